//! What a `<component|dir>` argument names: a component file to load, or a Rust crate
//! directory to build first. Components this process builds are remembered (by sha256) so
//! the trust store can record them as built on this machine (`super::trust`). A Python
//! factory (`.py` file or project directory) is built with componentize-py.

use anyhow::{bail, Context, Result};
use factory_host::{builder, pybuild};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Components built by this process: (sha256, file).
static BUILT: Mutex<Vec<(String, PathBuf)>> = Mutex::new(Vec::new());

/// Build the crate at `dir` (or the Python factory there, see [`build_python`]), telling
/// the user what happens on stderr.
pub fn build(dir: &Path) -> Result<PathBuf> {
    if pybuild::is_python(dir) {
        return build_python(dir);
    }
    let built = builder::build_crate(dir, None, &mut |note| eprintln!("factory: {note}"))
        .with_context(|| format!("building {}", dir.display()))?;
    remember(&built.component)
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

/// The trust identity of a loaded factory: its source's sha256 for a script factory (the
/// runner is part of this binary), else its component's.
pub fn trust_key(factory: &factory_host::Factory) -> String {
    match &factory.component.script {
        Some(script) => script.hash.clone(),
        None => factory.component.hash.clone(),
    }
}

/// The component file for `target`: itself, or the crate built from it; a script factory
/// (`.js`, `.mjs`, `.ts`, `.mts`, maybe `file.js#name`) as it is.
pub fn resolve(target: &Path) -> Result<PathBuf> {
    if is_script_target(&target.to_string_lossy()) {
        remember_script(target)?;
        Ok(target.to_path_buf())
    } else if target.is_dir() || pybuild::is_python(target) {
        build(target)
    } else if target.is_file() {
        Ok(target.to_path_buf())
    } else {
        bail!("`{}` is neither a component file, a script factory, nor a crate directory", target.display())
    }
}
