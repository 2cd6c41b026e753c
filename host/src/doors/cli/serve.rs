//! `factory serve`: the service of a state directory. It holds the store, serves the
//! control socket every other front door talks to (see [`crate::doors::daemon`]), and with
//! `--http` the JSON API and the dashboard. Started by hand it runs until stopped; started
//! by a front door (`--idle-exit`) it exits after that long with no active run and no
//! client. At start it resumes the runs a crash or a stop of a service left `halted`
//! ([`factory_host::recover`]), and arms the timer that resumes the runs parked for their
//! backend's quota at its reset; on SIGINT/SIGTERM it stops its runs as `halted` (resumable,
//! recovered by the next start) and exits.
//!
//! When another service already holds the store, `factory serve --http` attaches to it:
//! it serves HTTP as that service's client instead of failing on the lock.
//!
//! With `--store postgres://...` the runs live in that database instead (a
//! [`PgStore`](factory_host::store::PgStore) worker); the state directory keeps the socket
//! and the token, and the URL is only ever shown redacted. Such a worker claims queued runs
//! under its caps and reaps dead workers ([`factory_host::engine::queue`]); on SIGTERM it
//! drains: it stops claiming, lets its runs go on for `--drain-seconds`, then halts the rest
//! and hands them back to the queue.

use crate::doors::cli::backends::load_config;

/// Say a line like `eprintln!` does, through [`crate::doors::telemetry::say`]: a JSON
/// record of `serve.log` in a service started by a front door, whose stderr is that file.
macro_rules! say {
    ($($arg:tt)*) => {
        crate::doors::telemetry::say(&format!($($arg)*))
    };
}
use crate::doors::args::GlobalArgs;
use crate::doors::reach::{open_host, serve as serve_socket};
use anyhow::{Context, Result};
use clap::Args;
use factory_host::service::Client;
use factory_host::store::StoreError;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use tokio::signal::unix::{signal, SignalKind};

