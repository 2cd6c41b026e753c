//! The sandbox: engine configuration (component-model async, fuel, epochs), the per-run
//! `Store` with its memory and table caps, and a deny-by-default WASI context for guests
//! that import WASI (no env, no args, no files, no network; stdout/stderr captured). The
//! only way to widen it is a read-only directory grant ([`check_grants`]), mounted in the
//! guest at [`grant_mount_point`].


pub mod component;
pub(crate) mod contract;

use crate::capabilities::set::Capabilities;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use wasmtime::{Config, Engine, Store, StoreLimits, StoreLimitsBuilder};
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
    start_epoch_ticker(&engine);
    Ok(engine)
}

/// Advance the engine's epoch every [`EPOCH_TICK`] until the engine is dropped. Each tick
/// makes running guests yield to the async executor, where deadlines and cancellation act.
fn start_epoch_ticker(engine: &Engine) {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("factory-epoch".into())
        .spawn(move || loop {
            std::thread::sleep(EPOCH_TICK);
            match weak.upgrade() {
                Some(engine) => engine.increment_epoch(),
                None => break,
            }
        })
        .ok();
}

/// Per-run store data: the run's shared state plus WASI and resource bookkeeping.
pub struct RunData {
    pub(crate) run: Arc<Capabilities>,
    /// The source of a script factory (`None` for components).
    pub(crate) script: Option<Arc<crate::guests::script::Script>>,
    wasi: WasiCtx,
    table: ResourceTable,
    limits: StoreLimits,
    output: MemoryOutputPipe,
}

impl RunData {
    /// What the guest wrote to stdout/stderr (capped).
    pub(crate) fn captured_output(&self) -> Vec<u8> {
        self.output.contents().to_vec()
    }
}

impl WasiView for RunData {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
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
    #[error("the run was granted `{recorded}`, which now leads to `{now}` (replaced by a symlink?); refusing to mount it")]
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

/// A new store for one attempt of a run. Each of `grants` (checked directories) is mounted
/// read-only at [`grant_mount_point`]; nothing else of the host is visible.
pub(crate) fn new_store(
    engine: &Engine,
    limits: &SandboxLimits,
    run: Arc<Capabilities>,
    script: Option<Arc<crate::guests::script::Script>>,
    grants: &[String],
) -> wasmtime::Result<Store<RunData>> {
    let output = MemoryOutputPipe::new(limits.max_output_bytes);
    let mut wasi = WasiCtxBuilder::new();
    wasi.stdout(output.clone()).stderr(output.clone()).allow_tcp(false).allow_udp(false).allow_ip_name_lookup(false);
    for (index, dir) in grants.iter().enumerate() {
        wasi.preopened_dir(dir, grant_mount_point(index), FsPerms::ReadOnly)?;
    }
    let wasi = wasi.build();
    let store_limits = StoreLimitsBuilder::new()
        .memory_size(limits.memory_bytes)
        .table_elements(limits.table_elements)
        .instances(limits.instances)
        .tables(limits.tables)
        .memories(limits.memories)
        .trap_on_grow_failure(true)
        .build();
    let data = RunData { run, script, wasi, table: ResourceTable::new(), limits: store_limits, output };
    let mut store = Store::new(engine, data);
    store.limiter(|d| &mut d.limits);
    store.set_fuel(limits.fuel)?;
    store.fuel_async_yield_interval(Some(limits.fuel_yield_interval))?;
    store.set_epoch_deadline(1);
    store.epoch_deadline_async_yield_and_update(1);
    Ok(store)
}
