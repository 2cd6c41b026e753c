//! [`Host`]: the library's front door. It owns the engine, the linker, the component loader,
//! the durable store and the backend; it loads and registers factories, starts, resumes,
//! cancels and waits for runs, and answers questions about them — always on behalf of a
//! [`Scope`]: one owner session, which sees only its own runs, or the owner of the state
//! directory, who sees every session's.

use crate::backend::{AgentBackend, BackendCatalog, BackendRef, BackendUnavailable, BuiltinCatalog, DryRun};
use crate::capabilities::stop::StopSignal;
use crate::engine::loaded::Kept;
use crate::engine::run::{self, AttemptSetup, Capabilities};
use crate::error::Error;
use crate::guests::script::{Script, ScriptError, ScriptRef};
use crate::model::envelope::{Accounting, Failure, RunEnvelope, RunStatus, RunSummary, RunsPage};
use crate::model::limits::Limits;
use crate::model::meta::FactoryMeta;
use crate::model::progress::{AgentSummary, ProgressEntry, ProgressEvent, RunUpdated};
use crate::model::schema::Schema;
use crate::model::scope::Scope;
use crate::sandbox::admission::{Bound, TrustError};
use crate::sandbox::component::{ComponentLoader, LoadedComponent};
use crate::sandbox::{self, RunData, SandboxLimits};
use crate::store::journal::Journal;
use crate::store::{ProgressQuery, RedbStore, Registration, RunRecord, Store, StoreOptions, DEFAULT_COMMIT_WINDOW};
use futures::FutureExt;
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};
use tracing::Instrument;
use wasmtime::component::Linker;
use wasmtime::Engine;

pub use crate::store::DEFAULT_SESSION;

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
    pub on_start: Option<Box<dyn FnOnce(&str) + Send>>,
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
    pub on_start: Option<Box<dyn FnOnce(&str) + Send>>,
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

/// A run with its phases, agent summaries and latest progress page. On the wire it is the
/// envelope's fields and its own side by side (see its `Deserialize`).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunDetail {
    /// The envelope.
    #[serde(flatten)]
    pub envelope: RunEnvelope,
    /// Effective limits of the latest attempt.
    pub limits: Limits,
    /// Phases entered, in order (consecutive repeats folded).
    pub phases: Vec<String>,
    /// Agent summaries (no prompts), in completion order.
    pub agents: Vec<AgentSummary>,
    /// The latest progress page.
    pub progress: Vec<ProgressEntry>,
    /// Component sha256 of each attempt.
    pub component_hashes: Vec<String>,
    /// The source each attempt ran, for a script factory (index-aligned with
    /// `component_hashes`; `null` for a component).
    pub scripts: Vec<Option<ScriptRef>>,
    /// The modules the run's script loaded (module name -> sha256, the directory, every
    /// answered import), over the attempts that ran its latest source (`resume --component`
    /// starts a new record); absent when it loaded none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modules: Option<crate::guests::modules::Manifest>,
    /// The backend of each attempt.
    pub backends: Vec<BackendRef>,
    /// Read-only directory grants (canonical host paths; the `i`-th is `/grant/<i>`).
    pub grants: Vec<String>,
    /// The sandbox limits of the host answering (every run of it gets these).
    pub sandbox: SandboxLimits,
    /// True when `phases` and `agents` come from the newest [`DETAIL_SCAN_ENTRIES`]
    /// progress entries only, or `agents` were cut to the newest [`DETAIL_AGENTS`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// How the flows of the run's backend stand while it executes in the process answering
    /// (calls queued, in flight, the rate and why calls wait; shared with every other run of
    /// that backend); absent when it does not execute here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flows: Vec<crate::model::flow::FlowStats>,
    /// The phases the latest attempt's factory declares, the entered and current ones marked
    /// (empty when it declares none, or for runs recorded before they were kept).
    #[serde(default)]
    pub declared_phases: Vec<crate::engine::live::DeclaredPhase>,
    /// The latest attempt's agents that run now, oldest first (none unless it executes).
    #[serde(default)]
    pub running_agents: Vec<crate::engine::live::LiveAgent>,
    /// Its agents that wait for a concurrency slot, oldest first.
    #[serde(default)]
    pub queued_agents: Vec<crate::engine::live::LiveAgent>,
    /// When this detail was read (RFC 3339).
    #[serde(default)]
    pub observed_at: String,
}

impl<'de> serde::Deserialize<'de> for RunDetail {
    /// The flat form, read in two passes over one JSON object: the envelope's fields, then
    /// the detail's own (serde's `flatten` cannot hand a result's raw JSON text through).
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Own {
            limits: Limits,
            phases: Vec<String>,
            agents: Vec<AgentSummary>,
            progress: Vec<ProgressEntry>,
            component_hashes: Vec<String>,
            scripts: Vec<Option<ScriptRef>>,
            #[serde(default)]
            modules: Option<crate::guests::modules::Manifest>,
            backends: Vec<BackendRef>,
            grants: Vec<String>,
            sandbox: SandboxLimits,
            #[serde(default)]
            truncated: bool,
            #[serde(default)]
            flows: Vec<crate::model::flow::FlowStats>,
            #[serde(default)]
            declared_phases: Vec<crate::engine::live::DeclaredPhase>,
            #[serde(default)]
            running_agents: Vec<crate::engine::live::LiveAgent>,
            #[serde(default)]
            queued_agents: Vec<crate::engine::live::LiveAgent>,
            #[serde(default)]
            observed_at: String,
        }
        use serde::de::Error as _;
        let text = Box::<serde_json::value::RawValue>::deserialize(deserializer)?;
        let envelope: RunEnvelope = serde_json::from_str(text.get()).map_err(D::Error::custom)?;
        let own: Own = serde_json::from_str(text.get()).map_err(D::Error::custom)?;
        Ok(RunDetail {
            envelope,
            limits: own.limits,
            phases: own.phases,
            agents: own.agents,
            progress: own.progress,
            component_hashes: own.component_hashes,
            scripts: own.scripts,
            modules: own.modules,
            backends: own.backends,
            grants: own.grants,
            sandbox: own.sandbox,
            truncated: own.truncated,
            flows: own.flows,
            declared_phases: own.declared_phases,
            running_agents: own.running_agents,
            queued_agents: own.queued_agents,
            observed_at: own.observed_at,
        })
    }
}

/// A run's detail reads at most this many progress entries, the newest.
pub const DETAIL_SCAN_ENTRIES: usize = 10_000;

/// A run's detail lists at most this many agent summaries, the newest.
pub const DETAIL_AGENTS: usize = 2_000;

/// The most run summaries one page of a listing carries ([`Host::run_summaries`]): with
/// messages of at most [`crate::model::envelope::SUMMARY_MESSAGE_BYTES`], a page stays a few
/// MiB, well under what a client of the control socket reads of one answer.
pub const MAX_RUNS_PAGE: usize = 1_000;

/// The terminal runs a page by sequence ([`Host::runs_page`]) holds when the caller names no
/// `limit`.
pub const RUNS_PAGE_DEFAULT_LIMIT: usize = 200;

/// The most terminal runs a page by sequence holds (a larger `limit` is cut to it).
pub const RUNS_PAGE_MAX_LIMIT: usize = 500;

/// `backend` with the working directories of the run's callers in other processes
/// ([`RunRecord::caller_dirs`]) hidden from its spawns unless granted.
fn caller_hidden(backend: Arc<dyn AgentBackend>, record: &RunRecord) -> Arc<dyn AgentBackend> {
    if record.caller_dirs.is_empty() {
        return backend;
    }
    let unless_granted = record.caller_dirs.iter().map(PathBuf::from).collect();
    let hidden = crate::backend::Hidden { sealed: Vec::new(), unless_granted };
    backend.hiding(&hidden).unwrap_or(backend)
}

/// How often an attempt with live subscribers samples its backend's flows.
const FLOWS_SAMPLED_EVERY: Duration = Duration::from_millis(500);

/// Tell the attempt's live subscribers how its backend's flows stand, when it changed
/// ([`crate::model::flow::FlowWatch`]), until aborted.
async fn watch_flows(shared: Arc<Capabilities>) {
    let flows = shared.agents.flows();
    if flows.is_empty() {
        return;
    }
    let mut watch = crate::model::flow::FlowWatch::default();
    loop {
        tokio::time::sleep(FLOWS_SAMPLED_EVERY).await;
        if let Some(stats) = watch.next(flows.iter().map(|f| f.stats()).collect()) {
            shared.attempt.announce(|| ProgressEvent::Flows { flows: stats });
        }
    }
}

/// Stops [`watch_flows`] when the attempt ends.
struct WatchFlows(tokio::task::JoinHandle<()>);

impl Drop for WatchFlows {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A run executing in this process.
struct ActiveRun {
    stop: StopSignal,
    shared: Option<Arc<Capabilities>>,
}

/// The factory host.
pub struct Host {
    engine: Engine,
    linker: Linker<RunData>,
    /// [`Host::linker`] plus the `script` import: links the JS runner only.
    script_linker: Linker<RunData>,
    /// The built-in JS runner, once loaded.
    runner: Mutex<Option<LoadedComponent>>,
    loader: ComponentLoader,
    /// Factories of plain components this host loaded, by component hash.
    loaded: Kept<Factory>,
    config: HostConfig,
    store: Arc<dyn Store>,
    active: Mutex<HashMap<String, ActiveRun>>,
    updates: broadcast::Sender<RunUpdated>,
    /// Bytes the pending agent calls of every run hold.
    pending_bytes: Arc<std::sync::atomic::AtomicU64>,
    /// Room for runs from a shared store's queue ([`crate::engine::caps::Caps::worker_runs`]).
    queue_room: Arc<tokio::sync::Semaphore>,
    /// [`Host::queue_room`]'s permits when no queued run executes here.
    queue_capacity: usize,
    /// Told when a queued run this host executed ended (room to claim again).
    queue_freed: Arc<tokio::sync::Notify>,
    /// The runs parked for their backend's quota that this process resumes at their reset.
    parking: crate::engine::parking::Parking,
}

fn session_of(session: &Option<String>) -> String {
    session.clone().unwrap_or_else(|| DEFAULT_SESSION.to_string())
}

impl Host {
    /// A host with `config`: opens (or creates) the store, halting runs a crash left running.
    pub fn new(config: HostConfig) -> Result<Self, Error> {
        let store = match &config.state_dir {
            Some(dir) => {
                let options = StoreOptions {
                    commit_window: config.commit_window,
                    read_cache_bytes: config.read_cache_bytes,
                    ..StoreOptions::default()
                };
                RedbStore::open(dir, options)?
            }
            None => RedbStore::in_memory()?,
        };
        Host::with_store(config, Arc::new(store))
    }

    /// A host on a store the caller opened (e.g. [`RedbStore::open_with_backend`]);
    /// `config.state_dir` and `config.commit_window` are not used.
    pub fn with_store(config: HostConfig, store: Arc<dyn Store>) -> Result<Self, Error> {
        config.sandbox.validate()?;
        let engine = sandbox::engine().map_err(|e| Error::Engine(e.into_boxed_dyn_error()))?;
        let linker = crate::capabilities::linker(&engine).map_err(|e| Error::Engine(e.into_boxed_dyn_error()))?;
        let script_linker =
            crate::capabilities::script_linker(&engine).map_err(|e| Error::Engine(e.into_boxed_dyn_error()))?;
        let loader = ComponentLoader::new(engine.clone(), config.cache_dir.clone());
        let (updates, _) = broadcast::channel(1024);
        let room = config
            .caps
            .worker_runs
            .unwrap_or(tokio::sync::Semaphore::MAX_PERMITS)
            .min(tokio::sync::Semaphore::MAX_PERMITS);
        Ok(Host {
            queue_room: Arc::new(tokio::sync::Semaphore::new(room)),
            queue_capacity: room,
            queue_freed: Arc::default(),
            engine,
            linker,
            script_linker,
            runner: Mutex::new(None),
            loader,
            loaded: Kept::new(crate::engine::loaded::KEPT),
            config,
            store,
            active: Mutex::new(HashMap::new()),
            updates,
            pending_bytes: Default::default(),
            parking: Default::default(),
        })
    }

