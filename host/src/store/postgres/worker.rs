//! This process as a worker of the shared store: its row in `workers` (id, generation,
//! lease expiry), registered at connect with a new generation, renewed by a task every third
//! of the lease, released at close. Every group commit read-locks the row (`FOR KEY SHARE`)
//! and checks generation and expiry inside its own transaction ([`CHECK`]): once the lease
//! has run out or another worker raised the generation (fencing), the worker writes nothing
//! more ([`StoreError::Fenced`]).
//!
//! Registering also repairs what a crash left, as every store does at open: the runs this
//! worker (by id) or a worker whose lease has run out left `running` become `halted`, and
//! those dead workers are fenced, in the same transaction.

use super::pg;
use crate::model::envelope::RunStatus;
use crate::store::records::halt_interrupted;
use crate::store::{RunRecord, StoreError};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Who this worker is on the shared store.
#[derive(Debug, Clone)]
pub(crate) struct Lease {
    /// The worker's id.
    pub(crate) worker: String,
    /// The generation it holds: the one it registered with, raised when it rejoins after
    /// losing its lease ([`register`] again). Shared by every clone.
    generation: Arc<AtomicI64>,
    /// How long a renewal holds.
    pub(crate) duration: Duration,
}

impl Lease {
    /// The generation this worker holds now.
    pub(crate) fn generation(&self) -> i64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Hold `generation` from now on (a rejoin).
    pub(crate) fn set_generation(&self, generation: i64) {
        self.generation.store(generation, Ordering::SeqCst);
    }

    /// The refusal every write meets once this lease is lost.
    pub(crate) fn fenced(&self) -> StoreError {
        StoreError::Fenced { worker: self.worker.clone(), generation: self.generation() }
    }
}

/// Why [`register`] halts the runs this worker (by id) left `running`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Left {
    /// A process of this id stopped or crashed: the runs are interrupted (recovery resumes
    /// them when the worker starts), and so are those of workers really dead (fenced here).
    Crash,
    /// This process lost its lease while the database was away for `0`: its own runs end
    /// `halted` with a storage failure, still interrupted, and go back to the queue (a worker
    /// resumes them, counted against `--max-recoveries`). Other workers' runs are left to
    /// the reaper: a worker whose lease lapsed in the same outage is rejoining too.
    Outage(Duration),
}

/// Fence, by the reaper's rule, every worker other than `worker` whose lease ran out and
/// that still owns runs or queue entries: its row taken `FOR UPDATE` (`SKIP LOCKED`: one
/// that a commit of its own or its own rejoin holds is not dead, and is passed over), its
/// generation raised, inside the caller's transaction that then takes its runs. Returns the
/// workers fenced.
pub(super) async fn fence_dead(
    tx: &tokio_postgres::Transaction<'_>,
    url: &str,
    worker: &str,
) -> Result<Vec<String>, StoreError> {
    let e = |e| pg(url, e);
    let dead: Vec<String> = tx
        .query(
            "SELECT w.id FROM workers w WHERE w.lease_until < now() AND w.id <> $1
               AND (EXISTS (SELECT 1 FROM runs r WHERE r.owner = w.id) OR EXISTS (SELECT 1 FROM run_queue q WHERE q.claimed_by = w.id))
             FOR UPDATE SKIP LOCKED",
            &[&worker],
        )
        .await
        .map_err(e)?
        .iter()
        .map(|row| row.get(0))
        .collect();
    if !dead.is_empty() {
        tx.execute("UPDATE workers SET generation = generation + 1 WHERE id = ANY($1)", &[&dead]).await.map_err(e)?;
    }
    Ok(dead)
}

/// What a worker taking over a run (its own after a crash or an outage, a dead worker's)
/// does with it ([`take_over`]).
pub(super) enum TakeOver {
    /// Its record cannot be read: left as it is.
    Unreadable(serde_json::Error),
    /// Claimed from the queue and never started: back in the queue as it was.
    Fresh(RunRecord),
    /// Halted as interrupted, with its spend up to the last commit: to be resumed.
    Halted(RunRecord),
    /// It had ended (only its owner was not cleared).
    Ended,
}

