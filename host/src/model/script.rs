//! What a run or a registration records of a script factory: a reference to its source
//! ([`ScriptRef`]; the text is a stored blob) and the [`Manifest`] of the modules it loaded,
//! so a resume runs the same code. Plain data, shared by the guest loader that fills it and
//! the store that keeps it.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What a run or registration records of a script factory (the text is a stored blob).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScriptRef {
    /// sha256 of the source text.
    pub sha256: String,
    /// The file name shown in stack traces.
    pub file_name: String,
    /// The factory of the file that runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<String>,
    /// sha256 of the [`Manifest`] (a stored blob) of the modules it had loaded when this was
    /// recorded (its static imports); `None`: it imports nothing. A run's complete record of
    /// its modules is the store's `run_modules`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modules: Option<String>,
}

/// What a run records of the modules it loaded (JSON in the store).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// The factory's directory (canonical), where modules not yet loaded are read from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
    /// Module name -> sha256 of its text as written (a blob in the store).
    pub modules: BTreeMap<String, String>,
    /// Every answered (referrer, specifier) -> module name.
    pub resolved: Vec<Resolution>,
}

/// One answered import.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Resolution {
    /// The importing module.
    pub referrer: String,
    /// What it imported.
    pub specifier: String,
    /// The module it got.
    pub name: String,
}
