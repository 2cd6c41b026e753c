//! What a `<component|dir>` argument names: a component file to load, or a Rust crate
//! directory to build first.

use anyhow::{bail, Context, Result};
use factory_host::builder;
use std::path::{Path, PathBuf};

/// Build the crate at `dir`, telling the user what happens on stderr.
pub fn build(dir: &Path) -> Result<PathBuf> {
    let built = builder::build_crate(dir, None, &mut |note| eprintln!("factory: {note}"))
        .with_context(|| format!("building {}", dir.display()))?;
    Ok(built.component)
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
