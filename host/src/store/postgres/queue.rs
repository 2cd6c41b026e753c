//! The run queue on PostgreSQL ([`RunQueue`] for [`PgStore`]): table `run_queue` (one row per
//! run waiting for, or held by, a worker: its [`QueuedStart`] and the worker that claimed it),
//! claimed with `FOR UPDATE SKIP LOCKED`; one `pg_notify('factory_queue', '')` per
//! transaction that enqueues or requeues (never one per row), and one when a claimed run
//! ends while others wait (room under a cap may have opened), heard on a LISTEN connection of
//! each worker's own, with a slow poll by the caller as the fallback. The cluster-wide cap on
//! runs is counted under a transaction-level advisory lock (so two workers claiming at once
//! cannot both take the last room); without that cap claims never wait on each other. The
//! reaper and the per-backend call slots (`call_slots`, one row per slot) live here too, as
//! do the flow budgets the workers share (`flow_budgets`, one row per backend endpoint and
//! key: token buckets refilled on the database's clock, taken from in one statement).

use super::worker::{fenced, take_over, TakeOver};
use super::{pg, PgStore};
use crate::store::queue::{Claimed, FlowRates, QueuedStart, Reaped, RunQueue};
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

/// Take from a flow budget: the row is locked (`FOR UPDATE`: a take waiting on another sees
/// the row it left), its buckets refilled for the time since `refilled_at` at the rates then
/// in force and capped at the sizes now given, then one request and `$6` tokens taken when
/// both are there and the budget is not closed; the rates and sizes become the caller's.
/// Returns NULL when taken, else the seconds until it could be (the closed time left, or
/// the refill the emptier bucket needs). Time is the database's `clock_timestamp()`.
/// `$1` key, `$2` requests/s (NULL: not metered), `$3` request bucket size, `$4` tokens/s
/// (NULL: not metered), `$5` token bucket size, `$6` tokens of this call.
const TAKE_BUDGET: &str = "
    UPDATE flow_budgets b SET
        request_rate = $2::float8, request_burst = $3::float8, token_rate = $4::float8, token_burst = $5::float8,
        requests = CASE WHEN f.ok AND $2::float8 IS NOT NULL THEN f.requests - 1 ELSE f.requests END,
        tokens = CASE WHEN f.ok AND $4::float8 IS NOT NULL THEN f.tokens - $6::float8 ELSE f.tokens END,
        refilled_at = f.at
    FROM (
        SELECT r.key, r.at, r.closed_until, r.requests, r.tokens, r.closed,
               NOT r.closed AND ($2::float8 IS NULL OR r.requests >= 1)
                   AND ($4::float8 IS NULL OR r.tokens >= least($6::float8, $5::float8)) AS ok
        FROM (
            SELECT l.key, l.at, l.closed_until, coalesce(l.closed_until > l.at, false) AS closed,
                   least(l.requests + coalesce(l.request_rate, 0) * l.elapsed, $3::float8) AS requests,
                   least(l.tokens + coalesce(l.token_rate, 0) * l.elapsed, $5::float8) AS tokens
            FROM (
                SELECT c.key, c.requests, c.tokens, c.request_rate, c.token_rate, c.closed_until,
                       greatest(c.refilled_at, clock_timestamp()) AS at,
                       greatest(extract(epoch FROM clock_timestamp() - c.refilled_at)::float8, 0) AS elapsed
                FROM flow_budgets c WHERE c.key = $1 FOR UPDATE
            ) l
        ) r
    ) f
    WHERE b.key = f.key
    RETURNING CASE
        WHEN f.ok THEN NULL
        WHEN f.closed THEN extract(epoch FROM f.closed_until - f.at)::float8
        ELSE greatest(
            CASE WHEN $2::float8 IS NULL THEN 0 ELSE (1 - f.requests) / greatest($2::float8, 1e-6) END,
            CASE WHEN $4::float8 IS NULL THEN 0 ELSE (least($6::float8, $5::float8) - f.tokens) / greatest($4::float8, 1e-6) END)
    END";

/// A flow budget's row on first use: its buckets holding what the caller's own hold (`$2`,
/// `$3`), at most full (`$4`, `$5`).
const NEW_BUDGET: &str = "
    INSERT INTO flow_budgets (key, requests, tokens, refilled_at)
    VALUES ($1, least($2::float8, $4::float8), least($3::float8, $5::float8), clock_timestamp())
    ON CONFLICT (key) DO NOTHING";

/// Close a flow budget for `$2` seconds from now (a later close stands) and empty its
/// request bucket, the refill starting now.
const CLOSE_BUDGET: &str = "
    INSERT INTO flow_budgets (key, closed_until, refilled_at) VALUES ($1, clock_timestamp() + make_interval(secs => $2::float8), clock_timestamp())
    ON CONFLICT (key) DO UPDATE SET
        closed_until = greatest(flow_budgets.closed_until, EXCLUDED.closed_until),
        requests = least(flow_budgets.requests, 0),
        refilled_at = greatest(flow_budgets.refilled_at, EXCLUDED.refilled_at)";

