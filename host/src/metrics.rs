//! Metrics: the process's counters, gauges and histograms (the `prometheus-client` crate),
//! rendered in the Prometheus text format by [`render`] (what `GET /metrics` serves). Runs
//! ended by status, active runs, agent calls by backend and outcome, the wait for a
//! concurrency slot and the call latency, tokens and credits by backend, store commit
//! latency and journal bytes. Every update is an atomic add; the per-backend handles of an
//! attempt are looked up once ([`Metrics::backend`]), not per call.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::sync::OnceLock;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    backend: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackendLabel {
    backend: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabels {
    backend: String,
    direction: String,
}

/// The process's metrics ([`metrics`]).
pub struct Metrics {
    registry: Registry,
    runs_ended: Family<StatusLabel, Counter>,
    active_runs: Gauge,
    agent_calls: Family<CallLabels, Counter>,
    queue_wait: Family<BackendLabel, Histogram>,
    call_latency: Family<BackendLabel, Histogram>,
    tokens: Family<TokenLabels, Counter>,
    credits: Family<BackendLabel, Counter<f64, AtomicU64>>,
    commit_latency: Histogram,
    journal_bytes: Counter,
}

/// How an agent call ended, as `factory_agent_calls_total{outcome}` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallOutcome {
    /// A reply.
    Ok,
    /// No usable reply (an error, an empty or mismatched reply).
    Failed,
    /// The attempt stopped during it (a limit, an outage, a cancel).
    Aborted,
    /// Answered from the journal or an identical call, without a spawn.
    Cached,
}

/// One backend's handles, looked up once per attempt.
#[derive(Clone)]
pub struct BackendMetrics {
    calls: [Counter; 4],
    queue_wait: Histogram,
    latency: Histogram,
    input_tokens: Counter,
    output_tokens: Counter,
    credits: Counter<f64, AtomicU64>,
}

impl BackendMetrics {
    /// Count a call that ended with `outcome`.
    pub fn call(&self, outcome: CallOutcome) {
        self.calls[outcome as usize].inc();
    }

    /// A wait for a concurrency slot.
    pub fn queued(&self, wait: std::time::Duration) {
        self.queue_wait.observe(wait.as_secs_f64());
    }

    /// One spawn's latency, its tokens and credits.
    pub fn spawned(&self, latency: std::time::Duration, input_tokens: u64, output_tokens: u64, credits_nano: Option<u64>) {
        self.latency.observe(latency.as_secs_f64());
        self.input_tokens.inc_by(input_tokens);
        self.output_tokens.inc_by(output_tokens);
        if let Some(nano) = credits_nano {
            self.credits.inc_by(nano as f64 / 1e9);
        }
    }
}

/// The process's metrics, registered on first use.
pub fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

impl Metrics {
    fn new() -> Metrics {
        let seconds = || Histogram::new(exponential_buckets(0.001, 2.0, 18));
        let mut registry = Registry::with_prefix("factory");
        let runs_ended = Family::<StatusLabel, Counter>::default();
        registry.register("run_attempts_ended", "Run attempts ended, by the status they ended with", runs_ended.clone());
        let active_runs = Gauge::default();
        registry.register("active_runs", "Runs executing now", active_runs.clone());
        let agent_calls = Family::<CallLabels, Counter>::default();
        registry.register("agent_calls", "Agent calls ended, by backend and outcome (ok, failed, aborted, cached)", agent_calls.clone());
        let queue_wait = Family::<BackendLabel, Histogram>::new_with_constructor(seconds as fn() -> Histogram);
        registry.register("agent_queue_wait_seconds", "Time agent calls waited for a concurrency slot (maxConcurrentSubagents)", queue_wait.clone());
        let call_latency = Family::<BackendLabel, Histogram>::new_with_constructor(seconds as fn() -> Histogram);
        registry.register("agent_call_seconds", "Latency of one agent spawn (a backend call)", call_latency.clone());
        let tokens = Family::<TokenLabels, Counter>::default();
        registry.register("agent_tokens", "Tokens agent calls used, by backend and direction (input, output)", tokens.clone());
        let credits = Family::<BackendLabel, Counter<f64, AtomicU64>>::default();
        registry.register("ai_credits", "AI credits agent calls cost, by backend", credits.clone());
        let commit_latency = seconds();
        registry.register("store_commit_seconds", "Latency of one store commit (a group of journal writes made durable)", commit_latency.clone());
        let journal_bytes = Counter::default();
        registry.register("journal_bytes", "Bytes runs journaled (steps, agent outcomes, progress)", journal_bytes.clone());
        Metrics { registry, runs_ended, active_runs, agent_calls, queue_wait, call_latency, tokens, credits, commit_latency, journal_bytes }
    }

    /// The handles of `backend`'s calls.
    pub fn backend(&self, backend: &str) -> BackendMetrics {
        let call = |outcome: &str| {
            self.agent_calls.get_or_create(&CallLabels { backend: backend.into(), outcome: outcome.into() }).clone()
        };
        let label = BackendLabel { backend: backend.into() };
        let tokens = |direction: &str| {
            self.tokens.get_or_create(&TokenLabels { backend: backend.into(), direction: direction.into() }).clone()
        };
        BackendMetrics {
            // In [`CallOutcome`]'s order.
            calls: [call("ok"), call("failed"), call("aborted"), call("cached")],
            queue_wait: self.queue_wait.get_or_create(&label).clone(),
            latency: self.call_latency.get_or_create(&label).clone(),
            input_tokens: tokens("input"),
            output_tokens: tokens("output"),
            credits: self.credits.get_or_create(&label).clone(),
        }
    }

    /// An attempt ended with `status`.
    pub fn attempt_ended(&self, status: crate::model::envelope::RunStatus) {
        self.runs_ended.get_or_create(&StatusLabel { status: status.as_str().into() }).inc();
    }

    /// A store commit took `latency`.
    pub fn committed(&self, latency: std::time::Duration) {
        self.commit_latency.observe(latency.as_secs_f64());
    }

    /// A run journaled `bytes` more.
    pub fn journaled(&self, bytes: u64) {
        self.journal_bytes.inc_by(bytes);
    }

    /// Everything, in the Prometheus text format, with `active_runs` as the gauge's value.
    pub fn render(&self, active_runs: usize) -> String {
        self.active_runs.set(i64::try_from(active_runs).unwrap_or(i64::MAX));
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}
