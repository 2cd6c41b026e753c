//! `factory run`: load (or build) a factory, run it with progress on stderr, print the
//! result (or the envelope with `--json`) on stdout. Exit code 0 only for `completed`.

use super::{progress_ui, target, LimitArgs};
use anyhow::{Context, Result};
use clap::Args;
use factory_host::{backend, Host, HostConfig, RunOptions, RunStatus};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Args)]
pub struct RunArgs {
    /// A component file (`.wasm`) or a Rust factory crate directory.
    target: PathBuf,
    /// Arguments as JSON (default `{}`).
    #[arg(long, value_name = "JSON")]
    args: Option<String>,
    /// Who runs subagents: `dry-run` (offline, deterministic) or `script:FILE`.
    #[arg(long, default_value = "dry-run", value_name = "SPEC")]
    backend: String,
    /// Print the run envelope as JSON instead of the result.
    #[arg(long)]
    json: bool,
    /// No progress output on stderr.
    #[arg(long, short)]
    quiet: bool,
    #[command(flatten)]
    limits: LimitArgs,
}

pub async fn run(a: RunArgs) -> Result<ExitCode> {
    let args = match &a.args {
        Some(text) => Some(serde_json::from_str(text).context("--args is not valid JSON")?),
        None => None,
    };
    let backend = backend::from_spec(&a.backend)?;
    let host = Arc::new(Host::new(HostConfig { backend, ..HostConfig::default() })?);
    let path = target::resolve(&a.target)?;
    let factory = host.load_file(&path).await.with_context(|| format!("loading {}", path.display()))?;

    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let ui = tokio::spawn(progress_ui::render(rx, factory.meta.name.clone(), a.quiet));
    let interrupt = {
        let host = host.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("\nfactory: interrupted, cancelling the run...");
                host.cancel_all();
            }
        })
    };
    let options = RunOptions { args, limits: a.limits.limits(), events: Some(tx), on_start: None };
    let envelope = host.run(&factory, options).await;
    interrupt.abort();
    let _ = ui.await;
    let envelope = envelope?;

    if a.json {
        println!("{}", serde_json::to_string_pretty(&envelope)?);
    } else if let Some(result) = &envelope.result {
        println!("{}", serde_json::to_string_pretty(result)?);
    }
    let acc = &envelope.accounting;
    if envelope.status == RunStatus::Completed {
        if !a.quiet {
            eprintln!(
                "factory: run {} completed: {} agents spawned, {} replayed, {:.2}s active, {} AI credits",
                envelope.run_id,
                acc.agents_spawned,
                acc.agent_cache_hits,
                acc.active_seconds,
                acc.ai_credits()
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    let why = envelope.failure.as_ref().map_or_else(
        || envelope.error.clone().unwrap_or_default(),
        |f| match &f.kind {
            Some(kind) => format!("{} ({}): {}", f.kind_type, kind, f.message),
            None => format!("{}: {}", f.kind_type, f.message),
        },
    );
    let status = serde_json::to_value(envelope.status)?;
    eprintln!("factory: run {} ended as {}: {why}", envelope.run_id, status.as_str().unwrap_or("?"));
    Ok(ExitCode::from(if envelope.status == RunStatus::Cancelled { 130 } else { 1 }))
}
