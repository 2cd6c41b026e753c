//! Metrics: the process's counters, gauges and histograms (the `prometheus-client` crate),
//! rendered in the Prometheus text format by [`render`] (what `GET /metrics` serves). Runs
//! ended by status, active runs, agent calls by backend and outcome, the wait for a
//! concurrency slot and the call latency, tokens and credits by backend, store commit
//! latency and journal bytes; and each backend's flow (read through [`set_flow_source`]): calls
//! queued and its concurrency limit (sampled from the flows at each scrape), replies that
//! pushed back, and each call's wait in the flow. Every update is an atomic add; the per-backend handles of an
//! attempt are looked up once ([`Metrics::backend`]), not per call.
//!
//! When the binary exports over OTLP ([`export_to`], before the first use) every update is
//! also recorded on OpenTelemetry instruments of the same names and labels (counters as
//! monotonic sums without Prometheus's `_total` suffix, the histograms with the same bucket
//! bounds, `factory_active_runs` as an observed gauge), which the SDK's periodic reader
//! exports on a thread of its own.

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

/// The OpenTelemetry meter the metrics are also recorded on ([`export_to`]).
static EXPORT: OnceLock<opentelemetry::metrics::Meter> = OnceLock::new();

/// Also record every metric on `meter` (for OTLP export), under the same names. Takes effect
/// only before the first use of [`metrics`]: `false` when it came too late (or twice).
pub fn export_to(meter: opentelemetry::metrics::Meter) -> bool {
    if METRICS.get().is_some() {
        return false;
    }
    EXPORT.set(meter).is_ok()
}

/// The histogram bucket bounds, in seconds (the same for Prometheus and OTLP).
fn second_bounds() -> Vec<f64> {
    exponential_buckets(0.001, 2.0, 18).collect()
}

/// The OpenTelemetry instruments mirroring the Prometheus ones.
struct Otel {
    runs_ended: opentelemetry::metrics::Counter<u64>,
    agent_calls: opentelemetry::metrics::Counter<u64>,
    queue_wait: opentelemetry::metrics::Histogram<f64>,
    call_latency: opentelemetry::metrics::Histogram<f64>,
    tokens: opentelemetry::metrics::Counter<u64>,
    credits: opentelemetry::metrics::Counter<f64>,
    commit_latency: opentelemetry::metrics::Histogram<f64>,
    journal_bytes: opentelemetry::metrics::Counter<u64>,
    throttled: opentelemetry::metrics::Counter<u64>,
    flow_wait: opentelemetry::metrics::Histogram<f64>,
    /// Kept so its callback stays registered.
    _active_runs: opentelemetry::metrics::ObservableGauge<i64>,
    /// Kept so their callbacks stay registered.
    _flow_gauges: [opentelemetry::metrics::ObservableGauge<i64>; 2],
}

impl Otel {
    fn new(meter: &opentelemetry::metrics::Meter, active_runs: Gauge) -> Otel {
        let seconds = |name: &'static str, help: &'static str| {
            meter.f64_histogram(name).with_description(help).with_boundaries(second_bounds()).build()
        };
        Otel {
            runs_ended: meter.u64_counter("factory_run_attempts_ended").with_description(RUNS_ENDED).build(),
            agent_calls: meter.u64_counter("factory_agent_calls").with_description(AGENT_CALLS).build(),
            queue_wait: seconds("factory_agent_queue_wait_seconds", QUEUE_WAIT),
            call_latency: seconds("factory_agent_call_seconds", CALL_SECONDS),
            tokens: meter.u64_counter("factory_agent_tokens").with_description(TOKENS).build(),
            credits: meter.f64_counter("factory_ai_credits").with_description(CREDITS).build(),
            commit_latency: seconds("factory_store_commit_seconds", COMMIT_SECONDS),
            journal_bytes: meter.u64_counter("factory_journal_bytes").with_description(JOURNAL_BYTES).build(),
            throttled: meter.u64_counter("factory_backend_throttled").with_description(THROTTLED).build(),
            flow_wait: seconds("factory_backend_flow_wait_seconds", FLOW_WAIT),
            _active_runs: meter
                .i64_observable_gauge("factory_active_runs")
                .with_description(ACTIVE_RUNS)
                .with_callback(move |observer| observer.observe(active_runs.get(), &[]))
                .build(),
            _flow_gauges: [(QUEUE_DEPTH_NAME, QUEUE_DEPTH), (LIMIT_NAME, LIMIT)].map(|(name, help)| {
                meter
                    .i64_observable_gauge(format!("factory_{name}"))
                    .with_description(help)
                    .with_callback(move |observer| {
                        for (backend, queued, limit) in flow_gauges() {
                            let value = if name == QUEUE_DEPTH_NAME { queued } else { limit };
                            observer.observe(value, &[opentelemetry::KeyValue::new("backend", backend)]);
                        }
                    })
                    .build()
            }),
        }
    }
}

