//! Flow control per backend: one [`Flow`] per (backend endpoint, API key) in the process,
//! found through [`flow`] by every backend built for that endpoint, so every run of a
//! service shares it. A call is admitted under three bounds and queued (first come, first
//! served) until it fits:
//! - **concurrency**: calls in flight under an adaptive limit (AIMD: halved when the server
//!   pushes back with 429/529/503, grown by one per limit's worth of successes), capped by
//!   `max_concurrent` when configured (agent CLIs: a fixed limit, the machine's cores);
//! - **request and token rates**: token buckets refilled at `requests_per_minute` /
//!   `tokens_per_minute` when configured, else at the rate the provider's own headers imply
//!   ([`headers::Learned`]), their contents kept at most at what the server says remains;
//! - **the server's word**: a 429's `retry-after` closes the flow for everyone until then
//!   (a gate), so a throttled fan-out waits once instead of stampeding.
//!
//! A throttled call does not spend a retry: it goes back to the queue. What bounds it is
//! [`FlowLimits::max_wait`]: a call kept waiting by the server longer than that fails as a
//! `rate_limited` outage, and a single `retry-after` beyond it is a spent quota
//! ([`crate::backend::BackendError::QuotaSpent`]), which parks the run. On a shared store,
//! a [`SharedBudget`] (set by the engine) replaces the local buckets and gate, so workers
//! share one budget.

pub mod headers;

pub use crate::model::flow::{FlowStats, WaitReason};

use headers::Learned;
use reqwest::header::HeaderMap;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime};

/// How long a call may be kept waiting by a server's pushback before it fails (10 minutes).
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(600);

/// The concurrency limit an adaptive flow starts from.
const INITIAL_WINDOW: f64 = 16.0;

/// The most an adaptive flow lets run at once without a configured `max_concurrent`.
const MAX_WINDOW: f64 = 1024.0;

/// The most flows a process keeps (distinct endpoints and keys); past it, idle ones go.
const MAX_FLOWS: usize = 1024;

/// Configured bounds of a backend's flow (all optional; what is not configured is learned).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FlowLimits {
    /// Requests per minute.
    pub requests_per_minute: Option<f64>,
    /// Tokens (prompt and completion) per minute.
    pub tokens_per_minute: Option<f64>,
    /// Calls in flight at once: a fixed cap (the adaptive limit stays under it).
    pub max_concurrent: Option<u32>,
    /// How long the server's pushback may keep one call waiting ([`DEFAULT_MAX_WAIT`]).
    pub max_wait: Option<Duration>,
    /// A fixed concurrency (agent CLIs): no AIMD, no rates learned.
    pub fixed: bool,
    /// Models with limits of their own (a flow each, keyed by the model's name).
    pub models: std::collections::BTreeMap<String, FlowLimits>,
}

impl FlowLimits {
    /// A fixed concurrency of `n` calls (agent CLIs).
    pub fn concurrency(n: u32) -> FlowLimits {
        FlowLimits { max_concurrent: Some(n.max(1)), fixed: true, ..FlowLimits::default() }
    }

    /// The wait bound in force.
    pub fn max_wait(&self) -> Duration {
        self.max_wait.unwrap_or(DEFAULT_MAX_WAIT)
    }
}

/// A budget shared by the workers of a cluster (the engine implements it on the store).
pub trait SharedBudget: Send + Sync + 'static {
    /// Take one request and `tokens` tokens from `key`'s shared buckets, refilled at `rates`
    /// (created full on first use); `Ok(None)` when taken, `Ok(Some(wait))` when not now.
    fn take(
        &self,
        key: &str,
        rates: SharedRates,
        tokens: f64,
    ) -> futures::future::BoxFuture<'static, Result<Option<Duration>, SharedBudgetError>>;

    /// Close `key` for every worker until `until` (the server pushed back).
    fn close_until(
        &self,
        key: &str,
        until: SystemTime,
    ) -> futures::future::BoxFuture<'static, Result<(), SharedBudgetError>>;

    /// Put `tokens` back in `key`'s token bucket (negative: take more): a call's usage, as
    /// its reply says, trued up against what was taken at its admission.
    fn true_up(&self, key: &str, tokens: f64) -> futures::future::BoxFuture<'static, Result<(), SharedBudgetError>>;

    /// The server says at most `requests` and `tokens` remain (when it says): `key`'s buckets
    /// hold no more than that.
    fn remaining(
        &self,
        key: &str,
        requests: Option<f64>,
        tokens: Option<f64>,
    ) -> futures::future::BoxFuture<'static, Result<(), SharedBudgetError>>;
}