    /// The runs parked for their quota that this process resumes by itself.
    pub(crate) fn parking(&self) -> &crate::engine::parking::Parking {
        &self.parking
    }

    /// How many runs parked for their backend's quota wait here to be resumed by themselves
    /// (a service with such a run is not idle).
    pub fn parked_waiting(&self) -> usize {
        self.parking.waiting()
    }

    /// The durable store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The caps this host runs under as a worker of a shared store.
    pub fn caps(&self) -> &crate::engine::caps::Caps {
        &self.config.caps
    }

    /// Room for runs from the queue: one permit per run executing.
    pub(crate) fn queue_room(&self) -> &Arc<tokio::sync::Semaphore> {
        &self.queue_room
    }

    /// Take no more runs from the queue, nor claim new runs started here (a draining worker):
    /// they wait in the queue for another worker.
    pub fn stop_claiming(&self) {
        self.parking.close();
        self.queue_room.close();
        self.queue_freed.notify_waiters();
    }

    /// Whether this worker stopped claiming ([`Host::stop_claiming`]: it drains).
    pub(crate) fn draining(&self) -> bool {
        self.queue_room.is_closed()
    }

    /// Whether no run claimed from the queue is being executed here, its queue entry included
    /// (an attempt that ended is followed by the drop of its entry: a drain waits for both).
    pub fn queue_idle(&self) -> bool {
        self.queue_room.available_permits() >= self.queue_capacity
    }

    /// Notified when a queued run executed here ended.
    pub(crate) fn queue_freed(&self) -> &tokio::sync::Notify {
        &self.queue_freed
    }

    /// The sandbox limits every run of this host gets.
    pub fn sandbox_limits(&self) -> &SandboxLimits {
        &self.config.sandbox
    }

    /// The backend's name.
    pub fn backend_name(&self) -> String {
        self.config.backend.name()
    }

    /// `run_updated` events of every run of this host.
    pub fn subscribe(&self) -> broadcast::Receiver<RunUpdated> {
        self.updates.subscribe()
    }

    /// Load a component file, or a script factory (`.js`, `.mjs`, `.ts`, `.mts`; a file
    /// offering several factories as `file.js#name`), and read its metadata.
    pub async fn load_file(&self, path: &Path) -> Result<Factory, Error> {
        if !path.exists() {
            if let Some(text) = path.to_str() {
                if let (file, Some(entry)) = crate::guests::script::split_entry(text) {
                    let script = Script::read(Path::new(file), Some(entry.to_string()))?;
                    return self.load_script(script).await;
                }
            }
        }
        if crate::guests::script::is_script(path) {
            let script = Script::read(path, None)?;
            return self.load_script(script).await;
        }
        let component = self.loader.load_file(&self.linker, path)?;
        let factory = self.with_meta(component).await?;
        self.loaded.keep(&factory.component.hash, factory.clone());
        Ok(factory)
    }

    /// Load a script factory: the built-in JS runner with `script` as its source. Fails
    /// with [`Error::Script`] when the source does not define a runnable factory (a syntax
    /// error names `file:line:col`).
    pub async fn load_script(&self, script: Script) -> Result<Factory, Error> {
        let runner = self.runner()?;
        self.with_meta(runner.with_script(script)).await
    }

    /// The built-in JS runner component (compiled once per host; the compile cache keeps
    /// its artifact across processes).
    pub fn runner(&self) -> Result<LoadedComponent, Error> {
        let mut runner = self.runner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(loaded) = runner.as_ref() {
            return Ok(loaded.clone());
        }
        let loaded = self.loader.load_bytes_for(&self.script_linker, crate::guests::script::RUNNER, true)?;
        *runner = Some(loaded.clone());
        Ok(loaded)
    }

    /// Register a factory given in the authoring form — `meta` as JSON and a `run` body that
    /// is one self-contained async function expression — without running it. The
    /// registration stores the runner and the generated source; `run <name>` runs it.
    pub async fn author(&self, meta: &serde_json::Value, run: &str) -> Result<Registration, Error> {
        let script = crate::guests::script::author(meta, run)?;
        let factory = self.load_script(script).await?;
        self.register(&factory).await
    }

    /// [`Host::author`] in `session`'s own scope: only that session lists and runs it (it
    /// wins over a factory of the same name registered for everyone).
    pub async fn author_in(&self, session: &str, meta: &serde_json::Value, run: &str) -> Result<Registration, Error> {
        let script = crate::guests::script::author(meta, run)?;
        let factory = self.load_script(script).await?;
        self.register_as(&factory, Some(session.to_string())).await
    }

    /// A script factory from a stored runner and a stored source (what a run or a
    /// registration recorded).
    pub async fn load_stored_script(&self, runner_hash: &str, script: &ScriptRef) -> Result<Factory, Error> {
        self.load_recorded_script(runner_hash, script, None).await
    }

    /// [`Host::load_stored_script`] with the modules `run_id` recorded (when given and it
    /// recorded any), else those of `script`'s own record: a recorded module is served as
    /// recorded, whatever its file holds now.
    async fn load_recorded_script(
        &self,
        runner_hash: &str,
        script: &ScriptRef,
        run_id: Option<&str>,
    ) -> Result<Factory, Error> {
        let text = self
            .store
            .blob(&script.sha256)
            .await?
            .ok_or_else(|| Error::NotRegistered(format!("no stored source with sha256 {}", script.sha256)))?;
        crate::sandbox::admission::check_bytes("script source", &script.sha256, &text)?;
        let text = String::from_utf8(text).map_err(|_| ScriptError::NotText(script.file_name.clone()))?;
        let runner = match self.runner() {
            Ok(runner) if runner.hash == runner_hash => runner,
            _ => {
                let bytes = self
                    .store
                    .blob(runner_hash)
                    .await?
                    .ok_or_else(|| Error::NotRegistered(format!("no stored runner with sha256 {runner_hash}")))?;
                crate::sandbox::admission::check_bytes("JS runner", runner_hash, &bytes)?;
                self.loader.load_bytes_for(&self.script_linker, &bytes, true)?
            }
        };
        let mut loaded = Script::from_source(script.file_name.clone(), text, script.entry.clone())?;
        let recorded = match run_id {
            Some(id) => self.store.run_modules(id).await?,
            None => None,
        };
        let manifest = match recorded {
            Some(manifest) => Some(manifest),
            None => match &script.modules {
                Some(hash) => {
                    let bytes =
                        self.store.blob(hash).await?.ok_or_else(|| {
                            Error::NotRegistered(format!("no stored module record with sha256 {hash}"))
                        })?;
                    let manifest = serde_json::from_slice(&bytes)
                        .map_err(|e| crate::guests::modules::ModuleError::Record {
                            name: script.file_name.clone(),
                            problem: crate::guests::modules::RecordProblem::Manifest(Arc::new(e)),
                        })
                        .map_err(ScriptError::Module)?;
                    Some(manifest)
                }
                None => None,
            },
        };
        if let Some(manifest) = manifest {
            // The recorded texts, read first (the set is built synchronously).
            let mut texts = HashMap::new();
            for hash in manifest.modules.values() {
                if !texts.contains_key(hash) {
                    texts.insert(hash.clone(), self.store.blob(hash).await);
                }
            }
            let modules = crate::guests::modules::ModuleSet::recorded(loaded.file_name.clone(), &manifest, |hash| {
                texts.remove(hash).unwrap_or(Ok(None))
            })
            .map_err(ScriptError::Module)?;
            loaded = loaded.with_modules(modules);
        }
        self.with_meta(runner.with_script(loaded)).await
    }

    /// Store what a run or registration of `factory` needs to load it again: the component
    /// bytes and, for a script factory, the source text.
    fn put_blobs(&self, factory: &Factory) -> Result<(), Error> {
        self.store.put_blob(&factory.component.hash, &factory.component.bytes)?;
        if let Some(script) = &factory.component.script {
            let text: Arc<[u8]> = Arc::from(script.text.as_bytes());
            self.store.put_blob(&script.hash, &text)?;
            if !script.modules.is_empty() {
                for (_, hash, text) in script.modules.texts() {
                    self.store.put_blob(&hash, &Arc::from(text.as_bytes()))?;
                }
                let manifest = script.modules.manifest();
                let json: Arc<[u8]> = crate::guests::script::manifest_json(&manifest).into();
                self.store.put_blob(&crate::guests::script::manifest_hash(&manifest), &json)?;
            }
        }
        Ok(())
    }

    /// Load a component from bytes and read its metadata.
    pub async fn load_bytes(&self, bytes: &[u8]) -> Result<Factory, Error> {
        let component = self.loader.load_bytes(&self.linker, bytes)?;
        let factory = self.with_meta(component).await?;
        self.loaded.keep(&factory.component.hash, factory.clone());
        Ok(factory)
    }

    /// Load a component stored under its sha256: the factory this host loaded from it, if it
    /// keeps one (see [`crate::engine::loaded`]), else read from the store and loaded.
    pub async fn load_stored(&self, hash: &str) -> Result<Factory, Error> {
        if let Some(factory) = self.loaded.get(hash) {
            return Ok(factory);
        }
        let bytes = self
            .store
            .blob(hash)
            .await?
            .ok_or_else(|| Error::NotRegistered(format!("no stored component with sha256 {hash}")))?;
        // Hashed again before anything of it is compiled or run: the store may have been
        // written by someone else (a shared database).
        crate::sandbox::admission::check_bytes("component", hash, &bytes)?;
        self.load_bytes(&bytes).await
    }

    /// Load a registered factory by name.
    pub async fn load_registered(&self, name: &str) -> Result<Factory, Error> {
        let registration = self
            .store
            .factory(name)
            .await?
            .ok_or_else(|| Error::NotRegistered(format!("no factory named `{name}`")))?;
        self.load_registration(&registration).await
    }

    /// Load factory `name` as `session` sees it (its own authored one first).
    pub async fn load_registered_for(&self, session: &str, name: &str) -> Result<Factory, Error> {
        let registration = self
            .store
            .factory_in(session, name)
            .await?
            .ok_or_else(|| Error::NotRegistered(format!("no factory named `{name}`")))?;
        self.load_registration(&registration).await
    }

    async fn load_registration(&self, registration: &Registration) -> Result<Factory, Error> {
        match &registration.script {
            Some(script) => self.load_stored_script(&registration.hash, script).await,
            None => self.load_stored(&registration.hash).await,
        }
    }

    /// Register a factory under its meta name (replacing an earlier registration).
    pub async fn register(&self, factory: &Factory) -> Result<Registration, Error> {
        self.register_as(factory, None).await
    }

    /// Register a factory under its meta name: for everyone (`None`), or in `session`'s own
    /// scope only (it shadows one of the same name registered for everyone).
    pub async fn register_in(&self, factory: &Factory, session: Option<String>) -> Result<Registration, Error> {
        self.register_as(factory, session).await
    }

    async fn register_as(&self, factory: &Factory, session: Option<String>) -> Result<Registration, Error> {
        let registration = Registration {
            session,
            meta: factory.meta.clone(),
            hash: factory.component.hash.clone(),
            script: factory.component.script.as_ref().map(|s| s.reference()),
            added_at: crate::store::records_timestamp(),
        };
        self.put_blobs(factory)?;
        self.store.register(&registration, &factory.component.bytes).await?;
        Ok(registration)
    }

    /// Factories registered for everyone, by name.
    pub async fn registered(&self) -> Result<Vec<Registration>, Error> {
        Ok(self.store.factories().await?.into_iter().filter(|r| r.session.is_none()).collect())
    }

    /// Whether the component or script source `key` (a sha256) is a factory `session`
    /// authored itself: it runs in the sandbox without consent, as the spec's authoring does.
    pub async fn authored_in(&self, session: &str, key: &str) -> Result<bool, Error> {
        Ok(self
            .store
            .factories()
            .await?
            .iter()
            .any(|r| r.session.as_deref() == Some(session) && r.script.as_ref().is_some_and(|s| s.sha256 == key)))
    }

