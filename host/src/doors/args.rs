//! The options every front door shares: where the state is, the session, the store's
//! commit window and whether to use the state directory's service ([`GlobalArgs`]), and
//! the limit overrides of `run` and `resume` ([`LimitArgs`]), each checked by the
//! library's own validation while parsing.

use clap::Args;
use factory_host::Limits;
use std::path::PathBuf;

/// Options every subcommand shares.
#[derive(Args, Clone)]
pub struct GlobalArgs {
    /// Where runs, journals, trust and registered factories are stored (default:
    /// $XDG_STATE_HOME/factory, else ~/.local/state/factory; never the working directory).
    #[arg(long = "state-dir", global = true, env = "FACTORY_STATE_DIR", value_name = "DIR")]
    pub state_dir_arg: Option<PathBuf>,
    /// The state directory in use (resolved by [`GlobalArgs::resolve`]).
    #[arg(skip)]
    pub state_dir: PathBuf,
    /// Whether the state directory is project-local (at or below the working directory):
    /// then trust is kept in the user-level state directory instead.
    #[arg(skip)]
    pub state_dir_is_project_local: bool,
    /// Set by a front door that starts the service for a project-local state directory
    /// (the service runs elsewhere, so it cannot tell by itself).
    #[arg(long = "project-local-state-dir", global = true, hide = true)]
    pub project_local_arg: bool,
    /// The group-commit window of the store, in milliseconds: journal entries are made
    /// durable together at most this long after they are written.
    #[arg(long, global = true, env = "FACTORY_COMMIT_WINDOW_MS", default_value_t = 10, value_name = "MS")]
    pub commit_window_ms: u64,
    /// The session new runs and authored factories go in, and whose runs `runs` lists (the CLI is the owner: a run id may name any session's run).
    #[arg(long, global = true, env = "FACTORY_SESSION", default_value = factory_host::DEFAULT_SESSION)]
    pub session: String,
    /// Open the store in this process instead of using (or starting) the state directory's
    /// service: runs then end with this process (for CI and scripts).
    #[arg(long, global = true, env = "FACTORY_NO_DAEMON", value_parser = clap::builder::FalseyValueParser::new())]
    pub no_daemon: bool,
    /// How log lines on stderr are written: `human`, or `json` (one object per line) for
    /// machines (the service's `serve.log` is always JSON lines). Which lines: `RUST_LOG`
    /// (default `warn,factory_host=info,factory=info`).
    #[arg(long, global = true, env = "FACTORY_LOG_FORMAT", value_enum, default_value_t = crate::doors::telemetry::LogFormat::Human, value_name = "FORMAT")]
    pub log_format: crate::doors::telemetry::LogFormat,
    /// The bearer token `--http` servers (`serve`, `mcp`) require, read from this file
    /// (owner-only, at least 32 characters) instead of a random one per process: give every
    /// worker of a cluster the same file and each accepts the same token. `FACTORY_TOKEN`,
    /// when set, holds the token itself and wins.
    #[arg(long, global = true, env = "FACTORY_TOKEN_FILE", value_name = "PATH")]
    pub token_file: Option<PathBuf>,
}

impl GlobalArgs {
    /// Fill in the state directory: `--state-dir`/`$FACTORY_STATE_DIR`, else the user-level
    /// default.
    pub fn resolve(&mut self) -> anyhow::Result<()> {
        self.state_dir = match &self.state_dir_arg {
            Some(dir) => dir.clone(),
            None => factory_host::access::default_state_dir()?,
        };
        self.state_dir_is_project_local =
            self.project_local_arg || factory_host::access::is_project_local(&self.state_dir);
        Ok(())
    }

    /// What no agent-CLI sandbox of a run served from here may see, even inside a grant: the
    /// state directory in use (its store, `control.sock`, `http.token`, `mcp.token`, logs),
    /// the user-level state and config directories, the cluster's `--token-file` and a
    /// `$FACTORY_CONFIG` file. Absolute; handed to the host as data
    /// ([`factory_host::HostConfig::sandbox_hidden`]).
    pub fn sandbox_hidden(&self) -> Vec<PathBuf> {
        let state = std::path::absolute(&self.state_dir).unwrap_or_else(|_| self.state_dir.clone());
        let mut hidden = vec![
            state.join(crate::doors::state_files::CONTROL_SOCKET),
            state.join(crate::doors::state_files::HTTP_TOKEN),
            state.join(crate::doors::state_files::MCP_TOKEN),
            state,
        ];
        hidden.extend(factory_host::access::default_state_dir().ok());
        hidden.extend(factory_host::access::user_config_dir().ok());
        let files = [self.token_file.clone(), std::env::var_os("FACTORY_CONFIG").map(PathBuf::from)];
        hidden.extend(files.into_iter().flatten().filter_map(|f| std::path::absolute(f).ok()));
        hidden
    }

    /// The cluster's bearer token (`FACTORY_TOKEN`, else `--token-file`), if one is given.
    pub fn cluster_token(&self) -> anyhow::Result<Option<String>> {
        crate::doors::http::bearer::cluster_token(self.token_file.as_deref())
    }

    /// Where trust approvals are kept: the state directory, unless that is project-local
    /// (a repository's `.factory`), whose approvals are not the user's: then the user-level
    /// state directory.
    pub fn trust_dir(&self) -> anyhow::Result<PathBuf> {
        if self.state_dir_is_project_local {
            Ok(factory_host::access::default_state_dir()?)
        } else {
            Ok(self.state_dir.clone())
        }
    }
}