/// The rates a shared budget refills at (per second) and its bucket sizes.
pub use crate::model::flow::FlowRates as SharedRates;

/// A shared budget that could not be reached.
#[derive(Debug, thiserror::Error)]
#[error("the shared flow budget: {0}")]
pub struct SharedBudgetError(#[source] pub Box<dyn std::error::Error + Send + Sync>);

/// Why a call could not be admitted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AdmitError {
    /// The server kept the call waiting past the flow's bound.
    #[error(
        "waited {waited:.1}s for backend `{backend}` to accept calls again, past the {bound}s bound (max_wait_seconds)"
    )]
    WaitBound {
        /// The backend's name.
        backend: String,
        /// Seconds waited.
        waited: f64,
        /// The bound, in seconds.
        bound: u64,
    },
}

/// A token bucket.
#[derive(Debug, Clone)]
struct Bucket {
    /// Refill per second.
    rate: f64,
    /// Capacity.
    burst: f64,
    level: f64,
    /// Where the rate came from.
    configured: bool,
}

impl Bucket {
    fn new(rate: f64, burst: f64, configured: bool) -> Bucket {
        Bucket { rate, burst: burst.max(1.0), level: burst.max(1.0), configured }
    }

    fn refill(&mut self, elapsed: f64) {
        self.level = (self.level + self.rate * elapsed).min(self.burst);
    }

    /// How long until `amount` (capped at the burst) fits.
    fn wait_for(&self, amount: f64) -> Option<Duration> {
        let need = amount.min(self.burst);
        if self.level >= need {
            return None;
        }
        Some(Duration::from_secs_f64(((need - self.level) / self.rate.max(1e-6)).min(86_400.0)))
    }
}

#[derive(Debug)]
struct State {
    limits: FlowLimits,
    in_flight: u32,
    /// The adaptive concurrency limit.
    window: f64,
    /// Still doubling (no pushback seen yet).
    slow_start: bool,
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
    refilled: Instant,
    /// Nothing is sent before this (the server said so).
    gate: Option<Instant>,
    /// Admissions so far; a pushback on a call admitted before `cut_at` cuts nothing more.
    admitted: u64,
    cut_at: u64,
    /// Recent successes (admission instants), for the rate a server without headers allows.
    recent: std::collections::VecDeque<Instant>,
    /// Estimated completion tokens per call (a moving average).
    output_estimate: f64,
    waiting_for: Option<WaitReason>,
    shared: Option<Arc<dyn SharedBudget>>,
    /// The shared budget failed last time it was asked (warned once until it answers again).
    shared_failing: bool,
}

impl std::fmt::Debug for dyn SharedBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedBudget")
    }
}

/// The flow controller of one backend endpoint and key.
#[derive(Debug)]
pub struct Flow {
    key: String,
    backend: String,
    state: Mutex<State>,
    /// The queue: calls take this in turn, and the holder waits until it is admitted.
    door: tokio::sync::Mutex<()>,
    /// Rings when a call in flight ends.
    freed: tokio::sync::Notify,
    queued: AtomicU64,
    throttled: AtomicU64,
    wait_nanos: AtomicU64,
    /// The backend's flow metrics (`factory_backend_*`).
    metrics: crate::metrics::FlowMetrics,
}

/// The flow of `key` (e.g. `openai https://api.openai.com/v1 key:1a2b3c4d`), made with
/// `limits` on first use; a later call with other limits updates them.
pub fn flow(key: &str, backend: &str, limits: &FlowLimits) -> Arc<Flow> {
    crate::metrics::set_flow_source(all_stats);
    let mut flows = flows();
    if let Some(flow) = flows.get(key) {
        flow.configure(limits);
        return flow.clone();
    }
    if flows.len() >= MAX_FLOWS {
        flows.retain(|_, f| Arc::strong_count(f) > 1);
    }
    let flow = Arc::new(Flow::new(key, backend, limits.clone()));
    flows.insert(key.to_string(), flow.clone());
    flow
}

/// The flows of the process, by key.
static FLOWS: OnceLock<Mutex<HashMap<String, Arc<Flow>>>> = OnceLock::new();

