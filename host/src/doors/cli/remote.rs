//! Runs that execute in the service (or in the process holding the store): hand the run
//! over and follow it from here with the service's [`Follower`]; Ctrl-C cancels it.

use crate::doors::args::GlobalArgs;
use crate::doors::cli::events::EventSink;
use crate::doors::cli::progress_ui;
use crate::doors::daemon::remote;
use anyhow::{bail, Context, Result};
use factory_host::backend::cassette::{write_cassette, Exchange};
use factory_host::service::{Client, ClientError, Followed, Follower, Request, ServiceError};
use factory_host::{ProgressEntry, RunEnvelope};
use std::path::Path;

/// Send a `Run`/`Resume` request; with `detach`, print the run id and return `None`,
/// otherwise follow the run to its end. `record`: the cassette file (the caller's) to write
/// the exchanges the run recorded to once it ends (the request asks for them).
pub async fn start(
    g: &GlobalArgs,
    request: Request,
    detach: bool,
    quiet: bool,
    events: Option<EventSink>,
    record: Option<&Path>,
) -> Result<Option<RunEnvelope>> {
    if !detach && g.no_daemon && !quiet {
        eprintln!("factory: the store is held by another factory process; running the factory there");
    }
    let client = Client::Remote(if detach { crate::doors::daemon::ensure(g).await? } else { remote(g) });
    if detach {
        let run_id = client.start(request).await?;
        if let Some(sink) = &events {
            sink.started(&run_id);
        }
        outln!("{run_id}");
        if !quiet {
            eprintln!("factory: run {run_id} started in the background; follow it with: factory watch {run_id}");
        }
        return Ok(None);
    }
    // Started and followed on one connection.
    let follower = Follower::start(client.clone(), factory_host::Scope::Owner, request).await?;
    if let Some(sink) = &events {
        sink.started(follower.run_id());
    }
    // A recording is in the service that ran the run: one started again has none to send.
    let restart = if record.is_some() { None } else { Some(g) };
    let (envelope, recorded) = follow_with(&client, follower, quiet, events.clone(), true, restart).await?;
    if let Some(file) = record {
        write_cassette(file, &recorded).with_context(|| format!("writing the cassette {}", file.display()))?;
    }
    if let Some(sink) = &events {
        sink.finished(&envelope);
    }
    Ok(Some(envelope))
}

/// How many times following a run starts the service again after it went away.
const RESTARTS: u32 = 3;

/// Did the service go away (killed, crashed, stopped) rather than refuse?
fn went_away(e: &ServiceError) -> bool {
    matches!(e, ServiceError::Remote(ClientError::Disconnected { .. } | ClientError::Connect { .. }))
}

/// Show a run's progress after `after_seq` live until it is terminal; Ctrl-C cancels it when
/// `cancel_on_interrupt`, else only stops following. The local user follows and cancels as
/// the owner: the run may be of any session. With `restart`, a service that goes away
/// mid-follow is started again (at most [`RESTARTS`] times; the new service recovers the
/// run it left halted) and following goes on from the last entry shown.
pub async fn follow(
    client: &Client,
    run_id: &str,
    quiet: bool,
    events: Option<EventSink>,
    cancel_on_interrupt: bool,
    after_seq: u64,
    restart: Option<&GlobalArgs>,
) -> Result<RunEnvelope> {
    let follower = Follower::new(client.clone(), factory_host::Scope::Owner, run_id, after_seq).await;
    Ok(follow_with(client, follower, quiet, events, cancel_on_interrupt, restart).await?.0)
}

/// [`follow`] with a follower already made (one that started the run, say), and the
/// exchanges the run recorded for us (a start that records).
async fn follow_with(
    client: &Client,
    mut follower: Follower,
    quiet: bool,
    events: Option<EventSink>,
    cancel_on_interrupt: bool,
    restart: Option<&GlobalArgs>,
) -> Result<(RunEnvelope, Vec<Exchange>)> {
    let run_id = &follower.run_id().to_string();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<ProgressEntry>();
    let ui = progress_ui::spawn(rx, quiet, events);
    let mut client = client.clone();
    let mut restarts = 0;
    let mut interrupt = Box::pin(tokio::signal::ctrl_c());
    let envelope = loop {
        tokio::select! {
            next = follower.next() => match next {
                Some(Ok(Followed::Progress(entry))) => {
                    let _ = tx.send(entry);
                }
                Some(Ok(Followed::Ended(envelope))) => break envelope,
                Some(Err(e)) if went_away(&e) && restarts < RESTARTS && matches!(client, Client::Remote(_)) => {
                    // `--no-daemon`: no service is started on our behalf.
                    let Some(g) = restart.filter(|g| !g.no_daemon) else { return Err(e.into()) };
                    restarts += 1;
                    eprintln!("\nfactory: the service went away ({e}); starting it again to follow run {run_id}", e = crate::doors::cli::escape::esc(&e.to_string()));
                    client = Client::Remote(crate::doors::daemon::ensure(g).await?);
                    follower = Follower::new(client.clone(), factory_host::Scope::Owner, run_id, follower.after_seq()).await;
                }
                Some(Err(e)) => return Err(e.into()),
                None => bail!("following run {run_id} ended without its envelope"),
            },
            _ = &mut interrupt => {
                if cancel_on_interrupt {
                    eprintln!("\nfactory: interrupted, cancelling the run...");
                    client.cancel(factory_host::Scope::Owner, run_id).await?;
                } else {
                    drop(tx);
                    ui.finish().await;
                    bail!("stopped following run {run_id}; it keeps running (factory watch {run_id})");
                }
                interrupt = Box::pin(tokio::signal::ctrl_c());
            }
        }
    };
    drop(tx);
    ui.finish().await;
    Ok((envelope, follower.take_recorded()))
}
