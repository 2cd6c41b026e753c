//! Durable runs through the library on a real redb file: replay with zero backend calls,
//! resume after an edited component, reopening after a restart, halted runs, sessions,
//! progress paging, and group commit.

mod common;

use common::counting::{Counting, Shared};
use factory_host::store::ProgressQuery;
use factory_host::{
    Error, Host, HostConfig, Limits, ProgressEvent, ResumeOptions, RunOptions, RunStatus, DEFAULT_SESSION,
};
use serde_json::json;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const S: &str = factory_host::DEFAULT_SESSION;

use common::counting::{durable_host as host, load};

#[tokio::test]
async fn a_resume_replays_the_journal_with_zero_backend_calls() {
    let state = tempfile::tempdir().unwrap();
    let backend = Counting::with_latency(Duration::ZERO);
    let host = host(state.path(), &backend);
    let v1 = load(&host, "edit-v1").await;
    let first = host.run(&v1, RunOptions::default()).await.unwrap();
    assert_eq!(first.status, RunStatus::Error);
    assert_eq!(backend.total(), 2);

    let again = host.resume(&first.run_id, ResumeOptions::default()).await.unwrap();
    assert_eq!(again.run_id, first.run_id);
    assert_eq!(again.attempts, 2);
    assert_eq!(backend.total(), 2, "the second attempt made no backend call");
    assert_eq!(again.accounting.agents_spawned, 2, "accounting carries over");
    assert_eq!(again.accounting.agent_cache_hits, 2);
}

#[tokio::test]
async fn a_resume_with_an_edited_component_still_hits_every_unchanged_call() {
    let state = tempfile::tempdir().unwrap();
    let backend = Counting::with_latency(Duration::ZERO);
    let host = host(state.path(), &backend);
    let v1 = load(&host, "edit-v1").await;
    let v2 = load(&host, "edit-v2").await;
    let first = host.run(&v1, RunOptions::default()).await.unwrap();
    assert_eq!(first.status, RunStatus::Error);

    let options = ResumeOptions { component: Some(v2.clone()), ..Default::default() };
    let done = host.resume(&first.run_id, options).await.unwrap();
    assert_eq!(done.status, RunStatus::Completed, "{done:#?}");
    assert_eq!(backend.calls_for("first question"), 1);
    assert_eq!(backend.calls_for("second question"), 1);
    assert_eq!(backend.calls_for("third question"), 1, "only the new call spawned");
    let result = done.result_value().unwrap();
    assert_eq!(result["plan"], "plan from v1", "the step replays by key, whatever the producer");
    assert!(result["c"].is_string());

    let detail = host.detail(S, &first.run_id).await.unwrap();
    assert_eq!(detail.component_hashes, vec![v1.component.hash.clone(), v2.component.hash.clone()]);
    match host.resume(&first.run_id, ResumeOptions::default()).await {
        Err(e @ Error::NonResumable(_)) => assert_eq!(e.code(), factory_host::ErrorCode::NonResumable),
        other => panic!("a completed run is final, got {other:?}"),
    }
    assert!(matches!(host.resume("no-such-run", ResumeOptions::default()).await, Err(Error::NotFound(_))));
}

#[tokio::test]
async fn the_store_reopens_after_a_restart_with_runs_journal_and_components() {
    let state = tempfile::tempdir().unwrap();
    let backend = Counting::with_latency(Duration::ZERO);
    let run_id = {
        let host = host(state.path(), &backend);
        let v1 = load(&host, "edit-v1").await;
        host.run(&v1, RunOptions::default()).await.unwrap().run_id
    };
    // A new host on the same directory: the run, its journal and its component are there.
    let host = host(state.path(), &backend);
    let runs = host.runs(S).await.unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].run_id, run_id);
    assert_eq!(runs[0].status, RunStatus::Error);
    let again = host.resume(&run_id, ResumeOptions::default()).await.unwrap();
    assert_eq!(again.attempts, 2);
    assert_eq!(backend.total(), 2, "replayed from the reopened store");
}

