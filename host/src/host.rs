//! [`Host`]: the library's front door. It owns the engine, the linker, the component loader,
//! the journal and the backend, and the table of runs; it loads factories, starts, resumes
//! and cancels runs, and answers questions about them.

use crate::backend::{AgentBackend, DryRun};
use crate::component::{ComponentLoader, LoadedComponent};
use crate::envelope::{Accounting, RunEnvelope, RunStatus};
use crate::error::Error;
use crate::journal::{Journal, MemoryJournal};
use crate::limits::Limits;
use crate::meta::FactoryMeta;
use crate::progress::{ProgressEntry, ProgressEvent};
use crate::run::{self, AgentSummary, AttemptSetup, RunShared};
use crate::sandbox::{self, RunData, SandboxLimits};
use crate::schema::Schema;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use wasmtime::component::Linker;
use wasmtime::Engine;

/// How a [`Host`] is set up.
pub struct HostConfig {
    /// Where compiled components are cached (`None`: no cache).
    pub cache_dir: Option<PathBuf>,
    /// Who runs subagents.
    pub backend: Arc<dyn AgentBackend>,
    /// Where journal entries go.
    pub journal: Arc<dyn Journal>,
    /// Host-side sandbox limits.
    pub sandbox: SandboxLimits,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            cache_dir: default_cache_dir(),
            backend: Arc::new(DryRun),
            journal: Arc::new(MemoryJournal::new()),
            sandbox: SandboxLimits::default(),
        }
    }
}

/// `$FACTORY_CACHE_DIR`, else `$XDG_CACHE_HOME/factory`, else `~/.cache/factory`.
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("FACTORY_CACHE_DIR") {
        return Some(PathBuf::from(dir));
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(dir).join("factory"));
    }
    std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache").join("factory"))
}

/// A loaded factory: its compiled component and its checked metadata.
#[derive(Debug, Clone)]
pub struct Factory {
    /// The component (hash, imports, compiled code).
    pub component: LoadedComponent,
    /// What it declares.
    pub meta: FactoryMeta,
}

/// Per-invocation options of [`Host::run`] and [`Host::resume`].
#[derive(Default)]
pub struct RunOptions {
    /// Arguments (`{}` when `None`).
    pub args: Option<serde_json::Value>,
    /// Limit overrides (each present one replaces the declared one).
    pub limits: Limits,
    /// Receives every progress entry as it happens.
    pub events: Option<mpsc::UnboundedSender<ProgressEntry>>,
    /// Called with the run id once the run exists (before it executes).
    pub on_start: Option<Box<dyn FnOnce(&str) + Send>>,
}

/// A run with its phases, agent summaries and progress.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunDetail {
    /// The envelope.
    #[serde(flatten)]
    pub envelope: RunEnvelope,
    /// Effective limits of the latest attempt.
    pub limits: Limits,
    /// Phases entered, in order.
    pub phases: Vec<String>,
    /// Agent summaries (no prompts).
    pub agents: Vec<AgentSummary>,
    /// Progress entries.
    pub progress: Vec<ProgressEntry>,
    /// Component hash of each attempt.
    pub component_hashes: Vec<String>,
}

/// What the host remembers of one run.
struct RunRecord {
    envelope: RunEnvelope,
    args: String,
    overrides: Limits,
    limits: Limits,
    progress: Vec<ProgressEntry>,
    agents: Vec<AgentSummary>,
    component_hashes: Vec<String>,
    stop: Option<CancellationToken>,
}

/// The factory host.
pub struct Host {
    engine: Engine,
    linker: Linker<RunData>,
    loader: ComponentLoader,
    config: HostConfig,
    runs: Mutex<Vec<RunRecord>>,
}

fn timestamp() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

impl Host {
    /// A host with `config`.
    pub fn new(config: HostConfig) -> Result<Self, Error> {
        let engine = sandbox::engine().map_err(|e| Error::Engine(format!("{e:#}")))?;
        let linker = crate::hooks::linker(&engine).map_err(|e| Error::Engine(format!("{e:#}")))?;
        let loader = ComponentLoader::new(engine.clone(), config.cache_dir.clone());
        Ok(Host { engine, linker, loader, config, runs: Mutex::new(Vec::new()) })
    }

    /// The sandbox limits every run of this host gets.
    pub fn sandbox_limits(&self) -> &SandboxLimits {
        &self.config.sandbox
    }

    /// The backend's name.
    pub fn backend_name(&self) -> String {
        self.config.backend.name()
    }

    /// Load a component file and read its metadata.
    pub async fn load_file(&self, path: &Path) -> Result<Factory, Error> {
        let component = self.loader.load_file(&self.linker, path)?;
        self.with_meta(component).await
    }

