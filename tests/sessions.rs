//! Sessions are owner scopes (issue 19), through the real `factory` binary: runs started in
//! session `a` and session `b` are listed per session by `factory runs`; the local user is
//! the state directory's owner, so `factory runs --all` lists both with their sessions and
//! `show`, `progress`, `wait`, `cancel`, `resume` and `watch` work on a run of any session,
//! whether this process opens the store or talks to the `factory serve` holding it. A raw
//! request on the control socket scoped to session `a` cannot see, read or cancel `b`'s run.

mod common;

use common::{factory_cmd, factory_in, stderr, stdout_json};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

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
    // It says it holds the store, then (runs to recover resumed) that it serves.
    let first =
        lines.by_ref().map(|l| l.expect("a line")).find(|l| l.contains("serving")).expect("serve says it listens");
    assert!(first.starts_with("factory serve: pid "), "{first}");
    std::thread::spawn(move || for _ in lines {});
    Serve(child)
}

/// `factory --session SESSION ARGS...` against `state`.
fn as_session(state: &Path, session: &str, args: &[&str]) -> std::process::Output {
    let mut all = vec!["--session", session];
    all.extend_from_slice(args);
    factory_in(state, &all)
}

/// `factory --session SESSION ARGS... --json`, which must succeed: its JSON.
fn json_as(state: &Path, session: &str, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let out = as_session(state, session, &all);
    assert!(out.status.success(), "{all:?} in session {session}: {}", stderr(&out));
    stdout_json(&out)
}

/// The run ids of a listing, with their sessions.
fn listed(runs: &Value) -> Vec<(String, String)> {
    let mut ids: Vec<(String, String)> = runs
        .as_array()
        .expect("a list")
        .iter()
        .map(|r| {
            (r["runId"].as_str().expect("a run id").to_string(), r["session"].as_str().unwrap_or("(none)").to_string())
        })
        .collect();
    ids.sort();
    ids
}

/// One raw request line on the control socket; the answer line, parsed.
fn raw(socket: &Path, body: Value) -> Value {
    let mut stream = std::os::unix::net::UnixStream::connect(socket).expect("connect to the control socket");
    stream
        .write_all(format!("{}\n", json!({ "wire": factory_host::service::WIRE_VERSION, "body": body })).as_bytes())
        .expect("send");
    let mut answer = String::new();
    BufReader::new(stream).read_line(&mut answer).expect("an answer");
    serde_json::from_str(&answer).unwrap_or_else(|e| panic!("not JSON ({e}): {answer}"))
}

/// One raw request line on the control socket; every line of the stream it answers with, until
/// the service closes it, parsed.
fn raw_stream(socket: &Path, body: Value) -> Vec<Value> {
    let mut stream = std::os::unix::net::UnixStream::connect(socket).expect("connect to the control socket");
    stream
        .write_all(format!("{}\n", json!({ "wire": factory_host::service::WIRE_VERSION, "body": body })).as_bytes())
        .expect("send");
    BufReader::new(stream)
        .lines()
        .map(|line| {
            let line = line.expect("a line");
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
        })
        .collect()
}

/// A state dir with `probe` registered and trusted, and a slow script backend as default.
fn prepared_state() -> tempfile::TempDir {
    common::slow_probe_state(200)
}

