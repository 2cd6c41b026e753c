//! `factory.toml`: the user's backend configuration — named backends, the default one, how
//! a call's `options.model` routes to a backend and model name, and prices. It is found
//! ([`Config::discover`]) via `--config` (or `$FACTORY_CONFIG`), else `factory.toml` in the
//! state directory, else `./.factory/factory.toml` (a project's), else the user's
//! `$XDG_CONFIG_HOME/factory/factory.toml` (`~/.config/factory/factory.toml`); with no file,
//! the built-in backends (`dry-run`, `openai`, `anthropic`, `cli:PRESET`, `script:FILE`)
//! still work.
//!
//! A config chooses commands the host executes (`kind = "cli"`), so a file that came with
//! the working directory is never used on its own: a discovered file at or below the
//! current directory ([`crate::access::is_project_local`]) is used only when its exact
//! contents were approved with `factory config allow FILE` (an edited file needs approving
//! again); every discovered or named file must be owned by the user and not writable by
//! group or others. Built-in backend names (`dry-run`, `dry`, `openai`, `anthropic`, and any
//! name with a `:` such as `cli:claude` or `script:x`) cannot be redefined.
//!
//! ```toml
//! default = "local"                     # used when --backend is not given
//!
//! [backends.local]
//! kind = "openai"                       # openai | anthropic | cli | dry-run | script
//! base_url = "http://127.0.0.1:8080/v1"
//! api_key_env = "LOCAL_API_KEY"         # the variable holding the key (optional)
//! model = "qwen2.5-7b-instruct"         # the model when a call names none
//! timeout_seconds = 300
//! max_retries = 4
//! structured_output = "json_schema"     # or json_object, plain (anthropic: tool, plain)
//! [backends.local.pricing]              # credits (1 credit = US$0.01) per 1000 tokens; without it the model is unpriced (a run with maxAiCredits refuses it), or free when the server is on this machine (a loopback base_url)
//! input = 0.0
//! output = 0.0
//! models = { "big-model" = { input = 0.3, output = "1.5", cache_read = 0.03, cache_write = 0.375 } }
//!
//! [prices.openai]                       # over the built-in table (`factory backends --prices`)
//! "gpt-4o" = { input = 0.25, output = 1, cache_read = 0.125, cache_write = 0 }
//! [prices.anthropic]
//! "claude-next" = { input = 0.3, output = 1.5, cache_read = 0.03, cache_write = 0.375 }
//!
//! [backends.claude]
//! kind = "cli"
//! preset = "claude"                     # claude | codex | copilot | gemini | generic
//! env = ["ANTHROPIC_API_KEY"]           # passed through besides PATH and HOME
//! timeout_seconds = 900
//! grace_seconds = 5
//! sandbox = "bwrap"                     # the default; "none" runs it as you, unsandboxed
//! sandbox_writable = [".claude", ".claude.json"]  # home paths it may write (the preset's)
//! sandbox_hide = [".config/secret-tool"]          # hidden besides the built-in list
//! allowed_tools = ["Read", "Grep", "Bash(git log:*)"]  # passed as --allowedTools=...
//! disallowed_tools = ["WebFetch"]                      # passed as --disallowedTools=...
//! turns_flag = "--max-turns"            # a call's maxTurns, as --max-turns=N (the preset's)
//! agent_flag = "--agent"                # a call's agent, as --agent=NAME (the preset's)
//! wrap_up = "none"                      # or "stdin": JSON-string lines, wrap-up at maxDurationSeconds
//! wrap_up_seconds = 30                  # time to answer after the wrap-up prompt
//!
//! [backends.claude-json]
//! kind = "cli"
//! preset = "claude"                     # its JSON output reports `total_cost_usd`
//! cost_credits = 100                    # credits per unit of reported cost (claude's USD: 100; default 1)
//!
//! [[routes]]                            # options.model -> backend (+ model name)
//! model = "fast"                        # exact name, or a prefix ending in `*`
//! backend = "local"
//! as = "qwen2.5:7b"                     # the model name sent (default: unchanged)
//! ```