    /// The factories `session` can run: its own authored ones, then those registered for
    /// everyone that it does not shadow.
    pub async fn registered_for(&self, session: &str) -> Result<Vec<Registration>, Error> {
        let all = self.store.factories().await?;
        let own: Vec<Registration> = all.iter().filter(|r| r.session.as_deref() == Some(session)).cloned().collect();
        let shared = all.into_iter().filter(|r| r.session.is_none() && !own.iter().any(|o| o.meta.name == r.meta.name));
        Ok(own.iter().cloned().chain(shared).collect())
    }

    /// The names of every factory the script `path` offers (each loadable as `path#name`),
    /// read by the JS runner without running any: what `factory add` registers for a file
    /// that offers several.
    pub async fn script_factories(&self, path: &Path) -> Result<Vec<String>, Error> {
        let component = self.runner()?.with_script(Script::read(path, None)?);
        let listed: (Result<Vec<String>, String>,) =
            self.call_runner(&component, "factories", "reading the factories' names").await?;
        Ok(listed.0.map_err(ScriptError::Invalid)?)
    }

    /// Call the script runner's export `name` (it takes nothing) in a store of its own, within
    /// the sandbox's meta time limit; `what` says what it reads, for the timeout's message.
    async fn call_runner<R>(&self, component: &LoadedComponent, name: &str, what: &str) -> Result<R, Error>
    where
        R: wasmtime::component::ComponentNamedList + wasmtime::component::Lift + Send + Sync + 'static,
    {
        let mut store = self.meta_store(component)?;
        let instance = component
            .pre
            .instance_pre()
            .instantiate_async(&mut store)
            .await
            .map_err(|e| Error::MetaCall(run::classify_trap(&e).message))?;
        let export = instance
            .get_typed_func::<(), R>(&mut store, name)
            .map_err(|e| Error::MetaCall(format!("the JS runner has no `{name}`: {e:#}")))?;
        let limit = Duration::from_millis(self.config.sandbox.meta_timeout_ms);
        tokio::time::timeout(limit, export.call_async(&mut store, ()))
            .await
            .map_err(|_| Error::MetaCall(format!("{what} did not finish within {limit:?}")))?
            .map_err(|e| Error::MetaCall(run::classify_trap(&e).message))
    }

    /// A store to call `meta` (or a script runner's `describe`) in: no run, no journal.
    fn meta_store(&self, component: &LoadedComponent) -> Result<wasmtime::Store<RunData>, Error> {
        let setup = AttemptSetup {
            run_id: String::new(),
            limits: Limits::default(),
            sandbox: self.config.sandbox.clone(),
            journal: Arc::new(NoJournal),
            backend: self.config.backend.clone(),
            prior: Accounting::default(),
            next_seq: 0,
            events: None,
            updates: broadcast::channel(1).0,
            record_writes: 0,
            stop: StopSignal::new(),
            host_pending_bytes: self.pending_bytes.clone(),
            span: tracing::Span::none(),
            agent_limits: Default::default(),
            answers: Default::default(),
        };
        let shared = Capabilities::new(setup, Default::default());
        sandbox::new_store(&self.engine, &self.config.sandbox, shared, component.script.clone(), &[])
            .map_err(|e| Error::MetaCall(format!("{e:#}")))
    }

    async fn with_meta(&self, component: LoadedComponent) -> Result<Factory, Error> {
        let meta = if component.script.is_some() {
            // A script runner's `describe` is `meta` that can say why the source is no factory.
            let described: (Result<crate::sandbox::contract::agent::factory::types::Meta, String>,) =
                self.call_runner(&component, "describe", "reading the factory's meta").await?;
            // A module the source imports that could not be loaded is said as itself.
            let modules = component.script.as_ref().and_then(|s| s.modules.take_error()).filter(|_| {
                matches!(&described.0, Err(m) if m.contains("Error resolving module") || m.contains("Error loading module"))
            });
            described.0.map_err(|message| modules.map_or(ScriptError::Invalid(message), ScriptError::Module))?
        } else {
            let mut store = self.meta_store(&component)?;
            let instance = component
                .pre
                .instantiate_async(&mut store)
                .await
                .map_err(|e| Error::MetaCall(run::classify_trap(&e).message))?;
            // `meta` must be cheap: a guest that spins in it runs out of time, not forever.
            let limit = Duration::from_millis(self.config.sandbox.meta_timeout_ms);
            tokio::time::timeout(limit, instance.call_meta(&mut store))
                .await
                .map_err(|_| Error::MetaCall(format!("`meta` did not return within {limit:?}")))?
                .map_err(|e| Error::MetaCall(run::classify_trap(&e).message))?
        };
        let meta = crate::sandbox::contract::meta_from_wit(meta)?;
        Ok(Factory { component, meta })
    }

    fn active(&self) -> MutexGuard<'_, HashMap<String, ActiveRun>> {
        self.active.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `run_id` exists and `scope` sees it (false when it cannot be read).
    pub async fn owned_by(&self, scope: impl Into<Scope>, run_id: &str) -> bool {
        self.record(&scope.into(), run_id).await.is_ok()
    }

    /// The record of `run_id`, if `scope` sees it (another session's run is `NotFound`,
    /// as if it did not exist).
    async fn record(&self, scope: &Scope, run_id: &str) -> Result<RunRecord, Error> {
        match self.store.run(run_id).await? {
            Some(record) if scope.sees(&record.session) => Ok(record),
            _ => Err(Error::NotFound(run_id.to_string())),
        }
    }

    /// The envelope of a record as callers see it: every reader (`envelope`, `runs`,
    /// `wait`, `detail`) goes through here, so the rules live in one place.
    ///
    /// - Live accounting and revision while an attempt runs here.
    /// - Claimed here for a new attempt that has not recorded its start yet: `running`
    ///   (its earlier ending is no longer the answer).
    /// - `pending` in a shared store's queue, tried by workers that could not serve it: its
    ///   `error` says which and why.
    /// - `running` with no attempt here: first read again (the attempt writes its end before
    ///   it leaves `active`, so it may have just ended); still `running`, it is an attempt
    ///   that could not record its end (this process holds the store), and it reads as
    ///   `halted`, resumable, like a crash found at reopen. On a [shared](Store::shared)
    ///   store it reads as `running`: another worker may be executing it.
    async fn current(&self, record: RunRecord) -> Result<RunEnvelope, Error> {
        let mut envelope = record.envelope;
        // A record stored before messages were bounded may hold longer ones.
        envelope.bound_messages();
        envelope.session = Some(record.session.clone());
        let (active, live) = {
            let active = self.active();
            let run = active.get(&envelope.run_id);
            (run.is_some(), run.and_then(|a| a.shared.clone()))
        };
        match live {
            Some(shared) => {
                envelope.accounting = shared.accounting();
                envelope.revision = record.writes + shared.attempt.last_seq();
            }
            None => envelope.revision = record.writes + self.store.last_progress_seq(&envelope.run_id).await?,
        }
        if active && envelope.status.is_terminal() {
            // Claimed for a new attempt that has not recorded its start yet.
            envelope.status = RunStatus::Running;
            envelope.failure = None;
            envelope.error = None;
            envelope.result = None;
            envelope.resume_at = None;
            envelope.checkpoint = None;
        }
        if envelope.status == RunStatus::Running && !active {
            // The attempt may have ended between reading the record and looking at `active`:
            // it writes its end before it leaves `active`, so a fresh read has it.
            if let Some(fresh) = self.store.run(&envelope.run_id).await? {
                if fresh.envelope.status != RunStatus::Running {
                    return Box::pin(self.current(fresh)).await;
                }
            }
        }
        // Waiting in a shared store's queue: why the workers that tried it could not serve it.
        if envelope.status == RunStatus::Pending && !active {
            if let Some(queue) = self.store.run_queue() {
                let refusals = queue.refusals(envelope.run_id.clone()).await?;
                if !refusals.is_empty() {
                    let why: Vec<String> =
                        refusals.iter().map(|(worker, reason)| format!("worker {worker}: {reason}")).collect();
                    let error = format!(
                        "waiting in the queue for a worker that can serve it; tried and could not: {}",
                        why.join("; ")
                    );
                    envelope.error =
                        Some(crate::model::envelope::bounded_text(error, crate::model::envelope::MAX_MESSAGE_BYTES));
                }
            }
        }
        // On a shared store, another process may be executing it: it reads as it is.
        if envelope.status == RunStatus::Running && !active && !self.store.shared() {
            envelope.status = RunStatus::Halted;
            let failure = Failure::new(
                crate::model::envelope::FailureType::Halted,
                None,
                "the attempt ended without recording its outcome; resume to continue",
            );
            envelope.error.get_or_insert_with(|| failure.message.clone());
            envelope.failure.get_or_insert(failure);
        }
        Ok(envelope)
    }

    /// Start a run of `factory` and drive its first attempt to the end. Returns the envelope
    /// for every outcome; refuses only what fails before the run exists (bad limits, bad
    /// args, a store failure).
    pub async fn run(&self, factory: &Factory, mut options: RunOptions) -> Result<RunEnvelope, Error> {
        let backend = match options.backend.take() {
            Some(backend) => backend,
            None => self.chosen_backend(&options.choice)?,
        };
        if self.store.run_queue().is_some() {
            return self.run_queued(factory, options, backend).await;
        }
        let (record, options) = self.create_run(factory, options).await?;
        let backend = caller_hidden(backend, &record);
        self.attempt(factory, record, options.events, backend, options.trace_parent).await
    }

    /// [`Host::run`] on a store with a run queue: the run is stored with its queue entry
    /// (what its first attempt needs: component, script, backend; its grants are in the
    /// record). When this worker has room it claims the entry in the same transaction and
    /// executes the run at once; otherwise any worker with room claims it, and this waits for
    /// its end.
    async fn run_queued(
        &self,
        factory: &Factory,
        mut options: RunOptions,
        backend: Arc<dyn AgentBackend>,
    ) -> Result<RunEnvelope, Error> {
        let Some(queue) = self.store.run_queue() else {
            return Err(Error::Misrouted("a queued run on a store without a queue"));
        };
        let permit = self.queue_room.clone().try_acquire_owned().ok();
        let on_start = options.on_start.take();
        let (mut record, options) = self.new_record(factory, options)?;
        let backend = caller_hidden(backend, &record);
        self.put_blobs(factory)?;
        // The component and script bytes are durable before any worker can claim the run.
        if let Err(e) = self.store.flush().await {
            return Err(e
                .0
                .downcast_ref::<crate::store::StoreError>()
                .cloned()
                .unwrap_or(crate::store::StoreError::Closed)
                .into());
        }
        let start = crate::store::queue::QueuedStart {
            component: factory.component.hash.clone(),
            script: factory.component.script.as_ref().map(|s| s.reference()),
            backend: backend.reference(),
        };
        // The consent given to this start, bound to what it runs: checked by the worker that
        // claims it.
        record.seal = Some(self.config.trust.seal(&start_bound(&record, &start)));
        let here = queue.enqueue(&mut record, &start, permit.is_some(), self.config.caps.cluster_runs).await?;
        let run_id = record.envelope.run_id.clone();
        if let Some(on_start) = on_start {
            on_start(&run_id);
        }
        if !here {
            drop(permit);
            return self.wait(Scope::Owner, &run_id).await;
        }
        let ended = self.attempt(factory, record, options.events, backend, options.trace_parent).await;
        // A draining worker keeps the entry of a run it stopped: it hands it back.
        let handed_back = self.draining() && ended.as_ref().is_ok_and(|envelope| envelope.status == RunStatus::Halted);
        if !handed_back {
            if let Err(e) = queue.finish(run_id.clone()).await {
                tracing::warn!(run = %run_id, error = %e, "dropping a finished run's queue entry");
            }
        }
        drop(permit);
        self.queue_freed.notify_one();
        ended
    }

    /// Whether this worker can execute a run it claimed from the queue: the backend the run
    /// was started with (or last recorded) can be built here, its key variable is set, and
    /// every granted directory is under a root this worker allows and still the one recorded.
    pub(crate) async fn can_serve(&self, claimed: &crate::store::queue::Claimed) -> Result<(), Error> {
        let Some(record) = self.store.run(&claimed.run_id).await? else { return Ok(()) };
        if let Some(start) = claimed.start.as_ref().filter(|_| record.envelope.attempts == 0) {
            if self.config.trust.verify(record.seal.as_deref(), &start_bound(&record, start)).is_err() {
                // Not a run another worker could serve: a record that does not match its
                // consent; its start ends it with that failure ([`Host::start_queued`]).
                return Ok(());
            }
        }
        // A run this worker did not start mounts only grants under the roots it allows.
        self.config.trust.check_grants(&claimed.run_id, &record.grants)?;
        sandbox::recheck_grants(&record.grants)?;
        match &claimed.start {
            Some(start) if record.envelope.attempts == 0 => self.backend_of(&start.backend).map(drop),
            _ => self.recorded_backend(&record, &BackendChoice::default()).map(drop),
        }
    }

