//! Loading a factory component: recognise the bytes (core module, component, garbage),
//! hash them (sha256), compile once and cache the serialized artifact on disk keyed by hash
//! and engine, link against the host's imports and check the exports through `InstancePre`:
//! a [`LinkedComponent`], over whatever store data the caller's linker serves.
//!
//! A cached artifact is native code that is mapped and run, so it is used only when it is
//! ours: the file and its directory must be owned by this user and not writable by group or
//! others (else the component is compiled again, and a debug log says why). The cache
//! directory is created `0700` and artifacts `0600`.

use crate::sandbox::contract::FactoryPre;
use sha2::{Digest, Sha256};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use wasmtime::component::{Component, Linker};
use wasmtime::Engine;

/// Why a component cannot be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read `{path}`: {source}")]
    Read { path: String, source: std::io::Error },
    /// Larger than [`MAX_COMPONENT_BYTES`].
    #[error("`{path}` is over {limit} bytes: not loaded as a component")]
    TooLarge { path: String, limit: u64 },
    /// Not a regular file (a device, a pipe, a directory).
    #[error("`{path}` is not a regular file: not loaded as a component")]
    NotAFile { path: String },
    /// Not WebAssembly at all.
    #[error("not a WebAssembly component: the bytes do not start with the wasm magic number")]
    NotWasm,
    /// A core module: it must be componentized first.
    #[error("this is a core WebAssembly module, not a component; build it with `factory build` (or `wasm-tools component new`) against wit/factory.wit")]
    CoreModule,
    /// A component that failed to validate or compile.
    #[error("invalid component: {0}")]
    Invalid(String),
    /// A component that imports something the host does not provide.
    #[error("component imports `{import}`, which the factory host does not provide (a component of another world?)")]
    UnknownImport { import: String },
    /// A component whose exports do not match world `factory`.
    #[error("component does not export the `agent:factory/factory` world: {0}")]
    WrongWorld(String),
}

/// The largest component file read (the JS runner, the biggest the host ships, is about 2 MiB).
pub const MAX_COMPONENT_BYTES: u64 = 256 << 20;

/// A component file's bytes: a regular file of at most [`MAX_COMPONENT_BYTES`] (a device
/// such as `/dev/zero`, a pipe or a huge file is refused before it is read).
pub fn read_component_file(path: &Path) -> Result<Vec<u8>, LoadError> {
    use std::io::Read;
    let shown = || path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| LoadError::Read { path: shown(), source })?;
    let meta = file.metadata().map_err(|source| LoadError::Read { path: shown(), source })?;
    if !meta.is_file() {
        return Err(LoadError::NotAFile { path: shown() });
    }
    if meta.len() > MAX_COMPONENT_BYTES {
        return Err(LoadError::TooLarge { path: shown(), limit: MAX_COMPONENT_BYTES });
    }
    let mut bytes = Vec::new();
    file.take(MAX_COMPONENT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| LoadError::Read { path: shown(), source })?;
    if bytes.len() as u64 > MAX_COMPONENT_BYTES {
        return Err(LoadError::TooLarge { path: shown(), limit: MAX_COMPONENT_BYTES });
    }
    Ok(bytes)
}

/// The first bytes of every wasm binary.
const WASM_MAGIC: &[u8; 4] = b"\0asm";

/// What kind of wasm binary `bytes` are.
fn classify(bytes: &[u8]) -> Result<(), LoadError> {
    if bytes.len() < 8 || &bytes[..4] != WASM_MAGIC {
        return Err(LoadError::NotWasm);
    }
    // Core modules carry version 1 and layer 0; components carry layer 1.
    match bytes[6..8] {
        [0, 0] => Err(LoadError::CoreModule),
        [1, 0] => Ok(()),
        _ => Err(LoadError::Invalid("unknown wasm binary layer".into())),
    }
}

