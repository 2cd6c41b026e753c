//! The shared store: a PostgreSQL database that several `factory` workers use at once
//! (`factory serve --store postgres://...`). The same tables as the redb store, plus the
//! workers and their leases ([`worker`]); versioned migrations serialized across workers
//! ([`schema`]); group commit in one fenced transaction per window ([`writer`]); reads on a
//! small connection pool (deadpool-postgres); cancel and pause requests between workers ([`cancel`]);
//! one notification per commit so other workers follow runs live ([`changes`]); the run
//! queue workers claim from, the reaper and the per-backend call slots ([`queue`]).
//! Everything that talks to the database runs on the store's own small tokio runtime, so a
//! caller on any runtime (or a blocked thread) never stalls it. Connecting repairs what a crash left, as opening the redb store does.

mod blobs;
mod cancel;
mod changes;
mod journal;
mod progress;
mod queue;
pub mod schema;
pub mod url;
mod usage;
mod values;
mod worker;
pub mod workers;
mod writer;

use crate::model::envelope::RunStatus;
use crate::model::progress::ProgressEntry;
use crate::model::script::Manifest;
use crate::store::op::Op;
use crate::store::records::{display_key, unreadable_run};
use crate::store::{
    corrupt, ListedRun, ProgressQuery, Registration, Removed, RunRecord, Store, StoreError, WriterStats,
};
use futures::future::{BoxFuture, FutureExt};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use worker::Lease;
use writer::Writer;

pub use url::{is_postgres_url, redact};

/// Default lease of a worker: renewed every third of it.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);

/// Default connections in the pool (the writer takes one per commit, reads the others).
pub const DEFAULT_POOL_SIZE: usize = 4;

/// How to connect a PostgreSQL store.
#[derive(Debug, Clone)]
pub struct PgOptions {
    /// This worker's id: a worker that starts again under the same id takes its runs back at
    /// once (a new generation fences its earlier self); see [`default_worker_id`].
    pub worker: String,
    /// The group-commit window.
    pub commit_window: Duration,
    /// Bytes queued and not yet committed before a write waits for the next commit.
    pub queue_bytes: u64,
    /// How long a lease renewal holds.
    pub lease: Duration,
    /// Connections in the pool.
    pub pool_size: usize,
    /// The password when the URL has none (else `PGPASSWORD`, else the password file:
    /// [`url::config`]).
    pub password: Option<String>,
}

impl PgOptions {
    /// The defaults for worker `worker`.
    pub fn new(worker: impl Into<String>) -> Self {
        PgOptions {
            worker: worker.into(),
            commit_window: crate::store::DEFAULT_COMMIT_WINDOW,
            queue_bytes: crate::store::DEFAULT_QUEUE_BYTES,
            lease: DEFAULT_LEASE,
            pool_size: DEFAULT_POOL_SIZE,
            password: None,
        }
    }
}

/// The default worker id of a process serving `state_dir`: this host's name and a short
/// hash of the state directory, so a service restarted on the same machine and directory is
/// the same worker, and two services with their own directories are two.
pub fn default_worker_id(state_dir: &Path) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(state_dir.as_os_str().as_encoded_bytes());
    format!("{}-{}", worker::hostname(), &hex::encode(digest)[..8])
}

/// A PostgreSQL failure of the store at `url` (already redacted).
pub(crate) fn pg(url: &str, e: tokio_postgres::Error) -> StoreError {
    StoreError::Postgres { url: url.to_string(), source: Arc::new(e) }
}

/// The connection pool, with the redacted URL its errors name.
#[derive(Clone)]
pub(crate) struct PoolHandle {
    pool: deadpool_postgres::Pool,
    /// The store's URL, redacted.
    pub(crate) url: String,
}

impl PoolHandle {
    fn new(config: tokio_postgres::Config, url: String, size: usize) -> Result<PoolHandle, StoreError> {
        let manager = deadpool_postgres::Manager::from_config(
            config,
            tokio_postgres::NoTls,
            deadpool_postgres::ManagerConfig { recycling_method: deadpool_postgres::RecyclingMethod::Fast },
        );
        let pool = deadpool_postgres::Pool::builder(manager)
            .max_size(size.max(2))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .create_timeout(Some(Duration::from_secs(10)))
            .wait_timeout(Some(Duration::from_secs(30)))
            .build()
            .map_err(|e| StoreError::PoolBuild { url: url.clone(), source: e.into() })?;
        Ok(PoolHandle { pool, url })
    }

