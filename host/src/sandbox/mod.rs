//! The sandbox: engine configuration (component-model async, fuel, epochs), the per-run
//! `Store` with its memory and table caps, and a deny-by-default WASI context for guests
//! that import WASI (no env, no args, no files, no network; stdout/stderr captured). The
//! only way to widen it is a read-only directory grant ([`check_grants`]), mounted in the
//! guest at [`grant_mount_point`]. A store's data is [`RunData<T>`]: what the sandbox keeps
//! (WASI, the resource table, the limits, the captured output) around the host state `T`
//! its caller builds and reaches again through [`RunData::host`] (as wasmtime-wasi's
//! `WasiView` reaches WASI's); the sandbox never looks inside `T`, and [`linker`] links WASI
//! alone, leaving the rest of the imports to the caller. What a worker of a shared store admits of what the
//! database says to run (component hashes, consent seals, grant roots) is [`admission`].
//! The OS sandbox native code runs in (builds, agent CLIs) is bubblewrap: [`bwrap`].

pub mod admission;
pub mod component;
pub(crate) mod contract;

use std::path::{Path, PathBuf};
use std::time::Duration;
use wasmtime::component::Linker;
use wasmtime::{Config, Engine, ResourceLimiter, Store};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{FsPerms, ResourceTable, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

pub use crate::model::sandbox_limits::{SandboxLimits, SandboxLimitsError};

/// How often the epoch advances: the granularity of deadlines and forced yields.
pub const EPOCH_TICK: Duration = Duration::from_millis(5);

/// The wasmtime engine every run of a host shares.
pub fn engine() -> wasmtime::Result<Engine> {
    let mut config = Config::new();
    config
        .wasm_component_model(true)
        .wasm_component_model_async(true)
        .concurrency_support(true)
        .consume_fuel(true)
        .epoch_interruption(true);
    // For profiling only: `FACTORY_PERF_MAP=1` makes wasmtime write `/tmp/perf-PID.map`,
    // so `perf report` names the guest's compiled functions.
    if std::env::var_os("FACTORY_PERF_MAP").is_some_and(|v| v == "1") {
        config.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }
    let engine = Engine::new(&config)?;
    ticker::global().register(&engine);
    Ok(engine)
}

/// The process's epoch ticker: one thread that advances the epoch of every live engine
/// every [`EPOCH_TICK`] while some guest store exists, and sleeps (no wake-ups) while none
/// does, so an idle service or MCP server costs no CPU. Each tick makes running guests
/// yield to the async executor, where deadlines and cancellation act.
pub(crate) mod ticker {
    use super::EPOCH_TICK;
    use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
    use wasmtime::{Engine, EngineWeak};

    #[derive(Default)]
    struct State {
        engines: Vec<EngineWeak>,
        /// Guest stores alive now ([`Live`] guards).
        live: usize,
        /// Ticks made so far.
        ticks: u64,
    }

    /// A ticker and its thread (the process has one, [`global`]).
    #[derive(Default)]
    pub(crate) struct Ticker {
        state: Mutex<State>,
        wake: Condvar,
    }

    impl Ticker {
        /// A ticker with a thread of its own (it lives as long as the process).
        pub(crate) fn start() -> Arc<Ticker> {
            let ticker = Arc::new(Ticker::default());
            let ours = ticker.clone();
            let started = std::thread::Builder::new().name("factory-epoch".into()).spawn(move || ours.run());
            if let Err(e) = started {
                tracing::error!("cannot start the epoch ticker thread: {e}; guest deadlines will not be enforced");
            }
            ticker
        }

        fn lock(&self) -> MutexGuard<'_, State> {
            self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
        }

        fn run(&self) {
            loop {
                let engines = {
                    let mut state = self.lock();
                    while state.live == 0 {
                        state = self.wake.wait(state).unwrap_or_else(|p| p.into_inner());
                    }
                    state.engines.retain(|weak| weak.upgrade().is_some());
                    state.ticks += 1;
                    state.engines.iter().filter_map(EngineWeak::upgrade).collect::<Vec<Engine>>()
                };
                std::thread::sleep(EPOCH_TICK);
                for engine in engines {
                    engine.increment_epoch();
                }
            }
        }

        /// Tick `engine` from now on, while it lives.
        pub(crate) fn register(&self, engine: &Engine) {
            self.lock().engines.push(engine.weak());
        }

        /// A guard that keeps this ticker ticking while it lives.
        pub(crate) fn live(self: &Arc<Self>) -> Live {
            self.lock().live += 1;
            self.wake.notify_one();
            Live(self.clone())
        }

        /// Ticks made so far.
        #[cfg(test)]
        pub(crate) fn ticks(&self) -> u64 {
            self.lock().ticks
        }
    }

    /// The process's ticker.
    pub(crate) fn global() -> &'static Arc<Ticker> {
        static TICKER: OnceLock<Arc<Ticker>> = OnceLock::new();
        TICKER.get_or_init(Ticker::start)
    }

    /// Keeps its ticker running while it lives: one per guest store.
    pub(crate) struct Live(Arc<Ticker>);

    impl Drop for Live {
        fn drop(&mut self) {
            let mut state = self.0.lock();
            state.live = state.live.saturating_sub(1);
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// Wait (bounded, generously) until `ticker` has made `count` ticks.
        fn reaches(ticker: &Ticker, count: u64) -> bool {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while std::time::Instant::now() < deadline {
                if ticker.ticks() >= count {
                    return true;
                }
                std::thread::sleep(EPOCH_TICK);
            }
            false
        }

        #[test]
        fn a_ticker_ticks_only_while_a_store_lives() {
            let ticker = Ticker::start();
            let engine = crate::sandbox::engine().unwrap();
            ticker.register(&engine);
            std::thread::sleep(EPOCH_TICK * 4);
            assert_eq!(ticker.ticks(), 0, "no store yet: no tick");
            let live = ticker.live();
            assert!(reaches(&ticker, 3), "a live store makes it tick");
            drop(live);
            // A tick is counted under the lock only while a store lives: none after this.
            let parked = ticker.ticks();
            std::thread::sleep(EPOCH_TICK * 10);
            assert_eq!(ticker.ticks(), parked, "no store left: no more ticks");
            let again = ticker.live();
            assert!(reaches(&ticker, parked + 2), "a new store wakes it");
            drop(again);
        }
    }
}

