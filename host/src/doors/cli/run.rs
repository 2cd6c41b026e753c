//! `factory run` and `factory resume`: drive one attempt with progress on stderr and print
//! the result (or the envelope with `--json`) on stdout. Ctrl-C cancels the run cleanly and
//! says how to resume it; exit code 0 only for `completed`. Either way a run starts through
//! the service: the one in this process when it opens the store (a cassette or a config
//! file of the command's own rides along as the backend), else the process holding the
//! store (a `--replay` cassette read here goes with the start, and a `--record` one comes
//! back with its end and is written here), and is followed from here;
//! `--detach` hands it to a background `factory serve` (started if needed) and prints the
//! run id.

use crate::doors::args::{GlobalArgs, LimitArgs};
use crate::doors::cli::backends::{cassette_backend, load_config, BackendArgs};
use crate::doors::cli::conventions::{paint, stderr_colored};
use crate::doors::cli::escape::esc;
use crate::doors::cli::events::EventSink;
use crate::doors::cli::trust::{self, ConsentArgs, YesArg};
use crate::doors::cli::{progress_ui, remote, target};
use crate::doors::reach::{self, serve};
use anstyle::AnsiColor;
use anyhow::{Context, Result};
use clap::Args;
use factory_host::backend::AgentBackend;
use factory_host::config::Config;
use factory_host::service::{Client, Consent, InProcess, Local, Request, Tape, Target};
use factory_host::{RunEnvelope, RunStatus, Scope};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

/// How the run is shown and who answers its subagents.
#[derive(Args)]
pub struct OutputArgs {
    #[command(flatten)]
    backend: BackendArgs,
    /// Print the run envelope as JSON instead of the result.
    #[arg(long)]
    json: bool,
    /// No progress output on stderr.
    #[arg(long, short)]
    quiet: bool,
    /// Write versioned lifecycle events as JSON lines to FILE or to open descriptor `fd:N`.
    #[arg(long, value_name = "FILE|fd:N")]
    events: Option<String>,
    /// Hand the run to a background `factory serve` (started if needed), print its id, exit.
    #[arg(long)]
    detach: bool,
}

#[derive(Args)]
pub struct RunArgs {
    /// A component file (`.wasm`), a Rust factory crate directory, a Python factory (`.py` file or project directory), or a registered name.
    target: String,
    /// Arguments as JSON (default `{}`).
    #[arg(long, value_name = "JSON")]
    args: Option<String>,
    #[command(flatten)]
    out: OutputArgs,
    #[command(flatten)]
    limits: LimitArgs,
    #[command(flatten)]
    consent: ConsentArgs,
}

#[derive(Args)]
pub struct ResumeArgs {
    /// The run to resume.
    run_id: String,
    /// Run this component (file or crate directory) instead of the last attempt's.
    #[arg(long, value_name = "FILE|DIR")]
    component: Option<PathBuf>,
    /// The answer to the checkpoint the paused run waits at (JSON): its `ctx.pause(key)`
    /// returns it. Without it, `ctx.pause(key)` returns none.
    #[arg(long, value_name = "JSON", value_parser = parse_input)]
    input: Option<serde_json::Value>,
    #[command(flatten)]
    out: OutputArgs,
    #[command(flatten)]
    limits: LimitArgs,
    #[command(flatten)]
    yes: YesArg,
}

/// `--input`: JSON text.
fn parse_input(text: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(text).map_err(|e| format!("not JSON: {e} (quote a string as JSON: '\"yes\"')"))
}

/// What another process needs to find the component: an absolute file path (a crate
/// directory is built here first) or a registered name.
fn remote_target(target: &str, build: &target::BuildConsent) -> Result<Target> {
    match target::classify(target) {
        target::Named::Path(path) => Ok(Target::File(std::path::absolute(target::resolve(&path, build)?)?)),
        target::Named::Registered(name) => Ok(Target::Registered(name)),
    }
}

/// Open the store here (the service in this process, with the backend configuration), or
/// `None` when another process holds it.
async fn open_local(g: &GlobalArgs, out: &OutputArgs) -> Result<Option<(Local, Arc<Config>)>> {
    if out.detach {
        return Ok(None);
    }
    let config = Arc::new(load_config(g, out.backend.config.as_ref())?);
    // A cassette, or a config file of this command's own or of the project (the service
    // reads neither), is used here when this process can open the store itself; when a
    // service holds it, a cassette goes with the start and comes back with its end instead.
    let project_config = factory_host::config::Config::discover_path(&g.state_dir)
        .is_some_and(|path| factory_host::access::is_project_local(&path));
    let reach = if out.backend.cassette() || out.backend.config.is_some() || project_config {
        reach::open_here_or_reach(g, config.clone(), reach::Holder::Command).await?
    } else {
        reach::open_or_reach(g, config.clone(), reach::Holder::Command).await?
    };
    match reach {
        Client::Local(local) => Ok(Some((local, config))),
        Client::Remote(_) => Ok(None),
    }
}