/// One backend's OpenTelemetry instruments and labels.
#[derive(Clone)]
struct BackendOtel {
    calls: opentelemetry::metrics::Counter<u64>,
    /// Labels of each [`CallOutcome`], in its order.
    call_labels: [Vec<opentelemetry::KeyValue>; 4],
    queue_wait: opentelemetry::metrics::Histogram<f64>,
    latency: opentelemetry::metrics::Histogram<f64>,
    backend: Vec<opentelemetry::KeyValue>,
    tokens: opentelemetry::metrics::Counter<u64>,
    input: Vec<opentelemetry::KeyValue>,
    output: Vec<opentelemetry::KeyValue>,
    credits: opentelemetry::metrics::Counter<f64>,
}

const RUNS_ENDED: &str = "Run attempts ended, by the status they ended with";
const ACTIVE_RUNS: &str = "Runs executing now";
const AGENT_CALLS: &str = "Agent calls ended, by backend and outcome (ok, failed, aborted, cached)";
const QUEUE_WAIT: &str = "Time agent calls waited for a concurrency slot (maxConcurrentSubagents)";
const CALL_SECONDS: &str = "Latency of one agent spawn (a backend call)";
const TOKENS: &str = "Tokens agent calls used, by backend and direction (input, output)";
const CREDITS: &str = "AI credits agent calls cost, by backend";
const COMMIT_SECONDS: &str = "Latency of one store commit (a group of journal writes made durable)";
const JOURNAL_BYTES: &str = "Bytes runs journaled (steps, agent outcomes, progress)";
const QUEUE_DEPTH_NAME: &str = "backend_queue_depth";
const QUEUE_DEPTH: &str = "Agent calls waiting in their backend's flow (for its request, token or concurrency budget)";
const LIMIT_NAME: &str = "backend_concurrency_limit";
const LIMIT: &str = "Calls a backend's flow lets run at once now (adaptive, or its max_concurrent)";
const THROTTLED: &str = "Replies of a backend that pushed back (HTTP 429, 529, 503)";
const FLOW_WAIT: &str = "Time each backend call waited in its backend's flow before it was sent";

/// Per backend name: calls queued and the concurrency limit, summed over its flows (one
/// per endpoint and key, and per model with limits of its own), in name order.
/// Where the flow gauges are read from: set by the flows' owner when it makes its first flow
/// ([`set_flow_source`]), so this module names no layer.
static FLOW_SOURCE: std::sync::OnceLock<fn() -> Vec<crate::model::flow::FlowStats>> = std::sync::OnceLock::new();

/// Read the flow gauges from `source` at each scrape (the first source set stays).
pub fn set_flow_source(source: fn() -> Vec<crate::model::flow::FlowStats>) {
    let _ = FLOW_SOURCE.set(source);
}

fn flow_gauges() -> Vec<(String, i64, i64)> {
    let mut by_backend = std::collections::BTreeMap::<String, (u64, u64)>::new();
    let all = FLOW_SOURCE.get().map(|source| source()).unwrap_or_default();
    for stats in all {
        let entry = by_backend.entry(stats.backend).or_default();
        entry.0 = entry.0.saturating_add(stats.queued);
        entry.1 = entry.1.saturating_add(stats.limit);
    }
    let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    by_backend.into_iter().map(|(backend, (queued, limit))| (backend, gauge(queued), gauge(limit))).collect()
}

/// The flow gauges, sampled from the flows at each scrape.
#[derive(Debug)]
struct FlowGauges;

