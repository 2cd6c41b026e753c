//! `agent:factory/script`: the factory's source and the modules it imports, for the JS
//! runner. Linked only into the linker of script factories ([`super::script_linker`]); a
//! component of world `factory` that imports it is refused at load. The hooks reach the
//! source of the store's run through [`ScriptView`]. Resolution, reading and recording are
//! [`crate::guests::modules`]'s; this only carries the answers across.

use crate::guests::script::Script;
use crate::sandbox::contract::script_runner::agent::factory::script;
use crate::sandbox::RunData;
use wasmtime::component::{HasData, Linker};

/// How the hooks reach the source of the script factory a store runs (the run's state in
/// the store data implements it).
pub(crate) trait ScriptView: Send + 'static {
    /// The source (`None` for a component, which has none).
    fn script(&self) -> Option<&Script>;
}

/// What `agent:factory/script` reaches of a store: the source of its run, if any.
pub(crate) struct ScriptHost<'a>(Option<&'a Script>);

/// `agent:factory/script`'s data in the linker: a [`ScriptHost`].
struct HasScript;

impl HasData for HasScript {
    type Data<'a> = ScriptHost<'a>;
}

/// The getter of [`HasScript`]: the view of the store's host state.
fn script_of<S: ScriptView>(data: &mut RunData<S>) -> ScriptHost<'_> {
    ScriptHost(data.host().script())
}

/// Add `agent:factory/script` to `linker`, served by the source the host state `S` of each
/// store lends.
pub(super) fn add_to_linker<S: ScriptView>(linker: &mut Linker<RunData<S>>) -> wasmtime::Result<()> {
    script::add_to_linker::<RunData<S>, HasScript>(linker, script_of::<S>)
}

impl ScriptHost<'_> {
    fn script_of(&self) -> wasmtime::Result<&Script> {
        self.0.ok_or_else(|| wasmtime::Error::msg("this component is not a script factory: it has no source"))
    }
}

impl script::Host for ScriptHost<'_> {
    fn source(&mut self) -> wasmtime::Result<script::ScriptSource> {
        let s = self.script_of()?;
        Ok(script::ScriptSource { file_name: s.file_name.clone(), text: s.js.to_string(), entry: s.entry.clone() })
    }

    fn resolve(&mut self, specifier: String, referrer: String) -> wasmtime::Result<Result<String, String>> {
        Ok(self.script_of()?.modules.resolve(&specifier, &referrer).map_err(|e| e.brief()))
    }

    fn load(&mut self, name: String) -> wasmtime::Result<Result<String, String>> {
        Ok(self.script_of()?.modules.load(&name).map(|js| js.to_string()).map_err(|e| e.brief()))
    }
}