pub async fn run(g: &GlobalArgs, a: RunArgs) -> Result<ExitCode> {
    let args = match &a.args {
        Some(text) => Some(serde_json::from_str(text).context("--args is not valid JSON")?),
        None => None,
    };
    let events = a.out.events.as_deref().map(EventSink::open).transpose()?;
    let limits = a.limits.limits();
    let grants = a.consent.grants()?;
    let Some((local, config)) = open_local(g, &a.out).await? else {
        let backend = a.out.backend.remote_choice(a.out.detach)?;
        // A cassette is read here, as the caller, and refused here before anything is sent.
        let replay = a.out.backend.sent_tape()?;
        let component = remote_target(&a.target, &target::BuildConsent::new(g, a.consent.yes.yes))?;
        let yes = &a.consent.yes;
        let shown = shown_remote(&backend, replay.as_ref());
        // The service that will run it (started now for a detached run, which starts it
        // anyway) describes the factory for the consent question, as it will load it.
        let client = Client::Remote(crate::doors::daemon::ensure(g).await?);
        let approved =
            trust::consent_remote(g, yes, &a.target, &component, &limits, Some(&grants), &shown, &client).await?;
        let declined = approved.is_none();
        let request = Request::Run {
            session: g.session.clone(),
            component,
            args,
            limits,
            backend,
            grants,
            declined,
            // Consent was given here (a prompt, --yes, or trusted) for exactly what was read
            // here: the serving process runs it only if it loads the same.
            consent: approved.map_or(Consent::None, Consent::Sha256),
            trace_parent: None,
            // The service runs elsewhere: it hides this directory from agent sandboxes.
            caller_cwd: factory_host::service::caller_cwd(),
            replay,
            // Recorded there, written here (`remote::start`).
            record: a.out.backend.record.is_some(),
        };
        return match remote::start(g, request, a.out.detach, a.out.quiet, events, a.out.backend.record.as_deref())
            .await?
        {
            Some(envelope) if declined => trust::report_declined(&envelope, a.out.json),
            Some(envelope) => report(envelope, &a.out),
            None => Ok(ExitCode::SUCCESS),
        };
    };
    // The run starts as every door starts one: through the service (here, in this process),
    // which checks the consent given here. A cassette or a configuration file of this
    // command's own builds a backend no request can name: it is handed over with the run.
    // An unusable backend is refused before anything is created or asked.
    let host = local.host().clone();
    // Built once: shown in the consent question, then handed over with the start.
    let backend = match cassette_backend(&config, &a.out.backend, None)? {
        Some(backend) => backend,
        None => host.chosen_backend(&a.out.backend.choice())?,
    };
    let shown = backend.describe();
    let component = local_target(&a.target, &target::BuildConsent::new(g, a.consent.yes.yes))?;
    let client = Client::Local(local.clone());
    let approved =
        trust::consent_remote(g, &a.consent.yes, &a.target, &component, &limits, Some(&grants), &shown, &client)
            .await?;
    let declined = approved.is_none();
    let request = Request::Run {
        session: g.session.clone(),
        component,
        args,
        limits,
        backend: a.out.backend.choice(),
        grants,
        declined,
        consent: approved.map_or(Consent::None, Consent::Sha256),
        trace_parent: None,
        // This process's own working directory is always hidden from agent sandboxes.
        caller_cwd: None,
        // A cassette here is the backend handed over below.
        replay: None,
        record: false,
    };
    let envelope = in_process(g, &local, request, Some(backend), a.out.quiet, events).await?;
    if declined {
        return trust::report_declined(&envelope, a.out.json);
    }
    report(envelope, &a.out)
}