#[tokio::test]
async fn a_run_interrupted_by_a_host_stop_is_halted_and_resumable() {
    let state = tempfile::tempdir().unwrap();
    let backend = Counting::with_latency(Duration::from_millis(20));
    let (run_id, spawned_before) = {
        let host = Arc::new(host(state.path(), &backend));
        let probe = load(&host, "probe").await;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let limits = Limits { max_concurrent_subagents: Some(2), ..Default::default() };
        let options = RunOptions {
            args: Some(json!({"case": "fanout", "n": 40})),
            limits,
            events: Some(tx),
            ..Default::default()
        };
        let task = {
            let host = host.clone();
            tokio::spawn(async move { host.run(&probe, options).await })
        };
        // Stop the host abruptly once ten agents are done: the attempt's task is dropped
        // mid-run (no verdict, no final record write, no flush) and then the host with it.
        let mut done = 0;
        let mut run_id = String::new();
        while let Some(entry) = rx.recv().await {
            if let ProgressEvent::AgentFinished { cached: false, .. } = entry.event {
                done += 1;
            }
            if done == 10 {
                run_id = host.runs(S).await.unwrap()[0].run_id.clone();
                task.abort();
                break;
            }
        }
        let _ = task.await;
        (run_id, backend.total())
    };
    let host = host(state.path(), &backend);
    let halted = host.envelope(S, &run_id).await.unwrap();
    assert_eq!(halted.status, RunStatus::Halted);
    assert_eq!(halted.failure.as_ref().unwrap().kind_type, factory_host::FailureType::Halted);
    assert!(halted.accounting.agents_spawned >= 10, "spend up to the last commit survives: {halted:#?}");

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let done = host.resume(&run_id, ResumeOptions { events: Some(tx), ..Default::default() }).await.unwrap();
    assert_eq!(done.status, RunStatus::Completed);
    assert_eq!(done.result_value().unwrap()["done"], 40);
    let respawned = backend.total() - spawned_before;
    assert!(respawned <= 40 - 10, "only unjournaled work re-ran ({respawned} spawns)");
    // Each of the 40 items was either replayed or spawned once in the second attempt.
    let (mut replayed, mut spawned) = (0, 0);
    while let Ok(entry) = rx.try_recv() {
        match entry.event {
            ProgressEvent::AgentFinished { cached: true, .. } => replayed += 1,
            ProgressEvent::AgentStarted { .. } => spawned += 1,
            _ => {}
        }
    }
    assert!(replayed >= 10, "the ten outcomes seen before the stop were journaled ({replayed} replayed)");
    assert_eq!(replayed + spawned, 40, "{replayed} replayed + {spawned} spawned");
    assert_eq!(spawned as u64, respawned);
}

#[tokio::test]
async fn another_session_can_neither_see_nor_touch_a_run() {
    let state = tempfile::tempdir().unwrap();
    let backend = Counting::with_latency(Duration::ZERO);
    let host = host(state.path(), &backend);
    let v1 = load(&host, "edit-v1").await;
    let options = RunOptions { session: Some("alice".into()), ..Default::default() };
    let run = host.run(&v1, options).await.unwrap();
    assert_eq!(host.runs("alice").await.unwrap().len(), 1);
    assert!(host.runs("bob").await.unwrap().is_empty());
    assert!(matches!(host.envelope("bob", &run.run_id).await, Err(Error::NotFound(_))));
    assert!(matches!(host.detail("bob", &run.run_id).await, Err(Error::NotFound(_))));
    assert!(matches!(host.cancel("bob", &run.run_id).await, Err(Error::NotFound(_))));
    let as_bob = ResumeOptions { scope: Some("bob".into()), ..Default::default() };
    assert!(matches!(host.resume(&run.run_id, as_bob).await, Err(Error::NotFound(_))));
    let as_alice = ResumeOptions { scope: Some("alice".into()), ..Default::default() };
    assert_eq!(host.resume(&run.run_id, as_alice).await.unwrap().attempts, 2);
}

