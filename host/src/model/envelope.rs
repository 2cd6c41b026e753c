//! The run envelope: what a caller gets back for every outcome of a run (`completed`,
//! `error`, `halted`, `paused`, `cancelled`), with typed failures and accounting, and the
//! [`RunSummary`] a listing shows of it. Every message an envelope carries is bounded:
//! a failure's message and the run's error are cut at [`MAX_MESSAGE_BYTES`] (a summary's at
//! [`SUMMARY_MESSAGE_BYTES`]) on a UTF-8 boundary, ending with [`TRUNCATED_MARKER`].

use serde::{Deserialize, Serialize};

/// Where a run is in its lifecycle. Only `Completed` is final; the others ending an
/// attempt are resumable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    /// Created, not started.
    Pending,
    /// An attempt is executing.
    Running,
    /// Finished with a verdict of its own; final.
    Completed,
    /// The attempt failed (limit, trap, guest error).
    Error,
    /// The attempt stopped without a verdict (host shut down or crashed, or the backend's
    /// quota is spent: parked until `resumeAt`).
    Halted,
    /// Cancelled by a caller.
    Cancelled,
    /// Paused by a caller, or waiting at a checkpoint (`ctx.pause(key)`, named by
    /// [`RunEnvelope::checkpoint`]): a settled attempt, resumed by a caller (never by
    /// automatic recovery), its journaled work kept.
    Paused,
}

impl RunStatus {
    /// True for statuses an attempt ends in.
    pub fn is_terminal(self) -> bool {
        !matches!(self, RunStatus::Pending | RunStatus::Running)
    }

    /// Its wire spelling (`completed`, `halted`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Pending => "pending",
            RunStatus::Running => "running",
            RunStatus::Completed => "completed",
            RunStatus::Error => "error",
            RunStatus::Halted => "halted",
            RunStatus::Cancelled => "cancelled",
            RunStatus::Paused => "paused",
        }
    }
}

/// Which family a [`Failure`] is of; serialized as its `type` string (`sandbox_limit`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FailureType {
    /// A factory limit stopped the attempt (kind: `maxTotalSubagents`, `timeoutSeconds`,
    /// `maxAiCredits`).
    FactoryLimitReached,
    /// A host sandbox limit stopped it (kind: the limit's name: `fuel`, `memory`, `stack`,
    /// `maxJsonDepth`, `maxPendingAgentBytes`, ...).
    SandboxLimit,
    /// The sandbox for the attempt could not be set up (e.g. a grant cannot be mounted).
    Sandbox,
    /// The guest trapped (kind: `unreachable` for a panic, ...).
    Trap,
    /// The guest's `run` returned an error (a thrown JS error, a Rust `Err`).
    GuestError,
    /// The guest's result is not JSON.
    InvalidResult,
    /// The guest called a hook with something it cannot take (an invalid schema, ...).
    InvalidCall,
    /// The journal or store failed (kind `unreadable_record`: a record that cannot be read).
    Storage,
    /// The backend could not be used (kind: `unavailable`, `timeout`, `auth`,
    /// `model_not_found`, `rate_limited`, `server_error`, `invalid_reply`, `not_installed`,
    /// `misconfigured`, `replay_miss`, `quota`: the provider's quota is spent and the run is
    /// parked `halted` until [`RunEnvelope::resume_at`]).
    Backend,
    /// A host bug (a panic the host caught).
    Internal,
    /// Cancelled by a caller (kind `declined`: declined at the consent prompt).
    Cancelled,
    /// The host stopped during the attempt.
    Halted,
    /// The attempt was paused (kind `caller`: a caller's pause; `checkpoint`: the body
    /// reached a checkpoint, named by [`RunEnvelope::checkpoint`]).
    Paused,
}

impl FailureType {
    /// Its wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureType::FactoryLimitReached => "factory_limit_reached",
            FailureType::SandboxLimit => "sandbox_limit",
            FailureType::Sandbox => "sandbox",
            FailureType::Trap => "trap",
            FailureType::GuestError => "guest_error",
            FailureType::InvalidResult => "invalid_result",
            FailureType::InvalidCall => "invalid_call",
            FailureType::Storage => "storage",
            FailureType::Backend => "backend",
            FailureType::Internal => "internal",
            FailureType::Cancelled => "cancelled",
            FailureType::Halted => "halted",
            FailureType::Paused => "paused",
        }
    }
}