use crate::backend::flow::FlowLimits;
use crate::backend::{
    self, AgentBackend, AgentCli, AgentCliConfig, Anthropic, AnthropicConfig, BackendCatalog, BackendRef,
    BackendSpecError, BackendUnavailable, Identified, JsonOutput, OpenAi, OpenAiConfig, OutputMode, Price, PriceTables,
    Pricing, Provider, Route, Router, SandboxMode, Script, StructuredMode, Unbuilt, WrapUp,
};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// A config file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config `{path}`: {source}")]
    Read { path: String, source: std::io::Error },
    /// The file is not TOML of this shape.
    #[error("invalid config `{path}`: {source}")]
    Toml { path: String, source: toml::de::Error },
    /// The file is not UTF-8 text.
    #[error("invalid config `{path}`: {source}")]
    NotUtf8 { path: String, source: std::string::FromUtf8Error },
    /// The file is TOML of this shape but a value is refused (the store URL, a route).
    #[error("invalid config `{path}`: {message}")]
    Parse { path: String, message: String },
    /// A backend entry that cannot be built.
    #[error("backend `{name}`: {message}")]
    Invalid { name: String, message: String },
    /// A backend entry whose backend cannot be set up (its script, its agent CLI preset,
    /// its HTTP client).
    #[error("backend `{name}`: {source}")]
    Backend {
        name: String,
        #[source]
        source: BackendSpecError,
    },
    /// A price that is no amount of credits (`name`: the backend, or `[prices.PROVIDER]`
    /// and the model).
    #[error("backend `{name}`: {source}")]
    Price {
        name: String,
        #[source]
        source: PriceError,
    },
    /// An agent CLI's `cwd` that cannot be made absolute.
    #[error("backend `{name}`: cwd `{path}`: {source}")]
    Cwd {
        name: String,
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// An agent CLI's `cost_credits` that is no amount of credits.
    #[error("backend `{name}`: cost_credits: {source}")]
    CostCredits {
        name: String,
        #[source]
        source: PriceError,
    },
    /// A name that is neither configured nor built in.
    #[error(transparent)]
    Spec(#[from] BackendSpecError),
    /// A `[backends.NAME]` entry that would shadow a built-in backend.
    #[error("invalid config `{path}`: `[backends.{name}]` redefines a built-in backend name; choose another name (built-in names: dry-run, dry, openai, anthropic, and any name with a `:` such as cli:claude or script:FILE)")]
    Reserved { path: String, name: String },
    /// A project-local config whose contents the user has not approved.
    #[error("config `{path}` came with this directory (it is at or below the working directory) and these contents (sha256 {sha256}) were not approved: review it, then run `factory config allow {path}`, or name a config of your own with --config")]
    NotAllowed { path: String, sha256: String },
    /// A `factory serve` setting with a bad value.
    #[error(transparent)]
    Setting(#[from] SettingError),
    /// A config file someone else could have written, or the allow list is unusable.
    #[error(transparent)]
    Access(#[from] crate::access::AccessError),
}

/// Is `name` a built-in backend spelling (or in the reserved `prefix:` namespace)?
pub fn is_reserved_name(name: &str) -> bool {
    backend::is_builtin_spec(name) || name.contains(':')
}

/// A credit amount: a TOML number, or a decimal string for exactness.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Amount {
    /// An integer number of credits.
    Int(u64),
    /// A float number of credits.
    Float(f64),
    /// A decimal string like `"0.0025"`.
    Text(String),
}

impl Amount {
    /// The amount in nano-credits.
    pub fn nano(&self) -> Result<u64, PriceError> {
        match self {
            Amount::Int(n) => n.checked_mul(backend::pricing::NANO_PER_CREDIT).ok_or(PriceError::TooLarge(*n)),
            Amount::Float(f) => Ok(backend::pricing::float_credits_nano(*f)?),
            Amount::Text(t) => Ok(backend::pricing::parse_credits_nano(t)?),
        }
    }
}

/// An amount or a price of a config that is no amount of credits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PriceError {
    /// A whole number of credits too large to count in nano-credits.
    #[error("{0} is too large")]
    TooLarge(u64),
    /// Not a non-negative decimal amount of at most 9 decimal places.
    #[error(transparent)]
    Credits(#[from] backend::pricing::BadCredits),
    /// The price of one model is wrong.
    #[error("model `{model}`: {source}")]
    Model {
        /// The model.
        model: String,
        /// What is wrong with its price.
        #[source]
        source: Box<PriceError>,
    },
}

/// A price in credits (one credit is US$0.01) per 1000 input, output, cache-read and
/// cache-write tokens.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceConfig {
    /// Credits per 1000 uncached prompt tokens (default 0).
    pub input: Option<Amount>,
    /// Credits per 1000 completion tokens (default 0).
    pub output: Option<Amount>,
    /// Credits per 1000 prompt tokens read from the cache (unset: unknown, and a spend with
    /// such tokens is "at least").
    pub cache_read: Option<Amount>,
    /// Credits per 1000 prompt tokens written to the cache (unset: unknown, likewise).
    pub cache_write: Option<Amount>,
}

impl PriceConfig {
    /// The price in nano-credits per 1000 tokens.
    pub fn price(&self) -> Result<Price, PriceError> {
        let nano = |a: &Option<Amount>| a.as_ref().map_or(Ok(0), Amount::nano);
        let known = |a: &Option<Amount>| a.as_ref().map(Amount::nano).transpose();
        Ok(Price {
            input_nano_per_1k: nano(&self.input)?,
            output_nano_per_1k: nano(&self.output)?,
            cache_read_nano_per_1k: known(&self.cache_read)?,
            cache_write_nano_per_1k: known(&self.cache_write)?,
        })
    }
}

/// `[prices]`: per-model prices that override and extend the built-in price table of each
/// provider (used by the built-in `openai`/`anthropic` backends and by configured backends
/// of those kinds for models their own `pricing` leaves unpriced).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PricesConfig {
    /// OpenAI models.
    #[serde(default)]
    pub openai: BTreeMap<String, PriceConfig>,
    /// Anthropic models.
    #[serde(default)]
    pub anthropic: BTreeMap<String, PriceConfig>,
}

/// A backend's pricing: a default price and per-model prices.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PricingConfig {
    /// Credits per 1000 prompt tokens for models without their own entry.
    pub input: Option<Amount>,
    /// Credits per 1000 completion tokens for models without their own entry.
    pub output: Option<Amount>,
    /// Credits per 1000 cache-read tokens for models without their own entry.
    pub cache_read: Option<Amount>,
    /// Credits per 1000 cache-write tokens for models without their own entry.
    pub cache_write: Option<Amount>,
    /// Per-model prices.
    #[serde(default)]
    pub models: BTreeMap<String, PriceConfig>,
}

impl PricingConfig {
    /// The pricing in nano-credits.
    pub fn pricing(&self) -> Result<Pricing, PriceError> {
        // A default price exists only when one of its halves is written down.
        let default = if self.input.is_some() || self.output.is_some() {
            let price = PriceConfig {
                input: self.input.clone(),
                output: self.output.clone(),
                cache_read: self.cache_read.clone(),
                cache_write: self.cache_write.clone(),
            };
            Some(price.price()?)
        } else {
            None
        };
        let models = self
            .models
            .iter()
            .map(|(m, p)| {
                p.price()
                    .map(|p| (m.clone(), p))
                    .map_err(|e| PriceError::Model { model: m.clone(), source: Box::new(e) })
            })
            .collect::<Result<_, _>>()?;
        Ok(Pricing { default, models })
    }
}

/// What a `[backends.NAME]` entry builds: its `kind`, serialized as `openai`, `anthropic`,
/// `cli`, `dry-run` or `script` (another name is refused when the file is read).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackendKind {
    /// An OpenAI-compatible chat completions API.
    #[serde(rename = "openai")]
    OpenAi,
    /// The Anthropic messages API.
    Anthropic,
    /// An agent CLI run as a process (`command` or `preset`).
    Cli,
    /// Canned answers from the args schema, no model.
    DryRun,
    /// Rules from a JSON file (`path`).
    Script,
}

