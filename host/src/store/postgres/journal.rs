//! The PostgreSQL store as a [`Journal`]: puts go to the group-commit [`writer`](super::writer)
//! (step and agent values readable from its pending map at once); reads look there first,
//! then in the database. [`Journal::load`] reads a run's step and agent rows in key order (laid
//! out in journal order by their places),
//! fetching only the values that could fit the budget, and lists every agent key, so an
//! attempt asks the database only for a call that was journaled and did not fit.

use super::{pg, values, PgStore};
use crate::model::envelope::Accounting;
use crate::store::journal::{decode_outcome, Journal, JournalError, JournalSnapshot, LoadingEntries};
use crate::store::op::Op;
use crate::store::shared;
use crate::store::{corrupt, StoreError};
use futures::future::{BoxFuture, FutureExt};

fn journal_error(e: StoreError) -> JournalError {
    JournalError::new(e)
}

/// A stored key as text.
fn key_text(bytes: &[u8]) -> Result<&str, StoreError> {
    std::str::from_utf8(bytes).map_err(|e| corrupt("a journal key", e))
}

/// A step or agent row's place in its run's journal (its fourth column).
fn place(row: &tokio_postgres::Row) -> u64 {
    row.get::<_, i64>(3).max(0) as u64
}

/// Bytes a row takes beside its key and value: the tuple header and line pointer (28), the
/// values' length words, and the primary-key index entry's header (16). Rounded up.
const ROW_OVERHEAD: u64 = 64;

impl PgStore {
    fn load_journal(
        &self,
        run_id: &str,
        value_bytes: usize,
    ) -> BoxFuture<'static, Result<JournalSnapshot, StoreError>> {
        let (pool, run_id) = (self.pool.clone(), run_id.to_string());
        // The run's cache keeps no value over a quarter of its bytes: loading one is waste.
        let largest_bytes = value_bytes / 4;
        let largest = i64::try_from(largest_bytes).unwrap_or(i64::MAX);
        self.spawn(async move {
            let client = pool.get().await?;
            let e = |e| pg(&pool.url, e);
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&run_id, &largest];
            let steps = client.query(
                "SELECT key, octet_length(key)::int8 + octet_length(value), CASE WHEN octet_length(key)::int8 + octet_length(value) <= $2::int8 THEN value END, place
                 FROM steps WHERE run_id = $1 ORDER BY key",
                &params,
            );
            let agents = client.query(
                "SELECT key, octet_length(key)::int8 + octet_length(outcome), CASE WHEN octet_length(key)::int8 + octet_length(outcome) <= $2::int8 THEN outcome END, place
                 FROM agents WHERE run_id = $1 ORDER BY key",
                &params,
            );
            let usage = client.query_opt("SELECT bytes FROM journal_usage WHERE run_id = $1", &params[..1]);
            let (steps, agents, usage) = futures::join!(steps, agents, usage);
            let (steps, agents) = (steps.map_err(e)?, agents.map_err(e)?);
            let (mut loading_steps, mut loading_agents) = (LoadingEntries::steps(), LoadingEntries::agents());
            loading_steps.reserve(steps.len(), 0);
            loading_agents.reserve(agents.len(), 0);
            let mut room = value_bytes;
            // The sizes the query gives are the stored ones: a value is counted at its decoded
            // size (read from its frame's header, or its reference) against the room and the
            // largest loaded. One that cannot be decoded is left unloaded: the replay that asks
            // for it fails with the typed error. The shared values that fit are fetched after,
            // all in one query.
            let mut fits = |key: &str, extra: usize, stored: &[u8]| {
                let size = key.len().saturating_add(extra).saturating_add(shared::decoded_len(stored).ok()?);
                (size <= room && size <= largest_bytes).then(|| room -= size)
            };
            let mut wanted: Vec<Vec<u8>> = Vec::new();
            let mut step_rows = Vec::with_capacity(steps.len());
            for row in &steps {
                let key = key_text(row.get(0))?;
                let stored = row.get::<_, Option<&[u8]>>(2).filter(|stored| fits(key, 0, stored).is_some());
                wanted.extend(stored.and_then(values::hash_of));
                step_rows.push((key, stored, place(row)));
            }
            let mut agent_rows = Vec::with_capacity(agents.len());
            for row in &agents {
                let key = key_text(row.get(0))?;
                let stored = row.get::<_, Option<&[u8]>>(2);
                if stored.is_some_and(|outcome| !matches!(outcome, [0] | [1, ..])) {
                    return Err(corrupt("agent journal", crate::store::journal::UnknownOutcome));
                }
                // The outcome's tag, then its reply's stored form (none for a failure).
                let stored = stored.map(|outcome| (outcome[0], &outcome[1..])).filter(|(_, reply)| fits(key, 1, reply).is_some());
                wanted.extend(stored.and_then(|(_, reply)| values::hash_of(reply)));
                agent_rows.push((key, stored, place(row)));
            }
            wanted.sort();
            wanted.dedup();
            let kept = values::fetch(&client, &wanted).await.map_err(e)?;
            let kept_for = |stored: &[u8]| {
                shared::Reference::parse(stored).and_then(Result::ok).and_then(|r| kept.get(&r.hash)).map(Vec::as_slice)
            };
            for (key, stored, place) in step_rows {
                match stored.and_then(|stored| values::resolve(stored, kept_for(stored)).ok()) {
                    // Its text is checked as UTF-8 where a replay reads it.
                    Some(value) => loading_steps.value(key, &[&value], place),
                    None => loading_steps.key(key),
                }
            }
            for (key, stored, place) in agent_rows {
                match stored.and_then(|(tag, reply)| values::resolve(reply, kept_for(reply)).ok().map(|r| (tag, r))) {
                    // Its reply is checked as UTF-8 where a replay decodes it.
                    Some((tag, reply)) => loading_agents.value(key, &[&[tag], &reply], place),
                    None => loading_agents.key(key),
                }
            }
            Ok(JournalSnapshot {
                steps: loading_steps.finish(),
                agents: loading_agents.finish(),
                // Every agent key is listed, so a call never journaled needs no read.
                agents_listed: true,
                journal_bytes: usage.map_err(e)?.map_or(0, |row| row.get::<_, i64>(0).max(0) as u64),
            })
        })
    }
}

