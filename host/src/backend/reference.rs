//! The [`BackendCatalog`] that builds a backend again from what a run recorded
//! ([`BackendRef`], in `recorded`) on resume, and [`Identified`], the wrapper that carries a
//! record next to the backend it describes.

use super::recorded::{BackendRef, BackendUnavailable, Unbuilt};
use super::{AgentBackend, AgentReply, AgentRequest, BackendError};
use futures::future::BoxFuture;
use std::sync::Arc;

/// Builds a backend from a recorded [`BackendRef`] (with the configuration as it is now).
pub trait BackendCatalog: Send + Sync + 'static {
    /// Build the backend `reference` names, with its model.
    fn build(&self, reference: &BackendRef) -> Result<Arc<dyn AgentBackend>, BackendUnavailable>;

    /// The backend a new run uses when it names none (`None`: the host's own default).
    fn default_name(&self) -> Option<String> {
        None
    }

    /// Files the catalog was read from, which no run's agent-CLI sandbox may see (a config
    /// file may name a store's password or keys' variables).
    fn hidden_files(&self) -> Vec<std::path::PathBuf> {
        Vec::new()
    }
}

/// The built-in backends only (`dry-run`, `script:FILE`, `openai`, `anthropic`,
/// `cli:PRESET`, `replay:FILE`): what a library host resolves without a config file.
pub struct BuiltinCatalog;

impl BackendCatalog for BuiltinCatalog {
    fn build(&self, reference: &BackendRef) -> Result<Arc<dyn AgentBackend>, BackendUnavailable> {
        super::from_spec_with_model(&reference.name, reference.model.as_deref())
            .map_err(|e| BackendUnavailable { backend: reference.display(), missing: Unbuilt::failed(e) })
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

    fn free_notice(&self, model: Option<&str>) -> Option<String> {
        self.inner.free_notice(model)
    }

    fn with_grants(&self, grants: &[String]) -> Option<Arc<dyn AgentBackend>> {
        let inner = self.inner.with_grants(grants)?;
        Some(Arc::new(Identified { inner, reference: self.reference.clone() }))
    }

    fn hiding(&self, hidden: &super::Hidden) -> Option<Arc<dyn AgentBackend>> {
        let inner = self.inner.hiding(hidden)?;
        Some(Arc::new(Identified { inner, reference: self.reference.clone() }))
    }

    fn flows(&self) -> Vec<Arc<super::flow::Flow>> {
        self.inner.flows()
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }
}
