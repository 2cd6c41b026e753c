//! Group commit: one writer thread owns every write to the store. Callers hand it
//! operations and go on at once; it gathers whatever arrives within the commit window
//! (default 10 ms) — or until someone asks for a flush — into one write transaction and one
//! fsync. A fan-out of a thousand journaled results costs about ten commits, and a
//! sequential loop of fast calls overlaps its commits with its work.
//!
//! The loss window after a `kill -9` is bounded by the commit window plus one commit:
//! entries handed over in that time may be lost (their calls re-run on resume); nothing
//! committed is lost.
//!
//! The queue is bounded in bytes ([`Backlog`]): once `queue_bytes` are handed over and not
//! yet committed, a caller waits for the next commit before its write joins the queue, so
//! runs writing faster than the disk can take slow down instead of filling host memory.
//!
//! A write is a push under one lock: the thread sleeps until the first write of a batch and
//! then until the window closes (or a flush is asked for), so the writes that join a batch
//! cost no thread wake-up each. A batch that reaches [`EARLY_COMMIT_OPS`] writes is
//! committed at once, without waiting out the window: a burst (a fan-out's results, a loop
//! of `log` lines) is committed in pieces while the run goes on, and the run's closing flush
//! waits for the last piece only, not for the whole burst.
//!
//! The thread also settles the store as runs stop ([`settle`](super::settle)): told by the
//! store when a run's record is committed with the run no longer executing, it packs the
//! journal rows that run wrote and, when no run is executing any more, compacts the file if
//! that is worthwhile. The work waits until the store has taken no write for
//! [`SETTLE_QUIET`] (rows to pack at most [`SETTLE_LATEST`]; the compaction, which holds the
//! database alone, always waits for quiet), so what a caller does right after a run stops
//! (its resume, the next run) does not share the disk, the cores or the database with it; it
//! is then done a step at a time (a piece of a run's rows, or the compaction), one step before
//! each batch, so queued writes wait for one step at most; closing, the writer finishes it.

use super::compact::DbCell;
use super::progress::Chunk;
use super::settle::{Packing, Settle};
use super::tables::{
    self, AGENTS, BLOBS, FACTORIES, JOURNAL_USAGE, JOURNAL_VALUES, JOURNAL_VALUE_REFS, LIVE_ACCOUNTING, PROGRESS, RUNS,
    RUN_ORDER, STEPS,
};
use super::values;
use crate::store::codec::Dictionaries;
use crate::store::op::{Backlog, Op, Pending, Queued, EARLY_COMMIT_OPS};
use crate::store::shared::{self, Reference};
use crate::store::{StoreError, WriterStats};
use redb::{Database, ReadableTable, Table, TableDefinition, WriteTransaction};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// What callers hand the writer thread, behind one lock. A write only takes the lock and
/// pushes: the thread is woken for the first write of a batch (it sleeps until then), for a
/// flush, and to stop; writes that arrive while it gathers a batch do not wake it.
#[derive(Default)]
struct Queue {
    ops: Vec<Queued>,
    /// Commit now: a flush is queued, or the batch holds [`EARLY_COMMIT_OPS`] writes.
    flush: bool,
    /// Every handle is gone, or [`Writer::close`]: commit what is queued and stop.
    closed: bool,
    /// The thread waits for a first write (a write must wake it).
    idle: bool,
    /// The first commit failure; once set, the store refuses further writes.
    failed: Option<Arc<StoreError>>,
    /// The runs executing, the rows they wrote and the work their stops leave.
    settle: Settle,
}

impl Queue {
    /// Why the store takes no more writes (its first commit failure, or it is closed), if
    /// it does not.
    fn refusal(&self) -> Option<StoreError> {
        match &self.failed {
            Some(failure) => Some(StoreError::WriteFailed(failure.clone())),
            None if self.closed => Some(StoreError::Closed),
            None => None,
        }
    }
}

/// The queue and the signal the thread waits on.
#[derive(Default)]
struct Shared {
    queue: Mutex<Queue>,
    arrived: Condvar,
    /// The store's compression dictionaries: values are compressed with the newest.
    dictionaries: Arc<Dictionaries>,
}