impl std::fmt::Display for FailureType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A typed failure: `type` says which family, `kind` which member.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Failure {
    /// The family.
    #[serde(rename = "type")]
    pub kind_type: FailureType,
    /// For limits: `maxTotalSubagents`, `timeoutSeconds`, `maxAiCredits`, or the sandbox
    /// limit's name.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub kind: Option<String>,
    /// Human-readable detail.
    pub message: String,
}

/// The most bytes of a failure's message or a run's error the host keeps (64 KiB): a guest
/// that throws a longer error has it cut here, before it is stored or sent.
pub const MAX_MESSAGE_BYTES: usize = 64 << 10;

/// The most bytes of a failure's message or error a [`RunSummary`] carries (1 KiB).
pub const SUMMARY_MESSAGE_BYTES: usize = 1 << 10;

/// What ends a message cut to its bound.
pub const TRUNCATED_MARKER: &str = " [truncated]";

/// `text` at most `max` bytes long: a longer one is cut on a UTF-8 boundary and ends with
/// [`TRUNCATED_MARKER`] (the marker counted in `max`).
pub fn bounded_text(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut cut = max.saturating_sub(TRUNCATED_MARKER.len());
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    text.push_str(TRUNCATED_MARKER);
    text
}

/// The `kind` of a `backend` failure that is a spent quota: the run is parked until the
/// quota resets (the backend's `OutageKind::Quota`).
pub const QUOTA_KIND: &str = "quota";

/// The `kind` of the `cancelled` failure of a run declined at its consent question.
pub const DECLINED_KIND: &str = "declined";

impl Failure {
    /// Whether a backend's spent quota stopped the run ([`QUOTA_KIND`]).
    pub fn is_spent_quota(&self) -> bool {
        self.kind_type == FailureType::Backend && self.kind.as_deref() == Some(QUOTA_KIND)
    }

    /// Whether the run was declined at its consent question and never ran ([`DECLINED_KIND`]).
    pub fn is_declined(&self) -> bool {
        self.kind_type == FailureType::Cancelled && self.kind.as_deref() == Some(DECLINED_KIND)
    }

    /// A failure of `kind_type` with an optional `kind`; a message over
    /// [`MAX_MESSAGE_BYTES`] is cut ([`bounded_text`]).
    pub fn new(kind_type: FailureType, kind: Option<&str>, message: impl Into<String>) -> Self {
        Failure { kind_type, kind: kind.map(str::to_string), message: bounded_text(message.into(), MAX_MESSAGE_BYTES) }
    }

    /// This failure with its message cut to `max` bytes.
    fn bounded(mut self, max: usize) -> Self {
        self.message = bounded_text(self.message, max);
        self
    }

    /// A sandbox limit was passed (`kind`: its name).
    pub fn sandbox_limit(kind: crate::model::sandbox_limits::SandboxLimitKind, message: impl Into<String>) -> Self {
        Failure::new(FailureType::SandboxLimit, Some(kind.as_str()), message)
    }

    /// A factory limit (`maxTotalSubagents`, `timeoutSeconds`, `maxAiCredits`) was reached.
    pub fn limit(kind: &str, message: impl Into<String>) -> Self {
        Failure::new(FailureType::FactoryLimitReached, Some(kind), message)
    }
}

/// What a run consumed, over all its attempts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Accounting {
    /// Subagents spawned (each schema retry counts).
    pub agents_spawned: u64,
    /// Agent calls answered from the memo or journal without a spawn.
    pub agent_cache_hits: u64,
    /// Accumulated active seconds.
    pub active_seconds: f64,
    /// AI credits in nano-credits (exact integer arithmetic; one credit is US$0.01, so a
    /// nano-credit is US$10^-11). A lower bound when `ai_credits_at_least` is set.
    pub ai_credits_nano: u64,
    /// True when `ai_credits_nano` is a lower bound ("at least"): some spend has no known
    /// cost — a call whose usage came without a price (an unpriced model, cache tokens
    /// without a cache price, counts the server sent unreadable), a backend (e.g. an agent
    /// CLI) that reported no cost, or a call that failed or was cut off mid-way. Absent in
    /// records written before it: exact.
    #[serde(default)]
    pub ai_credits_at_least: bool,
    /// Uncached prompt tokens reported by backends.
    #[serde(default)]
    pub input_tokens: u64,
    /// Completion tokens reported by backends.
    #[serde(default)]
    pub output_tokens: u64,
    /// Prompt tokens read from providers' prompt caches (not part of `input_tokens`).
    #[serde(default)]
    pub cache_read_tokens: u64,
    /// Prompt tokens written to providers' prompt caches (not part of `input_tokens`).
    #[serde(default)]
    pub cache_write_tokens: u64,
}

