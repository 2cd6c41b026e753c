//! TypeScript: type-stripped to JavaScript before the runner sees it.

use crate::script::ScriptError;

/// Strip the types of the TypeScript module `text` (from `file_name`).
pub fn strip(file_name: &str, _text: &str) -> Result<String, ScriptError> {
    Err(ScriptError::TypeScript(format!("{file_name}: TypeScript factories are not supported yet; write JavaScript")))
}
