//! The run engine: the state one attempt of a run shares between its hooks ([`RunShared`]:
//! journal view, memo, limits, accounting, progress, the stop signal) and [`execute`], which
//! drives an attempt to its end: instantiate, call `run` inside `run_concurrent`, race it
//! against cancellation and the deadline, drop the store to stop it, flush the journal,
//! and classify the outcome.

pub(crate) use crate::engine::abort::{Abort, LimitKind, StepError};
use crate::backend::{AgentBackend, AgentReply, AgentRequest};
use crate::sandbox::component::LoadedComponent;
use crate::model::envelope::{Accounting, Failure, RunStatus};
use crate::store::journal::Journal;
use crate::model::limits::Limits;
use crate::engine::cache::ValueCache;
use crate::model::progress::{AgentSummary, JournaledProgress, LogLevel, ProgressEntry, ProgressEvent, RunUpdated};
use crate::sandbox::{self, SandboxLimits};
use crate::model::schema::Schema;
use crate::AgentKey;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{broadcast, mpsc, OnceCell, Semaphore};
use tokio_util::sync::CancellationToken;

impl crate::capabilities::view::RunView for RunShared {
    fn step_get(&self, key: &str) -> Result<Option<String>, Abort> {
        RunShared::step_get(self, key)
    }

    fn step_put(&self, key: String, value: String) -> Result<(), StepError> {
        RunShared::step_put(self, key, value)
    }

    fn phase(&self, title: String) {
        RunShared::phase(self, title)
    }

    fn log(&self, message: String) {
        RunShared::log(self, message)
    }

    fn log_at(&self, level: LogLevel, message: String) {
        RunShared::log_at(self, level, message)
    }

    fn stop_token(&self) -> CancellationToken {
        self.stop.clone()
    }

    fn stopping(&self) -> Option<Abort> {
        RunShared::stopping(self)
    }

    fn run_id(&self) -> String {
        self.run_id.clone()
    }

    fn cancelled(&self) -> bool {
        RunShared::cancelled(self)
    }

    fn agent(
        self: Arc<Self>,
        prompt: String,
        label: Option<String>,
        schema: Option<String>,
        model: Option<String>,
    ) -> futures::future::BoxFuture<'static, Result<Option<String>, Abort>> {
        Box::pin(RunShared::agent(self, prompt, label, schema, model))
    }
}

/// How an attempt was told to stop, and the abort every later hook call answers with.
#[derive(Debug, Clone, PartialEq)]
enum StopCause {
    Cancelled,
    Halted,
    Failed(Failure, Abort),
}

/// Mutable per-run state behind one lock (never held across an await). Journal values are
/// not all here: a bounded cache holds some, the store has them all.
#[derive(Default)]
struct RunState {
    /// Step and agent values recently read or written (bounded in bytes).
    cache: ValueCache,
    /// Fingerprints of every journaled step key (distinct steps, without their keys).
    step_keys: HashSet<u64>,
    /// Bytes journaled so far, all attempts (counted against `maxJournalBytes`).
    journal_bytes: u64,
    /// The current phase: the seq of the `Phase` entry that set it, and its title.
    phase: Option<(u64, String)>,
    next_seq: u64,
    log_lines: usize,
    log_bytes: usize,
    dropped_log_lines: u64,
}

type Shared = Arc<OnceCell<Result<Option<String>, Abort>>>;

/// Everything the hooks of one attempt share.
pub(crate) struct RunShared {
    pub(crate) run_id: String,
    limits: Limits,
    sandbox: SandboxLimits,
    journal: Arc<dyn Journal>,
    backend: Arc<dyn AgentBackend>,
    state: Mutex<RunState>,
    inflight: Mutex<HashMap<String, Shared>>,
    slots: Option<Arc<Semaphore>>,
    stop: CancellationToken,
    cause: Mutex<Option<StopCause>>,
    events: Option<mpsc::UnboundedSender<ProgressEntry>>,
    updates: broadcast::Sender<RunUpdated>,
    /// Record writes of the run so far: the revision is this plus the progress seq.
    record_writes: u64,
    prior_active: Duration,
    started: Instant,
    spawned: AtomicU64,
    cache_hits: AtomicU64,
    attempt_cache_hits: AtomicU64,
    /// Agent hook calls in progress (queued, running, or waiting on an identical call).
    pending_calls: AtomicU64,
    /// Bytes those calls hold in the host (see [`pending_charge`]).
    pending_bytes: AtomicU64,
    /// The same, over every run of the host.
    host_pending_bytes: Arc<AtomicU64>,
    credits_nano: AtomicU64,
    input_tokens: AtomicU64,
    output_tokens: AtomicU64,
}