/// Put `$2` tokens back in a flow budget's token bucket (negative: take more), within
/// plus or minus its size.
const TRUE_UP_BUDGET: &str = "
    UPDATE flow_budgets SET tokens = greatest(least(tokens + $2::float8, token_burst), -token_burst)
    WHERE key = $1 AND token_rate IS NOT NULL";

/// Bound a flow budget's buckets by what the server says remains (`$2` requests, `$3`
/// tokens; NULL: not said), refilled first up to now.
const BOUND_BUDGET: &str = "
    UPDATE flow_budgets SET
        requests = least(requests + coalesce(request_rate, 0) * greatest(extract(epoch FROM clock_timestamp() - refilled_at)::float8, 0),
                         request_burst, coalesce($2::float8, 'Infinity'::float8)),
        tokens = least(tokens + coalesce(token_rate, 0) * greatest(extract(epoch FROM clock_timestamp() - refilled_at)::float8, 0),
                       token_burst, coalesce($3::float8, 'Infinity'::float8)),
        refilled_at = greatest(refilled_at, clock_timestamp())
    WHERE key = $1";

/// The longest wait a flow budget reports (a day), as the local buckets do.
const MAX_BUDGET_WAIT: f64 = 86_400.0;

/// Under the claim lock, how many more runs `cap` allows.
async fn cluster_room(
    tx: &tokio_postgres::Transaction<'_>,
    url: &str,
    cap: Option<usize>,
) -> Result<usize, StoreError> {
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
    fn enqueue<'a>(
        &'a self,
        record: &'a mut RunRecord,
        start: &'a QueuedStart,
        here: bool,
        cluster_runs: Option<usize>,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let (pool, lease) = (self.pool.clone(), self.lease.clone());
        let start = serde_json::to_vec(start);
        async move {
            let start = start?;
            let mut due = self.pins.due_for(&start, crate::store::blobs::Referenced::start);
            let status = serde_json::to_value(record.envelope.status)?.as_str().unwrap_or("pending").to_string();
            let mut staged = record.clone();
            let (seq, claimed) = self
                .spawn(async move {
                    let url = pool.url.clone();
                    let e = |e| pg(&url, e);
                    let mut client = pool.get().await?;
                    let tx = fenced(&mut client, &url, &lease).await?;
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
                    tx.execute(
                        "INSERT INTO run_queue (run_id, start, claimed_by) VALUES ($1, $2, $3)",
                        &[&staged.envelope.run_id, &start, &owner],
                    )
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
            due.extend(self.pins.due_for_run(&record.envelope.run_id, &serde_json::to_vec(record)?));
            self.keep_pinned(due).await?;
            Ok(claimed)
        }
        .boxed()
    }

    fn claim(
        &self,
        max: usize,
        skip: Vec<String>,
        cluster_runs: Option<usize>,
    ) -> BoxFuture<'_, Result<Vec<Claimed>, StoreError>> {
        let (pool, lease) = (self.pool.clone(), self.lease.clone());
        self.spawn(async move {
            let url = pool.url.clone();
            let e = |e| pg(&url, e);
            let mut client = pool.get().await?;
            let tx = fenced(&mut client, &url, &lease).await?;
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

    fn release(&self, run_id: String, reason: String) -> BoxFuture<'_, Result<(), StoreError>> {
        let (pool, lease) = (self.pool.clone(), self.lease.clone());
        // Bounded: a reason is one error message.
        let reason: String = reason.chars().take(1000).collect();
        self.spawn(async move {
            let url = pool.url.clone();
            let e = |e| pg(&url, e);
            let mut client = pool.get().await?;
            let tx = client.transaction().await.map_err(e)?;
            tx.execute(
                "UPDATE run_queue SET claimed_by = NULL, refused = refused || jsonb_build_object($2::text, $3::text)
                 WHERE run_id = $1 AND claimed_by = $2",
                &[&run_id, &lease.worker, &reason],
            )
            .await
            .map_err(e)?;
            tx.execute("UPDATE runs SET owner = NULL WHERE id = $1 AND owner = $2", &[&run_id, &lease.worker])
                .await
                .map_err(e)?;
            tx.execute("SELECT pg_notify($1, '')", &[&CHANNEL]).await.map_err(e)?;
            tx.commit().await.map_err(e)
        })
    }

    fn refusals(&self, run_id: String) -> BoxFuture<'_, Result<Vec<(String, String)>, StoreError>> {
        let pool = self.pool.clone();
        self.spawn(async move {
            let client = pool.get().await?;
            let rows = client
                .query("SELECT r.key, r.value FROM run_queue q, jsonb_each_text(q.refused) r WHERE q.run_id = $1 ORDER BY r.key", &[&run_id])
                .await
                .map_err(|e| pg(&pool.url, e))?;
            Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
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

    fn hold(&self, run_ids: Vec<String>) -> BoxFuture<'_, Result<(), StoreError>> {
        let (pool, lease) = (self.pool.clone(), self.lease.clone());
        self.spawn(async move {
            let client = pool.get().await?;
            client
                .execute(
                    "INSERT INTO run_queue (run_id, claimed_by) SELECT id, $2 FROM runs WHERE id = ANY($1)
                     ON CONFLICT (run_id) DO UPDATE SET claimed_by = EXCLUDED.claimed_by",
                    &[&run_ids, &lease.worker],
                )
                .await
                .map_err(|e| pg(&pool.url, e))?;
            Ok(())
        })
    }

    fn hand_back(&self, run_ids: Vec<String>) -> BoxFuture<'_, Result<Vec<String>, StoreError>> {
        let (pool, lease) = (self.pool.clone(), self.lease.clone());
        self.spawn(async move {
            let url = pool.url.clone();
            let e = |e| pg(&url, e);
            let mut client = pool.get().await?;
            let tx = client.transaction().await.map_err(e)?;
            tx.execute(
                "DELETE FROM run_queue q USING runs r WHERE q.run_id = ANY($1) AND q.claimed_by = $2 AND r.id = q.run_id AND r.status <> 'halted'",
                &[&run_ids, &lease.worker],
            )
            .await
            .map_err(e)?;
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
            let tx = fenced(&mut client, &url, &lease).await?;
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
                let record = match take_over(row.get(1), row.get(2), row.get(3))? {
                    TakeOver::Unreadable(error) => {
                        tracing::warn!("the record of run {id} cannot be read ({error}); only released");
                        orphans.push(id);
                        continue;
                    }
                    TakeOver::Fresh(record) | TakeOver::Halted(record) => record,
                    // Ended, but its owner was not cleared: only released.
                    TakeOver::Ended => {
                        orphans.push(id);
                        continue;
                    }
                };
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
            tx.execute("UPDATE run_queue SET claimed_by = NULL WHERE claimed_by = ANY($1)", &[&dead])
                .await
                .map_err(e)?;
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

    fn take_flow_budget(
        &self,
        key: String,
        rates: FlowRates,
        tokens: f64,
    ) -> BoxFuture<'static, Result<Option<Duration>, StoreError>> {
        let pool = self.pool.clone();
        self.spawn(async move {
            let url = pool.url.clone();
            let e = |e| pg(&url, e);
            let client = pool.get().await?;
            let tokens = if tokens.is_finite() { tokens.max(0.0) } else { 0.0 };
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] =
                [&key, &rates.requests, &rates.request_burst, &rates.tokens, &rates.token_burst, &tokens];
            let mut row = client.query_opt(TAKE_BUDGET, &params).await.map_err(e)?;
            if row.is_none() {
                // First use: the row is made with full buckets (by one worker; the others'
                // inserts do nothing), then taken from like any other.
                let left = [rates.requests_left, rates.tokens_left].map(|v| if v.is_finite() { v } else { 0.0 });
                client
                    .execute(NEW_BUDGET, &[&key, &left[0], &left[1], &rates.request_burst, &rates.token_burst])
                    .await
                    .map_err(e)?;
                row = client.query_opt(TAKE_BUDGET, &params).await.map_err(e)?;
            }
            let wait: Option<f64> = match row {
                Some(row) => row.try_get(0).map_err(e)?,
                None => return Err(corrupt("a flow budget", format!("the row of `{key}` is gone"))),
            };
            Ok(wait.map(|secs| {
                Duration::from_secs_f64(if secs.is_finite() {
                    secs.clamp(0.0, MAX_BUDGET_WAIT)
                } else {
                    MAX_BUDGET_WAIT
                })
            }))
        })
    }

    fn close_flow_budget(&self, key: String, wait: Duration) -> BoxFuture<'static, Result<(), StoreError>> {
        let pool = self.pool.clone();
        self.spawn(async move {
            let client = pool.get().await?;
            let secs = wait.as_secs_f64().min(MAX_BUDGET_WAIT);
            client.execute(CLOSE_BUDGET, &[&key, &secs]).await.map_err(|e| pg(&pool.url, e))?;
            Ok(())
        })
    }

    fn bound_flow_budget(
        &self,
        key: String,
        requests: Option<f64>,
        tokens: Option<f64>,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        let pool = self.pool.clone();
        self.spawn(async move {
            let [requests, tokens] = [requests, tokens].map(|v| v.filter(|v| v.is_finite()));
            if requests.is_none() && tokens.is_none() {
                return Ok(());
            }
            let client = pool.get().await?;
            client.execute(BOUND_BUDGET, &[&key, &requests, &tokens]).await.map_err(|e| pg(&pool.url, e))?;
            Ok(())
        })
    }

    fn true_up_flow_budget(&self, key: String, tokens: f64) -> BoxFuture<'static, Result<(), StoreError>> {
        let pool = self.pool.clone();
        self.spawn(async move {
            if !tokens.is_finite() {
                return Ok(());
            }
            let client = pool.get().await?;
            client.execute(TRUE_UP_BUDGET, &[&key, &tokens]).await.map_err(|e| pg(&pool.url, e))?;
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

async fn notifications(
    config: &tokio_postgres::Config,
    wakeups: &broadcast::Sender<()>,
) -> Result<(), tokio_postgres::Error> {
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
