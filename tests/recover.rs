//! Runs outlive their service (issue 19): a `factory serve` that is killed with -9 or stopped
//! leaves its runs `halted`, and the next `factory serve` on the state directory resumes them
//! by itself — recorded component, backend, grants and limits, own session, no new consent —
//! at most `--max-recoveries` times per run, never with `--no-recover`, and never a run that
//! ended for a reason of its own (a limit, a cancel, a guest error). No journaled agent call
//! is paid twice: the backend is a real OpenAI-compatible server on 127.0.0.1
//! (`common::fake_openai`) that counts the requests for each prompt.
//!
//! Each test holds the server at a known point: it answers the first `ok` calls at once and
//! then holds every request open, so the kill lands with exactly those results journaled
//! and the calls after them in flight.

mod common;

use common::fake_openai::{write_config, FakeOpenAi, Mode};
use common::service::Service;
use common::{factory_in, stderr, stdout_json};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

/// Long enough that a held request is still open when the test kills or stops the service.
const HELD: Duration = Duration::from_secs(3600);

/// The fake server on a runtime of its own (its threads keep answering while the test
/// blocks on the binary).
fn server(ok: usize) -> (tokio::runtime::Runtime, FakeOpenAi) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let server =
        runtime.block_on(FakeOpenAi::start(Mode::AnswerThen { ok, then: Box::new(Mode::Answer { latency: HELD }) }));
    (runtime, server)
}

/// `factory ARGS --json`'s output as JSON (whatever the exit code; the panic shows stderr).
fn json(state: &Path, args: &[&str]) -> Value {
    stdout_json(&factory_in(state, args))
}

