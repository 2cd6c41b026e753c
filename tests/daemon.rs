//! The local service of a state directory, through the real binary: a front door that
//! finds no service starts one and is its client (racing front doors end up with one), it
//! logs to a 0600 file and exits by itself when idle, a stale socket after a crash is
//! replaced, `--no-daemon` opens the store in-process, a foreground `factory run` survives
//! `kill -9` of its terminal while Ctrl-C still cancels, and `factory serve --http` attaches
//! to the running service instead of failing on the lock.

mod common;

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `factory ARGS` against `state` in the default mode: through the state dir's service.
fn factory(state: &Path, args: &[&str]) -> Command {
    let mut cmd = common::factory_cmd(state, args);
    cmd.env_remove("FACTORY_NO_DAEMON").env("FACTORY_IDLE_SECONDS", "30");
    cmd
}

fn output(state: &Path, args: &[&str]) -> Output {
    factory(state, args).output().expect("factory starts")
}

fn ok_json(state: &Path, args: &[&str]) -> Value {
    let out = output(state, args);
    assert!(out.status.success(), "{args:?}: {}", common::stderr(&out));
    common::stdout_json(&out)
}

use common::service::{alive, live_services, logged_services};

fn signal(pid: i32, signal: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
}

/// Stops every service of a state dir when a test ends, however it ends.
struct Services(PathBuf);

