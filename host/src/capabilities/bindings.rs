//! The WIT bindings of the capabilities: `agent:factory/ctx` (steps, phase and log, the
//! run's identity and stop signal, checkpoints) and `agent:factory/agents` (subagents and sleep), each
//! function handed to the capability that owns it, and the conversion of the host's
//! [`Abort`] and [`StepError`] to their WIT forms. Each interface is added to the linker with
//! a getter (wasmtime's `HasData`, as wasmtime-wasi adds WASI): it takes the sandbox's store
//! data, asks its host part (the run's state, which the engine builds) for the capabilities
//! through their views ([`AttemptView`], [`StepsView`], [`ProgressView`], [`AgentsView`]),
//! and the interface is served by what they lend ([`CtxHost`], [`AgentsCtx`]). The
//! capabilities' semantics never see the store data, so they do not depend on the sandbox
//! that holds them. The synchronous hooks answer from in-memory state or, for a journaled value not
//! cached, one read of the store; none waits for a commit. An agent call is checked, keyed
//! and, when the journal view holds its answer, answered inside the hook call (or by the
//! synchronous `agents.agent-ready` or `agents.agent-start`: they spare a memo hit the
//! async call's machinery); one that must wait clones what it needs out of the store and
//! awaits without holding it, in the async `agents.agent`'s own future or, started by
//! `agents.agent-start`, in the store's set of started calls
//! ([`super::started`]), which `agents.agent-wait` polls and reports in batches.

use super::abort::{Abort, LimitKind, Pause, StepError};
use super::agents::{Agents, Start};
use super::attempt::{Attempt, AttemptView};
use super::progress::{Progress, ProgressView};
use super::started::{settle, AgentsCtx, AgentsView, Launch};
use super::steps::{Steps, StepsView};
use crate::sandbox::contract::agent::factory::{agents, ctx, types as wit};
use crate::sandbox::RunData;
use std::sync::Arc;
use wasmtime::component::{Accessor, HasData, Linker};

/// Add `agent:factory/types`, `ctx` and `agents` to `linker`, served by the capabilities the
/// host state `S` of each store lends through their views.
pub(super) fn add_to_linker<S>(linker: &mut Linker<RunData<S>>) -> wasmtime::Result<()>
where
    S: AttemptView + StepsView + ProgressView + AgentsView,
{
    wit::add_to_linker::<RunData<S>, Ctx>(linker, ctx_of::<S>)?;
    ctx::add_to_linker::<RunData<S>, Ctx>(linker, ctx_of::<S>)?;
    agents::add_to_linker::<RunData<S>, AgentHooks>(linker, agents_of::<S>)
}

/// What `agent:factory/ctx` reaches of the attempt a store runs: the capabilities behind its
/// functions.
pub(crate) struct CtxHost<'a> {
    attempt: &'a Attempt,
    steps: &'a Steps,
    progress: &'a Progress,
}

/// `agent:factory/ctx`'s (and `types`') data in the linker: a [`CtxHost`].
struct Ctx;

impl HasData for Ctx {
    type Data<'a> = CtxHost<'a>;
}

/// The getter of [`Ctx`]: the views of the store's host state.
fn ctx_of<S: AttemptView + StepsView + ProgressView>(data: &mut RunData<S>) -> CtxHost<'_> {
    let state = data.host();
    CtxHost { attempt: state.attempt(), steps: state.steps(), progress: state.progress() }
}

/// `agent:factory/agents`' data in the linker: an [`AgentsCtx`].
struct AgentHooks;

impl HasData for AgentHooks {
    type Data<'a> = AgentsCtx<'a>;
}

/// The getter of [`AgentHooks`]: the view of the store's host state.
fn agents_of<S: AgentsView>(data: &mut RunData<S>) -> AgentsCtx<'_> {
    data.host_mut().agents()
}

impl ctx::Host for CtxHost<'_> {
    fn step_get(&mut self, key: String) -> wasmtime::Result<Result<Option<String>, wit::Abort>> {
        Ok(self.steps.get(&key).map_err(Into::into))
    }

    fn step_put(&mut self, key: String, value: String) -> wasmtime::Result<Result<(), wit::StepError>> {
        Ok(self.steps.put(key, value).map_err(Into::into))
    }

    fn phase(&mut self, title: String) -> wasmtime::Result<()> {
        self.progress.phase(title);
        Ok(())
    }

    fn log(&mut self, message: String) -> wasmtime::Result<()> {
        self.progress.log(message);
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
        self.progress.log_at(level, message);
        Ok(())
    }

    fn run_id(&mut self) -> wasmtime::Result<String> {
        Ok(self.attempt.run_id.clone())
    }

    fn cancelled(&mut self) -> wasmtime::Result<bool> {
        self.attempt.watch();
        Ok(self.attempt.cancelled())
    }

    fn stop_reason(&mut self) -> wasmtime::Result<Option<wit::Abort>> {
        self.attempt.watch();
        Ok(self.attempt.stopping().map(Into::into))
    }

    fn pause(&mut self, key: String) -> wasmtime::Result<Result<Option<String>, wit::Abort>> {
        Ok(super::checkpoints::pause(self.attempt, key).map_err(Into::into))
    }
}