impl BackendKind {
    /// Its name in `kind`.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::OpenAi => "openai",
            BackendKind::Anthropic => "anthropic",
            BackendKind::Cli => "cli",
            BackendKind::DryRun => "dry-run",
            BackendKind::Script => "script",
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One `[backends.NAME]` entry.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    /// What it builds.
    pub kind: BackendKind,
    /// HTTP: the API root (default: the kind's environment variable, then its public URL).
    pub base_url: Option<String>,
    /// HTTP: the environment variable holding the API key.
    pub api_key_env: Option<String>,
    /// The model used when a call names none.
    pub model: Option<String>,
    /// HTTP: `max_tokens`.
    pub max_tokens: Option<u32>,
    /// HTTP: a system prompt sent with every call.
    pub system_prompt: Option<String>,
    /// HTTP: the first structured-output mode (openai: json_schema, json_object, plain;
    /// anthropic: tool, plain).
    pub structured_output: Option<String>,
    /// Timeout of one request (HTTP) or one call (CLI), in seconds.
    pub timeout_seconds: Option<f64>,
    /// HTTP: retries after the first try.
    pub max_retries: Option<u32>,
    /// HTTP: the first backoff delay in milliseconds.
    pub retry_base_ms: Option<u64>,
    /// Prices (credits per 1000 tokens).
    pub pricing: Option<PricingConfig>,
    /// HTTP: requests per minute the provider allows (default: learned from its headers).
    pub requests_per_minute: Option<f64>,
    /// HTTP: tokens per minute the provider allows (default: learned from its headers).
    pub tokens_per_minute: Option<f64>,
    /// Calls in flight at once (HTTP: a cap over the adaptive limit; CLI: agents running at
    /// once on this machine, default the number of cores).
    pub max_concurrent: Option<u32>,
    /// HTTP: how long the server's pushback may keep one call waiting (default 600).
    pub max_wait_seconds: Option<f64>,
    /// HTTP: models with limits of their own (`requests_per_minute`, `tokens_per_minute`,
    /// `max_concurrent`).
    pub model_limits: Option<BTreeMap<String, ModelLimitsConfig>>,
    /// CLI: the preset (`claude`, `codex`, `copilot`, `gemini`, `generic`).
    pub preset: Option<String>,
    /// CLI: the command template (replaces the preset's).
    pub command: Option<Vec<String>>,
    /// CLI: arguments added when a model is known (`{model}` replaced).
    pub model_args: Option<Vec<String>>,
    /// CLI: the working directory (default: a fresh scratch directory per spawn under the
    /// sandbox, the host's working directory without it). Under the sandbox it is mounted
    /// writable: naming one grants the agent write access to it.
    pub cwd: Option<PathBuf>,
    /// CLI: `bwrap` (the default: bubblewrap) or `none` (unsandboxed: the agent runs as you,
    /// with your files).
    pub sandbox: Option<String>,
    /// CLI: home-relative (or absolute) paths the sandboxed agent may write (default: the
    /// preset's config directories).
    pub sandbox_writable: Option<Vec<PathBuf>>,
    /// CLI: home-relative (or absolute) paths hidden from the sandboxed agent, besides the
    /// built-in list.
    pub sandbox_hide: Option<Vec<PathBuf>>,
    /// CLI: the tools the agent may use (the preset's flag, e.g. claude `--allowedTools`).
    pub allowed_tools: Option<Vec<String>>,
    /// CLI: the tools the agent may not use (e.g. claude `--disallowedTools`).
    pub disallowed_tools: Option<Vec<String>>,
    /// CLI: the flag `allowed_tools` is passed with (default: the preset's).
    pub allowed_tools_flag: Option<String>,
    /// CLI: the flag `disallowed_tools` is passed with (default: the preset's).
    pub disallowed_tools_flag: Option<String>,
    /// CLI: environment variables passed through besides PATH and HOME.
    pub env: Option<Vec<String>>,
    /// CLI: seconds between SIGTERM and SIGKILL.
    pub grace_seconds: Option<f64>,
    /// CLI: the flag a call's `maxTurns` is passed with as `FLAG=N` (default: the preset's;
    /// claude `--max-turns`).
    pub turns_flag: Option<String>,
    /// CLI: the flag a call's `agent` is passed with as `FLAG=NAME` (default: the preset's;
    /// claude and copilot `--agent`; without one the option is ignored).
    pub agent_flag: Option<String>,
    /// CLI: `none` (the default) or `stdin`: the CLI reads one JSON string per stdin line and
    /// takes a wrap-up prompt there when a call's `maxDurationSeconds` is up.
    pub wrap_up: Option<String>,
    /// CLI: seconds the CLI has to answer after the wrap-up prompt (default 30).
    pub wrap_up_seconds: Option<f64>,
    /// CLI: `text` or `json` (with `json` paths, or the preset's).
    pub output: Option<String>,
    /// CLI: JSON output paths.
    pub json: Option<JsonOutput>,
    /// CLI: credits per unit of the cost the CLI reports (`json.cost`), e.g. credits per USD
    /// for Claude Code's `total_cost_usd` (default 1).
    pub cost_credits: Option<Amount>,
    /// Script: the script file.
    pub path: Option<PathBuf>,
}

/// A model's own limits (`[backends.NAME.model_limits."MODEL"]`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelLimitsConfig {
    /// Requests per minute.
    pub requests_per_minute: Option<f64>,
    /// Tokens per minute.
    pub tokens_per_minute: Option<f64>,
    /// Calls in flight at once.
    pub max_concurrent: Option<u32>,
}

