//! `factory build`: build a Rust factory crate for `wasm32-unknown-unknown` with cargo and
//! componentize the core module in-process with `wit-component`. Cargo's own cache makes a
//! second build of an unchanged crate a no-op, and the component is re-encoded only when the
//! core module changed. A crate can also be built for `wasm32-wasip2` ([`BuildTarget`]),
//! where rustc's linker (wasm-component-ld) emits the component itself.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The target factories are built for by default: no WASI, no ambient authority.
pub const TARGET: &str = "wasm32-unknown-unknown";

/// What a crate is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum BuildTarget {
    /// [`TARGET`] (`wasm32-unknown-unknown`): a core module, componentized here.
    #[default]
    Unknown,
    /// `wasm32-wasip2`: rustc emits a component that imports WASI (std's env, files,
    /// sockets, stdio), which the host serves deny-by-default. No encoding step.
    WasiP2,
}

impl BuildTarget {
    /// The rustc target triple.
    pub fn triple(self) -> &'static str {
        match self {
            BuildTarget::Unknown => TARGET,
            BuildTarget::WasiP2 => "wasm32-wasip2",
        }
    }
}

/// Why a build failed.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The directory has no Cargo.toml.
    #[error("`{0}` is not a Rust crate (no Cargo.toml)")]
    NotACrate(String),
    /// cargo could not be started.
    #[error("cannot run cargo: {0}; install Rust from https://rustup.rs")]
    NoCargo(String),
    /// The wasm target is missing and rustup is not there to add it.
    #[error("the `{0}` target is not installed and rustup is not available to add it; install rustup (https://rustup.rs) or add the target to your toolchain")]
    NoTarget(&'static str),
    /// `rustup target add` failed.
    #[error("`rustup target add {target}` failed: {message}")]
    TargetAdd { target: &'static str, message: String },
    /// cargo build failed (its diagnostics went to stderr).
    #[error("cargo build failed for `{0}` (see the compiler output above)")]
    Cargo(String),
    /// The build produced no cdylib `.wasm`.
    #[error("cargo built no `.wasm` for `{0}`: is the crate a `cdylib` (`[lib] crate-type = [\"cdylib\"]`)?")]
    NoArtifact(String),
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    /// wit-component could not encode the module.
    #[error("componentizing `{path}` failed: {message}")]
    Componentize { path: String, message: String },
}

/// A built factory component.
#[derive(Debug, Clone)]
pub struct Built {
    /// The component file.
    pub component: PathBuf,
    /// True when the component was (re-)encoded by this build.
    pub encoded: bool,
}

/// Is `target` installed for the active toolchain?
fn target_installed(target: &str) -> bool {
    let Ok(out) = Command::new("rustc").args(["--print", "target-libdir", "--target", target]).output() else {
        return false;
    };
    out.status.success() && Path::new(String::from_utf8_lossy(&out.stdout).trim()).exists()
}

/// Add `target` with rustup, telling the user through `say`.
fn ensure_target(target: &'static str, say: &mut dyn FnMut(&str)) -> Result<(), BuildError> {
    if target_installed(target) {
        return Ok(());
    }
    if Command::new("rustup").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_err() {
        return Err(BuildError::NoTarget(target));
    }
    say(&format!("adding the Rust target {target} (rustup target add {target})"));
    let out = Command::new("rustup")
        .args(["target", "add", target])
        .output()
        .map_err(|e| BuildError::TargetAdd { target, message: e.to_string() })?;
    if !out.status.success() {
        let message = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(BuildError::TargetAdd { target, message });
    }
    Ok(())
}

/// Build the factory crate in `dir` (release profile) and return its component. `target_dir`
/// overrides cargo's target directory; `say` receives one-line notes for the user (target
/// added, componentized).
pub fn build_crate(dir: &Path, target_dir: Option<&Path>, say: &mut dyn FnMut(&str)) -> Result<Built, BuildError> {
    build_crate_for(dir, BuildTarget::default(), target_dir, say)
}

/// [`build_crate`] for `target`. For [`BuildTarget::WasiP2`] the `.wasm` cargo builds is
/// already the component (`Built::encoded` is then always false).
pub fn build_crate_for(
    dir: &Path,
    target: BuildTarget,
    target_dir: Option<&Path>,
    say: &mut dyn FnMut(&str),
) -> Result<Built, BuildError> {
    let manifest = dir.join("Cargo.toml");
    if !manifest.is_file() {
        return Err(BuildError::NotACrate(dir.display().to_string()));
    }
    ensure_target(target.triple(), say)?;
    let mut cargo = Command::new("cargo");
    cargo
        .args(["build", "--release", "--target", target.triple(), "--message-format=json-render-diagnostics"])
        .arg("--manifest-path")
        .arg(&manifest);
    if let Some(target_dir) = target_dir {
        cargo.arg("--target-dir").arg(target_dir);
    }
    let output = cargo
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| BuildError::NoCargo(e.to_string()))?;
    if !output.status.success() {
        return Err(BuildError::Cargo(dir.display().to_string()));
    }
    let artifact =
        find_artifact(&output.stdout, &manifest).ok_or_else(|| BuildError::NoArtifact(dir.display().to_string()))?;
    match target {
        BuildTarget::Unknown => componentize_file(&artifact, say),
        BuildTarget::WasiP2 => Ok(Built { component: artifact, encoded: false }),
    }
}