pub async fn resume(g: &GlobalArgs, a: ResumeArgs) -> Result<ExitCode> {
    let events = a.out.events.as_deref().map(EventSink::open).transpose()?;
    let limits = a.limits.limits();
    let Some((local, config)) = open_local(g, &a.out).await? else {
        let backend = a.out.backend.remote_choice(a.out.detach)?;
        let replay = a.out.backend.sent_tape()?;
        let component = match &a.component {
            Some(path) => Some(std::path::absolute(target::resolve(path, &target::BuildConsent::new(g, a.yes.yes))?)?),
            None => None,
        };
        let approved = match &component {
            Some(file) => {
                let source = file.display().to_string();
                let shown = shown_remote(&backend, replay.as_ref());
                let client = Client::Remote(crate::doors::daemon::ensure(g).await?);
                match trust::consent_remote(
                    g,
                    &a.yes,
                    &source,
                    &Target::File(file.clone()),
                    &limits,
                    None,
                    &shown,
                    &client,
                )
                .await?
                {
                    Some(key) => Some(key),
                    None => {
                        eprintln!("factory: not resumed: the component was declined");
                        return Ok(ExitCode::from(1));
                    }
                }
            }
            None => reapprove(g, &a.yes, &Client::Remote(crate::doors::daemon::remote(g)), &a.run_id).await?,
        };
        let request = Request::Resume {
            // The local user resumes a run of any session; it stays in its own.
            scope: Scope::Owner,
            run_id: a.run_id.clone(),
            component,
            limits,
            backend,
            // Consent was checked above (trusted, --yes, or a prompt) for this trust key.
            consent: approved.map_or(Consent::None, Consent::Sha256),
            trace_parent: None,
            // The service runs elsewhere: it hides this directory from agent sandboxes.
            caller_cwd: factory_host::service::caller_cwd(),
            input: a.input.clone(),
            replay,
            record: a.out.backend.record.is_some(),
        };
        return match remote::start(g, request, a.out.detach, a.out.quiet, events, a.out.backend.record.as_deref())
            .await?
        {
            Some(envelope) => report(envelope, &a.out),
            None => Ok(ExitCode::SUCCESS),
        };
    };
    // As `run`: through the service in this process, with the consent given here.
    let host = local.host().clone();
    let client = Client::Local(local.clone());
    let component = match &a.component {
        Some(path) => Some(std::path::absolute(target::resolve(path, &target::BuildConsent::new(g, a.yes.yes))?)?),
        None => None,
    };
    let approved = match &component {
        Some(file) => {
            // The backend the resume will use: --backend, else the one the run recorded.
            let name = match &a.out.backend.backend {
                Some(name) => Some(name.clone()),
                None => host.envelope(Scope::Owner, &a.run_id).await.ok().and_then(|e| e.backend).map(|b| b.name),
            };
            let shown = match name {
                Some(name) => config.run_backend(Some(&name), None).map_or(format!("`{name}`"), |b| b.describe()),
                None => "the backend the run recorded".to_string(),
            };
            let source = file.display().to_string();
            match trust::consent_remote(g, &a.yes, &source, &Target::File(file.clone()), &limits, None, &shown, &client)
                .await?
            {
                Some(key) => Some(key),
                None => {
                    eprintln!("factory: not resumed: the component was declined");
                    return Ok(ExitCode::from(1));
                }
            }
        }
        None => reapprove(g, &a.yes, &client, &a.run_id).await?,
    };
    // A cassette wraps the run's recorded backend unless --backend names another.
    let own_backend = if a.out.backend.cassette() {
        let recorded = host.envelope(Scope::Owner, &a.run_id).await?.backend;
        cassette_backend(&config, &a.out.backend, recorded.as_ref())?
    } else {
        None
    };
    let request = Request::Resume {
        scope: Scope::Owner,
        run_id: a.run_id.clone(),
        component,
        limits,
        backend: a.out.backend.choice(),
        consent: approved.map_or(Consent::None, Consent::Sha256),
        trace_parent: None,
        caller_cwd: None,
        input: a.input.clone(),
        replay: None,
        record: false,
    };
    let envelope = in_process(g, &local, request, own_backend, a.out.quiet, events).await?;
    report(envelope, &a.out)
}

/// The backend a consent question names for a start the process holding the store runs:
/// the cassette sent with it, or the backend it configures.
fn shown_remote(choice: &factory_host::BackendChoice, replay: Option<&Tape>) -> String {
    match replay {
        Some(tape) if tape.then_live => {
            format!("replay of `{}`, then {}", tape.shown.display(), trust::remote_backend(choice))
        }
        Some(tape) => format!("replay of `{}`", tape.shown.display()),
        None => trust::remote_backend(choice),
    }
}

/// Consent again to the component a resume runs (the run's last one), as
/// [`trust::reapprove`] says.
/// Returns the trust key consented to (`None`: the run has no attempt yet).
async fn reapprove(g: &GlobalArgs, yes: &YesArg, client: &Client, run_id: &str) -> Result<Option<String>> {
    let detail = client.detail(Scope::Owner, run_id).await?;
    // A script factory is trusted by its source's sha256 (the runner is this binary's).
    let script = detail.scripts.last().and_then(|s| s.as_ref()).map(|s| s.sha256.as_str());
    let component = detail.component_hashes.last().map(String::as_str);
    match script.or(component) {
        Some(hash) => {
            trust::reapprove(g, yes, run_id, &detail.envelope.factory, hash).await.map(|()| Some(hash.to_string()))
        }
        // A run with no attempt yet has nothing to approve again; the resume says why it cannot start.
        None => Ok(None),
    }
}

