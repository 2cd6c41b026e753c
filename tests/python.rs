//! Python factories through the real `factory` binary: `factory build` / `factory run` of
//! `.py` files with componentize-py (each built once per test binary, then cached by source
//! hash), every ctx function of the Python SDK, null-on-failure, abort propagation, a
//! Python exception, the agent tuning options, build errors, the WASI sandbox, hostile Python
//! (a spin, a memory bomb) and a resume after `kill -9` that repeats no journaled backend call; the build sandbox
//! (import-time code writes nothing outside the build's output, no build without `bwrap`)
//! and the private, ownership-checked build cache.
//!
//! Needs `componentize-py` and `bwrap` on PATH (`./test` installs the pinned version into `.venv` and
//! bubblewrap).

mod common;

use common::{factory_cmd, factory_in, root, stderr, stdout_json};
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The Python test factory.
fn probe_py() -> PathBuf {
    root().join("tests").join("python").join("probe.py")
}

/// `factory build FILE` once per test binary (the build cache makes later ones lookups);
/// returns the component's path.
fn built(source: &Path) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<PathBuf, PathBuf>>> = OnceLock::new();
    let mut map = BUILT.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    if let Some(path) = map.get(source) {
        return path.clone();
    }
    let state = tempfile::tempdir().unwrap();
    let out = factory_in(state.path(), &["build", source.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "factory build {} failed (is componentize-py installed? ./test installs it into .venv): {}",
        source.display(),
        stderr(&out)
    );
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(path.is_file(), "build printed the component's path: {path:?}");
    map.insert(source.to_path_buf(), path.clone());
    path
}

fn probe() -> PathBuf {
    built(&probe_py())
}

/// `factory run COMPONENT --yes --json -q --args ARGS [more]` in a fresh state directory.
fn run(component: &Path, args: Value, more: &[&str]) -> (Output, Value, tempfile::TempDir) {
    let state = tempfile::tempdir().unwrap();
    let args = args.to_string();
    let mut argv = vec!["run", component.to_str().unwrap(), "--yes", "--json", "-q", "--args", &args];
    argv.extend_from_slice(more);
    let out = factory_in(state.path(), &argv);
    // Refused before a run exists (exit 2): no envelope.
    let envelope = if out.status.code() == Some(2) { Value::Null } else { stdout_json(&out) };
    (out, envelope, state)
}