/// What a new attempt starts from.
pub(crate) struct AttemptSetup {
    pub run_id: String,
    pub limits: Limits,
    pub sandbox: SandboxLimits,
    pub journal: Arc<dyn Journal>,
    pub backend: Arc<dyn AgentBackend>,
    pub prior: Accounting,
    pub next_seq: u64,
    pub events: Option<mpsc::UnboundedSender<ProgressEntry>>,
    pub updates: broadcast::Sender<RunUpdated>,
    pub record_writes: u64,
    pub stop: CancellationToken,
    /// Bytes pending agent calls hold over every run of the host.
    pub host_pending_bytes: Arc<AtomicU64>,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl RunShared {
    /// Load the run's journal and set up the attempt's shared state.
    pub(crate) fn new(setup: AttemptSetup) -> Result<Arc<Self>, Failure> {
        let snapshot = setup
            .journal
            .load(&setup.run_id, setup.sandbox.journal_cache_bytes)
            .map_err(|e| Failure::new(crate::model::envelope::FailureType::Storage, None, e.to_string()))?;
        let mut cache = ValueCache::new(setup.sandbox.journal_cache_bytes);
        for (key, value) in snapshot.steps {
            cache.put_step(key, value);
        }
        for (key, outcome) in snapshot.agents {
            cache.put_agent(key, outcome);
        }
        let slots = setup.limits.concurrency().map(|n| Arc::new(Semaphore::new(n as usize)));
        Ok(Arc::new(RunShared {
            run_id: setup.run_id,
            limits: setup.limits,
            sandbox: setup.sandbox,
            journal: setup.journal,
            backend: setup.backend,
            state: Mutex::new(RunState {
                cache,
                step_keys: snapshot.step_keys,
                journal_bytes: snapshot.journal_bytes,
                next_seq: setup.next_seq,
                ..Default::default()
            }),
            inflight: Mutex::new(HashMap::new()),
            slots,
            stop: setup.stop,
            cause: Mutex::new(None),
            events: setup.events,
            updates: setup.updates,
            record_writes: setup.record_writes,
            prior_active: Duration::from_secs_f64(setup.prior.active_seconds),
            started: Instant::now(),
            spawned: AtomicU64::new(setup.prior.agents_spawned),
            cache_hits: AtomicU64::new(setup.prior.agent_cache_hits),
            attempt_cache_hits: AtomicU64::new(0),
            pending_calls: AtomicU64::new(0),
            pending_bytes: AtomicU64::new(0),
            host_pending_bytes: setup.host_pending_bytes,
            credits_nano: AtomicU64::new(setup.prior.ai_credits_nano),
            input_tokens: AtomicU64::new(setup.prior.input_tokens),
            output_tokens: AtomicU64::new(setup.prior.output_tokens),
        }))
    }

    fn state(&self) -> MutexGuard<'_, RunState> {
        // A panic while holding the lock cannot leave RunState half-updated in a way that
        // matters more than losing the run, so recover the guard rather than propagate.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Charge `cost` journal bytes to the run (state locked by the caller) and return the
    /// new total, which the put records with its entry: `Err` with the abort when they would
    /// pass `maxJournalBytes` (then nothing is charged). `essential` entries (an attempt's
    /// start and end) are always charged and written.
    fn charge(&self, state: &mut RunState, cost: u64, essential: bool) -> Result<u64, Abort> {
        let total = state.journal_bytes.saturating_add(cost);
        if total > self.sandbox.max_journal_bytes && !essential {
            let message = format!(
                "the run has journaled {} bytes; {cost} more would pass the {} byte journal budget (maxJournalBytes)",
                state.journal_bytes, self.sandbox.max_journal_bytes
            );
            return Err(Abort::SandboxLimit { kind: "maxJournalBytes", message });
        }
        state.journal_bytes = total;
        Ok(total)
    }

    /// Record a progress event (journaled, so `progress` pages and revisions survive a
    /// crash), stream it to the subscriber, and announce the new revision. The journal keeps
    /// a reference to the current phase, not its text. An entry past the journal budget is
    /// not recorded and stops the attempt (attempt start and end are always recorded).
    pub(crate) fn emit(&self, event: ProgressEvent) {
        let essential = matches!(event, ProgressEvent::AttemptStarted { .. } | ProgressEvent::AttemptEnded { .. });
        let written = {
            let mut state = self.state();
            let seq = state.next_seq + 1;
            let before = state.phase.clone();
            if let ProgressEvent::Phase { title } = &event {
                state.phase = Some((seq, title.clone()));
            }
            let stored = JournaledProgress {
                seq,
                at_ms: now_ms(),
                phase_seq: state.phase.as_ref().map(|(at, _)| *at),
                phase: None,
                event,
            };
            let bytes = serde_json::to_vec(&stored).map_err(|e| Abort::Storage(crate::store::journal::JournalError::new(e)));
            let written = bytes.and_then(|bytes| {
                let cost = self.journal.footprint(self.run_id.len() + 8, bytes.len());
                let total = self.charge(&mut state, cost, essential)?;
                self.journal.put_progress(&self.run_id, seq, bytes, total).map_err(Abort::Storage)
            });
            match written {
                Ok(()) => {
                    state.next_seq = seq;
                    let phase = state.phase.as_ref().map(|(_, title)| title.clone());
                    Ok(ProgressEntry { seq, at_ms: stored.at_ms, phase, event: stored.event })
                }
                Err(abort) => {
                    state.phase = before;
                    Err(abort)
                }
            }
        };
        let entry = match written {
            Ok(entry) => entry,
            Err(abort) => {
                self.abort(abort);
                return;
            }
        };
        let _ = self.updates.send(RunUpdated { run_id: self.run_id.clone(), revision: self.record_writes + entry.seq });
        if let Some(tx) = &self.events {
            let _ = tx.send(entry);
        }
    }

    /// Tell live subscribers (not the journal) about a call answered without a spawn. A
    /// replay changes nothing durable, and journaling one entry per replayed call would make
    /// every resume pay (and store) again for what it skips; the attempt's `AttemptEnded`
    /// entry counts them instead. The entry carries the latest durable seq.
    fn notify_cached(&self, label: String, ok: bool) {
        self.attempt_cache_hits.fetch_add(1, Ordering::Relaxed);
        if let Some(tx) = &self.events {
            let state = self.state();
            let entry = ProgressEntry {
                seq: state.next_seq,
                at_ms: now_ms(),
                phase: state.phase.as_ref().map(|(_, title)| title.clone()),
                event: ProgressEvent::cached(label, ok),
            };
            drop(state);
            let _ = tx.send(entry);
        }
    }

    /// Calls this attempt answered from the journal or an identical call.
    pub(crate) fn attempt_cache_hits(&self) -> u64 {
        self.attempt_cache_hits.load(Ordering::Relaxed)
    }

    /// The latest progress seq of this run.
    pub(crate) fn last_seq(&self) -> u64 {
        self.state().next_seq
    }

    /// Stop the attempt: the first cause wins. Returns the abort to hand the guest.
    pub(crate) fn abort(&self, abort: Abort) -> Abort {
        let failure = match &abort {
            Abort::Cancelled | Abort::Halted => None,
            Abort::Limit(kind) => Some(Failure::limit(kind.name(), limit_message(*kind, &self.limits))),
            Abort::Storage(e) => Some(Failure::new(crate::model::envelope::FailureType::Storage, None, e.to_string())),
            Abort::InvalidCall(m) => Some(Failure::new(crate::model::envelope::FailureType::InvalidCall, None, m.clone())),
            Abort::SandboxLimit { kind, message } => Some(Failure::new(crate::model::envelope::FailureType::SandboxLimit, Some(kind), message.clone())),
            Abort::Backend { kind, message } => Some(Failure::new(crate::model::envelope::FailureType::Backend, Some(kind.as_str()), message.clone())),
            Abort::Unpriced(message) => Some(Failure::limit(LimitKind::MaxAiCredits.name(), message.clone())),
        };
        let cause = match failure {
            None if abort == Abort::Halted => StopCause::Halted,
            None => StopCause::Cancelled,
            Some(failure) => StopCause::Failed(failure, abort.clone()),
        };
        self.cause.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(cause);
        self.stop.cancel();
        abort
    }

    /// The abort a hook returns once the attempt is stopping, if it is.
    fn stopping(&self) -> Option<Abort> {
        if !self.stop.is_cancelled() {
            return None;
        }
        Some(match self.cause.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            Some(StopCause::Failed(_, abort)) => abort.clone(),
            Some(StopCause::Halted) => Abort::Halted,
            _ => Abort::Cancelled,
        })
    }

