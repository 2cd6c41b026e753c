//! The conformance suite of the [`Store`] contract, written against the trait only, so every
//! implementation runs the same checks: run records (put, get, list in creation order, seq
//! kept across a reopen), progress paging (after / before / limit / phase, phase titles,
//! last seq), blobs, registrations by session, run modules, the journal (puts readable at
//! once, [`Journal::load`]'s budget rules), flush durability across a reopen, writer
//! counters, long values (stored compressed) read back as put, large values stored once
//! (shared by the runs that journal them, counted, deleted with their last run), crash
//! repair at open, and removing a run with its journal.
//!
//! A store passes by running [`run_all`] with a function that opens *the same* stored data
//! each time it is called (the suite drops its handle before calling it again, and expects
//! everything flushed before to be there). Every case writes under fresh ids (UUIDv7), so a
//! store shared with other data, or with other cases, serves as it is. The redb store runs
//! it on a file in a temporary directory (this module's tests); another store runs it from
//! its own test, e.g. for a PostgreSQL database:
//!
//! ```ignore
//! let open = || async { Ok(Arc::new(PgStore::connect(&url).await?) as Arc<dyn Store>) }.boxed();
//! factory_host::store::conformance::run_all(open).await;
//! ```
//!
//! A failed check panics, saying what the store did (this is test support).

use super::journal::{decode_outcome, fingerprint, Journal, JournalSnapshot, Loaded};
use super::records::registration_key;
use super::{Interruption, ListedRun, ProgressQuery, Registration, Removed, RunRecord, Store, StoreError};
use crate::model::envelope::{Accounting, RunEnvelope, RunStatus};
use crate::model::limits::Limits;
use crate::model::meta::FactoryMeta;
use crate::model::progress::{JournaledProgress, LogLevel, ProgressEvent};
use crate::model::script::{Manifest, Resolution};
use futures::future::BoxFuture;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Opens the store under test: the same stored data at every call.
pub trait Open: Fn() -> BoxFuture<'static, Result<Arc<dyn Store>, StoreError>> {}
impl<F: Fn() -> BoxFuture<'static, Result<Arc<dyn Store>, StoreError>>> Open for F {}

/// Run every case on the store `open` opens.
pub async fn run_all(open: impl Open) {
    run_records(&open).await;
    progress_paging(&open).await;
    blobs(&open).await;
    registrations(&open).await;
    run_modules(&open).await;
    journal_reads_and_puts(&open).await;
    journal_load_budget(&open).await;
    journal_load_order(&open).await;
    flushed_writes_survive_a_reopen(&open).await;
    long_values_read_back_as_put(&open).await;
    large_values_are_stored_once(&open).await;
    crash_repair_at_open(&open).await;
    remove_run(&open).await;
    blobs_go_with_their_last_user(&open).await;
}

async fn opened(open: &impl Open) -> Arc<dyn Store> {
    open().await.unwrap_or_else(|e| panic!("the store does not open: {e}"))
}

fn fresh_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// A run record of `session` in `status`, as the host writes one at creation.
pub fn record(run_id: &str, session: &str, status: RunStatus) -> RunRecord {
    let now = super::records::timestamp();
    RunRecord {
        envelope: RunEnvelope {
            run_id: run_id.to_string(),
            factory: "conformance".into(),
            status,
            result: None,
            failure: None,
            error: None,
            accounting: Accounting::default(),
            attempts: 1,
            backend: None,
            resume_at: None,
            checkpoint: None,
            session: None,
            created_at: now.clone(),
            updated_at: now,
            revision: 0,
        },
        session: session.to_string(),
        args: "{\"n\":1}".into(),
        overrides: Limits::default(),
        limits: Limits::default(),
        component_hashes: vec!["c0ffee".into()],
        scripts: Vec::new(),
        backends: Vec::new(),
        grants: Vec::new(),
        writes: 0,
        seq: 0,
        interrupted: None,
        recoveries: 0,
        seal: None,
        caller_dirs: Vec::new(),
        phases: Vec::new(),
        checkpoints: Default::default(),
    }
}

async fn flush(store: &Arc<dyn Store>) {
    Journal::flush(&**store).await.unwrap_or_else(|e| panic!("flush: {e}"));
}