    /// Execute the first attempt of a queued run this worker claimed, as its start recorded
    /// it (no consent asked again: it was given when the run was started).
    /// A run whose start cannot be prepared here (its component cannot be loaded, ...) ends
    /// `error` with the reason instead of waiting forever.
    pub(crate) async fn start_queued(
        &self,
        mut record: RunRecord,
        start: &crate::store::queue::QueuedStart,
    ) -> Result<RunEnvelope, Error> {
        let run_id = record.envelope.run_id.clone();
        let claim = self.claim(&run_id)?;
        let prepared = async {
            // Before anything of the run is loaded: what the database says to run must be
            // what its consent was given for.
            self.config.trust.verify(record.seal.as_deref(), &start_bound(&record, start))?;
            self.config.trust.check_grants(&run_id, &record.grants)?;
            sandbox::recheck_grants(&record.grants)?;
            let factory = match &start.script {
                Some(script) => self.load_recorded_script(&start.component, script, Some(&run_id)).await,
                None => self.load_stored(&start.component).await,
            }
            .map_err(|e| match e {
                Error::Trust(refused) => Error::Trust(refused),
                e => Error::NonResumable(format!("the component of run `{run_id}` cannot be loaded: {e}")),
            })?;
            Ok::<_, Error>((factory, caller_hidden(self.backend_of(&start.backend)?, &record)))
        };
        match prepared.await {
            Ok((factory, backend)) => self.attempt_claimed(&factory, record, None, backend, claim, None).await,
            Err(error) => {
                let failure = match &error {
                    Error::Trust(refused) => Failure::new(
                        crate::model::envelope::FailureType::Sandbox,
                        Some(refused.kind()),
                        format!("the queued run was refused: {refused}; nothing ran"),
                    ),
                    _ => Failure::new(
                        crate::model::envelope::FailureType::Internal,
                        None,
                        format!("the queued run could not start: {error}"),
                    ),
                };
                self.end_broken_attempt(&mut record, failure).await;
                drop(claim);
                self.announce_end(&record).await;
                Err(error)
            }
        }
    }

    /// The backend `reference` names, built here (its key variable must be set).
    fn backend_of(&self, reference: &BackendRef) -> Result<Arc<dyn AgentBackend>, Error> {
        if let Some(var) = &reference.key_env {
            if std::env::var(var).map_or(true, |v| v.trim().is_empty()) {
                return Err(BackendUnavailable {
                    backend: reference.display(),
                    missing: format!("the variable `{var}` that held its API key is not set"),
                }
                .into());
            }
        }
        let default = self.config.backend.reference();
        if default.name == reference.name && default.model == reference.model && default.config == reference.config {
            return Ok(self.config.backend.clone());
        }
        Ok(self.config.catalog.build(reference)?)
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

    /// The backend a resume of `record` uses: the one its last attempt recorded (with the
    /// model or name `choice` changes), built again — never a silent fallback.
    fn recorded_backend(&self, record: &RunRecord, choice: &BackendChoice) -> Result<Arc<dyn AgentBackend>, Error> {
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
        if let Some(var) = &reference.key_env {
            if std::env::var(var).map_or(true, |v| v.trim().is_empty()) {
                return Err(BackendUnavailable {
                    backend: reference.display(),
                    missing: format!("the variable `{var}` that held its API key is not set"),
                }
                .into());
            }
        }
        let default = self.config.backend.reference();
        if default.name == reference.name && default.model == reference.model && default.config == reference.config {
            return Ok(self.config.backend.clone());
        }
        self.config.catalog.build(&reference).map_err(|mut e| {
            if choice.name.is_none() {
                e.missing = format!(
                    "{} — the run recorded it; put its configuration back, or resume on another backend with --backend",
                    e.missing
                );
            }
            e.into()
        })
    }

    /// Record a fresh run of `factory` that its user declined to start (a consent prompt
    /// answered "no"): created as [`Host::run`] would create it (same checks, a run id,
    /// `on_start`), then ended at once as `cancelled` (failure kind `declined`) without
    /// executing anything. It cannot be resumed: it has no attempt to continue.
    pub async fn decline(&self, factory: &Factory, options: RunOptions) -> Result<RunEnvelope, Error> {
        let (mut record, _) = self.create_run(factory, options).await?;
        let envelope = &mut record.envelope;
        envelope.status = RunStatus::Cancelled;
        let failure = Failure::new(
            crate::model::envelope::FailureType::Cancelled,
            Some("declined"),
            "the run was declined at the consent prompt; nothing ran",
        );
        envelope.error = Some(failure.message.clone());
        envelope.failure = Some(failure);
        envelope.updated_at = crate::store::records_timestamp();
        self.store.put_run(&mut record, false).await?;
        let run_id = record.envelope.run_id.clone();
        let revision = record.writes + self.store.last_progress_seq(&run_id).await?;
        let _ = self.updates.send(RunUpdated { run_id, revision });
        self.current(record).await
    }

    /// Check `options` and store a new pending run of `factory`; hands back what of
    /// `options` the attempt still needs.
    async fn create_run(&self, factory: &Factory, mut options: RunOptions) -> Result<(RunRecord, RunOptions), Error> {
        let on_start = options.on_start.take();
        let (mut record, options) = self.new_record(factory, options)?;
        self.put_blobs(factory)?;
        self.store.put_run(&mut record, true).await?;
        if let Some(on_start) = on_start {
            on_start(&record.envelope.run_id);
        }
        Ok((record, options))
    }

    /// Check `options` and build the record of a new pending run of `factory` (not stored).
    fn new_record(&self, factory: &Factory, options: RunOptions) -> Result<(RunRecord, RunOptions), Error> {
        let limits = factory.meta.limits.overridden_by(&options.limits);
        limits.validate()?;
        let grants = sandbox::check_grants(&options.grants)?;
        let args = options.args.clone().unwrap_or_else(|| serde_json::json!({}));
        if let Some(schema) = &factory.meta.args_schema {
            let schema = Schema::parse(schema.get()).map_err(|e| Error::InvalidArgs(e.to_string()))?;
            schema.check(&args).map_err(|m| Error::InvalidArgs(m.to_string()))?;
        }
        let run_id = uuid::Uuid::now_v7().to_string();
        let now = crate::store::records_timestamp();
        let mut record = RunRecord {
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
                revision: 0,
                backend: None,
                resume_at: None,
                checkpoint: None,
                session: None,
            },
            session: session_of(&options.session),
            args: args.to_string(),
            overrides: options.limits,
            limits,
            component_hashes: Vec::new(),
            scripts: Vec::new(),
            backends: Vec::new(),
            grants,
            writes: 0,
            seq: 0,
            interrupted: None,
            recoveries: 0,
            seal: None,
            caller_dirs: Vec::new(),
            phases: Vec::new(),
            checkpoints: Default::default(),
        };
        if let Some(dir) = &options.caller_cwd {
            record.add_caller_dir(dir);
        }
        Ok((record, options))
    }

    /// Resume a run that ended without completing: same id, same args, a new attempt in
    /// which every journaled step and agent call replays for free. A caller's resume sets
    /// the run's count of automatic recoveries back to 0.
    pub async fn resume(&self, run_id: &str, options: ResumeOptions) -> Result<RunEnvelope, Error> {
        self.resume_as(run_id, options, ResumedBy::Caller).await
    }

    /// [`Host::resume`] on behalf of `by`: automatic recovery resumes only a run that is
    /// still `halted` by an [`Interruption`](crate::store::Interruption) once it holds the
    /// claim, and counts itself in the record.
    pub(crate) async fn resume_as(
        &self,
        run_id: &str,
        options: ResumeOptions,
        by: ResumedBy,
    ) -> Result<RunEnvelope, Error> {
        let scope = options.scope.clone().unwrap_or_else(|| Scope::from(DEFAULT_SESSION));
        let record = self.record(&scope, run_id).await?;
        match record.envelope.status {
            RunStatus::Completed => return Err(Error::NonResumable(format!("run `{run_id}` is completed"))),
            // `running` without an attempt here is an attempt that could not write its end
            // (this process holds the store, so nobody else runs it): resumable.
            RunStatus::Pending => return Err(Error::AlreadyActive(run_id.into())),
            // On a store other processes share, another worker may be executing it.
            RunStatus::Running if self.store.shared() && !self.active().contains_key(run_id) => {
                return Err(Error::AlreadyActive(run_id.into()))
            }
            _ => {}
        }
        // Claimed before anyone hears of the new attempt (`on_start`), so a `wait` that
        // follows it cannot mistake the previous attempt's end for this one's.
        let claim = self.claim(run_id)?;
        // On a store other processes share, a caller's resume also claims the run there
        // (recovery claimed it already): two callers resuming it at once through two workers,
        // one resumes it and the other is told it is active.
        if by == ResumedBy::Caller && self.store.shared() {
            if !self.store.claim_resume(run_id).await? {
                return Err(Error::AlreadyActive(run_id.into()));
            }
            let resumed = self.resume_claimed(run_id, &scope, options, by, claim).await;
            if resumed.is_err() {
                // Not started (or ended at once): free for another worker's resume.
                if let Err(e) = self.store.release_claim(run_id).await {
                    tracing::warn!(run = %run_id, error = %e, "cannot release the claim of a resume that did not start");
                }
            }
            return resumed;
        }
        self.resume_with(run_id, &scope, record, options, by, claim).await
    }

    /// [`Host::resume_as`] once the run is claimed in the store: read again (another
    /// worker may have resumed it to its end meanwhile), then resumed.
    async fn resume_claimed(
        &self,
        run_id: &str,
        scope: &Scope,
        options: ResumeOptions,
        by: ResumedBy,
        claim: Claim<'_>,
    ) -> Result<RunEnvelope, Error> {
        let record = self.record(scope, run_id).await?;
        if record.envelope.status == RunStatus::Completed {
            return Err(Error::NonResumable(format!("run `{run_id}` is completed")));
        }
        self.resume_with(run_id, scope, record, options, by, claim).await
    }

