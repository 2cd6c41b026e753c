//! Agents call factories (issue 12): `factory mcp` driven by a real MCP client, the official
//! Python SDK (`mcp`, installed into `.venv` by `./test`), through `tests/mcp/client.py`: initialize and
//! list the tools, list and inspect factories, run one into its total cap (progress
//! notifications arrive), find the run with `runs`, resume it with a raised limit (zero
//! repeated backend calls, counted at a real HTTP backend on 127.0.0.1), pre-run failures
//! as tool errors with their codes, a client cancellation that cancels the run, and a second
//! client (another session) that sees nothing of the first one's runs.

mod common;

use common::fake_openai::{base_url, FakeOpenAi, Mode};
use common::{factory_cmd, factory_in, stderr};
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// A state dir whose default backend is the fake server, with `probe` registered and trusted.
fn prepared_state(port: u16) -> tempfile::TempDir {
    let state = tempfile::tempdir().unwrap();
    let config = format!(
        "default = \"local\"\n[backends.local]\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"\nmax_retries = 1\nretry_base_ms = 5\n",
        base_url(port)
    );
    std::fs::write(state.path().join("factory.toml"), config).unwrap();
    common::register_trusted_probe(state.path());
    state
}

/// Run the Python client's `scenario` against `factory mcp` on `state`; its JSON report.
async fn client(state: &Path, scenario: &str, client_name: &str, env: &[(&str, &str)]) -> Value {
    let factory = common::factory_bin();
    common::python_mcp_client(state, "client.py", &[factory.to_str().unwrap(), scenario, client_name], env).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_runs_finds_and_resumes_a_factory_over_mcp() {
    let server = FakeOpenAi::start(Mode::Answer { latency: Duration::from_millis(5) }).await;
    let state = prepared_state(server.port());
    let report = client(state.path(), "lifecycle", "pytest-agent", &[]).await;

    // The two tools, with schemas a model can read.
    let tools = report["tools"].as_object().unwrap();
    assert_eq!(tools.keys().collect::<Vec<_>>(), ["factories_manage", "run_factory"], "{report:#}");
    let run_schema = &tools["run_factory"];
    for field in ["name", "args", "limits", "resumeFromRunId"] {
        assert!(run_schema["properties"][field].is_object(), "{field}: {run_schema:#}");
    }
    assert_eq!(run_schema["oneOf"].as_array().map(Vec::len), Some(2), "exactly two input branches");

    let list = &report["list"]["structured"]["factories"];
    assert_eq!(list[0]["name"], "probe", "{report:#}");
    assert!(list[0]["description"].as_str().unwrap().contains("args"), "the description tells the model the args");
    assert_eq!(report["inspect"]["structured"]["name"], "probe");

    // Stopped by its total cap: an envelope, not a tool error; progress notifications came.
    let stopped = &report["stopped"];
    assert_eq!(stopped["isError"], false, "{stopped:#}");
    assert_eq!(stopped["structured"]["status"], "error");
    assert_eq!(stopped["structured"]["failure"]["type"], "factory_limit_reached");
    assert_eq!(stopped["structured"]["failure"]["kind"], "maxTotalSubagents");
    assert!(stopped["text"].as_str().unwrap().contains("resumeFromRunId"), "the summary says how to go on");
    assert!(!report["progress"].as_array().unwrap().is_empty(), "progress notifications arrived: {report:#}");
    let run_id = stopped["structured"]["runId"].as_str().unwrap();
    let runs = report["runs"]["structured"]["runs"].as_array().unwrap();
    assert!(runs.iter().any(|r| r["runId"] == run_id), "`runs` recovers the id: {runs:#?}");

    // Resumed with the limit lifted (`null`): completed, and no call reached the backend twice.
    let resumed = &report["resumed"]["structured"];
    assert_eq!(resumed["status"], "completed", "{resumed:#}");
    assert_eq!(resumed["result"]["done"], 6);
    assert_eq!(resumed["attempts"], 2);
    let answered: Vec<String> = server.answered().into_iter().filter(|p| p.starts_with("task ")).collect();
    assert_eq!(answered.len(), 6, "6 distinct calls, each answered once: {answered:?}");
    assert_eq!(report["show"]["structured"]["agents"].as_array().unwrap().len(), 6);
    assert!(report["show"]["structured"]["limits"].get("maxTotalSubagents").is_none(), "lifted: {:#}", report["show"]);
    assert!(!report["show"]["text"].as_str().unwrap().contains("task 0"), "no prompts in `show`");
    assert_eq!(report["progressPage"]["structured"]["entries"].as_array().unwrap().len(), 5);

    // An authored factory: registered in this session (not run), listed, and run.
    assert_eq!(report["author"]["isError"], false, "{:#}", report["author"]);
    let names: Vec<&str> = report["listAfterAuthor"]["structured"]["factories"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["name"].as_str())
        .collect();
    assert!(names.contains(&"bug-hunt") && names.contains(&"probe"), "{names:?}");
    let authored = &report["authoredRun"]["structured"];
    assert_eq!(authored["status"], "completed", "{authored:#}");
    assert!(
        authored["result"]["finding"].as_str().unwrap().starts_with("real answer to: Name one likely bug in src/a.rs"),
        "{authored:#}"
    );
    assert_eq!(report["badAuthor"]["isError"], true);
    assert_eq!(report["badAuthor"]["structured"]["code"], "invalid_script", "{:#}", report["badAuthor"]);
    assert!(report["badAuthor"]["text"].as_str().unwrap().contains("SyntaxError"), "{:#}", report["badAuthor"]);

    // Pre-run failures: tool errors carrying the codes.
    for (case, code) in [
        ("unknown", "unknown_factory"),
        ("completedAgain", "non_resumable"),
        ("badLimits", "invalid_limits"),
        ("bothBranches", "invalid_params"),
    ] {
        assert_eq!(report[case]["isError"], true, "{case}: {:#}", report[case]);
        assert_eq!(report[case]["structured"]["code"], code, "{case}: {:#}", report[case]);
    }

    // `runs` pages (`limit`, `next`); `remove` deletes an ended run and it is listed no more.
    let page = &report["runsPage"]["structured"];
    assert_eq!(page["runs"].as_array().map(Vec::len), Some(1), "{page:#}");
    assert_eq!(page["next"], page["runs"][0]["runId"], "{page:#}");
    let authored_id = report["authoredRun"]["structured"]["runId"].as_str().expect("the authored run's id");
    // Pages by creation sequence over the two runs: newest (the authored), older, newer.
    let pages = report["seqPages"].as_array().unwrap();
    let ids = |page: &Value| -> Vec<String> {
        page["structured"]["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["runId"].as_str().unwrap().to_string())
            .collect()
    };
    let flags = |page: &Value| (page["structured"]["hasMoreNewer"].clone(), page["structured"]["omittedOlder"].clone());
    assert_eq!(ids(&pages[0]), [authored_id], "{pages:#?}");
    assert_eq!(flags(&pages[0]), (serde_json::json!(false), serde_json::json!(true)), "{pages:#?}");
    assert_eq!(ids(&pages[1]), [run_id], "{pages:#?}");
    assert_eq!(flags(&pages[1]), (serde_json::json!(true), serde_json::json!(false)), "{pages:#?}");
    assert_eq!(ids(&pages[2]), [authored_id], "{pages:#?}");
    assert_eq!(
        report["removed"]["structured"],
        serde_json::json!({"runId": authored_id, "removed": true}),
        "{:#}",
        report["removed"]
    );
    let after: Vec<&str> = report["runsAfterRemove"]["structured"]["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["runId"].as_str())
        .collect();
    assert!(!after.contains(&authored_id) && after.contains(&run_id), "{after:?}");

    // Another client is another session: none of these runs is visible or resumable.
    let other = client(state.path(), "other", "another-agent", &[("FOREIGN_RUN_ID", run_id)]).await;
    assert_eq!(other["runs"]["structured"]["runs"].as_array().map(Vec::len), Some(0), "{other:#}");
    assert_eq!(other["show"]["structured"]["code"], "not_found", "{other:#}");
    assert_eq!(other["resume"]["structured"]["code"], "not_found", "{other:#}");
    assert_eq!(other["remove"]["structured"]["code"], "not_found", "another session cannot remove it: {other:#}");
    let names: Vec<&str> = other["list"]["structured"]["factories"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["name"].as_str())
        .collect();
    assert_eq!(names, ["probe"], "another session does not see the authored factory");
    assert_eq!(other["authored"]["structured"]["code"], "unknown_factory", "{other:#}");

    // `gc` collects the session's own ended runs only: no policy is refused, a dry run lists
    // them and deletes nothing, a pass deletes them; the first session's run stays.
    let gc = client(state.path(), "gc", "gc-agent", &[]).await;
    let own = gc["run"]["structured"]["runId"].as_str().expect("the gc session's run");
    assert_eq!(gc["noPolicy"]["structured"]["code"], "invalid_params", "{gc:#}");
    assert_eq!(gc["dry"]["structured"], serde_json::json!({"removed": [own], "kept": 1, "dryRun": true}), "{gc:#}");
    assert_eq!(gc["runsAfterDry"]["structured"]["runs"].as_array().map(Vec::len), Some(1), "{gc:#}");
    assert_eq!(gc["gc"]["structured"], serde_json::json!({"removed": [own], "kept": 0, "dryRun": false}), "{gc:#}");
    assert_eq!(gc["runsAfterGc"]["structured"]["runs"].as_array().map(Vec::len), Some(0), "{gc:#}");
    let out = factory_in(state.path(), &["show", run_id]);
    assert!(out.status.success(), "another session's run stays: {}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_is_a_session_whatever_the_client_calls_itself() {
    let server = FakeOpenAi::start(Mode::Answer { latency: Duration::ZERO }).await;
    let state = prepared_state(server.port());
    let first = client(state.path(), "start", "same-agent", &[]).await;
    assert_eq!(first["run"]["structured"]["status"], "completed", "{first:#}");
    let run_id = first["run"]["structured"]["runId"].as_str().unwrap();
    // A second connection with the same self-reported name is another session.
    let second = client(state.path(), "other", "same-agent", &[("FOREIGN_RUN_ID", run_id)]).await;
    assert_eq!(second["runs"]["structured"]["runs"].as_array().map(Vec::len), Some(0), "{second:#}");
    assert_eq!(second["show"]["structured"]["code"], "not_found", "{second:#}");
    assert_eq!(second["resume"]["structured"]["code"], "not_found", "{second:#}");
    // A session pinned with `--session` on both connections sees the same runs.
    let pinned = [("FACTORY_SESSION", "shared")];
    let first = client(state.path(), "start", "one-agent", &pinned).await;
    let run_id = first["run"]["structured"]["runId"].as_str().unwrap();
    let second = client(state.path(), "other", "another-agent", &[("FOREIGN_RUN_ID", run_id), pinned[0]]).await;
    let runs = second["runs"]["structured"]["runs"].as_array().unwrap();
    assert!(runs.iter().any(|r| r["runId"] == run_id), "{second:#}");
    assert_eq!(second["show"]["structured"]["runId"], run_id, "{second:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_return_says_running_and_the_run_goes_on() {
    // 8 agents one at a time, 300 ms each: the run takes at least 2.4 s, the bound is 1 s.
    let server = FakeOpenAi::start(Mode::Answer { latency: Duration::from_millis(300) }).await;
    let state = prepared_state(server.port());
    let report = client(state.path(), "bounded", "pytest-agent", &[("FACTORY_MCP_WAIT_SECONDS", "1")]).await;
    let first = &report["first"];
    assert_eq!(first["isError"], false, "{report:#}");
    assert_eq!(first["structured"]["status"], "running", "{report:#}");
    assert!(first["text"].as_str().unwrap().contains("\"operation\": \"wait\""), "{report:#}");
    let waits = report["waits"].as_array().unwrap();
    let last = &waits.last().unwrap()["structured"];
    assert_eq!(last["status"], "completed", "the bounded return did not cancel the run: {report:#}");
    assert_eq!(last["result"]["done"], 8);
    assert_eq!(server.answered().len(), 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_outlasts_its_call_tells_the_session_its_phases_and_its_end() {
    // 8 agents one at a time, 300 ms each: the run outlasts the 1 s bound.
    let server = FakeOpenAi::start(Mode::Answer { latency: Duration::from_millis(300) }).await;
    let state = prepared_state(server.port());
    let report = client(state.path(), "notify", "pytest-agent", &[("FACTORY_MCP_WAIT_SECONDS", "1")]).await;
    let first = &report["first"];
    assert_eq!(first["structured"]["status"], "running", "{report:#}");
    assert!(
        first["text"].as_str().unwrap().contains("factory_completed"),
        "the answer says the session will be told: {report:#}"
    );
    let run_id = first["structured"]["runId"].as_str().unwrap();
    let logs = report["logs"].as_array().unwrap();
    let of = |id: &str, event: &str| -> Vec<&Value> {
        logs.iter().filter(|l| l["data"]["runId"] == id && l["data"]["event"] == event).collect()
    };
    // The official client's logging callback got them, from the `factory` logger.
    assert!(logs.iter().all(|l| l["logger"] == "factory"), "{logs:#?}");
    let phases: Vec<&Value> = of(run_id, "phase").iter().map(|l| &l["data"]["phase"]).collect();
    assert_eq!(phases, ["Probe"], "logPhaseNames: each phase entered, once: {logs:#?}");
    let done = of(run_id, "factory_completed");
    assert_eq!(done.len(), 1, "{logs:#?}");
    let done = &done[0];
    assert_eq!(
        (done["level"].as_str(), done["data"]["status"].as_str()),
        (Some("info"), Some("completed")),
        "{done:#}"
    );
    let preview: Value = serde_json::from_str(done["data"]["resultPreview"].as_str().expect("a preview"))
        .expect("the whole small result");
    assert_eq!(preview["done"], 8, "{done:#}");
    let message = done["data"]["message"].as_str().unwrap();
    assert!(message.contains(run_id) && message.contains("\"operation\": \"show\""), "says how to read it: {message}");

    // notifyOnComplete false: its run ended, and nothing was told of it.
    let quiet_id = report["quiet"]["structured"]["runId"].as_str().unwrap();
    assert_eq!(report["quiet"]["structured"]["status"], "running", "{report:#}");
    assert_eq!(report["quietWaited"]["structured"]["status"], "completed", "{report:#}");
    assert!(logs.iter().all(|l| l["data"]["runId"] != quiet_id), "{logs:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cancellation_cancels_the_run() {
    let server = FakeOpenAi::start(Mode::Answer { latency: Duration::from_millis(50) }).await;
    let state = prepared_state(server.port());
    let report = client(state.path(), "cancel", "pytest-agent", &[]).await;
    let waited = &report["waited"]["structured"];
    assert_eq!(waited["status"], "cancelled", "{report:#}");
    let answered = server.answered().len();
    assert!(answered < 50, "the run stopped early ({answered} of 50 answered)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_paused_and_resumed_and_a_checkpoint_answered_over_mcp() {
    let server = FakeOpenAi::start(Mode::Answer { latency: Duration::from_millis(20) }).await;
    let state = prepared_state(server.port());
    let report = client(state.path(), "pause", "pytest-agent", &[]).await;
    let paused = &report["pause"]["structured"];
    assert_eq!(paused["status"], "paused", "{report:#}");
    assert_eq!(
        report["paused"]["structured"]["status"], "paused",
        "run_factory returns the paused envelope: {report:#}"
    );
    let resumed = &report["resumed"]["structured"];
    assert_eq!(resumed["status"], "completed", "{report:#}");
    assert_eq!(resumed["result"]["done"], 100);
    let tasks: Vec<String> = server.asked().into_iter().filter(|p| p.starts_with("task ")).collect();
    let distinct: std::collections::BTreeSet<&String> = tasks.iter().collect();
    assert_eq!(distinct.len(), 100, "every call made");
    assert!(tasks.len() <= 101, "at most the call in flight at the pause was asked again: {} asks", tasks.len());

    let checkpoint = &report["checkpoint"];
    assert_eq!(checkpoint["structured"]["status"], "paused", "{report:#}");
    assert_eq!(checkpoint["structured"]["checkpoint"], "approve");
    let hint = checkpoint["text"].as_str().unwrap();
    assert!(
        hint.contains("\"operation\": \"resume\"") && hint.contains("\"input\""),
        "the summary says how to answer: {hint}"
    );
    let answered = &report["answered"]["structured"];
    assert_eq!(answered["status"], "completed", "{report:#}");
    assert_eq!(answered["result"]["answer"], serde_json::json!({"approved": true}));
    assert_eq!(
        server.asked().iter().filter(|p| *p == "plan the work").count(),
        1,
        "the call before the checkpoint was paid once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_component_is_refused_without_a_way_to_ask() {
    let server = FakeOpenAi::start(Mode::Answer { latency: Duration::ZERO }).await;
    let state = prepared_state(server.port());
    let probe = common::component("probe");
    let out = factory_in(state.path(), &["trust", "--revoke", probe.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report = client(state.path(), "lifecycle_untrusted", "pytest-agent", &[]).await;
    assert_eq!(report["refused"]["isError"], true, "{report:#}");
    assert_eq!(report["refused"]["structured"]["code"], "no_approval_provider", "{report:#}");
    assert_eq!(server.requests(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_over_streamable_http_needs_the_bearer_token() {
    let server = FakeOpenAi::start(Mode::Answer { latency: Duration::ZERO }).await;
    let state = prepared_state(server.port());
    let (mut daemon, url, token) = common::mcp_http(state.path());

    // Without the token: 401, nothing served.
    let refused = reqwest::Client::new()
        .post(&url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);

    // With it, the official client works over HTTP.
    let mut cmd = Command::new("python3");
    cmd.arg(common::root().join("tests/mcp/client.py")).args(["--http", &url, &token]);
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("python3 runs")).await.unwrap();
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(daemon.id() as i32), nix::sys::signal::Signal::SIGTERM);
    let _ = daemon.wait();
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["tools"], serde_json::json!(["factories_manage", "run_factory"]), "{report:#}");
    assert_eq!(report["run"]["structured"]["status"], "completed", "{report:#}");
    assert_eq!(report["run"]["structured"]["result"]["done"], 3);
    assert_eq!(server.answered().len(), 3);
}

use common::service::live_services;

/// `factory ARGS` in the default mode (through the state dir's service) as the owner.
fn owner(state: &Path, args: &[&str]) -> Value {
    let out =
        factory_cmd(state, args).env("FACTORY_NO_DAEMON", "0").env("FACTORY_IDLE_SECONDS", "30").output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    common::stdout_json(&out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_outlives_its_mcp_client_and_other_front_doors_see_it() {
    // 30 agents one at a time, 300 ms each: the run outlasts the server's drain of the
    // dropped call (rmcp's 5 s), so a server that cancels on a disconnect is caught.
    let server = FakeOpenAi::start(Mode::Answer { latency: Duration::from_millis(300) }).await;
    let state = prepared_state(server.port());
    let daemon = [("FACTORY_NO_DAEMON", "0"), ("FACTORY_IDLE_SECONDS", "30")];
    // Client A and its `factory mcp` in a process group of their own, killed together below.
    let template = factory_cmd(state.path(), &[]);
    let mut cmd = Command::new("python3");
    cmd.arg(common::root().join("tests/mcp/client.py")).arg(common::factory_bin()).arg("hang").arg("agent-a");
    for (key, value) in template.get_envs() {
        match value {
            Some(value) => cmd.env(key, value),
            None => cmd.env_remove(key),
        };
    }
    cmd.env_remove("FACTORY_SESSION").envs(daemon).stdout(std::process::Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut a = cmd.spawn().expect("python3 runs");

    // The owner sees A's run, in A's session, once it is under way.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let (run_id, session) = loop {
        let runs = owner(state.path(), &["runs", "--all", "--json"]);
        let running = runs
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["status"] == "running" && r["accounting"]["agentsSpawned"].as_u64().unwrap_or(0) >= 1);
        if let Some(run) = running {
            break (run["runId"].as_str().unwrap().to_string(), run["session"].as_str().unwrap().to_string());
        }
        assert!(a.try_wait().unwrap().is_none(), "client A ended before its run got going");
        assert!(std::time::Instant::now() < deadline, "A's run never got going: {runs:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(session.starts_with("mcp-"), "one MCP connection is one session: {session}");
    let services = live_services(state.path());
    assert_eq!(services.len(), 1, "the run lives in the state dir's service");

    // Client A is killed mid-call: its server sees the connection end (which rmcp reports
    // like a cancellation) and must not cancel; then the server is killed too. The run goes
    // on in the service, to its end.
    a.kill().unwrap();
    let _ = a.wait();
    let group = nix::unistd::Pid::from_raw(a.id() as i32);
    // The server ends by itself once it has drained the call (rmcp cancels it on the way).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while nix::sys::signal::killpg(group, None).is_ok() {
        assert!(std::time::Instant::now() < deadline, "the MCP server outlived its client");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let done = owner(state.path(), &["wait", &run_id, "--json"]);
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(done["result"]["done"], 30);
    assert_eq!(done["attempts"], 1, "never interrupted");
    assert_eq!(server.answered().len(), 30, "every prompt answered once");

    // Client B (another connection, so another session) sees nothing of it and cannot touch it.
    let b = client(state.path(), "other", "agent-a", &[daemon[0], daemon[1], ("FOREIGN_RUN_ID", &run_id)]).await;
    assert_eq!(b["runs"]["structured"]["runs"].as_array().map(Vec::len), Some(0), "{b:#}");
    assert_eq!(b["show"]["structured"]["code"], "not_found", "{b:#}");
    assert_eq!(b["resume"]["structured"]["code"], "not_found", "{b:#}");

    // `factory serve --http` attaches to the same service: the owner's view lists the run.
    let mut http = factory_cmd(state.path(), &["serve", "--http", "127.0.0.1:0"])
        .envs(daemon)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(http.stderr.take().unwrap()));
    let base = loop {
        let line = lines.next().expect("serve says where it listens").unwrap();
        if let Some(rest) = line.split("HTTP API on http://").nth(1) {
            break format!("http://{}", rest.split("/api/").next().unwrap());
        }
    };
    std::thread::spawn(move || for _ in lines {});
    let token = std::fs::read_to_string(state.path().join("http.token")).unwrap();
    let runs: Value = reqwest::Client::new()
        .get(format!("{base}/api/runs"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let listed = runs.as_array().unwrap().iter().find(|r| r["runId"] == run_id.as_str()).cloned();
    assert_eq!(listed.as_ref().map(|r| r["session"].clone()), Some(Value::from(session.clone())), "{runs:#}");
    assert_eq!(live_services(state.path()), services, "still the one service");

    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(http.id() as i32), nix::sys::signal::Signal::SIGTERM);
    let _ = http.wait();
    for pid in live_services(state.path()) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
    }
}

/// Issue 49: `factory mcp --http` keeps at most 64 MCP sessions: past them a new session is
/// refused (503 `unavailable`) while the open ones keep working, and closing one (`DELETE
/// /mcp`) makes room again. (Idle sessions are also closed after 5 minutes: the SDK's
/// keep-alive, not waited for here.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_over_http_caps_its_sessions() {
    let server = FakeOpenAi::start(Mode::Answer { latency: Duration::ZERO }).await;
    let state = prepared_state(server.port());
    let (mut daemon, url, token) = common::mcp_http(state.path());
    let client = reqwest::Client::new();
    let initialize = || {
        client
            .post(&url)
            .bearer_auth(token.trim())
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"cap-test","version":"1"}}}"#)
            .send()
    };
    let mut sessions = Vec::new();
    for _ in 0..64 {
        let response = initialize().await.expect("the server answers");
        assert_eq!(response.status(), 200);
        let id = response.headers().get("mcp-session-id").expect("a session id").to_str().unwrap().to_string();
        let _ = response.bytes().await;
        sessions.push(id);
    }
    let refused = initialize().await.expect("the server answers");
    assert_eq!(refused.status(), 503);
    let body: Value = refused.json().await.expect("a JSON refusal");
    assert_eq!(body["code"], "unavailable", "{body}");
    // An open session still answers; closing one makes room for a new one.
    let ping = client
        .post(&url)
        .bearer_auth(token.trim())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", &sessions[1])
        .body(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
        .send()
        .await
        .unwrap();
    assert!(ping.status().is_success(), "{}", ping.status());
    let closed =
        client.delete(&url).bearer_auth(token.trim()).header("mcp-session-id", &sessions[0]).send().await.unwrap();
    assert!(closed.status().is_success(), "{}", closed.status());
    let again = initialize().await.expect("the server answers");
    assert_eq!(again.status(), 200);
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(daemon.id() as i32), nix::sys::signal::Signal::SIGTERM);
    let _ = daemon.wait();
}
