//! [`Error`]: everything the host library can refuse, as typed values. A run that started
//! never becomes an `Error`: its outcome is in the envelope.

use crate::component::LoadError;
use crate::limits::LimitError;
use crate::meta::MetaError;

/// A refusal of the host library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The host's sandbox limits cannot be honoured.
    #[error(transparent)]
    SandboxLimits(#[from] crate::sandbox::SandboxLimitsError),
    /// The wasmtime engine or linker could not be set up.
    #[error("engine: {0}")]
    Engine(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
    /// An answer could not be encoded.
    #[error("encoding the answer: {0}")]
    Encode(#[from] serde_json::Error),
    /// The task running an attempt failed (a panic the host caught).
    #[error("the run task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// A request reached a handler that does not answer it (a host bug).
    #[error("{0}")]
    Misrouted(&'static str),
    /// The component could not be loaded.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The component's `meta` is unacceptable or could not be read.
    #[error(transparent)]
    Meta(#[from] MetaError),
    /// Calling `meta` failed (trap, fuel).
    #[error("calling the factory's `meta` failed: {0}")]
    MetaCall(String),
    /// A limit (declared or overridden) is out of range.
    #[error(transparent)]
    Limits(#[from] LimitError),
    /// The arguments are not JSON or do not match the factory's args schema.
    #[error("invalid args: {0}")]
    InvalidArgs(String),
    /// No run with that id (for this session).
    #[error("not_found: no run `{0}`")]
    NotFound(String),
    /// The run is completed (or otherwise cannot be resumed).
    #[error("non_resumable: {0}")]
    NonResumable(String),
    /// No registered factory or stored component by that name or hash.
    #[error("{0}")]
    NotRegistered(String),
    /// The durable store failed (unavailable, locked, corrupt, or a commit failed).
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// The run has an attempt executing.
    #[error("already_active: run `{0}` is running")]
    AlreadyActive(String),
    /// A script factory's source cannot be read or does not define a runnable factory
    /// (a syntax error: `file:line:col`).
    #[error(transparent)]
    Script(#[from] crate::script::ScriptError),
    /// A directory to grant read access to is missing or not a directory.
    #[error(transparent)]
    Grant(#[from] crate::sandbox::GrantError),
    /// A component that is not trusted, with no consent and no way to ask for it.
    #[error("no_approval_provider: {0}")]
    NotApproved(String),
    /// The backend a run needs cannot be built (its config entry is gone, its key variable
    /// is unset, the name is unknown): nothing started.
    #[error(transparent)]
    BackendUnavailable(#[from] crate::backend::BackendUnavailable),
}

impl Error {
    /// The error's code (`not_found`, `non_resumable`, `already_active`, `backend_unavailable`,
    /// `unknown_factory`, `invalid_limits`, `invalid_args`), when it has one.
    pub fn code(&self) -> Option<&'static str> {
        match self {
            Error::NotFound(_) => Some("not_found"),
            Error::NonResumable(_) => Some("non_resumable"),
            Error::AlreadyActive(_) => Some("already_active"),
            Error::BackendUnavailable(_) => Some("backend_unavailable"),
            Error::NotRegistered(_) => Some("unknown_factory"),
            Error::NotApproved(_) => Some("no_approval_provider"),
            Error::Limits(_) => Some("invalid_limits"),
            Error::InvalidArgs(_) => Some("invalid_args"),
            Error::Script(_) => Some("invalid_script"),
            _ => None,
        }
    }
}
