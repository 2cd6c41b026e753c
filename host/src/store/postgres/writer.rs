//! Group commit on PostgreSQL: one writer task owns every write of this worker. Callers hand
//! it operations and go on at once; it gathers whatever arrives within the commit window (or
//! until a flush is asked for, or [`EARLY_COMMIT_OPS`] writes wait) into ONE transaction:
//! first the worker's fencing check
//! ([`worker::FENCE`]), then one batched upsert per table (`INSERT ... SELECT FROM
//! unnest(...) ON CONFLICT DO UPDATE`), the entries deduplicated per batch (an upsert cannot
//! touch a row twice), all statements prepared once per connection and pipelined on it with
//! `BEGIN` and `COMMIT` (one round trip per window). Every batch is idempotent, so a
//! commit whose outcome is unknown (the connection dropped, the database away) is retried on
//! a new connection for as long as this worker's lease holds by its own clock (the bound: a
//! commit after it would be refused anyway); then it fails with
//! [`StoreError::Unavailable`]. A failed commit (that one, fenced, a database error) fails the
//! store, which then refuses further writes until the worker rejoins (see `super::renew`).

use super::values;
use super::worker::{self, Lease};
use super::{pg, PoolHandle};
use crate::store::codec;
use crate::store::op::{Backlog, Op, Pending, Queued, EARLY_COMMIT_OPS};
use crate::store::shared;
use crate::store::{StoreError, WriterStats};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// The handle callers use.
pub(crate) struct Writer {
    pub(crate) pending: Arc<Mutex<Pending>>,
    tx: Arc<Mutex<Option<mpsc::UnboundedSender<Queued>>>>,
    /// The first failure (a refused commit, a lost lease); once set, writes are refused.
    pub(crate) failed: Arc<Mutex<Option<Arc<StoreError>>>>,
    pub(crate) stats: Arc<WriterStats>,
    backlog: Arc<Backlog>,
    /// Told when the task has committed what was queued and stopped.
    done: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

/// What the writer task needs.
pub(super) struct Setup {
    pub(super) pool: PoolHandle,
    pub(super) lease: Lease,
    pub(super) window: Duration,
    pub(super) queue_bytes: u64,
    /// When this worker's lease runs out by its own clock: commits are retried until then.
    pub(super) local_lease: Arc<Mutex<std::time::Instant>>,
}

impl Writer {
    /// Start the writer task on `runtime`.
    pub(super) fn start(runtime: &tokio::runtime::Handle, setup: Setup) -> Writer {
        let (tx, rx) = mpsc::unbounded_channel();
        let (done_tx, done) = std::sync::mpsc::channel();
        let writer = Writer {
            pending: Arc::default(),
            tx: Arc::new(Mutex::new(Some(tx))),
            failed: Arc::default(),
            stats: Arc::default(),
            backlog: Arc::new(Backlog::new(setup.queue_bytes)),
            done: Mutex::new(Some(done)),
        };
        let (notes, notifier) = mpsc::unbounded_channel();
        let notifier = runtime.spawn(notify(
            setup.pool.clone(),
            setup.lease.worker.clone(),
            writer.stats.clone(),
            setup.window,
            notifier,
        ));
        let task = Task {
            notes,
            pool: setup.pool,
            lease: setup.lease,
            window: setup.window,
            local_lease: setup.local_lease,
            failed: writer.failed.clone(),
            stats: writer.stats.clone(),
            pending: writer.pending.clone(),
            backlog: writer.backlog.clone(),
        };
        runtime.spawn(async move {
            task.run(rx).await;
            // The notifications of the last commits go out before the writer reports done.
            let _ = notifier.await;
            let _ = done_tx.send(());
        });
        writer
    }

