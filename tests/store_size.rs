//! Where a run's bytes go in the store (issue 54): a fan-out of 2,000 agents whose replies
//! are 2 KiB of English-like text (windows of the book), each different, and one of 1,000 agents that reply "ok",
//! run through the library on a real redb file; the store is then opened again and its
//! usage read per table ([`RedbStore::usage`]). Each test prints the figures the book's
//! "Storage: where the bytes go" (docs/src/internals/store.md) quotes (`cargo test --test store_size -- --nocapture`). The
//! same 2 KiB fan-out on a real PostgreSQL server (`common::postgres`) prints the bytes per
//! call its tables keep and the WAL it writes.

mod common;

use common::counting::load;
use factory_host::backend::{AgentBackend, AgentReply, AgentRequest, BackendError, Usage};
use factory_host::store::{PgOptions, PgStore, RedbStore, Removed, Store, StoreOptions, StoreUsage};
use factory_host::{Host, HostConfig, Limits, RunOptions, RunStatus};
use futures::future::BoxFuture;
use serde_json::json;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The project's book (docs/src, every chapter in path order): English text, some 300 KB.
fn book_text() -> String {
    fn chapters(dir: &Path, into: &mut Vec<std::path::PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir).expect("docs/src").map(|e| e.unwrap().path()).collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                chapters(&path, into);
            } else if path.extension().is_some_and(|e| e == "md") {
                into.push(path);
            }
        }
    }
    let mut files = Vec::new();
    chapters(&common::root().join("docs").join("src"), &mut files);
    files.iter().map(|f| std::fs::read_to_string(f).expect("a chapter")).collect::<Vec<_>>().join("\n")
}

/// English-like text: 2 KiB windows of the project's book, each at another offset.
struct Prose {
    text: String,
    /// Bytes of each reply (0: every reply is `ok`).
    reply_bytes: usize,
    /// Bytes of every reply answered.
    answered: AtomicU64,
    calls: AtomicU64,
}

impl Prose {
    fn new(reply_bytes: usize) -> Arc<Prose> {
        let text = book_text();
        Arc::new(Prose { text, reply_bytes, answered: AtomicU64::new(0), calls: AtomicU64::new(0) })
    }

    /// The reply to call `i`: a window of `reply_bytes` at most, cut at character boundaries.
    fn reply(&self, i: usize) -> String {
        if self.reply_bytes == 0 {
            return "ok".into();
        }
        let span = self.text.len() - self.reply_bytes - 8;
        let mut start = i.wrapping_mul(7919) % span;
        while !self.text.is_char_boundary(start) {
            start += 1;
        }
        let mut end = start + self.reply_bytes;
        while !self.text.is_char_boundary(end) {
            end -= 1;
        }
        self.text[start..end].to_string()
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
    // Replies are stored compressed (store/codec.rs): their rows, keys included, hold less
    // than the replies did (2,451,199 B for 4,095,995 measured), and the progress of a call
    // refers to nothing of its reply (a few dozen bytes a call, compressed chunks).
    assert!(
        agents.stored_bytes * 10 <= replies * 7,
        "agent rows of {} B for {replies} B of replies",
        agents.stored_bytes
    );
    let progress = usage.table("progress").expect("the progress table");
    assert!(progress.stored_bytes <= 64 * n as u64, "progress of {} B for {n} calls", progress.stored_bytes);
    // The target is a file of at most 0.6x the replies. Measured: 2.19x (8,949,760 B)
    // long, 1.24x (5,095,424 B) on disk, of which 4,202,496 B are free pages and the tail
    // redb grew ahead (only compaction gives the pages back) and 1,606,270 B the room half-full
    // leaves of random agent keys leave: the live rows alone are 0.6x. Held here to what this
    // build reaches (4.37x long and 2.52x on disk before).
    assert!(usage.file_bytes * 10 <= replies * 25, "{}", report("2 KiB replies", &usage, replies, n as u64));
    // The pages redb holds live (what a compaction keeps): 1,165 pages of 4 KiB, 1.17x the
    // replies, measured here and on CI. The blocks on disk are the file system's business (CI's
    // file system kept 6,176,768 B of the same file where this machine's kept 5,095,424 B), so
    // they are printed, not held.
    let live = usage.allocated_pages * usage.page_size;
    assert!(live * 10 <= replies * 13, "{}", report("2 KiB replies", &usage, replies, n as u64));

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
    // component's blob (no other run or registration uses it) and, the free pages being most
    // of the file, compacts it: the whole file is under 10% of what it was. Measured:
    // 8,949,760 B before, 1,052,672 B after when the component stayed (its 524,288 B of
    // pages included).
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