impl Shared {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The handle callers use; the thread stops when it is closed or dropped.
pub(crate) struct Writer {
    /// Values queued, not yet committed.
    pub(crate) pending: Arc<Mutex<Pending>>,
    shared: Arc<Shared>,
    pub(crate) stats: Arc<WriterStats>,
    /// Bytes queued, not yet committed.
    pub(crate) backlog: Arc<Backlog>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Writer {
    /// Start the writer thread for `db`, committing every `window` and holding at most
    /// about `queue_bytes` uncommitted.
    /// `path` is the store file's, if it is a file (only a file is compacted as the store
    /// settles).
    pub(crate) fn start(
        db: Arc<DbCell>,
        window: Duration,
        queue_bytes: u64,
        path: Option<PathBuf>,
        dictionaries: Arc<Dictionaries>,
    ) -> Result<Self, StoreError> {
        let shared = Arc::new(Shared { dictionaries, ..Shared::default() });
        let stats = Arc::new(WriterStats::default());
        let pending: Arc<Mutex<Pending>> = Arc::default();
        let backlog = Arc::new(Backlog::new(queue_bytes));
        let thread = {
            let shared = shared.clone();
            let stats = stats.clone();
            let pending = pending.clone();
            let backlog = backlog.clone();
            std::thread::Builder::new()
                .name("factory-store-writer".into())
                .spawn(move || run(db, path, shared, window, stats, pending, backlog))
                .map_err(|e| StoreError::Writer(Arc::new(e)))?
        };
        Ok(Writer { pending, shared, stats, backlog, thread: Mutex::new(Some(thread)) })
    }

    /// Queue a write; fails only when the store has already failed or is closed. A step or
    /// agent value is readable through [`Writer::pending`] from now until it is committed.
    /// When the queue holds its cap in bytes, waits for the next commit first.
    pub(crate) fn send(&self, op: Op) -> Result<(), StoreError> {
        self.send_all([Some(op)])
    }

    /// Queue several writes (the `Some`s) at once, in order and in the same commit, as
    /// [`Writer::send`] does one.
    pub(crate) fn send_all<const N: usize>(&self, ops: [Option<Op>; N]) -> Result<(), StoreError> {
        let ops = ops.map(|op| op.map(Queued::new));
        let bytes = ops.iter().flatten().map(|q| q.bytes).sum();
        // A write that fits the backlog takes one lock, the queue's; one that does not waits
        // for the next commit outside it (after the queue says the store still takes writes).
        let reserved = self.backlog.try_reserve(bytes);
        let mut queue = self.shared.queue();
        if let Some(error) = queue.refusal() {
            if reserved {
                self.backlog.release(bytes);
            }
            return Err(error);
        }
        if !reserved {
            drop(queue);
            self.backlog.reserve_after_refusal(bytes);
            queue = self.shared.queue();
            if queue.closed {
                // Closed while this write waited: its bytes will not be committed.
                self.backlog.release(bytes);
                return Err(StoreError::Closed);
            }
        }
        // Registered under the queue's lock, so the commit that removes it comes after.
        if ops.iter().flatten().any(|q| q.op.is_value()) {
            let mut pending = self.pending();
            for queued in ops.iter().flatten() {
                pending.queued(&queued.op);
            }
        }
        let mut wake = queue.idle;
        for queued in ops.into_iter().flatten() {
            wake |= queued.op.is_flush();
            queue.flush |= queued.op.is_flush();
            queue.ops.push(queued);
        }
        if !queue.flush && queue.ops.len() >= EARLY_COMMIT_OPS {
            // A batch this large is committed now (woken once: the flag stays set until the
            // thread takes the batch).
            queue.flush = true;
            wake = true;
        }
        if wake {
            queue.idle = false;
            self.shared.arrived.notify_one();
        }
        Ok(())
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

    /// Run `run`'s record, saying whether it executes (`running`, `pending`), is committed:
    /// a run that stops has its rows packed, and the store is compacted when nothing executes
    /// any more (see [`settle`](super::settle)), a step between two batches.
    pub(crate) fn run_written(&self, run: &str, executing: bool) {
        let mut queue = self.shared.queue();
        queue.settle.run_written(run, executing);
        if queue.settle.has_work() && queue.idle {
            queue.idle = false;
            self.shared.arrived.notify_one();
        }
    }

    /// Resolve once everything queued so far is committed.
    pub(crate) async fn flush(&self) -> Result<(), StoreError> {
        {
            // The thread waits for a first write only once it has committed (or failed)
            // everything handed to it: then there is nothing to wait for, and no wake-up of
            // the thread to pay (the end of an attempt that journaled nothing new).
            let queue = self.shared.queue();
            if queue.idle && queue.ops.is_empty() {
                return queue.refusal().map_or(Ok(()), Err);
            }
        }
        let (done, wait) = oneshot::channel();
        self.send(Op::Flush(done))?;
        wait.await.map_err(|_| StoreError::Closed)?
    }

    /// Stop the thread after it commits what is queued.
    pub(crate) fn close(&self) {
        self.shared.queue().closed = true;
        self.shared.arrived.notify_one();
        if let Some(thread) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.close();
    }
}

/// How long the store must have taken no write before the settling work a stop leaves is
/// done: 100 ms. A caller that resumes, reads or starts a run right after one stops (a
/// service's client, a test, the bench's replay rows) does not find the writer packing the
/// stopped run's rows or compacting the file under it; a run that executes again by then is
/// packed at its next stop instead.
pub(crate) const SETTLE_QUIET: Duration = Duration::from_millis(100);

/// The longest a stopped run's rows wait for the store to be quiet ([`SETTLE_QUIET`]) to be
/// packed: 2 s. A store that other runs keep writing to packs them a piece between their
/// commits after that (its compaction waits for quiet).
pub(crate) const SETTLE_LATEST: Duration = Duration::from_secs(2);

/// Whether the settling work is done before a batch: the writer is closing (all of it, now),
/// the store has been quiet for [`SETTLE_QUIET`] (a step), rows to pack have waited
/// [`SETTLE_LATEST`] (a piece packed, no compaction: that holds the database alone, and is
/// done only when the store is quiet), or not yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Due {
    Closing,
    Quiet,
    Packs,
    Not,
}

/// Since when runs that stopped wait for their work to be taken, and since when the pieces
/// of rows taken wait to be packed ([`SETTLE_LATEST`] counts from these, each stop's own).
#[derive(Default)]
struct Waiting {
    stops: Option<Instant>,
    pieces: Option<Instant>,
}

impl Waiting {
    /// The earliest wait still going at `now`, told whether stops and pieces are left.
    fn since(&mut self, stops: bool, pieces: bool, now: Instant) -> Option<Instant> {
        self.stops = stops.then(|| self.stops.unwrap_or(now));
        self.pieces = pieces.then(|| self.pieces.unwrap_or(now));
        match (self.stops, self.pieces) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The stops' work was taken: its pieces have waited since the stops did.
    fn taken(&mut self) {
        if let Some(stops) = self.stops.take() {
            self.pieces = Some(self.pieces.map_or(stops, |pieces| pieces.min(stops)));
        }
    }
}

impl Due {
    /// When the thread, which took its last write at `last_write` and has rows to pack
    /// waiting since `packs` (if any), has settling work due.
    fn at(last_write: Instant, packs: Option<Instant>) -> Instant {
        let quiet = last_write + SETTLE_QUIET;
        packs.map_or(quiet, |since| quiet.min(since + SETTLE_LATEST))
    }

