//! Pause and checkpoints (issue 51), through the real `factory` binary and its service: a
//! running run paused from the CLI and over HTTP stops cooperatively as `paused` (settled,
//! resumable), and a resume completes it under the same id paying no answered call twice
//! (the backend is a real OpenAI-compatible server on 127.0.0.1 that counts the requests for
//! each prompt); pausing a run that does not run is refused with `not_running`. A factory's
//! checkpoint (`ctx.pause(key)`, a Rust component and a JS file) pauses the run there; the
//! paused envelope names the checkpoint; `factory resume RUN --input JSON` answers it, and
//! the body gets the answer, journaled (a later resume replays it); a run paused at a
//! checkpoint survives a `kill -9` of its service and stays paused (no automatic recovery).

mod common;

use common::fake_openai::{write_config, FakeOpenAi, Mode};
use common::service::Service;
use common::{factory_in, stderr, stdout_json};
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

/// Long enough that a held request is still open when the test pauses the run.
const HELD: Duration = Duration::from_secs(3600);

/// The fake server on a runtime of its own: it answers the first `ok` calls at once, then
/// holds every request open (so a pause lands with exactly those results journaled).
fn server(ok: usize) -> (tokio::runtime::Runtime, FakeOpenAi) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let server =
        runtime.block_on(FakeOpenAi::start(Mode::AnswerThen { ok, then: Box::new(Mode::Answer { latency: HELD }) }));
    (runtime, server)
}

/// `factory ARGS`'s stdout as JSON, checking it succeeded.
fn ok_json(state: &Path, args: &[&str]) -> Value {
    let out = factory_in(state, args);
    assert!(out.status.success(), "factory {args:?}: {}\n{}", stderr(&out), String::from_utf8_lossy(&out.stdout));
    stdout_json(&out)
}

/// `factory ARGS`'s stdout as JSON, whatever the exit code (`wait` and `run` exit 1 for a
/// run that did not complete).
fn any_json(state: &Path, args: &[&str]) -> Value {
    stdout_json(&factory_in(state, args))
}

/// Hand the probe's `args` on backend `local` to the running service; returns the run id.
fn detach_probe(state: &Path, args: &Value) -> String {
    let probe = common::component("probe");
    let args = args.to_string();
    let argv = [
        "run",
        probe.to_str().unwrap(),
        "--yes",
        "--backend",
        "local",
        "--args",
        &args,
        "--max-concurrent-subagents",
        "2",
        "--detach",
        "-q",
    ];
    let out = factory_in(state, &argv);
    assert!(out.status.success(), "{}", stderr(&out));
    let run_id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(run_id.len(), 36, "the run id is printed: {run_id:?}");
    run_id
}

