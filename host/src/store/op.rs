//! What a store's group-commit writer is handed, shared by the redb and PostgreSQL writers
//! (which differ only in how they commit a batch): one [`Op`] per write, made by the same
//! constructors for every store; the [`Queued`] form that carries the op's size in bytes,
//! computed once when it is queued and released with it at its commit; the [`Backlog`] that
//! caps those bytes; the [`Pending`] values that journal reads see until they are
//! committed; and [`EARLY_COMMIT_OPS`], the batch both writers commit without waiting out
//! their window.

use crate::model::envelope::Accounting;
use crate::store::journal::encode_outcome;
use crate::store::StoreError;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use tokio::sync::oneshot;

/// Writes in a batch that make a writer commit it without waiting out its window: a burst
/// (a fan-out's results, a loop of `log` lines) is committed in pieces while the run goes
/// on, and the run's closing flush waits for the last piece only. Each commit still carries
/// at least this many writes (or a window's worth), so its fixed cost (an fsync, a round
/// trip) stays shared; a bigger batch would only lengthen the wait of the flush after it.
/// Measured on the fan-out and `log` rows of the bench (README, Benchmarks).
pub(crate) const EARLY_COMMIT_OPS: usize = 256;

/// One write.
pub(crate) enum Op {
    /// A journal entry carries the run's journal bytes with it counted (`usage`).
    Step {
        run: String,
        key: String,
        value: Arc<str>,
        usage: u64,
    },
    Agent {
        run: String,
        key: String,
        outcome: Arc<[u8]>,
        usage: u64,
    },
    Progress {
        run: String,
        seq: u64,
        entry: Vec<u8>,
        usage: u64,
    },
    /// The running attempt's accounting: encoded by the writer, for the last one of each run
    /// in a commit only (a fan-out's agents each hand one over; a commit keeps one per run).
    Accounting {
        run: String,
        accounting: Accounting,
    },
    /// A run record: `seq` is its creation seq, `new` when this write creates it, `status`
    /// its status's name for a store that keeps it beside the record (else empty).
    Run {
        id: String,
        seq: u64,
        new: bool,
        status: String,
        record: Vec<u8>,
    },
    Factory {
        key: String,
        registration: Vec<u8>,
    },
    Blob {
        hash: String,
        bytes: Arc<[u8]>,
    },
    RunModules {
        run: String,
        manifest: Vec<u8>,
    },
    Flush(oneshot::Sender<Result<(), StoreError>>),
}

impl Op {
    /// A step value.
    pub(crate) fn step(run_id: &str, key: &str, value: &str, usage: u64) -> Op {
        Op::Step { run: run_id.to_string(), key: key.to_string(), value: Arc::from(value), usage }
    }

    /// An agent outcome (`None`: an ordinary failure), in its stored form.
    pub(crate) fn agent(run_id: &str, key: &str, outcome: Option<&str>, usage: u64) -> Op {
        Op::Agent { run: run_id.to_string(), key: key.to_string(), outcome: encode_outcome(outcome).into(), usage }
    }

    /// A progress entry in its stored JSON form.
    pub(crate) fn progress(run_id: &str, seq: u64, entry: Vec<u8>, usage: u64) -> Op {
        Op::Progress { run: run_id.to_string(), seq, entry, usage }
    }

    /// The running attempt's accounting so far.
    pub(crate) fn accounting(run_id: &str, accounting: &Accounting) -> Op {
        Op::Accounting { run: run_id.to_string(), accounting: *accounting }
    }

    /// The bytes the operation holds while queued.
    fn size(&self) -> u64 {
        let bytes = match self {
            Op::Step { run, key, value, .. } => run.len() + key.len() + value.len(),
            Op::Agent { run, key, outcome, .. } => run.len() + key.len() + outcome.len(),
            Op::Progress { run, entry, .. } => run.len() + entry.len(),
            // Its encoding's size, about: ten numbers and their names.
            Op::Accounting { run, .. } => run.len() + ACCOUNTING_BYTES,
            Op::Run { id, record, status, .. } => id.len() + record.len() + status.len(),
            Op::Factory { key, registration } => key.len() + registration.len(),
            Op::Blob { hash, bytes } => hash.len() + bytes.len(),
            Op::RunModules { run, manifest } => run.len() + manifest.len(),
            Op::Flush(_) => 0,
        };
        bytes as u64
    }

    /// Whether this is a step or agent value (which [`Pending`] keeps until committed).
    pub(crate) fn is_value(&self) -> bool {
        matches!(self, Op::Step { .. } | Op::Agent { .. })
    }

    /// Whether this is a flush request.
    pub(crate) fn is_flush(&self) -> bool {
        matches!(self, Op::Flush(_))
    }
}

/// About the size of an encoded [`Accounting`], as a queued op's bytes count it.
const ACCOUNTING_BYTES: usize = 256;

/// An op as a writer queues it: with its size, computed once here and released with it.
pub(crate) struct Queued {
    pub(crate) op: Op,
    pub(crate) bytes: u64,
}

impl Queued {
    /// `op`, sized.
    pub(crate) fn new(op: Op) -> Queued {
        let bytes = op.size();
        Queued { op, bytes }
    }
}

