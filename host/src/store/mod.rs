//! The durable store: one redb file in the state directory holding run records, the step
//! and agent journal, progress, live accounting, registered factories, component bytes and
//! the modules script runs loaded ([`modules`]).
//! Writes go through the group-commit [`writer`]; reads open their own read transaction and
//! see what is committed. Opening the store repairs what a crash left: runs that were
//! `running` become `halted` (marked [`Interruption::Crash`]), with the spend recorded up to
//! the last commit.

pub mod footprint;
pub mod journal;
pub mod modules;
pub mod trust;
mod records;
pub(crate) mod tables;
mod writer;

pub use records::{Interruption, ProgressQuery, Registration, RunRecord, DEFAULT_SESSION};
pub use writer::WriterStats;
pub(crate) use records::timestamp as records_timestamp;

use crate::model::envelope::{Accounting, Failure, RunStatus};
use crate::store::journal::{Journal, JournalError, JournalSnapshot};
use crate::model::progress::{JournaledProgress, ProgressEntry, ProgressEvent};
use futures::future::BoxFuture;
use redb::{Database, ReadableDatabase, ReadableTable};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tables::*;
use writer::{Op, Writer};

/// The store file's name inside the state directory.
pub const STORE_FILE: &str = "factory.redb";

/// Bytes of pages redb keeps cached in memory (its default is 1 GiB): a run's values are
/// read on demand, and what the cache holds counts against the host's memory.
pub const READ_CACHE_BYTES: usize = 64 << 20;

/// Default commit window of the group-commit writer.
pub const DEFAULT_COMMIT_WINDOW: Duration = Duration::from_millis(10);

/// A store failure, with its cause ([`std::error::Error::source`] is the cause itself, not
/// a wrapper). Never a cache miss. Cloneable (one failed commit is the answer of every write
/// waiting on it), so causes are shared.
#[derive(Debug, Clone)]
pub enum StoreError {
    /// Another process holds the store (redb allows one).
    Locked(PathBuf),
    /// Written by a newer (or unknown) layout.
    Version { found: u64, expected: u64 },
    /// The state directory or the store file is not safely ours (someone else's, writable by
    /// others, a symlink): refused, never used.
    Unsafe(Arc<crate::access::AccessError>),
    /// The file is damaged or holds what this build did not write.
    Corrupt(String),
    /// The database failed (I/O underneath, a transaction, a commit).
    Database(Arc<redb::Error>),
    /// The store file could not be created or opened.
    File { path: PathBuf, source: Arc<std::io::Error> },
    /// A record could not be encoded.
    Encode(Arc<serde_json::Error>),
    /// The writer thread could not be started.
    Writer(Arc<std::io::Error>),
    /// A commit failed earlier (the first failure is kept); the store refuses further writes.
    WriteFailed(Arc<StoreError>),
    /// The writer is gone.
    Closed,
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Locked(path) => write!(f, "the store {} is in use by another factory process", path.display()),
            StoreError::Version { found, expected } => {
                write!(f, "the store was written with schema version {found}; this build reads version {expected}")
            }
            StoreError::Unsafe(e) => write!(f, "{e}"),
            StoreError::Corrupt(what) => write!(f, "the store is corrupt: {what}"),
            StoreError::Database(e) => write!(f, "store database: {e}"),
            StoreError::File { path, source } => write!(f, "store file {}: {source}", path.display()),
            StoreError::Encode(e) => write!(f, "encoding a store record: {e}"),
            StoreError::Writer(e) => write!(f, "cannot start the store writer: {e}"),
            StoreError::WriteFailed(e) => write!(f, "a store commit failed: {e}"),
            StoreError::Closed => write!(f, "the store is closed"),
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StoreError::Unsafe(e) => Some(&**e),
            StoreError::Database(e) => Some(&**e),
            StoreError::File { source, .. } => Some(&**source),
            StoreError::Encode(e) => Some(&**e),
            StoreError::Writer(e) => Some(&**e),
            StoreError::WriteFailed(e) => Some(&**e),
            StoreError::Locked(_) | StoreError::Version { .. } | StoreError::Corrupt(_) | StoreError::Closed => None,
        }
    }
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self {
                StoreError::Database(Arc::new(e.into()))
            }
        }
    )*};
}
from_redb!(redb::Error, redb::StorageError, redb::TableError, redb::TransactionError, redb::CommitError);

