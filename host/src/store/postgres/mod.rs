//! The shared store: a PostgreSQL database that several `factory` workers use at once
//! (`factory serve --store postgres://...`). The same tables as the redb store, plus the
//! workers and their leases ([`worker`]); versioned migrations serialized across workers
//! ([`schema`]); group commit in one fenced transaction per window ([`writer`]); reads on a
//! small connection pool (deadpool-postgres); cancel requests between workers ([`cancel`]); the
//! run queue workers claim from, the reaper and the per-backend call slots ([`queue`]).
//! Everything that talks to the database runs on the store's own small tokio runtime, so a
//! caller on any runtime (or a blocked thread) never stalls it. Connecting repairs what a crash left, as opening the redb store does.

mod cancel;
mod journal;
mod progress;
mod queue;
pub mod schema;
pub mod url;
mod worker;
pub mod workers;
mod writer;

use crate::model::progress::ProgressEntry;
use crate::model::script::Manifest;
use crate::store::records::{display_key, unreadable_run};
use crate::store::{corrupt, ProgressQuery, Registration, RunRecord, Store, StoreError, WriterStats};
use futures::future::{BoxFuture, FutureExt};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use worker::Lease;
use writer::{Op, Writer};

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
            .map_err(|e| StoreError::Url { url: url.clone(), reason: e.to_string() })?;
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
    /// The runs connecting halted (a crash, or a dead worker, left them running).
    repaired: Vec<String>,
    /// Cancel requests for runs, from other workers ([`cancel`]).
    cancels: tokio::sync::broadcast::Sender<String>,
    /// Wakes the claimers of the run queue ([`queue`]).
    queue_wakeups: tokio::sync::broadcast::Sender<()>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore").field("url", &self.pool.url).field("worker", &self.lease.worker).field("generation", &self.lease.generation).finish()
    }
}

impl PgStore {
    /// Connect to the database at `url`: migrate its schema (refusing a newer one), register
    /// this worker with a new generation and a lease, halt the runs a crash or a dead worker
    /// left running, and start the writer and the lease renewal.
    pub async fn connect(url: &str, options: PgOptions) -> Result<PgStore, StoreError> {
        let config = url::config(url)?;
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
                let (lease, repaired) = worker::register(&mut client, &shown, &options.worker, options.lease).await?;
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
        let writer = Writer::start(
            &handle,
            writer::Setup { pool: pool.clone(), lease: lease.clone(), window: options.commit_window, queue_bytes: options.queue_bytes },
        );
        let local_lease = Arc::new(Mutex::new(registered + lease.duration));
        handle.spawn(renew(pool.clone(), lease.clone(), writer.failed.clone(), local_lease.clone()));
        let (cancels, _) = tokio::sync::broadcast::channel(256);
        handle.spawn(cancel::listen(listen_config, pool.clone(), lease.worker.clone(), cancels.clone()));
        let (queue_wakeups, _) = tokio::sync::broadcast::channel(16);
        handle.spawn(queue::listen(queue_config, pool.url.clone(), queue_wakeups.clone()));
        Ok(PgStore { pool, writer, lease, local_lease, handle, runtime: Some(runtime), known_blobs: Default::default(), repaired, cancels, queue_wakeups })
    }

    /// This worker's id.
    pub fn worker(&self) -> &str {
        &self.lease.worker
    }

    /// The generation this worker registered with.
    pub fn generation(&self) -> i64 {
        self.lease.generation
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
    fn spawn<T: Send + 'static>(&self, work: impl std::future::Future<Output = Result<T, StoreError>> + Send + 'static) -> BoxFuture<'static, Result<T, StoreError>> {
        let join = self.handle.spawn(work);
        async move { join.await.map_err(|_| StoreError::Closed)? }.boxed()
    }

    fn queue_blob(&self, hash: &str, bytes: &Arc<[u8]>) -> Result<(), StoreError> {
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
        self.writer.send(Op::Run { id: record.envelope.run_id.clone(), seq: record.seq, status, record: bytes })?;
        self.writer.flush().await
    }

    async fn write_registration(&self, registration: &Registration, bytes: &Arc<[u8]>) -> Result<(), StoreError> {
        self.queue_blob(&registration.hash, bytes)?;
        let json = serde_json::to_vec(registration)?;
        self.writer.send(Op::Factory { key: registration.key(), registration: json })?;
        self.writer.flush().await
    }
}