/// The flow limits an entry configures (rates must be positive and finite).
fn flow_limits(name: &str, entry: &BackendConfig) -> Result<FlowLimits, ConfigError> {
    let invalid = |message: String| ConfigError::Invalid { name: name.into(), message };
    let rate = |key: &str, value: Option<f64>| match value {
        Some(v) if !(v.is_finite() && v > 0.0) => Err(invalid(format!("{key} = {v}: expected a positive number"))),
        other => Ok(other),
    };
    let concurrent = |key: &str, value: Option<u32>| match value {
        Some(0) => Err(invalid(format!("{key} = 0: expected a positive whole number"))),
        other => Ok(other),
    };
    let mut models = BTreeMap::new();
    for (model, own) in entry.model_limits.iter().flatten() {
        models.insert(
            model.clone(),
            FlowLimits {
                requests_per_minute: rate(
                    &format!("model_limits.{model}.requests_per_minute"),
                    own.requests_per_minute,
                )?,
                tokens_per_minute: rate(&format!("model_limits.{model}.tokens_per_minute"), own.tokens_per_minute)?,
                max_concurrent: concurrent(&format!("model_limits.{model}.max_concurrent"), own.max_concurrent)?,
                max_wait: None,
                fixed: false,
                models: BTreeMap::new(),
            },
        );
    }
    let max_wait = entry.max_wait_seconds.map(|s| secs(name, "max_wait_seconds", s)).transpose()?;
    for own in models.values_mut() {
        own.max_wait = max_wait;
    }
    Ok(FlowLimits {
        requests_per_minute: rate("requests_per_minute", entry.requests_per_minute)?,
        tokens_per_minute: rate("tokens_per_minute", entry.tokens_per_minute)?,
        max_concurrent: concurrent("max_concurrent", entry.max_concurrent)?,
        max_wait,
        fixed: false,
        models,
    })
}

/// One `[[routes]]` entry.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// An exact model name, or a prefix ending in `*`.
    pub model: String,
    /// The backend that takes matching calls.
    pub backend: String,
    /// The model name sent to it (default: the requested one).
    #[serde(rename = "as")]
    pub target: Option<String>,
}

/// A parsed `factory.toml`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The file it was read from (absolute), if any: hidden from agent-CLI sandboxes, as the
    /// state and config directories are ([`BackendCatalog::hidden_files`]).
    #[serde(skip)]
    pub source: Option<PathBuf>,
    /// The backend used when `--backend` is not given.
    pub default: Option<String>,
    /// Named backends.
    #[serde(default)]
    pub backends: BTreeMap<String, BackendConfig>,
    /// Model routes, tried in order.
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
    /// Prices that override and extend the built-in price table.
    #[serde(default)]
    pub prices: PricesConfig,
    /// The shared store `factory serve` and `factory workers` use when neither `--store`
    /// nor `FACTORY_STORE` names one (a postgres:// URL; any password in it is never shown).
    pub store: Option<String>,
    /// `factory serve --max-runs` when the flag is not given (read by [`Config::serve`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_runs: Option<toml::Value>,
    /// `factory serve --cluster-max-runs` when the flag is not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_max_runs: Option<toml::Value>,
    /// `factory serve --backend-max-calls`, a table of backend name to cap, for the backends
    /// no flag names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_max_calls: Option<toml::Value>,
    /// `factory serve --drain-seconds` when the flag is not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_seconds: Option<toml::Value>,
    /// `factory serve --max-recoveries` when the flag is not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_recoveries: Option<toml::Value>,
    /// `factory serve --allow-grant-root`, a list of directories, added to the flags'.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_grant_roots: Option<toml::Value>,
    /// `[retention]`: which ended runs `factory gc`, and `factory serve` on a schedule, delete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<RetentionConfig>,
    /// The six keys above, checked when the file was parsed.
    #[serde(skip)]
    pub serve: ServeSettings,
}

/// `[retention]` of a config file: the policy ([`crate::model::retention::Retention`]) and how
/// often `factory serve` applies it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionConfig {
    /// Keep runs updated in the last `keep_days` days.
    pub keep_days: Option<u32>,
    /// Keep the newest `keep_last` runs of each factory.
    pub keep_last: Option<u32>,
    /// Seconds between two passes of `factory serve`'s collector (default
    /// [`crate::model::retention::DEFAULT_GC_INTERVAL_SECONDS`], at least 1).
    pub interval_seconds: Option<u64>,
}

impl RetentionConfig {
    /// The policy.
    pub fn policy(&self) -> crate::model::retention::Retention {
        crate::model::retention::Retention { keep_days: self.keep_days, keep_last: self.keep_last }
    }

    /// The time between two passes of the service's collector.
    pub fn interval(&self) -> std::time::Duration {
        std::time::Duration::from_secs(
            self.interval_seconds.unwrap_or(crate::model::retention::DEFAULT_GC_INTERVAL_SECONDS).max(1),
        )
    }
}

/// The settings of `factory serve` a config file may hold (its top-level keys `max_runs`,
/// `cluster_max_runs`, `backend_max_calls`, `drain_seconds`, `max_recoveries`,
/// `allow_grant_roots`), checked
/// ([`Config::serve`]); a flag given on the command line wins over each.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServeSettings {
    /// `max_runs`: runs this worker executes at once from the queue.
    pub max_runs: Option<usize>,
    /// `cluster_max_runs`: runs owned across the cluster.
    pub cluster_max_runs: Option<usize>,
    /// `backend_max_calls`: agent calls in flight at once across the cluster, per backend.
    pub backend_max_calls: BTreeMap<String, u32>,
    /// `drain_seconds`: how long a draining worker lets its runs go on.
    pub drain_seconds: Option<f64>,
    /// `max_recoveries`: automatic recoveries per run.
    pub max_recoveries: Option<u32>,
    /// `allow_grant_roots`: directories under which the worker mounts the grants of runs it
    /// executes without a caller of its own (absolute paths).
    pub allow_grant_roots: Vec<std::path::PathBuf>,
}

/// A `factory serve` setting of the config file that has a bad value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid config `{path}`: `{key}` {expected}, not {found}")]
pub struct SettingError {
    /// The config file.
    pub path: String,
    /// The key (`backend_max_calls.NAME` for one backend's cap).
    pub key: String,
    /// What the key takes.
    pub expected: &'static str,
    /// What the file holds there, as TOML.
    pub found: String,
}

fn whole(path: &str, key: &str, value: &toml::Value, least: i64, expected: &'static str) -> Result<i64, SettingError> {
    match value.as_integer() {
        Some(n) if n >= least && n <= i64::from(u32::MAX) => Ok(n),
        _ => Err(SettingError { path: path.into(), key: key.into(), expected, found: value.to_string() }),
    }
}