    /// Queue a write; fails only when the store has failed or is closed. When the queue
    /// holds its cap in bytes, waits for the next commit first.
    pub(crate) fn send(&self, op: Op) -> Result<(), StoreError> {
        if let Some(failure) = self.failed.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Err(StoreError::WriteFailed(failure));
        }
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        let Some(sender) = tx.as_ref() else { return Err(StoreError::Closed) };
        let queued = Queued::new(op);
        self.backlog.reserve(queued.bytes);
        self.pending().queued(&queued.op);
        sender.send(queued).map_err(|_| StoreError::Closed)
    }

    pub(crate) fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Have what is queued so far committed now rather than when the commit window closes,
    /// without waiting for it. A writer that cannot take it has failed or closed, which the
    /// next write or flush reports.
    pub(crate) fn commit_soon(&self) {
        let (done, _) = oneshot::channel();
        let _ = self.send(Op::Flush(done));
    }

    /// Resolve once everything queued so far is committed.
    pub(crate) async fn flush(&self) -> Result<(), StoreError> {
        let (done, wait) = oneshot::channel();
        self.send(Op::Flush(done))?;
        wait.await.map_err(|_| StoreError::Closed)?
    }

    /// What the lease renewal needs of the writer to rejoin.
    pub(super) fn handle(&self) -> Handle {
        Handle { tx: self.tx.clone(), failed: self.failed.clone() }
    }

    /// Stop the task after it commits what is queued and releases the lease; waits for it
    /// (at most `patience`).
    pub(crate) fn close(&self, patience: Duration) {
        self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(done) = self.done.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = done.recv_timeout(patience);
        }
    }
}

/// The writer as the lease renewal sees it, to rejoin: refuse writes, drain, accept again.
pub(super) struct Handle {
    tx: Arc<Mutex<Option<mpsc::UnboundedSender<Queued>>>>,
    failed: Arc<Mutex<Option<Arc<StoreError>>>>,
}

impl Handle {
    /// Refuse every write from now on with `error` (unless one failure is already kept).
    pub(super) fn fail(&self, error: StoreError) {
        self.failed.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(|| Arc::new(error));
    }

