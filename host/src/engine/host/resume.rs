//! Resuming runs: a caller's resume, automatic recovery's and a parked run's timer, each
//! checked and claimed before its attempt starts; the answer a checkpoint's resume carries;
//! leaving a run recovery gives up on to a caller.

use super::attempt::{attempt_bound, Claim};
use super::backends::caller_hidden;
use super::{Host, ResumeOptions, DEFAULT_SESSION};
use crate::error::Error;
use crate::model::envelope::{Failure, RunEnvelope, RunStatus};
use crate::model::scope::Scope;
use crate::sandbox::admission::TrustError;
use crate::sandbox::{self, SandboxLimits};
use crate::store::RunRecord;

impl Host {
    /// Resume a run that ended without completing: same id, same args, a new attempt in
    /// which every journaled step and agent call replays for free. A caller's resume sets
    /// the run's count of automatic recoveries back to 0.
    pub async fn resume(&self, run_id: &str, options: ResumeOptions) -> Result<RunEnvelope, Error> {
        self.resume_as(run_id, options, ResumedBy::Caller).await
    }

    /// [`Host::resume`] on behalf of `by`: automatic recovery resumes only a run that is
    /// still `halted` by an [`Interruption`](crate::store::Interruption) once it holds the
    /// claim, and counts itself in the record.
    pub(crate) async fn resume_as(
        &self,
        run_id: &str,
        options: ResumeOptions,
        by: ResumedBy,
    ) -> Result<RunEnvelope, Error> {
        let scope = options.scope.clone().unwrap_or_else(|| Scope::from(DEFAULT_SESSION));
        let record = self.record(&scope, run_id).await?;
        match record.envelope.status {
            RunStatus::Completed => return Err(Error::NonResumable(format!("run `{run_id}` is completed"))),
            // `running` without an attempt here is an attempt that could not write its end
            // (this process holds the store, so nobody else runs it): resumable.
            RunStatus::Pending => return Err(Error::AlreadyActive(run_id.into())),
            // On a store other processes share, another worker may be executing it.
            RunStatus::Running if self.store.shared() && !self.active().contains_key(run_id) => {
                return Err(Error::AlreadyActive(run_id.into()))
            }
            _ => {}
        }
        // Claimed before anyone hears of the new attempt (`on_start`), so a `wait` that
        // follows it cannot mistake the previous attempt's end for this one's.
        let claim = self.claim(run_id)?;
        // On a store other processes share, a caller's resume also claims the run there
        // (recovery claimed it already): two callers resuming it at once through two workers,
        // one resumes it and the other is told it is active.
        if by == ResumedBy::Caller && self.store.shared() {
            if !self.store.claim_resume(run_id).await? {
                return Err(Error::AlreadyActive(run_id.into()));
            }
            let resumed = self.resume_claimed(run_id, &scope, options, by, claim).await;
            if resumed.is_err() {
                // Not started (or ended at once): free for another worker's resume.
                if let Err(e) = self.store.release_claim(run_id).await {
                    tracing::warn!(run = %run_id, error = %e, "cannot release the claim of a resume that did not start");
                }
            }
            return resumed;
        }
        self.resume_with(run_id, &scope, record, options, by, claim).await
    }

    /// [`Host::resume_as`] once the run is claimed in the store: read again (another
    /// worker may have resumed it to its end meanwhile), then resumed.
    pub(super) async fn resume_claimed(
        &self,
        run_id: &str,
        scope: &Scope,
        options: ResumeOptions,
        by: ResumedBy,
        claim: Claim<'_>,
    ) -> Result<RunEnvelope, Error> {
        let record = self.record(scope, run_id).await?;
        if record.envelope.status == RunStatus::Completed {
            return Err(Error::NonResumable(format!("run `{run_id}` is completed")));
        }
        self.resume_with(run_id, scope, record, options, by, claim).await
    }

