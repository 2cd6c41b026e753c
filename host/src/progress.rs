//! Progress of a run: phases, log lines and agent lifecycle events, each with a sequence
//! number. The run keeps them (for `show`/`progress`) and streams them to subscribers (the
//! CLI's progress bar, event files).

use serde::{Deserialize, Serialize};

/// One thing that happened in a run. Never carries a prompt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "camelCase")]
pub enum ProgressEvent {
    /// The attempt started.
    AttemptStarted { attempt: u32 },
    /// `ctx.phase(title)`.
    Phase { title: String },
    /// `ctx.log(message)` (or a line the guest wrote to stdout/stderr).
    Log { message: String },
    /// A subagent waits for a concurrency slot.
    AgentQueued { label: String },
    /// A subagent spawn started.
    AgentStarted { label: String, attempt: u32 },
    /// A subagent call finished: `ok` false for an ordinary failure, `cached` when it was
    /// answered by the journal or an identical call without a spawn.
    AgentFinished { label: String, ok: bool, cached: bool },
    /// The attempt ended with this status.
    AttemptEnded { status: crate::RunStatus },
}

/// A progress event with its place in the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