    /// A connection.
    pub(crate) async fn get(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool.get().await.map_err(|e| StoreError::Pool { url: self.url.clone(), source: Arc::new(e) })
    }
}

/// The PostgreSQL store of one worker.
pub struct PgStore {
    pool: PoolHandle,
    writer: Writer,
    lease: Lease,
    /// When the lease runs out by this process's monotonic clock (from the last successful
    /// renewal's send time).
    local_lease: Arc<Mutex<Instant>>,
    handle: tokio::runtime::Handle,
    runtime: Option<tokio::runtime::Runtime>,
    /// Component hashes queued or known stored (saves a copy per attempt).
    known_blobs: Mutex<std::collections::HashSet<String>>,
    /// Blobs put and not yet checked after a record referring to them ([`blobs`]).
    pins: crate::store::blobs::Pins,
    /// The runs connecting halted (a crash, or a dead worker, left them running).
    repaired: Vec<String>,
    /// Cancel requests for runs, from other workers ([`cancel`]).
    cancels: tokio::sync::broadcast::Sender<String>,
    /// Pause requests for runs, from other workers ([`cancel`]).
    pauses: tokio::sync::broadcast::Sender<String>,
    /// Runs other workers committed ([`changes`]).
    changes: tokio::sync::broadcast::Sender<String>,
    /// The runs whose attempt this process started, with the generation it held then. A
    /// write for a run whose attempt began under an earlier generation (before this worker
    /// lost its lease and rejoined) is refused: that attempt's run may be another worker's
    /// now. Held while a run's write is queued, and while rejoining.
    executing: Arc<Mutex<std::collections::HashMap<String, i64>>>,
    /// Wakes the claimers of the run queue ([`queue`]).
    queue_wakeups: tokio::sync::broadcast::Sender<()>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("url", &self.pool.url)
            .field("worker", &self.lease.worker)
            .field("generation", &self.lease.generation())
            .finish()
    }
}

impl PgStore {
    /// Connect to the database at `url`: migrate its schema (refusing a newer one), register
    /// this worker with a new generation and a lease, halt the runs a crash or a dead worker
    /// left running, and start the writer and the lease renewal.
    pub async fn connect(url: &str, options: PgOptions) -> Result<PgStore, StoreError> {
        let config = url::config(url, options.password.as_deref())?;
        let listen_config = config.clone();
        let queue_config = config.clone();
        let shown = redact(url);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("factory-pg")
            .enable_all()
            .build()
            .map_err(|e| StoreError::Writer(Arc::new(e)))?;
        let handle = runtime.handle().clone();
        let setup = {
            let (shown, options) = (shown.clone(), options.clone());
            handle.spawn(async move {
                let pool = PoolHandle::new(config, shown.clone(), options.pool_size)?;
                let mut client = pool.get().await?;
                schema::migrate(&mut client, &shown).await?;
                let (lease, repaired) =
                    worker::register(&mut client, &shown, &options.worker, options.lease, worker::Left::Crash).await?;
                Ok::<_, StoreError>((pool, lease, repaired, Instant::now()))
            })
        };
        let (pool, lease, repaired, registered) = match setup.await {
            Ok(Ok(parts)) => parts,
            Ok(Err(e)) => {
                runtime.shutdown_background();
                return Err(e);
            }
            Err(_) => {
                runtime.shutdown_background();
                return Err(StoreError::Closed);
            }
        };
        for id in &repaired {
            tracing::info!("run {id} was left running by a crash; halted");
        }
        let local_lease = Arc::new(Mutex::new(registered + lease.duration));
        let writer = Writer::start(
            &handle,
            writer::Setup {
                pool: pool.clone(),
                lease: lease.clone(),
                window: options.commit_window,
                queue_bytes: options.queue_bytes,
                local_lease: local_lease.clone(),
            },
        );
        let executing = Arc::default();
        handle.spawn(
            Renewal {
                pool: pool.clone(),
                lease: lease.clone(),
                writer: writer.handle(),
                local: local_lease.clone(),
                executing: Arc::clone(&executing),
            }
            .run(),
        );
        let (cancels, _) = tokio::sync::broadcast::channel(256);
        let (pauses, _) = tokio::sync::broadcast::channel(256);
        let (changes, _) = tokio::sync::broadcast::channel(1024);
        let heard = cancel::Heard { cancels: cancels.clone(), pauses: pauses.clone(), changes: changes.clone() };
        handle.spawn(cancel::listen(listen_config, pool.clone(), lease.worker.clone(), heard));
        let (queue_wakeups, _) = tokio::sync::broadcast::channel(16);
        handle.spawn(queue::listen(queue_config, pool.url.clone(), queue_wakeups.clone()));
        Ok(PgStore {
            pool,
            writer,
            lease,
            local_lease,
            handle,
            runtime: Some(runtime),
            known_blobs: Default::default(),
            pins: Default::default(),
            repaired,
            cancels,
            pauses,
            changes,
            executing,
            queue_wakeups,
        })
    }

