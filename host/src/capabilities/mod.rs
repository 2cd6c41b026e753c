//! The capabilities a guest gets, one module each (`ctx`: journal, progress, identity;
//! `agents`: subagents and sleep; `script`: a script factory's source), written against
//! [`view::RunView`] (what they need of a run), and [`linker`],
//! which adds the first two and deny-by-default WASI to one linker that serves every
//! component of a host, and [`script_linker`], which adds `script` too, for the JS runner.

mod agents;
mod ctx;
mod script;
pub(crate) mod view;

use crate::sandbox::contract::agent::factory::types as wit;
use crate::engine::abort::{Abort, LimitKind, StepError};
use crate::sandbox::RunData;
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