    /// What is due at `now` (the rules [`Due::at`] gives the time of): all of it when the
    /// writer is `closed`, a step once the store has been quiet since `last_write`, a piece of
    /// rows once they have waited since `packs` for [`SETTLE_LATEST`], else nothing.
    fn of(closed: bool, now: Instant, last_write: Instant, packs: Option<Instant>) -> Due {
        if closed {
            Due::Closing
        } else if now >= last_write + SETTLE_QUIET {
            Due::Quiet
        } else if packs.is_some_and(|since| now >= since + SETTLE_LATEST) {
            Due::Packs
        } else {
            Due::Not
        }
    }
}

fn run(
    db: Arc<DbCell>,
    path: Option<PathBuf>,
    shared: Arc<Shared>,
    window: Duration,
    stats: Arc<WriterStats>,
    pending: Arc<Mutex<Pending>>,
    backlog: Arc<Backlog>,
) {
    let dictionaries = shared.dictionaries.clone();
    // The batch buffer, reused from commit to commit.
    let mut batch: Vec<Queued> = Vec::new();
    // Settling work taken and not done yet: a step of it between two batches, once due.
    let mut packing = Packing::new(dictionaries.clone());
    // When the last batch of writes was taken, and since when rows to pack wait.
    let mut last_write = Instant::now();
    let mut waiting = Waiting::default();
    loop {
        let (already_failed, closing, work, due) = {
            let mut queue = shared.queue();
            // Sleep until the first write of a batch, or until settling work is due (see
            // `Due`).
            while queue.ops.is_empty() && !queue.closed {
                if !queue.settle.has_work() && packing.done() {
                    waiting = Waiting::default();
                    queue.idle = true;
                    queue = shared.arrived.wait(queue).unwrap_or_else(|p| p.into_inner());
                    continue;
                }
                let now = Instant::now();
                let at = Due::at(last_write, waiting.since(queue.settle.has_stops(), packing.packing(), now));
                if now >= at {
                    break;
                }
                queue.idle = true;
                queue = shared.arrived.wait_timeout(queue, at - now).unwrap_or_else(|p| p.into_inner()).0;
            }
            queue.idle = false;
            // Gather until the window closes, a flush is asked for or the writer is closed
            // (at once when only settling work woke the thread: nothing to gather).
            let deadline = Instant::now() + window;
            while !queue.flush && !queue.closed && !queue.ops.is_empty() {
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                queue = shared.arrived.wait_timeout(queue, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
            }
            std::mem::swap(&mut batch, &mut queue.ops);
            queue.flush = false;
            let now = Instant::now();
            if batch.iter().any(|q| !q.op.is_flush()) {
                last_write = now;
            }
            // A batch of writes puts the work off; the runs that stopped are taken only when
            // it is due: one executing again by then is left for its next stop.
            let since = waiting.since(queue.settle.has_stops(), packing.packing(), now);
            let due = Due::of(queue.closed, now, last_write, since);
            let work = if due == Due::Not {
                Default::default()
            } else {
                waiting.taken();
                queue.settle.take()
            };
            (queue.failed.clone(), queue.closed, work, due)
        };
        if already_failed.is_none() {
            packing.add(work);
            if due != Due::Not {
                let may_compact = due != Due::Packs;
                if let Some(written) = packing.step(&db, path.as_deref(), may_compact, || shared.queue().settle.idle())
                {
                    shared.queue().settle.not_compacted(written);
                }
            }
        } else {
            packing.clear();
        }
        // Closing, the settling work is finished first.
        if batch.is_empty() && closing && packing.done() {
            break;
        }
        let result = match already_failed {
            Some(message) => Err(StoreError::WriteFailed(message)),
            None => commit(&db.get(), &batch, &stats, &dictionaries),
        };
        match &result {
            Err(e) => {
                shared.queue().failed.get_or_insert_with(|| Arc::new(e.clone()));
            }
            Ok(()) => {
                // Committed: readable from the database now, and counted for the packing of
                // the runs' rows when they stop (before any flush of the batch is answered).
                pending.lock().unwrap_or_else(|p| p.into_inner()).committed(batch.iter().map(|q| &q.op));
                count_rows(&shared, &batch);
            }
        }
        let bytes = batch.iter().map(|q| q.bytes).sum();
        for queued in batch.drain(..) {
            if let Op::Flush(done) = queued.op {
                let _ = done.send(result.clone());
            }
        }
        backlog.release(bytes);
    }
}

/// Count the journal rows `batch` committed, per run, for [`Settle`].
fn count_rows(shared: &Shared, batch: &[Queued]) {
    let mut rows = batch.iter().filter_map(|q| match &q.op {
        Op::Step { run, key, value, .. } => Some((run, key.len() + value.len())),
        Op::Agent { run, key, outcome, .. } => Some((run, key.len() + outcome.len())),
        _ => None,
    });
    let Some(first) = rows.next() else { return };
    let mut queue = shared.queue();
    for (run, bytes) in std::iter::once(first).chain(rows) {
        queue.settle.rows_written(run, bytes as u64);
    }
}

fn commit(db: &Database, batch: &[Queued], stats: &WriterStats, dictionaries: &Dictionaries) -> Result<(), StoreError> {
    let writes = batch.iter().filter(|q| !q.op.is_flush()).count();
    if writes == 0 {
        return Ok(());
    }
    let span = crate::trace::store_commit(writes);
    let _entered = span.enter();
    let started = Instant::now();
    let txn = db.begin_write()?;
    {
        // Each table is opened when the batch first writes to it: a commit of a run record
        // alone (an attempt's start or end) opens one table, not eleven, and flushes one root.
        let mut steps = Lazy::new(&txn, STEPS);
        let mut agents = Lazy::new(&txn, AGENTS);
        let mut progress = Lazy::new(&txn, PROGRESS);
        let mut accounting = Lazy::new(&txn, LIVE_ACCOUNTING);
        let mut runs = Lazy::new(&txn, RUNS);
        let mut order = Lazy::new(&txn, RUN_ORDER);
        let mut factories = Lazy::new(&txn, FACTORIES);
        let mut blobs = Lazy::new(&txn, BLOBS);
        let mut meta = Lazy::new(&txn, tables::META);
        let mut usage = Lazy::new(&txn, JOURNAL_USAGE);
        let mut run_modules = Lazy::new(&txn, tables::RUN_MODULES);
        let mut shared_values = Lazy::new(&txn, JOURNAL_VALUES);
        let mut shared_refs = Lazy::new(&txn, JOURNAL_VALUE_REFS);
        // Live accounting is overwritten per agent; within a batch only each run's last one
        // needs writing. Likewise the journal usage: only the largest per run.
        let mut last = PerRun::default();
        // Where each run's last accounting is encoded.
        let mut encoded = Vec::new();
        // Where each step or agent row is encoded.
        let mut row = Vec::new();
        for (i, op) in batch.iter().map(|q| &q.op).enumerate() {
            match op {
                Op::Accounting { run, .. } => last.at(run).accounting = Some(i),
                Op::Step { run, usage: bytes, .. }
                | Op::Agent { run, usage: bytes, .. }
                | Op::Progress { run, usage: bytes, .. } => {
                    let most = &mut last.at(run).usage;
                    *most = Some(most.map_or(*bytes, |most| most.max(*bytes)));
                }
                _ => {}
            }
        }
        for (run, of_run) in &last.runs {
            if let Some(bytes) = of_run.usage {
                usage.table()?.insert(*run, bytes)?;
            }
        }
        for (i, op) in batch.iter().map(|q| &q.op).enumerate() {
            match op {
                // Each with its place in the run's journal: the journal bytes counted with it.
                // A large value is stored once, shared (counted here), the row keeping a
                // reference; a row it overwrites releases the value it referred to.
                Op::Step { run, key, value, usage: place } => {
                    let new = shared::shares(value.as_bytes()).then(|| Reference::of(value.as_bytes()));
                    match &new {
                        Some(reference) => super::rows::encode_step_reference(*place, reference, &mut row),
                        None => super::rows::encode_step(*place, value, &mut row, Some(dictionaries)),
                    }
                    let old = steps.table()?.insert((run.as_str(), key.as_str()), row.as_slice())?;
                    let old = old.and_then(|old| super::rows::step_reference(old.value()));
                    let new = new.as_ref().map(|reference| (reference, value.as_bytes()));
                    recount(&mut shared_values, &mut shared_refs, new, old, dictionaries)?;
                }
                Op::Agent { run, key, outcome, usage: place } => {
                    let new = match outcome.split_first() {
                        Some((1, reply)) if shared::shares(reply) => Some((Reference::of(reply), reply)),
                        _ => None,
                    };
                    match &new {
                        Some((reference, _)) => super::rows::encode_agent_reference(*place, reference, &mut row),
                        None => super::rows::encode_agent(*place, outcome, &mut row, Some(dictionaries)),
                    }
                    let old = agents.table()?.insert((run.as_str(), key.as_str()), row.as_slice())?;
                    let old = old.and_then(|old| super::rows::agent_reference(old.value()));
                    let new = new.as_ref().map(|(reference, reply)| (reference, *reply));
                    recount(&mut shared_values, &mut shared_refs, new, old, dictionaries)?;
                }
                // A run's entries in this batch share rows (see `progress.rs`).
                Op::Progress { run, seq, entry, .. } => {
                    let chunk = &mut last.at(run).progress;
                    if chunk.must_close(*seq, entry.len()) {
                        if let Some((key, taken)) = chunk.take() {
                            row.clear();
                            crate::store::codec::encode_into(taken, &mut row);
                            progress.table()?.insert((run.as_str(), key), row.as_slice())?;
                        }
                    }
                    chunk.push(*seq, entry);
                }
                Op::Accounting { run, accounting: spent } => {
                    if last.at(run).accounting == Some(i) {
                        crate::store::journal::encode_live_accounting(spent, &mut encoded)?;
                        accounting.table()?.insert(run.as_str(), encoded.as_slice())?;
                    }
                }
                Op::Run { id, seq, new, record, .. } => {
                    runs.table()?.insert(id.as_str(), record.as_slice())?;
                    if *new {
                        order.table()?.insert(*seq, id.as_str())?;
                        meta.table()?.insert("next_run_seq", *seq + 1)?;
                    }
                }
                Op::Factory { key, registration } => {
                    factories.table()?.insert(key.as_str(), registration.as_slice())?;
                }
                Op::Blob { hash, bytes } => {
                    if blobs.table()?.get(hash.as_str())?.is_none() {
                        let stored = crate::store::codec::encode_blob(bytes);
                        blobs.table()?.insert(hash.as_str(), stored.as_slice())?;
                    }
                }
                Op::RunModules { run, manifest } => {
                    run_modules.table()?.insert(run.as_str(), manifest.as_slice())?;
                }
                Op::Flush(_) => {}
            }
        }
        for (run, of_run) in &mut last.runs {
            if let Some((key, taken)) = of_run.progress.take() {
                row.clear();
                crate::store::codec::encode_into(taken, &mut row);
                progress.table()?.insert((*run, key), row.as_slice())?;
            }
        }
    }
    txn.commit()?;
    crate::metrics::metrics().committed(started.elapsed());
    stats.commits.fetch_add(1, Ordering::Relaxed);
    stats.ops.fetch_add(writes as u64, Ordering::Relaxed);
    Ok(())
}

/// A table of a write transaction, opened on first use.
struct Lazy<'txn, K: redb::Key + 'static, V: redb::Value + 'static> {
    txn: &'txn WriteTransaction,
    definition: TableDefinition<'static, K, V>,
    table: Option<Table<'txn, K, V>>,
}

impl<'txn, K: redb::Key + 'static, V: redb::Value + 'static> Lazy<'txn, K, V> {
    fn new(txn: &'txn WriteTransaction, definition: TableDefinition<'static, K, V>) -> Self {
        Lazy { txn, definition, table: None }
    }