    /// Load a component from bytes and read its metadata.
    pub async fn load_bytes(&self, bytes: &[u8]) -> Result<Factory, Error> {
        let component = self.loader.load_bytes(&self.linker, bytes)?;
        self.with_meta(component).await
    }

    async fn with_meta(&self, component: LoadedComponent) -> Result<Factory, Error> {
        let setup = AttemptSetup {
            run_id: String::new(),
            limits: Limits::default(),
            sandbox: self.config.sandbox.clone(),
            journal: Arc::new(MemoryJournal::new()),
            backend: self.config.backend.clone(),
            prior: Accounting::default(),
            next_seq: 0,
            events: None,
            stop: CancellationToken::new(),
        };
        let shared = RunShared::new(setup).map_err(|f| Error::MetaCall(f.message))?;
        let mut store = sandbox::new_store(&self.engine, &self.config.sandbox, shared)
            .map_err(|e| Error::MetaCall(format!("{e:#}")))?;
        let instance = component
            .pre
            .instantiate_async(&mut store)
            .await
            .map_err(|e| Error::MetaCall(run::classify_trap(&e).message))?;
        // `meta` must be cheap: a guest that spins in it runs out of time, not forever.
        let meta = tokio::time::timeout(Duration::from_secs(10), instance.call_meta(&mut store))
            .await
            .map_err(|_| Error::MetaCall("`meta` did not return within 10 s".into()))?
            .map_err(|e| Error::MetaCall(run::classify_trap(&e).message))?;
        let meta = FactoryMeta::from_wit(meta)?;
        Ok(Factory { component, meta })
    }

    fn runs(&self) -> MutexGuard<'_, Vec<RunRecord>> {
        self.runs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Start a run of `factory` and drive it to the end of its first attempt. Returns the
    /// envelope for every outcome; refuses only what fails before the run exists (bad
    /// limits, bad args).
    pub async fn run(&self, factory: &Factory, options: RunOptions) -> Result<RunEnvelope, Error> {
        let limits = factory.meta.limits.overridden_by(&options.limits);
        limits.validate()?;
        let args = options.args.clone().unwrap_or_else(|| serde_json::json!({}));
        if let Some(schema) = &factory.meta.args_schema {
            let schema = Schema::from_value(schema.clone()).map_err(|e| Error::InvalidArgs(e.to_string()))?;
            schema.check(&args).map_err(|m| Error::InvalidArgs(m.to_string()))?;
        }
        let run_id = uuid::Uuid::now_v7().to_string();
        let now = timestamp();
        self.runs().push(RunRecord {
            envelope: RunEnvelope {
                run_id: run_id.clone(),
                factory: factory.meta.name.clone(),
                status: RunStatus::Pending,
                result: None,
                failure: None,
                error: None,
                accounting: Accounting::default(),
                attempts: 0,
                created_at: now.clone(),
                updated_at: now,
                revision: 1,
            },
            args: args.to_string(),
            overrides: options.limits,
            limits,
            progress: Vec::new(),
            agents: Vec::new(),
            component_hashes: Vec::new(),
            stop: None,
        });
        self.attempt(factory, &run_id, options).await
    }

    /// Resume a run that ended without completing: same id, same args, a new attempt in
    /// which every journaled step and agent call replays for free. `options.limits` raise
    /// (or set) limits on top of the run's previous overrides; `options.args` is ignored.
    pub async fn resume(&self, run_id: &str, factory: &Factory, options: RunOptions) -> Result<RunEnvelope, Error> {
        {
            let mut runs = self.runs();
            let record = runs.iter_mut().find(|r| r.envelope.run_id == run_id).ok_or_else(|| Error::NotFound(run_id.into()))?;
            match record.envelope.status {
                RunStatus::Completed => {
                    return Err(Error::NonResumable(format!("run `{run_id}` is completed")))
                }
                RunStatus::Running | RunStatus::Pending => return Err(Error::AlreadyActive(run_id.into())),
                _ => {}
            }
            if record.envelope.factory != factory.meta.name {
                return Err(Error::NonResumable(format!(
                    "run `{run_id}` belongs to factory `{}`, not `{}`",
                    record.envelope.factory, factory.meta.name
                )));
            }
            let overrides = record.overrides.overridden_by(&options.limits);
            let limits = factory.meta.limits.overridden_by(&overrides);
            limits.validate()?;
            record.overrides = overrides;
            record.limits = limits;
            record.envelope.status = RunStatus::Pending;
        }
        self.attempt(factory, run_id, options).await
    }

