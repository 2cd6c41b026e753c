//! The durable store: what the host asks of wherever runs live — run records, the step and
//! agent journal, progress, live accounting, registered factories, component bytes and the
//! modules script runs loaded — as one object-safe trait, [`Store`], used as
//! `Arc<dyn Store>`. This module holds what every store shares (the trait, [`StoreError`],
//! the records, the journal types, the footprint figure, the trust file); each
//! implementation lives in its own folder: [`redb`] (one embedded file, the default) and
//! [`postgres`] (a PostgreSQL database that several workers share).
//!
//! Reads are futures (a store across a network cannot answer at once); writes hand their
//! entry to the store's group-commit writer and return (they wait only when the writer's
//! queue is full), so the hot paths never wait for a commit. Opening a store repairs what a
//! crash left: runs that were `running` become `halted` ([`records::halt_interrupted`]).
//! [`conformance`] checks any store against this contract.

pub mod blobs;
pub mod codec;
pub mod conformance;
mod error;
pub mod footprint;
pub mod journal;
pub(crate) mod op;
pub mod postgres;
pub mod queue;
pub mod records;
pub mod redb;
pub mod shared;
mod stats;
pub mod trust;

pub use self::postgres::{PgOptions, PgStore};
pub use self::redb::{
    Compaction, RedbStore, StoreOptions, StorePart, StoreUsage, TableUsage, DEFAULT_COMMIT_WINDOW, DEFAULT_QUEUE_BYTES,
    READ_CACHE_BYTES, STORE_FILE,
};
pub(crate) use error::corrupt;
pub use error::{Damage, StoreError};
pub(crate) use records::timestamp as records_timestamp;
pub use records::{Interruption, ListedRun, ProgressQuery, Registration, Removed, RunRecord, DEFAULT_SESSION};
pub use stats::WriterStats;

use crate::model::progress::ProgressEntry;
use crate::model::script::Manifest;
use futures::future::BoxFuture;
use journal::Journal;
use std::path::Path;
use std::sync::Arc;

/// A durable store. It is a [`Journal`] (a run's entries, and [`Journal::flush`], which
/// resolves once every write queued so far — journal or not — is durable).
///
/// Writes other than [`Store::put_run`] and [`Store::register`] are queued: they return
/// once the writer holds them and are durable at the next commit (or [`Journal::flush`]).
/// Reads see what is committed, and journal reads also what is queued.
pub trait Store: Journal + std::fmt::Debug {
    /// The file the store lives in, for a store that is one file (`None` for one in memory,
    /// on another medium, or on a server).
    fn path(&self) -> Option<&Path>;

    /// Commit counters of the store's writer.
    fn writer_stats(&self) -> &WriterStats;

    /// Write a run record durably: bumps `record.writes` (which feeds its revision) and,
    /// when `new`, gives it the next creation seq (`record.seq`), which orders
    /// [`Store::runs`].
    fn put_run<'a>(&'a self, record: &'a mut RunRecord, new: bool) -> BoxFuture<'a, Result<(), StoreError>>;

    /// A run record. A record that cannot be read is [`StoreError::Corrupt`] for this run
    /// only: every other run reads as before.
    fn run<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Option<RunRecord>, StoreError>>;

    /// Every run record, in creation order. A record that cannot be read is listed as an
    /// [`unreadable`](records::unreadable_run) stand-in (status `error`, failure `storage` /
    /// `unreadable_record`) instead of failing the list.
    fn runs(&self) -> BoxFuture<'_, Result<Vec<RunRecord>, StoreError>>;

    /// Every run record as a listing reads it, in creation order: without its result (only
    /// the result's size is kept), each result dropped as its record is read, so a listing
    /// holds at most one result at a time however many runs returned big ones. Unreadable
    /// records are listed as in [`Store::runs`].
    fn listed_runs(&self) -> BoxFuture<'_, Result<Vec<ListedRun>, StoreError>>;

