//! Traces: the spans the host opens for what it does, and the W3C `traceparent` a caller
//! hands in ([`TraceParent`]) for a run's spans to continue the caller's trace. One span per
//! run attempt ([`attempt`]), per phase ([`phase`]), per agent call ([`agent_call`], after
//! the OpenTelemetry GenAI conventions: `gen_ai.operation.name`, `gen_ai.request.model`,
//! `gen_ai.provider.name`, `gen_ai.usage.*`; never the prompt), per wait of a call in its
//! backend's flow ([`flow_wait`], under the agent call's), per step lookup ([`step`])
//! and per store commit ([`store_commit`]), all under the target [`TARGET`]. The host only
//! opens spans; where they go is the binary's choice (OTLP export when configured). When no
//! subscriber wants [`TARGET`], every one of them is [`tracing::Span::none`]: no allocation,
//! no formatting, just the callsite's cached interest.

use tracing::field::Empty;
use tracing::Span;

// Integers are recorded as i64: OTLP's integer attribute (a u64 would be exported as text).

/// The target of every span the host opens (outside `factory*`, so `RUST_LOG=factory=info`
/// logs do not open them).
pub const TARGET: &str = "otel::factory";

/// A W3C trace context `traceparent` header value (`00-<trace id>-<parent id>-<flags>`),
/// checked: the run's spans become children of that parent.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TraceParent(String);

/// Why a `traceparent` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`traceparent` must be a W3C trace context (`00-<32 hex>-<16 hex>-<2 hex>`, ids not all zero), got {shown:?}")]
pub struct TraceParentError {
    /// The value, cut to 80 characters.
    pub shown: String,
}

impl TraceParent {
    /// Check `text` against the W3C format (version `00`, or a later one's first four fields).
    pub fn parse(text: &str) -> Result<TraceParent, TraceParentError> {
        let wrong = || TraceParentError { shown: text.chars().take(80).collect() };
        let text = text.trim();
        let hex =
            |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        let zero = |s: &str| s.bytes().all(|b| b == b'0');
        if text.len() < 55 || (text.len() > 55 && text.as_bytes()[55] != b'-') || text.len() > 512 {
            return Err(wrong());
        }
        let mut parts = text[..55].split('-');
        let (Some(version), Some(trace), Some(parent), Some(flags), None) =
            (parts.next(), parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(wrong());
        };
        let ok = hex(version, 2)
            && version != "ff"
            && (version != "00" || text.len() == 55)
            && hex(trace, 32)
            && !zero(trace)
            && hex(parent, 16)
            && !zero(parent)
            && hex(flags, 2);
        if !ok {
            return Err(wrong());
        }
        Ok(TraceParent(text[..55].to_string()))
    }

    /// The header value.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for TraceParent {
    type Error = TraceParentError;
    fn try_from(text: String) -> Result<Self, Self::Error> {
        TraceParent::parse(&text)
    }
}

impl From<TraceParent> for String {
    fn from(parent: TraceParent) -> String {
        parent.0
    }
}

/// Make `span` a child of the caller's span named by `parent` (nothing when `span` is off).
pub fn continue_trace(span: &Span, parent: &TraceParent) {
    use opentelemetry::propagation::TextMapPropagator;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    if span.is_disabled() {
        return;
    }
    let carrier: std::collections::HashMap<String, String> =
        std::iter::once(("traceparent".to_string(), parent.as_str().to_string())).collect();
    let context = opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&carrier);
    let _ = span.set_parent(context);
}

/// The span of one run attempt; its outcome is recorded by [`attempt_ended`].
pub(crate) fn attempt(factory: &str, run_id: &str, session: &str, attempt: u32) -> Span {
    tracing::info_span!(
        target: TARGET,
        "run",
        otel.name = %format_args!("run {factory}"),
        factory.name = factory,
        factory.run_id = run_id,
        factory.session = session,
        factory.attempt = i64::from(attempt),
        factory.status = Empty,
        "factory.failure.type" = Empty,
        factory.failure.kind = Empty,
        otel.status_code = Empty,
    )
}

/// Record how the attempt of `span` ended.
pub(crate) fn attempt_ended(
    span: &Span,
    status: crate::model::envelope::RunStatus,
    failure: Option<&crate::model::envelope::Failure>,
) {
    if span.is_disabled() {
        return;
    }
    span.record("factory.status", status.as_str());
    if let Some(f) = failure {
        span.record("factory.failure.type", f.kind_type.as_str());
        if let Some(kind) = &f.kind {
            span.record("factory.failure.kind", kind.as_str());
        }
    }
    span.record(
        "otel.status_code",
        if status == crate::model::envelope::RunStatus::Completed { "OK" } else { "ERROR" },
    );
}