impl prometheus_client::collector::Collector for FlowGauges {
    fn encode(&self, mut encoder: prometheus_client::encoding::DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::gauge::ConstGauge;
        let gauges = flow_gauges();
        for (name, help, pick) in [(QUEUE_DEPTH_NAME, QUEUE_DEPTH, 0), (LIMIT_NAME, LIMIT, 1)] {
            let mut family =
                encoder.encode_descriptor(name, help, None, prometheus_client::metrics::MetricType::Gauge)?;
            for (backend, queued, limit) in &gauges {
                let value = if pick == 0 { *queued } else { *limit };
                let label = BackendLabel { backend: backend.clone() };
                ConstGauge::new(value).encode(family.encode_family(&label)?)?;
            }
        }
        Ok(())
    }
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
    throttled: Family<BackendLabel, Counter>,
    flow_wait: Family<BackendLabel, Histogram>,
    otel: Option<Otel>,
}

/// One backend flow's handles ([`Metrics::flow`]), looked up once per flow.
#[derive(Clone)]
pub struct FlowMetrics {
    throttled: Counter,
    wait: Histogram,
    otel: Option<(
        opentelemetry::metrics::Counter<u64>,
        opentelemetry::metrics::Histogram<f64>,
        [opentelemetry::KeyValue; 1],
    )>,
}

impl std::fmt::Debug for FlowMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FlowMetrics")
    }
}

impl FlowMetrics {
    /// A reply pushed back (429, 529, 503).
    pub fn throttled(&self) {
        self.throttled.inc();
        if let Some((throttled, _, backend)) = &self.otel {
            throttled.add(1, backend);
        }
    }

    /// A call was admitted after waiting `wait` in the flow.
    pub fn waited(&self, wait: std::time::Duration) {
        self.wait.observe(wait.as_secs_f64());
        if let Some((_, histogram, backend)) = &self.otel {
            histogram.record(wait.as_secs_f64(), backend);
        }
    }
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
    otel: Option<BackendOtel>,
}

impl BackendMetrics {
    /// Count a call that ended with `outcome`.
    pub fn call(&self, outcome: CallOutcome) {
        self.calls[outcome as usize].inc();
        if let Some(o) = &self.otel {
            o.calls.add(1, &o.call_labels[outcome as usize]);
        }
    }

    /// A wait for a concurrency slot.
    pub fn queued(&self, wait: std::time::Duration) {
        self.queue_wait.observe(wait.as_secs_f64());
        if let Some(o) = &self.otel {
            o.queue_wait.record(wait.as_secs_f64(), &o.backend);
        }
    }

    /// One spawn's latency, its tokens and credits.
    pub fn spawned(
        &self,
        latency: std::time::Duration,
        input_tokens: u64,
        output_tokens: u64,
        credits_nano: Option<u64>,
    ) {
        self.latency.observe(latency.as_secs_f64());
        self.input_tokens.inc_by(input_tokens);
        self.output_tokens.inc_by(output_tokens);
        let credits = credits_nano.map(|nano| nano as f64 / 1e9);
        if let Some(credits) = credits {
            self.credits.inc_by(credits);
        }
        if let Some(o) = &self.otel {
            o.latency.record(latency.as_secs_f64(), &o.backend);
            o.tokens.add(input_tokens, &o.input);
            o.tokens.add(output_tokens, &o.output);
            if let Some(credits) = credits {
                o.credits.add(credits, &o.backend);
            }
        }
    }
}

static METRICS: OnceLock<Metrics> = OnceLock::new();

/// The process's metrics, registered on first use.
pub fn metrics() -> &'static Metrics {
    METRICS.get_or_init(Metrics::new)
}