    /// This worker's id.
    pub fn worker(&self) -> &str {
        &self.lease.worker
    }

    /// The generation this worker holds (raised each time it rejoins after losing its lease).
    pub fn generation(&self) -> i64 {
        self.lease.generation()
    }

    /// The store's URL, redacted.
    pub fn url(&self) -> &str {
        &self.pool.url
    }

    /// The runs connecting halted (left running by a crash or a dead worker).
    pub fn repaired(&self) -> &[String] {
        &self.repaired
    }

    /// Whether this worker still holds its lease by its own clock (it stops starting work
    /// once it does not, even before the database says so).
    pub fn lease_held(&self) -> bool {
        Instant::now() < *self.local_lease.lock().unwrap_or_else(|p| p.into_inner())
            && self.writer.failed.lock().unwrap_or_else(|p| p.into_inner()).is_none()
    }

    /// Run `work` on the store's runtime and await it from any runtime.
    fn spawn<T: Send + 'static>(
        &self,
        work: impl std::future::Future<Output = Result<T, StoreError>> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        let join = self.handle.spawn(work);
        async move { join.await.map_err(|_| StoreError::Closed)? }.boxed()
    }

    /// Queue `op`, a write of run `run`'s: refused when the run's attempt began under a
    /// generation this worker no longer holds (it lost its lease since and rejoined).
    pub(crate) fn send_for(&self, run: &str, op: Op) -> Result<(), StoreError> {
        let executing = self.executing.lock().unwrap_or_else(|p| p.into_inner());
        if executing.get(run).is_some_and(|&generation| generation != self.lease.generation()) {
            return Err(self.lease.fenced());
        }
        self.writer.send(op)
    }

    /// After a claim of run `run` for a new attempt here (`taken`): an attempt of it begun
    /// under a generation this worker lost has ended by then (the caller stopped it first), so
    /// its entry in `executing` no longer refuses the run's writes. Returns `taken`.
    fn claimed(&self, run: &str, taken: bool) -> bool {
        if taken {
            let mut executing = self.executing.lock().unwrap_or_else(|p| p.into_inner());
            if executing.get(run).is_some_and(|&generation| generation != self.lease.generation()) {
                executing.remove(run);
            }
        }
        taken
    }

    fn queue_blob(&self, hash: &str, bytes: &Arc<[u8]>) -> Result<(), StoreError> {
        self.pins.pin(hash, bytes);
        let mut known = self.known_blobs.lock().unwrap_or_else(|p| p.into_inner());
        if known.contains(hash) {
            return Ok(());
        }
        // Content-addressed and inserted `ON CONFLICT DO NOTHING`: no read to find out.
        self.writer.send(Op::Blob { hash: hash.to_string(), bytes: bytes.clone() })?;
        known.insert(hash.to_string());
        Ok(())
    }

    async fn write_run(&self, record: &mut RunRecord, new: bool) -> Result<(), StoreError> {
        if new {
            let pool = self.pool.clone();
            let seq = self
                .spawn(async move {
                    let client = pool.get().await?;
                    let row = client.query_one("SELECT nextval('run_seq')", &[]).await.map_err(|e| pg(&pool.url, e))?;
                    Ok(row.get::<_, i64>(0))
                })
                .await?;
            record.seq = u64::try_from(seq).map_err(|e| corrupt("the run sequence", e))?;
        }
        record.writes += 1;
        let status = serde_json::to_value(record.envelope.status)?.as_str().unwrap_or("unknown").to_string();
        let bytes = serde_json::to_vec(record)?;
        let id = record.envelope.run_id.clone();
        let starts = matches!(record.envelope.status, RunStatus::Running | RunStatus::Pending);
        let due = self.pins.due_for_run(&id, &bytes);
        {
            // An attempt starts under the generation held now; any other write of the run is
            // its attempt's, refused once that generation is gone.
            let mut executing = self.executing.lock().unwrap_or_else(|p| p.into_inner());
            if !starts && executing.get(&id).is_some_and(|&generation| generation != self.lease.generation()) {
                return Err(self.lease.fenced());
            }
            self.writer.send(Op::Run { id: id.clone(), seq: record.seq, new, status, record: bytes })?;
            if starts {
                executing.insert(id.clone(), self.lease.generation());
            }
        }
        self.writer.flush().await?;
        if !starts {
            let mut executing = self.executing.lock().unwrap_or_else(|p| p.into_inner());
            if executing.get(&id).is_some_and(|&generation| generation == self.lease.generation()) {
                executing.remove(&id);
            }
        }
        self.keep_pinned(due).await
    }

    /// After a committed record referring to them: store again the pinned blobs `due` that a
    /// collection (of any worker) deleted meanwhile ([`blobs::keep`]), then unpin them.
    pub(crate) async fn keep_pinned(&self, due: Vec<(String, Arc<[u8]>)>) -> Result<(), StoreError> {
        if due.is_empty() {
            return Ok(());
        }
        let pool = self.pool.clone();
        let checked = due.clone();
        let stored = self.spawn(async move { blobs::keep(&pool, checked).await }).await?;
        if !stored.is_empty() {
            tracing::info!(
                event = "blobs_restored",
                blobs = stored.len(),
                "blobs a collection deleted were stored again"
            );
        }
        self.pins.release(&due);
        Ok(())
    }

    async fn write_registration(&self, registration: &Registration, bytes: &Arc<[u8]>) -> Result<(), StoreError> {
        self.queue_blob(&registration.hash, bytes)?;
        let json = serde_json::to_vec(registration)?;
        let due = self.pins.due_for(&json, crate::store::blobs::Referenced::registration);
        self.writer.send(Op::Factory { key: registration.key(), registration: json })?;
        self.writer.flush().await?;
        self.keep_pinned(due).await
    }
}

