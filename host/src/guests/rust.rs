//! `factory build`: build a Rust factory crate for `wasm32-unknown-unknown` with cargo and
//! componentize the core module in-process with `wit-component`. Cargo's own cache makes a
//! second build of an unchanged crate a no-op; the component is encoded afresh every time (a
//! `.component.wasm` left in the target directory could be the build's own doing). A crate can also be built for `wasm32-wasip2` ([`BuildTarget`]),
//! where rustc's linker (wasm-component-ld) emits the component itself.
//!
//! Building runs the crate's own native code (its `build.rs`, its proc macros, and those of
//! its dependencies), so how that code is confined is the caller's choice ([`Confinement`]):
//! [`Confinement::Sandbox`] runs the build in a bubblewrap sandbox ([`Sandbox`]) with no
//! network and a read-only file system except the build's target directory, after a
//! `cargo fetch` outside it (which downloads, and runs no crate code); [`Confinement::Native`]
//! runs it as the user, for source the user vouched for. Either way cargo and rustup run from
//! a neutral directory ([`NEUTRAL_DIR`]) with `--manifest-path`, so a `.cargo/config.toml` or
//! `rust-toolchain.toml` in the caller's working directory (or its parents) is never read.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The target factories are built for by default: no WASI, no ambient authority.
pub const TARGET: &str = "wasm32-unknown-unknown";

/// Where cargo, rustc and rustup are started: cargo reads `.cargo/config.toml` from its
/// working directory and every parent, and rustup a `rust-toolchain.toml` the same way, so
/// the build never starts in (or below) the user's working directory.
pub const NEUTRAL_DIR: &str = "/";