    /// Resolve once every write queued so far has been handled (committed or failed), even
    /// while writes are refused: a worker rejoining waits here, so no write queued under its
    /// lost generation is committed under the new one.
    pub(super) async fn drain(&self) {
        let (done, wait) = oneshot::channel();
        let sent = self
            .tx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|tx| tx.send(Queued::new(Op::Flush(done))).is_ok());
        if sent == Some(true) {
            let _ = wait.await;
        }
    }

    /// Accept writes again (the worker rejoined with a new generation).
    pub(super) fn recover(&self) {
        self.failed.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

struct Task {
    /// The runs each commit touched, for the notifier task ([`notify`]).
    notes: mpsc::UnboundedSender<Vec<String>>,
    pool: PoolHandle,
    lease: Lease,
    window: Duration,
    local_lease: Arc<Mutex<std::time::Instant>>,
    failed: Arc<Mutex<Option<Arc<StoreError>>>>,
    stats: Arc<WriterStats>,
    pending: Arc<Mutex<Pending>>,
    backlog: Arc<Backlog>,
}

impl Task {
    async fn run(self, mut rx: mpsc::UnboundedReceiver<Queued>) {
        // Writers waiting on the last commit (its flushes) and how long it took: once a flush
        // asks for a commit, the window stays open a little longer (at most half the last
        // commit, at most the window) while fewer flushes than that have come. Writers who
        // were told "durable" together usually write again together; committing for the
        // first of them alone would make the others wait for that commit and then their own.
        let (mut waiters, mut grace) = (0usize, Duration::ZERO);
        while let Some(first) = rx.recv().await {
            let mut flushes = usize::from(first.op.is_flush());
            let mut writes = usize::from(!first.op.is_flush());
            let mut bytes = first.bytes;
            let mut batch = vec![first.op];
            let now = tokio::time::Instant::now();
            let window_end = now + self.window;
            let mut grace_end = (flushes > 0).then(|| now + grace);
            let mut open = true;
            loop {
                let deadline = match grace_end {
                    Some(_) if writes == 0 || flushes >= waiters => break,
                    Some(end) => end.min(window_end),
                    None => window_end,
                };
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(queued)) => {
                        if queued.op.is_flush() {
                            flushes += 1;
                            grace_end.get_or_insert_with(|| tokio::time::Instant::now() + grace);
                        } else {
                            writes += 1;
                        }
                        bytes += queued.bytes;
                        batch.push(queued.op);
                        if writes >= EARLY_COMMIT_OPS {
                            // A batch this large is committed now, not at the window's end.
                            break;
                        }
                    }
                    Ok(None) => {
                        open = false;
                        break;
                    }
                    Err(_) => break,
                }
            }
            while let Ok(queued) = rx.try_recv() {
                flushes += usize::from(queued.op.is_flush());
                writes += usize::from(!queued.op.is_flush());
                bytes += queued.bytes;
                batch.push(queued.op);
            }
            let started = std::time::Instant::now();
            let already = self.failed.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let result = match already {
                Some(failure) => Err(StoreError::WriteFailed(failure)),
                None => self.traced_commit(&batch).await,
            };
            if writes > 0 && result.is_ok() {
                waiters = flushes;
                grace = (started.elapsed() / 2).min(self.window);
            }
            match &result {
                Err(e) => {
                    self.failed.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(|| Arc::new(e.clone()));
                }
                Ok(()) => self.forget_committed(&batch),
            }
            let touched = if result.is_ok() { touched_runs(&batch) } else { Vec::new() };
            for op in batch {
                if let Op::Flush(done) = op {
                    let _ = done.send(result.clone());
                }
            }
            self.backlog.release(bytes);
            // Told after the waiters, and sent by a task of its own: the notification adds
            // nothing to a put's way to durable, nor to the next window's.
            if !touched.is_empty() {
                let _ = self.notes.send(touched);
            }
            if !open {
                break;
            }
        }
        // Closed cleanly: give the lease up, unless it was lost.
        if self.failed.lock().unwrap_or_else(|p| p.into_inner()).is_none() {
            if let Ok(client) = self.pool.get().await {
                if let Err(e) = worker::release(&client, &self.pool.url, &self.lease).await {
                    tracing::warn!("releasing the worker lease: {e}");
                }
            }
        }
    }

    /// [`Task::commit_retrying`] inside a `store.commit` span, its latency counted as
    /// redb's is (a batch of flushes alone writes nothing and is neither).
    async fn traced_commit(&self, batch: &[Op]) -> Result<(), StoreError> {
        use tracing::Instrument as _;
        let writes = batch.iter().filter(|op| !matches!(op, Op::Flush(_))).count();
        if writes == 0 {
            return self.commit_retrying(batch).await;
        }
        let started = std::time::Instant::now();
        let result = self.commit_retrying(batch).instrument(crate::trace::store_commit(writes)).await;
        if result.is_ok() {
            crate::metrics::metrics().committed(started.elapsed());
        }
        result
    }

    /// Committed values are readable from the database now; an entry replaced by a later put
    /// (another Arc) stays until that one is committed.
    fn forget_committed(&self, batch: &[Op]) {
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).committed(batch.iter());
    }

    /// Commit `batch`, retrying on a new connection while the failure is the connection's
    /// (the outcome unknown: the batch is idempotent), while this worker's lease holds by its
    /// own clock; past it, [`StoreError::Unavailable`].
    async fn commit_retrying(&self, batch: &[Op]) -> Result<(), StoreError> {
        let writes = batch.iter().filter(|op| !matches!(op, Op::Flush(_))).count();
        if writes == 0 {
            return Ok(());
        }
        let rows = Rows::of(batch)?;
        let started = tokio::time::Instant::now();
        let mut pause = Duration::from_millis(50);
        loop {
            match self.commit(&rows).await {
                Ok(()) => break,
                Err(e) if retryable(&e) => {
                    let lease_until = *self.local_lease.lock().unwrap_or_else(|p| p.into_inner());
                    if std::time::Instant::now() >= lease_until {
                        tracing::error!(
                            "the store could not be written for {:.1} s, past this worker's lease: {e}",
                            started.elapsed().as_secs_f64()
                        );
                        return Err(StoreError::Unavailable {
                            url: self.pool.url.clone(),
                            seconds: started.elapsed().as_secs_f64(),
                            source: Arc::new(e),
                        });
                    }
                    tracing::warn!("a store commit failed ({e}); retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                Err(e) => return Err(e),
            }
        }
        self.stats.commits.fetch_add(1, Ordering::Relaxed);
        self.stats.ops.fetch_add(writes as u64, Ordering::Relaxed);
        Ok(())
    }

    /// One round trip: `BEGIN`, the fencing check ([`worker::FENCE`]), every upsert and
    /// `COMMIT`, pipelined on one connection in that order. A refused check (or any failed
    /// statement) aborts the transaction, so its `COMMIT` commits nothing; the outcome is
    /// read from each statement's answer.
    async fn commit(&self, rows: &Rows<'_>) -> Result<(), StoreError> {
        let url = &self.pool.url;
        let e = |e| pg(url, e);
        let client = self.pool.get().await?;
        let upserts = rows.upserts(&self.lease.worker);
        // Prepared once per connection (cached), all at once.
        let sqls = std::iter::once(worker::FENCE).chain(upserts.iter().map(|u| u.sql));
        let prepared = futures::future::try_join_all(sqls.map(|sql| client.prepare_cached(sql))).await.map_err(e)?;
        let Some((fence, statements)) = prepared.split_first() else { return Ok(()) };
        // Each request goes on the wire when its future is first polled, and `join!` polls
        // them in order.
        let generation = self.lease.generation();
        let held: [Param<'_>; 2] = [&self.lease.worker, &generation];
        let begin = client.batch_execute("BEGIN");
        let check = client.execute_raw(fence, held.iter().copied());
        let writes = futures::future::try_join_all(
            upserts
                .iter()
                .zip(statements)
                .map(|(u, statement)| client.execute_raw(statement, u.params.iter().copied())),
        );
        let commit = client.batch_execute("COMMIT");
        let (begun, checked, written, committed) = futures::join!(begin, check, writes, commit);
        let outcome = match (begun, checked, written, committed) {
            (Ok(()), Ok(_), Ok(_), Ok(())) => Ok(()),
            (Ok(()), Err(refused), _, _) if worker::is_fence_refusal(&refused) => Err(self.lease.fenced()),
            (Err(error), ..) | (_, Err(error), ..) | (_, _, Err(error), _) | (.., Err(error)) => Err(e(error)),
        };
        if outcome.is_err() && !client.is_closed() {
            // Leave no transaction open on a connection going back to the pool (an aborted
            // one was ended by its `COMMIT`; this is for a `BEGIN` that went wrong).
            if client.batch_execute("ROLLBACK").await.is_err() {
                drop(deadpool_postgres::Object::take(client));
            }
        }
        outcome
    }
}

/// The notifier task: after a commit, ONE notification naming the runs it touched (from
/// [`touched_runs`]), for the other workers' followers ([`super::changes`]). At most one per
/// commit window (`window`): the runs of commits made meanwhile go out together in the next
/// one, each named once, so a busy worker does not wake every listening worker once per
/// commit; a follower is at most about one window later. A failure to send is only logged
/// (the other workers poll too).
async fn notify(
    pool: PoolHandle,
    worker: String,
    stats: Arc<WriterStats>,
    window: Duration,
    mut notes: mpsc::UnboundedReceiver<Vec<String>>,
) {
    let mut next = tokio::time::Instant::now();
    while let Some(mut runs) = notes.recv().await {
        tokio::time::sleep_until(next).await;
        while let Ok(more) = notes.try_recv() {
            runs.extend(more);
        }
        runs.sort();
        runs.dedup();
        next = tokio::time::Instant::now() + window;
        match super::changes::notify(&pool, &super::changes::payload(&worker, runs)).await {
            Ok(()) => {
                stats.notifies.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => tracing::warn!("notifying the other workers of a commit: {e}"),
        }
    }
}

/// The runs a batch touched, each once.
fn touched_runs(batch: &[Op]) -> Vec<String> {
    let mut runs: Vec<String> = batch
        .iter()
        .filter_map(|op| match op {
            Op::Step { run, .. }
            | Op::Agent { run, .. }
            | Op::Progress { run, .. }
            | Op::Accounting { run, .. }
            | Op::RunModules { run, .. } => Some(run.clone()),
            Op::Run { id, .. } => Some(id.clone()),
            Op::Factory { .. } | Op::Blob { .. } | Op::Flush(_) => None,
        })
        .collect();
    runs.sort();
    runs.dedup();
    runs
}

/// Whether a failed commit may be retried: the connection failed (the outcome is unknown),
/// not the database's answer.
fn retryable(error: &StoreError) -> bool {
    match error {
        StoreError::Pool { .. } => true,
        // A deadlock the server broke (two commits counting the same shared values) aborted
        // the transaction: nothing of it was done.
        StoreError::Postgres { source, .. } => {
            source.as_db_error().is_none() || source.is_closed() || super::values::is_deadlock(source)
        }
        _ => false,
    }
}

type Param<'s> = &'s (dyn tokio_postgres::types::ToSql + Sync);

/// One statement of a batch and its parameters.
struct Upsert<'s> {
    sql: &'static str,
    params: Vec<Param<'s>>,
}

fn upsert<'s>(sql: &'static str, params: Vec<Param<'s>>) -> Upsert<'s> {
    Upsert { sql, params }
}

/// A batch as one column array per table field, deduplicated (the last put of a key wins;
/// the journal usage is the largest per run).
struct Rows<'a> {
    /// The shared values the batch's rows refer to: hashes, counts, values (codec's form).
    shared: (Vec<Vec<u8>>, Vec<i64>, Vec<Vec<u8>>),
    steps: Journaled<'a>,
    agents: Journaled<'a>,
    progress: (Vec<&'a str>, Vec<i64>, Vec<&'a [u8]>),
    /// Each run's last accounting, encoded here (the ops carry it as numbers).
    accounting: (Vec<&'a str>, Vec<Vec<u8>>),
    usage: (Vec<&'a str>, Vec<i64>),
    runs: RunRows<'a>,
    factories: (Vec<&'a [u8]>, Vec<&'a [u8]>),
    blobs: (Vec<&'a str>, Vec<&'a [u8]>),
    modules: (Vec<&'a str>, Vec<&'a [u8]>),
}

/// Run rows: ids, revisions, statuses and records.
type RunRows<'a> = (Vec<&'a str>, Vec<i64>, Vec<&'a str>, Vec<&'a [u8]>);

/// Step or agent rows: run ids, keys, values (in the [`codec`](crate::store::codec)'s stored
/// form) and places in the run's journal.
type Journaled<'a> = (Vec<&'a str>, Vec<&'a [u8]>, Vec<Vec<u8>>, Vec<i64>);

/// The shared values of a batch ([`shared`]): each hash once, with the rows referring to it.
#[derive(Default)]
struct SharedValues {
    values: HashMap<shared::Hash, (i64, Vec<u8>)>,
}

impl SharedValues {
    /// The stored form of the JSON text `raw` in its row: a reference to it, shared and
    /// counted here, when it is large; else the codec's form.
    fn stored(&mut self, raw: &[u8]) -> Vec<u8> {
        if !shared::shares(raw) {
            return codec::encode(raw);
        }
        let reference = shared::Reference::of(raw);
        self.values.entry(reference.hash).or_insert_with(|| (0, codec::encode(raw))).0 += 1;
        reference.encode().to_vec()
    }

    /// Hashes, counts and values, in hash order.
    fn columns(self) -> (Vec<Vec<u8>>, Vec<i64>, Vec<Vec<u8>>) {
        let mut values: Vec<_> = self.values.into_iter().collect();
        values.sort_unstable_by_key(|(hash, _)| *hash);
        let mut out = (Vec::new(), Vec::new(), Vec::new());
        for (hash, (count, value)) in values {
            out.0.push(hash.to_vec());
            out.1.push(count);
            out.2.push(value);
        }
        out
    }
}

fn last_wins<K: std::hash::Hash + Eq, V>(items: impl Iterator<Item = (K, V)>) -> Vec<V> {
    let mut index: HashMap<K, usize> = HashMap::new();
    let mut out: Vec<V> = Vec::new();
    for (key, value) in items {
        match index.get(&key) {
            Some(&at) => out[at] = value,
            None => {
                index.insert(key, out.len());
                out.push(value);
            }
        }
    }
    out
}

fn unzip3<A, B, C>(items: Vec<(A, B, C)>) -> (Vec<A>, Vec<B>, Vec<C>) {
    let mut out = (Vec::with_capacity(items.len()), Vec::with_capacity(items.len()), Vec::with_capacity(items.len()));
    for (a, b, c) in items {
        out.0.push(a);
        out.1.push(b);
        out.2.push(c);
    }
    out
}

fn unzip4<A, B, C, D>(items: Vec<(A, B, C, D)>) -> (Vec<A>, Vec<B>, Vec<C>, Vec<D>) {
    let mut out = (
        Vec::with_capacity(items.len()),
        Vec::with_capacity(items.len()),
        Vec::with_capacity(items.len()),
        Vec::with_capacity(items.len()),
    );
    for (a, b, c, d) in items {
        out.0.push(a);
        out.1.push(b);
        out.2.push(c);
        out.3.push(d);
    }
    out
}

fn db_int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl<'a> Rows<'a> {
    fn of(batch: &'a [Op]) -> Result<Rows<'a>, StoreError> {
        let steps = last_wins(batch.iter().filter_map(|op| match op {
            // Each with its place in the run's journal: the journal bytes counted with it.
            Op::Step { run, key, value, usage } => {
                Some(((run, key), (run.as_str(), key.as_bytes(), value.as_bytes(), db_int(*usage))))
            }
            _ => None,
        }));
        // Compressed (when smaller) once the last put of each key is known; a large value is
        // shared, the row keeping a reference.
        let mut shared = SharedValues::default();
        let steps = steps.into_iter().map(|(run, key, value, place)| (run, key, shared.stored(value), place)).collect();
        let agents = last_wins(batch.iter().filter_map(|op| match op {
            Op::Agent { run, key, outcome, usage } => {
                Some(((run, key), (run.as_str(), key.as_bytes(), &outcome[..], db_int(*usage))))
            }
            _ => None,
        }));
        let agents = agents
            .into_iter()
            .map(|(run, key, outcome, place)| match outcome.split_first() {
                Some((&tag @ 1, reply)) if shared::shares(reply) => {
                    let mut stored = vec![tag];
                    stored.extend_from_slice(&shared.stored(reply));
                    (run, key, stored, place)
                }
                _ => (run, key, codec::encode_outcome(outcome), place),
            })
            .collect();
        let progress = last_wins(batch.iter().filter_map(|op| match op {
            Op::Progress { run, seq, entry, .. } => Some(((run, *seq), (run.as_str(), db_int(*seq), entry.as_slice()))),
            _ => None,
        }));
        let accounting = last_wins(batch.iter().filter_map(|op| match op {
            Op::Accounting { run, accounting } => Some((run, (run.as_str(), accounting))),
            _ => None,
        }));
        let accounting = accounting
            .into_iter()
            .map(|(run, spent)| {
                let mut encoded = Vec::new();
                crate::store::journal::encode_live_accounting(spent, &mut encoded)?;
                Ok((run, encoded))
            })
            .collect::<Result<Vec<_>, serde_json::Error>>()?;
        let mut usage: HashMap<&str, u64> = HashMap::new();
        for op in batch {
            if let Op::Step { run, usage: bytes, .. }
            | Op::Agent { run, usage: bytes, .. }
            | Op::Progress { run, usage: bytes, .. } = op
            {
                let most = usage.entry(run.as_str()).or_insert(0);
                *most = (*most).max(*bytes);
            }
        }
        let runs = last_wins(batch.iter().filter_map(|op| match op {
            Op::Run { id, seq, status, record, .. } => {
                Some((id, (id.as_str(), db_int(*seq), status.as_str(), record.as_slice())))
            }
            _ => None,
        }));
        let factories = last_wins(batch.iter().filter_map(|op| match op {
            Op::Factory { key, registration } => Some((key, (key.as_bytes(), registration.as_slice()))),
            _ => None,
        }));
        // Content-addressed: the first copy of a hash is as good as any.
        let mut blobs: Vec<(&str, &[u8])> = Vec::new();
        for op in batch {
            if let Op::Blob { hash, bytes } = op {
                if !blobs.iter().any(|(h, _)| *h == hash.as_str()) {
                    blobs.push((hash.as_str(), &bytes[..]));
                }
            }
        }
        let modules = last_wins(batch.iter().filter_map(|op| match op {
            Op::RunModules { run, manifest } => Some((run, (run.as_str(), manifest.as_slice()))),
            _ => None,
        }));
        let mut run_columns = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (id, seq, status, record) in runs {
            run_columns.0.push(id);
            run_columns.1.push(seq);
            run_columns.2.push(status);
            run_columns.3.push(record);
        }
        Ok(Rows {
            shared: shared.columns(),
            steps: unzip4(steps),
            agents: unzip4(agents),
            progress: unzip3(progress),
            accounting: accounting.into_iter().unzip(),
            usage: usage.into_iter().map(|(run, bytes)| (run, db_int(bytes))).unzip(),
            runs: run_columns,
            factories: factories.into_iter().unzip(),
            blobs: blobs.into_iter().unzip(),
            modules: modules.into_iter().unzip(),
        })
    }

    /// Every upsert of the batch (only the tables it touches), as `worker` writes them.
    fn upserts<'s>(&'s self, worker: &'s String) -> Vec<Upsert<'s>> {
        let mut statements = Vec::new();
        let journals = !self.steps.0.is_empty() || !self.agents.0.is_empty();
        // Shared values: the batch's counted first, then those of the rows it overwrites
        // uncounted (read before the rows are written), the ones counted 0 deleted last.
        // Counted this way, a batch committed twice (a retry after a lost answer) counts once.
        if !self.shared.0.is_empty() {
            let (a, b, c) = &self.shared;
            statements.push(upsert(values::SHARE, vec![a as Param<'_>, b, c]));
        }
        if journals {
            let (steps, agents) = (&self.steps, &self.agents);
            statements
                .push(upsert(values::RELEASE_OVERWRITTEN, vec![&steps.0 as Param<'_>, &steps.1, &agents.0, &agents.1]));
        }
        if !self.steps.0.is_empty() {
            let (a, b, c, d) = &self.steps;
            statements.push(
                upsert(
                    "INSERT INTO steps (run_id, key, value, place) SELECT * FROM unnest($1::text[], $2::bytea[], $3::bytea[], $4::int8[])
                     ON CONFLICT (run_id, key) DO UPDATE SET value = EXCLUDED.value, place = EXCLUDED.place",
                    vec![a as Param<'_>, b, c, d],
                ),
            );
        }
        if !self.agents.0.is_empty() {
            let (a, b, c, d) = &self.agents;
            statements.push(
                upsert(
                    "INSERT INTO agents (run_id, key, outcome, place) SELECT * FROM unnest($1::text[], $2::bytea[], $3::bytea[], $4::int8[])
                     ON CONFLICT (run_id, key) DO UPDATE SET outcome = EXCLUDED.outcome, place = EXCLUDED.place",
                    vec![a as Param<'_>, b, c, d],
                ),
            );
        }
        if !self.progress.0.is_empty() {
            let (a, b, c) = &self.progress;
            statements.push(upsert(
                "INSERT INTO progress (run_id, seq, entry) SELECT * FROM unnest($1::text[], $2::int8[], $3::bytea[])
                     ON CONFLICT (run_id, seq) DO UPDATE SET entry = EXCLUDED.entry",
                vec![a as Param<'_>, b, c],
            ));
        }
        if !self.accounting.0.is_empty() {
            let (a, b) = &self.accounting;
            statements.push(upsert(
                "INSERT INTO live_accounting (run_id, accounting) SELECT * FROM unnest($1::text[], $2::bytea[])
                     ON CONFLICT (run_id) DO UPDATE SET accounting = EXCLUDED.accounting",
                vec![a as Param<'_>, b],
            ));
        }
        if !self.usage.0.is_empty() {
            let (a, b) = &self.usage;
            statements.push(upsert(
                "INSERT INTO journal_usage (run_id, bytes) SELECT * FROM unnest($1::text[], $2::int8[])
                     ON CONFLICT (run_id) DO UPDATE SET bytes = EXCLUDED.bytes",
                vec![a as Param<'_>, b],
            ));
        }
        if !self.runs.0.is_empty() {
            // A run's owner is the worker executing it: set while it is running or pending,
            // cleared once it ends, so a halted run is free for recovery to claim.
            let (a, b, c, d) = &self.runs;
            statements.push(
                upsert(
                    "INSERT INTO runs (id, seq, status, owner, record)
                       SELECT u.id, u.seq, u.status, CASE WHEN u.status IN ('running', 'pending') THEN $5::text END, u.record FROM unnest($1::text[], $2::int8[], $3::text[], $4::bytea[]) AS u(id, seq, status, record)
                     ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status, owner = EXCLUDED.owner, record = EXCLUDED.record,
                         cancel_requested = runs.cancel_requested AND EXCLUDED.status IN ('running', 'pending'),
                         pause_requested = runs.pause_requested AND EXCLUDED.status IN ('running', 'pending')",
                    vec![a as Param<'_>, b, c, d, worker],
                ),
            );
        }
        if !self.factories.0.is_empty() {
            let (a, b) = &self.factories;
            statements.push(upsert(
                "INSERT INTO factories (key, registration) SELECT * FROM unnest($1::bytea[], $2::bytea[])
                     ON CONFLICT (key) DO UPDATE SET registration = EXCLUDED.registration",
                vec![a as Param<'_>, b],
            ));
        }
        if !self.blobs.0.is_empty() {
            let (a, b) = &self.blobs;
            statements.push(
                upsert("INSERT INTO blobs (hash, bytes) SELECT * FROM unnest($1::text[], $2::bytea[]) ON CONFLICT (hash) DO NOTHING", vec![a as Param<'_>, b]),
            );
        }
        if !self.modules.0.is_empty() {
            let (a, b) = &self.modules;
            statements.push(upsert(
                "INSERT INTO run_modules (run_id, manifest) SELECT * FROM unnest($1::text[], $2::bytea[])
                     ON CONFLICT (run_id) DO UPDATE SET manifest = EXCLUDED.manifest",
                vec![a as Param<'_>, b],
            ));
        }
        if journals {
            statements.push(upsert(values::DELETE_UNREFERENCED, Vec::new()));
        }
        statements
    }
}
