//! Subagent backends: the [`AgentBackend`] trait, and [`from_spec`] that turns a CLI
//! `--backend` value into one. The schema retry, memoization, limits and credit accounting
//! live around backends (in `hooks::agents`), not in them: a backend answers one prompt.

mod dry_run;
mod script;

pub use dry_run::DryRun;
pub use script::{Script, ScriptError};

use futures::future::BoxFuture;
use std::sync::Arc;

/// One subagent spawn as a backend sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentRequest {
    /// The prompt (never shown by observation APIs).
    pub prompt: String,
    /// The call's label, if any.
    pub label: Option<String>,
    /// The requested model, if any.
    pub model: Option<String>,
    /// The JSON Schema the reply must match, if any.
    pub schema: Option<serde_json::Value>,
    /// 0 for the first spawn, 1 for the schema retry.
    pub attempt: u32,
}

/// What a backend reports for one spawn.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Usage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// Cost of the call in nano-credits, when the backend knows it.
    pub credits_nano: Option<u64>,
}

/// A subagent's reply.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentReply {
    /// The final text (for schema calls: text that should parse as matching JSON).
    pub text: String,
    /// Usage; `None` when the backend could not account the call.
    pub usage: Option<Usage>,
}

/// A spawn that failed. An ordinary failure for the factory (`none`), never an abort.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct BackendError(pub String);

/// Something that runs subagents.
pub trait AgentBackend: Send + Sync + 'static {
    /// A short name for progress output and envelopes.
    fn name(&self) -> String;

    /// Run one spawn. The future must be cancel-safe: dropping it abandons the call.
    fn call(&self, request: Arc<AgentRequest>) -> BoxFuture<'static, Result<AgentReply, BackendError>>;
}

/// A `--backend` value that names no backend or cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum BackendSpecError {
    /// Not one of the known forms.
    #[error("unknown backend `{0}` (expected `dry-run` or `script:FILE`)")]
    Unknown(String),
    /// A `script:FILE` whose file is unusable.
    #[error(transparent)]
    Script(#[from] ScriptError),
}

/// Build a backend from its CLI spelling: `dry-run` (the default) or `script:FILE`.
pub fn from_spec(spec: &str) -> Result<Arc<dyn AgentBackend>, BackendSpecError> {
    match spec {
        "dry-run" | "dry" => Ok(Arc::new(DryRun)),
        _ => match spec.strip_prefix("script:") {
            Some(path) => Ok(Arc::new(Script::from_file(path)?)),
            None => Err(BackendSpecError::Unknown(spec.to_string())),
        },
    }
}

/// A rough token count for backends that have no tokenizer: ~4 bytes per token.
pub(crate) fn estimate_tokens(text: &str) -> u64 {
    (text.len() as u64).div_ceil(4)
}
