//! `factory run` and `factory resume`: drive one attempt in the foreground with progress on
//! stderr, print the result (or the envelope with `--json`) on stdout. Ctrl-C cancels the
//! run cleanly and says how to resume it. Exit code 0 only for `completed`.

use super::context::{self, serve};
use super::{progress_ui, target, GlobalArgs, LimitArgs};
use anyhow::{Context, Result};
use clap::Args;
use factory_host::backend::AgentBackend;
use factory_host::{Factory, Host, ProgressEntry, ResumeOptions, RunEnvelope, RunOptions, RunStatus};
use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use tokio::sync::mpsc;

/// How the run is shown and who answers its subagents.
#[derive(Args)]
pub struct OutputArgs {
    #[command(flatten)]
    backend: super::backends::BackendArgs,
    /// Print the run envelope as JSON instead of the result.
    #[arg(long)]
    json: bool,
    /// No progress output on stderr.
    #[arg(long, short)]
    quiet: bool,
}

#[derive(Args)]
pub struct RunArgs {
    /// A component file (`.wasm`), a Rust factory crate directory, or a registered name.
    target: String,
    /// Arguments as JSON (default `{}`).
    #[arg(long, value_name = "JSON")]
    args: Option<String>,
    #[command(flatten)]
    out: OutputArgs,
    #[command(flatten)]
    limits: LimitArgs,
}

#[derive(Args)]
pub struct ResumeArgs {
    /// The run to resume.
    run_id: String,
    /// Run this component (file or crate directory) instead of the last attempt's.
    #[arg(long, value_name = "FILE|DIR")]
    component: Option<PathBuf>,
    #[command(flatten)]
    out: OutputArgs,
    #[command(flatten)]
    limits: LimitArgs,
}

fn make_backend(g: &GlobalArgs, out: &OutputArgs) -> Result<Arc<dyn AgentBackend>> {
    super::backends::run_backend(g, &out.backend)
}

/// Load what `target` names: a file, a crate directory, or a registered factory.
async fn load(host: &Host, target: &str) -> Result<Factory> {
    let path = PathBuf::from(target);
    if path.exists() {
        let file = target::resolve(&path)?;
        return host.load_file(&file).await.with_context(|| format!("loading {}", file.display()));
    }
    let looks_like_name = !target.contains('/') && !target.ends_with(".wasm");
    if looks_like_name {
        if let Ok(factory) = host.load_registered(target).await {
            return Ok(factory);
        }
    }
    anyhow::bail!("`{target}` is neither a component file, a crate directory, nor a registered factory")
}

pub async fn run(g: &GlobalArgs, a: RunArgs) -> Result<ExitCode> {
    let args = match &a.args {
        Some(text) => Some(serde_json::from_str(text).context("--args is not valid JSON")?),
        None => None,
    };
    let host = context::open_host(g, make_backend(g, &a.out)?)
        .with_context(|| format!("opening the store in {}", g.state_dir.display()))?;
    let factory = load(&host, &a.target).await?;
    let session = Some(g.session.clone());
    let limits = a.limits.limits();
    drive(g, &host, &a.out, |events| {
        let options = RunOptions { args, limits, session, events: Some(events), on_start: None };
        let host = host.clone();
        async move { host.run(&factory, options).await }
    })
    .await
}

pub async fn resume(g: &GlobalArgs, a: ResumeArgs) -> Result<ExitCode> {
    let host = context::open_host(g, make_backend(g, &a.out)?)
        .with_context(|| format!("opening the store in {}", g.state_dir.display()))?;
    let component = match &a.component {
        Some(path) => {
            let file = target::resolve(path)?;
            Some(host.load_file(&file).await.with_context(|| format!("loading {}", file.display()))?)
        }
        None => None,
    };
    let session = Some(g.session.clone());
    let limits = a.limits.limits();
    let run_id = a.run_id.clone();
    drive(g, &host, &a.out, |events| {
        let options = ResumeOptions { limits, component, session, events: Some(events) };
        let host = host.clone();
        async move { host.resume(&run_id, options).await }
    })
    .await
}

/// Run `start` with progress, Ctrl-C handling and the control socket, then report.
async fn drive<F, Fut>(g: &GlobalArgs, host: &Arc<Host>, out: &OutputArgs, start: F) -> Result<ExitCode>
where
    F: FnOnce(mpsc::UnboundedSender<ProgressEntry>) -> Fut,
    Fut: Future<Output = Result<RunEnvelope, factory_host::Error>>,
{
    let _serving = serve(g, host);
    let (tx, rx) = mpsc::unbounded_channel();
    let ui = tokio::spawn(progress_ui::render(rx, out.quiet));
    let interrupt = {
        let host = host.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("\nfactory: interrupted, cancelling the run...");
                host.cancel_all();
            }
        })
    };
    let envelope = start(tx).await;
    interrupt.abort();
    let _ = ui.await;
    report(&envelope?, out)
}

/// Print the outcome and choose the exit code.
fn report(envelope: &RunEnvelope, out: &OutputArgs) -> Result<ExitCode> {
    if out.json {
        println!("{}", serde_json::to_string_pretty(envelope)?);
    } else if let Some(result) = &envelope.result {
        println!("{}", serde_json::to_string_pretty(result)?);
    }
    let acc = &envelope.accounting;
    if envelope.status == RunStatus::Completed {
        if !out.quiet {
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
    eprintln!("factory: resume it with: factory resume {}", envelope.run_id);
    Ok(ExitCode::from(if envelope.status == RunStatus::Cancelled { 130 } else { 1 }))
}
