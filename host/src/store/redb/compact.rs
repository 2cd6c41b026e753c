//! Giving a redb store's free pages back: the store's [`Database`] behind [`DbCell`], which
//! every read and the writer thread borrow for one transaction at a time, so that
//! [`RedbStore::compact`] can hold it alone for [`Database::compact`] (which moves live pages
//! down and cuts the file's free tail). Deleting runs frees pages that later commits reuse;
//! only compaction makes the file itself smaller. It is done when worthwhile
//! ([`worthwhile`]): after a deletion, and when the store settles (its last executing run
//! stops; see `settle.rs`), when free pages are a large part of the file.

use super::RedbStore;
use crate::store::StoreError;
use redb::Database;
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// Free bytes below which a compaction is not worth its pause: 1 MiB.
pub const COMPACT_MIN_FREE_BYTES: u64 = 1 << 20;

/// Whether a file of `file_bytes` with `free_bytes` holding no live data is worth compacting:
/// at least [`COMPACT_MIN_FREE_BYTES`] free, and at least a quarter of the file.
pub fn worthwhile(file_bytes: u64, free_bytes: u64) -> bool {
    free_bytes >= COMPACT_MIN_FREE_BYTES && free_bytes.saturating_mul(4) >= file_bytes
}

/// The store's database, lent one transaction at a time ([`DbCell::get`]) and held alone
/// while it is compacted.
pub(crate) struct DbCell(RwLock<Arc<Database>>);

impl DbCell {
    pub(crate) fn new(db: Database) -> DbCell {
        DbCell(RwLock::new(Arc::new(db)))
    }

    /// The database, for a transaction (waits while a compaction runs).
    pub(crate) fn get(&self) -> Arc<Database> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// What [`RedbStore::compact`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Compaction {
    /// The file's length before.
    pub before_bytes: u64,
    /// The file's length after (the same when nothing was done).
    pub after_bytes: u64,
    /// Whether the file was compacted (`false`: not worthwhile, or busy with reads that did
    /// not end in time: tried again at the next deletion).
    pub compacted: bool,
}

impl RedbStore {
    /// Compact the store file when [`worthwhile`] (or always when `force`): every write
    /// queued so far is committed first, then the database is held alone (reads and commits
    /// wait) while redb moves live pages down and cuts the free tail. A read transaction still
    /// open (a journal being loaded) makes it wait a little, then give up for this time.
    pub async fn compact(&self, force: bool) -> Result<Compaction, StoreError> {
        self.writer.flush().await?;
        let usage = self.usage()?;
        let before = usage.file_bytes;
        if !force && !worthwhile(before, usage.free_bytes()) {
            return Ok(Compaction { before_bytes: before, after_bytes: before, compacted: false });
        }
        let cell = self.db.clone();
        let compacted = tokio::task::spawn_blocking(move || compact_held(&cell, COMPACT_TRIES))
            .await
            .map_err(|_| StoreError::Closed)??;
        let after = match &self.path {
            Some(path) => {
                std::fs::metadata(path).map_err(|e| StoreError::File { path: path.clone(), source: Arc::new(e) })?.len()
            }
            None => before,
        };
        if compacted {
            tracing::info!(event = "store_compacted", before, after, "store compacted");
        }
        Ok(Compaction { before_bytes: before, after_bytes: after, compacted })
    }
}

/// Tries [`RedbStore::compact`] makes to hold the database alone, 20 ms apart.
const COMPACT_TRIES: u32 = 50;

/// Hold the database alone and compact it: `Ok(false)` when it stays borrowed (a journal
/// being loaded) or a read is open through every one of `tries` tries, 20 ms apart.
pub(crate) fn compact_held(cell: &DbCell, tries: u32) -> Result<bool, StoreError> {
    for attempt in 0..tries {
        if attempt > 0 {
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut held = cell.0.write().unwrap_or_else(|p| p.into_inner());
        let Some(db) = Arc::get_mut(&mut held) else { continue };
        match db.compact() {
            // redb goes on until a pass moves nothing and cuts the free tail.
            Ok(_) => return Ok(true),
            Err(redb::CompactionError::TransactionInProgress) => continue,
            Err(e) => return Err(compaction_error(e)),
        }
    }
    Ok(false)
}

fn compaction_error(e: redb::CompactionError) -> StoreError {
    StoreError::Database(Arc::new(e.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_compaction_is_worthwhile_for_a_mebibyte_free_that_is_a_quarter_of_the_file() {
        assert!(worthwhile(8 << 20, 7 << 20));
        assert!(worthwhile(4 << 20, 1 << 20));
        assert!(!worthwhile(5 << 20, 1 << 20), "under a quarter of the file");
        assert!(!worthwhile(1 << 20, 512 << 10), "under 1 MiB free");
        assert!(!worthwhile(0, 0));
    }
}