    /// The rest of [`Host::resume_as`]: load what the run recorded and start its attempt.
    async fn resume_with(
        &self,
        run_id: &str,
        scope: &Scope,
        mut record: RunRecord,
        options: ResumeOptions,
        by: ResumedBy,
        claim: Claim<'_>,
    ) -> Result<RunEnvelope, Error> {
        if by != ResumedBy::Caller {
            // Read again under the claim: a caller may have resumed it since it was found.
            record = self.record(scope, run_id).await?;
            let still = match by {
                ResumedBy::Parked => {
                    crate::engine::parking::parked_until(&record).is_some_and(|at| at <= std::time::SystemTime::now())
                }
                _ => crate::engine::parking::is_interrupted(&record),
            };
            if !still {
                return Err(Error::NonResumable(format!("run `{run_id}` is no longer halted by an interruption")));
            }
        }
        if record.envelope.failure.as_ref().and_then(|f| f.kind.as_deref()) == Some("declined") {
            return Err(Error::NonResumable(format!("run `{run_id}` was declined and never ran: start a new run")));
        }
        if by != ResumedBy::Caller && self.store.shared() {
            // Resumed with no caller on a store others write: only what its consent was for.
            let Some(bound) = attempt_bound(&record) else {
                return Err(TrustError::ConsentMissing(run_id.to_string()).into());
            };
            self.config.trust.verify(record.seal.as_deref(), &bound)?;
            self.config.trust.check_grants(run_id, &record.grants)?;
        }
        // The run keeps its grants; each must still be the directory it recorded.
        sandbox::recheck_grants(&record.grants)?;
        let factory = match options.component {
            Some(factory) => factory,
            None => {
                let hash = record.component_hashes.last().cloned().unwrap_or_default();
                let script = record.scripts.get(record.component_hashes.len().wrapping_sub(1)).cloned().flatten();
                let loaded = match &script {
                    Some(script) => self.load_recorded_script(&hash, script, Some(run_id)).await,
                    None => self.load_stored(&hash).await,
                };
                loaded.map_err(|e| match e {
                    Error::Trust(refused) => Error::Trust(refused),
                    e => Error::NonResumable(format!("the component of run `{run_id}` cannot be loaded: {e}")),
                })?
            }
        };
        if factory.meta.name != record.envelope.factory {
            return Err(Error::NonResumable(format!(
                "run `{run_id}` belongs to factory `{}`, not `{}`",
                record.envelope.factory, factory.meta.name
            )));
        }
        let overrides = record.overrides.followed_by(&options.limits);
        let limits = factory.meta.limits.overridden_by(&overrides);
        limits.validate()?;
        record.overrides = overrides;
        record.limits = limits;
        let backend = match options.backend {
            Some(backend) => backend,
            None => self.recorded_backend(&record, &options.choice)?,
        };
        if let Some(dir) = &options.caller_cwd {
            record.add_caller_dir(dir);
        }
        answer_checkpoint(&mut record, options.input, &self.config.sandbox)?;
        let backend = caller_hidden(backend, &record);
        self.put_blobs(&factory)?;
        // Written with the attempt's start, before the guest runs: a recovery that crashes
        // the service again has been counted.
        record.recoveries = match by {
            ResumedBy::Caller => 0,
            ResumedBy::Recovery => record.recoveries.saturating_add(1),
            // Waiting out a quota is no recovery from a crash: not counted.
            ResumedBy::Parked => record.recoveries,
        };
        self.parking.disarm(run_id);
        if let Some(on_start) = options.on_start {
            on_start(run_id);
        }
        self.attempt_claimed(&factory, record, options.events, backend, claim, options.trace_parent).await
    }

    /// Leave a run that automatic recovery will not resume to a caller: while it is still
    /// `halted` by an interruption, its failure becomes `message` and the mark is cleared,
    /// so no later service start tries it again. Returns false when the run was no longer
    /// interrupted (a caller resumed it meanwhile).
    pub(crate) async fn leave_halted(&self, run_id: &str, message: String) -> Result<bool, Error> {
        let _claim = self.claim(run_id)?;
        let Some(mut record) = self.store.run(run_id).await? else { return Err(Error::NotFound(run_id.to_string())) };
        if !(record.envelope.status == RunStatus::Halted && record.interrupted.is_some()) {
            return Ok(false);
        }
        record.interrupted = None;
        record.envelope.resume_at = None;
        let failure = Failure::new(crate::model::envelope::FailureType::Halted, None, message);
        record.envelope.error = Some(failure.message.clone());
        record.envelope.failure = Some(failure);
        record.envelope.updated_at = crate::store::records_timestamp();
        self.store.put_run(&mut record, false).await?;
        let revision = record.writes + self.store.last_progress_seq(run_id).await?;
        let _ = self.updates.send(RunUpdated { run_id: run_id.to_string(), revision });
        Ok(true)
    }

    /// Execute one attempt of an existing run.
    async fn attempt(
        &self,
        factory: &Factory,
        record: RunRecord,
        events: Option<mpsc::UnboundedSender<ProgressEntry>>,
        backend: Arc<dyn AgentBackend>,
        trace_parent: Option<crate::trace::TraceParent>,
    ) -> Result<RunEnvelope, Error> {
        let claim = self.claim(&record.envelope.run_id)?;
        self.attempt_claimed(factory, record, events, backend, claim, trace_parent).await
    }

    /// Mark `run_id` as executing here (refused when it already is). Until the claim is
    /// dropped, `wait` does not take the run's stored status for its end.
    fn claim(&self, run_id: &str) -> Result<Claim<'_>, Error> {
        let stop = StopSignal::new();
        let mut active = self.active();
        if active.contains_key(run_id) {
            return Err(Error::AlreadyActive(run_id.to_string()));
        }
        active.insert(run_id.to_string(), ActiveRun { stop: stop.clone(), shared: None });
        crate::metrics::metrics().run_active(true);
        Ok(Claim { stop, guard: ActiveGuard { host: self, run_id: run_id.to_string() } })
    }