impl Accounting {
    /// AI credits as a decimal number.
    pub fn ai_credits(&self) -> f64 {
        self.ai_credits_nano as f64 / 1e9
    }
}

/// The run envelope.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunEnvelope {
    /// Stable across attempts.
    pub run_id: String,
    /// The factory's meta name.
    pub factory: String,
    /// Current status.
    pub status: RunStatus,
    /// The result; only for `completed` (absent when the factory returned none; the JSON
    /// value `null` when it returned `null`). Kept as the guest's JSON text, so that no
    /// result can make the record holding it unreadable ([`crate::model::json`]).
    #[serde(skip_serializing_if = "Option::is_none", default, deserialize_with = "present")]
    #[schemars(with = "Option<serde_json::Value>")]
    pub result: Option<crate::model::json::RawJson>,
    /// A typed failure, for `error` (and `cancelled`: `type = cancelled`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub failure: Option<Failure>,
    /// A plain error message, when the failure is best read as text.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<String>,
    /// Consumption over all attempts.
    pub accounting: Accounting,
    /// Attempts started so far.
    pub attempts: u32,
    /// The backend of the latest attempt (what answered its subagents).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub backend: Option<crate::model::recorded::BackendRef>,
    /// For a run parked because its backend's quota is spent (`halted`, failure `backend` /
    /// `quota`): when the service resumes it by itself (RFC 3339 UTC). Absent otherwise, and
    /// when the provider did not say when the quota resets (then it is resumed by hand).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub resume_at: Option<String>,
    /// For a run `paused` at a checkpoint: the key it waits at (`ctx.pause(key)`). A resume
    /// continues it, its `input` (if any) being what `ctx.pause(key)` returns.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub checkpoint: Option<String>,
    /// The run's owner session, on envelopes read back from a host (listings show it to
    /// an owner who sees every session's runs); absent in stored records.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub session: Option<String>,
    /// RFC 3339 timestamps.
    pub created_at: String,
    pub updated_at: String,
    /// Monotonic; bumped on every durable change.
    pub revision: u64,
}

impl RunEnvelope {
    /// The result parsed into a tree (`None`: no result).
    pub fn result_value(&self) -> Option<serde_json::Value> {
        self.result.as_ref().and_then(|r| r.to_value().ok())
    }

    /// Cut the failure's message and the error to [`MAX_MESSAGE_BYTES`] (a record stored
    /// before the bound may hold longer ones).
    pub fn bound_messages(&mut self) {
        self.failure = self.failure.take().map(|f| f.bounded(MAX_MESSAGE_BYTES));
        self.error = self.error.take().map(|e| bounded_text(e, MAX_MESSAGE_BYTES));
    }

    /// The run as a listing shows it: no result (its size only), messages cut to
    /// [`SUMMARY_MESSAGE_BYTES`].
    pub fn summary(&self) -> RunSummary {
        RunSummary {
            run_id: self.run_id.clone(),
            factory: self.factory.clone(),
            status: self.status,
            result_bytes: self.result.as_ref().map(|r| r.get().len() as u64),
            failure: self.failure.clone().map(|f| f.bounded(SUMMARY_MESSAGE_BYTES)),
            error: self.error.clone().map(|e| bounded_text(e, SUMMARY_MESSAGE_BYTES)),
            accounting: self.accounting,
            attempts: self.attempts,
            backend: self.backend.clone(),
            resume_at: self.resume_at.clone(),
            checkpoint: self.checkpoint.clone(),
            session: self.session.clone(),
            created_at: self.created_at.clone(),
            updated_at: self.updated_at.clone(),
            revision: self.revision,
            seq: None,
        }
    }
}