/// Run records: put (new and again), get, list in creation order; the creation seq goes on
/// after a reopen.
pub async fn run_records(open: &impl Open) {
    let store = opened(open).await;
    let ids: Vec<String> = (0..3).map(|_| fresh_id()).collect();
    let mut records = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        // Ended runs: one left running would be repaired at the reopen below.
        let status = [RunStatus::Halted, RunStatus::Error, RunStatus::Cancelled][i];
        let mut r = record(id, if i == 1 { "alice" } else { "default" }, status);
        store.put_run(&mut r, true).await.expect("put_run (new)");
        assert_eq!(r.writes, 1, "a first put counts one write");
        records.push(r);
    }
    assert!(
        records.windows(2).all(|w| w[0].seq < w[1].seq),
        "creation seqs increase: {:?}",
        records.iter().map(|r| r.seq).collect::<Vec<_>>()
    );
    for r in &records {
        assert_eq!(store.run(&r.envelope.run_id).await.expect("run").as_ref(), Some(r), "a run reads as put");
    }
    assert_eq!(store.run(&fresh_id()).await.expect("run of an unknown id"), None);

    // A later put replaces the record, keeps its place.
    let mut first = records[0].clone();
    first.envelope.status = RunStatus::Completed;
    first.envelope.result = Some(crate::model::json::RawJson::from_value(&serde_json::json!({"ok": true})));
    store.put_run(&mut first, false).await.expect("put_run (again)");
    assert_eq!((first.writes, first.seq), (2, records[0].seq), "a second put counts a write and keeps the seq");
    records[0] = first;
    let listed = ours(&store.runs().await.expect("runs"), &ids);
    assert_eq!(listed, records, "runs lists every record, in creation order, as last put");
    // A listing's read: the same records in the same order, each without its result and
    // with the result's size.
    let listed: Vec<ListedRun> = store
        .listed_runs()
        .await
        .expect("listed_runs")
        .into_iter()
        .filter(|l| ids.contains(&l.record.envelope.run_id))
        .collect();
    let expected: Vec<ListedRun> = records.iter().cloned().map(ListedRun::of).collect();
    assert_eq!(listed, expected, "listed_runs lists every record in creation order, results left out");
    assert_eq!(listed[0].result_bytes, Some(r#"{"ok":true}"#.len() as u64), "the result's size is kept");
    assert!(listed.iter().all(|l| l.record.envelope.result.is_none()), "no result is read into a listing");

    drop(store);
    let store = opened(open).await;
    assert_eq!(ours(&store.runs().await.expect("runs after a reopen"), &ids), records, "records survive a reopen");
    let mut later = record(&fresh_id(), "default", RunStatus::Completed);
    store.put_run(&mut later, true).await.expect("put_run after a reopen");
    assert!(
        later.seq > records[2].seq,
        "the creation seq goes on after a reopen ({} after {})",
        later.seq,
        records[2].seq
    );
    let all = store.runs().await.expect("runs");
    assert_eq!(all.last().map(|r| &r.envelope.run_id), Some(&later.envelope.run_id), "the newest run is listed last");
}

fn ours(all: &[RunRecord], ids: &[String]) -> Vec<RunRecord> {
    all.iter().filter(|r| ids.contains(&r.envelope.run_id)).cloned().collect()
}

fn entry(seq: u64, phase_seq: Option<u64>, event: ProgressEvent) -> Vec<u8> {
    serde_json::to_vec(&JournaledProgress { seq, at_ms: 1_000 + seq, phase_seq, phase: None, event }).expect("encode")
}

fn log(message: &str) -> ProgressEvent {
    ProgressEvent::Log { message: message.into(), level: LogLevel::Info }
}

fn seqs(entries: &[crate::model::progress::ProgressEntry]) -> Vec<u64> {
    entries.iter().map(|e| e.seq).collect()
}

/// Progress: pages forwards, backwards and from the tail, by phase, each entry with its
/// phase's title; the last seq; runs do not mix.
pub async fn progress_paging(open: &impl Open) {
    let store = opened(open).await;
    let (run, other) = (fresh_id(), fresh_id());
    // 1 attempt start, 2 phase A, 3-5 logs in A, 6 phase B, 7-10 logs in B.
    let mut entries = vec![entry(1, None, ProgressEvent::AttemptStarted { attempt: 1 })];
    entries.push(entry(2, Some(2), ProgressEvent::Phase { title: "A".into() }));
    for seq in 3..=5 {
        entries.push(entry(seq, Some(2), log(&format!("a{seq}"))));
    }
    entries.push(entry(6, Some(6), ProgressEvent::Phase { title: "B".into() }));
    for seq in 7..=10 {
        entries.push(entry(seq, Some(6), log(&format!("b{seq}"))));
    }
    for (i, bytes) in entries.into_iter().enumerate() {
        store.put_progress(&run, i as u64 + 1, bytes, 100 * (i as u64 + 1)).expect("put_progress");
    }
    // Another run's entries, one stored with its phase as text (before phase seqs).
    let legacy = serde_json::to_vec(&JournaledProgress {
        seq: 1,
        at_ms: 5,
        phase_seq: None,
        phase: Some("Old".into()),
        event: log("x"),
    })
    .expect("encode");
    store.put_progress(&other, 1, legacy, 10).expect("put_progress");
    flush(&store).await;

    let page = |query: ProgressQuery| {
        let (store, run) = (store.clone(), run.clone());
        async move { store.progress(&run, &query).await.expect("progress") }
    };
    let all = page(ProgressQuery { after_seq: Some(0), limit: Some(1000), ..Default::default() }).await;
    assert_eq!(seqs(&all), (1..=10).collect::<Vec<_>>(), "every entry, forwards");
    let phases: Vec<Option<&str>> = all.iter().map(|e| e.phase.as_deref()).collect();
    let mut expected = vec![None];
    expected.extend([Some("A"); 4]);
    expected.extend([Some("B"); 5]);
    assert_eq!(phases, expected, "each entry has its phase's title (a phase entry its own)");
    assert_eq!(all[3].event, log("a4"));
    assert_eq!(all[3].at_ms, 1_004);

    let q = |after: Option<u64>, before: Option<u64>, limit: Option<usize>, phase: Option<&str>| ProgressQuery {
        after_seq: after,
        before_seq: before,
        limit,
        phase: phase.map(str::to_string),
    };
    assert_eq!(seqs(&page(q(Some(2), None, Some(3), None)).await), vec![3, 4, 5], "after 2, 3 of them");
    assert_eq!(seqs(&page(q(None, Some(6), Some(2), None)).await), vec![4, 5], "before 6, 2 of them, ascending");
    assert_eq!(seqs(&page(q(None, None, Some(4), None)).await), vec![7, 8, 9, 10], "the tail");
    assert_eq!(page(q(None, None, None, None)).await.len(), 10, "the default page holds 50");
    assert_eq!(seqs(&page(q(Some(0), None, Some(0), None)).await), vec![1], "a page holds at least one");
    assert_eq!(seqs(&page(q(Some(0), None, None, Some("A"))).await), vec![2, 3, 4, 5], "phase A");
    assert_eq!(seqs(&page(q(Some(0), None, Some(2), Some("B"))).await), vec![6, 7], "phase B, forwards, 2");
    assert_eq!(seqs(&page(q(None, Some(9), Some(2), Some("B"))).await), vec![7, 8], "phase B, backwards from 9, 2");
    assert_eq!(seqs(&page(q(None, None, Some(2), Some("A"))).await), vec![4, 5], "phase A's tail");
    assert!(page(q(Some(0), None, None, Some("C"))).await.is_empty(), "no entry in an unknown phase");
    assert!(page(q(Some(10), None, None, None)).await.is_empty(), "nothing after the last");
    assert!(page(q(None, Some(1), None, None)).await.is_empty(), "nothing before the first");
    assert!(page(q(None, Some(0), None, None)).await.is_empty(), "nothing before 0");
    assert!(page(q(Some(5), Some(6), None, None)).await.is_empty(), "nothing between 5 and 6");
    assert_eq!(seqs(&page(q(Some(3), Some(6), None, None)).await), vec![4, 5], "between 3 and 6");

    let theirs = store.progress(&other, &ProgressQuery::default()).await.expect("progress");
    assert_eq!(seqs(&theirs), vec![1], "runs do not mix");
    assert_eq!(theirs[0].phase.as_deref(), Some("Old"), "a phase stored as text reads as it");
    assert_eq!(store.last_progress_seq(&run).await.expect("last seq"), 10);
    assert_eq!(store.last_progress_seq(&other).await.expect("last seq"), 1);
    assert_eq!(store.last_progress_seq(&fresh_id()).await.expect("last seq"), 0, "a run without progress");
    assert!(store.progress(&fresh_id(), &ProgressQuery::default()).await.expect("progress").is_empty());

    // A long run written in two flushes (a store may group a flush's entries into rows): pages
    // across every boundary read as entries one by one would.
    let long = fresh_id();
    let mut entries = vec![entry(1, Some(1), ProgressEvent::Phase { title: "P".into() })];
    entries.extend((2..=300).map(|seq| entry(seq, Some(1), log(&"x".repeat(seq as usize % 7 * 40)))));
    for (i, bytes) in entries.into_iter().enumerate() {
        store.put_progress(&long, i as u64 + 1, bytes, 0).expect("put_progress");
        if i == 130 {
            flush(&store).await;
        }
    }
    flush(&store).await;
    let page = |query: ProgressQuery| {
        let (store, long) = (store.clone(), long.clone());
        async move { store.progress(&long, &query).await.expect("progress") }
    };
    let all = page(q(Some(0), None, Some(1000), None)).await;
    assert_eq!(seqs(&all), (1..=300).collect::<Vec<_>>(), "every entry of the long run, forwards");
    assert!(all.iter().all(|e| e.phase.as_deref() == Some("P")), "each with the title set by entry 1");
    assert_eq!(all[200].event, log(&"x".repeat(201 % 7 * 40)));
    for at in [0u64, 1, 63, 64, 65, 127, 128, 129, 130, 131, 132, 200, 298, 299] {
        let after = page(q(Some(at), None, Some(5), None)).await;
        assert_eq!(seqs(&after), (at + 1..=(at + 5).min(300)).collect::<Vec<_>>(), "5 after {at}");
        let before = page(q(None, Some(at + 2), Some(5), None)).await;
        assert_eq!(seqs(&before), (at.saturating_sub(3).max(1)..=at + 1).collect::<Vec<_>>(), "5 before {}", at + 2);
    }
    assert_eq!(
        seqs(&page(q(Some(60), Some(140), Some(1000), None)).await),
        (61..=139).collect::<Vec<_>>(),
        "between 60 and 140"
    );
    assert_eq!(seqs(&page(q(None, None, Some(3), None)).await), vec![298, 299, 300], "the long run's tail");
    assert_eq!(store.last_progress_seq(&long).await.expect("last seq"), 300);
}

/// Blobs: put, read back, put again; unknown hashes read as none.
pub async fn blobs(open: &impl Open) {
    let store = opened(open).await;
    let hash = format!("blob-{}", fresh_id());
    let bytes: Arc<[u8]> = (0..=255u8).cycle().take(70_000).collect::<Vec<u8>>().into();
    store.put_blob(&hash, &bytes).expect("put_blob");
    store.put_blob(&hash, &bytes).expect("put_blob again");
    flush(&store).await;
    assert_eq!(store.blob(&hash).await.expect("blob").as_deref(), Some(&bytes[..]), "a blob reads as put");
    assert_eq!(store.blob(&format!("blob-{}", fresh_id())).await.expect("blob"), None);
}

fn registration(name: &str, session: Option<&str>, hash: &str) -> Registration {
    Registration {
        meta: FactoryMeta {
            name: name.into(),
            description: format!("{name} for {session:?}"),
            phases: Vec::new(),
            limits: Limits::default(),
            args_schema: None,
            agent_limits: Default::default(),
        },
        hash: hash.into(),
        script: None,
        added_at: super::records::timestamp(),
        session: session.map(str::to_string),
    }
}

/// Registrations: for everyone and within a session (which shadows the other for that
/// session only), replaced by a later one, listed; their component bytes are stored.
pub async fn registrations(open: &impl Open) {
    let store = opened(open).await;
    let name = format!("fx-{}", fresh_id());
    let hash = format!("component-{}", fresh_id());
    let bytes: Arc<[u8]> = Arc::from(&b"\0asm component"[..]);
    let global = registration(&name, None, &hash);
    let alices = registration(&name, Some("alice"), &hash);
    store.register(&global, &bytes).await.expect("register");
    store.register(&alices, &bytes).await.expect("register in a session");
    assert_eq!(store.blob(&hash).await.expect("blob").as_deref(), Some(&bytes[..]), "registering stores the component");
    assert_eq!(store.factory(&name).await.expect("factory").as_ref(), Some(&global));
    assert_eq!(
        store.factory_in("alice", &name).await.expect("factory_in").as_ref(),
        Some(&alices),
        "a session sees its own"
    );
    assert_eq!(
        store.factory_in("bob", &name).await.expect("factory_in").as_ref(),
        Some(&global),
        "another session sees everyone's"
    );
    assert_eq!(
        store.registration(&registration_key(Some("alice"), &name)).await.expect("registration").as_ref(),
        Some(&alices)
    );
    assert_eq!(store.registration("").await.expect("registration of the empty key"), None);
    assert_eq!(store.factory(&format!("fx-{}", fresh_id())).await.expect("factory"), None);

    let mut again = global.clone();
    again.meta.description = "replaced".into();
    store.register(&again, &bytes).await.expect("register again");
    assert_eq!(store.factory(&name).await.expect("factory").map(|r| r.meta.description), Some("replaced".into()));
    let listed: Vec<Registration> =
        store.factories().await.expect("factories").into_iter().filter(|r| r.meta.name == name).collect();
    assert_eq!(listed.len(), 2, "one per key: {listed:?}");
    assert!(listed.contains(&again) && listed.contains(&alices), "{listed:?}");

    drop(store);
    let store = opened(open).await;
    assert_eq!(
        store.factory_in("alice", &name).await.expect("factory_in").as_ref(),
        Some(&alices),
        "registrations survive a reopen"
    );
}

/// Run modules: a manifest reads back as last put.
pub async fn run_modules(open: &impl Open) {
    let store = opened(open).await;
    let run = fresh_id();
    assert_eq!(store.run_modules(&run).await.expect("run_modules"), None);
    let mut manifest = Manifest {
        root: Some("/factories/demo".into()),
        modules: BTreeMap::from([("lib.js".to_string(), "h1".to_string())]),
        resolved: vec![Resolution { referrer: "main.js".into(), specifier: "./lib.js".into(), name: "lib.js".into() }],
    };
    store.put_run_modules(&run, &manifest).expect("put_run_modules");
    flush(&store).await;
    assert_eq!(store.run_modules(&run).await.expect("run_modules").as_ref(), Some(&manifest));
    manifest.modules.insert("util.ts".into(), "h2".into());
    store.put_run_modules(&run, &manifest).expect("put_run_modules again");
    flush(&store).await;
    assert_eq!(store.run_modules(&run).await.expect("run_modules").as_ref(), Some(&manifest), "the last manifest wins");
}

/// The journal: step values and agent outcomes read back at once (before any flush), as
/// last put; runs do not mix; a load lists every step key and the journal bytes.
pub async fn journal_reads_and_puts(open: &impl Open) {
    let store = opened(open).await;
    let (run, other) = (fresh_id(), fresh_id());
    store.put_step(&run, "plan", "\"v1\"", 10).expect("put_step");
    assert_eq!(
        store.get_step(&run, "plan").await.expect("get_step").as_deref(),
        Some("\"v1\""),
        "a put reads back at once"
    );
    store.put_step(&run, "plan", "\"v2\"", 20).expect("put_step again");
    assert_eq!(store.get_step(&run, "plan").await.expect("get_step").as_deref(), Some("\"v2\""), "the last put wins");
    store.put_agent(&run, "a1", Some("{\"text\":\"hi\"}"), 30).expect("put_agent");
    store.put_agent(&run, "a2", None, 40).expect("put_agent (a failure)");
    assert_eq!(store.get_agent(&run, "a1").await.expect("get_agent"), Some(Some("{\"text\":\"hi\"}".into())));
    assert_eq!(
        store.get_agent(&run, "a2").await.expect("get_agent"),
        Some(None),
        "an ordinary failure is journaled as such"
    );
    assert_eq!(store.get_agent(&run, "a3").await.expect("get_agent"), None, "a call never journaled");
    assert_eq!(store.get_step(&other, "plan").await.expect("get_step"), None, "runs do not mix");
    flush(&store).await;
    assert_eq!(store.get_step(&run, "plan").await.expect("get_step").as_deref(), Some("\"v2\""), "and once committed");
    assert_eq!(store.get_agent(&run, "a2").await.expect("get_agent"), Some(None));

    let mut snapshot = store.load(&run, 1 << 20).await.expect("load");
    assert_eq!(snapshot.steps.len(), 1, "every step key");
    assert_eq!(
        steps(&snapshot),
        BTreeMap::from([("plan".to_string(), "\"v2\"".to_string())]),
        "a load with room holds every value"
    );
    let expected =
        BTreeMap::from([("a1".to_string(), Some("{\"text\":\"hi\"}".to_string())), ("a2".to_string(), None)]);
    assert_eq!(outcomes(&snapshot), expected, "and every agent outcome");
    // A store that lists agent keys lists every one.
    if snapshot.agents_listed {
        assert_eq!(snapshot.agents.len(), 2, "every agent key listed");
    }
    for key in ["a1", "a2"] {
        assert!(snapshot.agents.knows(snapshot.agents.fingerprint(key)), "agent key {key} known");
    }
    assert!(!snapshot.agents.knows(snapshot.agents.fingerprint("a3")), "a call never journaled is not known");
    assert_eq!(snapshot.steps.get("plan"), Loaded::Value(&b"\"v2\""[..]), "a value is found by its key");
    assert_eq!(snapshot.steps.get("other"), Loaded::Absent);
    assert_eq!(snapshot.journal_bytes, 40, "the last journal bytes");
    let empty = store.load(&other, 1 << 20).await.expect("load");
    assert!(empty.steps.is_empty() && empty.agents.is_empty(), "an empty journal lists no key");
    assert_eq!(empty.journal_bytes, 0, "an empty journal");
    assert_eq!(store.footprint(0, 0), store.footprint(0, 0), "a footprint is a figure");
    assert!(store.footprint(10, 100) >= 110, "a footprint counts at least the entry's bytes");
}

/// [`Journal::load`]'s budget: steps first, then agent outcomes, up to the budget in all,
/// none over a quarter of it; every step key listed whether its value is loaded or not.
pub async fn journal_load_budget(open: &impl Open) {
    let store = opened(open).await;
    let run = fresh_id();
    // A budget of 200: a quarter is 50. Four steps of 46 bytes (key 1 + value 45) fill 184;
    // one of 61 is over the quarter; an agent outcome of 40 (key 2 + 1 + 37) would fit the
    // quarter but not what the steps left.
    let value = |n: usize| format!("\"{}\"", "x".repeat(n - 2));
    for key in ["a", "b", "c", "d"] {
        store.put_step(&run, key, &value(45), 1).expect("put_step");
    }
    store.put_step(&run, "e", &value(60), 2).expect("put_step");
    store.put_agent(&run, "k1", Some(&value(37)), 3).expect("put_agent");
    flush(&store).await;

    let mut snapshot = store.load(&run, 200).await.expect("load");
    assert_eq!(snapshot.steps.len(), 5, "every step key, loaded or not");
    for key in ["a", "b", "c", "d", "e"] {
        assert!(snapshot.steps.knows(fingerprint(key)), "step key {key} known");
    }
    let loaded = steps(&snapshot);
    assert_eq!(
        loaded.keys().collect::<Vec<_>>(),
        vec!["a", "b", "c", "d"],
        "the steps that fit, none over a quarter of the budget"
    );
    assert!(loaded.values().all(|v| *v == value(45)));
    assert_eq!(snapshot.steps.get("e"), Loaded::Unloaded, "a key whose value was not loaded");
    assert_eq!(snapshot.agents.values(), 0, "steps come first: the agent outcome did not fit what they left");
    assert_eq!(snapshot.journal_bytes, 3);

    // With room, the agent outcome is loaded; the big step still is not (over a quarter).
    let mut roomy = store.load(&run, 240).await.expect("load");
    assert_eq!(roomy.steps.values(), 4, "{:?}", steps(&roomy));
    assert_eq!(outcomes(&roomy).get("k1"), Some(&Some(value(37))), "the outcome fits now");
    let mut whole = store.load(&run, 1000).await.expect("load");
    assert_eq!((whole.steps.values(), whole.agents.values()), (5, 1), "a budget for everything loads everything");
    // Over a quarter of the budget is never loaded, however much room is left.
    let big = fresh_id();
    store.put_step(&big, "s", &value(60), 1).expect("put_step");
    store.put_agent(&big, "k", Some(&value(59)), 2).expect("put_agent");
    store.put_step(&big, "t", &value(45), 3).expect("put_step");
    flush(&store).await;
    let mut capped = store.load(&big, 200).await.expect("load");
    assert_eq!(steps(&capped).keys().collect::<Vec<_>>(), vec!["t"], "a step of 61 bytes is over a quarter of 200");
    assert_eq!(capped.agents.values(), 0, "so is an agent outcome of 2 + 1 + 59");
    let mut none = store.load(&run, 0).await.expect("load");
    assert_eq!((none.steps.values(), none.agents.values()), (0, 0), "no budget, no values");
    assert_eq!(none.steps.len(), 5, "but every key");
}

/// [`Journal::load`] lays a run's loaded entries out in journal order (the order of their
/// puts; a step put again takes its new place), whatever the order of their keys, in this
/// commit and the ones before.
pub async fn journal_load_order(open: &impl Open) {
    let store = opened(open).await;
    let run = fresh_id();
    let mut bytes = 0;
    let mut place = || {
        bytes += 10;
        bytes
    };
    for key in ["m", "c", "x", "a"] {
        store.put_step(&run, key, &format!("\"{key}\""), place()).expect("put_step");
    }
    for key in ["k9", "k1", "k5"] {
        store.put_agent(&run, key, Some(&format!("\"{key}\"")), place()).expect("put_agent");
    }
    flush(&store).await;
    store.put_step(&run, "c", "\"c again\"", place()).expect("put_step again");
    store.put_agent(&run, "k0", None, place()).expect("put_agent");
    store.put_step(&run, "b", "\"b\"", place()).expect("put_step");
    flush(&store).await;
    let mut snapshot = store.load(&run, 1 << 20).await.expect("load");
    let steps: Vec<_> = snapshot.steps.iter().map(|(k, v)| format!("{k}={}", String::from_utf8_lossy(v))).collect();
    assert_eq!(
        steps,
        ["m=\"m\"", "x=\"x\"", "a=\"a\"", "c=\"c again\"", "b=\"b\""],
        "steps in the order of their last puts"
    );
    let outcome = |v: &[u8]| decode_outcome(v).expect("an outcome the journal wrote").map(str::to_string);
    let agents: Vec<_> = snapshot.agents.iter().map(|(k, v)| (k.to_string(), outcome(v))).collect();
    let expected = [("k9", Some("\"k9\"")), ("k1", Some("\"k1\"")), ("k5", Some("\"k5\"")), ("k0", None)];
    assert_eq!(
        agents,
        expected.map(|(k, v)| (k.to_string(), v.map(str::to_string))),
        "agent outcomes in the order of their puts"
    );
    // A replay asks in that order and finds each one.
    for key in ["m", "x", "a", "c", "b"] {
        assert!(matches!(snapshot.steps.get(key), Loaded::Value(_)), "{key}");
    }
}

/// A snapshot's loaded step values, by key.
fn steps(snapshot: &JournalSnapshot) -> BTreeMap<String, String> {
    let text = |v: &[u8]| String::from_utf8(v.to_vec()).expect("a step value is UTF-8");
    snapshot.steps.iter().map(|(k, v)| (k.to_string(), text(v))).collect()
}

/// A snapshot's loaded agent outcomes, by key.
fn outcomes(snapshot: &JournalSnapshot) -> BTreeMap<String, Option<String>> {
    let outcome = |v: &[u8]| decode_outcome(v).expect("an outcome the journal wrote").map(str::to_string);
    snapshot.agents.iter().map(|(k, v)| (k.to_string(), outcome(v))).collect()
}

/// What was flushed is there after a reopen: records, journal, progress, accounting's
/// writer counters moving with commits.
pub async fn flushed_writes_survive_a_reopen(open: &impl Open) {
    let store = opened(open).await;
    let run = fresh_id();
    let commits = store.writer_stats().commits.load(Ordering::SeqCst);
    let mut r = record(&run, "default", RunStatus::Completed);
    store.put_run(&mut r, true).await.expect("put_run");
    store.put_step(&run, "s", "1", 5).expect("put_step");
    store.put_agent(&run, "k", Some("\"reply\""), 9).expect("put_agent");
    store.put_progress(&run, 1, entry(1, None, log("hello")), 12).expect("put_progress");
    let blob = format!("blob-{}", fresh_id());
    store.put_blob(&blob, &Arc::from(&b"text"[..])).expect("put_blob");
    flush(&store).await;
    assert!(store.writer_stats().commits.load(Ordering::SeqCst) > commits, "the writer counts its commits");
    assert!(store.writer_stats().ops.load(Ordering::SeqCst) >= 5, "and its operations");
    drop(store);

    let store = opened(open).await;
    assert_eq!(store.run(&run).await.expect("run"), Some(r));
    assert_eq!(store.get_step(&run, "s").await.expect("get_step").as_deref(), Some("1"));
    assert_eq!(store.get_agent(&run, "k").await.expect("get_agent"), Some(Some("\"reply\"".into())));
    assert_eq!(seqs(&store.progress(&run, &ProgressQuery::default()).await.expect("progress")), vec![1]);
    assert_eq!(store.last_progress_seq(&run).await.expect("last seq"), 1);
    assert_eq!(store.load(&run, 1 << 20).await.expect("load").journal_bytes, 12, "the journal bytes of the last put");
    assert_eq!(store.blob(&blob).await.expect("blob").as_deref(), Some(&b"text"[..]));
}

/// Long step values, replies and progress (which a store keeps compressed, see
/// [`codec`](super::codec)) read back as they were put, committed or not, through every
/// read: get, load (its budget counting their decoded size), progress pages.
pub async fn long_values_read_back_as_put(open: &impl Open) {
    let store = opened(open).await;
    let run = fresh_id();
    let mut r = record(&run, "default", RunStatus::Completed);
    store.put_run(&mut r, true).await.expect("put_run");
    let value = format!("\"{}\"", "a step value of ordinary words, long enough to compress. ".repeat(40));
    let reply = format!("\"{}\"", "a reply of ordinary words, long enough to compress. ".repeat(40));
    let message = "a log line of ordinary words. ".repeat(20);
    store.put_step(&run, "s", &value, 100).expect("put_step");
    store.put_agent(&run, "k", Some(&reply), 200).expect("put_agent");
    store.put_progress(&run, 1, entry(1, None, log(&message)), 300).expect("put_progress");
    assert_eq!(store.get_step(&run, "s").await.expect("get_step"), Some(value.clone()), "queued");
    flush(&store).await;
    drop(store);

    let store = opened(open).await;
    assert_eq!(store.get_step(&run, "s").await.expect("get_step"), Some(value.clone()));
    assert_eq!(store.get_agent(&run, "k").await.expect("get_agent"), Some(Some(reply.clone())));
    let page = store.progress(&run, &ProgressQuery::default()).await.expect("progress");
    assert!(matches!(&page[..], [e] if e.event == log(&message)), "{page:?}");
    let snapshot = store.load(&run, 1 << 20).await.expect("load");
    assert_eq!(steps(&snapshot).get("s"), Some(&value));
    assert_eq!(outcomes(&snapshot).get("k"), Some(&Some(reply.clone())));
    // A budget that holds the compressed value but not the decoded one loads neither.
    let tight = 4 * (1 + value.len().min(reply.len()) / 2);
    let mut snapshot = store.load(&run, tight).await.expect("load");
    assert_eq!((snapshot.steps.values(), snapshot.agents.values()), (0, 0), "counted at their decoded size");
    assert_eq!((snapshot.steps.len(), snapshot.agents.len()), (1, 1), "their keys known");
}

/// Large values are stored once ([`shared`](super::shared)): two runs journaling the same
/// large reply and step value keep one stored value each, counted twice; a small value stays
/// inline; overwriting a row moves its count; a reopened store reads them back exactly (one
/// by one and in a load, as a resume does, counted at their decoded size); deleting one run
/// keeps them, deleting the other deletes them.
pub async fn large_values_are_stored_once(open: &impl Open) {
    let store = opened(open).await;
    let (first, second) = (fresh_id(), fresh_id());
    // The text names this case's first run: no other case (or other data) shares it.
    let reply = format!("\"{first}: {}\"", "a long reply of ordinary words, the same in both runs. ".repeat(200));
    let value = format!("{{\"plan\":\"{first}: {}\"}}", "a long step value, the same in both runs. ".repeat(250));
    let other = value.replace("the same", "another");
    assert!(super::shared::shares(reply.as_bytes()) && super::shared::shares(value.as_bytes()));
    let hash = |text: &str| super::shared::Reference::of(text.as_bytes()).hash;
    let refs = |store: Arc<dyn Store>, text: String| async move {
        store.shared_value_refs(&hash(&text)).await.unwrap_or_else(|e| panic!("shared_value_refs: {e}"))
    };
    let small = format!("\"{first}\"");
    for run in [&first, &second] {
        let mut r = record(run, "default", RunStatus::Completed);
        store.put_run(&mut r, true).await.expect("put_run");
        store.put_step(run, "s", &value, 100).expect("put_step");
        store.put_agent(run, "k", Some(&reply), 200).expect("put_agent");
        store.put_step(run, "small", &small, 300).expect("put_step (small)");
        store.put_agent(run, "tiny", Some(&small), 400).expect("put_agent (small)");
    }
    assert_eq!(refs(store.clone(), reply.clone()).await, Some(2), "the reply is stored once, counted twice");
    assert_eq!(refs(store.clone(), value.clone()).await, Some(2), "the step value too");
    assert_eq!(refs(store.clone(), small.clone()).await, None, "a small value stays inline");
    // Overwriting a row moves its count, and writing the same value again counts it once.
    store.put_step(&first, "s", &other, 500).expect("put_step (another value)");
    assert_eq!(refs(store.clone(), value.clone()).await, Some(1));
    assert_eq!(refs(store.clone(), other.clone()).await, Some(1));
    store.put_step(&first, "s", &value, 600).expect("put_step (the value again)");
    store.put_step(&first, "s", &value, 700).expect("put_step (the same again)");
    assert_eq!(refs(store.clone(), value.clone()).await, Some(2));
    assert_eq!(refs(store.clone(), other.clone()).await, None, "a value no row refers to is deleted");
    flush(&store).await;
    drop(store);

    let store = opened(open).await;
    for run in [&first, &second] {
        assert_eq!(store.get_step(run, "s").await.expect("get_step"), Some(value.clone()));
        assert_eq!(store.get_agent(run, "k").await.expect("get_agent"), Some(Some(reply.clone())));
        assert_eq!(store.get_step(run, "small").await.expect("get_step"), Some(small.clone()));
        let snapshot = store.load(run, 1 << 20).await.expect("load");
        assert_eq!(steps(&snapshot).get("s"), Some(&value), "a resume loads it");
        assert_eq!(steps(&snapshot).get("small"), Some(&small));
        assert_eq!(outcomes(&snapshot).get("k"), Some(&Some(reply.clone())));
        assert_eq!(outcomes(&snapshot).get("tiny"), Some(&Some(small.clone())));
        // Counted at its size, not its reference's: a budget a quarter of which is under
        // the values leaves them unloaded, their keys known.
        let mut snapshot = store.load(run, 4 * (reply.len().min(value.len()) - 1)).await.expect("load");
        assert_eq!(steps(&snapshot).get("s"), None);
        assert_eq!(outcomes(&snapshot).get("k"), None);
        assert_eq!((snapshot.steps.len(), snapshot.agents.len()), (2, 2), "their keys known");
    }
    assert_eq!(store.remove_run(&first).await.expect("remove_run"), Removed::Removed);
    assert_eq!(refs(store.clone(), reply.clone()).await, Some(1), "kept for the other run");
    assert_eq!(refs(store.clone(), value.clone()).await, Some(1));
    assert_eq!(store.get_agent(&second, "k").await.expect("get_agent"), Some(Some(reply.clone())));
    assert_eq!(store.remove_run(&second).await.expect("remove_run"), Removed::Removed);
    assert_eq!(refs(store.clone(), reply.clone()).await, None, "deleted with its last run");
    assert_eq!(refs(store.clone(), value.clone()).await, None);
}

/// Crash repair: a run the store held `running` when it was last open (its process gone)
/// is `halted` at the next open, marked a crash, with the accounting its attempt last
/// recorded (its AI credits marked "at least"); a run that had ended is left as it was.
pub async fn crash_repair_at_open(open: &impl Open) {
    let store = opened(open).await;
    let (running, ended) = (fresh_id(), fresh_id());
    let mut live = record(&running, "default", RunStatus::Running);
    store.put_run(&mut live, true).await.expect("put_run");
    let mut done = record(&ended, "default", RunStatus::Completed);
    store.put_run(&mut done, true).await.expect("put_run");
    let spent = Accounting { agents_spawned: 7, input_tokens: 70, ..Accounting::default() };
    store.put_accounting(&running, &spent).expect("put_accounting");
    store.put_accounting(&ended, &Accounting { agents_spawned: 99, ..Accounting::default() }).expect("put_accounting");
    flush(&store).await;
    drop(store);

    let store = opened(open).await;
    let repaired = store.run(&running).await.expect("run").expect("the running run");
    assert_eq!(repaired.envelope.status, RunStatus::Halted, "{repaired:#?}");
    assert_eq!(repaired.interrupted, Some(Interruption::Crash));
    // The spend recorded up to the last commit, a lower bound: what the crash cut off is unknown.
    assert_eq!(repaired.envelope.accounting, Accounting { ai_credits_at_least: true, ..spent });
    let failure = repaired.envelope.failure.as_ref().expect("a failure says why");
    assert_eq!(failure.kind_type, crate::model::envelope::FailureType::Halted);
    assert_eq!(repaired.writes, live.writes + 1, "the repair is a write of the record");
    assert_eq!(store.run(&ended).await.expect("run"), Some(done), "an ended run is left as it was");
}

/// Removing a run: its record and journal (steps, agents, progress, modules) are gone for
/// good, across a reopen; a run whose id starts with the removed one's keeps all of its own;
/// a run that executes (`running`, `pending`) is refused and kept; an unknown id is
/// `NotFound`; new runs go on after.
pub async fn remove_run(open: &impl Open) {
    let store = opened(open).await;
    let run = fresh_id();
    // Its keys sort right after the removed run's: a delete by range must stop before them.
    let neighbour = format!("{run}-next");
    let manifest =
        Manifest { root: None, modules: BTreeMap::from([("a.js".to_string(), "h".to_string())]), resolved: Vec::new() };
    let mut records = Vec::new();
    for id in [&run, &neighbour] {
        let mut r = record(id, "default", RunStatus::Completed);
        r.envelope.result = Some(crate::model::json::RawJson::from_value(&serde_json::json!({"big": "x"})));
        store.put_run(&mut r, true).await.expect("put_run");
        store.put_step(id, "plan", "\"v\"", 10).expect("put_step");
        store.put_agent(id, "a1", Some("{\"text\":\"hi\"}"), 20).expect("put_agent");
        store.put_progress(id, 1, entry(1, None, log("one")), 30).expect("put_progress");
        store.put_accounting(id, &Accounting { agents_spawned: 1, ..Accounting::default() }).expect("put_accounting");
        store.put_run_modules(id, &manifest).expect("put_run_modules");
        records.push(r);
    }
    let (mut running, mut pending) =
        (record(&fresh_id(), "default", RunStatus::Running), record(&fresh_id(), "default", RunStatus::Pending));
    store.put_run(&mut running, true).await.expect("put_run (running)");
    store.put_run(&mut pending, true).await.expect("put_run (pending)");

    // Queued writes are committed first: the journal put just before goes too.
    assert_eq!(store.remove_run(&run).await.expect("remove_run"), Removed::Removed);
    assert_eq!(store.run(&run).await.expect("run"), None, "the record is gone");
    assert!(!store.runs().await.expect("runs").iter().any(|r| r.envelope.run_id == run), "and not listed");
    assert!(
        store.progress(&run, &ProgressQuery::default()).await.expect("progress").is_empty(),
        "its progress is gone"
    );
    assert_eq!(store.last_progress_seq(&run).await.expect("last seq"), 0);
    assert_eq!(store.get_step(&run, "plan").await.expect("get_step"), None, "its steps are gone");
    assert_eq!(store.get_agent(&run, "a1").await.expect("get_agent"), None, "its agent outcomes are gone");
    assert_eq!(store.run_modules(&run).await.expect("run_modules"), None, "its modules are gone");
    assert_eq!(store.remove_run(&run).await.expect("remove_run again"), Removed::NotFound);
    assert_eq!(store.remove_run(&fresh_id()).await.expect("remove_run of an unknown id"), Removed::NotFound);

    // The neighbour keeps everything.
    let kept = store.run(&neighbour).await.expect("run").expect("the neighbour's record");
    assert_eq!(kept, records[1]);
    assert_eq!(store.get_step(&neighbour, "plan").await.expect("get_step").as_deref(), Some("\"v\""));
    assert_eq!(store.get_agent(&neighbour, "a1").await.expect("get_agent"), Some(Some("{\"text\":\"hi\"}".into())));
    assert_eq!(seqs(&store.progress(&neighbour, &ProgressQuery::default()).await.expect("progress")), vec![1]);
    assert_eq!(store.run_modules(&neighbour).await.expect("run_modules"), Some(manifest));

    // A run that executes is refused and kept.
    for r in [&running, &pending] {
        let id = &r.envelope.run_id;
        assert_eq!(
            store.remove_run(id).await.expect("remove_run (active)"),
            Removed::Active,
            "{:?}",
            r.envelope.status
        );
        assert_eq!(store.run(id).await.expect("run").as_ref(), Some(r), "an active run is kept as it was");
    }

    // Gone for good across a reopen; new runs go on, ended ones can be removed.
    drop(store);
    let store = opened(open).await;
    assert_eq!(store.run(&run).await.expect("run after a reopen"), None);
    assert_eq!(store.get_step(&run, "plan").await.expect("get_step after a reopen"), None);
    assert!(store.run(&neighbour).await.expect("run").is_some());
    let mut later = record(&fresh_id(), "default", RunStatus::Completed);
    store.put_run(&mut later, true).await.expect("put_run after a remove");
    assert!(later.seq > records[1].seq, "the creation seq goes on");
    for id in
        [neighbour, later.envelope.run_id.clone(), running.envelope.run_id.clone(), pending.envelope.run_id.clone()]
    {
        // The active ones were repaired at the reopen (a store held by one process), or are
        // ended here first.
        if let Some(mut r) = store.run(&id).await.expect("run") {
            if !r.envelope.status.is_terminal() {
                r.envelope.status = RunStatus::Cancelled;
                store.put_run(&mut r, false).await.expect("put_run (cancelled)");
            }
        }
        assert_eq!(store.remove_run(&id).await.expect("remove_run"), Removed::Removed, "{id}");
    }
}

/// Blobs are collected with their last user: of the blobs a removed run referred to
/// ([`blobs::of_run`](super::blobs::of_run)), those another run, a registration or a module
/// record still names stay, the rest are deleted; a blob a start put and a collection took
/// before its run's record was written is stored again by that write.
pub async fn blobs_go_with_their_last_user(open: &impl Open) {
    let store = opened(open).await;
    let h = |what: &str| format!("{what}-{}", fresh_id());
    let (only, shared, registered, source, manifest, text, module, shared_module) = (
        h("only"),
        h("shared"),
        h("registered"),
        h("source"),
        h("manifest"),
        h("text"),
        h("module"),
        h("shared-module"),
    );
    let named = |modules: &[(&str, &String)]| Manifest {
        root: None,
        modules: modules.iter().map(|(name, hash)| (name.to_string(), hash.to_string())).collect(),
        resolved: Vec::new(),
    };
    let manifest_json: Arc<[u8]> = serde_json::to_vec(&named(&[("lib.js", &text)])).expect("a manifest").into();
    for hash in [&only, &shared, &registered, &source, &text, &module, &shared_module] {
        store.put_blob(hash, &Arc::from(hash.as_bytes())).expect("put_blob");
    }
    store.put_blob(&manifest, &manifest_json).expect("put_blob (manifest)");
    let (removed, other) = (fresh_id(), fresh_id());
    let mut r = record(&removed, "default", RunStatus::Completed);
    r.component_hashes = vec![only.clone(), shared.clone(), registered.clone()];
    r.scripts = vec![Some(crate::model::script::ScriptRef {
        sha256: source.clone(),
        file_name: "f.js".into(),
        entry: None,
        modules: Some(manifest.clone()),
    })];
    store.put_run(&mut r, true).await.expect("put_run");
    store.put_run_modules(&removed, &named(&[("m.js", &module), ("s.js", &shared_module)])).expect("put_run_modules");
    let mut o = record(&other, "default", RunStatus::Completed);
    o.component_hashes = vec![shared.clone()];
    store.put_run(&mut o, true).await.expect("put_run (other)");
    store.put_run_modules(&other, &named(&[("s.js", &shared_module)])).expect("put_run_modules (other)");
    store
        .register(&registration(&h("fx"), None, &registered), &Arc::from(registered.as_bytes()))
        .await
        .expect("register");
    flush(&store).await;

    let mut candidates = super::blobs::of_run(&*store, &r).await.expect("the run's blobs");
    candidates.sort();
    let mut expected = vec![&only, &shared, &registered, &source, &manifest, &text, &module, &shared_module];
    expected.sort();
    assert_eq!(candidates.iter().collect::<Vec<_>>(), expected, "a run's blobs: components, script, modules");
    assert_eq!(store.remove_run(&removed).await.expect("remove_run"), Removed::Removed);
    assert_eq!(
        store.collect_blobs(&candidates).await.expect("collect_blobs"),
        5,
        "only, source, manifest, text, module"
    );
    for gone in [&only, &source, &manifest, &text, &module] {
        assert_eq!(store.blob(gone).await.expect("blob"), None, "{gone} had no other user");
    }
    for kept in [&shared, &registered, &shared_module] {
        assert!(store.blob(kept).await.expect("blob").is_some(), "{kept} is still used");
    }
    assert_eq!(store.collect_blobs(&candidates).await.expect("collect_blobs again"), 0, "nothing left to collect");

    // A start puts its component, a collection (its last user's removal) takes it before the
    // start writes its run record: the record's write stores it again.
    let (component, text) = (h("component"), h("started-text"));
    let started_manifest: Arc<[u8]> = serde_json::to_vec(&named(&[("lib.js", &text)])).expect("a manifest").into();
    let started_manifest_hash = h("started-manifest");
    for (hash, bytes) in [
        (&component, Arc::from(component.as_bytes())),
        (&text, Arc::from(text.as_bytes())),
        (&started_manifest_hash, started_manifest.clone()),
    ] {
        store.put_blob(hash, &bytes).expect("put_blob (start)");
    }
    flush(&store).await;
    let taken = [component.clone(), text.clone(), started_manifest_hash.clone()];
    assert_eq!(store.collect_blobs(&taken).await.expect("collect_blobs (racing)"), 3, "unreferenced as yet");
    assert_eq!(store.blob(&component).await.expect("blob"), None);
    let started = fresh_id();
    let mut s = record(&started, "default", RunStatus::Running);
    s.component_hashes = vec![component.clone()];
    s.scripts = vec![Some(crate::model::script::ScriptRef {
        sha256: component.clone(),
        file_name: "f.js".into(),
        entry: None,
        modules: Some(started_manifest_hash.clone()),
    })];
    store.put_run(&mut s, true).await.expect("put_run (the start)");
    assert_eq!(store.blob(&component).await.expect("blob").as_deref(), Some(component.as_bytes()), "stored again");
    assert_eq!(store.blob(&text).await.expect("blob").as_deref(), Some(text.as_bytes()), "its module text too");
    assert_eq!(store.collect_blobs(&taken).await.expect("collect_blobs"), 0, "referenced now");
    s.envelope.status = RunStatus::Completed;
    store.put_run(&mut s, false).await.expect("put_run (ended)");
    for id in [&other, &started] {
        assert_eq!(store.remove_run(id).await.expect("remove_run"), Removed::Removed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{RedbStore, StoreOptions};
    use futures::FutureExt;

    #[tokio::test]
    async fn the_redb_store_conforms_on_a_file_reopened() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().to_path_buf();
        let open = move || {
            let path = path.clone();
            async move { Ok(Arc::new(RedbStore::open(&path, StoreOptions::default())?) as Arc<dyn Store>) }.boxed()
        };
        run_all(open).await;
        assert!(dir.path().join(crate::store::STORE_FILE).is_file());
    }

    #[tokio::test]
    async fn the_in_memory_redb_store_conforms_while_open() {
        // Memory does not survive a reopen: the cases that reopen run on the file above.
        let store: Arc<dyn Store> = Arc::new(RedbStore::in_memory().expect("an in-memory store"));
        let open = move || {
            let store = store.clone();
            async move { Ok(store) }.boxed()
        };
        progress_paging(&open).await;
        blobs(&open).await;
        run_modules(&open).await;
        journal_reads_and_puts(&open).await;
        journal_load_budget(&open).await;
    }

    /// A row whose reference names a value the store does not keep (or one whose stored
    /// bytes are not what it names) reads as a typed corrupt-record error, never a panic,
    /// and a load leaves it unloaded (the replay that asks for it gets the error).
    #[tokio::test]
    async fn a_dangling_or_wrong_reference_is_a_corrupt_record() {
        use crate::store::redb::tables::{AGENTS, JOURNAL_VALUES, STEPS};
        use crate::store::shared::Reference;
        use redb::ReadableTable;
        let dir = tempfile::tempdir().expect("a temp dir");
        let run = fresh_id();
        let reply = format!("\"{}\"", "a long reply of ordinary words. ".repeat(400));
        {
            let store = RedbStore::open(dir.path(), StoreOptions::default()).expect("the store");
            let mut r = record(&run, "default", RunStatus::Halted);
            store.put_run(&mut r, true).await.expect("put_run");
            store.put_agent(&run, "k", Some(&reply), 100).expect("put_agent");
            store.put_step(&run, "s", &reply, 200).expect("put_step");
            flush(&(Arc::new(store) as Arc<dyn Store>)).await;
        }
        // Through redb directly: the step row names a value never stored, the shared reply's
        // stored bytes are another value's.
        {
            let db = redb::Database::open(dir.path().join(crate::store::STORE_FILE)).expect("the file");
            let txn = db.begin_write().expect("a write");
            {
                let missing = Reference::of(b"\"never stored\"");
                let mut row = 200u64.to_le_bytes().to_vec();
                row.extend_from_slice(&missing.encode());
                txn.open_table(STEPS).expect("steps").insert((run.as_str(), "s"), row.as_slice()).expect("the row");
                let hash = Reference::of(reply.as_bytes()).hash;
                let wrong = crate::store::codec::encode(reply.replace("long", "LONG").as_bytes());
                txn.open_table(JOURNAL_VALUES).expect("values").insert(&hash[..], wrong.as_slice()).expect("a value");
                assert!(txn.open_table(AGENTS).expect("agents").get((run.as_str(), "k")).expect("a read").is_some());
            }
            txn.commit().expect("a commit");
        }
        let store: Arc<dyn Store> = Arc::new(RedbStore::open(dir.path(), StoreOptions::default()).expect("the store"));
        let corrupt = |e: &crate::store::journal::JournalError| {
            matches!(e.0.downcast_ref::<StoreError>(), Some(StoreError::Corrupt(_)))
        };
        let step = store.get_step(&run, "s").await.expect_err("a dangling reference");
        assert!(corrupt(&step), "{step:?}");
        assert!(step.to_string().contains("not stored"), "{step}");
        let agent = store.get_agent(&run, "k").await.expect_err("a value that is not what it names");
        assert!(corrupt(&agent), "{agent:?}");
        assert!(agent.to_string().contains("does not hash to its key"), "{agent}");
        let mut snapshot = store.load(&run, 1 << 20).await.expect("a load");
        assert_eq!((snapshot.steps.values(), snapshot.agents.values()), (0, 0), "neither loaded");
        assert_eq!((snapshot.steps.len(), snapshot.agents.len()), (1, 1), "their keys known");
    }
}
