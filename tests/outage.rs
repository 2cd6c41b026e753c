//! Resume never fakes an answer, and an outage never passes for one (issue 9): the backend
//! is part of the run (recorded, reused by a plain `factory resume`, also through
//! `factory serve`, and a resume whose backend cannot be built fails before it starts);
//! a backend that is down, refuses the key, lacks the model or keeps failing stops the
//! attempt with `failure.type = "backend"` and journals nothing for the failed calls;
//! budgets bind on unpriced models; nothing a server sends panics the host; a panic inside
//! an attempt does not wedge the run; a resume re-asks for consent; and `null` is a result.
//!
//! The backend is a real OpenAI-compatible HTTP server on 127.0.0.1
//! (`common::fake_openai`), driven through the real `factory` binary.

mod common;

use common::counting::{Counting, Shared};
use common::fake_openai::{base_url, write_config, FakeOpenAi, Mode};
use common::{factory_cmd, stderr, stdout_json};
use factory_host::backend::{AgentBackend, AgentReply, AgentRequest, BackendError};
use factory_host::{Error, Host, HostConfig, Limits, ResumeOptions, RunOptions, RunStatus};
use futures::future::BoxFuture;
use serde_json::{json, Value};
use std::path::Path;
use std::process::{Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Run the binary against `state` (stdin closed) and wait for it, off the async runtime.
async fn factory(state: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    common::factory_clean(state, args, env).await
}

use common::{fanout_args as fanout, probe_arg as probe};

/// Each of the probe's `n` fan-out prompts was answered by the server exactly once.
fn each_answered_once(server: &FakeOpenAi, n: usize) {
    let answered = server.answered();
    for i in 0..n {
        let prompt = format!("task {i}");
        let times = answered.iter().filter(|p| **p == prompt).count();
        assert_eq!(times, 1, "`{prompt}` answered {times} times; answered: {answered:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_kind_of_outage_stops_the_attempt_and_a_plain_resume_retries_only_the_unanswered_calls() {
    let cases = [(401, "auth"), (404, "model_not_found"), (503, "server_error")];
    for (status, kind) in cases {
        let state = tempfile::tempdir().unwrap();
        // Three calls are answered, then the server fails every request.
        let server = FakeOpenAi::start(Mode::AnswerThen { ok: 3, then: Box::new(Mode::Status(status)) }).await;
        write_config(state.path(), server.port(), false, "");
        let n = 8;
        let run = [
            "run",
            &probe(),
            "--yes",
            "--backend",
            "local",
            "--args",
            &fanout(n),
            "--max-concurrent-subagents",
            "1",
            "--json",
            "-q",
        ];
        let out = factory(state.path(), &run, &[]).await;
        assert_eq!(out.status.code(), Some(1), "HTTP {status}: {}", stderr(&out));
        let envelope = stdout_json(&out);
        assert_eq!(envelope["status"], "error", "HTTP {status}: {envelope:#}");
        assert_eq!(envelope["failure"]["type"], "backend", "HTTP {status}: {envelope:#}");
        assert_eq!(envelope["failure"]["kind"], kind, "HTTP {status}: {envelope:#}");
        assert!(envelope["failure"]["message"].as_str().unwrap().contains(&format!("HTTP {status}")), "{envelope:#}");
        assert_eq!(envelope["backend"]["name"], "local", "the attempt records its backend: {envelope:#}");
        assert_eq!(server.answered().len(), 3);

        // The server comes back; `factory resume <id>` with no flags goes to it again, and
        // the calls that failed were not journaled as answers (else they would replay null).
        server.set(Mode::Answer { latency: Duration::ZERO });
        let id = envelope["runId"].as_str().unwrap();
        let out = factory(state.path(), &["resume", id, "--yes", "--json", "-q"], &[]).await;
        assert!(out.status.success(), "HTTP {status}: {}", stderr(&out));
        let done = stdout_json(&out);
        assert_eq!(done["status"], "completed", "{done:#}");
        assert_eq!(done["result"]["done"], n, "every item has a real answer: {done:#}");
        assert_eq!(done["backend"]["name"], "local");
        each_answered_once(&server, n);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_is_an_outage_and_factory_serve_resumes_on_the_recorded_backend() {
    let state = tempfile::tempdir().unwrap();
    let port = FakeOpenAi::free_port();
    write_config(state.path(), port, false, "");
    let n = 6;
    let run = ["run", &probe(), "--yes", "--backend", "local", "--args", &fanout(n), "--json", "-q"];
    let started = Instant::now();
    let out = factory(state.path(), &run, &[]).await;
    let envelope = stdout_json(&out);
    assert_eq!(envelope["failure"]["type"], "backend", "{envelope:#}");
    assert_eq!(envelope["failure"]["kind"], "unavailable", "{envelope:#}");
    assert!(started.elapsed() < Duration::from_secs(60), "a dead server stops the run promptly");

    // A daemon started with no backend (its default would be dry-run) holds the store; the
    // resume is handed to it and must go to the recorded backend, now listening.
    let server = FakeOpenAi::start_on(port, Mode::Answer { latency: Duration::ZERO }).await;
    let log = std::fs::File::create(state.path().join("daemon.log")).unwrap();
    let mut daemon = factory_cmd(state.path(), &["serve"])
        .env_remove("FACTORY_CONFIG")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("factory serve starts");
    // Wait until it serves (its banner names the socket).
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(state.path().join("daemon.log")).unwrap_or_default().contains("serving") {
        assert!(Instant::now() < deadline, "factory serve did not come up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let id = envelope["runId"].as_str().unwrap();
    let out = factory(state.path(), &["resume", id, "--yes", "--json", "-q"], &[]).await;
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(daemon.id() as i32), nix::sys::signal::Signal::SIGTERM);
    let _ = tokio::task::spawn_blocking(move || daemon.wait()).await;
    let log = std::fs::read_to_string(state.path().join("daemon.log")).unwrap_or_default();
    assert!(out.status.success(), "{}\ndaemon: {log}\nanswered: {:?}", stderr(&out), server.answered());
    let done = stdout_json(&out);
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(done["result"]["done"], n, "{done:#}");
    each_answered_once(&server, n);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_fan_out_then_a_plain_resume_finishes_on_the_same_server_with_no_dry_run_text() {
    let state = tempfile::tempdir().unwrap();
    let server = FakeOpenAi::start(Mode::Answer { latency: Duration::from_millis(150) }).await;
    write_config(state.path(), server.port(), true, "");
    let files: Vec<String> = (0..12).map(|i| format!("src/f{i}.rs")).collect();
    let args = json!({ "files": files }).to_string();
    let events = state.path().join("events.jsonl");
    let component = common::component("review-changed").display().to_string();
    let run = [
        "run",
        &component,
        "--yes",
        "--backend",
        "local",
        "--args",
        &args,
        "--max-total-subagents",
        "50",
        "--events",
        events.to_str().unwrap(),
        "--json",
        "-q",
    ];
    let mut cmd = factory_cmd(state.path(), &run);
    cmd.env_remove("FACTORY_CONFIG").stdout(Stdio::null()).stderr(Stdio::null());
    let mut child = cmd.spawn().expect("factory run starts");

    // Kill at a known point: once four agents have finished (read from the events stream).
    let deadline = Instant::now() + Duration::from_secs(120);
    let finished = |text: &str| text.lines().filter(|l| l.contains("\"agentFinished\"")).count();
    loop {
        let text = std::fs::read_to_string(&events).unwrap_or_default();
        if finished(&text) >= 4 {
            break;
        }
        assert!(Instant::now() < deadline, "the run never got going: {text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.kill().expect("SIGKILL");
    let _ = tokio::task::spawn_blocking(move || child.wait()).await;
    let text = std::fs::read_to_string(&events).unwrap();
    let run_id = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find_map(|e| e["runId"].as_str().map(str::to_string))
        .expect("run_started names the run");
    let before = server.answered().len();
    assert!(before < files.len(), "killed mid fan-out ({before} answered)");

    // The component ran with --yes: the resume asks again, and without a terminal it cannot.
    let out = factory(state.path(), &["resume", &run_id, "--json", "-q"], &[]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("no_approval_provider"), "{}", stderr(&out));

    let out = factory(state.path(), &["resume", &run_id, "--yes", "--json", "-q"], &[]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let done = stdout_json(&out);
    assert_eq!(done["status"], "completed", "{done:#}");
    let text = done.to_string();
    assert!(!text.contains("[dry-run"), "no dry-run text in the result: {done:#}");
    for (review, file) in done["result"]["reviews"].as_array().unwrap().iter().zip(&files) {
        assert_eq!(review["file"], file.as_str());
        let review = review["review"].as_str().unwrap_or_else(|| panic!("{file} has a review: {done:#}"));
        assert!(review.starts_with("real answer to: Review"), "{review}");
    }
    assert!(server.answered().len() > before, "the resume sent the remaining calls to the same server");
    for file in &files {
        let prompt_prefix = format!("Review {file}:");
        let times = server.answered().iter().filter(|p| p.starts_with(&prompt_prefix)).count();
        // At most the calls in flight at the kill (3 at once) are answered twice.
        assert!((1..=2).contains(&times), "{file} answered {times} times");
    }
    // The spend carried over the kill: what the host accounted is what the server billed,
    // less at most the calls that were answered but not yet committed at the kill (the
    // resume sent those again and the server billed them twice).
    let per_call = 10 * 1_000 + 5 * 2_000; // 10 input + 5 output tokens at 0.001 / 0.002 per 1k
    let billed = server.answered().len() as u64 * per_call;
    let repeated = (server.answered().len() - files.len()) as u64;
    let accounted = done["accounting"]["aiCreditsNano"].as_u64().unwrap();
    assert!(accounted <= billed && accounted >= billed - repeated * per_call, "{accounted} vs {billed}: {done:#}");
    // What the crash lost is unknown: the spend is flagged as a lower bound.
    assert_eq!(done["accounting"]["aiCreditsAtLeast"], true, "{done:#}");
    assert_eq!(done["backend"]["name"], "local");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budgeted_run_on_an_unpriced_model_is_refused_before_any_spawn() {
    let state = tempfile::tempdir().unwrap();
    let server = FakeOpenAi::start(Mode::Answer { latency: Duration::ZERO }).await;
    // A server elsewhere (TEST-NET-1: nothing answers there, and nothing is asked) has no
    // price for `m-test`: the budget cannot be enforced, so the run is refused.
    let remote = "[backends.local]\nkind = \"openai\"\nbase_url = \"http://192.0.2.1:9/v1\"\nmodel = \"m-test\"\n\
                  max_retries = 0\ntimeout_seconds = 5\n";
    std::fs::write(state.path().join("factory.toml"), remote).unwrap();
    let run =
        ["run", &probe(), "--yes", "--backend", "local", "--args", &fanout(3), "--max-ai-credits", "5", "--json", "-q"];
    let out = factory(state.path(), &run, &[]).await;
    let envelope = stdout_json(&out);
    assert_eq!(envelope["failure"]["type"], "factory_limit_reached", "{envelope:#}");
    assert_eq!(envelope["failure"]["kind"], "maxAiCredits", "{envelope:#}");
    let message = envelope["failure"]["message"].as_str().unwrap();
    assert!(message.contains("m-test") && message.contains("[backends.local.pricing]"), "{message}");
    assert_eq!(envelope["accounting"]["agentsSpawned"], 0, "nothing was spawned: {envelope:#}");

    // The same unpriced model on a server on this machine (127.0.0.1) costs 0 credits.
    write_config(state.path(), server.port(), false, "");
    let out = factory(state.path(), &run, &[]).await;
    let envelope = stdout_json(&out);
    assert_eq!(envelope["status"], "completed", "{envelope:#}\n{}", stderr(&out));
    assert_eq!(envelope["accounting"]["aiCreditsNano"], 0, "{envelope:#}");
    assert_eq!(server.requests(), 3);

    // Priced, the same run completes and is accounted.
    write_config(state.path(), server.port(), true, "");
    let out = factory(state.path(), &run, &[]).await;
    let envelope = stdout_json(&out);
    assert_eq!(envelope["status"], "completed", "{envelope:#}");
    // 3 calls of 10 input + 5 output tokens at 0.001 / 0.002 credits per 1000 tokens.
    assert_eq!(envelope["accounting"]["aiCreditsNano"], 3 * (10 * 1_000 + 5 * 2_000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_hostile_server_sends_cannot_panic_the_host() {
    let state = tempfile::tempdir().unwrap();
    let server = FakeOpenAi::start(Mode::RetryAfterMs("1e300")).await;
    write_config(state.path(), server.port(), true, "");
    let run = |n: usize, budget: bool| {
        let mut args = vec!["run".to_string(), probe(), "--yes".into(), "--backend".into(), "local".into()];
        args.extend(["--args".into(), fanout(n), "--max-concurrent-subagents".into(), "1".into()]);
        if budget {
            args.extend(["--max-ai-credits".into(), "5".into()]);
        }
        args.extend(["--json".into(), "-q".into()]);
        args
    };

    // An absurd Retry-After: a quota spent for longer than the backend waits, with no time
    // to come back at; not slept on and not a panic (exit 101).
    let args = run(2, false);
    let out = factory(state.path(), &args.iter().map(String::as_str).collect::<Vec<_>>(), &[]).await;
    let envelope = stdout_json(&out);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(envelope["failure"]["kind"], "quota", "{envelope:#}");

    // Usage near u64::MAX: the accounting saturates instead of wrapping, and a saturated
    // spend exhausts any budget.
    server.set(Mode::HugeUsage);
    let args = run(3, true);
    let out = factory(state.path(), &args.iter().map(String::as_str).collect::<Vec<_>>(), &[]).await;
    let envelope = stdout_json(&out);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(envelope["failure"]["kind"], "maxAiCredits", "{envelope:#}");
    assert_eq!(envelope["accounting"]["aiCreditsNano"], u64::MAX, "{envelope:#}");
    assert_eq!(envelope["accounting"]["inputTokens"], u64::MAX, "{envelope:#}");
    assert_eq!(envelope["accounting"]["agentsSpawned"], 1, "the spawn after the saturated one was refused");

    // A 200 whose body is not UTF-8 (nor a completion) is a backend failure, not an answer.
    server.set(Mode::NotUtf8);
    let args = run(2, false);
    let out = factory(state.path(), &args.iter().map(String::as_str).collect::<Vec<_>>(), &[]).await;
    let envelope = stdout_json(&out);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(envelope["failure"]["type"], "backend", "{envelope:#}");
    assert_eq!(envelope["failure"]["kind"], "invalid_reply", "{envelope:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_whose_backend_cannot_be_built_fails_before_an_attempt_starts() {
    let state = tempfile::tempdir().unwrap();
    let server = FakeOpenAi::start(Mode::Answer { latency: Duration::ZERO }).await;
    write_config(state.path(), server.port(), false, "api_key_env = \"FAKE_OPENAI_KEY\"");
    // Stopped by its total cap after 2 of 4 calls.
    let run = [
        "run",
        &probe(),
        "--yes",
        "--backend",
        "local",
        "--args",
        &fanout(4),
        "--max-total-subagents",
        "2",
        "--max-concurrent-subagents",
        "1",
        "--json",
        "-q",
    ];
    let out = factory(state.path(), &run, &[("FAKE_OPENAI_KEY", "sk-test")]).await;
    let envelope = stdout_json(&out);
    assert_eq!(envelope["failure"]["kind"], "maxTotalSubagents", "{envelope:#}");
    assert_eq!(envelope["backend"]["keyEnv"], "FAKE_OPENAI_KEY", "the key's variable is recorded, not its value");
    assert!(!out.stdout.windows(7).any(|w| w == b"sk-test"), "no secret in the envelope");
    let id = envelope["runId"].as_str().unwrap().to_string();
    let attempts = |out: &Output| stdout_json(out)["attempts"].clone();

    // The key variable is gone: refused before an attempt, naming it.
    let resume = ["resume", &id, "--yes", "--max-total-subagents", "10", "--json", "-q"];
    let out = factory(state.path(), &resume, &[]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("backend_unavailable") && stderr(&out).contains("FAKE_OPENAI_KEY"),
        "{}",
        stderr(&out)
    );

    // The config entry is gone: refused, naming the backend; nothing fell back to dry-run.
    std::fs::remove_file(state.path().join("factory.toml")).unwrap();
    let out = factory(state.path(), &resume, &[("FAKE_OPENAI_KEY", "sk-test")]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("backend_unavailable") && stderr(&out).contains("`local`"), "{}", stderr(&out));
    let shown = factory(state.path(), &["show", &id, "--json"], &[]).await;
    assert_eq!(attempts(&shown), 1, "no attempt started");
    assert_eq!(server.answered().len(), 2);

    // Back in place, a plain resume completes on it; `show` lists each attempt's backend.
    write_config(state.path(), server.port(), false, "api_key_env = \"FAKE_OPENAI_KEY\"");
    let out = factory(state.path(), &resume, &[("FAKE_OPENAI_KEY", "sk-test")]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout_json(&out)["result"]["done"], 4);
    each_answered_once(&server, 4);
    let shown = stdout_json(&factory(state.path(), &["show", &id, "--json"], &[]).await);
    let backends = shown["backends"].as_array().unwrap();
    assert_eq!(backends.len(), 2, "{shown:#}");
    assert!(backends.iter().all(|b| b["name"] == "local" && b["config"].is_string()), "{shown:#}");
}

/// A backend that panics inside `call`: a host bug, as far as the run engine can tell.
struct Panicking;

impl AgentBackend for Panicking {
    fn name(&self) -> String {
        "panicking".into()
    }
    fn call(&self, _request: Arc<AgentRequest>) -> BoxFuture<'static, Result<AgentReply, BackendError>> {
        Box::pin(async { panic!("injected backend panic") })
    }
}

fn library_host(state: &Path, backend: Arc<dyn AgentBackend>) -> Host {
    Host::new(HostConfig {
        state_dir: Some(state.to_path_buf()),
        backend,
        cache_dir: Some(common::guest_target_dir().join("cache")),
        ..HostConfig::default()
    })
    .unwrap()
}

#[tokio::test]
async fn a_panic_inside_an_attempt_ends_it_and_frees_the_run() {
    let state = tempfile::tempdir().unwrap();
    let host = library_host(state.path(), Arc::new(Panicking));
    let factory = host.load_file(&common::component("probe")).await.unwrap();
    let options = RunOptions { args: Some(json!({"case": "fanout", "n": 3})), ..Default::default() };
    let envelope = host.run(&factory, options).await.expect("the run ends with an envelope");
    assert_eq!(envelope.status, RunStatus::Error, "{envelope:#?}");
    assert_eq!(envelope.failure.as_ref().unwrap().kind_type, factory_host::FailureType::Internal, "{envelope:#?}");
    // Not wedged: waiting returns at once, and a resume (another backend) completes.
    let waited = tokio::time::timeout(Duration::from_secs(10), host.wait("default", &envelope.run_id)).await;
    assert_eq!(waited.expect("wait returns").unwrap().status, RunStatus::Error);
    let counting = Counting::with_latency(Duration::ZERO);
    let options = ResumeOptions { backend: Some(Arc::new(Shared(counting.clone()))), ..Default::default() };
    let done = host.resume(&envelope.run_id, options).await.unwrap();
    assert_eq!(done.status, RunStatus::Completed, "{done:#?}");
    assert_eq!(counting.total(), 3);
}

#[tokio::test]
async fn a_library_resume_never_falls_back_to_the_hosts_default_backend() {
    let state = tempfile::tempdir().unwrap();
    let counting = Counting::with_latency(Duration::ZERO);
    let id = {
        let host = library_host(state.path(), Arc::new(Shared(counting.clone())));
        let factory = host.load_file(&common::component("probe")).await.unwrap();
        let limits = Limits { max_total_subagents: Some(1), ..Default::default() };
        let options = RunOptions { args: Some(json!({"case": "fanout", "n": 3})), limits, ..Default::default() };
        host.run(&factory, options).await.unwrap().run_id
    };
    // Reopened with the default (dry-run) backend: the run's own (`counting`) cannot be
    // built by name, so the resume is refused rather than answered by dry-run.
    let host = library_host(state.path(), Arc::new(factory_host::backend::DryRun));
    let raise = || Limits { max_total_subagents: Some(10), ..Default::default() };
    let refused = host.resume(&id, ResumeOptions { limits: raise(), ..Default::default() }).await;
    let Err(e) = refused else { panic!("resumed on another backend: {refused:?}") };
    assert!(matches!(e, Error::BackendUnavailable(_)), "{e}");
    assert_eq!(e.code(), factory_host::ErrorCode::BackendUnavailable);
    assert_eq!(host.envelope("default", &id).await.unwrap().attempts, 1, "no attempt started");
    // Handed the backend again, it continues where it stopped.
    let options =
        ResumeOptions { limits: raise(), backend: Some(Arc::new(Shared(counting.clone()))), ..Default::default() };
    assert_eq!(host.resume(&id, options).await.unwrap().status, RunStatus::Completed);
    assert_eq!(counting.total(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_factory_can_complete_with_the_json_value_null() {
    let state = tempfile::tempdir().unwrap();
    let host = library_host(state.path(), Arc::new(factory_host::backend::DryRun));
    let factory = host.load_file(&common::component("probe")).await.unwrap();
    let options = RunOptions { args: Some(json!({"case": "null"})), ..Default::default() };
    let envelope = host.run(&factory, options).await.unwrap();
    assert_eq!(envelope.status, RunStatus::Completed);
    assert_eq!(envelope.result_value(), Some(Value::Null), "null is a result, not the absence of one");
    // It survives the store (a JSON `null` field is not read back as absent).
    assert_eq!(host.envelope("default", &envelope.run_id).await.unwrap().result_value(), Some(Value::Null));
    drop(host);
    let out = factory_in_json(state.path(), &["show", &envelope.run_id, "--json"]).await;
    assert!(out.as_object().unwrap().contains_key("result") && out["result"].is_null(), "{out:#}");
}

async fn factory_in_json(state: &Path, args: &[&str]) -> Value {
    stdout_json(&factory(state, args, &[]).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_agent_fan_out_against_a_dead_server_stops_at_the_first_outage() {
    let state = tempfile::tempdir().unwrap();
    write_config(state.path(), FakeOpenAi::free_port(), false, "");
    let run = ["run", &probe(), "--yes", "--backend", "local", "--args", &fanout(1000), "--json", "-q"];
    let out = factory(state.path(), &run, &[]).await;
    let envelope = stdout_json(&out);
    assert_eq!(envelope["failure"]["type"], "backend", "{envelope:#}");
    assert_eq!(envelope["failure"]["kind"], "unavailable", "{envelope:#}");
    // The first call that exhausted its retries stopped the attempt and cancelled the
    // others in flight: nothing was journaled, and the resume has all 1,000 calls to make.
    let shown =
        stdout_json(&factory(state.path(), &["show", envelope["runId"].as_str().unwrap(), "--json"], &[]).await);
    assert_eq!(shown["agents"].as_array().map(Vec::len), Some(0), "no call was journaled as an answer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_spends_up_to_its_credit_budget_then_stops_and_the_spend_carries_over() {
    let state = tempfile::tempdir().unwrap();
    let server = FakeOpenAi::start(Mode::Answer { latency: Duration::ZERO }).await;
    // One credit a call: 10 input tokens at 100 credits per 1,000.
    let text = format!(
        "[backends.local]\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"\n[backends.local.pricing]\ninput = 100\noutput = 0\n",
        base_url(server.port())
    );
    std::fs::write(state.path().join("factory.toml"), text).unwrap();
    let run = [
        "run",
        &probe(),
        "--yes",
        "--backend",
        "local",
        "--args",
        &fanout(6),
        "--max-ai-credits",
        "3",
        "--max-concurrent-subagents",
        "1",
        "--json",
        "-q",
    ];
    let out = factory(state.path(), &run, &[]).await;
    let envelope = stdout_json(&out);
    assert_eq!(envelope["failure"]["kind"], "maxAiCredits", "{envelope:#}");
    // Sequential calls: three are paid (3 credits), the fourth spawn is refused.
    assert_eq!(envelope["accounting"]["aiCreditsNano"], 3_000_000_000u64, "{envelope:#}");
    assert_eq!(server.answered().len(), 3);
    let id = envelope["runId"].as_str().unwrap();
    let out = factory(state.path(), &["resume", id, "--yes", "--max-ai-credits", "10", "--json", "-q"], &[]).await;
    let done = stdout_json(&out);
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(done["accounting"]["aiCreditsNano"], 6_000_000_000u64, "the first attempt's spend carried over");
    assert_eq!(server.answered().len(), 6, "what the server billed: 6 calls, 6 credits");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_with_an_untrusted_component_needs_consent() {
    let state = tempfile::tempdir().unwrap();
    let limits = ["--max-total-subagents", "1"];
    let mut run = vec!["run", "--yes", "--args", r#"{"case":"fanout","n":2}"#, "--json", "-q"];
    let probe = probe();
    run.insert(1, &probe);
    run.extend(limits);
    let id = stdout_json(&factory(state.path(), &run, &[]).await)["runId"].as_str().unwrap().to_string();
    // `--component` names a component that is not trusted: without a terminal or --yes the
    // resume is refused before it starts.
    let edited = common::component("probe").display().to_string();
    let refused =
        factory(state.path(), &["resume", &id, "--component", &edited, "--max-total-subagents", "5"], &[]).await;
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert!(stderr(&refused).contains("--yes"), "{}", stderr(&refused));
    let shown = stdout_json(&factory(state.path(), &["show", &id, "--json"], &[]).await);
    assert_eq!(shown["attempts"], 1, "nothing started");
    let out = factory(
        state.path(),
        &["resume", &id, "--component", &edited, "--yes", "--max-total-subagents", "5", "--json", "-q"],
        &[],
    )
    .await;
    assert_eq!(stdout_json(&out)["status"], "completed", "{}", stderr(&out));
}