pub use crate::bwrap::BWRAP;
use crate::bwrap::{self, Flag};

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
    NoCargo(#[source] std::io::Error),
    /// rustc could not be started.
    #[error("cannot run cargo: rustc: {0}; install Rust from https://rustup.rs")]
    NoRustc(#[source] std::io::Error),
    /// The wasm target is missing and rustup is not there to add it.
    #[error("the `{0}` target is not installed and rustup is not available to add it; install rustup (https://rustup.rs) or add the target to your toolchain")]
    NoTarget(&'static str),
    /// `rustup target add` failed (its stderr).
    #[error("`rustup target add {target}` failed: {message}")]
    TargetAdd { target: &'static str, message: String },
    /// `rustup target add` could not be started.
    #[error("`rustup target add {target}` failed: {source}")]
    NoRustup {
        target: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// `cargo fetch` failed (its diagnostics went to stderr).
    #[error("cargo fetch failed for `{0}` (see cargo's output above)")]
    Fetch(String),
    /// `cargo metadata` failed (its stderr) or answered without what a build needs.
    #[error("cargo metadata failed for `{crate_dir}`: {message}")]
    Metadata { crate_dir: String, message: String },
    /// `cargo metadata` answered something that is not JSON.
    #[error("cargo metadata failed for `{crate_dir}`: {source}")]
    MetadataJson {
        crate_dir: String,
        #[source]
        source: serde_json::Error,
    },
    /// The sandbox could not be started.
    #[error("cannot start the build sandbox: {0}")]
    Sandbox(#[from] SandboxUnavailable),
    /// cargo build failed (its diagnostics went to stderr).
    #[error("cargo build failed for `{0}` (see the compiler output above)")]
    Cargo(String),
    /// The build produced no cdylib `.wasm`.
    #[error("cargo built no `.wasm` for `{0}`: is the crate a `cdylib` (`[lib] crate-type = [\"cdylib\"]`)?")]
    NoArtifact(String),
    /// A sandboxed build named an artifact outside its target directory.
    #[error("the build of `{crate_dir}` named an artifact outside its target directory: {artifact}")]
    ArtifactOutside { crate_dir: String, artifact: String },
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    /// wit-component could not encode the module.
    #[error("componentizing `{path}` failed: {source:#}")]
    Componentize {
        path: String,
        #[source]
        source: anyhow::Error,
    },
}

/// Why bubblewrap cannot confine a build here.
#[derive(Debug, thiserror::Error)]
pub enum SandboxUnavailable {
    /// The program is not installed (or not on `PATH`).
    #[error("`{program}` (bubblewrap) cannot be started: {source}")]
    Missing { program: String, source: std::io::Error },
    /// It starts but cannot create a sandbox (e.g. user namespaces are disabled).
    #[error("`{program}` (bubblewrap) cannot create a sandbox here: {message}")]
    Broken { program: String, message: String },
}

/// A built factory component.
#[derive(Debug, Clone)]
pub struct Built {
    /// The component file.
    pub component: PathBuf,
    /// True when the component was (re-)encoded by this build.
    pub encoded: bool,
}

/// How a build runs the crate's own native code (build scripts, proc macros).
#[derive(Debug, Clone, Copy)]
pub enum Confinement<'a> {
    /// As the user, with the user's files and network: only for source the user vouched for.
    Native,
    /// Inside a bubblewrap sandbox (see [`Sandbox`]).
    Sandbox(&'a Sandbox),
}

/// A bubblewrap sandbox for cargo builds. Inside it: no network (a network namespace of its
/// own, with only a loopback of its own: the host's `127.0.0.1` is out of reach), its own PID, IPC and UTS namespaces and session
/// (no terminal to inject into), dies with its parent; the whole file system read-only, with
/// empty private `/tmp`, `/var/tmp` and `/run` (so no sockets there, such as the session bus
/// or an agent's, can be reached) and every [`Sandbox::hide`] directory emptied too; the
/// crate's workspace, its path dependencies, `CARGO_HOME` and `RUSTUP_HOME` readable; and
/// only the build's target directory writable.
#[derive(Debug, Clone)]
pub struct Sandbox {
    program: PathBuf,
    hidden: Vec<PathBuf>,
}

impl Sandbox {
    /// Bubblewrap as `$FACTORY_BWRAP`, else `bwrap` on `PATH`, checked by running `true` in
    /// a sandbox like the build's.
    pub fn detect() -> Result<Sandbox, SandboxUnavailable> {
        let program = bwrap::from_env();
        let name = program.display().to_string();
        let mut args = bwrap::Args::new();
        args.flags(&[Flag::DieWithParent, Flag::UnshareNet, Flag::UnsharePid]).ro_bind("/", "/").proc("/proc");
        let out = Command::new(&program)
            .current_dir(NEUTRAL_DIR)
            .args(args.finish())
            .arg("true")
            .stdin(Stdio::null())
            .output()
            .map_err(|source| SandboxUnavailable::Missing { program: name.clone(), source })?;
        if !out.status.success() {
            let message = String::from_utf8_lossy(&out.stderr).trim().to_string();
            let message = if message.is_empty() { out.status.to_string() } else { message };
            return Err(SandboxUnavailable::Broken { program: name, message });
        }
        Ok(Sandbox { program, hidden: Vec::new() })
    }

    /// Also hide `dir` from builds (an empty directory in its place), e.g. a state directory
    /// with its control socket.
    pub fn hide(mut self, dir: impl Into<PathBuf>) -> Sandbox {
        self.hidden.push(dir.into());
        self
    }

    /// `cargo ARGS` inside the sandbox, with `readable` visible read-only and `writable`
    /// (which must exist) writable.
    fn cargo(&self, readable: &[PathBuf], writable: &Path) -> Command {
        let mut args = bwrap::Args::new();
        args.flags(&[
            Flag::DieWithParent,
            Flag::NewSession,
            Flag::UnshareNet,
            Flag::UnsharePid,
            Flag::UnshareIpc,
            Flag::UnshareUts,
            Flag::UnshareCgroupTry,
        ])
        .ro_bind("/", "/")
        .dev("/dev")
        .proc("/proc");
        let scratch = ["/tmp", "/var/tmp", "/run"].map(PathBuf::from);
        for dir in scratch.iter().chain(&self.hidden).filter(|d| d.is_dir()) {
            args.tmpfs(dir);
        }
        for dir in readable.iter().filter(|d| d.exists()) {
            args.ro_bind(dir, dir);
        }
        args.bind(writable, writable).chdir(NEUTRAL_DIR);
        let mut cmd = Command::new(&self.program);
        cmd.current_dir(NEUTRAL_DIR).args(args.finish()).arg("cargo");
        cmd
    }
}

/// `program`, started in [`NEUTRAL_DIR`].
fn tool(program: &str) -> Command {
    let mut cmd = Command::new(program);
    cmd.current_dir(NEUTRAL_DIR);
    cmd
}

/// Is `target` installed for the active toolchain?
fn target_installed(target: &str) -> bool {
    let Ok(out) = tool("rustc").args(["--print", "target-libdir", "--target", target]).output() else {
        return false;
    };
    out.status.success() && Path::new(String::from_utf8_lossy(&out.stdout).trim()).exists()
}

/// Add `target` with rustup, telling the user through `say`.
fn ensure_target(target: &'static str, say: &mut dyn FnMut(&str)) -> Result<(), BuildError> {
    if target_installed(target) {
        return Ok(());
    }
    if tool("rustup").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_err() {
        return Err(BuildError::NoTarget(target));
    }
    say(&format!("adding the Rust target {target} (rustup target add {target})"));
    let out = tool("rustup")
        .args(["target", "add", target])
        .output()
        .map_err(|source| BuildError::NoRustup { target, source })?;
    if !out.status.success() {
        let message = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(BuildError::TargetAdd { target, message });
    }
    Ok(())
}

/// Build the factory crate in `dir` (release profile) and return its component. `target_dir`
/// overrides cargo's target directory; `say` receives one-line notes for the user (target
/// added, componentized). The crate's build scripts and proc macros run natively
/// ([`Confinement::Native`]): for third-party source use [`build_crate_confined`].
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
    build_crate_confined(dir, target, target_dir, Confinement::Native, say)
}

/// What `cargo metadata` says about the crate's workspace.
struct Layout {
    /// The target directory cargo uses (the workspace's, `CARGO_TARGET_DIR`, the user's config).
    target_dir: PathBuf,
    /// The workspace root and every path package's directory (path dependencies included).
    sources: Vec<PathBuf>,
}

/// The host's target triple (`rustc -vV`).
fn host_triple(dir: &Path) -> Result<String, BuildError> {
    let metadata = |message: String| BuildError::Metadata { crate_dir: dir.display().to_string(), message };
    let out = tool("rustc").arg("-vV").output().map_err(BuildError::NoRustc)?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(|h| h.trim().to_string())
        .ok_or_else(|| metadata("`rustc -vV` names no host".into()))
}

/// Fetch the crate's dependencies (network allowed; cargo runs no crate code to fetch) and
/// read its workspace layout offline.
fn prepare(dir: &Path, manifest: &Path, target: BuildTarget) -> Result<Layout, BuildError> {
    let metadata = |message: String| BuildError::Metadata { crate_dir: dir.display().to_string(), message };
    let host = host_triple(dir)?;
    let status = tool("cargo")
        .arg("fetch")
        .arg("--manifest-path")
        .arg(manifest)
        .args(["--target", target.triple(), "--target", &host])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .map_err(BuildError::NoCargo)?;
    if !status.success() {
        return Err(BuildError::Fetch(dir.display().to_string()));
    }
    let out = tool("cargo")
        .args(["metadata", "--offline", "--format-version", "1"])
        .args(["--filter-platform", target.triple(), "--filter-platform", &host])
        .arg("--manifest-path")
        .arg(manifest)
        .stdin(Stdio::null())
        .output()
        .map_err(BuildError::NoCargo)?;
    if !out.status.success() {
        return Err(metadata(String::from_utf8_lossy(&out.stderr).trim().to_string()));
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|source| BuildError::MetadataJson { crate_dir: dir.display().to_string(), source })?;
    let target_dir = meta["target_directory"].as_str().ok_or_else(|| metadata("no target_directory".into()))?;
    let mut sources: Vec<PathBuf> = meta["workspace_root"].as_str().map(PathBuf::from).into_iter().collect();
    for package in meta["packages"].as_array().into_iter().flatten() {
        if !package["source"].is_null() {
            continue;
        }
        if let Some(dir) = package["manifest_path"].as_str().and_then(|m| Path::new(m).parent()) {
            if !sources.iter().any(|s| dir.starts_with(s)) {
                sources.push(dir.to_path_buf());
            }
        }
    }
    // A path dependency may belong to a workspace of its own (`edition.workspace = true`, a
    // `wit/` beside it, as the factory SDK does): cargo and its build then read that
    // workspace's root, outside the directories above. It is shown read-only too.
    let roots: Vec<PathBuf> = sources
        .iter()
        .filter_map(|dir| workspace_manifest_above(dir))
        .filter_map(|manifest| manifest.parent().map(Path::to_path_buf))
        .collect();
    for root in roots {
        if !sources.iter().any(|s| root.starts_with(s)) {
            sources.push(root);
        }
    }
    Ok(Layout { target_dir: PathBuf::from(target_dir), sources })
}

/// The nearest `Cargo.toml` above `dir` that declares a `[workspace]`, if any.
fn workspace_manifest_above(dir: &Path) -> Option<PathBuf> {
    dir.ancestors().skip(1).map(|d| d.join("Cargo.toml")).find(|manifest| {
        std::fs::read_to_string(manifest)
            .ok()
            .and_then(|text| text.parse::<toml::Table>().ok())
            .is_some_and(|table| table.contains_key("workspace"))
    })
}

/// `CARGO_HOME` and `RUSTUP_HOME` as cargo and rustup find them (read-only in the sandbox).
fn tool_homes() -> Vec<PathBuf> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    [("CARGO_HOME", ".cargo"), ("RUSTUP_HOME", ".rustup")]
        .into_iter()
        .filter_map(|(var, dir)| {
            std::env::var_os(var).map(PathBuf::from).or_else(|| home.as_ref().map(|h| h.join(dir)))
        })
        .collect()
}

/// [`build_crate_for`] with the crate's own code confined as `confinement` says. In a
/// [`Sandbox`], dependencies are fetched first (outside it) and the build runs offline; the
/// artifact must lie in the target directory.
pub fn build_crate_confined(
    dir: &Path,
    target: BuildTarget,
    target_dir: Option<&Path>,
    confinement: Confinement<'_>,
    say: &mut dyn FnMut(&str),
) -> Result<Built, BuildError> {
    let manifest = std::path::absolute(dir.join("Cargo.toml"))
        .map_err(|source| BuildError::Io { path: dir.display().to_string(), source })?;
    if !manifest.is_file() {
        return Err(BuildError::NotACrate(dir.display().to_string()));
    }
    ensure_target(target.triple(), say)?;
    let target_dir = match target_dir {
        Some(t) => {
            Some(std::path::absolute(t).map_err(|source| BuildError::Io { path: t.display().to_string(), source })?)
        }
        None => None,
    };
    let (mut cargo, confined_to) = match confinement {
        Confinement::Native => (tool("cargo"), None),
        Confinement::Sandbox(sandbox) => {
            let layout = prepare(dir, &manifest, target)?;
            let writable = target_dir.clone().unwrap_or(layout.target_dir);
            std::fs::create_dir_all(&writable)
                .map_err(|source| BuildError::Io { path: writable.display().to_string(), source })?;
            let readable: Vec<PathBuf> = layout.sources.into_iter().chain(tool_homes()).collect();
            let mut cargo = sandbox.cargo(&readable, &writable);
            cargo.arg("--offline");
            (cargo, Some(writable))
        }
    };
    // The subcommand follows `cargo` (and, in the sandbox, `--offline` is cargo's own flag).
    cargo
        .args(["build", "--release", "--target", target.triple(), "--message-format=json-render-diagnostics"])
        .arg("--manifest-path")
        .arg(&manifest);
    if let Some(target_dir) = confined_to.as_ref().or(target_dir.as_ref()) {
        cargo.arg("--target-dir").arg(target_dir);
    }
    let output = cargo
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()
        .map_err(BuildError::NoCargo)?;
    if !output.status.success() {
        return Err(BuildError::Cargo(dir.display().to_string()));
    }
    let artifact =
        find_artifact(&output.stdout, &manifest).ok_or_else(|| BuildError::NoArtifact(dir.display().to_string()))?;
    if let Some(writable) = &confined_to {
        // What the sandboxed build reports is the build's word: only its own output counts.
        let inside = std::fs::canonicalize(&artifact)
            .ok()
            .zip(std::fs::canonicalize(writable).ok())
            .is_some_and(|(a, w)| a.starts_with(w));
        if !inside {
            let crate_dir = dir.display().to_string();
            return Err(BuildError::ArtifactOutside { crate_dir, artifact: artifact.display().to_string() });
        }
    }
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
        let same_package =
            msg["manifest_path"].as_str().map(|p| std::fs::canonicalize(p).ok() == wanted).unwrap_or(false);
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
/// always (one already there is replaced, never reused). The directory may have been
/// written by a sandboxed build: a symlink there is never followed (it is replaced, not
/// written through).
pub fn componentize_file(core: &Path, say: &mut dyn FnMut(&str)) -> Result<Built, BuildError> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| BuildError::Io { path, source }
    };
    let stem = core.file_stem().and_then(|s| s.to_str()).unwrap_or("factory");
    let component = core.with_file_name(format!("{stem}.component.wasm"));
    // Always encoded afresh (a few milliseconds): a `.component.wasm` already there, even a
    // newer one, may have been planted by the build's own code, and what is returned here is
    // trusted as built on this machine.
    let bytes = std::fs::read(core).map_err(io(core))?;
    let encoded =
        componentize(&bytes).map_err(|source| BuildError::Componentize { path: core.display().to_string(), source })?;
    // Written beside it under a fresh name, then renamed over: a rename replaces a symlink
    // rather than following it.
    let partial = core.with_file_name(format!(".{stem}.component.wasm.{}.partial", std::process::id()));
    let _ = std::fs::remove_file(&partial);
    let write = || -> std::io::Result<()> {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new().write(true).create_new(true).open(&partial)?;
        file.write_all(&encoded)?;
        std::fs::rename(&partial, &component)
    };
    write().map_err(io(&component))?;
    say(&format!("componentized {}", component.display()));
    Ok(Built { component, encoded: true })
}

/// Encode a core module (with its embedded `component-type` section, as wit-bindgen emits
/// it) as a component.
pub fn componentize(core: &[u8]) -> Result<Vec<u8>, anyhow::Error> {
    wit_component::ComponentEncoder::default().module(core)?.validate(true).encode()
}
