//! Reaching the service from the CLI: one [`Client`], two transports. Open the store here
//! (and serve the control socket while this process holds it), or — when another factory
//! process holds it — be a client of that process over the control socket.

use crate::doors::args::GlobalArgs;
use crate::doors::control;
use crate::doors::daemon::remote;
use anyhow::{Context, Result};
use factory_host::backend::{BackendCatalog, BuiltinCatalog};
use factory_host::service::{Client, ClientError, Local, ServiceError};
use factory_host::store::StoreError;
use factory_host::{Error, Host, HostConfig};
use std::sync::Arc;

/// The pending approvals of this process: every door it serves (the control socket, HTTP,
/// MCP) holds and answers the same ones.
fn approvals() -> Arc<factory_host::service::Approvals> {
    static APPROVALS: std::sync::OnceLock<Arc<factory_host::service::Approvals>> = std::sync::OnceLock::new();
    APPROVALS.get_or_init(Arc::default).clone()
}

/// The service over `host`, with this user's trust check, this process's pending approvals,
/// and the trust store an "always" answer records in.
pub fn local(g: &GlobalArgs, host: &Arc<Host>) -> Local {
    let trust = g.trust_dir().ok().map(|dir| Arc::new(factory_host::trust::TrustStore::in_state_dir(&dir)));
    Local::new(host.clone(), crate::doors::trusted::trust_check(g)).with_approvals(approvals(), trust)
}

/// What a process that opens the store holds it for: the store's page cache is sized by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// A command that ends with its run or its request (`run`, `resume`, `runs`, ...): a
    /// resumed run's journal is read once, so it keeps few pages ([`COMMAND_CACHE_BYTES`]).
    Command,
    /// A service (`serve`, `mcp`): pages are kept for the readers to come
    /// ([`READ_CACHE_BYTES`](factory_host::store::redb::READ_CACHE_BYTES)).
    Service,
}

/// The page cache of a store a [`Holder::Command`] opens: the pages the writer's commits
/// read again (the tables' upper levels) and little more.
pub const COMMAND_CACHE_BYTES: usize = 8 << 20;

impl Holder {
    fn cache_bytes(self) -> usize {
        match self {
            Holder::Command => COMMAND_CACHE_BYTES,
            Holder::Service => factory_host::store::redb::READ_CACHE_BYTES,
        }
    }
}

/// Open the store in the state directory for `holder`; `catalog` builds the backends runs
/// choose (and the ones resumed runs recorded).
pub fn open_host(g: &GlobalArgs, catalog: Arc<dyn BackendCatalog>, holder: Holder) -> Result<Arc<Host>, Error> {
    let config = HostConfig {
        state_dir: Some(g.state_dir.clone()),
        catalog,
        commit_window: std::time::Duration::from_millis(g.commit_window_ms),
        read_cache_bytes: holder.cache_bytes(),
        sandbox_hidden: g.sandbox_hidden(),
        ..HostConfig::default()
    };
    Host::new(config).map(Arc::new)
}

/// Open a host on the shared PostgreSQL store at `url` as worker `worker` (default: this
/// host and state directory's [`default_worker_id`](factory_host::store::postgres::default_worker_id)).
/// The state directory still holds the control socket, the HTTP token and the cache.
/// `trust`: what the worker checks before it runs what the database says; `password`: the
/// database password when the URL has none (see [`PgOptions::password`](factory_host::store::postgres::PgOptions)).
pub async fn open_shared_host(
    g: &GlobalArgs,
    catalog: Arc<dyn BackendCatalog>,
    url: &str,
    worker: Option<&str>,
    caps: factory_host::engine::caps::Caps,
    trust: factory_host::sandbox::admission::ClusterTrust,
    password: Option<String>,
) -> Result<Arc<Host>, Error> {
    use factory_host::store::postgres::{default_worker_id, PgOptions, PgStore};
    let commit_window = std::time::Duration::from_millis(g.commit_window_ms);
    let worker = worker.map_or_else(|| default_worker_id(&g.state_dir), str::to_string);
    let store = PgStore::connect(url, PgOptions { commit_window, password, ..PgOptions::new(worker) }).await?;
    let sandbox_hidden = g.sandbox_hidden();
    let state_dir = Some(g.state_dir.clone());
    let config = HostConfig { state_dir, catalog, commit_window, caps, trust, sandbox_hidden, ..HostConfig::default() };
    Host::with_store(config, Arc::new(store)).map(Arc::new)
}

/// How long to keep trying when the store is locked but nobody answers on the socket (a
/// short-lived reader such as `factory runs`, or a holder still starting up).
const LOCKED_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// The service of the state directory: started if none answers (see [`crate::doors::daemon`]),
/// or with `--no-daemon` the store opened here ([`open_here_or_reach`]).
pub async fn open_or_reach(g: &GlobalArgs, catalog: Arc<dyn BackendCatalog>, holder: Holder) -> Result<Client> {
    if g.no_daemon {
        return open_here_or_reach(g, catalog, holder).await;
    }
    Ok(Client::Remote(crate::doors::daemon::ensure(g).await?))
}

