//! Reaching the store from the CLI: open it (and serve the control socket while this
//! process holds it), or — when another factory process holds it — talk to that process
//! over the control socket.

use super::GlobalArgs;
use anyhow::{Context, Result};
use factory_host::backend::AgentBackend;
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

/// Open the store in the state directory with `backend`.
pub fn open_host(g: &GlobalArgs, backend: Arc<dyn AgentBackend>) -> Result<Arc<Host>, Error> {
    let config = HostConfig { state_dir: Some(g.state_dir.clone()), backend, ..HostConfig::default() };
    Host::new(config).map(Arc::new)
}

/// Open the store, or find the process that holds it.
pub fn access(g: &GlobalArgs) -> Result<Access> {
    match open_host(g, Arc::new(factory_host::backend::DryRun)) {
        Ok(host) => Ok(Access::Local(host)),
        Err(Error::Store(StoreError::Locked(_))) => Ok(Access::Remote(control::socket_path(&g.state_dir))),
        Err(e) => Err(e).with_context(|| format!("opening the store in {}", g.state_dir.display())),
    }
}

/// Serve the control socket for `host` while this process holds the store. The socket
/// file is removed when the guard drops.
pub struct Serving {
    task: tokio::task::JoinHandle<()>,
    path: std::path::PathBuf,
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Start serving; a failure only costs other terminals their view, so it is a warning.
pub fn serve(g: &GlobalArgs, host: &Arc<Host>) -> Option<Serving> {
    let path = control::socket_path(&g.state_dir);
    match control::serve(host.clone(), &path) {
        Ok(task) => Some(Serving { task, path }),
        Err(e) => {
            eprintln!("factory: warning: cannot serve the control socket {}: {e}", path.display());
            None
        }
    }
}
