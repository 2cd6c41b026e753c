//! Subagents (`agents.agent`; `agents.agent-ready`, its synchronous memo-hit path; and
//! `agents.agent-start`, which [`super::started`] drives) and sleep (`agents.sleep`): the
//! concurrent hooks. This module
//! owns the semantics and per-run state of subagent calls: admission (pending-call and
//! pending-byte caps, per-call caps), the memo (a journaled outcome replays for free, an
//! identical call in flight is shared), concurrency slots, the total-subagent and credit
//! limits, the per-agent soft limits (checked, the factory's defaults filled in, part of the
//! memo key, handed to the backend), schema retries, and accounting (spawns, cache hits,
//! credits, tokens). Each hook
//! call clones what it needs out of the store and awaits without holding it, so thousands
//! can be in flight at once. The hooks reach an attempt's calls, and the set of calls
//! `agents.agent-start` started, through [`super::started::AgentsView`]. Sleep's semantics are in
//! [`super::sleep`]; the WIT binding of both is in [`super::bindings`].

use super::abort::{Abort, LimitKind};
use super::attempt::{Attempt, AttemptSetup, Memo};
use super::progress::Progress;
use crate::backend::{AgentBackend, AgentReply, AgentRequest};
use crate::model::agent_key::AgentKey;
use crate::model::envelope::Accounting;
use crate::model::limits::AgentLimits;
use crate::model::progress::{AgentSummary, ProgressEvent};
use crate::model::sandbox_limits::SandboxLimitKind;
use crate::model::schema::Schema;
use crate::model::tuning::AgentTuning;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::{OnceCell, Semaphore};

type Shared = Arc<OnceCell<Result<Option<String>, Abort>>>;

/// The most free-on-this-machine notices one attempt logs (one per backend and model).
const MAX_NOTICES: usize = 8;

/// What [`Agents::start`] made of an agent call.
pub(crate) enum Start {
    /// Answered without a wait: a memo hit, or a refusal.
    Answered(Result<Option<String>, Abort>),
    /// Admitted, not yet answered: [`Agents::finish`] it.
    Call(Box<Call>),
}

/// An admitted agent call [`Agents::start`] could not answer at once.
pub(crate) struct Call {
    /// Counts the call as pending until it ends.
    pending: PendingCall,
    prompt: String,
    label: Option<String>,
    schema: Option<Schema>,
    model: Option<String>,
    limits: AgentLimits,
    tuning: AgentTuning,
    key: AgentKey,
    /// The journal view knows the key was never journaled (no store read needed).
    known: bool,
}

/// The subagent calls of one attempt.
pub(crate) struct Agents {
    attempt: Arc<Attempt>,
    progress: Arc<Progress>,
    backend: Arc<dyn AgentBackend>,
    /// Calls in flight in this attempt, by key: identical calls share one.
    inflight: Mutex<HashMap<AgentKey, Shared, foldhash::fast::RandomState>>,
    /// Concurrency slots (`maxConcurrentSubagents`), if limited.
    slots: Option<Arc<Semaphore>>,
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
    /// Some spend counted in `credits_nano` is a lower bound (see [`Accounting`]).
    credits_at_least: AtomicBool,
    input_tokens: AtomicU64,
    output_tokens: AtomicU64,
    cache_read_tokens: AtomicU64,
    cache_write_tokens: AtomicU64,
    /// The backend's metrics handles.
    metrics: crate::metrics::BackendMetrics,
    /// The factory's default soft limits (`meta.agentLimits`).
    agent_limits: AgentLimits,
    /// The backend's free-on-this-machine notices already logged (each once per attempt).
    noticed: Mutex<Vec<String>>,
}