/// The span of one phase (`ctx.phase`), under the attempt's.
pub(crate) fn phase(attempt: &Span, title: &str) -> Span {
    tracing::info_span!(target: TARGET, parent: attempt, "phase", otel.name = %format_args!("phase {title}"), factory.phase = title)
}

/// Whether an agent call was answered by a spawn, the journal or an identical call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Memo {
    /// Spawned (a memo miss).
    Miss,
    /// Replayed from the journal.
    Hit,
    /// Shared with an identical call in flight.
    Shared,
}

impl Memo {
    fn as_str(self) -> &'static str {
        match self {
            Memo::Miss => "miss",
            Memo::Hit => "hit",
            Memo::Shared => "shared",
        }
    }
}

/// The span of one agent call (`gen_ai.operation.name = chat`), under the current phase's;
/// `provider` is called only when the span is on.
pub(crate) fn agent_call(
    parent: &Span,
    provider: impl FnOnce() -> String,
    model: Option<&str>,
    label: Option<&str>,
    memo: Memo,
) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        parent: parent,
        "agent",
        otel.name = Empty,
        otel.kind = "client",
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = Empty,
        gen_ai.request.model = Empty,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        factory.agent.label = label.unwrap_or("agent"),
        factory.agent.memo = memo.as_str(),
        factory.agent.status = Empty,
        factory.agent.spawns = Empty,
        factory.agent.ended_by = Empty,
        factory.credits_nano = Empty,
        otel.status_code = Empty,
    );
    if !span.is_disabled() {
        span.record("gen_ai.provider.name", provider().as_str());
        match model {
            Some(model) => {
                span.record("gen_ai.request.model", model);
                span.record("otel.name", format!("chat {model}").as_str());
            }
            None => {
                span.record("otel.name", "chat");
            }
        }
    }
    span
}

/// Record an agent call's usage on its span: uncached input and output tokens, and its cost
/// in nano-credits when the backend knows it.
pub(crate) fn agent_usage(span: &Span, input_tokens: u64, output_tokens: u64, credits_nano: Option<u64>) {
    if span.is_disabled() {
        return;
    }
    span.record("gen_ai.usage.input_tokens", i64::try_from(input_tokens).unwrap_or(i64::MAX));
    span.record("gen_ai.usage.output_tokens", i64::try_from(output_tokens).unwrap_or(i64::MAX));
    if let Some(c) = credits_nano {
        span.record("factory.credits_nano", i64::try_from(c).unwrap_or(i64::MAX));
    }
}

/// Record how an agent call ended on its span.
pub(crate) fn agent_ended(span: &Span, status: &'static str, spawns: u32) {
    if span.is_disabled() {
        return;
    }
    span.record("factory.agent.status", status);
    span.record("factory.agent.spawns", i64::from(spawns));
    span.record("otel.status_code", if status == "ok" { "OK" } else { "ERROR" });
}

/// Record the soft limit that ended an agent call (`maxTurns`, `maxDurationSeconds`), if any.
pub(crate) fn agent_soft_limit(span: &Span, limit: Option<crate::model::limits::SoftLimit>) {
    if let (false, Some(limit)) = (span.is_disabled(), limit) {
        span.record("factory.agent.ended_by", limit.as_str());
    }
}

/// The span of one call's wait in its backend's flow (queued behind other calls, or for
/// the backend's budgets), under the current span (the agent call's); opened only when the
/// call has to wait, and its reason and wait recorded by [`flow_waited`] on admission.
pub(crate) fn flow_wait(backend: &str) -> Span {
    tracing::info_span!(
        target: TARGET,
        "flow.wait",
        factory.backend = backend,
        factory.flow.reason = Empty,
        factory.flow.wait_ms = Empty,
    )
}

/// Record why a call waited in its flow (`concurrency`, `request_rate`, `token_rate`,
/// `server`, `cluster`; `queue` when only behind other calls) and for how long.
pub(crate) fn flow_waited(span: &Span, reason: &str, waited: std::time::Duration) {
    if span.is_disabled() {
        return;
    }
    span.record("factory.flow.reason", reason);
    span.record("factory.flow.wait_ms", i64::try_from(waited.as_millis()).unwrap_or(i64::MAX));
}

/// The span of one step lookup (`ctx.step-get`): the key's hash (`key_hash`, called only when
/// the span is recorded), never the key; whether it was journaled is recorded by the caller
/// as `factory.step.hit`.
pub(crate) fn step(parent: &Span, key_hash: impl FnOnce() -> u64) -> Span {
    tracing::info_span!(
        target: TARGET,
        parent: parent,
        "step",
        factory.step.key_hash = %format_args!("{:016x}", key_hash()),
        factory.step.hit = Empty,
    )
}

/// The span of one store commit (a group of journal writes made durable together).
pub(crate) fn store_commit(ops: usize) -> Span {
    tracing::info_span!(target: TARGET, parent: None, "store.commit", factory.store.ops = i64::try_from(ops).unwrap_or(i64::MAX))
}
