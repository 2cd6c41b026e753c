//! Progress of a run: phases, log lines and agent lifecycle events, each with a sequence
//! number. The run keeps them (for `show`/`progress`) and streams them to subscribers (the
//! CLI's progress bar, event files); a few are told to live subscribers only (replayed
//! calls, the backend's flows).

use serde::{Deserialize, Serialize};

/// One thing that happened in a run. Never carries a prompt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "event", rename_all = "camelCase")]
pub enum ProgressEvent {
    /// The attempt started.
    AttemptStarted { attempt: u32 },
    /// `ctx.phase(title)`.
    Phase { title: String },
    /// `ctx.log(message)`, a `console` line (or a line the guest wrote to stdout/stderr).
    Log {
        message: String,
        /// `info` (left out of the JSON) for `ctx.log` and guest output.
        #[serde(default, skip_serializing_if = "LogLevel::is_info")]
        level: LogLevel,
    },
    /// A subagent waits for a concurrency slot.
    AgentQueued { label: String },
    /// A subagent spawn started.
    AgentStarted { label: String, attempt: u32 },
    /// A subagent call finished; `cached` when the journal or an identical call answered it
    /// without a spawn.
    AgentFinished {
        #[serde(flatten)]
        summary: AgentSummary,
        cached: bool,
    },
    /// How the flows of the run's backend stand (calls queued for its request, token and
    /// concurrency budgets, shared with every other run of the process): told to live
    /// followers while some call waits in one, and once when none waits any more. Never
    /// journaled.
    Flows { flows: Vec<crate::model::flow::FlowStats> },
    /// The attempt ended with this status.
    AttemptEnded {
        status: crate::model::envelope::RunStatus,
        /// Agent calls this attempt answered from the journal or an identical call.
        #[serde(default)]
        replayed: u64,
        /// Subagents this attempt spawned (0 in entries written before it was recorded).
        #[serde(default)]
        spawned: u64,
        /// AI credits this attempt spent, in nano-credits (a lower bound when
        /// `credits_at_least`).
        #[serde(default)]
        credits_nano: u64,
        /// `credits_nano` is a lower bound (some spend had no known cost).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        credits_at_least: bool,
        /// The attempt's active time, in milliseconds.
        #[serde(default)]
        elapsed_ms: u64,
        /// The type of the failure the attempt ended with, when it failed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        failure_type: Option<crate::model::envelope::FailureType>,
    },
}

impl ProgressEvent {
    /// An agent call answered without a spawn.
    pub(crate) fn cached(label: String, ok: bool) -> Self {
        let status = if ok { AgentStatus::Ok } else { AgentStatus::Failed };
        let summary = AgentSummary { label, model: None, status, ..AgentSummary::default() };
        ProgressEvent::AgentFinished { summary, cached: true }
    }
}

/// The level of a log line: `console.debug`/`info`/`warn`/`error` (`console.log` is
/// `info`, as is `ctx.log`); serialized lowercase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    /// `console.debug`.
    Debug,
    /// `ctx.log`, `console.log`, `console.info`.
    #[default]
    Info,
    /// `console.warn`.
    Warn,
    /// `console.error`.
    Error,
}

impl LogLevel {
    /// Its wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        }
    }

    /// True for the default level (left out of the JSON).
    pub fn is_info(&self) -> bool {
        *self == LogLevel::Info
    }
}

/// How a subagent call ended; serialized `ok`, `failed`, `aborted`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AgentStatus {
    /// It produced a reply.
    Ok,
    #[default]
    /// An ordinary failure: no reply, or one that failed its schema twice (`null` to the guest).
    Failed,
    /// The run stopped while it was in flight (a limit, a cancel, a backend outage).
    Aborted,
}

impl AgentStatus {
    /// Its wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            AgentStatus::Ok => "ok",
            AgentStatus::Failed => "failed",
            AgentStatus::Aborted => "aborted",
        }
    }
}