/// A run as listings carry it (`factory runs`, the service's `runs`, `GET /api/runs`, MCP
/// `runs`): the envelope's fields without the result, whose size `resultBytes` gives (a
/// result is read per run: `factory show ID`, the `envelope` and `detail` requests), and
/// with messages cut to [`SUMMARY_MESSAGE_BYTES`], so a listing's size does not depend on
/// what the runs returned or threw.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunSummary {
    /// Stable across attempts.
    pub run_id: String,
    /// The factory's meta name.
    pub factory: String,
    /// Current status.
    pub status: RunStatus,
    /// Bytes of the result's JSON text, when the run has one.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub result_bytes: Option<u64>,
    /// The typed failure, its message cut to [`SUMMARY_MESSAGE_BYTES`].
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub failure: Option<Failure>,
    /// The plain error message, cut to [`SUMMARY_MESSAGE_BYTES`].
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<String>,
    /// Consumption over all attempts.
    pub accounting: Accounting,
    /// Attempts started so far.
    pub attempts: u32,
    /// The backend of the latest attempt.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub backend: Option<crate::model::recorded::BackendRef>,
    /// When a run parked for its backend's quota resumes by itself ([`RunEnvelope::resume_at`]).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub resume_at: Option<String>,
    /// The checkpoint a paused run waits at ([`RunEnvelope::checkpoint`]).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub checkpoint: Option<String>,
    /// The run's owner session.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub session: Option<String>,
    /// RFC 3339 timestamps.
    pub created_at: String,
    pub updated_at: String,
    /// Monotonic; bumped on every durable change.
    pub revision: u64,
    /// The run's place in creation order (monotonic over the store, never reused): the cursor
    /// of a [`RunsPage`].
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub seq: Option<u64>,
}

/// A page of a listing by creation sequence (`listRuns({ afterSeq, beforeSeq, limit })`): the
/// runs in creation order, at most `limit` of them terminal (those still pending or running
/// come along without counting), and where the page sits among the runs the caller sees.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunsPage {
    /// The runs, oldest first; each has its `seq`.
    pub runs: Vec<RunSummary>,
    /// The `seq` of the page's oldest run (the `beforeSeq` of the page before it).
    pub oldest_seq: Option<u64>,
    /// The `seq` of the page's newest run (the `afterSeq` of the page after it).
    pub newest_seq: Option<u64>,
    /// Runs newer than this page exist.
    pub has_more_newer: bool,
    /// Runs older than this page exist (left out of it).
    pub omitted_older: bool,
}

