//! The `factory` CLI: argument parsing (clap) and one module per subcommand.

// First: its `outln!`/`out!` macros are used by the modules below.
#[macro_use]
pub(crate) mod out;
pub(crate) mod approvals;
pub(crate) mod backends;
pub(crate) mod config;
pub(crate) mod conventions;
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
pub(crate) mod testing;
pub(crate) mod trust;
pub(crate) mod workers;

pub use crate::doors::args::GlobalArgs;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// Run agent factories (WebAssembly components) in a sandbox, durably.
#[derive(Parser)]
#[command(name = "factory", version, about, long_about = None)]
struct Cli {
    #[command(flatten)]
    global: GlobalArgs,
    /// When to colour output: `auto` colours a terminal unless `NO_COLOR` is set;
    /// `always` and `never` win over the environment.
    #[arg(long, global = true, value_enum, default_value_t = conventions::ColorWhen::Auto, value_name = "WHEN")]
    color: conventions::ColorWhen,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a factory: a component file, a Rust crate directory (built first), or a
    /// registered name.
    #[command(after_help = "Examples:
  factory run examples/hello --args '{\"name\":\"Ada\"}'
  factory run ideas/ideas.ts --backend openai --model gpt-4o-mini
  factory run examples/review-changed --record review.cassette
  factory run examples/review-changed --replay review.cassette --json
  OPENAI_BASE_URL=http://127.0.0.1:8080/v1 factory run examples/review-changed --backend openai --model local
  factory run examples/review-changed --backend openai --model my-finetune --max-ai-credits none")]
    Run(run::RunArgs),
    /// Resume a run that stopped (limit, crash, cancel, pause, a spent quota, also before
    /// its `resumeAt`): journaled work replays for free.
    #[command(after_help = "Examples:
  factory resume 0192f3c4-...                         # journaled work replays for free
  factory resume 0192f3c4-... --max-total-subagents 200
  factory resume 0192f3c4-... --max-ai-credits none      # lift the budget
  factory resume 0192f3c4-... --component ./edited.wasm
  factory resume 0192f3c4-... --input '{\"approved\": true}'   # answer the checkpoint it waits at")]
    Resume(run::ResumeArgs),
    /// List the session's runs (every session's with --all), oldest first: summaries,
    /// without results (`show ID` prints one).
    #[command(after_help = "Examples:
  factory runs
  factory runs --all --json")]
    Runs(observe::RunsArgs),
    /// Show a run: envelope, phases, agent summaries, latest progress.
    #[command(after_help = "Examples:
  factory show 0192f3c4-...
  factory show 0192f3c4-... --json")]
    Show(observe::RunIdArgs),
    /// Page through a run's progress.
    #[command(after_help = "Examples:
  factory progress 0192f3c4-... --after-seq 100 --limit 50
  factory progress 0192f3c4-... --phase Review --json")]
    Progress(observe::ProgressArgs),
    /// Wait until a run ends and print its envelope.
    #[command(after_help = "Examples:
  factory wait 0192f3c4-... --json")]
    Wait(observe::RunIdArgs),
    /// Cancel a run (running, or parked until its backend's quota resets) and print its
    /// terminal envelope.
    #[command(after_help = "Examples:
  factory cancel 0192f3c4-...")]
    Cancel(observe::RunIdArgs),
    /// Pause a running run and print its envelope: the attempt stops cooperatively, the run
    /// is `paused` (active time stops, journaled work is kept); `factory resume` continues it.
    #[command(after_help = "Examples:
  factory pause 0192f3c4-...
  factory resume 0192f3c4-...")]
    Pause(observe::RunIdArgs),
    /// Delete runs and their journals (progress, steps, agent outcomes, accounting) from the
    /// store, with the components no other run or registration uses; a running run is
    /// refused (already_active): cancel it first.
    #[command(after_help = "Examples:
  factory rm 0192f3c4-...
  factory rm 0192f3c4-... 0192f3c5-... --json")]
    Rm(observe::RmArgs),
    /// Delete the ended runs (completed, error, cancelled) a retention policy no longer
    /// keeps: the config file's `[retention]` (keep_days, keep_last), or the flags; a run is
    /// deleted only when no rule keeps it. The store's free space is then given back.
    #[command(after_help = "Examples:
  factory gc --keep-days 30 --dry-run
  factory gc --keep-last 20 --json")]
    Gc(observe::GcArgs),
    /// Where the store's bytes go: its size and each part's share (journal values, shared
    /// journal values, progress records and agent summaries, run records, components, page
    /// overhead, free pages), then
    /// each table's. A redb store is the file; a PostgreSQL one its tables as the server
    /// measures them (rows as stored, indexes as branches, the rest of each table as overhead).
    #[command(after_help = "Examples:
  factory stats
  factory stats --json")]
    Stats(observe::StatsArgs),
    /// Follow a run's progress live until it ends.
    #[command(after_help = "Examples:
  factory watch 0192f3c4-...")]
    Watch(observe::RunIdArgs),
    /// The state directory's service: hold the store and run what every front door hands
    /// over (they start it on demand); with --http, also the JSON API and the dashboard
    /// (token in <state-dir>/http.token).
    #[command(after_help = "Examples:
  factory serve
  factory serve --http 127.0.0.1:8080 --idle-exit 600")]
    Serve(serve::ServeArgs),
    /// The workers of a shared PostgreSQL store (--store or FACTORY_STORE): id, host, pid,
    /// generation, lease, and the runs each executes.
    #[command(after_help = "Examples:
  factory workers --store postgres://factory@127.0.0.1:5432/factory
  FACTORY_STORE=postgres://factory@db:5432/factory factory workers --json")]
    Workers(workers::WorkersArgs),
    /// Scaffold a new factory (TypeScript, JavaScript, Rust or Python) in a new directory:
    /// a factory that runs as it is and a README (for TS/JS also its type declarations, a
    /// strict tsconfig.json and a package.json with `typecheck`).
    #[command(after_help = "Examples:
  factory init ideas                   # TypeScript (the default)
  factory init ideas --lang python
  factory init ideas --lang rust && factory run ./ideas")]
    Init(init::InitArgs),
    /// Test factories against their cassettes: run each case of `NAME.test.json` with every
    /// agent call replayed, check its status, result, accounting and journal, and report
    /// the recorded calls an edit stopped making and the new ones. The paths a test file
    /// names (`factory`, `cassette`) must stay inside the directory holding it.
    #[command(after_help = "Examples:
  factory test                                  # every *.test.json here
  factory test ideas/ideas.test.json --junit report.xml
  factory test ideas --update --backend openai  # record the calls the cassette lacks")]
    Test(testing::TestArgs),
    /// Register a factory under its meta name.
    #[command(after_help = "Examples:
  factory add examples/hello && factory run hello
  factory add ideas/ideas.ts")]
    Add(registry::AddArgs),
    /// List registered factories.
    #[command(after_help = "Examples:
  factory list --json")]
    List(observe::JsonArg),
    /// Show a registered factory's description, phases, limits and args schema.
    #[command(after_help = "Examples:
  factory inspect hello")]
    Inspect(registry::InspectArgs),
    /// Print a factory's metadata, imports and the sandbox limits it would run under.
    #[command(after_help = "Examples:
  factory describe ideas/ideas.ts
  factory describe target/wasm32-unknown-unknown/debug/hello.component.wasm
  factory describe hello")]
    Describe(describe::DescribeArgs),
    /// List the subagent backends (configured and built-in), or check one with a tiny call.
    #[command(after_help = "Examples:
  factory backends
  factory backends check openai")]
    Backends(backends::BackendsArgs),
    /// Build a factory (a Rust crate directory, or a Python `.py` file or project) into a component and print its path.
    #[command(
        after_help = "Examples:\n  factory build examples/hello\n  factory build examples/python/review_changed.py"
    )]
    Build {
        /// The crate directory, `.py` file or Python project directory.
        dir: PathBuf,
        /// Where bubblewrap cannot confine a crate's build, build it natively (its build.rs
        /// and proc macros run as you) without asking.
        #[arg(long)]
        yes: bool,
    },
    /// Approve a component so runs need no consent (`--revoke` to undo); list trusted ones.
    #[command(after_help = "Examples:
  factory trust ./hello.component.wasm
  factory trust --revoke ./hello.component.wasm
  factory trust")]
    Trust(trust::TrustArgs),
    /// List the starts waiting for your approval (an untrusted factory started over HTTP); approve or decline one.
    #[command(after_help = "Examples:
  factory approvals
  factory approvals approve 5f0c... --always
  factory approvals decline 5f0c...")]
    Approvals(approvals::ApprovalsArgs),
    /// Serve MCP on stdin/stdout, or with --http as streamable HTTP at `/mcp` (token in
    /// <state-dir>/mcp.token): the `run_factory` and `factories_manage` tools for agents.
    #[command(after_help = "Examples:
  factory mcp                          # stdio, for an agent that starts it
  factory mcp --http 127.0.0.1:8765")]
    Mcp(crate::doors::mcp::McpArgs),
    /// Open the web dashboard of the daemon serving `--http` from this state directory: a
    /// one-time sign-in code goes into a private (0600) file that the browser opens (never
    /// the token, never a command line); list and revoke dashboard sessions.
    #[command(after_help = "Examples:
  factory ui
  factory ui --no-open              # print the sign-in file's path
  factory ui --url                  # print a sign-in URL (for a browser elsewhere)
  factory ui --sessions
  factory ui --revoke all")]
    Ui(dashboard::UiArgs),
    /// Which config file is used; approve (`allow`) or forget (`deny`) a project-local one.
    #[command(after_help = "Examples:
  factory config
  factory config allow ./factory.toml")]
    Config(config::ConfigArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) on stdout.
    #[command(
        after_help = "Examples:\n  source <(factory completions bash)\n  factory completions zsh > ~/.zfunc/_factory\n  factory completions fish > ~/.config/fish/completions/factory.fish"
    )]
    Completions(conventions::CompletionsArgs),
    /// Print the man page (roff) on stdout.
    #[command(after_help = "Examples:\n  factory man | man -l -\n  factory man > ~/.local/share/man/man1/factory.1")]
    Man,
    /// Print the book's CLI reference chapter (Markdown) on stdout.
    #[command(hide = true)]
    CliReference,
}