/// The lease renewal task: renews every third of the lease; when the lease is found lost
/// (the database was away past it, or another worker fenced this one), the worker rejoins.
struct Renewal {
    pool: PoolHandle,
    lease: Lease,
    writer: writer::Handle,
    local: Arc<Mutex<Instant>>,
    executing: Arc<Mutex<std::collections::HashMap<String, i64>>>,
}

impl Renewal {
    async fn run(self) {
        let every = self.lease.duration / 3;
        // Since when renewals have failed (the database away), for the halted runs' message.
        let mut away_since: Option<Instant> = None;
        loop {
            tokio::time::sleep(every).await;
            let renewed = match self.pool.get().await {
                Ok(client) => worker::renew(&client, &self.pool.url, &self.lease).await,
                Err(e) => Err(e),
            };
            match renewed {
                Ok(sent) => {
                    away_since = None;
                    *self.local.lock().unwrap_or_else(|p| p.into_inner()) = sent + self.lease.duration;
                }
                Err(StoreError::Fenced { worker, generation }) => {
                    tracing::error!("worker {worker} (generation {generation}) lost its lease; its attempts stop, and it rejoins the store");
                    let away = away_since.map_or(self.lease.duration, |since| since.elapsed());
                    match self.rejoin(away).await {
                        Ok(halted) => {
                            away_since = None;
                            tracing::warn!(
                                "worker {worker} rejoined the store as generation {}; the runs it was executing are halted and back in the queue: {}",
                                self.lease.generation(),
                                if halted.is_empty() { "none".to_string() } else { halted.join(", ") }
                            );
                        }
                        Err(e) => tracing::warn!("rejoining the store: {e}"),
                    }
                }
                // The database is away: the lease runs out by itself if it stays away.
                Err(e) => {
                    away_since.get_or_insert_with(Instant::now);
                    tracing::warn!("renewing the worker lease: {e}");
                }
            }
        }
    }

