//! One run's envelope cannot brick a session (issue 49, item 2), through the real `factory`
//! binary and the `factory serve` holding the store: a guest that throws an error of 33 MiB
//! and five runs that return 15 MiB results leave `factory runs`, `factory show` and the
//! control socket's `runs` answering; the error is stored cut to 64 KiB with a visible
//! marker, listings carry summaries (no results) a page at a time, a result over
//! `maxResultBytes` is a typed failure, and a new run still works. `factory rm` deletes runs
//! and their journals, refusing a running one, so a session can always be repaired.

mod common;

use common::{factory_cmd, factory_in, stderr, stdout_json};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Stdio};

/// `factory serve` holding the store; stopped (SIGTERM) when dropped.
struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ =
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.0.id() as i32), nix::sys::signal::Signal::SIGTERM);
        let _ = self.0.wait();
    }
}

fn serve(state: &Path) -> Serve {
    let mut child =
        factory_cmd(state, &["serve"]).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("serve starts");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    lines.by_ref().map(|l| l.expect("a line")).find(|l| l.contains("serving")).expect("serve says it listens");
    std::thread::spawn(move || for _ in lines {});
    Serve(child)
}

/// `factory ARGS... --json`, which must exit with `code`: its JSON.
fn json_of(state: &Path, args: &[&str], code: i32) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let out = factory_in(state, &all);
    assert_eq!(out.status.code(), Some(code), "{all:?}: {}", stderr(&out));
    stdout_json(&out)
}

/// One raw request line on the control socket (this build's wire version); the answer line.
fn raw(socket: &Path, body: Value) -> Value {
    let mut stream = std::os::unix::net::UnixStream::connect(socket).expect("connect to the control socket");
    stream
        .write_all(format!("{}\n", json!({ "wire": factory_host::service::WIRE_VERSION, "body": body })).as_bytes())
        .expect("send");
    let mut answer = String::new();
    BufReader::new(stream).read_line(&mut answer).expect("an answer");
    serde_json::from_str(&answer).unwrap_or_else(|e| panic!("not JSON ({e}): {answer:.300}"))
}

/// Run the hostile guest with `args` (consent given on the command line).
fn hostile(state: &Path, args: Value, code: i32) -> Value {
    let component = common::component("hostile");
    json_of(state, &["run", component.to_str().unwrap(), "--yes", "-q", "--args", &args.to_string()], code)
}

/// A message cut to `max` bytes: at most that long, ending with the marker.
fn assert_cut(message: &str, max: usize) {
    assert!(message.len() <= max, "{} bytes, over {max}", message.len());
    assert!(message.len() > max - 64, "cut near the bound, not shorter: {} bytes", message.len());
    assert!(message.ends_with(" [truncated]"), "{:?}", &message[message.len().saturating_sub(40)..]);
}