impl Config {
    /// The `factory serve` settings of this file (`path` names it in errors), checked.
    fn serve_settings(&self, path: &str) -> Result<ServeSettings, SettingError> {
        let mut settings = ServeSettings::default();
        if let Some(value) = &self.max_runs {
            settings.max_runs = Some(whole(path, "max_runs", value, 0, "takes a whole number, 0 or more")? as usize);
        }
        if let Some(value) = &self.cluster_max_runs {
            settings.cluster_max_runs =
                Some(whole(path, "cluster_max_runs", value, 0, "takes a whole number, 0 or more")? as usize);
        }
        if let Some(value) = &self.backend_max_calls {
            let expected =
                "takes a table of backend names to positive whole numbers (backend_max_calls = { openai = 8 })";
            let table = value.as_table().ok_or_else(|| SettingError {
                path: path.into(),
                key: "backend_max_calls".into(),
                expected,
                found: value.to_string(),
            })?;
            for (name, cap) in table {
                let key = format!("backend_max_calls.{name}");
                settings
                    .backend_max_calls
                    .insert(name.clone(), whole(path, &key, cap, 1, "takes a positive whole number")? as u32);
            }
        }
        if let Some(value) = &self.drain_seconds {
            let seconds = value.as_float().or_else(|| value.as_integer().map(|n| n as f64));
            match seconds {
                Some(s) if s.is_finite() && (0.0..=1e6).contains(&s) => settings.drain_seconds = Some(s),
                _ => {
                    return Err(SettingError {
                        path: path.into(),
                        key: "drain_seconds".into(),
                        expected: "takes a number of seconds from 0 to 1000000",
                        found: value.to_string(),
                    })
                }
            }
        }
        if let Some(value) = &self.max_recoveries {
            settings.max_recoveries =
                Some(whole(path, "max_recoveries", value, 1, "takes a whole number, 1 or more")? as u32);
        }
        if let Some(value) = &self.allow_grant_roots {
            let refused = || SettingError {
                path: path.into(),
                key: "allow_grant_roots".into(),
                expected: "takes a list of absolute directory paths (allow_grant_roots = [\"/srv/data\"])",
                found: value.to_string(),
            };
            for root in value.as_array().ok_or_else(refused)? {
                match root.as_str().map(std::path::PathBuf::from) {
                    Some(root) if root.is_absolute() => settings.allow_grant_roots.push(root),
                    _ => return Err(refused()),
                }
            }
        }
        Ok(settings)
    }
}

/// The config file's name in the state directory.
pub const CONFIG_FILE: &str = "factory.toml";

/// The project directory (relative to the working directory) whose `factory.toml` is
/// discovered, and used once allowed.
pub const PROJECT_DIR: &str = ".factory";

fn secs(name: &str, what: &str, value: f64) -> Result<Duration, ConfigError> {
    Duration::try_from_secs_f64(value).map_err(|_| ConfigError::Invalid {
        name: name.into(),
        message: format!("{what} must be a non-negative number"),
    })
}

impl Config {
    /// Parse TOML text; `path` names it in errors.
    pub fn parse(text: &str, path: &str) -> Result<Self, ConfigError> {
        let mut config: Config =
            toml::from_str(text).map_err(|source| ConfigError::Toml { path: path.into(), source })?;
        if let Some(name) = config.backends.keys().find(|name| is_reserved_name(name)) {
            return Err(ConfigError::Reserved { path: path.into(), name: name.clone() });
        }
        if let Some(store) = &config.store {
            if !crate::store::postgres::is_postgres_url(store) {
                return Err(ConfigError::Parse {
                    path: path.into(),
                    message: format!(
                        "`store` must be a postgres:// URL, not {}",
                        crate::store::postgres::redact(store)
                    ),
                });
            }
        }
        config.serve = config.serve_settings(path)?;
        for route in &config.routes {
            if !config.backends.contains_key(&route.backend) && !backend::is_builtin_spec(&route.backend) {
                return Err(ConfigError::Parse {
                    path: path.into(),
                    message: format!("route `{}` names backend `{}`, which is not defined", route.model, route.backend),
                });
            }
        }
        Ok(config)
    }

