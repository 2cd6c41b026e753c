//! The local service of a state directory: one long-lived `factory serve` that owns the
//! runs. A front door that finds no service answering on `<state-dir>/control.sock` starts
//! one ([`ensure`]: detached, in its own process group, logging to the 0600 file
//! `<state-dir>/serve.log`) and becomes its client, so runs outlive the terminal, editor
//! or agent that started them. A service started this way exits by itself once it has had
//! no active run and no client for [`idle_seconds`]; `--no-daemon` (`FACTORY_NO_DAEMON=1`)
//! keeps the single-process mode, where the front door opens the store itself.
//!
//! Two front doors racing to start the service end up with one: only one process can hold
//! the store, and the other `factory serve` sees the winner answer and exits quietly.

use crate::doors::args::GlobalArgs;
use crate::doors::telemetry::LOG_FILE;
use anyhow::{bail, Context, Result};
use factory_host::service::{Client, ClientError, Remote, ServiceError};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The service's working directory, inside the state directory.
pub const SERVICE_DIR: &str = "service";

/// The log is rotated (to `serve.log.1`) when a service starts and finds it larger.
const LOG_ROTATE_BYTES: u64 = 8 << 20;

/// How long an automatically started service waits with nothing to do before it exits
/// (`FACTORY_IDLE_SECONDS`, default 300).
pub fn idle_seconds() -> f64 {
    std::env::var("FACTORY_IDLE_SECONDS")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .unwrap_or(300.0)
}

/// How long a front door waits for a service it started to answer.
const START_PATIENCE: Duration = Duration::from_secs(30);

/// Whether the service answers; `Err` when the socket is not one to talk to (another
/// user's, another version): that is said, never worked around.
pub async fn answers(remote: &Remote, g: &GlobalArgs) -> Result<bool> {
    match Client::Remote(remote.clone()).runs_page(&g.session, None, Some(1)).await {
        Ok(_) => Ok(true),
        Err(ServiceError::Remote(e @ (ClientError::NotOurs { .. } | ClientError::Protocol { .. }))) => Err(e.into()),
        Err(_) => Ok(false),
    }
}

/// A client of the service answering on the state directory's control socket.
pub fn remote(g: &GlobalArgs) -> Remote {
    Remote::new(crate::doors::control::socket_path(&g.state_dir))
}

/// The service of the state directory, started if none answers.
pub async fn ensure(g: &GlobalArgs) -> Result<Remote> {
    let remote = remote(g);
    if answers(&remote, g).await? {
        return Ok(remote);
    }
    factory_host::access::private_state_dir(&g.state_dir)?;
    let state_dir = std::path::absolute(&g.state_dir)?;
    let log_path = state_dir.join(LOG_FILE);
    if std::fs::symlink_metadata(&log_path).is_ok_and(|m| m.is_file() && m.len() > LOG_ROTATE_BYTES) {
        let _ = std::fs::rename(&log_path, state_dir.join(format!("{LOG_FILE}.1")));
    }
    let log = factory_host::access::private_file_options().append(true).open(&log_path)?;
    factory_host::access::tighten_open(&log)?;
    let exe = std::env::current_exe().context("locating the factory binary")?;
    let mut cmd = Command::new(exe);
    cmd.arg("serve").arg("--state-dir").arg(&state_dir).arg("--started-by-front-door");
    cmd.arg("--idle-exit").arg(idle_seconds().to_string());
    cmd.arg("--commit-window-ms").arg(g.commit_window_ms.to_string());
    if let Some(file) = &g.token_file {
        cmd.arg("--token-file").arg(std::path::absolute(file).unwrap_or_else(|_| file.clone()));
    }
    cmd.env_remove("FACTORY_SESSION").env_remove("FACTORY_NO_DAEMON");
    // From a neutral directory of its own, below the state dir and above nothing: what it
    // reads never depends on where it was started (a project's `.factory/factory.toml` is
    // for runs of that project, run in-process), and nothing it reads counts as a
    // project's. Whether the state dir itself is a project's is this front door's call.
    let cwd = state_dir.join(SERVICE_DIR);
    factory_host::access::private_state_dir(&cwd)?;
    cmd.current_dir(&cwd);
    if g.state_dir_is_project_local {
        cmd.arg("--project-local-state-dir");
    }
    cmd.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
    // Its own process group: a Ctrl-C in this terminal must not stop the service.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd.spawn().context("starting `factory serve`")?;
    let deadline = Instant::now() + START_PATIENCE;
    while Instant::now() < deadline {
        if answers(&remote, g).await? {
            // Reap it when it exits, however long this front door lives.
            std::thread::spawn(move || child.wait());
            return Ok(remote);
        }
        if let Ok(Some(status)) = child.try_wait() {
            // It lost a race to another service (which answers soon), or it failed.
            if !status.success() {
                bail!("`factory serve` could not start ({status}); see {}", log_path.display());
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    bail!("`factory serve` did not come up within {} s; see {}", START_PATIENCE.as_secs(), log_path.display())
}

/// Keep this front door counted as a client of the service while it lives, so the service
/// does not idle out under it: a subscription held open (and drained) for the process's
/// life. If the service goes away (killed, say), a new one is started, which recovers the
/// runs the old one left halted.
pub fn keep_alive(g: &GlobalArgs) {
    let g = g.clone();
    tokio::spawn(async move {
        loop {
            if let Ok(remote) = ensure(&g).await {
                if let Ok(mut updates) = Client::Remote(remote).updates(&g.session).await {
                    while updates.next().await.is_some() {}
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
}
