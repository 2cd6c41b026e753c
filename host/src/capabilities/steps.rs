//! Steps (`ctx.step-get`, `ctx.step-put`): journaled values under keys the guest chooses.
//! This module owns their semantics and per-run state: which step keys the run has journaled
//! (fingerprints, so a key never written needs no store read, and `maxSteps` counts distinct
//! keys) with the values the attempt's load found, and the checks a value passes before it
//! is journaled (size, depth, JSON). Other values go through the attempt's journal view
//! ([`super::attempt::Attempt`]). The hooks reach an attempt's steps through [`StepsView`].

use super::abort::{Abort, StepError};
use super::attempt::Attempt;
use crate::model::sandbox_limits::SandboxLimitKind;
use crate::store::journal::{fingerprint, Fingerprints, Loaded, LoadedEntries};
use std::sync::{Arc, Mutex};

/// How the hooks reach the steps of the attempt a store runs (the run's state in the store
/// data implements it).
pub(crate) trait StepsView: Send + 'static {
    /// The attempt's steps.
    fn steps(&self) -> &Steps;
}

/// The steps of one attempt.
pub(crate) struct Steps {
    attempt: Arc<Attempt>,
    keys: Mutex<Keys>,
}

/// Every journaled step key, all attempts.
struct Keys {
    /// The keys the journal held at load, with the values that fit its budget (a value this
    /// attempt replaced is forgotten there).
    loaded: LoadedEntries,
    /// Fingerprints of the keys this attempt journaled first.
    added: Fingerprints,
}

impl Keys {
    fn knows(&mut self, fingerprint: u64) -> bool {
        self.loaded.knows(fingerprint) || self.added.contains(&fingerprint)
    }
}

impl Steps {
    /// Steps over `attempt`, knowing the keys (and values) the journal's load found.
    pub(crate) fn new(attempt: Arc<Attempt>, loaded: LoadedEntries) -> Steps {
        Steps { attempt, keys: Mutex::new(Keys { loaded, added: Fingerprints::default() }) }
    }

    /// `ctx.step-get`: a read of the journal as loaded plus this attempt's writes.
    pub(crate) fn get(&self, key: &str) -> Result<Option<String>, Abort> {
        let attempt = &self.attempt;
        if let Some(abort) = attempt.stopping() {
            return Err(abort);
        }
        attempt.cap(SandboxLimitKind::MaxStepKeyBytes, "step key", key.len(), attempt.sandbox.max_step_key_bytes)?;
        let span = crate::trace::step(&attempt.parent_span(), || crate::store::journal::fingerprint(key));
        let found = self.lookup(key);
        if !span.is_disabled() {
            span.record("factory.step.hit", matches!(found, Ok(Some(_))));
        }
        found
    }

    /// The journaled value of `key`, if any.
    fn lookup(&self, key: &str) -> Result<Option<String>, Abort> {
        let attempt = &self.attempt;
        // Hashed only if the lookup needs it: a replay in journal order finds each key as
        // the entry after the last one found.
        let mut hashed = None;
        let known = {
            let mut guard = self.keys.lock().unwrap_or_else(|p| p.into_inner());
            let keys = &mut *guard;
            match keys.loaded.find(key, &mut hashed) {
                Loaded::Value(value) => match std::str::from_utf8(value) {
                    Ok(value) => return Ok(Some(value.to_string())),
                    // Not as the journal writes it: read again from the journal, which says
                    // why.
                    Err(_) => true,
                },
                Loaded::Unloaded => true,
                Loaded::Absent => keys.added.contains(hashed.get_or_insert_with(|| fingerprint(key))),
            }
        };
        if let Some(value) = attempt.cached_step(key) {
            return Ok(Some(value));
        }
        // A key never journaled needs no read (every new step asks first).
        if !known {
            return Ok(None);
        }
        attempt.read_step(key).map_err(|e| attempt.abort(Abort::Storage(e)))
    }

    /// `ctx.step-put`: validate, then journal (durable by the next commit).
    pub(crate) fn put(&self, key: String, value: String) -> Result<(), StepError> {
        let attempt = &self.attempt;
        let sandbox = &attempt.sandbox;
        if let Some(abort) = attempt.stopping() {
            return Err(StepError::Abort(abort));
        }
        attempt
            .cap(SandboxLimitKind::MaxStepKeyBytes, "step key", key.len(), sandbox.max_step_key_bytes)
            .map_err(StepError::Abort)?;
        if value.len() > sandbox.max_step_bytes {
            let message =
                format!("step `{key}` value is {} bytes, over the {} byte limit", value.len(), sandbox.max_step_bytes);
            return Err(StepError::Abort(
                attempt.abort(Abort::SandboxLimit { kind: SandboxLimitKind::MaxStepBytes, message }),
            ));
        }
        let depth = crate::model::json::depth(&value);
        if depth > sandbox.max_json_depth {
            let limit = sandbox.max_json_depth;
            return Err(StepError::InvalidJson(format!(
                "step `{key}`: nested {depth} deep, over the limit of {limit}"
            )));
        }
        if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(&value) {
            return Err(StepError::InvalidJson(format!("step `{key}`: not JSON: {e}")));
        }
        // Held across the write, so two puts of new keys cannot both pass `maxSteps`.
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let fingerprint = fingerprint(&key);
        let known = keys.knows(fingerprint);
        if !known && keys.loaded.len() + keys.added.len() >= sandbox.max_steps {
            drop(keys);
            let message = format!("the run has journaled {} distinct steps, the limit (maxSteps)", sandbox.max_steps);
            return Err(StepError::Abort(
                attempt.abort(Abort::SandboxLimit { kind: SandboxLimitKind::MaxSteps, message }),
            ));
        }
        if let Err(abort) = attempt.write_step(key, value) {
            drop(keys);
            return Err(StepError::Abort(attempt.abort(abort)));
        }
        // The loaded value (if any) is the old one now.
        keys.loaded.forget(fingerprint);
        if !known {
            keys.added.insert(fingerprint);
        }
        Ok(())
    }
}