impl From<redb::DatabaseError> for StoreError {
    fn from(e: redb::DatabaseError) -> Self {
        match e {
            redb::DatabaseError::DatabaseAlreadyOpen => StoreError::Locked(PathBuf::new()),
            redb::DatabaseError::Storage(redb::StorageError::Corrupted(m)) => StoreError::Corrupt(m),
            other => StoreError::Database(Arc::new(other.into())),
        }
    }
}

impl From<serde_json::Error> for StoreError {
    fn from(e: serde_json::Error) -> Self {
        StoreError::Encode(Arc::new(e))
    }
}

/// How to open a store.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// The group-commit window.
    pub commit_window: Duration,
    /// Bytes handed to the writer and not yet committed before a write waits for the next
    /// commit (a write larger than this waits for an empty queue).
    pub queue_bytes: u64,
}

/// The default [`StoreOptions::queue_bytes`]: 64 MiB.
pub const DEFAULT_QUEUE_BYTES: u64 = 64 << 20;

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions { commit_window: DEFAULT_COMMIT_WINDOW, queue_bytes: DEFAULT_QUEUE_BYTES }
    }
}

/// The durable store.
pub struct Store {
    db: Arc<Database>,
    writer: Writer,
    next_run_seq: AtomicU64,
    path: Option<PathBuf>,
    /// Component hashes known to be stored (saves a copy and a lookup per attempt).
    known_blobs: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

fn corrupt(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{what}: {e}"))
}

impl Store {
    /// Open (or create) the store in `dir`. A missing `dir` is created `0700` and the
    /// store file `0600` (it holds every prompt, reply and step value); a store file of ours
    /// with a looser mode is tightened.
    pub fn open(dir: &Path, options: StoreOptions) -> Result<Store, StoreError> {
        crate::access::private_state_dir(dir).map_err(|e| StoreError::Unsafe(Arc::new(e)))?;
        let path = dir.join(STORE_FILE);
        // redb creates the file with the process umask: create it first, owner-only.
        crate::access::private_file_options()
            .read(true)
            .truncate(false)
            .open(&path)
            .and_then(|file| crate::access::tighten_open(&file))
            .map_err(|e| StoreError::File { path: path.clone(), source: Arc::new(e) })?;
        let db = Database::builder().set_cache_size(READ_CACHE_BYTES).create(&path).map_err(|e| match StoreError::from(e) {
            StoreError::Locked(_) => StoreError::Locked(path.clone()),
            other => other,
        })?;
        Store::with_database(db, options, Some(path))
    }

    /// Open (or create) the store on a redb storage backend of the caller's choosing: other
    /// media, or a backend that injects faults (tests). The store has no file path.
    pub fn open_with_backend(backend: impl redb::StorageBackend, options: StoreOptions) -> Result<Store, StoreError> {
        let db = Database::builder().create_with_backend(backend)?;
        Store::with_database(db, options, None)
    }

    /// A store that lives in memory for the life of the process (embedding, tests).
    pub fn in_memory() -> Result<Store, StoreError> {
        let db = Database::builder().create_with_backend(redb::backends::InMemoryBackend::new())?;
        Store::with_database(db, StoreOptions { commit_window: Duration::ZERO, ..StoreOptions::default() }, None)
    }

    fn with_database(db: Database, options: StoreOptions, path: Option<PathBuf>) -> Result<Store, StoreError> {
        let next_run_seq = prepare(&db)?;
        let db = Arc::new(db);
        let writer = Writer::start(db.clone(), options.commit_window, options.queue_bytes)?;
        Ok(Store { db, writer, next_run_seq: AtomicU64::new(next_run_seq), path, known_blobs: Default::default() })
    }

    /// The store file, if it has one.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Commit counters of the writer.
    pub fn writer_stats(&self) -> &WriterStats {
        &self.writer.stats
    }

    /// Resolve once every write queued so far is committed.
    pub async fn flush(&self) -> Result<(), StoreError> {
        self.writer.flush().await
    }