/// A prompt-free summary of one subagent call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentSummary {
    /// The call's label (or `agent`).
    pub label: String,
    /// The requested model, if any.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub model: Option<String>,
    /// How it ended.
    pub status: AgentStatus,
    /// Spawns it took (2 with a schema retry; 0 when replayed).
    pub spawns: u32,
    /// Credits in nano-credits (a lower bound when `credits_at_least`).
    pub credits_nano: u64,
    /// `creditsNano` is a lower bound (see [`crate::model::envelope::Accounting::ai_credits_at_least`]);
    /// absent when exact.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub credits_at_least: bool,
    /// Uncached prompt tokens its spawns reported.
    #[serde(default)]
    pub input_tokens: u64,
    /// Completion tokens its spawns reported.
    #[serde(default)]
    pub output_tokens: u64,
    /// Prompt tokens read from the provider's cache (absent: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_read_tokens: u64,
    /// Prompt tokens written to the provider's cache (absent: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_write_tokens: u64,
    /// Wall time of the call, queue wait included.
    pub millis: u64,
    /// The soft limit that ended the call (`maxTurns`, `maxDurationSeconds`); absent when
    /// none did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_by: Option<crate::model::limits::SoftLimit>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl AgentSummary {
    /// True when the call produced a reply.
    pub fn ok(&self) -> bool {
        self.status == AgentStatus::Ok
    }
}

/// An invalidation signal: the run changed; re-read it if `revision` is newer than yours.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunUpdated {
    /// The run.
    pub run_id: String,
    /// Its new revision.
    pub revision: u64,
}

/// An attempt of a run started (`run_started` on the event streams).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunStarted {
    /// The run.
    pub run_id: String,
    /// The attempt's number (1 for the run's first).
    pub attempt: u32,
    /// The factory's meta name.
    pub factory_name: String,
}

/// An attempt of a run settled (`run_settled` on the event streams), with what it consumed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunSettled {
    /// The run.
    pub run_id: String,
    /// How the attempt ended.
    pub status: crate::model::envelope::RunStatus,
    /// AI credits the attempt spent (one credit is US$0.01).
    pub consumed_credits: f64,
    /// The same in nano-credits, exactly.
    pub consumed_credits_nano: u64,
    /// The credits are a lower bound (some spend had no known cost).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub consumed_credits_at_least: bool,
    /// Subagents the attempt spawned.
    pub consumed_subagents: u64,
    /// The attempt's active time, in milliseconds.
    pub elapsed_ms: u64,
    /// The type of the failure the attempt ended with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_type: Option<crate::model::envelope::FailureType>,
}

impl RunSettled {
    /// What an `attemptEnded` entry of run `run_id` tells (`None` for another entry).
    pub fn of(run_id: &str, event: &ProgressEvent) -> Option<RunSettled> {
        let ProgressEvent::AttemptEnded {
            status,
            spawned,
            credits_nano,
            credits_at_least,
            elapsed_ms,
            failure_type,
            ..
        } = event
        else {
            return None;
        };
        Some(RunSettled {
            run_id: run_id.to_string(),
            status: *status,
            consumed_credits: *credits_nano as f64 / 1e9,
            consumed_credits_nano: *credits_nano,
            consumed_credits_at_least: *credits_at_least,
            consumed_subagents: *spawned,
            elapsed_ms: *elapsed_ms,
            failure_type: *failure_type,
        })
    }
}

/// A progress event with its place in the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProgressEntry {
    /// 1-based, increasing across attempts.
    pub seq: u64,
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The phase current when it happened.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub phase: Option<String>,
    /// What happened.
    #[serde(flatten)]
    pub event: ProgressEvent,
}

/// A progress entry as the journal stores it: the phase is a reference (the seq of the
/// `Phase` entry that set it), not a copy of its title, so a long title followed by many
/// entries is stored once. Entries written before this form carry `phase` as text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JournaledProgress {
    /// 1-based, increasing across attempts.
    pub seq: u64,
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The seq of the `Phase` entry current when it happened.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub phase_seq: Option<u64>,
    /// The phase as text (entries stored before `phaseSeq`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub phase: Option<String>,
    /// What happened.
    #[serde(flatten)]
    pub event: ProgressEvent,
}
