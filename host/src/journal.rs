//! The journal: what a run writes as it goes — step values, agent outcomes, progress, and
//! live accounting — keyed by run. A trait, so the run engine does not depend on where the
//! entries live; the durable [`Store`](crate::store::Store) implements it.

use crate::envelope::Accounting;
use crate::progress::ProgressEntry;
use futures::future::BoxFuture;
use std::collections::HashMap;

/// A journal operation that failed. Never a cache miss: the run must stop.
#[derive(Debug, Clone, thiserror::Error)]
#[error("journal: {0}")]
pub struct JournalError(pub String);

/// Everything journaled for one run, as loaded at the start of an attempt.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JournalSnapshot {
    /// Step key -> JSON text.
    pub steps: HashMap<String, String>,
    /// Agent key (hex) -> outcome: `Some(json)` for a reply, `None` for an ordinary failure.
    pub agents: HashMap<String, Option<String>>,
}

/// Where a run's entries go. Puts may return before the entry is durable; [`Journal::flush`]
/// resolves once everything put so far is.
pub trait Journal: Send + Sync + 'static {
    /// Everything journaled for `run_id` so far.
    fn load(&self, run_id: &str) -> Result<JournalSnapshot, JournalError>;

    /// Record a step value.
    fn put_step(&self, run_id: &str, key: &str, value: &str) -> Result<(), JournalError>;

    /// Record an agent outcome.
    fn put_agent(&self, run_id: &str, key: &str, outcome: Option<&str>) -> Result<(), JournalError>;

    /// Record a progress entry.
    fn put_progress(&self, run_id: &str, entry: &ProgressEntry) -> Result<(), JournalError>;

    /// Record the running attempt's accounting so far.
    fn put_accounting(&self, run_id: &str, accounting: &Accounting) -> Result<(), JournalError>;

    /// Resolve once every entry put so far is durable.
    fn flush(&self) -> BoxFuture<'_, Result<(), JournalError>>;
}
