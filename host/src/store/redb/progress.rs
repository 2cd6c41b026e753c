//! Reading a run's progress from the redb store: a page of entries (forwards after a seq,
//! backwards before one or from the tail, optionally one phase's), each given the title of
//! its phase (entries store the seq of the entry that set it, resolved once per read), and
//! the run's last seq.

use super::tables::PROGRESS;
use super::RedbStore;
use crate::model::progress::ProgressEntry;
use crate::store::records::{decode_progress, phase_title, title_set_by, PhaseTitle};
use crate::store::{ProgressQuery, StoreError};
use redb::ReadableDatabase;
use std::collections::HashMap;

impl RedbStore {
    /// Progress entries of a run, paged (see [`ProgressQuery`]), in ascending seq order.
    pub(super) fn read_progress(&self, run_id: &str, query: &ProgressQuery) -> Result<Vec<ProgressEntry>, StoreError> {
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
            let mut stored = decode_progress(bytes)?;
            let phase = match phase_title(&mut stored) {
                PhaseTitle::Known(title) => title,
                PhaseTitle::SetAt(at) => match titles.get(&at) {
                    Some(title) => title.clone(),
                    None => {
                        let title = match table.get((run_id, at))? {
                            Some(row) => title_set_by(row.value())?,
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
    pub(super) fn read_last_progress_seq(&self, run_id: &str) -> Result<u64, StoreError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(PROGRESS)?;
        let last = table.range((run_id, 0)..=(run_id, u64::MAX))?.next_back();
        Ok(match last {
            Some(row) => row?.0.value().1,
            None => 0,
        })
    }
}
