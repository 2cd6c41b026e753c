//! Choosing who answers subagents: the backend options `run` and `resume` share
//! ([`BackendArgs`]: `--backend`, `--model`, `--config`, `--record`, `--replay`,
//! `--replay-then-live`) and how they become one backend, and the `factory backends`
//! subcommand that lists the configured and built-in backends or checks one with a tiny call.

use crate::doors::args::GlobalArgs;
use crate::doors::cli::escape::esc;
use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use factory_host::backend::cassette::read_tape;
use factory_host::backend::{self, AgentBackend, AgentRequest, BackendRef, Cassette};
use factory_host::config::{BackendKind, Config, CONFIG_FILE};
use factory_host::service::Tape;
use factory_host::BackendChoice;
use serde_json::json;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

/// Who runs subagents, shared by `run` and `resume` (serializable: a detached or remote
/// run sends them to the process that holds the store).
#[derive(Args, Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct BackendArgs {
    /// Who runs subagents: `dry-run` (offline, deterministic; the default without a config),
    /// `script:FILE`, `openai` (OPENAI_BASE_URL, OPENAI_API_KEY), `anthropic`
    /// (ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY), `cli:claude|codex|copilot|gemini`, or a
    /// backend named in factory.toml (default: the config's `default`).
    #[arg(long, value_name = "SPEC")]
    pub backend: Option<String>,
    /// The model for calls that name none.
    #[arg(long, value_name = "MODEL")]
    pub model: Option<String>,
    /// The backend config file (default: factory.toml in the state directory, if present).
    #[arg(long, env = "FACTORY_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Record every agent exchange of the run to this cassette file (overwritten).
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// Serve agent calls from this cassette: no live backend is called; a miss fails.
    #[arg(long, value_name = "FILE")]
    pub replay: Option<PathBuf>,
    /// With --replay: calls the cassette does not hold go to the live backend.
    #[arg(long, requires = "replay")]
    pub replay_then_live: bool,
}

impl BackendArgs {
    /// `--backend` and `--model`, as every front door names a backend.
    pub fn choice(&self) -> BackendChoice {
        BackendChoice { name: self.backend.clone(), model: self.model.clone() }
    }

    /// Whether a cassette wraps the backend (`--record`, `--replay`).
    pub fn cassette(&self) -> bool {
        self.record.is_some() || self.replay.is_some()
    }

    /// The choice to send to the process that holds the store, which builds backends from
    /// its own configuration and never writes or reads a file a client names (a cassette
    /// goes as [`BackendArgs::sent_tape`]; a recording comes back on the follow stream and is
    /// written here, so it cannot be `detach`ed).
    pub fn remote_choice(&self, detach: bool) -> Result<BackendChoice> {
        if self.record.is_some() && detach {
            anyhow::bail!(
                "--record writes the cassette here when the run ends, so it follows the run: it cannot be used \
                 with --detach"
            );
        }
        if self.config.is_some() {
            eprintln!(
                "factory: the process holding the store uses its own backend configuration; --config is not sent"
            );
        }
        let mut choice = self.choice();
        // A script's path is the caller's: the serving process runs in another directory.
        if let Some(file) = choice.name.as_deref().and_then(|name| name.strip_prefix("script:")) {
            let file = std::path::absolute(file).with_context(|| format!("cannot resolve script `{file}`"))?;
            choice.name = Some(format!("script:{}", file.display()));
        }
        Ok(choice)
    }
}

impl BackendArgs {
    /// `--replay FILE` as the process holding the store gets it: the file read here, as the
    /// caller, bounded as a local replay reads it ([`read_tape`]), and sent with the start
    /// (the service checks each entry against its key again and never opens the file).
    pub fn sent_tape(&self) -> Result<Option<Tape>> {
        let Some(file) = &self.replay else { return Ok(None) };
        if self.backend.is_some() && !self.replay_then_live {
            eprintln!("factory: --replay serves every call from the cassette; --backend is not used");
        }
        let entries = read_tape(file)?;
        Ok(Some(Tape { shown: file.clone(), entries, then_live: self.replay_then_live }))
    }
}

