//! The JS guest surface of Dynamic Workflows (upstream's current name for agent factories),
//! through the real `factory` binary and its service: a body that waits only on `ctx.signal`
//! (or on a promise that never settles) parks until it is cancelled or times out.

mod common;

use common::{factory_cmd, factory_in, stderr, stdout_json};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// A factory file `name.js` in `dir` around a `run` body.
fn factory_file(dir: &Path, name: &str, meta: &str, run: &str) -> PathBuf {
    let path = dir.join(format!("{name}.js"));
    let text = format!(
        "import {{ defineFactory }} from \"factory\";\nexport default defineFactory({{ meta: {meta}, run: {run} }});\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// The run's log messages, as `factory progress` prints them.
fn logs(state: &Path, run_id: &str) -> Vec<String> {
    let out = factory_in(state, &["progress", run_id, "--after-seq", "0", "--limit", "1000", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let entries = stdout_json(&out).as_array().cloned().expect("a list of entries");
    entries.into_iter().filter(|e| e["event"] == "log").filter_map(|e| e["message"].as_str().map(str::to_string)).collect()
}

/// The id of the only run of `state` once it has logged `line` (polled from another process).
fn wait_for_log(state: &Path, line: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let out = factory_in(state, &["runs", "--json"]);
        let id = out.status.success().then(|| stdout_json(&out)).and_then(|runs| runs[0]["runId"].as_str().map(str::to_string));
        if let Some(id) = id {
            if logs(state, &id).iter().any(|m| m == line) {
                return id;
            }
        }
        assert!(Instant::now() < deadline, "the run never logged {line:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Start `factory run FILE` in the background (through the state directory's service), wait
/// until it logs `waiting`, cancel it with `factory cancel`, and answer the cancelled
/// envelope (the foreground run exits 130).
fn cancel_when_waiting(state: &Path, file: &Path) -> (String, Value) {
    let child = factory_cmd(state, &["run", file.to_str().unwrap(), "--json", "-q"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("factory run starts");
    let id = wait_for_log(state, "waiting");
    // Parked, not trapped: the run is still running after its body began to wait.
    std::thread::sleep(Duration::from_millis(300));
    let out = factory_in(state, &["show", &id, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout_json(&out)["status"], "running", "{}", stdout_json(&out));
    let out = factory_in(state, &["cancel", &id, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let envelope = stdout_json(&out);
    let foreground = child.wait_with_output().unwrap();
    assert_eq!(foreground.status.code(), Some(130), "{}", String::from_utf8_lossy(&foreground.stderr));
    (id, envelope)
}

#[test]
fn a_body_waiting_only_on_its_signal_parks_until_cancelled() {
    let state = tempfile::tempdir().unwrap();
    let file = factory_file(
        state.path(),
        "signal-only",
        r#"{ name: "signal-only", description: "d" }"#,
        r#"async (ctx) => {
            ctx.log("waiting");
            await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve));
            ctx.log(`woken: ${ctx.signal.reason.kind}`);
            return "after the abort";
        }"#,
    );
    let (id, envelope) = cancel_when_waiting(state.path(), &file);
    assert_eq!(envelope["status"], "cancelled", "{envelope:#}");
    assert_eq!(envelope["failure"]["type"], "cancelled", "{envelope:#}");
    // The listener ran: the body saw the abort and returned (its result does not count).
    assert!(logs(state.path(), &id).contains(&"woken: cancelled".to_string()), "{:?}", logs(state.path(), &id));
    assert!(envelope.get("result").is_none_or(Value::is_null), "{envelope:#}");
}

#[test]
fn a_body_awaiting_a_promise_that_never_settles_parks_until_cancelled() {
    let state = tempfile::tempdir().unwrap();
    let file = factory_file(
        state.path(),
        "never",
        r#"{ name: "never", description: "d" }"#,
        r#"async (ctx) => {
            ctx.log("waiting");
            await new Promise(() => {});
        }"#,
    );
    let (_, envelope) = cancel_when_waiting(state.path(), &file);
    assert_eq!(envelope["status"], "cancelled", "{envelope:#}");
    assert_eq!(envelope["failure"]["type"], "cancelled", "{envelope:#}");
}

#[test]
fn a_body_waiting_on_nothing_ends_at_its_timeout() {
    let state = tempfile::tempdir().unwrap();
    for (name, body) in [
        ("signal-timeout", "async (ctx) => { await new Promise((resolve) => ctx.signal.addEventListener(\"abort\", resolve)); return 1; }"),
        ("never-timeout", "async () => { await new Promise(() => {}); }"),
    ] {
        let meta = format!(r#"{{ name: "{name}", description: "d", limits: {{ timeoutSeconds: 1 }} }}"#);
        let file = factory_file(state.path(), name, &meta, body);
        let out = factory_in(state.path(), &["run", file.to_str().unwrap(), "--json", "-q"]);
        let envelope = stdout_json(&out);
        assert_eq!(envelope["status"], "error", "{envelope:#}");
        assert_eq!(envelope["failure"]["type"], "factory_limit_reached", "{envelope:#}");
        assert_eq!(envelope["failure"]["kind"], "timeoutSeconds", "{envelope:#}");
    }
}