    /// Execute one attempt of a run this host has claimed.
    async fn attempt_claimed(
        &self,
        factory: &Factory,
        mut record: RunRecord,
        events: Option<mpsc::UnboundedSender<ProgressEntry>>,
        backend: Arc<dyn AgentBackend>,
        claim: Claim<'_>,
        trace_parent: Option<crate::trace::TraceParent>,
    ) -> Result<RunEnvelope, Error> {
        let run_id = record.envelope.run_id.clone();
        let Claim { stop, guard: _active } = claim;
        let span = crate::trace::attempt(
            &record.envelope.factory,
            &run_id,
            &record.session,
            record.envelope.attempts.saturating_add(1),
        );
        if let Some(parent) = &trace_parent {
            crate::trace::continue_trace(&span, parent);
        }
        // However the attempt ends (a store error, a panic, its future dropped), the run
        // leaves `active` and gets a terminal status, so it is never wedged as running.
        let outcome = AssertUnwindSafe(self.attempt_inner(factory, &mut record, events, backend, stop, span.clone()))
            .catch_unwind()
            .instrument(span.clone())
            .await;
        let failure = match outcome {
            Ok(Ok(())) => None,
            Ok(Err(e)) => {
                Some((Failure::new(crate::model::envelope::FailureType::Storage, None, e.to_string()), Some(e)))
            }
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".into());
                tracing::error!(run = %run_id, panic = %what, "an attempt panicked");
                Some((
                    Failure::new(
                        crate::model::envelope::FailureType::Internal,
                        None,
                        format!("the host failed during this attempt ({what}); resume to continue"),
                    ),
                    None,
                ))
            }
        };
        if let Some((failure, error)) = failure {
            self.end_broken_attempt(&mut record, failure).await;
            drop(_active);
            self.announce_end(&record).await;
            if let Some(e) = error {
                return Err(e);
            }
        } else {
            drop(_active);
            self.announce_end(&record).await;
        }
        crate::trace::attempt_ended(&span, record.envelope.status, record.envelope.failure.as_ref());
        crate::metrics::metrics().attempt_ended(record.envelope.status);
        self.current(record).await
    }

    /// Tell subscribers an attempt has ended, once the run has left `active`: until then a
    /// read of the run still shows it running, so an update sent earlier could wake a
    /// follower to a read that does not show the end, and no later update would come.
    async fn announce_end(&self, record: &RunRecord) {
        let run_id = record.envelope.run_id.clone();
        let revision = record.writes + self.store.last_progress_seq(&run_id).await.unwrap_or(0);
        let _ = self.updates.send(RunUpdated { run_id, revision });
    }

    /// Give an attempt that broke (a store error, a panic) its terminal status, as far as
    /// the store still allows (the caller announces it).
    async fn end_broken_attempt(&self, record: &mut RunRecord, failure: Failure) {
        let envelope = &mut record.envelope;
        envelope.status = RunStatus::Error;
        envelope.result = None;
        envelope.error = Some(failure.message.clone());
        envelope.failure = Some(failure);
        envelope.updated_at = crate::store::records_timestamp();
        if let Err(e) = self.store.put_run(record, false).await {
            tracing::error!(run = %record.envelope.run_id, error = %e, "cannot record the end of a broken attempt");
        }
    }

    async fn attempt_inner(
        &self,
        factory: &Factory,
        record: &mut RunRecord,
        events: Option<mpsc::UnboundedSender<ProgressEntry>>,
        backend: Arc<dyn AgentBackend>,
        stop: StopSignal,
        span: tracing::Span,
    ) -> Result<(), Error> {
        let run_id = record.envelope.run_id.clone();
        record.envelope.status = RunStatus::Running;
        record.interrupted = None;
        record.envelope.attempts += 1;
        record.envelope.result = None;
        record.envelope.failure = None;
        record.envelope.error = None;
        record.envelope.resume_at = None;
        record.envelope.checkpoint = None;
        record.envelope.updated_at = crate::store::records_timestamp();
        // `scripts` is index-aligned with `component_hashes` (runs recorded before scripts
        // existed have none: they were all components).
        record.scripts.resize(record.component_hashes.len(), None);
        record.component_hashes.push(factory.component.hash.clone());
        record.scripts.push(factory.component.script.as_ref().map(|s| s.reference()));
        record.phases = factory.meta.phases.clone();
        // A script's modules: this attempt's own set, recording what it loads under the run.
        let component = match &factory.component.script {
            Some(script) => {
                let modules = script.modules.for_run(self.store.clone(), &run_id).map_err(ScriptError::Module)?;
                std::borrow::Cow::Owned(factory.component.clone().with_script(script.with_modules(modules)))
            }
            None => std::borrow::Cow::Borrowed(&factory.component),
        };
        let reference = backend.reference();
        record.envelope.backend = Some(reference.clone());
        record.backends.push(reference);
        if self.store.shared() {
            // The consent this attempt runs under, bound to what it runs (a worker that
            // recovers the run checks it).
            record.seal = attempt_bound(record).map(|bound| self.config.trust.seal(&bound));
        }
        // The attempt's start is written while its journal loads (neither reads what the
        // other writes); the guest runs once both are done, so a start the store refuses (a
        // worker fenced off) runs no guest code.
        let cache_bytes = self.config.sandbox.journal_cache_bytes;
        let loading = async {
            let next_seq = self.store.last_progress_seq(&run_id).await;
            (next_seq, Capabilities::load(&*self.store, &run_id, cache_bytes).await)
        };
        let (started, (next_seq, snapshot)) = futures::future::join(self.store.put_run(record, false), loading).await;
        started?;
        let next_seq = next_seq?;

        let prior = record.envelope.accounting;
        // Backends whose spawns see files (agent CLIs) see the run's grants, and only those,
        // and never what the serving front door keeps (its state, tokens, socket).
        let backend = backend.with_grants(&record.grants).unwrap_or(backend);
        let mut hidden = self.config.sandbox_hidden.clone();
        hidden.extend(self.config.catalog.hidden_files());
        let sealed = crate::backend::Hidden { sealed: hidden, unless_granted: Vec::new() };
        let backend = match sealed.is_empty() {
            true => backend,
            false => backend.hiding(&sealed).unwrap_or(backend),
        };
        // Under the cluster-wide cap of its backend, on a shared store that sets one; its
        // flows paced by the budget the workers of a shared store share.
        crate::engine::caps::share_flows(&self.store, &*backend);
        let backend = crate::engine::caps::capped(&self.store, &self.config.caps, backend);
        let setup = AttemptSetup {
            run_id: run_id.clone(),
            limits: record.limits,
            sandbox: self.config.sandbox.clone(),
            journal: self.store.clone() as Arc<dyn Journal>,
            backend,
            prior,
            next_seq,
            events,
            updates: self.updates.clone(),
            record_writes: record.writes,
            stop: stop.clone(),
            host_pending_bytes: self.pending_bytes.clone(),
            span,
            agent_limits: factory.meta.agent_limits.clone(),
            answers: record.checkpoints.clone(),
        };
        let mut parked = None;
        let mut checkpoint = None;
        let (status, result, failure, accounting) = match snapshot.map(|snapshot| Capabilities::new(setup, snapshot)) {
            Err(failure) => (RunStatus::Error, None, Some(failure), prior),
            Ok(shared) => {
                if let Some(active) = self.active().get_mut(&run_id) {
                    active.shared = Some(shared.clone());
                }
                shared.attempt.emit(ProgressEvent::AttemptStarted { attempt: record.envelope.attempts });
                // Live followers are told how the backend's flows stand while calls wait.
                let _watching =
                    shared.attempt.listened().then(|| WatchFlows(tokio::spawn(watch_flows(shared.clone()))));
                // Seen by the run's followers now, not a commit window later; and committed
                // while the guest runs, not at its end, where the verdict waits for it.
                shared.attempt.journal.commit_soon();
                let prior_active = Duration::from_secs_f64(prior.active_seconds);
                let budget =
                    record.limits.timeout_seconds.map(|t| Duration::from_secs_f64(t).saturating_sub(prior_active));
                if budget == Some(Duration::ZERO) {
                    shared.attempt.abort(run::Abort::Limit(run::LimitKind::TimeoutSeconds));
                }
                let mut outcome =
                    run::execute(&self.engine, &component, shared.clone(), record.args.clone(), budget, &record.grants)
                        .await;
                // A spent quota parks the run (`halted`, resumable) instead of ending it `error`.
                if let Some(crate::capabilities::attempt::StopCause::Failed(
                    failure,
                    run::Abort::Backend { kind: crate::backend::OutageKind::Quota, resume_at, .. },
                )) = shared.attempt.cause()
                {
                    if outcome.failure.as_ref() == Some(&failure) {
                        outcome.status = RunStatus::Halted;
                        parked = Some(resume_at);
                    }
                }
                if let (
                    RunStatus::Paused,
                    Some(crate::capabilities::attempt::StopCause::Paused(run::Pause::Checkpoint(key))),
                ) = (outcome.status, shared.attempt.cause())
                {
                    shared.progress.log(format!("paused at checkpoint `{key}`"));
                    checkpoint = Some(key);
                }
                let mut failure = outcome.failure;
                // The modules' record, with every import answered (written before the flush).
                if let Some(Err(e)) = component.script.as_ref().map(|s| s.modules.record_now()) {
                    failure = Some(Failure::new(crate::model::envelope::FailureType::Storage, None, e.to_string()));
                }
                // A store out of reach (the database away past the worker's lease) halts the
                // attempt, resumable: no verdict of its own.
                let outage = matches!(shared.attempt.cause(), Some(crate::capabilities::attempt::StopCause::Failed(_, run::Abort::Storage(e))) if e.is_outage());
                let dropped = shared.progress.dropped_log_lines();
                if dropped > 0 {
                    record.envelope.error = Some(format!("{dropped} log lines over the cap were dropped"));
                }
                let status =
                    if failure.as_ref().is_some_and(|f| f.kind_type == crate::model::envelope::FailureType::Storage) {
                        if outage {
                            RunStatus::Halted
                        } else {
                            RunStatus::Error
                        }
                    } else {
                        outcome.status
                    };
                // The attempt's end, with what it consumed (its `run_settled` event).
                let spent = shared.accounting();
                shared.attempt.emit(ProgressEvent::AttemptEnded {
                    status,
                    replayed: shared.agents.attempt_cache_hits(),
                    spawned: spent.agents_spawned.saturating_sub(prior.agents_spawned),
                    credits_nano: spent.ai_credits_nano.saturating_sub(prior.ai_credits_nano),
                    credits_at_least: spent.ai_credits_at_least && !prior.ai_credits_at_least,
                    elapsed_ms: ((spent.active_seconds - prior.active_seconds).max(0.0) * 1000.0) as u64,
                    failure_type: failure.as_ref().map(|f| f.kind_type),
                });
                shared.attempt.end_phase();
                (status, outcome.result, failure, spent)
            }
        };
        let accounting_at_end = accounting;
        ended(record, status, result, failure, accounting);
        record.envelope.checkpoint = checkpoint.filter(|_| record.envelope.status == RunStatus::Paused);
        let quota = |f: &Failure| {
            f.kind_type == crate::model::envelope::FailureType::Backend && f.kind.as_deref() == Some("quota")
        };
        let parked = parked.filter(|_| {
            record.envelope.status == RunStatus::Halted && record.envelope.failure.as_ref().is_some_and(quota)
        });
        if let Some(resume_at) = parked {
            if let Some(at) = park(record, resume_at) {
                self.parking.arm(&run_id, at);
            }
        }
        // Announced by the caller once the run has left `active` (`announce_end`). The
        // attempt's last progress entries are still being written: they and the verdict are
        // made durable by this one flush (in order: the entries are never behind the verdict).
        let Err(e) = self.store.put_run(record, false).await else { return Ok(()) };
        // That write failed, the entries with it: the attempt ends as a storage failure,
        // `halted` (resumable) when the store is out of reach, and that is written instead.
        // Said as the store's own error.
        // (An attempt already halted by the store out of reach stays so.)
        let halted_by_storage = record.envelope.status == RunStatus::Halted && record.interrupted.is_none();
        let outage = e.is_outage() || halted_by_storage;
        let failure =
            Failure::new(crate::model::envelope::FailureType::Storage, outage.then_some("unavailable"), e.to_string());
        let status = if outage { RunStatus::Halted } else { RunStatus::Error };
        record.envelope.resume_at = None;
        ended(record, status, None, Some(failure), accounting_at_end);
        self.store.put_run(record, false).await?;
        Ok(())
    }

    /// Cancel a run and return its terminal envelope. A run executing here stops promptly
    /// (its store is dropped, its backend calls abandoned) and keeps its journal; a run that
    /// another process sharing the store executes is asked to stop through the store
    /// ([`Store::request_cancel`]) and waited for; a run that is not executing is returned as
    /// it is.
    pub async fn cancel(&self, scope: impl Into<Scope>, run_id: &str) -> Result<RunEnvelope, Error> {
        let scope = scope.into();
        self.record(&scope, run_id).await?;
        if self.cancel_parked(run_id).await? {
            return self.envelope(scope, run_id).await;
        }
        if !self.cancel_here(run_id) {
            // Executed by another process sharing the store (or not running): ask it.
            self.store.request_cancel(run_id).await?;
            if let Some(queue) = self.store.run_queue() {
                // Still waiting in a shared store's queue, nobody executes it: it ends here.
                // A worker may hold it for a moment (claiming it, or putting it back): tried
                // again each second until it ends one way or the other.
                loop {
                    if queue.dequeue(run_id.to_string()).await? {
                        self.cancel_queued(run_id).await?;
                        break;
                    }
                    if let Ok(ended) =
                        tokio::time::timeout(Duration::from_secs(1), self.wait(scope.clone(), run_id)).await
                    {
                        return ended;
                    }
                }
            }
        }
        self.wait(scope, run_id).await
    }

    /// Pause a run and return its envelope once the attempt has stopped (`paused`, resumable
    /// under the same id by a caller; its journaled steps and agent calls kept). The attempt
    /// stops cooperatively, as a cancel stops it, with a pause as its reason (a JS body's
    /// `ctx.signal.reason` says so). A run that another process sharing the store executes is
    /// asked to pause through the store ([`Store::request_pause`]) and waited for. A run with
    /// no attempt executing is refused with [`Error::NotRunning`].
    pub async fn pause(&self, scope: impl Into<Scope>, run_id: &str) -> Result<RunEnvelope, Error> {
        let scope = scope.into();
        let record = self.record(&scope, run_id).await?;
        // (A run waiting in a shared store's queue has no attempt to pause: refused below.)
        let elsewhere = record.envelope.status == RunStatus::Running && !self.runs_here(run_id) && self.store.shared();
        if elsewhere && self.store.request_pause(run_id).await? {
            return self.wait(scope, run_id).await;
        }
        // An attempt claimed here builds its capabilities before its guest runs: waited for
        // (briefly), so a pause right after a start pauses it rather than being refused.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let running = self.active().get(run_id).map(|a| a.shared.clone());
            match running {
                Some(Some(shared)) => {
                    shared.attempt.abort(run::Abort::Paused(run::Pause::Caller));
                    break;
                }
                Some(None) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                _ => {
                    let status = record.envelope.status.as_str();
                    return Err(Error::NotRunning(format!("run `{run_id}` is {status}: it has no attempt executing")));
                }
            }
        }
        self.wait(scope, run_id).await
    }

    /// Delete a run `scope` sees and its journal from the store (`factory rm`), so a user can
    /// always repair a session. A run with an attempt executing (here, or by its record
    /// elsewhere on a shared store) is refused with [`Error::AlreadyActive`]: cancel it
    /// first. Held as this host's active run meanwhile, so no resume starts under it.
    pub async fn remove(&self, scope: impl Into<Scope>, run_id: &str) -> Result<(), Error> {
        let scope = scope.into();
        match self.store.run(run_id).await {
            Ok(Some(record)) if scope.sees(&record.session) => {}
            // A record that cannot be read names no session: only the owner, who sees every
            // session's runs, may remove it.
            Err(crate::store::StoreError::Corrupt(_)) if scope == Scope::Owner => {}
            Ok(_) => return Err(Error::NotFound(run_id.to_string())),
            Err(e) => return Err(e.into()),
        }
        let _claim = self.claim(run_id)?;
        match self.store.remove_run(run_id).await? {
            crate::store::Removed::Removed => {
                self.parking.disarm(run_id);
                tracing::info!(event = "run_removed", run = %run_id, "run removed");
                // The run is gone whether or not its space is given back now.
                if let Err(e) = self.store.reclaim().await {
                    tracing::warn!(event = "store_reclaim_failed", error = %e, "the store's free space was not given back");
                }
                Ok(())
            }
            crate::store::Removed::NotFound => Err(Error::NotFound(run_id.to_string())),
            crate::store::Removed::Active => Err(Error::AlreadyActive(run_id.to_string())),
        }
    }

    /// Cancel run `run_id` if it is parked for its backend's quota (not executing): it ends
    /// `cancelled` and its timer is disarmed. On a shared store the run is first claimed
    /// there ([`Store::claim_resume`]), so no worker's timer resumes it meanwhile. `false`
    /// when it is not parked (or executes, here or elsewhere): the caller cancels it as usual.
    async fn cancel_parked(&self, run_id: &str) -> Result<bool, Error> {
        let Ok(claim) = self.claim(run_id) else { return Ok(false) };
        let parked = |record: &Option<RunRecord>| record.as_ref().is_some_and(crate::engine::parking::is_parked);
        if !parked(&self.store.run(run_id).await?) {
            return Ok(false);
        }
        let shared = self.store.shared();
        if shared && !self.store.claim_resume(run_id).await? {
            return Ok(false);
        }
        // Read again under the claims: a timer may have resumed it meanwhile.
        let cancelled = async {
            let record = self.store.run(run_id).await?;
            if !parked(&record) {
                return Ok::<_, Error>(None);
            }
            let Some(mut record) = record else { return Ok(None) };
            record.interrupted = None;
            let envelope = &mut record.envelope;
            envelope.resume_at = None;
            envelope.status = RunStatus::Cancelled;
            let failure = Failure::new(
                crate::model::envelope::FailureType::Cancelled,
                None,
                "the run was cancelled while it was parked for its backend's quota",
            );
            envelope.error = Some(failure.message.clone());
            envelope.failure = Some(failure);
            envelope.updated_at = crate::store::records_timestamp();
            self.store.put_run(&mut record, false).await?;
            Ok(Some(record))
        }
        .await;
        if shared {
            if let Err(e) = self.store.release_claim(run_id).await {
                tracing::warn!(run = %run_id, error = %e, "cannot release the claim of a cancelled parked run");
            }
        }
        let Some(record) = cancelled? else { return Ok(false) };
        self.parking.disarm(run_id);
        drop(claim);
        tracing::info!(event = "parked_cancelled", run = %run_id, "a run parked for its quota was cancelled");
        self.announce_end(&record).await;
        Ok(true)
    }

    /// End a run taken out of the queue before any attempt: `cancelled`, nothing ran.
    async fn cancel_queued(&self, run_id: &str) -> Result<(), Error> {
        let Some(mut record) = self.store.run(run_id).await? else { return Err(Error::NotFound(run_id.to_string())) };
        let envelope = &mut record.envelope;
        envelope.status = RunStatus::Cancelled;
        let failure = Failure::new(
            crate::model::envelope::FailureType::Cancelled,
            None,
            "the run was cancelled while it waited in the queue; nothing ran",
        );
        envelope.error = Some(failure.message.clone());
        envelope.failure = Some(failure);
        envelope.updated_at = crate::store::records_timestamp();
        self.store.put_run(&mut record, false).await?;
        self.announce_end(&record).await;
        Ok(())
    }

    /// Tell this host's subscribers (`wait`, followers, event streams) that run `run_id`,
    /// which another process sharing the store executes, changed: its revision read from the
    /// store is announced, once per revision (`last` holds what was announced per run, and
    /// forgets runs that ended). A run executing here announces itself.
    pub async fn announce_elsewhere(&self, run_id: &str, last: &mut HashMap<String, u64>) -> Result<(), Error> {
        if self.active().contains_key(run_id) {
            return Ok(());
        }
        let Some(record) = self.store.run(run_id).await? else { return Ok(()) };
        let revision = record.writes + self.store.last_progress_seq(run_id).await?;
        if last.get(run_id) == Some(&revision) {
            return Ok(());
        }
        if record.envelope.status.is_terminal() {
            last.remove(run_id);
        } else {
            last.insert(run_id.to_string(), revision);
        }
        let _ = self.updates.send(RunUpdated { run_id: run_id.to_string(), revision });
        Ok(())
    }

    /// Cancel run `run_id` if it executes in this process; whether it does.
    pub fn cancel_here(&self, run_id: &str) -> bool {
        let running = self.active().get(run_id).map(|a| (a.stop.clone(), a.shared.clone()));
        match running {
            Some((_, Some(shared))) => {
                shared.attempt.abort(run::Abort::Cancelled);
                true
            }
            Some((stop, None)) => {
                stop.cancel();
                true
            }
            None => false,
        }
    }

    /// Pause run `run_id` if it executes in this process (a pause another process asked for
    /// through a shared store); whether it does.
    pub fn pause_here(&self, run_id: &str) -> bool {
        let shared = self.active().get(run_id).and_then(|a| a.shared.clone());
        match shared {
            Some(shared) => {
                shared.attempt.abort(run::Abort::Paused(run::Pause::Caller));
                true
            }
            None => false,
        }
    }

    /// Whether an attempt of `run_id` executes in this process.
    pub(crate) fn runs_here(&self, run_id: &str) -> bool {
        self.active().contains_key(run_id)
    }

    /// Resolves once no attempt of `run_id` executes in this process.
    pub(crate) async fn attempt_gone(&self, run_id: &str) {
        let mut updates = self.subscribe();
        while self.active().contains_key(run_id) {
            tokio::select! {
                _ = updates.recv() => {}
                _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            }
        }
    }

    /// Stop an attempt of `run_id` still executing in this process although the run went
    /// back to a shared store's queue (it began under a generation this worker lost, so it
    /// writes nothing more and starts no call), and wait until it has left (at most 30 s):
    /// the worker that claimed the run again can then resume it.
    pub(crate) async fn end_stale_attempt(&self, run_id: &str) {
        let running = self.active().get(run_id).map(|a| (a.stop.clone(), a.shared.clone()));
        match running {
            Some((_, Some(shared))) => {
                shared.attempt.abort(run::Abort::Halted);
            }
            Some((stop, None)) => stop.cancel(),
            None => return,
        }
        tracing::info!(run = %run_id, "stopping a stale attempt of a requeued run");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while self.active().contains_key(run_id) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stop every run executing in this process because the host is shutting down: each
    /// ends as `halted` (resumable), not `cancelled`.
    pub fn shutdown(&self) {
        // No parked run is resumed from now on: the next service's start arms it again.
        self.parking.close();
        for run in self.active().values() {
            match &run.shared {
                Some(shared) => {
                    shared.attempt.abort(run::Abort::Halted);
                }
                None => run.stop.cancel(),
            }
        }
    }

    /// Cancel every run executing in this process (for signal handlers).
    pub fn cancel_all(&self) {
        for run in self.active().values() {
            run.stop.cancel();
        }
    }

    /// Ids of the runs executing in this process.
    pub fn active_runs(&self) -> Vec<String> {
        self.active().keys().cloned().collect()
    }

    /// What consent for a resume of `run_id` is about: the sha256 of its last attempt's
    /// script source for a script factory, else of its last component (`None` before any
    /// attempt).
    pub async fn trust_key_of_run(&self, scope: impl Into<Scope>, run_id: &str) -> Result<Option<String>, Error> {
        let record = self.record(&scope.into(), run_id).await?;
        if let Some(Some(script)) = record.scripts.last() {
            return Ok(Some(script.sha256.clone()));
        }
        Ok(record.component_hashes.last().cloned())
    }

    /// The runs `scope` sees (a session's, or every session's for the owner), in creation
    /// order.
    pub async fn runs(&self, scope: impl Into<Scope>) -> Result<Vec<RunEnvelope>, Error> {
        let scope = scope.into();
        let records = self.store.runs().await?;
        let mut out = Vec::with_capacity(records.len());
        for record in records.into_iter().filter(|r| scope.sees(&r.session)) {
            out.push(self.current(record).await?);
        }
        Ok(out)
    }

    /// A page of the summaries of the runs `scope` sees, in creation order: those created
    /// after run `after` (from the first when `None`), at most `limit` (capped at
    /// [`MAX_RUNS_PAGE`]). A summary has no result and short messages
    /// ([`RunEnvelope::summary`]), so a page's size does not depend on what the runs returned.
    pub async fn run_summaries(
        &self,
        scope: impl Into<Scope>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<RunSummary>, Error> {
        let scope = scope.into();
        let limit = limit.clamp(1, MAX_RUNS_PAGE);
        // Read without results (only their sizes): a listing's memory does not grow with
        // what the runs returned.
        let listed = self.store.listed_runs().await?;
        let visible = listed.into_iter().filter(|l| scope.sees(&l.record.session));
        let mut out = Vec::new();
        let mut started = after.is_none();
        for listed in visible {
            if !started {
                started = after == Some(listed.record.envelope.run_id.as_str());
                continue;
            }
            out.push(self.listed_summary(listed).await?);
            if out.len() == limit {
                break;
            }
        }
        if !started {
            // The cursor names no run this scope sees (deleted, or another session's).
            return Err(Error::NotFound(after.unwrap_or_default().to_string()));
        }
        Ok(out)
    }

    /// A page of the summaries of the runs `scope` sees by creation sequence: with
    /// `after_seq`, the oldest runs created after it (walking newer); else the newest created
    /// before `before_seq` (before none: the newest page). A page holds at most `limit`
    /// terminal runs ([`RUNS_PAGE_DEFAULT_LIMIT`] when `None`, at most
    /// [`RUNS_PAGE_MAX_LIMIT`]); the runs still pending or running among them come along
    /// without counting, up to [`MAX_RUNS_PAGE`] runs in all.
    pub async fn runs_page(
        &self,
        scope: impl Into<Scope>,
        after_seq: Option<u64>,
        before_seq: Option<u64>,
        limit: Option<usize>,
    ) -> Result<RunsPage, Error> {
        let scope = scope.into();
        let limit = limit.unwrap_or(RUNS_PAGE_DEFAULT_LIMIT).clamp(1, RUNS_PAGE_MAX_LIMIT);
        let mut visible: Vec<_> =
            self.store.listed_runs().await?.into_iter().filter(|l| scope.sees(&l.record.session)).collect();
        visible.sort_by_key(|l| l.record.seq);
        let start = after_seq.map_or(0, |after| visible.partition_point(|l| l.record.seq <= after));
        let end =
            before_seq.map_or(visible.len(), |before| visible.partition_point(|l| l.record.seq < before)).max(start);
        let total = visible.len();
        let mut slots: Vec<_> = visible.into_iter().map(Some).collect();
        let order: Vec<usize> = if after_seq.is_some() { (start..end).collect() } else { (start..end).rev().collect() };
        let (mut picked, mut terminal) = (Vec::new(), 0usize);
        for index in order {
            let Some(listed) = slots[index].take() else { continue };
            let summary = self.listed_summary(listed).await?;
            terminal += usize::from(summary.status.is_terminal());
            picked.push((index, summary));
            if terminal == limit || picked.len() == MAX_RUNS_PAGE {
                break;
            }
        }
        picked.sort_by_key(|(index, _)| *index);
        let (lowest, highest) = (picked.first().map(|p| p.0), picked.last().map(|p| p.0));
        let runs: Vec<RunSummary> = picked.into_iter().map(|(_, summary)| summary).collect();
        Ok(RunsPage {
            oldest_seq: runs.first().and_then(|r| r.seq),
            newest_seq: runs.last().and_then(|r| r.seq),
            has_more_newer: highest.map_or(end < total, |h| h + 1 < total),
            omitted_older: lowest.map_or(start > 0, |l| l > 0),
            runs,
        })
    }

    /// The summary of a listed run: its current status, its result's size, its `seq`.
    async fn listed_summary(&self, listed: crate::store::ListedRun) -> Result<RunSummary, Error> {
        let seq = listed.record.seq;
        let mut summary = self.current(listed.record).await?.summary();
        summary.result_bytes = listed.result_bytes;
        summary.seq = Some(seq);
        Ok(summary)
    }

    /// The latest envelope of a run.
    pub async fn envelope(&self, scope: impl Into<Scope>, run_id: &str) -> Result<RunEnvelope, Error> {
        let record = self.record(&scope.into(), run_id).await?;
        self.current(record).await
    }

    /// Progress entries of a run, paged.
    pub async fn progress(
        &self,
        scope: impl Into<Scope>,
        run_id: &str,
        query: &ProgressQuery,
    ) -> Result<Vec<ProgressEntry>, Error> {
        self.record(&scope.into(), run_id).await?;
        Ok(self.store.progress(run_id, query).await?)
    }

    /// A run with its phases, agent summaries and latest progress page.
    pub async fn detail(&self, scope: impl Into<Scope>, run_id: &str) -> Result<RunDetail, Error> {
        let record = self.record(&scope.into(), run_id).await?;
        // The newest entries only, in pages backwards from the tail (the query caps a page
        // at 1000): a run's detail costs the same however long its history is.
        let mut pages = Vec::new();
        let (mut before, mut scanned, mut truncated) = (None, 0usize, false);
        loop {
            let query = ProgressQuery { before_seq: before, limit: Some(1000), ..Default::default() };
            let page = self.store.progress(run_id, &query).await?;
            let full = page.len() == 1000;
            scanned += page.len();
            before = page.first().map(|e| e.seq);
            pages.push(page);
            if !full || before.is_none_or(|seq| seq <= 1) {
                break;
            }
            if scanned >= DETAIL_SCAN_ENTRIES {
                truncated = true;
                break;
            }
        }
        let mut phases: Vec<String> = Vec::new();
        let mut agents = std::collections::VecDeque::new();
        for entry in pages.iter().rev().flatten() {
            match &entry.event {
                ProgressEvent::Phase { title } if phases.last() != Some(title) => phases.push(title.clone()),
                ProgressEvent::AgentFinished { summary, cached: false } => {
                    if agents.len() == DETAIL_AGENTS {
                        agents.pop_front();
                        truncated = true;
                    }
                    agents.push_back(summary.clone());
                }
                _ => {}
            }
        }
        let agents = Vec::from(agents);
        let executing = record.envelope.status == RunStatus::Running;
        let live = crate::engine::live::live(pages.iter().rev().flatten(), executing);
        let declared_phases = crate::engine::live::declared_phases(&record.phases, &phases);
        let progress = self.store.progress(run_id, &ProgressQuery::default()).await?;
        let limits = record.limits;
        let component_hashes = record.component_hashes.clone();
        let mut scripts = record.scripts.clone();
        scripts.resize(component_hashes.len(), None);
        let backends = record.backends.clone();
        let grants = record.grants.clone();
        let sandbox = self.config.sandbox.clone();
        let modules = self.store.run_modules(run_id).await?;
        let flows = self.run_flows(run_id);
        Ok(RunDetail {
            envelope: self.current(record).await?,
            limits,
            phases,
            agents,
            progress,
            component_hashes,
            scripts,
            modules,
            backends,
            grants,
            sandbox,
            truncated,
            flows,
            declared_phases,
            running_agents: live.running,
            queued_agents: live.queued,
            observed_at: crate::store::records_timestamp(),
        })
    }

    /// How the flows of `run_id`'s backend stand, while an attempt of it executes in this
    /// process (else none). The caller has checked the scope sees the run.
    pub fn run_flows(&self, run_id: &str) -> Vec<crate::model::flow::FlowStats> {
        let shared = self.active().get(run_id).and_then(|a| a.shared.clone());
        shared.map(|s| s.agents.flows().iter().map(|f| f.stats()).collect()).unwrap_or_default()
    }

    /// Wait until the run is in a terminal status and return that envelope (on a shared
    /// store, a `halted` run that is back in the queue or claimed by a live worker is waited
    /// for further: its next attempt's end is the answer). Watches
    /// `run_updated` and re-reads on a low-frequency timer too, so a missed event only makes
    /// the answer a little late.
    pub async fn wait(&self, scope: impl Into<Scope>, run_id: &str) -> Result<RunEnvelope, Error> {
        let scope = scope.into();
        let mut updates = self.subscribe();
        loop {
            let envelope = self.envelope(&scope, run_id).await?;
            // On a shared store, a `halted` attempt the cluster continues (the run is back in
            // the queue, or a live worker claimed it for its next attempt) is not the run's end.
            if envelope.status.is_terminal()
                && !self.active().contains_key(run_id)
                && !(envelope.status == RunStatus::Halted && self.store.continues(run_id).await?)
            {
                return Ok(envelope);
            }
            tokio::select! {
                _ = updates.recv() => {}
                _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            }
        }
    }
}

/// Who asks for a resume ([`Host::resume_as`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResumedBy {
    /// A caller (`factory resume`, the control socket, MCP, the library).
    Caller,
    /// Automatic recovery of an interrupted run ([`crate::engine::recover`]).
    Recovery,
    /// The service's timer, for a run parked for its quota whose reset has come.
    Parked,
}