    /// `ctx.cancelled`.
    pub(crate) fn cancelled(&self) -> bool {
        self.stop.is_cancelled()
    }

    /// Refuse a guest value of `len` bytes over `limit`: the attempt stops with a
    /// `sandbox_limit` failure named `kind`. The value itself is never copied into the message.
    fn cap(&self, kind: &'static str, what: &str, len: usize, limit: usize) -> Result<(), Abort> {
        if len <= limit {
            return Ok(());
        }
        let message = format!("{what} is {len} bytes, over the {limit} byte limit ({kind})");
        Err(self.abort(Abort::SandboxLimit { kind, message }))
    }

    /// `ctx.phase`: a title over `maxPhaseBytes` stops the attempt and is not recorded.
    pub(crate) fn phase(&self, title: String) {
        if self.cap("maxPhaseBytes", "phase title", title.len(), self.sandbox.max_phase_bytes).is_err() {
            return;
        }
        self.emit(ProgressEvent::Phase { title });
    }

    /// `ctx.log`: [`RunShared::log_at`] level `info`.
    pub(crate) fn log(&self, message: String) {
        self.log_at(LogLevel::Info, message)
    }

    /// `ctx.log-at`: capped in line count, line length and total bytes (every level
    /// together); lines over a cap are dropped and counted.
    pub(crate) fn log_at(&self, level: LogLevel, mut message: String) {
        let kept = message.len().min(self.sandbox.max_log_line_bytes);
        {
            let mut state = self.state();
            if state.log_lines >= self.sandbox.max_log_lines || state.log_bytes + kept > self.sandbox.max_log_bytes {
                state.dropped_log_lines += 1;
                return;
            }
            state.log_lines += 1;
            state.log_bytes += kept;
        }
        if message.len() > self.sandbox.max_log_line_bytes {
            let mut cut = self.sandbox.max_log_line_bytes;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
            message.push_str(" [truncated]");
        }
        self.emit(ProgressEvent::Log { message, level });
    }