/// Poll the run until `answered` of its calls have a fresh result recorded and `started`
/// have started.
fn wait_for_calls(state: &Path, run_id: &str, started: usize, answered: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let page = ok_json(state, &["progress", run_id, "--limit", "1000", "--json"]);
        let entries = page.as_array().cloned().unwrap_or_default();
        let count = |pred: &dyn Fn(&Value) -> bool| entries.iter().filter(|e| pred(e)).count();
        let s = count(&|e| e["event"] == "agentStarted");
        let a = count(&|e| e["event"] == "agentFinished" && e["cached"] == false && e["status"] == "ok");
        if s >= started && a >= answered {
            return;
        }
        assert!(Instant::now() < deadline, "only {s} started and {a} answered: {entries:#?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How many requests the server received for `prompt`.
fn asked(server: &FakeOpenAi, prompt: &str) -> usize {
    server.asked().iter().filter(|p| *p == prompt).count()
}

/// The fan-out's prompts the server answered (each a call whose result was journaled).
fn answered_tasks(server: &FakeOpenAi) -> Vec<String> {
    server.answered().into_iter().filter(|p| p.starts_with("task ")).collect()
}

#[test]
fn a_run_paused_from_the_cli_settles_paused_and_resumes_to_completion_paying_no_answered_call_twice() {
    let state = tempfile::tempdir().unwrap();
    let (runtime, server) = server(4);
    write_config(state.path(), server.port(), false, "");
    let service = Service::start(state.path(), &[]);
    let run_id = detach_probe(state.path(), &json!({"case": "fanout", "n": 10}));
    // Four results journaled, two calls held open.
    wait_for_calls(state.path(), &run_id, 6, 4);
    let waiter =
        common::factory_cmd(state.path(), &["wait", &run_id]).stdout(std::process::Stdio::piped()).spawn().unwrap();

    let paused = ok_json(state.path(), &["pause", &run_id]);
    assert_eq!(paused["status"], "paused", "{paused:#}");
    assert_eq!(paused["runId"], run_id.as_str());
    assert_eq!(
        (paused["failure"]["type"].as_str(), paused["failure"]["kind"].as_str()),
        (Some("paused"), Some("caller")),
        "{paused:#}"
    );
    assert!(paused.get("checkpoint").is_none(), "a caller's pause waits at no checkpoint: {paused:#}");
    assert!(paused.get("result").is_none());
    // `wait` settles on it.
    let waited = waiter.wait_with_output().unwrap();
    assert_eq!(stdout_json(&waited)["status"], "paused");
    let shown = ok_json(state.path(), &["show", &run_id, "--json"]);
    assert_eq!(shown["status"], "paused");
    let listed = ok_json(state.path(), &["runs", "--json"]);
    assert_eq!(listed[0]["status"], "paused", "{listed:#}");
    let before = answered_tasks(&server);
    assert_eq!(before.len(), 4, "{before:?}");
    let active = shown["accounting"]["activeSeconds"].as_f64().unwrap();

    // The service is killed with -9: the run stays paused, its active time stopped, and the
    // next service does not resume it by itself.
    let log = service.kill();
    assert!(!log.contains("recovering run"), "{log}");
    let service = Service::start(state.path(), &[]);
    let still = ok_json(state.path(), &["show", &run_id, "--json"]);
    assert_eq!((still["status"].as_str(), still["attempts"].as_u64()), (Some("paused"), Some(1)), "{still:#}");
    assert_eq!(still["accounting"]["activeSeconds"].as_f64(), Some(active), "no active time while paused");

    // Pausing it again, or a run that does not exist, is refused with a clear code.
    let again = factory_in(state.path(), &["pause", &run_id]);
    assert!(!again.status.success());
    assert!(stderr(&again).contains("not_running"), "{}", stderr(&again));
    let unknown = factory_in(state.path(), &["pause", "0192f3c4-0000-7000-8000-000000000000"]);
    assert!(!unknown.status.success());
    assert!(stderr(&unknown).contains("not_found"), "{}", stderr(&unknown));
    // An answer is for a run that waits at a checkpoint, which this one does not.
    let refused = factory_in(state.path(), &["resume", &run_id, "--yes", "--input", "true", "--json"]);
    assert!(!refused.status.success());
    assert!(stderr(&refused).contains("not_at_checkpoint"), "{}", stderr(&refused));

    // Resumed with the backend answering: completed under the same id.
    server.set(Mode::Answer { latency: Duration::ZERO });
    let done = ok_json(state.path(), &["resume", &run_id, "--yes", "--json"]);
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(done["runId"], run_id.as_str());
    assert_eq!(done["result"]["done"], 10);
    assert_eq!(done["attempts"], 2);
    assert!(done["accounting"]["agentCacheHits"].as_u64().unwrap() >= 4, "{done:#}");
    for prompt in &before {
        assert_eq!(asked(&server, prompt), 1, "`{prompt}` was answered before the pause: never asked again");
    }
    let mut all = answered_tasks(&server);
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 10, "every call answered once: {all:?}");
    service.stop();
    drop(runtime);
}

/// `factory serve --http 127.0.0.1:0` on `state`: the service and its API's base URL.
fn serve_http(state: &Path) -> (Service, String, String) {
    let service = Service::start(state, &["--http", "127.0.0.1:0"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let base = loop {
        let log = service.log();
        if let Some(rest) = log.split("HTTP API on http://").nth(1) {
            break format!("http://{}", rest.split("/api/").next().unwrap());
        }
        assert!(Instant::now() < deadline, "no HTTP address in the log: {log}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let token = std::fs::read_to_string(state.join("http.token")).expect("the token file");
    (service, base, token)
}

#[test]
fn a_run_paused_over_http_resumes_to_completion_and_a_run_not_running_is_refused_with_409() {
    let state = tempfile::tempdir().unwrap();
    let (runtime, server) = server(3);
    write_config(state.path(), server.port(), false, "");
    let (service, base, token) = serve_http(state.path());
    let run_id = detach_probe(state.path(), &json!({"case": "fanout", "n": 8}));
    wait_for_calls(state.path(), &run_id, 5, 3);

    let call = |method: reqwest::Method, path: String, body: Option<Value>| {
        let client = reqwest::Client::new();
        let mut request = client.request(method, format!("{base}{path}")).bearer_auth(&token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        runtime.block_on(async move {
            let response = request.send().await.expect("the API answers");
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap_or(Value::Null))
        })
    };
    let (status, paused) = call(reqwest::Method::POST, format!("/api/runs/{run_id}/pause"), None);
    assert_eq!(status, 200, "{paused:#}");
    assert_eq!(paused["status"], "paused", "{paused:#}");
    let before = answered_tasks(&server);
    assert_eq!(before.len(), 3, "{before:?}");
    let (status, again) = call(reqwest::Method::POST, format!("/api/runs/{run_id}/pause"), None);
    assert_eq!((status, again["code"].as_str()), (409, Some("not_running")), "{again:#}");

    server.set(Mode::Answer { latency: Duration::ZERO });
    let (status, started) =
        call(reqwest::Method::POST, format!("/api/runs/{run_id}/resume"), Some(json!({"approved": true})));
    assert_eq!(status, 202, "{started:#}");
    let (_, done) = call(reqwest::Method::GET, format!("/api/runs/{run_id}/wait"), None);
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(done["result"]["done"], 8);
    for prompt in &before {
        assert_eq!(asked(&server, prompt), 1, "`{prompt}` was answered before the pause: never asked again");
    }
    service.stop();
}

#[test]
fn a_rust_checkpoint_pauses_the_run_and_resume_input_is_the_answer_journaled_across_resumes_and_a_kill_9() {
    let state = tempfile::tempdir().unwrap();
    let (_runtime, server) = server(usize::MAX);
    write_config(state.path(), server.port(), false, "");
    let service = Service::start(state.path(), &[]);
    let run_id = detach_probe(state.path(), &json!({"case": "checkpoint"}));
    let paused = any_json(state.path(), &["wait", &run_id]);
    assert_eq!(paused["status"], "paused", "{paused:#}");
    assert_eq!(paused["checkpoint"], "approve", "the envelope names the checkpoint: {paused:#}");
    assert_eq!(paused["failure"]["kind"], "checkpoint");
    assert!(paused["failure"]["message"].as_str().unwrap().contains("--input"), "it says how to answer: {paused:#}");
    let show = factory_in(state.path(), &["show", &run_id]);
    assert!(
        String::from_utf8_lossy(&show.stdout).contains("waits at:  checkpoint approve"),
        "{}",
        String::from_utf8_lossy(&show.stdout)
    );
    assert_eq!(server.requests(), 1, "only the call before the checkpoint ran");

    // The service is killed: the run stays paused at its checkpoint (nothing recovers it).
    let log = service.kill();
    assert!(!log.contains("recovering run"), "{log}");
    let service = Service::start(state.path(), &[]);
    std::thread::sleep(Duration::from_millis(500));
    let still = ok_json(state.path(), &["show", &run_id, "--json"]);
    assert_eq!(
        (still["status"].as_str(), still["checkpoint"].as_str()),
        (Some("paused"), Some("approve")),
        "{still:#}"
    );
    assert_eq!(still["attempts"], 1, "not resumed by itself: {still:#}");
    assert!(!service.log().contains("recovering run"), "{}", service.log());

    // Not JSON, or an answer over 64 KiB, is refused before anything runs.
    let big = serde_json::to_string(&"x".repeat(70 << 10)).unwrap();
    let over = factory_in(state.path(), &["resume", &run_id, "--yes", "--input", &big]);
    assert!(!over.status.success());
    assert!(stderr(&over).contains("invalid_input"), "{}", stderr(&over));
    let bad = factory_in(state.path(), &["resume", &run_id, "--yes", "--input", "{nope"]);
    assert!(!bad.status.success());
    assert!(stderr(&bad).contains("not JSON"), "{}", stderr(&bad));
    let done = ok_json(
        state.path(),
        &["resume", &run_id, "--yes", "--input", r#"{"approved": true, "note": "ship it"}"#, "--json"],
    );
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(done["result"]["answer"], json!({"approved": true, "note": "ship it"}), "{done:#}");
    assert_eq!(done["result"]["plan"], "real answer to: plan the work", "the first call replayed: {done:#}");
    let inner = done["result"]["inner"].as_str().unwrap_or_default();
    assert!(
        inner.starts_with("refused: ") && inner.contains("main flow"),
        "a checkpoint inside parallel is refused: {done:#}"
    );
    assert_eq!(asked(&server, "plan the work"), 1, "the call before the checkpoint was paid once");
    assert!(done.get("checkpoint").is_none(), "{done:#}");
    service.stop();

    // A run paused at its checkpoint and resumed without an answer: ctx.pause returns none.
    let service = Service::start(state.path(), &[]);
    let other = detach_probe(state.path(), &json!({"case": "checkpoint"}));
    assert_eq!(any_json(state.path(), &["wait", &other])["status"], "paused");
    let done = ok_json(state.path(), &["resume", &other, "--yes", "--json"]);
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(done["result"]["answer"], Value::Null, "{done:#}");
    service.stop();
}

/// A JS factory with a checkpoint between two agent calls, which also tries one inside
/// `ctx.parallel` (refused: main flow only) and reports how its `ctx.signal` ended.
const JS_CHECKPOINT: &str = r#"import { defineFactory } from "factory";
export default defineFactory({
  meta: { name: "approve-js", description: "plan, wait for an answer, then work" },
  run: async (ctx) => {
    const plan = await ctx.agent("js plan", { label: "plan" });
    const [inner] = await ctx.parallel([async () => {
      try { await ctx.pause("inside"); return "allowed"; } catch (e) { return `refused: ${e.message}`; }
    }]);
    let reason = null;
    try {
      const answer = await ctx.pause("approve");
      const done = await ctx.agent(`js work: ${JSON.stringify(answer)}`, { label: "work" });
      return { plan, inner, answer, done };
    } catch (e) {
      reason = `${e.name}/${e.kind}/${ctx.signal.aborted}/${ctx.signal.reason?.kind}`;
      ctx.log(`stopped: ${reason}`);
      throw e;
    }
  },
});
"#;

#[test]
fn a_js_checkpoint_pauses_with_an_abort_error_and_returns_the_answer_on_resume() {
    let state = tempfile::tempdir().unwrap();
    let (_runtime, server) = server(usize::MAX);
    write_config(state.path(), server.port(), false, "");
    let file = state.path().join("approve.js");
    std::fs::write(&file, JS_CHECKPOINT).unwrap();
    let file = file.to_str().unwrap();
    let out = factory_in(state.path(), &["run", file, "--yes", "--backend", "local", "--json"]);
    let paused = stdout_json(&out);
    assert_eq!(paused["status"], "paused", "{paused:#}\n{}", stderr(&out));
    assert_eq!(paused["checkpoint"], "approve");
    assert!(stderr(&out).contains("--input"), "the CLI says how to answer: {}", stderr(&out));
    let run_id = paused["runId"].as_str().unwrap().to_string();
    let log = ok_json(state.path(), &["progress", &run_id, "--limit", "1000", "--json"]);
    let lines: Vec<&str> = log.as_array().unwrap().iter().filter_map(|e| e["message"].as_str()).collect();
    assert!(
        lines.contains(&"stopped: AbortError/paused/true/paused"),
        "ctx.pause threw the pause's AbortError and fired ctx.signal: {lines:?}"
    );

    let done = ok_json(state.path(), &["resume", &run_id, "--yes", "--input", r#"["a", 1]"#, "--json"]);
    assert_eq!(done["status"], "completed", "{done:#}");
    let result = &done["result"];
    assert_eq!(result["answer"], json!(["a", 1]), "{done:#}");
    assert_eq!(result["done"], r#"real answer to: js work: ["a",1]"#);
    assert!(
        result["inner"]
            .as_str()
            .unwrap()
            .starts_with("refused: ctx.pause: a checkpoint is not allowed inside ctx.parallel"),
        "{done:#}"
    );
    assert_eq!(asked(&server, "js plan"), 1, "the call before the checkpoint was paid once");
}

/// A Python factory with a checkpoint between two agent calls; it reports the abort it saw.
const PY_CHECKPOINT: &str = r#"from factory_sdk import Abort, Ctx, FactoryError, factory


@factory(name="approve-py", description="plan, wait for an answer, then work")
async def run(ctx: Ctx) -> object:
    plan = await ctx.agent("py plan", label="plan")

    async def inside() -> str:
        try:
            ctx.pause("inside")
            return "allowed"
        except FactoryError as e:
            return f"refused: {e}"

    [inner] = await ctx.parallel([inside])
    try:
        answer = ctx.pause("approve")
    except Abort as e:
        ctx.log(f"stopped: {e.reason} {e.message}")
        raise
    done = await ctx.agent(f"py work: {answer!r}", label="work")
    return {"plan": plan, "answer": answer, "done": done, "inner": inner}
"#;

#[test]
fn a_python_checkpoint_pauses_the_run_and_returns_the_answer_on_resume() {
    let state = tempfile::tempdir().unwrap();
    let (_runtime, server) = server(usize::MAX);
    write_config(state.path(), server.port(), false, "");
    let file = state.path().join("approve.py");
    std::fs::write(&file, PY_CHECKPOINT).unwrap();
    let file = file.to_str().unwrap();
    let out = factory_in(state.path(), &["run", file, "--yes", "--backend", "local", "--json"]);
    assert_eq!(out.status.code(), Some(1), "a paused run is no success: {}", stderr(&out));
    let paused = stdout_json(&out);
    assert_eq!(
        (paused["status"].as_str(), paused["checkpoint"].as_str()),
        (Some("paused"), Some("approve")),
        "{paused:#}\n{}",
        stderr(&out)
    );
    let run_id = paused["runId"].as_str().unwrap().to_string();
    let log = ok_json(state.path(), &["progress", &run_id, "--limit", "1000", "--json"]);
    let lines: Vec<&str> = log.as_array().unwrap().iter().filter_map(|e| e["message"].as_str()).collect();
    assert!(lines.contains(&"stopped: paused approve"), "ctx.pause raised the pause's Abort: {lines:?}");

    let done = ok_json(state.path(), &["resume", &run_id, "--yes", "--input", r#"{"n": 3}"#, "--json"]);
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(done["result"]["answer"], json!({"n": 3}), "{done:#}");
    assert_eq!(done["result"]["done"], "real answer to: py work: {'n': 3}");
    let inner = done["result"]["inner"].as_str().unwrap_or_default();
    assert!(
        inner.starts_with("refused: ") && inner.contains("main flow"),
        "a checkpoint inside parallel is refused: {done:#}"
    );
    assert_eq!(asked(&server, "py plan"), 1, "the call before the checkpoint was paid once");
}

#[test]
fn a_typescript_checkpoint_returns_the_answer_on_resume() {
    let state = tempfile::tempdir().unwrap();
    let (_runtime, server) = server(usize::MAX);
    write_config(state.path(), server.port(), false, "");
    let file = state.path().join("approve.ts");
    let source = r#"import { defineFactory } from "factory";
interface Approval { approved: boolean }
export default defineFactory({
  meta: { name: "approve-ts", description: "wait for an answer" },
  run: async (ctx) => {
    const approval: Approval | null = await ctx.pause<{ approved: boolean }>("approve");
    return { approved: approval?.approved ?? null };
  },
});
"#;
    std::fs::write(&file, source).unwrap();
    let out = factory_in(state.path(), &["run", file.to_str().unwrap(), "--yes", "--backend", "local", "--json"]);
    let paused = stdout_json(&out);
    assert_eq!(
        (paused["status"].as_str(), paused["checkpoint"].as_str()),
        (Some("paused"), Some("approve")),
        "{paused:#}"
    );
    let run_id = paused["runId"].as_str().unwrap().to_string();
    let done = ok_json(state.path(), &["resume", &run_id, "--yes", "--input", r#"{"approved": false}"#, "--json"]);
    assert_eq!(done["result"], json!({"approved": false}), "{done:#}");
    assert_eq!(server.requests(), 0);
}