/// A field that is present is `Some`, even when it is `null` (serde's `Option` would read a
/// `null` as absent).
fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<crate::model::json::RawJson>, D::Error> {
    crate::model::json::RawJson::deserialize(deserializer).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_are_cut_on_a_character_boundary_with_the_marker() {
        assert_eq!(bounded_text("short".into(), 64), "short");
        let exact = "x".repeat(64);
        assert_eq!(bounded_text(exact.clone(), 64), exact, "a message at the bound is kept whole");
        // `é` is two bytes: a cut at the bound's byte would split it.
        let long = "é".repeat(100);
        let cut = bounded_text(long, 64);
        assert!(cut.len() <= 64 && cut.len() >= 64 - 1, "{}", cut.len());
        assert!(cut.ends_with(TRUNCATED_MARKER), "{cut}");
        assert!(cut.trim_end_matches(TRUNCATED_MARKER).chars().all(|c| c == 'é'));
        let failure = Failure::new(FailureType::GuestError, None, "e".repeat(MAX_MESSAGE_BYTES * 3));
        assert!(failure.message.len() <= MAX_MESSAGE_BYTES && failure.message.ends_with(TRUNCATED_MARKER));
    }

    #[test]
    fn a_summary_has_no_result_and_short_messages() {
        let text = r#"{"runId":"r","factory":"f","status":"error","result":{"big": "x"},"accounting":{"agentsSpawned":0,
            "agentCacheHits":0,"activeSeconds":0,"aiCreditsNano":0},"attempts":1,"createdAt":"","updatedAt":"","revision":1}"#;
        let mut envelope: RunEnvelope = serde_json::from_str(text).unwrap();
        // As read from a record stored before messages were bounded.
        envelope.failure =
            Some(Failure { kind_type: FailureType::GuestError, kind: None, message: "m".repeat(1 << 20) });
        envelope.error = Some("m".repeat(1 << 20));
        let summary = serde_json::to_value(envelope.summary()).unwrap();
        assert!(summary.get("result").is_none());
        assert_eq!(summary["resultBytes"], r#"{"big": "x"}"#.len());
        assert_eq!(summary["failure"]["message"].as_str().map(str::len), Some(SUMMARY_MESSAGE_BYTES));
        assert_eq!(summary["error"].as_str().map(str::len), Some(SUMMARY_MESSAGE_BYTES));
        envelope.bound_messages();
        assert_eq!(envelope.failure.map(|f| f.message.len()), Some(MAX_MESSAGE_BYTES));
        assert_eq!(envelope.error.map(|e| e.len()), Some(MAX_MESSAGE_BYTES));
    }

    #[test]
    fn accounting_written_before_cache_tokens_still_reads() {
        let old = r#"{"agentsSpawned":2,"agentCacheHits":1,"activeSeconds":0.5,"aiCreditsNano":7,"inputTokens":3,"outputTokens":4}"#;
        let read: Accounting = serde_json::from_str(old).unwrap();
        assert_eq!((read.ai_credits_nano, read.input_tokens, read.output_tokens), (7, 3, 4));
        assert_eq!((read.cache_read_tokens, read.cache_write_tokens, read.ai_credits_at_least), (0, 0, false));
        let written =
            serde_json::to_value(Accounting { cache_read_tokens: 9, ai_credits_at_least: true, ..read }).unwrap();
        assert_eq!(written["cacheReadTokens"], 9);
        assert_eq!(written["cacheWriteTokens"], 0);
        assert_eq!(written["aiCreditsAtLeast"], true);
    }

    #[test]
    fn failure_types_and_agent_statuses_keep_their_wire_strings() {
        let all = [
            (FailureType::FactoryLimitReached, "factory_limit_reached"),
            (FailureType::SandboxLimit, "sandbox_limit"),
            (FailureType::Sandbox, "sandbox"),
            (FailureType::Trap, "trap"),
            (FailureType::GuestError, "guest_error"),
            (FailureType::InvalidResult, "invalid_result"),
            (FailureType::InvalidCall, "invalid_call"),
            (FailureType::Storage, "storage"),
            (FailureType::Backend, "backend"),
            (FailureType::Internal, "internal"),
            (FailureType::Cancelled, "cancelled"),
            (FailureType::Halted, "halted"),
            (FailureType::Paused, "paused"),
        ];
        for (kind, text) in all {
            assert_eq!(serde_json::to_value(kind).unwrap(), serde_json::json!(text));
            assert_eq!(kind.as_str(), text);
            assert_eq!(serde_json::from_value::<FailureType>(serde_json::json!(text)).unwrap(), kind);
        }
        let failure: Failure = serde_json::from_str(r#"{"type":"sandbox_limit","kind":"fuel","message":"m"}"#).unwrap();
        assert_eq!(failure.kind_type, FailureType::SandboxLimit);
        assert!(serde_json::from_str::<Failure>(r#"{"type":"nope","message":"m"}"#).is_err());
        use crate::model::progress::AgentStatus;
        for (status, text) in
            [(AgentStatus::Ok, "ok"), (AgentStatus::Failed, "failed"), (AgentStatus::Aborted, "aborted")]
        {
            assert_eq!(serde_json::to_value(status).unwrap(), serde_json::json!(text));
            assert_eq!(status.as_str(), text);
        }
        for status in [
            RunStatus::Pending,
            RunStatus::Running,
            RunStatus::Completed,
            RunStatus::Error,
            RunStatus::Halted,
            RunStatus::Cancelled,
            RunStatus::Paused,
        ] {
            assert!(status.is_terminal() || matches!(status, RunStatus::Pending | RunStatus::Running));
            assert_eq!(serde_json::to_value(status).unwrap(), serde_json::json!(status.as_str()));
        }
    }
}