impl Metrics {
    fn new() -> Metrics {
        let seconds = || Histogram::new(second_bounds());
        let mut registry = Registry::with_prefix("factory");
        let runs_ended = Family::<StatusLabel, Counter>::default();
        registry.register("run_attempts_ended", RUNS_ENDED, runs_ended.clone());
        let active_runs = Gauge::default();
        registry.register("active_runs", ACTIVE_RUNS, active_runs.clone());
        let agent_calls = Family::<CallLabels, Counter>::default();
        registry.register("agent_calls", AGENT_CALLS, agent_calls.clone());
        let queue_wait = Family::<BackendLabel, Histogram>::new_with_constructor(seconds as fn() -> Histogram);
        registry.register("agent_queue_wait_seconds", QUEUE_WAIT, queue_wait.clone());
        let call_latency = Family::<BackendLabel, Histogram>::new_with_constructor(seconds as fn() -> Histogram);
        registry.register("agent_call_seconds", CALL_SECONDS, call_latency.clone());
        let tokens = Family::<TokenLabels, Counter>::default();
        registry.register("agent_tokens", TOKENS, tokens.clone());
        let credits = Family::<BackendLabel, Counter<f64, AtomicU64>>::default();
        registry.register("ai_credits", CREDITS, credits.clone());
        let commit_latency = seconds();
        registry.register("store_commit_seconds", COMMIT_SECONDS, commit_latency.clone());
        let journal_bytes = Counter::default();
        registry.register("journal_bytes", JOURNAL_BYTES, journal_bytes.clone());
        let throttled = Family::<BackendLabel, Counter>::default();
        registry.register("backend_throttled", THROTTLED, throttled.clone());
        let flow_wait = Family::<BackendLabel, Histogram>::new_with_constructor(seconds as fn() -> Histogram);
        registry.register("backend_flow_wait_seconds", FLOW_WAIT, flow_wait.clone());
        registry.register_collector(Box::new(FlowGauges));
        let otel = EXPORT.get().map(|meter| Otel::new(meter, active_runs.clone()));
        Metrics {
            registry,
            runs_ended,
            active_runs,
            agent_calls,
            queue_wait,
            call_latency,
            tokens,
            credits,
            commit_latency,
            journal_bytes,
            throttled,
            flow_wait,
            otel,
        }
    }

    /// The handles of a flow of `backend`.
    pub fn flow(&self, backend: &str) -> FlowMetrics {
        let label = BackendLabel { backend: backend.into() };
        FlowMetrics {
            throttled: self.throttled.get_or_create(&label).clone(),
            wait: self.flow_wait.get_or_create(&label).clone(),
            otel: self.otel.as_ref().map(|o| {
                (
                    o.throttled.clone(),
                    o.flow_wait.clone(),
                    [opentelemetry::KeyValue::new("backend", backend.to_string())],
                )
            }),
        }
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
            otel: self.otel.as_ref().map(|o| {
                use opentelemetry::KeyValue;
                let backend = || KeyValue::new("backend", backend.to_string());
                let call = |outcome: &'static str| vec![backend(), KeyValue::new("outcome", outcome)];
                let direction = |d: &'static str| vec![backend(), KeyValue::new("direction", d)];
                BackendOtel {
                    calls: o.agent_calls.clone(),
                    call_labels: [call("ok"), call("failed"), call("aborted"), call("cached")],
                    queue_wait: o.queue_wait.clone(),
                    latency: o.call_latency.clone(),
                    backend: vec![backend()],
                    tokens: o.tokens.clone(),
                    input: direction("input"),
                    output: direction("output"),
                    credits: o.credits.clone(),
                }
            }),
        }
    }

    /// An attempt ended with `status`.
    pub fn attempt_ended(&self, status: crate::model::envelope::RunStatus) {
        self.runs_ended.get_or_create(&StatusLabel { status: status.as_str().into() }).inc();
        if let Some(o) = &self.otel {
            o.runs_ended.add(1, &[opentelemetry::KeyValue::new("status", status.as_str())]);
        }
    }

    /// A run started (`true`) or stopped executing in this process.
    pub fn run_active(&self, started: bool) {
        match started {
            true => self.active_runs.inc(),
            false => self.active_runs.dec(),
        };
    }

    /// A store commit took `latency`.
    pub fn committed(&self, latency: std::time::Duration) {
        self.commit_latency.observe(latency.as_secs_f64());
        if let Some(o) = &self.otel {
            o.commit_latency.record(latency.as_secs_f64(), &[]);
        }
    }

    /// A run journaled `bytes` more.
    pub fn journaled(&self, bytes: u64) {
        self.journal_bytes.inc_by(bytes);
        if let Some(o) = &self.otel {
            o.journal_bytes.add(bytes, &[]);
        }
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
