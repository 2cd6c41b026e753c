//! The consent policy of the service: what a start request must carry before a factory
//! runs, and the one derivation of the key consent is about ([`trust_key`]). A component is
//! trusted by its sha256; a script factory (JS, TS) by its source's sha256, because the
//! runner that executes it ships in this binary and is the same for every script. The
//! consent question itself ([`Question`]: what is asked about, whichever door asks it) is
//! here too: MCP asks it as an elicitation form, the HTTP door holds it as a pending
//! approval ([`super::Approvals`]) for the owner to answer.

use crate::error::Error;
use crate::Factory;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The consent a start request carries.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Consent {
    /// None: the service runs only a component its own trust check accepts.
    #[default]
    None,
    /// The user approved exactly this trust key (see [`trust_key`]): the service runs the
    /// factory only if what it loads has that key, so a file swapped after the client read
    /// it is refused, not run.
    Sha256(String),
    /// The caller consents to whatever the service loads (a front door without files of its
    /// own to show, e.g. the HTTP API, whose bearer token is the user's).
    Any,
    /// None, but the caller can wait for the owner's answer: a start the trust check refuses
    /// becomes a pending approval ([`super::Approvals`]) instead of a refusal.
    Ask,
}

/// What a consent question asks to do with the factory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Operation {
    /// Start a run.
    Run,
    /// Resume a run whose factory is not trusted (any more, or a new component).
    Resume,
    /// Register a body the caller (an agent) wrote, in its session.
    Author,
}

impl Operation {
    /// The operation as the question names it (`run`, `resume`, `author`).
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Run => "run",
            Operation::Resume => "resume",
            Operation::Author => "author",
        }
    }
}

/// One consent question: what is asked about, whichever door asks it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Question {
    /// The factory's name.
    pub factory: String,
    /// The sha256 approved (the trust key: a script's source, else the component).
    pub sha256: String,
    /// What is asked for.
    pub operation: Operation,
    /// Who answers its subagents.
    pub backend: String,
    /// The limits it would run under (the declared ones with the request's overrides).
    pub limits: crate::Limits,
    /// Its declared phases.
    pub phases: Vec<String>,
    /// The host directories it could read.
    pub grants: Vec<String>,
}

/// Whether a trust key may run without consent in the request: built on this machine or
/// approved before. The service checks it itself, whatever the client did.
pub type TrustCheck = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// What consent to run `factory` is about: the sha256 of its script source for a script
/// factory, else of its component. The one place this is decided.
pub fn trust_key(factory: &Factory) -> &str {
    factory.component.script.as_ref().map_or(&factory.component.hash, |s| &s.hash)
}

/// What consent to run a registered factory is about, as [`trust_key`] says for the
/// factory it loads.
pub fn registration_trust_key(registration: &crate::store::Registration) -> &str {
    registration.script.as_ref().map_or(&registration.hash, |s| &s.sha256)
}

/// Refuse a factory whose trust key `key` the request's `consent` does not cover and
/// `trusted` does not accept (`authored`: the session's own authored factory, which needs
/// no consent). `what` names it in the error.
pub fn consented(trusted: &TrustCheck, consent: &Consent, authored: bool, key: &str, what: &str) -> Result<(), Error> {
    match consent {
        Consent::Sha256(approved) if approved != key => Err(Error::NotApproved(format!(
            "{what} is not what was approved: the approval was for sha256 {approved}, the file now has sha256 \
             {key} (it changed after it was read for consent); nothing ran"
        ))),
        Consent::Sha256(_) | Consent::Any => Ok(()),
        Consent::None | Consent::Ask if authored || trusted(key) => Ok(()),
        Consent::None | Consent::Ask => Err(Error::NotApproved(format!(
            "{what} (sha256 {key}) is not trusted on this machine and the request carries no consent: \
             run it with --yes, or approve it with `factory trust`"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(keys: &'static [&'static str]) -> TrustCheck {
        Arc::new(move |key: &str| keys.contains(&key))
    }

    #[test]
    fn an_approval_covers_exactly_its_key() {
        let none = check(&[]);
        assert!(consented(&none, &Consent::Sha256("aa".into()), false, "aa", "f").is_ok());
        let swapped = consented(&none, &Consent::Sha256("aa".into()), false, "bb", "f").unwrap_err();
        assert!(matches!(swapped, Error::NotApproved(_)), "{swapped}");
        assert!(swapped.to_string().contains("changed after it was read"), "{swapped}");
        // An approval of one key does not make another trusted, even a trusted-looking one.
        assert!(consented(&none, &Consent::None, false, "aa", "f").is_err());
    }

    #[test]
    fn without_consent_only_trusted_or_authored_keys_run() {
        let trusted = check(&["aa"]);
        assert!(consented(&trusted, &Consent::None, false, "aa", "f").is_ok());
        assert!(consented(&trusted, &Consent::None, false, "bb", "f").is_err());
        assert!(consented(&trusted, &Consent::None, true, "bb", "f").is_ok());
        assert!(consented(&trusted, &Consent::Any, false, "bb", "f").is_ok());
    }
}
