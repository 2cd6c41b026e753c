//! A spent quota parks the run (issue 50): when the provider answers 429 `insufficient_quota`
//! the run stops at once and waits `halted` (failure `backend`/`quota`) with a `resumeAt`,
//! and the service resumes it by itself then — also after it was killed with -9 and started
//! again — paying no journaled call twice; a cancel while it waits ends it `cancelled`, a
//! resume by hand before `resumeAt` works, and with a reset the provider did not give the run
//! stays `halted` for a resume by hand; the resume of a parked run is not counted against
//! `--max-recoveries`. Through the real binary and service, against a real
//! OpenAI-compatible server on 127.0.0.1 (`common::fake_openai`) that counts the requests.

mod common;

use common::fake_openai::{write_config, FakeOpenAi, Mode};
use common::service::Service;
use common::{factory_in, stderr, stdout_json};
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

/// How long the quota stays spent after its first refusal (T): long enough that the test
/// sees the run parked and kills the service before T.
const SPENT_FOR: Duration = Duration::from_secs(15);

/// The fake server on a runtime of its own: it answers `ok` calls, then refuses with a spent
/// quota (`spent`).
fn server(ok: usize, spent: Option<Duration>) -> (tokio::runtime::Runtime, FakeOpenAi) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mode = Mode::AnswerThen { ok, then: Box::new(Mode::QuotaSpent { for_: spent }) };
    let server = runtime.block_on(FakeOpenAi::start(mode));
    (runtime, server)
}

/// `factory ARGS`'s output as JSON (whatever the exit code; the panic shows stderr).
fn json(state: &Path, args: &[&str]) -> Value {
    stdout_json(&factory_in(state, args))
}

