//! `agent:factory/agents`: the concurrent hooks. Each call clones the run's shared state
//! out of the store and awaits without holding it, so thousands can be in flight at once.

use crate::sandbox::contract::agent::factory::{agents, types as wit};
use crate::sandbox::RunData;
use wasmtime::component::{Accessor, HasSelf};

impl agents::Host for RunData {}

impl agents::HostWithStore<RunData> for HasSelf<RunData> {
    async fn agent(
        accessor: &Accessor<RunData, Self>,
        prompt: String,
        options: wit::AgentOptions,
    ) -> wasmtime::Result<Result<Option<String>, wit::Abort>> {
        let run = accessor.with(|mut access| access.get().run.clone());
        let stop = run.stop_token();
        // Once the attempt is stopping the call answers at once with the abort, so the guest
        // can react during the stop grace (the call is abandoned as a dropped store would).
        let outcome = tokio::select! {
            biased;
            outcome = run.clone().agent(prompt, options.label, options.schema, options.model) => outcome,
            _ = stop.cancelled() => Err(run.stopping().unwrap_or(crate::engine::abort::Abort::Cancelled)),
        };
        Ok(outcome.map_err(Into::into))
    }

    async fn sleep(accessor: &Accessor<RunData, Self>, ms: u64) -> wasmtime::Result<()> {
        // Sleeping counts as active time: the attempt's clock keeps running meanwhile. Once
        // the attempt is stopping a sleep ends at once, so the guest sees the stop (its
        // `ctx.signal` fires) within the stop grace; then the store (and this future) go.
        let stop = accessor.with(|mut access| access.get().run.stop_token());
        tokio::select! {
            _ = tokio::time::sleep(std::time::Duration::from_millis(ms)) => {}
            _ = stop.cancelled() => {}
        }
        Ok(())
    }
}
