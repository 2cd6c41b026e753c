//! `agent:factory/script`: the factory's source, for the JS runner. Linked only into the
//! linker of script factories ([`super::script_linker`]); a component of world `factory`
//! that imports it is refused at load.

use crate::sandbox::contract::script_runner::agent::factory::script;
use crate::sandbox::RunData;

impl script::Host for RunData {
    fn source(&mut self) -> wasmtime::Result<script::ScriptSource> {
        let Some(s) = &self.script else {
            return Err(wasmtime::Error::msg("this component is not a script factory: it has no source"));
        };
        Ok(script::ScriptSource { file_name: s.file_name.clone(), text: s.js.to_string(), entry: s.entry.clone() })
    }
}
