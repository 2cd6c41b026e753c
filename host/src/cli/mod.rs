//! The `factory` CLI: argument parsing (clap) and one module per subcommand.

mod describe;
mod progress_ui;
mod run;
mod target;

use clap::{Args, Parser, Subcommand};
use factory_host::Limits;
use std::path::PathBuf;
use std::process::ExitCode;

/// Run agent factories (WebAssembly components) in a sandbox.
#[derive(Parser)]
#[command(name = "factory", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a factory: a component file, or a Rust crate directory (built first).
    Run(run::RunArgs),
    /// Print a factory's metadata, imports and the sandbox limits it would run under.
    Describe(describe::DescribeArgs),
    /// Build a Rust factory crate into a component and print its path.
    Build {
        /// The crate directory.
        dir: PathBuf,
    },
}

/// Limit overrides shared by `run` (and later `resume`).
#[derive(Args, Debug, Default, Clone)]
pub struct LimitArgs {
    /// Override maxConcurrentSubagents (positive integer).
    #[arg(long, value_name = "N")]
    pub max_concurrent_subagents: Option<u32>,
    /// Override maxTotalSubagents (positive integer).
    #[arg(long, value_name = "N")]
    pub max_total_subagents: Option<u32>,
    /// Override timeoutSeconds (positive, fractions allowed, at most 2147483.647).
    #[arg(long, value_name = "SECONDS")]
    pub timeout_seconds: Option<f64>,
    /// Override maxAiCredits (positive).
    #[arg(long, value_name = "CREDITS")]
    pub max_ai_credits: Option<f64>,
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
    let outcome = runtime.block_on(async move {
        match cli.command {
            Command::Run(args) => run::run(args).await,
            Command::Describe(args) => describe::describe(args).await,
            Command::Build { dir } => {
                let built = target::build(&dir)?;
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
