//! Subagent backends: the [`AgentBackend`] trait, and [`from_spec`] that turns a CLI
//! `--backend` value into one. The schema retry, memoization, limits and credit accounting
//! live around backends (in `hooks::agents`), not in them: a backend answers one prompt.

mod agent_cli;
mod anthropic;
pub mod cassette;
pub mod config;
mod dry_run;
pub mod flow;
pub mod http;
mod openai;
pub mod pricing;
mod prompting;
pub(crate) mod quota;
mod reply;
pub use crate::model::recorded;
pub mod redact;
mod reference;
pub mod router;
mod script;

pub use agent_cli::{
    group_alive, AgentCli, AgentCliConfig, CliPresetError, JsonOutput, OutputMode, SandboxMode, ToolFlags, WrapUp,
    DEFAULT_HIDDEN, MAX_TURNS_REASON, PRESETS,
};
pub use anthropic::{Anthropic, AnthropicConfig, DEFAULT_ANTHROPIC_BASE_URL};
pub use cassette::{Cassette, CassetteError};
pub use dry_run::DryRun;
pub use http::RetryPolicy;
pub use openai::{OpenAi, OpenAiConfig, StructuredMode, DEFAULT_OPENAI_BASE_URL};
pub use pricing::{Price, PriceTables, Pricing, Provider};
pub use recorded::{BackendRef, BackendUnavailable, Unbuilt};
pub use reference::{BackendCatalog, BuiltinCatalog, Identified};
pub use router::{Route, Router};
pub use script::{Script, ScriptError, ScriptRulesError};

pub use crate::model::limits::{AgentLimits, SoftLimit};
pub use crate::model::tuning::AgentTuning;
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
    /// The call's soft limits (its own over the factory's defaults), checked; each backend
    /// honours what applies to it (README, "Per-agent soft limits").
    pub limits: AgentLimits,
    /// The call's agent, reasoning effort and context tier, checked; each backend maps what
    /// it has a knob for (README, "Agent options").
    pub tuning: AgentTuning,
}

/// What a backend reports for one spawn. The four token counts are disjoint: input tokens
/// are the prompt tokens that were neither read from nor written to the provider's prompt
/// cache (OpenAI counts cached tokens inside `prompt_tokens`; they are moved out).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Usage {
    /// Uncached prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// Prompt tokens read from the provider's prompt cache.
    pub cache_read_tokens: u64,
    /// Prompt tokens written to the provider's prompt cache.
    pub cache_write_tokens: u64,
    /// Cost of the call in nano-credits, when the backend knows it.
    pub credits_nano: Option<u64>,
    /// True when `credits_nano` is a lower bound (e.g. cache tokens without a price).
    pub credits_at_least: bool,
}

impl Usage {
    /// Usage of `input_tokens` uncached and `output_tokens` completion tokens, no cache,
    /// costing `credits_nano` exactly.
    pub fn tokens(input_tokens: u64, output_tokens: u64, credits_nano: Option<u64>) -> Usage {
        Usage { input_tokens, output_tokens, credits_nano, ..Usage::default() }
    }
}

/// A subagent's reply.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentReply {
    /// The final text (for schema calls: text that should parse as matching JSON).
    pub text: String,
    /// Usage; `None` when the backend could not account the call.
    pub usage: Option<Usage>,
    /// The soft limit that ended the call, if one did (the text is what the subagent gave
    /// by then, empty when nothing).
    pub ended_by: Option<SoftLimit>,
}

impl AgentReply {
    /// A reply of `text` with `usage`, not ended by a soft limit.
    pub fn new(text: impl Into<String>, usage: Option<Usage>) -> AgentReply {
        AgentReply { text: text.into(), usage, ended_by: None }
    }

    /// A call a soft limit ended before the subagent replied (no text, no usage known).
    pub fn cut_off(limit: SoftLimit) -> AgentReply {
        AgentReply { text: String::new(), usage: None, ended_by: Some(limit) }
    }
}

