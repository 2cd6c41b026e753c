//! The capabilities a guest gets, each one module that owns its semantics and per-run
//! state (as Spin's factors do): [`steps`] (`ctx.step-get`/`step-put`), [`agents`]
//! (`agents.agent`: memo, limits, accounting), [`started`] (the calls `agents.agent-start`
//! started and `agents.agent-wait` reports), [`progress`] (`ctx.phase`/`ctx.log`),
//! [`sleep`] (`agents.sleep`), [`checkpoints`] (`ctx.pause`) and [`script`] (a script factory's source). What they share of
//! one attempt (identity, limits, the stop signal of [`stop`], the journal view and the
//! progress journal) is [`attempt::Attempt`]. [`Capabilities`] is one attempt's set, which
//! the run engine builds. The capabilities never see the store's data: each reaches its
//! per-run state through a view trait (as wasmtime-wasi reaches WASI through `WasiView`:
//! [`attempt::AttemptView`], [`steps::StepsView`], [`progress::ProgressView`],
//! [`started::AgentsView`], [`script::ScriptView`]) that the host state in the sandbox's
//! [`RunData`] implements (the engine's), and `bindings` adds the WIT interfaces to the
//! linker with getters that go through those views. [`linker`] adds the factory world to
//! the sandbox's linker (deny-by-default WASI) that serves every component of a host, and
//! [`script_linker`] adds `script` too, for the JS runner.

pub(crate) mod abort;
pub(crate) mod agents;
pub(crate) mod attempt;
mod bindings;
pub(crate) mod cache;
pub(crate) mod checkpoints;
pub(crate) mod progress;
pub(crate) mod script;
pub(crate) mod set;
pub(crate) mod sleep;
pub(crate) mod started;
pub(crate) mod steps;
pub(crate) mod stop;

use crate::sandbox::RunData;
pub(crate) use set::Capabilities;
use wasmtime::component::Linker;
use wasmtime::Engine;

/// What the host state of a store must lend for the factory world's hooks: the views of
/// every capability but the script's.
pub(crate) trait HookViews:
    attempt::AttemptView + steps::StepsView + progress::ProgressView + started::AgentsView
{
}

impl<S> HookViews for S where S: attempt::AttemptView + steps::StepsView + progress::ProgressView + started::AgentsView {}

/// A linker with the factory world's imports and WASI p2, for stores whose host state is `S`.
pub(crate) fn linker<S: HookViews>(engine: &Engine) -> wasmtime::Result<Linker<RunData<S>>> {
    let mut linker = crate::sandbox::linker(engine)?;
    bindings::add_to_linker(&mut linker)?;
    Ok(linker)
}

/// [`linker`] plus `agent:factory/script`: the linker of script factories (the JS runner).
pub(crate) fn script_linker<S: HookViews + script::ScriptView>(
    engine: &Engine,
) -> wasmtime::Result<Linker<RunData<S>>> {
    let mut linker = linker(engine)?;
    script::add_to_linker(&mut linker)?;
    Ok(linker)
}
