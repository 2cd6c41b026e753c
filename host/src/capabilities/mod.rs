//! The capabilities a guest gets, each one module that owns its semantics and per-run
//! state (as Spin's factors do): [`steps`] (`ctx.step-get`/`step-put`), [`agents`]
//! (`agents.agent`: memo, limits, accounting), [`started`] (the calls `agents.agent-start`
//! started and `agents.agent-wait` reports), [`progress`] (`ctx.phase`/`ctx.log`),
//! [`sleep`] (`agents.sleep`), [`checkpoints`] (`ctx.pause`) and `script` (a script factory's source). What they share of
//! one attempt (identity, limits, the stop signal of [`stop`], the journal view and the
//! progress journal) is [`attempt::Attempt`]. [`Capabilities`] is one attempt's set, which the run
//! engine builds and the sandbox's store data holds; `bindings` binds the WIT interfaces
//! to the capability behind each function. [`linker`] adds the factory world and
//! deny-by-default WASI to one linker that serves every component of a host, and
//! [`script_linker`] adds `script` too, for the JS runner.

pub(crate) mod abort;
pub(crate) mod agents;
pub(crate) mod attempt;
mod bindings;
pub(crate) mod cache;
pub(crate) mod checkpoints;
pub(crate) mod progress;
mod script;
pub(crate) mod set;
pub(crate) mod sleep;
pub(crate) mod started;
pub(crate) mod steps;
pub(crate) mod stop;

use crate::sandbox::RunData;
pub(crate) use set::Capabilities;
use wasmtime::component::{HasSelf, Linker};
use wasmtime::Engine;

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