/// Every progress entry of a run, oldest first.
fn progress(state: &Path, run_id: &str) -> Vec<Value> {
    let mut entries: Vec<Value> = Vec::new();
    loop {
        let after = entries.last().map(|e| e["seq"].to_string()).unwrap_or_else(|| "0".into());
        let out = factory_in(state, &["progress", run_id, "--after-seq", &after, "--limit", "1000", "--json"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let page = stdout_json(&out).as_array().cloned().unwrap_or_default();
        if page.is_empty() {
            return entries;
        }
        entries.extend(page);
    }
}

fn logs(entries: &[Value]) -> Vec<String> {
    entries.iter().filter(|e| e["event"] == "log").filter_map(|e| e["message"].as_str().map(str::to_string)).collect()
}

fn write_script(dir: &Path, script: Value) -> String {
    let file = dir.join("script.json");
    std::fs::write(&file, script.to_string()).unwrap();
    format!("script:{}", file.display())
}

#[test]
fn every_ctx_function_of_the_python_sdk() {
    let dir = tempfile::tempdir().unwrap();
    let backend = write_script(
        dir.path(),
        json!({ "rules": [
            { "label": "fails", "reply": { "error": "scripted failure" } },
            { "label": "schema", "reply": { "json": { "file": "a.rs", "severity": 3 } } },
            { "label": "raw", "reply": { "json": { "any": [1, 2] } } }
        ], "fallback": "dry-run" }),
    );
    let (out, envelope, state) = run(&probe(), json!({ "mode": "all" }), &["--backend", &backend]);
    assert!(out.status.success(), "{}\n{envelope:#}", stderr(&out));
    let result = &envelope["result"];
    assert_eq!(result["text"], "[dry-run text] reply to: hello", "{result:#}");
    // An ordinary agent failure is None, not an exception.
    assert_eq!(result["failed"], Value::Null, "{result:#}");
    // A dataclass schema: the reply was checked by the host and converted by the SDK.
    assert_eq!(result["structured"], json!(["a.rs", 3]), "{result:#}");
    assert_eq!(result["raw"], json!({ "any": [1, 2] }), "{result:#}");
    assert_eq!(result["par"].as_array().map(Vec::len), Some(3), "{result:#}");
    // parallel: a thunk that raises is None; the others keep their values.
    assert_eq!(result["mixed"][0], "[dry-run ok] reply to: ok", "{result:#}");
    assert_eq!(result["mixed"][1], Value::Null, "{result:#}");
    // pipeline: stages see (previous, item, index); a failing item is None.
    assert_eq!(result["piped"][0], "[dry-run s0] reply to: s0|0|0", "{result:#}");
    assert_eq!(result["piped"][1], Value::Null, "{result:#}");
    assert_eq!(result["piped"][2], "[dry-run s2] reply to: s2|2|2", "{result:#}");
    // step: sync and async producers; the value is the JSON round-trip (a tuple is a list).
    assert_eq!(result["counted"], json!({ "n": 1, "t": [1, 2] }), "{result:#}");
    assert_eq!(result["asynced"], json!([1, 2, 3]), "{result:#}");
    assert_eq!(result["vol"], 7, "{result:#}");
    assert_eq!(result["cancelled"], false, "{result:#}");
    assert_eq!(result["runIdLen"], envelope["runId"].as_str().unwrap().len(), "{result:#}");

    let run_id = envelope["runId"].as_str().unwrap();
    let entries = progress(state.path(), run_id);
    let phases: Vec<&str> =
        entries.iter().filter(|e| e["event"] == "phase").filter_map(|e| e["title"].as_str()).collect();
    assert_eq!(phases, ["One", "Two"], "{entries:#?}");
    let logs = logs(&entries);
    assert!(logs.iter().any(|l| l == &format!("run id {run_id}")), "{logs:#?}");
    assert!(logs.iter().any(|l| l == "failed agent -> None"), "{logs:#?}");
    assert!(logs.iter().any(|l| l.contains("parallel: item 1 failed: ValueError: item failed")), "{logs:#?}");
    assert!(
        logs.iter().any(|l| l.contains("pipeline stage 2: item 1 failed: RuntimeError: stage failed")),
        "{logs:#?}"
    );
    // Journaled steps are in the store (the volatile one is not).
    assert_eq!(envelope["accounting"]["agentsSpawned"], 11, "{envelope:#}");
}

#[test]
fn meta_limits_phases_and_an_args_schema_from_a_dataclass() {
    let component = built(&root().join("examples/python/review_changed.py"));
    let state = tempfile::tempdir().unwrap();
    let out = factory_in(state.path(), &["describe", component.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let described = stdout_json(&out);
    let text = described.to_string();
    assert!(text.contains("review-changed-py"), "{described:#}");
    assert!(text.contains("\"Review\"") && text.contains("\"Verify\""), "{described:#}");
    assert!(text.contains("maxConcurrentSubagents"), "{described:#}");
    // The dataclass `Args` became a schema the host enforces before the run starts.
    let (out, envelope, _state) = run(&component, json!({ "files": "not a list" }), &[]);
    assert_eq!(out.status.code(), Some(2), "{envelope:#}\n{}", stderr(&out));
    assert!(stderr(&out).contains("invalid args"), "{}", stderr(&out));
    // Its declared maxTotalSubagents (10) stops an eleventh review.
    let files: Vec<String> = (0..11).map(|i| format!("f{i}.rs")).collect();
    let (out, envelope, _state) = run(&component, json!({ "files": files }), &["--max-concurrent-subagents", "1"]);
    assert_eq!(out.status.code(), Some(1), "{envelope:#}");
    assert_eq!(envelope["failure"]["type"], "factory_limit_reached", "{envelope:#}");
    assert_eq!(envelope["failure"]["kind"], "maxTotalSubagents", "{envelope:#}");
}

#[test]
fn the_python_examples_run() {
    let review = built(&root().join("examples/python/review_changed.py"));
    let (out, envelope, _state) = run(&review, json!({ "files": ["src/a.rs", "src/b.rs"] }), &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let reviews = envelope["result"]["reviews"].as_array().expect("reviews");
    assert_eq!(reviews.len(), 2, "{envelope:#}");
    assert_eq!(reviews[0]["file"], "src/a.rs");
    assert!(reviews[1]["review"].as_str().unwrap().starts_with("[dry-run review:src/b.rs]"), "{envelope:#}");

    // multi-stage review: schema replies, a pipeline, adversarial verification.
    let multi = built(&root().join("examples/python/multi_stage_review.py"));
    let dir = tempfile::tempdir().unwrap();
    let backend = write_script(
        dir.path(),
        json!({ "rules": [
            { "label": "review:bugs", "reply": { "json": { "findings": [{ "title": "off by one in a.rs" }, { "title": "maybe a leak" }] } } },
            { "label": "review:perf", "reply": { "error": "reviewer crashed" } },
            { "label": "review:security", "reply": { "json": { "findings": [] } } },
            { "label": "verify:bugs:0", "reply": { "json": { "isReal": true } } },
            { "label": "verify:bugs:1", "reply": { "json": { "isReal": false } } }
        ] }),
    );
    let (out, envelope, state) = run(&multi, json!({ "diff": "--- a\n+++ b" }), &["--backend", &backend]);
    assert!(out.status.success(), "{}\n{envelope:#}", stderr(&out));
    assert_eq!(
        envelope["result"],
        json!({ "confirmed": [{ "dimension": "bugs", "title": "off by one in a.rs" }], "dimensions": 3 }),
        "{envelope:#}"
    );
    let logs = logs(&progress(state.path(), envelope["runId"].as_str().unwrap()));
    assert!(logs.iter().any(|l| l == "review:perf produced nothing"), "{logs:#?}");
    assert!(logs.iter().any(|l| l == "review:security found no security vulnerabilities"), "{logs:#?}");
}

#[test]
fn an_abort_ends_the_python_run_with_the_hosts_typed_cause() {
    // The probe catches `Exception` around a fan-out past the limit: the host stops the
    // attempt at the abort and records its cause; nothing the guest does afterwards counts.
    let (out, envelope, state) = run(&probe(), json!({ "mode": "abort" }), &["--max-total-subagents", "2"]);
    assert_eq!(out.status.code(), Some(1), "{envelope:#}");
    assert_eq!(envelope["failure"]["type"], "factory_limit_reached", "{envelope:#}");
    assert_eq!(envelope["failure"]["kind"], "maxTotalSubagents", "{envelope:#}");
    assert_eq!(envelope["result"], Value::Null, "{envelope:#}");
    let logs = logs(&progress(state.path(), envelope["runId"].as_str().unwrap()));
    assert!(!logs.iter().any(|l| l.contains("swallowed")), "{logs:#?}");
}

#[test]
fn a_python_run_that_leaves_a_started_call_behind_returns_without_waiting_for_it() {
    // The SDK keeps its one `agent-wait` alive with the component's task while a started
    // call is unreported; the run still ends at its result: the call left behind (ten
    // minutes long) would otherwise hold it until the 60-second timeout stopped it.
    let state = tempfile::tempdir().unwrap();
    let backend = write_script(
        state.path(),
        json!({ "rules": [
            { "label": "slow", "reply": { "text": "late" }, "latencyMs": 600_000 },
            { "label": "fast", "reply": { "text": "soon" } }
        ] }),
    );
    let (out, envelope, _state) =
        run(&probe(), json!({ "mode": "abandon" }), &["--backend", &backend, "--timeout-seconds", "60"]);
    assert!(out.status.success(), "{}\n{envelope:#}", stderr(&out));
    assert_eq!(envelope["status"], "completed", "{envelope:#}");
    assert_eq!(envelope["result"], "soon", "{envelope:#}");
}

/// The SDK's semantics (abort propagation through `parallel`/`pipeline`/`step` past
/// `except Exception`, null-on-failure, the 4096 cap, schemas from types, args conversion)
/// under CPython with the host's hooks faked: `guest-sdk/python/tests`.
#[test]
fn the_python_sdk_unit_tests_pass() {
    let sdk = root().join("guest-sdk").join("python");
    let out = std::process::Command::new("python3")
        .args(["-m", "unittest", "discover", "-s", "tests", "-t", "."])
        .current_dir(&sdk)
        .output()
        .expect("python3 runs (componentize-py needs it too)");
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(stderr(&out).contains("OK"), "{}", stderr(&out));
}

#[test]
fn an_exception_in_run_is_an_error_with_the_python_traceback() {
    let (out, envelope, _state) = run(&probe(), json!({ "mode": "raise" }), &[]);
    assert_eq!(out.status.code(), Some(1), "{envelope:#}");
    assert_eq!(envelope["status"], "error");
    assert_eq!(envelope["failure"]["type"], "guest_error", "{envelope:#}");
    let message = envelope["failure"]["message"].as_str().unwrap();
    assert!(message.starts_with("KeyError: 'missing-key'"), "{message}");
    assert!(message.contains("File \"probe.py\", line"), "the user's frames, by file: {message}");
    assert!(message.contains("in inner") && message.contains("raise KeyError(\"missing-key\")"), "{message}");
    assert!(
        !message.contains("wasm backtrace") && !message.contains("factory_sdk"),
        "no wasm or SDK frames: {message}"
    );

    let (out, envelope, _state) = run(&probe(), json!({ "mode": "too-many" }), &[]);
    assert_eq!(out.status.code(), Some(1), "{envelope:#}");
    let message = envelope["failure"]["message"].as_str().unwrap();
    assert!(message.starts_with("FactoryError: too many items: 4097 (at most 4096 per call)"), "{message}");
}

#[test]
fn wasi_is_denied_by_default_with_clocks_random_and_output_allowed() {
    let component = probe();
    let state = tempfile::tempdir().unwrap();
    let out = factory_in(state.path(), &["describe", component.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let described = stdout_json(&out);
    let imports: Vec<String> = described["imports"]
        .as_array()
        .expect("imports")
        .iter()
        .filter_map(|i| i.as_str().map(str::to_string))
        .collect();
    assert!(imports.iter().any(|i| i.starts_with("agent:factory/agents")), "{imports:?}");
    for import in &imports {
        let allowed = [
            "agent:factory/",
            "wasi:io/",
            "wasi:clocks/",
            "wasi:random/",
            "wasi:cli/",
            "wasi:filesystem/",
            "wasi:sockets/",
        ];
        assert!(allowed.iter().any(|a| import.starts_with(a)), "unexpected import {import}");
    }

    let (out, envelope, state) = run(&component, json!({ "mode": "wasi" }), &[]);
    assert!(out.status.success(), "{}\n{envelope:#}", stderr(&out));
    let seen = &envelope["result"];
    assert_eq!(seen["env"], json!({}), "no environment: {seen:#}");
    assert_eq!(seen["file"], "FileNotFoundError", "no files: {seen:#}");
    assert_eq!(seen["listdir"], "FileNotFoundError", "no files: {seen:#}");
    assert_ne!(seen["socket"], "connected", "no sockets: {seen:#}");
    assert_eq!(seen["time"], true, "clocks work: {seen:#}");
    assert_eq!(seen["random"], true, "random works: {seen:#}");
    let logs = logs(&progress(state.path(), envelope["runId"].as_str().unwrap()));
    assert!(logs.iter().any(|l| l == "[guest] hello from print"), "stdout goes to the log: {logs:#?}");
}

#[test]
fn hostile_python_ends_with_typed_sandbox_failures() {
    // An infinite loop: stopped by the active-time limit (fuel bounds it too, later).
    let (out, envelope, _state) = run(&probe(), json!({ "mode": "spin" }), &["--timeout-seconds", "2"]);
    assert_eq!(out.status.code(), Some(1), "{envelope:#}");
    assert_eq!(envelope["failure"]["type"], "factory_limit_reached", "{envelope:#}");
    assert_eq!(envelope["failure"]["kind"], "timeoutSeconds", "{envelope:#}");

    // A memory bomb: the store's memory cap, a typed sandbox failure.
    let (out, envelope, _state) = run(&probe(), json!({ "mode": "bomb" }), &["--timeout-seconds", "60"]);
    assert_eq!(out.status.code(), Some(1), "{envelope:#}");
    assert_eq!(envelope["failure"]["type"], "sandbox_limit", "{envelope:#}");
    assert_eq!(envelope["failure"]["kind"], "memory", "{envelope:#}");
}

#[test]
fn python_build_errors_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("broken.py");
    std::fs::write(&bad, "from factory_sdk import factory\n\nvalues = (1,\n").unwrap();
    let state = tempfile::tempdir().unwrap();
    let out = factory_in(state.path(), &["build", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains(&format!("{}:3: SyntaxError", bad.display())), "file:line of the syntax error: {err}");

    let bad_name = dir.path().join("my-factory.py");
    std::fs::write(&bad_name, "").unwrap();
    let out = factory_in(state.path(), &["build", bad_name.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("rename it, e.g. to `my_factory.py`"), "{}", stderr(&out));

    // No componentize-py on PATH and a factory not built yet: exit 2 with the pip command.
    let empty = tempfile::tempdir().unwrap();
    let fresh = dir.path().join("fresh.py");
    std::fs::write(&fresh, format!("# {}\n{}", uuid_like(), std::fs::read_to_string(probe_py()).unwrap())).unwrap();
    let out = factory_cmd(state.path(), &["run", fresh.to_str().unwrap(), "--yes"])
        .env("PATH", empty.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("pip install componentize-py=="), "{}", stderr(&out));
}

/// A text no earlier build has seen (so its build is not a cache hit).
fn uuid_like() -> String {
    format!("{:?}-{}", std::time::SystemTime::now(), std::process::id())
}

#[test]
fn a_python_project_directory_builds_its_package() {
    // A pyproject.toml naming a package module; a helper module beside it; an environment
    // directory that is never bundled.
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("proj");
    std::fs::create_dir_all(project.join("reviewer")).unwrap();
    std::fs::create_dir_all(project.join(".venv")).unwrap();
    std::fs::write(
        project.join("pyproject.toml"),
        "[project]\nname = \"proj\"\n\n[tool.factory]\nmodule = \"reviewer.main\"\n",
    )
    .unwrap();
    std::fs::write(project.join("reviewer/__init__.py"), "").unwrap();
    std::fs::write(
        project.join("reviewer/util.py"),
        "def shout(text: str) -> str:\n    if text == 'fail':\n        raise ValueError('no shouting')\n    return text.upper()\n",
    )
    .unwrap();
    std::fs::write(
        project.join("reviewer/main.py"),
        "from factory_sdk import Ctx, factory\nfrom .util import shout\n\n\
         @factory(name='proj', description='args: { text: string }', args={'type': 'object', 'required': ['text']})\n\
         async def run(ctx: Ctx) -> str:\n    return shout(ctx.args['text'])\n",
    )
    .unwrap();
    std::fs::write(project.join(".venv/broken.py"), "this is not python (\n").unwrap();
    let component = built(&project);
    let (out, envelope, _state) = run(&component, json!({ "text": "hi" }), &[]);
    assert!(out.status.success(), "{}\n{envelope:#}", stderr(&out));
    assert_eq!(envelope["result"], "HI", "{envelope:#}");
    let (out, envelope, _state) = run(&component, json!({ "text": "fail" }), &[]);
    assert_eq!(out.status.code(), Some(1), "{envelope:#}");
    let message = envelope["failure"]["message"].as_str().unwrap();
    assert!(message.contains("File \"reviewer/util.py\", line 3, in shout"), "{message}");
    assert!(message.contains("File \"reviewer/main.py\", line 6, in run"), "{message}");
}

#[test]
fn a_python_build_is_cached_and_trusted_like_a_rust_build() {
    let component = probe();
    let state = tempfile::tempdir().unwrap();
    // Built (a cache hit now): no "building" note, the same component.
    let out = factory_in(state.path(), &["build", probe_py().to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()), component);
    assert!(!stderr(&out).contains("building"), "{}", stderr(&out));
    // A cache hit runs no Python: it works with componentize-py off PATH (the version that
    // built it is recorded beside it).
    let out = factory_cmd(state.path(), &["build", probe_py().to_str().unwrap()])
        .env("PATH", "/nonexistent")
        .output()
        .expect("the factory binary starts");
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()), component);
    let version = std::fs::read_to_string(component.with_extension("version")).expect("the version file");
    assert!(version.starts_with("componentize-py "), "{version}");
    // Run by source with no --yes and no terminal: trusted because this machine built it.
    let out = factory_in(
        state.path(),
        &["run", probe_py().to_str().unwrap(), "--json", "-q", "--args", r#"{"mode":"none"}"#],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout_json(&out)["status"], "completed");
}

#[test]
fn kill_9_mid_fan_out_then_resume_repeats_no_journaled_backend_call() {
    let component = probe();
    let state = tempfile::tempdir().unwrap();
    let backend = write_script(
        state.path(),
        json!({ "rules": [{ "labelPrefix": "t:", "reply": { "text": "ok" }, "latencyMs": 40 }] }),
    );
    let events = state.path().join("events.jsonl");
    let n = 120;
    let args = json!({ "mode": "fanout", "n": n }).to_string();
    let mut child = factory_cmd(
        state.path(),
        &[
            "run",
            component.to_str().unwrap(),
            "--yes",
            "--json",
            "-q",
            "--args",
            &args,
            "--backend",
            &backend,
            "--max-concurrent-subagents",
            "4",
            "--events",
            events.to_str().unwrap(),
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("factory run starts");

    // Kill at a known point: 24 fresh results on the events stream.
    let deadline = Instant::now() + Duration::from_secs(120);
    let run_id = loop {
        let text = std::fs::read_to_string(&events).unwrap_or_default();
        let complete = text.rfind('\n').map_or("", |end| &text[..end]);
        let finished: Vec<Value> = complete
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["event"] == "progress" && e["entry"]["event"] == "agentFinished")
            .collect();
        if finished.len() >= 24 {
            break finished[0]["runId"].as_str().expect("the event names the run").to_string();
        }
        assert!(Instant::now() < deadline, "the run never got going: {text}");
        std::thread::sleep(Duration::from_millis(20));
    };
    child.kill().expect("SIGKILL");
    child.wait().unwrap();

    // What the store committed before the kill: those calls must never run again. A result
    // is journaled right after it is reported, so all but the last few reported ones surely
    // are (the last 8 are left out: their journal write may have missed the last commit).
    let before = progress(state.path(), &run_id);
    let committed: Vec<String> = before
        .iter()
        .filter(|e| e["event"] == "agentFinished" && e["cached"] == false)
        .filter_map(|e| e["label"].as_str().map(str::to_string))
        .collect();
    assert!(committed.len() < n, "killed mid fan-out ({} committed)", committed.len());
    let journaled: HashSet<String> = committed[..committed.len().saturating_sub(8)].iter().cloned().collect();
    assert!(!journaled.is_empty(), "results were committed before the kill: {committed:?}");

    let out = factory_in(state.path(), &["resume", &run_id, "--yes", "--json", "-q"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let envelope = stdout_json(&out);
    assert_eq!(envelope["status"], "completed", "{envelope:#}");
    assert_eq!(envelope["result"]["done"], n, "{envelope:#}");
    assert_eq!(envelope["attempts"], 2);

    let entries = progress(state.path(), &run_id);
    let second = entries.iter().position(|e| e["event"] == "attemptStarted" && e["attempt"] == 2).expect("attempt 2");
    let attempt2 = &entries[second..];
    let spawned: Vec<&str> =
        attempt2.iter().filter(|e| e["event"] == "agentStarted").filter_map(|e| e["label"].as_str()).collect();
    let repeated: Vec<&&str> = spawned.iter().filter(|l| journaled.contains(**l)).collect();
    assert!(repeated.is_empty(), "journaled calls ran again: {repeated:?}");
    let replayed = attempt2.iter().find(|e| e["event"] == "attemptEnded").expect("attempt 2 ended")["replayed"]
        .as_u64()
        .unwrap() as usize;
    assert!(replayed >= journaled.len(), "every journaled call replayed ({replayed})");
    assert_eq!(replayed + spawned.len(), n, "each item replayed or spawned exactly once");
}

/// `factory build SOURCE` with its own (fresh) build cache `cache`, so it surely builds.
fn build_with_cache(state: &Path, cache: &Path, source: &Path) -> Output {
    factory_cmd(state, &["build", source.to_str().unwrap()])
        .env("FACTORY_CACHE_DIR", cache)
        .output()
        .expect("the factory binary starts")
}

/// The host Python's package directories a Python build could reach: `site.getsitepackages()`,
/// the user site and the directory holding componentize-py's package (those that exist).
fn host_python_dirs() -> Vec<PathBuf> {
    let code = "import json, os, site, componentize_py\n\
                dirs = list(site.getsitepackages()) + [site.getusersitepackages()]\n\
                dirs.append(os.path.dirname(os.path.dirname(os.path.abspath(componentize_py.__file__))))\n\
                print(json.dumps(dirs))";
    let out = std::process::Command::new("python3")
        .args(["-c", code])
        .output()
        .expect("python3 runs (componentize-py needs it too)");
    assert!(
        out.status.success(),
        "finding site-packages and componentize-py's package failed (install it: pip install componentize-py==0.25.1): {}",
        stderr(&out)
    );
    let dirs: Vec<PathBuf> = serde_json::from_slice(&out.stdout).expect("a JSON list of directories");
    let mut found: Vec<PathBuf> = Vec::new();
    for dir in dirs {
        let Ok(dir) = dir.canonicalize() else { continue };
        if dir.is_dir() && !found.iter().any(|f| dir.starts_with(f)) {
            found.retain(|f| !f.starts_with(&dir));
            found.push(dir);
        }
    }
    assert!(!found.is_empty(), "no site-packages directory found");
    found
}

/// Every entry under `dir`, symlinks not followed: relative path → kind, mode and the sha256
/// of a file's bytes (a symlink's target).
fn tree_digest(dir: &Path) -> std::collections::BTreeMap<PathBuf, String> {
    use sha2::{Digest, Sha256};
    use std::os::unix::fs::PermissionsExt;
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(current) = stack.pop() {
        let entries = match std::fs::read_dir(&current) {
            Ok(entries) => entries,
            Err(e) => {
                out.insert(current.clone(), format!("unreadable: {e}"));
                continue;
            }
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let rel = path.strip_prefix(dir).unwrap_or(&path).to_path_buf();
            let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
            let mode = meta.permissions().mode();
            let kind = meta.file_type();
            let summary = if kind.is_symlink() {
                format!("link {mode:o} {:?}", std::fs::read_link(&path).ok())
            } else if kind.is_dir() {
                stack.push(path.clone());
                format!("dir {mode:o}")
            } else if kind.is_file() {
                match std::fs::read(&path) {
                    Ok(bytes) => format!("file {mode:o} {}", hex::encode(Sha256::digest(&bytes))),
                    Err(e) => format!("file {mode:o} unreadable: {e}"),
                }
            } else {
                format!("other {mode:o}")
            };
            out.insert(rel, summary);
        }
    }
    out
}

/// The paths under `dir` (recursively when `deep`) whose name contains `marker`.
fn marked(dir: &Path, marker: &str, deep: bool) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return found };
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_name().to_string_lossy().contains(marker) {
            found.push(path.clone());
        }
        if deep && entry.file_type().is_ok_and(|t| t.is_dir()) {
            found.extend(marked(&path, marker, true));
        }
    }
    found
}

#[test]
fn a_python_build_writes_nothing_outside_its_output() {
    // The factory's module top level runs at build time (componentize-py snapshots it): here it
    // tries to drop a file (and a directory) into every sys.path entry, the host's
    // site-packages by their real paths, its working directory, `/`, `/tmp` and $HOME.
    let sites = host_python_dirs();
    let before: Vec<_> = sites.iter().map(|d| tree_digest(d)).collect();
    let marker = format!("zz_factory_probe_{}", std::process::id());
    let dir = tempfile::tempdir().unwrap();
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/root"));
    let mut named: Vec<String> = sites.iter().map(|d| d.display().to_string()).collect();
    named.extend(
        [common::test_home(), home.clone(), std::env::temp_dir(), dir.path().to_path_buf()]
            .iter()
            .map(|d| d.display().to_string()),
    );
    let source = dir.path().join("writer.py");
    std::fs::write(
        &source,
        format!(
            "# {unique}\nimport os, sys\nfrom factory_sdk import Ctx, factory\n\n\
             MARKER = {marker:?}\nNAMED = {named}\n\
             attempted, written = [], []\n\
             for d in list(sys.path) + ['', '.', '/', '/tmp', os.environ.get('HOME') or '/root', os.path.expanduser('~')] + NAMED:\n\
             \x20   for path, make in ((os.path.join(d or '.', MARKER + '.txt'), 'file'), (os.path.join(d or '.', MARKER + '_dir'), 'dir')):\n\
             \x20       attempted.append(path)\n\
             \x20       try:\n\
             \x20           if make == 'file':\n\
             \x20               with open(path, 'w') as f:\n\
             \x20                   f.write('written at build time\\n')\n\
             \x20           else:\n\
             \x20               os.mkdir(path)\n\
             \x20           written.append(path)\n\
             \x20       except OSError:\n\
             \x20           pass\n\n\
             @factory(name='writer', description='writes at import time')\n\
             async def run(ctx: Ctx) -> object:\n\
             \x20   return {{'attempted': len(attempted), 'written': written}}\n",
            unique = uuid_like(),
            named = serde_json::to_string(&named).unwrap(),
        ),
    )
    .unwrap();
    let state = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let out = build_with_cache(state.path(), cache.path(), &source);

    // Whatever happened, take every probe file away from the host again before judging.
    let mut leaked: Vec<PathBuf> = sites.iter().flat_map(|d| marked(d, &marker, true)).collect();
    leaked.extend(marked(dir.path(), &marker, true));
    leaked.extend(marked(cache.path(), &marker, true));
    for shallow in [common::test_home(), home, std::env::temp_dir(), PathBuf::from("/tmp"), PathBuf::from("/")] {
        leaked.extend(marked(&shallow, &marker, false));
    }
    let after: Vec<_> = sites.iter().map(|d| tree_digest(d)).collect();
    for path in &leaked {
        let _ = std::fs::remove_file(path).or_else(|_| std::fs::remove_dir_all(path));
    }
    assert!(leaked.is_empty(), "the build's import-time code wrote outside its output: {leaked:#?}");
    for ((site, before), after) in sites.iter().zip(&before).zip(&after) {
        let changed: Vec<_> =
            after.iter().filter(|(path, digest)| before.get(*path) != Some(digest)).map(|(p, _)| p).collect();
        let gone: Vec<_> = before.keys().filter(|path| !after.contains_key(*path)).collect();
        assert!(changed.is_empty() && gone.is_empty(), "{} changed: {changed:?}, removed: {gone:?}", site.display());
    }
    // The build succeeded (a write refused is an OSError the module caught) and the
    // import-time code did run: its snapshot counted the attempts.
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("in a sandbox"), "{}", stderr(&out));
    let component = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(component.starts_with(cache.path()), "{component:?}");
    let (out, envelope, _state) = run(&component, json!({}), &[]);
    assert!(out.status.success(), "{}\n{envelope:#}", stderr(&out));
    let attempted = envelope["result"]["attempted"].as_u64().unwrap_or(0);
    assert!(attempted as usize >= 2 * (named.len() + 6), "{envelope:#}");
}

/// The mode bits of `path` (symlinks not followed).
fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).permissions().mode() & 0o7777
}

#[test]
fn the_python_build_cache_and_temp_files_are_private_and_a_loose_entry_is_not_trusted() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("private_probe.py");
    std::fs::write(&source, format!("# {}\n{}", uuid_like(), std::fs::read_to_string(probe_py()).unwrap())).unwrap();
    let state = tempfile::tempdir().unwrap();
    let cache_root = tempfile::tempdir().unwrap();
    let cache = cache_root.path().join("cache");
    let tmp = tempfile::tempdir().unwrap();

    // The build's temporary directory, watched while it exists: the directories `factory`
    // makes there are 0700 and the files it writes 0600 (componentize-py's own, under `out/`
    // and `scratch/`, are inside those 0700 directories).
    let mut child = factory_cmd(state.path(), &["build", source.to_str().unwrap()])
        .env("FACTORY_CACHE_DIR", &cache)
        .env("TMPDIR", tmp.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the factory binary starts");
    let mut seen: std::collections::BTreeMap<PathBuf, u32> = Default::default();
    let deadline = Instant::now() + Duration::from_secs(300);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the build hangs");
        for build in marked(tmp.path(), "factory-pybuild-", false) {
            let mut stack = vec![build.clone()];
            if let Ok(meta) = std::fs::symlink_metadata(&build) {
                seen.insert(PathBuf::from("."), meta.permissions().mode() & 0o7777);
            }
            while let Some(d) = stack.pop() {
                for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                    let path = entry.path();
                    let rel = path.strip_prefix(&build).unwrap_or(&path).to_path_buf();
                    let theirs = rel.starts_with("out") || rel.starts_with("scratch");
                    let ours = !theirs || rel == Path::new("out") || rel == Path::new("scratch");
                    let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
                    if ours {
                        seen.insert(rel, meta.permissions().mode() & 0o7777);
                    }
                    if meta.is_dir() && !theirs {
                        stack.push(path);
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let component = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    for must in
        [".", "wit", "wit/factory.wit", "sdk", "sdk/factory_sdk/__init__.py", "src/private_probe.py", "out", "scratch"]
    {
        assert!(seen.contains_key(Path::new(must)), "{must} seen in the build's temporary directory: {seen:#?}");
    }
    for (path, mode) in &seen {
        let want = if path.extension().is_some() { 0o600 } else { 0o700 };
        assert_eq!(*mode, want, "{} in the build's temporary directory is {mode:o}: {seen:#?}", path.display());
    }
    assert!(marked(tmp.path(), "factory-pybuild-", false).is_empty(), "the temporary directory is removed");

    // The cache: directories 0700, files 0600, no partial file left.
    let python = cache.join("python");
    assert_eq!(component.parent(), Some(python.as_path()));
    assert_eq!(mode(&cache), 0o700);
    assert_eq!(mode(&python), 0o700);
    assert_eq!(mode(&component), 0o600);
    assert_eq!(mode(&component.with_extension("version")), 0o600);
    let names: Vec<String> =
        std::fs::read_dir(&python).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(names.len(), 2, "the component and its version only: {names:?}");
    let good = std::fs::read(&component).unwrap();

    // A cached component someone else could have written (group-writable) is not used: it is
    // built again and replaced by a private file.
    std::fs::write(&component, b"planted").unwrap();
    std::fs::set_permissions(&component, std::fs::Permissions::from_mode(0o620)).unwrap();
    let out = build_with_cache(state.path(), &cache, &source);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("not using the cached") && stderr(&out).contains("writable by group or others"),
        "{}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("building"), "{}", stderr(&out));
    assert_eq!(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()), component);
    assert_ne!(std::fs::read(&component).unwrap(), b"planted");
    assert_eq!(mode(&component), 0o600);

    // Nor is a symlink, nor a file of another owner (which only root can plant).
    std::fs::remove_file(&component).unwrap();
    let elsewhere = dir.path().join("elsewhere.wasm");
    std::fs::write(&elsewhere, &good).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &component).unwrap();
    let out = build_with_cache(state.path(), &cache, &source);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("not using the cached") && stderr(&out).contains("not a regular file"),
        "{}",
        stderr(&out)
    );
    assert!(!std::fs::symlink_metadata(&component).unwrap().file_type().is_symlink());
    if nix::unistd::geteuid().is_root() {
        std::fs::write(&component, b"planted by uid 65534").unwrap();
        std::os::unix::fs::chown(&component, Some(65534), Some(65534)).unwrap();
        let out = build_with_cache(state.path(), &cache, &source);
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("not using the cached") && stderr(&out).contains("owned by uid 65534"),
            "{}",
            stderr(&out)
        );
        assert_ne!(std::fs::read(&component).unwrap(), b"planted by uid 65534");
        assert_eq!(std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&component).unwrap()), 0);
    } else {
        eprintln!("note: not root, so no file of another owner can be planted; that case is not exercised here");
    }

    // A cache directory anyone can write is refused outright: not read, not written.
    std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = build_with_cache(state.path(), &cache, &source);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("the Python build cache `{}` is writable by group or others", python.display())),
        "{}",
        stderr(&out)
    );
    std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o700)).unwrap();
    // A cache hit still works with nothing but the cache (the mode is fixed).
    let out = build_with_cache(state.path(), &cache, &source);
    assert!(out.status.success() && !stderr(&out).contains("building"), "{}", stderr(&out));
}