    /// The table, opened now if it was not yet.
    fn table(&mut self) -> Result<&mut Table<'txn, K, V>, StoreError> {
        let table = match self.table.take() {
            Some(table) => table,
            None => self.txn.open_table(self.definition)?,
        };
        Ok(self.table.insert(table))
    }
}

/// Count the shared value a row just written refers to (`new`: its reference and JSON
/// text), then release the one the row it overwrote referred to (`old`): counted first, so a
/// row written again with the same value keeps it. The shared tables are opened only when
/// either is there.
fn recount<'txn>(
    values: &mut Lazy<'txn, &'static [u8], &'static [u8]>,
    refs: &mut Lazy<'txn, &'static [u8], u64>,
    new: Option<(&Reference, &[u8])>,
    old: Option<Reference>,
    dictionaries: &Dictionaries,
) -> Result<(), StoreError> {
    if new.is_none() && old.is_none() {
        return Ok(());
    }
    let (values, refs) = (values.table()?, refs.table()?);
    if let Some((reference, raw)) = new {
        values::share(values, refs, reference, raw, Some(dictionaries))?;
    }
    if let Some(old) = old {
        values::release(values, refs, &old)?;
    }
    Ok(())
}

/// What a batch writes once per run: the index of its last accounting op, its largest
/// journal usage, and the row of progress entries it is gathering.
#[derive(Default)]
struct OfRun {
    accounting: Option<usize>,
    usage: Option<u64>,
    progress: Chunk,
}

/// [`OfRun`] by run, in the order runs first appear in the batch. A batch's ops mostly come
/// in runs of one run's, so the run of the last lookup is tried before the index.
#[derive(Default)]
struct PerRun<'a> {
    runs: Vec<(&'a str, OfRun)>,
    index: HashMap<&'a str, usize>,
    last: usize,
}

impl<'a> PerRun<'a> {
    fn at(&mut self, run: &'a str) -> &mut OfRun {
        let hit = self.runs.get(self.last).is_some_and(|(r, _)| *r == run);
        if !hit {
            self.last = match self.index.get(run) {
                Some(&at) => at,
                None => {
                    self.index.insert(run, self.runs.len());
                    self.runs.push((run, OfRun::default()));
                    self.runs.len() - 1
                }
            };
        }
        &mut self.runs[self.last].1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(value_bytes: usize) -> Op {
        Op::Step { run: "r".into(), key: "k".into(), value: "x".repeat(value_bytes).into(), usage: 0 }
    }

    #[test]
    fn a_full_queue_makes_the_next_write_wait_for_a_commit() {
        let db = Database::builder().create_with_backend(redb::backends::InMemoryBackend::new()).expect("a database");
        // A long window: without the cap, both writes would be queued before any commit.
        let writer = Writer::start(Arc::new(DbCell::new(db)), Duration::from_millis(300), 1000, None, Arc::default())
            .expect("the writer");
        writer.send(step(800)).expect("the first write");
        assert_eq!(writer.stats.commits.load(Ordering::SeqCst), 0, "the first write was queued, not committed");
        assert!(writer.backlog.queued() >= 800);
        writer.send(step(800)).expect("the second write");
        assert!(writer.stats.commits.load(Ordering::SeqCst) >= 1, "the second write waited for the first commit");
        // A write larger than the cap is taken once the queue is empty.
        writer.send(step(5000)).expect("a write over the cap");
        writer.close();
        assert_eq!(writer.backlog.queued(), 0, "every queued byte was released");
    }

    #[test]
    fn a_batch_of_early_commit_ops_writes_is_committed_before_the_window_closes() {
        let db = Database::builder().create_with_backend(redb::backends::InMemoryBackend::new()).expect("a database");
        // A window no test waits out: only the batch's size can make the thread commit.
        let writer = Writer::start(Arc::new(DbCell::new(db)), Duration::from_secs(600), u64::MAX, None, Arc::default())
            .expect("the writer");
        let commits = || writer.stats.commits.load(Ordering::SeqCst);
        for _ in 0..EARLY_COMMIT_OPS - 1 {
            writer.send(step(10)).expect("a write");
        }
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(commits(), 0, "a batch one write short is left to its window");
        writer.send(step(10)).expect("the write that fills the batch");
        let waited = Instant::now();
        // Counted as committed, then its bytes released: wait for both.
        while (commits() == 0 || writer.backlog.queued() > 0) && waited.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(commits(), 1, "the full batch was committed in one commit, the window still open");
        assert_eq!(writer.backlog.queued(), 0, "its bytes were released");
        // The next write starts a new batch, left to its window again.
        writer.send(step(10)).expect("a write after the commit");
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(commits(), 1);
        writer.close();
        assert_eq!(commits(), 2, "closing committed what was queued");
    }
}
