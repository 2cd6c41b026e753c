//! Subagent backends: the [`AgentBackend`] trait, and [`from_spec`] that turns a CLI
//! `--backend` value into one. The schema retry, memoization, limits and credit accounting
//! live around backends (in `hooks::agents`), not in them: a backend answers one prompt.

mod agent_cli;
mod anthropic;
pub mod cassette;
mod dry_run;
pub mod http;
mod openai;
pub mod pricing;
mod prompting;
pub mod router;
mod script;

pub use agent_cli::{group_alive, AgentCli, AgentCliConfig, CliPresetError, JsonOutput, OutputMode, PRESETS};
pub use anthropic::{Anthropic, AnthropicConfig, DEFAULT_ANTHROPIC_BASE_URL};
pub use cassette::{Cassette, CassetteError};
pub use dry_run::DryRun;
pub use http::RetryPolicy;
pub use openai::{OpenAi, OpenAiConfig, StructuredMode, DEFAULT_OPENAI_BASE_URL};
pub use pricing::{Price, Pricing};
pub use router::{Route, Router};
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
    /// On the schema retry: why the previous reply was rejected, so the model can fix it.
    pub feedback: Option<String>,
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
    #[error(
        "unknown backend `{0}` (expected `dry-run`, `script:FILE`, `openai`, `anthropic`, \
         `cli:PRESET` with PRESET one of claude, codex, copilot, gemini, or a backend named in factory.toml)"
    )]
    Unknown(String),
    /// A `script:FILE` whose file is unusable.
    #[error(transparent)]
    Script(#[from] ScriptError),
    /// A `cli:PRESET` that names no preset (or `generic`, which needs a config).
    #[error(transparent)]
    Cli(#[from] CliPresetError),
    /// A backend that could not be set up (e.g. its HTTP client).
    #[error(transparent)]
    Setup(#[from] BackendError),
}

/// Build a backend from its CLI spelling: `dry-run` (the default) or `script:FILE`.
pub fn from_spec(spec: &str) -> Result<Arc<dyn AgentBackend>, BackendSpecError> {
    from_spec_with_model(spec, None)
}

/// Build a built-in backend from its CLI spelling — `dry-run`, `script:FILE`, `openai`
/// (`OPENAI_BASE_URL`, `OPENAI_API_KEY`), `anthropic` (`ANTHROPIC_BASE_URL`,
/// `ANTHROPIC_API_KEY`) or `cli:PRESET` — with `model` as its default model.
pub fn from_spec_with_model(spec: &str, model: Option<&str>) -> Result<Arc<dyn AgentBackend>, BackendSpecError> {
    let model = model.map(str::to_string);
    match spec {
        "dry-run" | "dry" => Ok(Arc::new(DryRun)),
        "openai" => Ok(Arc::new(OpenAi::new(OpenAiConfig { model, ..OpenAiConfig::from_env() })?)),
        "anthropic" => Ok(Arc::new(Anthropic::new(AnthropicConfig { model, ..AnthropicConfig::from_env() })?)),
        _ => {
            if let Some(path) = spec.strip_prefix("script:") {
                Ok(Arc::new(Script::from_file(path)?))
            } else if let Some(preset) = spec.strip_prefix("cli:") {
                let config = AgentCliConfig { model, ..AgentCliConfig::preset(preset)? };
                Ok(Arc::new(AgentCli::new(config)?))
            } else {
                Err(BackendSpecError::Unknown(spec.to_string()))
            }
        }
    }
}

/// Whether `spec` is a built-in spelling (checked without building the backend).
pub fn is_builtin_spec(spec: &str) -> bool {
    matches!(spec, "dry-run" | "dry" | "openai" | "anthropic")
        || spec.starts_with("script:")
        || spec.strip_prefix("cli:").is_some_and(|p| PRESETS.contains(&p) && p != "generic")
}

/// A rough token count for backends that have no tokenizer: ~4 bytes per token.
pub(crate) fn estimate_tokens(text: &str) -> u64 {
    (text.len() as u64).div_ceil(4)
}
