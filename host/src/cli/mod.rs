//! The `factory` CLI: argument parsing (clap) and one module per subcommand.

mod backends;
mod bearer;
mod config;
mod context;
mod dashboard;
mod describe;
mod escape;
mod events;
mod http;
mod http_bind;
mod mcp;
mod observe;
mod progress_ui;
mod registry;
mod remote;
mod run;
mod serve;
mod target;
mod trust;

use clap::{Args, Parser, Subcommand};
use factory_host::Limits;
use std::path::PathBuf;
use std::process::ExitCode;

/// Run agent factories (WebAssembly components) in a sandbox, durably.
#[derive(Parser)]
#[command(name = "factory", version, about, long_about = None)]
struct Cli {
    #[command(flatten)]
    global: GlobalArgs,
    #[command(subcommand)]
    command: Command,
}

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
    /// The group-commit window of the store, in milliseconds: journal entries are made
    /// durable together at most this long after they are written.
    #[arg(long, global = true, env = "FACTORY_COMMIT_WINDOW_MS", default_value_t = 10, value_name = "MS")]
    pub commit_window_ms: u64,
    /// The session new runs and authored factories go in, and whose runs `runs` lists (the CLI is the owner: a run id may name any session's run).
    #[arg(long, global = true, env = "FACTORY_SESSION", default_value = factory_host::DEFAULT_SESSION)]
    pub session: String,
}

impl GlobalArgs {
    /// Fill in the state directory: `--state-dir`/`$FACTORY_STATE_DIR`, else the user-level
    /// default.
    fn resolve(&mut self) -> anyhow::Result<()> {
        self.state_dir = match &self.state_dir_arg {
            Some(dir) => dir.clone(),
            None => factory_host::access::default_state_dir()?,
        };
        self.state_dir_is_project_local = factory_host::access::is_project_local(&self.state_dir);
        Ok(())
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

#[derive(Subcommand)]
enum Command {
    /// Run a factory: a component file, a Rust crate directory (built first), or a
    /// registered name.
    Run(run::RunArgs),
    /// Resume a run that stopped (limit, crash, cancel): journaled work replays for free.
    Resume(run::ResumeArgs),
    /// List the session's runs (every session's with --all), oldest first.
    Runs(observe::RunsArgs),
    /// Show a run: envelope, phases, agent summaries, latest progress.
    Show(observe::RunIdArgs),
    /// Page through a run's progress.
    Progress(observe::ProgressArgs),
    /// Wait until a run ends and print its envelope.
    Wait(observe::RunIdArgs),
    /// Cancel a run and print its terminal envelope.
    Cancel(observe::RunIdArgs),
    /// Follow a run's progress live until it ends.
    Watch(observe::RunIdArgs),
    /// Hold the store and run what `factory run --detach` hands over, until stopped; with
    /// --http, also the JSON API and the dashboard (token in <state-dir>/http.token).
    Serve(serve::ServeArgs),
    /// Register a factory under its meta name.
    Add(registry::AddArgs),
    /// List registered factories.
    List(observe::JsonArg),
    /// Show a registered factory's description, phases, limits and args schema.
    Inspect(registry::InspectArgs),
    /// Print a factory's metadata, imports and the sandbox limits it would run under.
    Describe(describe::DescribeArgs),
    /// List the subagent backends (configured and built-in), or check one with a tiny call.
    Backends(backends::BackendsArgs),
    /// Build a factory (a Rust crate directory, or a Python `.py` file or project) into a component and print its path.
    Build {
        /// The crate directory, `.py` file or Python project directory.
        dir: PathBuf,
        /// Where bubblewrap cannot confine a crate's build, build it natively (its build.rs
        /// and proc macros run as you) without asking.
        #[arg(long)]
        yes: bool,
    },
    /// Approve a component so runs need no consent (`--revoke` to undo); list trusted ones.
    Trust(trust::TrustArgs),
    /// Serve MCP on stdin/stdout, or with --http as streamable HTTP at `/mcp` (token in
    /// <state-dir>/mcp.token): the `run_factory` and `factories_manage` tools for agents.
    Mcp(mcp::McpArgs),
    /// Print (and on a terminal, open) the web dashboard's URL with a one-time sign-in
    /// code (never the token), for the daemon serving `--http` from this state directory.
    Ui(dashboard::UiArgs),
    /// Which config file is used; approve (`allow`) or forget (`deny`) a project-local one.
    Config(config::ConfigArgs),
}

/// Limit overrides shared by `run` and `resume`. Each value is checked by the library's
/// [`Limits::validate`] while parsing, so `--timeout-seconds -1` (negative numbers are
/// accepted as values) reports the limit's own error, exit code 2.
#[derive(Args, Debug, Default, Clone)]
pub struct LimitArgs {
    /// Override maxConcurrentSubagents (positive integer).
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = parse_max_concurrent)]
    pub max_concurrent_subagents: Option<u32>,
    /// Override maxTotalSubagents (positive integer).
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = parse_max_total)]
    pub max_total_subagents: Option<u32>,
    /// Override timeoutSeconds (positive, fractions allowed, at most 2147483.647).
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true, value_parser = parse_timeout)]
    pub timeout_seconds: Option<f64>,
    /// Override maxAiCredits (positive).
    #[arg(long, value_name = "CREDITS", allow_negative_numbers = true, value_parser = parse_credits)]
    pub max_ai_credits: Option<f64>,
}