#[test]
fn a_huge_error_and_big_results_leave_the_session_usable() {
    let state = tempfile::tempdir().expect("a state dir");
    let state = state.path();
    let _serve = serve(state);

    // An error of 33 MiB: the run ends `error`, its message cut to 64 KiB on a character
    // boundary with the marker, the plain error the same.
    let failed = hostile(state, json!({ "case": "huge-error", "n": 33 << 20 }), 1);
    assert_eq!(
        (failed["status"].as_str(), failed["failure"]["type"].as_str()),
        (Some("error"), Some("guest_error")),
        "{:.300}",
        failed.to_string()
    );
    assert_cut(failed["failure"]["message"].as_str().expect("a message"), 64 << 10);
    assert_cut(failed["error"].as_str().expect("an error"), 64 << 10);
    let failed_id = failed["runId"].as_str().expect("a run id").to_string();

    // Five results of 15 MiB each (75 MiB together, over the socket's 64 MiB answer cap).
    let mut big = Vec::new();
    for _ in 0..5 {
        let done = hostile(state, json!({ "case": "huge-result", "n": 15 << 20 }), 0);
        assert_eq!(done["status"], "completed", "{:.300}", done.to_string());
        big.push(done["runId"].as_str().expect("a run id").to_string());
    }
    // A result over `maxResultBytes` (16 MiB) is refused with a typed failure.
    let over = hostile(state, json!({ "case": "huge-result", "n": 17 << 20 }), 1);
    assert_eq!(
        (over["failure"]["type"].as_str(), over["failure"]["kind"].as_str()),
        (Some("sandbox_limit"), Some("maxResultBytes")),
        "{over:#}"
    );

    // The listing answers: summaries, no results (their size only), short messages.
    let runs = json_of(state, &["runs"], 0);
    let runs = runs.as_array().expect("a list");
    assert_eq!(runs.len(), 7, "{runs:#?}");
    for run in runs {
        assert!(run.get("result").is_none(), "a listing carries no result: {run:#}");
    }
    let listed_big: Vec<&Value> = runs.iter().filter(|r| big.iter().any(|id| r["runId"] == id.as_str())).collect();
    assert_eq!(listed_big.len(), 5);
    for run in listed_big {
        assert_eq!(run["resultBytes"], (15 << 20) + 2, "the result's size: {run:#}");
    }
    let listed_failed = runs.iter().find(|r| r["runId"] == failed_id.as_str()).expect("the failed run is listed");
    assert_cut(listed_failed["failure"]["message"].as_str().expect("a message"), 1 << 10);
    assert_cut(listed_failed["error"].as_str().expect("an error"), 1 << 10);
    let table = factory_in(state, &["runs"]);
    assert!(table.status.success(), "{}", stderr(&table));
    assert_eq!(String::from_utf8_lossy(&table.stdout).lines().count(), 8, "a header and seven rows");

    // Each run reads on its own: a big result whole, the failed run's cut message.
    let shown = json_of(state, &["show", &big[0]], 0);
    assert_eq!(shown["result"].as_str().map(str::len), Some(15 << 20));
    let shown = json_of(state, &["show", &failed_id], 0);
    assert_cut(shown["failure"]["message"].as_str().expect("a message"), 64 << 10);
    let text = factory_in(state, &["show", &failed_id]);
    assert!(text.status.success(), "{}", stderr(&text));
    assert!(String::from_utf8_lossy(&text.stdout).contains("[truncated]"));

    // The control socket pages the listing: `limit`, then `after` the last one seen.
    let socket = state.join("control.sock");
    let first = raw(&socket, json!({ "op": "runs", "scope": "owner", "limit": 4 }));
    let first = first["body"]["ok"]["runs"].as_array().unwrap_or_else(|| panic!("{first}")).clone();
    assert_eq!(first.len(), 4);
    let after = first[3]["runId"].as_str().unwrap();
    let rest = raw(&socket, json!({ "op": "runs", "scope": "owner", "after": after, "limit": 4 }));
    let rest = rest["body"]["ok"]["runs"].as_array().unwrap_or_else(|| panic!("{rest}")).clone();
    assert_eq!(rest.len(), 3);
    let paged: Vec<&Value> = first.iter().chain(&rest).map(|r| &r["runId"]).collect();
    let whole: Vec<&Value> = runs.iter().map(|r| &r["runId"]).collect();
    assert_eq!(paged, whole, "the pages are the listing, in order");
    let unknown = raw(&socket, json!({ "op": "runs", "scope": "owner", "after": "no-such-run" }));
    assert_eq!(unknown["body"]["err"]["code"], "not_found", "{unknown}");

    // The session goes on: a new run works and is listed.
    let fresh = hostile(state, json!({ "case": "log-flood", "n": 3 }), 0);
    assert_eq!(fresh["status"], "completed", "{fresh:#}");
    assert_eq!(json_of(state, &["runs"], 0).as_array().map(Vec::len), Some(8));
}

/// `factory rm ID` as the local user (the owner): the exit code and both streams.
fn rm(state: &Path, ids: &[&str], json: bool) -> (Option<i32>, String, String) {
    let mut args = vec!["rm"];
    args.extend_from_slice(ids);
    if json {
        args.push("--json");
    }
    let out = factory_in(state, &args);
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned(), stderr(&out))
}