    /// Execute one attempt of an existing run record.
    async fn attempt(&self, factory: &Factory, run_id: &str, options: RunOptions) -> Result<RunEnvelope, Error> {
        let stop = CancellationToken::new();
        let (args, limits, prior, next_seq, attempt_no) = {
            let mut runs = self.runs();
            let record = runs.iter_mut().find(|r| r.envelope.run_id == run_id).ok_or_else(|| Error::NotFound(run_id.into()))?;
            record.envelope.status = RunStatus::Running;
            record.envelope.attempts += 1;
            record.envelope.revision += 1;
            record.envelope.updated_at = timestamp();
            record.stop = Some(stop.clone());
            record.component_hashes.push(factory.component.hash.clone());
            let next_seq = record.progress.last().map_or(0, |e| e.seq);
            (record.args.clone(), record.limits, record.envelope.accounting, next_seq, record.envelope.attempts)
        };
        if let Some(on_start) = options.on_start {
            on_start(run_id);
        }
        let setup = AttemptSetup {
            run_id: run_id.to_string(),
            limits,
            sandbox: self.config.sandbox.clone(),
            journal: self.config.journal.clone(),
            backend: self.config.backend.clone(),
            prior,
            next_seq,
            events: options.events,
            stop: stop.clone(),
        };
        let prior_active = Duration::from_secs_f64(prior.active_seconds);
        let outcome = match RunShared::new(setup) {
            Err(failure) => Err(failure),
            Ok(shared) => {
                shared.emit(ProgressEvent::AttemptStarted { attempt: attempt_no });
                let budget = limits.timeout_seconds.map(|t| Duration::from_secs_f64(t).saturating_sub(prior_active));
                let outcome = if budget == Some(Duration::ZERO) {
                    shared.abort(run::Abort::Limit(run::LimitKind::TimeoutSeconds));
                    run::execute(&self.engine, &factory.component, shared.clone(), args, Some(Duration::ZERO)).await
                } else {
                    run::execute(&self.engine, &factory.component, shared.clone(), args, budget).await
                };
                shared.emit(ProgressEvent::AttemptEnded { status: outcome.status });
                Ok((outcome, shared))
            }
        };
        let mut runs = self.runs();
        let record = runs.iter_mut().find(|r| r.envelope.run_id == run_id).ok_or_else(|| Error::NotFound(run_id.into()))?;
        record.stop = None;
        let envelope = &mut record.envelope;
        envelope.revision += 1;
        envelope.updated_at = timestamp();
        match outcome {
            Err(failure) => {
                envelope.status = RunStatus::Error;
                envelope.error = Some(failure.message.clone());
                envelope.failure = Some(failure);
            }
            Ok((outcome, shared)) => {
                envelope.status = outcome.status;
                envelope.result = outcome.result;
                envelope.error = outcome.failure.as_ref().map(|f| f.message.clone());
                envelope.failure = outcome.failure;
                envelope.accounting = shared.accounting(prior_active + outcome.active);
                record.progress.extend(shared.progress());
                record.agents.extend(shared.summaries());
                let dropped = shared.dropped_log_lines();
                if dropped > 0 {
                    record.envelope.error.get_or_insert_with(|| format!("{dropped} log lines over the cap were dropped"));
                }
            }
        }
        Ok(record.envelope.clone())
    }

    /// Cancel a running run; returns `true` when one was running. The attempt ends promptly
    /// with status `cancelled`; its journal is kept.
    pub fn cancel(&self, run_id: &str) -> Result<bool, Error> {
        let runs = self.runs();
        let record = runs.iter().find(|r| r.envelope.run_id == run_id).ok_or_else(|| Error::NotFound(run_id.into()))?;
        Ok(match &record.stop {
            Some(stop) => {
                stop.cancel();
                true
            }
            None => false,
        })
    }

    /// Cancel every running run (for signal handlers).
    pub fn cancel_all(&self) {
        for record in self.runs().iter() {
            if let Some(stop) = &record.stop {
                stop.cancel();
            }
        }
    }

    /// The runs in creation order.
    pub fn runs_list(&self) -> Vec<RunEnvelope> {
        self.runs().iter().map(|r| r.envelope.clone()).collect()
    }

    /// The latest envelope of a run.
    pub fn envelope(&self, run_id: &str) -> Result<RunEnvelope, Error> {
        self.detail(run_id).map(|d| d.envelope)
    }

    /// A run with its phases, agent summaries and progress.
    pub fn detail(&self, run_id: &str) -> Result<RunDetail, Error> {
        let runs = self.runs();
        let record = runs.iter().find(|r| r.envelope.run_id == run_id).ok_or_else(|| Error::NotFound(run_id.into()))?;
        let phases = record
            .progress
            .iter()
            .filter_map(|e| match &e.event {
                ProgressEvent::Phase { title } => Some(title.clone()),
                _ => None,
            })
            .collect();
        Ok(RunDetail {
            envelope: record.envelope.clone(),
            limits: record.limits,
            phases,
            agents: record.agents.clone(),
            progress: record.progress.clone(),
            component_hashes: record.component_hashes.clone(),
        })
    }
}