/// Decide what becomes of a run taken over, from its row: its `record`, its live
/// `accounting`, and whether it has a queue entry (`queued`).
pub(super) fn take_over(record: &[u8], accounting: Option<&[u8]>, queued: bool) -> Result<TakeOver, StoreError> {
    let mut record: RunRecord = match serde_json::from_slice(record) {
        Ok(record) => record,
        Err(error) => return Ok(TakeOver::Unreadable(error)),
    };
    if queued && record.envelope.status == RunStatus::Pending && record.envelope.attempts == 0 {
        return Ok(TakeOver::Fresh(record));
    }
    let live = match accounting {
        Some(bytes) => Some(
            crate::store::journal::decode_live_accounting(bytes).map_err(|e| crate::store::corrupt("accounting", e))?,
        ),
        None => None,
    };
    Ok(if halt_interrupted(&mut record, live) { TakeOver::Halted(record) } else { TakeOver::Ended })
}

/// Open a transaction on `client` that first read-locks this worker's row and checks its
/// lease ([`CHECK`]): what it then writes is written only while the worker holds its lease.
pub(super) async fn fenced<'c>(
    client: &'c mut tokio_postgres::Client,
    url: &str,
    lease: &Lease,
) -> Result<tokio_postgres::Transaction<'c>, StoreError> {
    let tx = client.transaction().await.map_err(|e| pg(url, e))?;
    checked(tx.query_opt(CHECK, &[&lease.worker]).await.map_err(|e| pg(url, e))?, lease)?;
    Ok(tx)
}

/// Register `worker` (a new generation, a fresh lease) and repair the runs a crash left
/// running, in one transaction. Returns the lease and the ids of the runs halted.
///
/// Only runs whose worker cannot continue them are taken: this worker's own (by id), and at
/// connect ([`Left::Crash`]) those of workers found really dead and fenced in this same
/// transaction ([`fence_dead`]), and runs no worker row owns. A worker that is alive, or
/// rejoining at this moment, keeps its runs.
pub(super) async fn register(
    client: &mut tokio_postgres::Client,
    url: &str,
    worker: &str,
    duration: Duration,
    left: Left,
) -> Result<(Lease, Vec<String>), StoreError> {
    let e = |e| pg(url, e);
    let host = hostname();
    let pid = std::process::id() as i32;
    let secs = duration.as_secs_f64();
    let tx = client.transaction().await.map_err(e)?;
    // `FOR UPDATE` waits for any commit of an earlier self (holding `FOR KEY SHARE`) to end,
    // and makes every later one see the new generation.
    tx.execute("SELECT 1 FROM workers WHERE id = $1 FOR UPDATE", &[&worker]).await.map_err(e)?;
    let generation: i64 = tx
        .query_one(
            "INSERT INTO workers (id, generation, lease_until, host, pid) VALUES ($1, 1, now() + make_interval(secs => $2), $3, $4)
             ON CONFLICT (id) DO UPDATE SET generation = workers.generation + 1, lease_until = EXCLUDED.lease_until,
                 host = EXCLUDED.host, pid = EXCLUDED.pid, started_at = now()
             RETURNING generation",
            &[&worker, &secs, &host, &pid],
        )
        .await
        .map_err(e)?
        .get(0);
    let crash = left == Left::Crash;
    let dead = if crash { fence_dead(&tx, url, worker).await? } else { Vec::new() };
    let rows = tx
        .query(
            "SELECT r.id, r.record, a.accounting, q.run_id IS NOT NULL FROM runs r
               LEFT JOIN live_accounting a ON a.run_id = r.id
               LEFT JOIN run_queue q ON q.run_id = r.id
             WHERE r.status IN ('running', 'pending')
               AND (r.owner = $1 OR r.owner = ANY($2)
                    OR ($3 AND ((r.owner IS NULL AND q.run_id IS NULL)
                                OR (r.owner IS NOT NULL AND NOT EXISTS (SELECT 1 FROM workers w WHERE w.id = r.owner)))))
             FOR UPDATE OF r SKIP LOCKED",
            &[&worker, &dead, &crash],
        )
        .await
        .map_err(e)?;
    let (mut ids, mut records, mut fresh) = (Vec::new(), Vec::new(), Vec::new());
    for row in rows {
        let id: String = row.get(0);
        match take_over(row.get(1), row.get(2), row.get(3))? {
            // A record that cannot be read stays as it is (listed as unreadable).
            TakeOver::Unreadable(error) => {
                tracing::warn!("the record of run {id} cannot be read ({error}); left as it is")
            }
            TakeOver::Fresh(_) => fresh.push(id),
            TakeOver::Halted(mut record) => {
                if let Left::Outage(away) = left {
                    outage_failure(&mut record, away);
                }
                records.push(serde_json::to_vec(&record)?);
                ids.push(id);
            }
            TakeOver::Ended => {}
        }
    }
    if !ids.is_empty() {
        tx.execute(
            "UPDATE runs SET record = u.record, status = 'halted', owner = NULL
               FROM unnest($1::text[], $2::bytea[]) AS u(id, record) WHERE runs.id = u.id",
            &[&ids, &records],
        )
        .await
        .map_err(e)?;
    }
    // At connect, the runs halted here are recovered when the worker starts (`factory
    // serve`), not through the queue. At a rejoin they go back to the queue, for whichever
    // worker claims them first (this one included). What an earlier self or a dead worker had
    // claimed from the queue and not started goes back to it.
    let requeued = if crash {
        tx.execute("DELETE FROM run_queue WHERE run_id = ANY($1)", &[&ids]).await.map_err(e)?;
        0
    } else {
        tx.execute(
            "INSERT INTO run_queue (run_id) SELECT unnest($1::text[])
             ON CONFLICT (run_id) DO UPDATE SET claimed_by = NULL, enqueued_at = now()",
            &[&ids],
        )
        .await
        .map_err(e)?
    };
    tx.execute("UPDATE runs SET owner = NULL WHERE id = ANY($1)", &[&fresh]).await.map_err(e)?;
    let released = tx
        .execute(
            "UPDATE run_queue SET claimed_by = NULL WHERE claimed_by = $1 OR claimed_by = ANY($2) OR run_id = ANY($3)",
            &[&worker, &dead, &fresh],
        )
        .await
        .map_err(e)?;
    if released + requeued > 0 {
        tx.execute("SELECT pg_notify($1, '')", &[&super::schema::QUEUE_CHANNEL]).await.map_err(e)?;
    }
    tx.commit().await.map_err(e)?;
    Ok((Lease { worker: worker.to_string(), generation: Arc::new(AtomicI64::new(generation)), duration }, ids))
}