#[tokio::test]
async fn progress_pages_forwards_backwards_and_by_phase() {
    let state = tempfile::tempdir().unwrap();
    let backend = Counting::with_latency(Duration::ZERO);
    let host = host(state.path(), &backend);
    let review = load(&host, "review-changed").await;
    let files: Vec<String> = (0..8).map(|i| format!("f{i}.rs")).collect();
    let run =
        host.run(&review, RunOptions { args: Some(json!({ "files": files })), ..Default::default() }).await.unwrap();
    assert_eq!(run.status, RunStatus::Completed);
    let id = &run.run_id;
    let all = host
        .progress(S, id, &ProgressQuery { after_seq: Some(0), limit: Some(1000), ..Default::default() })
        .await
        .unwrap();
    let seqs: Vec<u64> = all.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "seqs are 1.. without gaps");
    assert!(all.len() > 10);

    let forward = host
        .progress(S, id, &ProgressQuery { after_seq: Some(2), limit: Some(3), ..Default::default() })
        .await
        .unwrap();
    assert_eq!(forward.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![3, 4, 5]);
    let backward = host
        .progress(S, id, &ProgressQuery { before_seq: Some(6), limit: Some(2), ..Default::default() })
        .await
        .unwrap();
    assert_eq!(backward.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![4, 5]);
    let tail = host.progress(S, id, &ProgressQuery { limit: Some(4), ..Default::default() }).await.unwrap();
    assert_eq!(tail.last().map(|e| e.seq), all.last().map(|e| e.seq));
    assert_eq!(tail.len(), 4);

    let verify = host
        .progress(S, id, &ProgressQuery { phase: Some("Verify".into()), limit: Some(1000), ..Default::default() })
        .await
        .unwrap();
    assert!(!verify.is_empty());
    assert!(verify.iter().all(|e| e.phase.as_deref() == Some("Verify")));
    let review_phase = host
        .progress(S, id, &ProgressQuery { phase: Some("Review".into()), limit: Some(1000), ..Default::default() })
        .await
        .unwrap();
    assert_eq!(review_phase.iter().filter(|e| matches!(e.event, ProgressEvent::AgentFinished { .. })).count(), 8);

    let detail = host.detail(S, id).await.unwrap();
    assert_eq!(detail.phases, vec!["Review", "Verify"]);
    assert_eq!(detail.agents.len(), 8);
    assert!(detail.envelope.revision >= all.len() as u64, "revision moves with every durable change");
}

#[tokio::test]
async fn group_commit_batches_a_fan_out_into_few_commits() {
    let state = tempfile::tempdir().unwrap();
    let backend = Counting::with_latency(Duration::ZERO);
    let host = host(state.path(), &backend);
    let probe = load(&host, "probe").await;
    let stats = host.store().writer_stats();
    let (commits0, ops0) =
        (stats.commits.load(std::sync::atomic::Ordering::SeqCst), stats.ops.load(std::sync::atomic::Ordering::SeqCst));
    let run = host
        .run(&probe, RunOptions { args: Some(json!({"case": "fanout", "n": 1000})), ..Default::default() })
        .await
        .unwrap();
    assert_eq!(run.status, RunStatus::Completed);
    let commits = stats.commits.load(std::sync::atomic::Ordering::SeqCst) - commits0;
    let ops = stats.ops.load(std::sync::atomic::Ordering::SeqCst) - ops0;
    // Count the agent outcomes in the journal itself, not the writer's operations (which
    // include progress entries and accounting snapshots).
    let mut journaled = factory_host::journal::Journal::load(&**host.store(), &run.run_id, usize::MAX).await.unwrap();
    assert_eq!(journaled.agents.len(), 1000, "every agent outcome was journaled");
    assert!(ops >= 1000, "{ops} writer operations");
    // One commit per agent outcome would be 1000; grouped, each commit carries many.
    assert!(commits * 10 <= 1000, "{commits} commits for 1000 agent outcomes: writes are grouped");
}

