//! What a `<component|dir>` argument names: a component file to load, or a Rust crate
//! directory to build first. Components this process builds are remembered (by sha256) so
//! the trust store can record them as built on this machine (`super::trust`).

use anyhow::{bail, Context, Result};
use factory_host::builder;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Components built by this process: (sha256, file).
static BUILT: Mutex<Vec<(String, PathBuf)>> = Mutex::new(Vec::new());

/// Build the crate at `dir`, telling the user what happens on stderr.
pub fn build(dir: &Path) -> Result<PathBuf> {
    let built = builder::build_crate(dir, None, &mut |note| eprintln!("factory: {note}"))
        .with_context(|| format!("building {}", dir.display()))?;
    let bytes = std::fs::read(&built.component).with_context(|| format!("reading {}", built.component.display()))?;
    let hash = factory_host::component::content_hash(&bytes);
    BUILT.lock().unwrap_or_else(|p| p.into_inner()).push((hash, built.component.clone()));
    Ok(built.component)
}

/// The components this process built so far: (sha256, file).
pub fn built_here() -> Vec<(String, PathBuf)> {
    BUILT.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// The component file for `target`: itself, or the crate built from it.
pub fn resolve(target: &Path) -> Result<PathBuf> {
    if target.is_dir() {
        build(target)
    } else if target.is_file() {
        Ok(target.to_path_buf())
    } else {
        bail!("`{}` is neither a component file nor a crate directory", target.display())
    }
}
