//! What a run records about the backend that answered it ([`BackendRef`]: a spec or config
//! name, the model given with it, a fingerprint of the configuration it was built from, and
//! the *name* of the variable that held its key — never a secret or an environment value),
//! the [`BackendCatalog`] that builds a backend again from such a record on resume, and
//! [`Identified`], the wrapper that carries a record next to the backend it describes.

use super::{AgentBackend, AgentReply, AgentRequest, BackendError};
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The backend of one attempt, as the run records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

/// Builds a backend from a recorded [`BackendRef`] (with the configuration as it is now).
pub trait BackendCatalog: Send + Sync + 'static {
    /// Build the backend `reference` names, with its model.
    fn build(&self, reference: &BackendRef) -> Result<Arc<dyn AgentBackend>, BackendUnavailable>;

    /// The backend a new run uses when it names none (`None`: the host's own default).
    fn default_name(&self) -> Option<String> {
        None
    }
}

/// The built-in backends only (`dry-run`, `script:FILE`, `openai`, `anthropic`,
/// `cli:PRESET`, `replay:FILE`): what a library host resolves without a config file.
pub struct BuiltinCatalog;

impl BackendCatalog for BuiltinCatalog {
    fn build(&self, reference: &BackendRef) -> Result<Arc<dyn AgentBackend>, BackendUnavailable> {
        super::from_spec_with_model(&reference.name, reference.model.as_deref()).map_err(|e| BackendUnavailable {
            backend: reference.display(),
            missing: e.to_string(),
        })
    }
}

/// A backend with the record that names it (what [`AgentBackend::reference`] answers).
pub struct Identified {
    inner: Arc<dyn AgentBackend>,
    reference: BackendRef,
}

impl Identified {
    /// `inner`, recorded as `reference` (its `key_env` is filled in from `inner`).
    pub fn new(inner: Arc<dyn AgentBackend>, mut reference: BackendRef) -> Self {
        if reference.key_env.is_none() {
            reference.key_env = inner.reference().key_env;
        }
        Identified { inner, reference }
    }
}

impl AgentBackend for Identified {
    fn name(&self) -> String {
        self.inner.name()
    }

    fn call(&self, request: Arc<AgentRequest>) -> BoxFuture<'static, Result<AgentReply, BackendError>> {
        self.inner.call(request)
    }

    fn reference(&self) -> BackendRef {
        self.reference.clone()
    }

    fn unpriced(&self, model: Option<&str>) -> Option<String> {
        self.inner.unpriced(model)
    }
}