    /// `ctx.step-get`: a read of the journal as loaded plus this attempt's writes.
    pub(crate) fn step_get(&self, key: &str) -> Result<Option<String>, Abort> {
        if let Some(abort) = self.stopping() {
            return Err(abort);
        }
        self.cap("maxStepKeyBytes", "step key", key.len(), self.sandbox.max_step_key_bytes)?;
        {
            let state = self.state();
            if let Some(value) = state.cache.step(key) {
                return Ok(Some(value.clone()));
            }
            // A key never journaled needs no read (every new step asks first).
            if !state.step_keys.contains(&crate::store::journal::fingerprint(key)) {
                return Ok(None);
            }
        }
        let value = self.journal.get_step(&self.run_id, key).map_err(|e| self.abort(Abort::Storage(e)))?;
        if let Some(value) = &value {
            self.state().cache.put_step(key.to_string(), value.clone());
        }
        Ok(value)
    }

    /// `ctx.step-put`: validate, then journal (durable by the next commit).
    pub(crate) fn step_put(&self, key: String, value: String) -> Result<(), StepError> {
        if let Some(abort) = self.stopping() {
            return Err(StepError::Abort(abort));
        }
        self.cap("maxStepKeyBytes", "step key", key.len(), self.sandbox.max_step_key_bytes).map_err(StepError::Abort)?;
        if value.len() > self.sandbox.max_step_bytes {
            let message = format!(
                "step `{key}` value is {} bytes, over the {} byte limit",
                value.len(),
                self.sandbox.max_step_bytes
            );
            return Err(StepError::Abort(self.abort(Abort::SandboxLimit { kind: "maxStepBytes", message })));
        }
        let depth = crate::model::json::depth(&value);
        if depth > self.sandbox.max_json_depth {
            let limit = self.sandbox.max_json_depth;
            return Err(StepError::InvalidJson(format!("step `{key}`: nested {depth} deep, over the limit of {limit}")));
        }
        if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(&value) {
            return Err(StepError::InvalidJson(format!("step `{key}`: not JSON: {e}")));
        }
        let mut state = self.state();
        let fingerprint = crate::store::journal::fingerprint(&key);
        if !state.step_keys.contains(&fingerprint) && state.step_keys.len() >= self.sandbox.max_steps {
            drop(state);
            let message = format!("the run has journaled {} distinct steps, the limit (maxSteps)", self.sandbox.max_steps);
            return Err(StepError::Abort(self.abort(Abort::SandboxLimit { kind: "maxSteps", message })));
        }
        let cost = self.journal.footprint(self.run_id.len() + key.len(), value.len());
        let written = self
            .charge(&mut state, cost, false)
            .and_then(|total| self.journal.put_step(&self.run_id, &key, &value, total).map_err(Abort::Storage));
        if let Err(abort) = written {
            drop(state);
            return Err(StepError::Abort(self.abort(abort)));
        }
        state.step_keys.insert(fingerprint);
        state.cache.put_step(key, value);
        Ok(())
    }

