//! [`Ctx`]: the factory's handle on its run: arguments, journal, progress, identity.

use crate::__bindings::agent::factory::{agents, ctx as hooks, types as wit};
use crate::{Abort, AgentCall, Error};
use serde::{de::DeserializeOwned, Serialize};
use std::future::Future;
use std::rc::Rc;

/// The run's context. Cheap to clone: capture clones in `async move` blocks.
#[derive(Clone, Debug)]
pub struct Ctx {
    args: Rc<str>,
}

impl Ctx {
    pub(crate) fn new(args: String) -> Self {
        Ctx { args: args.into() }
    }

    /// The arguments as JSON text (`{}` when the caller gave none).
    pub fn args_json(&self) -> &str {
        &self.args
    }

    /// The arguments, deserialized. A shape mismatch is [`Error::InvalidArgs`] with serde's
    /// description of what is wrong (missing field, wrong type, ...).
    pub fn args<T: DeserializeOwned>(&self) -> Result<T, Error> {
        serde_json::from_str(&self.args).map_err(|e| Error::InvalidArgs(e.to_string()))
    }

    /// The run id, stable across resumed attempts.
    pub fn run_id(&self) -> String {
        hooks::run_id()
    }

    /// Start a named progress phase (run-global: call it between fan-outs).
    pub fn phase(&self, title: &str) {
        hooks::phase(title)
    }

    /// Append a progress line.
    pub fn log(&self, message: impl AsRef<str>) {
        hooks::log(message.as_ref())
    }

    /// True once the run has been asked to stop.
    pub fn cancelled(&self) -> bool {
        hooks::cancelled()
    }

    /// A durable one-shot checkpoint named `key`. The first attempt that reaches it pauses
    /// the run there: it returns [`Abort::Paused`] (propagate it with `?`) and the run ends
    /// `paused`, waiting at `key`. Once a caller resumes it (`factory resume RUN --input
    /// JSON`), the body runs again from the top (journaled steps and agent calls replay) and
    /// this returns the resume's input (`None` when it carried none); every later attempt
    /// gets the same answer. Call it from the body's main flow: while a `parallel` or
    /// `pipeline` call is in flight it is refused with an ordinary [`Error::Failed`].
    pub fn pause<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, Error> {
        if crate::combinators::in_concurrent_call() {
            return Err(Error::Failed(format!(
                "ctx.pause(\"{key}\") is refused inside parallel or pipeline: a checkpoint belongs to the body's main flow"
            )));
        }
        match hooks::pause(key).map_err(Abort::from)? {
            None => Ok(None),
            Some(json) => serde_json::from_str(&json).map(Some).map_err(|e| {
                Error::Failed(format!("checkpoint `{key}`: the answer does not fit the expected type: {e}"))
            }),
        }
    }

    /// Sleep for `ms` milliseconds (counts as active time).
    pub async fn sleep(&self, ms: u64) {
        agents::sleep(ms).await
    }

    /// A subagent call; configure it with the builder, then `.await` it.
    pub fn agent(&self, prompt: impl Into<String>) -> AgentCall {
        AgentCall::new(prompt.into())
    }

    /// A journaled step: on a resume, the value stored under `key` is returned without
    /// running `producer`. The key is the step's sole identity (version it when the
    /// producer's meaning changes). Producers may re-run after a crash: keep them idempotent.
    pub async fn step<T, F, Fut>(&self, key: &str, producer: F) -> Result<T, Error>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        if let Some(json) = hooks::step_get(key).map_err(Abort::from)? {
            return serde_json::from_str(&json).map_err(|e| Error::Step {
                key: key.to_string(),
                message: format!("the journaled value does not fit the expected type: {e}"),
            });
        }
        let value = producer().await?;
        let json = serde_json::to_string(&value)
            .map_err(|e| Error::Step { key: key.to_string(), message: format!("the value is not JSON: {e}") })?;
        match hooks::step_put(key, &json) {
            Ok(()) => Ok(value),
            Err(wit::StepError::Abort(a)) => Err(Error::Abort(a.into())),
            Err(wit::StepError::InvalidJson(m)) => Err(Error::Step { key: key.to_string(), message: m }),
        }
    }

    /// A volatile step: bypasses the journal and runs `producer` every time.
    pub async fn step_volatile<T, F, Fut>(&self, _key: &str, producer: F) -> Result<T, Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        producer().await
    }
}
