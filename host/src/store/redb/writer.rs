//! Group commit: one writer thread owns every write to the store. Callers hand it
//! operations and go on at once; it gathers whatever arrives within the commit window
//! (default 10 ms) — or until someone asks for a flush — into one write transaction and one
//! fsync. A fan-out of a thousand journaled results costs a handful of commits, and a
//! sequential loop of fast calls overlaps its commits with its work.
//!
//! The loss window after a `kill -9` is bounded by the commit window plus one commit:
//! entries handed over in that time may be lost (their calls re-run on resume); nothing
//! committed is lost.
//!
//! The queue is bounded in bytes ([`Backlog`]): once `queue_bytes` are handed over and not
//! yet committed, a caller waits for the next commit before its write joins the queue, so
//! runs writing faster than the disk can take slow down instead of filling host memory.

use super::tables::{self, AGENTS, BLOBS, FACTORIES, JOURNAL_USAGE, LIVE_ACCOUNTING, PROGRESS, RUNS, RUN_ORDER, STEPS};
use crate::store::{StoreError, WriterStats};
use redb::{Database, ReadableTable};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// One write.
pub(crate) enum Op {
    /// A journal entry carries the run's journal bytes with it counted (`usage`).
    Step { run: String, key: String, value: Arc<str>, usage: u64 },
    Agent { run: String, key: String, outcome: Arc<[u8]>, usage: u64 },
    Progress { run: String, seq: u64, entry: Vec<u8>, usage: u64 },
    Accounting { run: String, accounting: Vec<u8> },
    Run { id: String, order: Option<u64>, record: Vec<u8> },
    Factory { name: String, registration: Vec<u8> },
    Blob { hash: String, bytes: Arc<[u8]> },
    RunModules { run: String, manifest: Vec<u8> },
    Flush(oneshot::Sender<Result<(), StoreError>>),
}

impl Op {
    /// The bytes the operation holds while queued.
    fn bytes(&self) -> u64 {
        let bytes = match self {
            Op::Step { run, key, value, .. } => run.len() + key.len() + value.len(),
            Op::Agent { run, key, outcome, .. } => run.len() + key.len() + outcome.len(),
            Op::Progress { run, entry, .. } => run.len() + entry.len(),
            Op::Accounting { run, accounting } => run.len() + accounting.len(),
            Op::Run { id, record, .. } => id.len() + record.len(),
            Op::Factory { name, registration } => name.len() + registration.len(),
            Op::Blob { hash, bytes } => hash.len() + bytes.len(),
            Op::RunModules { run, manifest } => run.len() + manifest.len(),
            Op::Flush(_) => 0,
        };
        bytes as u64
    }
}

/// Bytes handed to the writer and not yet committed, against a cap.
pub(crate) struct Backlog {
    queued: Mutex<u64>,
    drained: Condvar,
    cap: u64,
}

impl Backlog {
    pub(crate) fn new(cap: u64) -> Self {
        Backlog { queued: Mutex::new(0), drained: Condvar::new(), cap }
    }

    /// Wait until `bytes` more fit under the cap (a write larger than the cap waits for an
    /// empty queue), then count them.
    pub(crate) fn reserve(&self, bytes: u64) {
        let mut queued = self.queued.lock().unwrap_or_else(|p| p.into_inner());
        while *queued > 0 && queued.saturating_add(bytes) > self.cap {
            queued = self.drained.wait(queued).unwrap_or_else(|p| p.into_inner());
        }
        *queued = queued.saturating_add(bytes);
    }

    /// The writer is done with `bytes` (committed, or failed: either way no longer held).
    pub(crate) fn release(&self, bytes: u64) {
        let mut queued = self.queued.lock().unwrap_or_else(|p| p.into_inner());
        *queued = queued.saturating_sub(bytes);
        self.drained.notify_all();
    }