impl Agents {
    /// Subagent calls over `attempt`, counting on from the run's prior accounting.
    pub(crate) fn new(attempt: Arc<Attempt>, progress: Arc<Progress>, setup: &AttemptSetup) -> Agents {
        let slots = setup.limits.concurrency().map(|n| Arc::new(Semaphore::new(n as usize)));
        Agents {
            attempt,
            progress,
            backend: setup.backend.clone(),
            inflight: Mutex::new(HashMap::default()),
            slots,
            spawned: AtomicU64::new(setup.prior.agents_spawned),
            cache_hits: AtomicU64::new(setup.prior.agent_cache_hits),
            attempt_cache_hits: AtomicU64::new(0),
            pending_calls: AtomicU64::new(0),
            pending_bytes: AtomicU64::new(0),
            host_pending_bytes: setup.host_pending_bytes.clone(),
            credits_nano: AtomicU64::new(setup.prior.ai_credits_nano),
            credits_at_least: AtomicBool::new(setup.prior.ai_credits_at_least),
            input_tokens: AtomicU64::new(setup.prior.input_tokens),
            output_tokens: AtomicU64::new(setup.prior.output_tokens),
            cache_read_tokens: AtomicU64::new(setup.prior.cache_read_tokens),
            cache_write_tokens: AtomicU64::new(setup.prior.cache_write_tokens),
            metrics: crate::metrics::metrics().backend(&setup.backend.name()),
            agent_limits: setup.agent_limits.clone(),
            noticed: Mutex::new(Vec::new()),
        }
    }

    /// Tell live subscribers (not the journal) about a call answered without a spawn. A
    /// replay changes nothing durable, and journaling one entry per replayed call would make
    /// every resume pay (and store) again for what it skips; the attempt's `AttemptEnded`
    /// entry counts them instead.
    fn notify_cached(&self, label: &str, ok: bool) {
        self.attempt_cache_hits.fetch_add(1, Ordering::Relaxed);
        self.metrics.call(crate::metrics::CallOutcome::Cached);
        self.attempt.announce(|| ProgressEvent::cached(label.to_string(), ok));
    }

    /// The attempt these calls belong to.
    pub(crate) fn attempt(&self) -> &Arc<Attempt> {
        &self.attempt
    }

    /// The flows the backend's calls go through (see [`AgentBackend::flows`]).
    pub(crate) fn flows(&self) -> Vec<Arc<crate::backend::flow::Flow>> {
        self.backend.flows()
    }

    /// Calls this attempt answered from the journal or an identical call.
    pub(crate) fn attempt_cache_hits(&self) -> u64 {
        self.attempt_cache_hits.load(Ordering::Relaxed)
    }

    /// `agents.agent` (memoized, journaled, limited), the part that needs no wait: the
    /// per-call caps, admission as a pending call, the memo key, and the answer when the
    /// attempt's journal view has it (a memo hit answers here, with no await, and is never
    /// counted as pending). A call it cannot answer is handed to [`Agents::finish`];
    /// dropping it instead (as `agents.agent-ready` does) undoes its admission.
    pub(crate) fn start(
        self: &Arc<Self>,
        prompt: String,
        label: Option<String>,
        schema: Option<String>,
        model: Option<String>,
        limits: AgentLimits,
        tuning: AgentTuning,
    ) -> Start {
        if let Some(abort) = self.attempt.stopping() {
            return Start::Answered(Err(abort));
        }
        let limits = match self.check_call(&prompt, label.as_deref(), schema.as_deref(), model.as_deref(), limits) {
            Ok(limits) => limits,
            Err(abort) => return Start::Answered(Err(abort)),
        };
        if let Err(e) = tuning.validate() {
            let who = label.as_deref().unwrap_or("agent");
            return Start::Answered(Err(self.attempt.abort(Abort::InvalidCall(format!("agent `{who}`: {e}")))));
        }
        // The call's strings are already in host memory, and stay there while it is pending
        // (their bytes are charged as it enters). A small call without a schema is keyed at
        // once and enters only if it must wait: a memo hit is never pending. A call with a
        // schema enters before the schema is parsed (the one copy that grows with it), and a
        // large one before its key is hashed: the bytes that are not yet counted are never
        // more than a small call's, for longer than it takes to hash them.
        let charge = pending_charge(&prompt, label.as_deref(), schema.as_deref(), model.as_deref())
            .saturating_add(limits.wrap_up.as_ref().map_or(0, |w| w.len() as u64))
            .saturating_add(tuning.len() as u64);
        let pending = if schema.is_some() || charge > KEYED_BEFORE_ENTRY_BYTES {
            match self.enter(charge) {
                Ok(pending) => Some(pending),
                Err(abort) => return Start::Answered(Err(abort)),
            }
        } else {
            None
        };
        let schema = match schema.map(|text| self.parse_schema(&text, label.as_deref())).transpose() {
            Ok(schema) => schema,
            Err(abort) => return Start::Answered(Err(abort)),
        };
        let key = AgentKey::of(
            &prompt,
            label.as_deref(),
            schema.as_ref().map(Schema::as_value),
            model.as_deref(),
            &limits,
            &tuning,
        );
        // Journaled: replay for free, here when the journal view knows the answer.
        let known = match self.attempt.cached_agent(&key) {
            Memo::Hit(outcome) => return Start::Answered(Ok(self.hit(outcome, label.as_deref(), model.as_deref()))),
            Memo::Absent => true,
            Memo::Unknown => false,
        };
        let pending = match pending.map_or_else(|| self.enter(charge), Ok) {
            Ok(pending) => pending,
            Err(abort) => return Start::Answered(Err(abort)),
        };
        Start::Call(Box::new(Call { pending, prompt, label, schema, model, limits, tuning, key, known }))
    }

