//! Reaching the store from the CLI: open it (and serve the control socket while this
//! process holds it), or — when another factory process holds it — talk to that process
//! over the control socket.

use super::GlobalArgs;
use anyhow::{Context, Result};
use factory_host::backend::{BackendCatalog, BuiltinCatalog};
use factory_host::control;
use factory_host::store::StoreError;
use factory_host::{Error, Host, HostConfig};
use std::sync::Arc;

/// Where the store is, from this process's point of view.
pub enum Access {
    /// This process opened it.
    Local(Arc<Host>),
    /// Another process holds it and answers on this socket.
    Remote(std::path::PathBuf),
}

impl Access {
    /// Answer `request`: locally, or through the process holding the store (one client,
    /// two transports).
    pub async fn ask(&self, request: control::Request) -> Result<serde_json::Value> {
        match self {
            Access::Remote(path) => Ok(control::request(path, &request).await?),
            Access::Local(host) => Ok(control::answer_query(host, request).await?),
        }
    }
}

/// Open the store in the state directory; `catalog` builds the backends runs choose (and
/// the ones resumed runs recorded).
pub fn open_host(g: &GlobalArgs, catalog: Arc<dyn BackendCatalog>) -> Result<Arc<Host>, Error> {
    let config = HostConfig {
        state_dir: Some(g.state_dir.clone()),
        catalog,
        commit_window: std::time::Duration::from_millis(g.commit_window_ms),
        ..HostConfig::default()
    };
    Host::new(config).map(Arc::new)
}

/// How long to keep trying when the store is locked but nobody answers on the socket (a
/// short-lived reader such as `factory runs`, or a holder still starting up).
const LOCKED_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// Open the store with `catalog`, or find the process that holds it. A holder that does
/// not answer on the control socket is waited for: it is a short-lived reader, or it is
/// still starting up.
pub async fn open_or_reach(g: &GlobalArgs, catalog: Arc<dyn BackendCatalog>) -> Result<Access> {
    let socket = control::socket_path(&g.state_dir);
    let deadline = std::time::Instant::now() + LOCKED_PATIENCE;
    loop {
        match open_host(g, catalog.clone()) {
            Ok(host) => return Ok(Access::Local(host)),
            Err(Error::Store(StoreError::Locked(path))) => {
                let ping = control::Request::Runs { session: g.session.clone() };
                match control::request(&socket, &ping).await {
                    Ok(_) => return Ok(Access::Remote(socket)),
                    // Another user's socket: refused at once, never waited for.
                    Err(e @ control::ClientError::NotOurs { .. }) => return Err(e.into()),
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

/// Open the store, or find the process that holds it (to observe: no backend is built).
pub async fn access(g: &GlobalArgs) -> Result<Access> {
    open_or_reach(g, Arc::new(BuiltinCatalog)).await
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
    match control::serve(host.clone(), &path, super::trust::trust_check(g)) {
        Ok(server) => Some(Serving { server, path }),
        Err(e) => {
            eprintln!("factory: warning: cannot serve the control socket {}: {e}", path.display());
            None
        }
    }
}
