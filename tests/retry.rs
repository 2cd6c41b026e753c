//! Reject-and-retry (issue 15): a run stopped by a limit resumes with the raised limit,
//! through the library and the CLI. Overrides are merged with the earlier ones and
//! persisted (a reopened store still has them); `maxTotalSubagents` counts spawns of every
//! attempt; `timeoutSeconds` counts active time of every attempt but not the time between
//! them, and a resume with no time left stops before the guest runs.

mod common;

use common::counting::Counting;
use common::{factory_in, stderr, stdout_json};
use factory_host::{
    Limits, ProgressEntry, ProgressEvent, ResumeOptions, RunEnvelope, RunOptions, RunStatus, DEFAULT_SESSION as S,
};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

use common::counting::{durable_host as host, load};

fn limit_stop(envelope: &RunEnvelope, kind: &str) {
    assert_eq!(envelope.status, RunStatus::Error, "{envelope:#?}");
    let failure = envelope.failure.as_ref().expect("a failure");
    assert_eq!(failure.kind_type, factory_host::FailureType::FactoryLimitReached, "{failure:#?}");
    assert_eq!(failure.kind.as_deref(), Some(kind), "{failure:#?}");
}

#[tokio::test]
async fn a_total_cap_stop_resumes_with_a_raised_cap_and_spawns_count_across_attempts() {
    let state = tempfile::tempdir().unwrap();
    let backend = Counting::with_latency(Duration::ZERO);
    let args = json!({"case": "fanout", "n": 20});
    // One at a time, so every admitted spawn finishes (and is journaled) before the next.
    let run_id = {
        let host = host(state.path(), &backend);
        let probe = load(&host, "probe").await;
        let limits = Limits { max_total_subagents: Some(5), max_concurrent_subagents: Some(1), ..Default::default() };
        let first = host.run(&probe, RunOptions { args: Some(args), limits, ..Default::default() }).await.unwrap();
        limit_stop(&first, "maxTotalSubagents");
        assert_eq!(first.accounting.agents_spawned, 5);
        assert_eq!(backend.total(), 5);

        // Raise only the total cap: the concurrency override stays (merged, not replaced).
        let raise = ResumeOptions {
            limits: Limits { max_total_subagents: Some(12), ..Default::default() },
            ..Default::default()
        };
        let second = host.resume(&first.run_id, raise).await.unwrap();
        limit_stop(&second, "maxTotalSubagents");
        assert_eq!(second.accounting.agents_spawned, 12, "5 spawns of the first attempt + 7 of the second");
        assert_eq!(second.accounting.agent_cache_hits, 5, "the first five replayed");
        assert_eq!(backend.total(), 12);
        let detail = host.detail(S, &first.run_id).await.unwrap();
        assert_eq!(detail.limits.max_total_subagents, Some(12));
        assert_eq!(detail.limits.max_concurrent_subagents, Some(1), "the earlier override is kept");
        first.run_id
    };

    // A new host on the same store: the overrides were persisted. A resume without any
    // override is still capped at 12 spawns in all, and there are no spawns left.
    let host = host(state.path(), &backend);
    let record = host.store().run(&run_id).await.unwrap().expect("the run record");
    assert_eq!(record.overrides.max_total_subagents, Some(12));
    assert_eq!(record.overrides.max_concurrent_subagents, Some(1));
    let third = host.resume(&run_id, ResumeOptions::default()).await.unwrap();
    limit_stop(&third, "maxTotalSubagents");
    assert_eq!(third.accounting.agents_spawned, 12);
    assert_eq!(backend.total(), 12, "no spawn past the persisted cap reached the backend");

    let raise =
        ResumeOptions { limits: Limits { max_total_subagents: Some(20), ..Default::default() }, ..Default::default() };
    let done = host.resume(&run_id, raise).await.unwrap();
    assert_eq!(done.status, RunStatus::Completed, "{done:#?}");
    assert_eq!(done.result_value().as_ref().unwrap()["done"], 20);
    assert_eq!(done.attempts, 4);
    assert_eq!(done.accounting.agents_spawned, 20, "each of the 20 spawned exactly once over four attempts");
    assert_eq!(backend.total(), 20);
}

/// The progress entries of one attempt, from its `attemptStarted` to its `attemptEnded`.
fn attempt_events(entries: &[ProgressEntry], attempt: u32) -> Vec<ProgressEvent> {
    let start = entries
        .iter()
        .position(|e| matches!(e.event, ProgressEvent::AttemptStarted { attempt: a } if a == attempt))
        .unwrap_or_else(|| panic!("attempt {attempt} started"));
    entries[start..]
        .iter()
        .map(|e| e.event.clone())
        .take_while(|e| !matches!(e, ProgressEvent::AttemptEnded { .. }))
        .collect()
}

