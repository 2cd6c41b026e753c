//! The run queue on PostgreSQL ([`RunQueue`] for [`PgStore`]): table `run_queue` (one row per
//! run waiting for, or held by, a worker: its [`QueuedStart`] and the worker that claimed it),
//! claimed with `FOR UPDATE SKIP LOCKED`; one `pg_notify('factory_queue', '')` per
//! transaction that enqueues or requeues (never one per row), and one when a claimed run
//! ends while others wait (room under a cap may have opened), heard on a LISTEN connection of
//! each worker's own, with a slow poll by the caller as the fallback. The cluster-wide cap on
//! runs is counted under a transaction-level advisory lock (so two workers claiming at once
//! cannot both take the last room); without that cap claims never wait on each other. The
//! reaper and the per-backend call slots (`call_slots`, one row per slot) live here too.

use super::worker::{checked, CHECK};
use super::{pg, PgStore};
use crate::model::envelope::{Accounting, RunStatus};
use crate::store::queue::{Claimed, QueuedStart, Reaped, RunQueue};
use crate::store::records::halt_interrupted;
use crate::store::{corrupt, RunRecord, StoreError};
use futures::future::{BoxFuture, FutureExt};
use futures::StreamExt;
use std::time::Duration;
use tokio::sync::broadcast;

use super::schema::QUEUE_CHANNEL as CHANNEL;

/// The advisory lock claims take when a cluster-wide cap on runs is set.
const CLAIM_LOCK: i64 = 0x6661_6374_6f72_7902;

/// Runs owned cluster-wide (executing, or claimed and about to).
const OWNED: &str = "SELECT count(*) FROM runs WHERE owner IS NOT NULL";

/// Under the claim lock, how many more runs `cap` allows.
async fn cluster_room(tx: &tokio_postgres::Transaction<'_>, url: &str, cap: Option<usize>) -> Result<usize, StoreError> {
    let Some(cap) = cap else { return Ok(usize::MAX) };
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&CLAIM_LOCK]).await.map_err(|e| pg(url, e))?;
    let owned: i64 = tx.query_one(OWNED, &[]).await.map_err(|e| pg(url, e))?.get(0);
    Ok(cap.saturating_sub(usize::try_from(owned).unwrap_or(usize::MAX)))
}

fn decode_start(run_id: &str, bytes: Option<Vec<u8>>) -> Option<QueuedStart> {
    let bytes = bytes?;
    match serde_json::from_slice(&bytes) {
        Ok(start) => Some(start),
        Err(e) => {
            tracing::warn!("the queued start of run {run_id} cannot be read ({e}); resumed from its record instead");
            None
        }
    }
}

