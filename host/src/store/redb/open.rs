//! What opening a redb store does before anything reads it: create every table, check the
//! schema version (a schema 1 or 2 store has its step rows moved to schema 3's table, each
//! with no place; a store of 1 to 4 is marked 5, its raw or per-value compressed values,
//! its rows and raw blobs read as they are), load the compression dictionaries
//! ([`dictionaries`]), and repair what a crash
//! left — runs that were `running` become `halted` ([`halt_interrupted`]), with the spend
//! recorded up to the last commit.

use super::tables::*;
use crate::model::envelope::RunStatus;
use crate::store::codec::{CodecError, Dictionaries, MAX_DICTIONARY_BYTES};
use crate::store::records::halt_interrupted;
use crate::store::{corrupt, RunRecord, StoreError};
use redb::{Database, ReadableDatabase, ReadableTable, WriteTransaction};

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
            // Schema 3's values are raw and schema 4's compressed per value, which the value
            // codec reads as they are; so are their raw blobs, and no row of theirs is a
            // reference to a shared value: only the mark changes (an older build then refuses
            // the store, whose values it could not read).
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
        txn.open_table(DICTIONARIES)?;
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
            super::rows::encode_step(0, value.value(), &mut row, None);
            new.insert((run, step), row.as_slice())?;
        }
    }
    txn.delete_table(STEPS_V2)?;
    Ok(())
}

/// The compression dictionaries the store holds, put together from their pieces (bounded by
/// [`MAX_DICTIONARY_BYTES`]) and prepared. One that cannot be is left out (logged): the rows
/// that name it fail alone, as corrupt records.
pub(super) fn dictionaries(db: &Database) -> Result<Dictionaries, StoreError> {
    let dictionaries = Dictionaries::default();
    let txn = db.begin_read()?;
    // The dictionary being put together: its ID, its bytes, and whether its pieces so far
    // are whole (in order from 0, within the bound).
    let mut current: Option<(u32, Vec<u8>, bool)> = None;
    let add = |(id, bytes, whole): (u32, Vec<u8>, bool)| {
        let added = if whole { dictionaries.add(id, &bytes) } else { Err(CodecError::BadDictionary(id)) };
        if let Err(e) = added {
            tracing::warn!("compression dictionary {id} cannot be used ({e}); left out");
        }
    };
    for row in txn.open_table(DICTIONARIES)?.iter()? {
        let (key, piece) = row?;
        let (id, at) = key.value();
        if current.as_ref().is_some_and(|(of, _, _)| *of != id) {
            current.take().map(add);
        }
        let (_, bytes, whole) = current.get_or_insert_with(|| (id, Vec::new(), true));
        *whole &= at as usize * DICTIONARY_PIECE_BYTES == bytes.len()
            && bytes.len() + piece.value().len() <= MAX_DICTIONARY_BYTES;
        if *whole {
            bytes.extend_from_slice(piece.value());
        }
    }
    current.take().map(add);
    Ok(dictionaries)
}
