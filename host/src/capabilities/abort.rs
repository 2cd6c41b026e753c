//! Why a hook refuses a guest's call: [`Abort`] (the WIT `abort`, with the host's real
//! cause), the factory [`LimitKind`]s, and [`StepError`] (the WIT `step-error`). Shared by
//! the run engine, which decides them, and the hooks, which hand them to the guest.

use crate::backend::OutageKind;
use crate::model::sandbox_limits::SandboxLimitKind;

/// Why a hook tells the guest to stop (mirrors the WIT `abort`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Abort {
    Cancelled,
    /// The host is shutting down; the run ends `halted`.
    Halted,
    Limit(LimitKind),
    /// The journal failed (its cause kept).
    Storage(crate::store::journal::JournalError),
    InvalidCall(String),
    /// A host sandbox limit, by name (`maxStepBytes`, ...), with a message.
    SandboxLimit {
        kind: SandboxLimitKind,
        message: String,
    },
    /// The backend could not be used (unreachable, auth, unknown model, ...).
    /// `resume_at`: when a spent quota resets ([`OutageKind::Quota`]), if the provider said.
    Backend {
        kind: OutageKind,
        message: String,
        resume_at: Option<std::time::SystemTime>,
    },
    /// A budgeted run would spawn on a model whose cost is unknown (`maxAiCredits`).
    Unpriced(String),
    /// The run is pausing; it ends `paused` (resumable).
    Paused(Pause),
}

/// Why a run pauses ([`Abort::Paused`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Pause {
    /// A caller paused it.
    Caller,
    /// The body reached checkpoint `ctx.pause(key)` for the first time.
    Checkpoint(String),
}

impl Pause {
    /// Its `failure.kind`: `caller` or `checkpoint`.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Pause::Caller => "caller",
            Pause::Checkpoint(_) => "checkpoint",
        }
    }
}

/// A factory limit that can stop a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LimitKind {
    MaxTotalSubagents,
    TimeoutSeconds,
    MaxAiCredits,
}

impl LimitKind {
    /// The spec's spelling, used as `failure.kind`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            LimitKind::MaxTotalSubagents => "maxTotalSubagents",
            LimitKind::TimeoutSeconds => "timeoutSeconds",
            LimitKind::MaxAiCredits => "maxAiCredits",
        }
    }
}

/// Why `step-put` refused a value (mirrors the WIT `step-error`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum StepError {
    InvalidJson(String),
    Abort(Abort),
}