    /// Read and parse a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: shown.clone(), source })?;
        let mut config = Config::parse(&text, &shown)?;
        config.source = std::path::absolute(path).ok();
        Ok(config)
    }

    /// The config at `explicit` (which must exist), else the first file that exists of
    /// `<state_dir>/factory.toml`, `./.factory/factory.toml` and the user's
    /// `<config-dir>/factory.toml`, else none. The file must be owned by the user and not
    /// writable by others; a discovered project-local file must have been approved with
    /// `factory config allow` ([`ConfigError::NotAllowed`] otherwise).
    pub fn discover(explicit: Option<&Path>, state_dir: &Path) -> Result<Option<Self>, ConfigError> {
        if let Some(path) = explicit {
            return Config::load_checked(path, false).map(Some);
        }
        match Config::discover_path(state_dir) {
            Some(path) => Config::load_checked(&path, crate::access::is_project_local(&path)).map(Some),
            None => Ok(None),
        }
    }

    /// The file [`Config::discover`] would read without `--config`, if any exists.
    pub fn discover_path(state_dir: &Path) -> Option<PathBuf> {
        let mut candidates = vec![state_dir.join(CONFIG_FILE), Path::new(PROJECT_DIR).join(CONFIG_FILE)];
        if let Ok(dir) = crate::access::user_config_dir() {
            candidates.push(dir.join(CONFIG_FILE));
        }
        candidates.into_iter().find(|path| path.is_file())
    }

    /// Read `path` once, check its owner and mode, and (when `project_local`) that these
    /// exact bytes were allowed; then parse them.
    fn load_checked(path: &Path, project_local: bool) -> Result<Self, ConfigError> {
        use std::io::Read;
        let shown = path.display().to_string();
        let read = |source| ConfigError::Read { path: shown.clone(), source };
        let mut file = std::fs::File::open(path).map_err(read)?;
        let meta = file.metadata().map_err(read)?;
        crate::access::check_owned_private(&meta).map_err(|problem| {
            ConfigError::Access(crate::access::AccessError::Unsafe { path: shown.clone(), problem })
        })?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(read)?;
        if project_local {
            let sha256 = crate::access::sha256_hex(&bytes);
            if !crate::access::AllowList::user()?.is_allowed(path, &sha256)? {
                return Err(ConfigError::NotAllowed { path: shown, sha256 });
            }
        }
        let text = String::from_utf8(bytes).map_err(|source| ConfigError::NotUtf8 { path: shown.clone(), source })?;
        let mut config = Config::parse(&text, &shown)?;
        config.source = std::path::absolute(path).ok();
        Ok(config)
    }

    /// The price tables: the built-in one of each provider with this config's `[prices]`
    /// entries over it (an entry of the same model replaces the built-in price).
    pub fn price_tables(&self) -> Result<PriceTables, ConfigError> {
        let mut tables = PriceTables::builtin();
        for (provider, entries) in
            [(Provider::OpenAi, &self.prices.openai), (Provider::Anthropic, &self.prices.anthropic)]
        {
            for (model, price) in entries {
                let price = price.price().map_err(|source| ConfigError::Price {
                    name: format!("[prices.{}] model `{model}`", provider.as_str()),
                    source,
                })?;
                tables.get_mut(provider).insert(model.clone(), price);
            }
        }
        Ok(tables)
    }

    /// Build the backend called `name`: a configured one, else a built-in spelling. `model`
    /// (e.g. `--model`) replaces its default model.
    pub fn backend(&self, name: &str, model: Option<&str>) -> Result<Arc<dyn AgentBackend>, ConfigError> {
        let tables = self.price_tables()?;
        match self.backends.get(name) {
            Some(entry) => build(name, entry, model, &tables),
            None => Ok(backend::from_spec_priced(name, model, &tables)?),
        }
    }

    /// The backend of a run: `selected` (`--backend`), else the config's default, else
    /// `dry-run`; wrapped in a [`Router`] when routes are configured. Each backend is built
    /// once, so routes to one name share it. Its [`AgentBackend::reference`] names it with
    /// `model` and [`Config::identity`].
    pub fn run_backend(
        &self,
        selected: Option<&str>,
        model: Option<&str>,
    ) -> Result<Arc<dyn AgentBackend>, ConfigError> {
        let name = selected.or(self.default.as_deref()).unwrap_or("dry-run");
        let backend = self.routed_backend(name, model)?;
        let spec = backend.reference().name;
        let reference = BackendRef {
            name: if self.backends.contains_key(name) { name.to_string() } else { spec },
            model: model.map(str::to_string),
            config: self.identity(name),
            key_env: None,
        };
        Ok(Arc::new(Identified::new(backend, reference)))
    }

    /// A fingerprint (sha256) of what this config says about backend `name`: its entry and
    /// the routes with the entries they name. `None` when the config says nothing of it.
    /// Secrets never enter it (the config holds variable names, not keys).
    pub fn identity(&self, name: &str) -> Option<String> {
        let entry = self.backends.get(name);
        if entry.is_none() && self.routes.is_empty() {
            return None;
        }
        let routed: BTreeMap<&str, Option<&BackendConfig>> =
            self.routes.iter().map(|r| (r.backend.as_str(), self.backends.get(&r.backend))).collect();
        let text = serde_json::to_string(&(name, entry, &self.routes, routed)).ok()?;
        Some(hex::encode(Sha256::digest(text.as_bytes())))
    }

    fn routed_backend(&self, name: &str, model: Option<&str>) -> Result<Arc<dyn AgentBackend>, ConfigError> {
        let default = self.backend(name, model)?;
        if self.routes.is_empty() {
            return Ok(default);
        }
        let mut built: HashMap<String, Arc<dyn AgentBackend>> = HashMap::new();
        built.insert(name.to_string(), default.clone());
        let mut routes = Vec::new();
        for route in &self.routes {
            let backend = match built.get(&route.backend) {
                Some(b) => b.clone(),
                None => {
                    let b = self.backend(&route.backend, None)?;
                    built.insert(route.backend.clone(), b.clone());
                    b
                }
            };
            routes.push(Route { pattern: route.model.clone(), backend, model: route.target.clone() });
        }
        Ok(Arc::new(Router::new(default, routes)))
    }
}

impl BackendCatalog for Config {
    fn build(&self, reference: &BackendRef) -> Result<Arc<dyn AgentBackend>, BackendUnavailable> {
        self.run_backend(Some(&reference.name), reference.model.as_deref())
            .map_err(|e| BackendUnavailable { backend: reference.display(), missing: Unbuilt::failed(e) })
    }

    fn default_name(&self) -> Option<String> {
        self.default.clone()
    }

    fn hidden_files(&self) -> Vec<PathBuf> {
        self.source.iter().cloned().collect()
    }
}

