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

/// Why the backend a run recorded cannot be built now. Its source is the error that building
/// it failed with, when it did.
#[derive(Debug, Clone)]
pub struct BackendUnavailable {
    /// The recorded backend, as shown to the user.
    pub backend: String,
    /// What is missing (a key variable, a record, ...), or why it could not be built.
    pub missing: Unbuilt,
}

impl std::fmt::Display for BackendUnavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "backend_unavailable: backend `{}` cannot be used: {}", self.backend, self.missing)
    }
}

impl std::error::Error for BackendUnavailable {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.missing {
            Unbuilt::Missing(_) => None,
            Unbuilt::Failed { error, .. } => Some(&**error),
        }
    }
}

/// Why a recorded backend cannot be built: something missing, said in words, or the error
/// building it failed with (its config entry gone or invalid, an unknown name).
#[derive(Debug, Clone)]
pub enum Unbuilt {
    /// What is missing, and what to do.
    Missing(String),
    /// Building it failed with `error`; `hint` says what to do, when something does.
    Failed { error: std::sync::Arc<dyn std::error::Error + Send + Sync>, hint: Option<String> },
}

impl Unbuilt {
    /// Building the backend failed with `error`.
    pub fn failed(error: impl std::error::Error + Send + Sync + 'static) -> Unbuilt {
        Unbuilt::Failed { error: std::sync::Arc::new(error), hint: None }
    }

    /// This, with `hint` (what to do) after it.
    pub fn hinted(self, hint: &str) -> Unbuilt {
        match self {
            Unbuilt::Missing(what) => Unbuilt::Missing(format!("{what} — {hint}")),
            Unbuilt::Failed { error, .. } => Unbuilt::Failed { error, hint: Some(hint.to_string()) },
        }
    }
}

impl std::fmt::Display for Unbuilt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unbuilt::Missing(what) => f.write_str(what),
            Unbuilt::Failed { error, hint: None } => write!(f, "{error}"),
            Unbuilt::Failed { error, hint: Some(hint) } => write!(f, "{error} — {hint}"),
        }
    }
}

impl From<String> for Unbuilt {
    fn from(missing: String) -> Self {
        Unbuilt::Missing(missing)
    }
}

impl From<&str> for Unbuilt {
    fn from(missing: &str) -> Self {
        Unbuilt::Missing(missing.to_string())
    }
}