impl Drop for Services {
    fn drop(&mut self) {
        // Twice: a front door that was still shutting down may have started one more.
        for _ in 0..2 {
            for pid in live_services(&self.0) {
                signal(pid, nix::sys::signal::Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn mode(path: &Path) -> u32 {
    std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(path).unwrap().permissions()) & 0o777
}

#[test]
fn racing_front_doors_start_one_service_and_share_it() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let _services = Services(state.clone());
    let racers: Vec<Child> = (0..4)
        .map(|_| factory(&state, &["runs", "--json"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap())
        .collect();
    for racer in racers {
        let out = racer.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", common::stderr(&out));
        assert_eq!(common::stdout_json(&out), serde_json::json!([]));
    }
    let live = live_services(&state);
    assert_eq!(
        live.len(),
        1,
        "one service for the state dir: {live:?}\n{}",
        std::fs::read_to_string(state.join("serve.log")).unwrap()
    );
    assert_eq!(mode(&state.join("serve.log")), 0o600, "the service's log is the owner's only");
    // Later front doors use it; none starts another.
    let started = logged_services(&state).len();
    ok_json(&state, &["runs", "--json"]);
    assert_eq!(logged_services(&state).len(), started);
    assert_eq!(live_services(&state), live);
}

#[test]
fn an_idle_service_exits_and_a_stale_socket_after_a_crash_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let _services = Services(state.clone());
    let out = factory(&state, &["runs"]).env("FACTORY_IDLE_SECONDS", "1").output().unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    let first = live_services(&state);
    assert_eq!(first.len(), 1);
    wait_until("the idle service exits", || !alive(first[0]));
    let log = std::fs::read_to_string(state.join("serve.log")).unwrap();
    assert!(log.contains("idle for 1 s with no run and no client; exiting"), "{log}");
    assert!(!state.join("control.sock").exists(), "an idle exit removes its socket");

    // A crash leaves its socket behind: a file nobody listens on.
    drop(std::os::unix::net::UnixListener::bind(state.join("control.sock")).unwrap());
    assert!(state.join("control.sock").exists());
    ok_json(&state, &["runs", "--json"]);
    let second = live_services(&state);
    assert_eq!(second.len(), 1);
    // And a service killed with -9 (socket and all left behind) is replaced the same way.
    signal(second[0], nix::sys::signal::Signal::SIGKILL);
    wait_until("the killed service is gone", || !alive(second[0]));
    ok_json(&state, &["runs", "--json"]);
    let third = live_services(&state);
    assert_eq!(third.len(), 1);
    assert_ne!(third, second);
}

#[test]
fn no_daemon_opens_the_store_in_this_process() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let _services = Services(state.clone());
    for (var, flag) in [(Some("1"), None), (None, Some("--no-daemon"))] {
        let mut cmd = factory(&state, &["runs", "--json"]);
        if let Some(value) = var {
            cmd.env("FACTORY_NO_DAEMON", value);
        }
        if let Some(flag) = flag {
            cmd.arg(flag);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", common::stderr(&out));
        assert!(!state.join("serve.log").exists(), "no service was started");
        assert!(!state.join("control.sock").exists());
    }
}

/// A slow fan-out of `n` agents (40 ms each, 4 at a time) in the foreground, through the
/// service.
fn start_fanout(state: &Path, n: usize) -> Child {
    let script = state.parent().unwrap().join("slow.json");
    std::fs::write(&script, r#"{"rules":[{"labelPrefix":"t:","reply":{"text":"ok"},"latencyMs":40}]}"#).unwrap();
    let probe = common::component("probe");
    let args = format!(r#"{{"case":"fanout","n":{n}}}"#);
    let backend = format!("script:{}", script.display());
    factory(
        state,
        &[
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
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("factory run starts")
}

/// The id of the state dir's running run, once it has spawned `spawned` agents.
fn running(state: &Path, spawned: u64) -> String {
    let mut id = String::new();
    wait_until("the run gets going", || {
        let runs = ok_json(state, &["runs", "--json"]);
        match runs.as_array().and_then(|r| r.iter().find(|r| r["status"] == "running")) {
            Some(run) if run["accounting"]["agentsSpawned"].as_u64().unwrap_or(0) >= spawned => {
                id = run["runId"].as_str().unwrap().to_string();
                true
            }
            _ => false,
        }
    });
    id
}

#[test]
fn a_foreground_run_outlives_a_killed_terminal_and_ctrl_c_cancels_it() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let _services = Services(state.clone());
    let mut client = start_fanout(&state, 60);
    let run_id = running(&state, 4);
    assert_eq!(ok_json(&state, &["show", &run_id, "--json"])["status"], "running");
    // The terminal goes away; the run is the service's and carries on.
    client.kill().unwrap();
    client.wait().unwrap();
    let done = ok_json(&state, &["wait", &run_id, "--json"]);
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(done["accounting"]["agentsSpawned"], 60);
    assert_eq!(done["attempts"], 1, "no second attempt: it never stopped");

    // Ctrl-C in the terminal of a foreground run is a deliberate stop: it cancels the run.
    let client = start_fanout(&state, 400);
    let second = running(&state, 4);
    assert_ne!(second, run_id);
    signal(client.id() as i32, nix::sys::signal::Signal::SIGINT);
    let out = client.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", common::stderr(&out));
    assert_eq!(common::stdout_json(&out)["status"], "cancelled");
    let shown = ok_json(&state, &["show", &second, "--json"]);
    assert_eq!(shown["status"], "cancelled");
    assert!(shown["accounting"]["agentsSpawned"].as_u64().unwrap() < 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_http_attaches_to_the_running_service() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let _services = Services(state.clone());
    let probe = common::component("probe");
    let out = output(&state, &["run", probe.to_str().unwrap(), "--yes", "--args", r#"{"case":"steps"}"#, "--json"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let run_id = common::stdout_json(&out)["runId"].as_str().unwrap().to_string();
    let service = live_services(&state);
    assert_eq!(service.len(), 1);

    let mut http = factory(&state, &["serve", "--http", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(http.stderr.take().unwrap()).lines();
    let mut said = Vec::new();
    let base = loop {
        let line = lines.next().expect("serve says where it listens").unwrap();
        said.push(line.clone());
        if let Some(rest) = line.split("HTTP API on http://").nth(1) {
            break format!("http://{}", rest.split("/api/").next().unwrap());
        }
    };
    std::thread::spawn(move || for _ in lines {});
    assert!(said.iter().any(|l| l.contains("attached to the service")), "{said:?}");
    let token = std::fs::read_to_string(state.join("http.token")).unwrap();
    let get = |path: &str| {
        let (base, token) = (base.clone(), token.clone());
        let path = path.to_string();
        async move {
            let response = reqwest::Client::new().get(format!("{base}{path}")).bearer_auth(token).send().await.unwrap();
            (response.status().as_u16(), response.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (status, runs) = get("/api/runs").await;
    assert_eq!(status, 200, "{runs}");
    // A cassette rides only with the CLI's own start: the HTTP API's bodies cannot carry one
    // nor ask for a recording.
    let replay = serde_json::json!({"shown": "tape.jsonl", "entries": [], "thenLive": false});
    for (path, body) in [
        ("/api/runs".to_string(), serde_json::json!({"name": "probe", "replay": replay})),
        (format!("/api/runs/{run_id}/resume"), serde_json::json!({"replay": replay})),
        ("/api/runs".to_string(), serde_json::json!({"name": "probe", "record": true})),
    ] {
        let response =
            reqwest::Client::new().post(format!("{base}{path}")).bearer_auth(&token).json(&body).send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        assert_eq!(status, 400, "{path}: {text}");
        assert!(text.contains("unknown field `replay`") || text.contains("unknown field `record`"), "{path}: {text}");
    }
    assert!(runs.as_array().unwrap().iter().any(|r| r["runId"] == run_id.as_str()), "{runs:#}");
    // Still one service: the HTTP front door is its client, not a second owner.
    assert_eq!(live_services(&state), service);

    // The service dies: the attached front door starts another, which serves the same runs.
    signal(service[0], nix::sys::signal::Signal::SIGKILL);
    let mut recovered = false;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !recovered && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (status, detail) = get(&format!("/api/runs/{run_id}")).await;
        recovered = status == 200 && detail["status"] == "completed";
    }
    assert!(recovered, "the attached HTTP server lost the service for good");
    // (Its banner comes after it has answered: recovery of halted runs comes first.)
    wait_until("one new service says it serves", || {
        let now = live_services(&state);
        now.len() == 1 && now != service
    });
    signal(http.id() as i32, nix::sys::signal::Signal::SIGTERM);
    let _ = http.wait();
}

#[test]
fn after_kill_9_of_the_service_its_foreground_run_restarts_it_and_follows_the_recovered_run() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let _services = Services(state.clone());
    let client = start_fanout(&state, 200);
    let run_id = running(&state, 8);
    let first = live_services(&state);
    assert_eq!(first.len(), 1);
    signal(first[0], nix::sys::signal::Signal::SIGKILL);
    wait_until("the killed service is gone", || !alive(first[0]));
    // The terminal that started it sees its service gone, starts it again (which resumes
    // the run) and follows the run on to its end from where it was.
    let out = client.wait_with_output().unwrap();
    let stderr = common::stderr(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("the service went away") && stderr.contains("starting it again"), "{stderr}");
    let shown = common::stdout_json(&out);
    assert_eq!(
        (shown["runId"].as_str(), &shown["status"]),
        (Some(run_id.as_str()), &Value::from("completed")),
        "{shown:#}"
    );
    assert_eq!(shown["attempts"], 2, "one recovery: {shown:#}");
    // Another front door sees the same.
    let done = ok_json(&state, &["wait", &run_id, "--json"]);
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(done["attempts"], 2, "one recovery: {done:#}");
    // (That no journaled call is paid twice is tests/recover.rs's: it kills at a known point.)
    let log = std::fs::read_to_string(state.join("serve.log")).unwrap();
    assert!(log.contains(&format!("recovering run {run_id}")), "{log}");
}

/// Paths a caller names are the caller's: run from a scratch directory, a relative script
/// backend, grant and cassette reach the service (which runs in the state directory) as the
/// caller meant them: a cassette is written and read here, and travels with the run.
#[test]
fn relative_paths_are_read_in_the_callers_directory() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let _services = Services(state.clone());
    let work = dir.path().join("work");
    std::fs::create_dir_all(work.join("data")).unwrap();
    std::fs::write(
        work.join("rules.json"),
        r#"{"rules":[{"labelPrefix":"t:","reply":{"text":"from the caller's rules"}}]}"#,
    )
    .unwrap();
    std::fs::write(
        work.join("f.js"),
        "import { defineFactory } from \"factory\";\nexport default defineFactory({ meta: { name: \"rel\", description: \"d\" }, \
         run: async (ctx) => ({ r: await ctx.agent(\"hello\", { label: \"t:1\" }) }) });\n",
    )
    .unwrap();
    let in_work = |args: &[&str], service: bool| {
        let mut cmd = if service { factory(&state, args) } else { common::factory_cmd(&state, args) };
        cmd.current_dir(&work).output().expect("factory starts")
    };
    let run = ["run", "f.js", "--yes", "--json", "-q", "--backend", "script:rules.json", "--allow-read", "data"];
    let out = in_work(&run, true);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let envelope = common::stdout_json(&out);
    assert_eq!(envelope["status"], "completed", "{envelope:#}");
    assert_eq!(envelope["result"]["r"], "from the caller's rules");
    let service = live_services(&state);
    assert_eq!(service.len(), 1, "the run went through the service");

    let record = ["run", "f.js", "--yes", "--json", "-q", "--backend", "script:rules.json", "--record", "tape.json"];
    let out = in_work(&record, true);
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert!(work.join("tape.json").is_file(), "the cassette is written where the caller is");
    assert!(!state.join("service").join("tape.json").exists(), "not where the service runs");

    // Replayed while the service holds the store: no live call (the rules are gone).
    std::fs::remove_file(work.join("rules.json")).unwrap();
    let replay = ["run", "f.js", "--yes", "--json", "-q", "--replay", "tape.json"];
    let out = in_work(&replay, true);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let envelope = common::stdout_json(&out);
    assert_eq!(envelope["result"]["r"], "from the caller's rules");
    assert_eq!(envelope["backend"]["name"], "replay:tape.json", "{envelope:#}");
    assert_eq!(live_services(&state), service, "the service held the store throughout");
}

/// A factory of two calls, and a cassette of both recorded in a process of its own (whose
/// script backend is then deleted: nothing can answer live). Answers the work directory.
fn two_calls_and_their_cassette(dir: &Path, state: &Path) -> PathBuf {
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(work.join("rules.json"), r#"{"rules":[{"labelPrefix":"t:","reply":{"text":"recorded"}}]}"#).unwrap();
    std::fs::write(
        work.join("two.js"),
        "import { defineFactory } from \"factory\";\nexport default defineFactory({ meta: { name: \"two\", description: \"d\" }, \
         run: async (ctx) => ({ a: await ctx.agent(\"first\", { label: \"t:1\" }), \
         b: await ctx.agent(\"second\", { label: \"t:2\" }) }) });\n",
    )
    .unwrap();
    let record = ["run", "two.js", "--yes", "--json", "-q", "--backend", "script:rules.json", "--record", "full.jsonl"];
    let out = common::factory_cmd(state, &record).current_dir(&work).output().unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    std::fs::remove_file(work.join("rules.json")).unwrap();
    work
}

/// `--replay` through a running service: a run that misses a call ends resumable and a
/// resume with the whole cassette completes it; an entry whose request was tampered with
/// is never served (the service checks it again and says which line); a cassette over the
/// size bound is refused here before anything is sent.
#[test]
fn a_cassette_replays_and_resumes_through_the_running_service() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let _services = Services(state.clone());
    let work = two_calls_and_their_cassette(dir.path(), &state);
    let full = std::fs::read_to_string(work.join("full.jsonl")).unwrap();
    let lines: Vec<&str> = full.lines().collect();
    assert_eq!(lines.len(), 3, "a header and two exchanges: {full}");
    // The service holds the store from now on.
    ok_json(&state, &["runs", "--json"]);
    let service = live_services(&state);
    assert_eq!(service.len(), 1);
    let in_work = |args: &[&str]| factory(&state, args).current_dir(&work).output().expect("factory starts");

    // Only the first call recorded: the second misses, and the run waits to be resumed.
    let first: Vec<&str> = lines.iter().copied().filter(|l| !l.contains("\"t:2\"")).collect();
    std::fs::write(work.join("first.jsonl"), first.join("\n") + "\n").unwrap();
    let out = in_work(&["run", "two.js", "--yes", "--json", "-q", "--replay", "first.jsonl"]);
    assert!(!out.status.success(), "a miss fails the run");
    let missed = common::stdout_json(&out);
    assert_ne!(missed["status"], "completed", "{missed:#}");
    assert!(missed.to_string().contains("cassette miss: `first.jsonl`"), "{missed:#}");
    let run_id = missed["runId"].as_str().unwrap().to_string();
    let out = in_work(&["resume", &run_id, "--yes", "--json", "-q", "--replay", "full.jsonl"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let resumed = common::stdout_json(&out);
    assert_eq!((resumed["runId"].as_str(), &resumed["status"]), (Some(run_id.as_str()), &Value::from("completed")));
    assert_eq!(resumed["result"], serde_json::json!({"a": "recorded", "b": "recorded"}), "{resumed:#}");

    // With --replay-then-live the call it lacks goes to the service's backend for the run.
    std::fs::write(work.join("live.json"), r#"{"rules":[{"labelPrefix":"t:","reply":{"text":"live"}}]}"#).unwrap();
    let then_live = ["--replay", "first.jsonl", "--replay-then-live", "--backend", "script:live.json"];
    let out = in_work(&[&["run", "two.js", "--yes", "--json", "-q"][..], &then_live[..]].concat());
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert_eq!(common::stdout_json(&out)["result"], serde_json::json!({"a": "recorded", "b": "live"}));

    // A cassette longer than an ordinary request (1 MiB) goes with its start all the same.
    let long = "x".repeat(3 << 20);
    let big = full.replacen("\"text\":\"recorded\"", &format!("\"text\":\"{long}\""), 1);
    std::fs::write(work.join("big.jsonl"), big).unwrap();
    let out = in_work(&["run", "two.js", "--yes", "--json", "-q", "--replay", "big.jsonl"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let replayed = common::stdout_json(&out);
    assert_eq!(replayed["result"]["a"].as_str().map(str::len), Some(long.len()));
    assert_eq!(replayed["result"]["b"], "recorded");

    // The second entry answers another call than its key says: not served, and the miss
    // names its line.
    let tampered = full.replace("\"prompt\":\"second\"", "\"prompt\":\"something else\"");
    assert_ne!(tampered, full);
    std::fs::write(work.join("tampered.jsonl"), tampered).unwrap();
    let out = in_work(&["run", "two.js", "--yes", "--json", "-q", "--replay", "tampered.jsonl"]);
    assert!(!out.status.success(), "a tampered entry is not served");
    let refused = common::stdout_json(&out).to_string();
    assert!(refused.contains("line 3") && refused.contains("is not replayed"), "{refused}");

    // Over the bound: refused here, before the service is asked (no run is created).
    let runs = ok_json(&state, &["runs", "--json"]).as_array().unwrap().len();
    let huge = std::fs::File::create(work.join("huge.jsonl")).unwrap();
    huge.set_len((128 << 20) + 1).unwrap();
    drop(huge);
    let out = in_work(&["run", "two.js", "--yes", "--json", "-q", "--replay", "huge.jsonl"]);
    assert!(!out.status.success());
    assert!(common::stderr(&out).contains("over the limit"), "{}", common::stderr(&out));
    assert_eq!(ok_json(&state, &["runs", "--json"]).as_array().unwrap().len(), runs, "nothing was started");
    assert_eq!(live_services(&state), service, "the service held the store throughout");
}

/// `--record` through a running service: the service records the run's exchanges in memory
/// and sends them with the run's end; the command writes the cassette in the caller's
/// directory (`0600`), and it replays with no service and no live backend.
#[test]
fn a_cassette_recorded_through_the_running_service_replays_offline() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let _services = Services(state.clone());
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(work.join("rules.json"), r#"{"rules":[{"labelPrefix":"t:","reply":{"text":"live"}}]}"#).unwrap();
    std::fs::write(
        work.join("two.js"),
        "import { defineFactory } from \"factory\";\nexport default defineFactory({ meta: { name: \"two\", description: \"d\" }, \
         run: async (ctx) => ({ a: await ctx.agent(\"first\", { label: \"t:1\" }), \
         b: await ctx.agent(\"second\", { label: \"t:2\" }) }) });\n",
    )
    .unwrap();
    ok_json(&state, &["runs", "--json"]);
    let service = live_services(&state);
    assert_eq!(service.len(), 1);
    let in_work = |args: &[&str]| factory(&state, args).current_dir(&work).output().expect("factory starts");

    let detached =
        in_work(&["run", "two.js", "--yes", "--backend", "script:rules.json", "--record", "x.jsonl", "--detach"]);
    assert!(!detached.status.success());
    assert!(common::stderr(&detached).contains("cannot be used with --detach"), "{}", common::stderr(&detached));
    assert!(!work.join("x.jsonl").exists());

    let record = ["run", "two.js", "--yes", "--json", "-q", "--backend", "script:rules.json", "--record", "rec.jsonl"];
    let out = in_work(&record);
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert_eq!(common::stdout_json(&out)["result"], serde_json::json!({"a": "live", "b": "live"}));
    assert_eq!(live_services(&state), service, "the service held the store throughout");
    let tape = std::fs::read_to_string(work.join("rec.jsonl")).unwrap();
    assert_eq!(tape.lines().count(), 3, "a header and two exchanges: {tape}");
    assert!(tape.starts_with(r#"{"cassette":"factory","version":1}"#), "{tape}");
    assert_eq!(mode(&work.join("rec.jsonl")), 0o600);

    // A resume records the calls its attempt makes: a run that missed its second call
    // records only that one when resumed live.
    let first: Vec<&str> = tape.lines().filter(|l| !l.contains("\"t:2\"")).collect();
    std::fs::write(work.join("first.jsonl"), first.join("\n") + "\n").unwrap();
    let out = in_work(&["run", "two.js", "--yes", "--json", "-q", "--replay", "first.jsonl"]);
    assert!(!out.status.success(), "a miss fails the run");
    let run_id = common::stdout_json(&out)["runId"].as_str().unwrap().to_string();
    let resume =
        ["resume", &run_id, "--yes", "--json", "-q", "--backend", "script:rules.json", "--record", "more.jsonl"];
    let out = in_work(&resume);
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert_eq!(common::stdout_json(&out)["result"], serde_json::json!({"a": "live", "b": "live"}));
    let more = std::fs::read_to_string(work.join("more.jsonl")).unwrap();
    assert_eq!(more.lines().count(), 2, "a header and the one call made: {more}");
    assert!(more.contains("\"t:2\""), "{more}");

    // Offline: no service, another store, and nothing can answer live.
    std::fs::remove_file(work.join("rules.json")).unwrap();
    let offline = dir.path().join("offline");
    let replay = ["run", "two.js", "--yes", "--json", "-q", "--replay", "rec.jsonl"];
    let out = common::factory_cmd(&offline, &replay).current_dir(&work).output().unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert_eq!(common::stdout_json(&out)["result"], serde_json::json!({"a": "live", "b": "live"}));
    assert!(live_services(&offline).is_empty(), "replayed in a process of its own");
}

/// A running run's detail says what runs and what waits right now (label, since when), when
/// it was read, and which of its declared phases it has entered; once it ends, nothing runs.
#[test]
fn a_running_runs_detail_shows_its_running_and_queued_agents_and_declared_phases() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let _services = Services(state.clone());
    std::fs::create_dir_all(&state).unwrap();
    let rules = dir.path().join("slow.json");
    std::fs::write(&rules, r#"{"rules":[{"labelPrefix":"t:","reply":{"text":"ok"},"latencyMs":400}]}"#).unwrap();
    let file = dir.path().join("phased.js");
    std::fs::write(
        &file,
        "import { defineFactory } from \"factory\";\nexport default defineFactory({ meta: { name: \"phased\", description: \"d\", \
         phases: [{ title: \"Scan\" }, { title: \"Verify\", detail: \"check each\" }, { title: \"Merge\" }], \
         limits: { maxConcurrentSubagents: 2 } }, run: async (ctx) => {\n  ctx.phase(\"Scan\");\n  ctx.phase(\"Verify\");\n  \
         const r = await ctx.parallel(Array.from({ length: 8 }, (_, i) => () => ctx.agent(`item ${i}`, { label: `t:${i}` })));\n  \
         return { done: r.length };\n} });\n",
    )
    .unwrap();
    let backend = format!("script:{}", rules.display());
    let child = factory(&state, &["run", file.to_str().unwrap(), "--yes", "--backend", &backend, "--json", "-q"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("factory run starts");
    let run_id = running(&state, 2);
    let mut detail = Value::Null;
    wait_until("two agents run and some wait", || {
        detail = ok_json(&state, &["show", &run_id, "--json"]);
        detail["runningAgents"].as_array().map_or(0, Vec::len) == 2
            && detail["queuedAgents"].as_array().map_or(0, Vec::len) >= 1
    });
    for agent in detail["runningAgents"].as_array().unwrap().iter().chain(detail["queuedAgents"].as_array().unwrap()) {
        assert!(agent["label"].as_str().unwrap().starts_with("t:"), "{detail:#}");
        assert!(agent["sinceMs"].as_u64().unwrap() > 1_700_000_000_000, "{detail:#}");
    }
    assert!(detail["observedAt"].as_str().unwrap().starts_with("20"), "{detail:#}");
    let phases: Vec<(String, bool, bool)> = detail["declaredPhases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (p["title"].as_str().unwrap().to_string(), p["entered"].as_bool().unwrap(), p["current"].as_bool().unwrap())
        })
        .collect();
    assert_eq!(
        phases,
        [("Scan".to_string(), true, false), ("Verify".to_string(), true, true), ("Merge".to_string(), false, false)],
        "{detail:#}"
    );
    assert_eq!(detail["declaredPhases"][1]["detail"], "check each");
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    let ended = ok_json(&state, &["show", &run_id, "--json"]);
    assert_eq!(ended["status"], "completed");
    assert_eq!(ended["runningAgents"], serde_json::json!([]), "{ended:#}");
    assert_eq!(ended["queuedAgents"], serde_json::json!([]), "{ended:#}");
}

/// `describe` and `trust` ask the service. With none running they ask one in their own
/// process over a private store: no service starts and no store is created. With one
/// running, it describes a file as it loads it for a run and a registered factory by its
/// name, and a registered factory that is not trusted is described for its consent question
/// (here, with no terminal to ask on, the refusal that names it and its sha256).
#[test]
fn describe_and_trust_ask_the_service() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let _services = Services(state.clone());
    let hello = common::component("hello");
    let hello = hello.to_str().unwrap();
    let file = ok_json(&state, &["describe", hello, "--json"]);
    assert_eq!(file["meta"]["name"], "hello", "{file:#}");
    let sha256 = file["sha256"].as_str().expect("a sha256").to_string();
    assert_eq!(sha256.len(), 64, "{file:#}");
    assert!(file["sandbox"]["memoryBytes"].as_u64().is_some_and(|m| m > 0), "{file:#}");
    assert!(live_services(&state).is_empty(), "describe started no service");
    assert!(!state.join("factory.redb").exists(), "describe created no store");
    let out = output(&state, &["trust", "--json"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert!(!state.join("factory.redb").exists(), "trust created no store");

    // A service holds the store: a registered factory is described by name, and the run of
    // one that is not trusted shows what it is before it refuses for want of a terminal.
    let out = output(&state, &["add", hello]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert!(!live_services(&state).is_empty(), "add went through a service");
    let registered = ok_json(&state, &["describe", "hello", "--json"]);
    assert_eq!(registered["meta"]["name"], "hello", "{registered:#}");
    assert_eq!(registered["sha256"], sha256.as_str(), "the same component: {registered:#}");
    let again = ok_json(&state, &["describe", hello, "--json"]);
    assert_eq!(again, file, "the service describes the file as the process did");
    let out = output(&state, &["run", "hello"]);
    let err = common::stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("factory `hello`") && err.contains(&sha256) && err.contains("not trusted"), "{err}");
    let missing = output(&state, &["describe", "ghost"]);
    assert!(!missing.status.success());
    assert!(common::stderr(&missing).contains("no factory named `ghost`"), "{}", common::stderr(&missing));
}
