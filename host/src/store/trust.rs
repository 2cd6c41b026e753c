//! The trust store: which components (by sha256) the user has agreed to run on this
//! machine. Trust is consent, not privilege — it only decides whether the CLI asks before a
//! run starts; the sandbox enforces the same limits and grants on a trusted component as on
//! any other, and nothing in [`crate::engine::host::Host`] reads this store.
//!
//! The store is a small JSON file, `<state-dir>/trusted.json`, rather than a table in the
//! redb store: it must be readable and writable while another process holds the redb lock
//! (a `factory serve`, a long run), and a user can read, diff or delete it by hand. Every
//! write takes an exclusive lock on `<state-dir>/trusted.json.lock` for its
//! read-modify-write (so concurrent writers never lose an entry) and replaces the file
//! atomically (temporary file, fsync, rename). A file that does not parse is an error, never
//! an empty store: trust fails closed. The directory is created `0700`, the file and its
//! lock `0600` (see [`crate::access`]).

use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The trust store's file name inside the state directory.
pub const FILE_NAME: &str = "trusted.json";

/// The version of the file format this host writes.
const FORMAT_VERSION: u32 = 1;

/// Why a component is trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum TrustSource {
    /// Built on this machine by `factory build` / `factory run <crate-dir>`.
    Built,
    /// Approved by the user: `factory trust`, or "y" at the consent prompt.
    Approved,
}

/// One trusted component.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrustedComponent {
    /// The component's sha256 (hex), its identity.
    pub sha256: String,
    /// Its factory name when it was trusted (informational).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Where it was when it was trusted (informational).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Why it is trusted.
    pub source: TrustSource,
    /// When it was trusted (RFC 3339).
    pub added_at: String,
}

impl TrustedComponent {
    /// An entry for `sha256` trusted now.
    pub fn new(sha256: impl Into<String>, source: TrustSource) -> Self {
        TrustedComponent {
            sha256: sha256.into(),
            name: None,
            path: None,
            source,
            added_at: crate::store::records_timestamp(),
        }
    }
}

/// The file's contents.
#[derive(Debug, Default, Serialize, Deserialize)]
struct TrustFile {
    version: u32,
    components: Vec<TrustedComponent>,
}

/// Why the trust store could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    /// The file (or its lock) could not be read or opened.
    #[error("cannot read the trust store `{path}`: {source}")]
    Read { path: String, source: std::io::Error },
    /// The file is not a trust store this host understands.
    #[error("the trust store `{path}` is unreadable ({message}); fix or delete it (every component will then need approval again)")]
    Corrupt { path: String, message: String },
    /// The file could not be written.
    #[error("cannot write the trust store `{path}`: {source}")]
    Write { path: String, source: std::io::Error },
    /// Its directory is not safely ours.
    #[error(transparent)]
    Access(crate::access::AccessError),
}

/// The trust store of one state directory.
#[derive(Debug, Clone)]
pub struct TrustStore {
    path: PathBuf,
}

