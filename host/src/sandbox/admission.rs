//! What a worker of a shared store checks before it runs what the database says
//! ([`ClusterTrust`]): anyone who can write the database must not get code or files on a
//! worker beyond what that worker's owner allowed. Three checks, each refused with a
//! [`TrustError`] and nothing of the guest run:
//!
//! - a component, JS runner or script source read from the store is hashed again and must
//!   have the sha256 it was asked for ([`check_bytes`]);
//! - consent is bound to what it was given for: when a run is started (or resumed by a
//!   caller) its record gets a seal over its run id, session, args, component (or script)
//!   hash, backend, grants, callers' working directories and limits ([`ClusterTrust::seal`]);
//!   a worker executing a run it did not start itself (a queued start, an automatic
//!   recovery) refuses a record whose seal does not match ([`ClusterTrust::verify`]). The
//!   seal is an HMAC-SHA256 keyed by the cluster's shared token (`--token-file` /
//!   `FACTORY_TOKEN`), which the database does not hold, so a row edited by hand cannot be sealed again; without a token it is a plain
//!   SHA-256 of the same encoding, which catches an edit of one field but not a writer who
//!   recomputes it (documented in README's security model);
//! - a run's grants are mounted only when each lies under a root this worker allows
//!   (`factory serve --allow-grant-root DIR`, [`ClusterTrust::check_grants`]): by default a
//!   worker mounts no grant of a run it did not start itself.

use crate::model::limits::Limits;
use crate::model::recorded::BackendRef;
use crate::model::script::ScriptRef;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Why a worker refuses to run what the shared store says.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrustError {
    /// Bytes read from the store do not hash to the sha256 they were stored under.
    #[error(
        "component_mismatch: the stored {what} asked for as sha256 {expected} hashes to {actual}; refusing to load it"
    )]
    ComponentMismatch {
        /// What was read (`component`, `JS runner`, `script source`).
        what: &'static str,
        /// The sha256 asked for.
        expected: String,
        /// The sha256 of the bytes read.
        actual: String,
    },
    /// The run's record carries no consent seal (written by hand, or by a build that did not
    /// seal runs).
    #[error(
        "consent_mismatch: run `{0}` carries no consent seal; refusing to run what the database says (start it again)"
    )]
    ConsentMissing(String),
    /// The run's component, backend, grants, limits, args or session are not what its
    /// consent was given for.
    #[error("consent_mismatch: the record of run `{0}` does not match the consent it was started with (its component, backend, grants, limits or args were changed in the store); refusing to run it")]
    ConsentMismatch(String),
    /// A granted directory lies under no root this worker allows.
    #[error("grant_not_allowed: run `{run_id}` is granted `{grant}`, which is under no directory this worker allows (factory serve --allow-grant-root DIR); refusing to mount it")]
    GrantNotAllowed {
        /// The run.
        run_id: String,
        /// The granted directory.
        grant: String,
    },
}

impl TrustError {
    /// The failure kind a run refused so ends with (`failure.type` `sandbox`).
    pub fn kind(&self) -> &'static str {
        match self {
            TrustError::ComponentMismatch { .. } => "component_mismatch",
            TrustError::ConsentMissing(_) | TrustError::ConsentMismatch(_) => "consent_mismatch",
            TrustError::GrantNotAllowed { .. } => "grant_not_allowed",
        }
    }
}

/// Refuse `bytes` read from the store as `what` unless their sha256 is `expected`.
pub fn check_bytes(what: &'static str, expected: &str, bytes: &[u8]) -> Result<(), TrustError> {
    let actual = hex::encode(Sha256::digest(bytes));
    if actual == expected {
        Ok(())
    } else {
        Err(TrustError::ComponentMismatch { what, expected: expected.to_string(), actual })
    }
}

/// What a run's consent is bound to: the values one attempt runs with.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Bound<'a> {
    /// The run.
    pub run_id: &'a str,
    /// Its owner session.
    pub session: &'a str,
    /// Its arguments (JSON text).
    pub args: &'a str,
    /// The component's sha256 (for a script factory, the JS runner's).
    pub component: &'a str,
    /// The script a script factory runs.
    pub script: Option<&'a ScriptRef>,
    /// The backend.
    pub backend: &'a BackendRef,
    /// The granted directories.
    pub grants: &'a [String],
    /// The callers' working directories its subagents must not see.
    pub caller_dirs: &'a [String],
    /// The effective limits.
    pub limits: &'a Limits,
    /// The limit overrides given so far.
    pub overrides: &'a Limits,
}

/// The trust settings of a worker of a shared store.
#[derive(Debug, Clone, Default)]
pub struct ClusterTrust {
    /// The key consent seals are made with (the cluster's shared token); `None`: a plain
    /// digest.
    key: Option<Arc<[u8]>>,
    /// Directories under which this worker mounts the grants of runs it did not start.
    grant_roots: Vec<PathBuf>,
}

/// The version tag of the sealed encoding.
const SEAL_CONTEXT: &[u8] = b"factory consent seal v1\0";

impl ClusterTrust {
    /// Seals made with `key` (the cluster's shared token, if any); grants mounted only under
    /// `grant_roots` (canonical directories).
    pub fn new(key: Option<&str>, grant_roots: Vec<PathBuf>) -> ClusterTrust {
        ClusterTrust { key: key.map(|k| Arc::from(k.as_bytes())), grant_roots }
    }

    /// Whether seals are keyed (a shared token was given).
    pub fn keyed(&self) -> bool {
        self.key.is_some()
    }