    /// Progress entries of a run, paged (see [`ProgressQuery`]), in ascending seq order, each
    /// with the title of the phase it was recorded in.
    fn progress<'a>(
        &'a self,
        run_id: &'a str,
        query: &'a ProgressQuery,
    ) -> BoxFuture<'a, Result<Vec<ProgressEntry>, StoreError>>;

    /// The highest committed progress seq of a run (0 when it has none).
    fn last_progress_seq<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<u64, StoreError>>;

    /// Queue component (or source, or manifest) bytes under their sha256. Content-addressed:
    /// a hash already stored keeps its bytes (a store may skip the copy when it knows it has
    /// them; it need not read to find out).
    fn put_blob(&self, hash: &str, bytes: &Arc<[u8]>) -> Result<(), StoreError>;

    /// Bytes by hash.
    fn blob<'a>(&'a self, hash: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, StoreError>>;

    /// Register (or re-register) a factory under [`Registration::key`], with its component
    /// bytes, durably.
    fn register<'a>(
        &'a self,
        registration: &'a Registration,
        bytes: &'a Arc<[u8]>,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// The registration under `key` ([`records::registration_key`]); `None` for an empty key.
    /// One that cannot be read is [`StoreError::Corrupt`].
    fn registration<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Registration>, StoreError>>;

    /// Every registered factory, every session's, ordered by key. A registration that cannot
    /// be read is left out (and logged): it fails only its own key, never the list.
    fn factories(&self) -> BoxFuture<'_, Result<Vec<Registration>, StoreError>>;

    /// Queue `manifest` as run `run_id`'s record of loaded modules (replacing the last).
    fn put_run_modules(&self, run_id: &str, manifest: &Manifest) -> Result<(), StoreError>;

    /// The modules run `run_id` recorded (`None`: it loaded none, or ran before modules).
    fn run_modules<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Option<Manifest>, StoreError>>;

    /// Delete run `run_id` and its journal (step values, agent outcomes, progress, live
    /// accounting, journal usage, module record) durably, after every write queued before
    /// it. A run whose record says it executes (`running` or `pending`), or on a shared store
    /// that another live worker has claimed to resume, is kept and answered
    /// [`Removed::Active`]; a record that cannot be read is deleted all the same. Blobs stay
    /// (content-addressed, shared with other runs and registrations): the caller hands those
    /// the run referred to ([`blobs::of_run`], read before) to [`Store::collect_blobs`].
    fn remove_run<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Removed, StoreError>>;

    /// Delete those of the blobs `candidates` (hashes) that no run record, registration, run
    /// module record, queued start or script manifest refers to any more, after every write
    /// queued before; how many were deleted. A blob a start put just before and refers to
    /// only in a record not yet written is stored again once that record is (see
    /// [`blobs`]). A record that cannot be read fails the collection (nothing is deleted).
    fn collect_blobs<'a>(&'a self, candidates: &'a [String]) -> BoxFuture<'a, Result<usize, StoreError>>;

    /// Give back the space deleted runs left, when worthwhile: a redb file is compacted when
    /// its free pages are a large part of it ([`redb::compaction_worthwhile`]); `None` for a
    /// store that gives space back by itself (PostgreSQL's autovacuum; the default).
    fn reclaim(&self) -> BoxFuture<'_, Result<Option<Compaction>, StoreError>> {
        Box::pin(std::future::ready(Ok(None)))
    }

    /// Where the store's bytes go, per table and per part ([`StoreUsage::parts`]), once what
    /// is queued is committed (PostgreSQL: its tables as the server measures them); `None`
    /// for a store that does not measure itself (the default).
    fn usage_report(&self) -> BoxFuture<'_, Result<Option<StoreUsage>, StoreError>> {
        Box::pin(std::future::ready(Ok(None)))
    }

    /// How many journal rows refer to the shared value ([`shared`]) whose JSON text hashes
    /// to `hash`, once what is queued is committed; `None` when the store keeps no such value
    /// (or shares none: the default).
    fn shared_value_refs<'a>(&'a self, hash: &'a shared::Hash) -> BoxFuture<'a, Result<Option<u64>, StoreError>> {
        let _ = hash;
        Box::pin(std::future::ready(Ok(None)))
    }

    /// Whether other processes execute runs of this store at the same time (a shared
    /// database): a `running` run that does not execute here may then be executing elsewhere,
    /// not a run whose process died. `false` (the default) for a store one process holds.
    fn shared(&self) -> bool {
        false
    }

    /// Ask whichever process executes run `run_id` to cancel it, for a store several
    /// processes share: `Ok(true)` when the request was recorded for a run still running.
    /// A store of one process has no one else to ask (`Ok(false)`, the default).
    fn request_cancel<'a>(&'a self, _run_id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(std::future::ready(Ok(false)))
    }

    /// Ask whichever process executes run `run_id` to pause it, as [`Store::request_cancel`]
    /// asks for a cancel: `Ok(true)` when the request was recorded for a run still running.
    fn request_pause<'a>(&'a self, _run_id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(std::future::ready(Ok(false)))
    }

    /// Take run `run_id`, found `halted` by an interruption, for this process to recover:
    /// `Ok(true)` when this process may resume it, `Ok(false)` when it is no longer `halted`
    /// or another live process sharing the store took it first (each interrupted run is
    /// recovered by one process). A store one process holds has no one to race: it claims
    /// every run (the default).
    fn claim_interrupted<'a>(&'a self, _run_id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(std::future::ready(Ok(true)))
    }

    /// Whether an attempt of run `run_id` executing in this process began under a worker
    /// generation this process no longer holds (it lost its lease and rejoined since): such
    /// an attempt writes nothing more and is to be stopped. A store one process holds is never
    /// fenced (`false`, the default).
    fn attempt_fenced(&self, _run_id: &str) -> bool {
        false
    }

    /// Take run `run_id`, not executing (not `running` or `pending`), for a caller's resume
    /// in this process: `Ok(false)` when another live process sharing the store took it
    /// first or it is executing (two callers resuming it at once through two workers: one
    /// resumes it). Released by the resumed attempt's first write, or by
    /// [`Store::release_claim`] when the resume does not start. A store one process holds has
    /// no one to race (the default: `Ok(true)`).
    fn claim_resume<'a>(&'a self, _run_id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(std::future::ready(Ok(true)))
    }

    /// Give up a claim of [`Store::claim_resume`] (or [`Store::claim_interrupted`]) whose
    /// resume did not start, so that another process may resume the run at once.
    fn release_claim<'a>(&'a self, _run_id: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(std::future::ready(Ok(())))
    }

    /// Whether run `run_id`, `halted`, goes on in another attempt without a caller: on a
    /// store several processes share, it is back in the run queue or a live worker claimed
    /// it to resume it. `false` for a store of one process (the default).
    fn continues<'a>(&'a self, _run_id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(std::future::ready(Ok(false)))
    }

    /// The ids of runs other processes sharing the store committed changes to (as they
    /// are notified, and from a slow poll of the runs executing elsewhere), for this
    /// process's followers; `None` for a store of one process (the default).
    fn run_changes(&self) -> Option<tokio::sync::broadcast::Receiver<String>> {
        None
    }

    /// The ids of runs whose cancel other processes requested ([`Store::request_cancel`]),
    /// as they arrive; `None` for a store of one process (the default).
    fn cancel_requests(&self) -> Option<tokio::sync::broadcast::Receiver<String>> {
        None
    }

    /// The ids of runs whose pause other processes requested ([`Store::request_pause`]), as
    /// they arrive; `None` for a store of one process (the default).
    fn pause_requests(&self) -> Option<tokio::sync::broadcast::Receiver<String>> {
        None
    }

    /// The run queue, for a store several workers share: new runs are enqueued there and
    /// claimed by whichever worker has room ([`queue::RunQueue`]). `None` (the default): runs
    /// execute in the process that starts them.
    fn run_queue(&self) -> Option<&dyn queue::RunQueue> {
        None
    }
}

impl dyn Store {
    /// A factory registered for everyone.
    pub async fn factory(&self, name: &str) -> Result<Option<Registration>, StoreError> {
        self.registration(name).await
    }

    /// The factory `name` as `session` sees it: its own authored one, else the one
    /// registered for everyone.
    pub async fn factory_in(&self, session: &str, name: &str) -> Result<Option<Registration>, StoreError> {
        match self.registration(&records::registration_key(Some(session), name)).await? {
            Some(registration) => Ok(Some(registration)),
            None => self.registration(name).await,
        }
    }
}
