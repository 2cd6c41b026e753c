//! The capabilities a guest gets, each one module that owns its semantics and per-run
//! state (as Spin's factors do): [`steps`] (`ctx.step-get`/`step-put`), [`agents`]
//! (`agents.agent`: memo, limits, accounting), [`progress`] (`ctx.phase`/`ctx.log`),
//! [`sleep`] (`agents.sleep`) and `script` (a script factory's source). What they share of
//! one attempt (identity, limits, the stop signal, the journal view and the progress
//! journal) is [`attempt::Attempt`]. [`Capabilities`] is one attempt's set, which the run
//! engine builds and the sandbox's store data holds; `ctx` binds the WIT interface of that
//! name to the capability behind each function. [`linker`] adds the factory world and
//! deny-by-default WASI to one linker that serves every component of a host, and
//! [`script_linker`] adds `script` too, for the JS runner.

pub(crate) mod abort;
pub(crate) mod agents;
pub(crate) mod attempt;
pub(crate) mod cache;
mod ctx;
pub(crate) mod progress;
mod script;
pub(crate) mod sleep;
pub(crate) mod steps;

use crate::sandbox::contract::agent::factory::types as wit;
use abort::{Abort, LimitKind, StepError};
use attempt::{Attempt, AttemptSetup};
use crate::model::envelope::{Accounting, Failure, FailureType};
use crate::sandbox::RunData;
use std::sync::Arc;
use wasmtime::component::{HasSelf, Linker};
use wasmtime::Engine;

/// One attempt's capabilities: the shared core and each capability's own state.
pub(crate) struct Capabilities {
    pub(crate) attempt: Arc<Attempt>,
    pub(crate) steps: steps::Steps,
    pub(crate) progress: Arc<progress::Progress>,
    pub(crate) agents: Arc<agents::Agents>,
}

impl Capabilities {
    /// Load the run's journal and set up the attempt's capabilities.
    pub(crate) fn new(setup: AttemptSetup) -> Result<Arc<Self>, Failure> {
        let snapshot = setup
            .journal
            .load(&setup.run_id, setup.sandbox.journal_cache_bytes)
            .map_err(|e| Failure::new(FailureType::Storage, None, e.to_string()))?;
        let mut cache = cache::ValueCache::new(setup.sandbox.journal_cache_bytes);
        for (key, value) in snapshot.steps {
            cache.put_step(key, value);
        }
        for (key, outcome) in snapshot.agents {
            cache.put_agent(key, outcome);
        }
        let attempt = Arc::new(Attempt::new(&setup, cache, snapshot.journal_bytes));
        let progress = Arc::new(progress::Progress::new(attempt.clone()));
        let agents = Arc::new(agents::Agents::new(attempt.clone(), progress.clone(), &setup));
        let steps = steps::Steps::new(attempt.clone(), snapshot.step_keys);
        Ok(Arc::new(Capabilities { attempt, steps, progress, agents }))
    }

    /// Accounting so far, all attempts included; active time counts this attempt so far.
    pub(crate) fn accounting(&self) -> Accounting {
        self.agents.accounting()
    }
}

/// A linker with the factory world's imports and WASI p2.
pub(crate) fn linker(engine: &Engine) -> wasmtime::Result<Linker<RunData>> {
    let mut linker = Linker::new(engine);
    crate::sandbox::contract::Factory::add_to_linker::<RunData, HasSelf<RunData>>(&mut linker, |data| data)?;
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    Ok(linker)
}

/// [`linker`] plus `agent:factory/script`: the linker of script factories (the JS runner).
pub(crate) fn script_linker(engine: &Engine) -> wasmtime::Result<Linker<RunData>> {
    let mut linker = linker(engine)?;
    crate::sandbox::contract::script_runner::agent::factory::script::add_to_linker::<RunData, HasSelf<RunData>>(
        &mut linker,
        |data| data,
    )?;
    Ok(linker)
}

impl wit::Host for RunData {}

impl From<Abort> for wit::Abort {
    fn from(abort: Abort) -> Self {
        match abort {
            Abort::Cancelled => wit::Abort::Cancelled,
            Abort::Halted => wit::Abort::Halted,
            Abort::Backend { kind, message } => wit::Abort::Backend(format!("{}: {message}", kind.as_str())),
            Abort::Unpriced(_) => wit::Abort::LimitReached(wit::LimitKind::MaxAiCredits),
            Abort::Limit(kind) => wit::Abort::LimitReached(match kind {
                LimitKind::MaxTotalSubagents => wit::LimitKind::MaxTotalSubagents,
                LimitKind::TimeoutSeconds => wit::LimitKind::TimeoutSeconds,
                LimitKind::MaxAiCredits => wit::LimitKind::MaxAiCredits,
            }),
            Abort::Storage(e) => wit::Abort::Storage(e.to_string()),
            Abort::InvalidCall(m) => wit::Abort::InvalidCall(m),
            Abort::SandboxLimit { message, .. } => wit::Abort::SandboxLimit(message),
        }
    }
}

impl From<StepError> for wit::StepError {
    fn from(e: StepError) -> Self {
        match e {
            StepError::InvalidJson(m) => wit::StepError::InvalidJson(m),
            StepError::Abort(a) => wit::StepError::Abort(a.into()),
        }
    }
}