/// The componentize-py script itself (its shebang names its Python), not a shim that needs
/// `PATH`.
fn componentize_py_script() -> PathBuf {
    let code = "import sysconfig, os\n\
                for scheme in (None, os.name + '_user'):\n\
                \x20   d = sysconfig.get_path('scripts') if scheme is None else sysconfig.get_path('scripts', scheme)\n\
                \x20   p = os.path.join(d, 'componentize-py')\n\
                \x20   if os.path.isfile(p):\n\
                \x20       print(p)\n\
                \x20       break\n";
    let out = std::process::Command::new("python3").args(["-c", code]).output().expect("python3 runs");
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(
        path.is_file(),
        "componentize-py is not installed for python3: pip install componentize-py==0.25.1 ({})",
        stderr(&out)
    );
    path
}

#[test]
fn without_bubblewrap_a_python_build_is_refused_naming_the_package() {
    // componentize-py on PATH, bwrap not: the build is refused, never run unsandboxed.
    let bin = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(componentize_py_script(), bin.path().join("componentize-py")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("unsandboxed.py");
    std::fs::write(&source, format!("# {}\n{}", uuid_like(), std::fs::read_to_string(probe_py()).unwrap())).unwrap();
    let state = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let out = factory_cmd(state.path(), &["build", source.to_str().unwrap()])
        .env("FACTORY_CACHE_DIR", cache.path())
        .env("PATH", bin.path())
        .output()
        .expect("the factory binary starts");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("`bwrap` (bubblewrap) is not installed") && err.contains("apt-get install bubblewrap"),
        "{err}"
    );
    assert!(std::fs::read_dir(cache.path().join("python")).map_or(0, |d| d.count()) == 0, "nothing built");
}