    /// The per-call caps and the limits' validity: the effective limits (the call's over the
    /// factory's).
    fn check_call(
        &self,
        prompt: &str,
        label: Option<&str>,
        schema: Option<&str>,
        model: Option<&str>,
        limits: AgentLimits,
    ) -> Result<AgentLimits, Abort> {
        let sandbox = &self.attempt.sandbox;
        if prompt.len() > sandbox.max_prompt_bytes {
            let message = format!("prompt is {} bytes, over the {} byte limit", prompt.len(), sandbox.max_prompt_bytes);
            return Err(self.attempt.abort(Abort::SandboxLimit { kind: SandboxLimitKind::MaxPromptBytes, message }));
        }
        if let Some(label) = label {
            self.attempt.cap(SandboxLimitKind::MaxLabelBytes, "agent label", label.len(), sandbox.max_label_bytes)?;
        }
        if let Some(model) = model {
            self.attempt.cap(
                SandboxLimitKind::MaxModelBytes,
                "agent model name",
                model.len(),
                sandbox.max_model_bytes,
            )?;
        }
        if let Some(schema) = schema {
            self.attempt.cap(
                SandboxLimitKind::MaxSchemaBytes,
                "agent schema",
                schema.len(),
                sandbox.max_schema_bytes,
            )?;
        }
        if let Some(wrap_up) = &limits.wrap_up {
            // A wrap-up is a prompt: bounded like one.
            self.attempt.cap(
                SandboxLimitKind::MaxPromptBytes,
                "agent wrap-up prompt",
                wrap_up.len(),
                sandbox.max_prompt_bytes,
            )?;
        }
        if let Err(e) = limits.validate() {
            let who = label.unwrap_or("agent");
            return Err(self.attempt.abort(Abort::InvalidCall(format!("agent `{who}`: {e}"))));
        }
        // The effective limits (the call's over the factory's) are the call's identity.
        Ok(limits.or(&self.agent_limits))
    }

    /// Count a call holding `charge` bytes as pending, within the pending-call and
    /// pending-byte caps of its run and of the host (refused, and not counted, past one).
    fn enter(self: &Arc<Self>, charge: u64) -> Result<PendingCall, Abort> {
        let pending = PendingCall::enter(self.clone(), charge);
        let sandbox = &self.attempt.sandbox;
        if pending.count > sandbox.max_pending_agent_calls as u64 {
            let message = format!("more than {} agent calls pending at once", sandbox.max_pending_agent_calls);
            return Err(self
                .attempt
                .abort(Abort::SandboxLimit { kind: SandboxLimitKind::MaxPendingAgentCalls, message }));
        }
        if pending.run_bytes > sandbox.max_pending_agent_bytes {
            let message = format!(
                "agent calls pending at once would hold {} bytes in the host, over the {} byte limit",
                pending.run_bytes, sandbox.max_pending_agent_bytes
            );
            return Err(self
                .attempt
                .abort(Abort::SandboxLimit { kind: SandboxLimitKind::MaxPendingAgentBytes, message }));
        }
        if pending.host_bytes_now > sandbox.max_host_pending_agent_bytes {
            let message = format!(
                "agent calls pending at once in every run of this host would hold {} bytes, over the {} byte limit",
                pending.host_bytes_now, sandbox.max_host_pending_agent_bytes
            );
            return Err(self
                .attempt
                .abort(Abort::SandboxLimit { kind: SandboxLimitKind::MaxHostPendingAgentBytes, message }));
        }
        Ok(pending)
    }