#[derive(Args)]
pub struct ServeArgs {
    /// The default backend for runs that do not choose one (default: the config's
    /// `default`, else `dry-run`). Resumed runs use the backend they recorded.
    #[arg(long, value_name = "SPEC")]
    backend: Option<String>,
    /// The backend config file (default: factory.toml in the state directory, if present).
    #[arg(long, env = "FACTORY_CONFIG", value_name = "FILE")]
    config: Option<std::path::PathBuf>,
    /// With --http: also the JSON API and the dashboard (the bearer token is written to
    /// <state-dir>/http.token).
    #[command(flatten)]
    bind: crate::doors::http::bind::HttpBindArgs,
    /// With --http: how long a dashboard session (opened by `factory ui`) lasts before the
    /// page must sign in again, e.g. `12h`, `30m` (default 12h). `factory ui --revoke`
    /// ends sessions sooner.
    #[arg(long, value_name = "DURATION", value_parser = parse_session_ttl, requires = "http")]
    ui_session_ttl: Option<Duration>,
    /// Exit after this many seconds with no active run and no client (default: never).
    #[arg(long, value_name = "SECONDS", value_parser = parse_idle)]
    idle_exit: Option<f64>,
    /// Set by a front door that starts the service: losing the store to another service
    /// that answers is then no error, and a store still held by a process on its way out
    /// is waited for.
    #[arg(long, hide = true)]
    started_by_front_door: bool,
    /// Leave the runs a crash or a stop of the service interrupted `halted` instead of
    /// resuming them at start (runs parked for their backend's quota still resume at their
    /// `resumeAt`).
    #[arg(long)]
    no_recover: bool,
    /// Automatic recoveries per run (counted since a caller last started or resumed it);
    /// past them an interrupted run stays `halted` until resumed by hand. Else the config
    /// file's `max_recoveries`, else 3.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_recoveries: Option<u32>,
    /// Keep runs in this PostgreSQL database instead of the state directory's redb file
    /// (postgres://USER[:PASSWORD]@HOST:PORT/DB; the password is never printed). The state
    /// directory still holds the control socket and the HTTP token. Else `FACTORY_STORE`,
    /// else the config file's `store` key.
    #[arg(long, env = "FACTORY_STORE", value_name = "URL", value_parser = parse_store)]
    store: Option<String>,
    /// With a shared store: this worker's id (default: the host name and a hash of the state
    /// directory, so a restarted service takes its own runs back at once).
    #[arg(long, env = "FACTORY_WORKER_ID", value_name = "ID")]
    worker_id: Option<String>,
    /// With a shared store: runs this worker executes at once (0: it executes none and only queues
    /// the runs started through it for the other workers). Else the config file's `max_runs`,
    /// else no cap.
    #[arg(long, value_name = "N")]
    max_runs: Option<usize>,
    /// With a shared store: runs executing at once across all the workers; a worker claims a
    /// queued run only while fewer are (give every worker the same value). Else the config
    /// file's `cluster_max_runs`, else no cap.
    #[arg(long, value_name = "N")]
    cluster_max_runs: Option<usize>,
    /// With a shared store: agent calls in flight at once across all the workers on backend NAME
    /// (exact: each call holds one of N slot rows in the database while it runs; give every
    /// worker the same value). Repeatable, one per backend; wins over the config file's
    /// `backend_max_calls = { NAME = N }` for that backend.
    #[arg(long, value_name = "NAME=N", value_parser = parse_backend_cap)]
    backend_max_calls: Vec<(String, u32)>,
    /// With a shared store: on SIGTERM, how long the worker lets its runs go on before it halts the
    /// rest and hands them back to the queue for another worker. Else the config file's
    /// `drain_seconds`, else 10.
    #[arg(long, value_name = "SECONDS", value_parser = parse_drain)]
    drain_seconds: Option<f64>,
    /// With a shared store: read the database password from this file (readable by its
    /// owner only) instead of the URL, which other local users can read in the process list.
    /// Else `PGPASSWORD`, else `~/.pgpass` (or `PGPASSFILE`), as libpq reads them.
    #[arg(long, env = "FACTORY_STORE_PASSWORD_FILE", value_name = "FILE")]
    store_password_file: Option<std::path::PathBuf>,
    /// With a shared store: a directory under which this worker mounts the grants (--allow-read)
    /// of runs it executes without a caller of its own (claimed from the queue, recovered).
    /// Repeatable, added to the config file's `allow_grant_roots`; default none: such a run with
    /// a grant is refused here (`grant_not_allowed`).
    #[arg(long, value_name = "DIR")]
    allow_grant_root: Vec<std::path::PathBuf>,
}

/// Default of `--drain-seconds`.
const DEFAULT_DRAIN_SECONDS: f64 = 10.0;

fn parse_backend_cap(text: &str) -> Result<(String, u32), String> {
    let (name, n) = text.split_once('=').ok_or_else(|| format!("--backend-max-calls takes NAME=N, got {text}"))?;
    match n.trim().parse::<u32>() {
        Ok(n) if n > 0 && !name.trim().is_empty() => Ok((name.trim().to_string(), n)),
        _ => Err(format!("--backend-max-calls takes NAME=N with N a positive whole number, got {text}")),
    }
}

fn parse_drain(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && (0.0..=1e6).contains(&s) => Ok(s),
        _ => Err(format!("--drain-seconds must be a number of seconds, got {text}")),
    }
}

fn parse_store(text: &str) -> Result<String, String> {
    if factory_host::store::postgres::is_postgres_url(text) {
        Ok(text.to_string())
    } else {
        Err("--store takes a postgres:// URL (the default store is the state directory's redb file)".into())
    }
}

impl ServeArgs {
    /// Whether a front door started this service (its stderr is then the service log).
    pub fn started_by_front_door(&self) -> bool {
        self.started_by_front_door
    }
}

fn parse_session_ttl(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text.trim()) {
        Ok(ttl) if ttl >= Duration::from_secs(1) && ttl <= Duration::from_secs(366 * 86400) => Ok(ttl),
        _ => Err(format!("--ui-session-ttl must be a duration from 1s to 366d (e.g. 12h, 30m), got {text}")),
    }
}

