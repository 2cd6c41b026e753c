//! Runs changed by other workers, so every worker's followers see a run live wherever it
//! executes. After each commit a worker's writer sends ONE `pg_notify('factory_runs', ...)`
//! naming the runs that commit touched (never one per entry, and never inside the commit's
//! transaction, where NOTIFY takes a global lock; sent by a task of its own, so the next
//! commit does not wait for it, at most one per commit window, the runs of the commits
//! made meanwhile together); every worker LISTENs on its own
//! connection (see [`super::cancel::listen`]) and hands the ids it did not write itself to
//! the host ([`Store::run_changes`](crate::store::Store::run_changes)), which announces them
//! to its subscribers. A slow poll of the runs executing on other workers covers a lost
//! notification.

use super::{pg, PoolHandle};
use crate::store::StoreError;
use serde::{Deserialize, Serialize};

/// The channel commits are notified on.
pub(crate) const CHANNEL: &str = "factory_runs";

/// PostgreSQL's limit on a notification's payload is 8000 bytes: a list longer than this
/// is sent as "many runs" (`runs` empty, `many` set), and receivers re-read what executes.
const MAX_PAYLOAD: usize = 7900;

/// One notification: who committed, and which runs.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Changed {
    /// The worker that committed (its own listener skips it).
    pub(crate) worker: String,
    /// The runs the commit touched.
    #[serde(default)]
    pub(crate) runs: Vec<String>,
    /// Too many runs to name: every run executing elsewhere may have changed.
    #[serde(default)]
    pub(crate) many: bool,
}

/// The payload naming `runs` as committed by `worker`.
pub(crate) fn payload(worker: &str, runs: Vec<String>) -> String {
    let named = serde_json::to_string(&Changed { worker: worker.to_string(), runs, many: false }).unwrap_or_default();
    if named.len() <= MAX_PAYLOAD && !named.is_empty() {
        return named;
    }
    let many = Changed { worker: worker.chars().take(1000).collect(), runs: Vec::new(), many: true };
    serde_json::to_string(&many).unwrap_or_default()
}

/// Send one notification (`payload`) of one or more commits, outside those commits'
/// transactions, in a transaction of its own pipelined on one connection (one round trip).
/// That transaction commits asynchronously (`synchronous_commit` off for it alone): a
/// notification is a hint, the journal it announces is already durable, and a NOTIFY holds
/// PostgreSQL's global notify lock until its transaction's commit record is flushed; waiting
/// for that flush would serialize every worker's notifications behind the disk.
pub(super) async fn notify(pool: &PoolHandle, payload: &str) -> Result<(), StoreError> {
    let e = |e| pg(&pool.url, e);
    let client = pool.get().await?;
    let statement = client.prepare_cached("SELECT pg_notify('factory_runs', $1)").await.map_err(e)?;
    let begin = client.batch_execute("BEGIN; SET LOCAL synchronous_commit TO off");
    let send = client.execute_raw(&statement, std::iter::once(&payload as &(dyn tokio_postgres::types::ToSql + Sync)));
    let commit = client.batch_execute("COMMIT");
    let (begun, sent, committed) = futures::join!(begin, send, commit);
    let outcome = begun.and(sent.map(drop)).and(committed);
    if outcome.is_err() && !client.is_closed() {
        // Leave no transaction open on a connection going back to the pool.
        let _ = client.batch_execute("ROLLBACK").await;
    }
    outcome.map_err(e)
}

/// The runs executing (`running`, `pending`) on workers other than `worker`.
pub(super) async fn executing_elsewhere(pool: &PoolHandle, worker: &str) -> Result<Vec<String>, StoreError> {
    let client = pool.get().await?;
    let rows = client
        .query("SELECT id FROM runs WHERE status IN ('running', 'pending') AND owner IS DISTINCT FROM $1", &[&worker])
        .await
        .map_err(|e| pg(&pool.url, e))?;
    Ok(rows.iter().map(|row| row.get(0)).collect())
}
