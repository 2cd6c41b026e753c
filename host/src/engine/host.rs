//! [`Host`]: the library's front door. It owns the engine, the linker, the component loader,
//! the durable store and the backend; it loads and registers factories, starts, resumes,
//! cancels and waits for runs, and answers questions about them — always on behalf of a
//! [`Scope`](crate::model::scope::Scope): one owner session, which sees only its own runs, or
//! the owner of the state directory, who sees every session's.
//!
//! This file holds the type, how it is built and what it shares with its parts; each concern is
//! a module of its own: [`options`] (what a host and a run are given), [`load`] and
//! [`registry`] (factories), [`start`], [`resume`] and [`attempt`] (executing runs, on the
//! backend [`backends`] picks), [`control`] (cancel, pause, remove), [`observe`] and
//! [`detail`] (reading runs), and [`revision`] (a run's revision, read and announced).

use crate::capabilities::stop::StopSignal;
use crate::engine::loaded::Kept;
use crate::engine::run::Capabilities;
use crate::engine::state::{self, LoadedComponent, RunLinker};
use crate::error::Error;
use crate::model::progress::RunUpdated;
use crate::sandbox::component::ComponentLoader;
use crate::sandbox::{self, SandboxLimits};
use crate::store::{RedbStore, Store, StoreOptions};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::broadcast;
use wasmtime::Engine;

pub use crate::store::DEFAULT_SESSION;

mod attempt;
mod backends;
mod control;
mod detail;
mod load;
mod observe;
mod options;
mod registry;
mod resume;
mod revision;
mod start;

pub use detail::{RunDetail, DETAIL_AGENTS, DETAIL_SCAN_ENTRIES};
pub use observe::{MAX_RUNS_PAGE, RUNS_PAGE_DEFAULT_LIMIT, RUNS_PAGE_MAX_LIMIT};
pub use options::{default_cache_dir, BackendChoice, Factory, HostConfig, OnStart, ResumeOptions, RunOptions};
pub(crate) use resume::ResumedBy;

/// A run executing in this process.
struct ActiveRun {
    stop: StopSignal,
    shared: Option<Arc<Capabilities>>,
}

/// The factory host.
pub struct Host {
    engine: Engine,
    linker: RunLinker,
    /// [`Host::linker`] plus the `script` import: links the JS runner only.
    script_linker: RunLinker,
    /// The built-in JS runner, once loaded.
    runner: Mutex<Option<LoadedComponent>>,
    loader: ComponentLoader,
    /// Factories of plain components this host loaded, by component hash.
    loaded: Kept<Factory>,
    config: HostConfig,
    store: Arc<dyn Store>,
    active: Mutex<HashMap<String, ActiveRun>>,
    /// A run's revisions, read and announced ([`revision::Revisions`]).
    revisions: revision::Revisions,
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
        let linker = state::linker(&engine).map_err(|e| Error::Engine(e.into_boxed_dyn_error()))?;
        let script_linker = state::script_linker(&engine).map_err(|e| Error::Engine(e.into_boxed_dyn_error()))?;
        let loader = ComponentLoader::new(engine.clone(), config.cache_dir.clone());
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
            revisions: revision::Revisions::new(store.clone()),
            store,
            active: Mutex::new(HashMap::new()),
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
        self.revisions.subscribe()
    }

    fn active(&self) -> MutexGuard<'_, HashMap<String, ActiveRun>> {
        self.active.lock().unwrap_or_else(|p| p.into_inner())
    }
}
