//! What the writer thread does when runs stop executing (their record written `completed`,
//! `error`, `cancelled`, `halted` or `paused`): [`Settle`]. A run's journal rows are keyed by
//! (run id, agent key | step key), hashes in no order, so the rows its commits insert land in
//! leaves all over its range, which split in two and stay about 60 % full. Once the run stops,
//! its rows are rewritten in key order through a redb cursor ([`pack_piece`]), which packs them
//! into full leaves; the keys, and so the journal's identity, do not change. When no run this
//! store wrote is executing any more (the store settles), its free pages are worth it
//! ([`worthwhile`](super::compact::worthwhile)) and the runs wrote rows of at least an eighth
//! of the file since the last compaction, the file is compacted
//! ([`compact_held`](super::compact::compact_held)): redb grows a file by doubling it and its
//! allocator leaves pages near the end, so without this the file of a finished run stays
//! about twice its live pages. The last condition keeps the compactions' work (each reads
//! every page) proportional to what runs write: a store whose runs write little (replays,
//! resumes of long journals) is not compacted each time the doubling its next commit makes
//! leaves half of it free.
//!
//! The first run a store packs also gives it its compression dictionary, when it has none
//! ([`train`]): a zstd dictionary of at most [`DICTIONARY_BYTES`] trained from a bounded
//! sample of that run's values ([`SAMPLE_BYTES`]), stored in the
//! [`DICTIONARIES`](super::tables::DICTIONARIES) table before any row uses it. Packing
//! rewrites every row anyway: the run's rows are written again with their values compressed
//! with it, and the writer compresses every value written afterwards with it. Short English
//! replies share most of their words and phrasing with one another, which a value compressed
//! alone cannot use: see the book's "Storage: where the bytes go" for the figures.

use super::compact::{compact_held, worthwhile, DbCell};
use super::tables::{AGENTS, DICTIONARIES, DICTIONARY_PIECE_BYTES, STEPS};
use crate::store::codec::{self, Dictionaries};
use crate::store::StoreError;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::collections::{HashMap, HashSet, VecDeque};
use std::num::NonZeroU32;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The size of the dictionary a store trains: 63 KiB (at most 64 KiB; stored in pieces, see
/// [`DICTIONARY_PIECE_BYTES`]). Measured on replies none of which it learnt from, 1,000
/// replies of 2 KiB (`tests/store_size.rs`'s): a 16 KiB dictionary kept 41.3 % of their
/// bytes, 32 KiB 37.9 %, 63 KiB 33.6 %, 110 KiB 29.6 %; each compressed alone 59.0 %.
pub const DICTIONARY_BYTES: usize = 63 << 10;

/// Bytes of values a dictionary is trained from at most: 2 MiB, the first values of the
/// run in key order (agent and step keys are hashes: the order is no order of the run's).
/// Training reads and holds them, on the writer thread, once per store.
pub const SAMPLE_BYTES: usize = 2 << 20;

/// Bytes of one value a sample keeps at most (its start).
const SAMPLE_VALUE_BYTES: usize = 16 << 10;

/// Values a run must have (of at least [`codec::RAW_BELOW`] bytes) for a dictionary to be
/// trained from them: fewer teach it little.
const MIN_SAMPLES: usize = 64;

/// The first dictionary ID a store gives (zstd's format reserves those below 32,768).
const FIRST_DICTIONARY_ID: u32 = 1 << 15;

/// Bytes of journal rows a run must have written (in this process, since it was last packed)
/// for its rows to be rewritten when it stops: 64 KiB. A run that journaled less fills few
/// pages, and rewriting them is not worth the commit.
pub const PACK_MIN_BYTES: u64 = 64 << 10;

/// Bytes of rows one pack transaction rewrites at most: 1 MiB. A run's rows are rewritten in
/// pieces of this size, each its own transaction, one piece between two commits of the
/// writer: the writes of other runs wait for one piece at most, and a pack holds one in
/// memory.
const PACK_PIECE_BYTES: usize = 1 << 20;

/// The tables a run's rows are packed in, in order.
const PACKED: [TableDefinition<(&str, &str), &[u8]>; 2] = [AGENTS, STEPS];

/// Tries a settled store's compaction makes to hold the database alone (20 ms apart) before
/// it gives up until the store settles again: a read open all that time (a journal being
/// loaded, a detail view) means the store is not idle.
const SETTLE_COMPACT_TRIES: u32 = 5;

/// The runs the store's writer saw executing and the journal rows they wrote, and the
/// settling work their stops leave to do.
#[derive(Default)]
pub(crate) struct Settle {
    /// Runs whose last record written says they execute (`running`, `pending`).
    active: HashSet<String>,
    /// Bytes of journal rows each run wrote since it was last packed.
    unpacked: HashMap<String, u64>,
    /// Runs stopped since the writer last took the work, to pack.
    stopped: Vec<String>,
    /// A stop left the store without an executing run: compact when worthwhile.
    settled: bool,
    /// Bytes of journal rows written since the store was last compacted as it settled.
    written: u64,
}

/// What stops leave to do ([`Settle::take`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Work {
    /// Runs to pack.
    pub(crate) packs: Vec<String>,
    /// When the store settled: the bytes of rows written since its last compaction (handed
    /// back by [`Settle::not_compacted`] when it is not compacted now).
    pub(crate) settled: Option<u64>,
}