    /// `agents.agent`: memoized, journaled, limited subagent call.
    pub(crate) async fn agent(
        self: Arc<Self>,
        prompt: String,
        label: Option<String>,
        schema: Option<String>,
        model: Option<String>,
    ) -> Result<Option<String>, Abort> {
        if let Some(abort) = self.stopping() {
            return Err(abort);
        }
        // Admission, before anything else is copied or parsed: the call's strings are
        // already in host memory, and stay there until it ends (its bytes are charged now
        // and judged once the per-call caps below have passed).
        let charge = pending_charge(&prompt, label.as_deref(), schema.as_deref(), model.as_deref());
        let _pending = PendingCall::enter(&self.pending_calls, &self.pending_bytes, &self.host_pending_bytes, charge);
        if _pending.count > self.sandbox.max_pending_agent_calls as u64 {
            let message = format!(
                "more than {} agent calls pending at once",
                self.sandbox.max_pending_agent_calls
            );
            return Err(self.abort(Abort::SandboxLimit { kind: "maxPendingAgentCalls", message }));
        }
        if prompt.len() > self.sandbox.max_prompt_bytes {
            let message = format!(
                "prompt is {} bytes, over the {} byte limit",
                prompt.len(),
                self.sandbox.max_prompt_bytes
            );
            return Err(self.abort(Abort::SandboxLimit { kind: "maxPromptBytes", message }));
        }
        if let Some(label) = &label {
            self.cap("maxLabelBytes", "agent label", label.len(), self.sandbox.max_label_bytes)?;
        }
        if let Some(model) = &model {
            self.cap("maxModelBytes", "agent model name", model.len(), self.sandbox.max_model_bytes)?;
        }
        if let Some(schema) = &schema {
            self.cap("maxSchemaBytes", "agent schema", schema.len(), self.sandbox.max_schema_bytes)?;
        }
        // Within every per-call cap: now the bytes it holds while pending (checked before the
        // schema is parsed, the one copy that grows with it).
        if _pending.run_bytes > self.sandbox.max_pending_agent_bytes {
            let message = format!(
                "agent calls pending at once would hold {} bytes in the host, over the {} byte limit",
                _pending.run_bytes, self.sandbox.max_pending_agent_bytes
            );
            return Err(self.abort(Abort::SandboxLimit { kind: "maxPendingAgentBytes", message }));
        }
        if _pending.host_bytes_now > self.sandbox.max_host_pending_agent_bytes {
            let message = format!(
                "agent calls pending at once in every run of this host would hold {} bytes, over the {} byte limit",
                _pending.host_bytes_now, self.sandbox.max_host_pending_agent_bytes
            );
            return Err(self.abort(Abort::SandboxLimit { kind: "maxHostPendingAgentBytes", message }));
        }
        let schema = match schema.as_deref().map(Schema::parse) {
            None => None,
            Some(Ok(schema)) => Some(schema),
            Some(Err(e)) => {
                let who = label.as_deref().unwrap_or("agent");
                return Err(self.abort(Abort::InvalidCall(format!("agent `{who}`: invalid schema: {e}"))));
            }
        };
        let key = AgentKey::new(&prompt, label.as_deref(), schema.as_ref().map(Schema::as_value), model.as_deref());
        let shown = label.clone().unwrap_or_else(|| "agent".to_string());

        // Journaled: replay for free (from the cache, else from the store).
        let cached = self.state().cache.agent(&key.0).cloned();
        let journaled = match cached {
            Some(outcome) => Some(outcome),
            None => self.journal.get_agent(&self.run_id, &key.0).map_err(|e| self.abort(Abort::Storage(e)))?,
        };
        if let Some(outcome) = journaled {
            self.cache_hits.fetch_add(1, Ordering::Relaxed);
            self.notify_cached(shown, outcome.is_some());
            return Ok(outcome);
        }

        // In flight or done in this attempt: share the one call.
        let key_hex = key.0.clone();
        let (cell, first) = {
            let mut inflight = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
            match inflight.get(&key.0) {
                Some(cell) => (cell.clone(), false),
                None => {
                    let cell: Shared = Arc::new(OnceCell::new());
                    inflight.insert(key.0.clone(), cell.clone());
                    (cell, true)
                }
            }
        };
        if !first {
            self.cache_hits.fetch_add(1, Ordering::Relaxed);
        }
        let request = AgentRequest {
            prompt,
            label,
            model,
            schema: schema.as_ref().map(|s| s.as_value().clone()),
            attempt: 0,
            feedback: None,
        };
        let this = self.clone();
        let outcome = cell
            .get_or_init(|| async move {
                let outcome = this.spawn_agent(request, schema).await;
                if let Ok(reply) = &outcome {
                    let cost = this.journal.footprint(this.run_id.len() + key.0.len(), 1 + reply.as_ref().map_or(0, String::len));
                    let mut state = this.state();
                    let written = this.charge(&mut state, cost, false).and_then(|total| {
                        this.journal
                            .put_agent(&this.run_id, &key.0, reply.as_deref(), total)
                            .map_err(Abort::Storage)
                    });
                    if let Err(abort) = written {
                        drop(state);
                        return Err(this.abort(abort));
                    }
                    state.cache.put_agent(key.0.clone(), reply.clone());
                }
                outcome
            })
            .await
            .clone();
        if first {
            // Done: later identical calls replay from the journal, so this attempt does not
            // hold every outcome for its whole life. Calls already waiting share the cell.
            self.inflight.lock().unwrap_or_else(|p| p.into_inner()).remove(&key_hex);
        }
        if !first {
            if let Ok(reply) = &outcome {
                self.notify_cached(shown, reply.is_some());
            }
        }
        outcome
    }

    /// Admit a spawn for `model`: the total cap and the credit budget (which needs the
    /// model's cost to be known), checked at the moment it starts.
    fn admit(&self, model: Option<&str>) -> Result<(), Abort> {
        if let Some(abort) = self.stopping() {
            return Err(abort);
        }
        if self.limits.max_ai_credits.is_some() {
            if let Some(message) = self.backend.unpriced(model) {
                return Err(self.abort(Abort::Unpriced(message)));
            }
        }
        let n = self.spawned.fetch_add(1, Ordering::SeqCst);
        if self.limits.max_total_subagents.is_some_and(|max| n >= u64::from(max)) {
            self.spawned.fetch_sub(1, Ordering::SeqCst);
            return Err(self.abort(Abort::Limit(LimitKind::MaxTotalSubagents)));
        }
        if let Some(budget) = self.limits.max_ai_credits {
            // Compare in exact nano-credits; a budget too large to express is no limit.
            let budget = crate::backend::pricing::float_credits_nano(budget).unwrap_or(u64::MAX);
            // A saturated total means the spend is beyond counting: the budget is exhausted.
            let spent = self.credits_nano.load(Ordering::SeqCst);
            if spent >= budget || spent == u64::MAX {
                self.spawned.fetch_sub(1, Ordering::SeqCst);
                return Err(self.abort(Abort::Limit(LimitKind::MaxAiCredits)));
            }
        }
        Ok(())
    }