impl Journal for PgStore {
    fn load<'a>(&'a self, run_id: &'a str, value_bytes: usize) -> BoxFuture<'a, Result<JournalSnapshot, JournalError>> {
        self.load_journal(run_id, value_bytes).map(|r| r.map_err(journal_error)).boxed()
    }

    fn get_step<'a>(&'a self, run_id: &'a str, key: &'a str) -> BoxFuture<'a, Result<Option<String>, JournalError>> {
        if let Some(value) = self.writer.pending().step(run_id, key) {
            return futures::future::ready(Ok(Some(value.to_string()))).boxed();
        }
        let (pool, run_id, key) = (self.pool.clone(), run_id.to_string(), key.to_string());
        self.spawn(async move {
            let client = pool.get().await?;
            // With the shared value its reference names, if it is one.
            let row = client
                .query_opt(
                    "SELECT s.value, (SELECT j.value FROM journal_values j WHERE octet_length(s.value) = 41
                         AND substring(s.value FOR 1) = '\\x26'::bytea AND j.hash = substring(s.value FROM 10 FOR 32))
                     FROM steps s WHERE s.run_id = $1 AND s.key = $2",
                    &[&run_id, &key.as_bytes()],
                )
                .await
                .map_err(|e| pg(&pool.url, e))?;
            let text = |stored: &[u8], kept: Option<&[u8]>| {
                let value = values::resolve(stored, kept).map_err(|e| corrupt("a step value", e))?;
                String::from_utf8(value.into_owned()).map_err(|e| corrupt("a step value", e))
            };
            row.map(|row| text(row.get::<_, &[u8]>(0), row.get::<_, Option<&[u8]>>(1))).transpose()
        })
        .map(|r| r.map_err(journal_error))
        .boxed()
    }

    fn get_agent<'a>(
        &'a self,
        run_id: &'a str,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<Option<String>>, JournalError>> {
        let decode = |bytes: &[u8]| {
            decode_outcome(bytes).map(|outcome| outcome.map(str::to_string)).map_err(|e| corrupt("agent journal", e))
        };
        let pending = self.writer.pending().agent(run_id, key).cloned();
        if let Some(bytes) = pending {
            return futures::future::ready(decode(&bytes).map(Some).map_err(journal_error)).boxed();
        }
        let (pool, run_id, key) = (self.pool.clone(), run_id.to_string(), key.to_string());
        self.spawn(async move {
            let client = pool.get().await?;
            let row = client
                .query_opt(
                    "SELECT a.outcome, (SELECT j.value FROM journal_values j WHERE octet_length(a.outcome) = 42
                         AND substring(a.outcome FOR 2) = '\\x0126'::bytea AND j.hash = substring(a.outcome FROM 11 FOR 32))
                     FROM agents a WHERE a.run_id = $1 AND a.key = $2",
                    &[&run_id, &key.as_bytes()],
                )
                .await
                .map_err(|e| pg(&pool.url, e))?;
            // The outcome's tag, then its reply (inline or shared) back in `encode_outcome`'s form.
            let stored = |bytes: &[u8], kept: Option<&[u8]>| match bytes.split_first() {
                Some((&tag @ 1, reply)) => {
                    let reply = values::resolve(reply, kept).map_err(|e| corrupt("agent journal", e))?;
                    let mut outcome = Vec::with_capacity(reply.len() + 1);
                    outcome.push(tag);
                    outcome.extend_from_slice(&reply);
                    decode(&outcome)
                }
                _ => decode(bytes),
            };
            row.map(|row| stored(row.get::<_, &[u8]>(0), row.get::<_, Option<&[u8]>>(1))).transpose()
        })
        .map(|r| r.map_err(journal_error))
        .boxed()
    }

    /// A row's bytes in its heap page and its primary-key index entry (the key twice).
    fn footprint(&self, key_bytes: usize, value_bytes: usize) -> u64 {
        (key_bytes as u64).saturating_mul(2).saturating_add(value_bytes as u64).saturating_add(ROW_OVERHEAD)
    }

    fn put_step(&self, run_id: &str, key: &str, value: &str, journal_bytes: u64) -> Result<(), JournalError> {
        self.send_for(run_id, Op::step(run_id, key, value, journal_bytes)).map_err(journal_error)
    }

    fn put_agent(
        &self,
        run_id: &str,
        key: &str,
        outcome: Option<&str>,
        journal_bytes: u64,
    ) -> Result<(), JournalError> {
        self.send_for(run_id, Op::agent(run_id, key, outcome, journal_bytes)).map_err(journal_error)
    }

    fn put_progress(&self, run_id: &str, seq: u64, entry: Vec<u8>, journal_bytes: u64) -> Result<(), JournalError> {
        self.send_for(run_id, Op::progress(run_id, seq, entry, journal_bytes)).map_err(journal_error)
    }

    fn put_accounting(&self, run_id: &str, accounting: &Accounting) -> Result<(), JournalError> {
        self.send_for(run_id, Op::accounting(run_id, accounting)).map_err(journal_error)
    }

    fn flush(&self) -> BoxFuture<'_, Result<(), JournalError>> {
        Box::pin(async move { self.writer.flush().await.map_err(journal_error) })
    }

    fn commit_soon(&self) {
        self.writer.commit_soon();
    }

    /// Refused once the store failed (fenced, a refused commit) or this worker's lease ran out
    /// by its own monotonic clock (renewals failing, the database away): a worker that may
    /// have been replaced starts no paid call, even before the database can say so. Refused
    /// too for a run whose attempt began under a generation this worker no longer holds.
    fn writable(&self, run_id: &str) -> Result<(), JournalError> {
        if let Some(failure) = self.writer.failed.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Err(journal_error(StoreError::WriteFailed(failure)));
        }
        if !self.lease_held() || crate::store::Store::attempt_fenced(self, run_id) {
            return Err(journal_error(self.lease.fenced()));
        }
        Ok(())
    }
}