impl Settle {
    /// A run's record was written (and committed) with `executing` its status.
    pub(crate) fn run_written(&mut self, run: &str, executing: bool) {
        if executing {
            self.active.insert(run.to_string());
        } else {
            self.active.remove(run);
            self.stopped.push(run.to_string());
            self.settled = self.active.is_empty();
        }
    }

    /// `bytes` of journal rows of `run` were committed.
    pub(crate) fn rows_written(&mut self, run: &str, bytes: u64) {
        self.written = self.written.saturating_add(bytes);
        match self.unpacked.get_mut(run) {
            Some(total) => *total += bytes,
            None => {
                self.unpacked.insert(run.to_string(), bytes);
            }
        }
    }

    /// Whether stops left work to do.
    pub(crate) fn has_work(&self) -> bool {
        !self.stopped.is_empty() || self.settled
    }

    /// Whether runs stopped since the work was last taken (their rows may be to pack).
    pub(crate) fn has_stops(&self) -> bool {
        !self.stopped.is_empty()
    }

    /// Whether no run this store wrote executes.
    pub(crate) fn idle(&self) -> bool {
        self.active.is_empty()
    }

    /// Take the work the stops so far left: the runs to pack (those that wrote at least
    /// [`PACK_MIN_BYTES`] since their last pack and do not execute again), and whether to
    /// try a compaction. A run that executes again is left, with the bytes it wrote, for its
    /// next stop.
    pub(crate) fn take(&mut self) -> Work {
        let mut packs = Vec::new();
        for run in std::mem::take(&mut self.stopped) {
            if self.active.contains(&run) {
                continue;
            }
            if self.unpacked.remove(&run).is_some_and(|bytes| bytes >= PACK_MIN_BYTES) {
                packs.push(run);
            }
        }
        let settled = std::mem::take(&mut self.settled) && self.active.is_empty();
        Work { packs, settled: settled.then(|| std::mem::take(&mut self.written)) }
    }

    /// The settled store taken with `written` bytes of rows was not compacted: they count
    /// toward the next time it settles.
    pub(crate) fn not_compacted(&mut self, written: u64) {
        self.written = self.written.saturating_add(written);
    }
}

/// A piece of a run's rows to pack: the run, the table (in [`PACKED`]) and the key it
/// starts at.
struct Piece {
    run: String,
    table: usize,
    from: String,
}