/// A store of schema 1 (every progress entry a row of its own, keyed by its seq) opens, reads
/// its progress as it did, is marked schema 2, and takes new runs.
#[tokio::test]
async fn a_schema_1_store_opens_and_reads_its_progress_as_it_was() {
    use factory_host::store::STORE_FILE;
    use redb::{ReadableDatabase, TableDefinition};
    const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
    const PROGRESS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("progress");
    let state = tempfile::tempdir().unwrap();
    let backend = Counting::with_latency(Duration::ZERO);
    let (id, before) = {
        let host = host(state.path(), &backend);
        let review = load(&host, "review-changed").await;
        let files: Vec<String> = (0..8).map(|i| format!("f{i}.rs")).collect();
        let run = host
            .run(&review, RunOptions { args: Some(json!({ "files": files })), ..Default::default() })
            .await
            .unwrap();
        assert_eq!(run.status, RunStatus::Completed);
        let all = host
            .progress(S, &run.run_id, &ProgressQuery { after_seq: Some(0), limit: Some(1000), ..Default::default() })
            .await
            .unwrap();
        (run.run_id, all)
    };
    assert!(before.len() > 10);
    // Rewrite the run's progress as schema 1 wrote it: each entry's JSON under its own seq.
    // Rows of several entries (tag 0, then seq u64 LE, length u32 LE and the JSON per entry)
    // are what schema 2 adds.
    let db = redb::Database::open(state.path().join(STORE_FILE)).unwrap();
    let rows: Vec<(u64, Vec<u8>)> = {
        let txn = db.begin_read().unwrap();
        let table = txn.open_table(PROGRESS).unwrap();
        table
            .range((id.as_str(), 0)..=(id.as_str(), u64::MAX))
            .unwrap()
            .map(|row| {
                let (key, value) = row.unwrap();
                // Rows are stored in the value codec's form (schema 4): a zstd frame, or raw.
                let value = value.value();
                let value = if value.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
                    zstd::stream::decode_all(value).unwrap()
                } else {
                    value.to_vec()
                };
                (key.value().1, value)
            })
            .collect()
    };
    assert!(rows.iter().any(|(_, row)| row[0] == 0), "the run's entries share rows");
    assert!(rows.len() < before.len(), "{} rows for {} entries", rows.len(), before.len());
    let txn = db.begin_write().unwrap();
    {
        let mut table = txn.open_table(PROGRESS).unwrap();
        for (key, row) in &rows {
            table.remove((id.as_str(), *key)).unwrap();
            let mut rest = &row[..];
            if rest[0] != 0 {
                table.insert((id.as_str(), *key), rest).unwrap();
                continue;
            }
            rest = &rest[1..];
            while !rest.is_empty() {
                let seq = u64::from_le_bytes(rest[..8].try_into().unwrap());
                let len = u32::from_le_bytes(rest[8..12].try_into().unwrap()) as usize;
                table.insert((id.as_str(), seq), &rest[12..12 + len]).unwrap();
                rest = &rest[12 + len..];
            }
        }
        txn.open_table(META).unwrap().insert("schema_version", 1).unwrap();
    }
    txn.commit().unwrap();
    drop(db);

    let host = host(state.path(), &backend);
    let after = host
        .progress(S, &id, &ProgressQuery { after_seq: Some(0), limit: Some(1000), ..Default::default() })
        .await
        .unwrap();
    assert_eq!(after, before, "schema 1's rows read as the same entries, titles included");
    let tail = host.progress(S, &id, &ProgressQuery { limit: Some(3), ..Default::default() }).await.unwrap();
    assert_eq!(tail, before[before.len() - 3..].to_vec());
    let review = load(&host, "review-changed").await;
    let next =
        host.run(&review, RunOptions { args: Some(json!({ "files": ["a.rs"] })), ..Default::default() }).await.unwrap();
    assert_eq!(next.status, RunStatus::Completed);
    drop(host);
    let db = redb::Database::open(state.path().join(STORE_FILE)).unwrap();
    let version = db.begin_read().unwrap().open_table(META).unwrap().get("schema_version").unwrap().map(|v| v.value());
    assert_eq!(version, Some(5), "the store is marked schema 5");
}

/// `edit-v1`'s run (it stops with an error after its two calls and its step), by a host that
/// is dropped before it returns, so the store file can be opened and rewritten.
async fn edit_v1_run(state: &Path, backend: &Arc<Counting>) -> factory_host::RunEnvelope {
    let host = host(state, backend);
    let v1 = load(&host, "edit-v1").await;
    let first = host.run(&v1, RunOptions::default()).await.unwrap();
    assert_eq!(first.status, RunStatus::Error);
    first
}