/// Build one configured backend.
fn build(
    name: &str,
    entry: &BackendConfig,
    model: Option<&str>,
    tables: &PriceTables,
) -> Result<Arc<dyn AgentBackend>, ConfigError> {
    let invalid = |message: String| ConfigError::Invalid { name: name.into(), message };
    let unusable = |source: BackendSpecError| ConfigError::Backend { name: name.into(), source };
    let pricing = entry
        .pricing
        .as_ref()
        .map(PricingConfig::pricing)
        .transpose()
        .map_err(|source| ConfigError::Price { name: name.into(), source })?
        .unwrap_or_default();
    let model = model.map(str::to_string).or_else(|| entry.model.clone());
    let mut retry = backend::RetryPolicy::default();
    if let Some(t) = entry.timeout_seconds {
        retry.timeout = secs(name, "timeout_seconds", t)?;
    }
    if let Some(n) = entry.max_retries {
        retry.max_retries = n;
    }
    if let Some(ms) = entry.retry_base_ms {
        retry.base_delay = Duration::from_millis(ms);
    }
    let key = |default_var: &str| {
        let var = entry.api_key_env.clone().unwrap_or_else(|| default_var.to_string());
        let key = std::env::var(&var).ok().filter(|k| !k.trim().is_empty());
        (var, key)
    };
    let backend: Arc<dyn AgentBackend> = match entry.kind {
        BackendKind::DryRun => Arc::new(backend::DryRun),
        BackendKind::Script => {
            let path = entry.path.as_ref().ok_or_else(|| invalid("a `script` backend needs `path`".into()))?;
            Arc::new(Script::from_file(path).map_err(|e| unusable(e.into()))?)
        }
        BackendKind::OpenAi => {
            let from_env = OpenAiConfig::from_env();
            let (api_key_var, api_key) = key("OPENAI_API_KEY");
            let structured = match entry.structured_output.as_deref() {
                None | Some("json_schema") => StructuredMode::JsonSchema,
                Some("json_object") => StructuredMode::JsonObject,
                Some("plain") => StructuredMode::Plain,
                Some(other) => {
                    return Err(invalid(format!(
                        "structured_output `{other}`: expected json_schema, json_object or plain"
                    )))
                }
            };
            let config = OpenAiConfig {
                name: name.into(),
                base_url: entry.base_url.clone().unwrap_or(from_env.base_url).trim_end_matches('/').to_string(),
                api_key,
                api_key_var,
                model,
                system_prompt: entry.system_prompt.clone(),
                max_tokens: entry.max_tokens,
                structured,
                pricing: pricing.with_table(tables.get(Provider::OpenAi)),
                retry,
                flow: flow_limits(name, entry)?,
            };
            Arc::new(OpenAi::new(config).map_err(|e| unusable(e.into()))?)
        }
        BackendKind::Anthropic => {
            let from_env = AnthropicConfig::from_env();
            let (api_key_var, api_key) = key("ANTHROPIC_API_KEY");
            let use_tool = match entry.structured_output.as_deref() {
                None | Some("tool") => true,
                Some("plain") => false,
                Some(other) => return Err(invalid(format!("structured_output `{other}`: expected tool or plain"))),
            };
            let config = AnthropicConfig {
                name: name.into(),
                base_url: entry.base_url.clone().unwrap_or(from_env.base_url).trim_end_matches('/').to_string(),
                api_key,
                api_key_var,
                model,
                system_prompt: entry.system_prompt.clone(),
                max_tokens: entry.max_tokens.unwrap_or(from_env.max_tokens),
                use_tool,
                pricing: pricing.with_table(tables.get(Provider::Anthropic)),
                retry,
                flow: flow_limits(name, entry)?,
            };
            Arc::new(Anthropic::new(config).map_err(|e| unusable(e.into()))?)
        }
        BackendKind::Cli => {
            let preset = entry.preset.as_deref().unwrap_or("generic");
            let mut config = AgentCliConfig::preset(preset).map_err(|e| unusable(e.into()))?;
            config.name = name.into();
            config.model = model;
            config.pricing = pricing;
            if let Some(amount) = &entry.cost_credits {
                config.credits_per_cost_nano =
                    amount.nano().map_err(|source| ConfigError::CostCredits { name: name.into(), source })?;
            }
            if let Some(command) = &entry.command {
                config.command = command.clone();
            }
            if let Some(args) = &entry.model_args {
                config.model_args = args.clone();
            }
            config.cwd = entry
                .cwd
                .as_ref()
                .map(|dir| {
                    // Absolute and canonical, so the sandbox mounts the directory that was meant.
                    std::fs::canonicalize(dir).or_else(|_| std::path::absolute(dir)).map_err(|source| {
                        ConfigError::Cwd { name: name.into(), path: dir.display().to_string(), source }
                    })
                })
                .transpose()?;
            config.sandbox = match entry.sandbox.as_deref() {
                None | Some("bwrap") | Some("bubblewrap") => SandboxMode::Bubblewrap,
                Some("none") => SandboxMode::None,
                Some(other) => return Err(invalid(format!("sandbox `{other}`: expected bwrap or none"))),
            };
            if let Some(paths) = &entry.sandbox_writable {
                config.writable = paths.clone();
            }
            if let Some(paths) = &entry.sandbox_hide {
                config.hidden = paths.clone();
            }
            if let Some(tools) = &entry.allowed_tools {
                config.allowed_tools = tools.clone();
            }
            if let Some(tools) = &entry.disallowed_tools {
                config.disallowed_tools = tools.clone();
            }
            if let Some(flag) = &entry.allowed_tools_flag {
                config.tool_flags.allowed = Some(flag.clone());
            }
            if let Some(flag) = &entry.disallowed_tools_flag {
                config.tool_flags.disallowed = Some(flag.clone());
            }
            if let Some(env) = &entry.env {
                config.env = env.clone();
            }
            if let Some(t) = entry.timeout_seconds {
                config.timeout = Some(secs(name, "timeout_seconds", t)?);
            }
            if let Some(g) = entry.grace_seconds {
                config.grace = secs(name, "grace_seconds", g)?;
            }
            if let Some(flag) = &entry.turns_flag {
                config.turns_flag = Some(flag.clone());
            }
            if let Some(flag) = &entry.agent_flag {
                config.agent_flag = Some(flag.clone());
            }
            config.wrap_up = match entry.wrap_up.as_deref() {
                None | Some("none") => WrapUp::None,
                Some("stdin") => WrapUp::Stdin,
                Some(other) => return Err(invalid(format!("wrap_up `{other}`: expected none or stdin"))),
            };
            if let Some(g) = entry.wrap_up_seconds {
                config.wrap_up_grace = secs(name, "wrap_up_seconds", g)?;
            }
            if entry.max_concurrent == Some(0) {
                return Err(invalid("max_concurrent = 0: expected a positive whole number".into()));
            }
            config.max_concurrent = entry.max_concurrent;
            if let Some(p) = &entry.json {
                config.output = OutputMode::Json(p.clone());
            }
            match entry.output.as_deref() {
                None => {}
                Some("text") => config.output = OutputMode::Text,
                Some("json") if matches!(config.output, OutputMode::Json(_)) => {}
                Some("json") => return Err(invalid("`output = \"json\"` needs a `[json]` table of paths".into())),
                Some(other) => return Err(invalid(format!("output `{other}`: expected text or json"))),
            }
            Arc::new(AgentCli::new(config).map_err(|e| unusable(e.into()))?)
        }
    };
    Ok(backend)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"
        default = "local"
        [backends.local]
        kind = "openai"
        base_url = "http://127.0.0.1:9/v1/"
        model = "small"
        [backends.local.pricing]
        input = 0.5
        output = "0.000000001"
        models = { big = { input = 2, output = 3 } }
        [backends.agent]
        kind = "cli"
        command = ["sh", "-c", "cat"]
        env = ["MY_VAR"]
        timeout_seconds = 2.5
        [[routes]]
        model = "fast*"
        backend = "agent"
        as = "x"
    "#;

    #[test]
    fn parses_prices_exactly_and_builds_named_backends() {
        let config = Config::parse(SAMPLE, "t").unwrap();
        let pricing = config.backends["local"].pricing.as_ref().unwrap().pricing().unwrap();
        assert_eq!(pricing.default, Some(Price::new(500_000_000, 1)));
        assert_eq!(pricing.price("big"), Some(Price::new(2_000_000_000, 3_000_000_000)));
        assert_eq!(config.backend("local", None).unwrap().name(), "local");
        assert_eq!(config.backend("agent", None).unwrap().name(), "agent");
        // Built-in spellings still work next to configured names.
        assert_eq!(config.backend("dry-run", None).unwrap().name(), "dry-run");
        assert_eq!(config.run_backend(None, None).unwrap().name(), "local");
        assert!(matches!(config.backend("nope", None), Err(ConfigError::Spec(_))));
    }

    #[test]
    fn rejects_unknown_fields_kinds_and_dangling_routes() {
        assert!(Config::parse("defualt = \"x\"", "t").is_err());
        // An unknown kind is refused as the file is read, naming the kinds there are.
        let Err(e) = Config::parse("[backends.a]\nkind = \"telepathy\"", "t") else {
            panic!("a backend of an unknown kind was read")
        };
        assert!(e.to_string().contains("telepathy") && e.to_string().contains("dry-run"), "{e}");
        for kind in
            [BackendKind::OpenAi, BackendKind::Anthropic, BackendKind::Cli, BackendKind::DryRun, BackendKind::Script]
        {
            let text = format!("[backends.a]\nkind = \"{kind}\"");
            let config = Config::parse(&text, "t").unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(config.backends["a"].kind, kind);
        }
        for name in ["openai", "dry-run", "dry", "anthropic", "cli:claude", "cli:mine", "script:x"] {
            let text = format!("[backends.\"{name}\"]\nkind = \"cli\"\ncommand = [\"sh\"]");
            let e = Config::parse(&text, "t").expect_err(name);
            assert!(matches!(e, ConfigError::Reserved { .. }) && e.to_string().contains(name), "{e}");
        }
        let dangling = "[[routes]]\nmodel = \"m\"\nbackend = \"ghost\"";
        assert!(Config::parse(dangling, "t").unwrap_err().to_string().contains("ghost"));
        let bad_price = Config::parse("[backends.a]\nkind = \"openai\"\npricing = { input = -1.0 }", "t").unwrap();
        let Err(e) = bad_price.backend("a", None) else { panic!("a negative price was taken") };
        assert!(matches!(&e, ConfigError::Price { source: PriceError::Credits(_), .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            "backend `a`: `-1` is not a non-negative decimal amount of credits (at most 9 decimal places)"
        );
        let model_price =
            Config::parse("[backends.a]\nkind = \"openai\"\n[backends.a.pricing.models.m]\ninput = \"x\"", "t")
                .unwrap();
        let Err(e) = model_price.backend("a", None) else { panic!("a price of `x` was taken") };
        assert!(
            matches!(&e, ConfigError::Price { source: PriceError::Model { model, .. }, .. } if model == "m"),
            "{e:?}"
        );
        // A backend that cannot be set up keeps why as its source (here the script's read error).
        let no_script =
            Config::parse("[backends.s]\nkind = \"script\"\npath = \"/nonexistent/factory/rules.json\"", "t").unwrap();
        let Err(e) = no_script.backend("s", None) else { panic!("a missing script was taken") };
        let read = matches!(
            &e,
            ConfigError::Backend { source: BackendSpecError::Script(crate::backend::ScriptError::Read { .. }), .. }
        );
        assert!(read, "{e:?}");
        let source = std::error::Error::source(&e).map(ToString::to_string).unwrap_or_default();
        assert_eq!(e.to_string(), format!("backend `s`: {source}"));
        // A recorded backend that cannot be built again keeps why as its source too.
        let Err(unavailable) = BackendCatalog::build(&no_script, &BackendRef::named("s")) else {
            panic!("a missing script was built")
        };
        let why = std::error::Error::source(&unavailable).and_then(|s| s.downcast_ref::<ConfigError>());
        assert!(matches!(why, Some(ConfigError::Backend { .. })), "{unavailable:?}");
        assert_eq!(unavailable.to_string(), format!("backend_unavailable: backend `s` cannot be used: {e}"));
    }

    #[test]
    fn a_json_table_gives_the_cli_its_output_paths_and_refuses_unknown_keys() {
        let text = "[backends.a]\nkind = \"cli\"\ncommand = [\"sh\"]\noutput = \"json\"\n\
                    [backends.a.json]\ntext = \"result\"\ninput_tokens = \"/usage/in\"\nstop_reason = \"subtype\"";
        let config = Config::parse(text, "t").unwrap();
        let json = config.backends["a"].json.as_ref().unwrap();
        assert_eq!(json.text, "result");
        assert_eq!(json.input_tokens.as_deref(), Some("/usage/in"));
        assert_eq!(json.stop_reason.as_deref(), Some("subtype"));
        assert_eq!(json.output_tokens, None);
        assert!(config.backend("a", None).is_ok());
        let typo = text.replace("input_tokens", "input_tokenz");
        let e = Config::parse(&typo, "t").unwrap_err();
        assert!(e.to_string().contains("input_tokenz"), "{e}");
    }
}
