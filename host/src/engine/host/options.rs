//! How a [`Host`] is set up ([`HostConfig`]), what it loads ([`Factory`]) and what one run or
//! resume of it is given ([`RunOptions`], [`ResumeOptions`], a [`BackendChoice`]).

use crate::backend::{AgentBackend, BackendCatalog, BuiltinCatalog, DryRun};
use crate::engine::state::LoadedComponent;
use crate::model::limits::Limits;
use crate::model::meta::FactoryMeta;
use crate::model::progress::ProgressEntry;
use crate::model::scope::Scope;
use crate::sandbox::SandboxLimits;
use crate::store::DEFAULT_COMMIT_WINDOW;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// How a [`Host`] is set up.
pub struct HostConfig {
    /// Where the durable store lives (`None`: in memory, gone with the process).
    pub state_dir: Option<PathBuf>,
    /// Group-commit window of the store.
    pub commit_window: Duration,
    /// Where compiled components are cached (`None`: no cache).
    pub cache_dir: Option<PathBuf>,
    /// Who runs subagents of new runs that name no backend.
    pub backend: Arc<dyn AgentBackend>,
    /// Builds backends by name: a [`BackendChoice`], and on resume the backend a run
    /// recorded (default: the built-in ones; the CLI uses its `factory.toml`).
    pub catalog: Arc<dyn BackendCatalog>,
    /// Host-side sandbox limits.
    pub sandbox: SandboxLimits,
    /// The caps of a worker of a shared store (its run queue and call slots; unused with a
    /// store of one process).
    pub caps: crate::engine::caps::Caps,
    /// Bytes of store pages the store in `state_dir` keeps cached in memory (see
    /// [`StoreOptions::read_cache_bytes`]).
    pub read_cache_bytes: usize,
    /// What a worker of a shared store checks before it runs what the store says (its
    /// consent seal key, the roots it mounts grants under); unused with a store of one process.
    pub trust: crate::sandbox::admission::ClusterTrust,
    /// Paths no run's subagent sandbox may see, even inside a grant: what the front door
    /// serving this host keeps there (its state directories, token files, control socket).
    pub sandbox_hidden: Vec<PathBuf>,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            state_dir: None,
            commit_window: DEFAULT_COMMIT_WINDOW,
            cache_dir: default_cache_dir(),
            backend: Arc::new(DryRun),
            catalog: Arc::new(BuiltinCatalog),
            sandbox: SandboxLimits::default(),
            caps: Default::default(),
            read_cache_bytes: crate::store::redb::READ_CACHE_BYTES,
            trust: Default::default(),
            sandbox_hidden: Vec::new(),
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

/// A backend chosen by name, as every front door (CLI, control socket, MCP) names one: built
/// by the host's [`BackendCatalog`].
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendChoice {
    /// A built-in spec or a configured name (`None`: the host's default for a new run, the
    /// recorded one for a resume).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The model for calls that name none (`None`: the backend's, or the recorded one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

impl BackendChoice {
    /// True when it names neither a backend nor a model.
    pub fn is_empty(&self) -> bool {
        self.name.is_none() && self.model.is_none()
    }
}

/// Called with a run's id once it exists (see [`RunOptions::on_start`]).
pub type OnStart = Box<dyn FnOnce(&str) + Send>;

/// Per-invocation options of [`Host::run`].
#[derive(Default)]
pub struct RunOptions {
    /// Arguments (`{}` when `None`).
    pub args: Option<serde_json::Value>,
    /// Limit overrides (each present one replaces the declared one; a lifted one removes it).
    pub limits: Limits,
    /// The owner session (default [`DEFAULT_SESSION`]).
    pub session: Option<String>,
    /// Receives every progress entry as it happens.
    pub events: Option<mpsc::UnboundedSender<ProgressEntry>>,
    /// Called with the run id once the run exists (before it executes).
    pub on_start: Option<OnStart>,
    /// Who runs this run's subagents (wins over `choice`; default: the host's backend).
    pub backend: Option<Arc<dyn AgentBackend>>,
    /// A backend by name, built by the host's catalog (when `backend` is `None`).
    pub choice: BackendChoice,
    /// Directories the guest may read (read-only), mounted at `/grant/0`, `/grant/1`, ...
    /// ([`sandbox::grant_mount_point`]). Each must exist and be a directory; the run records
    /// them and every resume mounts them again.
    pub grants: Vec<PathBuf>,
    /// The caller's trace (W3C `traceparent`): the attempt's span continues it.
    pub trace_parent: Option<crate::trace::TraceParent>,
    /// The caller's working directory (canonical), when the caller is another process than
    /// this host's: hidden from the run's subagent sandboxes unless granted (this process's
    /// own working directory always is).
    pub caller_cwd: Option<PathBuf>,
}

/// Options of [`Host::resume`].
#[derive(Default)]
pub struct ResumeOptions {
    /// Limit overrides, on top of the run's earlier ones (raise a limit that stopped it).
    pub limits: Limits,
    /// Run this component instead of the one the last attempt ran (an edited factory);
    /// journaled calls it repeats still replay, being keyed by content.
    pub component: Option<Factory>,
    /// Who resumes: a session resumes only its own runs, [`Scope::Owner`] any (default: the
    /// session [`DEFAULT_SESSION`]). The run stays in its own session either way.
    pub scope: Option<Scope>,
    /// Receives every progress entry as it happens.
    pub events: Option<mpsc::UnboundedSender<ProgressEntry>>,
    /// Called with the run id once the new attempt is accepted (before it executes).
    pub on_start: Option<OnStart>,
    /// Who runs this attempt's subagents (wins over `choice`). By default a resume uses the
    /// backend the run recorded, built again by the host's catalog — never another one.
    pub backend: Option<Arc<dyn AgentBackend>>,
    /// Another backend or model by name than the recorded one (a name alone keeps no model;
    /// a model alone keeps the recorded backend).
    pub choice: BackendChoice,
    /// The caller's trace (W3C `traceparent`): the attempt's span continues it.
    pub trace_parent: Option<crate::trace::TraceParent>,
    /// The caller's working directory, as [`RunOptions::caller_cwd`].
    pub caller_cwd: Option<PathBuf>,
    /// The answer to the checkpoint the run is paused at (`ctx.pause(key)` returns it;
    /// `None`: it returns none). Refused for a run that waits at no checkpoint.
    pub input: Option<serde_json::Value>,
}
