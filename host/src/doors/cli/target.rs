//! What a `<component|dir>` argument names: a component file to load, a Rust crate
//! directory to build first, or (for `factory run`) a registered factory's bare name.
//! Building a crate runs its build scripts and proc macros, so it happens only where the user
//! asked for a build (`run`, `add`, `build`, `resume --component`; never `describe` or
//! `trust`), inside the bubblewrap sandbox ([`builder::Sandbox`]) when it is available and
//! otherwise only with consent ([`BuildConsent`]: `--yes`, or "y" at a prompt). Components
//! this process builds are remembered (by sha256) so the trust store can record them as
//! built on this machine (`crate::doors::cli::trust`). A Python factory (`.py` file or project
//! directory) is built with componentize-py.

use crate::doors::args::GlobalArgs;
use anyhow::{bail, Context, Result};
use factory_host::builder::{self, BuildTarget, Confinement, Sandbox};
use factory_host::pybuild;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Components built by this process: (sha256, file).
static BUILT: Mutex<Vec<(String, PathBuf)>> = Mutex::new(Vec::new());

/// Consent to building a crate outside the sandbox, and what a sandboxed build must not see.
#[derive(Debug, Clone)]
pub struct BuildConsent {
    /// `--yes`: build natively, without asking, when bubblewrap cannot confine the build.
    yes: bool,
    /// Hidden from a sandboxed build: the state and trust directories (the control socket).
    hide: Vec<PathBuf>,
}

impl BuildConsent {
    /// The consent `yes` (`--yes`) gives for a command on `g`'s state directory.
    pub fn new(g: &GlobalArgs, yes: bool) -> BuildConsent {
        let mut hide = vec![g.state_dir.clone()];
        hide.extend(g.trust_dir().ok().filter(|d| *d != g.state_dir));
        BuildConsent { yes, hide }
    }
}

/// Is this a Rust crate directory (one `build` would run cargo on)?
fn is_crate_dir(path: &Path) -> bool {
    path.is_dir() && path.join("Cargo.toml").is_file() && !pybuild::is_python(path)
}

/// Build the crate at `dir` (or the Python factory there, see [`build_python`]), telling
/// the user what happens on stderr: in the build sandbox, or natively with `consent`.
pub fn build(dir: &Path, consent: &BuildConsent) -> Result<PathBuf> {
    if pybuild::is_python(dir) {
        return build_python(dir);
    }
    if !dir.join("Cargo.toml").is_file() {
        bail!(builder::BuildError::NotACrate(dir.display().to_string()));
    }
    let say = &mut |note: &str| eprintln!("factory: {note}");
    let building = || format!("building {}", dir.display());
    let built = match Sandbox::detect() {
        Ok(sandbox) => {
            let sandbox = consent.hide.iter().fold(sandbox, |s, d| s.hide(d.clone()));
            say(&format!(
                "building {} in the build sandbox (bubblewrap: no network, writes only to its target directory)",
                dir.display()
            ));
            builder::build_crate_confined(dir, BuildTarget::Unknown, None, Confinement::Sandbox(&sandbox), say)
                .with_context(building)?
        }
        Err(why) => {
            consent_to_native_build(dir, &why, consent)?;
            builder::build_crate_confined(dir, BuildTarget::Unknown, None, Confinement::Native, say)
                .with_context(building)?
        }
    };
    remember(&built.component)
}

/// Without a sandbox, building runs the crate's code as the user: only with `--yes` or a
/// "y" on a terminal. Otherwise an error saying what to do.
fn consent_to_native_build(dir: &Path, why: &builder::SandboxUnavailable, consent: &BuildConsent) -> Result<()> {
    let shown = dir.display();
    let risk = format!(
        "building the Rust crate `{shown}` runs its build.rs and proc macros (and its dependencies') natively, as you, \
         with your files and network, and the sandbox that would confine them is not available ({why})"
    );
    if consent.yes {
        eprintln!("factory: {risk}; building it anyway (--yes)");
        return Ok(());
    }
    if std::io::stdin().is_terminal() && std::io::stderr().is_terminal() {
        eprint!("factory: {risk}.\nBuild it natively? [y/N] ");
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).context("reading the answer")?;
        if matches!(line.trim().to_ascii_lowercase().as_str(), "y" | "yes") {
            return Ok(());
        }
        bail!("not built: building `{shown}` natively was declined");
    }
    bail!(
        "{risk}, and there is no terminal to ask for consent: install bubblewrap (Debian/Ubuntu: \
         `apt-get install bubblewrap`) to build it in the sandbox, pass --yes to build it natively, or build it \
         yourself (`cargo build --release --target {}`) and pass the component file",
        builder::TARGET
    )
}

/// Build a Python factory (a `.py` file, or a directory with an `app.py` or a
/// `pyproject.toml`) with componentize-py, cached under the compile cache directory.
pub fn build_python(path: &Path) -> Result<PathBuf> {
    let cache = factory_host::default_cache_dir().unwrap_or_else(|| std::env::temp_dir().join("factory-cache"));
    let built = pybuild::build(path, &cache, &mut |note| eprintln!("factory: {note}"))
        .with_context(|| format!("building {}", path.display()))?;
    remember(&built.component)
}