/// A run this worker was executing when it lost its lease to a database outage: `halted`
/// with a storage failure saying so; it keeps its interruption mark, so the worker that
/// claims it from the queue resumes it as automatic recovery does (counted against
/// `--max-recoveries`), every journaled call replaying for free.
fn outage_failure(record: &mut RunRecord, away: Duration) {
    use crate::model::envelope::{Failure, FailureType};
    let failure = Failure::new(
        FailureType::Storage,
        Some("unavailable"),
        format!(
            "the store could not be written for {:.1} s, longer than this worker's lease; the attempt stopped with the journal as last committed, and the run went back to the queue for a worker to resume",
            away.as_secs_f64()
        ),
    );
    record.envelope.error = Some(failure.message.clone());
    record.envelope.failure = Some(failure);
}

/// Take run `run_id` for this worker to recover, in one transaction that also checks this
/// worker's lease ([`CHECK`]): the run's row is locked `FOR UPDATE` (a worker claiming it at
/// the same moment waits, then reads the owner this one wrote) and becomes this worker's
/// while it is still `halted` and owned by nobody, by this worker's id, or by a worker whose
/// lease has run out (such a worker commits nothing more). `Ok(false)`: another live worker
/// took it, or it is no longer `halted`. The owner stays set until the resumed attempt
/// writes the run `running` (and the writer clears it once the run is no longer executing).
pub(super) async fn claim(
    client: &mut tokio_postgres::Client,
    url: &str,
    lease: &Lease,
    run_id: &str,
) -> Result<bool, StoreError> {
    let e = |e| pg(url, e);
    let tx = fenced(client, url, lease).await?;
    let Some(row) =
        tx.query_opt("SELECT status, owner FROM runs WHERE id = $1 FOR UPDATE", &[&run_id]).await.map_err(e)?
    else {
        return Ok(false);
    };
    if row.get::<_, &str>(0) != "halted" {
        return Ok(false);
    }
    if let Some(owner) = row.get::<_, Option<String>>(1).filter(|owner| *owner != lease.worker) {
        let live = tx.query_opt("SELECT lease_until > now() FROM workers WHERE id = $1", &[&owner]).await.map_err(e)?;
        if live.is_some_and(|row| row.get::<_, bool>(0)) {
            return Ok(false);
        }
    }
    tx.execute("UPDATE runs SET owner = $2 WHERE id = $1", &[&run_id, &lease.worker]).await.map_err(e)?;
    tx.commit().await.map_err(e)?;
    Ok(true)
}

