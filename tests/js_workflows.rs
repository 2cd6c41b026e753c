//! The JS guest surface of Dynamic Workflows (upstream's current name for agent factories),
//! through the real `factory` binary and its service: a body that waits only on `ctx.signal`
//! (or on a promise that never settles) parks until it is cancelled, paused or times out;
//! `defineWorkflow` and files offering several definitions (run by `#name`, all registered by
//! `factory add`); definitions checked and frozen;
//! results and step values refused unless plain JSON; `ctx.session` refusing run, resume and
//! pause.

mod common;

use common::{factory_cmd, factory_in, js_factory_file, stderr, stdout_json};
use serde_json::Value;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// The run's log messages, as `factory progress` prints them.
fn logs(state: &Path, run_id: &str) -> Vec<String> {
    common::progress_entries(state, run_id)
        .into_iter()
        .filter(|e| e["event"] == "log")
        .filter_map(|e| e["message"].as_str().map(str::to_string))
        .collect()
}

/// The id of the only run of `state` once it has logged `line` (polled from another process).
fn wait_for_log(state: &Path, line: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let out = factory_in(state, &["runs", "--json"]);
        let id = out
            .status
            .success()
            .then(|| stdout_json(&out))
            .and_then(|runs| runs[0]["runId"].as_str().map(str::to_string));
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
    stop_when_waiting(state, file, "cancel", 130)
}

