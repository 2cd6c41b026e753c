//! Several real `factory` processes on one state directory: a `kill -9` mid-fan-out
//! followed by a resume that re-runs only unjournaled work, and observing, waiting for and
//! cancelling a running run from a second process through the control socket.

mod common;

use serde_json::Value;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn factory(state: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(common::factory_bin());
    cmd.args(args)
        .env("FACTORY_STATE_DIR", state)
        .env("CARGO_TARGET_DIR", common::guest_target_dir())
        .env("FACTORY_CACHE_DIR", common::guest_target_dir().join("cache"));
    cmd
}

fn output(state: &Path, args: &[&str]) -> Output {
    factory(state, args).output().expect("factory starts")
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("not JSON ({e}): {}\nstderr: {}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    })
}

/// A slow fan-out of `n` agents, 4 at a time, 40 ms each, in the background.
fn start_fanout(state: &Path, script: &Path, n: usize) -> Child {
    let probe = common::component("probe");
    let args = format!(r#"{{"case":"fanout","n":{n}}}"#);
    let backend = format!("script:{}", script.display());
    factory(state, &["run", probe.to_str().unwrap(), "--args", &args, "--max-concurrent-subagents", "4", "--backend", &backend, "--json", "-q"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("factory run starts")
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

#[test]
fn kill_9_mid_fan_out_then_resume_reruns_only_unjournaled_work() {
    let state = tempfile::tempdir().unwrap();
    let script = slow_script(state.path());
    let n = 120;
    let mut child = start_fanout(state.path(), &script, n);
    let run_id = wait_for_spawns(state.path(), 24);
    child.kill().expect("SIGKILL"); // std's kill is SIGKILL on Unix
    child.wait().unwrap();

    // The store opens, and the run shows as interrupted, not running forever.
    let runs = json(&output(state.path(), &["runs", "--json"]));
    assert_eq!(runs[0]["runId"], run_id.as_str());
    assert_eq!(runs[0]["status"], "halted", "{runs:#}");

    let backend = format!("script:{}", script.display());
    let out = output(state.path(), &["resume", &run_id, "--backend", &backend, "--json", "-q"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let envelope = json(&out);
    assert_eq!(envelope["status"], "completed");
    assert_eq!(envelope["result"]["done"], n);
    assert_eq!(envelope["attempts"], 2);

    // In the second attempt every item was either replayed from the journal or spawned
    // once: nothing journaled before the kill ran again.
    let progress = json(&output(state.path(), &["progress", &run_id, "--after-seq", "0", "--limit", "1000", "--json"]));
    let entries = progress.as_array().unwrap();
    let second = entries.iter().position(|e| e["event"] == "attemptStarted" && e["attempt"] == 2).expect("attempt 2 started");
    let attempt2 = &entries[second..];
    let replayed = attempt2.iter().filter(|e| e["event"] == "agentFinished" && e["cached"] == true).count();
    let spawned = attempt2.iter().filter(|e| e["event"] == "agentStarted").count();
    // 24 had started at the kill; 4 were in flight, and the last commit window may be lost.
    assert!(replayed >= 12, "work done before the kill was journaled ({replayed} replayed)");
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

    // Another session sees nothing, through the store directly now that it is free.
    let other = output(state.path(), &["runs", "--json", "--session", "someone-else"]);
    assert_eq!(json(&other), serde_json::json!([]));
    let other = output(state.path(), &["show", &run_id, "--session", "someone-else"]);
    assert!(!other.status.success());
    assert!(String::from_utf8_lossy(&other.stderr).contains("not_found"));
}
