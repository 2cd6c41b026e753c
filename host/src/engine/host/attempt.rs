//! One attempt of a run: claiming it as active here, preparing its capabilities and backend,
//! executing the guest, and writing its end (parked for a quota, halted by an outage, or its
//! verdict), however it ends.

use super::{ActiveRun, Factory, Host};
use crate::backend::AgentBackend;
use crate::capabilities::stop::StopSignal;
use crate::engine::run::{self, AttemptSetup, Capabilities};
use crate::error::Error;
use crate::guests::script::ScriptError;
use crate::model::envelope::{Accounting, Failure, RunEnvelope, RunStatus};
use crate::model::progress::{ProgressEntry, ProgressEvent};
use crate::sandbox::admission::Bound;
use crate::store::journal::Journal;
use crate::store::RunRecord;
use futures::FutureExt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::Instrument;

/// How often an attempt with live subscribers samples its backend's flows.
pub(super) const FLOWS_SAMPLED_EVERY: Duration = Duration::from_millis(500);

/// Tell the attempt's live subscribers how its backend's flows stand, when it changed
/// ([`crate::model::flow::FlowWatch`]), until aborted.
pub(super) async fn watch_flows(shared: Arc<Capabilities>) {
    let flows = shared.agents.flows();
    if flows.is_empty() {
        return;
    }
    let mut watch = crate::model::flow::FlowWatch::default();
    loop {
        tokio::time::sleep(FLOWS_SAMPLED_EVERY).await;
        if let Some(stats) = watch.next(flows.iter().map(|f| f.stats()).collect()) {
            shared.attempt.announce(|| ProgressEvent::Flows { flows: stats });
        }
    }
}

/// Stops [`watch_flows`] when the attempt ends.
pub(super) struct WatchFlows(tokio::task::JoinHandle<()>);

impl Drop for WatchFlows {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Host {
    /// Execute one attempt of an existing run.
    pub(super) async fn attempt(
        &self,
        factory: &Factory,
        record: RunRecord,
        events: Option<mpsc::UnboundedSender<ProgressEntry>>,
        backend: Arc<dyn AgentBackend>,
        trace_parent: Option<crate::trace::TraceParent>,
    ) -> Result<RunEnvelope, Error> {
        let claim = self.claim(&record.envelope.run_id)?;
        self.attempt_claimed(factory, record, events, backend, claim, trace_parent).await
    }

    /// Mark `run_id` as executing here (refused when it already is). Until the claim is
    /// dropped, `wait` does not take the run's stored status for its end.
    pub(super) fn claim(&self, run_id: &str) -> Result<Claim<'_>, Error> {
        let stop = StopSignal::new();
        let mut active = self.active();
        if active.contains_key(run_id) {
            return Err(Error::AlreadyActive(run_id.to_string()));
        }
        active.insert(run_id.to_string(), ActiveRun { stop: stop.clone(), shared: None });
        crate::metrics::metrics().run_active(true);
        Ok(Claim { stop, guard: ActiveGuard { host: self, run_id: run_id.to_string() } })
    }

