//! The `factory` CLI: argument parsing (clap) and one module per subcommand.

pub(crate) mod backends;
pub(crate) mod config;
pub(crate) mod dashboard;
pub(crate) mod describe;
pub(crate) mod escape;
pub(crate) mod events;
pub(crate) mod init;
pub(crate) mod observe;
pub(crate) mod progress_ui;
pub(crate) mod registry;
pub(crate) mod remote;
pub(crate) mod run;
pub(crate) mod serve;
pub(crate) mod target;
pub(crate) mod trust;

use clap::{Parser, Subcommand};
pub use crate::doors::args::GlobalArgs;
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
    /// The state directory's service: hold the store and run what every front door hands
    /// over (they start it on demand); with --http, also the JSON API and the dashboard
    /// (token in <state-dir>/http.token).
    Serve(serve::ServeArgs),
    /// Scaffold a new JS/TS factory in a new directory: a factory that runs as it is, its
    /// type declarations, a strict tsconfig.json and a package.json with `typecheck`.
    Init(init::InitArgs),
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
    Mcp(crate::doors::mcp::McpArgs),
    /// Print (and on a terminal, open) the web dashboard's URL with a one-time sign-in
    /// code (never the token), for the daemon serving `--http` from this state directory.
    Ui(dashboard::UiArgs),
    /// Which config file is used; approve (`allow`) or forget (`deny`) a project-local one.
    Config(config::ConfigArgs),
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
    // The service logs to its state directory too; one started by a front door has that
    // file for its stderr already.
    let service_log = match &cli.command {
        Command::Serve(args) => Some(!args.started_by_front_door()),
        _ => None,
    };
    let logging = || -> anyhow::Result<()> {
        match service_log {
            Some(stderr) => {
                factory_host::access::private_state_dir(&g.state_dir)?;
                crate::doors::telemetry::init(g.log_format, Some(&g.state_dir), stderr)?;
            }
            None => crate::doors::telemetry::init(g.log_format, None, true)?,
        }
        Ok(())
    };
    if let Err(e) = logging() {
        eprintln!("error: cannot open the service log in {}: {e:#}", g.state_dir.display());
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
            Command::Init(args) => init::init(args),
            Command::Add(args) => trust::after_build(&g, registry::add(&g, args).await),
            Command::List(args) => registry::list(&g, args).await,
            Command::Inspect(args) => registry::inspect(&g, args).await,
            Command::Describe(args) => describe::describe(args).await,
            Command::Backends(args) => backends::backends(&g, args).await,
            Command::Trust(args) => trust::trust(&g, args).await,
            Command::Mcp(args) => crate::doors::mcp::mcp(&g, args).await,
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
    crate::doors::telemetry::shutdown();
    match outcome {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