/// Which way a backend could not be used at all (a backend failure, not an answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutageKind {
    /// Connection refused or reset, DNS failure, a broken transfer, after the retries.
    Unavailable,
    /// The request timed out, after the retries.
    Timeout,
    /// Authentication or permission refused (HTTP 401/403).
    Auth,
    /// The model (or the endpoint) does not exist (HTTP 404).
    ModelNotFound,
    /// Rate limited (HTTP 429) past the retry budget, or asked to wait too long.
    RateLimited,
    /// Server errors (HTTP 5xx) past the retry budget.
    ServerError,
    /// A success status whose body is not the API's reply format.
    InvalidReply,
    /// An agent CLI that is not installed or not executable.
    NotInstalled,
    /// The backend's own setup cannot work (no model, an empty command, a client error).
    Misconfigured,
    /// A replay-only cassette has no exchange for the call.
    ReplayMiss,
    /// The provider's quota is spent (OpenAI `insufficient_quota`, a usage or credit limit,
    /// or a wait past the backend's bound): no retry fixes it before the quota resets. The
    /// run is parked until then ([`BackendError::resume_at`]).
    Quota,
}

impl OutageKind {
    /// The spelling used as `failure.kind`.
    pub fn as_str(self) -> &'static str {
        match self {
            OutageKind::Unavailable => "unavailable",
            OutageKind::Timeout => "timeout",
            OutageKind::Auth => "auth",
            OutageKind::ModelNotFound => "model_not_found",
            OutageKind::RateLimited => "rate_limited",
            OutageKind::ServerError => "server_error",
            OutageKind::InvalidReply => "invalid_reply",
            OutageKind::NotInstalled => "not_installed",
            OutageKind::Misconfigured => "misconfigured",
            OutageKind::ReplayMiss => "replay_miss",
            OutageKind::Quota => crate::model::envelope::QUOTA_KIND,
        }
    }
}

impl std::fmt::Display for OutageKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A spawn that failed, in one of two classes the run engine treats differently.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The model answered badly or not at all (nothing, a refusal, a non-zero exit of an
    /// agent CLI): an ordinary failure, `none` to the factory, journaled.
    #[error("{0}")]
    Ordinary(String),
    /// The backend could not be used; says nothing about the prompt. The attempt stops with
    /// `failure.type = "backend"`, the call is not journaled, and a resume retries it.
    #[error("{message}")]
    Outage {
        /// Which way it failed.
        kind: OutageKind,
        /// The backend's message.
        message: String,
    },
    /// The provider's quota is spent ([`OutageKind::Quota`]): a backend failure the run waits
    /// out, parked until `until` when the provider said when the quota resets.
    #[error("{message}")]
    QuotaSpent {
        /// The backend's message.
        message: String,
        /// When the quota resets, if the provider said.
        until: Option<std::time::SystemTime>,
    },
}

impl BackendError {
    /// An ordinary failure.
    pub fn ordinary(message: impl Into<String>) -> Self {
        BackendError::Ordinary(message.into())
    }

    /// A backend failure of `kind`.
    pub fn outage(kind: OutageKind, message: impl Into<String>) -> Self {
        BackendError::Outage { kind, message: message.into() }
    }

    /// A spent quota that resets at `until` (unknown: `None`).
    pub fn quota(message: impl Into<String>, until: Option<std::time::SystemTime>) -> Self {
        BackendError::QuotaSpent { message: message.into(), until }
    }

    /// The outage kind, for a backend failure.
    pub fn outage_kind(&self) -> Option<OutageKind> {
        match self {
            BackendError::Ordinary(_) => None,
            BackendError::Outage { kind, .. } => Some(*kind),
            BackendError::QuotaSpent { .. } => Some(OutageKind::Quota),
        }
    }

    /// When the run may try again by itself: a spent quota's reset time, when known.
    pub fn resume_at(&self) -> Option<std::time::SystemTime> {
        match self {
            BackendError::QuotaSpent { until, .. } => *until,
            _ => None,
        }
    }

    /// The message, whatever the class.
    pub fn message(&self) -> &str {
        match self {
            BackendError::Ordinary(m)
            | BackendError::Outage { message: m, .. }
            | BackendError::QuotaSpent { message: m, .. } => m,
        }
    }
}

