//! [`RunView`]: what the hooks need of a run, as `WasiView` is what WASI needs of a store.
//! The sandbox's store data holds a run through it, so neither the sandbox nor the hooks
//! depend on the run engine that implements it (`RunShared`).

use crate::engine::abort::{Abort, StepError};
use futures::future::BoxFuture;
use std::sync::Arc;

/// One attempt of a run, as the guest's hooks see it.
pub(crate) trait RunView: Send + Sync + 'static {
    /// `ctx.step-get`: a journaled step value.
    fn step_get(&self, key: &str) -> Result<Option<String>, Abort>;
    /// `ctx.step-put`: validate and journal a step value.
    fn step_put(&self, key: String, value: String) -> Result<(), StepError>;
    /// `ctx.phase`: a progress entry that starts a phase.
    fn phase(&self, title: String);
    /// `ctx.log`: a progress entry.
    fn log(&self, message: String);
    /// `ctx.log-at`: a progress entry with a level.
    fn log_at(&self, level: crate::model::progress::LogLevel, message: String);
    /// Cancelled once the attempt is stopping (sleeps and agent calls then answer at once).
    fn stop_token(&self) -> tokio_util::sync::CancellationToken;
    /// The abort every hook answers with once the attempt is stopping.
    fn stopping(&self) -> Option<Abort>;
    /// `ctx.run-id`.
    fn run_id(&self) -> String;
    /// `ctx.cancelled`: whether the attempt is stopping.
    fn cancelled(&self) -> bool;
    /// `agents.agent`: a memoized, journaled, limited subagent call.
    fn agent(
        self: Arc<Self>,
        prompt: String,
        label: Option<String>,
        schema: Option<String>,
        model: Option<String>,
    ) -> BoxFuture<'static, Result<Option<String>, Abort>>;
}
