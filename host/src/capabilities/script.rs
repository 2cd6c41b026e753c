//! `agent:factory/script`: the factory's source and the modules it imports, for the JS
//! runner. Linked only into the linker of script factories ([`super::script_linker`]); a
//! component of world `factory` that imports it is refused at load. Resolution, reading
//! and recording are [`crate::guests::modules`]'s; this only carries the answers across.

use crate::sandbox::contract::script_runner::agent::factory::script;
use crate::sandbox::RunData;

impl RunData {
    fn script_of(&self) -> wasmtime::Result<&crate::guests::script::Script> {
        self.script
            .as_deref()
            .ok_or_else(|| wasmtime::Error::msg("this component is not a script factory: it has no source"))
    }
}

impl script::Host for RunData {
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
