//! The journal: step values and agent outcomes of a run, keyed by (run id, key). Behind a
//! trait so the run engine does not care whether it lives in memory or in the durable store.

use futures::future::BoxFuture;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

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

/// Where journal entries live.
pub trait Journal: Send + Sync + 'static {
    /// Everything journaled for `run_id` so far.
    fn load(&self, run_id: &str) -> Result<JournalSnapshot, JournalError>;

    /// Record a step value. May return before the entry is durable; see [`Journal::flush`].
    fn put_step(&self, run_id: &str, key: &str, value: &str) -> Result<(), JournalError>;

    /// Record an agent outcome. May return before the entry is durable.
    fn put_agent(&self, run_id: &str, key: &str, outcome: Option<&str>) -> Result<(), JournalError>;

    /// Resolve once every entry put so far is durable.
    fn flush(&self) -> BoxFuture<'static, Result<(), JournalError>>;
}

/// A journal that lives as long as the process (for embedding and tests).
#[derive(Debug, Default, Clone)]
pub struct MemoryJournal {
    runs: Arc<Mutex<HashMap<String, JournalSnapshot>>>,
}

impl MemoryJournal {
    /// An empty journal.
    pub fn new() -> Self {
        Self::default()
    }

    fn with_run<R>(&self, run_id: &str, f: impl FnOnce(&mut JournalSnapshot) -> R) -> Result<R, JournalError> {
        let mut runs = self.runs.lock().map_err(|_| JournalError("memory journal poisoned".into()))?;
        Ok(f(runs.entry(run_id.to_string()).or_default()))
    }
}

impl Journal for MemoryJournal {
    fn load(&self, run_id: &str) -> Result<JournalSnapshot, JournalError> {
        self.with_run(run_id, |snapshot| snapshot.clone())
    }

    fn put_step(&self, run_id: &str, key: &str, value: &str) -> Result<(), JournalError> {
        self.with_run(run_id, |s| {
            s.steps.insert(key.to_string(), value.to_string());
        })
    }

    fn put_agent(&self, run_id: &str, key: &str, outcome: Option<&str>) -> Result<(), JournalError> {
        self.with_run(run_id, |s| {
            s.agents.insert(key.to_string(), outcome.map(str::to_string));
        })
    }

    fn flush(&self) -> BoxFuture<'static, Result<(), JournalError>> {
        Box::pin(async { Ok(()) })
    }
}