/// Something that runs subagents.
pub trait AgentBackend: Send + Sync + 'static {
    /// A short name for progress output and envelopes.
    fn name(&self) -> String;

    /// Run one spawn. The future must be cancel-safe: dropping it abandons the call.
    fn call(&self, request: Arc<AgentRequest>) -> BoxFuture<'static, Result<AgentReply, BackendError>>;

    /// What a run records about this backend so a resume can build it again (default: its
    /// name, as a built-in spec).
    fn reference(&self) -> BackendRef {
        BackendRef::named(self.name())
    }

    /// Why a call for `model` (`None`: the backend's default) cannot be accounted in credits,
    /// naming what would price it; `None` when its cost is known. A run with `maxAiCredits`
    /// refuses to spawn on an unpriced model (fail-closed).
    fn unpriced(&self, _model: Option<&str>) -> Option<String> {
        None
    }

    /// The line a run shows once when calls for `model` (`None`: the backend's default)
    /// cost 0 credits because the backend's server is on this machine (a loopback address)
    /// and nothing prices the model; `None` (the default) otherwise.
    fn free_notice(&self, _model: Option<&str>) -> Option<String> {
        None
    }

    /// This backend for a run granted `grants` (canonical read-only directories): a backend
    /// whose spawns see files (an agent CLI) shows them those; `None` (the default): grants
    /// change nothing for it.
    fn with_grants(&self, _grants: &[String]) -> Option<Arc<dyn AgentBackend>> {
        None
    }

    /// This backend with `hidden` kept from its spawns as well (a backend whose spawns see
    /// files, an agent CLI, adds them to what its sandbox hides; a wrapper passes them on);
    /// `None` (the default): its spawns see no files, so there is nothing to hide.
    fn hiding(&self, _hidden: &Hidden) -> Option<Arc<dyn AgentBackend>> {
        None
    }

    /// The flow controllers its calls are admitted through ([`flow`]): the HTTP backends'
    /// (one per endpoint and key, and per model with limits of its own) and agent CLIs';
    /// wrappers pass their inner backends' on. Empty by default.
    fn flows(&self) -> Vec<Arc<flow::Flow>> {
        Vec::new()
    }

    /// One line for the consent prompt: what runs the subagents and with what reach
    /// (default: the name).
    fn describe(&self) -> String {
        self.name()
    }
}

/// Paths a run's spawns must not see, handed down as data by the layer that knows them (the
/// front door serving the store knows its state directories, token files and socket; the
/// caller of a run knows its working directory). Absolute paths; those that do not exist
/// are skipped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hidden {
    /// Never shown, not even inside a grant or a backend's own working directory: the
    /// serving process's state directories, token files and control socket.
    pub sealed: Vec<std::path::PathBuf>,
    /// Hidden unless a grant shows them: the caller's working directory.
    pub unless_granted: Vec<std::path::PathBuf>,
}

