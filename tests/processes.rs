//! Several real `factory` processes on one state directory: a `kill -9` mid-fan-out
//! followed by a resume that re-runs only unjournaled work, and observing, waiting for and
//! cancelling a running run from a second process through the control socket.

mod common;

use common::service::{daemon_pid, signal, wait_gone};
use serde_json::Value;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn factory(state: &Path, args: &[&str]) -> Command {
    common::factory_cmd(state, args)
}

fn output(state: &Path, args: &[&str]) -> Output {
    factory(state, args).output().expect("factory starts")
}

fn json(out: &Output) -> Value {
    common::stdout_json(out)
}

/// A slow fan-out of `n` agents, 4 at a time, 40 ms each, in the background.
fn start_fanout(state: &Path, script: &Path, n: usize) -> Child {
    start_fanout_with(state, script, n, &[])
}

/// [`start_fanout`] with more options for `factory run`.
fn start_fanout_with(state: &Path, script: &Path, n: usize, more: &[&str]) -> Child {
    let probe = common::component("probe");
    let args = format!(r#"{{"case":"fanout","n":{n}}}"#);
    let backend = format!("script:{}", script.display());
    let mut argv = vec![
        "run",
        probe.to_str().unwrap(),
        "--yes",
        "--args",
        &args,
        "--max-concurrent-subagents",
        "4",
        "--backend",
        &backend,
        "--json",
        "-q",
    ];
    argv.extend_from_slice(more);
    factory(state, &argv).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("factory run starts")
}

fn slow_script(dir: &Path) -> std::path::PathBuf {
    let script = dir.join("slow.json");
    std::fs::write(&script, r#"{"rules":[{"labelPrefix":"t:","reply":{"text":"ok"},"latencyMs":40}]}"#).unwrap();
    script
}

/// Poll `factory runs` from this (second) process until the run has spawned `spawned`.
fn wait_for_spawns(state: &Path, spawned: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let out = output(state, &["runs", "--json"]);
        if out.status.success() {
            if let Some(run) = json(&out).as_array().and_then(|r| r.first()).cloned() {
                if run["accounting"]["agentsSpawned"].as_u64().unwrap_or(0) >= spawned {
                    return run["runId"].as_str().unwrap().to_string();
                }
            }
        }
        assert!(Instant::now() < deadline, "the run never got going: {}", String::from_utf8_lossy(&out.stderr));
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The JSON lines of an `--events` file written so far (a partial last line is left out).
fn event_lines(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("event line {l:?}: {e}"))).collect()
}

/// Read `--events` until `count` fresh agent results were reported; returns the run id and
/// the seq of the `count`-th one.
fn wait_for_results_in_events(events: &Path, count: usize) -> (String, u64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let lines = event_lines(events);
        let finished: Vec<&Value> = lines
            .iter()
            .filter(|e| {
                e["event"] == "progress" && e["entry"]["event"] == "agentFinished" && e["entry"]["cached"] == false
            })
            .collect();
        if finished.len() >= count {
            let run_id = finished[count - 1]["runId"].as_str().expect("the event names the run").to_string();
            return (run_id, finished[count - 1]["entry"]["seq"].as_u64().expect("a seq"));
        }
        assert!(Instant::now() < deadline, "only {} results in the events stream", finished.len());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Ask the process holding the store (through its control socket) for the committed
/// progress after `seq` until it holds `count` fresh agent results.
fn wait_for_committed_results_after(state: &Path, run_id: &str, seq: u64, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let after = seq.to_string();
        let out = output(state, &["progress", run_id, "--after-seq", &after, "--limit", "1000", "--json"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let page = json(&out);
        let entries = page.as_array().expect("a page");
        assert!(entries.iter().all(|e| e["seq"].as_u64().unwrap_or(0) > seq), "--after-seq {seq}: {page:#}");
        let finished = entries.iter().filter(|e| e["event"] == "agentFinished" && e["cached"] == false).count();
        if finished >= count {
            return;
        }
        assert!(Instant::now() < deadline, "only {finished} results committed after seq {seq}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn kill_9_mid_fan_out_then_resume_reruns_only_unjournaled_work() {
    let state = tempfile::tempdir().unwrap();
    let script = slow_script(state.path());
    let events = state.path().join("events.jsonl");
    let n = 400;
    let mut child = start_fanout_with(state.path(), &script, n, &["--events", events.to_str().unwrap()]);
    // The known point: 24 results reported on the events stream, and the store (asked
    // through the control socket) has committed 8 more after them. Each result is journaled
    // right after it is reported, with no await between, so by the time later results are
    // committed, these 24 are too.
    let journaled = 24;
    let (run_id, seq) = wait_for_results_in_events(&events, journaled);
    wait_for_committed_results_after(state.path(), &run_id, seq, 8);
    child.kill().expect("SIGKILL"); // std's kill is SIGKILL on Unix
    child.wait().unwrap();
    let lines = event_lines(&events);
    assert!(lines.iter().all(|e| e["version"] == 1), "every event line is versioned");
    assert_eq!(lines.first().map(|e| e["event"].clone()), Some(Value::from("run_started")));
    assert!(lines.iter().all(|e| e["event"] != "run_finished"), "the run was killed mid-way, not finished");

    // The store opens, and the run shows as interrupted, not running forever.
    let runs = json(&output(state.path(), &["runs", "--json"]));
    assert_eq!(runs[0]["runId"], run_id.as_str());
    assert_eq!(runs[0]["status"], "halted", "{runs:#}");
    assert!(
        runs[0]["accounting"]["agentsSpawned"].as_u64().unwrap() >= journaled as u64,
        "spend up to the last commit survives: {runs:#}"
    );

    let backend = format!("script:{}", script.display());
    let out = output(state.path(), &["resume", &run_id, "--yes", "--backend", &backend, "--json", "-q"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let envelope = json(&out);
    assert_eq!(envelope["status"], "completed");
    assert_eq!(envelope["result"]["done"], n);
    assert_eq!(envelope["attempts"], 2);

    // In the second attempt every item was either replayed from the journal or spawned
    // once: nothing journaled before the kill ran again.
    let progress = json(&output(state.path(), &["progress", &run_id, "--after-seq", "0", "--limit", "1000", "--json"]));
    let mut entries = progress.as_array().unwrap().clone();
    while entries.len().is_multiple_of(1000) && !entries.is_empty() {
        let after = entries.last().unwrap()["seq"].to_string();
        let more =
            json(&output(state.path(), &["progress", &run_id, "--after-seq", &after, "--limit", "1000", "--json"]));
        let more = more.as_array().unwrap().clone();
        if more.is_empty() {
            break;
        }
        entries.extend(more);
    }
    let second =
        entries.iter().position(|e| e["event"] == "attemptStarted" && e["attempt"] == 2).expect("attempt 2 started");
    let attempt2 = &entries[second..];
    let ended = attempt2.iter().find(|e| e["event"] == "attemptEnded").expect("attempt 2 ended");
    let replayed = ended["replayed"].as_u64().unwrap() as usize;
    let spawned = attempt2.iter().filter(|e| e["event"] == "agentStarted").count();
    assert!(replayed >= journaled, "every result journaled before the kill replayed ({replayed} replayed)");
    assert_eq!(replayed + spawned, n, "each item replayed or spawned exactly once");
}

#[test]
fn a_second_process_observes_waits_for_and_cancels_a_running_run() {
    let state = tempfile::tempdir().unwrap();
    let script = slow_script(state.path());
    let child = start_fanout(state.path(), &script, 2000);
    let run_id = wait_for_spawns(state.path(), 5);

    let show = json(&output(state.path(), &["show", &run_id, "--json"]));
    assert_eq!(show["status"], "running");
    let waiter = factory(state.path(), &["wait", &run_id]).stdout(Stdio::piped()).spawn().unwrap();

    let out = output(state.path(), &["cancel", &run_id, "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let cancelled = json(&out);
    assert_eq!(cancelled["status"], "cancelled");
    assert!(cancelled["accounting"]["agentsSpawned"].as_u64().unwrap() < 2000);

    let waited = waiter.wait_with_output().unwrap();
    assert_eq!(json(&waited)["status"], "cancelled");
    let run = child.wait_with_output().unwrap();
    assert_eq!(run.status.code(), Some(130), "the foreground run reports the cancel");
    assert!(String::from_utf8_lossy(&run.stderr).contains(&format!("factory resume {run_id}")));

    // Another session lists none of it, through the store directly now that it is free;
    // the CLI is the owner, so `--all` and `show` find it there.
    let other = output(state.path(), &["runs", "--json", "--session", "someone-else"]);
    assert_eq!(json(&other), serde_json::json!([]));
    let all = json(&output(state.path(), &["runs", "--all", "--json", "--session", "someone-else"]));
    assert_eq!(
        (all[0]["runId"].as_str(), all[0]["session"].as_str()),
        (Some(run_id.as_str()), Some("default")),
        "{all:#}"
    );
    let other = output(state.path(), &["show", &run_id, "--json", "--session", "someone-else"]);
    assert_eq!(json(&other)["status"], "cancelled");
}

#[test]
fn detach_hands_the_run_to_a_daemon_that_watch_follows_and_shutdown_halts() {
    let state = tempfile::tempdir().unwrap();
    let script = slow_script(state.path());
    let probe = common::component("probe");
    let backend = format!("script:{}", script.display());
    let out = output(
        state.path(),
        &[
            "run",
            probe.to_str().unwrap(),
            "--yes",
            "--args",
            r#"{"case":"fanout","n":20}"#,
            "--backend",
            &backend,
            "--detach",
        ],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let run_id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(run_id.len(), 36, "the run id is printed: {run_id:?}");

    let watched = output(state.path(), &["watch", &run_id, "--json"]);
    assert!(watched.status.success(), "{}", String::from_utf8_lossy(&watched.stderr));
    let envelope = json(&watched);
    assert_eq!(envelope["status"], "completed");
    assert_eq!(envelope["result"]["done"], 20);
    assert!(String::from_utf8_lossy(&watched.stderr).contains("agent t:19: done"), "watch shows progress");

    // A second detached run that is still going when the daemon is told to stop ends as
    // halted, and resumes to completion.
    let out = output(
        state.path(),
        &[
            "run",
            probe.to_str().unwrap(),
            "--yes",
            "--args",
            r#"{"case":"fanout","n":400}"#,
            "--backend",
            &backend,
            "--max-concurrent-subagents",
            "2",
            "--detach",
        ],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let long_id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let show = json(&output(state.path(), &["show", &long_id, "--json"]));
        if show["accounting"]["agentsSpawned"].as_u64().unwrap_or(0) >= 4 {
            break;
        }
        assert!(Instant::now() < deadline, "the detached run never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid = daemon_pid(state.path());
    signal(pid, "-TERM");
    wait_gone(pid);
    let runs = json(&output(state.path(), &["runs", "--json"]));
    let long = runs.as_array().unwrap().iter().find(|r| r["runId"] == long_id.as_str()).unwrap().clone();
    assert_eq!(long["status"], "halted", "{long:#}");
    assert!(!state.path().join("control.sock").exists(), "the daemon removed its socket");
}

#[test]
fn a_second_foreground_run_executes_in_the_process_holding_the_store() {
    let state = tempfile::tempdir().unwrap();
    let script = slow_script(state.path());
    let mut holder = start_fanout(state.path(), &script, 2000);
    let holder_run = wait_for_spawns(state.path(), 2);

    let probe = common::component("probe");
    let out =
        output(state.path(), &["run", probe.to_str().unwrap(), "--yes", "--args", r#"{"case":"steps"}"#, "--json"]);
    if !out.status.success() {
        let _ = holder.kill();
        let held = holder.wait_with_output().unwrap();
        panic!("{}\nholder: {}", String::from_utf8_lossy(&out.stderr), String::from_utf8_lossy(&held.stderr));
    }
    let envelope = json(&out);
    assert_eq!(envelope["status"], "completed");
    assert_eq!(envelope["result"], serde_json::json!({"a": 42, "b": 42}));
    assert!(String::from_utf8_lossy(&out.stderr).contains("held by another factory process"));

    let out = output(state.path(), &["cancel", &holder_run, "--json"]);
    assert_eq!(json(&out)["status"], "cancelled");
    let _ = holder.wait();
}

#[test]
fn ctrl_c_cancels_a_foreground_run_and_says_how_to_resume() {
    let state = tempfile::tempdir().unwrap();
    let script = slow_script(state.path());
    let child = start_fanout(state.path(), &script, 2000);
    let run_id = wait_for_spawns(state.path(), 4);
    signal(child.id(), "-INT");
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("factory resume {run_id}")));
    let runs = json(&output(state.path(), &["runs", "--json"]));
    assert_eq!(runs[0]["status"], "cancelled");
}

/// `factory_cmd(state, args)`, run through `sh` with descriptor 3 open on `events` (for
/// `--events fd:3`).
fn with_fd3(state: &Path, args: &[&str], events: &Path) -> Command {
    let inner = factory(state, args);
    let mut sh = Command::new("sh");
    sh.arg("-c").arg(r#"exec "$0" "$@" 3>"$FACTORY_TEST_EVENTS""#).arg(inner.get_program()).args(inner.get_args());
    for (key, value) in inner.get_envs() {
        match value {
            Some(value) => sh.env(key, value),
            None => sh.env_remove(key),
        };
    }
    sh.env("FACTORY_TEST_EVENTS", events).stdin(Stdio::null());
    sh
}

#[test]
fn events_go_to_a_file_descriptor() {
    let state = tempfile::tempdir().unwrap();
    let events = state.path().join("fd3.jsonl");
    let probe = common::component("probe");
    let args =
        ["run", probe.to_str().unwrap(), "--yes", "--args", r#"{"case":"steps"}"#, "--events", "fd:3", "--json", "-q"];
    let out = with_fd3(state.path(), &args, &events).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let envelope = json(&out);
    let lines = event_lines(&events);
    assert!(lines.len() >= 3, "{lines:#?}");
    assert!(lines.iter().all(|e| e["version"] == 1), "every line is versioned: {lines:#?}");
    assert_eq!(lines[0]["event"], "run_started");
    assert_eq!(lines[0]["runId"], envelope["runId"]);
    let last = lines.last().unwrap();
    assert_eq!(last["event"], "run_finished");
    assert_eq!(last["envelope"]["status"], "completed");
    assert_eq!(last["envelope"]["result"], envelope["result"]);
    assert!(
        lines
            .iter()
            .any(|e| e["event"] == "progress" && e["entry"]["event"] == "phase" && e["entry"]["title"] == "Probe"),
        "{lines:#?}"
    );

    // Descriptors 0-2 are taken, and a closed one is refused: both before a run exists.
    for (fd, says) in [("fd:1", "above 2"), ("fd:9", "not open")] {
        let args = ["run", probe.to_str().unwrap(), "--yes", "--args", r#"{"case":"steps"}"#, "--events", fd, "-q"];
        let out = output(state.path(), &args);
        assert_eq!(out.status.code(), Some(2), "{fd}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stderr).contains(says), "{fd}: {}", String::from_utf8_lossy(&out.stderr));
    }
    assert_eq!(json(&output(state.path(), &["runs", "--json"])).as_array().map(Vec::len), Some(1));
}

/// One raw request of this wire version on the control socket of `state`; the answer, parsed.
fn raw_request(state: &Path, body: Value) -> Value {
    use std::io::{BufRead, Write};
    let mut stream = std::os::unix::net::UnixStream::connect(state.join("control.sock")).expect("connect");
    stream
        .write_all(
            format!("{}\n", serde_json::json!({ "wire": factory_host::service::WIRE_VERSION, "body": body }))
                .as_bytes(),
        )
        .expect("send");
    let mut answer = String::new();
    std::io::BufReader::new(stream).read_line(&mut answer).expect("an answer");
    serde_json::from_str(&answer).expect("a JSON answer")
}

/// A caller scoped to another session (as an MCP connection is) sees and touches nothing
/// of the holder's run; the CLI, the state directory's owner, sees it from any session.
#[test]
fn while_the_holder_is_alive_another_session_sees_and_touches_nothing() {
    let state = tempfile::tempdir().unwrap();
    let script = slow_script(state.path());
    let mut holder = start_fanout(state.path(), &script, 2000);
    let run_id = wait_for_spawns(state.path(), 2);
    let other = |args: &[&str]| {
        let mut argv = args.to_vec();
        argv.extend(["--session", "someone-else"]);
        output(state.path(), &argv)
    };
    let not_found = |out: Output, what: &str| {
        assert!(!out.status.success(), "{what} succeeded for another session");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("not_found"),
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };

    assert_eq!(json(&other(&["runs", "--json"])), serde_json::json!([]));
    let scoped = serde_json::json!({"session": "someone-else"});
    for op in ["envelope", "detail", "wait", "cancel"] {
        let answer = raw_request(state.path(), serde_json::json!({ "op": op, "scope": scoped, "runId": run_id }));
        assert_eq!(answer["body"]["err"]["code"], "not_found", "{op}: {answer}");
    }
    let answer = raw_request(
        state.path(),
        serde_json::json!({ "op": "progress", "scope": scoped, "runId": run_id, "query": {} }),
    );
    assert_eq!(answer["body"]["err"]["code"], "not_found", "{answer}");
    let answer = raw_request(
        state.path(),
        serde_json::json!({ "op": "resume", "scope": scoped, "runId": run_id, "consent": "any" }),
    );
    assert_eq!(answer["body"]["err"]["code"], "not_found", "{answer}");
    let answer = raw_request(state.path(), serde_json::json!({ "op": "runs", "scope": scoped }));
    assert_eq!(answer["body"]["ok"]["runs"], serde_json::json!([]), "{answer}");
    not_found(other(&["show", "no-such-run", "--json"]), "show of a run that does not exist");
    // The owner still sees it running, untouched, from any session.
    let show = json(&other(&["show", &run_id, "--json"]));
    assert_eq!(show["status"], "running", "{show:#}");
    assert_eq!(show["attempts"], 1);

    let out = output(state.path(), &["cancel", &run_id, "--json"]);
    assert_eq!(json(&out)["status"], "cancelled");
    let _ = holder.wait();
}

#[test]
fn progress_pages_backwards_and_by_phase_through_the_socket() {
    let state = tempfile::tempdir().unwrap();
    let script = slow_script(state.path());
    let mut holder = start_fanout(state.path(), &script, 2000);
    let run_id = wait_for_spawns(state.path(), 12);
    let page = |args: &[&str]| -> Vec<Value> {
        let mut argv = vec!["progress", run_id.as_str()];
        argv.extend_from_slice(args);
        argv.push("--json");
        let out = output(state.path(), &argv);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        json(&out).as_array().cloned().expect("a page")
    };
    let seqs = |entries: &[Value]| entries.iter().map(|e| e["seq"].as_u64().unwrap()).collect::<Vec<_>>();

    assert_eq!(seqs(&page(&["--after-seq", "2", "--limit", "3"])), vec![3, 4, 5]);
    assert_eq!(seqs(&page(&["--before-seq", "6", "--limit", "2"])), vec![4, 5], "backwards from --before-seq");
    assert_eq!(seqs(&page(&["--before-seq", "1"])), Vec::<u64>::new());
    let tail = seqs(&page(&["--limit", "3"]));
    assert_eq!(tail.len(), 3);
    assert!(tail.windows(2).all(|w| w[0] + 1 == w[1]) && tail[0] > 5, "the latest entries, ascending: {tail:?}");
    let probe_phase = page(&["--phase", "Probe", "--after-seq", "0", "--limit", "1000"]);
    assert!(probe_phase.len() >= 12, "{probe_phase:#?}");
    assert!(probe_phase.iter().all(|e| e["phase"] == "Probe"), "{probe_phase:#?}");
    let before = page(&["--phase", "Probe", "--before-seq", "10", "--limit", "3"]);
    assert_eq!(seqs(&before), vec![7, 8, 9], "by phase and backwards at once: {before:#?}");
    assert_eq!(page(&["--phase", "No such phase", "--after-seq", "0"]), Vec::<Value>::new());
    // Before the guest entered its phase there is the attempt's start, with no phase.
    let first = page(&["--after-seq", "0", "--limit", "1"]);
    assert_eq!(first[0]["event"], "attemptStarted", "{first:#?}");
    assert!(first[0]["phase"].is_null());

    let out = output(state.path(), &["cancel", &run_id, "--json"]);
    assert_eq!(json(&out)["status"], "cancelled");
    let _ = holder.wait();
}

#[test]
fn an_attempt_s_start_is_committed_at_once_whatever_the_commit_window() {
    // With a 60 s window, another process still sees the attempt's start while its agents
    // run (it is committed as the attempt starts), and none of the answers the run has
    // already reported (those wait for the window).
    let state = tempfile::tempdir().unwrap();
    let script = slow_script(state.path());
    let events = state.path().join("events.jsonl");
    let mut child = start_fanout_with(
        state.path(),
        &script,
        40,
        &["--events", events.to_str().unwrap(), "--commit-window-ms", "60000"],
    );
    let (run_id, _) = wait_for_results_in_events(&events, 4);
    let progress = json(&output(state.path(), &["progress", &run_id, "--after-seq", "0", "--limit", "1000", "--json"]));
    let entries = progress.as_array().expect("a list of entries");
    assert_eq!(entries.first().map(|e| &e["event"]), Some(&serde_json::json!("attemptStarted")), "{progress:#}");
    assert!(!entries.iter().any(|e| e["event"] == "agentFinished"), "answers wait for the window: {progress:#}");
    assert!(child.try_wait().expect("the run's process").is_none(), "the run is still going");
    let runs = json(&output(state.path(), &["runs", "--json"]));
    assert_eq!(runs[0]["status"], "running", "{runs:#}");
    child.kill().expect("SIGKILL");
    child.wait().unwrap();
}

#[test]
fn the_commit_window_flag_sets_how_much_a_kill_9_can_lose() {
    // With a 60 s window only the attempt's start (committed at once) and whatever rides
    // with it is committed during this test: a kill -9 after results were reported loses
    // every answer, and the resume runs everything again.
    let state = tempfile::tempdir().unwrap();
    let script = slow_script(state.path());
    let events = state.path().join("events.jsonl");
    let n = 40;
    let mut child = start_fanout_with(
        state.path(),
        &script,
        n,
        &["--events", events.to_str().unwrap(), "--commit-window-ms", "60000"],
    );
    let (run_id, _) = wait_for_results_in_events(&events, 8);
    child.kill().expect("SIGKILL");
    child.wait().unwrap();
    let runs = json(&output(state.path(), &["runs", "--json"]));
    assert_eq!(runs[0]["runId"], run_id.as_str());
    assert_eq!(runs[0]["status"], "halted", "{runs:#}");
    // The attempt's start entry is committed at once, and the first spawns (4 at a time,
    // none answered within 40 ms) may ride with it; no answered call was committed.
    assert!(
        runs[0]["accounting"]["agentsSpawned"].as_u64().is_some_and(|n| n <= 4),
        "no more spend than the first spawns was committed: {runs:#}"
    );

    let backend = format!("script:{}", script.display());
    let out = output(state.path(), &["resume", &run_id, "--yes", "--backend", &backend, "--json", "-q"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(json(&out)["status"], "completed");
    let progress = json(&output(state.path(), &["progress", &run_id, "--after-seq", "0", "--limit", "1000", "--json"]));
    let ended: Vec<&Value> = progress.as_array().unwrap().iter().filter(|e| e["event"] == "attemptEnded").collect();
    assert_eq!(ended.len(), 1, "the first attempt's end was never committed: {ended:#?}");
    assert_eq!(ended[0]["replayed"], 0, "nothing of the first attempt was journaled");
}

/// A resume shows its own attempt's progress, the calls it replays from the journal as one
/// line per burst rather than one each: in the process itself (`--no-daemon`), and through
/// the service holding the store, which follows it from its own first entry, not from the
/// run's first (the attempts before it are history).
#[test]
fn a_resume_shows_its_replayed_calls_as_one_line_and_not_the_attempts_before_it() {
    let state = tempfile::tempdir().unwrap();
    let bench = common::component("bench");
    let (bench, n) = (bench.to_str().unwrap(), 40);
    // A fan-out that fails at its end, after every call was answered: resumable.
    let args = format!(r#"{{"workload":"fanout","n":{n},"failAtEnd":true}}"#);
    let ends_failing = |out: &Output, what: &str| {
        let said = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(1), "{what}: {said}");
        assert!(said.contains(&format!("failAtEnd: done={n}")), "{what}: {said}");
        said
    };
    let out = output(state.path(), &["run", bench, "--yes", "--args", &args, "--backend", "dry-run"]);
    let first = ends_failing(&out, "the run");
    assert_eq!(first.lines().filter(|l| l.contains("agent f:") && l.ends_with(": done")).count(), n, "{first}");
    let run_id = json(&output(state.path(), &["runs", "--json"]))[0]["runId"].as_str().unwrap().to_string();

    // In this process: every call replayed, shown as one line (the 40 are answered in well
    // under the second a line gathers).
    let out = output(state.path(), &["resume", &run_id, "--yes", "--backend", "dry-run"]);
    let said = ends_failing(&out, "the resume");
    assert!(said.contains("attempt 2"), "{said}");
    let replayed: Vec<&str> = said.lines().filter(|l| l.contains("replayed") && !l.contains("queued")).collect();
    assert_eq!(replayed.len(), 1, "one line for the burst of replayed calls: {said}");
    assert!(replayed[0].ends_with(&format!("agents f:0 … f:{}: {n} replayed", n - 1)), "{said}");
    assert!(!said.lines().any(|l| l.ends_with(": done")), "nothing ran again: {said}");
    assert!(said.contains(&format!("0 done (0 failed), {n} replayed")), "the summary counts them: {said}");

    // Through the service holding the store: only attempt 3's entries, none of the run's
    // earlier 40 `done` lines; its replayed calls (told to live subscribers only) are
    // counted from its `attemptEnded` entry.
    let service = common::service::Service::start(state.path(), &[]);
    let out = output(state.path(), &["resume", &run_id, "--yes", "--backend", "dry-run"]);
    let said = ends_failing(&out, "the resume in the service");
    assert!(said.contains("held by another factory process"), "run in the service: {said}");
    assert!(said.contains("attempt 3") && !said.contains("attempt 2"), "followed from attempt 3's first entry: {said}");
    assert!(!said.contains("agent f:"), "no line of the earlier attempts: {said}");
    assert!(said.contains(&format!("0 done (0 failed), {n} replayed")), "{said}");
    service.stop();
}
