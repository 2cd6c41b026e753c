//! The redb store as a [`Journal`]: puts go to the group-commit [`writer`](super::writer)
//! (step and agent values readable from its pending map at once), reads look there first and
//! then in one read transaction; [`Journal::load`] reads a run's contiguous key ranges, on a
//! blocking thread.

use super::rows::{agent_parts, decode_agent, step_parts, text, BadRow};
use super::tables::*;
use super::values::resolve;
use super::RedbStore;
use crate::model::envelope::Accounting;
use crate::store::codec::Dictionaries;
use crate::store::journal::{AgentOutcome, Journal, JournalError, JournalSnapshot, LoadingEntries};
use crate::store::op::Op;
use crate::store::shared;
use crate::store::{corrupt, StoreError};
use futures::future::{ready, BoxFuture, FutureExt};
use redb::{Database, ReadableDatabase};

impl RedbStore {
    /// Queue the running attempt's accounting (so a crash loses no recorded spend).
    fn put_live_accounting(&self, run_id: &str, accounting: &Accounting) -> Result<(), StoreError> {
        self.writer.send(Op::accounting(run_id, accounting))
    }

    /// The journal of `run_id` as an attempt starts from it (see [`Journal::load`]).
    fn load_journal(
        db: &Database,
        dictionaries: &Dictionaries,
        run_id: &str,
        value_bytes: usize,
    ) -> Result<JournalSnapshot, StoreError> {
        let txn = db.begin_read()?;
        let journal_bytes = txn.open_table(JOURNAL_USAGE)?.get(run_id)?.map_or(0, |v| v.value());
        // What the run journaled bounds the bytes of its keys and values (each entry is
        // counted at least at its size): the buffers are set aside once, not grown by
        // doubling and copied, and cut down to what was loaded.
        let bound = usize::try_from(journal_bytes).unwrap_or(usize::MAX).min(value_bytes);
        let mut room = value_bytes;
        // The run's cache keeps no value over a quarter of its bytes: loading one is waste.
        let largest = value_bytes / 4;
        let mut loading = LoadingEntries::steps();
        loading.reserve(0, bound);
        // Shared values are read in the same transaction, a lookup by hash each.
        let shared_values = txn.open_table(JOURNAL_VALUES)?;
        let steps = txn.open_table(STEPS)?;
        let bad = |e: BadRow| corrupt("step journal", e);
        for row in steps.range((run_id, "")..)? {
            let (key, value) = row?;
            let (run, step) = key.value();
            if run != run_id {
                break;
            }
            // A value's bytes are its key's and its JSON text's (decoded), not its place's.
            // A value that cannot be decoded (or a shared one that cannot be read) is left
            // unloaded: the replay that asks for it fails with the typed error, as one whose
            // text is not UTF-8 does.
            let (place, stored) = step_parts(value.value()).map_err(bad)?;
            let size = shared::decoded_len(stored).map(|n| step.len().saturating_add(n));
            match size {
                Ok(size) if size <= room && size <= largest => {
                    match resolve(&shared_values, stored, Some(dictionaries))? {
                        Ok(json) => {
                            room -= size;
                            // Its text is checked as UTF-8 where a replay reads it.
                            loading.value(step, &[&json], place);
                        }
                        Err(_) => loading.key(step),
                    }
                }
                _ => loading.key(step),
            }
        }
        let steps = loading.finish();
        let mut loading = LoadingEntries::agents();
        loading.reserve(0, bound.min(room));
        let agents = txn.open_table(AGENTS)?;
        let bad = |e: BadRow| corrupt("agent journal", e);
        for row in agents.range((run_id, "")..)? {
            let (key, value) = row?;
            let (run, agent) = key.value();
            if run != run_id {
                break;
            }
            // An outcome's bytes are its key's, 1 and its reply's (decoded; none for a
            // failure), not its place's.
            let (place, tag, stored) = agent_parts(value.value()).map_err(bad)?;
            let size = shared::decoded_len(stored).map(|n| agent.len().saturating_add(1).saturating_add(n));
            match size {
                Ok(size) if size <= room && size <= largest => {
                    match resolve(&shared_values, stored, Some(dictionaries))? {
                        Ok(json) => {
                            room -= size;
                            // Kept in `encode_outcome`'s form, its reply checked as UTF-8 where a
                            // replay decodes it.
                            loading.value(agent, &[&[tag], &json], place);
                        }
                        Err(_) => loading.key(agent),
                    }
                }
                _ => loading.key(agent),
            }
        }
        let snapshot = JournalSnapshot { steps, agents: loading.finish(), agents_listed: true, journal_bytes };
        Ok(snapshot)
    }

    fn get_step_value(&self, run_id: &str, key: &str) -> Result<Option<String>, StoreError> {
        if let Some(value) = self.writer.pending().step(run_id, key) {
            return Ok(Some(value.to_string()));
        }
        let txn = self.db.get().begin_read()?;
        let steps = txn.open_table(STEPS)?;
        let Some(row) = steps.get((run_id, key))? else { return Ok(None) };
        let bad = |e: BadRow| corrupt("step journal", e);
        let (_, stored) = step_parts(row.value()).map_err(bad)?;
        let json = read_value(&txn, stored, &self.dictionaries)?.map_err(BadRow::from).map_err(bad)?;
        Ok(Some(text(json).map_err(bad)?.into_owned()))
    }