    /// A call's schema, parsed (a schema that is not one fails the call as invalid).
    fn parse_schema(&self, text: &str, label: Option<&str>) -> Result<Schema, Abort> {
        Schema::parse(text).map_err(|e| {
            let who = label.unwrap_or("agent");
            self.attempt.abort(Abort::InvalidCall(format!("agent `{who}`: invalid schema: {e}")))
        })
    }

    /// A call answered from the journal: counted, traced and told to live subscribers.
    fn hit(&self, outcome: Option<String>, label: Option<&str>, model: Option<&str>) -> Option<String> {
        self.cache_hits.fetch_add(1, Ordering::Relaxed);
        let shown = label.unwrap_or("agent");
        let span = self.span(model, shown, crate::trace::Memo::Hit);
        crate::trace::agent_ended(&span, if outcome.is_some() { "ok" } else { "failed" }, 0);
        self.notify_cached(shown, outcome.is_some());
        outcome
    }

    /// The part of `agents.agent` that may wait: the store's answer for a key the journal
    /// view does not know, an identical call in flight, or the spawn itself.
    pub(crate) async fn finish(self: Arc<Self>, call: Box<Call>) -> Result<Option<String>, Abort> {
        let Call { pending: _pending, prompt, label, schema, model, limits, tuning, key, known } = *call;
        if !known {
            let journaled =
                self.attempt.read_agent(key.as_str()).await.map_err(|e| self.attempt.abort(Abort::Storage(e)))?;
            if let Some(outcome) = journaled {
                return Ok(self.hit(outcome, label.as_deref(), model.as_deref()));
            }
        }

        // In flight or done in this attempt: share the one call.
        let (cell, first) = {
            let mut inflight = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
            match inflight.get(&key) {
                Some(cell) => (cell.clone(), false),
                None => {
                    let cell: Shared = Arc::new(OnceCell::new());
                    inflight.insert(key, cell.clone());
                    (cell, true)
                }
            }
        };
        if !first {
            self.cache_hits.fetch_add(1, Ordering::Relaxed);
        }
        let shown = if first { String::new() } else { label.clone().unwrap_or_else(|| "agent".to_string()) };
        let span = self.span(
            model.as_deref(),
            label.as_deref().unwrap_or("agent"),
            if first { crate::trace::Memo::Miss } else { crate::trace::Memo::Shared },
        );
        let request = AgentRequest {
            prompt,
            label,
            model,
            schema: schema.as_ref().map(|s| s.as_value().clone()),
            attempt: 0,
            feedback: None,
            limits,
            tuning,
        };
        let this = &self;
        let call_span = &span;
        let key = &key;
        let outcome = cell
            .get_or_init(|| async move {
                let (outcome, summary) = this.spawn_agent(request, schema, call_span).await;
                if let Ok(reply) = &outcome {
                    // Its progress entry, the accounting and the outcome: one journal write.
                    let finished = ProgressEvent::AgentFinished { summary, cached: false };
                    if let Err(abort) = this.attempt.finish_agent(key, reply, finished, &this.accounting()) {
                        return Err(this.attempt.abort(abort));
                    }
                }
                outcome
            })
            .await
            .clone();
        if first {
            // Done: later identical calls replay from the journal, so this attempt does not
            // hold every outcome for its whole life. Calls already waiting share the cell.
            self.inflight.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
        } else {
            crate::trace::agent_ended(&span, status_name(&outcome), 0);
            if let Ok(reply) = &outcome {
                self.notify_cached(&shown, reply.is_some());
            }
        }
        outcome
    }

    /// The span of one agent call under the attempt's current phase (none when traces are off).
    fn span(&self, model: Option<&str>, label: &str, memo: crate::trace::Memo) -> tracing::Span {
        let parent = self.attempt.parent_span();
        if parent.is_disabled() {
            return parent;
        }
        crate::trace::agent_call(&parent, || self.backend.name(), model, Some(label), memo)
    }

