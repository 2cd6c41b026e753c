//! The error every store answers with: [`StoreError`], typed by what failed (the store is
//! busy, of another layout, unsafe, damaged, its database or file failed, a record could not
//! be encoded, its writer failed or is gone, PostgreSQL failed, the worker was fenced), each
//! variant keeping its cause as
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
    Corrupt(Damage),
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
    /// PostgreSQL failed (connecting, a query, a commit); the URL in the message is redacted.
    Postgres { url: String, source: Arc<tokio_postgres::Error> },
    /// No connection could be taken from the pool of the PostgreSQL store.
    Pool { url: String, source: Arc<deadpool_postgres::PoolError> },
    /// The store URL cannot be used (shown redacted).
    Url { url: String, reason: String },
    /// The store URL does not parse as a PostgreSQL connection string (shown redacted).
    UrlParse { url: String, source: Arc<tokio_postgres::Error> },
    /// The connection pool of the PostgreSQL store could not be built.
    PoolBuild { url: String, source: Arc<deadpool_postgres::BuildError> },
    /// The shared store could not be written for `seconds` (its connections failing), past
    /// this worker's lease: the commit is abandoned and the worker's attempts stop.
    Unavailable { url: String, seconds: f64, source: Arc<StoreError> },
    /// This worker's lease on the shared store was lost (it expired, or another worker
    /// fenced it by raising its generation): its writes are refused.
    Fenced { worker: String, generation: i64 },
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Locked(path) => write!(f, "the store {} is in use by another factory process", path.display()),
            StoreError::Version { found, expected } if found > expected => write!(
                f,
                "the store was written with schema version {found}, by a newer factory than this build (which reads \
                 version {expected}): use that release or a newer one"
            ),
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
            // The root cause only: the layers between (the pool's, the driver's) each repeat
            // their own cause in their message.
            StoreError::Postgres { url, source } => write!(f, "PostgreSQL store {url}: {}", root(&**source)),
            StoreError::Pool { url, source } => write!(f, "PostgreSQL store {url}: no connection: {}", root(&**source)),
            StoreError::Url { url, reason } => write!(f, "store URL {url}: {reason}"),
            StoreError::UrlParse { url, source } => write!(f, "store URL {url}: {source}"),
            StoreError::PoolBuild { url, source } => write!(f, "store URL {url}: {source}"),
            StoreError::Fenced { worker, generation } => {
                write!(
                    f,
                    "worker {worker} (generation {generation}) lost its lease on the store: its writes are refused"
                )
            }
            StoreError::Unavailable { url, seconds, .. } => {
                write!(f, "PostgreSQL store {url} could not be written for {seconds:.1} s, past this worker's lease")
            }
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StoreError::Unsafe(e) => Some(&**e),
            StoreError::Corrupt(damage) => damage.cause.as_deref().map(|c| c as &(dyn std::error::Error + 'static)),
            StoreError::Database(e) => Some(&**e),
            StoreError::File { source, .. } => Some(&**source),
            StoreError::Encode(e) => Some(&**e),
            StoreError::Writer(e) => Some(&**e),
            StoreError::WriteFailed(e) => Some(&**e),
            StoreError::Postgres { source, .. } => Some(&**source),
            StoreError::Pool { source, .. } => Some(&**source),
            StoreError::UrlParse { source, .. } => Some(&**source),
            StoreError::PoolBuild { source, .. } => Some(&**source),
            StoreError::Unavailable { source, .. } => Some(&**source),
            StoreError::Locked(_)
            | StoreError::Version { .. }
            | StoreError::Closed
            | StoreError::Url { .. }
            | StoreError::Fenced { .. } => None,
        }
    }
}

impl StoreError {
    /// Whether this failure is the shared store being out of reach for this worker (the
    /// database away past its lease, or the lease lost): the attempts it stops end `halted`,
    /// resumable, not `error`.
    pub fn is_outage(&self) -> bool {
        match self {
            StoreError::Unavailable { .. } | StoreError::Fenced { .. } => true,
            StoreError::WriteFailed(inner) => inner.is_outage(),
            _ => false,
        }
    }
}

impl From<serde_json::Error> for StoreError {
    fn from(e: serde_json::Error) -> Self {
        StoreError::Encode(Arc::new(e))
    }
}

/// The innermost cause of `error` (itself when it has none).
fn root<'e>(error: &'e (dyn std::error::Error + 'static)) -> &'e (dyn std::error::Error + 'static) {
    let mut at = error;
    while let Some(next) = at.source() {
        at = next;
    }
    at
}

/// What of a store is damaged ([`StoreError::Corrupt`]): said in words, with the cause when
/// a decoder said why (kept as the error's [`std::error::Error::source`]).
#[derive(Debug, Clone)]
pub struct Damage {
    /// What cannot be read.
    what: String,
    /// Why, when something said so.
    cause: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl Damage {
    /// What cannot be read.
    pub fn what(&self) -> &str {
        &self.what
    }
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.cause {
            Some(cause) => write!(f, "{}: {cause}", self.what),
            None => f.write_str(&self.what),
        }
    }
}

impl From<String> for Damage {
    fn from(what: String) -> Self {
        Damage { what, cause: None }
    }
}

impl From<&str> for Damage {
    fn from(what: &str) -> Self {
        Damage { what: what.to_string(), cause: None }
    }
}

/// A record or value of the store that cannot be read: [`StoreError::Corrupt`], saying what
/// and why (an error, kept as the source, or a text saying what is wrong with it).
pub(crate) fn corrupt(what: &str, cause: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> StoreError {
    StoreError::Corrupt(Damage { what: what.to_string(), cause: Some(Arc::from(cause.into())) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn damage_keeps_its_cause_as_the_source_and_says_it() {
        let json = serde_json::from_str::<u8>("x").expect_err("not a number");
        let shown = json.to_string();
        let e = corrupt("progress", json);
        assert_eq!(e.to_string(), format!("the store is corrupt: progress: {shown}"));
        assert!(e.source().and_then(|s| s.downcast_ref::<serde_json::Error>()).is_some(), "{e:?}");
        // A cause said in words reads the same; a damage without one has no source.
        let said = corrupt("progress", "a chunk entry is cut short");
        assert_eq!(said.to_string(), "the store is corrupt: progress: a chunk entry is cut short");
        let bare = StoreError::Corrupt("run r".into());
        assert!(bare.source().is_none(), "{bare:?}");
        assert_eq!(bare.to_string(), "the store is corrupt: run r");
        assert!(matches!(&bare, StoreError::Corrupt(d) if d.what() == "run r"));
    }
}