/// Per-run store data: the host state `T` its caller built, plus WASI and resource
/// bookkeeping, the store's limits and the guest's captured output.
pub struct RunData<T> {
    /// The caller's state for this run (the engine's: what the hooks reach).
    host: T,
    wasi: WasiCtx,
    table: ResourceTable,
    limits: GuestLimits,
    output: MemoryOutputPipe,
    /// Keeps the epoch ticker running while this store lives.
    _ticking: ticker::Live,
}

impl<T> RunData<T> {
    /// The host state this store was made with.
    pub fn host(&self) -> &T {
        &self.host
    }

    /// The host state this store was made with, to change.
    pub fn host_mut(&mut self) -> &mut T {
        &mut self.host
    }

    /// What the guest wrote to stdout/stderr (capped).
    pub(crate) fn captured_output(&self) -> Vec<u8> {
        self.output.contents().to_vec()
    }
}

impl<T: Send> WasiView for RunData<T> {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

/// A linker for stores of [`RunData<T>`] with WASI p2 (served deny-by-default by each
/// store's context, [`new_store`]); the caller adds the rest of the imports.
pub fn linker<T: Send + 'static>(engine: &Engine) -> wasmtime::Result<Linker<RunData<T>>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    Ok(linker)
}

/// Why a directory cannot be granted to a run.
#[derive(Debug, thiserror::Error)]
pub enum GrantError {
    /// It does not exist or cannot be reached.
    #[error("cannot grant read access to `{path}`: {source}")]
    Unavailable { path: String, source: std::io::Error },
    /// It is not a directory.
    #[error("cannot grant read access to `{0}`: not a directory (--allow-read takes a directory)")]
    NotADirectory(String),
    /// Its canonical path is not UTF-8 (runs record grants as text).
    #[error("cannot grant read access to `{0}`: the path is not valid UTF-8")]
    NotUtf8(String),
    /// A granted directory now resolves elsewhere (a symlink replaced it or one of its
    /// parents): the run was granted the directory it recorded, not whatever is there now.
    #[error(
        "the run was granted `{recorded}`, which now leads to `{now}` (replaced by a symlink?); refusing to mount it"
    )]
    Moved { recorded: String, now: String },
}

/// Check a run's recorded grants again before an attempt: each must still be a directory
/// whose canonical path is the recorded one (so a directory replaced by a symlink, or a
/// parent swapped, is refused rather than followed).
pub fn recheck_grants(recorded: &[String]) -> Result<(), GrantError> {
    for dir in recorded {
        let now = check_grant(Path::new(dir))?;
        if &now != dir {
            return Err(GrantError::Moved { recorded: dir.clone(), now });
        }
    }
    Ok(())
}