    /// Admit a spawn for `model`: the journal still writable, the total cap and the credit
    /// budget (which needs the model's cost to be known), checked at the moment it starts.
    fn admit(&self, model: Option<&str>) -> Result<(), Abort> {
        if let Some(abort) = self.attempt.stopping() {
            return Err(abort);
        }
        // A journal that would refuse the outcome (a worker whose lease ran out) pays for no
        // call whose answer it could not keep.
        if let Err(e) = self.attempt.journal.writable(&self.attempt.run_id) {
            return Err(self.attempt.abort(Abort::Storage(e)));
        }
        if self.attempt.limits.max_ai_credits.is_some() {
            if let Some(message) = self.backend.unpriced(model) {
                return Err(self.attempt.abort(Abort::Unpriced(message)));
            }
        }
        let n = self.spawned.fetch_add(1, Ordering::SeqCst);
        if self.attempt.limits.max_total_subagents.is_some_and(|max| n >= u64::from(max)) {
            self.spawned.fetch_sub(1, Ordering::SeqCst);
            return Err(self.attempt.abort(Abort::Limit(LimitKind::MaxTotalSubagents)));
        }
        if let Some(budget) = self.attempt.limits.max_ai_credits {
            // Compare in exact nano-credits; a budget too large to express is no limit.
            let budget = crate::backend::pricing::float_credits_nano(budget).unwrap_or(u64::MAX);
            // A saturated total means the spend is beyond counting: the budget is exhausted.
            let spent = self.credits_nano.load(Ordering::SeqCst);
            if spent >= budget || spent == u64::MAX {
                self.spawned.fetch_sub(1, Ordering::SeqCst);
                return Err(self.attempt.abort(Abort::Limit(LimitKind::MaxAiCredits)));
            }
        }
        // A model on a server on this machine that nothing prices costs 0 credits: said once
        // in the run's progress (the CLI that started the run prints it on stderr).
        if let Some(notice) = self.backend.free_notice(model) {
            let mut noticed = self.noticed.lock().unwrap_or_else(|p| p.into_inner());
            // Models are the guest's to name: a few notices at most.
            if noticed.len() < MAX_NOTICES && !noticed.contains(&notice) {
                noticed.push(notice.clone());
                drop(noticed);
                self.progress.log(notice);
            }
        }
        Ok(())
    }

    /// Account a reply's usage into the run's totals and the call's `summary`; a budgeted
    /// run whose cost is unknown stops (fail-closed). A cost that is unknown (no budget) or
    /// a lower bound marks the spend "at least".
    fn account(&self, reply: &AgentReply, summary: &mut AgentSummary) -> Result<(), Abort> {
        let credits = reply.usage.as_ref().and_then(|u| u.credits_nano);
        if let Some(usage) = &reply.usage {
            saturating_add(&self.input_tokens, usage.input_tokens);
            saturating_add(&self.output_tokens, usage.output_tokens);
            saturating_add(&self.cache_read_tokens, usage.cache_read_tokens);
            saturating_add(&self.cache_write_tokens, usage.cache_write_tokens);
            summary.input_tokens = summary.input_tokens.saturating_add(usage.input_tokens);
            summary.output_tokens = summary.output_tokens.saturating_add(usage.output_tokens);
            summary.cache_read_tokens = summary.cache_read_tokens.saturating_add(usage.cache_read_tokens);
            summary.cache_write_tokens = summary.cache_write_tokens.saturating_add(usage.cache_write_tokens);
            if usage.credits_at_least && credits.is_some() {
                self.at_least(summary);
            }
        }
        match credits {
            Some(c) => {
                saturating_add(&self.credits_nano, c);
                summary.credits_nano = summary.credits_nano.saturating_add(c);
                Ok(())
            }
            // A call a soft limit cut off (killed, or a request dropped) reports nothing: its
            // spend is a lower bound, as for a spawn that failed.
            None if self.attempt.limits.max_ai_credits.is_some() && reply.ended_by.is_none() => {
                self.progress.log(format!("backend `{}` reported no usage on a budgeted run", self.backend.name()));
                self.at_least(summary);
                Err(self.attempt.abort(Abort::Limit(LimitKind::MaxAiCredits)))
            }
            None => {
                self.at_least(summary);
                Ok(())
            }
        }
    }

    /// Mark the run's spend and the call's as a lower bound.
    fn at_least(&self, summary: &mut AgentSummary) {
        summary.credits_at_least = true;
        self.credits_at_least.store(true, Ordering::SeqCst);
    }

