//! The WIT bindings of the capabilities: `agent:factory/ctx` (steps, phase and log, the
//! run's identity and stop signal) and `agent:factory/agents` (subagents and sleep), each
//! function handed to the capability that owns it, and the conversion of the host's
//! [`Abort`] and [`StepError`] to their WIT forms. Bindings take the sandbox's store data;
//! the capabilities' semantics never see it, so they do not depend on the sandbox that holds
//! them. The synchronous hooks answer from in-memory state or, for a journaled value not
//! cached, one read of the store; none waits for a commit. An agent call is checked, keyed
//! and, when the journal view holds its answer, answered inside the hook call (or by the
//! synchronous `agents.agent-ready` or `agents.agent-start`: they spare a memo hit the
//! async call's machinery); one that must wait clones what it needs out of the store and
//! awaits without holding it, in the async `agents.agent`'s own future or, started by
//! `agents.agent-start`, in the store data's set of started calls
//! ([`super::started`]), which `agents.agent-wait` polls and reports in batches.
//! `agents.agent-start`, the path every SDK takes, is defined over the generated binding
//! ([`shadow_agent_start`]): it reads the call's strings in the guest's memory (a memo hit
//! copies none of them) and hands a memo hit's reply to the guest from the journal view
//! that shares it.

use super::abort::{Abort, LimitKind, StepError};
use super::agents::{Agents, Start};
use super::started::{settle, Launch};
use crate::sandbox::contract::agent::factory::{agents, ctx, types as wit};
use crate::sandbox::RunData;
use crate::model::limits::AgentLimits;
use std::borrow::Cow;
use std::sync::Arc;
use wasmtime::component::{Accessor, ComponentType, HasSelf, Lift, Linker, Lower, WasmStr};
use wasmtime::StoreContextMut;

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
        self.run.attempt.watch();
        Ok(self.run.attempt.cancelled())
    }

    fn stop_reason(&mut self) -> wasmtime::Result<Option<wit::Abort>> {
        self.run.attempt.watch();
        Ok(self.run.attempt.stopping().map(Into::into))
    }
}

/// [`Agents::start`] of a call as the three agent hooks receive it.
fn start(agents: &Arc<Agents>, prompt: String, options: wit::AgentOptions) -> Start {
    let limits = crate::sandbox::contract::agent_limits_from_wit(options.limits);
    agents.start(prompt.into(), options.label.map(Into::into), options.schema.map(Into::into), options.model.map(Into::into), limits)
}

/// A memo hit's reply as the generated bindings take it: a copy of the shared text.
fn owned(reply: Option<Arc<str>>) -> Option<String> {
    reply.map(|text| String::from(&*text))
}

/// WIT `started` as `agent-start` lowers it: a memo hit's reply straight from the journal
/// view that shares it (the generated type would take a copy).
#[derive(ComponentType, Lower)]
#[component(variant)]
enum Started {
    #[component(name = "reply")]
    Reply(Option<Arc<str>>),
    #[component(name = "pending")]
    Pending(u32),
}

/// What `agent-start` answers for `start`: a call that must wait is launched into the
/// store data's started calls.
fn started(data: &mut RunData, start: Start) -> Result<Started, Abort> {
    match start {
        Start::Hit(reply) => Ok(Started::Reply(reply)),
        Start::Refused(abort) => Err(abort),
        Start::Call(call) => {
            let run = &data.run;
            match data.started.launch(run.agents.clone(), run.attempt.clone(), call) {
                Launch::Answered(outcome) => outcome.map(|reply| Started::Reply(reply.map(Arc::from))),
                Launch::Pending(id) => Ok(Started::Pending(id)),
            }
        }
    }
}

/// `agent-options` as `agent-start` lifts it: its strings left in the guest's memory until
/// a call that must wait takes copies (a memo hit takes none).
#[derive(ComponentType, Lift)]
#[component(record)]
struct BorrowedOptions {
    label: Option<WasmStr>,
    schema: Option<WasmStr>,
    model: Option<WasmStr>,
    limits: BorrowedLimits,
}