impl RunQueue for PgStore {
    fn enqueue<'a>(&'a self, record: &'a mut RunRecord, start: &'a QueuedStart, here: bool, cluster_runs: Option<usize>) -> BoxFuture<'a, Result<bool, StoreError>> {
        let (pool, lease) = (self.pool.clone(), self.lease.clone());
        let start = serde_json::to_vec(start);
        async move {
            let start = start?;
            let status = serde_json::to_value(record.envelope.status)?.as_str().unwrap_or("pending").to_string();
            let mut staged = record.clone();
            let (seq, claimed) = self
                .spawn(async move {
                    let url = pool.url.clone();
                    let e = |e| pg(&url, e);
                    let mut client = pool.get().await?;
                    let tx = client.transaction().await.map_err(e)?;
                    checked(tx.query_opt(CHECK, &[&lease.worker]).await.map_err(e)?, &lease)?;
                    let seq: i64 = tx.query_one("SELECT nextval('run_seq')", &[]).await.map_err(e)?.get(0);
                    let here = here && cluster_room(&tx, &url, cluster_runs).await? > 0;
                    staged.seq = u64::try_from(seq).map_err(|e| corrupt("the run sequence", e))?;
                    staged.writes += 1;
                    let bytes = serde_json::to_vec(&staged)?;
                    let owner = here.then_some(lease.worker.as_str());
                    tx.execute(
                        "INSERT INTO runs (id, seq, status, owner, record) VALUES ($1, $2, $3, $4, $5)",
                        &[&staged.envelope.run_id, &seq, &status, &owner, &bytes],
                    )
                    .await
                    .map_err(e)?;
                    tx.execute("INSERT INTO run_queue (run_id, start, claimed_by) VALUES ($1, $2, $3)", &[&staged.envelope.run_id, &start, &owner])
                        .await
                        .map_err(e)?;
                    if !here {
                        tx.execute("SELECT pg_notify($1, '')", &[&CHANNEL]).await.map_err(e)?;
                    }
                    tx.commit().await.map_err(e)?;
                    Ok((staged.seq, here))
                })
                .await?;
            record.seq = seq;
            record.writes += 1;
            Ok(claimed)
        }
        .boxed()
    }

    fn claim(&self, max: usize, skip: Vec<String>, cluster_runs: Option<usize>) -> BoxFuture<'_, Result<Vec<Claimed>, StoreError>> {
        let (pool, lease) = (self.pool.clone(), self.lease.clone());
        self.spawn(async move {
            let url = pool.url.clone();
            let e = |e| pg(&url, e);
            let mut client = pool.get().await?;
            let tx = client.transaction().await.map_err(e)?;
            checked(tx.query_opt(CHECK, &[&lease.worker]).await.map_err(e)?, &lease)?;
            let max = max.min(cluster_room(&tx, &url, cluster_runs).await?);
            if max == 0 {
                return Ok(Vec::new());
            }
            let limit = i64::try_from(max).unwrap_or(i64::MAX);
            let rows = tx
                .query(
                    "WITH picked AS (
                       SELECT run_id FROM run_queue WHERE claimed_by IS NULL AND NOT (run_id = ANY($2))
                       ORDER BY enqueued_at LIMIT $3 FOR UPDATE SKIP LOCKED)
                     UPDATE run_queue q SET claimed_by = $1 FROM picked WHERE q.run_id = picked.run_id
                     RETURNING q.run_id, q.start",
                    &[&lease.worker, &skip, &limit],
                )
                .await
                .map_err(e)?;
            let ids: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
            // The run becomes this worker's unless another live worker executes it.
            let owned: Vec<String> = tx
                .query(
                    "UPDATE runs r SET owner = $1 WHERE r.id = ANY($2)
                       AND (r.owner IS NULL OR r.owner = $1
                            OR NOT EXISTS (SELECT 1 FROM workers w WHERE w.id = r.owner AND w.lease_until > now()))
                     RETURNING r.id",
                    &[&lease.worker, &ids],
                )
                .await
                .map_err(e)?
                .iter()
                .map(|row| row.get(0))
                .collect();
            tx.commit().await.map_err(e)?;
            Ok(rows
                .into_iter()
                .map(|row| {
                    let run_id: String = row.get(0);
                    let start = decode_start(&run_id, row.get(1));
                    let owned = owned.contains(&run_id);
                    Claimed { run_id, start, owned }
                })
                .collect())
        })
    }

    fn release(&self, run_id: String) -> BoxFuture<'_, Result<(), StoreError>> {
        let (pool, lease) = (self.pool.clone(), self.lease.clone());
        self.spawn(async move {
            let url = pool.url.clone();
            let e = |e| pg(&url, e);
            let mut client = pool.get().await?;
            let tx = client.transaction().await.map_err(e)?;
            tx.execute("UPDATE run_queue SET claimed_by = NULL WHERE run_id = $1 AND claimed_by = $2", &[&run_id, &lease.worker]).await.map_err(e)?;
            tx.execute("UPDATE runs SET owner = NULL WHERE id = $1 AND owner = $2", &[&run_id, &lease.worker]).await.map_err(e)?;
            tx.execute("SELECT pg_notify($1, '')", &[&CHANNEL]).await.map_err(e)?;
            tx.commit().await.map_err(e)
        })
    }

    fn finish(&self, run_id: String) -> BoxFuture<'_, Result<(), StoreError>> {
        let (pool, lease) = (self.pool.clone(), self.lease.clone());
        self.spawn(async move {
            let client = pool.get().await?;
            // Only this worker's claim: an entry handed back meanwhile stays queued. When runs
            // wait (held back by a cap), one notification says there may be room now.
            client
                .execute(
                    "WITH done AS (DELETE FROM run_queue WHERE run_id = $1 AND claimed_by = $2 RETURNING run_id)
                     SELECT pg_notify($3, '') WHERE EXISTS (SELECT 1 FROM done)
                       AND EXISTS (SELECT 1 FROM run_queue WHERE claimed_by IS NULL)",
                    &[&run_id, &lease.worker, &CHANNEL],
                )
                .await
                .map_err(|e| pg(&pool.url, e))?;
            Ok(())
        })
    }

    fn dequeue(&self, run_id: String) -> BoxFuture<'_, Result<bool, StoreError>> {
        let pool = self.pool.clone();
        self.spawn(async move {
            let client = pool.get().await?;
            let removed = client
                .execute(
                    "DELETE FROM run_queue q USING runs r
                     WHERE q.run_id = $1 AND q.claimed_by IS NULL AND r.id = q.run_id AND r.status = 'pending' AND r.owner IS NULL",
                    &[&run_id],
                )
                .await
                .map_err(|e| pg(&pool.url, e))?;
            Ok(removed == 1)
        })
    }

    fn hand_back(&self, run_ids: Vec<String>) -> BoxFuture<'_, Result<Vec<String>, StoreError>> {
        let pool = self.pool.clone();
        self.spawn(async move {
            let url = pool.url.clone();
            let e = |e| pg(&url, e);
            let mut client = pool.get().await?;
            let tx = client.transaction().await.map_err(e)?;
            let queued: Vec<String> = tx
                .query(
                    "INSERT INTO run_queue (run_id) SELECT id FROM runs WHERE id = ANY($1) AND status = 'halted'
                     ON CONFLICT (run_id) DO UPDATE SET claimed_by = NULL, enqueued_at = now()
                     RETURNING run_id",
                    &[&run_ids],
                )
                .await
                .map_err(e)?
                .iter()
                .map(|row| row.get(0))
                .collect();
            if !queued.is_empty() {
                tx.execute("SELECT pg_notify($1, '')", &[&CHANNEL]).await.map_err(e)?;
            }
            tx.commit().await.map_err(e)?;
            Ok(queued)
        })
    }

    fn reap(&self) -> BoxFuture<'_, Result<Reaped, StoreError>> {
        let (pool, lease) = (self.pool.clone(), self.lease.clone());
        self.spawn(async move {
            let url = pool.url.clone();
            let e = |e| pg(&url, e);
            let mut client = pool.get().await?;
            let tx = client.transaction().await.map_err(e)?;
            checked(tx.query_opt(CHECK, &[&lease.worker]).await.map_err(e)?, &lease)?;
            // `FOR UPDATE` conflicts with the `FOR KEY SHARE` of a commit of theirs in flight:
            // such a worker is skipped now and fenced at the next pass.
            let dead = super::worker::fence_dead(&tx, &url, &lease.worker).await?;
            if dead.is_empty() {
                return Ok(Reaped::default());
            }
            let rows = tx
                .query(
                    "SELECT r.id, r.record, a.accounting, q.run_id IS NOT NULL FROM runs r
                       LEFT JOIN live_accounting a ON a.run_id = r.id
                       LEFT JOIN run_queue q ON q.run_id = r.id
                     WHERE r.owner = ANY($1) FOR UPDATE OF r",
                    &[&dead],
                )
                .await
                .map_err(e)?;
            let (mut ids, mut records, mut statuses) = (Vec::new(), Vec::new(), Vec::new());
            let mut orphans = Vec::new();
            for row in rows {
                let id: String = row.get(0);
                let bytes: Vec<u8> = row.get(1);
                let mut record: RunRecord = match serde_json::from_slice(&bytes) {
                    Ok(record) => record,
                    Err(error) => {
                        tracing::warn!("the record of run {id} cannot be read ({error}); only released");
                        orphans.push(id);
                        continue;
                    }
                };
                let queued: bool = row.get(3);
                let fresh = queued && record.envelope.status == RunStatus::Pending && record.envelope.attempts == 0;
                if !fresh {
                    let live = match row.get::<_, Option<Vec<u8>>>(2) {
                        Some(bytes) => Some(serde_json::from_slice::<Accounting>(&bytes).map_err(|e| corrupt("accounting", e))?),
                        None => None,
                    };
                    if !halt_interrupted(&mut record, live) {
                        // Ended, but its owner was not cleared: only released.
                        orphans.push(id);
                        continue;
                    }
                }
                let status = serde_json::to_value(record.envelope.status)?.as_str().unwrap_or("halted").to_string();
                records.push(serde_json::to_vec(&record)?);
                statuses.push(status);
                ids.push(id);
            }
            tx.execute(
                "UPDATE runs SET record = u.record, status = u.status, owner = NULL
                   FROM unnest($1::text[], $2::bytea[], $3::text[]) AS u(id, record, status) WHERE runs.id = u.id",
                &[&ids, &records, &statuses],
            )
            .await
            .map_err(e)?;
            tx.execute("UPDATE runs SET owner = NULL WHERE id = ANY($1)", &[&orphans]).await.map_err(e)?;
            tx.execute(
                "INSERT INTO run_queue (run_id) SELECT unnest($1::text[])
                 ON CONFLICT (run_id) DO UPDATE SET claimed_by = NULL, enqueued_at = now()",
                &[&ids],
            )
            .await
            .map_err(e)?;
            tx.execute("UPDATE run_queue SET claimed_by = NULL WHERE claimed_by = ANY($1)", &[&dead]).await.map_err(e)?;
            tx.execute("SELECT pg_notify($1, '')", &[&CHANNEL]).await.map_err(e)?;
            tx.commit().await.map_err(e)?;
            Ok(Reaped { workers: dead, runs: ids })
        })
    }

    fn wakeups(&self) -> broadcast::Receiver<()> {
        self.queue_wakeups.subscribe()
    }

    fn take_call_slot(&self, backend: String, cap: u32) -> BoxFuture<'static, Result<Option<i32>, StoreError>> {
        let (pool, lease) = (self.pool.clone(), self.lease.clone());
        self.spawn(async move {
            let url = pool.url.clone();
            let e = |e| pg(&url, e);
            let client = pool.get().await?;
            let cap = i32::try_from(cap).unwrap_or(i32::MAX);
            client
                .execute("INSERT INTO call_slots (backend, slot) SELECT $1, generate_series(0, $2 - 1) ON CONFLICT DO NOTHING", &[&backend, &cap])
                .await
                .map_err(e)?;
            // A slot is free when nobody holds it, or its holder's lease ran out (such a
            // worker starts no call) or it registered again since (a new generation). The
            // holder's liveness is a subquery, not a join: a slot taken meanwhile by another
            // worker is checked again on its new row (a join would keep the old holder's).
            let row = client
                .query_opt(
                    "UPDATE call_slots s SET holder = $3, holder_generation = $4 FROM (
                       SELECT c.backend, c.slot FROM call_slots c
                       WHERE c.backend = $1 AND c.slot < $2
                         AND (c.holder IS NULL OR NOT EXISTS (
                               SELECT 1 FROM workers w WHERE w.id = c.holder AND w.generation = c.holder_generation AND w.lease_until > now()))
                       ORDER BY c.slot LIMIT 1 FOR UPDATE OF c SKIP LOCKED) free
                     WHERE s.backend = free.backend AND s.slot = free.slot
                       AND EXISTS (SELECT 1 FROM workers me WHERE me.id = $3 AND me.generation = $4 AND me.lease_until > now())
                     RETURNING s.slot",
                    &[&backend, &cap, &lease.worker, &lease.generation()],
                )
                .await
                .map_err(e)?;
            Ok(row.map(|row| row.get(0)))
        })
    }

    fn give_call_slot(&self, backend: String, slot: i32) -> BoxFuture<'static, Result<(), StoreError>> {
        let (pool, lease) = (self.pool.clone(), self.lease.clone());
        self.spawn(async move {
            let client = pool.get().await?;
            client
                .execute(
                    "UPDATE call_slots SET holder = NULL, holder_generation = NULL WHERE backend = $1 AND slot = $2 AND holder = $3 AND holder_generation = $4",
                    &[&backend, &slot, &lease.worker, &lease.generation()],
                )
                .await
                .map_err(|e| pg(&pool.url, e))?;
            Ok(())
        })
    }
}

/// Forward queue notifications to `wakeups`, on a LISTEN connection of its own (connected
/// again after a failure).
pub(super) async fn listen(config: tokio_postgres::Config, url: String, wakeups: broadcast::Sender<()>) {
    loop {
        if let Err(e) = notifications(&config, &wakeups).await {
            tracing::warn!("listening for queued runs on {url}: {e}");
        }
        // Whatever was enqueued meanwhile is found by the next claim.
        let _ = wakeups.send(());
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn notifications(config: &tokio_postgres::Config, wakeups: &broadcast::Sender<()>) -> Result<(), tokio_postgres::Error> {
    let (client, mut connection) = config.connect(tokio_postgres::NoTls).await?;
    let (tx, mut rx) = futures::channel::mpsc::unbounded();
    let driver = futures::stream::poll_fn(move |cx| connection.poll_message(cx)).map(Ok).forward(tx);
    let driver = tokio::spawn(driver);
    client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
    while let Some(message) = rx.next().await {
        match message {
            Ok(tokio_postgres::AsyncMessage::Notification(note)) if note.channel() == CHANNEL => {
                let _ = wakeups.send(());
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