    /// Register again with a new generation: every write is refused first and what was
    /// queued is handled (failed), so nothing of the lost generation is committed under the
    /// new one; the runs this worker left `running` become `halted` with a storage failure
    /// and go back to the queue (those another worker took meanwhile are its own; other
    /// workers' runs are the reaper's); then writes are accepted again,
    /// except those of attempts begun under the lost generation ([`PgStore::send_for`]).
    async fn rejoin(&self, away: Duration) -> Result<Vec<String>, StoreError> {
        self.writer.fail(self.lease.fenced());
        self.writer.drain().await;
        let mut client = self.pool.get().await?;
        let (fresh, halted) = worker::register(
            &mut client,
            &self.pool.url,
            &self.lease.worker,
            self.lease.duration,
            worker::Left::Outage(away),
        )
        .await?;
        let registered = Instant::now();
        let _executing = self.executing.lock().unwrap_or_else(|p| p.into_inner());
        self.lease.set_generation(fresh.generation());
        *self.local.lock().unwrap_or_else(|p| p.into_inner()) = registered + self.lease.duration;
        self.writer.recover();
        Ok(halted)
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        // Commit what is queued and give the lease up, then stop the runtime.
        self.writer.close(Duration::from_secs(10));
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

fn read_record(id: String, seq: i64, bytes: &[u8]) -> RunRecord {
    match serde_json::from_slice(bytes) {
        Ok(record) => record,
        Err(e) => unreadable_run(&id, seq.max(0) as u64, bytes, &e),
    }
}

impl Store for PgStore {
    fn path(&self) -> Option<&Path> {
        None
    }

    fn writer_stats(&self) -> &WriterStats {
        &self.writer.stats
    }

    fn put_run<'a>(&'a self, record: &'a mut RunRecord, new: bool) -> BoxFuture<'a, Result<(), StoreError>> {
        self.write_run(record, new).boxed()
    }

    fn run<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Option<RunRecord>, StoreError>> {
        let (pool, run_id) = (self.pool.clone(), run_id.to_string());
        self.spawn(async move {
            let client = pool.get().await?;
            let row = client
                .query_opt("SELECT record FROM runs WHERE id = $1", &[&run_id])
                .await
                .map_err(|e| pg(&pool.url, e))?;
            match row {
                None => Ok(None),
                Some(row) => serde_json::from_slice(row.get::<_, &[u8]>(0))
                    .map(Some)
                    .map_err(|e| corrupt(&format!("the record of run {run_id}"), e)),
            }
        })
    }

    fn runs(&self) -> BoxFuture<'_, Result<Vec<RunRecord>, StoreError>> {
        let pool = self.pool.clone();
        self.spawn(async move {
            let client = pool.get().await?;
            let rows = client
                .query("SELECT id, seq, record FROM runs ORDER BY seq", &[])
                .await
                .map_err(|e| pg(&pool.url, e))?;
            Ok(rows.iter().map(|row| read_record(row.get(0), row.get(1), row.get(2))).collect())
        })
    }

    fn listed_runs(&self) -> BoxFuture<'_, Result<Vec<ListedRun>, StoreError>> {
        let pool = self.pool.clone();
        self.spawn(async move {
            use futures::TryStreamExt;
            let client = pool.get().await?;
            // Row by row as the server sends them, each result dropped once its record is
            // read: the listing holds one result at a time, not every run's.
            let no_params: [&str; 0] = [];
            let rows = client
                .query_raw("SELECT id, seq, record FROM runs ORDER BY seq", no_params)
                .await
                .map_err(|e| pg(&pool.url, e))?;
            let mut rows = std::pin::pin!(rows);
            let mut out = Vec::new();
            while let Some(row) = rows.try_next().await.map_err(|e| pg(&pool.url, e))? {
                out.push(ListedRun::of(read_record(row.get(0), row.get(1), row.get(2))));
            }
            Ok(out)
        })
    }