/// Renew the lease every third of it; once it is lost, the writer refuses every write.
async fn renew(pool: PoolHandle, lease: Lease, failed: Arc<Mutex<Option<Arc<StoreError>>>>, local: Arc<Mutex<Instant>>) {
    let every = lease.duration / 3;
    loop {
        tokio::time::sleep(every).await;
        let renewed = match pool.get().await {
            Ok(client) => worker::renew(&client, &pool.url, &lease).await,
            Err(e) => Err(e),
        };
        match renewed {
            Ok(sent) => *local.lock().unwrap_or_else(|p| p.into_inner()) = sent + lease.duration,
            Err(StoreError::Fenced { worker, generation }) => {
                tracing::error!("worker {worker} (generation {generation}) lost its lease; it writes nothing more");
                failed.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(|| Arc::new(StoreError::Fenced { worker, generation }));
                return;
            }
            // The database is away: the lease runs out by itself if it stays away.
            Err(e) => tracing::warn!("renewing the worker lease: {e}"),
        }
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
            let row = client.query_opt("SELECT record FROM runs WHERE id = $1", &[&run_id]).await.map_err(|e| pg(&pool.url, e))?;
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
            let rows = client.query("SELECT id, seq, record FROM runs ORDER BY seq", &[]).await.map_err(|e| pg(&pool.url, e))?;
            Ok(rows.iter().map(|row| read_record(row.get(0), row.get(1), row.get(2))).collect())
        })
    }

    fn progress<'a>(&'a self, run_id: &'a str, query: &'a ProgressQuery) -> BoxFuture<'a, Result<Vec<ProgressEntry>, StoreError>> {
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
            let row = client.query_opt("SELECT bytes FROM blobs WHERE hash = $1", &[&hash]).await.map_err(|e| pg(&pool.url, e))?;
            Ok(row.map(|row| row.get::<_, Vec<u8>>(0)))
        })
    }

    fn register<'a>(&'a self, registration: &'a Registration, bytes: &'a Arc<[u8]>) -> BoxFuture<'a, Result<(), StoreError>> {
        self.write_registration(registration, bytes).boxed()
    }

    fn registration<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Registration>, StoreError>> {
        let (pool, key) = (self.pool.clone(), key.to_string());
        self.spawn(async move {
            if key.is_empty() {
                return Ok(None);
            }
            let client = pool.get().await?;
            let row = client.query_opt("SELECT registration FROM factories WHERE key = $1", &[&key.as_bytes()]).await.map_err(|e| pg(&pool.url, e))?;
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
            let rows = client.query("SELECT key, registration FROM factories ORDER BY key", &[]).await.map_err(|e| pg(&pool.url, e))?;
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
        let bytes = serde_json::to_vec(manifest)?;
        self.writer.send(Op::RunModules { run: run_id.to_string(), manifest: bytes })
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

    fn run_queue(&self) -> Option<&dyn crate::store::queue::RunQueue> {
        Some(self)
    }

    fn claim_interrupted<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        let (pool, lease, run_id) = (self.pool.clone(), self.lease.clone(), run_id.to_string());
        self.spawn(async move {
            let mut client = pool.get().await?;
            worker::claim(&mut client, &pool.url, &lease, &run_id).await
        })
    }

    fn run_modules<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Option<Manifest>, StoreError>> {
        let (pool, run_id) = (self.pool.clone(), run_id.to_string());
        self.spawn(async move {
            let client = pool.get().await?;
            let row = client.query_opt("SELECT manifest FROM run_modules WHERE run_id = $1", &[&run_id]).await.map_err(|e| pg(&pool.url, e))?;
            match row {
                None => Ok(None),
                Some(row) => serde_json::from_slice(row.get::<_, &[u8]>(0)).map(Some).map_err(|e| corrupt("a run's module record", e)),
            }
        })
    }
}