#[test]
fn a_session_lists_its_own_runs_and_the_owner_sees_and_controls_every_session() {
    let state = prepared_state();
    let state = state.path();
    let quick = ["run", "probe", "--args", r#"{"case":"fanout","n":2}"#, "-q"];

    // In-process (no daemon): one run in each session.
    let a1 = json_as(state, "a", &quick);
    let b1 = json_as(state, "b", &quick);
    assert_eq!((a1["status"].as_str(), b1["status"].as_str()), (Some("completed"), Some("completed")), "{a1:#} {b1:#}");
    let a1 = a1["runId"].as_str().unwrap().to_string();
    let b1 = b1["runId"].as_str().unwrap().to_string();
    let own = |session: &str| json_as(state, session, &["runs"]);
    assert_eq!(listed(&own("a")), [(a1.clone(), "a".to_string())]);
    assert_eq!(listed(&own("b")), [(b1.clone(), "b".to_string())]);
    let mut both = vec![(a1.clone(), "a".to_string()), (b1.clone(), "b".to_string())];
    both.sort();
    assert_eq!(listed(&json_as(state, "a", &["runs", "--all"])), both);
    // The table has a SESSION column with --all, and each row names its session.
    let table = as_session(state, "a", &["runs", "--all"]);
    let text = String::from_utf8_lossy(&table.stdout).into_owned();
    assert!(text.lines().next().is_some_and(|head| head.contains("SESSION")), "{text}");
    let row = text.lines().find(|l| l.starts_with(&b1)).unwrap_or_else(|| panic!("no row for {b1}: {text}"));
    assert!(row.split_whitespace().nth(1) == Some("b"), "{row}");
    let own_table = String::from_utf8_lossy(&as_session(state, "a", &["runs"]).stdout).into_owned();
    assert!(!own_table.contains(&b1) && !own_table.contains("SESSION"), "{own_table}");
    // The owner reads b's run from session a.
    let shown = json_as(state, "a", &["show", &b1]);
    assert_eq!((shown["runId"].as_str(), shown["session"].as_str()), (Some(b1.as_str()), Some("b")), "{shown:#}");
    let text = String::from_utf8_lossy(&as_session(state, "a", &["show", &b1]).stdout).into_owned();
    assert!(text.lines().any(|l| l == "session:   b"), "{text}");
    let page = json_as(state, "a", &["progress", &b1]);
    assert!(!page.as_array().expect("entries").is_empty(), "{page:#}");

    // Through `factory serve` (the control socket): a slow run in session b, controlled
    // from session a.
    let _serve = serve(state);
    let out = as_session(
        state,
        "b",
        &["run", "probe", "--args", r#"{"case":"fanout","n":40}"#, "--max-concurrent-subagents", "1", "--detach", "-q"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let b2 = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let shown = json_as(state, "a", &["show", &b2]);
        if shown["status"] == "running" && shown["accounting"]["agentsSpawned"].as_u64() >= Some(2) {
            break;
        }
        assert!(Instant::now() < deadline, "b's run never got going: {shown:#}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(listed(&own("a")), [(a1.clone(), "a".to_string())], "a lists only its own runs through the service");
    let all = listed(&json_as(state, "a", &["runs", "--all"]));
    assert!(all.contains(&(b2.clone(), "b".to_string())) && all.len() == 3, "{all:?}");

    // A request scoped to session a, raw on the socket, sees nothing of b's.
    let socket = state.join("control.sock");
    for op in ["envelope", "detail", "wait", "cancel"] {
        let answer = raw(&socket, json!({ "op": op, "scope": {"session": "a"}, "runId": b2 }));
        assert_eq!(answer["body"]["err"]["code"], "not_found", "{op}: {answer}");
    }
    let answer = raw(&socket, json!({ "op": "progress", "scope": {"session": "a"}, "runId": b2, "query": {} }));
    assert_eq!(answer["body"]["err"]["code"], "not_found", "{answer}");
    let answer = raw_stream(&socket, json!({ "op": "follow", "scope": {"session": "a"}, "runId": b2 }));
    assert_eq!(answer.len(), 1, "a refused follow is one answer: {answer:?}");
    assert_eq!(answer[0]["body"]["err"]["code"], "not_found", "{answer:?}");
    let answer = raw(&socket, json!({ "op": "resume", "scope": {"session": "a"}, "runId": b1, "consent": "any" }));
    assert_eq!(answer["body"]["err"]["code"], "not_found", "{answer}");
    let answer = raw(&socket, json!({ "op": "runs", "scope": {"session": "a"} }));
    assert_eq!(listed(&answer["body"]["ok"]["runs"]), [(a1.clone(), "a".to_string())], "{answer}");
    // Scoped to b, or as the owner, it is there.
    let answer = raw(&socket, json!({ "op": "envelope", "scope": {"session": "b"}, "runId": b2 }));
    assert_eq!(answer["body"]["ok"]["envelope"]["session"], "b", "{answer}");
    let answer = raw(&socket, json!({ "op": "runs", "scope": "owner" }));
    assert_eq!(listed(&answer["body"]["ok"]["runs"]).len(), 3, "{answer}");
    // Still running: the session-scoped cancel above touched nothing.
    assert_eq!(json_as(state, "b", &["show", &b2])["status"], "running");

    // The owner cancels b's run from session a, and resumes it (in session b) to the end.
    let cancelled = json_as(state, "a", &["cancel", &b2]);
    assert_eq!(cancelled["status"], "cancelled", "{cancelled:#}");
    let resumed = json_as(state, "a", &["resume", &b2, "--backend", "dry-run", "-q"]);
    assert_eq!((resumed["status"].as_str(), resumed["attempts"].as_u64()), (Some("completed"), Some(2)), "{resumed:#}");
    assert_eq!(resumed["session"], "b", "a resumed run stays in its session");
    let waited = json_as(state, "a", &["wait", &b2]);
    assert_eq!(waited["status"], "completed");
    // Following the finished run on the socket, as its session, from entry 3: one stream of
    // every later entry in order, then the envelope, then the end.
    let lines = raw_stream(&socket, json!({ "op": "follow", "scope": {"session": "b"}, "runId": b2, "afterSeq": 3 }));
    assert_eq!(lines[0]["body"]["ok"], "following", "{:?}", lines[0]);
    let (last, entries) = lines[1..].split_last().expect("entries and an envelope");
    assert_eq!(last["body"]["ended"]["status"], "completed", "{last}");
    assert_eq!(last["body"]["ended"]["runId"], b2.as_str(), "{last}");
    let seqs: Vec<u64> =
        entries.iter().map(|e| e["body"]["progress"]["seq"].as_u64().expect("a progress entry")).collect();
    assert_eq!(seqs.first(), Some(&4), "{seqs:?}");
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "in order, none missing: {seqs:?}");
    let page = raw(
        &socket,
        json!({ "op": "progress", "scope": "owner", "runId": b2, "query": {"afterSeq": 3, "limit": 1000} }),
    );
    let stored: Vec<u64> =
        page["body"]["ok"]["progress"].as_array().expect("a page").iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, stored, "the stream hands out what the run journaled after entry 3");
    // Started and followed on one connection: `started`, every entry from the first, the
    // envelope; a start that is refused is one error answer.
    let start = json!({ "op": "run", "session": "b", "component": {"registered": "probe"}, "args": {"case": "fanout", "n": 2}, "consent": "any" });
    let lines = raw_stream(&socket, json!({ "op": "startFollowing", "start": start }));
    let started =
        lines[0]["body"]["ok"]["started"]["runId"].as_str().unwrap_or_else(|| panic!("{:?}", lines[0])).to_string();
    let (last, entries) = lines[1..].split_last().expect("entries and an envelope");
    assert_eq!(
        (last["body"]["ended"]["runId"].as_str(), &last["body"]["ended"]["status"]),
        (Some(started.as_str()), &json!("completed")),
        "{last}"
    );
    let seqs: Vec<u64> =
        entries.iter().map(|e| e["body"]["progress"]["seq"].as_u64().expect("a progress entry")).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "every entry from the first, in order");
    assert_eq!(json_as(state, "b", &["show", &started])["session"], "b");
    let refused = raw_stream(
        &socket,
        json!({ "op": "startFollowing", "start": { "op": "run", "session": "b", "component": {"registered": "nope"} } }),
    );
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0]["body"]["err"]["code"], "unknown_factory", "{refused:?}");
    let out = as_session(state, "a", &["watch", &b2, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout_json(&out)["status"], "completed");
    let mut bs = vec![(b1.clone(), "b".to_string()), (b2.clone(), "b".to_string()), (started.clone(), "b".to_string())];
    bs.sort();
    assert_eq!(listed(&own("b")), bs);
}