    /// One subagent call: up to two spawns with a schema (one retry on a parse or match
    /// failure), one without. Its outcome and summary; the caller journals an answer.
    async fn spawn_agent(
        &self,
        request: AgentRequest,
        schema: Option<Schema>,
        span: &tracing::Span,
    ) -> (Result<Option<String>, Abort>, AgentSummary) {
        // Shared with the backend, not copied per spawn: a retry changes its own copy only
        // while the backend still holds the first.
        let mut request = Arc::new(request);
        let label = request.label.clone().unwrap_or_else(|| "agent".to_string());
        let started = Instant::now();
        let mut summary = AgentSummary {
            label: label.clone(),
            model: request.model.clone(),
            status: crate::model::progress::AgentStatus::Failed,
            ..AgentSummary::default()
        };
        let spawns = if schema.is_some() { 2 } else { 1 };
        let mut outcome = Ok(None);
        for attempt in 0..spawns {
            if request.attempt != attempt {
                Arc::make_mut(&mut request).attempt = attempt;
            }
            let _slot = match &self.slots {
                Some(slots) => {
                    if slots.available_permits() == 0 {
                        self.attempt.emit(ProgressEvent::AgentQueued { label: label.clone() });
                    }
                    let waiting = Instant::now();
                    match slots.clone().acquire_owned().await {
                        Ok(permit) => {
                            self.metrics.queued(waiting.elapsed());
                            Some(permit)
                        }
                        Err(_) => return (Err(Abort::Cancelled), summary),
                    }
                }
                None => None,
            };
            if let Err(abort) = self.admit(request.model.as_deref()) {
                outcome = Err(abort);
                break;
            }
            summary.spawns += 1;
            self.attempt.emit(ProgressEvent::AgentStarted { label: label.clone(), attempt });
            // A spawn cut off mid-way (the attempt stopped and dropped this future) may have
            // been billed for what it had done: the spend becomes a lower bound.
            let cut_off = CutOff(Some(&self.credits_at_least));
            let calling = Instant::now();
            // Under the call's span: what the backend opens (a wait in its flow) is its child.
            let reply = tracing::Instrument::instrument(self.backend.call(request.clone()), span.clone()).await;
            cut_off.finished();
            let reply = match reply {
                Ok(reply) => {
                    let usage = reply.usage.as_ref();
                    let (input, output) = usage.map_or((0, 0), |u| (u.input_tokens, u.output_tokens));
                    self.metrics.spawned(calling.elapsed(), input, output, usage.and_then(|u| u.credits_nano));
                    reply
                }
                Err(e) => {
                    if may_have_billed(&e) {
                        self.at_least(&mut summary);
                    }
                    self.metrics.spawned(calling.elapsed(), 0, 0, None);
                    tracing::warn!(event = "backend_failure", run = %self.attempt.run_id, backend = %self.backend.name(), label = %label, outage = ?e.outage_kind(), error = %e, "agent call failed");
                    if let Some(kind) = e.outage_kind() {
                        // Not an answer: the attempt stops and the call stays unjournaled.
                        let message = format!("agent `{label}`: {}", e.message());
                        outcome = Err(self.attempt.abort(Abort::Backend { kind, message, resume_at: e.resume_at() }));
                    } else {
                        self.progress.log(format!("agent `{label}` failed: {e}"));
                    }
                    break;
                }
            };
            if let Some(u) = &reply.usage {
                crate::trace::agent_usage(span, u.input_tokens, u.output_tokens, u.credits_nano);
            }
            if let Err(abort) = self.account(&reply, &mut summary) {
                outcome = Err(abort);
                break;
            }
            if let Some(limit) = reply.ended_by {
                summary.ended_by = Some(limit);
                self.progress.log(format!("agent `{label}` was ended by its soft limit `{limit}`"));
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
                    // A soft limit ended the call: what it gave is its answer, no retry.
                    Err(_) if reply.ended_by.is_some() => break,
                    Err(mismatch) => {
                        let next = if attempt + 1 < spawns { ", retrying" } else { "" };
                        self.progress.log(format!("agent `{label}` reply does not match its schema: {mismatch}{next}"));
                        Arc::make_mut(&mut request).feedback =
                            Some(format!("it does not match the schema ({mismatch})"));
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
        crate::trace::agent_ended(span, status_name(&outcome), summary.spawns);
        crate::trace::agent_soft_limit(span, summary.ended_by);
        self.metrics.call(match &outcome {
            Ok(Some(_)) => crate::metrics::CallOutcome::Ok,
            Ok(None) => crate::metrics::CallOutcome::Failed,
            Err(_) => crate::metrics::CallOutcome::Aborted,
        });
        (outcome, summary)
    }

    /// Accounting so far, all attempts included; active time counts this attempt so far.
    pub(crate) fn accounting(&self) -> Accounting {
        Accounting {
            agents_spawned: self.spawned.load(Ordering::SeqCst),
            agent_cache_hits: self.cache_hits.load(Ordering::SeqCst),
            active_seconds: self.attempt.active_time().as_secs_f64(),
            ai_credits_nano: self.credits_nano.load(Ordering::SeqCst),
            ai_credits_at_least: self.credits_at_least.load(Ordering::SeqCst),
            input_tokens: self.input_tokens.load(Ordering::SeqCst),
            output_tokens: self.output_tokens.load(Ordering::SeqCst),
            cache_read_tokens: self.cache_read_tokens.load(Ordering::SeqCst),
            cache_write_tokens: self.cache_write_tokens.load(Ordering::SeqCst),
        }
    }
}

/// Marks the run's spend "at least" when dropped before [`CutOff::finished`]: the spawn it
/// guards was abandoned mid-way.
struct CutOff<'a>(Option<&'a AtomicBool>);

impl CutOff<'_> {
    /// The spawn ended (with a reply or an error): nothing was cut off.
    fn finished(mut self) {
        self.0 = None;
    }
}

impl Drop for CutOff<'_> {
    fn drop(&mut self) {
        if let Some(flag) = self.0 {
            flag.store(true, Ordering::SeqCst);
        }
    }
}