    /// Execute one attempt of a run this host has claimed.
    pub(super) async fn attempt_claimed(
        &self,
        factory: &Factory,
        mut record: RunRecord,
        events: Option<mpsc::UnboundedSender<ProgressEntry>>,
        backend: Arc<dyn AgentBackend>,
        claim: Claim<'_>,
        trace_parent: Option<crate::trace::TraceParent>,
    ) -> Result<RunEnvelope, Error> {
        let run_id = record.envelope.run_id.clone();
        let Claim { stop, guard: _active } = claim;
        let span = crate::trace::attempt(
            &record.envelope.factory,
            &run_id,
            &record.session,
            record.envelope.attempts.saturating_add(1),
        );
        if let Some(parent) = &trace_parent {
            crate::trace::continue_trace(&span, parent);
        }
        // However the attempt ends (a store error, a panic, its future dropped), the run
        // leaves `active` and gets a terminal status, so it is never wedged as running.
        let outcome = AssertUnwindSafe(self.attempt_inner(factory, &mut record, events, backend, stop, span.clone()))
            .catch_unwind()
            .instrument(span.clone())
            .await;
        let failure = match outcome {
            Ok(Ok(())) => None,
            Ok(Err(e)) => {
                Some((Failure::new(crate::model::envelope::FailureType::Storage, None, e.to_string()), Some(e)))
            }
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".into());
                tracing::error!(run = %run_id, panic = %what, "an attempt panicked");
                Some((
                    Failure::new(
                        crate::model::envelope::FailureType::Internal,
                        None,
                        format!("the host failed during this attempt ({what}); resume to continue"),
                    ),
                    None,
                ))
            }
        };
        if let Some((failure, error)) = failure {
            self.end_broken_attempt(&mut record, failure).await;
            drop(_active);
            self.announce_end(&record).await;
            if let Some(e) = error {
                return Err(e);
            }
        } else {
            drop(_active);
            self.announce_end(&record).await;
        }
        crate::trace::attempt_ended(&span, record.envelope.status, record.envelope.failure.as_ref());
        crate::metrics::metrics().attempt_ended(record.envelope.status);
        self.current(record).await
    }

    /// Give an attempt that broke (a store error, a panic) its terminal status, as far as
    /// the store still allows (the caller announces it).
    pub(super) async fn end_broken_attempt(&self, record: &mut RunRecord, failure: Failure) {
        let envelope = &mut record.envelope;
        envelope.status = RunStatus::Error;
        envelope.result = None;
        envelope.error = Some(failure.message.clone());
        envelope.failure = Some(failure);
        envelope.updated_at = crate::store::records_timestamp();
        if let Err(e) = self.store.put_run(record, false).await {
            tracing::error!(run = %record.envelope.run_id, error = %e, "cannot record the end of a broken attempt");
        }
    }

    pub(super) async fn attempt_inner(
        &self,
        factory: &Factory,
        record: &mut RunRecord,
        events: Option<mpsc::UnboundedSender<ProgressEntry>>,
        backend: Arc<dyn AgentBackend>,
        stop: StopSignal,
        span: tracing::Span,
    ) -> Result<(), Error> {
        let run_id = record.envelope.run_id.clone();
        record.envelope.status = RunStatus::Running;
        record.interrupted = None;
        record.envelope.attempts += 1;
        record.envelope.result = None;
        record.envelope.failure = None;
        record.envelope.error = None;
        record.envelope.resume_at = None;
        record.envelope.checkpoint = None;
        record.envelope.updated_at = crate::store::records_timestamp();
        // `scripts` is index-aligned with `component_hashes` (runs recorded before scripts
        // existed have none: they were all components).
        record.scripts.resize(record.component_hashes.len(), None);
        record.component_hashes.push(factory.component.hash.clone());
        record.scripts.push(factory.component.script.as_ref().map(|s| s.reference()));
        record.phases = factory.meta.phases.clone();
        // A script's modules: this attempt's own set, recording what it loads under the run.
        let component = match &factory.component.script {
            Some(script) => {
                let modules = script.modules.for_run(self.store.clone(), &run_id).map_err(ScriptError::Module)?;
                std::borrow::Cow::Owned(factory.component.clone().with_script(script.with_modules(modules)))
            }
            None => std::borrow::Cow::Borrowed(&factory.component),
        };
        let reference = backend.reference();
        record.envelope.backend = Some(reference.clone());
        record.backends.push(reference);
        if self.store.shared() {
            // The consent this attempt runs under, bound to what it runs (a worker that
            // recovers the run checks it).
            record.seal = attempt_bound(record).map(|bound| self.config.trust.seal(&bound));
        }
        // The attempt's start is written while its journal loads (neither reads what the
        // other writes); the guest runs once both are done, so a start the store refuses (a
        // worker fenced off) runs no guest code.
        let cache_bytes = self.config.sandbox.journal_cache_bytes;
        let loading = async {
            let next_seq = self.store.last_progress_seq(&run_id).await;
            (next_seq, Capabilities::load(&*self.store, &run_id, cache_bytes).await)
        };
        let (started, (next_seq, snapshot)) = futures::future::join(self.store.put_run(record, false), loading).await;
        started?;
        let next_seq = next_seq?;

        let prior = record.envelope.accounting;
        // Backends whose spawns see files (agent CLIs) see the run's grants, and only those,
        // and never what the serving front door keeps (its state, tokens, socket).
        let backend = backend.with_grants(&record.grants).unwrap_or(backend);
        let mut hidden = self.config.sandbox_hidden.clone();
        hidden.extend(self.config.catalog.hidden_files());
        let sealed = crate::backend::Hidden { sealed: hidden, unless_granted: Vec::new() };
        let backend = match sealed.is_empty() {
            true => backend,
            false => backend.hiding(&sealed).unwrap_or(backend),
        };
        // Under the cluster-wide cap of its backend, on a shared store that sets one; its
        // flows paced by the budget the workers of a shared store share.
        crate::engine::caps::share_flows(&self.store, &*backend);
        let backend = crate::engine::caps::capped(&self.store, &self.config.caps, backend);
        let setup = AttemptSetup {
            run_id: run_id.clone(),
            limits: record.limits,
            sandbox: self.config.sandbox.clone(),
            journal: self.store.clone() as Arc<dyn Journal>,
            backend,
            prior,
            next_seq,
            events,
            updates: self.revisions.sender(),
            record_writes: record.writes,
            stop: stop.clone(),
            host_pending_bytes: self.pending_bytes.clone(),
            span,
            agent_limits: factory.meta.agent_limits.clone(),
            answers: record.checkpoints.clone(),
        };
        let mut parked = None;
        let mut checkpoint = None;
        let (status, result, failure, accounting) = match snapshot.map(|snapshot| Capabilities::new(setup, snapshot)) {
            Err(failure) => (RunStatus::Error, None, Some(failure), prior),
            Ok(shared) => {
                if let Some(active) = self.active().get_mut(&run_id) {
                    active.shared = Some(shared.clone());
                }
                shared.attempt.emit(ProgressEvent::AttemptStarted { attempt: record.envelope.attempts });
                // Live followers are told how the backend's flows stand while calls wait.
                let _watching =
                    shared.attempt.listened().then(|| WatchFlows(tokio::spawn(watch_flows(shared.clone()))));
                // Seen by the run's followers now, not a commit window later; and committed
                // while the guest runs, not at its end, where the verdict waits for it.
                shared.attempt.journal.commit_soon();
                let prior_active = Duration::from_secs_f64(prior.active_seconds);
                let budget =
                    record.limits.timeout_seconds.map(|t| Duration::from_secs_f64(t).saturating_sub(prior_active));
                if budget == Some(Duration::ZERO) {
                    shared.attempt.abort(run::Abort::Limit(run::LimitKind::TimeoutSeconds));
                }
                let mut outcome =
                    run::execute(&self.engine, &component, shared.clone(), record.args.clone(), budget, &record.grants)
                        .await;
                // A spent quota parks the run (`halted`, resumable) instead of ending it `error`.
                if let Some(crate::capabilities::attempt::StopCause::Failed(
                    failure,
                    run::Abort::Backend { kind: crate::backend::OutageKind::Quota, resume_at, .. },
                )) = shared.attempt.cause()
                {
                    if outcome.failure.as_ref() == Some(&failure) {
                        outcome.status = RunStatus::Halted;
                        parked = Some(resume_at);
                    }
                }
                if let (
                    RunStatus::Paused,
                    Some(crate::capabilities::attempt::StopCause::Paused(run::Pause::Checkpoint(key))),
                ) = (outcome.status, shared.attempt.cause())
                {
                    shared.progress.log(format!("paused at checkpoint `{key}`"));
                    checkpoint = Some(key);
                }
                let mut failure = outcome.failure;
                // The modules' record, with every import answered (written before the flush).
                if let Some(Err(e)) = component.script.as_ref().map(|s| s.modules.record_now()) {
                    failure = Some(Failure::new(crate::model::envelope::FailureType::Storage, None, e.to_string()));
                }
                // A store out of reach (the database away past the worker's lease) halts the
                // attempt, resumable: no verdict of its own.
                let outage = matches!(shared.attempt.cause(), Some(crate::capabilities::attempt::StopCause::Failed(_, run::Abort::Storage(e))) if e.is_outage());
                let dropped = shared.progress.dropped_log_lines();
                if dropped > 0 {
                    record.envelope.error = Some(format!("{dropped} log lines over the cap were dropped"));
                }
                let status =
                    if failure.as_ref().is_some_and(|f| f.kind_type == crate::model::envelope::FailureType::Storage) {
                        if outage {
                            RunStatus::Halted
                        } else {
                            RunStatus::Error
                        }
                    } else {
                        outcome.status
                    };
                // The attempt's end, with what it consumed (its `run_settled` event).
                let spent = shared.accounting();
                shared.attempt.emit(ProgressEvent::AttemptEnded {
                    status,
                    replayed: shared.agents.attempt_cache_hits(),
                    spawned: spent.agents_spawned.saturating_sub(prior.agents_spawned),
                    credits_nano: spent.ai_credits_nano.saturating_sub(prior.ai_credits_nano),
                    credits_at_least: spent.ai_credits_at_least && !prior.ai_credits_at_least,
                    elapsed_ms: ((spent.active_seconds - prior.active_seconds).max(0.0) * 1000.0) as u64,
                    failure_type: failure.as_ref().map(|f| f.kind_type),
                });
                shared.attempt.end_phase();
                (status, outcome.result, failure, spent)
            }
        };
        let accounting_at_end = accounting;
        ended(record, status, result, failure, accounting);
        record.envelope.checkpoint = checkpoint.filter(|_| record.envelope.status == RunStatus::Paused);
        let parked = parked.filter(|_| {
            record.envelope.status == RunStatus::Halted
                && record.envelope.failure.as_ref().is_some_and(Failure::is_spent_quota)
        });
        if let Some(resume_at) = parked {
            if let Some(at) = park(record, resume_at) {
                self.parking.arm(&run_id, at);
            }
        }
        // Announced by the caller once the run has left `active` (`announce_end`). The
        // attempt's last progress entries are still being written: they and the verdict are
        // made durable by this one flush (in order: the entries are never behind the verdict).
        let Err(e) = self.store.put_run(record, false).await else { return Ok(()) };
        // That write failed, the entries with it: the attempt ends as a storage failure,
        // `halted` (resumable) when the store is out of reach, and that is written instead.
        // Said as the store's own error.
        // (An attempt already halted by the store out of reach stays so.)
        let halted_by_storage = record.envelope.status == RunStatus::Halted && record.interrupted.is_none();
        let outage = e.is_outage() || halted_by_storage;
        let failure =
            Failure::new(crate::model::envelope::FailureType::Storage, outage.then_some("unavailable"), e.to_string());
        let status = if outage { RunStatus::Halted } else { RunStatus::Error };
        record.envelope.resume_at = None;
        ended(record, status, None, Some(failure), accounting_at_end);
        self.store.put_run(record, false).await?;
        Ok(())
    }
}

