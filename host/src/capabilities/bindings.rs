//! The WIT bindings of the capabilities: `agent:factory/ctx` (steps, phase and log, the
//! run's identity and stop signal) and `agent:factory/agents` (subagents and sleep), each
//! function handed to the capability that owns it, and the conversion of the host's
//! [`Abort`] and [`StepError`] to their WIT forms. Bindings take the sandbox's store data;
//! the capabilities' semantics never see it, so they do not depend on the sandbox that holds
//! them. The synchronous hooks answer from in-memory state or, for a journaled value not
//! cached, one read of the store; none waits for a commit. Each agent call clones what it
//! needs out of the store and awaits without holding it.

use super::abort::{Abort, LimitKind, StepError};
use crate::sandbox::contract::agent::factory::{agents, ctx, types as wit};
use crate::sandbox::RunData;
use wasmtime::component::{Accessor, HasSelf};

impl ctx::Host for RunData {
    fn step_get(&mut self, key: String) -> wasmtime::Result<Result<Option<String>, wit::Abort>> {
        Ok(self.run.steps.get(&key).map_err(Into::into))
    }

    fn step_put(&mut self, key: String, value: String) -> wasmtime::Result<Result<(), wit::StepError>> {
        Ok(self.run.steps.put(key, value).map_err(Into::into))
    }

    fn phase(&mut self, title: String) -> wasmtime::Result<()> {
        self.run.progress.phase(title);
        Ok(())
    }

    fn log(&mut self, message: String) -> wasmtime::Result<()> {
        self.run.progress.log(message);
        Ok(())
    }

    fn run_id(&mut self) -> wasmtime::Result<String> {
        Ok(self.run.attempt.run_id.clone())
    }

    fn cancelled(&mut self) -> wasmtime::Result<bool> {
        Ok(self.run.attempt.cancelled())
    }
}

impl agents::Host for RunData {}

impl agents::HostWithStore<RunData> for HasSelf<RunData> {
    async fn agent(
        accessor: &Accessor<RunData, Self>,
        prompt: String,
        options: wit::AgentOptions,
    ) -> wasmtime::Result<Result<Option<String>, wit::Abort>> {
        let agents = accessor.with(|mut access| access.get().run.agents.clone());
        let outcome = agents.call(prompt, options.label, options.schema, options.model).await;
        Ok(outcome.map_err(Into::into))
    }

    async fn sleep(accessor: &Accessor<RunData, Self>, ms: u64) -> wasmtime::Result<()> {
        let attempt = accessor.with(|mut access| access.get().run.attempt.clone());
        super::sleep::sleep(&attempt, ms).await;
        Ok(())
    }
}

impl wit::Host for RunData {}

impl From<Abort> for wit::Abort {
    fn from(abort: Abort) -> Self {
        match abort {
            // The contract has no backend case: the guest sees `cancelled` (the run is
            // stopping either way) and the host records the real cause.
            Abort::Cancelled | Abort::Halted | Abort::Backend { .. } => wit::Abort::Cancelled,
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