/// Whether a spawn that failed with `error` may have been billed without reporting usage:
/// an ordinary failure (a model's refusal, an agent CLI's non-zero exit) or a call that
/// timed out or got an unreadable reply; not a backend that refused the request outright
/// (unreachable, unauthorised, rate limited, a server error, not installed, misconfigured).
fn may_have_billed(error: &crate::backend::BackendError) -> bool {
    use crate::backend::OutageKind;
    match error.outage_kind() {
        None => true,
        Some(kind) => matches!(kind, OutageKind::Timeout | OutageKind::InvalidReply),
    }
}

/// How an agent call ended, as its span says.
fn status_name(outcome: &Result<Option<String>, Abort>) -> &'static str {
    match outcome {
        Ok(Some(_)) => "ok",
        Ok(None) => "failed",
        Err(_) => "aborted",
    }
}

/// Add to a counter without wrapping: a total past `u64::MAX` stays there.
fn saturating_add(counter: &AtomicU64, amount: u64) {
    let _ = counter.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| Some(n.saturating_add(amount)));
}

/// The most a call without a schema may charge and still be keyed (and answered, when it is
/// a memo hit) before it enters as pending: its key is hashed in microseconds.
const KEYED_BEFORE_ENTRY_BYTES: u64 = 64 << 10;

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
pub(crate) struct PendingCall {
    agents: Arc<Agents>,
    charge: u64,
    /// Pending calls including this one, when it entered.
    count: u64,
    /// Bytes pending calls of the run hold, this one included, when it entered.
    run_bytes: u64,
    /// The same over every run of the host.
    host_bytes_now: u64,
}

impl PendingCall {
    fn enter(agents: Arc<Agents>, charge: u64) -> Self {
        let count = agents.pending_calls.fetch_add(1, Ordering::SeqCst) + 1;
        let run_bytes = agents.pending_bytes.fetch_add(charge, Ordering::SeqCst).saturating_add(charge);
        let host_bytes_now = agents.host_pending_bytes.fetch_add(charge, Ordering::SeqCst).saturating_add(charge);
        PendingCall { agents, charge, count, run_bytes, host_bytes_now }
    }
}

impl Drop for PendingCall {
    fn drop(&mut self) {
        self.agents.pending_calls.fetch_sub(1, Ordering::SeqCst);
        self.agents.pending_bytes.fetch_sub(self.charge, Ordering::SeqCst);
        self.agents.host_pending_bytes.fetch_sub(self.charge, Ordering::SeqCst);
    }
}