/// Removes a run from the host's active runs when its attempt ends, however it ends.
pub(super) struct ActiveGuard<'a> {
    host: &'a Host,
    run_id: String,
}

impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        self.host.active().remove(&self.run_id);
        crate::metrics::metrics().run_active(false);
    }
}

/// A run claimed for an attempt: its stop signal, and the guard that releases it.
pub(super) struct Claim<'a> {
    stop: StopSignal,
    guard: ActiveGuard<'a>,
}

/// Write an attempt's end into its run's record: `status`, the result of a completed run,
/// the failure (its message as the run's error) and the accounting. An attempt ends `halted`
/// by an interruption only when its host shut down during it (a store outage halts it too,
/// for a caller to resume).
pub(super) fn ended(
    record: &mut RunRecord,
    status: RunStatus,
    result: Option<crate::model::json::RawJson>,
    failure: Option<Failure>,
    accounting: Accounting,
) {
    let by_storage = failure.as_ref().is_some_and(|f| f.kind_type == crate::model::envelope::FailureType::Storage);
    record.interrupted = (status == RunStatus::Halted && !by_storage).then_some(crate::store::Interruption::Shutdown);
    let envelope = &mut record.envelope;
    envelope.status = status;
    envelope.result = if status == RunStatus::Completed { result } else { None };
    if let Some(f) = &failure {
        envelope.error = Some(f.message.clone());
    }
    match &failure {
        Some(f) => tracing::info!(
            event = "attempt_ended", run = %envelope.run_id, factory = %envelope.factory, attempt = envelope.attempts,
            status = status.as_str(), failure_type = f.kind_type.as_str(), failure_kind = f.kind.as_deref().unwrap_or(""),
            "attempt ended"
        ),
        None => {
            tracing::debug!(event = "attempt_ended", run = %envelope.run_id, factory = %envelope.factory, attempt = envelope.attempts, status = status.as_str(), "attempt ended")
        }
    }
    envelope.failure = failure;
    envelope.accounting = accounting;
    envelope.updated_at = crate::store::records_timestamp();
}