    /// The rest of [`Host::resume_as`]: load what the run recorded and start its attempt.
    pub(super) async fn resume_with(
        &self,
        run_id: &str,
        scope: &Scope,
        mut record: RunRecord,
        options: ResumeOptions,
        by: ResumedBy,
        claim: Claim<'_>,
    ) -> Result<RunEnvelope, Error> {
        if by != ResumedBy::Caller {
            // Read again under the claim: a caller may have resumed it since it was found.
            record = self.record(scope, run_id).await?;
            let still = match by {
                ResumedBy::Parked => {
                    crate::engine::parking::parked_until(&record).is_some_and(|at| at <= std::time::SystemTime::now())
                }
                _ => crate::engine::parking::is_interrupted(&record),
            };
            if !still {
                return Err(Error::NonResumable(format!("run `{run_id}` is no longer halted by an interruption")));
            }
        }
        if record.envelope.failure.as_ref().is_some_and(Failure::is_declined) {
            return Err(Error::NonResumable(format!("run `{run_id}` was declined and never ran: start a new run")));
        }
        if by != ResumedBy::Caller && self.store.shared() {
            // Resumed with no caller on a store others write: only what its consent was for.
            let Some(bound) = attempt_bound(&record) else {
                return Err(TrustError::ConsentMissing(run_id.to_string()).into());
            };
            self.config.trust.verify(record.seal.as_deref(), &bound)?;
            self.config.trust.check_grants(run_id, &record.grants)?;
        }
        // The run keeps its grants; each must still be the directory it recorded.
        sandbox::recheck_grants(&record.grants)?;
        let factory = match options.component {
            Some(factory) => factory,
            None => {
                let hash = record.component_hashes.last().cloned().unwrap_or_default();
                let script = record.scripts.get(record.component_hashes.len().wrapping_sub(1)).cloned().flatten();
                let loaded = match &script {
                    Some(script) => self.load_recorded_script(&hash, script, Some(run_id)).await,
                    None => self.load_stored(&hash).await,
                };
                loaded.map_err(|e| match e {
                    Error::Trust(refused) => Error::Trust(refused),
                    e => Error::NonResumable(format!("the component of run `{run_id}` cannot be loaded: {e}")),
                })?
            }
        };
        if factory.meta.name != record.envelope.factory {
            return Err(Error::NonResumable(format!(
                "run `{run_id}` belongs to factory `{}`, not `{}`",
                record.envelope.factory, factory.meta.name
            )));
        }
        let overrides = record.overrides.followed_by(&options.limits);
        let limits = factory.meta.limits.overridden_by(&overrides);
        limits.validate()?;
        record.overrides = overrides;
        record.limits = limits;
        let backend = match options.backend {
            Some(backend) => backend,
            None => self.recorded_backend(&record, &options.choice)?,
        };
        if let Some(dir) = &options.caller_cwd {
            record.add_caller_dir(dir);
        }
        answer_checkpoint(&mut record, options.input, &self.config.sandbox)?;
        let backend = caller_hidden(backend, &record);
        self.put_blobs(&factory)?;
        // Written with the attempt's start, before the guest runs: a recovery that crashes
        // the service again has been counted.
        record.recoveries = match by {
            ResumedBy::Caller => 0,
            ResumedBy::Recovery => record.recoveries.saturating_add(1),
            // Waiting out a quota is no recovery from a crash: not counted.
            ResumedBy::Parked => record.recoveries,
        };
        self.parking.disarm(run_id);
        if let Some(on_start) = options.on_start {
            on_start(run_id);
        }
        self.attempt_claimed(&factory, record, options.events, backend, claim, options.trace_parent).await
    }

    /// Leave a run that automatic recovery will not resume to a caller: while it is still
    /// `halted` by an interruption, its failure becomes `message` and the mark is cleared,
    /// so no later service start tries it again. Returns false when the run was no longer
    /// interrupted (a caller resumed it meanwhile).
    pub(crate) async fn leave_halted(&self, run_id: &str, message: String) -> Result<bool, Error> {
        let _claim = self.claim(run_id)?;
        let Some(mut record) = self.store.run(run_id).await? else { return Err(Error::NotFound(run_id.to_string())) };
        if !(record.envelope.status == RunStatus::Halted && record.interrupted.is_some()) {
            return Ok(false);
        }
        record.interrupted = None;
        record.envelope.resume_at = None;
        let failure = Failure::new(crate::model::envelope::FailureType::Halted, None, message);
        record.envelope.error = Some(failure.message.clone());
        record.envelope.failure = Some(failure);
        record.envelope.updated_at = crate::store::records_timestamp();
        self.store.put_run(&mut record, false).await?;
        self.revisions.announce(&record).await?;
        Ok(true)
    }
}

/// Who asks for a resume ([`Host::resume_as`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResumedBy {
    /// A caller (`factory resume`, the control socket, MCP, the library).
    Caller,
    /// Automatic recovery of an interrupted run ([`crate::engine::recover`]).
    Recovery,
    /// The service's timer, for a run parked for its quota whose reset has come.
    Parked,
}

