//! Where a run's bytes go in the store (issue 54): a fan-out of 2,000 agents whose replies
//! are 2 KiB of English-like text (an order-2 Markov chain over the book's words), each different, and one of 1,000 agents that reply "ok",
//! run through the library on a real redb file; the store is then opened again and its
//! usage read per table ([`RedbStore::usage`]). Each test prints the figures the book's
//! "Storage: where the bytes go" (docs/src/internals/store.md) quotes (`cargo test --test store_size -- --nocapture`). The
//! same 2 KiB fan-out on a real PostgreSQL server (`common::postgres`) prints the bytes per
//! call its tables keep and the WAL it writes. A store shared by two runs is compacted only
//! once neither executes (it settles), each run's rows packed as it stops; a paused run whose
//! rows were packed resumes with nothing asked twice.

mod common;

use common::counting::load;
use common::prose::Markov;
use factory_host::backend::{AgentBackend, AgentReply, AgentRequest, BackendError, Usage};
use factory_host::store::{PgOptions, PgStore, RedbStore, Removed, Store, StoreOptions, StoreUsage};
use factory_host::{Host, HostConfig, Limits, RunOptions, RunStatus, Scope};
use futures::future::BoxFuture;
use serde_json::json;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// English-like replies ([`common::prose`]), each different, and what was answered.
struct Prose {
    chain: Markov,
    /// Bytes of each reply (0: every reply is `ok`).
    reply_bytes: usize,
    /// Mixed into each call's PRNG seed: another seed, other replies.
    seed: u64,
    /// Bytes of every reply answered.
    answered: AtomicU64,
    calls: AtomicU64,
}

impl Prose {
    fn new(reply_bytes: usize) -> Arc<Prose> {
        Prose::seeded(reply_bytes, 0)
    }

    fn seeded(reply_bytes: usize, seed: u64) -> Arc<Prose> {
        let chain = Markov::of_book(&common::root()).expect("the book's words");
        Arc::new(Prose { chain, reply_bytes, seed, answered: AtomicU64::new(0), calls: AtomicU64::new(0) })
    }

    /// The reply to call `i`: `reply_bytes` of generated text at most (`ok` when 0).
    fn reply(&self, i: usize) -> String {
        if self.reply_bytes == 0 {
            return "ok".into();
        }
        self.chain.reply(i as u64, self.seed, self.reply_bytes)
    }
}

struct Shared(Arc<Prose>);

impl AgentBackend for Shared {
    fn name(&self) -> String {
        "prose".into()
    }
    fn call(&self, request: Arc<AgentRequest>) -> BoxFuture<'static, Result<AgentReply, BackendError>> {
        let me = self.0.clone();
        Box::pin(async move {
            let i: usize = request.prompt.trim_start_matches("task ").parse().unwrap_or(0);
            let reply = me.reply(i);
            me.answered.fetch_add(reply.len() as u64, Ordering::SeqCst);
            me.calls.fetch_add(1, Ordering::SeqCst);
            Ok(AgentReply::new(reply, Some(Usage::tokens(10, 500, Some(0)))))
        })
    }
}

/// Run the probe's fan-out of `n` agents against `backend` on a store in `state`; the
/// store's usage once the host is gone, and the run's id.
async fn fan_out(state: &Path, backend: &Arc<Prose>, n: usize) -> (StoreUsage, String) {
    let host = Host::new(HostConfig {
        state_dir: Some(state.to_path_buf()),
        backend: Arc::new(Shared(backend.clone())),
        cache_dir: Some(common::guest_target_dir().join("cache")),
        ..HostConfig::default()
    })
    .expect("host");
    let run_id = run_fan_out(host, backend, n).await;
    (usage_of(state), run_id)
}

/// The usage of the store in `state`, opened again.
fn usage_of(state: &Path) -> StoreUsage {
    let store = RedbStore::open(state, StoreOptions::default()).expect("the store opens again");
    store.usage().expect("the store's usage")
}

/// Run the probe's fan-out of `n` agents against `backend` on `host`, then drop it; the
/// run's id.
async fn run_fan_out(host: Host, backend: &Arc<Prose>, n: usize) -> String {
    let probe = load(&host, "probe").await;
    let limits =
        Limits { max_concurrent_subagents: Some(64), max_total_subagents: Some(n as u32), ..Limits::default() };
    let options = RunOptions { args: Some(json!({"case": "fanout", "n": n})), limits, ..Default::default() };
    let done = host.run(&probe, options).await.expect("the run");
    assert_eq!(done.status, RunStatus::Completed, "{done:#?}");
    assert_eq!(done.result_value().expect("a result")["done"], n);
    assert_eq!(backend.calls.load(Ordering::SeqCst), n as u64, "each call asked once");
    drop(probe);
    drop(host);
    done.run_id
}

