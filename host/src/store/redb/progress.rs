//! A run's progress in the redb store: how entries are grouped into rows, and reading a page
//! of them (forwards after a seq, backwards before one or from the tail, optionally one
//! phase's), each given the title of its phase (entries store the seq of the entry that set
//! it, resolved once per read), and the run's last seq.
//!
//! A row holds the entries of one run that one commit wrote, up to [`CHUNK_ENTRIES`] entries
//! or [`CHUNK_BYTES`] bytes, and is keyed by the seq of its last entry, so the row holding a
//! seq is the first at or after it. A row of one entry is that entry's JSON (as schema 1 wrote
//! every entry); a row of several is a chunk: the byte [`CHUNK_TAG`] (JSON starts with `{`),
//! then per entry its seq (u64, little-endian), its length (u32, little-endian) and its JSON.
//! One B-tree insert per chunk instead of per entry is most of what a journaled `log` costs the
//! writer thread. Since schema 4 a row is stored in the [`codec`](crate::store::codec)'s form
//! (a chunk's repeated field names compress well); rows written before read as they are.

use super::tables::PROGRESS;
use super::RedbStore;
use crate::model::progress::ProgressEntry;
use crate::store::records::{decode_progress, phase_title, title_set_by, PhaseTitle};
use crate::store::{corrupt, ProgressQuery, StoreError};
use redb::{ReadOnlyTable, ReadableDatabase};
use std::collections::HashMap;

/// At most this many entries share a row.
pub(super) const CHUNK_ENTRIES: usize = 1024;
/// A row takes no further entry once it holds this many bytes (one entry may be larger): a
/// row and its key fit one 16 KiB redb page. A leaf of one value over a page takes the next
/// size up, so a row just over 4 KiB (64 log lines) took 8 KiB and one of 16 KiB took 32.
pub(super) const CHUNK_BYTES: usize = (16 << 10) - 512;
/// The first byte of a row of several entries.
const CHUNK_TAG: u8 = 0;
/// Bytes before each entry of a chunk: its seq and its length.
const ENTRY_HEADER: usize = 12;

/// The entries of one run that one commit writes, gathered into rows ([`Chunk::must_close`]
/// says when the gathered row must be written before the next entry joins).
#[derive(Default)]
pub(super) struct Chunk {
    bytes: Vec<u8>,
    entries: usize,
    last: u64,
}

impl Chunk {
    /// Whether the entry `seq` of `len` bytes starts a new row: this one is full, or `seq`
    /// does not follow its last entry.
    pub(super) fn must_close(&self, seq: u64, len: usize) -> bool {
        self.entries > 0 && (self.entries >= CHUNK_ENTRIES || self.bytes.len() + len > CHUNK_BYTES || seq <= self.last)
    }

    /// Add the entry `seq`.
    pub(super) fn push(&mut self, seq: u64, entry: &[u8]) {
        if self.entries == 0 {
            self.bytes.clear();
            self.bytes.push(CHUNK_TAG);
        }
        self.bytes.extend_from_slice(&seq.to_le_bytes());
        // An entry is bounded far below 4 GiB; one over `CHUNK_BYTES` is alone in its row, which
        // is then its JSON alone (see `take`), its length never read.
        self.bytes.extend_from_slice(&u32::try_from(entry.len()).unwrap_or(u32::MAX).to_le_bytes());
        self.bytes.extend_from_slice(entry);
        self.entries += 1;
        self.last = seq;
    }

    /// The row gathered so far (its key seq and its value), and empty the chunk; `None` when it
    /// holds no entry.
    pub(super) fn take(&mut self) -> Option<(u64, &[u8])> {
        let entries = std::mem::take(&mut self.entries);
        match entries {
            0 => None,
            // A lone entry is stored as its JSON, as schema 1 stored every entry.
            1 => Some((self.last, &self.bytes[1 + ENTRY_HEADER..])),
            _ => Some((self.last, &self.bytes)),
        }
    }
}

/// A stored progress row, decoded.
fn decoded(stored: &[u8]) -> Result<std::borrow::Cow<'_, [u8]>, StoreError> {
    crate::store::codec::decode(stored).map_err(|e| corrupt("progress", e))
}

/// The entries of the progress row keyed `key` (decoded), in seq order: `(seq, JSON)`.
fn entries(key: u64, row: &[u8]) -> Result<Vec<(u64, &[u8])>, StoreError> {
    let Some((&CHUNK_TAG, mut rest)) = row.split_first() else {
        return Ok(vec![(key, row)]);
    };
    let mut out = Vec::new();
    while !rest.is_empty() {
        let (header, tail) = rest
            .split_at_checked(ENTRY_HEADER)
            .ok_or_else(|| corrupt("progress", "a chunk entry's header is cut short"))?;
        let (seq, len) = header.split_at(8);
        let seq = u64::from_le_bytes(seq.try_into().map_err(|_| corrupt("progress", "a chunk entry's seq"))?);
        let len =
            u32::from_le_bytes(len.try_into().map_err(|_| corrupt("progress", "a chunk entry's length"))?) as usize;
        let (entry, tail) =
            tail.split_at_checked(len).ok_or_else(|| corrupt("progress", "a chunk entry is cut short"))?;
        out.push((seq, entry));
        rest = tail;
    }
    if out.last().map(|(seq, _)| *seq) != Some(key) {
        return Err(corrupt("progress", format!("the chunk keyed {key} does not end with that seq")));
    }
    Ok(out)
}