/// The settling work the writer thread has taken and not done yet, done a step at a time
/// between its commits ([`Packing::step`]): the pieces of runs' rows to pack, then the
/// compaction the store's settling asked for.
pub(crate) struct Packing {
    pieces: VecDeque<Piece>,
    /// The store settled: the bytes of rows written since its last compaction.
    compact: Option<u64>,
    /// The store's dictionaries: packed rows are compressed with the newest.
    dictionaries: Arc<Dictionaries>,
}

impl Packing {
    /// Nothing to do yet, for a store holding `dictionaries`.
    pub(crate) fn new(dictionaries: Arc<Dictionaries>) -> Packing {
        Packing { pieces: VecDeque::new(), compact: None, dictionaries }
    }

    /// Add the work taken from [`Settle::take`].
    pub(crate) fn add(&mut self, work: Work) {
        for run in work.packs {
            self.pieces.push_back(Piece { run, table: 0, from: String::new() });
        }
        if let Some(written) = work.settled {
            self.compact = Some(self.compact.unwrap_or(0).saturating_add(written));
        }
    }

    /// Whether nothing is left to do.
    pub(crate) fn done(&self) -> bool {
        self.pieces.is_empty() && self.compact.is_none()
    }

    /// Whether pieces of runs' rows are left to pack.
    pub(crate) fn packing(&self) -> bool {
        !self.pieces.is_empty()
    }

    /// Drop what is left (the store failed: nothing more is written).
    pub(crate) fn clear(&mut self) {
        self.pieces.clear();
        self.compact = None;
    }

