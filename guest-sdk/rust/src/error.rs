//! Errors a factory sees: [`Abort`] (the run must stop) and [`Error`] (anything that ends
//! a call, a thunk or the run).

use crate::__bindings::agent::factory::types as wit;
use core::fmt;

/// Which limit stopped the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    /// `maxTotalSubagents`.
    MaxTotalSubagents,
    /// `timeoutSeconds`.
    TimeoutSeconds,
    /// `maxAiCredits`.
    MaxAiCredits,
}

/// The run itself must stop: propagate it with `?`. The host records the real cause and
/// ends the attempt whatever the factory does next, so there is nothing to gain by
/// swallowing it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Abort {
    /// The run was cancelled.
    Cancelled,
    /// A resource limit was reached.
    LimitReached(LimitKind),
    /// The durable store failed.
    Storage(String),
    /// The call was malformed (a bug in the factory), e.g. an invalid schema.
    InvalidCall(String),
    /// A host sandbox limit was exceeded.
    SandboxLimit(String),
    /// The agent backend could not be used (an outage, not an answer).
    Backend(String),
    /// The host is shutting down (the run ends `halted`, resumable).
    Halted,
    /// The run is pausing (it ends `paused`, resumable): a caller paused it (`None`), or
    /// [`Ctx::pause`](crate::Ctx::pause) reached its checkpoint for the first time (its key).
    Paused(Option<String>),
}

impl From<wit::Abort> for Abort {
    fn from(a: wit::Abort) -> Self {
        match a {
            wit::Abort::Cancelled => Abort::Cancelled,
            wit::Abort::LimitReached(k) => Abort::LimitReached(match k {
                wit::LimitKind::MaxTotalSubagents => LimitKind::MaxTotalSubagents,
                wit::LimitKind::TimeoutSeconds => LimitKind::TimeoutSeconds,
                wit::LimitKind::MaxAiCredits => LimitKind::MaxAiCredits,
            }),
            wit::Abort::Storage(m) => Abort::Storage(m),
            wit::Abort::InvalidCall(m) => Abort::InvalidCall(m),
            wit::Abort::SandboxLimit(m) => Abort::SandboxLimit(m),
            wit::Abort::Backend(m) => Abort::Backend(m),
            wit::Abort::Halted => Abort::Halted,
            wit::Abort::Paused(key) => Abort::Paused(key),
        }
    }
}

impl fmt::Display for Abort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Abort::Cancelled => write!(f, "run aborted: cancelled"),
            Abort::LimitReached(k) => write!(f, "run aborted: limit reached ({k:?})"),
            Abort::Storage(m) => write!(f, "run aborted: storage failure: {m}"),
            Abort::InvalidCall(m) => write!(f, "run aborted: invalid call: {m}"),
            Abort::SandboxLimit(m) => write!(f, "run aborted: sandbox limit: {m}"),
            Abort::Backend(m) => write!(f, "run aborted: backend outage: {m}"),
            Abort::Halted => write!(f, "run aborted: the host is shutting down"),
            Abort::Paused(None) => write!(f, "run paused"),
            Abort::Paused(Some(key)) => write!(f, "run paused at checkpoint `{key}`"),
        }
    }
}

impl std::error::Error for Abort {}

/// An error inside a factory. In [`Ctx::parallel`](crate::Ctx::parallel) and
/// [`Ctx::pipeline`](crate::Ctx::pipeline) an [`Error::Abort`] fails the whole call while
/// any other error turns that one item into `None`.
#[derive(Debug)]
pub enum Error {
    /// The run must stop.
    Abort(Abort),
    /// The arguments do not have the expected shape.
    InvalidArgs(String),
    /// More than [`MAX_ITEMS`](crate::MAX_ITEMS) items were given to `parallel`/`pipeline`.
    TooManyItems(usize),
    /// A journaled step value could not be (de)serialized.
    Step { key: String, message: String },
    /// Any other failure, with a message.
    Failed(String),
}

impl Error {
    /// An ordinary failure with a message.
    pub fn msg(message: impl fmt::Display) -> Self {
        Error::Failed(message.to_string())
    }

    /// True for [`Error::Abort`].
    pub fn is_abort(&self) -> bool {
        matches!(self, Error::Abort(_))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Abort(a) => a.fmt(f),
            Error::InvalidArgs(m) => write!(f, "invalid args: {m}"),
            Error::TooManyItems(n) => {
                write!(f, "too many items: {n} (at most {} per call)", crate::MAX_ITEMS)
            }
            Error::Step { key, message } => write!(f, "step `{key}`: {message}"),
            Error::Failed(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for Error {}

impl From<Abort> for Error {
    fn from(a: Abort) -> Self {
        Error::Abort(a)
    }
}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::Failed(format!("JSON: {e}"))
    }
}

impl From<String> for Error {
    fn from(m: String) -> Self {
        Error::Failed(m)
    }
}

impl From<&str> for Error {
    fn from(m: &str) -> Self {
        Error::Failed(m.to_string())
    }
}
