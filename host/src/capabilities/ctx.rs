//! `agent:factory/ctx`: the synchronous hooks, bound to the capability that owns each:
//! steps ([`super::steps`]), phase and log ([`super::progress`]), and the run's identity and
//! stop signal ([`super::attempt`]). Each answers from in-memory state or, for a journaled
//! value not cached, one read of the store (which sees every put at once); none waits for a
//! commit.

use crate::sandbox::contract::agent::factory::{ctx, types as wit};
use crate::sandbox::RunData;

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

    fn log_at(&mut self, level: wit::LogLevel, message: String) -> wasmtime::Result<()> {
        use crate::model::progress::LogLevel;
        let level = match level {
            wit::LogLevel::Debug => LogLevel::Debug,
            wit::LogLevel::Info => LogLevel::Info,
            wit::LogLevel::Warn => LogLevel::Warn,
            wit::LogLevel::Error => LogLevel::Error,
        };
        self.run.progress.log_at(level, message);
        Ok(())
    }

    fn run_id(&mut self) -> wasmtime::Result<String> {
        Ok(self.run.attempt.run_id.clone())
    }

    fn cancelled(&mut self) -> wasmtime::Result<bool> {
        Ok(self.run.attempt.cancelled())
    }

    fn stop_reason(&mut self) -> wasmtime::Result<Option<wit::Abort>> {
        Ok(self.run.attempt.stopping().map(Into::into))
    }
}
