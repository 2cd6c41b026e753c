//! `factory serve`: hold the store and serve the control socket — runs handed over by
//! `factory run --detach` (or by a `factory run` in another terminal) execute here. On
//! SIGINT/SIGTERM it stops its runs as `halted` (resumable) and exits.

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
    /// Also serve the JSON API over HTTP on ADDR (loopback, e.g. 127.0.0.1:8080; port 0 picks
    /// one). Every call needs the bearer token written to <state-dir>/http.token.
    #[arg(long, value_name = "ADDR")]
    http: Option<std::net::SocketAddr>,
    /// Allow --http on an address that is not loopback (anyone who can reach it and has the
    /// token can drive your runs).
    #[arg(long, requires = "http")]
    http_any_address: bool,
}

pub async fn serve(g: &GlobalArgs, a: ServeArgs) -> Result<ExitCode> {
    let mut config = load_config(g, a.config.as_ref())?;
    if let Some(name) = a.backend {
        // Checked now, so a daemon with an unusable default says so at start.
        config.run_backend(Some(&name), None).with_context(|| format!("setting up backend `{name}`"))?;
        config.default = Some(name);
    }
    let host = open_host(g, std::sync::Arc::new(config))
        .with_context(|| format!("opening the store in {}", g.state_dir.display()))?;
    let serving = serve_socket(g, &host).context("cannot serve the control socket")?;
    eprintln!("factory serve: pid {}, serving {}", std::process::id(), serving.path().display());
    if let Some(addr) = a.http {
        if !addr.ip().is_loopback() && !a.http_any_address {
            anyhow::bail!("--http {addr} is not a loopback address; add --http-any-address to serve it anyway");
        }
        let trusted = super::trust::trust_check(g);
        let bound = super::http::serve(host.clone(), addr, &g.state_dir, g.session.clone(), trusted)
            .await
            .with_context(|| format!("serving HTTP on {addr}"))?;
        eprintln!(
            "factory serve: HTTP API on http://{bound}/api/ (session {}; token in {})",
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
    host.shutdown();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !host.active_runs().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    serving.drain().await;
    host.store().flush().await?;
    Ok(ExitCode::SUCCESS)
}
