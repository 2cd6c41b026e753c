//! Logs, traces and metrics (issue 23), through the real `factory` binary.
//!
//! Logs: `RUST_LOG` filters what is written, `--log-format json` writes one JSON object per
//! line, and `factory serve` writes its log to `<state-dir>/serve.log` (owner-only, rotated
//! past its bound) with every refusal as one structured event.

mod common;

use common::factory_cmd;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};

/// A `factory serve --http` on a free loopback port; SIGTERM when dropped.
struct Served {
    child: Child,
    base: String,
    token: String,
    stderr: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

impl Served {
    /// Its stderr lines so far.
    fn stderr(&self) -> Vec<String> {
        self.stderr.lock().unwrap().clone()
    }
}

/// Start `factory serve --http 127.0.0.1:0 EXTRA` on `state` with `env` set.
fn serve(state: &Path, extra: &[&str], env: &[(&str, &str)]) -> Served {
    let mut args = vec!["serve", "--http", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let mut cmd = factory_cmd(state, &args);
    cmd.env_remove("RUST_LOG")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    cmd.env_remove("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("factory serve starts");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let base = loop {
        let line = lines.next().expect("serve says where it listens").unwrap();
        seen.lock().unwrap().push(line.clone());
        if let Some(rest) = line.split("HTTP API on http://").nth(1) {
            break format!("http://{}", rest.split("/api/").next().unwrap());
        }
    };
    let keep = seen.clone();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            keep.lock().unwrap().push(line);
        }
    });
    let token = std::fs::read_to_string(state.join("http.token")).expect("the token file");
    Served { child, base, token, stderr: seen }
}

fn mode(path: &Path) -> u32 {
    std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(path).unwrap().permissions()) & 0o777
}

/// The JSON objects among `lines` (plain banner lines are not log events).
fn json_lines<'a>(lines: impl IntoIterator<Item = &'a str>) -> Vec<Value> {
    lines
        .into_iter()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("a log line that is not JSON ({e}): {l}")))
        .collect()
}

/// Ask the API without a token: refused (401), which the service logs.
async fn refused_call(served: &Served) {
    let status = reqwest::Client::new().get(format!("{}/api/runs", served.base)).send().await.unwrap().status();
    assert_eq!(status.as_u16(), 401);
}