/// Load the config the options point at (or the state directory's), if any.
pub fn load_config(g: &GlobalArgs, explicit: Option<&PathBuf>) -> Result<Config> {
    let config = Config::discover(explicit.map(PathBuf::as_path), &g.state_dir)?;
    Ok(config.unwrap_or_default())
}

/// The backend of a run recorded or replayed through a cassette (`None` without
/// `--record`/`--replay`: the host builds it from the choice). On resume `recorded` is the
/// run's backend, which the cassette wraps unless `--backend` names another.
pub fn cassette_backend(
    config: &Config,
    a: &BackendArgs,
    recorded: Option<&BackendRef>,
) -> Result<Option<Arc<dyn AgentBackend>>> {
    if !a.cassette() {
        return Ok(None);
    }
    run_backend(config, a, recorded).map(Some)
}

/// The backend `a` selects in `config` (for a resume, `recorded` fills in what `a` leaves
/// out), wrapped in a cassette when recording or replaying.
pub fn run_backend(config: &Config, a: &BackendArgs, recorded: Option<&BackendRef>) -> Result<Arc<dyn AgentBackend>> {
    let name = a.backend.as_deref().or(recorded.map(|r| r.name.as_str()));
    let model = a.model.as_deref().or(recorded.filter(|_| a.backend.is_none()).and_then(|r| r.model.as_deref()));
    let live = || -> Result<Arc<dyn AgentBackend>> { Ok(config.run_backend(name, model)?) };
    let cassette = match (&a.replay, a.replay_then_live) {
        (Some(file), false) => {
            if a.backend.is_some() {
                eprintln!("factory: --replay serves every call from the cassette; --backend is not used");
            }
            Some(Cassette::replay(file)?)
        }
        (Some(file), true) => Some(Cassette::replay_then_live(file, live()?)?),
        (None, _) => None,
    };
    let cassette = match (cassette, &a.record) {
        (Some(c), Some(out)) => Some(c.recording_to(out)?),
        (None, Some(out)) => Some(Cassette::record(live()?, out)?),
        (c, None) => c,
    };
    match cassette {
        Some(c) => Ok(Arc::new(c)),
        None => live(),
    }
}

/// `factory backends`: list, or check one.
#[derive(Args)]
pub struct BackendsArgs {
    #[command(subcommand)]
    command: Option<BackendsCommand>,
    /// The backend config file (default: factory.toml in the state directory, if present).
    #[arg(long, env = "FACTORY_CONFIG", value_name = "FILE", global = true)]
    config: Option<PathBuf>,
    /// Print JSON.
    #[arg(long, global = true)]
    json: bool,
    /// Print the price table of the `openai` and `anthropic` backends instead: the built-in
    /// list prices (and the date they were taken) with factory.toml's `[prices]` over them.
    #[arg(long)]
    prices: bool,
}

#[derive(Subcommand)]
enum BackendsCommand {
    /// Send one tiny request and report latency, model and usage.
    Check {
        /// A configured backend name or a built-in spelling (`openai`, `cli:claude`, ...).
        name: String,
        /// The model to ask (default: the backend's).
        #[arg(long, value_name = "MODEL")]
        model: Option<String>,
    },
}

pub async fn backends(g: &GlobalArgs, a: BackendsArgs) -> Result<ExitCode> {
    let config = load_config(g, a.config.as_ref())?;
    if a.prices {
        if a.command.is_some() {
            anyhow::bail!("--prices prints the price table; it takes no subcommand");
        }
        return prices(&config, a.json);
    }
    match a.command {
        None => list(g, &config, a.json, a.config.is_some()),
        Some(BackendsCommand::Check { name, model }) => check(&config, &name, model, a.json).await,
    }
}

