//! [`Error`]: everything the host library can refuse, as typed values. A run that started
//! never becomes an `Error`: its outcome is in the envelope.

use crate::model::limits::LimitError;
use crate::model::meta::MetaError;
use crate::sandbox::component::LoadError;

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
    Script(#[from] crate::guests::script::ScriptError),
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
    /// What a shared store says to run is refused: bytes that do not hash to their sha256,
    /// a record that does not match its consent seal, a grant outside the allowed roots.
    #[error(transparent)]
    Trust(#[from] crate::sandbox::admission::TrustError),
    /// A request field that is well-formed JSON but unusable (a relative `callerCwd`).
    #[error("bad_request: {0}")]
    BadRequest(String),
    /// Pausing a run that has no attempt executing (it ended, is paused, or waits).
    #[error("not_running: {0}")]
    NotRunning(String),
    /// A resume with an answer (`input`) for a run that waits at no checkpoint.
    #[error("not_at_checkpoint: {0}")]
    NotAtCheckpoint(String),
    /// A checkpoint's answer (a resume's `input`) over the host's step bounds.
    #[error("invalid_input: {0}")]
    InvalidInput(String),
    /// A pending approval cannot be held, found or answered.
    #[error(transparent)]
    Approval(#[from] ApprovalError),
}

/// Why a pending approval (see `service::Approvals`) cannot be held, found or answered.
#[derive(Debug, thiserror::Error)]
pub enum ApprovalError {
    /// No approval by that id for this caller.
    #[error("not_found: no approval `{0}` (unknown, answered long ago, or the service restarted)")]
    Unknown(String),
    /// It was answered already (or is being answered).
    #[error("approval `{0}` was {1} already")]
    Answered(String, &'static str),
    /// Too many approvals are pending.
    #[error(
        "no_approval_provider: {0} approvals are pending already: answer some (`factory approvals`) and try again"
    )]
    Full(usize),
    /// An "always" answer could not be recorded in the trust store (nothing started).
    #[error("recording the approval in the trust store: {0}")]
    Remember(#[source] crate::store::trust::TrustError),
}

/// The code every front door gives a refusal (the control socket, the HTTP API, MCP tool
/// errors), serialized as today's strings (`not_found`, ...). A code this build does not
/// know reads as [`ErrorCode::Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// No run (or route) by that id for this caller.
    NotFound,
    /// The run cannot be resumed (completed, declined).
    NonResumable,
    /// The run has an attempt executing.
    AlreadyActive,
    /// The backend the run needs cannot be built.
    BackendUnavailable,
    /// No registered factory by that name.
    UnknownFactory,
    /// The component is not trusted and the request carries no consent.
    NoApprovalProvider,
    /// A limit is out of range.
    InvalidLimits,
    /// The arguments are not JSON or do not match the args schema.
    InvalidArgs,
    /// A script factory's source is refused.
    InvalidScript,
    /// The request's parameters are malformed.
    InvalidParams,
    /// A malformed request line (control socket).
    BadRequest,
    /// The peer speaks another wire version.
    UnsupportedVersion,
    /// The caller is not allowed (another uid on the control socket).
    Forbidden,
    /// The HTTP `Host` header names no address served here.
    ForbiddenHost,
    /// No or a wrong bearer token.
    Unauthorized,
    /// A one-time dashboard code that is used, expired or unknown.
    InvalidCode,
    /// The process holding the store cannot be reached.
    Unavailable,
    /// The caller cancelled what it was waiting for.
    Cancelled,
    /// The user declined the consent question (or left it unanswered): nothing started.
    Declined,
    /// What a shared store says to run is refused ([`crate::sandbox::admission::TrustError`]:
    /// bytes that do not hash to their sha256, a record that does not match its consent seal,
    /// a grant under no allowed root).
    Refused,
    /// Pausing a run that has no attempt executing.
    NotRunning,
    /// A resume's answer for a run that waits at no checkpoint.
    NotAtCheckpoint,
    /// A checkpoint's answer is unusable (over the step bounds).
    InvalidInput,
    /// The store cannot be reached or written now (the database away, the lease lost, the
    /// store closed or held by another process): try again later.
    StorageUnavailable,
    /// The store holds what this build cannot read (damaged, or written by a newer layout).
    StorageCorrupt,
    /// Anything else.
    #[serde(other)]
    Error,
}

impl ErrorCode {
    /// Its wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::NotFound => "not_found",
            ErrorCode::NonResumable => "non_resumable",
            ErrorCode::AlreadyActive => "already_active",
            ErrorCode::BackendUnavailable => "backend_unavailable",
            ErrorCode::UnknownFactory => "unknown_factory",
            ErrorCode::NoApprovalProvider => "no_approval_provider",
            ErrorCode::InvalidLimits => "invalid_limits",
            ErrorCode::InvalidArgs => "invalid_args",
            ErrorCode::InvalidScript => "invalid_script",
            ErrorCode::InvalidParams => "invalid_params",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::UnsupportedVersion => "unsupported_version",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::ForbiddenHost => "forbidden_host",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::InvalidCode => "invalid_code",
            ErrorCode::Refused => "refused",
            ErrorCode::Declined => "declined",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Cancelled => "cancelled",
            ErrorCode::NotRunning => "not_running",
            ErrorCode::NotAtCheckpoint => "not_at_checkpoint",
            ErrorCode::InvalidInput => "invalid_input",
            ErrorCode::StorageUnavailable => "storage_unavailable",
            ErrorCode::StorageCorrupt => "storage_corrupt",
            ErrorCode::Error => "error",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Error {
    /// The error's code ([`ErrorCode::Error`] for those without a code of their own).
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::NotFound(_) => ErrorCode::NotFound,
            Error::NonResumable(_) => ErrorCode::NonResumable,
            Error::AlreadyActive(_) => ErrorCode::AlreadyActive,
            Error::BackendUnavailable(_) => ErrorCode::BackendUnavailable,
            Error::NotRegistered(_) => ErrorCode::UnknownFactory,
            Error::NotApproved(_) => ErrorCode::NoApprovalProvider,
            Error::Limits(_) => ErrorCode::InvalidLimits,
            Error::InvalidArgs(_) => ErrorCode::InvalidArgs,
            Error::Script(_) => ErrorCode::InvalidScript,
            Error::Load(LoadError::TooLarge { .. } | LoadError::NotAFile { .. }) => ErrorCode::InvalidParams,
            Error::BadRequest(_) => ErrorCode::BadRequest,
            Error::Trust(_) => ErrorCode::Refused,
            Error::NotRunning(_) => ErrorCode::NotRunning,
            Error::NotAtCheckpoint(_) => ErrorCode::NotAtCheckpoint,
            Error::InvalidInput(_) => ErrorCode::InvalidInput,
            Error::Approval(ApprovalError::Unknown(_)) => ErrorCode::NotFound,
            Error::Approval(ApprovalError::Answered(..)) => ErrorCode::AlreadyActive,
            Error::Approval(ApprovalError::Full(_)) => ErrorCode::NoApprovalProvider,
            Error::Store(e) => store_code(e),
            _ => ErrorCode::Error,
        }
    }
}