    fn get_agent_outcome(&self, run_id: &str, key: &str) -> Result<Option<Option<String>>, StoreError> {
        let pending = self.writer.pending().agent(run_id, key).cloned();
        // A queued outcome is in `encode_outcome`'s form, which is also a row of schema 2.
        let decode = |bytes: &[u8]| match decode_agent(bytes, Some(&self.dictionaries)) {
            Ok((_, outcome)) => Ok(outcome.map(|o| o.into_owned())),
            Err(e) => Err(corrupt("agent journal", e)),
        };
        if let Some(bytes) = pending {
            return decode(&bytes).map(Some);
        }
        let txn = self.db.get().begin_read()?;
        let agents = txn.open_table(AGENTS)?;
        let Some(row) = agents.get((run_id, key))? else { return Ok(None) };
        let bad = |e: BadRow| corrupt("agent journal", e);
        match agent_parts(row.value()).map_err(bad)? {
            (_, 0, _) => Ok(Some(None)),
            (_, _, stored) => {
                let json = read_value(&txn, stored, &self.dictionaries)?.map_err(BadRow::from).map_err(bad)?;
                Ok(Some(Some(text(json).map_err(bad)?.into_owned())))
            }
        }
    }
}

/// A row's stored value as JSON text bytes: decoded (with the store's `dictionaries`) when inline, read from the shared values
/// (opened only then) when a reference.
fn read_value<'a>(
    txn: &redb::ReadTransaction,
    stored: &'a [u8],
    dictionaries: &Dictionaries,
) -> Result<Result<std::borrow::Cow<'a, [u8]>, shared::SharedError>, StoreError> {
    if !shared::is_reference(stored) {
        return Ok(shared::decode_inline(stored, Some(dictionaries)));
    }
    resolve(&txn.open_table(JOURNAL_VALUES)?, stored, Some(dictionaries))
}

fn journal_error(e: StoreError) -> JournalError {
    JournalError::new(e)
}

impl Journal for RedbStore {
    fn load<'a>(&'a self, run_id: &'a str, value_bytes: usize) -> BoxFuture<'a, Result<JournalSnapshot, JournalError>> {
        // On a thread of tokio's blocking pool: a large journal takes a while to read, and the
        // runtime's worker meanwhile serves others (and the attempt's start record is being
        // committed by the writer thread at the same time).
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            let loaded = Self::load_journal(&self.db.get(), &self.dictionaries, run_id, value_bytes);
            return ready(loaded.map_err(journal_error)).boxed();
        };
        let (db, dictionaries, run_id) = (self.db.get(), self.dictionaries.clone(), run_id.to_string());
        let loading = runtime.spawn_blocking(move || Self::load_journal(&db, &dictionaries, &run_id, value_bytes));
        async move {
            match loading.await {
                Ok(loaded) => loaded.map_err(journal_error),
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(_) => Err(journal_error(StoreError::Closed)),
            }
        }
        .boxed()
    }

    fn get_step<'a>(&'a self, run_id: &'a str, key: &'a str) -> BoxFuture<'a, Result<Option<String>, JournalError>> {
        ready(self.get_step_value(run_id, key).map_err(journal_error)).boxed()
    }

    fn get_agent<'a>(
        &'a self,
        run_id: &'a str,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<Option<String>>, JournalError>> {
        ready(self.get_agent_outcome(run_id, key).map_err(journal_error)).boxed()
    }

    fn footprint(&self, key_bytes: usize, value_bytes: usize) -> u64 {
        crate::store::footprint::entry_bytes(key_bytes, value_bytes)
    }

    fn put_step(&self, run_id: &str, key: &str, value: &str, journal_bytes: u64) -> Result<(), JournalError> {
        self.writer.send(Op::step(run_id, key, value, journal_bytes)).map_err(journal_error)
    }

    fn put_agent(
        &self,
        run_id: &str,
        key: &str,
        outcome: Option<&str>,
        journal_bytes: u64,
    ) -> Result<(), JournalError> {
        self.writer.send(Op::agent(run_id, key, outcome, journal_bytes)).map_err(journal_error)
    }

    fn put_progress(&self, run_id: &str, seq: u64, entry: Vec<u8>, journal_bytes: u64) -> Result<(), JournalError> {
        self.writer.send(Op::progress(run_id, seq, entry, journal_bytes)).map_err(journal_error)
    }

    fn put_accounting(&self, run_id: &str, accounting: &Accounting) -> Result<(), JournalError> {
        self.put_live_accounting(run_id, accounting).map_err(journal_error)
    }

    fn put_agent_outcome(&self, run_id: &str, outcome: AgentOutcome<'_>) -> Result<(), JournalError> {
        let progress = outcome.progress.map(|(seq, entry, usage)| Op::progress(run_id, seq, entry, usage));
        let accounting = Op::accounting(run_id, outcome.accounting);
        let agent = outcome.agent.map(|(key, reply, usage)| Op::agent(run_id, key, reply, usage));
        self.writer.send_all([progress, Some(accounting), agent]).map_err(journal_error)
    }

    fn flush(&self) -> BoxFuture<'_, Result<(), JournalError>> {
        Box::pin(async move { self.writer.flush().await.map_err(journal_error) })
    }

    fn commit_soon(&self) {
        self.writer.commit_soon();
    }
}