impl wit::Host for CtxHost<'_> {}

/// [`Agents::start`] of a call as the three agent hooks receive it.
fn start(agents: &Arc<Agents>, prompt: String, options: wit::AgentOptions) -> Start {
    let limits = crate::sandbox::contract::agent_limits_from_wit(options.limits);
    let tuning = crate::model::tuning::AgentTuning {
        agent: options.agent,
        reasoning_effort: options.reasoning_effort,
        context_tier: options.context_tier,
    };
    agents.start(prompt, options.label, options.schema, options.model, limits, tuning)
}

impl agents::Host for AgentsCtx<'_> {
    fn agent_ready(
        &mut self,
        prompt: String,
        options: wit::AgentOptions,
    ) -> wasmtime::Result<Result<wit::ReadyReply, wit::Abort>> {
        // What `agent` answers inside its hook call, by a synchronous call; a call that
        // must wait is dropped here (its admission undone) and made by `agent`.
        Ok(match start(self.agents, prompt, options) {
            Start::Answered(outcome) => outcome.map(wit::ReadyReply::Reply).map_err(Into::into),
            Start::Call(_) => Ok(wit::ReadyReply::MustWait),
        })
    }

    fn agent_start(
        &mut self,
        prompt: String,
        options: wit::AgentOptions,
    ) -> wasmtime::Result<Result<wit::Started, wit::Abort>> {
        // Admission, the memo key and a memo hit as in `agent`; a call that must wait is
        // polled once and, unless that answered it, kept for `agent-wait`.
        let agents = self.agents;
        Ok(match start(agents, prompt, options) {
            Start::Answered(outcome) => outcome.map(wit::Started::Reply).map_err(Into::into),
            Start::Call(call) => match self.started.launch(agents.clone(), agents.attempt().clone(), call) {
                Launch::Answered(outcome) => outcome.map(wit::Started::Reply).map_err(Into::into),
                Launch::Pending(id) => Ok(wit::Started::Pending(id)),
            },
        })
    }
}

impl<T> agents::HostWithStore<T> for AgentHooks {
    async fn agent(
        accessor: &Accessor<T, Self>,
        prompt: String,
        options: wit::AgentOptions,
    ) -> wasmtime::Result<Result<Option<String>, wit::Abort>> {
        // Admission, the memo key and a memo hit need no wait: answered here, in the hook call.
        let started = accessor.with(|mut access| {
            let agents = access.get().agents;
            match start(agents, prompt, options) {
                Start::Answered(outcome) => Err(outcome),
                Start::Call(call) => Ok((agents.clone(), agents.attempt().clone(), call)),
            }
        });
        let (agents, attempt, call) = match started {
            Ok(waiting) => waiting,
            Err(outcome) => return Ok(outcome.map_err(Into::into)),
        };
        // Once the attempt is stopping the call answers at once with the abort, so the guest
        // can react within the stop grace (the call is abandoned as a dropped store would).
        // Boxed: the future of a call that waits stays out of the hook's own.
        let outcome = Box::pin(settle(agents, attempt, call)).await;
        Ok(outcome.map_err(Into::into))
    }

    async fn agent_wait(accessor: &Accessor<T, Self>) -> wasmtime::Result<Vec<wit::Finished>> {
        // Polled through the store data each time: the calls live there, not in this future.
        let done = std::future::poll_fn(|cx| accessor.with(|mut access| access.get().started.poll_done(cx))).await;
        Ok(done
            .into_iter()
            .map(|(call, outcome)| wit::Finished { call, outcome: outcome.map_err(Into::into) })
            .collect())
    }

    async fn sleep(accessor: &Accessor<T, Self>, ms: u64) -> wasmtime::Result<()> {
        let attempt = accessor.with(|mut access| access.get().agents.attempt().clone());
        super::sleep::sleep(&attempt, ms).await;
        Ok(())
    }
}

impl From<Abort> for wit::Abort {
    fn from(abort: Abort) -> Self {
        match abort {
            Abort::Cancelled => wit::Abort::Cancelled,
            Abort::Halted => wit::Abort::Halted,
            Abort::Backend { kind, message, .. } => wit::Abort::Backend(format!("{}: {message}", kind.as_str())),
            Abort::Unpriced(_) => wit::Abort::LimitReached(wit::LimitKind::MaxAiCredits),
            Abort::Limit(kind) => wit::Abort::LimitReached(match kind {
                LimitKind::MaxTotalSubagents => wit::LimitKind::MaxTotalSubagents,
                LimitKind::TimeoutSeconds => wit::LimitKind::TimeoutSeconds,
                LimitKind::MaxAiCredits => wit::LimitKind::MaxAiCredits,
            }),
            Abort::Storage(e) => wit::Abort::Storage(e.to_string()),
            Abort::InvalidCall(m) => wit::Abort::InvalidCall(m),
            Abort::SandboxLimit { message, .. } => wit::Abort::SandboxLimit(message),
            Abort::Paused(Pause::Caller) => wit::Abort::Paused(None),
            Abort::Paused(Pause::Checkpoint(key)) => wit::Abort::Paused(Some(key)),
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