    /// Do the next step: pack one piece, or, every piece packed and `may_compact`, compact
    /// the file if the store is still settled (`settled` says so) and that is worth it. The
    /// bytes of rows of a settling that did not compact, handed back for
    /// [`Settle::not_compacted`]. A failure is logged, not returned: nothing committed is at
    /// stake, only the file's size.
    pub(crate) fn step(
        &mut self,
        cell: &DbCell,
        path: Option<&Path>,
        may_compact: bool,
        settled: impl FnOnce() -> bool,
    ) -> Option<u64> {
        if let Some(mut piece) = self.pieces.pop_front() {
            let db = cell.get();
            if piece.table == 0 && piece.from.is_empty() && self.dictionaries.encoder().is_none() {
                let started = std::time::Instant::now();
                match train(&db, &self.dictionaries, &piece.run) {
                    Ok(Some((id, bytes))) => tracing::info!(
                        event = "store_dictionary_trained", run = %piece.run, id, bytes,
                        millis = started.elapsed().as_millis() as u64, "a compression dictionary was trained"
                    ),
                    Ok(None) => {}
                    Err(e) => tracing::warn!(
                        event = "store_dictionary_failed", run = %piece.run, error = %e, "no compression dictionary was trained"
                    ),
                }
            }
            match pack_piece(&db, &self.dictionaries, PACKED[piece.table], &piece.run, &piece.from) {
                Ok(Some(next)) => {
                    piece.from = next;
                    self.pieces.push_front(piece);
                }
                Ok(None) if piece.table + 1 < PACKED.len() => {
                    self.pieces.push_front(Piece { run: piece.run, table: piece.table + 1, from: String::new() });
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(
                    event = "store_pack_failed", run = %piece.run, error = %e, "a run's journal rows were not packed"
                ),
            }
            return None;
        }
        if !may_compact {
            return None;
        }
        let written = self.compact.take()?;
        let Some(path) = path else { return Some(written) };
        if !settled() {
            return Some(written);
        }
        match compact_if_worthwhile(cell, path, written) {
            Ok(Some((before, after))) => {
                tracing::info!(event = "store_compacted", before, after, "store compacted as it settled");
                None
            }
            Ok(None) => Some(written),
            Err(e) => {
                tracing::warn!(event = "store_compact_failed", error = %e, "the settled store was not compacted");
                Some(written)
            }
        }
    }
}

/// Compact the file at `path` when [`worthwhile`] and `written` bytes of rows since the last
/// compaction are at least an eighth of it: its length before and after, or `None` when not
/// or the database stayed busy.
fn compact_if_worthwhile(cell: &DbCell, path: &Path, written: u64) -> Result<Option<(u64, u64)>, StoreError> {
    let length = |path: &Path| {
        std::fs::metadata(path)
            .map(|m| m.len())
            .map_err(|e| StoreError::File { path: PathBuf::from(path), source: std::sync::Arc::new(e) })
    };
    let before = length(path)?;
    if written.saturating_mul(8) < before {
        return Ok(None);
    }
    let allocated = {
        let db = cell.get();
        let txn = db.begin_write()?;
        let pages = txn.stats()?;
        let bytes = pages.allocated_pages().saturating_mul(pages.page_size() as u64);
        txn.abort()?;
        bytes
    };
    if !worthwhile(before, before.saturating_sub(allocated)) {
        return Ok(None);
    }
    if !compact_held(cell, SETTLE_COMPACT_TRIES)? {
        return Ok(None);
    }
    Ok(Some((before, length(path)?)))
}

/// Rewrite run `run`'s step and agent rows in key order, packed into full leaves, piece by
/// piece ([`pack_piece`]) as [`Packing`] does between commits.
#[cfg(test)]
fn pack_run(db: &Database, dictionaries: &Dictionaries, run: &str) -> Result<(), StoreError> {
    for table in PACKED {
        let mut from = String::new();
        while let Some(next) = pack_piece(db, dictionaries, table, run, &from)? {
            from = next;
        }
    }
    Ok(())
}

/// Train the store's first dictionary from the values of `run` (see the module's doc),
/// store it, and hold it in `dictionaries`: its ID and size, or `None` when the run has too
/// few values to learn from.
fn train(db: &Database, dictionaries: &Dictionaries, run: &str) -> Result<Option<(u32, usize)>, StoreError> {
    let end = format!("{run}\0");
    let mut samples: Vec<Vec<u8>> = Vec::new();
    let mut bytes = 0usize;
    {
        let txn = db.begin_read()?;
        for (agent, table) in [(true, AGENTS), (false, STEPS)] {
            let rows = txn.open_table(table)?;
            for row in rows.range((run, "")..(end.as_str(), ""))? {
                if bytes >= SAMPLE_BYTES {
                    break;
                }
                let (_, value) = row?;
                let stored = match agent {
                    true => super::rows::agent_parts(value.value()).ok().filter(|p| p.1 == 1).map(|p| p.2),
                    false => super::rows::step_parts(value.value()).ok().map(|p| p.1),
                };
                // A value that does not decode is no sample (its row fails where it is read).
                let Some(raw) = stored.and_then(|s| codec::decode_with(s, Some(dictionaries)).ok()) else { continue };
                if raw.len() < codec::RAW_BELOW {
                    continue;
                }
                let kept = &raw[..raw.len().min(SAMPLE_VALUE_BYTES).min(SAMPLE_BYTES - bytes)];
                bytes += kept.len();
                samples.push(kept.to_vec());
            }
        }
    }
    if samples.len() < MIN_SAMPLES {
        return Ok(None);
    }
    let txn = db.begin_write()?;
    let (id, dictionary) = {
        let mut table = txn.open_table(DICTIONARIES)?;
        let last = table.last()?.map(|(key, _)| key.value().0);
        let next = last.map_or(FIRST_DICTIONARY_ID, |id| id.saturating_add(1).max(FIRST_DICTIONARY_ID));
        let id = NonZeroU32::new(next).unwrap_or(NonZeroU32::MIN);
        let samples: Vec<&[u8]> = samples.iter().map(Vec::as_slice).collect();
        // Samples too few or too alike to learn from: the store goes on without.
        let dictionary = match codec::train(&samples, DICTIONARY_BYTES, id) {
            Ok(dictionary) => dictionary,
            Err(e) => {
                tracing::warn!(event = "store_dictionary_failed", run, error = %e, "no compression dictionary was trained");
                return Ok(None);
            }
        };
        for (at, piece) in dictionary.chunks(DICTIONARY_PIECE_BYTES).enumerate() {
            table.insert((id.get(), at as u32), piece)?;
        }
        (id.get(), dictionary)
    };
    txn.commit()?;
    // Committed before any row names it. One zstd cannot prepare is stored and never used.
    match dictionaries.add(id, &dictionary) {
        Ok(()) => Ok(Some((id, dictionary.len()))),
        Err(e) => {
            tracing::warn!(event = "store_dictionary_failed", run, error = %e, "the trained dictionary is not used");
            Ok(None)
        }
    }
}

/// Pack the rows of `run` from key `from` on, up to [`PACK_PIECE_BYTES`], in one
/// transaction: they are read, deleted and inserted again through a cursor at the gap they
/// left (redb packs a cursor's ascending inserts into full leaves), the same rows and keys as
/// before, their values compressed with the newest of `dictionaries` when they were not
/// ([`recode`](super::rows::recode)). The key of the first row left for the next piece, if
/// any.
fn pack_piece(
    db: &Database,
    dictionaries: &Dictionaries,
    table: TableDefinition<(&str, &str), &[u8]>,
    run: &str,
    from: &str,
) -> Result<Option<String>, StoreError> {
    // Every key of the run sorts before (run id + NUL, "").
    let end = format!("{run}\0");
    let txn = db.begin_write()?;
    let rest = {
        let mut rows = txn.open_table(table)?;
        let mut piece: Vec<(String, Vec<u8>)> = Vec::new();
        let mut bytes = 0usize;
        let mut rest = None;
        let agent = redb::TableHandle::name(&table) == redb::TableHandle::name(&AGENTS);
        let mut recoded = Vec::new();
        for row in rows.range((run, from)..(end.as_str(), ""))? {
            let (key, value) = row?;
            let (_, key) = key.value();
            if bytes >= PACK_PIECE_BYTES {
                rest = Some(key.to_string());
                break;
            }
            bytes += key.len() + value.value().len();
            // A row whose value cannot be read again is kept as it is (it fails where it is read).
            let row = match super::rows::recode(agent, value.value(), dictionaries, &mut recoded) {
                Ok(true) => recoded.clone(),
                _ => value.value().to_vec(),
            };
            piece.push((key.to_string(), row));
        }
        if piece.is_empty() {
            return Ok(None);
        }
        match &rest {
            Some(next) => rows.retain_in((run, from)..(run, next.as_str()), |_, _| false)?,
            None => rows.retain_in((run, from)..(end.as_str(), ""), |_, _| false)?,
        }
        let mut cursor = rows.lower_bound_mut(Bound::Included((run, from)))?;
        for (key, value) in &piece {
            cursor.insert_before((run, key.as_str()), value.as_slice())?;
        }
        cursor.close()?;
        rest
    };
    txn.commit()?;
    Ok(rest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::ReadableTableMetadata;

    fn rows(db: &Database, run: &str) -> Vec<(String, Vec<u8>)> {
        let txn = db.begin_read().expect("a read");
        let table = txn.open_table(AGENTS).expect("the table");
        let end = format!("{run}\0");
        let rows: Vec<_> = table
            .range((run, "")..(end.as_str(), ""))
            .expect("a range")
            .map(|row| {
                let (k, v) = row.expect("a row");
                (k.value().1.to_string(), v.value().to_vec())
            })
            .collect();
        rows
    }

    #[test]
    fn a_packed_run_keeps_its_rows_in_fewer_leaves_and_its_neighbours_untouched() {
        let db = Database::builder().create_with_backend(redb::backends::InMemoryBackend::new()).expect("a database");
        // Two runs written at once, 1,200-byte rows under hash-like keys, 64 a commit.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20 {
            let txn = db.begin_write().expect("a write");
            {
                let mut table = txn.open_table(AGENTS).expect("the table");
                for i in 0..64u32 {
                    let run = if i % 2 == 0 { "run-a" } else { "run-b" };
                    let key = format!("{:016x}{:016x}", next(), next());
                    let value = vec![(i % 251) as u8; 1200];
                    table.insert((run, key.as_str()), value.as_slice()).expect("a row");
                }
            }
            txn.commit().expect("a commit");
        }
        let leaves = |db: &Database| {
            let txn = db.begin_read().expect("a read");
            let table = txn.open_table(AGENTS).expect("the table");
            (table.stats().expect("stats").leaf_pages(), table.len().expect("len"))
        };
        let (a, b) = (rows(&db, "run-a"), rows(&db, "run-b"));
        let (before, count) = leaves(&db);
        pack_run(&db, &Dictionaries::default(), "run-a").expect("packed");
        assert_eq!(rows(&db, "run-a"), a, "the same rows, in the same order");
        assert_eq!(rows(&db, "run-b"), b, "the neighbour's rows untouched");
        let (after, after_count) = leaves(&db);
        assert_eq!(after_count, count);
        // 640 rows of run a, three to a 4 KiB leaf: 214 leaves where they took some 268
        // (measured: 536 leaves for both runs before, 483 after).
        assert!(after + 45 <= before, "{before} leaves before, {after} after");
        // A second pack changes nothing.
        pack_run(&db, &Dictionaries::default(), "run-a").expect("packed again");
        assert_eq!(rows(&db, "run-a"), a);
        assert_eq!(leaves(&db).0, after);
    }

    #[test]
    fn a_run_is_packed_in_pieces_when_its_rows_are_many() {
        let db = Database::builder().create_with_backend(redb::backends::InMemoryBackend::new()).expect("a database");
        let txn = db.begin_write().expect("a write");
        {
            let mut table = txn.open_table(AGENTS).expect("the table");
            // Over two pieces' worth: 9,000 rows of 1 KiB.
            for i in 0..9000u32 {
                let key = format!("{:08x}", i.wrapping_mul(2_654_435_761));
                table.insert(("run", key.as_str()), vec![1u8; 1024].as_slice()).expect("a row");
            }
        }
        txn.commit().expect("a commit");
        let before = rows(&db, "run");
        pack_run(&db, &Dictionaries::default(), "run").expect("packed");
        assert_eq!(rows(&db, "run"), before);
    }

    #[test]
    fn the_first_packed_run_trains_the_dictionary_its_rows_are_written_again_with() {
        let db = Database::builder().create_with_backend(redb::backends::InMemoryBackend::new()).expect("a database");
        let words = [
            "the", "review", "found", "nothing", "to", "change", "in", "this", "file", "tests", "cover", "it", "a",
            "function", "returns", "an", "error", "when", "its", "input", "is", "empty",
        ];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let dictionaries = Dictionaries::default();
        let txn = db.begin_write().expect("a write");
        {
            // Every table exists, as a store's open makes sure.
            txn.open_table(STEPS).expect("the table");
            txn.open_table(DICTIONARIES).expect("the table");
            let mut agents = txn.open_table(AGENTS).expect("the table");
            let mut row = Vec::new();
            for i in 0..300u32 {
                let mut reply = String::from("\"");
                while reply.len() < 900 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    reply += words[(x % words.len() as u64) as usize];
                    reply.push(' ');
                }
                reply.push('"');
                let outcome = crate::store::journal::encode_outcome(Some(&reply));
                super::super::rows::encode_agent(u64::from(i), &outcome, &mut row, Some(&dictionaries));
                agents
                    .insert(("run", format!("{:08x}", i.wrapping_mul(2_654_435_761)).as_str()), row.as_slice())
                    .expect("a row");
            }
            // A failure and a short reply: kept as they are.
            let failure = crate::store::journal::encode_outcome(None);
            super::super::rows::encode_agent(300, &failure, &mut row, None);
            agents.insert(("run", "failure"), row.as_slice()).expect("a row");
        }
        txn.commit().expect("a commit");
        let before = rows(&db, "run");
        let decoded = |rows: &[(String, Vec<u8>)], d: &Dictionaries| -> Vec<_> {
            rows.iter()
                .map(|(k, v)| {
                    let (place, reply) = super::super::rows::decode_agent(v, Some(d)).expect("a row");
                    (k.clone(), place, reply.map(|r| r.into_owned()))
                })
                .collect()
        };
        let (id, bytes) = train(&db, &dictionaries, "run").expect("trained").expect("a dictionary");
        assert_eq!((id, dictionaries.encoder()), (FIRST_DICTIONARY_ID, Some(FIRST_DICTIONARY_ID)));
        assert!(bytes <= DICTIONARY_BYTES);
        pack_run(&db, &dictionaries, "run").expect("packed");
        let after = rows(&db, "run");
        assert_eq!(decoded(&after, &dictionaries), decoded(&before, &dictionaries), "the same keys, places, replies");
        let sum = |rows: &[(String, Vec<u8>)]| rows.iter().map(|(_, v)| v.len()).sum::<usize>();
        assert!(sum(&after) < sum(&before), "{} B of rows after, {} B before", sum(&after), sum(&before));
        assert!(after.iter().filter(|(k, _)| k != "failure").all(|(_, v)| codec::dictionary_of(&v[9..]) == Some(id)));
        // The dictionary is stored: a store opened again reads the rows.
        let reopened = super::super::open::dictionaries(&db).expect("the dictionaries");
        assert_eq!(reopened.ids(), vec![id]);
        assert_eq!(decoded(&after, &reopened), decoded(&before, &dictionaries));
        // Without it, a row is a typed error, not a panic.
        let lacking = Dictionaries::default();
        assert!(matches!(
            super::super::rows::decode_agent(&after[0].1, Some(&lacking)),
            Err(super::super::rows::BadRow::Shared(crate::store::shared::SharedError::Codec(codec::CodecError::MissingDictionary(found)))) if found == id
        ));
        // A run with too few values to learn from trains none.
        assert_eq!(train(&db, &Dictionaries::default(), "other").expect("nothing to train from"), None);
    }