impl Hidden {
    /// Whether it hides nothing.
    pub fn is_empty(&self) -> bool {
        self.sealed.is_empty() && self.unless_granted.is_empty()
    }
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
    /// A `script:FILE` or `replay:FILE` whose path cannot be made absolute.
    #[error("backend `{spec}`: cannot make its path absolute: {source}")]
    Path {
        /// The spec.
        spec: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A `script:FILE` whose file is unusable.
    #[error(transparent)]
    Script(#[from] ScriptError),
    /// A `cli:PRESET` that names no preset (or `generic`, which needs a config).
    #[error(transparent)]
    Cli(#[from] CliPresetError),
    /// A backend that could not be set up (e.g. its HTTP client).
    #[error(transparent)]
    Setup(#[from] BackendError),
    /// A `replay:FILE` whose cassette is unusable.
    #[error(transparent)]
    Cassette(#[from] CassetteError),
}

/// Build a backend from its CLI spelling: `dry-run` (the default) or `script:FILE`.
pub fn from_spec(spec: &str) -> Result<Arc<dyn AgentBackend>, BackendSpecError> {
    from_spec_with_model(spec, None)
}

/// Build a built-in backend from its CLI spelling — `dry-run`, `script:FILE`, `openai`
/// (`OPENAI_BASE_URL`, `OPENAI_API_KEY`), `anthropic` (`ANTHROPIC_BASE_URL`,
/// `ANTHROPIC_API_KEY`), `cli:PRESET` or `replay:CASSETTE` — with `model` as its default
/// model; `openai` and `anthropic` are priced by the built-in price table. The backend's
/// [`AgentBackend::reference`] is the spec (file paths made absolute) and `model`.
pub fn from_spec_with_model(spec: &str, model: Option<&str>) -> Result<Arc<dyn AgentBackend>, BackendSpecError> {
    from_spec_priced(spec, model, &PriceTables::builtin())
}

/// [`from_spec_with_model`] with the price tables `prices` for the built-in `openai` and
/// `anthropic` backends (e.g. the built-in table with `factory.toml`'s `[prices]`).
pub fn from_spec_priced(
    spec: &str,
    model: Option<&str>,
    prices: &PriceTables,
) -> Result<Arc<dyn AgentBackend>, BackendSpecError> {
    let owned = model.map(str::to_string);
    let absolute =
        |path: &str| std::path::absolute(path).map_err(|source| BackendSpecError::Path { spec: spec.into(), source });
    let (backend, name): (Arc<dyn AgentBackend>, String) = match spec {
        "dry-run" | "dry" => (Arc::new(DryRun), "dry-run".into()),
        "openai" => {
            let pricing = Pricing::default().with_table(prices.get(Provider::OpenAi));
            (Arc::new(OpenAi::new(OpenAiConfig { model: owned, pricing, ..OpenAiConfig::from_env() })?), spec.into())
        }
        "anthropic" => {
            let pricing = Pricing::default().with_table(prices.get(Provider::Anthropic));
            (
                Arc::new(Anthropic::new(AnthropicConfig { model: owned, pricing, ..AnthropicConfig::from_env() })?),
                spec.into(),
            )
        }
        _ => {
            if let Some(path) = spec.strip_prefix("script:") {
                let path = absolute(path)?;
                (Arc::new(Script::from_file(&path)?), format!("script:{}", path.display()))
            } else if let Some(path) = spec.strip_prefix("replay:") {
                let path = absolute(path)?;
                (Arc::new(Cassette::replay(&path)?), format!("replay:{}", path.display()))
            } else if let Some(preset) = spec.strip_prefix("cli:") {
                let config = AgentCliConfig { model: owned, ..AgentCliConfig::preset(preset)? };
                (Arc::new(AgentCli::new(config)?), spec.into())
            } else {
                return Err(BackendSpecError::Unknown(spec.to_string()));
            }
        }
    };
    let reference = BackendRef { model: model.map(str::to_string), ..BackendRef::named(name) };
    Ok(Arc::new(Identified::new(backend, reference)))
}

/// Whether `spec` is a built-in spelling (checked without building the backend).
pub fn is_builtin_spec(spec: &str) -> bool {
    matches!(spec, "dry-run" | "dry" | "openai" | "anthropic")
        || spec.starts_with("script:")
        || spec.starts_with("replay:")
        || spec.strip_prefix("cli:").is_some_and(|p| PRESETS.contains(&p) && p != "generic")
}

/// Token counts read from a server's usage object: each field a count, zero when absent;
/// a field that is present but no count (negative, a string, an object) reads as zero and
/// sets `unreadable`, so the cost built from them is flagged as a lower bound. A number
/// beyond `u64::MAX` (or a huge float) saturates at `u64::MAX`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    /// Whether some field present was not a count.
    pub unreadable: bool,
}

impl Counts {
    /// Counts to be read from `usage`; a usage that is not an object is unreadable.
    pub(crate) fn of(usage: &serde_json::Value) -> Counts {
        Counts { unreadable: !usage.is_object() }
    }

    /// The count at `pointer` (a JSON pointer) in `usage`.
    pub(crate) fn get(&mut self, usage: &serde_json::Value, pointer: &str) -> u64 {
        match usage.pointer(pointer) {
            None | Some(serde_json::Value::Null) => 0,
            Some(value) => match value.as_u64() {
                Some(n) => n,
                // `as` saturates: 1e300 is u64::MAX; fractions round down.
                None => match value.as_f64().filter(|f| f.is_finite() && *f >= 0.0) {
                    Some(f) => f as u64,
                    None => {
                        self.unreadable = true;
                        0
                    }
                },
            },
        }
    }
}

/// A rough token count for backends that have no tokenizer: ~4 bytes per token.
pub(crate) fn estimate_tokens(text: &str) -> u64 {
    (text.len() as u64).div_ceil(4)
}