/// Removes a run from the host's active runs when its attempt ends, however it ends.
struct ActiveGuard<'a> {
    host: &'a Host,
    run_id: String,
}

impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        self.host.active().remove(&self.run_id);
        crate::metrics::metrics().run_active(false);
    }
}

/// A run claimed for an attempt: its stop signal, and the guard that releases it.
struct Claim<'a> {
    stop: StopSignal,
    guard: ActiveGuard<'a>,
}

/// The journal of `meta` calls, which journal nothing.
struct NoJournal;

impl Journal for NoJournal {
    fn load<'a>(
        &'a self,
        _: &'a str,
        _: usize,
    ) -> futures::future::BoxFuture<
        'a,
        Result<crate::store::journal::JournalSnapshot, crate::store::journal::JournalError>,
    > {
        futures::future::ready(Ok(Default::default())).boxed()
    }
    fn get_step<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<Option<String>, crate::store::journal::JournalError>> {
        futures::future::ready(Ok(None)).boxed()
    }
    fn get_agent<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<Option<Option<String>>, crate::store::journal::JournalError>> {
        futures::future::ready(Ok(None)).boxed()
    }
    fn put_step(&self, _: &str, _: &str, _: &str, _: u64) -> Result<(), crate::store::journal::JournalError> {
        Ok(())
    }
    fn put_agent(&self, _: &str, _: &str, _: Option<&str>, _: u64) -> Result<(), crate::store::journal::JournalError> {
        Ok(())
    }
    fn put_progress(&self, _: &str, _: u64, _: Vec<u8>, _: u64) -> Result<(), crate::store::journal::JournalError> {
        Ok(())
    }
    fn put_accounting(&self, _: &str, _: &Accounting) -> Result<(), crate::store::journal::JournalError> {
        Ok(())
    }
    fn flush(&self) -> futures::future::BoxFuture<'_, Result<(), crate::store::journal::JournalError>> {
        Box::pin(async { Ok(()) })
    }
}