/// The service's code for a store failure: [`ErrorCode::StorageUnavailable`] for a store out
/// of reach now, [`ErrorCode::StorageCorrupt`] for one this build cannot read, else
/// [`ErrorCode::Error`].
fn store_code(e: &crate::store::StoreError) -> ErrorCode {
    use crate::store::StoreError;
    match e {
        StoreError::Locked(_)
        | StoreError::Closed
        | StoreError::Postgres { .. }
        | StoreError::Pool { .. }
        | StoreError::Unavailable { .. }
        | StoreError::Fenced { .. } => ErrorCode::StorageUnavailable,
        StoreError::WriteFailed(inner) if inner.is_outage() => ErrorCode::StorageUnavailable,
        StoreError::Corrupt(_) | StoreError::Version { .. } => ErrorCode::StorageCorrupt,
        _ => ErrorCode::Error,
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorCode;

    #[test]
    fn codes_keep_their_wire_strings_and_an_unknown_one_reads_as_error() {
        for code in [
            ErrorCode::NotFound,
            ErrorCode::NoApprovalProvider,
            ErrorCode::ForbiddenHost,
            ErrorCode::Refused,
            ErrorCode::NotRunning,
            ErrorCode::StorageUnavailable,
            ErrorCode::StorageCorrupt,
            ErrorCode::Error,
        ] {
            assert_eq!(serde_json::to_value(code).unwrap(), serde_json::json!(code.as_str()));
            assert_eq!(serde_json::from_value::<ErrorCode>(serde_json::json!(code.as_str())).unwrap(), code);
        }
        assert_eq!(
            serde_json::from_value::<ErrorCode>(serde_json::json!("from_a_newer_peer")).unwrap(),
            ErrorCode::Error
        );
    }

    #[test]
    fn a_store_out_of_reach_and_a_damaged_one_have_codes_of_their_own() {
        use crate::store::StoreError;
        let closed = super::Error::from(StoreError::Closed);
        assert_eq!(closed.code(), ErrorCode::StorageUnavailable);
        let locked = super::Error::from(StoreError::Locked("/s/store.redb".into()));
        assert_eq!(locked.code(), ErrorCode::StorageUnavailable);
        let corrupt = super::Error::from(StoreError::Corrupt("run r".into()));
        assert_eq!(corrupt.code(), ErrorCode::StorageCorrupt);
        let newer = super::Error::from(StoreError::Version { found: 9, expected: 1 });
        assert_eq!(newer.code(), ErrorCode::StorageCorrupt);
    }

    #[test]
    fn what_a_worker_refuses_of_a_shared_store_has_a_code_of_its_own() {
        use crate::sandbox::admission::TrustError;
        let refused = super::Error::from(TrustError::ConsentMismatch("r".into()));
        assert_eq!(refused.code(), ErrorCode::Refused);
        assert!(refused.to_string().starts_with("consent_mismatch: "), "{refused}");
    }
}
