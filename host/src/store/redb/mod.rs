//! The embedded store: one redb file in the state directory (or a redb backend of the
//! caller's, or memory) holding run records, the step and agent journal, progress, live
//! accounting, registered factories, component bytes and the modules script runs loaded.
//! Writes go through the group-commit [`writer`]; reads open their own read transaction and
//! see what is committed, so each of its [`Store`] futures is ready at once. Opening it
//! repairs what a crash left ([`open`]).

mod blobs;
mod compact;
mod error;
mod journal;
mod modules;
mod open;
mod progress;
mod rows;
mod settle;
pub(crate) mod tables;
mod usage;
mod values;
mod writer;

pub use compact::{worthwhile as compaction_worthwhile, Compaction, COMPACT_MIN_FREE_BYTES};
pub use usage::{StorePart, StoreUsage, TableUsage};

use crate::model::progress::ProgressEntry;
use crate::model::script::Manifest;
use crate::store::codec::{self, Dictionaries};
use crate::store::op::Op;
use crate::store::records::{display_key, record_says_active, unreadable_run};
use crate::store::{
    corrupt, ListedRun, ProgressQuery, Registration, Removed, RunRecord, Store, StoreError, WriterStats,
};
use futures::future::{ready, BoxFuture, FutureExt};
use redb::{Database, ReadableDatabase, ReadableTable};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tables::*;
use writer::Writer;

/// The store file's name inside the state directory.
pub const STORE_FILE: &str = "factory.redb";

/// Bytes of pages redb keeps cached in memory by default (its own default is 1 GiB): a run's
/// values are read on demand, and what the cache holds counts against the host's memory.
pub const READ_CACHE_BYTES: usize = 64 << 20;

/// Default commit window of the group-commit writer.
pub const DEFAULT_COMMIT_WINDOW: Duration = Duration::from_millis(10);

/// How to open a redb store.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// The group-commit window.
    pub commit_window: Duration,
    /// Bytes handed to the writer and not yet committed before a write waits for the next
    /// commit (a write larger than this waits for an empty queue).
    pub queue_bytes: u64,
    /// Bytes of store pages kept cached in memory ([`READ_CACHE_BYTES`] by default). A
    /// process that runs one run and exits reads a resumed run's journal once: pages it
    /// keeps are memory no later read uses.
    pub read_cache_bytes: usize,
}

/// The default [`StoreOptions::queue_bytes`]: 64 MiB.
pub const DEFAULT_QUEUE_BYTES: u64 = 64 << 20;

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            commit_window: DEFAULT_COMMIT_WINDOW,
            queue_bytes: DEFAULT_QUEUE_BYTES,
            read_cache_bytes: READ_CACHE_BYTES,
        }
    }
}

/// The redb store.
pub struct RedbStore {
    db: Arc<compact::DbCell>,
    /// The compression dictionaries the store holds, prepared (shared with the writer, which
    /// trains the first: see `settle.rs`).
    dictionaries: Arc<Dictionaries>,
    writer: Writer,
    next_run_seq: AtomicU64,
    path: Option<PathBuf>,
    /// Component hashes known to be stored (saves a copy and a lookup per attempt).
    known_blobs: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Blobs put and not yet checked after a record referring to them ([`blobs`](crate::store::blobs)).
    pins: crate::store::blobs::Pins,
}

impl std::fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbStore").field("path", &self.path).finish()
    }
}

impl RedbStore {
    /// Open (or create) the store in `dir`. A missing `dir` is created `0700` and the
    /// store file `0600` (it holds every prompt, reply and step value); a store file of ours
    /// with a looser mode is tightened.
    pub fn open(dir: &Path, options: StoreOptions) -> Result<RedbStore, StoreError> {
        crate::access::private_state_dir(dir).map_err(|e| StoreError::Unsafe(Arc::new(e)))?;
        let path = dir.join(STORE_FILE);
        // redb creates the file with the process umask: create it first, owner-only.
        crate::access::private_file_options()
            .read(true)
            .truncate(false)
            .open(&path)
            .and_then(|file| crate::access::tighten_open(&file))
            .map_err(|e| StoreError::File { path: path.clone(), source: Arc::new(e) })?;
        let db = Database::builder().set_cache_size(options.read_cache_bytes).create(&path).map_err(|e| {
            match StoreError::from(e) {
                StoreError::Locked(_) => StoreError::Locked(path.clone()),
                other => other,
            }
        })?;
        RedbStore::with_database(db, options, Some(path))
    }