pub use crate::model::grant::mount_point as grant_mount_point;

/// Check directories to grant read access to: each must exist and be a directory. Returns
/// their canonical absolute paths, which is what a run records and mounts (symlinks and
/// `..` are resolved once, here).
pub fn check_grants(paths: &[PathBuf]) -> Result<Vec<String>, GrantError> {
    paths.iter().map(|path| check_grant(path)).collect()
}

fn check_grant(path: &Path) -> Result<String, GrantError> {
    let shown = path.display().to_string();
    let canonical =
        std::fs::canonicalize(path).map_err(|source| GrantError::Unavailable { path: shown.clone(), source })?;
    let metadata =
        std::fs::metadata(&canonical).map_err(|source| GrantError::Unavailable { path: shown.clone(), source })?;
    if !metadata.is_dir() {
        return Err(GrantError::NotADirectory(shown));
    }
    canonical.into_os_string().into_string().map_err(|_| GrantError::NotUtf8(shown))
}

/// A guest's growth the store refused: the typed cause of the trap that ends it, which the
/// engine names as the sandbox limit it hit (no message is read for it).
#[derive(Debug, thiserror::Error)]
pub enum GrowthRefused {
    /// A linear memory would grow past the store's memory limit (or its own maximum).
    #[error("forcing trap when growing memory to {desired} bytes, over the limit of {limit}")]
    Memory {
        /// The size it asked for.
        desired: usize,
        /// The most it may have.
        limit: usize,
    },
    /// A table would grow past the store's element limit (or its own maximum).
    #[error("forcing trap when growing table to {desired} elements, over the limit of {limit}")]
    Table {
        /// The elements it asked for.
        desired: usize,
        /// The most it may have.
        limit: usize,
    },
}

/// The store's resource limits ([`SandboxLimits`]): a growth past them traps with a
/// [`GrowthRefused`], as does a growth the host cannot give (memory it cannot have).
struct GuestLimits {
    memory_bytes: usize,
    table_elements: usize,
    instances: usize,
    tables: usize,
    memories: usize,
}

impl ResourceLimiter for GuestLimits {
    fn memory_growing(&mut self, _current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        let limit = maximum.map_or(self.memory_bytes, |max| max.min(self.memory_bytes));
        if desired > limit {
            return Err(GrowthRefused::Memory { desired, limit }.into());
        }
        Ok(true)
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        Err(error.context("forcing a memory growth failure to be a trap"))
    }

    fn table_growing(&mut self, _current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        let limit = maximum.map_or(self.table_elements, |max| max.min(self.table_elements));
        if desired > limit {
            return Err(GrowthRefused::Table { desired, limit }.into());
        }
        Ok(true)
    }

    fn table_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        Err(error.context("forcing a table growth failure to be a trap"))
    }

    fn instances(&self) -> usize {
        self.instances
    }

    fn tables(&self) -> usize {
        self.tables
    }

    fn memories(&self) -> usize {
        self.memories
    }
}

/// A new store for one attempt of a run, holding `host` (the caller's state for the run).
/// Each of `grants` (checked directories) is mounted read-only at [`grant_mount_point`];
/// nothing else of the host is visible.
pub(crate) fn new_store<T>(
    engine: &Engine,
    limits: &SandboxLimits,
    host: T,
    grants: &[String],
) -> wasmtime::Result<Store<RunData<T>>> {
    let output = MemoryOutputPipe::new(limits.max_output_bytes);
    let mut wasi = WasiCtxBuilder::new();
    wasi.stdout(output.clone()).stderr(output.clone()).allow_tcp(false).allow_udp(false).allow_ip_name_lookup(false);
    for (index, dir) in grants.iter().enumerate() {
        wasi.preopened_dir(dir, grant_mount_point(index), FsPerms::ReadOnly)?;
    }
    let wasi = wasi.build();
    let store_limits = GuestLimits {
        memory_bytes: limits.memory_bytes,
        table_elements: limits.table_elements,
        instances: limits.instances,
        tables: limits.tables,
        memories: limits.memories,
    };
    let data = RunData {
        host,
        wasi,
        table: ResourceTable::new(),
        limits: store_limits,
        output,
        _ticking: ticker::global().live(),
    };
    let mut store = Store::new(engine, data);
    store.limiter(|d| &mut d.limits);
    store.set_fuel(limits.fuel)?;
    store.fuel_async_yield_interval(Some(limits.fuel_yield_interval))?;
    store.set_epoch_deadline(1);
    store.epoch_deadline_async_yield_and_update(1);
    Ok(store)
}