/// A count limit: an integer the library accepts, else its [`factory_host::limits::LimitError`] text.
fn parse_count(field: &'static str, text: &str, set: fn(u32) -> Limits) -> Result<u32, String> {
    let wrong = |reason: String| factory_host::limits::LimitError { field, reason }.to_string();
    let n: i128 = text.trim().parse().map_err(|_| wrong(format!("must be a positive integer, got {text}")))?;
    let n = u32::try_from(n).map_err(|_| wrong(format!("must be a positive integer of at most {}, got {n}", u32::MAX)))?;
    set(n).validate().map_err(|e| e.to_string())?;
    Ok(n)
}

/// A number limit: a number the library accepts, else its error text.
fn parse_number(field: &'static str, text: &str, set: fn(f64) -> Limits) -> Result<f64, String> {
    let wrong = |reason: String| factory_host::limits::LimitError { field, reason }.to_string();
    let x: f64 = text.trim().parse().map_err(|_| wrong(format!("must be a positive finite number, got {text}")))?;
    set(x).validate().map_err(|e| e.to_string())?;
    Ok(x)
}

fn parse_max_concurrent(text: &str) -> Result<u32, String> {
    parse_count("maxConcurrentSubagents", text, |n| Limits { max_concurrent_subagents: Some(n), ..Limits::default() })
}

fn parse_max_total(text: &str) -> Result<u32, String> {
    parse_count("maxTotalSubagents", text, |n| Limits { max_total_subagents: Some(n), ..Limits::default() })
}

fn parse_timeout(text: &str) -> Result<f64, String> {
    parse_number("timeoutSeconds", text, |t| Limits { timeout_seconds: Some(t), ..Limits::default() })
}

fn parse_credits(text: &str) -> Result<f64, String> {
    parse_number("maxAiCredits", text, |c| Limits { max_ai_credits: Some(c), ..Limits::default() })
}

impl LimitArgs {
    /// The overrides as library limits (validated by the host).
    pub fn limits(&self) -> Limits {
        Limits {
            max_concurrent_subagents: self.max_concurrent_subagents,
            max_total_subagents: self.max_total_subagents,
            timeout_seconds: self.timeout_seconds,
            max_ai_credits: self.max_ai_credits,
        }
    }
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let mut g = cli.global;
    if let Err(e) = g.resolve() {
        eprintln!("error: {e:#}");
        return ExitCode::from(2);
    }
    let outcome = runtime.block_on(async move {
        match cli.command {
            Command::Run(args) => run::run(&g, args).await,
            Command::Resume(args) => run::resume(&g, args).await,
            Command::Runs(args) => observe::runs(&g, args).await,
            Command::Show(args) => observe::show(&g, args).await,
            Command::Progress(args) => observe::progress(&g, args).await,
            Command::Wait(args) => observe::wait(&g, args).await,
            Command::Cancel(args) => observe::cancel(&g, args).await,
            Command::Watch(args) => observe::watch(&g, args).await,
            Command::Serve(args) => serve::serve(&g, args).await,
            Command::Add(args) => trust::after_build(&g, registry::add(&g, args).await),
            Command::List(args) => registry::list(&g, args).await,
            Command::Inspect(args) => registry::inspect(&g, args).await,
            Command::Describe(args) => describe::describe(args).await,
            Command::Backends(args) => backends::backends(&g, args).await,
            Command::Trust(args) => trust::trust(&g, args).await,
            Command::Mcp(args) => mcp::mcp(&g, args).await,
            Command::Config(args) => config::config(&g, args),
            Command::Ui(args) => dashboard::ui(&g, args).await,
            Command::Build { dir, yes } => {
                let built = target::build(&dir, &target::BuildConsent::new(&g, yes))?;
                trust::remember_built(&g);
                println!("{}", built.display());
                Ok(ExitCode::SUCCESS)
            }
        }
    });
    match outcome {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