/// The sha256 of a component's bytes, in hex.
pub fn content_hash(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A compiled, linked, checked factory component, ready to instantiate in a store of data
/// `T` (the data of the linker it was linked with).
pub struct LinkedComponent<T: 'static> {
    /// sha256 of the component bytes (hex).
    pub hash: String,
    /// The imports the component declares (`agent:factory/ctx@0.1.0`, ...).
    pub imports: Vec<String>,
    /// How the compiled artifact was obtained.
    pub origin: CompileOrigin,
    /// The component bytes (stored content-addressed with the runs that use them).
    pub bytes: std::sync::Arc<[u8]>,
    /// Instantiates it, its imports resolved.
    pub(crate) pre: FactoryPre<T>,
}

impl<T: 'static> Clone for LinkedComponent<T> {
    fn clone(&self) -> Self {
        LinkedComponent {
            hash: self.hash.clone(),
            imports: self.imports.clone(),
            origin: self.origin,
            bytes: self.bytes.clone(),
            pre: self.pre.clone(),
        }
    }
}

impl<T: 'static> std::fmt::Debug for LinkedComponent<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkedComponent").field("hash", &self.hash).field("imports", &self.imports).finish()
    }
}

/// Where a loaded component's machine code came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompileOrigin {
    /// Compiled now (and written to the cache, when there is one).
    Compiled,
    /// Deserialized from the on-disk cache.
    Cached,
}

/// Compiles components, caching artifacts in a directory keyed by content and engine.
pub struct ComponentLoader {
    engine: Engine,
    cache_dir: Option<PathBuf>,
    /// Distinguishes artifacts of differently configured engines or versions.
    engine_tag: String,
}

impl ComponentLoader {
    /// A loader for `engine`, caching in `cache_dir` (no cache when `None`).
    pub fn new(engine: Engine, cache_dir: Option<PathBuf>) -> Self {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        env!("CARGO_PKG_VERSION").hash(&mut hasher);
        let engine_tag = format!("{:016x}", hasher.finish());
        ComponentLoader { engine, cache_dir, engine_tag }
    }

    /// Load a component file.
    pub fn load_file<T: 'static>(&self, linker: &Linker<T>, path: &Path) -> Result<LinkedComponent<T>, LoadError> {
        let bytes = read_component_file(path)?;
        self.load_bytes(linker, &bytes)
    }

    /// Load a component from bytes.
    pub fn load_bytes<T: 'static>(&self, linker: &Linker<T>, bytes: &[u8]) -> Result<LinkedComponent<T>, LoadError> {
        self.load_bytes_for(linker, bytes, false)
    }

    /// Load a component from bytes; `script_runner`: `linker` provides `agent:factory/script`
    /// (only the host's JS runner is loaded so).
    pub(crate) fn load_bytes_for<T: 'static>(
        &self,
        linker: &Linker<T>,
        bytes: &[u8],
        script_runner: bool,
    ) -> Result<LinkedComponent<T>, LoadError> {
        classify(bytes)?;
        let hash = content_hash(bytes);
        let (component, origin) = self.compile_cached(&hash, bytes)?;
        let imports =
            component.component_type().imports(&self.engine).map(|(name, _)| name.to_string()).collect::<Vec<_>>();
        let exports_run = component.component_type().exports(&self.engine).any(|(name, _)| name == "run");
        let script_import = |i: &String| i.starts_with("agent:factory/script");
        if let Some(import) = imports.iter().find(|i| !host_provides(i) || (!script_runner && script_import(i))) {
            return Err(LoadError::UnknownImport { import: import.clone() });
        }
        let instance_pre = linker.instantiate_pre(&component).map_err(|e| LoadError::WrongWorld(format!("{e:#}")))?;
        let pre = FactoryPre::new(instance_pre).map_err(|e| {
            let hint = if exports_run { "" } else { " (it has no `run` export)" };
            LoadError::WrongWorld(format!("{e:#}{hint}"))
        })?;
        Ok(LinkedComponent { hash, imports, origin, bytes: bytes.into(), pre })
    }

    fn cache_path(&self, hash: &str) -> Option<PathBuf> {
        self.cache_dir.as_ref().map(|dir| dir.join(format!("{hash}-{}.cwasm", self.engine_tag)))
    }

    fn compile_cached(&self, hash: &str, bytes: &[u8]) -> Result<(Component, CompileOrigin), LoadError> {
        if let Some(path) = self.cache_path(hash) {
            if path.exists() && cache_file_is_ours(&path) {
                // SAFETY: the artifact was written by `Component::serialize` of an engine with
                // the same compatibility hash (it is in the file name), into the user's own
                // cache directory; wasmtime still checks its header and engine settings. If
                // that check fails we fall back to compiling.
                if let Ok(component) = unsafe { Component::deserialize_file(&self.engine, &path) } {
                    return Ok((component, CompileOrigin::Cached));
                }
            }
        }
        let component = Component::new(&self.engine, bytes).map_err(|e| LoadError::Invalid(format!("{e:#}")))?;
        if let Some(path) = self.cache_path(hash) {
            // A cache write failure only costs the next start a compile: not an error.
            if let Ok(artifact) = component.serialize() {
                let _ = write_atomically(&path, &artifact);
            }
        }
        Ok((component, CompileOrigin::Compiled))
    }
}