/// The library's own rule, without the CLI: `Host` reads and controls on behalf of a
/// [`Scope`]; a session sees its own runs only, the owner every session's, and a run keeps
/// its session whoever resumes it.
#[tokio::test]
async fn the_host_answers_each_scope_with_what_it_sees() {
    use factory_host::{Error, Host, HostConfig, ResumeOptions, RunOptions, Scope};
    let host = Host::new(HostConfig { cache_dir: None, ..HostConfig::default() }).expect("an in-memory host");
    let probe = host.load_file(&common::component("probe")).await.expect("probe loads");
    let options = RunOptions {
        session: Some("alice".into()),
        args: Some(json!({"case": "fanout", "n": 2})),
        limits: factory_host::Limits { max_total_subagents: Some(1), ..Default::default() },
        ..Default::default()
    };
    let run = host.run(&probe, options).await.expect("the run ends");
    assert_eq!((run.status, run.session.as_deref()), (factory_host::RunStatus::Error, Some("alice")), "{run:#?}");
    let id = run.run_id.clone();
    assert!(host.runs("bob").await.unwrap().is_empty());
    let all = host.runs(Scope::Owner).await.unwrap();
    assert_eq!((all.len(), all[0].session.as_deref()), (1, Some("alice")));
    assert!(matches!(host.envelope("bob", &id).await, Err(Error::NotFound(_))));
    assert!(
        host.owned_by("alice", &id).await && host.owned_by(Scope::Owner, &id).await && !host.owned_by("bob", &id).await
    );
    assert_eq!(host.detail(Scope::Owner, &id).await.unwrap().envelope.session.as_deref(), Some("alice"));
    let as_bob = ResumeOptions { scope: Some("bob".into()), ..Default::default() };
    assert!(matches!(host.resume(&id, as_bob).await, Err(Error::NotFound(_))));
    let as_owner = ResumeOptions {
        scope: Some(Scope::Owner),
        limits: factory_host::Limits { max_total_subagents: Some(5), ..Default::default() },
        ..Default::default()
    };
    let resumed = host.resume(&id, as_owner).await.expect("the owner resumes alice's run");
    assert_eq!((resumed.status, resumed.attempts), (factory_host::RunStatus::Completed, 2), "{resumed:#?}");
    assert_eq!(resumed.session.as_deref(), Some("alice"), "a resumed run stays in its session");
    assert_eq!(host.runs("alice").await.unwrap().len(), 1);
}