#[test]
fn factory_rm_deletes_runs_and_their_journals_and_refuses_a_running_one() {
    let state = tempfile::tempdir().expect("a state dir");
    let state = state.path();
    let _serve = serve(state);
    let ids: Vec<String> = (0..3)
        .map(|_| {
            let done = hostile(state, json!({ "case": "log-flood", "n": 5 }), 0);
            assert_eq!(done["status"], "completed", "{done:#}");
            done["runId"].as_str().expect("a run id").to_string()
        })
        .collect();
    let progress = json_of(state, &["progress", &ids[0]], 0);
    assert!(!progress.as_array().expect("entries").is_empty(), "the run has a journal to delete");
    assert_eq!(component_rows(state), 1, "three runs of one component: one blob");

    // One run: gone from the listing, its detail and its progress; the others stay whole.
    let (code, out, err) = rm(state, &[&ids[0]], false);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.trim(), format!("removed {}", ids[0]));
    for args in [vec!["show", ids[0].as_str()], vec!["progress", ids[0].as_str()]] {
        let out = factory_in(state, &args);
        assert!(!out.status.success() && stderr(&out).contains("not_found"), "{args:?}: {}", stderr(&out));
    }
    let listed: Vec<String> = json_of(state, &["runs"], 0)
        .as_array()
        .expect("a list")
        .iter()
        .map(|r| r["runId"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(listed, ids[1..].to_vec());
    assert_eq!(json_of(state, &["show", &ids[1]], 0)["status"], "completed");

    // An unknown id is `not_found`; the others in the same command are removed all the same.
    let (code, out, err) = rm(state, &["no-such-run", &ids[1]], true);
    assert_eq!(code, Some(1), "{err}");
    let answers: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(answers[0]["error"]["code"], "not_found", "{answers:#}");
    assert_eq!(answers[1], json!({ "runId": ids[1], "removed": true }));

    // A session sees only its own runs: a request scoped to another session cannot remove one.
    let socket = state.join("control.sock");
    let refused = raw(&socket, json!({ "op": "remove", "scope": {"session": "other"}, "runId": ids[2] }));
    assert_eq!(refused["body"]["err"]["code"], "not_found", "{refused}");
    assert_eq!(json_of(state, &["show", &ids[2]], 0)["status"], "completed");
    let removed = raw(&socket, json!({ "op": "remove", "scope": {"session": "default"}, "runId": ids[2] }));
    assert_eq!(removed["body"]["ok"]["removed"]["runId"], ids[2].as_str(), "{removed}");

    // A running run is refused with `already_active` and keeps running; cancelled, it goes.
    let component = common::component("hostile");
    let args = json!({ "case": "spin" }).to_string();
    let out = factory_in(state, &["run", component.to_str().unwrap(), "--yes", "-q", "--detach", "--args", &args]);
    assert!(out.status.success(), "{}", stderr(&out));
    let spinning = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let (code, _, err) = rm(state, &[&spinning], false);
    assert_eq!(code, Some(1));
    assert!(err.contains("already_active"), "{err}");
    assert_eq!(json_of(state, &["show", &spinning], 0)["status"], "running");
    assert_eq!(json_of(state, &["cancel", &spinning], 0)["status"], "cancelled");
    let (code, _, err) = rm(state, &[&spinning], false);
    assert_eq!(code, Some(0), "{err}");

    // The session goes on: nothing is listed, the component went with its last run (`factory
    // stats`: no row of components), a new run works and stores it again.
    assert_eq!(json_of(state, &["runs"], 0), json!([]));
    assert_eq!(component_rows(state), 0, "the component's blob went with its last run");
    let fresh = hostile(state, json!({ "case": "log-flood", "n": 2 }), 0);
    assert_eq!(fresh["status"], "completed", "{fresh:#}");
    assert_eq!(json_of(state, &["runs"], 0).as_array().map(Vec::len), Some(1));
    assert_eq!(component_rows(state), 1, "stored again by the new run");
}

/// The rows of components and registrations `factory stats` counts.
fn component_rows(state: &Path) -> u64 {
    let stats = json_of(state, &["stats"], 0);
    let parts = stats["parts"].as_array().expect("the parts");
    let components = parts.iter().find(|p| p["part"] == "components and registrations");
    components.and_then(|p| p["rows"].as_u64()).unwrap_or(0)
}

/// The ids `factory runs` lists, in creation order.
fn listed(state: &Path) -> Vec<String> {
    json_of(state, &["runs"], 0)
        .as_array()
        .expect("a list")
        .iter()
        .map(|r| r["runId"].as_str().expect("a run id").to_string())
        .collect()
}

/// Start the hostile guest's `spin` case in the background: a run that executes until cancelled.
fn spinning(state: &Path) -> String {
    let component = common::component("hostile");
    let args = json!({ "case": "spin" }).to_string();
    let out = factory_in(state, &["run", component.to_str().unwrap(), "--yes", "-q", "--detach", "--args", &args]);
    assert!(out.status.success(), "{}", stderr(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn factory_gc_deletes_the_ended_runs_its_policy_no_longer_keeps_and_never_a_running_one() {
    let state = tempfile::tempdir().expect("a state dir");
    let state = state.path();
    let _serve = serve(state);
    let spin = spinning(state);
    let ids: Vec<String> = (0..4)
        .map(|_| hostile(state, json!({ "case": "log-flood", "n": 3 }), 0)["runId"].as_str().unwrap().to_string())
        .collect();

    // No policy (no config, no flag): refused, saying how to give one.
    let out = factory_in(state, &["gc"]);
    assert!(!out.status.success() && stderr(&out).contains("no retention policy"), "{}", stderr(&out));

    // A dry run says which; nothing goes.
    let dry = json_of(state, &["gc", "--keep-last", "1", "--dry-run"], 0);
    assert_eq!(dry["dryRun"], true);
    assert_eq!(dry["removed"], json!(ids[..3]), "{dry:#}");
    assert_eq!(listed(state).len(), 5);

    // The newest two of the factory are kept, the running one too (it is not ended).
    let done = json_of(state, &["gc", "--keep-last", "2"], 0);
    assert_eq!(done["removed"], json!(ids[..2]), "{done:#}");
    assert_eq!(done["kept"], 3);
    assert_eq!(listed(state), [std::slice::from_ref(&spin), &ids[2..]].concat());
    assert_eq!(json_of(state, &["show", &spin], 0)["status"], "running");

    // Runs ended a moment ago are older than 0 days: every ended run goes, the running one stays.
    let done = json_of(state, &["gc", "--keep-days", "0"], 0);
    assert_eq!(done["removed"], json!(ids[2..]), "{done:#}");
    assert_eq!(listed(state), std::slice::from_ref(&spin));
    assert_eq!(json_of(state, &["cancel", &spin], 0)["status"], "cancelled");
}

#[test]
fn factory_serve_applies_the_config_files_retention_policy_on_its_schedule() {
    let state = tempfile::tempdir().expect("a state dir");
    let state = state.path();
    std::fs::write(state.join("factory.toml"), "[retention]\nkeep_last = 1\ninterval_seconds = 1\n").expect("config");
    let _serve = serve(state);
    let spin = spinning(state);
    let ids: Vec<String> = (0..3)
        .map(|_| hostile(state, json!({ "case": "log-flood", "n": 3 }), 0)["runId"].as_str().unwrap().to_string())
        .collect();
    // The service's passes delete the older ended runs by themselves; the running one stays.
    let until = |want: Vec<String>| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        loop {
            let now = listed(state);
            if now == want {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "listed {now:?}, expected {want:?}");
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    };
    until(vec![spin.clone(), ids[2].clone()]);
    assert_eq!(json_of(state, &["show", &spin], 0)["status"], "running");
    // Cancelled, it is an ended run older than the newest: the next pass deletes it.
    assert_eq!(json_of(state, &["cancel", &spin], 0)["status"], "cancelled");
    until(vec![ids[2].clone()]);
}