/// Limit overrides shared by `run` and `resume`. Each value is checked by the library's
/// [`Limits::validate`] while parsing, so `--timeout-seconds -1` (negative numbers are
/// accepted as values) reports the limit's own error, exit code 2. `none` lifts the limit:
/// no limit of that kind for this run, whatever the factory declares.
#[derive(Args, Debug, Default, Clone)]
pub struct LimitArgs {
    /// Override maxConcurrentSubagents (positive integer, or `none`: no cap).
    #[arg(long, value_name = "N|none", allow_negative_numbers = true, value_parser = parse_max_concurrent)]
    pub max_concurrent_subagents: Option<Given<u32>>,
    /// Override maxTotalSubagents (positive integer, or `none`: no cap).
    #[arg(long, value_name = "N|none", allow_negative_numbers = true, value_parser = parse_max_total)]
    pub max_total_subagents: Option<Given<u32>>,
    /// Override timeoutSeconds (positive, fractions allowed, at most 2147483.647; or `none`: no timeout).
    #[arg(long, value_name = "SECONDS|none", allow_negative_numbers = true, value_parser = parse_timeout)]
    pub timeout_seconds: Option<Given<f64>>,
    /// Override maxAiCredits (positive; or `none`: no budget, e.g. for a factory that declares one, run on a model that has no price).
    #[arg(long, value_name = "CREDITS|none", allow_negative_numbers = true, value_parser = parse_credits)]
    pub max_ai_credits: Option<Given<f64>>,
}

/// A limit flag's value: a limit, or `none` (the limit is lifted).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Given<T> {
    /// This limit.
    Value(T),
    /// No limit of this kind.
    Lifted,
}

impl<T: Copy> Given<T> {
    /// The value and whether the limit is lifted, as [`Limits`] holds them.
    fn split(given: Option<Given<T>>) -> (Option<T>, bool) {
        match given {
            None => (None, false),
            Some(Given::Value(v)) => (Some(v), false),
            Some(Given::Lifted) => (None, true),
        }
    }
}

/// `none` (any case, trimmed): the flag lifts the limit.
fn is_none_word(text: &str) -> bool {
    text.trim().eq_ignore_ascii_case("none")
}

/// A count limit: an integer the library accepts (or `none`), else its [`factory_host::limits::LimitError`] text.
fn parse_count(field: &'static str, text: &str, set: fn(u32) -> Limits) -> Result<Given<u32>, String> {
    if is_none_word(text) {
        return Ok(Given::Lifted);
    }
    let wrong = |reason: String| factory_host::limits::LimitError { field, reason }.to_string();
    let n: i128 =
        text.trim().parse().map_err(|_| wrong(format!("must be a positive integer or `none`, got {text}")))?;
    let n =
        u32::try_from(n).map_err(|_| wrong(format!("must be a positive integer of at most {}, got {n}", u32::MAX)))?;
    set(n).validate().map_err(|e| e.to_string())?;
    Ok(Given::Value(n))
}

/// A number limit: a number the library accepts (or `none`), else its error text.
fn parse_number(field: &'static str, text: &str, set: fn(f64) -> Limits) -> Result<Given<f64>, String> {
    if is_none_word(text) {
        return Ok(Given::Lifted);
    }
    let wrong = |reason: String| factory_host::limits::LimitError { field, reason }.to_string();
    let x: f64 =
        text.trim().parse().map_err(|_| wrong(format!("must be a positive finite number or `none`, got {text}")))?;
    set(x).validate().map_err(|e| e.to_string())?;
    Ok(Given::Value(x))
}

fn parse_max_concurrent(text: &str) -> Result<Given<u32>, String> {
    parse_count("maxConcurrentSubagents", text, |n| Limits { max_concurrent_subagents: Some(n), ..Limits::default() })
}

fn parse_max_total(text: &str) -> Result<Given<u32>, String> {
    parse_count("maxTotalSubagents", text, |n| Limits { max_total_subagents: Some(n), ..Limits::default() })
}

fn parse_timeout(text: &str) -> Result<Given<f64>, String> {
    parse_number("timeoutSeconds", text, |t| Limits { timeout_seconds: Some(t), ..Limits::default() })
}

fn parse_credits(text: &str) -> Result<Given<f64>, String> {
    parse_number("maxAiCredits", text, |c| Limits { max_ai_credits: Some(c), ..Limits::default() })
}

impl LimitArgs {
    /// The overrides as library limits (validated by the host), lifts included.
    pub fn limits(&self) -> Limits {
        let (max_concurrent_subagents, mcs) = Given::split(self.max_concurrent_subagents);
        let (max_total_subagents, mts) = Given::split(self.max_total_subagents);
        let (timeout_seconds, ts) = Given::split(self.timeout_seconds);
        let (max_ai_credits, mac) = Given::split(self.max_ai_credits);
        Limits {
            max_concurrent_subagents,
            max_total_subagents,
            timeout_seconds,
            max_ai_credits,
            lifted: factory_host::limits::Lifted {
                max_concurrent_subagents: mcs,
                max_total_subagents: mts,
                timeout_seconds: ts,
                max_ai_credits: mac,
            },
        }
    }
}