/// Take run `run_id` for a caller's resume on this worker, in one transaction that also
/// checks this worker's lease ([`CHECK`]): the run's row is locked `FOR UPDATE` (a worker
/// resuming it at the same moment waits, then reads the owner this one wrote) and becomes
/// this worker's while it is not executing (`running`, `pending`) and is owned by nobody, by
/// this worker, or by a worker whose lease has run out. `Ok(false)`: another live worker
/// holds it, or it is executing.
pub(super) async fn claim_for_resume(
    client: &mut tokio_postgres::Client,
    url: &str,
    lease: &Lease,
    run_id: &str,
) -> Result<bool, StoreError> {
    let e = |e| pg(url, e);
    let tx = fenced(client, url, lease).await?;
    let taken = tx
        .query_opt(
            // The owner's liveness is a subquery, not a join: when this statement waits for
            // another resume's lock, PostgreSQL re-checks the row's new owner, and a join would
            // keep the worker row it had joined before (none), letting both resumes through.
            "WITH run AS (SELECT r.id FROM runs r
                          WHERE r.id = $1 AND r.status NOT IN ('running', 'pending')
                            AND (r.owner IS NULL OR r.owner = $2 OR NOT EXISTS (
                                  SELECT 1 FROM workers w WHERE w.id = r.owner AND w.lease_until >= now()))
                          FOR UPDATE OF r)
             UPDATE runs SET owner = $2 FROM run WHERE runs.id = run.id RETURNING runs.id",
            &[&run_id, &lease.worker],
        )
        .await
        .map_err(e)?;
    tx.commit().await.map_err(e)?;
    Ok(taken.is_some())
}

/// Give up this worker's claim of run `run_id` while the run is not executing.
pub(super) async fn release_claim(
    client: &tokio_postgres::Client,
    url: &str,
    lease: &Lease,
    run_id: &str,
) -> Result<(), StoreError> {
    client
        .execute(
            "UPDATE runs SET owner = NULL WHERE id = $1 AND owner = $2 AND status NOT IN ('running', 'pending')",
            &[&run_id, &lease.worker],
        )
        .await
        .map_err(|e| pg(url, e))?;
    Ok(())
}

/// Inside a commit's transaction: read-lock the worker's row (its id the one parameter).
pub(super) const CHECK: &str = "SELECT generation, lease_until > now() FROM workers WHERE id = $1 FOR KEY SHARE";

/// The fencing check of a group commit, pipelined with its upserts and `COMMIT`: fails with
/// [`super::schema::FENCE_SQLSTATE`] (aborting the transaction) unless the worker (`$1`)
/// still holds generation `$2` and an unexpired lease; read-locks the row as [`CHECK`] does.
pub(super) const FENCE: &str = "SELECT factory_fence($1, $2)";

/// Whether `error` is [`FENCE`] refusing the commit.
pub(super) fn is_fence_refusal(error: &tokio_postgres::Error) -> bool {
    error.as_db_error().is_some_and(|db| db.code().code() == super::schema::FENCE_SQLSTATE)
}

/// What [`CHECK`] answered: the worker still holds its generation and an unexpired lease.
pub(super) fn checked(row: Option<tokio_postgres::Row>, lease: &Lease) -> Result<(), StoreError> {
    match row {
        Some(row) if row.get::<_, i64>(0) == lease.generation() && row.get::<_, bool>(1) => Ok(()),
        _ => Err(lease.fenced()),
    }
}

/// Extend the lease; [`StoreError::Fenced`] when it had run out or the generation moved.
/// Returns when the renewal was sent (the local clock's start of the new lease).
pub(super) async fn renew(client: &tokio_postgres::Client, url: &str, lease: &Lease) -> Result<Instant, StoreError> {
    let sent = Instant::now();
    let renewed = client
        .execute(
            "UPDATE workers SET lease_until = now() + make_interval(secs => $3)
             WHERE id = $1 AND generation = $2 AND lease_until > now()",
            &[&lease.worker, &lease.generation(), &lease.duration.as_secs_f64()],
        )
        .await
        .map_err(|e| pg(url, e))?;
    if renewed == 1 {
        Ok(sent)
    } else {
        Err(lease.fenced())
    }
}

/// Give the lease up at a clean close: the next start of this worker, or any other
/// worker, may take its runs at once.
pub(super) async fn release(client: &tokio_postgres::Client, url: &str, lease: &Lease) -> Result<(), StoreError> {
    client
        .execute(
            "UPDATE workers SET lease_until = now() WHERE id = $1 AND generation = $2",
            &[&lease.worker, &lease.generation()],
        )
        .await
        .map_err(|e| pg(url, e))?;
    Ok(())
}

/// This machine's name (for `workers.host`).
pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}