/// Park `record`, whose attempt ended `halted` on a spent quota: with a known reset
/// (`resume_at`) it is marked [`Interruption::Quota`](crate::store::Interruption::Quota) with
/// its `resumeAt`, for the service to resume it then; without one it has no mark, and its
/// failure says to resume it by hand. Its failure says which. Returns when it resumes.
pub(super) fn park(record: &mut RunRecord, resume_at: Option<std::time::SystemTime>) -> Option<std::time::SystemTime> {
    let by_hand = crate::engine::parking::resume_command(&record.envelope.run_id, &record.session);
    // Within the bounds a spent quota is waited for, whoever made the error (a time past
    // year 9999 could not be written as RFC 3339).
    let now = std::time::SystemTime::now();
    let resume_at = resume_at.map(|t| t.clamp(now, now + crate::backend::quota::MAX_WAIT));
    let at = resume_at.map(|t| humantime::format_rfc3339_seconds(t).to_string());
    let note = match &at {
        Some(at) => format!("the run is parked (halted) and resumes by itself at {at} in the service (`factory serve`); or resume it sooner by hand: {by_hand}"),
        None => format!("the run is halted until resumed by hand once the quota is back: {by_hand}"),
    };
    record.interrupted = at.is_some().then_some(crate::store::Interruption::Quota);
    let envelope = &mut record.envelope;
    envelope.resume_at = at;
    if let Some(failure) = envelope.failure.as_mut() {
        failure.message = crate::model::envelope::bounded_text(
            format!("{}; {note}", failure.message),
            crate::model::envelope::MAX_MESSAGE_BYTES,
        );
        envelope.error = Some(failure.message.clone());
    }
    resume_at
}

/// What the consent of the latest attempt `record` recorded is bound to (`None`: none
/// recorded).
pub(super) fn attempt_bound(record: &RunRecord) -> Option<Bound<'_>> {
    let component = record.component_hashes.last()?;
    let script = record.scripts.get(record.component_hashes.len() - 1).and_then(Option::as_ref);
    Some(Bound {
        run_id: &record.envelope.run_id,
        session: &record.session,
        args: &record.args,
        component,
        script,
        backend: record.backends.last()?,
        grants: &record.grants,
        caller_dirs: &record.caller_dirs,
        limits: &record.limits,
        overrides: &record.overrides,
    })
}