    /// Open (or create) the store on a redb storage backend of the caller's choosing: other
    /// media, or a backend that injects faults (tests). The store has no file path.
    pub fn open_with_backend(
        backend: impl redb::StorageBackend,
        options: StoreOptions,
    ) -> Result<RedbStore, StoreError> {
        let db = Database::builder().create_with_backend(backend)?;
        RedbStore::with_database(db, options, None)
    }

    /// A store that lives in memory for the life of the process (embedding, tests).
    pub fn in_memory() -> Result<RedbStore, StoreError> {
        let db = Database::builder().create_with_backend(redb::backends::InMemoryBackend::new())?;
        RedbStore::with_database(db, StoreOptions { commit_window: Duration::ZERO, ..StoreOptions::default() }, None)
    }

    fn with_database(db: Database, options: StoreOptions, path: Option<PathBuf>) -> Result<RedbStore, StoreError> {
        let next_run_seq = open::prepare(&db)?;
        let dictionaries = Arc::new(open::dictionaries(&db)?);
        let db = Arc::new(compact::DbCell::new(db));
        let writer =
            Writer::start(db.clone(), options.commit_window, options.queue_bytes, path.clone(), dictionaries.clone())?;
        Ok(RedbStore {
            db,
            dictionaries,
            writer,
            next_run_seq: AtomicU64::new(next_run_seq),
            path,
            known_blobs: Default::default(),
            pins: Default::default(),
        })
    }

    async fn write_run(&self, record: &mut RunRecord, new: bool) -> Result<(), StoreError> {
        record.writes += 1;
        if new {
            record.seq = self.next_run_seq.fetch_add(1, Ordering::SeqCst);
        }
        let bytes = serde_json::to_vec(record)?;
        let (id, seq, status) = (record.envelope.run_id.clone(), record.seq, String::new());
        let due = self.pins.due_for_run(&id, &bytes);
        self.writer.send(Op::Run { id: id.clone(), seq, new, status, record: bytes })?;
        self.writer.flush().await?;
        // Committed: a run that stops executing has its rows packed, and the store settles
        // when none executes any more (`settle.rs`).
        self.writer.run_written(&id, !record.envelope.status.is_terminal());
        self.keep_pinned(due).await
    }

