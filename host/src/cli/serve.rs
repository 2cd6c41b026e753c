//! `factory serve`: hold the store and serve the control socket — runs handed over by
//! `factory run --detach` (or by a `factory run` in another terminal) execute here. At start
//! it resumes the runs a crash or a stop of a service left `halted`
//! ([`factory_host::recover`]). On SIGINT/SIGTERM it stops its runs as `halted` (resumable,
//! recovered by the next start) and exits.

use super::backends::load_config;
use super::context::{open_host, serve as serve_socket};
use super::GlobalArgs;
use anyhow::{Context, Result};
use clap::Args;
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
    bind: super::http_bind::HttpBindArgs,
    /// Leave the runs a crash or a stop of the service interrupted `halted` instead of
    /// resuming them at start.
    #[arg(long)]
    no_recover: bool,
    /// Automatic recoveries per run (counted since a caller last started or resumed it);
    /// past them an interrupted run stays `halted` until resumed by hand.
    #[arg(long, value_name = "N", default_value_t = factory_host::recover::DEFAULT_MAX_RECOVERIES,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_recoveries: u32,
}

pub async fn serve(g: &GlobalArgs, a: ServeArgs) -> Result<ExitCode> {
    let http = a.bind.address()?;
    let mut config = load_config(g, a.config.as_ref())?;
    if let Some(name) = a.backend {
        // Checked now, so a daemon with an unusable default says so at start.
        config.run_backend(Some(&name), None).with_context(|| format!("setting up backend `{name}`"))?;
        config.default = Some(name);
    }
    let host = open_host(g, std::sync::Arc::new(config))
        .with_context(|| format!("opening the store in {}", g.state_dir.display()))?;
    let serving = serve_socket(g, &host).context("cannot serve the control socket")?;
    if !a.no_recover {
        // Before the banner: once it is printed, every interrupted run is resumed or left.
        let recovered = factory_host::recover::recover_interrupted(&host, a.max_recoveries)
            .await
            .context("reading the runs to recover")?;
        for recovery in recovered {
            eprintln!("factory serve: {recovery}");
        }
    }
    eprintln!("factory serve: pid {}, serving {}", std::process::id(), serving.path().display());
    if let Some(addr) = http {
        let trusted = super::trust::trust_check(g);
        let bound = super::http::serve(host.clone(), addr, &g.state_dir, g.session.clone(), trusted)
            .await
            .with_context(|| format!("serving HTTP on {addr}"))?;
        eprintln!(
            "factory serve: HTTP API on http://{bound}/api/, dashboard at http://{bound}/ (`factory ui` opens it; session {}; token in {})",
            g.session,
            g.state_dir.join(super::http::TOKEN_FILE).display()
        );
    }
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    eprintln!("factory serve: shutting down; running runs end as halted");
    if http.is_some() {
        // `factory ui` then says no daemon serves HTTP here.
        let _ = std::fs::remove_file(g.state_dir.join(super::http::ADDR_FILE));
    }
    host.shutdown();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !host.active_runs().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    serving.drain().await;
    host.store().flush().await?;
    Ok(ExitCode::SUCCESS)
}