/// A component named on the command line, for the service in this process: an absolute
/// file path (a crate directory is built here first) or a registered name.
fn local_target(target: &str, build: &target::BuildConsent) -> Result<Target> {
    if let target::Named::Path(path) = target::classify(target) {
        if !path.exists() && !target::is_script_target(target) {
            anyhow::bail!("`{target}` is neither a component file, a crate directory, nor a registered factory")
        }
    }
    remote_target(target, build)
}

/// Start `request` through the service in this process (with `backend`, when this command
/// built its own) and show its progress live to its end, with the control socket served
/// meanwhile. Ctrl-C (SIGINT) cancels the run; SIGTERM and SIGHUP (a closed terminal, a
/// supervisor stopping us) end it as `halted`, resumable, as `factory serve` does.
async fn in_process(
    g: &GlobalArgs,
    local: &Local,
    request: Request,
    backend: Option<Arc<dyn AgentBackend>>,
    quiet: bool,
    events: Option<EventSink>,
) -> Result<RunEnvelope> {
    let host = local.host().clone();
    let serving = serve(g, &host);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let ui = progress_ui::spawn(rx, quiet, events.clone());
    use tokio::signal::unix::{signal, SignalKind};
    // Installed before the run starts, so a signal that arrives early is not lost.
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut hangup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    let interrupt = {
        let host = host.clone();
        // Not eprintln!: after a hang-up stderr may be gone, and a failed write must not
        // panic before the run is stopped.
        let say = |text: &str| {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "\nfactory: {text}");
        };
        tokio::spawn(async move {
            let why = tokio::select! {
                Ok(()) = tokio::signal::ctrl_c() => {
                    say("interrupted, cancelling the run...");
                    host.cancel_all();
                    return;
                }
                Some(()) = term.recv() => "terminated",
                Some(()) = hangup.recv() => "hung up",
                else => return,
            };
            say(&format!("{why}; the run ends as halted (resume it later)"));
            // Halt until this task is aborted (the run has ended): a signal that came before
            // the run registered itself still halts it once it has.
            loop {
                host.shutdown();
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        })
    };
    // `run_started` is written as the run gets its id, before any of its progress.
    let announce = events
        .clone()
        .map(|sink| -> factory_host::engine::host::OnStart { Box::new(move |run_id: &str| sink.started(run_id)) });
    let here = InProcess { backend, events: Some(tx), on_start: announce };
    let envelope = match local.start_with(request, here).await {
        Ok((_, attempt)) => attempt.await.map_err(factory_host::Error::Task).and_then(|ended| ended),
        Err(e) => Err(e),
    };
    interrupt.abort();
    ui.finish().await;
    if let Some(serving) = serving {
        serving.drain().await;
    }
    let envelope = envelope?;
    if let Some(sink) = &events {
        sink.finished(&envelope);
    }
    Ok(envelope)
}

/// Print the outcome and choose the exit code.
pub fn report(envelope: RunEnvelope, out: &OutputArgs) -> Result<ExitCode> {
    if out.json {
        outln!("{}", serde_json::to_string_pretty(&envelope)?);
    } else if let Some(result) = &envelope.result {
        match result.to_value() {
            Ok(value) => outln!("{}", serde_json::to_string_pretty(&value)?),
            Err(_) => outln!("{}", esc(&result.to_string())),
        }
    }
    let acc = &envelope.accounting;
    if envelope.status == RunStatus::Completed {
        if !out.quiet {
            let completed = paint(stderr_colored(), AnsiColor::Green.on_default(), "completed");
            eprintln!(
                "factory: run {} {completed}: {} agents spawned, {} replayed, {:.2}s active, {}{} AI credits",
                envelope.run_id,
                acc.agents_spawned,
                acc.agent_cache_hits,
                acc.active_seconds,
                if acc.ai_credits_at_least { "at least " } else { "" },
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
    let status = paint(stderr_colored(), AnsiColor::Red.on_default().bold(), envelope.status.as_str());
    // The failure's message is the guest's (or a backend's) text: escaped, on one line.
    eprintln!("factory: run {} ended as {status}: {}", envelope.run_id, esc(&why));
    match envelope.checkpoint.as_deref().filter(|_| envelope.status == RunStatus::Paused) {
        Some(key) => eprintln!(
            "factory: it waits at checkpoint {}: answer it with: factory resume {} --input JSON (or resume without one)",
            esc(key),
            envelope.run_id
        ),
        None => eprintln!("factory: resume it with: factory resume {}", envelope.run_id),
    }
    Ok(ExitCode::from(if envelope.status == RunStatus::Cancelled { 130 } else { 1 }))
}