    /// Account a reply's usage; a budgeted run whose usage is unknown stops (fail-closed).
    fn account(&self, reply: &AgentReply) -> Result<u64, Abort> {
        let credits = reply.usage.as_ref().and_then(|u| u.credits_nano);
        if let Some(usage) = &reply.usage {
            saturating_add(&self.input_tokens, usage.input_tokens);
            saturating_add(&self.output_tokens, usage.output_tokens);
        }
        match credits {
            Some(c) => {
                saturating_add(&self.credits_nano, c);
                Ok(c)
            }
            None if self.limits.max_ai_credits.is_some() => {
                self.log(format!("backend `{}` reported no usage on a budgeted run", self.backend.name()));
                Err(self.abort(Abort::Limit(LimitKind::MaxAiCredits)))
            }
            None => Ok(0),
        }
    }

    /// One subagent call: up to two spawns with a schema (one retry on a parse or match
    /// failure), one without.
    async fn spawn_agent(&self, mut request: AgentRequest, schema: Option<Schema>) -> Result<Option<String>, Abort> {
        let label = request.label.clone().unwrap_or_else(|| "agent".to_string());
        let started = Instant::now();
        let mut summary = AgentSummary {
            label: label.clone(),
            model: request.model.clone(),
            status: crate::model::progress::AgentStatus::Failed,
            spawns: 0,
            credits_nano: 0,
            millis: 0,
        };
        let spawns = if schema.is_some() { 2 } else { 1 };
        let mut outcome = Ok(None);
        for attempt in 0..spawns {
            request.attempt = attempt;
            let _slot = match &self.slots {
                Some(slots) => {
                    if slots.available_permits() == 0 {
                        self.emit(ProgressEvent::AgentQueued { label: label.clone() });
                    }
                    match slots.clone().acquire_owned().await {
                        Ok(permit) => Some(permit),
                        Err(_) => return Err(Abort::Cancelled),
                    }
                }
                None => None,
            };
            if let Err(abort) = self.admit(request.model.as_deref()) {
                outcome = Err(abort);
                break;
            }
            summary.spawns += 1;
            self.emit(ProgressEvent::AgentStarted { label: label.clone(), attempt });
            let reply = self.backend.call(Arc::new(request.clone())).await;
            let reply = match reply {
                Ok(reply) => reply,
                Err(e) => {
                    if let Some(kind) = e.outage_kind() {
                        // Not an answer: the attempt stops and the call stays unjournaled.
                        let message = format!("agent `{label}`: {}", e.message());
                        outcome = Err(self.abort(Abort::Backend { kind, message }));
                    } else {
                        self.log(format!("agent `{label}` failed: {e}"));
                    }
                    break;
                }
            };
            match self.account(&reply) {
                Ok(c) => summary.credits_nano = summary.credits_nano.saturating_add(c),
                Err(abort) => {
                    outcome = Err(abort);
                    break;
                }
            }
            match &schema {
                None if reply.text.trim().is_empty() => break,
                None => {
                    outcome = Ok(Some(serde_json::Value::String(reply.text).to_string()));
                    break;
                }
                Some(schema) => match schema.parse_reply(&reply.text) {
                    Ok(value) => {
                        outcome = Ok(Some(value.to_string()));
                        break;
                    }
                    Err(mismatch) => {
                        let next = if attempt + 1 < spawns { ", retrying" } else { "" };
                        self.log(format!("agent `{label}` reply does not match its schema: {mismatch}{next}"));
                        request.feedback = Some(format!("it does not match the schema ({mismatch})"));
                    }
                },
            }
        }
        summary.status = match &outcome {
            Ok(Some(_)) => crate::model::progress::AgentStatus::Ok,
            Ok(None) => crate::model::progress::AgentStatus::Failed,
            Err(_) => crate::model::progress::AgentStatus::Aborted,
        };
        summary.millis = started.elapsed().as_millis() as u64;
        if outcome.is_ok() {
            self.emit(ProgressEvent::AgentFinished { summary, cached: false });
            let accounting = self.accounting();
            if let Err(e) = self.journal.put_accounting(&self.run_id, &accounting) {
                return Err(self.abort(Abort::Storage(e)));
            }
        }
        outcome
    }

    /// Accounting so far, all attempts included; active time counts this attempt so far.
    pub(crate) fn accounting(&self) -> Accounting {
        Accounting {
            agents_spawned: self.spawned.load(Ordering::SeqCst),
            agent_cache_hits: self.cache_hits.load(Ordering::SeqCst),
            active_seconds: (self.prior_active + self.started.elapsed()).as_secs_f64(),
            ai_credits_nano: self.credits_nano.load(Ordering::SeqCst),
            input_tokens: self.input_tokens.load(Ordering::SeqCst),
            output_tokens: self.output_tokens.load(Ordering::SeqCst),
        }
    }

    /// Log lines dropped over the cap.
    pub(crate) fn dropped_log_lines(&self) -> u64 {
        self.state().dropped_log_lines
    }
}

