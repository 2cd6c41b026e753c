//! What the engine puts in a run's store: [`RunState`], the host part of the sandbox's
//! [`RunData`], built for each attempt (and each `meta` call) from the attempt's
//! [`Capabilities`], the calls `agents.agent-start` started in that store, and a script
//! factory's source. The capabilities reach their part of it through their views (the
//! `*View` traits of [`crate::capabilities`]), which it implements, as an embedder's state
//! implements wasmtime-wasi's `WasiView`; the sandbox holds it without looking inside. A
//! component linked against that store data, with the script it runs if any, is a
//! [`LoadedComponent`].

use crate::capabilities::attempt::{Attempt, AttemptView};
use crate::capabilities::progress::{Progress, ProgressView};
use crate::capabilities::script::ScriptView;
use crate::capabilities::started::{AgentsCtx, AgentsView, Started};
use crate::capabilities::steps::{Steps, StepsView};
use crate::capabilities::Capabilities;
use crate::guests::script::Script;
use crate::sandbox::component::{CompileOrigin, LinkedComponent};
use crate::sandbox::contract::FactoryPre;
use crate::sandbox::{self, RunData, SandboxLimits};
use std::sync::Arc;
use wasmtime::component::Linker;
use wasmtime::Engine;

/// The engine's state in one store: what the hooks of its guest reach.
pub(crate) struct RunState {
    /// The attempt's capabilities (shared with the engine, which reads the attempt's end).
    caps: Arc<Capabilities>,
    /// The agent calls `agents.agent-start` started: they end with the store.
    started: Started,
    /// The source of a script factory (`None` for components).
    script: Option<Arc<Script>>,
}

/// A store of the engine's: the sandbox's data around a [`RunState`].
pub(crate) type RunStore = wasmtime::Store<RunData<RunState>>;

/// A linker for the engine's stores: [`crate::capabilities::linker`] over [`RunState`].
pub(crate) type RunLinker = Linker<RunData<RunState>>;

impl AttemptView for RunState {
    fn attempt(&self) -> &Arc<Attempt> {
        &self.caps.attempt
    }
}

impl StepsView for RunState {
    fn steps(&self) -> &Steps {
        &self.caps.steps
    }
}

impl ProgressView for RunState {
    fn progress(&self) -> &Progress {
        &self.caps.progress
    }
}

impl AgentsView for RunState {
    fn agents(&mut self) -> AgentsCtx<'_> {
        AgentsCtx { agents: &self.caps.agents, started: &mut self.started }
    }
}

impl ScriptView for RunState {
    fn script(&self) -> Option<&Script> {
        self.script.as_deref()
    }
}

/// A new store for an attempt with `caps`, running `component` (its script, if any, is the
/// source the store serves); `grants` are the run's checked read-only directories.
pub(crate) fn new_store(
    engine: &Engine,
    limits: &SandboxLimits,
    caps: Arc<Capabilities>,
    component: &LoadedComponent,
    grants: &[String],
) -> wasmtime::Result<RunStore> {
    let state = RunState { caps, started: Started::default(), script: component.script.clone() };
    sandbox::new_store(engine, limits, state, grants)
}

/// The linker of plain components: the factory world and WASI.
pub(crate) fn linker(engine: &Engine) -> wasmtime::Result<RunLinker> {
    crate::capabilities::linker(engine)
}

/// The linker of the JS runner: [`linker`] plus `agent:factory/script`.
pub(crate) fn script_linker(engine: &Engine) -> wasmtime::Result<RunLinker> {
    crate::capabilities::script_linker(engine)
}

/// A compiled, linked, checked factory component, ready to instantiate in the engine's
/// stores; a script factory is the JS runner's with the script as its source.
#[derive(Clone)]
pub struct LoadedComponent {
    /// sha256 of the component bytes (hex).
    pub hash: String,
    /// The imports the component declares (`agent:factory/ctx@0.1.0`, ...).
    pub imports: Vec<String>,
    /// How the compiled artifact was obtained.
    pub origin: CompileOrigin,
    /// The component bytes (stored content-addressed with the runs that use them).
    pub bytes: Arc<[u8]>,
    /// A script factory's source (the component is then the JS runner).
    pub script: Option<Arc<Script>>,
    pub(crate) pre: FactoryPre<RunData<RunState>>,
}

impl From<LinkedComponent<RunData<RunState>>> for LoadedComponent {
    fn from(linked: LinkedComponent<RunData<RunState>>) -> Self {
        let LinkedComponent { hash, imports, origin, bytes, pre } = linked;
        LoadedComponent { hash, imports, origin, bytes, script: None, pre }
    }
}

impl LoadedComponent {
    /// This (runner) component with `script` as its source.
    pub fn with_script(mut self, script: Script) -> Self {
        self.script = Some(Arc::new(script));
        self
    }
}

impl std::fmt::Debug for LoadedComponent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedComponent")
            .field("hash", &self.hash)
            .field("imports", &self.imports)
            .field("script", &self.script.as_ref().map(|s| s.reference()))
            .finish()
    }
}
