//! Upgrade in place (issue 54): a store written by the release before journal values were
//! compressed (`tests/fixtures/store-v3.redb.zst`, made by `tests/fixtures/make-store-v3.sh`)
//! opens with this build through the real `factory` binary: its completed run reads as it
//! was, and its run halted mid-fan-out resumes against a real OpenAI-compatible server on
//! 127.0.0.1 (`common::fake_openai`) paying no journaled call twice, with its component
//! rebuilt against this release's contract (`resume --component`: the contract is not stable
//! before 1.0, and the old component no longer loads, as the refusal says). A store of a newer
//! schema is refused with a message that says so.

mod common;

use common::fake_openai::{write_config, FakeOpenAi, Mode};
use common::{factory_clean, stderr, stdout_json};
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

/// The fixture store, decompressed into `state` (0600, as the host requires).
fn plant_fixture(state: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let packed = std::fs::read(common::root().join("tests/fixtures/store-v3.redb.zst")).expect("the fixture store");
    let bytes = zstd::stream::decode_all(packed.as_slice()).expect("the fixture decompresses");
    let file = state.join(factory_host::store::STORE_FILE);
    std::fs::write(&file, bytes).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
}

async fn json(state: &Path, args: &[&str]) -> Value {
    let out = factory_clean(state, args, &[]).await;
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    stdout_json(&out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_of_the_last_release_opens_and_its_halted_run_resumes_paying_nothing_twice() {
    let state = tempfile::tempdir().unwrap();
    plant_fixture(state.path());
    let server = FakeOpenAi::start(Mode::Answer { latency: Duration::ZERO }).await;
    write_config(state.path(), server.port(), false, "");

    let runs = json(state.path(), &["runs", "--json"]).await;
    let runs = runs.as_array().expect("a list of runs");
    assert_eq!(runs.len(), 2, "{runs:#?}");
    let completed = runs.iter().find(|r| r["status"] == "completed").expect("the completed run");
    let halted = runs.iter().find(|r| r["status"] == "halted").expect("the halted run");

    // The completed run's step journal and result read as the old release wrote them.
    let id = completed["runId"].as_str().unwrap();
    let shown = json(state.path(), &["show", id, "--json"]).await;
    assert_eq!(shown["result"], serde_json::json!({"a": 42, "b": 42}), "{shown:#}");

    // The calls the halted run's first attempt finished, by label (`t:i` asks `task i`).
    let id = halted["runId"].as_str().unwrap();
    let progress = json(state.path(), &["progress", id, "--json", "--limit", "1000"]).await;
    let finished: Vec<String> = progress
        .as_array()
        .expect("progress entries")
        .iter()
        .filter(|e| e["event"] == "agentFinished" && e["status"] == "ok")
        .map(|e| e["label"].as_str().unwrap_or_default().replace("t:", "task "))
        .collect();
    assert!(!finished.is_empty() && finished.len() < 10, "the fixture's run was stopped mid-fan-out: {finished:?}");

    // The contract is not stable before 1.0 (docs/src/status.md): this release's `wit/` added
    // to `abort` and `agent-options`, so the component the old release built no longer
    // loads, and the plain resume says which import does not match, asking nothing.
    let out = factory_clean(state.path(), &["resume", id, "--backend", "local", "--yes", "--json", "-q"], &[]).await;
    assert!(!out.status.success(), "the old component cannot load: {}", String::from_utf8_lossy(&out.stdout));
    let refused = stderr(&out);
    assert!(refused.contains("cannot be loaded") && refused.contains("agent:factory/"), "{refused}");
    assert!(server.asked().is_empty(), "nothing was asked: {:?}", server.asked());
    // Rebuilt against this release, it resumes the run: the journal the old release wrote replays.
    let probe = common::component("probe");
    let resume = ["resume", id, "--component", probe.to_str().unwrap(), "--backend", "local", "--yes", "--json", "-q"];
    let out = factory_clean(state.path(), &resume, &[]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let done = stdout_json(&out);
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(done["result"]["done"], 10, "{done:#}");
    let asked = server.asked();
    for prompt in &finished {
        assert!(!asked.contains(prompt), "`{prompt}` was journaled by the old release and asked again: {asked:?}");
    }
    for i in 0..10 {
        let prompt = format!("task {i}");
        let times = asked.iter().filter(|p| **p == prompt).count();
        assert!(times <= 1, "`{prompt}` asked {times} times: {asked:?}");
    }
    assert_eq!(asked.len(), 10 - finished.len(), "only the calls not journaled were asked: {asked:?}");
    assert_eq!(done["accounting"]["agentCacheHits"], finished.len(), "{done:#}");

    // The store is marked with this build's schema (5: dictionary frames, compressed blobs):
    // a build before them refuses it.
    use redb::ReadableDatabase;
    let db = redb::Database::open(state.path().join(factory_host::store::STORE_FILE)).unwrap();
    let meta = db.begin_read().unwrap().open_table(redb::TableDefinition::<&str, u64>::new("meta")).unwrap();
    assert_eq!(meta.get("schema_version").unwrap().map(|v| v.value()), Some(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_of_a_newer_schema_is_refused_with_a_message_that_says_so() {
    let state = tempfile::tempdir().unwrap();
    plant_fixture(state.path());
    {
        let db = redb::Database::open(state.path().join(factory_host::store::STORE_FILE)).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(redb::TableDefinition::<&str, u64>::new("meta")).unwrap().insert("schema_version", 99).unwrap();
        txn.commit().unwrap();
    }
    let out = factory_clean(state.path(), &["runs", "--json"], &[]).await;
    assert!(!out.status.success(), "a newer store must be refused");
    let message = stderr(&out);
    assert!(message.contains("schema version 99") && message.contains("newer"), "{message}");
}