    /// Write a run record durably (bumps its write count, which feeds its revision).
    pub async fn put_run(&self, record: &mut RunRecord, new: bool) -> Result<(), StoreError> {
        record.writes += 1;
        let order = new.then(|| {
            record.seq = self.next_run_seq.fetch_add(1, Ordering::SeqCst);
            record.seq
        });
        let bytes = serde_json::to_vec(record)?;
        self.writer.send(Op::Run { id: record.envelope.run_id.clone(), order, record: bytes })?;
        self.writer.flush().await
    }

    /// A run record. A record that cannot be read is [`StoreError::Corrupt`] for this run
    /// only: every other run reads as before.
    pub fn run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        let txn = self.db.begin_read()?;
        let runs = txn.open_table(RUNS)?;
        match runs.get(run_id)? {
            None => Ok(None),
            Some(bytes) => serde_json::from_slice(bytes.value())
                .map(Some)
                .map_err(|e| corrupt(&format!("the record of run {run_id}"), e)),
        }
    }

    /// Every run record, in creation order. A record that cannot be read is listed as an
    /// [`unreadable`](records::unreadable_run) stand-in (status `error`, failure `storage` /
    /// `unreadable_record`) instead of failing the list.
    pub fn runs(&self) -> Result<Vec<RunRecord>, StoreError> {
        let txn = self.db.begin_read()?;
        let order = txn.open_table(RUN_ORDER)?;
        let runs = txn.open_table(RUNS)?;
        let mut out = Vec::new();
        for row in order.iter()? {
            let (seq, id) = row?;
            if let Some(bytes) = runs.get(id.value())? {
                out.push(match serde_json::from_slice(bytes.value()) {
                    Ok(record) => record,
                    Err(e) => records::unreadable_run(id.value(), seq.value(), bytes.value(), &e),
                });
            }
        }
        Ok(out)
    }