    /// The seal of `bound`: hex HMAC-SHA256 under the key, else hex SHA-256.
    pub fn seal(&self, bound: &Bound<'_>) -> String {
        let message = sealed_message(bound);
        match &self.key {
            Some(key) => hex::encode(mac_of(key, &message).finalize().into_bytes()),
            None => hex::encode(Sha256::digest(&message)),
        }
    }

    /// Refuse a run whose recorded `seal` is missing or is not the seal of `bound`.
    pub fn verify(&self, seal: Option<&str>, bound: &Bound<'_>) -> Result<(), TrustError> {
        let Some(seal) = seal else { return Err(TrustError::ConsentMissing(bound.run_id.to_string())) };
        let message = sealed_message(bound);
        let same = match (hex::decode(seal), &self.key) {
            // A MAC is compared in constant time (`Mac::verify_slice`).
            (Ok(tag), Some(key)) => mac_of(key, &message).verify_slice(&tag).is_ok(),
            (Ok(digest), None) => digest[..] == Sha256::digest(&message)[..],
            (Err(_), _) => false,
        };
        if same {
            Ok(())
        } else {
            Err(TrustError::ConsentMismatch(bound.run_id.to_string()))
        }
    }

    /// Refuse a grant of run `run_id` that lies under none of this worker's allowed roots.
    /// Grants are canonical paths (checked again before mounting), compared by components.
    pub fn check_grants(&self, run_id: &str, grants: &[String]) -> Result<(), TrustError> {
        for grant in grants {
            if !self.grant_roots.iter().any(|root| Path::new(grant).starts_with(root)) {
                return Err(TrustError::GrantNotAllowed { run_id: run_id.to_string(), grant: grant.clone() });
            }
        }
        Ok(())
    }
}

/// The bytes a seal covers: a version tag, then `bound` as JSON.
fn sealed_message(bound: &Bound<'_>) -> Vec<u8> {
    let mut message = SEAL_CONTEXT.to_vec();
    // Serializing plain strings, options and numbers into a Vec cannot fail.
    message.extend(serde_json::to_vec(bound).unwrap_or_default());
    message
}

/// HMAC-SHA256 (RFC 2104, RustCrypto's `hmac`) of `message` under `key`, not yet finalized.
fn mac_of(key: &[u8], message: &[u8]) -> Hmac<sha2_11::Sha256> {
    // HMAC takes a key of any length (a longer one than a block is hashed first).
    let mut mac = <Hmac<sha2_11::Sha256> as KeyInit>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
    mac.update(message);
    mac
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231() {
        // Test case 2 of RFC 4231.
        let mac = mac_of(b"Jefe", b"what do ya want for nothing?").finalize().into_bytes();
        assert_eq!(hex::encode(mac), "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
        // Test case 6: a key longer than the block.
        let mac =
            mac_of(&[0xaa; 131], b"Test Using Larger Than Block-Size Key - Hash Key First").finalize().into_bytes();
        assert_eq!(hex::encode(mac), "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
    }

    #[test]
    fn a_seal_covers_every_bound_value_and_the_key() {
        let backend = BackendRef::named("local");
        let limits = Limits::default();
        let grants = vec!["/srv/data".to_string()];
        let callers = vec!["/home/me/project".to_string()];
        let bound = Bound {
            run_id: "r",
            session: "s",
            args: "{}",
            component: "aa",
            script: None,
            backend: &backend,
            grants: &grants,
            caller_dirs: &callers,
            limits: &limits,
            overrides: &limits,
        };
        let keyed = ClusterTrust::new(Some("k".repeat(32).as_str()), Vec::new());
        let seal = keyed.seal(&bound);
        assert!(keyed.verify(Some(&seal), &bound).is_ok());
        let other_grants = vec!["/home/me/.ssh".to_string()];
        let changed = Bound { grants: &other_grants, ..bound };
        assert_eq!(keyed.verify(Some(&seal), &changed), Err(TrustError::ConsentMismatch("r".into())));
        let other_backend = BackendRef::named("openai");
        assert!(keyed.verify(Some(&seal), &Bound { backend: &other_backend, ..bound }).is_err());
        assert!(keyed.verify(Some(&seal), &Bound { component: "bb", ..bound }).is_err());
        // A caller's directory taken off the record would show it to the run's subagents.
        assert!(keyed.verify(Some(&seal), &Bound { caller_dirs: &[], ..bound }).is_err());
        let raised = Limits { max_total_subagents: Some(1_000_000), ..Limits::default() };
        assert!(keyed.verify(Some(&seal), &Bound { limits: &raised, ..bound }).is_err());
        assert_eq!(keyed.verify(None, &bound), Err(TrustError::ConsentMissing("r".into())));
        // A seal made without the key (what a database writer can compute) is refused.
        let unkeyed = ClusterTrust::default().seal(&bound);
        assert!(keyed.verify(Some(&unkeyed), &bound).is_err());
    }

    #[test]
    fn grants_are_allowed_only_under_a_root() {
        let trust = ClusterTrust::new(None, vec![PathBuf::from("/srv/data")]);
        assert!(trust.check_grants("r", &["/srv/data".into(), "/srv/data/a".into()]).is_ok());
        assert!(trust.check_grants("r", &["/srv/database".into()]).is_err());
        assert!(ClusterTrust::default().check_grants("r", &["/srv/data".into()]).is_err());
        assert!(ClusterTrust::default().check_grants("r", &[]).is_ok());
    }
}