fn flows() -> MutexGuard<'static, HashMap<String, Arc<Flow>>> {
    FLOWS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner())
}

/// How every flow of the process stands (for metrics sampled at scrape time).
pub fn all_stats() -> Vec<FlowStats> {
    let flows: Vec<Arc<Flow>> = flows().values().cloned().collect();
    flows.iter().map(|f| f.stats()).collect()
}

/// The flows of one backend: the endpoint's, and one per model with limits of its own.
#[derive(Debug, Clone)]
pub struct Flows {
    default: Arc<Flow>,
    models: HashMap<String, Arc<Flow>>,
}

impl Flows {
    /// The flows of `key` for `limits` (see [`flow`]).
    pub fn new(key: &str, backend: &str, limits: &FlowLimits) -> Flows {
        let models = limits
            .models
            .iter()
            .map(|(model, own)| (model.clone(), flow(&format!("{key} model:{model}"), backend, own)))
            .collect();
        Flows { default: flow(key, backend, limits), models }
    }

    /// The flow a call for `model` goes through.
    pub fn get(&self, model: &str) -> &Arc<Flow> {
        self.models.get(model).unwrap_or(&self.default)
    }

    /// Every flow: the endpoint's first, then the models' own.
    pub fn all(&self) -> Vec<Arc<Flow>> {
        std::iter::once(self.default.clone()).chain(self.models.values().cloned()).collect()
    }
}

/// A short fingerprint of an API key for a flow's key (never the key).
pub fn key_fingerprint(api_key: Option<&str>) -> String {
    use sha2::{Digest, Sha256};
    match api_key {
        None => "nokey".into(),
        Some(k) => hex::encode(&Sha256::digest(k.as_bytes())[..6]),
    }
}