    /// Progress entries of a run, paged (see [`ProgressQuery`]), in ascending seq order.
    pub fn progress(&self, run_id: &str, query: &ProgressQuery) -> Result<Vec<ProgressEntry>, StoreError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(PROGRESS)?;
        let limit = query.limit();
        let lo = query.after_seq.map_or(0, |s| s.saturating_add(1));
        let hi = query.before_seq.map_or(u64::MAX, |s| s.saturating_sub(1));
        if lo > hi || query.before_seq == Some(0) {
            return Ok(Vec::new());
        }
        let range = table.range((run_id, lo)..=(run_id, hi))?;
        let mut out = Vec::new();
        let keep = |entry: &ProgressEntry| query.phase.as_deref().is_none_or(|p| entry.phase.as_deref() == Some(p));
        // Phase titles by the seq of the entry that set them, resolved once per read.
        let mut titles: HashMap<u64, Option<String>> = HashMap::new();
        let mut resolve = |bytes: &[u8]| -> Result<ProgressEntry, StoreError> {
            let stored: JournaledProgress = serde_json::from_slice(bytes).map_err(|e| corrupt("progress", e))?;
            let phase = match (stored.phase, stored.phase_seq) {
                (Some(text), _) => Some(text),
                (None, None) => None,
                (None, Some(at)) if at == stored.seq => match &stored.event {
                    ProgressEvent::Phase { title } => Some(title.clone()),
                    _ => None,
                },
                (None, Some(at)) => match titles.get(&at) {
                    Some(title) => title.clone(),
                    None => {
                        let title = match table.get((run_id, at))? {
                            Some(row) => {
                                let setter: JournaledProgress =
                                    serde_json::from_slice(row.value()).map_err(|e| corrupt("progress", e))?;
                                match setter.event {
                                    ProgressEvent::Phase { title } => Some(title),
                                    _ => None,
                                }
                            }
                            None => None,
                        };
                        titles.insert(at, title.clone());
                        title
                    }
                },
            };
            Ok(ProgressEntry { seq: stored.seq, at_ms: stored.at_ms, phase, event: stored.event })
        };
        // Forward from `after_seq`; otherwise backward from `before_seq` or the tail.
        if query.after_seq.is_some() {
            for row in range {
                let entry = resolve(row?.1.value())?;
                if keep(&entry) {
                    out.push(entry);
                    if out.len() >= limit {
                        break;
                    }
                }
            }
        } else {
            for row in range.rev() {
                let entry = resolve(row?.1.value())?;
                if keep(&entry) {
                    out.push(entry);
                    if out.len() >= limit {
                        break;
                    }
                }
            }
            out.reverse();
        }
        Ok(out)
    }

    /// The highest progress seq of a run (0 when it has none).
    pub fn last_progress_seq(&self, run_id: &str) -> Result<u64, StoreError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(PROGRESS)?;
        let last = table.range((run_id, 0)..=(run_id, u64::MAX))?.next_back();
        Ok(match last {
            Some(row) => row?.0.value().1,
            None => 0,
        })
    }

    /// Queue the running attempt's accounting (so a crash loses no recorded spend).
    pub(crate) fn put_live_accounting(&self, run_id: &str, accounting: &Accounting) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec(accounting)?;
        self.writer.send(Op::Accounting { run: run_id.to_string(), accounting: bytes })
    }

    /// Store component bytes under their hash; nothing is copied or written when the store
    /// already has them.
    pub fn put_blob(&self, hash: &str, bytes: &Arc<[u8]>) -> Result<(), StoreError> {
        if self.known_blobs.lock().unwrap_or_else(|p| p.into_inner()).contains(hash) {
            return Ok(());
        }
        if self.blob_exists(hash)? {
            self.known_blobs.lock().unwrap_or_else(|p| p.into_inner()).insert(hash.to_string());
            return Ok(());
        }
        self.writer.send(Op::Blob { hash: hash.to_string(), bytes: bytes.clone() })?;
        self.known_blobs.lock().unwrap_or_else(|p| p.into_inner()).insert(hash.to_string());
        Ok(())
    }

    fn blob_exists(&self, hash: &str) -> Result<bool, StoreError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(BLOBS)?;
        Ok(table.get(hash)?.is_some())
    }

    /// Component bytes by hash.
    pub fn blob(&self, hash: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(BLOBS)?;
        Ok(table.get(hash)?.map(|b| b.value().to_vec()))
    }

    /// Register (or re-register) a factory by name.
    pub async fn register(&self, registration: &Registration, bytes: &Arc<[u8]>) -> Result<(), StoreError> {
        self.put_blob(&registration.hash, bytes)?;
        let json = serde_json::to_vec(registration)?;
        self.writer.send(Op::Factory { name: registration.key(), registration: json })?;
        self.writer.flush().await
    }

    /// A factory registered for everyone.
    pub fn factory(&self, name: &str) -> Result<Option<Registration>, StoreError> {
        self.factory_by_key(name)
    }

    /// The factory `name` as `session` sees it: its own authored one, else the one
    /// registered for everyone.
    pub fn factory_in(&self, session: &str, name: &str) -> Result<Option<Registration>, StoreError> {
        match self.factory_by_key(&records::registration_key(Some(session), name))? {
            Some(registration) => Ok(Some(registration)),
            None => self.factory_by_key(name),
        }
    }

    fn factory_by_key(&self, key: &str) -> Result<Option<Registration>, StoreError> {
        if key.is_empty() {
            return Ok(None);
        }
        let txn = self.db.begin_read()?;
        let table = txn.open_table(FACTORIES)?;
        match table.get(key)? {
            None => Ok(None),
            Some(b) => serde_json::from_slice(b.value())
                .map(Some)
                .map_err(|e| corrupt(&format!("the registration of {}", records::display_key(key)), e)),
        }
    }

    /// Every registered factory, by name. A registration that cannot be read is left out
    /// (and logged): it fails only its own name ([`Store::factory`]), never the list.
    pub fn factories(&self) -> Result<Vec<Registration>, StoreError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(FACTORIES)?;
        let mut out = Vec::new();
        for row in table.iter()? {
            let (key, bytes) = row?;
            match serde_json::from_slice(bytes.value()) {
                Ok(registration) => out.push(registration),
                Err(e) => tracing::warn!("the registration of {} cannot be read ({e}); left out", records::display_key(key.value())),
            }
        }
        Ok(out)
    }
}