/// Hand a fan-out of `n` calls ("task 0" ...), 2 at a time, on backend `local`, to the
/// running service; returns the run id.
fn detach_fanout(state: &Path, n: usize, more: &[&str]) -> String {
    let probe = common::component("probe");
    let args = format!(r#"{{"case":"fanout","n":{n}}}"#);
    let mut argv = vec![
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
    argv.extend_from_slice(more);
    let out = factory_in(state, &argv);
    assert!(out.status.success(), "{}", stderr(&out));
    let run_id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(run_id.len(), 36, "the run id is printed: {run_id:?}");
    run_id
}

/// Every committed progress entry of the run (through the service, or the store itself).
fn progress(state: &Path, run_id: &str) -> Vec<Value> {
    let mut entries: Vec<Value> = Vec::new();
    loop {
        let after = entries.last().map_or("0".to_string(), |e| e["seq"].to_string());
        let out = factory_in(state, &["progress", run_id, "--after-seq", &after, "--limit", "1000", "--json"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let page = stdout_json(&out).as_array().cloned().expect("a page");
        let full = page.len() == 1000;
        entries.extend(page);
        if !full {
            return entries;
        }
    }
}

/// The prompt of the probe's call labelled `t:<i>`.
fn prompt(label: &str) -> String {
    format!("task {}", label.trim_start_matches("t:"))
}

/// Prompts of the calls that started, and of those whose fresh result was recorded.
fn started_and_answered(entries: &[Value]) -> (BTreeSet<String>, BTreeSet<String>) {
    let labels = |pred: &dyn Fn(&Value) -> bool| -> BTreeSet<String> {
        entries.iter().filter(|e| pred(e)).filter_map(|e| e["label"].as_str()).map(prompt).collect()
    };
    (
        labels(&|e| e["event"] == "agentStarted"),
        labels(&|e| e["event"] == "agentFinished" && e["cached"] == false && e["status"] == "ok"),
    )
}

/// Poll the run's committed progress until `started` calls have started and `answered`
/// have their result; returns the entries.
fn wait_for_calls(state: &Path, run_id: &str, started: usize, answered: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let entries = progress(state, run_id);
        let (s, a) = started_and_answered(&entries);
        if s.len() >= started && a.len() >= answered {
            return entries;
        }
        assert!(Instant::now() < deadline, "only {} started and {} answered: {entries:#?}", s.len(), a.len());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Poll the run's committed progress until attempt `attempt` has recorded its start.
fn wait_for_attempt(state: &Path, run_id: &str, attempt: u32) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !progress(state, run_id).iter().any(|e| e["event"] == "attemptStarted" && e["attempt"] == attempt) {
        assert!(Instant::now() < deadline, "attempt {attempt} never started");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How many requests the server received for `prompt`.
fn asked(server: &FakeOpenAi, prompt: &str) -> usize {
    server.asked().iter().filter(|p| *p == prompt).count()
}

/// The log line of a recovery the service started.
fn recovering(run_id: &str, attempt: u32, max: u32) -> String {
    format!(
        "factory serve: recovering run {run_id} (factory probe, session default): automatic recovery {attempt}/{max}"
    )
}

#[test]
fn kill_9_mid_fan_out_then_the_next_service_completes_the_run_paying_no_journaled_call_twice() {
    let state = tempfile::tempdir().unwrap();
    let (_runtime, server) = server(4);
    write_config(state.path(), server.port(), false, "");
    let n = 10;
    let service = Service::start(state.path(), &[]);
    let run_id = detach_fanout(state.path(), n, &[]);
    // Four results, then two calls held open (each started after an earlier result was
    // journaled, so those four are committed once the sixth start is).
    wait_for_calls(state.path(), &run_id, 6, 4);
    service.kill();

    // With the service down, this process opens the store itself: the run is halted, and
    // its progress says which calls have their answer journaled.
    let runs = json(state.path(), &["runs", "--json"]);
    assert_eq!(runs[0]["runId"], run_id.as_str());
    assert_eq!(runs[0]["status"], "halted", "{runs:#}");
    let (started, journaled) = started_and_answered(&progress(state.path(), &run_id));
    assert_eq!(journaled.len(), 4, "{journaled:?}");
    let in_flight: BTreeSet<String> = started.difference(&journaled).cloned().collect();
    assert_eq!(in_flight.len(), 2, "started {started:?}, journaled {journaled:?}");

    // The next service resumes it by itself (no `factory resume`, no consent asked).
    server.set(Mode::Answer { latency: Duration::ZERO });
    let service = Service::start(state.path(), &[]);
    assert!(service.log().contains(&recovering(&run_id, 1, 3)), "{}", service.log());
    let done = json(state.path(), &["wait", &run_id]);
    assert_eq!(done["status"], "completed", "{done:#}\n{}", service.log());
    assert_eq!(done["result"]["done"], n, "{done:#}");
    assert_eq!(done["attempts"], 2, "{done:#}");
    assert_eq!(done["backend"]["name"], "local", "the recorded backend: {done:#}");
    let ended: Vec<Value> =
        progress(state.path(), &run_id).into_iter().filter(|e| e["event"] == "attemptEnded").collect();
    assert_eq!(ended.last().map(|e| e["replayed"].clone()), Some(Value::from(4)), "{ended:#?}");
    service.stop();

    // Every call journaled before the kill was asked once; only the ones in flight at the
    // kill were asked again; every other call once, by the recovered attempt.
    for i in 0..n {
        let prompt = format!("task {i}");
        let times = asked(&server, &prompt);
        let expected = if in_flight.contains(&prompt) { 2 } else { 1 };
        assert_eq!(times, expected, "`{prompt}` asked {times} times; asked: {:?}", server.asked());
    }
}

#[test]
fn a_run_halted_by_stopping_the_service_stays_halted_with_no_recover_and_the_next_start_recovers_it() {
    let state = tempfile::tempdir().unwrap();
    let (_runtime, server) = server(2);
    write_config(state.path(), server.port(), false, "");
    let n = 6;
    let service = Service::start(state.path(), &[]);
    let run_id = detach_fanout(state.path(), n, &[]);
    wait_for_calls(state.path(), &run_id, 4, 2);
    service.stop();
    let shown = json(state.path(), &["show", &run_id, "--json"]);
    assert_eq!(shown["status"], "halted", "SIGTERM halts the service's runs: {shown:#}");

    // Once the banner is out, every run to recover has been resumed: this one was not.
    let service = Service::start(state.path(), &["--no-recover"]);
    let shown = json(state.path(), &["show", &run_id, "--json"]);
    assert_eq!(shown["status"], "halted", "{shown:#}");
    assert_eq!(shown["attempts"], 1, "{shown:#}");
    let log = service.stop();
    assert!(!log.contains("recover"), "{log}");

    // `--no-recover` left it for later: a plain start recovers it.
    server.set(Mode::Answer { latency: Duration::ZERO });
    let service = Service::start(state.path(), &[]);
    assert!(service.log().contains(&recovering(&run_id, 1, 3)), "{}", service.log());
    let done = json(state.path(), &["wait", &run_id]);
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(done["result"]["done"], n, "{done:#}");
    service.stop();
    assert_eq!(
        server.asked().len(),
        n + 2,
        "only the two calls the stop cut off were asked again: {:?}",
        server.asked()
    );
}

#[test]
fn past_max_recoveries_the_run_stays_halted_and_says_how_to_resume_it() {
    let state = tempfile::tempdir().unwrap();
    let (_runtime, server) = server(1);
    write_config(state.path(), server.port(), false, "");
    let bound = ["--max-recoveries", "1"];
    let service = Service::start(state.path(), &bound);
    let run_id = detach_fanout(state.path(), 6, &[]);
    wait_for_calls(state.path(), &run_id, 3, 1);
    service.kill();

    // Recovered once; killed again once its second attempt has recorded its start (with
    // it, the count).
    let service = Service::start(state.path(), &bound);
    assert!(service.log().contains(&recovering(&run_id, 1, 1)), "{}", service.log());
    wait_for_attempt(state.path(), &run_id, 2);
    service.kill();

    // The bound is spent: this start leaves the run halted, and its failure says why.
    let service = Service::start(state.path(), &bound);
    let log = service.log();
    assert!(!log.contains("factory serve: recovering"), "{log}");
    assert!(log.contains(&format!("not recovering run {run_id}")), "{log}");
    let shown = json(state.path(), &["show", &run_id, "--json"]);
    assert_eq!(shown["status"], "halted", "{shown:#}");
    assert_eq!(shown["attempts"], 2, "{shown:#}");
    assert_eq!(shown["failure"]["type"], "halted", "{shown:#}");
    let message = shown["failure"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("recovered automatically 1 time "), "{message}");
    assert!(message.contains(&format!("factory resume {run_id}")), "{message}");

    // By hand it resumes (a resume asks for consent again; --yes gives it), and that starts
    // the count again: interrupted once more, the run is recovered once more.
    let out = factory_in(state.path(), &["resume", &run_id, "--yes", "--detach", "-q"]);
    assert!(out.status.success(), "{}", stderr(&out));
    wait_for_attempt(state.path(), &run_id, 3);
    service.kill();
    server.set(Mode::Answer { latency: Duration::ZERO });
    let service = Service::start(state.path(), &bound);
    assert!(service.log().contains(&recovering(&run_id, 1, 1)), "{}", service.log());
    let done = json(state.path(), &["wait", &run_id]);
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(done["attempts"], 4, "{done:#}");
    service.stop();
}

#[test]
fn runs_that_ended_for_a_reason_of_their_own_are_never_recovered() {
    let state = tempfile::tempdir().unwrap();
    let (_runtime, server) = server(usize::MAX);
    write_config(state.path(), server.port(), false, "");
    let service = Service::start(state.path(), &[]);

    // A limit stops one run, the guest fails another, a caller cancels a third.
    let limited = detach_fanout(state.path(), 6, &["--max-total-subagents", "2"]);
    let limit = json(state.path(), &["wait", &limited]);
    assert_eq!(limit["status"], "error", "{limit:#}");
    assert_eq!(limit["failure"]["type"], "factory_limit_reached", "{limit:#}");
    let probe = common::component("probe");
    let out = factory_in(
        state.path(),
        &["run", probe.to_str().unwrap(), "--yes", "--args", r#"{"case":"nope"}"#, "--detach", "-q"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let failed = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let guest = json(state.path(), &["wait", &failed]);
    assert_eq!(guest["failure"]["type"], "guest_error", "{guest:#}");
    server.set(Mode::Answer { latency: HELD });
    let cancelled = detach_fanout(state.path(), 4, &[]);
    wait_for_calls(state.path(), &cancelled, 1, 0);
    let cancel = json(state.path(), &["cancel", &cancelled, "--json"]);
    assert_eq!(cancel["status"], "cancelled", "{cancel:#}");

    // A fourth is still running when the service is killed.
    let crashed = detach_fanout(state.path(), 4, &[]);
    wait_for_calls(state.path(), &crashed, 2, 0);
    service.kill();

    server.set(Mode::Answer { latency: Duration::ZERO });
    let service = Service::start(state.path(), &[]);
    let log = service.log();
    // The service's own lines (the structured `recovery` event says the same, once).
    let recoveries: Vec<&str> =
        log.lines().filter(|l| l.starts_with("factory serve: ") && l.contains("recover")).collect();
    assert_eq!(log.lines().filter(|l| l.contains("event=\"recovery\"")).count(), 1, "one recovery event: {log}");
    assert_eq!(recoveries, vec![recovering(&crashed, 1, 3).as_str()], "only the interrupted run: {log}");
    for (run_id, status) in [(&limited, "error"), (&failed, "error"), (&cancelled, "cancelled")] {
        let shown = json(state.path(), &["show", run_id, "--json"]);
        assert_eq!(shown["status"], status, "{shown:#}");
        assert_eq!(shown["attempts"], 1, "not resumed: {shown:#}");
    }
    let done = json(state.path(), &["wait", &crashed]);
    assert_eq!(done["status"], "completed", "{done:#}");
    service.stop();
}

#[test]
fn a_run_whose_resume_cannot_start_is_left_halted_with_why_and_not_tried_again() {
    let state = tempfile::tempdir().unwrap();
    let (_runtime, server) = server(1);
    write_config(state.path(), server.port(), false, "");
    let data = state.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let service = Service::start(state.path(), &[]);
    let run_id = detach_fanout(state.path(), 4, &["--allow-read", data.to_str().unwrap()]);
    wait_for_calls(state.path(), &run_id, 3, 1);
    service.kill();

    // The run's grant is gone: a resume would mount another directory, so it cannot start.
    std::fs::remove_dir(&data).unwrap();
    let service = Service::start(state.path(), &[]);
    let log = service.stop();
    assert!(log.contains(&format!("cannot recover run {run_id}")), "{log}");
    let shown = json(state.path(), &["show", &run_id, "--json"]);
    assert_eq!(shown["status"], "halted", "{shown:#}");
    assert_eq!(shown["attempts"], 1, "{shown:#}");
    let message = shown["failure"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("automatic recovery could not resume the run"), "{message}");
    assert!(message.contains(&format!("factory resume {run_id}")), "{message}");

    // Later starts leave it to a person.
    let log = Service::start(state.path(), &[]).stop();
    assert!(!log.contains("recover"), "{log}");
    assert_eq!(json(state.path(), &["show", &run_id, "--json"])["failure"]["message"], message);
}
