//! The error every store answers with: [`StoreError`], typed by what failed (the store is
//! busy, of another layout, unsafe, damaged, its database or file failed, a record could not
//! be encoded, its writer failed or is gone), each variant keeping its cause as
//! [`std::error::Error::source`]. Shared by every store implementation.

use std::path::PathBuf;
use std::sync::Arc;

/// A store failure, with its cause ([`std::error::Error::source`] is the cause itself, not
/// a wrapper). Never a cache miss. Cloneable (one failed commit is the answer of every write
/// waiting on it), so causes are shared.
#[derive(Debug, Clone)]
pub enum StoreError {
    /// Another process holds the store (redb allows one).
    Locked(PathBuf),
    /// Written by a newer (or unknown) layout.
    Version { found: u64, expected: u64 },
    /// The state directory or the store file is not safely ours (someone else's, writable by
    /// others, a symlink): refused, never used.
    Unsafe(Arc<crate::access::AccessError>),
    /// The file is damaged or holds what this build did not write.
    Corrupt(String),
    /// The database failed (I/O underneath, a transaction, a commit).
    Database(Arc<redb::Error>),
    /// The store file could not be created or opened.
    File { path: PathBuf, source: Arc<std::io::Error> },
    /// A record could not be encoded.
    Encode(Arc<serde_json::Error>),
    /// The writer thread could not be started.
    Writer(Arc<std::io::Error>),
    /// A commit failed earlier (the first failure is kept); the store refuses further writes.
    WriteFailed(Arc<StoreError>),
    /// The writer is gone.
    Closed,
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Locked(path) => write!(f, "the store {} is in use by another factory process", path.display()),
            StoreError::Version { found, expected } => {
                write!(f, "the store was written with schema version {found}; this build reads version {expected}")
            }
            StoreError::Unsafe(e) => write!(f, "{e}"),
            StoreError::Corrupt(what) => write!(f, "the store is corrupt: {what}"),
            StoreError::Database(e) => write!(f, "store database: {e}"),
            StoreError::File { path, source } => write!(f, "store file {}: {source}", path.display()),
            StoreError::Encode(e) => write!(f, "encoding a store record: {e}"),
            StoreError::Writer(e) => write!(f, "cannot start the store writer: {e}"),
            StoreError::WriteFailed(e) => write!(f, "a store commit failed: {e}"),
            StoreError::Closed => write!(f, "the store is closed"),
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StoreError::Unsafe(e) => Some(&**e),
            StoreError::Database(e) => Some(&**e),
            StoreError::File { source, .. } => Some(&**source),
            StoreError::Encode(e) => Some(&**e),
            StoreError::Writer(e) => Some(&**e),
            StoreError::WriteFailed(e) => Some(&**e),
            StoreError::Locked(_) | StoreError::Version { .. } | StoreError::Corrupt(_) | StoreError::Closed => None,
        }
    }
}

impl From<serde_json::Error> for StoreError {
    fn from(e: serde_json::Error) -> Self {
        StoreError::Encode(Arc::new(e))
    }
}

/// A record or value of the store that cannot be read: [`StoreError::Corrupt`], saying what.
pub(crate) fn corrupt(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{what}: {e}"))
}
