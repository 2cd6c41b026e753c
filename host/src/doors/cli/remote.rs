//! Runs that execute in the service (or in the process holding the store): hand the run
//! over and follow it from here with the service's [`Follower`]; Ctrl-C cancels it.

use crate::doors::daemon::remote;
use crate::doors::cli::events::EventSink;
use crate::doors::args::GlobalArgs;
use crate::doors::cli::progress_ui;
use anyhow::{bail, Result};
use factory_host::service::{Client, Followed, Follower, Request};
use factory_host::{ProgressEntry, RunEnvelope};

/// Send a `Run`/`Resume` request; with `detach`, print the run id and return `None`,
/// otherwise follow the run to its end.
pub async fn start(
    g: &GlobalArgs,
    request: Request,
    detach: bool,
    quiet: bool,
    events: Option<EventSink>,
) -> Result<Option<RunEnvelope>> {
    if !detach && g.no_daemon && !quiet {
        eprintln!("factory: the store is held by another factory process; running the factory there");
    }
    let client = Client::Remote(if detach { crate::doors::daemon::ensure(g).await? } else { remote(g) });
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