    /// Bytes queued now.
    #[cfg(test)]
    pub(crate) fn queued(&self) -> u64 {
        *self.queued.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Journal values queued but not yet committed, so reads see every put at once. Each entry
/// shares its bytes with the queued operation (no copy) and leaves once that is committed.
#[derive(Default)]
pub(crate) struct Pending {
    pub(crate) steps: HashMap<(String, String), Arc<str>>,
    pub(crate) agents: HashMap<(String, String), Arc<[u8]>>,
}

/// The handle callers use; the thread stops when every handle is dropped.
pub(crate) struct Writer {
    /// Values queued, not yet committed.
    pub(crate) pending: Arc<Mutex<Pending>>,
    tx: Mutex<Option<mpsc::Sender<Op>>>,
    /// The first commit failure; once set, the store refuses further writes.
    failed: Arc<Mutex<Option<Arc<StoreError>>>>,
    pub(crate) stats: Arc<WriterStats>,
    /// Bytes queued, not yet committed.
    pub(crate) backlog: Arc<Backlog>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Writer {
    /// Start the writer thread for `db`, committing every `window` and holding at most
    /// about `queue_bytes` uncommitted.
    pub(crate) fn start(db: Arc<Database>, window: Duration, queue_bytes: u64) -> Result<Self, StoreError> {
        let (tx, rx) = mpsc::channel();
        let failed = Arc::new(Mutex::new(None));
        let stats = Arc::new(WriterStats::default());
        let pending: Arc<Mutex<Pending>> = Arc::default();
        let backlog = Arc::new(Backlog::new(queue_bytes));
        let thread = {
            let failed = failed.clone();
            let stats = stats.clone();
            let pending = pending.clone();
            let backlog = backlog.clone();
            std::thread::Builder::new()
                .name("factory-store-writer".into())
                .spawn(move || run(db, rx, window, failed, stats, pending, backlog))
                .map_err(|e| StoreError::Writer(Arc::new(e)))?
        };
        Ok(Writer { pending, tx: Mutex::new(Some(tx)), failed, stats, backlog, thread: Mutex::new(Some(thread)) })
    }

    /// Queue a write; fails only when the store has already failed or is closed. A step or
    /// agent value is readable through [`Writer::pending`] from now until it is committed.
    /// When the queue holds its cap in bytes, waits for the next commit first.
    pub(crate) fn send(&self, op: Op) -> Result<(), StoreError> {
        if let Some(message) = self.failed.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Err(StoreError::WriteFailed(message));
        }
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        if tx.is_none() {
            return Err(StoreError::Closed);
        }
        // Under the sender lock: the thread is running (it stops only once `tx` is taken),
        // so every byte counted here is released by a commit.
        self.backlog.reserve(op.bytes());
        // Registered under the sender lock, so the commit that removes it comes after.
        match &op {
            Op::Step { run, key, value, .. } => {
                self.pending().steps.insert((run.clone(), key.clone()), value.clone());
            }
            Op::Agent { run, key, outcome, .. } => {
                self.pending().agents.insert((run.clone(), key.clone()), outcome.clone());
            }
            _ => {}
        }
        match tx.as_ref() {
            Some(tx) => tx.send(op).map_err(|_| StoreError::Closed),
            None => Err(StoreError::Closed),
        }
    }

    pub(crate) fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Resolve once everything queued so far is committed.
    pub(crate) async fn flush(&self) -> Result<(), StoreError> {
        let (done, wait) = oneshot::channel();
        self.send(Op::Flush(done))?;
        wait.await.map_err(|_| StoreError::Closed)?
    }

    /// Stop the thread after it commits what is queued.
    pub(crate) fn close(&self) {
        self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
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

fn run(
    db: Arc<Database>,
    rx: mpsc::Receiver<Op>,
    window: Duration,
    failed: Arc<Mutex<Option<Arc<StoreError>>>>,
    stats: Arc<WriterStats>,
    pending: Arc<Mutex<Pending>>,
    backlog: Arc<Backlog>,
) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        let deadline = Instant::now() + window;
        let mut flush = matches!(batch[0], Op::Flush(_));
        let mut open = true;
        // Gather until the window closes or a flush is asked for.
        while !flush {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(op) => {
                    flush = matches!(op, Op::Flush(_));
                    batch.push(op);
                }
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        // Whatever is already waiting rides along for free.
        while let Ok(op) = rx.try_recv() {
            batch.push(op);
        }
        let already_failed = failed.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let result = match already_failed {
            Some(message) => Err(StoreError::WriteFailed(message)),
            None => commit(&db, &batch, &stats),
        };
        match &result {
            Err(e) => {
                failed.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(|| Arc::new(e.clone()));
            }
            // Committed: readable from the database now. An entry replaced by a later put
            // (another Arc) stays until that one is committed.
            Ok(()) => {
                let mut pending = pending.lock().unwrap_or_else(|p| p.into_inner());
                for op in &batch {
                    match op {
                        Op::Step { run, key, value, .. } => {
                            let id = (run.clone(), key.clone());
                            if pending.steps.get(&id).is_some_and(|v| Arc::ptr_eq(v, value)) {
                                pending.steps.remove(&id);
                            }
                        }
                        Op::Agent { run, key, outcome, .. } => {
                            let id = (run.clone(), key.clone());
                            if pending.agents.get(&id).is_some_and(|v| Arc::ptr_eq(v, outcome)) {
                                pending.agents.remove(&id);
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        let bytes = batch.iter().map(Op::bytes).sum();
        for op in batch {
            if let Op::Flush(done) = op {
                let _ = done.send(result.clone());
            }
        }
        backlog.release(bytes);
        if !open {
            break;
        }
    }
}

fn commit(db: &Database, batch: &[Op], stats: &WriterStats) -> Result<(), StoreError> {
    let writes = batch.iter().filter(|op| !matches!(op, Op::Flush(_))).count();
    if writes == 0 {
        return Ok(());
    }
    let span = crate::trace::store_commit(writes);
    let _entered = span.enter();
    let started = Instant::now();
    let txn = db.begin_write()?;
    {
        let mut steps = txn.open_table(STEPS)?;
        let mut agents = txn.open_table(AGENTS)?;
        let mut progress = txn.open_table(PROGRESS)?;
        let mut accounting = txn.open_table(LIVE_ACCOUNTING)?;
        let mut runs = txn.open_table(RUNS)?;
        let mut order = txn.open_table(RUN_ORDER)?;
        let mut factories = txn.open_table(FACTORIES)?;
        let mut blobs = txn.open_table(BLOBS)?;
        let mut meta = txn.open_table(tables::META)?;
        let mut usage = txn.open_table(JOURNAL_USAGE)?;
        let mut run_modules = txn.open_table(super::tables::RUN_MODULES)?;
        // Live accounting is overwritten per agent; within a batch only each run's last one
        // needs writing.
        let mut last_accounting = std::collections::HashMap::new();
        // Likewise the journal usage: only the largest per run.
        let mut last_usage: HashMap<&str, u64> = HashMap::new();
        for (i, op) in batch.iter().enumerate() {
            match op {
                Op::Accounting { run, .. } => {
                    last_accounting.insert(run.as_str(), i);
                }
                Op::Step { run, usage: bytes, .. }
                | Op::Agent { run, usage: bytes, .. }
                | Op::Progress { run, usage: bytes, .. } => {
                    let most = last_usage.entry(run.as_str()).or_insert(0);
                    *most = (*most).max(*bytes);
                }
                _ => {}
            }
        }
        for (run, bytes) in last_usage {
            usage.insert(run, bytes)?;
        }
        for (i, op) in batch.iter().enumerate() {
            match op {
                Op::Step { run, key, value, .. } => {
                    steps.insert((run.as_str(), key.as_str()), &**value)?;
                }
                Op::Agent { run, key, outcome, .. } => {
                    agents.insert((run.as_str(), key.as_str()), &**outcome)?;
                }
                Op::Progress { run, seq, entry, .. } => {
                    progress.insert((run.as_str(), *seq), entry.as_slice())?;
                }
                Op::Accounting { run, accounting: bytes } => {
                    if last_accounting.get(run.as_str()) == Some(&i) {
                        accounting.insert(run.as_str(), bytes.as_slice())?;
                    }
                }
                Op::Run { id, order: seq, record } => {
                    runs.insert(id.as_str(), record.as_slice())?;
                    if let Some(seq) = seq {
                        order.insert(*seq, id.as_str())?;
                        meta.insert("next_run_seq", *seq + 1)?;
                    }
                }
                Op::Factory { name, registration } => {
                    factories.insert(name.as_str(), registration.as_slice())?;
                }
                Op::Blob { hash, bytes } => {
                    if blobs.get(hash.as_str())?.is_none() {
                        blobs.insert(hash.as_str(), &bytes[..])?;
                    }
                }
                Op::RunModules { run, manifest } => {
                    run_modules.insert(run.as_str(), manifest.as_slice())?;
                }
                Op::Flush(_) => {}
            }
        }
    }
    txn.commit()?;
    crate::metrics::metrics().committed(started.elapsed());
    stats.commits.fetch_add(1, Ordering::Relaxed);
    stats.ops.fetch_add(writes as u64, Ordering::Relaxed);
    Ok(())
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
        let writer = Writer::start(Arc::new(db), Duration::from_millis(300), 1000).expect("the writer");
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
}