/// Interfaces the host links: our package and WASI p2 (served deny-by-default).
fn host_provides(import: &str) -> bool {
    import.starts_with("agent:factory/") || import.starts_with("wasi:")
}

/// May the cached artifact at `path` be deserialized? Only a regular file (not a symlink)
/// in a directory, both owned by us and writable by nobody else: anyone who can write it
/// chooses the machine code we run.
fn cache_file_is_ours(path: &Path) -> bool {
    let checked = std::fs::symlink_metadata(path).map_err(|e| e.to_string()).and_then(|meta| {
        if !meta.file_type().is_file() {
            return Err("is not a regular file".to_string());
        }
        crate::access::check_owned_private(&meta)?;
        let dir = path.parent().ok_or_else(|| "has no directory".to_string())?;
        let dir_meta = std::fs::metadata(dir).map_err(|e| e.to_string())?;
        crate::access::check_owned_private(&dir_meta).map_err(|e| format!("its directory {e}"))
    });
    match checked {
        Ok(()) => true,
        Err(problem) => {
            tracing::debug!("compile cache: not using {} ({problem}); compiling again", path.display());
            false
        }
    }
}

/// Write via a temporary file and rename, so a concurrent reader never sees half a file.
/// The directory is created `0700`, the file `0600`.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    if let Some(dir) = path.parent() {
        crate::access::create_private_dir(dir)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let written = crate::access::create_private_file(&tmp).and_then(|mut file| file.write_all(bytes));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_binaries() {
        assert!(matches!(classify(b"hello world"), Err(LoadError::NotWasm)));
        assert!(matches!(classify(b"\0asm\x01\0\0\0"), Err(LoadError::CoreModule)));
        assert!(classify(b"\0asm\x0d\0\x01\0").is_ok());
    }

    #[test]
    fn a_cache_file_others_can_write_is_not_used() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("factory-cache-{}", uuid::Uuid::new_v4()));
        let file = dir.join("x.cwasm");
        write_atomically(&file, b"artifact").expect("write");
        assert_eq!(std::fs::metadata(&dir).expect("dir").permissions().mode() & 0o777, 0o700);
        assert_eq!(std::fs::metadata(&file).expect("file").permissions().mode() & 0o777, 0o600);
        assert!(cache_file_is_ours(&file));
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        assert!(!cache_file_is_ours(&file));
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod dir");
        assert!(!cache_file_is_ours(&file), "a directory others can write lets them swap the file");
        let link = std::env::temp_dir().join(format!("factory-cache-link-{}", uuid::Uuid::new_v4()));
        std::os::unix::fs::symlink(&file, &link).expect("symlink");
        assert!(!cache_file_is_ours(&link));
        let _ = std::fs::remove_file(link);
        let _ = std::fs::remove_dir_all(dir);
    }
}