/// Create the tables, check the schema version, and halt the runs a crash left running.
/// Returns the next run creation seq.
fn prepare(db: &Database) -> Result<u64, StoreError> {
    let txn = db.begin_write()?;
    let next_seq;
    {
        let mut meta = txn.open_table(META)?;
        let version = meta.get("schema_version")?.map(|v| v.value());
        match version {
            None => {
                meta.insert("schema_version", SCHEMA_VERSION)?;
            }
            Some(v) if v == SCHEMA_VERSION => {}
            Some(found) => return Err(StoreError::Version { found, expected: SCHEMA_VERSION }),
        }
        next_seq = meta.get("next_run_seq")?.map_or(0, |v| v.value());
        // Make sure every table exists, so readers never meet a missing one.
        txn.open_table(RUN_ORDER)?;
        txn.open_table(STEPS)?;
        txn.open_table(AGENTS)?;
        txn.open_table(PROGRESS)?;
        txn.open_table(FACTORIES)?;
        txn.open_table(BLOBS)?;
        txn.open_table(JOURNAL_USAGE)?;
        txn.open_table(modules::RUN_MODULES)?;
        let live = txn.open_table(LIVE_ACCOUNTING)?;
        let mut runs = txn.open_table(RUNS)?;
        let mut interrupted = Vec::new();
        for row in runs.iter()? {
            let (id, bytes) = row?;
            // A record that cannot be read stays as it is (listed as unreadable): it must not
            // keep the store, and every other run, from opening.
            let mut record: RunRecord = match serde_json::from_slice(bytes.value()) {
                Ok(record) => record,
                Err(e) => {
                    tracing::warn!("the record of run {} cannot be read ({e}); left as it is", id.value());
                    continue;
                }
            };
            if matches!(record.envelope.status, RunStatus::Running | RunStatus::Pending) {
                if let Some(acc) = live.get(id.value())? {
                    let acc: Accounting = serde_json::from_slice(acc.value()).map_err(|e| corrupt("accounting", e))?;
                    record.envelope.accounting = acc;
                }
                record.envelope.status = RunStatus::Halted;
                let failure = Failure::new(crate::model::envelope::FailureType::Halted, None, "the host stopped during this attempt; resume to continue");
                record.envelope.error = Some(failure.message.clone());
                record.envelope.failure = Some(failure);
                record.envelope.updated_at = records::timestamp();
                record.interrupted = Some(Interruption::Crash);
                record.writes += 1;
                interrupted.push(record);
            }
        }
        for record in interrupted {
            let bytes = serde_json::to_vec(&record)?;
            runs.insert(record.envelope.run_id.as_str(), bytes.as_slice())?;
        }
    }
    txn.commit()?;
    Ok(next_seq)
}

impl Store {
    fn load_journal(&self, run_id: &str, value_bytes: usize) -> Result<JournalSnapshot, StoreError> {
        let txn = self.db.begin_read()?;
        let mut snapshot = JournalSnapshot::default();
        let mut room = value_bytes;
        // The run's cache keeps no value over a quarter of its bytes: loading one is waste.
        let largest = value_bytes / 4;
        let steps = txn.open_table(STEPS)?;
        for row in steps.range((run_id, "")..)? {
            let (key, value) = row?;
            let (run, step) = key.value();
            if run != run_id {
                break;
            }
            snapshot.step_keys.insert(crate::store::journal::fingerprint(step));
            let value = value.value();
            let size = step.len() + value.len();
            if size <= room && size <= largest {
                room -= size;
                snapshot.steps.insert(step.to_string(), value.to_string());
            }
        }
        let agents = txn.open_table(AGENTS)?;
        for row in agents.range((run_id, "")..)? {
            let (key, value) = row?;
            let (run, agent) = key.value();
            if run != run_id {
                break;
            }
            let value = value.value();
            let size = agent.len() + value.len();
            if size <= room && size <= largest {
                room -= size;
                let outcome = decode_outcome(value).map_err(|e| corrupt("agent journal", e))?;
                snapshot.agents.insert(agent.to_string(), outcome);
            }
        }
        let usage = txn.open_table(JOURNAL_USAGE)?;
        snapshot.journal_bytes = usage.get(run_id)?.map_or(0, |v| v.value());
        Ok(snapshot)
    }