fn list(g: &GlobalArgs, config: &Config, as_json: bool, explicit: bool) -> Result<ExitCode> {
    let default = config.default.clone().unwrap_or_else(|| "dry-run".into());
    let configured: Vec<_> = config
        .backends
        .iter()
        .map(|(name, b)| {
            let target = match b.kind {
                BackendKind::Cli => b
                    .command
                    .as_ref()
                    .map(|c| c.join(" "))
                    .unwrap_or_else(|| format!("preset {}", b.preset.as_deref().unwrap_or("generic"))),
                BackendKind::Script => b.path.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
                _ => b.base_url.clone().unwrap_or_else(|| "(from the environment)".into()),
            };
            json!({"name": name, "kind": b.kind, "model": b.model, "target": target, "default": *name == default})
        })
        .collect();
    let routes: Vec<_> =
        config.routes.iter().map(|r| json!({"model": r.model, "backend": r.backend, "as": r.target})).collect();
    let env_or = |var: &str, fallback: &str| std::env::var(var).unwrap_or_else(|_| fallback.to_string());
    let builtin = vec![
        json!({"name": "dry-run", "target": "offline, deterministic"}),
        json!({"name": "script:FILE", "target": "a JSON script of replies"}),
        json!({"name": "openai", "target": env_or("OPENAI_BASE_URL", backend::DEFAULT_OPENAI_BASE_URL),
               "key": std::env::var_os("OPENAI_API_KEY").is_some()}),
        json!({"name": "anthropic", "target": env_or("ANTHROPIC_BASE_URL", backend::DEFAULT_ANTHROPIC_BASE_URL),
               "key": std::env::var_os("ANTHROPIC_API_KEY").is_some()}),
        json!({"name": "cli:claude", "target": "claude -p --output-format json"}),
        json!({"name": "cli:codex", "target": "codex exec -"}),
        json!({"name": "cli:copilot", "target": "copilot -p PROMPT"}),
        json!({"name": "cli:gemini", "target": "gemini (prompt on stdin)"}),
    ];
    if as_json {
        let out = json!({"default": default, "backends": configured, "routes": routes, "builtin": builtin});
        outln!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(ExitCode::SUCCESS);
    }
    if configured.is_empty() && !explicit {
        outln!("no {} in {} (built-in backends only)", CONFIG_FILE, g.state_dir.display());
    }
    for b in &configured {
        let mark = if b["default"] == true { "*" } else { " " };
        let model = b["model"].as_str().map(|m| format!(" model={m}")).unwrap_or_default();
        outln!("{mark} {:<16} {:<10} {}{model}", str_of(&b["name"]), str_of(&b["kind"]), str_of(&b["target"]));
    }
    for r in &routes {
        let to = r["as"].as_str().map(|m| format!(" as {m}")).unwrap_or_default();
        outln!("  route {} -> {}{to}", str_of(&r["model"]), str_of(&r["backend"]));
    }
    outln!("built-in:");
    for b in &builtin {
        let mark = if b["name"] == default { "*" } else { " " };
        let key = match b.get("key").and_then(|k| k.as_bool()) {
            Some(true) => " (key set)",
            Some(false) => " (no key)",
            None => "",
        };
        outln!("{mark} {:<16} {}{key}", str_of(&b["name"]), str_of(&b["target"]));
    }
    Ok(ExitCode::SUCCESS)
}