/// Bytes handed to the writer and not yet committed, against a cap. The count is an atomic,
/// so a write that fits takes no lock; the lock and the condition are only for a write that
/// must wait for a commit.
pub(crate) struct Backlog {
    queued: AtomicU64,
    lock: Mutex<()>,
    drained: Condvar,
    cap: u64,
}

impl Backlog {
    /// A backlog holding at most about `cap` bytes.
    pub(crate) fn new(cap: u64) -> Self {
        Backlog { queued: AtomicU64::new(0), lock: Mutex::new(()), drained: Condvar::new(), cap }
    }

    /// Count `bytes` if they fit under the cap now (or the backlog is empty: a write larger
    /// than the cap is taken alone); false, counting nothing, if they do not.
    pub(crate) fn try_reserve(&self, bytes: u64) -> bool {
        self.queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |queued| {
                (queued == 0 || queued.saturating_add(bytes) <= self.cap).then(|| queued.saturating_add(bytes))
            })
            .is_ok()
    }

    /// Wait until `bytes` more fit under the cap (a write larger than the cap waits for an
    /// empty queue), then count them.
    pub(crate) fn reserve(&self, bytes: u64) {
        if !self.try_reserve(bytes) {
            self.reserve_after_refusal(bytes);
        }
    }

    /// [`Backlog::reserve`] for a caller whose [`Backlog::try_reserve`] of `bytes` was just
    /// refused: wait for a commit, then count them.
    pub(crate) fn reserve_after_refusal(&self, bytes: u64) {
        // Checked again under the lock [`Backlog::release`] notifies under, so a release
        // between the refusal and the wait is not missed.
        let mut guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        while !self.try_reserve(bytes) {
            guard = self.drained.wait(guard).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// The writer is done with `bytes` (committed, or failed: either way no longer held).
    pub(crate) fn release(&self, bytes: u64) {
        let _ =
            self.queued.fetch_update(Ordering::AcqRel, Ordering::Acquire, |queued| Some(queued.saturating_sub(bytes)));
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.drained.notify_all();
    }

    /// Bytes queued now.
    #[cfg(test)]
    pub(crate) fn queued(&self) -> u64 {
        self.queued.load(Ordering::Acquire)
    }
}

/// Journal values queued but not yet committed, so reads see every put at once: by run,
/// then key. Each entry shares its bytes with the queued operation (no copy) and leaves once
/// that is committed.
#[derive(Default)]
pub(crate) struct Pending {
    steps: HashMap<String, HashMap<String, Arc<str>>>,
    /// Agent outcomes by memo key (hex of a SHA-256 the host computed, no guest's choice: a
    /// fast hasher).
    agents: HashMap<String, HashMap<String, Arc<[u8]>, foldhash::fast::RandomState>>,
}

/// Keep `value` under run, key.
fn keep<V, S: BuildHasher + Default>(map: &mut HashMap<String, HashMap<String, V, S>>, run: &str, key: &str, value: V) {
    match map.get_mut(run) {
        Some(keys) => {
            keys.insert(key.to_string(), value);
        }
        None => {
            let mut keys = HashMap::default();
            keys.insert(key.to_string(), value);
            map.insert(run.to_string(), keys);
        }
    }
}

/// Drop run, key if it still holds `value` (a later put of the key stays).
fn forget<V: ?Sized, S: BuildHasher>(
    map: &mut HashMap<String, HashMap<String, Arc<V>, S>>,
    run: &str,
    key: &str,
    value: &Arc<V>,
) {
    if let Some(keys) = map.get_mut(run) {
        if keys.get(key).is_some_and(|v| Arc::ptr_eq(v, value)) {
            keys.remove(key);
            if keys.is_empty() {
                map.remove(run);
            }
        }
    }
}

impl Pending {
    /// A step value queued and not yet committed.
    pub(crate) fn step(&self, run: &str, key: &str) -> Option<&Arc<str>> {
        self.steps.get(run)?.get(key)
    }

    /// An agent outcome (stored form) queued and not yet committed.
    pub(crate) fn agent(&self, run: &str, key: &str) -> Option<&Arc<[u8]>> {
        self.agents.get(run)?.get(key)
    }

    /// `op` is queued: a step or agent value is readable from now on.
    pub(crate) fn queued(&mut self, op: &Op) {
        match op {
            Op::Step { run, key, value, .. } => keep(&mut self.steps, run, key, value.clone()),
            Op::Agent { run, key, outcome, .. } => keep(&mut self.agents, run, key, outcome.clone()),
            _ => {}
        }
    }

    /// `ops` are committed, so readable from the store: their values leave. An entry
    /// replaced by a later put (another Arc) stays until that one is committed.
    pub(crate) fn committed<'a>(&mut self, ops: impl Iterator<Item = &'a Op>) {
        for op in ops {
            match op {
                Op::Step { run, key, value, .. } => forget(&mut self.steps, run, key, value),
                Op::Agent { run, key, outcome, .. } => forget(&mut self.agents, run, key, outcome),
                _ => {}
            }
        }
    }
}