/// The compression dictionaries the store in `state` holds.
fn dictionaries(state: &Path) -> usize {
    RedbStore::open(state, StoreOptions::default()).expect("the store opens again").dictionary_ids().len()
}

/// Whether the file was compacted: its free pages are at most 5 % of it, or what redb's
/// compaction leaves in a small file (measured: 57,344 to 69,632 B), where a file not
/// compacted keeps over a MiB of them (the least a settled store's compaction takes back).
fn compacted(usage: &StoreUsage) -> bool {
    usage.free_bytes() * 20 <= usage.file_bytes || usage.free_bytes() <= 128 << 10
}

/// The figures, one line per table and the file's.
fn report(what: &str, usage: &StoreUsage, reply_bytes: u64, calls: u64) -> String {
    let mut out = format!(
        "{what}: {calls} calls, replies {reply_bytes} B; file {} B ({:.2}x the replies, {:.0} B per call), {} B on disk; \
         allocated {} pages of {} B; free {} B\n",
        usage.file_bytes,
        usage.file_bytes as f64 / reply_bytes.max(1) as f64,
        usage.file_bytes as f64 / calls.max(1) as f64,
        usage.disk_bytes,
        usage.allocated_pages,
        usage.page_size,
        usage.free_bytes(),
    );
    for t in usage.tables.iter().filter(|t| t.entries > 0) {
        out += &format!(
            "  {:<16} {:>6} rows {:>9} B in the file: {:>9} B stored, {:>9} B unused in its pages, {:>7} B branches\n",
            t.name,
            t.entries,
            t.bytes(),
            t.stored_bytes,
            t.fragmented_bytes,
            t.metadata_bytes
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_two_kib_replies_where_the_bytes_go() {
    let state = tempfile::tempdir().unwrap();
    let backend = Prose::new(2048);
    let n = 2000;
    let (usage, run_id) = fan_out(state.path(), &backend, n).await;
    let replies = backend.answered.load(Ordering::SeqCst);
    println!("{}", report("2 KiB replies", &usage, replies, n as u64));
    let agents = usage.table("agents").expect("the agents table");
    assert_eq!(agents.entries, n as u64, "one outcome per call");
    assert!(replies >= (n as u64) * 2000, "{replies} bytes of replies");
    // Each reply different, and what each would keep compressed alone (the codec's level 3,
    // no dictionary): the baseline the store's dictionary is measured against.
    let each: Vec<String> = (0..n).map(|i| backend.reply(i)).collect();
    assert_eq!(each.iter().collect::<std::collections::HashSet<_>>().len(), n, "every reply different");
    let alone: usize = each.iter().map(|r| zstd::bulk::compress(r.as_bytes(), 3).expect("zstd").len()).sum();
    println!(
        "per-value zstd level 3: {alone} B of {replies} B ({:.1} %); agent rows as stored: {} B ({:.1} %)",
        alone as f64 * 100.0 / replies as f64,
        agents.stored_bytes,
        agents.stored_bytes as f64 * 100.0 / replies as f64
    );
    // Replies are stored compressed with the dictionary the store trained from this run as it
    // stopped (store/redb/settle.rs): their rows, keys included, hold 38.2 % of the replies
    // (1,562,900 B for 4,095,997 measured), where each reply compressed alone keeps 58.9 %;
    // and the progress of a call refers to nothing of its reply (a few dozen bytes a call,
    // compressed chunks).
    assert!(
        agents.stored_bytes * 100 <= replies * 45,
        "agent rows of {} B for {replies} B of replies",
        agents.stored_bytes
    );
    let progress = usage.table("progress").expect("the progress table");
    assert!(progress.stored_bytes <= 64 * n as u64, "progress of {} B for {n} calls", progress.stored_bytes);
    // The component is stored compressed (codec::encode_blob): measured 115,565 B of its
    // 422,326 B (27 %).
    let component = std::fs::metadata(common::component("probe")).expect("the probe component").len();
    let blobs = usage.table("blobs").expect("the blobs table");
    assert!(
        blobs.stored_bytes * 5 <= component * 2,
        "the component's {component} B stored as {} B",
        blobs.stored_bytes
    );
    // The run's rows were packed into full leaves as it stopped (store/redb/settle.rs): the
    // room its leaves leave is 143,726 B for 1,562,900 B of rows (9 %).
    assert!(
        agents.fragmented_bytes * 5 <= agents.stored_bytes,
        "{}",
        report("2 KiB replies", &usage, replies, n as u64)
    );
    // The target: a file of at most 0.6x the replies. Measured: 0.51x (2,101,248 B),
    // the store compacted as it settled (its last run stopped): the replies' rows 1,562,900
    // B, the probe component 115,565 B (compressed, 28 % of its bytes), the dictionary
    // 64,516 B, progress some 50,000 B, the pages' unused room some 240,000 B.
    assert!(usage.file_bytes * 10 <= replies * 6, "{}", report("2 KiB replies", &usage, replies, n as u64));
    assert!(compacted(&usage), "{}", report("2 KiB replies", &usage, replies, n as u64));
    // The pages redb holds live (what a compaction keeps): 499 pages of 4 KiB, 0.50x the
    // replies. The blocks on disk are the file
    // system's business (CI's file system kept 6,176,768 B of the file of 8,949,760 B where
    // this machine's kept 5,095,424 B), so they are printed, not held.
    let live = usage.allocated_pages * usage.page_size;
    assert!(live * 10 <= replies * 6, "{}", report("2 KiB replies", &usage, replies, n as u64));

    // `factory stats` (the real binary) says where the bytes go: its parts add up to the file.
    let out = common::factory_in(state.path(), &["stats", "--json"]);
    let stats = common::stdout_json(&out);
    let parts = stats["parts"].as_array().expect("the parts");
    let sum: u64 = parts.iter().map(|p| p["bytes"].as_u64().expect("bytes")).sum();
    assert_eq!(stats["fileBytes"].as_u64(), Some(usage.file_bytes), "{stats:#}");
    assert_eq!(sum, usage.file_bytes, "{stats:#}");
    for part in parts {
        println!(
            "  part {:<52} {:>9} B {:>5.1} %",
            part["part"].as_str().unwrap_or("?"),
            part["bytes"],
            part["bytes"].as_u64().unwrap_or(0) as f64 * 100.0 / usage.file_bytes as f64
        );
    }
    let journal = &parts[0];
    assert!(journal["part"].as_str().is_some_and(|p| p.starts_with("journal values")), "{stats:#}");
    assert_eq!(journal["rows"].as_u64(), Some(n as u64), "one agent row a call, no step rows: {stats:#}");

    // `factory rm` of the run (the real binary, the owner) deletes its journal and the probe
    // component's blob (no other run or registration uses it) and compacts the file: the
    // whole file is under 10% of what it was. Measured: 2,101,248 B before, 135,168 B after
    // (the dictionary, kept: rows may use it, and the next runs do).
    let out = common::factory_in(state.path(), &["rm", &run_id]);
    assert!(out.status.success(), "factory rm: {}", String::from_utf8_lossy(&out.stderr));
    let after = usage_of(state.path());
    println!("{}", report("after factory rm", &after, replies, n as u64));
    assert!(after.table("agents").expect("the agents table").entries == 0, "the run's journal is gone");
    assert_eq!(after.table("blobs").expect("the blobs table").entries, 0, "the component went with its last run");
    assert!(
        after.file_bytes * 10 < usage.file_bytes,
        "{} B before, {}",
        usage.file_bytes,
        report("after rm", &after, 0, 1)
    );
    assert_eq!(dictionaries(state.path()), 1, "the dictionary stays");

    // The next run of the store, other replies (none of them a sample the dictionary learnt
    // from): written with the dictionary as they are committed, they keep what the first
    // run's did. Measured: 1,588,496 B of 4,095,998 (38.8 %).
    let other = Prose::seeded(2048, 1);
    let (next, _) = fan_out(state.path(), &other, n).await;
    let (replies, agents) = (other.answered.load(Ordering::SeqCst), next.table("agents").expect("the agents table"));
    println!(
        "the next run, with the dictionary: agent rows {} B of {replies} B of replies ({:.1} %)",
        agents.stored_bytes,
        agents.stored_bytes as f64 * 100.0 / replies as f64
    );
    assert_eq!(dictionaries(state.path()), 1, "no second dictionary");
    assert!(agents.stored_bytes * 100 <= replies * 45, "{}", report("the next run", &next, replies, n as u64));
}

/// A backend that holds the first call it is asked until released, answering every other one
/// at once as [`Prose`] does.
struct HoldFirst {
    prose: Arc<Prose>,
    first: std::sync::atomic::AtomicBool,
    arrived: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

struct Holding(Arc<HoldFirst>);

impl AgentBackend for Holding {
    fn name(&self) -> String {
        "prose".into()
    }
    fn call(&self, request: Arc<AgentRequest>) -> BoxFuture<'static, Result<AgentReply, BackendError>> {
        let me = self.0.clone();
        Box::pin(async move {
            if !me.first.swap(true, Ordering::SeqCst) {
                me.arrived.notify_one();
                me.release.notified().await;
            }
            Shared(me.prose.clone()).call(request).await
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runs_of_one_service_the_store_is_compacted_once_neither_executes() {
    let state = tempfile::tempdir().unwrap();
    let prose = Prose::new(2048);
    let held = Arc::new(HoldFirst {
        prose: prose.clone(),
        first: Default::default(),
        arrived: Default::default(),
        release: Default::default(),
    });
    let host = Host::new(HostConfig {
        state_dir: Some(state.path().to_path_buf()),
        backend: Arc::new(Holding(held.clone())),
        cache_dir: Some(common::guest_target_dir().join("cache")),
        ..HostConfig::default()
    })
    .expect("host");
    let probe = load(&host, "probe").await;
    let fan_out = |n: usize| RunOptions {
        args: Some(json!({"case": "fanout", "n": n})),
        limits: Limits { max_concurrent_subagents: Some(64), max_total_subagents: Some(n as u32), ..Limits::default() },
        ..Default::default()
    };
    let usage = || async { host.usage(Scope::Owner).await.expect("usage").expect("a redb store measures itself") };
    // Run B's one call is held while run A, 2,000 calls, runs to its end in the same host.
    let b = host.run(&probe, fan_out(1));
    let a_then_release = async {
        held.arrived.notified().await;
        let a = host.run(&probe, fan_out(2000)).await.expect("run A");
        assert_eq!(a.status, RunStatus::Completed, "{a:#?}");
        assert_eq!(a.result_value().expect("a result")["done"], 2000);
        // A stopped: its rows are being packed, a piece between two commits. B executes: the
        // store is not compacted under it, its free pages are kept for the commits to come.
        let during = usage().await;
        let agents = during.table("agents").expect("the agents table");
        assert_eq!(agents.entries, 2000, "A's outcomes (B's call is still held)");
        // (Measured: 1,077,248 B free of 5,312,512; compacted, some 60 KiB would be.)
        assert!(during.free_bytes() >= 512 << 10, "not compacted while B executes: {during:#?}");
        held.release.notify_one();
    };
    let (b, ()) = tokio::join!(b, a_then_release);
    let b = b.expect("run B");
    assert_eq!(b.status, RunStatus::Completed, "{b:#?}");
    assert_eq!(b.result_value().expect("a result")["done"], 1);
    assert_eq!(prose.calls.load(Ordering::SeqCst), 2001, "each call asked once");
    // Neither executes now: the store settled. Its writer finishes the settling work as the
    // store closes (a step between two commits while it is open): A's rows packed, then the
    // file compacted to about its live pages.
    drop(probe);
    drop(host);
    let after = usage_of(state.path());
    let agents = after.table("agents").expect("the agents table");
    assert_eq!(agents.entries, 2001);
    assert!(agents.fragmented_bytes * 5 <= agents.stored_bytes, "packed: {after:#?}");
    assert!(compacted(&after), "compacted as it settled: {after:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_tiny_replies_where_the_bytes_go() {
    let state = tempfile::tempdir().unwrap();
    let backend = Prose::new(0);
    let n = 1000;
    let (usage, _) = fan_out(state.path(), &backend, n).await;
    let replies = backend.answered.load(Ordering::SeqCst);
    println!("{}", report("tiny replies", &usage, replies, n as u64));
    assert_eq!(usage.table("agents").expect("the agents table").entries, n as u64);
    // Measured: progress 17,405 B stored (310,084 before compression), the file 1,122,304 B
    // (2,240,512 before), of which 400,721 B are the probe component and 344,064 B free pages.
    let progress = usage.table("progress").expect("the progress table");
    assert!(progress.stored_bytes <= 40 * n as u64, "progress of {} B for {n} calls", progress.stored_bytes);
    assert!(usage.file_bytes <= 1_500_000, "{}", report("tiny replies", &usage, replies, n as u64));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_two_kib_replies_on_postgresql_bytes_and_wal_per_call() {
    let server = common::postgres::Postgres::start();
    let url = server.database("size");
    let store = PgStore::connect(&url, PgOptions::new("size-worker")).await.expect("the store connects");
    let backend = Prose::new(2048);
    let config = HostConfig {
        backend: Arc::new(Shared(backend.clone())),
        cache_dir: Some(common::guest_target_dir().join("cache")),
        ..HostConfig::default()
    };
    let store: Arc<dyn Store> = Arc::new(store);
    let host = Host::with_store(config, store.clone()).expect("host");
    let wal_before = server.psql("size", "SELECT pg_current_wal_insert_lsn()");
    let n = 2000;
    let run_id = run_fan_out(host, &backend, n).await;
    let replies = backend.answered.load(Ordering::SeqCst);
    let wal: u64 = server
        .psql("size", &format!("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '{wal_before}')::bigint"))
        .parse()
        .expect("a WAL byte count");
    let size = |table: &str| -> u64 {
        server.psql("size", &format!("SELECT pg_total_relation_size('{table}')")).parse().expect("a relation size")
    };
    let (agents, progress) = (size("agents"), size("progress"));
    let stored: u64 =
        server.psql("size", "SELECT sum(octet_length(outcome)) FROM agents").parse().expect("a byte count");
    println!(
        "PostgreSQL, 2 KiB replies: {n} calls, replies {replies} B; agents table {agents} B ({:.0} B per call; outcomes \
         {stored} B stored), progress table {progress} B ({:.0} B per call), WAL {wal} B ({:.0} B per call)",
        agents as f64 / n as f64,
        progress as f64 / n as f64,
        wal as f64 / n as f64
    );
    assert_eq!(server.psql("size", "SELECT count(*) FROM agents"), n.to_string(), "one outcome per call");
    // Replies are stored compressed: their outcomes hold less than the replies did. Measured:
    // the agents table 3,096,576 B (4,595,712 B with raw values), WAL 5,024,744 B (6,195,312).
    assert!(stored * 10 <= replies * 7, "outcomes of {stored} B for {replies} B of replies");

    // Removed, the run leaves no row behind: its journal deleted in batches of
    // `REMOVE_BATCH_ROWS` (2,000 agent rows: two batches and an empty one).
    // Its component's blob goes with it: no other run or registration uses it.
    let record = store.run(&run_id).await.expect("run").expect("the run's record");
    let blobs = factory_host::store::blobs::of_run(&*store, &record).await.expect("the run's blobs");
    assert_eq!(server.psql("size", "SELECT count(*) FROM blobs"), blobs.len().to_string(), "the component");
    assert_eq!(store.remove_run(&run_id).await.expect("remove_run"), Removed::Removed);
    assert_eq!(store.collect_blobs(&blobs).await.expect("collect_blobs"), blobs.len());
    for table in ["runs", "agents", "steps", "progress", "journal_usage", "live_accounting", "blobs"] {
        assert_eq!(server.psql("size", &format!("SELECT count(*) FROM {table}")), "0", "{table} after the removal");
    }
    assert_eq!(store.remove_run(&run_id).await.expect("remove_run"), Removed::NotFound);
}

/// Issue 54's yardstick, measured on this machine beside our store: LangGraph's SQLite
/// checkpointer keeping the same fan-out of 1,000 calls answering `ok`
/// (`tests/compare/langgraph_size.py`, its packages pinned by `./test`). Our store, the
/// factory's component included, holds at most 1.5x its bytes per call. Measured: LangGraph
/// 856,064 to 860,160 B (about 860 B a call); ours 1,122,304 B (1,122 B a call, 1.31x), of
/// which 400,721 B are the probe component.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_tiny_replies_beside_langgraphs_sqlite_checkpointer() {
    let state = tempfile::tempdir().unwrap();
    let backend = Prose::new(0);
    let n = 1000;
    let (usage, _) = fan_out(state.path(), &backend, n).await;
    let script = common::root().join("tests/compare/langgraph_size.py");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3").arg(script).args([n.to_string(), "0".into()]).output()
    })
    .await
    .expect("the script's thread")
    .expect("python3 runs");
    assert!(
        out.status.success(),
        "LangGraph's side failed (is `langgraph` installed? ./test installs langgraph==1.2.24 and \
         langgraph-checkpoint-sqlite==3.1.2 into .venv and puts it first on PATH): {}",
        common::stderr(&out)
    );
    let theirs = common::stdout_json(&out);
    let theirs = theirs["fileBytes"].as_u64().expect("LangGraph's file bytes");
    println!(
        "tiny replies, {n} calls: ours {} B ({:.0} B a call), LangGraph's SQLite checkpointer {theirs} B ({:.0} B a \
         call): {:.2}x",
        usage.file_bytes,
        usage.file_bytes as f64 / n as f64,
        theirs as f64 / n as f64,
        usage.file_bytes as f64 / theirs as f64
    );
    assert!(
        usage.file_bytes * 10 <= theirs * 15,
        "ours {} B, LangGraph's {theirs} B: {}",
        usage.file_bytes,
        report("tiny replies", &usage, 2 * n as u64, n as u64)
    );
}

/// A backend that holds every call from the `from`th task on until `open` says so, answering
/// the others at once as [`Prose`] does.
struct HoldFrom {
    prose: Arc<Prose>,
    from: usize,
    open: tokio::sync::watch::Receiver<bool>,
}

impl AgentBackend for HoldFrom {
    fn name(&self) -> String {
        "prose".into()
    }
    fn call(&self, request: Arc<AgentRequest>) -> BoxFuture<'static, Result<AgentReply, BackendError>> {
        let (prose, from, mut open) = (self.prose.clone(), self.from, self.open.clone());
        Box::pin(async move {
            let i: usize = request.prompt.trim_start_matches("task ").parse().unwrap_or(0);
            if i >= from {
                // Dropped with the attempt when the run is paused.
                let _ = open.wait_for(|open| *open).await;
            }
            Shared(prose).call(request).await
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_run_whose_rows_were_packed_resumes_paying_nothing_twice() {
    let state = tempfile::tempdir().unwrap();
    let prose = Prose::new(2048);
    let (open, opened) = tokio::sync::watch::channel(false);
    let backend = Arc::new(HoldFrom { prose: prose.clone(), from: 1000, open: opened });
    let config = || HostConfig {
        state_dir: Some(state.path().to_path_buf()),
        backend: backend.clone(),
        cache_dir: Some(common::guest_target_dir().join("cache")),
        ..HostConfig::default()
    };
    let n = 2000;
    let limits =
        || Limits { max_concurrent_subagents: Some(64), max_total_subagents: Some(n as u32), ..Limits::default() };
    let run_id = {
        let host = Host::new(config()).expect("host");
        let probe = load(&host, "probe").await;
        let options =
            RunOptions { args: Some(json!({"case": "fanout", "n": n})), limits: limits(), ..Default::default() };
        let pause_at_half = async {
            // Tasks 0 to 999 are answered, the next ones held: pause the run then.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
            while prose.calls.load(Ordering::SeqCst) < 1000 {
                assert!(std::time::Instant::now() < deadline, "1,000 calls never answered");
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            let run_id = host.runs(factory_host::DEFAULT_SESSION).await.expect("runs")[0].run_id.clone();
            let paused = host.pause(factory_host::DEFAULT_SESSION, &run_id).await.expect("paused");
            assert_eq!(paused.status, RunStatus::Paused, "{paused:#?}");
            run_id
        };
        let (ran, run_id) = tokio::join!(host.run(&probe, options), pause_at_half);
        assert_eq!(ran.expect("the run").status, RunStatus::Paused);
        run_id
    };
    // The paused run's rows were packed as it stopped, and the store compacted as it settled.
    let usage = usage_of(state.path());
    let agents = usage.table("agents").expect("the agents table");
    assert_eq!(agents.entries, 1000, "{usage:#?}");
    assert!(agents.fragmented_bytes * 5 <= agents.stored_bytes, "packed: {usage:#?}");
    assert!(compacted(&usage), "compacted: {usage:#?}");
    // Resumed in a new host on the packed, compacted store: the 1,000 journaled calls replay
    // for free, only the others are asked.
    open.send(true).expect("the backend listens");
    let host = Host::new(config()).expect("host");
    // (Room for the cap to count the replayed calls too.)
    let limits = Limits { max_total_subagents: Some(4 * n as u32), ..limits() };
    let options = factory_host::ResumeOptions { limits, ..Default::default() };
    let done = host.resume(&run_id, options).await.expect("resumed");
    assert_eq!(done.status, RunStatus::Completed, "{done:#?}");
    assert_eq!(done.result_value().expect("a result")["done"], n);
    assert_eq!(prose.calls.load(Ordering::SeqCst), n as u64, "each call asked once over both attempts");
}
