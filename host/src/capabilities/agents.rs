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
        let outcome = run.agent(prompt, options.label, options.schema, options.model).await;
        Ok(outcome.map_err(Into::into))
    }

    async fn sleep(accessor: &Accessor<RunData, Self>, ms: u64) -> wasmtime::Result<()> {
        // Sleeping counts as active time: the attempt's clock keeps running meanwhile, and
        // cancellation or the deadline drop the store (and this future) mid-sleep.
        let _run = accessor.with(|mut access| access.get().run.clone());
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        Ok(())
    }
}