/// Record `component` as built by this process (the trust store trusts it like a build).
fn remember(component: &Path) -> Result<PathBuf> {
    let bytes = std::fs::read(component).with_context(|| format!("reading {}", component.display()))?;
    let hash = factory_host::component::content_hash(&bytes);
    BUILT.lock().unwrap_or_else(|p| p.into_inner()).push((hash, component.to_path_buf()));
    Ok(component.to_path_buf())
}

/// The components this process built so far: (sha256, file).
pub fn built_here() -> Vec<(String, PathBuf)> {
    BUILT.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Does `target` name a script factory file, maybe as `file.js#name`?
pub fn is_script_target(target: &str) -> bool {
    let (file, _) = factory_host::script::split_entry(target);
    let file = Path::new(file);
    file.is_file() && factory_host::script::is_script(file)
}

/// A script factory named on the command line is the user's own source, like a crate built
/// here: remember it (by the sha256 of its source) so the trust store records it as trusted.
fn remember_script(target: &Path) -> Result<()> {
    let text = target.to_string_lossy();
    let (file, entry) = factory_host::script::split_entry(&text);
    let script = factory_host::script::Script::read(Path::new(file), entry.map(str::to_string))
        .with_context(|| format!("reading {file}"))?;
    BUILT.lock().unwrap_or_else(|p| p.into_inner()).push((script.hash, PathBuf::from(file)));
    Ok(())
}

/// Remember a source authored here (`factory add --meta --run`) as built here.
pub fn remember_source(hash: &str, name: &str) {
    BUILT.lock().unwrap_or_else(|p| p.into_inner()).push((hash.to_string(), PathBuf::from(name)));
}

/// The component file for `target`: itself, or the crate built from it (see [`build`]); a
/// script factory (`.js`, `.mjs`, `.ts`, `.mts`, maybe `file.js#name`) as it is.
pub fn resolve(target: &Path, consent: &BuildConsent) -> Result<PathBuf> {
    if is_script_target(&target.to_string_lossy()) {
        remember_script(target)?;
        Ok(target.to_path_buf())
    } else if target.is_dir() || pybuild::is_python(target) {
        build(target, consent)
    } else if target.is_file() {
        Ok(target.to_path_buf())
    } else {
        bail!("`{}` is neither a component file, a script factory, nor a crate directory", target.display())
    }
}

/// [`resolve`] for commands that only look at a factory (`describe`, `trust`, `trust
/// --revoke`, named by `command`): a Rust crate directory is never built by them (that would
/// run its build.rs and proc macros), so it is an error saying how to build it first.
pub fn resolve_built(target: &Path, command: &str) -> Result<PathBuf> {
    if is_crate_dir(target) {
        let shown = target.display();
        bail!(
            "`{shown}` is a Rust crate directory, and `factory {command}` does not build crates (building runs the \
             crate's build.rs and proc macros): build it first with `factory build {shown}` and pass the component \
             file it prints"
        );
    }
    if target.is_dir() && !pybuild::is_python(target) {
        bail!(builder::BuildError::NotACrate(target.display().to_string()));
    }
    // A Python factory is built (or found in the build cache) by componentize-py, see `pybuild`.
    resolve(target, &BuildConsent { yes: false, hide: Vec::new() })
}

/// What a `factory run` target names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Named {
    /// A file or directory.
    Path(PathBuf),
    /// A registered factory.
    Registered(String),
}

/// File name endings that make a target a path even without a `/`.
const FACTORY_FILE_ENDINGS: &[&str] = &[".wasm", ".js", ".mjs", ".ts", ".mts", ".py", ".json"];

/// A bare name (no `/`, not `.` or `..`, no `#entry`, no factory file ending) names a
/// registered factory, even when a file or directory of that name is in the working
/// directory; anything else is a path (`./NAME` for a directory named like a factory).
pub fn classify(target: &str) -> Named {
    let path_like = target.contains('/')
        || target.contains('#')
        || target == "."
        || target == ".."
        || FACTORY_FILE_ENDINGS.iter().any(|e| target.ends_with(e));
    if path_like {
        Named::Path(PathBuf::from(target))
    } else {
        Named::Registered(target.to_string())
    }
}

/// The error loading the bare `name` gave (`why`: no such registration, or what the store
/// said), with a hint when `./name` exists.
pub fn not_registered(name: &str, why: factory_host::Error) -> anyhow::Error {
    let missing = matches!(why, factory_host::Error::NotRegistered(_));
    if missing && Path::new(name).exists() {
        return anyhow::anyhow!(
            "{why} is registered; did you mean ./{name}? (a bare name is a registered factory: a file or \
             directory needs a path such as ./{name})"
        );
    }
    if missing {
        return anyhow::anyhow!("{why} is registered (a file or directory needs a path such as ./{name})");
    }
    anyhow::Error::new(why).context(format!("loading the registered factory `{name}`"))
}