    fn progress<'a>(
        &'a self,
        run_id: &'a str,
        query: &'a ProgressQuery,
    ) -> BoxFuture<'a, Result<Vec<ProgressEntry>, StoreError>> {
        let (pool, run_id, query) = (self.pool.clone(), run_id.to_string(), query.clone());
        self.spawn(async move { progress::read(&pool, &run_id, &query).await })
    }

    fn last_progress_seq<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        let (pool, run_id) = (self.pool.clone(), run_id.to_string());
        self.spawn(async move { progress::last_seq(&pool, &run_id).await })
    }

    fn put_blob(&self, hash: &str, bytes: &Arc<[u8]>) -> Result<(), StoreError> {
        self.queue_blob(hash, bytes)
    }

    fn blob<'a>(&'a self, hash: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, StoreError>> {
        let (pool, hash) = (self.pool.clone(), hash.to_string());
        self.spawn(async move {
            let client = pool.get().await?;
            let row = client
                .query_opt("SELECT bytes FROM blobs WHERE hash = $1", &[&hash])
                .await
                .map_err(|e| pg(&pool.url, e))?;
            Ok(row.map(|row| row.get::<_, Vec<u8>>(0)))
        })
    }

    fn register<'a>(
        &'a self,
        registration: &'a Registration,
        bytes: &'a Arc<[u8]>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.write_registration(registration, bytes).boxed()
    }

    fn registration<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Registration>, StoreError>> {
        let (pool, key) = (self.pool.clone(), key.to_string());
        self.spawn(async move {
            if key.is_empty() {
                return Ok(None);
            }
            let client = pool.get().await?;
            let row = client
                .query_opt("SELECT registration FROM factories WHERE key = $1", &[&key.as_bytes()])
                .await
                .map_err(|e| pg(&pool.url, e))?;
            match row {
                None => Ok(None),
                Some(row) => serde_json::from_slice(row.get::<_, &[u8]>(0))
                    .map(Some)
                    .map_err(|e| corrupt(&format!("the registration of {}", display_key(&key)), e)),
            }
        })
    }

    fn factories(&self) -> BoxFuture<'_, Result<Vec<Registration>, StoreError>> {
        let pool = self.pool.clone();
        self.spawn(async move {
            let client = pool.get().await?;
            let rows = client
                .query("SELECT key, registration FROM factories ORDER BY key", &[])
                .await
                .map_err(|e| pg(&pool.url, e))?;
            let mut out = Vec::new();
            for row in rows {
                match serde_json::from_slice(row.get::<_, &[u8]>(1)) {
                    Ok(registration) => out.push(registration),
                    Err(e) => {
                        let key = String::from_utf8_lossy(row.get::<_, &[u8]>(0)).into_owned();
                        tracing::warn!("the registration of {} cannot be read ({e}); left out", display_key(&key));
                    }
                }
            }
            Ok(out)
        })
    }

    fn put_run_modules(&self, run_id: &str, manifest: &Manifest) -> Result<(), StoreError> {
        self.pins.pin_modules(run_id, manifest);
        let bytes = serde_json::to_vec(manifest)?;
        self.send_for(run_id, Op::RunModules { run: run_id.to_string(), manifest: bytes })
    }

    fn shared(&self) -> bool {
        true
    }

    fn request_cancel<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        let (pool, run_id) = (self.pool.clone(), run_id.to_string());
        self.spawn(async move { cancel::request(&pool, &run_id).await })
    }

    fn cancel_requests(&self) -> Option<tokio::sync::broadcast::Receiver<String>> {
        Some(self.cancels.subscribe())
    }

    fn request_pause<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        let (pool, run_id) = (self.pool.clone(), run_id.to_string());
        self.spawn(async move { cancel::request_pause(&pool, &run_id).await })
    }

    fn pause_requests(&self) -> Option<tokio::sync::broadcast::Receiver<String>> {
        Some(self.pauses.subscribe())
    }

    fn run_queue(&self) -> Option<&dyn crate::store::queue::RunQueue> {
        Some(self)
    }

    fn run_changes(&self) -> Option<tokio::sync::broadcast::Receiver<String>> {
        Some(self.changes.subscribe())
    }

    fn attempt_fenced(&self, run_id: &str) -> bool {
        let executing = self.executing.lock().unwrap_or_else(|p| p.into_inner());
        executing.get(run_id).is_some_and(|&generation| generation != self.lease.generation())
    }

    fn claim_interrupted<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        let (pool, lease, id) = (self.pool.clone(), self.lease.clone(), run_id.to_string());
        let claimed = self.spawn(async move {
            let mut client = pool.get().await?;
            worker::claim(&mut client, &pool.url, &lease, &id).await
        });
        async move { Ok(self.claimed(run_id, claimed.await?)) }.boxed()
    }

    fn continues<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        let (pool, run_id) = (self.pool.clone(), run_id.to_string());
        self.spawn(async move {
            let client = pool.get().await?;
            let row = client
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM run_queue WHERE run_id = $1)
                         OR EXISTS (SELECT 1 FROM runs r JOIN workers w ON w.id = r.owner WHERE r.id = $1 AND w.lease_until > now())",
                    &[&run_id],
                )
                .await
                .map_err(|e| pg(&pool.url, e))?;
            Ok(row.get(0))
        })
    }

    fn claim_resume<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        let (pool, lease, id) = (self.pool.clone(), self.lease.clone(), run_id.to_string());
        let claimed = self.spawn(async move {
            let mut client = pool.get().await?;
            worker::claim_for_resume(&mut client, &pool.url, &lease, &id).await
        });
        async move { Ok(self.claimed(run_id, claimed.await?)) }.boxed()
    }

    fn release_claim<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        let (pool, lease, run_id) = (self.pool.clone(), self.lease.clone(), run_id.to_string());
        self.spawn(async move {
            let client = pool.get().await?;
            worker::release_claim(&client, &pool.url, &lease, &run_id).await
        })
    }

    fn remove_run<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Removed, StoreError>> {
        let (pool, run_id, worker) = (self.pool.clone(), run_id.to_string(), self.lease.worker.clone());
        async move {
            // Every write queued before is committed first: none lands after the delete.
            self.writer.flush().await?;
            self.spawn(async move {
                let e = |e| pg(&pool.url, e);
                let mut client = pool.get().await?;
                let tx = client.transaction().await.map_err(e)?;
                // The row is locked: a worker claiming the run meanwhile waits, then finds it
                // gone. An ended run another live worker has claimed (to resume it) is active.
                let row = tx
                    .query_opt(
                        "SELECT r.status, r.owner IS NOT NULL AND r.owner <> $2 AND EXISTS (
                             SELECT 1 FROM workers w WHERE w.id = r.owner AND w.lease_until >= now())
                         FROM runs r WHERE r.id = $1 FOR UPDATE OF r",
                        &[&run_id, &worker],
                    )
                    .await
                    .map_err(e)?;
                match row.map(|row| (row.get::<_, String>(0), row.get::<_, bool>(1))) {
                    None => return Ok(Removed::NotFound),
                    Some((status, claimed)) if claimed || status == "running" || status == "pending" => {
                        return Ok(Removed::Active)
                    }
                    Some(_) => {}
                }
                // The run's record and its one-row parts go in this transaction: the run is
                // gone for every reader at once.
                for table in ["live_accounting", "journal_usage", "run_modules", "run_queue"] {
                    tx.execute(&format!("DELETE FROM {table} WHERE run_id = $1"), &[&run_id]).await.map_err(e)?;
                }
                tx.execute("DELETE FROM runs WHERE id = $1", &[&run_id]).await.map_err(e)?;
                tx.commit().await.map_err(e)?;
                // Its journal (as many rows as it made calls, steps and progress entries) goes
                // after, [`REMOVE_BATCH_ROWS`] rows a transaction: no lock held long, no WAL
                // burst of one huge transaction. Rows a crash leaves meanwhile belong to no
                // run: nothing reads them (nothing sweeps them yet either).
                // The shared values its rows refer to are uncounted in each batch's transaction
                // (and deleted with their last reference).
                for table in [values::Rows::Steps, values::Rows::Agents] {
                    values::delete_rows(&mut client, table, &run_id, REMOVE_BATCH_ROWS).await.map_err(e)?;
                }
                delete_in_batches(&client, "progress", &run_id).await.map_err(e)?;
                Ok(Removed::Removed)
            })
            .await
        }
        .boxed()
    }

    fn shared_value_refs<'a>(
        &'a self,
        hash: &'a crate::store::shared::Hash,
    ) -> BoxFuture<'a, Result<Option<u64>, StoreError>> {
        let (pool, hash) = (self.pool.clone(), hash.to_vec());
        async move {
            self.writer.flush().await?;
            self.spawn(async move {
                let client = pool.get().await?;
                let row = client
                    .query_opt("SELECT refs FROM journal_values WHERE hash = $1", &[&hash])
                    .await
                    .map_err(|e| pg(&pool.url, e))?;
                Ok(row.map(|row| row.get::<_, i64>(0).max(0) as u64))
            })
            .await
        }
        .boxed()
    }

    fn usage_report(&self) -> BoxFuture<'_, Result<Option<crate::store::StoreUsage>, StoreError>> {
        let pool = self.pool.clone();
        async move {
            // What is queued is committed first, as a redb store's report does.
            self.writer.flush().await?;
            self.spawn(async move { usage::usage(&pool).await.map(Some) }).await
        }
        .boxed()
    }

    fn collect_blobs<'a>(&'a self, candidates: &'a [String]) -> BoxFuture<'a, Result<usize, StoreError>> {
        let (pool, candidates) = (self.pool.clone(), candidates.to_vec());
        async move {
            if candidates.is_empty() {
                return Ok(0);
            }
            // Every write queued before is committed first (a module record among them).
            self.writer.flush().await?;
            let dead = self.spawn(async move { blobs::collect(&pool, candidates).await }).await?;
            let mut known = self.known_blobs.lock().unwrap_or_else(|p| p.into_inner());
            for hash in &dead {
                known.remove(hash);
            }
            Ok(dead.len())
        }
        .boxed()
    }

    fn run_modules<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Option<Manifest>, StoreError>> {
        let (pool, run_id) = (self.pool.clone(), run_id.to_string());
        self.spawn(async move {
            let client = pool.get().await?;
            let row = client
                .query_opt("SELECT manifest FROM run_modules WHERE run_id = $1", &[&run_id])
                .await
                .map_err(|e| pg(&pool.url, e))?;
            match row {
                None => Ok(None),
                Some(row) => serde_json::from_slice(row.get::<_, &[u8]>(0))
                    .map(Some)
                    .map_err(|e| corrupt("a run's module record", e)),
            }
        })
    }
}

/// Journal rows a removal deletes in one transaction.
pub const REMOVE_BATCH_ROWS: i64 = 1000;

/// Delete run `run_id`'s rows of `table` (keyed by `run_id` first), [`REMOVE_BATCH_ROWS`] at
/// a time, each batch its own short transaction.
async fn delete_in_batches(
    client: &tokio_postgres::Client,
    table: &str,
    run_id: &str,
) -> Result<u64, tokio_postgres::Error> {
    let statement =
        format!("DELETE FROM {table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {table} WHERE run_id = $1 LIMIT $2))");
    let mut deleted = 0;
    loop {
        let n = client.execute(&statement, &[&run_id, &REMOVE_BATCH_ROWS]).await?;
        deleted += n;
        if n == 0 {
            return Ok(deleted);
        }
    }
}