/// The resume of `run_id` with `edit-v2` by a host that opens the store afresh.
async fn resumed_with_edit_v2(state: &Path, backend: &Arc<Counting>, run_id: &str) -> factory_host::RunEnvelope {
    let host = host(state, backend);
    let v2 = load(&host, "edit-v2").await;
    host.resume(run_id, ResumeOptions { component: Some(v2), ..Default::default() }).await.unwrap()
}

#[tokio::test]
async fn a_schema_2_store_keeps_its_journal_and_a_resume_replays_it() {
    use factory_host::store::STORE_FILE;
    use redb::{ReadableDatabase, ReadableTable, TableDefinition};
    const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
    const STEPS_V2: TableDefinition<(&str, &str), &str> = TableDefinition::new("steps");
    const STEPS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("step_rows");
    const AGENTS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("agents");
    fn journal_rows(table: &redb::Table<(&str, &str), &[u8]>) -> Vec<(String, String, Vec<u8>)> {
        let row = |row: Result<_, redb::StorageError>| {
            let (key, value): (redb::AccessGuard<(&str, &str)>, redb::AccessGuard<&[u8]>) = row.unwrap();
            (key.value().0.to_string(), key.value().1.to_string(), value.value().to_vec())
        };
        table.iter().unwrap().map(row).collect()
    }
    let state = tempfile::tempdir().unwrap();
    let backend = Counting::with_latency(Duration::ZERO);
    let first = edit_v1_run(state.path(), &backend).await;
    // Rewrite the journal as schema 2 wrote it: step values as text in `steps`, agent
    // outcomes as `0`, or `1` and the reply's JSON, with no place.
    let db = redb::Database::open(state.path().join(STORE_FILE)).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let mut steps = txn.open_table(STEPS).unwrap();
        let mut old = txn.open_table(STEPS_V2).unwrap();
        let rows = journal_rows(&steps);
        assert_eq!(rows.len(), 1, "the run's one step");
        for (run, key, row) in &rows {
            old.insert((run.as_str(), key.as_str()), std::str::from_utf8(&row[8..]).unwrap()).unwrap();
            steps.remove((run.as_str(), key.as_str())).unwrap();
        }
        let mut agents = txn.open_table(AGENTS).unwrap();
        let rows = journal_rows(&agents);
        assert_eq!(rows.len(), 2, "the run's two agent calls");
        for (run, key, row) in &rows {
            assert_eq!(row[0], 3, "a reply with its place");
            let old_form = [&[1u8][..], &row[9..]].concat();
            agents.insert((run.as_str(), key.as_str()), old_form.as_slice()).unwrap();
        }
    }
    txn.open_table(META).unwrap().insert("schema_version", 2).unwrap();
    txn.commit().unwrap();
    drop(db);

    let done = resumed_with_edit_v2(state.path(), &backend, &first.run_id).await;
    assert_eq!(done.status, RunStatus::Completed, "{done:#?}");
    assert_eq!(backend.calls_for("first question"), 1, "schema 2's agent rows replay");
    assert_eq!(backend.calls_for("second question"), 1);
    assert_eq!(done.result_value().unwrap()["plan"], "plan from v1", "schema 2's step row replays");
    let db = redb::Database::open(state.path().join(STORE_FILE)).unwrap();
    let txn = db.begin_read().unwrap();
    assert_eq!(txn.open_table(META).unwrap().get("schema_version").unwrap().map(|v| v.value()), Some(5));
    assert!(txn.open_table(STEPS_V2).is_err(), "schema 2's step table is gone");
    let steps = txn.open_table(STEPS).unwrap();
    let plan = steps.get((first.run_id.as_str(), "plan")).unwrap().expect("the step moved").value().to_vec();
    assert_eq!((&plan[..8], &plan[8..]), (&[0u8; 8][..], &b"\"plan from v1\""[..]), "moved with place 0");
}