impl TrustStore {
    /// The trust store in `state_dir` (nothing is read or created yet).
    pub fn in_state_dir(state_dir: &Path) -> Self {
        TrustStore { path: state_dir.join(FILE_NAME) }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every trusted component, oldest first (empty when there is no file yet).
    pub fn list(&self) -> Result<Vec<TrustedComponent>, TrustError> {
        Ok(self.read()?.components)
    }

    /// The entry for `sha256`, if it is trusted.
    pub fn get(&self, sha256: &str) -> Result<Option<TrustedComponent>, TrustError> {
        Ok(self.read()?.components.into_iter().find(|c| c.sha256.eq_ignore_ascii_case(sha256)))
    }

    /// Is `sha256` trusted?
    pub fn is_trusted(&self, sha256: &str) -> Result<bool, TrustError> {
        Ok(self.get(sha256)?.is_some())
    }

    /// Trust `entry`'s component. Returns false when it was trusted already (the existing
    /// entry is kept: the first reason to trust it stays on record).
    pub fn trust(&self, entry: TrustedComponent) -> Result<bool, TrustError> {
        self.update(|file| {
            if file.components.iter().any(|c| c.sha256.eq_ignore_ascii_case(&entry.sha256)) {
                return false;
            }
            file.components.push(entry);
            true
        })
    }

    /// Stop trusting `sha256`. Returns false when it was not trusted.
    pub fn revoke(&self, sha256: &str) -> Result<bool, TrustError> {
        self.update(|file| {
            let before = file.components.len();
            file.components.retain(|c| !c.sha256.eq_ignore_ascii_case(sha256));
            file.components.len() != before
        })
    }

    fn shown(&self) -> String {
        self.path.display().to_string()
    }

    fn read(&self) -> Result<TrustFile, TrustError> {
        // Ours and nobody else's to write, never through a symlink: a trust file planted by
        // someone else would choose what runs without consent.
        let text = match crate::access::read_private_file(&self.path) {
            Ok(Some(text)) => text,
            Ok(None) => return Ok(TrustFile::default()),
            Err(source) => return Err(TrustError::Read { path: self.shown(), source }),
        };
        let file: TrustFile = serde_json::from_slice(&text)
            .map_err(|e| TrustError::Corrupt { path: self.shown(), message: e.to_string() })?;
        if file.version > FORMAT_VERSION {
            let message = format!("format version {} is newer than this host's {FORMAT_VERSION}", file.version);
            return Err(TrustError::Corrupt { path: self.shown(), message });
        }
        Ok(file)
    }

    /// Read-modify-write under the lock; writes only when `change` says it changed.
    fn update(&self, change: impl FnOnce(&mut TrustFile) -> bool) -> Result<bool, TrustError> {
        let write_err = |source| TrustError::Write { path: self.shown(), source };
        if let Some(dir) = self.path.parent() {
            crate::access::private_state_dir(dir).map_err(TrustError::Access)?;
        }
        let lock_path = self.path.with_extension("json.lock");
        let lock = crate::access::private_file_options()
            .truncate(false)
            .open(&lock_path)
            .map_err(|source| TrustError::Read { path: lock_path.display().to_string(), source })?;
        lock.lock().map_err(|source| TrustError::Read { path: lock_path.display().to_string(), source })?;
        let mut file = self.read()?;
        if !change(&mut file) {
            return Ok(false);
        }
        file.version = FORMAT_VERSION;
        let mut text = serde_json::to_vec_pretty(&file)
            .map_err(|e| TrustError::Corrupt { path: self.shown(), message: e.to_string() })?;
        text.push(b'\n');
        let tmp = self.path.with_extension(format!("json.tmp{}", std::process::id()));
        let written = (|| {
            let mut out = crate::access::create_private_file(&tmp)?;
            out.write_all(&text)?;
            out.sync_all()?;
            std::fs::rename(&tmp, &self.path)
        })();
        if let Err(source) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(write_err(source));
        }
        // The lock is released when `lock` drops.
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("factory-trust-{tag}-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    #[test]
    fn trusts_lists_and_revokes() {
        let dir = temp_dir("roundtrip");
        let store = TrustStore::in_state_dir(&dir);
        assert!(store.list().expect("empty store").is_empty());
        assert!(!store.is_trusted("ab").expect("read"));
        assert!(store.trust(TrustedComponent::new("ab", TrustSource::Approved)).expect("trust"));
        assert!(!store.trust(TrustedComponent::new("AB", TrustSource::Built)).expect("trust again"));
        assert!(store.is_trusted("ab").expect("read"));
        let again = TrustStore::in_state_dir(&dir);
        assert_eq!(again.list().expect("list").len(), 1);
        assert_eq!(again.get("ab").expect("get").map(|c| c.source), Some(TrustSource::Approved));
        assert!(again.revoke("ab").expect("revoke"));
        assert!(!again.revoke("ab").expect("revoke again"));
        assert!(!store.is_trusted("ab").expect("read"));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_corrupt_file_fails_closed() {
        let dir = temp_dir("corrupt");
        std::fs::write(dir.join(FILE_NAME), b"{ not json").expect("write");
        let store = TrustStore::in_state_dir(&dir);
        assert!(matches!(store.is_trusted("ab"), Err(TrustError::Corrupt { .. })));
        assert!(matches!(
            store.trust(TrustedComponent::new("ab", TrustSource::Approved)),
            Err(TrustError::Corrupt { .. })
        ));
        // The broken file was left alone for the user to inspect.
        assert_eq!(std::fs::read(dir.join(FILE_NAME)).expect("read"), b"{ not json");
        let _ = std::fs::remove_dir_all(dir);
    }
}