/// As [`cancel_when_waiting`], stopping the run with `factory VERB` (`cancel`, `pause`); the
/// foreground run exits `code`.
fn stop_when_waiting(state: &Path, file: &Path, verb: &str, code: i32) -> (String, Value) {
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
    let out = factory_in(state, &[verb, &id, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let envelope = stdout_json(&out);
    let foreground = child.wait_with_output().unwrap();
    assert_eq!(foreground.status.code(), Some(code), "{}", String::from_utf8_lossy(&foreground.stderr));
    (id, envelope)
}

#[test]
fn a_body_waiting_only_on_its_signal_parks_until_cancelled() {
    let state = tempfile::tempdir().unwrap();
    let file = js_factory_file(
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
fn a_body_waiting_only_on_its_signal_parks_until_paused() {
    let state = tempfile::tempdir().unwrap();
    let file = js_factory_file(
        state.path(),
        "pause-me",
        r#"{ name: "pause-me", description: "d" }"#,
        r#"async (ctx) => {
            ctx.log("waiting");
            await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve));
            ctx.log(`woken: ${ctx.signal.reason.kind}`);
        }"#,
    );
    let (id, envelope) = stop_when_waiting(state.path(), &file, "pause", 1);
    assert_eq!(envelope["status"], "paused", "{envelope:#}");
    assert!(logs(state.path(), &id).contains(&"woken: paused".to_string()), "{:?}", logs(state.path(), &id));
}

#[test]
fn a_body_awaiting_a_promise_that_never_settles_parks_until_cancelled() {
    let state = tempfile::tempdir().unwrap();
    let file = js_factory_file(
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
        let file = js_factory_file(state.path(), name, &meta, body);
        let out = factory_in(state.path(), &["run", file.to_str().unwrap(), "--json", "-q"]);
        let envelope = stdout_json(&out);
        assert_eq!(envelope["status"], "error", "{envelope:#}");
        assert_eq!(envelope["failure"]["type"], "factory_limit_reached", "{envelope:#}");
        assert_eq!(envelope["failure"]["kind"], "timeoutSeconds", "{envelope:#}");
    }
}

/// `factory describe FILE --json`: its output, and its stderr when it fails.
fn describe(state: &Path, target: &str) -> Result<Value, String> {
    let out = factory_in(state, &["describe", target, "--json"]);
    if out.status.success() {
        Ok(stdout_json(&out))
    } else {
        Err(stderr(&out))
    }
}

#[test]
fn define_workflow_is_define_factory_and_one_file_offers_several_by_name() {
    let state = tempfile::tempdir().unwrap();
    let file = state.path().join("both.js");
    std::fs::write(
        &file,
        r#"import { defineWorkflow, defineFactory, joinSession } from "@github/copilot-sdk/extension";
const meta = { name: "review", description: "d", phases: [{ title: "Scan" }], limits: { maxTotalSubagents: 2 } };
const review = defineWorkflow({ meta, run: async (ctx) => {
    ctx.phase("Scan");
    return { frozen: Object.isFrozen(review.meta) && Object.isFrozen(review.meta.phases[0]) && Object.isFrozen(review),
             copy: review.meta !== meta, name: review.meta.name, same: typeof defineFactory };
} });
// The definition's object is copied: changing it afterwards changes nothing registered.
meta.name = "changed";
meta.phases.push({ title: "Late" });
const summary = defineWorkflow({ meta: { name: "summary", description: "d" }, run: async () => "S" });
await joinSession({ workflows: [review, summary] });
"#,
    )
    .unwrap();
    let several = describe(state.path(), file.to_str().unwrap()).expect_err("two workflows: pick one");
    assert!(several.contains("both.js#NAME") && several.contains("review, summary"), "{several}");
    let target = format!("{}#review", file.display());
    let described = describe(state.path(), &target).expect("described");
    assert_eq!(described["meta"]["name"], "review");
    assert_eq!(described["meta"]["phases"], serde_json::json!([{ "title": "Scan" }]));
    let out = factory_in(state.path(), &["run", &target, "--json", "-q"]);
    let envelope = stdout_json(&out);
    assert_eq!(envelope["status"], "completed", "{envelope:#}");
    assert_eq!(
        envelope["result"],
        serde_json::json!({ "frozen": true, "copy": true, "name": "review", "same": "function" })
    );
    let out = factory_in(state.path(), &["run", &format!("{}#summary", file.display()), "--json", "-q"]);
    assert_eq!(stdout_json(&out)["result"], "S");

    // `factory add FILE` registers every definition the file offers, each by its name.
    let out = factory_in(state.path(), &["add", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(said.contains("registered review ") && said.contains("registered summary "), "{said}");
    let out = factory_in(state.path(), &["list", "--json"]);
    let mut names: Vec<String> =
        stdout_json(&out).as_array().unwrap().iter().map(|r| r["meta"]["name"].as_str().unwrap().to_string()).collect();
    names.sort();
    assert_eq!(names, ["review", "summary"]);
    for (name, expected) in [("review", "review"), ("summary", "S")] {
        let out = factory_in(state.path(), &["run", name, "--json", "-q"]);
        let envelope = stdout_json(&out);
        let got = envelope["result"].get("name").unwrap_or(&envelope["result"]).clone();
        assert_eq!(got, expected, "{envelope:#}");
    }
}

#[test]
fn bad_definitions_are_refused_with_a_clear_error() {
    let state = tempfile::tempdir().unwrap();
    let cases = [
        (
            r#"defineWorkflow({ meta: { name: "a", description: "d", phases: [{ title: " " }] }, run: async () => 1 })"#,
            "defineWorkflow: the phase titles of `a` must not be empty",
        ),
        (
            r#"defineFactory({ meta: { name: "a", description: "d", phases: [{ title: "X" }, { title: "X" }] }, run: async () => 1 })"#,
            "defineFactory: the phase title \"X\" of `a` is declared more than once",
        ),
        (
            r#"defineWorkflow({ meta: { name: "a", description: "d", limits: { maxAiCredits: 1e-12 } }, run: async () => 1 })"#,
            "rounds to a safe positive integer of nano-credits",
        ),
        (
            r#"defineWorkflow({ meta: { name: "a", description: "d", limits: { maxAiCredits: 1e10 } }, run: async () => 1 })"#,
            "rounds to a safe positive integer of nano-credits",
        ),
        (
            r#"(await joinSession({ workflows: [defineWorkflow({ meta: { name: "a", description: "d" }, run: async () => 1 }), defineWorkflow({ meta: { name: "a", description: "e" }, run: async () => 2 })] }), null)"#,
            "joinSession: two definitions are named `a`",
        ),
        (
            r#"(await joinSession({ factories: [], workflows: [] }), null)"#,
            "either `factories` or `workflows`, not both",
        ),
    ];
    for (i, (definition, expected)) in cases.iter().enumerate() {
        let file = state.path().join(format!("bad{i}.js"));
        let text = format!(
            "import {{ defineFactory, defineWorkflow, joinSession }} from \"factory\";\nexport default {definition};\n"
        );
        std::fs::write(&file, text).unwrap();
        let refused = describe(state.path(), file.to_str().unwrap()).expect_err("refused");
        assert!(refused.contains(expected), "case {i}: {refused}");
    }
    // The host checks a budget the same way for every language, overrides included.
    let file = js_factory_file(state.path(), "fine", r#"{ name: "fine", description: "d" }"#, "async () => 1");
    for (credits, expected) in [("0.0000000001", "rounds to zero nano-credits"), ("10000000", "largest safe integer")] {
        let out = factory_in(state.path(), &["run", file.to_str().unwrap(), "--max-ai-credits", credits, "-q"]);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(stderr(&out).contains(expected), "{}", stderr(&out));
    }
}

#[test]
fn results_and_step_values_that_are_not_plain_json_are_refused_naming_the_path() {
    let state = tempfile::tempdir().unwrap();
    let results = [
        ("getter", "({ a: { get b() { return 1; } } })", "result.a.b is an accessor property"),
        (
            "hidden",
            "Object.defineProperty({ a: 1 }, \"h\", { value: 2, enumerable: false })",
            "result.h is a non-enumerable property",
        ),
        ("extra", "Object.assign([1, 2], { extra: true })", "result is an array with an extra key `extra`"),
        ("hole", "({ list: [1, , 3] })", "result.list[1] is a hole in a sparse array"),
        ("class", "({ when: new (class Stamp {})() })", "result.when is a Stamp"),
    ];
    for (name, value, expected) in results {
        let file = js_factory_file(
            state.path(),
            name,
            &format!(r#"{{ name: "{name}", description: "d" }}"#),
            &format!("async () => {value}"),
        );
        let out = factory_in(state.path(), &["run", file.to_str().unwrap(), "--json", "-q"]);
        let envelope = stdout_json(&out);
        assert_eq!(envelope["status"], "error", "{name}: {envelope:#}");
        assert_eq!(envelope["failure"]["type"], "invalid_result", "{name}: {envelope:#}");
        assert!(envelope["failure"]["message"].as_str().unwrap().contains(expected), "{name}: {envelope:#}");
    }
    // A step value: the step rejects (a TypeError naming the path) and nothing is journaled.
    let file = js_factory_file(
        state.path(),
        "step",
        r#"{ name: "step", description: "d" }"#,
        r#"async (ctx) => {
            const refused = await ctx.step("s", () => ({ v: { get x() { return 1; } } })).catch((e) => `${e.name}: ${e.message}`);
            const again = await ctx.step("s", () => ({ v: { x: 1 } }));
            return { refused, again };
        }"#,
    );
    let out = factory_in(state.path(), &["run", file.to_str().unwrap(), "--json", "-q"]);
    let envelope = stdout_json(&out);
    assert_eq!(envelope["status"], "completed", "{envelope:#}");
    let refused = envelope["result"]["refused"].as_str().unwrap();
    assert!(refused.starts_with("TypeError: ctx.step(\"s\") value.v.x is an accessor property"), "{refused}");
    assert_eq!(envelope["result"]["again"], serde_json::json!({ "v": { "x": 1 } }));
}

#[test]
fn ctx_session_refuses_to_run_resume_or_pause_from_a_body() {
    let state = tempfile::tempdir().unwrap();
    let file = js_factory_file(
        state.path(),
        "session",
        r#"{ name: "session", description: "d" }"#,
        r#"async (ctx) => {
            const s = ctx.session;
            const why = (p) => p.then(() => "resolved", (e) => e.message);
            return {
                runId: s.runId === ctx.runId,
                run: await why(s.factory.run("other")),
                resume: await why(s.workflow.resume("x")),
                pause: await why(s.workflow.pause("x")),
                read: await why(s.factory.getRun(ctx.runId)),
                nested: await why(ctx.workflow("other")),
            };
        }"#,
    );
    let out = factory_in(state.path(), &["run", file.to_str().unwrap(), "--json", "-q"]);
    let envelope = stdout_json(&out);
    assert_eq!(envelope["status"], "completed", "{envelope:#}");
    let r = &envelope["result"];
    assert_eq!(r["runId"], true);
    let refusal = "are not allowed while a factory body is running on this call path.";
    assert!(r["run"].as_str().unwrap().ends_with(refusal), "{r:#}");
    assert!(
        r["resume"].as_str().unwrap().ends_with("are not allowed while a workflow body is running on this call path."),
        "{r:#}"
    );
    assert!(
        r["pause"]
            .as_str()
            .unwrap()
            .starts_with("session.workflow.run, session.workflow.resume and session.workflow.pause"),
        "{r:#}"
    );
    assert!(r["read"].as_str().unwrap().contains("factory show"), "{r:#}");
    assert_eq!(r["nested"], "nested workflows are not supported");
}