/// Journal the answer to the checkpoint a paused run waits at (its record keeps it; every
/// later attempt's `ctx.pause(key)` returns it): `input`, or none when the resume carries
/// none. A run that waits at no checkpoint takes no answer.
pub(super) fn answer_checkpoint(
    record: &mut RunRecord,
    input: Option<serde_json::Value>,
    sandbox: &SandboxLimits,
) -> Result<(), Error> {
    use crate::capabilities::checkpoints::{MAX_ANSWERS_BYTES, MAX_ANSWER_BYTES};
    let run_id = &record.envelope.run_id;
    let waiting = record.envelope.checkpoint.clone().filter(|_| record.envelope.status == RunStatus::Paused);
    let Some(key) = waiting else {
        if input.is_some() {
            return Err(Error::NotAtCheckpoint(format!(
                "run `{run_id}` waits at no checkpoint (it is {}): resume it without an input",
                record.envelope.status.as_str()
            )));
        }
        return Ok(());
    };
    let answer = input.map(|value| value.to_string());
    if let Some(text) = &answer {
        let limit = MAX_ANSWER_BYTES.min(sandbox.max_step_bytes);
        if text.len() > limit {
            return Err(Error::InvalidInput(format!(
                "the answer is {} bytes, over the {limit} byte limit",
                text.len()
            )));
        }
        let depth = crate::model::json::depth(text);
        if depth > sandbox.max_json_depth {
            return Err(Error::InvalidInput(format!(
                "the answer is nested {depth} deep, over the limit of {}",
                sandbox.max_json_depth
            )));
        }
        let kept: usize = record.checkpoints.values().flatten().map(String::len).sum();
        if kept + text.len() > MAX_ANSWERS_BYTES {
            return Err(Error::InvalidInput(format!(
                "the run keeps {kept} bytes of answers already; this one would take it over the {MAX_ANSWERS_BYTES} byte limit"
            )));
        }
    }
    record.checkpoints.insert(key, answer);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capabilities::checkpoints::{MAX_ANSWERS_BYTES, MAX_ANSWER_BYTES};

    pub(super) fn paused_at(key: &str) -> RunRecord {
        let mut record = crate::store::conformance::record("r", "default", RunStatus::Paused);
        record.envelope.checkpoint = Some(key.to_string());
        record
    }

    #[test]
    pub(super) fn a_checkpoints_answer_is_kept_under_its_key_within_its_bounds() {
        let sandbox = SandboxLimits::default();
        let mut record = paused_at("approve");
        answer_checkpoint(&mut record, Some(serde_json::json!({"ok": true})), &sandbox).unwrap();
        assert_eq!(record.checkpoints.get("approve"), Some(&Some(r#"{"ok":true}"#.to_string())));
        // Without an input the checkpoint is passed with none.
        let mut record = paused_at("approve");
        answer_checkpoint(&mut record, None, &sandbox).unwrap();
        assert_eq!(record.checkpoints.get("approve"), Some(&None));

        // A run that waits at no checkpoint takes no answer (and needs none).
        for status in [RunStatus::Paused, RunStatus::Halted, RunStatus::Error] {
            let mut record = crate::store::conformance::record("r", "default", status);
            let e = answer_checkpoint(&mut record, Some(serde_json::json!(1)), &sandbox).unwrap_err();
            assert_eq!(e.code(), crate::error::ErrorCode::NotAtCheckpoint, "{e}");
            answer_checkpoint(&mut record, None, &sandbox).unwrap();
            assert!(record.checkpoints.is_empty());
        }
        // A checkpoint key left on a run that is no longer paused is no checkpoint.
        let mut record = paused_at("approve");
        record.envelope.status = RunStatus::Error;
        assert!(answer_checkpoint(&mut record, Some(serde_json::json!(1)), &sandbox).is_err());

        // One answer over its bound, and one past what the run keeps in all.
        let mut record = paused_at("big");
        let big = serde_json::json!("x".repeat(MAX_ANSWER_BYTES));
        let e = answer_checkpoint(&mut record, Some(big), &sandbox).unwrap_err();
        assert_eq!(e.code(), crate::error::ErrorCode::InvalidInput, "{e}");
        let mut record = paused_at("last");
        let kept = "y".repeat(MAX_ANSWERS_BYTES / 2);
        record.checkpoints.insert("a".into(), Some(kept.clone()));
        record.checkpoints.insert("b".into(), Some(kept));
        let e = answer_checkpoint(&mut record, Some(serde_json::json!(1)), &sandbox).unwrap_err();
        assert_eq!(e.code(), crate::error::ErrorCode::InvalidInput, "{e}");
        assert!(!record.checkpoints.contains_key("last"), "nothing kept of a refused answer");
    }
}
