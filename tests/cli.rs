//! Drives the real `factory` binary: run a crate directory and a component file, `--json`
//! envelopes, exit codes, `describe`, and clear errors on bad input.

mod common;

use common::{factory_in, stderr, stdout_json};

use serde_json::Value;
use std::process::Output;

/// Run the binary with a state directory of its own (a fresh one per call).
fn factory(args: &[&str]) -> Output {
    let state = tempfile::tempdir().expect("a temp dir");
    factory_in(state.path(), args)
}

#[test]
fn run_builds_a_crate_directory_and_prints_the_envelope() {
    let dir = common::crate_dir("review-changed");
    let out = factory(&["run", dir.to_str().unwrap(), "--json", "--args", r#"{"files":["x.rs","y.rs","z.rs"]}"#]);
    assert!(out.status.success(), "{}", stderr(&out));
    let envelope = stdout_json(&out);
    assert_eq!(envelope["status"], "completed");
    assert_eq!(envelope["factory"], "review-changed");
    assert_eq!(envelope["result"]["reviews"].as_array().unwrap().len(), 3);
    assert_eq!(envelope["accounting"]["agentsSpawned"], 3);
    assert!(envelope["runId"].as_str().is_some_and(|id| !id.is_empty()));
    // Progress went to stderr, as plain lines (stderr is not a terminal here).
    let err = stderr(&out);
    assert!(err.contains("phase: Review") && err.contains("phase: Verify"), "{err}");
}

#[test]
fn run_prints_the_result_and_exits_nonzero_on_a_limit() {
    let probe = common::component("probe");
    let out = factory(&["run", probe.to_str().unwrap(), "--yes", "--args", r#"{"case":"steps"}"#, "--quiet"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout_json(&out), serde_json::json!({"a": 42, "b": 42}));

    let out = factory(&[
        "run",
        probe.to_str().unwrap(),
        "--yes",
        "--args",
        r#"{"case":"fanout","n":5}"#,
        "--max-total-subagents",
        "2",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let envelope = stdout_json(&out);
    assert_eq!(envelope["status"], "error");
    assert_eq!(envelope["failure"]["type"], "factory_limit_reached");
    assert_eq!(envelope["failure"]["kind"], "maxTotalSubagents");
    assert!(stderr(&out).contains("maxTotalSubagents"));
}

#[test]
fn run_uses_a_script_backend() {
    let probe = common::component("probe");
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("script.json");
    std::fs::write(&script, r#"{"rules":[{"label":"judge","reply":{"json":{"ok":true}}}],"fallback":"error"}"#)
        .unwrap();
    let backend = format!("script:{}", script.display());
    let out = factory(&[
        "run",
        probe.to_str().unwrap(),
        "--yes",
        "--args",
        r#"{"case":"schema"}"#,
        "--backend",
        &backend,
        "-q",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout_json(&out), serde_json::json!({"verdict": {"ok": true}, "text": "{\"ok\":true}"}));
}

#[test]
fn describe_shows_meta_and_that_only_our_interfaces_are_imported() {
    let review = common::component("review-changed");
    let out = factory(&["describe", review.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let d = stdout_json(&out);
    assert_eq!(d["meta"]["name"], "review-changed");
    assert_eq!(d["meta"]["phases"][0]["title"], "Review");
    assert_eq!(d["meta"]["limits"]["maxConcurrentSubagents"], 3);
    assert_eq!(d["meta"]["limits"]["timeoutSeconds"], 90.5);
    assert_eq!(d["sha256"].as_str().unwrap().len(), 64);
    let imports: Vec<&str> = d["imports"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(!imports.is_empty());
    assert!(imports.iter().all(|i| i.starts_with("agent:factory/")), "{imports:?}");

    let out = factory(&["describe", review.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("review-changed") && text.contains("agent:factory/ctx@0.1.0"), "{text}");
}

#[test]
fn bad_input_gets_a_clear_error_and_exit_code_2() {
    let probe = common::component("probe");
    let out = factory(&["run", probe.to_str().unwrap(), "--args", "{not json"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--args is not valid JSON"), "{}", stderr(&out));

    let core = common::core_module("hello");
    let out = factory(&["run", core.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("core WebAssembly module"), "{}", stderr(&out));

    let out = factory(&["run", "/no/such/factory.wasm"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("neither a component file, a crate directory, nor a registered factory"),
        "{}",
        stderr(&out)
    );

    let out = factory(&["run", probe.to_str().unwrap(), "--timeout-seconds", "0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("timeoutSeconds"), "{}", stderr(&out));

    let out = factory(&["run", probe.to_str().unwrap(), "--backend", "nonsense"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("unknown backend"), "{}", stderr(&out));
}

#[test]
fn events_are_versioned_json_lines_from_start_to_finish() {
    let state = tempfile::tempdir().unwrap();
    let events = state.path().join("events.jsonl");
    let review = common::component("review-changed");
    let out = factory_in(
        state.path(),
        &["run", review.to_str().unwrap(), "--yes", "-q", "--events", events.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let lines: Vec<Value> = std::fs::read_to_string(&events)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    assert!(lines.iter().all(|e| e["version"] == 1));
    assert_eq!(lines.first().unwrap()["event"], "run_started");
    let last = lines.last().unwrap();
    assert_eq!(last["event"], "run_finished");
    assert_eq!(last["envelope"]["status"], "completed");
    let run_id = &lines[0]["runId"];
    assert!(lines.iter().all(|e| &e["runId"] == run_id));
    let phases: Vec<&Value> =
        lines.iter().filter(|e| e["entry"]["event"] == "phase").map(|e| &e["entry"]["title"]).collect();
    assert_eq!(phases, vec!["Review", "Verify"]);
    // The attempt's end is also told as `run_settled`, with what the attempt consumed.
    let settled: Vec<&Value> = lines.iter().filter(|e| e["event"] == "run_settled").collect();
    assert_eq!(settled.len(), 1, "one attempt: {settled:?}");
    assert_eq!(settled[0]["status"], "completed");
    assert_eq!(settled[0]["consumedSubagents"], last["envelope"]["accounting"]["agentsSpawned"], "{settled:?}");
    assert_eq!(settled[0]["consumedCreditsNano"], last["envelope"]["accounting"]["aiCreditsNano"], "{settled:?}");
    assert!(settled[0]["elapsedMs"].is_u64() && settled[0].get("failureType").is_none(), "{settled:?}");
}

#[test]
fn a_registered_factory_runs_by_name() {
    let state = tempfile::tempdir().unwrap();
    let dir = common::crate_dir("review-changed");
    let out = factory_in(state.path(), &["add", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("registered review-changed"));

    let list = stdout_json(&factory_in(state.path(), &["list", "--json"]));
    assert_eq!(list[0]["meta"]["name"], "review-changed");
    let inspect = stdout_json(&factory_in(state.path(), &["inspect", "review-changed", "--json"]));
    assert_eq!(inspect["meta"]["limits"]["maxTotalSubagents"], 10);
    assert_eq!(inspect["hash"].as_str().unwrap().len(), 64);

    let out = factory_in(state.path(), &["run", "review-changed", "--json", "-q"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout_json(&out)["factory"], "review-changed");
    let out = factory_in(state.path(), &["inspect", "nope"]);
    assert_eq!(out.status.code(), Some(2));
}