/// Add to a counter without wrapping: a total past `u64::MAX` stays there.
fn saturating_add(counter: &AtomicU64, amount: u64) {
    let _ = counter.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| Some(n.saturating_add(amount)));
}

/// How much a parsed schema may weigh per byte of its text (a tree of small nodes).
const SCHEMA_TREE_FACTOR: u64 = 16;

/// The bytes an agent call holds in the host while it is pending: its prompt, label and
/// model, and its schema's text and parsed tree (charged [`SCHEMA_TREE_FACTOR`] times the
/// text), plus a fixed overhead per call.
fn pending_charge(prompt: &str, label: Option<&str>, schema: Option<&str>, model: Option<&str>) -> u64 {
    let text = prompt.len() + label.map_or(0, str::len) + model.map_or(0, str::len);
    let schema = schema.map_or(0, |s| s.len() as u64).saturating_mul(SCHEMA_TREE_FACTOR + 1);
    (text as u64).saturating_add(schema).saturating_add(1024)
}

/// Counts one pending agent call, and the bytes it holds, for as long as it lives.
struct PendingCall<'a> {
    counter: &'a AtomicU64,
    bytes: &'a AtomicU64,
    host_bytes: &'a AtomicU64,
    charge: u64,
    /// Pending calls including this one, when it entered.
    count: u64,
    /// Bytes pending calls of the run hold, this one included, when it entered.
    run_bytes: u64,
    /// The same over every run of the host.
    host_bytes_now: u64,
}

impl<'a> PendingCall<'a> {
    fn enter(counter: &'a AtomicU64, bytes: &'a AtomicU64, host_bytes: &'a AtomicU64, charge: u64) -> Self {
        let count = counter.fetch_add(1, Ordering::SeqCst) + 1;
        let run_bytes = bytes.fetch_add(charge, Ordering::SeqCst).saturating_add(charge);
        let host_bytes_now = host_bytes.fetch_add(charge, Ordering::SeqCst).saturating_add(charge);
        PendingCall { counter, bytes, host_bytes, charge, count, run_bytes, host_bytes_now }
    }
}

impl Drop for PendingCall<'_> {
    fn drop(&mut self) {
        self.counter.fetch_sub(1, Ordering::SeqCst);
        self.bytes.fetch_sub(self.charge, Ordering::SeqCst);
        self.host_bytes.fetch_sub(self.charge, Ordering::SeqCst);
    }
}

fn limit_message(kind: LimitKind, limits: &Limits) -> String {
    match kind {
        LimitKind::MaxTotalSubagents => format!(
            "maxTotalSubagents ({}) reached: resume with a higher --max-total-subagents to continue",
            limits.max_total_subagents.unwrap_or(0)
        ),
        LimitKind::TimeoutSeconds => format!(
            "timeoutSeconds ({}) of active time reached: resume with a higher --timeout-seconds to continue",
            limits.timeout_seconds.unwrap_or(0.0)
        ),
        LimitKind::MaxAiCredits => format!(
            "maxAiCredits ({}) reached or usage could not be accounted: resume with a higher --max-ai-credits to continue",
            limits.max_ai_credits.unwrap_or(0.0)
        ),
    }
}

/// How an attempt ended.
#[derive(Debug, Clone)]
pub(crate) struct AttemptOutcome {
    pub status: RunStatus,
    pub result: Option<crate::model::json::RawJson>,
    pub failure: Option<Failure>,
}

/// How long a stopped attempt's guest may run on to react to the stop (abort listeners,
/// a last log line) before its store is dropped.
pub(crate) const STOP_GRACE: Duration = Duration::from_millis(500);