#[tokio::test]
async fn a_step_row_whose_text_is_not_utf8_fails_its_replay_as_a_typed_store_error() {
    use factory_host::store::STORE_FILE;
    use redb::{ReadableTable, TableDefinition};
    const STEPS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("step_rows");
    let state = tempfile::tempdir().unwrap();
    let backend = Counting::with_latency(Duration::ZERO);
    let first = edit_v1_run(state.path(), &backend).await;
    // The step's row keeps its place; its text is no longer UTF-8. The load does not read
    // the text: the replay does, where it asks for the step.
    let db = redb::Database::open(state.path().join(STORE_FILE)).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let mut steps = txn.open_table(STEPS).unwrap();
        let mut row = steps.get((first.run_id.as_str(), "plan")).unwrap().expect("the run's step").value().to_vec();
        row.truncate(8);
        row.extend_from_slice(b"\"\xff\"");
        steps.insert((first.run_id.as_str(), "plan"), row.as_slice()).unwrap();
    }
    txn.commit().unwrap();
    drop(db);

    let done = resumed_with_edit_v2(state.path(), &backend, &first.run_id).await;
    assert_eq!(done.status, RunStatus::Error, "{done:#?}");
    let failure = done.failure.expect("a failure says why");
    assert_eq!(failure.kind_type, factory_host::FailureType::Storage);
    assert!(failure.message.contains("not UTF-8"), "{}", failure.message);
    assert_eq!(backend.calls_for("third question"), 0, "the run stopped at the step, before the new call");
}

#[tokio::test]
async fn a_step_row_whose_compressed_value_is_damaged_fails_its_replay_as_a_typed_store_error() {
    use factory_host::store::STORE_FILE;
    use redb::{ReadableTable, TableDefinition};
    const STEPS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("step_rows");
    let state = tempfile::tempdir().unwrap();
    let backend = Counting::with_latency(Duration::ZERO);
    let first = edit_v1_run(state.path(), &backend).await;
    // The step's row keeps its place; its value becomes a zstd frame cut short, and then one
    // that declares 1 TiB: neither decodes, neither allocates what it claims.
    let text = format!("\"{}\"", "a plan of ordinary words. ".repeat(40));
    let frame = zstd::bulk::compress(text.as_bytes(), 3).unwrap();
    let mut huge = frame[..4].to_vec();
    huge.push(0xe0);
    huge.extend_from_slice(&(1u64 << 40).to_le_bytes());
    huge.extend_from_slice(&frame[13.min(frame.len())..]);
    for (bad, says) in [(&frame[..frame.len() - 5], "does not decode"), (&huge[..], "over the")] {
        let db = redb::Database::open(state.path().join(STORE_FILE)).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut steps = txn.open_table(STEPS).unwrap();
            let mut row = steps.get((first.run_id.as_str(), "plan")).unwrap().expect("the run's step").value().to_vec();
            row.truncate(8);
            row.extend_from_slice(bad);
            steps.insert((first.run_id.as_str(), "plan"), row.as_slice()).unwrap();
        }
        txn.commit().unwrap();
        drop(db);
        let done = resumed_with_edit_v2(state.path(), &backend, &first.run_id).await;
        assert_eq!(done.status, RunStatus::Error, "{done:#?}");
        let failure = done.failure.expect("a failure says why");
        assert_eq!(failure.kind_type, factory_host::FailureType::Storage);
        assert!(failure.message.contains(says), "{}", failure.message);
        assert_eq!(backend.calls_for("third question"), 0, "the run stopped at the step, before the new call");
    }
}

#[tokio::test]
async fn a_damaged_or_newer_store_is_refused_with_a_typed_error() {
    use factory_host::store::{StoreError, STORE_FILE};
    let backend = Counting::with_latency(Duration::ZERO);
    let config = |dir: &Path| HostConfig {
        state_dir: Some(dir.to_path_buf()),
        backend: Arc::new(Shared(backend.clone())),
        ..HostConfig::default()
    };

    let garbage = tempfile::tempdir().unwrap();
    std::fs::write(garbage.path().join(STORE_FILE), vec![0x5a; 64 << 10]).unwrap();
    match Host::new(config(garbage.path())) {
        Err(Error::Store(StoreError::Corrupt(_) | StoreError::Database(_))) => {}
        Err(other) => panic!("expected a store error, got {other:?}"),
        Ok(_) => panic!("a garbage store must not open"),
    }

    let newer = tempfile::tempdir().unwrap();
    drop(Host::new(config(newer.path())).unwrap());
    {
        let db = redb::Database::open(newer.path().join(STORE_FILE)).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(redb::TableDefinition::<&str, u64>::new("meta")).unwrap().insert("schema_version", 99).unwrap();
        txn.commit().unwrap();
    }
    match Host::new(config(newer.path())) {
        Err(Error::Store(StoreError::Version { found: 99, expected })) => assert_eq!(expected, 4),
        Err(other) => panic!("expected a version error, got {other:?}"),
        Ok(_) => panic!("a store of another layout must not open"),
    }
}