fn refusals(events: &[Value]) -> Vec<&Value> {
    events.iter().filter(|e| e["fields"]["event"] == "refused").collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_logs_refusals_as_json_lines_to_stderr_and_its_owner_only_log_file() {
    let state = tempfile::tempdir().unwrap();
    let served = serve(state.path(), &["--log-format", "json"], &[]);
    refused_call(&served).await;
    let log_path = state.path().join("serve.log");
    assert_eq!(mode(&log_path), 0o600, "the service log is its owner's only");
    let log = std::fs::read_to_string(&log_path).unwrap();
    let events = json_lines(log.lines());
    let refused = refusals(&events);
    assert_eq!(refused.len(), 1, "one event per refusal: {log}");
    let event = refused[0];
    assert_eq!(event["level"], "WARN");
    assert_eq!(event["fields"]["door"], "http");
    assert_eq!(event["fields"]["path"], "/api/runs");
    assert!(
        event["timestamp"].is_string() && event["target"].as_str().is_some_and(|t| t.starts_with("factory")),
        "{event}"
    );
    assert!(!log.contains(&served.token), "the token is never logged");
    // The same event on stderr, as JSON.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let lines = served.stderr();
        let events = json_lines(lines.iter().map(String::as_str));
        if refusals(&events).len() == 1 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no refusal on stderr: {lines:?}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_log_filters_what_the_service_logs() {
    // `error` hides the warning; the default (warn for dependencies, info for ours) shows it,
    // in the human format by default.
    let quiet = tempfile::tempdir().unwrap();
    let served = serve(quiet.path(), &[], &[("RUST_LOG", "error")]);
    refused_call(&served).await;
    let log = std::fs::read_to_string(quiet.path().join("serve.log")).unwrap();
    assert!(!log.contains("refused"), "RUST_LOG=error hides warnings: {log}");
    drop(served);

    let loud = tempfile::tempdir().unwrap();
    let served = serve(loud.path(), &[], &[]);
    refused_call(&served).await;
    let log = std::fs::read_to_string(loud.path().join("serve.log")).unwrap();
    // serve.log is JSON lines whatever the format; stderr is human by default.
    let events = json_lines(log.lines());
    assert_eq!(log.lines().count(), events.len(), "every line of serve.log is a record: {log}");
    let refused = refusals(&events);
    assert_eq!(
        (refused.len(), &refused[0]["level"], &refused[0]["fields"]["door"]),
        (1, &Value::from("WARN"), &Value::from("http")),
        "{log}"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let line = loop {
        if let Some(line) = served.stderr().into_iter().find(|l| l.contains("without a valid bearer token")) {
            break line;
        }
        assert!(std::time::Instant::now() < deadline, "no refusal on stderr: {:?}", served.stderr());
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert!(line.contains("WARN") && line.contains("event=\"refused\"") && line.contains("door=\"http\""), "{line}");
    assert!(!line.starts_with('{'), "human format by default on stderr: {line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_log_is_rotated_past_its_bound() {
    let state = tempfile::tempdir().unwrap();
    let log_path = state.path().join("serve.log");
    // A log already past the bound (8 MiB) from earlier services.
    std::fs::write(&log_path, vec![b'x'; (8 << 20) + 1]).unwrap();
    std::fs::set_permissions(&log_path, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let served = serve(state.path(), &[], &[]);
    refused_call(&served).await;
    let old = state.path().join("serve.log.1");
    assert_eq!(std::fs::metadata(&old).unwrap().len(), (8 << 20) + 1, "the full log moved aside whole");
    let now = std::fs::read_to_string(&log_path).unwrap();
    assert!(now.len() < 64 << 10 && now.contains("refused"), "a fresh log: {now}");
    assert_eq!(mode(&log_path), 0o600);
}

#[test]
fn an_unparseable_rust_log_is_said_and_the_default_used() {
    let state = tempfile::tempdir().unwrap();
    let out = factory_cmd(state.path(), &["runs"]).env("RUST_LOG", "factory=notalevel").output().unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    let stderr = common::stderr(&out);
    assert!(stderr.contains("is not a filter"), "{stderr}");
}

// ---- traces ----------------------------------------------------------------------------

/// The OTLP receiver of `tests/otlp/receiver.py` (official `opentelemetry-proto` decoder).
struct Receiver {
    child: Child,
    port: u16,
    out: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Receiver {
    fn start() -> Receiver {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("spans.jsonl");
        let script = common::root().join("tests/otlp/receiver.py");
        let mut child = std::process::Command::new("python3")
            .arg(&script)
            .arg(&out)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python3 runs (apt-get install python3)");
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
        let port = first.trim().parse().unwrap_or_else(|_| {
            let _ = child.kill();
            let mut err = String::new();
            let _ = std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err);
            panic!("the OTLP receiver did not start (pip install opentelemetry-proto==1.45.2, as ./test does): {err}")
        });
        Receiver { child, port, out, _dir: dir }
    }

    /// Every request received so far: (path, content type, spans).
    fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn spans(&self) -> Vec<Value> {
        self.requests().into_iter().flat_map(|r| r["spans"].as_array().cloned().unwrap_or_default()).collect()
    }

    /// Every metric of every `/v1/metrics` request so far, in the order received.
    fn metrics(&self) -> Vec<Value> {
        let mut path = self.out.clone().into_os_string();
        path.push(".metrics");
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let requests: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        for r in &requests {
            assert_eq!(r["contentType"], "application/x-protobuf");
        }
        requests.into_iter().flat_map(|r| r["metrics"].as_array().cloned().unwrap_or_default()).collect()
    }

    fn raw(&self) -> Vec<u8> {
        let mut raw = self.out.clone().into_os_string();
        raw.push(".raw");
        std::fs::read(raw).unwrap_or_default()
    }
}

/// A JS factory: phase `Fan` with `n` agent calls whose prompts carry a marker, then phase
/// `Steps` with one step.
const TRACED: &str = r#"
import { defineFactory } from "factory";
export default defineFactory({
    meta: { name: "traced", description: "a fan-out for traces", phases: [{ title: "Fan" }, { title: "Steps" }] },
    run: async (ctx) => {
        ctx.phase("Fan");
        const out = await ctx.parallel(Array.from({ length: ctx.args.n }, (_, i) => () => ctx.agent(`SECRET-PROMPT-${i} summarise`, { label: `t:${i}` })));
        ctx.phase("Steps");
        const counted = await ctx.step("count", () => out.length);
        return { done: out.filter((x) => x !== null).length, counted };
    },
});
"#;

/// A state dir with `traced` registered and trusted, and a script backend `scripted` that
/// answers every `t:` call with usage.
fn traced_state() -> tempfile::TempDir {
    let state = tempfile::tempdir().unwrap();
    let rules = state.path().join("rules.json");
    std::fs::write(&rules, r#"{"rules":[{"labelPrefix":"t:","reply":{"text":"ok"},"usage":{"inputTokens":12,"outputTokens":3,"credits":0.25}}]}"#).unwrap();
    let config =
        format!("default = \"scripted\"\n[backends.scripted]\nkind = \"script\"\npath = \"{}\"\n", rules.display());
    std::fs::write(state.path().join("factory.toml"), config).unwrap();
    let file = state.path().join("traced.js");
    std::fs::write(&file, TRACED).unwrap();
    for args in [["add", file.to_str().unwrap()], ["trust", file.to_str().unwrap()]] {
        let out = common::factory_in(state.path(), &args);
        assert!(out.status.success(), "{args:?}: {}", common::stderr(&out));
    }
    state
}

fn attr<'a>(span: &'a Value, key: &str) -> &'a Value {
    &span["attributes"][key]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fan_out_run_exports_its_span_tree_over_otlp_continuing_the_callers_trace() {
    const N: usize = 6;
    let receiver = Receiver::start();
    let state = traced_state();
    let endpoint = format!("http://127.0.0.1:{}", receiver.port);
    let served = serve(
        state.path(),
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_SERVICE_NAME", "factory-under-test"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    );
    let caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let client = reqwest::Client::new();
    let started: Value = client
        .post(format!("{}/api/runs", served.base))
        .bearer_auth(&served.token)
        .header("traceparent", format!("00-{caller_trace}-{caller_span}-01"))
        .json(&serde_json::json!({"name": "traced", "args": {"n": N}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let run_id = started["runId"].as_str().unwrap_or_else(|| panic!("{started}")).to_string();
    let envelope: Value = client
        .get(format!("{}/api/runs/{run_id}/wait", served.base))
        .bearer_auth(&served.token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(envelope["status"], "completed", "{envelope}");
    // A bad traceparent is refused, not ignored.
    let bad = client
        .post(format!("{}/api/runs", served.base))
        .bearer_auth(&served.token)
        .header("traceparent", "00-nothex-00f067aa0ba902b7-01")
        .json(&serde_json::json!({"name": "traced", "args": {"n": 1}}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status().as_u16(), 400);
    // Stopping the service exports what is queued.
    drop(served);

    let requests = receiver.requests();
    assert!(!requests.is_empty(), "the receiver got the export");
    for r in &requests {
        assert_eq!(r["path"], "/v1/traces");
        assert_eq!(r["contentType"], "application/x-protobuf");
    }
    let spans = receiver.spans();
    let named = |name: &str| spans.iter().filter(|s| s["name"] == name).collect::<Vec<_>>();
    assert!(
        spans.iter().all(|s| s["resource"]["service.name"] == "factory-under-test"),
        "OTEL_SERVICE_NAME names the service"
    );

    // The run attempt continues the caller's trace.
    let runs = named("run traced");
    assert_eq!(runs.len(), 1, "one span per attempt: {spans:#?}");
    let run = runs[0];
    assert_eq!(run["traceId"], caller_trace, "the caller's trace continues");
    assert_eq!(run["parentSpanId"], caller_span, "under the caller's span");
    assert_eq!(attr(run, "factory.name"), "traced");
    assert_eq!(attr(run, "factory.run_id"), run_id.as_str());
    assert_eq!(attr(run, "factory.session"), "default");
    assert_eq!(attr(run, "factory.attempt"), 1);
    assert_eq!(attr(run, "factory.status"), "completed");
    let run_id_hex = run["spanId"].as_str().unwrap();

    // Its phases, in it.
    let fan = named("phase Fan");
    let steps = named("phase Steps");
    assert_eq!((fan.len(), steps.len()), (1, 1), "one span per phase");
    for phase in [fan[0], steps[0]] {
        assert_eq!(phase["traceId"], caller_trace);
        assert_eq!(phase["parentSpanId"], run_id_hex, "a phase is a child of its attempt");
    }

    // One span per agent call, in the phase that made it, after the GenAI conventions.
    let agents: Vec<&Value> = spans.iter().filter(|s| attr(s, "gen_ai.operation.name") == "chat").collect();
    assert_eq!(agents.len(), N, "one span per agent call");
    let mut labels: Vec<&str> = agents.iter().map(|a| attr(a, "factory.agent.label").as_str().unwrap()).collect();
    labels.sort();
    let mut expected: Vec<String> = (0..N).map(|i| format!("t:{i}")).collect();
    expected.sort();
    assert_eq!(labels, expected.iter().map(String::as_str).collect::<Vec<_>>());
    for agent in &agents {
        assert_eq!(agent["name"], "chat");
        assert_eq!(agent["parentSpanId"], fan[0]["spanId"], "a call is a child of its phase");
        assert_eq!(agent["traceId"], caller_trace);
        assert_eq!(agent["kind"], 3, "SPAN_KIND_CLIENT");
        assert_eq!(attr(agent, "gen_ai.provider.name"), "script");
        assert_eq!(attr(agent, "gen_ai.usage.input_tokens"), 12);
        assert_eq!(attr(agent, "gen_ai.usage.output_tokens"), 3);
        assert_eq!(attr(agent, "factory.agent.memo"), "miss");
        assert_eq!(attr(agent, "factory.agent.status"), "ok");
        assert!(agent["start"].as_u64() >= run["start"].as_u64() && agent["end"].as_u64() <= run["end"].as_u64());
    }

    // The step, by its key's hash.
    let step_spans = named("step");
    assert_eq!(step_spans.len(), 1, "one span per step lookup");
    assert_eq!(step_spans[0]["parentSpanId"], steps[0]["spanId"]);
    assert_eq!(attr(step_spans[0], "factory.step.hit"), false);
    assert_eq!(attr(step_spans[0], "factory.step.key_hash").as_str().map(str::len), Some(16));

    // Store commits, each a trace of its own.
    let commits = named("store.commit");
    assert!(!commits.is_empty(), "commit spans");
    assert!(commits.iter().all(|c| c["parentSpanId"] == "" && attr(c, "factory.store.ops").as_i64() > Some(0)));

    // Never the prompt.
    let raw = receiver.raw();
    assert!(!raw.is_empty());
    assert!(!raw.windows(b"SECRET-PROMPT".len()).any(|w| w == b"SECRET-PROMPT"), "no prompt text in the export");
    assert!(!raw.windows(b"summarise".len()).any(|w| w == b"summarise"), "no prompt text in the export");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_to_a_postgresql_store_are_traced_as_redb_commits_are() {
    let receiver = Receiver::start();
    let postgres = common::postgres::Postgres::start();
    postgres.database("traced");
    let url = postgres.url("traced");
    let state = traced_state();
    let endpoint = format!("http://127.0.0.1:{}", receiver.port);
    let served = serve(
        state.path(),
        &["--store", &url],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint), ("OTEL_BSP_SCHEDULE_DELAY", "100")],
    );
    let client = reqwest::Client::new();
    let file = state.path().join("traced.js");
    let registered = client
        .post(format!("{}/api/factories", served.base))
        .bearer_auth(&served.token)
        .json(&serde_json::json!({"path": file}))
        .send()
        .await
        .unwrap();
    assert!(registered.status().is_success(), "{}", registered.text().await.unwrap());
    let started: Value = client
        .post(format!("{}/api/runs", served.base))
        .bearer_auth(&served.token)
        .json(&serde_json::json!({"name": "traced", "args": {"n": 2}, "approved": true}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let run_id = started["runId"].as_str().unwrap_or_else(|| panic!("{started}")).to_string();
    let envelope: Value = client
        .get(format!("{}/api/runs/{run_id}/wait", served.base))
        .bearer_auth(&served.token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(envelope["status"], "completed", "{envelope}");
    drop(served);
    let spans = receiver.spans();
    let commits: Vec<&Value> = spans.iter().filter(|s| s["name"] == "store.commit").collect();
    assert!(!commits.is_empty(), "no store.commit span: {:?}", spans.iter().map(|s| &s["name"]).collect::<Vec<_>>());
    assert!(commits.iter().all(|c| attr(c, "factory.store.ops").as_i64().is_some_and(|n| n >= 1)), "{commits:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_collector_fails_no_run() {
    // An endpoint where nothing listens: the run completes all the same.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = dead.local_addr().unwrap().port();
    drop(dead);
    let state = traced_state();
    let endpoint = format!("http://127.0.0.1:{port}");
    let out = factory_cmd(state.path(), &["run", "traced", "--args", r#"{"n": 3}"#, "--json"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .env("OTEL_EXPORTER_OTLP_TIMEOUT", "500")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert_eq!(common::stdout_json(&out)["status"], "completed");
}

// ---- metrics ---------------------------------------------------------------------------

/// `GET /metrics` with the token, parsed by the official Python client's parser
/// (`prometheus_client.parser.text_string_to_metric_families`): each sample as
/// `name{label="value",...}` (labels sorted) -> value.
async fn scrape(served: &Served) -> std::collections::BTreeMap<String, f64> {
    let response =
        reqwest::Client::new().get(format!("{}/metrics", served.base)).bearer_auth(&served.token).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let kind = response.headers()["content-type"].to_str().unwrap().to_string();
    assert!(kind.starts_with("application/openmetrics-text"), "{kind}");
    let text = response.text().await.unwrap();
    const PARSE: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = {}
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
        out[f"{s.name}{{{labels}}}"] = s.value
print(json.dumps(out))
"#;
    let mut child = std::process::Command::new("python3")
        .args(["-c", PARSE])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), text.as_bytes()).unwrap();
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the official parser reads /metrics (pip install prometheus_client==0.26.0, as ./test does): {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn sample(samples: &std::collections::BTreeMap<String, f64>, key: &str) -> f64 {
    samples.get(key).copied().unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_with_a_run_and_need_the_token() {
    const N: f64 = 4.0;
    let state = traced_state();
    let served = serve(state.path(), &[], &[]);
    let client = reqwest::Client::new();
    let anonymous = client.get(format!("{}/metrics", served.base)).send().await.unwrap();
    assert_eq!(anonymous.status().as_u16(), 401, "the same bearer token as the API");
    let before = scrape(&served).await;
    let started: Value = client
        .post(format!("{}/api/runs", served.base))
        .bearer_auth(&served.token)
        .json(&serde_json::json!({"name": "traced", "args": {"n": N as u32}, "limits": {"maxConcurrentSubagents": 2}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let run_id = started["runId"].as_str().unwrap_or_else(|| panic!("{started}")).to_string();
    let envelope: Value = client
        .get(format!("{}/api/runs/{run_id}/wait", served.base))
        .bearer_auth(&served.token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(envelope["status"], "completed", "{envelope}");
    let after = scrape(&served).await;
    let moved = |key: &str| sample(&after, key) - sample(&before, key);
    assert_eq!(moved(r#"factory_run_attempts_ended_total{status="completed"}"#), 1.0, "{after:#?}");
    assert!(after.contains_key(r#"factory_agent_calls_total{backend="script",outcome="ok"}"#), "{after:#?}");
    assert_eq!(moved(r#"factory_agent_calls_total{backend="script",outcome="ok"}"#), N);
    assert_eq!(moved(r#"factory_agent_call_seconds_count{backend="script"}"#), N);
    assert_eq!(moved(r#"factory_agent_queue_wait_seconds_count{backend="script"}"#), N, "every call took a slot");
    assert_eq!(moved(r#"factory_agent_tokens_total{backend="script",direction="input"}"#), 12.0 * N);
    assert_eq!(moved(r#"factory_agent_tokens_total{backend="script",direction="output"}"#), 3.0 * N);
    assert!((moved(r#"factory_ai_credits_total{backend="script"}"#) - 0.25 * N).abs() < 1e-9);
    assert!(moved("factory_store_commit_seconds_count{}") >= 1.0);
    assert!(moved("factory_journal_bytes_total{}") > 0.0);
    assert_eq!(sample(&after, "factory_active_runs{}"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_exported_over_otlp_under_the_names_metrics_serves() {
    const N: u32 = 3;
    let receiver = Receiver::start();
    let state = traced_state();
    let endpoint = format!("http://127.0.0.1:{}", receiver.port);
    let served = serve(
        state.path(),
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_TRACES_EXPORTER", "none"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "200"),
        ],
    );
    let client = reqwest::Client::new();
    let started: Value = client
        .post(format!("{}/api/runs", served.base))
        .bearer_auth(&served.token)
        .json(&serde_json::json!({"name": "traced", "args": {"n": N}, "limits": {"maxConcurrentSubagents": 2}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let run_id = started["runId"].as_str().unwrap_or_else(|| panic!("{started}")).to_string();
    let envelope: Value = client
        .get(format!("{}/api/runs/{run_id}/wait", served.base))
        .bearer_auth(&served.token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(envelope["status"], "completed", "{envelope}");
    let scraped = scrape(&served).await;
    // Stopping the service exports the final values.
    drop(served);
    let exported = receiver.metrics();
    assert!(receiver.spans().is_empty(), "OTEL_TRACES_EXPORTER=none: metrics only");
    // The last export of each metric (cumulative: it holds the totals).
    let mut last = std::collections::BTreeMap::new();
    for metric in &exported {
        last.insert(metric["name"].as_str().unwrap().to_string(), metric.clone());
    }
    let names: Vec<&str> = last.keys().map(String::as_str).collect();
    for expected in [
        "factory_active_runs",
        "factory_agent_call_seconds",
        "factory_agent_calls",
        "factory_agent_queue_wait_seconds",
        "factory_agent_tokens",
        "factory_ai_credits",
        "factory_journal_bytes",
        "factory_run_attempts_ended",
        "factory_store_commit_seconds",
    ] {
        assert!(names.contains(&expected), "{expected} not exported: {names:?}");
        // The same family on /metrics (counters there carry Prometheus's `_total`).
        assert!(
            scraped.keys().any(|k| k.starts_with(&format!("{expected}{{")) || k.starts_with(&format!("{expected}_"))),
            "{expected} not on /metrics"
        );
    }
    let point = |name: &str, attrs: Value| -> Value {
        let metric = &last[name];
        metric["points"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["attributes"] == attrs)
            .cloned()
            .unwrap_or_else(|| panic!("{name} has no point {attrs}: {metric:#}"))
    };
    let calls = &last["factory_agent_calls"];
    assert_eq!((calls["kind"].as_str(), calls["monotonic"].as_bool()), (Some("sum"), Some(true)), "{calls}");
    assert_eq!(calls["temporality"], 2, "cumulative");
    let ok = serde_json::json!({"backend": "script", "outcome": "ok"});
    assert_eq!(point("factory_agent_calls", ok)["value"], N);
    assert_eq!(
        scraped[r#"factory_agent_calls_total{backend="script",outcome="ok"}"#],
        f64::from(N),
        "the same value on /metrics"
    );
    assert_eq!(point("factory_run_attempts_ended", serde_json::json!({"status": "completed"}))["value"], 1);
    assert_eq!(
        point("factory_agent_tokens", serde_json::json!({"backend": "script", "direction": "input"}))["value"],
        12 * N
    );
    let credits = point("factory_ai_credits", serde_json::json!({"backend": "script"}))["value"].as_f64().unwrap();
    assert!((credits - 0.25 * f64::from(N)).abs() < 1e-9, "{credits}");
    // Histograms: the spawns counted, with /metrics' bucket bounds.
    let latency = point("factory_agent_call_seconds", serde_json::json!({"backend": "script"}));
    assert_eq!(last["factory_agent_call_seconds"]["kind"], "histogram");
    assert_eq!(latency["count"], N);
    let bounds: Vec<f64> = latency["bounds"].as_array().unwrap().iter().map(|b| b.as_f64().unwrap()).collect();
    let expected: Vec<f64> = (0..18).map(|i| 0.001 * 2f64.powi(i)).collect();
    assert_eq!(bounds.len(), expected.len());
    assert!(bounds.iter().zip(&expected).all(|(a, b)| (a - b).abs() < 1e-12), "{bounds:?}");
    assert!(
        scraped.contains_key(r#"factory_agent_call_seconds_bucket{backend="script",le="0.001"}"#),
        "the same bounds on /metrics"
    );
    assert_eq!(last["factory_active_runs"]["kind"], "gauge");
    assert_eq!(point("factory_active_runs", serde_json::json!({}))["value"], 0);
}

#[test]
fn an_mcp_call_continues_the_trace_in_its_meta_traceparent() {
    let receiver = Receiver::start();
    let state = traced_state();
    let endpoint = format!("http://127.0.0.1:{}", receiver.port);
    let mut mcp = factory_cmd(state.path(), &["mcp"])
        .env_remove("RUST_LOG")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("factory mcp starts");
    let trace = "0af7651916cd43dd8448eb211c80319c";
    let parent = "b7ad6b7169203331";
    let mut stdin = mcp.stdin.take().unwrap();
    let mut stdout = BufReader::new(mcp.stdout.take().unwrap()).lines();
    let mut send = move |message: Value| {
        std::io::Write::write_all(&mut stdin, format!("{message}\n").as_bytes()).unwrap();
    };
    let mut answer = |id: u64| loop {
        let line = stdout.next().expect("an answer").unwrap();
        let message: Value = serde_json::from_str(&line).unwrap();
        if message["id"] == id {
            break message;
        }
    };
    send(serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "traced-client", "version": "1"}}}));
    answer(1);
    send(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    send(serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "run_factory", "arguments": {"name": "traced", "args": {"n": 2}},
                   "_meta": {"traceparent": format!("00-{trace}-{parent}-01")}}}));
    let called = answer(2);
    assert_ne!(called["result"]["isError"], true, "{called}");
    send(serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "run_factory", "arguments": {"name": "traced", "args": {"n": 1}}, "_meta": {"traceparent": "00-bad"}}}));
    let refused = answer(3);
    assert!(refused.to_string().contains("traceparent"), "a bad traceparent is refused: {refused}");
    drop(send);
    assert!(mcp.wait().unwrap().success());
    let spans = receiver.spans();
    let run = spans.iter().find(|s| s["name"] == "run traced").unwrap_or_else(|| panic!("{spans:#?}"));
    assert_eq!((run["traceId"].as_str(), run["parentSpanId"].as_str()), (Some(trace), Some(parent)));
    let calls = spans.iter().filter(|s| s["traceId"] == trace && attr(s, "gen_ai.operation.name") == "chat").count();
    assert_eq!(calls, 2);
}

// ---- backend flows ---------------------------------------------------------------------

/// A state dir with `traced` registered and trusted, and as its default backend `local`, an
/// OpenAI-compatible server on `port` paced at `requests_per_minute` by the backend's flow.
fn flow_state(port: u16, requests_per_minute: u32) -> tempfile::TempDir {
    let state = traced_state();
    let config = format!(
        "default = \"local\"\n[backends.local]\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"m-test\"\n\
         max_retries = 1\nretry_base_ms = 5\nrequests_per_minute = {requests_per_minute}\n",
        common::fake_openai::base_url(port)
    );
    std::fs::write(state.path().join("factory.toml"), config).unwrap();
    state
}

/// The progress entries of `run_id` as the store keeps them (`factory progress --json`).
fn journaled_events(state: &Path, run_id: &str) -> Vec<String> {
    let out = common::factory_in(state, &["progress", run_id, "--limit", "1000", "--json"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let entries = common::stdout_json(&out);
    entries.as_array().unwrap().iter().map(|e| e["event"].as_str().unwrap().to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fan_out_paced_by_its_backend_says_on_stderr_how_many_calls_wait_and_why_and_journals_none_of_it() {
    use common::fake_openai::{FakeOpenAi, Mode};
    const N: usize = 12;
    let server = FakeOpenAi::start(Mode::Answer { latency: std::time::Duration::ZERO }).await;
    // 2 requests a second: a burst of 2, then the other calls wait for the rate.
    let state = flow_state(server.port(), 120);
    let args = format!(r#"{{"n": {N}}}"#);
    let out = common::factory_clean(state.path(), &["run", "traced", "--args", &args, "--json"], &[]).await;
    let stderr = common::stderr(&out);
    assert!(out.status.success(), "{stderr}");
    let envelope = common::stdout_json(&out);
    assert_eq!(envelope["result"]["done"], N, "{envelope:#}");
    assert_eq!(server.answered().len(), N);
    // Plain lines (stderr is not a terminal): the queue, its backend and why it waits.
    let flow_lines: Vec<&str> = stderr.lines().filter(|l| l.contains("] flow: ")).collect();
    assert!(
        flow_lines.iter().any(|l| l.contains(" queued: `local` at 2.0 req/s")),
        "a line says how many calls wait for `local` and at what rate: {stderr}"
    );
    // Live only: the journal has none of it.
    let events = journaled_events(state.path(), envelope["runId"].as_str().unwrap());
    assert!(events.iter().any(|e| e == "agentFinished"), "{events:?}");
    assert!(!events.iter().any(|e| e == "flows"), "flow states are not journaled: {events:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wide_fan_out_against_a_throttling_provider_says_how_many_calls_wait_for_it() {
    use common::throttling::{Limits, Throttling};
    const N: usize = 120;
    let server = Throttling::start(Limits::rps(20.0)).await;
    let state = tempfile::tempdir().unwrap();
    // No rate configured: the flow learns it from the provider's headers and 429s.
    let config = format!(
        "default = \"limited\"\n[backends.limited]\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"\n\
         [backends.limited.pricing]\ninput = 0\noutput = 0\n",
        server.base_url()
    );
    common::config_file(&state.path().join("factory.toml"), &config);
    let args = [
        "run",
        &common::probe_arg(),
        "--yes",
        "--args",
        &common::fanout_args(N),
        "--max-concurrent-subagents",
        "64",
        "--max-total-subagents",
        "1000",
        "--json",
    ];
    let out = common::factory_clean(state.path(), &args, &[]).await;
    let stderr = common::stderr(&out);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(common::stdout_json(&out)["result"]["done"], N, "{stderr}");
    assert!(
        stderr.lines().any(|l| l.contains("] flow: ") && l.contains(" queued: `limited` ")),
        "a line says how many calls wait for `limited`: {stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_served_fan_out_shows_its_queue_to_the_cli_in_run_detail_in_metrics_and_as_wait_spans() {
    use common::fake_openai::{FakeOpenAi, Mode};
    use std::time::{Duration, Instant};
    const N: usize = 16;
    let receiver = Receiver::start();
    // Three answers, then 429 with `retry-after-ms` until the test lets the server answer again.
    let server = FakeOpenAi::start(Mode::AnswerThen { ok: 3, then: Box::new(Mode::RetryAfterMs("300")) }).await;
    let state = flow_state(server.port(), 120);
    let endpoint = format!("http://127.0.0.1:{}", receiver.port);
    let served =
        serve(state.path(), &[], &[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint), ("OTEL_BSP_SCHEDULE_DELAY", "100")]);

    // The CLI hands the run to the service and follows it there (plain lines on stderr).
    let events = state.path().join("events.jsonl");
    let args = format!(r#"{{"n": {N}}}"#);
    let mut cmd =
        factory_cmd(state.path(), &["run", "traced", "--args", &args, "--events", events.to_str().unwrap(), "--json"]);
    let cli = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("factory run starts");
    let cli = tokio::task::spawn_blocking(move || cli.wait_with_output());

    let deadline = Instant::now() + Duration::from_secs(120);
    let run_id = loop {
        let text = std::fs::read_to_string(&events).unwrap_or_default();
        if let Some(id) = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find_map(|e| e["runId"].as_str().map(String::from))
        {
            break id;
        }
        assert!(Instant::now() < deadline, "the run never started: {text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Pushed back once at least: the server answers again.
    while server.requests() < 5 {
        assert!(Instant::now() < deadline, "the server got {} requests", server.requests());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.set(Mode::Answer { latency: Duration::ZERO });

    // While calls wait: the run's detail (HTTP and `factory show`) and /metrics say so.
    let client = reqwest::Client::new();
    let (mut in_detail, mut in_show, mut in_metrics) = (None, false, false);
    while in_detail.is_none() || !in_show || !in_metrics {
        let detail: Value = client
            .get(format!("{}/api/runs/{run_id}", served.base))
            .bearer_auth(&served.token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(
            detail["status"],
            "running",
            "the run ended before its queue was seen: detail {}, show {in_show}, metrics {in_metrics}",
            in_detail.is_some()
        );
        if let Some(flow) = detail["flows"].as_array().and_then(|f| f.iter().find(|f| f["queued"].as_u64() > Some(0))) {
            in_detail = Some(flow.clone());
        }
        let show = common::factory_in(state.path(), &["show", &run_id]);
        let text = String::from_utf8_lossy(&show.stdout).into_owned();
        in_show |= text.lines().any(|l| l.starts_with("flow:      local: ") && !l.contains(": 0 queued"));
        in_metrics |= sample(&scrape(&served).await, r#"factory_backend_queue_depth{backend="local"}"#) > 0.0;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let flow = in_detail.unwrap();
    assert_eq!(flow["backend"], "local", "{flow:#}");
    assert_eq!(flow["requestsPerSecond"], 2.0, "{flow:#}");
    assert!(flow["limit"].as_u64() >= Some(1) && flow["inFlight"].is_u64() && flow["waitSeconds"].is_f64(), "{flow:#}");

    let out = cli.await.unwrap().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    assert_eq!(common::stdout_json(&out)["result"]["done"], N);
    assert!(
        stderr.lines().any(|l| l.contains("] flow: ") && l.contains(" queued: `local` ")),
        "the follow stream carried the queue: {stderr}"
    );
    let events = journaled_events(state.path(), &run_id);
    assert!(!events.iter().any(|e| e == "flows"), "flow states are not journaled: {events:?}");
    let detail: Value = client
        .get(format!("{}/api/runs/{run_id}", served.base))
        .bearer_auth(&served.token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(detail.get("flows").is_none(), "a run that ended has no flows: {detail:#}");

    let after = scrape(&served).await;
    assert!(sample(&after, r#"factory_backend_throttled_total{backend="local"}"#) >= 1.0, "{after:#?}");
    assert!(
        sample(&after, r#"factory_backend_flow_wait_seconds_count{backend="local"}"#) >= N as f64,
        "one wait per admission: {after:#?}"
    );
    assert!(sample(&after, r#"factory_backend_flow_wait_seconds_sum{backend="local"}"#) > 0.0, "{after:#?}");
    assert!(sample(&after, r#"factory_backend_concurrency_limit{backend="local"}"#) >= 1.0, "{after:#?}");
    assert!(after.contains_key(r#"factory_backend_queue_depth{backend="local"}"#), "{after:#?}");
    assert_eq!(sample(&after, r#"factory_backend_queue_depth{backend="local"}"#), 0.0, "none waits any more");

    // A `flow.wait` span under each agent call that waited, with its backend and reason.
    drop(served);
    let spans = receiver.spans();
    let agents: Vec<&Value> = spans.iter().filter(|s| attr(s, "gen_ai.operation.name") == "chat").collect();
    assert_eq!(agents.len(), N, "{spans:#?}");
    let waits: Vec<&Value> = spans.iter().filter(|s| s["name"] == "flow.wait").collect();
    assert!(!waits.is_empty(), "calls waited: {:?}", spans.iter().map(|s| &s["name"]).collect::<Vec<_>>());
    for wait in &waits {
        assert_eq!(attr(wait, "factory.backend"), "local", "{wait:#}");
        let reason = attr(wait, "factory.flow.reason").as_str().unwrap_or_default();
        assert!(["request_rate", "server", "concurrency", "queue"].contains(&reason), "{wait:#}");
        assert!(attr(wait, "factory.flow.wait_ms").is_i64(), "{wait:#}");
        assert!(
            agents.iter().any(|a| a["spanId"] == wait["parentSpanId"]),
            "a wait is a child of its agent call: {wait:#}"
        );
    }
    assert!(waits.iter().any(|w| attr(w, "factory.flow.reason") == "request_rate"), "{waits:#?}");
    // The same flow metrics over OTLP (exported once more as the service stopped).
    let exported: Vec<String> =
        receiver.metrics().iter().filter_map(|m| m["name"].as_str().map(String::from)).collect();
    for name in [
        "factory_backend_queue_depth",
        "factory_backend_concurrency_limit",
        "factory_backend_throttled",
        "factory_backend_flow_wait_seconds",
    ] {
        assert!(exported.iter().any(|n| n == name), "{name} not exported: {exported:?}");
    }
}