/// Run one attempt to its end. `args` is JSON text; `budget` the active time left;
/// `grants` the run's checked read-only directories.
pub(crate) async fn execute(
    engine: &wasmtime::Engine,
    component: &LoadedComponent,
    shared: Arc<RunShared>,
    args: String,
    budget: Option<Duration>,
    grants: &[String],
) -> AttemptOutcome {
    let stop = shared.stop.clone();
    let returned = {
        let mut store = match sandbox::new_store(engine, &shared.sandbox, shared.clone(), component.script.clone(), grants) {
            Ok(store) => store,
            Err(e) => return outcome_failed(Failure::new(crate::model::envelope::FailureType::Sandbox, None, format!("{e:#}"))),
        };
        let pre = component.pre.clone();
        let call = async {
            let factory = pre.instantiate_async(&mut store).await?;
            store.run_concurrent(async move |accessor| factory.call_run(accessor, args).await).await?
        };
        let deadline = async {
            match budget {
                Some(left) => tokio::time::sleep(left).await,
                None => std::future::pending().await,
            }
        };
        let returned = {
            let mut call = std::pin::pin!(call);
            let returned = tokio::select! {
                biased;
                _ = stop.cancelled() => None,
                _ = deadline => {
                    shared.abort(Abort::Limit(LimitKind::TimeoutSeconds));
                    None
                }
                r = &mut call => Some(r),
            };
            // A stop lets the guest run on for [`STOP_GRACE`] (its sleeps and agent calls
            // answer at once, with the abort) so that `ctx.signal` listeners run; then the
            // store goes. What the guest returns meanwhile does not count: the cause wins.
            if returned.is_none() {
                let _ = tokio::time::timeout(STOP_GRACE, &mut call).await;
            }
            returned
        };
        // Dropping the store here stops the guest and every host future it spawned.
        let output = store.data().captured_output();
        drop(store);
        for line in String::from_utf8_lossy(&output).lines() {
            shared.log(format!("[guest] {line}"));
        }
        returned
    };

    // Whatever happened, nothing is reported before the journal is durable.
    let flushed = shared.journal.flush().await;
    let cause = shared.cause.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mut outcome = match (cause, returned) {
        (Some(StopCause::Cancelled), _) => AttemptOutcome {
            status: RunStatus::Cancelled,
            result: None,
            failure: Some(Failure::new(crate::model::envelope::FailureType::Cancelled, None, "the run was cancelled"))
        },
        // A recorded failure wins over whatever the guest returned after it.
        (Some(StopCause::Failed(failure, _)), _) => outcome_failed(failure),
        (Some(StopCause::Halted), _) => AttemptOutcome {
            status: RunStatus::Halted,
            result: None,
            failure: Some(Failure::new(crate::model::envelope::FailureType::Halted, None, "the host shut down during this attempt; resume to continue")),
        },
        // Only a cancel from outside stops an attempt without recording a cause.
        (None, None) => AttemptOutcome {
            status: RunStatus::Cancelled,
            result: None,
            failure: Some(Failure::new(crate::model::envelope::FailureType::Cancelled, None, "the run was cancelled")),
        },
        (None, Some(Err(trap))) => outcome_failed(classify_trap(&trap)),
        (None, Some(Ok(Err(message)))) => outcome_failed(Failure::new(crate::model::envelope::FailureType::GuestError, None, message)),
        (None, Some(Ok(Ok(result)))) => match check_result(result, &shared.sandbox) {
            Ok(result) => AttemptOutcome { status: RunStatus::Completed, result, failure: None },
            Err(failure) => outcome_failed(failure),
        },
    };
    if let Err(e) = flushed {
        outcome = outcome_failed(Failure::new(crate::model::envelope::FailureType::Storage, None, e.to_string()));
    }
    outcome
}

fn outcome_failed(failure: Failure) -> AttemptOutcome {
    AttemptOutcome { status: RunStatus::Error, result: None, failure: Some(failure) }
}

/// The run's result must be JSON within the size cap.
fn check_result(result: Option<String>, sandbox: &SandboxLimits) -> Result<Option<crate::model::json::RawJson>, Failure> {
    let Some(text) = result else { return Ok(None) };
    if text.len() > sandbox.max_result_bytes {
        return Err(Failure::new(
            crate::model::envelope::FailureType::SandboxLimit,
            Some("maxResultBytes"),
            format!("result is {} bytes, over the {} byte limit", text.len(), sandbox.max_result_bytes),
        ));
    }
    let depth = crate::model::json::depth(&text);
    if depth > sandbox.max_json_depth {
        return Err(Failure::new(
            crate::model::envelope::FailureType::SandboxLimit,
            Some("maxJsonDepth"),
            format!("result is nested {depth} deep, over the limit of {}", sandbox.max_json_depth),
        ));
    }
    crate::model::json::RawJson::from_text(text)
        .map(Some)
        .map_err(|e| Failure::new(crate::model::envelope::FailureType::InvalidResult, None, format!("the result is {e}")))
}

/// Name what stopped a guest: fuel, memory, stack, or a plain trap (a panic is `unreachable`).
pub(crate) fn classify_trap(error: &wasmtime::Error) -> Failure {
    let message = format!("{error:#}");
    if let Some(trap) = error.downcast_ref::<wasmtime::Trap>() {
        match trap {
            wasmtime::Trap::OutOfFuel => {
                return Failure::new(crate::model::envelope::FailureType::SandboxLimit, Some("fuel"), "the guest used up its CPU fuel budget")
            }
            wasmtime::Trap::StackOverflow => {
                return Failure::new(crate::model::envelope::FailureType::SandboxLimit, Some("stack"), "the guest overflowed its stack")
            }
            wasmtime::Trap::UnreachableCodeReached => {
                return Failure::new(crate::model::envelope::FailureType::Trap, Some("unreachable"), format!("the guest trapped (a panic?): {message}"))
            }
            _ => {}
        }
    }
    // The root cause alone ("forcing trap when growing memory to N bytes"): the wasm
    // backtrace around it says nothing to the factory's author.
    let cause = error.root_cause().to_string();
    if message.contains("forcing trap when growing memory") {
        return Failure::new(crate::model::envelope::FailureType::SandboxLimit, Some("memory"), format!("the guest exceeded its memory limit: {cause}"));
    }
    if message.contains("forcing trap when growing table") {
        return Failure::new(crate::model::envelope::FailureType::SandboxLimit, Some("table"), format!("the guest exceeded its table limit: {cause}"));
    }
    Failure::new(crate::model::envelope::FailureType::Trap, None, message)
}