/// `factory backends --prices`: the price tables, in credits per 1000 tokens (exact
/// decimals; JSON adds the nano-credit integers).
fn prices(config: &Config, as_json: bool) -> Result<ExitCode> {
    use factory_host::backend::pricing::{builtin_prices, format_credits, BUILTIN_PRICES_TAKEN, CREDITS_PER_USD};
    use factory_host::backend::Provider;
    let tables = config.price_tables()?;
    let mut rows = Vec::new();
    for provider in Provider::ALL {
        let builtin = builtin_prices(provider);
        for (model, price) in tables.get(provider) {
            let source = match builtin.get(model) {
                Some(p) if p == price => "built-in",
                Some(_) => "config (overrides built-in)",
                None => "config",
            };
            rows.push((provider, model.clone(), *price, source));
        }
    }
    if as_json {
        let prices: Vec<_> = rows
            .iter()
            .map(|(provider, model, p, source)| {
                json!({"provider": provider.as_str(), "model": model, "source": source,
                       "inputNanoPer1k": p.input_nano_per_1k, "outputNanoPer1k": p.output_nano_per_1k,
                       "cacheReadNanoPer1k": p.cache_read_nano_per_1k, "cacheWriteNanoPer1k": p.cache_write_nano_per_1k})
            })
            .collect();
        let out = json!({"taken": BUILTIN_PRICES_TAKEN, "creditsPerUsd": CREDITS_PER_USD,
                         "unit": "nano-credits per 1000 tokens", "prices": prices});
        outln!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(ExitCode::SUCCESS);
    }
    outln!(
        "credits per 1000 tokens (1 credit = US$0.01; built-in list prices taken {BUILTIN_PRICES_TAKEN}; \
         factory.toml [prices.openai] / [prices.anthropic] override and extend them)"
    );
    outln!(
        "{:<10} {:<28} {:>12} {:>12} {:>12} {:>12}  SOURCE",
        "PROVIDER",
        "MODEL",
        "INPUT",
        "OUTPUT",
        "CACHE-READ",
        "CACHE-WRITE"
    );
    let known = |p: Option<u64>| p.map_or_else(|| "unknown".to_string(), format_credits);
    for (provider, model, p, source) in &rows {
        outln!(
            "{:<10} {:<28} {:>12} {:>12} {:>12} {:>12}  {source}",
            provider.as_str(),
            crate::doors::cli::escape::esc(model),
            format_credits(p.input_nano_per_1k),
            format_credits(p.output_nano_per_1k),
            known(p.cache_read_nano_per_1k),
            known(p.cache_write_nano_per_1k),
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn str_of(v: &serde_json::Value) -> &str {
    v.as_str().unwrap_or("")
}

async fn check(config: &Config, name: &str, model: Option<String>, as_json: bool) -> Result<ExitCode> {
    let backend = config.backend(name, model.as_deref()).with_context(|| format!("setting up backend `{name}`"))?;
    let shown_model = model
        .clone()
        .or_else(|| config.backends.get(name).and_then(|b| b.model.clone()))
        .unwrap_or_else(|| "(the backend's default)".into());
    let request = AgentRequest {
        prompt: "Reply with the single word: ok".into(),
        label: Some("check".into()),
        model,
        schema: None,
        attempt: 0,
        feedback: None,
        limits: Default::default(),
        tuning: Default::default(),
    };
    let started = Instant::now();
    let outcome = backend.call(Arc::new(request)).await;
    let millis = started.elapsed().as_millis() as u64;
    match outcome {
        Ok(reply) => {
            let usage = reply.usage.as_ref().map(|u| {
                json!({"inputTokens": u.input_tokens, "outputTokens": u.output_tokens,
                       "cacheReadTokens": u.cache_read_tokens, "cacheWriteTokens": u.cache_write_tokens,
                       "creditsNano": u.credits_nano, "creditsAtLeast": u.credits_at_least})
            });
            if as_json {
                let out = json!({"backend": name, "ok": true, "millis": millis, "model": shown_model,
                                 "reply": reply.text, "usage": usage});
                outln!("{}", serde_json::to_string_pretty(&out)?);
            } else {
                let short: String = reply.text.trim().chars().take(80).collect();
                outln!("backend {name}: ok in {millis} ms");
                outln!("  model: {shown_model}");
                outln!("  reply: {}", esc(&short));
                match &reply.usage {
                    Some(u) => outln!(
                        "  usage: {} input + {} output + {} cache-read + {} cache-write tokens, {}{} nano-credits",
                        u.input_tokens,
                        u.output_tokens,
                        u.cache_read_tokens,
                        u.cache_write_tokens,
                        if u.credits_at_least && u.credits_nano.is_some() { "at least " } else { "" },
                        u.credits_nano.map_or("unknown".to_string(), |c| c.to_string())
                    ),
                    None => outln!("  usage: not reported (a budgeted run would stop: fail-closed)"),
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            if as_json {
                let out = json!({"backend": name, "ok": false, "millis": millis, "model": shown_model, "error": e.message(),
                                 "outage": e.outage_kind()});
                outln!("{}", serde_json::to_string_pretty(&out)?);
            } else {
                // The server's own words: escaped.
                eprintln!("backend {name}: failed after {millis} ms: {}", esc(&e.to_string()));
            }
            Ok(ExitCode::from(1))
        }
    }
}
