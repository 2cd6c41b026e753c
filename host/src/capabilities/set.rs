//! [`Capabilities`]: one attempt's set of capabilities, which the run engine builds and the
//! sandbox's store data holds: the shared core ([`super::attempt::Attempt`]) and each
//! capability's own state.

use super::attempt::{Attempt, AttemptSetup, LoadedAgents};
use super::{agents, cache, progress, steps};
use crate::model::envelope::{Accounting, Failure, FailureType};
use std::sync::Arc;

/// One attempt's capabilities: the shared core and each capability's own state.
pub(crate) struct Capabilities {
    pub(crate) attempt: Arc<Attempt>,
    pub(crate) steps: steps::Steps,
    pub(crate) progress: Arc<progress::Progress>,
    pub(crate) agents: Arc<agents::Agents>,
}

impl Capabilities {
    /// Load the run's journal and set up the attempt's capabilities.
    pub(crate) async fn new(setup: AttemptSetup) -> Result<Arc<Self>, Failure> {
        let snapshot = setup
            .journal
            .load(&setup.run_id, setup.sandbox.journal_cache_bytes)
            .await
            .map_err(|e| Failure::new(FailureType::Storage, None, e.to_string()))?;
        // The loaded values and the cache of this attempt's own share the budget.
        let loaded = snapshot.steps.memory().saturating_add(snapshot.agents.memory());
        let cache = cache::ValueCache::new(setup.sandbox.journal_cache_bytes.saturating_sub(loaded));
        let agents_loaded = LoadedAgents { entries: snapshot.agents, listed: snapshot.agents_listed };
        let attempt = Arc::new(Attempt::new(&setup, cache, snapshot.journal_bytes, agents_loaded));
        let progress = Arc::new(progress::Progress::new(attempt.clone()));
        let agents = Arc::new(agents::Agents::new(attempt.clone(), progress.clone(), &setup));
        let steps = steps::Steps::new(attempt.clone(), snapshot.steps);
        Ok(Arc::new(Capabilities { attempt, steps, progress, agents }))
    }

    /// Accounting so far, all attempts included; active time counts this attempt so far.
    pub(crate) fn accounting(&self) -> Accounting {
        self.agents.accounting()
    }
}