/// The JSON of entry `seq` of `run_id`, if it is stored.
fn entry_at(
    table: &ReadOnlyTable<(&'static str, u64), &'static [u8]>,
    run_id: &str,
    seq: u64,
) -> Result<Option<Vec<u8>>, StoreError> {
    let Some(row) = table.range((run_id, seq)..=(run_id, u64::MAX))?.next() else {
        return Ok(None);
    };
    let (key, value) = row?;
    let row = decoded(value.value())?;
    Ok(entries(key.value().1, &row)?.into_iter().find(|(s, _)| *s == seq).map(|(_, bytes)| bytes.to_vec()))
}

impl RedbStore {
    /// Progress entries of a run, paged (see [`ProgressQuery`]), in ascending seq order.
    pub(super) fn read_progress(&self, run_id: &str, query: &ProgressQuery) -> Result<Vec<ProgressEntry>, StoreError> {
        let txn = self.db.get().begin_read()?;
        let table = txn.open_table(PROGRESS)?;
        let limit = query.limit();
        let lo = query.after_seq.map_or(0, |s| s.saturating_add(1));
        let hi = query.before_seq.map_or(u64::MAX, |s| s.saturating_sub(1));
        if lo > hi || query.before_seq == Some(0) {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        let keep = |entry: &ProgressEntry| query.phase.as_deref().is_none_or(|p| entry.phase.as_deref() == Some(p));
        // Phase titles by the seq of the entry that set them, resolved once per read.
        let mut titles: HashMap<u64, Option<String>> = HashMap::new();
        let mut resolve = |bytes: &[u8]| -> Result<ProgressEntry, StoreError> {
            let mut stored = decode_progress(bytes)?;
            let phase = match phase_title(&mut stored) {
                PhaseTitle::Known(title) => title,
                PhaseTitle::SetAt(at) => match titles.get(&at) {
                    Some(title) => title.clone(),
                    None => {
                        let title = match entry_at(&table, run_id, at)? {
                            Some(bytes) => title_set_by(&bytes)?,
                            None => None,
                        };
                        titles.insert(at, title.clone());
                        title
                    }
                },
            };
            Ok(ProgressEntry { seq: stored.seq, at_ms: stored.at_ms, phase, event: stored.event })
        };
        // Forward from `after_seq`; otherwise backward from `before_seq` or the tail. An
        // entry before the window (in the direction read) is skipped, one past it ends the
        // page, as does a full page (`true`: stop).
        let forward = query.after_seq.is_some();
        let mut page = |seq: u64, bytes: &[u8]| -> Result<bool, StoreError> {
            let (before, past) = if forward { (seq < lo, seq > hi) } else { (seq > hi, seq < lo) };
            if past || before {
                return Ok(past);
            }
            let entry = resolve(bytes)?;
            if keep(&entry) {
                out.push(entry);
            }
            Ok(out.len() >= limit)
        };
        // Rows are keyed by their last seq: the first row holding `lo` is the first keyed at or
        // after it, the last holding `hi` the first keyed at or after `hi`.
        if forward {
            'rows: for row in table.range((run_id, lo)..=(run_id, u64::MAX))? {
                let (key, value) = row?;
                let row = decoded(value.value())?;
                for (seq, bytes) in entries(key.value().1, &row)? {
                    if page(seq, bytes)? {
                        break 'rows;
                    }
                }
            }
        } else {
            let end = match table.range((run_id, hi)..=(run_id, u64::MAX))?.next() {
                Some(row) => row?.0.value().1,
                None => hi,
            };
            'rows: for row in table.range((run_id, lo)..=(run_id, end))?.rev() {
                let (key, value) = row?;
                let row = decoded(value.value())?;
                for (seq, bytes) in entries(key.value().1, &row)?.into_iter().rev() {
                    if page(seq, bytes)? {
                        break 'rows;
                    }
                }
            }
            out.reverse();
        }
        Ok(out)
    }

    /// The highest progress seq of a run (0 when it has none): the key of its last row.
    pub(super) fn read_last_progress_seq(&self, run_id: &str) -> Result<u64, StoreError> {
        let txn = self.db.get().begin_read()?;
        let table = txn.open_table(PROGRESS)?;
        let last = table.range((run_id, 0)..=(run_id, u64::MAX))?.next_back();
        Ok(match last {
            Some(row) => row?.0.value().1,
            None => 0,
        })
    }
}