    #[test]
    fn a_store_settles_when_its_last_executing_run_stops() {
        let mut settle = Settle::default();
        settle.run_written("a", true);
        settle.run_written("b", true);
        settle.rows_written("a", PACK_MIN_BYTES);
        settle.rows_written("b", 10);
        settle.run_written("a", false);
        assert!(settle.has_work());
        let a = vec!["a".to_string()];
        assert_eq!(settle.take(), Work { packs: a, settled: None }, "a is packed; b still executes");
        assert!(!settle.has_work());
        settle.run_written("b", false);
        let written = PACK_MIN_BYTES + 10;
        assert_eq!(
            settle.take(),
            Work { packs: vec![], settled: Some(written) },
            "b wrote too little to pack; nothing executes now"
        );
        // Not compacted then: the rows count toward the next time. A run that stops again
        // without writing is not packed again.
        settle.not_compacted(written);
        settle.run_written("a", false);
        assert_eq!(settle.take(), Work { packs: vec![], settled: Some(written) });
        settle.run_written("a", false);
        assert_eq!(settle.take(), Work { packs: vec![], settled: Some(0) }, "compacted then: counted from 0");
    }

    #[test]
    fn a_run_that_executes_again_before_its_work_is_taken_is_packed_at_its_next_stop() {
        let mut settle = Settle::default();
        settle.run_written("a", true);
        settle.rows_written("a", PACK_MIN_BYTES);
        settle.run_written("a", false);
        // Resumed before the writer took the work: neither packed nor compacted under it.
        settle.run_written("a", true);
        assert_eq!(settle.take(), Work { packs: vec![], settled: None });
        settle.rows_written("a", 10);
        settle.run_written("a", false);
        let a = vec!["a".to_string()];
        assert_eq!(settle.take(), Work { packs: a, settled: Some(PACK_MIN_BYTES + 10) }, "its rows of both attempts");
    }
}