fn parse_idle(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s <= 1e9 => Ok(s),
        _ => Err(format!("--idle-exit must be a positive number of seconds, got {text}")),
    }
}

/// How long a service started by a front door waits for the store's lock.
const LOCK_PATIENCE: Duration = Duration::from_secs(10);

pub async fn serve(g: &GlobalArgs, a: ServeArgs) -> Result<ExitCode> {
    let http = a.bind.address()?;
    let ui_ttl = a.ui_session_ttl.unwrap_or(crate::doors::http::bearer::SESSION_TTL);
    let mut config = load_config(g, a.config.as_ref())?;
    if let Some(name) = a.backend {
        // Checked now, so a daemon with an unusable default says so at start.
        config.run_backend(Some(&name), None).with_context(|| format!("setting up backend `{name}`"))?;
        config.default = Some(name);
    }
    let config = std::sync::Arc::new(config);
    let deadline = Instant::now() + LOCK_PATIENCE;
    // --store, else FACTORY_STORE (both through clap), else the config file's `store`.
    let store = a.store.clone().or_else(|| config.store.clone());
    if store.is_none() && a.worker_id.is_some() {
        anyhow::bail!("--worker-id needs a shared store (--store, FACTORY_STORE or the config file's `store`)");
    }
    // Each setting: its flag, else the config file's key, else its default.
    let file = &config.serve;
    let max_runs = a.max_runs.or(file.max_runs);
    let cluster_max_runs = a.cluster_max_runs.or(file.cluster_max_runs);
    let mut backend_max_calls = file.backend_max_calls.clone();
    backend_max_calls.extend(a.backend_max_calls.iter().cloned());
    let max_recoveries =
        a.max_recoveries.or(file.max_recoveries).unwrap_or(factory_host::recover::DEFAULT_MAX_RECOVERIES);
    let drain_seconds = a.drain_seconds.or(file.drain_seconds).unwrap_or(DEFAULT_DRAIN_SECONDS);
    if store.is_none()
        && (!a.allow_grant_root.is_empty() || !file.allow_grant_roots.is_empty() || a.store_password_file.is_some())
    {
        anyhow::bail!(
            "--allow-grant-root (or the config file's allow_grant_roots) and --store-password-file need a shared store \
             (--store, FACTORY_STORE or the config file's `store`)"
        );
    }
    if store.is_none() && (max_runs.is_some() || cluster_max_runs.is_some() || !backend_max_calls.is_empty()) {
        anyhow::bail!("--max-runs, --cluster-max-runs and --backend-max-calls (or the config file's max_runs, cluster_max_runs and backend_max_calls) need a shared store (--store, FACTORY_STORE or the config file's `store`)");
    }
    let host = if let Some(url) = &store {
        // The store's errors name its URL, redacted.
        let caps = factory_host::engine::caps::Caps {
            worker_runs: max_runs,
            cluster_runs: cluster_max_runs,
            backend_calls: backend_max_calls,
        };
        let roots: Vec<std::path::PathBuf> =
            file.allow_grant_roots.iter().chain(&a.allow_grant_root).cloned().collect();
        let trust = cluster_trust(g, &roots)?;
        let keyed = trust.keyed();
        let password =
            crate::doors::cli::workers::store_password(url, a.store_password_file.as_deref(), a.store.is_some())?;
        let host = crate::doors::reach::open_shared_host(
            g,
            config.clone(),
            url,
            a.worker_id.as_deref(),
            caps,
            trust,
            password,
        )
        .await
        .context("opening the shared store")?;
        if !keyed {
            eprintln!(
                "factory serve: warning: no cluster token (--token-file or FACTORY_TOKEN): the consent of a queued run is \
                 sealed with a plain digest, which anyone who can write the database can recompute; give every worker \
                 the same --token-file"
            );
        }
        host
    } else {
        loop {
            match open_host(g, config.clone(), crate::doors::reach::Holder::Service) {
                Ok(host) => break host,
                Err(factory_host::Error::Store(StoreError::Locked(path))) => {
                    let remote = Client::Remote(crate::doors::daemon::remote(g));
                    if remote.runs_page(&g.session, None, Some(1)).await.is_ok() {
                        if let Some(addr) = http {
                            return attach(g, remote, addr, ui_ttl).await;
                        }
                        if a.started_by_front_door {
                            say!(
                                "factory serve: pid {}: another service already serves {}; exiting",
                                std::process::id(),
                                g.state_dir.display()
                            );
                            return Ok(ExitCode::SUCCESS);
                        }
                        anyhow::bail!(
                            "a factory service already holds the store {} and answers on {} (stop it with SIGTERM first)",
                            path.display(),
                            crate::doors::daemon::remote(g).socket().display()
                        );
                    }
                    if !a.started_by_front_door || Instant::now() >= deadline {
                        return Err(factory_host::Error::Store(StoreError::Locked(path)))
                            .with_context(|| format!("opening the store in {}", g.state_dir.display()));
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => return Err(e).with_context(|| format!("opening the store in {}", g.state_dir.display())),
            }
        }
    };
    // Said before the socket answers, so a front door that got an answer finds this line.
    match &store {
        Some(url) => say!(
            "factory serve: pid {}, worker of the store {} (state directory {})",
            std::process::id(),
            factory_host::store::postgres::redact(url),
            g.state_dir.display()
        ),
        None => say!("factory serve: pid {}, holds the store of {}", std::process::id(), g.state_dir.display()),
    }
    let serving = serve_socket(g, &host).context("cannot serve the control socket")?;
    if let Some(requests) = host.store().cancel_requests() {
        tokio::spawn(cancel_when_asked(host.clone(), requests));
    }
    if let Some(requests) = host.store().pause_requests() {
        tokio::spawn(pause_when_asked(host.clone(), requests));
    }
    if let Some(changes) = host.store().run_changes() {
        tokio::spawn(announce_changes(host.clone(), changes));
    }
    if !a.no_recover {
        // Before the banner: once it is printed, every interrupted run is resumed or left.
        let recovered = factory_host::recover::recover_interrupted(&host, max_recoveries)
            .await
            .context("reading the runs to recover")?;
        for recovery in recovered {
            say!("factory serve: {recovery}");
        }
    }
    // Runs parked for their backend's quota resume by themselves at its reset (also with
    // --no-recover: no crash interrupted them), at once when it has passed.
    for parked in factory_host::recover::arm_parked(&host).await.context("reading the parked runs")? {
        say!("factory serve: {parked}");
    }
    tokio::spawn(factory_host::recover::resume_parked_when_due(host.clone()));
    // The config file's retention policy, applied now and every interval.
    if let Some(retention) = config.retention.as_ref().filter(|r| r.policy().is_set()) {
        tokio::spawn(collect_every(host.clone(), retention.policy(), retention.interval()));
    }
    // A worker of a shared store claims queued runs and reaps dead workers until it drains.
    let claiming = tokio_util::sync::CancellationToken::new();
    if host.store().run_queue().is_some() {
        tokio::spawn(factory_host::engine::queue::claim_loop(host.clone(), max_recoveries, claiming.clone()));
        tokio::spawn(factory_host::engine::queue::reap_loop(host.store().clone(), claiming.clone()));
    }
    say!("factory serve: pid {}, serving {}", std::process::id(), serving.path().display());
    if let Some(addr) = http {
        let client = Client::Local(crate::doors::reach::local(g, &host));
        let bound = crate::doors::http::serve(
            client,
            addr,
            &g.state_dir,
            g.session.clone(),
            g.cluster_token()?.as_deref(),
            ui_ttl,
        )
        .await
        .with_context(|| format!("serving HTTP on {addr}"))?;
        announce_http(g, bound);
    }
    let mut term = signal(SignalKind::terminate())?;
    let idle = idle_exit(&host, &serving, a.idle_exit);
    let queued = host.store().run_queue().is_some();
    let stopping = if queued {
        "factory serve: draining: claiming no more runs"
    } else {
        "factory serve: shutting down; running runs end as halted"
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => say!("{stopping}"),
        _ = term.recv() => say!("{stopping}"),
        _ = idle => say!("factory serve: idle for {} s with no run and no client; exiting", a.idle_exit.unwrap_or_default()),
    }
    if queued {
        drain(&host, &claiming, Duration::from_secs_f64(drain_seconds)).await;
    }
    if http.is_some() {
        // `factory ui` then says no daemon serves HTTP here.
        let _ = std::fs::remove_file(g.state_dir.join(crate::doors::http::ADDR_FILE));
    }
    let halting = host.active_runs();
    if let (Some(queue), false) = (host.store().run_queue(), halting.is_empty()) {
        // Held in the queue before they stop, so a `wait` elsewhere follows them to the
        // worker that resumes them instead of answering `halted`.
        if let Err(e) = queue.hold(halting.clone()).await {
            say!("factory serve: warning: cannot hold the runs in the queue before halting them ({e})");
        }
    }
    host.shutdown();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !host.active_runs().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    serving.drain().await;
    host.store().flush().await?;
    if let Some(queue) = host.store().run_queue() {
        // What the drain could not finish goes back to the queue: another worker resumes it
        // from its journal.
        if !halting.is_empty() {
            match queue.hand_back(halting).await {
                Ok(ids) => say!("factory serve: handed {} run{} back to the queue: {}", ids.len(), if ids.len() == 1 { "" } else { "s" }, ids.join(" ")),
                Err(e) => say!("factory serve: warning: cannot hand the halted runs back to the queue ({e}); a worker resumes them when it starts"),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What this worker checks before it runs what the shared store says: consent seals keyed
/// by the cluster token (when one is given), grants mounted only under `roots` (each must be
/// a directory; kept canonical).
fn cluster_trust(
    g: &GlobalArgs,
    roots: &[std::path::PathBuf],
) -> Result<factory_host::sandbox::admission::ClusterTrust> {
    let roots = roots
        .iter()
        .map(|root| {
            let canonical =
                std::fs::canonicalize(root).with_context(|| format!("--allow-grant-root {}", root.display()))?;
            anyhow::ensure!(canonical.is_dir(), "--allow-grant-root {}: not a directory", root.display());
            Ok(canonical)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(factory_host::sandbox::admission::ClusterTrust::new(g.cluster_token()?.as_deref(), roots))
}

/// Stop claiming (new runs started here go to the queue for the other workers), then let the
/// runs executing here go on for at most `bound`.
async fn drain(host: &factory_host::Host, claiming: &tokio_util::sync::CancellationToken, bound: Duration) {
    claiming.cancel();
    host.stop_claiming();
    let running = host.active_runs().len();
    if running == 0 && host.queue_idle() {
        return;
    }
    if running > 0 {
        say!(
            "factory serve: waiting up to {} s for {running} run{} to end",
            bound.as_secs_f64(),
            if running == 1 { "" } else { "s" }
        );
    }
    // Until the runs executing here ended and the queue entries of those that did are dropped.
    let deadline = Instant::now() + bound;
    while (!host.active_runs().is_empty() || !host.queue_idle()) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Announce to this service's followers the runs other workers sharing the store commit
/// to, so `wait`, `follow`/`watch` and the event streams see them live here too.
async fn announce_changes(
    host: std::sync::Arc<factory_host::Host>,
    mut changes: tokio::sync::broadcast::Receiver<String>,
) {
    use tokio::sync::broadcast::error::RecvError;
    let mut last = std::collections::HashMap::new();
    // The runs announced and not yet seen ending are read again this often, so a run whose
    // last notification was lost still shows its end (the store's poll names only the runs
    // still executing).
    let mut again = tokio::time::interval(Duration::from_secs(2));
    loop {
        let run_ids = tokio::select! {
            changed = changes.recv() => match changed {
                Ok(run_id) => vec![run_id],
                Err(RecvError::Lagged(_)) => continue,
                Err(RecvError::Closed) => return,
            },
            _ = again.tick() => last.keys().cloned().collect(),
        };
        for run_id in run_ids {
            if let Err(e) = host.announce_elsewhere(&run_id, &mut last).await {
                tracing::debug!("reading run {run_id} changed by another worker: {e}");
            }
        }
    }
}

/// Cancel the runs executing here whose cancel was asked through another worker sharing the
/// store.
async fn cancel_when_asked(
    host: std::sync::Arc<factory_host::Host>,
    mut requests: tokio::sync::broadcast::Receiver<String>,
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        match requests.recv().await {
            Ok(run_id) => {
                if host.cancel_here(&run_id) {
                    tracing::info!("cancelling run {run_id}: asked through another worker");
                }
            }
            Err(RecvError::Lagged(_)) => {}
            Err(RecvError::Closed) => return,
        }
    }
}

/// Pause the runs executing here whose pause was asked through another worker sharing the
/// store.
async fn pause_when_asked(
    host: std::sync::Arc<factory_host::Host>,
    mut requests: tokio::sync::broadcast::Receiver<String>,
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        match requests.recv().await {
            Ok(run_id) => {
                if host.pause_here(&run_id) {
                    tracing::info!("pausing run {run_id}: asked through another worker");
                }
            }
            Err(RecvError::Lagged(_)) => {}
            Err(RecvError::Closed) => return,
        }
    }
}

/// Resolves once the service has had no active run, no run parked for its quota and no
/// client for `after` seconds (never without `after`).
async fn idle_exit(host: &factory_host::Host, serving: &crate::doors::reach::Serving, after: Option<f64>) {
    let Some(after) = after else { return std::future::pending().await };
    let after = Duration::from_secs_f64(after);
    let mut since = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(100).min(after)).await;
        // A run parked for its quota keeps the service that resumes it alive.
        if !host.active_runs().is_empty() || serving.in_flight() > 0 || host.parked_waiting() > 0 {
            since = Instant::now();
        } else if since.elapsed() >= after {
            return;
        }
    }
}

fn announce_http(g: &GlobalArgs, bound: std::net::SocketAddr) {
    say!(
        "factory serve: HTTP API on http://{bound}/api/, dashboard at http://{bound}/ (`factory ui` opens it; session {}; token in {})",
        g.session,
        g.state_dir.join(crate::doors::http::TOKEN_FILE).display()
    );
}

/// `factory serve --http` next to a running service: the HTTP API as its client, until
/// SIGINT/SIGTERM. The service stays alive while this process is its client.
async fn attach(g: &GlobalArgs, client: Client, addr: std::net::SocketAddr, ui_ttl: Duration) -> Result<ExitCode> {
    crate::doors::daemon::keep_alive(g);
    let bound =
        crate::doors::http::serve(client, addr, &g.state_dir, g.session.clone(), g.cluster_token()?.as_deref(), ui_ttl)
            .await
            .with_context(|| format!("serving HTTP on {addr}"))?;
    say!("factory serve: pid {}: attached to the service of {}", std::process::id(), g.state_dir.display());
    announce_http(g, bound);
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    let _ = std::fs::remove_file(g.state_dir.join(crate::doors::http::ADDR_FILE));
    Ok(ExitCode::SUCCESS)
}

/// Apply `policy` at once and then every `interval` (a failed pass is logged and tried again
/// at the next).
async fn collect_every(
    host: std::sync::Arc<factory_host::Host>,
    policy: factory_host::model::retention::Retention,
    interval: Duration,
) {
    loop {
        match host.gc(factory_host::Scope::Owner, &policy, false).await {
            Ok(report) if !report.removed.is_empty() => {
                say!("factory serve: retention removed {} runs, {} kept", report.removed.len(), report.kept)
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(event = "gc_failed", error = %e, "the retention pass failed"),
        }
        tokio::time::sleep(interval).await;
    }
}