    /// A run record. A record that cannot be read is [`StoreError::Corrupt`] for this run
    /// only: every other run reads as before.
    fn read_run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        let txn = self.db.get().begin_read()?;
        let runs = txn.open_table(RUNS)?;
        match runs.get(run_id)? {
            None => Ok(None),
            Some(bytes) => serde_json::from_slice(bytes.value())
                .map(Some)
                .map_err(|e| corrupt(&format!("the record of run {run_id}"), e)),
        }
    }

    /// Every run record, in creation order. A record that cannot be read is listed as an
    /// [`unreadable`](unreadable_run) stand-in (status `error`, failure `storage` /
    /// `unreadable_record`) instead of failing the list.
    fn read_runs(&self) -> Result<Vec<RunRecord>, StoreError> {
        self.read_runs_as(|record| record)
    }

    /// Every run record in creation order, each turned into `T` by `keep` as soon as it is
    /// read (a listing drops the result there, so at most one is held at a time).
    fn read_runs_as<T>(&self, keep: impl Fn(RunRecord) -> T) -> Result<Vec<T>, StoreError> {
        let txn = self.db.get().begin_read()?;
        let order = txn.open_table(RUN_ORDER)?;
        let runs = txn.open_table(RUNS)?;
        let mut out = Vec::new();
        for row in order.iter()? {
            let (seq, id) = row?;
            if let Some(bytes) = runs.get(id.value())? {
                out.push(keep(match serde_json::from_slice(bytes.value()) {
                    Ok(record) => record,
                    Err(e) => unreadable_run(id.value(), seq.value(), bytes.value(), &e),
                }));
            }
        }
        Ok(out)
    }

    /// Delete a run and its journal in one transaction, once every write queued before is
    /// committed (so none lands after it); a run whose record says it executes is kept.
    async fn delete_run(&self, run_id: &str) -> Result<Removed, StoreError> {
        self.writer.flush().await?;
        let txn = self.db.get().begin_write()?;
        {
            let mut runs = txn.open_table(RUNS)?;
            let active = match runs.get(run_id)? {
                None => return Ok(Removed::NotFound),
                Some(bytes) => record_says_active(bytes.value()),
            };
            if active {
                return Ok(Removed::Active);
            }
            runs.remove(run_id)?;
            txn.open_table(RUN_ORDER)?.retain(|_, id| id != run_id)?;
            // A run's journal keys are (run id, ...): every key of the run sorts before
            // (run id + NUL, ""), and every key of a run after it from there on.
            let next = format!("{run_id}\0");
            // Each row referring to a shared value releases it (deleted with its last row).
            let mut released = Vec::new();
            txn.open_table(STEPS)?.retain_in((run_id, "")..(next.as_str(), ""), |_, row| {
                released.extend(rows::step_reference(row));
                false
            })?;
            txn.open_table(AGENTS)?.retain_in((run_id, "")..(next.as_str(), ""), |_, row| {
                released.extend(rows::agent_reference(row));
                false
            })?;
            values::release_all(&txn, &released)?;
            txn.open_table(PROGRESS)?.retain_in((run_id, 0)..=(run_id, u64::MAX), |_, _| false)?;
            txn.open_table(LIVE_ACCOUNTING)?.remove(run_id)?;
            txn.open_table(JOURNAL_USAGE)?.remove(run_id)?;
            txn.open_table(RUN_MODULES)?.remove(run_id)?;
        }
        txn.commit()?;
        Ok(Removed::Removed)
    }

    /// Store component bytes under their hash; nothing is copied or written when the store
    /// already has them.
    fn queue_blob(&self, hash: &str, bytes: &Arc<[u8]>) -> Result<(), StoreError> {
        self.pins.pin(hash, bytes);
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
        let txn = self.db.get().begin_read()?;
        let table = txn.open_table(BLOBS)?;
        Ok(table.get(hash)?.is_some())
    }

    /// The IDs of the compression dictionaries the store holds (see `settle.rs`), oldest
    /// first.
    pub fn dictionary_ids(&self) -> Vec<u32> {
        self.dictionaries.ids()
    }

    /// Component bytes by hash, decompressed (bounded: see [`codec::decode_blob`]).
    fn read_blob(&self, hash: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let stored = {
            let txn = self.db.get().begin_read()?;
            let table = txn.open_table(BLOBS)?;
            table.get(hash)?.map(|b| b.value().to_vec())
        };
        match stored {
            Some(stored) => codec::decode_blob(stored).map(Some).map_err(|e| corrupt(&format!("blob {hash}"), e)),
            None => Ok(None),
        }
    }

    async fn write_registration(&self, registration: &Registration, bytes: &Arc<[u8]>) -> Result<(), StoreError> {
        self.queue_blob(&registration.hash, bytes)?;
        let json = serde_json::to_vec(registration)?;
        let due = self.pins.due_for(&json, crate::store::blobs::Referenced::registration);
        self.writer.send(Op::Factory { key: registration.key(), registration: json })?;
        self.writer.flush().await?;
        self.keep_pinned(due).await
    }

    fn read_registration(&self, key: &str) -> Result<Option<Registration>, StoreError> {
        if key.is_empty() {
            return Ok(None);
        }
        let txn = self.db.get().begin_read()?;
        let table = txn.open_table(FACTORIES)?;
        match table.get(key)? {
            None => Ok(None),
            Some(b) => serde_json::from_slice(b.value())
                .map(Some)
                .map_err(|e| corrupt(&format!("the registration of {}", display_key(key)), e)),
        }
    }

    /// Every registered factory, by name. A registration that cannot be read is left out
    /// (and logged): it fails only its own name ([`Store::registration`]), never the list.
    fn read_factories(&self) -> Result<Vec<Registration>, StoreError> {
        let txn = self.db.get().begin_read()?;
        let table = txn.open_table(FACTORIES)?;
        let mut out = Vec::new();
        for row in table.iter()? {
            let (key, bytes) = row?;
            match serde_json::from_slice(bytes.value()) {
                Ok(registration) => out.push(registration),
                Err(e) => {
                    tracing::warn!("the registration of {} cannot be read ({e}); left out", display_key(key.value()))
                }
            }
        }
        Ok(out)
    }
}