#[tokio::test]
async fn run_updated_events_carry_increasing_revisions_up_to_the_final_one() {
    let state = tempfile::tempdir().unwrap();
    let backend = Counting::with_latency(Duration::ZERO);
    let host = host(state.path(), &backend);
    let review = load(&host, "review-changed").await;
    let mut updates = host.subscribe();
    let run = host.run(&review, RunOptions::default()).await.unwrap();
    let mut revisions = Vec::new();
    while let Ok(update) = updates.try_recv() {
        assert_eq!(update.run_id, run.run_id);
        revisions.push(update.revision);
    }
    assert!(revisions.len() > 5, "{revisions:?}");
    assert!(revisions.windows(2).all(|w| w[0] < w[1]), "monotonic: {revisions:?}");
    assert_eq!(revisions.last().copied(), Some(run.revision), "the last event names the final revision");
    assert_eq!(host.envelope(S, &run.run_id).await.unwrap().revision, run.revision, "a re-read agrees");
}

/// A follower wakes on an update and re-reads the run; the update that announces a run's
/// end must come once a read shows the end (the run has left the host's active set), or
/// that follower reads "running", and no later update comes to wake it again (it used to
/// sit out its slow re-read timer). Each update is read at once on a thread of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_on_the_update_that_announces_a_runs_end_shows_the_end() {
    let state = tempfile::tempdir().unwrap();
    let backend = Counting::with_latency(Duration::ZERO);
    let host = Arc::new(host(state.path(), &backend));
    let probe = load(&host, "probe").await;
    for round in 0..20 {
        let mut updates = host.subscribe();
        let (done, finished) = std::sync::mpsc::channel();
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        {
            let host = host.clone();
            let log = log.clone();
            let runtime = tokio::runtime::Handle::current();
            std::thread::spawn(move || {
                // Read the run on every update, until a read shows it terminal.
                let mut seen = Vec::new();
                while let Ok(update) = updates.blocking_recv() {
                    let envelope = runtime.block_on(host.envelope(S, &update.run_id)).unwrap();
                    seen.push((update.revision, envelope.status));
                    log.lock().unwrap().push((update.revision, envelope.status, envelope.revision));
                    if envelope.status.is_terminal() {
                        let _ = done.send((envelope, seen));
                        return;
                    }
                }
            });
        }
        let run = host
            .run(&probe, RunOptions { args: Some(json!({"case": "fanout", "n": 2})), ..Default::default() })
            .await
            .unwrap();
        assert_eq!(run.status, RunStatus::Completed);
        // A bound against hanging, not a speed check: the reader is woken by the last update.
        let (envelope, seen) = finished
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| {
                let progress = futures::executor::block_on(host.progress(S, &run.run_id, &ProgressQuery::default())).unwrap();
                let events: Vec<_> = progress.iter().map(|e| (e.seq, format!("{:?}", e.event).chars().take(40).collect::<String>())).collect();
                panic!(
                    "round {round}: no update woke a read that shows the end of {} (revision {}); reads: {:?}; progress: {events:?}",
                    run.run_id,
                    run.revision,
                    log.lock().unwrap()
                )
            });
        assert_eq!(envelope.run_id, run.run_id);
        assert_eq!(envelope.revision, run.revision, "round {round}: {seen:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resuming_a_run_that_is_executing_is_already_active() {
    let state = tempfile::tempdir().unwrap();
    // The backend holds the one call until two are in flight, which never happens: the run
    // stays executing until it is cancelled.
    let backend = Counting::gated(Duration::ZERO, 2);
    let host = Arc::new(host(state.path(), &backend));
    let probe = load(&host, "probe").await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let options = RunOptions { args: Some(json!({"case": "fanout", "n": 1})), events: Some(tx), ..Default::default() };
    let task = {
        let host = host.clone();
        tokio::spawn(async move { host.run(&probe, options).await })
    };
    while let Some(entry) = rx.recv().await {
        if let ProgressEvent::AgentStarted { .. } = entry.event {
            break;
        }
    }
    let run_id = host.runs(S).await.unwrap()[0].run_id.clone();
    match host.resume(&run_id, ResumeOptions::default()).await {
        Err(e @ Error::AlreadyActive(_)) => {
            assert_eq!(e.code(), factory_host::ErrorCode::AlreadyActive);
            assert!(e.to_string().contains(&run_id), "{e}");
        }
        other => panic!("expected already_active, got {other:?}"),
    }
    let cancelled = host.cancel(S, &run_id).await.unwrap();
    assert_eq!(cancelled.status, RunStatus::Cancelled);
    assert_eq!(cancelled.attempts, 1, "the refused resume started no attempt");
    assert_eq!(task.await.unwrap().unwrap().status, RunStatus::Cancelled);
    // Once it stopped, it resumes (on a backend that answers).
    let options = ResumeOptions { backend: Some(Arc::new(factory_host::backend::DryRun)), ..Default::default() };
    let done = host.resume(&run_id, options).await.unwrap();
    assert_eq!(done.status, RunStatus::Completed, "{done:#?}");
    assert_eq!(done.attempts, 2);
}