impl Flow {
    /// A flow of its own (not shared through [`flow`]): for tests and one-off backends.
    pub fn new(key: &str, backend: &str, limits: FlowLimits) -> Flow {
        let window = match (limits.fixed, limits.max_concurrent) {
            (true, Some(n)) => f64::from(n),
            (_, Some(n)) => INITIAL_WINDOW.min(f64::from(n)),
            (_, None) => INITIAL_WINDOW,
        };
        let requests = limits.requests_per_minute.map(|rpm| Bucket::new(rpm / 60.0, (rpm / 60.0).max(1.0), true));
        let tokens = limits.tokens_per_minute.map(|tpm| Bucket::new(tpm / 60.0, tpm / 60.0, true));
        Flow {
            key: key.to_string(),
            backend: backend.to_string(),
            state: Mutex::new(State {
                limits,
                in_flight: 0,
                window,
                slow_start: true,
                requests,
                tokens,
                refilled: Instant::now(),
                gate: None,
                admitted: 0,
                cut_at: 0,
                recent: Default::default(),
                output_estimate: 64.0,
                waiting_for: None,
                shared: None,
                shared_failing: false,
            }),
            door: tokio::sync::Mutex::new(()),
            freed: tokio::sync::Notify::new(),
            queued: AtomicU64::new(0),
            throttled: AtomicU64::new(0),
            wait_nanos: AtomicU64::new(0),
            metrics: crate::metrics::metrics().flow(backend),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Apply `limits` (a config read again): configured rates replace the buckets' rates.
    fn configure(&self, limits: &FlowLimits) {
        let mut s = self.state();
        if s.limits == *limits {
            return;
        }
        if let Some(rpm) = limits.requests_per_minute {
            s.requests = Some(Bucket::new(rpm / 60.0, (rpm / 60.0).max(1.0), true));
        }
        if let Some(tpm) = limits.tokens_per_minute {
            s.tokens = Some(Bucket::new(tpm / 60.0, tpm / 60.0, true));
        }
        if limits.fixed {
            s.window = f64::from(limits.max_concurrent.unwrap_or(1).max(1));
        } else if let Some(n) = limits.max_concurrent {
            s.window = s.window.min(f64::from(n));
        }
        s.limits = limits.clone();
    }

    /// Share this flow's buckets and gate with the workers of a cluster.
    pub fn share(&self, shared: Arc<dyn SharedBudget>) {
        self.state().shared = Some(shared);
    }

    /// The flow's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The wait bound in force.
    pub fn max_wait(&self) -> Duration {
        self.state().limits.max_wait()
    }

    /// How the flow stands.
    pub fn stats(&self) -> FlowStats {
        let s = self.state();
        FlowStats {
            backend: self.backend.clone(),
            queued: self.queued.load(Ordering::Relaxed),
            in_flight: u64::from(s.in_flight),
            limit: s.window.floor() as u64,
            requests_per_second: s.requests.as_ref().map(|b| b.rate),
            tokens_per_second: s.tokens.as_ref().map(|b| b.rate),
            waiting_for: if self.queued.load(Ordering::Relaxed) > 0 { s.waiting_for } else { None },
            admitted: s.admitted,
            throttled: self.throttled.load(Ordering::Relaxed),
            wait_seconds: self.wait_nanos.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }

    /// Wait for a turn to send one request of about `input_tokens` prompt tokens; the
    /// returned permit carries how long it waited. A call that has to wait gets a
    /// `flow.wait` span (under the caller's current span) for as long as it does.
    pub async fn admit(self: &Arc<Self>, input_tokens: u64) -> Permit {
        self.queued.fetch_add(1, Ordering::Relaxed);
        let queued = Queued(&self.queued);
        let started = Instant::now();
        // The shared budget failed during this admission: the local buckets pace it.
        let mut local = false;
        // Opened only once the call has to wait (behind other calls, or for a budget).
        let mut wait_span: Option<(tracing::Span, Option<WaitReason>)> = None;
        let _door = match self.door.try_lock() {
            Ok(door) => door,
            Err(_) => {
                let why = self.state().waiting_for;
                let span = crate::trace::flow_wait(&self.backend);
                let door = tracing::Instrument::instrument(self.door.lock(), span.clone()).await;
                wait_span = Some((span, why));
                door
            }
        };
        // What the call is charged of a token budget: its prompt and the average reply.
        let mut charge = None;
        // Armed before a wait (then the state is looked at again), so no release is missed.
        let mut freed: Option<std::pin::Pin<Box<tokio::sync::futures::Notified<'_>>>> = None;
        loop {
            let (wait, shared, admitted) = {
                let mut guard = self.state();
                let s = &mut *guard;
                let charge = *charge.get_or_insert(input_tokens as f64 + s.output_estimate);
                let now = Instant::now();
                let elapsed = now.duration_since(s.refilled).as_secs_f64();
                s.refilled = now;
                for bucket in [&mut s.requests, &mut s.tokens].into_iter().flatten() {
                    bucket.refill(elapsed);
                }
                let shared = s.shared.clone().filter(|_| !local && (s.requests.is_some() || s.tokens.is_some()));
                let wait = if let Some(gate) = s.gate.filter(|g| *g > now) {
                    Some((WaitReason::Server, Some(gate - now)))
                } else if f64::from(s.in_flight) + 1.0 > s.window.floor().max(1.0) {
                    Some((WaitReason::Concurrency, None))
                } else if shared.is_some() {
                    None
                } else if let Some(d) = s.requests.as_ref().and_then(|b| b.wait_for(1.0)) {
                    Some((WaitReason::RequestRate, Some(d)))
                } else {
                    s.tokens.as_ref().and_then(|b| b.wait_for(charge)).map(|d| (WaitReason::TokenRate, Some(d)))
                };
                // The common case, admitted at once under this same lock.
                let admitted = (wait.is_none() && shared.is_none()).then(|| admit_locked(s, charge));
                s.waiting_for = wait.map(|(why, _)| why);
                if let Some((why, _)) = wait.filter(|_| freed.is_some()) {
                    match &mut wait_span {
                        Some((_, reason)) => *reason = Some(why),
                        None => wait_span = Some((crate::trace::flow_wait(&self.backend), Some(why))),
                    }
                }
                let rates = SharedRates {
                    requests: s.requests.as_ref().map(|b| b.rate),
                    request_burst: s.requests.as_ref().map_or(1.0, |b| b.burst),
                    tokens: s.tokens.as_ref().map(|b| b.rate),
                    token_burst: s.tokens.as_ref().map_or(1.0, |b| b.burst),
                    requests_left: s.requests.as_ref().map_or(1.0, |b| b.level),
                    tokens_left: s.tokens.as_ref().map_or(1.0, |b| b.level),
                };
                (wait, shared.map(|sh| (sh, rates)), admitted)
            };
            let charge = charge.unwrap_or(0.0);
            if let Some(seq) = admitted {
                return self.admitted(seq, charge, started, wait_span, queued);
            }
            match wait {
                Some(_) if freed.is_none() => {
                    let mut armed = Box::pin(self.freed.notified());
                    armed.as_mut().enable();
                    freed = Some(armed);
                }
                // A reply in the meantime may change the answer (a token budget trued up, a
                // rate learned): look again then.
                Some((_, Some(d))) => {
                    if let Some(mut armed) = freed.take() {
                        tokio::select! {
                            _ = tokio::time::sleep(d) => {}
                            _ = &mut armed => {}
                        }
                    }
                }
                Some((_, None)) => {
                    if let Some(armed) = freed.take() {
                        armed.await;
                    }
                }
                None => {
                    if let Some((shared, rates)) = shared {
                        match shared.take(&self.key, rates, charge).await {
                            Ok(None) => self.state().shared_failing = false,
                            Ok(Some(d)) => {
                                {
                                    let mut s = self.state();
                                    s.waiting_for = Some(WaitReason::Cluster);
                                    s.shared_failing = false;
                                }
                                match &mut wait_span {
                                    Some((_, reason)) => *reason = Some(WaitReason::Cluster),
                                    None => {
                                        wait_span =
                                            Some((crate::trace::flow_wait(&self.backend), Some(WaitReason::Cluster)))
                                    }
                                }
                                tokio::time::sleep(d.min(Duration::from_secs(5))).await;
                                continue;
                            }
                            Err(e) => {
                                // The database is unreachable: the local buckets stand in.
                                if !std::mem::replace(&mut self.state().shared_failing, true) {
                                    tracing::warn!(flow = %self.key, error = %e, "shared flow budget unavailable; pacing on this worker's own buckets");
                                }
                                local = true;
                                continue;
                            }
                        }
                    }
                    let seq = admit_locked(&mut self.state(), charge);
                    return self.admitted(seq, charge, started, wait_span, queued);
                }
            }
        }
    }

    /// The permit of call number `seq`, admitted after waiting since `started`.
    fn admitted(
        self: &Arc<Self>,
        seq: u64,
        charge: f64,
        started: Instant,
        wait_span: Option<(tracing::Span, Option<WaitReason>)>,
        queued: Queued<'_>,
    ) -> Permit {
        let waited = started.elapsed();
        self.wait_nanos.fetch_add(u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
        self.metrics.waited(waited);
        if let Some((span, reason)) = wait_span {
            crate::trace::flow_waited(&span, reason.map_or("queue", WaitReason::as_str), waited);
        }
        drop(queued);
        Permit { flow: self.clone(), seq, charged: charge, waited, released: false }
    }

    fn release(&self) {
        let mut s = self.state();
        s.in_flight = s.in_flight.saturating_sub(1);
        drop(s);
        self.freed.notify_one();
    }
}

/// Take one request and `charge` tokens from the buckets and a place in flight; the call's
/// admission number.
fn admit_locked(s: &mut State, charge: f64) -> u64 {
    if let Some(b) = s.requests.as_mut() {
        b.level -= 1.0;
    }
    if let Some(b) = s.tokens.as_mut() {
        b.level -= charge;
    }
    s.in_flight += 1;
    s.admitted += 1;
    s.waiting_for = None;
    s.admitted
}

/// Counts a call as queued until dropped.
struct Queued<'a>(&'a AtomicU64);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One admitted call. Tell it how the call went ([`Permit::answered`], [`Permit::pushed_back`],
/// [`Permit::failed`]); dropped without a word, it just frees its place.
#[derive(Debug)]
pub struct Permit {
    flow: Arc<Flow>,
    seq: u64,
    charged: f64,
    /// How long the call waited for this admission.
    pub waited: Duration,
    released: bool,
}

impl Permit {
    /// The server answered (any status but a pushback): learn from its headers, grow the
    /// concurrency limit. Returns the tokens charged at admission (for [`Flow::used_tokens`]).
    pub fn answered(mut self, headers: &HeaderMap) -> f64 {
        let learned = Learned::of(headers, SystemTime::now());
        let flow = self.flow.clone();
        let mut s = flow.state();
        let now = Instant::now();
        if !s.limits.fixed {
            let after = s.admitted.saturating_sub(self.seq) as f64;
            learn(&mut s, &learned, after, after * self.charged);
            if s.slow_start {
                s.window += 1.0;
            } else {
                s.window += 1.0 / s.window.max(1.0);
            }
            let cap = s.limits.max_concurrent.map_or(MAX_WINDOW, f64::from).min(MAX_WINDOW);
            s.window = s.window.min(cap);
            s.recent.push_back(now);
            while s.recent.len() > 256
                || s.recent.front().is_some_and(|t| now.duration_since(*t) > Duration::from_secs(2))
            {
                s.recent.pop_front();
            }
            // A rate found by probing (no headers, no config) creeps up while answered.
            if let Some(b) = s.requests.as_mut().filter(|b| !b.configured) {
                if learned.requests.is_none() {
                    b.rate += 0.5 / b.rate.max(1.0);
                }
            }
        }
        // What the server says remains bounds the shared buckets too (in the background).
        let remaining = (learned.requests.map(|w| w.remaining), learned.tokens.map(|w| w.remaining));
        let shared = s.shared.clone().filter(|_| !s.limits.fixed && (remaining.0.is_some() || remaining.1.is_some()));
        s.in_flight = s.in_flight.saturating_sub(1);
        drop(s);
        self.released = true;
        flow.freed.notify_one();
        if let (Some(shared), Ok(runtime)) = (shared, tokio::runtime::Handle::try_current()) {
            let key = flow.key.clone();
            runtime.spawn(async move {
                if let Err(e) = shared.remaining(&key, remaining.0, remaining.1).await {
                    tracing::debug!(flow = %key, error = %e, "bounding the shared flow budget by what the server says remains");
                }
            });
        }
        self.charged
    }

    /// The server pushed back with `status` (429, 529, or 503) and said to wait `after` (else
    /// a backoff): close the flow until then; once per round of calls, cut the concurrency
    /// limit when the server is overloaded (529, 503) or no rate is known (a 429 past a known
    /// rate is the buckets' business: halving the limit would starve a slow provider), and
    /// slow the request rate when none was configured or learned from headers.
    pub fn pushed_back(mut self, status: u16, headers: &HeaderMap, after: Option<Duration>, backoff: Duration) {
        self.flow.throttled.fetch_add(1, Ordering::Relaxed);
        self.flow.metrics.throttled();
        let learned = Learned::of(headers, SystemTime::now());
        let flow = self.flow.clone();
        let mut s = flow.state();
        let now = Instant::now();
        // The server's wait, else the time until its window resets, else a backoff.
        let reset = learned.requests.filter(|w| w.remaining < 1.0).and_then(|w| w.reset);
        let wait = after.or(reset).unwrap_or(backoff).min(Duration::from_secs(86_400));
        let until = now + wait;
        s.gate = Some(s.gate.map_or(until, |g| g.max(until)));
        if !s.limits.fixed {
            let after = s.admitted.saturating_sub(self.seq) as f64;
            learn(&mut s, &learned, after, after * self.charged);
            if self.seq > s.cut_at {
                s.cut_at = s.admitted;
                s.slow_start = false;
                let overloaded = status != 429;
                if overloaded || s.requests.is_none() {
                    s.window = (s.window / 2.0).max(1.0);
                }
                // Without headers or a configured rate: pace at what the server took lately.
                let took = s.recent.iter().filter(|t| now.duration_since(**t) <= Duration::from_secs(1)).count() as f64;
                match s.requests.as_mut() {
                    Some(b) if !b.configured && learned.requests.is_none() => b.rate = (b.rate * 0.8).max(0.1),
                    None if learned.requests.is_none() => {
                        let rate = (took * 0.9).max(1.0);
                        s.requests = Some(Bucket { level: 0.0, ..Bucket::new(rate, 1.0, false) });
                    }
                    _ => {}
                }
            }
        }
        if let Some(b) = s.requests.as_mut() {
            b.level = b.level.min(0.0);
        }
        let shared = s.shared.clone();
        s.in_flight = s.in_flight.saturating_sub(1);
        drop(s);
        self.released = true;
        flow.freed.notify_one();
        if let Some(shared) = shared {
            let key = flow.key.clone();
            let until = SystemTime::now() + wait;
            tokio::spawn(async move {
                if let Err(e) = shared.close_until(&key, until).await {
                    tracing::warn!(flow = %key, error = %e, "closing the shared flow budget");
                }
            });
        }
    }

    /// The call failed without a pushback (a transport error, a 5xx other than 503).
    pub fn failed(self) {}
}

impl Flow {
    /// A call charged `charged` tokens at admission used `input` + `output`, as its usage
    /// says: the token bucket is corrected, and the estimate of a reply's size moves.
    pub fn used_tokens(&self, charged: f64, input: u64, output: u64) {
        let mut s = self.state();
        s.output_estimate = (s.output_estimate * 0.9 + output.min(1 << 24) as f64 * 0.1).max(1.0);
        let used = input.saturating_add(output) as f64;
        // The shared token bucket is trued up the same way (in the background).
        let shared = s.shared.clone().filter(|_| s.tokens.is_some() && charged != used);
        if let Some(b) = s.tokens.as_mut() {
            b.level = (b.level + charged - used).clamp(-b.burst, b.burst);
            drop(s);
            self.freed.notify_one();
        }
        if let (Some(shared), Ok(runtime)) = (shared, tokio::runtime::Handle::try_current()) {
            let (key, change) = (self.key.clone(), charged - used);
            runtime.spawn(async move {
                if let Err(e) = shared.true_up(&key, change).await {
                    tracing::debug!(flow = %key, error = %e, "truing up the shared flow budget");
                }
            });
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.released {
            self.flow.release();
        }
    }
}

/// Fold what a reply's headers say into the buckets: learned rates where none is
/// configured (the tighter one when one is), and never more in a bucket than remains. The
/// server counted what remained when it took this call, before the `requests` calls (of
/// about `tokens` tokens) admitted since: those are taken off what it says remains, or a
/// first window of calls sent before any header was known would be counted twice over.
fn learn(s: &mut State, learned: &Learned, requests: f64, tokens: f64) {
    let apply = |bucket: &mut Option<Bucket>, window: Option<headers::Window>, since: f64| {
        let Some(w) = window else { return };
        let rate = w.rate();
        let w = headers::Window { remaining: (w.remaining - since).max(-w.limit.max(1.0)), ..w };
        match bucket {
            Some(b) => {
                if let Some(r) = rate {
                    b.rate = if b.configured { b.rate.min(r) } else { r };
                    b.burst = if b.configured { b.burst.min(w.limit.max(1.0)) } else { w.limit.max(1.0) };
                }
                b.level = b.level.min(w.remaining);
            }
            None => {
                if let Some(r) = rate {
                    *bucket = Some(Bucket { level: w.remaining, ..Bucket::new(r, w.limit, false) });
                }
            }
        }
    };
    apply(&mut s.requests, learned.requests, requests);
    apply(&mut s.tokens, learned.tokens, tokens);
}

#[cfg(test)]
mod tests {
    use super::headers::tests::headers;
    use super::*;

    #[tokio::test]
    async fn a_configured_rate_paces_admissions() {
        let flow =
            Arc::new(Flow::new("t", "t", FlowLimits { requests_per_minute: Some(1200.0), ..FlowLimits::default() }));
        let start = Instant::now();
        for _ in 0..30 {
            flow.admit(0).await.answered(&HeaderMap::new());
        }
        // A burst of 20 (one second's worth), then 20 per second: 10 more take half a second.
        // (Only the lower bound is checked: a loaded machine can only make it slower.)
        let took = start.elapsed().as_secs_f64();
        assert!(took >= 0.45, "{took}");
        assert_eq!(flow.stats().admitted, 30);
    }

    #[tokio::test]
    async fn a_pushback_closes_the_flow_for_everyone_and_halves_the_limit() {
        let flow = Arc::new(Flow::new("t", "t", FlowLimits::default()));
        let first = flow.admit(0).await;
        let second = flow.admit(0).await;
        assert_eq!(flow.stats().limit, 16);
        first.pushed_back(
            429,
            &headers(&[("retry-after-ms", "500")]),
            Some(Duration::from_millis(500)),
            Duration::ZERO,
        );
        second.pushed_back(429, &HeaderMap::new(), Some(Duration::from_millis(500)), Duration::ZERO);
        assert_eq!(flow.stats().limit, 8, "one cut per round");
        let start = Instant::now();
        let third = flow.admit(0).await;
        assert!(start.elapsed() >= Duration::from_millis(500));
        assert_eq!(flow.stats().throttled, 2);
        third.answered(&HeaderMap::new());
    }

    /// A shared budget whose database does not answer.
    struct Unreachable(AtomicU64);

    #[derive(Debug, thiserror::Error)]
    #[error("connection refused")]
    struct Refused;

    impl SharedBudget for Unreachable {
        fn take(
            &self,
            _: &str,
            _: SharedRates,
            _: f64,
        ) -> futures::future::BoxFuture<'static, Result<Option<Duration>, SharedBudgetError>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Err(SharedBudgetError(Box::new(Refused))) })
        }

        fn close_until(
            &self,
            _: &str,
            _: SystemTime,
        ) -> futures::future::BoxFuture<'static, Result<(), SharedBudgetError>> {
            Box::pin(async { Err(SharedBudgetError(Box::new(Refused))) })
        }

        fn true_up(&self, _: &str, _: f64) -> futures::future::BoxFuture<'static, Result<(), SharedBudgetError>> {
            Box::pin(async { Err(SharedBudgetError(Box::new(Refused))) })
        }

        fn remaining(
            &self,
            _: &str,
            _: Option<f64>,
            _: Option<f64>,
        ) -> futures::future::BoxFuture<'static, Result<(), SharedBudgetError>> {
            Box::pin(async { Err(SharedBudgetError(Box::new(Refused))) })
        }
    }

    #[tokio::test]
    async fn a_shared_budget_that_fails_leaves_the_pacing_to_the_local_buckets() {
        let flow =
            Arc::new(Flow::new("t", "t", FlowLimits { requests_per_minute: Some(1200.0), ..FlowLimits::default() }));
        let shared = Arc::new(Unreachable(AtomicU64::new(0)));
        flow.share(shared.clone());
        let start = Instant::now();
        for _ in 0..30 {
            flow.admit(0).await.answered(&HeaderMap::new());
        }
        // As without a shared budget: a burst of 20, then 20 per second (lower bound only).
        let took = start.elapsed().as_secs_f64();
        assert!(took >= 0.45, "the local buckets paced the calls: {took}");
        assert_eq!(shared.0.load(Ordering::SeqCst), 30, "asked again for each call");
        assert_eq!(flow.stats().admitted, 30);
    }

    #[tokio::test]
    async fn concurrency_is_fixed_for_a_fixed_flow() {
        let flow = Arc::new(Flow::new("t", "t", FlowLimits::concurrency(2)));
        let a = flow.admit(0).await;
        let _b = flow.admit(0).await;
        let waiting = {
            let flow = flow.clone();
            tokio::spawn(async move { flow.admit(0).await })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!waiting.is_finished());
        assert_eq!(flow.stats().queued, 1);
        assert_eq!(flow.stats().waiting_for, Some(WaitReason::Concurrency));
        drop(a);
        let _c = waiting.await.unwrap();
        assert_eq!(flow.stats().in_flight, 2);
    }

    #[tokio::test]
    async fn headers_teach_the_rate_and_what_remains() {
        let flow = Arc::new(Flow::new("t", "t", FlowLimits::default()));
        let h = headers(&[
            ("x-ratelimit-limit-requests", "20"),
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "2s"),
        ]);
        flow.admit(0).await.answered(&h);
        assert_eq!(flow.stats().requests_per_second, Some(10.0));
        let start = Instant::now();
        flow.admit(0).await.answered(&HeaderMap::new());
        let took = start.elapsed().as_secs_f64();
        assert!(took >= 0.09, "nothing remained: one refill's wait, {took}");
    }

    #[tokio::test]
    async fn what_remains_leaves_out_the_calls_sent_since() {
        // A first window of calls goes before any header is known; the first reply's
        // `remaining` was counted before the others reached the server.
        let flow = Arc::new(Flow::new("t", "t", FlowLimits::default()));
        let mut permits = Vec::new();
        for _ in 0..10 {
            permits.push(flow.admit(0).await);
        }
        let h = headers(&[
            ("x-ratelimit-limit-requests", "20"),
            ("x-ratelimit-remaining-requests", "19"),
            ("x-ratelimit-reset-requests", "100ms"),
        ]);
        permits.remove(0).answered(&h);
        // 19 remained when the first call arrived, and 9 more were sent since: 10 are left,
        // refilled at 10 a second (one used in 100 ms), so of 12 more calls 2 wait 0.2 s.
        drop(permits);
        let start = Instant::now();
        for _ in 0..12 {
            flow.admit(0).await.answered(&HeaderMap::new());
        }
        let took = start.elapsed().as_secs_f64();
        assert!(took >= 0.15, "10 were left and 2 more waited for refills: {took}");
    }
}