/// `agent-limits` as `agent-start` lifts it.
#[derive(ComponentType, Lift)]
#[component(record)]
struct BorrowedLimits {
    #[component(name = "max-turns")]
    max_turns: Option<u32>,
    #[component(name = "max-duration-seconds")]
    max_duration_seconds: Option<f64>,
    #[component(name = "wrap-up")]
    wrap_up: Option<WasmStr>,
}

/// Define `agents.agent-start` over the generated one: the same semantics, its strings
/// read in place.
pub(super) fn shadow_agent_start(linker: &mut Linker<RunData>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let defined = linker.instance("agent:factory/agents@0.1.0")?.func_wrap(
        "agent-start",
        |mut store: StoreContextMut<'_, RunData>, (prompt, options): (WasmStr, BorrowedOptions)| {
            let start = {
                let view = &store;
                let text = |s: &Option<WasmStr>| s.as_ref().map(|s| s.to_str(view)).transpose();
                let limits = AgentLimits {
                    max_turns: options.limits.max_turns,
                    max_duration_seconds: options.limits.max_duration_seconds,
                    wrap_up: text(&options.limits.wrap_up)?.map(Cow::into_owned),
                };
                let (label, schema, model) = (text(&options.label)?, text(&options.schema)?, text(&options.model)?);
                view.data().run.agents.start(prompt.to_str(view)?, label, schema, model, limits)
            };
            Ok((started(store.data_mut(), start).map_err(wit::Abort::from),))
        },
    );
    linker.allow_shadowing(false);
    defined
}

impl agents::Host for RunData {
    fn agent_ready(&mut self, prompt: String, options: wit::AgentOptions) -> wasmtime::Result<Result<wit::ReadyReply, wit::Abort>> {
        // What `agent` answers inside its hook call, by a synchronous call; a call that
        // must wait is dropped here (its admission undone) and made by `agent`.
        Ok(match start(&self.run.agents, prompt, options) {
            Start::Hit(reply) => Ok(wit::ReadyReply::Reply(owned(reply))),
            Start::Refused(abort) => Err(abort.into()),
            Start::Call(_) => Ok(wit::ReadyReply::MustWait),
        })
    }

    fn agent_start(&mut self, prompt: String, options: wit::AgentOptions) -> wasmtime::Result<Result<wit::Started, wit::Abort>> {
        // Admission, the memo key and a memo hit as in `agent`; a call that must wait is
        // polled once and, unless that answered it, kept for `agent-wait`.
        // Shadowed by [`shadow_agent_start`]'s definition, which reads the same call in place.
        let call = start(&self.run.agents, prompt, options);
        Ok(match started(self, call) {
            Ok(Started::Reply(reply)) => Ok(wit::Started::Reply(owned(reply))),
            Ok(Started::Pending(id)) => Ok(wit::Started::Pending(id)),
            Err(abort) => Err(abort.into()),
        })
    }
}

impl agents::HostWithStore<RunData> for HasSelf<RunData> {
    async fn agent(
        accessor: &Accessor<RunData, Self>,
        prompt: String,
        options: wit::AgentOptions,
    ) -> wasmtime::Result<Result<Option<String>, wit::Abort>> {
        // Admission, the memo key and a memo hit need no wait: answered here, in the hook call.
        let started = accessor.with(|mut access| {
            let run = &access.get().run;
            match start(&run.agents, prompt, options) {
                Start::Hit(reply) => Err(Ok(owned(reply))),
                Start::Refused(abort) => Err(Err(abort)),
                Start::Call(call) => Ok((run.agents.clone(), run.attempt.clone(), call)),
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

    async fn agent_wait(accessor: &Accessor<RunData, Self>) -> wasmtime::Result<Vec<wit::Finished>> {
        // Polled through the store data each time: the calls live there, not in this future.
        let done = std::future::poll_fn(|cx| accessor.with(|mut access| access.get().started.poll_done(cx))).await;
        Ok(done.into_iter().map(|(call, outcome)| wit::Finished { call, outcome: outcome.map_err(Into::into) }).collect())
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