#[tokio::test]
async fn resuming_with_another_factorys_component_is_non_resumable() {
    let state = tempfile::tempdir().unwrap();
    let backend = Counting::with_latency(Duration::ZERO);
    let host = host(state.path(), &backend);
    let v1 = load(&host, "edit-v1").await;
    let probe = load(&host, "probe").await;
    let first = host.run(&v1, RunOptions::default()).await.unwrap();
    assert_eq!(first.status, RunStatus::Error);
    let options = ResumeOptions { component: Some(probe), ..Default::default() };
    match host.resume(&first.run_id, options).await {
        Err(e @ Error::NonResumable(_)) => {
            assert_eq!(e.code(), factory_host::ErrorCode::NonResumable);
            let message = e.to_string();
            assert!(message.contains("belongs to factory `edit`, not `probe`"), "{message}");
        }
        other => panic!("expected non_resumable, got {other:?}"),
    }
    let after = host.envelope(S, &first.run_id).await.unwrap();
    assert_eq!(after.attempts, 1, "no attempt started");
    assert_eq!(after.status, RunStatus::Error);
    assert_eq!(host.detail(S, &first.run_id).await.unwrap().component_hashes, vec![v1.component.hash.clone()]);
}

#[tokio::test]
async fn a_record_left_running_with_no_attempt_reads_as_halted_and_resumes() {
    // A record that says `running` while no attempt of this host executes it (the attempt
    // ended without recording its outcome) is shown as `halted`, resumable, not `running`
    // forever.
    let state = tempfile::tempdir().unwrap();
    let backend = Counting::with_latency(Duration::ZERO);
    let host = host(state.path(), &backend);
    let v1 = load(&host, "edit-v1").await;
    let first = host.run(&v1, RunOptions::default()).await.unwrap();
    let mut record = host.store().run(&first.run_id).await.unwrap().expect("the record");
    record.envelope.status = RunStatus::Running;
    record.envelope.failure = None;
    record.envelope.error = None;
    host.store().put_run(&mut record, false).await.unwrap();
    let seen = host.envelope(DEFAULT_SESSION, &first.run_id).await.unwrap();
    assert_eq!(seen.status, RunStatus::Halted, "{seen:#?}");
    let failure = seen.failure.expect("a failure says why");
    assert_eq!(failure.kind_type, factory_host::FailureType::Halted);
    assert!(failure.message.contains("ended without recording its outcome"), "{}", failure.message);
    let listed = host.runs(DEFAULT_SESSION).await.unwrap();
    assert_eq!(listed[0].status, RunStatus::Halted);
    let resumed = host.resume(&first.run_id, ResumeOptions::default()).await.unwrap();
    assert_eq!(resumed.attempts, 2, "{resumed:#?}");
}
