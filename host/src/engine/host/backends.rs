//! Which backend an attempt runs on: the one a new run chose, the one a resumed run recorded,
//! or the one a queued start names, built here; and the callers' directories hidden from it.

use super::{BackendChoice, Host};
use crate::backend::{AgentBackend, BackendRef, BackendUnavailable};
use crate::error::Error;
use crate::store::RunRecord;
use std::path::PathBuf;
use std::sync::Arc;

/// `backend` with the working directories of the run's callers in other processes
/// ([`RunRecord::caller_dirs`]) hidden from its spawns unless granted.
pub(super) fn caller_hidden(backend: Arc<dyn AgentBackend>, record: &RunRecord) -> Arc<dyn AgentBackend> {
    if record.caller_dirs.is_empty() {
        return backend;
    }
    let unless_granted = record.caller_dirs.iter().map(PathBuf::from).collect();
    let hidden = crate::backend::Hidden { sealed: Vec::new(), unless_granted };
    backend.hiding(&hidden).unwrap_or(backend)
}

impl Host {
    /// The backend `reference` names, built here (its key variable must be set).
    pub(super) fn backend_of(&self, reference: &BackendRef) -> Result<Arc<dyn AgentBackend>, Error> {
        match self.reused_backend(reference)? {
            Some(backend) => Ok(backend),
            None => Ok(self.config.catalog.build(reference)?),
        }
    }

    /// What is decided before the catalog builds `reference`: refused when the variable
    /// that held its API key is not set; the host's own backend when it is that one (reused,
    /// not built again); `None` when the catalog must build it.
    fn reused_backend(&self, reference: &BackendRef) -> Result<Option<Arc<dyn AgentBackend>>, Error> {
        if let Some(var) = &reference.key_env {
            if std::env::var(var).map_or(true, |v| v.trim().is_empty()) {
                return Err(BackendUnavailable {
                    backend: reference.display(),
                    missing: format!("the variable `{var}` that held its API key is not set").into(),
                }
                .into());
            }
        }
        let default = self.config.backend.reference();
        let same =
            default.name == reference.name && default.model == reference.model && default.config == reference.config;
        Ok(same.then(|| self.config.backend.clone()))
    }

    /// The backend a new run uses for `choice`: the host's default when it is empty, else
    /// one the catalog builds (a model alone goes with the default backend's name).
    pub fn chosen_backend(&self, choice: &BackendChoice) -> Result<Arc<dyn AgentBackend>, Error> {
        let name = match choice.name.clone().or_else(|| self.config.catalog.default_name()) {
            Some(name) => name,
            None if choice.model.is_none() => return Ok(self.config.backend.clone()),
            None => self.config.backend.reference().name,
        };
        let reference = BackendRef { model: choice.model.clone(), ..BackendRef::named(name) };
        Ok(self.config.catalog.build(&reference)?)
    }

    /// The backend a caller's resume of run `run_id` (as `scope` sees it) runs on for
    /// `choice`: the one its last attempt recorded, or the one `choice` names.
    pub async fn resumed_backend(
        &self,
        scope: &crate::model::scope::Scope,
        run_id: &str,
        choice: &BackendChoice,
    ) -> Result<Arc<dyn AgentBackend>, Error> {
        let record = self.record(scope, run_id).await?;
        self.recorded_backend(&record, choice)
    }

    /// The backend a resume of `record` uses: the one its last attempt recorded (with the
    /// model or name `choice` changes), built again — never a silent fallback.
    pub(super) fn recorded_backend(
        &self,
        record: &RunRecord,
        choice: &BackendChoice,
    ) -> Result<Arc<dyn AgentBackend>, Error> {
        let recorded = record.backends.last().cloned();
        let reference = match (&choice.name, recorded) {
            (Some(name), _) => BackendRef { model: choice.model.clone(), ..BackendRef::named(name.clone()) },
            (None, Some(recorded)) => BackendRef { model: choice.model.clone().or(recorded.model.clone()), ..recorded },
            (None, None) => {
                return Err(BackendUnavailable {
                    backend: "(not recorded)".into(),
                    missing: "the run was started before factory recorded backends; resume it with --backend NAME"
                        .into(),
                }
                .into())
            }
        };
        if let Some(backend) = self.reused_backend(&reference)? {
            return Ok(backend);
        }
        self.config.catalog.build(&reference).map_err(|mut e| {
            if choice.name.is_none() {
                e.missing = e.missing.hinted(
                    "the run recorded it; put its configuration back, or resume on another backend with --backend",
                );
            }
            e.into()
        })
    }
}