impl Store for RedbStore {
    fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    fn writer_stats(&self) -> &WriterStats {
        &self.writer.stats
    }

    fn put_run<'a>(&'a self, record: &'a mut RunRecord, new: bool) -> BoxFuture<'a, Result<(), StoreError>> {
        self.write_run(record, new).boxed()
    }

    fn run<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Option<RunRecord>, StoreError>> {
        ready(self.read_run(run_id)).boxed()
    }

    fn runs(&self) -> BoxFuture<'_, Result<Vec<RunRecord>, StoreError>> {
        ready(self.read_runs()).boxed()
    }

    fn listed_runs(&self) -> BoxFuture<'_, Result<Vec<ListedRun>, StoreError>> {
        ready(self.read_runs_as(ListedRun::of)).boxed()
    }

    fn progress<'a>(
        &'a self,
        run_id: &'a str,
        query: &'a ProgressQuery,
    ) -> BoxFuture<'a, Result<Vec<ProgressEntry>, StoreError>> {
        ready(self.read_progress(run_id, query)).boxed()
    }

    fn last_progress_seq<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        ready(self.read_last_progress_seq(run_id)).boxed()
    }

    fn put_blob(&self, hash: &str, bytes: &Arc<[u8]>) -> Result<(), StoreError> {
        self.queue_blob(hash, bytes)
    }

    fn blob<'a>(&'a self, hash: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, StoreError>> {
        ready(self.read_blob(hash)).boxed()
    }

    fn register<'a>(
        &'a self,
        registration: &'a Registration,
        bytes: &'a Arc<[u8]>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.write_registration(registration, bytes).boxed()
    }

    fn registration<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Registration>, StoreError>> {
        ready(self.read_registration(key)).boxed()
    }

    fn factories(&self) -> BoxFuture<'_, Result<Vec<Registration>, StoreError>> {
        ready(self.read_factories()).boxed()
    }

    fn put_run_modules(&self, run_id: &str, manifest: &Manifest) -> Result<(), StoreError> {
        self.pins.pin_modules(run_id, manifest);
        self.queue_run_modules(run_id, manifest)
    }

    fn run_modules<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Option<Manifest>, StoreError>> {
        ready(self.read_run_modules(run_id)).boxed()
    }

    fn remove_run<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Removed, StoreError>> {
        self.delete_run(run_id).boxed()
    }

    fn collect_blobs<'a>(&'a self, candidates: &'a [String]) -> BoxFuture<'a, Result<usize, StoreError>> {
        self.delete_unreferenced(candidates).boxed()
    }

    fn usage_report(&self) -> BoxFuture<'_, Result<Option<StoreUsage>, StoreError>> {
        async move {
            self.writer.flush().await?;
            RedbStore::usage(self).map(Some)
        }
        .boxed()
    }

    fn shared_value_refs<'a>(
        &'a self,
        hash: &'a crate::store::shared::Hash,
    ) -> BoxFuture<'a, Result<Option<u64>, StoreError>> {
        async move {
            self.writer.flush().await?;
            let txn = self.db.get().begin_read()?;
            let refs = txn.open_table(JOURNAL_VALUE_REFS)?.get(&hash[..])?.map(|n| n.value());
            let stored = txn.open_table(JOURNAL_VALUES)?.get(&hash[..])?.is_some();
            Ok(refs.filter(|_| stored))
        }
        .boxed()
    }

    fn reclaim(&self) -> BoxFuture<'_, Result<Option<Compaction>, StoreError>> {
        async move { self.compact(false).await.map(Some) }.boxed()
    }
}