#[test]
fn agent_tuning_options_reach_the_host_as_part_of_the_call_identity() {
    // Each tuned call is its own subagent (its options are part of its memo key), a repeat is
    // a memo hit, and a bad value raises at the call.
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("tuned.py");
    std::fs::write(
        &source,
        r#"from factory_sdk import Ctx, factory


@factory(name="py-tuned", description="d")
async def run(ctx: Ctx) -> object:
    plain = await ctx.agent("think", label="t")
    high = await ctx.agent("think", label="t", reasoning_effort="high", agent="reviewer", context_tier="long_context")
    again = await ctx.agent("think", label="t", reasoning_effort="high", agent="reviewer", context_tier="long_context")
    try:
        await ctx.agent("think", label="t", reasoning_effort="max")
        refused = None
    except ValueError as e:
        refused = str(e)
    return {"plain": plain, "high": high, "again": again, "refused": refused}
"#,
    )
    .unwrap();
    let (out, envelope, _state) = run(&built(&source), json!({}), &[]);
    assert!(out.status.success(), "{}\n{envelope:#}", stderr(&out));
    let result = &envelope["result"];
    assert_eq!(result["high"], result["again"], "{result:#}");
    assert!(result["refused"].as_str().unwrap().contains("reasoning_effort must be one of"), "{result:#}");
    assert_eq!(envelope["accounting"]["agentsSpawned"], 2, "{envelope:#}");
}
