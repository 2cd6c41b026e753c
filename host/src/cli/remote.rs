//! Runs that execute in another process: hand a run to the process holding the store (or
//! to a background `factory serve`, started on demand for `--detach`) and follow it from
//! here by polling its progress and envelope over the control socket.

use super::context::{access, remote};
use super::events::EventSink;
use super::{progress_ui, GlobalArgs};
use anyhow::{bail, Context, Result};
use factory_host::service::{Client, Followed, Follower, Request};
use factory_host::{ProgressEntry, RunEnvelope};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Send a `Run`/`Resume` request; with `detach`, print the run id and return `None`,
/// otherwise follow the run to its end.
pub async fn start(
    g: &GlobalArgs,
    request: Request,
    detach: bool,
    quiet: bool,
    events: Option<EventSink>,
) -> Result<Option<RunEnvelope>> {
    if detach {
        ensure_daemon(g).await?;
    } else if !quiet {
        eprintln!("factory: the store is held by another factory process; running the factory there");
    }
    let client = Client::Remote(remote(g));
    let run_id = client.start(request).await?;
    if let Some(sink) = &events {
        sink.started(&run_id);
    }
    if detach {
        println!("{run_id}");
        if !quiet {
            eprintln!("factory: run {run_id} started in the background; follow it with: factory watch {run_id}");
        }
        return Ok(None);
    }
    let envelope = follow(&client, &run_id, quiet, events.clone(), true, 0).await?;
    if let Some(sink) = &events {
        sink.finished(&envelope);
    }
    Ok(Some(envelope))
}

/// Show a run's progress after `after_seq` live until it is terminal; Ctrl-C cancels it when
/// `cancel_on_interrupt`, else only stops following. The local user follows and cancels as
/// the owner: the run may be of any session.
pub async fn follow(
    client: &Client,
    run_id: &str,
    quiet: bool,
    events: Option<EventSink>,
    cancel_on_interrupt: bool,
    after_seq: u64,
) -> Result<RunEnvelope> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<ProgressEntry>();
    let ui = tokio::spawn(progress_ui::render(rx, quiet, events));
    let mut follower = Follower::new(client.clone(), factory_host::Scope::Owner, run_id, after_seq).await;
    let mut interrupt = Box::pin(tokio::signal::ctrl_c());
    let envelope = loop {
        tokio::select! {
            next = follower.next() => match next {
                Some(Ok(Followed::Progress(entry))) => {
                    let _ = tx.send(entry);
                }
                Some(Ok(Followed::Ended(envelope))) => break envelope,
                Some(Err(e)) => return Err(e.into()),
                None => bail!("following run {run_id} ended without its envelope"),
            },
            _ = &mut interrupt => {
                if cancel_on_interrupt {
                    eprintln!("\nfactory: interrupted, cancelling the run...");
                    client.cancel(factory_host::Scope::Owner, run_id).await?;
                } else {
                    drop(tx);
                    let _ = ui.await;
                    bail!("stopped following run {run_id}; it keeps running (factory watch {run_id})");
                }
                interrupt = Box::pin(tokio::signal::ctrl_c());
            }
        }
    };
    drop(tx);
    let _ = ui.await;
    Ok(envelope)
}

/// Make sure a `factory serve` answers on the state directory's socket, starting one in
/// the background if nobody holds the store.
async fn ensure_daemon(g: &GlobalArgs) -> Result<()> {
    let client = Client::Remote(remote(g));
    if client.runs(&g.session).await.is_ok() {
        return Ok(());
    }
    if let Client::Local(local) = access(g).await? {
        drop(local); // free the store for the daemon
    }
    factory_host::access::private_state_dir(&g.state_dir)?;
    let state_dir = std::path::absolute(&g.state_dir)?;
    let log_path = state_dir.join("serve.log");
    let log = factory_host::access::private_file_options().append(true).open(&log_path)?;
    factory_host::access::tighten_open(&log)?;
    let exe = std::env::current_exe().context("locating the factory binary")?;
    let mut cmd = Command::new(exe);
    cmd.arg("serve").arg("--state-dir").arg(&state_dir).arg("--session").arg(&g.session);
    cmd.arg("--commit-window-ms").arg(g.commit_window_ms.to_string());
    cmd.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
    // Its own process group: a Ctrl-C in this terminal must not stop the daemon.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    cmd.spawn().context("starting `factory serve`")?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if client.runs(&g.session).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("`factory serve` did not come up within 30 s; see {}", log_path.display())
}
