//! [`Capabilities`]: one attempt's set of capabilities, which the run engine builds, holds
//! for what it reads of the attempt (the stop cause, accounting), and puts in the host state
//! of the attempt's store, whose views lend each capability to its hooks: the shared core
//! ([`super::attempt::Attempt`]) and each capability's own state.

use super::attempt::{Attempt, AttemptSetup, LoadedAgents};
use super::{agents, cache, progress, steps};
use crate::model::envelope::{Accounting, Failure, FailureType};
use crate::store::journal::{Journal, JournalSnapshot};
use std::sync::Arc;

/// One attempt's capabilities: the shared core and each capability's own state.
pub(crate) struct Capabilities {
    pub(crate) attempt: Arc<Attempt>,
    pub(crate) steps: steps::Steps,
    pub(crate) progress: Arc<progress::Progress>,
    pub(crate) agents: Arc<agents::Agents>,
}

impl Capabilities {
    /// Load the run's journal (what [`Capabilities::new`] sets the attempt up on); a load
    /// that fails is the attempt's `storage` failure.
    pub(crate) async fn load(
        journal: &dyn Journal,
        run_id: &str,
        cache_bytes: usize,
    ) -> Result<JournalSnapshot, Failure> {
        journal.load(run_id, cache_bytes).await.map_err(|e| Failure::new(FailureType::Storage, None, e.to_string()))
    }

    /// Set up the attempt's capabilities on its loaded journal.
    pub(crate) fn new(setup: AttemptSetup, snapshot: JournalSnapshot) -> Arc<Self> {
        // The loaded values and the cache of this attempt's own share the budget.
        let loaded = snapshot.steps.memory().saturating_add(snapshot.agents.memory());
        let cache = cache::ValueCache::new(setup.sandbox.journal_cache_bytes.saturating_sub(loaded));
        let agents_loaded = LoadedAgents { entries: snapshot.agents, listed: snapshot.agents_listed };
        let attempt = Arc::new(Attempt::new(&setup, cache, snapshot.journal_bytes, agents_loaded));
        let progress = Arc::new(progress::Progress::new(attempt.clone()));
        let agents = Arc::new(agents::Agents::new(attempt.clone(), progress.clone(), &setup));
        let steps = steps::Steps::new(attempt.clone(), snapshot.steps);
        Arc::new(Capabilities { attempt, steps, progress, agents })
    }

    /// Accounting so far, all attempts included; active time counts this attempt so far.
    pub(crate) fn accounting(&self) -> Accounting {
        self.agents.accounting()
    }
}