/// Open the store with `catalog`, or find the process that holds it. A holder that does
/// not answer on the control socket is waited for: it is a short-lived reader, or it is
/// still starting up.
pub async fn open_here_or_reach(g: &GlobalArgs, catalog: Arc<dyn BackendCatalog>, holder: Holder) -> Result<Client> {
    let remote = remote(g);
    let socket = remote.socket().to_path_buf();
    let deadline = std::time::Instant::now() + LOCKED_PATIENCE;
    loop {
        match open_host(g, catalog.clone(), holder) {
            Ok(host) => return Ok(Client::Local(local(g, &host))),
            Err(Error::Store(StoreError::Locked(path))) => {
                let client = Client::Remote(remote.clone());
                match client.runs_page(&g.session, None, Some(1)).await {
                    Ok(_) => return Ok(client),
                    // Another user's socket, or another version: refused at once, never waited for.
                    Err(factory_host::service::ServiceError::Remote(
                        e @ (ClientError::NotOurs { .. } | ClientError::Protocol { .. }),
                    )) => return Err(e.into()),
                    Err(_) => {}
                }
                if std::time::Instant::now() >= deadline {
                    anyhow::bail!(
                        "the store {} is held by another process that does not answer on {}",
                        path.display(),
                        socket.display()
                    );
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e).with_context(|| format!("opening the store in {}", g.state_dir.display())),
        }
    }
}

/// The service, or with `--no-daemon` the store opened here (to observe: no backend is
/// built here).
pub async fn access(g: &GlobalArgs) -> Result<Client> {
    open_or_reach(g, Arc::new(BuiltinCatalog), Holder::Command).await
}

/// The service answering on the state directory's socket, or else one in this process over
/// a private in-memory host (nothing of the state directory is touched, no service is
/// started): for requests that need no store, as `describe` (a factory file as the serving
/// process would load it, under its sandbox limits).
pub async fn serving_or_private(g: &GlobalArgs) -> Result<Client> {
    let remote = remote(g);
    if crate::doors::daemon::answers(&remote, g).await? {
        return Ok(Client::Remote(remote));
    }
    let host = Host::new(HostConfig { state_dir: None, sandbox_hidden: g.sandbox_hidden(), ..HostConfig::default() })?;
    Ok(Client::Local(Local::new(Arc::new(host), crate::doors::trusted::trust_check(g))))
}

/// One request through [`access`] (every one-shot command of the CLI: `runs`, `show`,
/// `progress`, `wait`, `cancel`, `add`, `list`, `inspect`), asked again once through a fresh
/// [`access`] when nobody answered on the socket: the process that held the store ended
/// between being found and being asked (a foreground run that was just cancelled, say), so
/// the store is free now or another process holds it. Nothing reached the first one, so any
/// request may be asked again.
pub async fn ask<T, Asked>(g: &GlobalArgs, request: impl Fn(Client) -> Asked) -> Result<T>
where
    Asked: std::future::Future<Output = Result<T, ServiceError>>,
{
    match request(access(g).await?).await {
        Err(ServiceError::Remote(ClientError::Connect { .. })) => Ok(request(access(g).await?).await?),
        answered => Ok(answered?),
    }
}

/// Serve the control socket for `host` while this process holds the store. The socket
/// file is removed when the guard drops.
pub struct Serving {
    server: control::Server,
    path: std::path::PathBuf,
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Serving {
    /// Connections being answered now.
    pub fn in_flight(&self) -> usize {
        self.server.in_flight()
    }

    /// The socket's path.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Stop serving after answering the requests in flight (at most 5 s).
    pub async fn drain(self) {
        let _ = std::fs::remove_file(&self.path);
        self.server.drain(std::time::Duration::from_secs(5)).await;
    }
}

/// Start serving; a failure only costs other terminals their view, so it is a warning.
pub fn serve(g: &GlobalArgs, host: &Arc<Host>) -> Option<Serving> {
    let path = control::socket_path(&g.state_dir);
    match control::serve(local(g, host), &path) {
        Ok(server) => Some(Serving { server, path }),
        Err(e) => {
            eprintln!("factory: warning: cannot serve the control socket {}: {e}", path.display());
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        g: GlobalArgs,
    }

    fn gone() -> ServiceError {
        let source = std::io::Error::from(std::io::ErrorKind::NotFound);
        ServiceError::Remote(ClientError::Connect { path: "control.sock".into(), source })
    }

    #[tokio::test]
    async fn a_request_nobody_answered_is_asked_again_through_a_fresh_access() {
        let state = tempfile::tempdir().expect("a state directory");
        let dir = state.path().join("state");
        let mut g = Cli::try_parse_from(["factory", "--state-dir", dir.to_str().expect("UTF-8"), "--no-daemon"])
            .expect("args")
            .g;
        g.resolve().expect("the state directory");
        // The first answer is the one of a holder that ended before it was asked; the second
        // access finds the store free and opens it here.
        let asked = AtomicUsize::new(0);
        let runs = ask(&g, |client| {
            let first = asked.fetch_add(1, Ordering::SeqCst) == 0;
            async move {
                if first {
                    drop(client);
                    return Err(gone());
                }
                assert!(client.local().is_some(), "asked again of the store opened here");
                client.runs(factory_host::Scope::Owner).await
            }
        })
        .await
        .expect("answered the second time");
        assert_eq!((runs.len(), asked.load(Ordering::SeqCst)), (0, 2));
        // Any other failure is the answer: not asked again.
        let asked = AtomicUsize::new(0);
        let refused = ask(&g, |client| {
            asked.fetch_add(1, Ordering::SeqCst);
            async move {
                drop(client);
                Err::<(), _>(ServiceError::Remote(ClientError::Disconnected { path: "control.sock".into() }))
            }
        })
        .await;
        assert!(refused.is_err_and(|e| e.to_string().contains("went away mid-stream")));
        assert_eq!(asked.load(Ordering::SeqCst), 1);
    }
}