/// The cdylib `.wasm` cargo reported for the package at `manifest`.
fn find_artifact(messages: &[u8], manifest: &Path) -> Option<PathBuf> {
    let wanted = std::fs::canonicalize(manifest).ok();
    let mut found = None;
    for line in messages.split(|b| *b == b'\n') {
        let Ok(msg) = serde_json::from_slice::<serde_json::Value>(line) else { continue };
        if msg["reason"] != "compiler-artifact" {
            continue;
        }
        let same_package = msg["manifest_path"]
            .as_str()
            .map(|p| std::fs::canonicalize(p).ok() == wanted)
            .unwrap_or(false);
        let is_cdylib = msg["target"]["kind"].as_array().is_some_and(|k| k.iter().any(|k| k == "cdylib"));
        if !(same_package && is_cdylib) {
            continue;
        }
        if let Some(files) = msg["filenames"].as_array() {
            found = files.iter().filter_map(|f| f.as_str()).find(|f| f.ends_with(".wasm")).map(PathBuf::from);
        }
    }
    found
}

/// Encode the core module at `core` as a component beside it (`NAME.component.wasm`),
/// unless an up-to-date one is already there.
pub fn componentize_file(core: &Path, say: &mut dyn FnMut(&str)) -> Result<Built, BuildError> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| BuildError::Io { path, source }
    };
    let stem = core.file_stem().and_then(|s| s.to_str()).unwrap_or("factory");
    let component = core.with_file_name(format!("{stem}.component.wasm"));
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if let (Some(c), Some(m)) = (modified(&component), modified(core)) {
        if c >= m {
            return Ok(Built { component, encoded: false });
        }
    }
    let bytes = std::fs::read(core).map_err(io(core))?;
    let encoded = componentize(&bytes).map_err(|message| BuildError::Componentize { path: core.display().to_string(), message })?;
    std::fs::write(&component, encoded).map_err(io(&component))?;
    say(&format!("componentized {}", component.display()));
    Ok(Built { component, encoded: true })
}

/// Encode a core module (with its embedded `component-type` section, as wit-bindgen emits
/// it) as a component.
pub fn componentize(core: &[u8]) -> Result<Vec<u8>, String> {
    wit_component::ComponentEncoder::default()
        .module(core)
        .map_err(|e| format!("{e:#}"))?
        .validate(true)
        .encode()
        .map_err(|e| format!("{e:#}"))
}