pub fn main() -> ExitCode {
    // The colour choice comes first, so clap's own help and errors follow it too.
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    conventions::apply_color(conventions::color_from_args(&argv));
    let cli = match Cli::command().try_get_matches_from(&argv).and_then(|m| Cli::from_arg_matches(&m)) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    conventions::apply_color(cli.color);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let mut g = cli.global;
    if let Err(e) = g.resolve() {
        eprintln!("error: {}", escape::esc_lines(&format!("{e:#}")));
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
            Command::Pause(args) => observe::pause(&g, args).await,
            Command::Rm(args) => observe::rm(&g, args).await,
            Command::Gc(args) => observe::gc(&g, args).await,
            Command::Stats(args) => observe::stats(&g, args).await,
            Command::Watch(args) => observe::watch(&g, args).await,
            Command::Serve(args) => serve::serve(&g, args).await,
            Command::Workers(args) => workers::workers(&g, args).await,
            Command::Init(args) => init::init(&g, args).await,
            Command::Test(args) => testing::test(&g, args).await,
            Command::Add(args) => trust::after_build(&g, registry::add(&g, args).await),
            Command::List(args) => registry::list(&g, args).await,
            Command::Inspect(args) => registry::inspect(&g, args).await,
            Command::Describe(args) => describe::describe(&g, args).await,
            Command::Backends(args) => backends::backends(&g, args).await,
            Command::Trust(args) => trust::trust(&g, args).await,
            Command::Approvals(args) => approvals::approvals(&g, args).await,
            Command::Mcp(args) => crate::doors::mcp::mcp(&g, args).await,
            Command::Config(args) => config::config(&g, args),
            Command::Ui(args) => dashboard::ui(&g, args).await,
            Command::Completions(args) => conventions::completions(Cli::command(), args),
            Command::Man => conventions::man(Cli::command()),
            Command::CliReference => conventions::cli_reference(Cli::command()),
            Command::Build { dir, yes } => {
                let built = target::build(&dir, &target::BuildConsent::new(&g, yes))?;
                trust::remember_built(&g);
                outln!("{}", built.display());
                Ok(ExitCode::SUCCESS)
            }
        }
    });
    crate::doors::telemetry::shutdown();
    match outcome {
        Ok(code) => code,
        Err(e) => {
            let error = conventions::paint(
                conventions::stderr_colored(),
                anstyle::AnsiColor::Red.on_default().bold(),
                "error:",
            );
            // An error may quote guest or server text (a load error, a backend's message).
            if crate::doors::telemetry::says_to_log() {
                crate::doors::telemetry::say(&format!("error: {}", conventions::error_chain(&e)));
            } else {
                eprintln!("{error} {}", escape::esc_lines(&conventions::error_chain(&e)));
            }
            ExitCode::from(2)
        }
    }
}
