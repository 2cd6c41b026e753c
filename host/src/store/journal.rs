//! The journal: what a run writes as it goes — step values, agent outcomes, progress, and
//! live accounting — keyed by run. A trait, so the run engine does not depend on where the
//! entries live; every durable [`Store`](crate::store::Store) is one.
//!
//! A run does not hold its journal in memory: an attempt starts from a [`JournalSnapshot`]
//! (every step key's fingerprint, the bytes journaled so far, and as many values as fit a
//! byte budget) and reads the other values back on demand ([`Journal::get_step`],
//! [`Journal::get_agent`]), which see every put at once, committed or not. Reads are futures
//! (a store across a network cannot answer at once); puts are not: they hand the entry to
//! the store's writer and return, so the hot paths never wait for a store.

use crate::model::envelope::Accounting;
use futures::future::BoxFuture;
use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;
use std::sync::{Arc, OnceLock};

/// A step key's fingerprint: a 64-bit keyed hash (SipHash with a key random per process, so
/// a guest cannot aim for collisions). Only compared within one process.
pub fn fingerprint(key: &str) -> u64 {
    static KEYS: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    KEYS.get_or_init(Default::default).hash_one(key)
}

/// A journal operation that failed, with the error of whatever keeps the journal (the
/// store's [`StoreError`](crate::store::StoreError)). Never a cache miss: the run must stop.
#[derive(Debug, Clone)]
pub struct JournalError(pub Arc<dyn std::error::Error + Send + Sync + 'static>);

impl std::fmt::Display for JournalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "journal: {}", self.0)
    }
}

impl std::error::Error for JournalError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

impl JournalError {
    /// A journal failure caused by `source`.
    pub fn new(source: impl std::error::Error + Send + Sync + 'static) -> Self {
        JournalError(Arc::new(source))
    }

    /// Whether the cause is the shared store out of reach for this worker
    /// ([`StoreError::is_outage`](crate::store::StoreError::is_outage)).
    pub fn is_outage(&self) -> bool {
        self.0.downcast_ref::<crate::store::StoreError>().is_some_and(|e| e.is_outage())
    }
}

/// The same failure (one shared cause), not merely the same text.
impl PartialEq for JournalError {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// What an attempt starts from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JournalSnapshot {
    /// The [`fingerprint`] of every journaled step key (all of them, whether or not its
    /// value is in `steps`): what counts distinct steps without holding their keys.
    pub step_keys: HashSet<u64>,
    /// The [`fingerprint`] of every journaled agent key, when the journal lists them (then a
    /// call whose key is not among them was never journaled, without a read); `None`: ask
    /// [`Journal::get_agent`].
    pub agent_keys: Option<HashSet<u64>>,
    /// Step key -> JSON text, for as many steps as fit the load budget.
    pub steps: HashMap<String, String>,
    /// Agent key (hex) -> outcome (`Some(json)` for a reply, `None` for an ordinary
    /// failure), for as many agent calls as fit the load budget.
    pub agents: HashMap<String, Option<String>>,
    /// Bytes the run has journaled so far, all attempts together (as last recorded with a
    /// put).
    pub journal_bytes: u64,
}

/// What an answered agent call journals at once ([`Journal::put_agent_outcome`]); each
/// entry with the run's journal total as counted with it (an entry the journal budget had no
/// room for is left out).
pub struct AgentOutcome<'a> {
    /// Its progress entry: seq, stored JSON form, journal total.
    pub progress: Option<(u64, Vec<u8>, u64)>,
    /// The attempt's accounting with the call counted.
    pub accounting: &'a Accounting,
    /// The outcome: the call's key, its reply (`None`: an ordinary failure), journal total.
    pub agent: Option<(&'a str, Option<&'a str>, u64)>,
}

/// Where a run's entries go. Puts may return before the entry is durable; [`Journal::flush`]
/// resolves once everything put so far is.
pub trait Journal: Send + Sync + 'static {
    /// The run's journal so far: every step key, the journal bytes recorded with the last
    /// put, and values (steps first, then agent outcomes) up to `value_bytes` bytes in all,
    /// none over a quarter of that. A value's bytes are its key's plus, for a step, its JSON
    /// text's, for an agent outcome, 1 plus its reply's (0 for an ordinary failure).
    fn load<'a>(&'a self, run_id: &'a str, value_bytes: usize) -> BoxFuture<'a, Result<JournalSnapshot, JournalError>>;

    /// A step value, as last put (committed or not).
    fn get_step<'a>(&'a self, run_id: &'a str, key: &'a str) -> BoxFuture<'a, Result<Option<String>, JournalError>>;

    /// An agent outcome, as put (committed or not): `None` when the call was never journaled.
    fn get_agent<'a>(&'a self, run_id: &'a str, key: &'a str) -> BoxFuture<'a, Result<Option<Option<String>>, JournalError>>;

    /// What an entry of `key_bytes` (every part of its key, run id included) and
    /// `value_bytes` occupies where this journal keeps it: what the run's journal budget is
    /// charged for it.
    fn footprint(&self, key_bytes: usize, value_bytes: usize) -> u64 {
        (key_bytes as u64).saturating_add(value_bytes as u64)
    }

    // Each put carries `journal_bytes`: the run's journal total with this entry counted,
    // recorded together with the entry (so after a crash the total never counts less than
    // what was kept).

    /// Record a step value.
    fn put_step(&self, run_id: &str, key: &str, value: &str, journal_bytes: u64) -> Result<(), JournalError>;

    /// Record an agent outcome.
    fn put_agent(&self, run_id: &str, key: &str, outcome: Option<&str>, journal_bytes: u64) -> Result<(), JournalError>;

    /// Record a progress entry: `entry` is its stored JSON form
    /// ([`JournaledProgress`](crate::model::progress::JournaledProgress)).
    fn put_progress(&self, run_id: &str, seq: u64, entry: Vec<u8>, journal_bytes: u64) -> Result<(), JournalError>;

    /// Record the running attempt's accounting so far.
    fn put_accounting(&self, run_id: &str, accounting: &Accounting) -> Result<(), JournalError>;

    /// Record what an answered agent call journals, in this order: its progress entry, the
    /// attempt's accounting, its outcome. A store queues them as one write (so they share a
    /// commit); by default they are put one after the other.
    fn put_agent_outcome(&self, run_id: &str, outcome: AgentOutcome<'_>) -> Result<(), JournalError> {
        if let Some((seq, entry, journal_bytes)) = outcome.progress {
            self.put_progress(run_id, seq, entry, journal_bytes)?;
        }
        self.put_accounting(run_id, outcome.accounting)?;
        match outcome.agent {
            Some((key, reply, journal_bytes)) => self.put_agent(run_id, key, reply, journal_bytes),
            None => Ok(()),
        }
    }

    /// Resolve once every entry put so far is durable.
    fn flush(&self) -> BoxFuture<'_, Result<(), JournalError>>;

    /// Whether this process may still start work whose outcome the journal must record (a
    /// paid subagent call): a journal that already knows its writes would be refused says
    /// why (a worker whose lease ran out by its own clock, or was fenced, or whose attempt of
    /// run `run_id` began under a generation it lost). `Ok` by default.
    fn writable(&self, _run_id: &str) -> Result<(), JournalError> {
        Ok(())
    }
}