    fn get_step_value(&self, run_id: &str, key: &str) -> Result<Option<String>, StoreError> {
        let id = (run_id.to_string(), key.to_string());
        if let Some(value) = self.writer.pending().steps.get(&id) {
            return Ok(Some(value.to_string()));
        }
        let txn = self.db.begin_read()?;
        let steps = txn.open_table(STEPS)?;
        Ok(steps.get((run_id, key))?.map(|v| v.value().to_string()))
    }

    fn get_agent_outcome(&self, run_id: &str, key: &str) -> Result<Option<Option<String>>, StoreError> {
        let id = (run_id.to_string(), key.to_string());
        let pending = self.writer.pending().agents.get(&id).cloned();
        let decode = |bytes: &[u8]| decode_outcome(bytes).map_err(|e| corrupt("agent journal", e));
        if let Some(bytes) = pending {
            return decode(&bytes).map(Some);
        }
        let txn = self.db.begin_read()?;
        let agents = txn.open_table(AGENTS)?;
        match agents.get((run_id, key))? {
            Some(v) => decode(v.value()).map(Some),
            None => Ok(None),
        }
    }
}

fn journal_error(e: StoreError) -> JournalError {
    JournalError::new(e)
}

impl Journal for Store {
    fn load(&self, run_id: &str, value_bytes: usize) -> Result<JournalSnapshot, JournalError> {
        self.load_journal(run_id, value_bytes).map_err(journal_error)
    }

    fn get_step(&self, run_id: &str, key: &str) -> Result<Option<String>, JournalError> {
        self.get_step_value(run_id, key).map_err(journal_error)
    }

    fn get_agent(&self, run_id: &str, key: &str) -> Result<Option<Option<String>>, JournalError> {
        self.get_agent_outcome(run_id, key).map_err(journal_error)
    }

    fn footprint(&self, key_bytes: usize, value_bytes: usize) -> u64 {
        footprint::entry_bytes(key_bytes, value_bytes)
    }

    fn put_step(&self, run_id: &str, key: &str, value: &str, journal_bytes: u64) -> Result<(), JournalError> {
        let (run, key, value) = (run_id.to_string(), key.to_string(), Arc::from(value));
        self.writer.send(Op::Step { run, key, value, usage: journal_bytes }).map_err(journal_error)
    }

    fn put_agent(&self, run_id: &str, key: &str, outcome: Option<&str>, journal_bytes: u64) -> Result<(), JournalError> {
        let outcome: Arc<[u8]> = encode_outcome(outcome).into();
        let (run, key) = (run_id.to_string(), key.to_string());
        self.writer.send(Op::Agent { run, key, outcome, usage: journal_bytes }).map_err(journal_error)
    }

    fn put_progress(&self, run_id: &str, seq: u64, entry: Vec<u8>, journal_bytes: u64) -> Result<(), JournalError> {
        self.writer.send(Op::Progress { run: run_id.to_string(), seq, entry, usage: journal_bytes }).map_err(journal_error)
    }

    fn put_accounting(&self, run_id: &str, accounting: &Accounting) -> Result<(), JournalError> {
        self.put_live_accounting(run_id, accounting).map_err(journal_error)
    }

    fn flush(&self) -> BoxFuture<'_, Result<(), JournalError>> {
        Box::pin(async move { self.writer.flush().await.map_err(journal_error) })
    }
}

#[cfg(test)]
mod error_tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn errors_keep_their_causes() {
        // A journal failure carries the store error itself, which carries redb's.
        let redb_error = redb::Error::from(redb::StorageError::Io(std::io::Error::other("disk gone")));
        let store_error = StoreError::from(redb_error);
        let journal = journal_error(StoreError::WriteFailed(Arc::new(store_error)));
        let cause = journal.source().expect("the journal error has a cause");
        let store = cause.downcast_ref::<StoreError>().expect("the cause is a StoreError");
        assert!(matches!(store, StoreError::WriteFailed(_)));
        let first = store.source().and_then(|e| e.downcast_ref::<StoreError>()).expect("the first failure is kept");
        assert!(matches!(first, StoreError::Database(_)));
        assert!(first.source().is_some_and(|e| e.to_string().contains("disk gone")), "{first}");
    }
}
