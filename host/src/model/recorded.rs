//! What a run records about the backend that answered an attempt ([`BackendRef`]: a spec or
//! config name, the model given with it, a fingerprint of the configuration it was built
//! from, and the *name* of the variable that held its key — never a secret or an environment
//! value), and [`BackendUnavailable`], why such a record cannot be built again. Plain data:
//! the envelope and the store depend on it, and it depends on nothing of the host.

use serde::{Deserialize, Serialize};

/// The backend of one attempt, as the run records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackendRef {
    /// The spec or config name: `dry-run`, `openai`, `cli:claude`, `script:/abs/rules.json`,
    /// `replay:/abs/cassette.jsonl`, or a backend named in `factory.toml`.
    pub name: String,
    /// The model given with it (`--model`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// sha256 of the configuration it was built from (its `factory.toml` entry and the
    /// routes), when it came from a config file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<String>,
    /// The environment variable that held its API key when the attempt started (the name
    /// only), so a resume without it fails before it starts instead of answering 401s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_env: Option<String>,
}

impl BackendRef {
    /// A reference to `name` with no model, config or key.
    pub fn named(name: impl Into<String>) -> Self {
        BackendRef { name: name.into(), model: None, config: None, key_env: None }
    }

    /// `name`, or `name (model M)` — how errors and `show` name it.
    pub fn display(&self) -> String {
        match &self.model {
            Some(model) => format!("{} (model {model})", self.name),
            None => self.name.clone(),
        }
    }
}

/// Why the backend a run recorded cannot be built now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("backend_unavailable: backend `{backend}` cannot be used: {missing}")]
pub struct BackendUnavailable {
    /// The recorded backend, as shown to the user.
    pub backend: String,
    /// What is missing (a config entry, a key variable, ...), and what to do.
    pub missing: String,
}