fn guest_ran(events: &[ProgressEvent]) -> bool {
    events.iter().any(|e| matches!(e, ProgressEvent::Phase { title } if title == "Attack"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_counts_active_time_of_every_attempt_not_the_time_between() {
    let state = tempfile::tempdir().unwrap();
    let backend = Counting::with_latency(Duration::ZERO);
    let host = host(state.path(), &backend);
    let hostile = load(&host, "hostile").await;
    let spin = json!({ "case": "spin" });

    let limits = Limits { timeout_seconds: Some(0.3), ..Default::default() };
    let first = host.run(&hostile, RunOptions { args: Some(spin), limits, ..Default::default() }).await.unwrap();
    limit_stop(&first, "timeoutSeconds");
    let a1 = first.accounting.active_seconds;
    assert!(a1 >= 0.3, "stopped before its budget: {a1}");

    // Time between attempts: if it counted, the raised budget below would already be spent
    // and the guest would not run again.
    std::thread::sleep(Duration::from_secs(1));
    let t2 = a1 + 0.3;
    let raise =
        ResumeOptions { limits: Limits { timeout_seconds: Some(t2), ..Default::default() }, ..Default::default() };
    let second = host.resume(&first.run_id, raise).await.unwrap();
    limit_stop(&second, "timeoutSeconds");
    let a2 = second.accounting.active_seconds;
    assert!(a2 >= t2 - 1e-6, "the second attempt got the rest of the budget: {a2} < {t2}");

    // The same budget again: no time left, so the attempt stops before the guest runs.
    let third = host.resume(&first.run_id, ResumeOptions::default()).await.unwrap();
    limit_stop(&third, "timeoutSeconds");
    assert_eq!(third.attempts, 3);

    let query = factory_host::store::ProgressQuery { after_seq: Some(0), limit: Some(1000), ..Default::default() };
    let entries = host.progress(S, &first.run_id, &query).await.unwrap();
    assert!(guest_ran(&attempt_events(&entries, 1)));
    assert!(guest_ran(&attempt_events(&entries, 2)), "the time between attempts was not charged");
    assert!(!guest_ran(&attempt_events(&entries, 3)), "a resume with no time left stops at once");
    assert_eq!(
        host.detail(S, &first.run_id).await.unwrap().limits.timeout_seconds,
        Some(t2),
        "the raised limit persisted"
    );
}

fn cli_json(state: &Path, args: &[&str], code: i32) -> Value {
    let out = factory_in(state, args);
    assert_eq!(out.status.code(), Some(code), "factory {args:?}: {}", stderr(&out));
    stdout_json(&out)
}

#[test]
fn the_cli_resumes_a_limit_stop_with_the_raised_limit_and_keeps_the_other_overrides() {
    let state = tempfile::tempdir().unwrap();
    let probe = common::component("probe");
    let probe = probe.to_str().unwrap();
    let fanout = r#"{"case":"fanout","n":6}"#;

    // maxTotalSubagents: 3 then 5 then 6.
    let run = [
        "run",
        probe,
        "--yes",
        "--args",
        fanout,
        "--max-total-subagents",
        "3",
        "--max-concurrent-subagents",
        "1",
        "--json",
        "-q",
    ];
    let first = cli_json(state.path(), &run, 1);
    assert_eq!(first["failure"]["type"], "factory_limit_reached", "{first:#}");
    assert_eq!(first["failure"]["kind"], "maxTotalSubagents");
    assert_eq!(first["accounting"]["agentsSpawned"], 3);
    let id = first["runId"].as_str().unwrap().to_string();
    let second = cli_json(state.path(), &["resume", &id, "--yes", "--max-total-subagents", "5", "--json", "-q"], 1);
    assert_eq!(second["failure"]["kind"], "maxTotalSubagents", "{second:#}");
    assert_eq!(second["accounting"]["agentsSpawned"], 5, "spawns count across attempts");
    let shown = cli_json(state.path(), &["show", &id, "--json"], 0);
    assert_eq!(shown["limits"]["maxTotalSubagents"], 5, "{shown:#}");
    assert_eq!(shown["limits"]["maxConcurrentSubagents"], 1, "the earlier override is kept: {shown:#}");
    let done = cli_json(state.path(), &["resume", &id, "--yes", "--max-total-subagents", "6", "--json", "-q"], 0);
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(done["result"]["done"], 6);
    assert_eq!(done["attempts"], 3);
    assert_eq!(done["accounting"]["agentsSpawned"], 6);

    // timeoutSeconds: ten agents of 100 ms one at a time need a second; 0.3 s stops them.
    let script = state.path().join("slow.json");
    std::fs::write(&script, r#"{"rules":[{"labelPrefix":"t:","reply":{"text":"ok"},"latencyMs":100}]}"#).unwrap();
    let backend = format!("script:{}", script.display());
    let ten = r#"{"case":"fanout","n":10}"#;
    let run = [
        "run",
        probe,
        "--yes",
        "--args",
        ten,
        "--backend",
        &backend,
        "--timeout-seconds",
        "0.3",
        "--max-concurrent-subagents",
        "1",
        "--json",
        "-q",
    ];
    let stopped = cli_json(state.path(), &run, 1);
    assert_eq!(stopped["failure"]["kind"], "timeoutSeconds", "{stopped:#}");
    let id = stopped["runId"].as_str().unwrap().to_string();
    let resume = ["resume", &id, "--yes", "--backend", &backend, "--timeout-seconds", "600", "--json", "-q"];
    let done = cli_json(state.path(), &resume, 0);
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(done["result"]["done"], 10);
    // Journaled agents replayed; the one in flight at the stop was spawned (and counts)
    // but not journaled, so it spawned again.
    let spawned = done["accounting"]["agentsSpawned"].as_u64().unwrap();
    assert!((10..=11).contains(&spawned), "{done:#}");
}
