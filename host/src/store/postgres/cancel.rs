//! Cancelling or pausing a run another worker executes: the request is a flag on the run's
//! row (`cancel_requested`, `pause_requested`, cleared when the run ends) and one
//! `pg_notify('factory_cancel', id)` (`factory_pause`) sent with it. Every worker LISTENs on
//! its own connection and hands the ids to the host
//! ([`Store::cancel_requests`](crate::store::Store::cancel_requests),
//! [`Store::pause_requests`](crate::store::Store::pause_requests)), which cancels or pauses
//! the run if it executes there; a slow poll of the flags for this worker's runs covers a lost
//! notification or a listener that is reconnecting. The same connection LISTENs for the runs
//! other workers committed ([`super::changes`]), polled as slowly.

use super::{pg, PoolHandle};
use crate::store::StoreError;
use futures::StreamExt;
use std::time::Duration;
use tokio::sync::broadcast;

/// The channel cancel requests are notified on.
pub(crate) const CHANNEL: &str = "factory_cancel";

/// The channel pause requests are notified on.
pub(crate) const PAUSE_CHANNEL: &str = "factory_pause";

/// How often the flags of this worker's runs are read, whatever the notifications do.
pub(crate) const POLL: Duration = Duration::from_secs(2);

/// Record a cancel request and notify the workers (delivered when the statement commits).
pub(super) async fn request(pool: &PoolHandle, run_id: &str) -> Result<bool, StoreError> {
    flag(
        pool,
        run_id,
        "WITH asked AS (UPDATE runs SET cancel_requested = true WHERE id = $1 AND status IN ('running', 'pending') RETURNING id)
         SELECT pg_notify('factory_cancel', id) FROM asked",
    )
    .await
}

/// Record a pause request and notify the workers (delivered when the statement commits).
pub(super) async fn request_pause(pool: &PoolHandle, run_id: &str) -> Result<bool, StoreError> {
    flag(
        pool,
        run_id,
        "WITH asked AS (UPDATE runs SET pause_requested = true WHERE id = $1 AND status IN ('running', 'pending') RETURNING id)
         SELECT pg_notify('factory_pause', id) FROM asked",
    )
    .await
}

/// Run `statement` (set a request flag on run `$1` and notify its channel); whether the run
/// was one that runs or waits to.
async fn flag(pool: &PoolHandle, run_id: &str, statement: &'static str) -> Result<bool, StoreError> {
    let client = pool.get().await?;
    let rows = client.query(statement, &[&run_id]).await.map_err(|e| pg(&pool.url, e))?;
    Ok(!rows.is_empty())
}

/// Where the listener hands what it hears.
#[derive(Clone)]
pub(super) struct Heard {
    /// Cancel requests for runs (any worker's: the host cancels those it executes).
    pub(super) cancels: broadcast::Sender<String>,
    /// Pause requests for runs (any worker's: the host pauses those it executes).
    pub(super) pauses: broadcast::Sender<String>,
    /// Runs other workers committed.
    pub(super) changes: broadcast::Sender<String>,
}

/// Forward cancel requests and other workers' run changes: notifications on a connection of
/// its own (reconnected after a failure), and every [`POLL`] the flagged runs `worker` owns
/// and the runs executing elsewhere.
pub(super) async fn listen(config: tokio_postgres::Config, pool: PoolHandle, worker: String, heard: Heard) {
    let requests = heard.cancels.clone();
    let poll = {
        let (pool, requests, changes, worker) = (pool.clone(), requests.clone(), heard.changes.clone(), worker.clone());
        let pauses = heard.pauses.clone();
        async move {
            loop {
                tokio::time::sleep(POLL).await;
                if changes.receiver_count() > 0 {
                    match super::changes::executing_elsewhere(&pool, &worker).await {
                        Ok(ids) => {
                            for id in ids {
                                let _ = changes.send(id);
                            }
                        }
                        Err(e) => tracing::warn!("reading the runs other workers execute: {e}"),
                    }
                }
                let flagged = async {
                    let client = pool.get().await?;
                    client
                        .query(
                            "SELECT id, cancel_requested FROM runs
                             WHERE owner = $1 AND (cancel_requested OR pause_requested) AND status IN ('running', 'pending')",
                            &[&worker],
                        )
                        .await
                        .map_err(|e| pg(&pool.url, e))
                };
                match flagged.await {
                    Ok(rows) => {
                        // A cancel wins over a pause asked of the same run.
                        for row in rows {
                            let _ =
                                if row.get::<_, bool>(1) { requests.send(row.get(0)) } else { pauses.send(row.get(0)) };
                        }
                    }
                    Err(e) => tracing::warn!("reading cancel requests: {e}"),
                }
            }
        }
    };
    let notified = async move {
        loop {
            if let Err(e) = notifications(&config, &worker, &heard).await {
                tracing::warn!("listening for cancel requests on {}: {e}", pool.url);
            }
            tokio::time::sleep(POLL).await;
        }
    };
    futures::join!(poll, notified);
}

/// One LISTEN connection, until it fails.
async fn notifications(
    config: &tokio_postgres::Config,
    worker: &str,
    heard: &Heard,
) -> Result<(), tokio_postgres::Error> {
    let (client, mut connection) = config.connect(tokio_postgres::NoTls).await?;
    let (tx, mut rx) = futures::channel::mpsc::unbounded();
    let driver = futures::stream::poll_fn(move |cx| connection.poll_message(cx)).map(Ok).forward(tx);
    let driver = tokio::spawn(driver);
    client
        .batch_execute(&format!("LISTEN {CHANNEL}; LISTEN {PAUSE_CHANNEL}; LISTEN {}", super::changes::CHANNEL))
        .await?;
    while let Some(message) = rx.next().await {
        match message {
            Ok(tokio_postgres::AsyncMessage::Notification(note)) if note.channel() == CHANNEL => {
                let _ = heard.cancels.send(note.payload().to_string());
            }
            Ok(tokio_postgres::AsyncMessage::Notification(note)) if note.channel() == PAUSE_CHANNEL => {
                let _ = heard.pauses.send(note.payload().to_string());
            }
            Ok(tokio_postgres::AsyncMessage::Notification(note)) if note.channel() == super::changes::CHANNEL => {
                let Ok(changed) = serde_json::from_str::<super::changes::Changed>(note.payload()) else { continue };
                if changed.worker == worker || heard.changes.receiver_count() == 0 {
                    continue;
                }
                // `many` names no run: the poll of what executes elsewhere covers it.
                for run in changed.runs {
                    let _ = heard.changes.send(run);
                }
            }
            Ok(_) => {}
            Err(e) => {
                driver.abort();
                return Err(e);
            }
        }
    }
    driver.abort();
    Ok(())
}