/// Hand a fan-out of `n` calls ("task 0" ...), 2 at a time, on backend `local`, to the
/// running service; returns the run id.
fn detach_fanout(state: &Path, n: usize) -> String {
    let probe = common::component("probe");
    let args = format!(r#"{{"case":"fanout","n":{n}}}"#);
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

/// Poll the run until its attempt has ended (not `running` or `pending`); returns it.
fn ended(state: &Path, run_id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let shown = json(state, &["show", run_id, "--json"]);
        if !matches!(shown["status"].as_str(), Some("running" | "pending")) {
            return shown;
        }
        assert!(Instant::now() < deadline, "the run never ended: {shown:#}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Check that no call journaled before the run parked was paid again: each such prompt was
/// answered once (it replayed for free), any other at most twice (once more only when its
/// answer was in flight as the attempt stopped), and all `n` were answered.
fn assert_no_journaled_call_paid_twice(state: &Path, run_id: &str, server: &FakeOpenAi, n: usize) {
    let mut attempt = 0;
    let mut journaled = Vec::new();
    for entry in common::progress_entries(state, run_id) {
        if entry["event"] == "attemptStarted" {
            attempt = entry["attempt"].as_u64().unwrap_or(0);
        }
        if attempt == 1 && entry["event"] == "agentFinished" && entry["cached"] == false && entry["status"] == "ok" {
            journaled.push(format!("task {}", entry["label"].as_str().unwrap_or_default().trim_start_matches("t:")));
        }
    }
    assert!(!journaled.is_empty(), "calls were answered before the quota ran out");
    let answered = server.answered();
    for i in 0..n {
        let prompt = format!("task {i}");
        let times = answered.iter().filter(|p| **p == prompt).count();
        let most = if journaled.contains(&prompt) { 1 } else { 2 };
        assert!(
            (1..=most).contains(&times),
            "`{prompt}` answered {times} times; journaled {journaled:?}; answered {answered:?}"
        );
    }
}

/// `resumeAt` of a parked run, read.
fn resume_at(shown: &Value) -> SystemTime {
    let text = shown["resumeAt"].as_str().unwrap_or_else(|| panic!("a resumeAt: {shown:#}"));
    humantime::parse_rfc3339(text).unwrap_or_else(|e| panic!("resumeAt {text} is RFC 3339 UTC: {e}"))
}

/// An instant of this process as wall-clock time.
fn wall(at: Instant) -> SystemTime {
    let now = (Instant::now(), SystemTime::now());
    match at.checked_duration_since(now.0) {
        Some(ahead) => now.1 + ahead,
        None => now.1 - now.0.duration_since(at),
    }
}

/// A run parked for its quota, as `show --json` gives it.
fn assert_parked(shown: &Value) {
    assert_eq!(shown["status"], "halted", "{shown:#}");
    assert_eq!(shown["failure"]["type"], "backend", "{shown:#}");
    assert_eq!(shown["failure"]["kind"], "quota", "{shown:#}");
    let message = shown["failure"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("You exceeded your current quota"), "the provider's message: {message}");
}

#[test]
fn a_spent_quota_parks_the_run_which_resumes_by_itself_after_the_reset_even_after_a_kill_9() {
    let state = tempfile::tempdir().unwrap();
    let (_runtime, server) = server(3, Some(SPENT_FOR));
    write_config(state.path(), server.port(), false, "");
    let n = 8;
    let service = Service::start(state.path(), &[]);
    let run_id = detach_fanout(state.path(), n);
    let shown = ended(state.path(), &run_id);
    assert_parked(&shown);
    let t = wall(server.quota_until().expect("the server refused a call"));
    let at = resume_at(&shown);
    assert!(at >= t - Duration::from_millis(100), "resumeAt {at:?} is not before the reset {t:?}");
    assert!(at <= t + Duration::from_secs(30), "resumeAt {at:?} is about the reset {t:?}");
    let message = shown["failure"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("resumes by itself at") && message.contains(&format!("factory resume {run_id}")),
        "{message}"
    );
    service.kill();

    // The next service arms the run's timer again (at once if the reset has passed) and
    // resumes it by itself, with no `factory resume`.
    let service = Service::start(state.path(), &[]);
    let parked_line = format!("run {run_id} (factory probe, session default) is parked: its backend's quota is spent; it resumes by itself at");
    assert!(service.log().contains(&parked_line), "{}", service.log());
    // `wait` answers at each attempt's end (the parked one included): polled to the run's.
    let deadline = Instant::now() + Duration::from_secs(120);
    let done = loop {
        let shown = ended(state.path(), &run_id);
        if shown["status"] != "halted" || Instant::now() > deadline {
            break shown;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(done["status"], "completed", "{done:#}\n{}", service.log());
    assert_eq!(done["result"]["done"], n, "{done:#}");
    assert_eq!(done["attempts"], 2, "{done:#}");
    assert!(done.get("resumeAt").is_none(), "a running or ended run has no resumeAt: {done:#}");
    // Resumed after the reset, not before.
    let started: Vec<Value> = common::progress_entries(state.path(), &run_id)
        .into_iter()
        .filter(|e| e["event"] == "attemptStarted")
        .collect();
    let second = started.iter().find(|e| e["attempt"] == 2).unwrap_or_else(|| panic!("{started:#?}"));
    let at_ms = at.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_millis() as u64;
    assert!(second["atMs"].as_u64().unwrap_or(0) >= at_ms, "attempt 2 started before resumeAt: {second} < {at_ms}");
    service.stop();

    assert_no_journaled_call_paid_twice(state.path(), &run_id, &server, n);
}

#[test]
fn a_parked_run_is_cancelled_while_it_waits_or_resumed_by_hand_before_its_reset() {
    let state = tempfile::tempdir().unwrap();
    let (_runtime, server) = server(1, Some(Duration::from_secs(3600)));
    write_config(state.path(), server.port(), false, "");
    let service = Service::start(state.path(), &[]);
    let cancelled = detach_fanout(state.path(), 4);
    let shown = ended(state.path(), &cancelled);
    assert_parked(&shown);
    assert!(resume_at(&shown) > SystemTime::now() + Duration::from_secs(3000), "{shown:#}");
    let out = factory_in(state.path(), &["cancel", &cancelled, "--json"]);
    let envelope = stdout_json(&out);
    assert_eq!(envelope["status"], "cancelled", "{envelope:#}\n{}", stderr(&out));
    assert!(envelope.get("resumeAt").is_none(), "{envelope:#}");
    let shown = json(state.path(), &["show", &cancelled, "--json"]);
    assert_eq!(shown["status"], "cancelled", "{shown:#}");

    // Another run parked until the same far reset is resumed by hand once the quota is back.
    let resumed = detach_fanout(state.path(), 3);
    assert_parked(&ended(state.path(), &resumed));
    server.set(Mode::Answer { latency: Duration::ZERO });
    let out = factory_in(state.path(), &["resume", &resumed, "--yes", "--detach", "-q"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let done = json(state.path(), &["wait", &resumed]);
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(done["result"]["done"], 3, "{done:#}");

    // The cancelled run stays cancelled across a restart: its timer is gone for good.
    service.stop();
    let service = Service::start(state.path(), &[]);
    assert!(!service.log().contains("is parked"), "{}", service.log());
    assert_eq!(json(state.path(), &["show", &cancelled, "--json"])["status"], "cancelled");
    service.stop();
}

#[test]
fn a_quota_with_no_reset_leaves_the_run_halted_for_a_resume_by_hand() {
    let state = tempfile::tempdir().unwrap();
    let (_runtime, server) = server(2, None);
    write_config(state.path(), server.port(), false, "");
    let service = Service::start(state.path(), &[]);
    let run_id = detach_fanout(state.path(), 4);
    let shown = ended(state.path(), &run_id);
    assert_parked(&shown);
    assert!(shown.get("resumeAt").is_none(), "no reset was given: {shown:#}");
    let message = shown["failure"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("did not say when it resets"), "{message}");
    assert!(message.contains(&format!("resumed by hand once the quota is back: factory resume {run_id}")), "{message}");

    // A new service neither resumes nor arms it.
    service.stop();
    let service = Service::start(state.path(), &[]);
    assert!(!service.log().contains("is parked") && !service.log().contains("recovering"), "{}", service.log());
    assert_parked(&json(state.path(), &["show", &run_id, "--json"]));

    server.set(Mode::Answer { latency: Duration::ZERO });
    let out = factory_in(state.path(), &["resume", &run_id, "--yes", "--detach", "-q"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let done = json(state.path(), &["wait", &run_id]);
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(done["result"]["done"], 4, "{done:#}");
    service.stop();
    assert_no_journaled_call_paid_twice(state.path(), &run_id, &server, 4);
}

#[test]
fn resuming_a_parked_run_is_not_counted_against_max_recoveries() {
    let state = tempfile::tempdir().unwrap();
    let (_runtime, server) = server(1, Some(Duration::from_secs(6)));
    write_config(state.path(), server.port(), false, "");
    let service = Service::start(state.path(), &["--max-recoveries", "1"]);
    let run_id = detach_fanout(state.path(), 4);
    assert_parked(&ended(state.path(), &run_id));
    // Once the quota resets, the service resumes the run by itself: one answer, then every
    // request held, and the service killed under that second attempt.
    let asked = server.asked().len();
    server.set(Mode::AnswerThen { ok: 1, then: Box::new(Mode::Answer { latency: Duration::from_secs(3600) }) });
    let deadline = Instant::now() + Duration::from_secs(120);
    while server.asked().len() < asked + 2 {
        assert!(Instant::now() < deadline, "the parked run was not resumed: {}", service.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    service.kill();

    // Its crash is recovered: the resume of the parked run did not use up the one recovery
    // `--max-recoveries 1` allows.
    server.set(Mode::Answer { latency: Duration::ZERO });
    let service = Service::start(state.path(), &["--max-recoveries", "1"]);
    let recovering = format!("recovering run {run_id} (factory probe, session default): automatic recovery 1/1");
    assert!(service.log().contains(&recovering), "{}", service.log());
    let done = json(state.path(), &["wait", &run_id]);
    assert_eq!(done["status"], "completed", "{done:#}\n{}", service.log());
    assert_eq!(done["attempts"], 3, "{done:#}");
    service.stop();
}