/// Write an attempt's end into its run's record: `status`, the result of a completed run,
/// the failure (its message as the run's error) and the accounting. An attempt ends `halted`
/// by an interruption only when its host shut down during it (a store outage halts it too,
/// for a caller to resume).
fn ended(
    record: &mut RunRecord,
    status: RunStatus,
    result: Option<crate::model::json::RawJson>,
    failure: Option<Failure>,
    accounting: Accounting,
) {
    let by_storage = failure.as_ref().is_some_and(|f| f.kind_type == crate::model::envelope::FailureType::Storage);
    record.interrupted = (status == RunStatus::Halted && !by_storage).then_some(crate::store::Interruption::Shutdown);
    let envelope = &mut record.envelope;
    envelope.status = status;
    envelope.result = if status == RunStatus::Completed { result } else { None };
    if let Some(f) = &failure {
        envelope.error = Some(f.message.clone());
    }
    match &failure {
        Some(f) => tracing::info!(
            event = "attempt_ended", run = %envelope.run_id, factory = %envelope.factory, attempt = envelope.attempts,
            status = status.as_str(), failure_type = f.kind_type.as_str(), failure_kind = f.kind.as_deref().unwrap_or(""),
            "attempt ended"
        ),
        None => {
            tracing::debug!(event = "attempt_ended", run = %envelope.run_id, factory = %envelope.factory, attempt = envelope.attempts, status = status.as_str(), "attempt ended")
        }
    }
    envelope.failure = failure;
    envelope.accounting = accounting;
    envelope.updated_at = crate::store::records_timestamp();
}

/// Journal the answer to the checkpoint a paused run waits at (its record keeps it; every
/// later attempt's `ctx.pause(key)` returns it): `input`, or none when the resume carries
/// none. A run that waits at no checkpoint takes no answer.
fn answer_checkpoint(
    record: &mut RunRecord,
    input: Option<serde_json::Value>,
    sandbox: &SandboxLimits,
) -> Result<(), Error> {
    use crate::capabilities::checkpoints::{MAX_ANSWERS_BYTES, MAX_ANSWER_BYTES};
    let run_id = &record.envelope.run_id;
    let waiting = record.envelope.checkpoint.clone().filter(|_| record.envelope.status == RunStatus::Paused);
    let Some(key) = waiting else {
        if input.is_some() {
            return Err(Error::NotAtCheckpoint(format!(
                "run `{run_id}` waits at no checkpoint (it is {}): resume it without an input",
                record.envelope.status.as_str()
            )));
        }
        return Ok(());
    };
    let answer = input.map(|value| value.to_string());
    if let Some(text) = &answer {
        let limit = MAX_ANSWER_BYTES.min(sandbox.max_step_bytes);
        if text.len() > limit {
            return Err(Error::InvalidInput(format!(
                "the answer is {} bytes, over the {limit} byte limit",
                text.len()
            )));
        }
        let depth = crate::model::json::depth(text);
        if depth > sandbox.max_json_depth {
            return Err(Error::InvalidInput(format!(
                "the answer is nested {depth} deep, over the limit of {}",
                sandbox.max_json_depth
            )));
        }
        let kept: usize = record.checkpoints.values().flatten().map(String::len).sum();
        if kept + text.len() > MAX_ANSWERS_BYTES {
            return Err(Error::InvalidInput(format!(
                "the run keeps {kept} bytes of answers already; this one would take it over the {MAX_ANSWERS_BYTES} byte limit"
            )));
        }
    }
    record.checkpoints.insert(key, answer);
    Ok(())
}

/// Park `record`, whose attempt ended `halted` on a spent quota: with a known reset
/// (`resume_at`) it is marked [`Interruption::Quota`](crate::store::Interruption::Quota) with
/// its `resumeAt`, for the service to resume it then; without one it has no mark, and its
/// failure says to resume it by hand. Its failure says which. Returns when it resumes.
fn park(record: &mut RunRecord, resume_at: Option<std::time::SystemTime>) -> Option<std::time::SystemTime> {
    let by_hand = crate::engine::parking::resume_command(&record.envelope.run_id, &record.session);
    // Within the bounds a spent quota is waited for, whoever made the error (a time past
    // year 9999 could not be written as RFC 3339).
    let now = std::time::SystemTime::now();
    let resume_at = resume_at.map(|t| t.clamp(now, now + crate::backend::quota::MAX_WAIT));
    let at = resume_at.map(|t| humantime::format_rfc3339_seconds(t).to_string());
    let note = match &at {
        Some(at) => format!("the run is parked (halted) and resumes by itself at {at} in the service (`factory serve`); or resume it sooner by hand: {by_hand}"),
        None => format!("the run is halted until resumed by hand once the quota is back: {by_hand}"),
    };
    record.interrupted = at.is_some().then_some(crate::store::Interruption::Quota);
    let envelope = &mut record.envelope;
    envelope.resume_at = at;
    if let Some(failure) = envelope.failure.as_mut() {
        failure.message = crate::model::envelope::bounded_text(
            format!("{}; {note}", failure.message),
            crate::model::envelope::MAX_MESSAGE_BYTES,
        );
        envelope.error = Some(failure.message.clone());
    }
    resume_at
}

/// What the consent of a queued start (`record` enqueued with `start`) is bound to.
fn start_bound<'a>(record: &'a RunRecord, start: &'a crate::store::queue::QueuedStart) -> Bound<'a> {
    Bound {
        run_id: &record.envelope.run_id,
        session: &record.session,
        args: &record.args,
        component: &start.component,
        script: start.script.as_ref(),
        backend: &start.backend,
        grants: &record.grants,
        caller_dirs: &record.caller_dirs,
        limits: &record.limits,
        overrides: &record.overrides,
    }
}

/// What the consent of the latest attempt `record` recorded is bound to (`None`: none
/// recorded).
fn attempt_bound(record: &RunRecord) -> Option<Bound<'_>> {
    let component = record.component_hashes.last()?;
    let script = record.scripts.get(record.component_hashes.len() - 1).and_then(Option::as_ref);
    Some(Bound {
        run_id: &record.envelope.run_id,
        session: &record.session,
        args: &record.args,
        component,
        script,
        backend: record.backends.last()?,
        grants: &record.grants,
        caller_dirs: &record.caller_dirs,
        limits: &record.limits,
        overrides: &record.overrides,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capabilities::checkpoints::{MAX_ANSWERS_BYTES, MAX_ANSWER_BYTES};

    fn paused_at(key: &str) -> RunRecord {
        let mut record = crate::store::conformance::record("r", "default", RunStatus::Paused);
        record.envelope.checkpoint = Some(key.to_string());
        record
    }

    #[test]
    fn a_checkpoints_answer_is_kept_under_its_key_within_its_bounds() {
        let sandbox = SandboxLimits::default();
        let mut record = paused_at("approve");
        answer_checkpoint(&mut record, Some(serde_json::json!({"ok": true})), &sandbox).unwrap();
        assert_eq!(record.checkpoints.get("approve"), Some(&Some(r#"{"ok":true}"#.to_string())));
        // Without an input the checkpoint is passed with none.
        let mut record = paused_at("approve");
        answer_checkpoint(&mut record, None, &sandbox).unwrap();
        assert_eq!(record.checkpoints.get("approve"), Some(&None));

        // A run that waits at no checkpoint takes no answer (and needs none).
        for status in [RunStatus::Paused, RunStatus::Halted, RunStatus::Error] {
            let mut record = crate::store::conformance::record("r", "default", status);
            let e = answer_checkpoint(&mut record, Some(serde_json::json!(1)), &sandbox).unwrap_err();
            assert_eq!(e.code(), crate::error::ErrorCode::NotAtCheckpoint, "{e}");
            answer_checkpoint(&mut record, None, &sandbox).unwrap();
            assert!(record.checkpoints.is_empty());
        }
        // A checkpoint key left on a run that is no longer paused is no checkpoint.
        let mut record = paused_at("approve");
        record.envelope.status = RunStatus::Error;
        assert!(answer_checkpoint(&mut record, Some(serde_json::json!(1)), &sandbox).is_err());

        // One answer over its bound, and one past what the run keeps in all.
        let mut record = paused_at("big");
        let big = serde_json::json!("x".repeat(MAX_ANSWER_BYTES));
        let e = answer_checkpoint(&mut record, Some(big), &sandbox).unwrap_err();
        assert_eq!(e.code(), crate::error::ErrorCode::InvalidInput, "{e}");
        let mut record = paused_at("last");
        let kept = "y".repeat(MAX_ANSWERS_BYTES / 2);
        record.checkpoints.insert("a".into(), Some(kept.clone()));
        record.checkpoints.insert("b".into(), Some(kept));
        let e = answer_checkpoint(&mut record, Some(serde_json::json!(1)), &sandbox).unwrap_err();
        assert_eq!(e.code(), crate::error::ErrorCode::InvalidInput, "{e}");
        assert!(!record.checkpoints.contains_key("last"), "nothing kept of a refused answer");
    }
}
