//! What opening a redb store does before anything reads it: create every table, check the
//! schema version (a schema 1 or 2 store has its step rows moved to schema 3's table, each
//! with no place; a store of 1 to 4 is marked 5, its raw values and its rows read as they are), and repair what a crash
//! left — runs that were `running` become `halted` ([`halt_interrupted`]), with the spend
//! recorded up to the last commit.

use super::tables::*;
use crate::model::envelope::RunStatus;
use crate::store::records::halt_interrupted;
use crate::store::{corrupt, RunRecord, StoreError};
use redb::{Database, ReadableTable, WriteTransaction};

/// Create the tables, check the schema version, and halt the runs a crash left running.
/// Returns the next run creation seq.
pub(super) fn prepare(db: &Database) -> Result<u64, StoreError> {
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
            // Schema 1's progress rows (one entry each) and schema 2's agent rows (no place)
            // read as they are; their step rows move, in the same transaction.
            Some(1 | 2) => {
                move_steps_v2(&txn)?;
                meta.insert("schema_version", SCHEMA_VERSION)?;
            }
            // Schema 3's values are raw, which the value codec reads as they are: only the
            // mark changes (an older build then refuses the store, whose values it could not
            // read).
            // Schema 4's rows hold no reference to a shared value: only the mark changes (an
            // older build then refuses the store, whose references it could not read).
            Some(3 | 4) => {
                meta.insert("schema_version", SCHEMA_VERSION)?;
            }
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
        txn.open_table(RUN_MODULES)?;
        txn.open_table(JOURNAL_VALUES)?;
        txn.open_table(JOURNAL_VALUE_REFS)?;
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
            if !matches!(record.envelope.status, RunStatus::Running | RunStatus::Pending) {
                continue;
            }
            let accounting = match live.get(id.value())? {
                Some(acc) => Some(
                    crate::store::journal::decode_live_accounting(acc.value()).map_err(|e| corrupt("accounting", e))?,
                ),
                None => None,
            };
            if halt_interrupted(&mut record, accounting) {
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

/// Move schema 2's step rows into [`STEPS`], each with place 0 (journaled before anything
/// this build writes), and delete their table.
fn move_steps_v2(txn: &WriteTransaction) -> Result<(), StoreError> {
    {
        let old = txn.open_table(STEPS_V2)?;
        let mut new = txn.open_table(STEPS)?;
        let mut row = Vec::new();
        for entry in old.iter()? {
            let (key, value) = entry?;
            let (run, step) = key.value();
            super::rows::encode_step(0, value.value(), &mut row);
            new.insert((run, step), row.as_slice())?;
        }
    }
    txn.delete_table(STEPS_V2)?;
    Ok(())
}
