//! The HTTP API (issue 14, its API half): `factory serve --http 127.0.0.1:0` driven by a
//! real HTTP client. Every call needs the bearer token from `<state-dir>/http.token`; the
//! `Host` header is checked; no CORS headers; start, wait, resume with raised limits,
//! detail, progress pages, factories, cancel, errors with the same codes as elsewhere; and
//! `run_updated` events arrive over Server-Sent Events in revision order.

mod common;

use common::factory_cmd;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

/// A daemon serving HTTP on a free loopback port; stopped (SIGTERM) when dropped.
struct Daemon {
    child: Child,
    base: String,
    token: String,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

/// A state dir with `probe` registered and trusted, and a slow script backend as default.
fn prepared_state() -> tempfile::TempDir {
    common::slow_probe_state(30)
}

fn start(state: &Path) -> Daemon {
    let mut child = factory_cmd(state, &["serve", "--http", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("factory serve starts");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let base = loop {
        let line = lines.next().expect("serve says where it listens").unwrap();
        if let Some(rest) = line.split("HTTP API on http://").nth(1) {
            break format!("http://{}", rest.split("/api/").next().unwrap());
        }
    };
    // Keep reading stderr so the daemon never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    let token = std::fs::read_to_string(state.join("http.token")).expect("the token file");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(state.join("http.token")).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "the token is readable by its owner only");
    Daemon { child, base, token }
}

impl Daemon {
    fn client(&self) -> reqwest::Client {
        reqwest::Client::new()
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut req = self.client().request(method, format!("{}{path}", self.base)).bearer_auth(&self.token);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let response = req.send().await.expect("the API answers");
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        self.call(reqwest::Method::GET, path, None).await
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_needs_the_token_checks_the_host_and_sends_no_cors() {
    let state = prepared_state();
    let daemon = start(state.path());
    let url = format!("{}/api/runs", daemon.base);
    let client = daemon.client();
    let none = client.get(&url).send().await.unwrap();
    assert_eq!(none.status(), 401);
    let wrong = client.get(&url).bearer_auth("not-the-token").send().await.unwrap();
    assert_eq!(wrong.status(), 401);
    let body: Value = wrong.json().await.unwrap();
    assert_eq!(body["code"], "unauthorized");
    // A rebinding page: right token, wrong Host.
    let rebound = client.get(&url).bearer_auth(&daemon.token).header("host", "evil.example:80").send().await.unwrap();
    assert_eq!(rebound.status(), 403);
    // Another origin gets no permission to read.
    let cross =
        client.get(&url).bearer_auth(&daemon.token).header("origin", "http://evil.example").send().await.unwrap();
    assert_eq!(cross.status(), 200);
    assert!(cross.headers().get("access-control-allow-origin").is_none(), "no CORS");
    let (status, session) = daemon.get("/api/session").await;
    assert_eq!((status, session["session"].as_str()), (200, Some("default")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_over_http_with_events_in_revision_order() {
    let state = prepared_state();
    let daemon = start(state.path());

    // Subscribe before anything runs.
    let mut events =
        daemon.client().get(format!("{}/api/events", daemon.base)).bearer_auth(&daemon.token).send().await.unwrap();
    assert_eq!(events.headers()["content-type"], "text/event-stream");

    let (status, factories) = daemon.get("/api/factories").await;
    assert_eq!(status, 200);
    assert_eq!(factories[0]["meta"]["name"], "probe", "{factories:#}");
    let (status, inspected) = daemon.get("/api/factories/probe").await;
    assert_eq!((status, &inspected["meta"]["name"]), (200, &json!("probe")));

    // Start a run that stops on its total cap, wait for it, resume it with the cap lifted
    // (`null`: no limit of that kind).
    let start = json!({"name": "probe", "args": {"case": "fanout", "n": 4}, "limits": {"maxTotalSubagents": 2, "maxConcurrentSubagents": 1}});
    let (status, started) = daemon.post("/api/runs", start).await;
    assert_eq!(status, 202, "{started:#}");
    let id = started["runId"].as_str().unwrap().to_string();
    let (_, stopped) = daemon.get(&format!("/api/runs/{id}/wait")).await;
    assert_eq!(stopped["failure"]["kind"], "maxTotalSubagents", "{stopped:#}");
    let (status, _) =
        daemon.post(&format!("/api/runs/{id}/resume"), json!({"limits": {"maxTotalSubagents": null}})).await;
    assert_eq!(status, 202);
    let (_, done) = daemon.get(&format!("/api/runs/{id}/wait")).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(done["result"]["done"], 4);
    assert_eq!(done["accounting"]["agentsSpawned"], 4, "the resume did not pay twice");

    let (_, runs) = daemon.get("/api/runs").await;
    assert_eq!(runs.as_array().map(Vec::len), Some(1));
    let (_, detail) = daemon.get(&format!("/api/runs/{id}")).await;
    assert_eq!(detail["agents"].as_array().map(Vec::len), Some(4), "{detail:#}");
    assert!(detail["limits"].get("maxTotalSubagents").is_none(), "the cap was lifted: {detail:#}");
    assert_eq!(detail["limits"]["maxConcurrentSubagents"], 1, "the other override holds: {detail:#}");
    assert!(!detail.to_string().contains("task 0"), "no prompts");
    let (_, page) = daemon.get(&format!("/api/runs/{id}/progress?afterSeq=0&limit=3")).await;
    let page = page.as_array().unwrap();
    assert_eq!(page.len(), 3);
    let last = page[2]["seq"].as_u64().unwrap();
    let (_, back) = daemon.get(&format!("/api/runs/{id}/progress?beforeSeq={last}&limit=2")).await;
    assert_eq!(back.as_array().unwrap().last().unwrap()["seq"].as_u64(), Some(last - 1));
    let (_, by_phase) = daemon.get(&format!("/api/runs/{id}/progress?phase=Probe&limit=1000")).await;
    assert!(by_phase.as_array().unwrap().iter().all(|e| e["phase"] == "Probe"), "{by_phase:#}");

    // Errors carry the shared codes.
    let (status, missing) = daemon.get("/api/runs/no-such-run").await;
    assert_eq!((status, missing["code"].as_str()), (404, Some("not_found")));
    let (status, again) = daemon.post(&format!("/api/runs/{id}/resume"), json!({})).await;
    assert_eq!((status, again["code"].as_str()), (409, Some("non_resumable")));
    let (status, unknown) = daemon.post("/api/runs", json!({"name": "nope"})).await;
    assert_eq!((status, unknown["code"].as_str()), (404, Some("unknown_factory")));
    let (status, bad) = daemon.post("/api/runs", json!({"name": "probe", "limits": {"maxTotalSubagents": 0}})).await;
    assert_eq!((status, bad["code"].as_str()), (400, Some("invalid_limits")));

    // Cancel a slow run: its terminal envelope comes back.
    let slow = json!({"name": "probe", "args": {"case": "fanout", "n": 200}, "limits": {"maxConcurrentSubagents": 1}});
    let (_, started) = daemon.post("/api/runs", slow).await;
    let slow_id = started["runId"].as_str().unwrap().to_string();
    let (status, cancelled) = daemon.post(&format!("/api/runs/{slow_id}/cancel"), json!({})).await;
    assert_eq!((status, cancelled["status"].as_str()), (200, Some("cancelled")), "{cancelled:#}");

    // Pages by creation sequence: the newest (the slow run), then older with `beforeSeq`.
    let (status, newest) = daemon.get("/api/runs/page?limit=1").await;
    assert_eq!(status, 200, "{newest:#}");
    assert_eq!(newest["runs"][0]["runId"], slow_id.as_str(), "{newest:#}");
    assert_eq!(
        (newest["hasMoreNewer"].clone(), newest["omittedOlder"].clone()),
        (json!(false), json!(true)),
        "{newest:#}"
    );
    let (_, older) = daemon.get(&format!("/api/runs?beforeSeq={}&limit=1", newest["oldestSeq"])).await;
    assert_eq!(older["runs"][0]["runId"], id.as_str(), "{older:#}");
    assert_eq!(
        (older["hasMoreNewer"].clone(), older["omittedOlder"].clone()),
        (json!(true), json!(false)),
        "{older:#}"
    );
    let (status, mixed) = daemon.get("/api/runs/page?after=x").await;
    assert_eq!((status, mixed["code"].as_str()), (400, Some("invalid_params")), "{mixed:#}");

    // The event stream: run_updated for the first run, revisions strictly growing.
    let mut text = String::new();
    let mut revisions = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while revisions.last().copied() != Some(done["revision"].as_u64().unwrap()) {
        let chunk =
            tokio::time::timeout_at(deadline, events.chunk()).await.expect("events keep coming").unwrap().unwrap();
        text.push_str(&String::from_utf8_lossy(&chunk));
        revisions = text
            .split("\n\n")
            .filter(|e| e.starts_with("event: run_updated"))
            .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .filter(|d| d["runId"] == id.as_str())
            .filter_map(|d| d["revision"].as_u64())
            .collect();
    }
    assert!(revisions.len() > 3, "{revisions:?}");
    assert!(revisions.windows(2).all(|w| w[0] < w[1]), "in revision order: {revisions:?}");
    // Live progress rides the same stream, in seq order, ending with the attempt's end.
    let seqs: Vec<(u64, String)> = text
        .split("\n\n")
        .filter(|e| e.starts_with("event: progress"))
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|d| d["runId"] == id.as_str())
        .filter_map(|d| Some((d["entry"]["seq"].as_u64()?, d["entry"]["event"].as_str()?.to_string())))
        .collect();
    assert!(seqs.windows(2).all(|w| w[0].0 < w[1].0), "progress in seq order: {seqs:?}");
    assert!(seqs.iter().any(|(_, e)| e == "agentFinished"), "{seqs:?}");
    assert_eq!(seqs.last().map(|(_, e)| e.as_str()), Some("attemptEnded"), "{seqs:?}");

    // Each attempt is told as it starts and as it settles, with what it consumed.
    let lifecycle = |text: &str, name: &str| -> Vec<Value> {
        text.split("\n\n")
            .filter(|e| e.starts_with(&format!("event: {name}\n")))
            .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .filter(|d| d["runId"] == id.as_str())
            .collect()
    };
    while lifecycle(&text, "run_settled").len() < 2 {
        let chunk =
            tokio::time::timeout_at(deadline, events.chunk()).await.expect("run_settled comes").unwrap().unwrap();
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let started = lifecycle(&text, "run_started");
    assert_eq!(
        started,
        [1, 2].map(|attempt| json!({"runId": id, "attempt": attempt, "factoryName": "probe"})),
        "one run_started per attempt"
    );
    let settled = lifecycle(&text, "run_settled");
    assert_eq!(
        (settled[0]["status"].as_str(), settled[0]["failureType"].as_str()),
        (Some("error"), Some("factory_limit_reached")),
        "{settled:#?}"
    );
    assert_eq!(
        (settled[1]["status"].as_str(), settled[1].get("failureType")),
        (Some("completed"), None),
        "{settled:#?}"
    );
    assert_eq!(settled[0]["consumedSubagents"], 2, "{settled:#?}");
    assert_eq!(settled[1]["consumedSubagents"], 2, "the resume spawned only what was left: {settled:#?}");
    assert!(settled.iter().all(|s| s["elapsedMs"].is_u64() && s["consumedCredits"].is_number()), "{settled:#?}");
}

#[test]
fn serve_and_mcp_refuse_a_non_loopback_address_unless_told() {
    let state = tempfile::tempdir().expect("a state dir");
    for command in ["serve", "mcp"] {
        let out = factory_cmd(state.path(), &[command, "--http", "0.0.0.0:0"]).output().expect("factory starts");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{command}: {stderr}");
        assert!(
            stderr.contains("--http 0.0.0.0:0 is not a loopback address; add --http-any-address"),
            "{command}: {stderr}"
        );
        // Nothing was served: no token was written.
        assert!(!state.path().join(format!("{}.token", if command == "serve" { "http" } else { "mcp" })).exists());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_component_is_refused_over_http_unless_approved_in_the_request() {
    // `hello` registered but never trusted: with `"ask": false` the API starts it only with
    // `approved` (without, it would wait for the owner's approval: see below).
    let state = tempfile::tempdir().unwrap();
    let hello = common::component("hello");
    let out = common::factory_in(state.path(), &["add", hello.to_str().unwrap()]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let daemon = start(state.path());
    let (status, refused) = daemon.post("/api/runs", json!({ "name": "hello", "ask": false })).await;
    assert_eq!(status, 403, "{refused}");
    assert_eq!(refused["code"], "no_approval_provider", "{refused}");
    let (_, runs) = daemon.get("/api/runs").await;
    assert_eq!(runs, json!([]), "nothing was created");
    let (status, started) = daemon.post("/api/runs", json!({ "name": "hello", "approved": true })).await;
    assert_eq!(status, 202, "{started}");
    let id = started["runId"].as_str().expect("a run id").to_string();
    let (_, done) = daemon.get(&format!("/api/runs/{id}/wait")).await;
    assert_eq!(done["status"], "completed", "{done}");
}

/// Issue 52: an untrusted start over HTTP waits for the owner's approval. Held pending (the
/// caller answered at once with a pending envelope and the approval's id), it is listed by
/// the API and by `factory approvals` with the question's facts; declined with the CLI it
/// starts nothing and its waiter is told `declined`; approved once with the CLI while the
/// caller's request waits, that request answers with the run, which completes; approved
/// always, the next start runs without a question.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_start_over_http_waits_for_the_owners_approval() {
    let state = tempfile::tempdir().unwrap();
    let hello = common::component("hello");
    let out = common::factory_in(state.path(), &["add", hello.to_str().unwrap()]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let daemon = start(state.path());
    let (_, registration) = daemon.get("/api/factories/hello").await;
    let sha256 = registration["hash"].as_str().expect("the component's sha256").to_string();
    let approvals = |state: &Path| {
        let out = common::factory_in(state, &["approvals", "--json"]);
        assert!(out.status.success(), "{}", common::stderr(&out));
        common::stdout_json(&out)
    };

    // Held, and answered at once (no wait asked): a pending envelope naming the approval.
    let (status, pending) = daemon.post("/api/runs", json!({ "name": "hello", "approvalWaitSeconds": 0 })).await;
    assert_eq!((status, pending["status"].as_str()), (202, Some("pending_approval")), "{pending}");
    let id = pending["approvalId"].as_str().expect("an approval id").to_string();
    let question = &pending["approval"]["question"];
    assert_eq!(
        (question["factory"].as_str(), question["sha256"].as_str(), question["operation"].as_str()),
        (Some("hello"), Some(sha256.as_str()), Some("run")),
        "{pending}"
    );
    assert!(question["limits"].is_object() && question["backend"].is_string(), "{pending}");
    let (_, listed) = daemon.get("/api/approvals").await;
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    assert_eq!(listed[0]["id"], id.as_str());
    // The CLI lists it too, with the facts, and declines it: nothing starts.
    assert_eq!(approvals(state.path())[0]["id"], id.as_str());
    let out = common::factory_in(state.path(), &["approvals"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        text.contains(&id) && text.contains(&format!("sha256:    {sha256}")) && text.contains("operation: run"),
        "{text}"
    );
    let out = common::factory_in(state.path(), &["approvals", "decline", &id]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("declined"), "{}", String::from_utf8_lossy(&out.stdout));
    let (_, declined) = daemon.get(&format!("/api/approvals/{id}?wait=5")).await;
    assert_eq!(declined["state"]["status"], "declined", "{declined}");
    let (_, runs) = daemon.get("/api/runs").await;
    assert_eq!(runs, json!([]), "a declined start leaves no run");
    assert_eq!(approvals(state.path()), json!([]), "no longer pending");
    // Answered twice: refused.
    let out = common::factory_in(state.path(), &["approvals", "approve", &id]);
    assert!(!out.status.success(), "an answered approval cannot be approved");

    // A caller that waits: approved once from the CLI meanwhile, its request answers with the run.
    let waiting = {
        let (client, base, token) = (daemon.client(), daemon.base.clone(), daemon.token.clone());
        tokio::spawn(async move {
            let response = client
                .post(format!("{base}/api/runs"))
                .bearer_auth(token)
                .json(&json!({ "name": "hello", "approvalWaitSeconds": 60 }))
                .send()
                .await
                .expect("the API answers");
            (response.status().as_u16(), response.json::<Value>().await.unwrap_or(Value::Null))
        })
    };
    let id = loop {
        let listed = approvals(state.path());
        if let Some(id) = listed[0]["id"].as_str() {
            break id.to_string();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let out = common::factory_in(state.path(), &["approvals", "approve", &id, "--json"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let approved = common::stdout_json(&out);
    assert_eq!(
        (approved["state"]["status"].as_str(), approved["state"]["always"].as_bool()),
        (Some("approved"), Some(false))
    );
    let (status, started) = waiting.await.unwrap();
    assert_eq!(status, 202, "{started}");
    assert_eq!(started["runId"], approved["state"]["runId"], "the waiting request answers with the approved run");
    let run_id = started["runId"].as_str().unwrap().to_string();
    let (_, done) = daemon.get(&format!("/api/runs/{run_id}/wait")).await;
    assert_eq!(done["status"], "completed", "{done}");

    // Approved always (through the API): trusted from then on, so the next start asks nothing.
    let (_, pending) = daemon.post("/api/runs", json!({ "name": "hello", "approvalWaitSeconds": 0 })).await;
    let id = pending["approvalId"].as_str().expect("held again: approved once is not trust").to_string();
    let (status, approved) = daemon.post(&format!("/api/approvals/{id}/approve"), json!({ "always": true })).await;
    assert_eq!((status, approved["state"]["always"].as_bool()), (200, Some(true)), "{approved}");
    let (status, started) = daemon.post("/api/runs", json!({ "name": "hello", "approvalWaitSeconds": 0 })).await;
    assert_eq!(status, 202, "{started}");
    assert!(started["runId"].is_string(), "trusted now: it runs at once: {started}");
    let out = common::factory_in(state.path(), &["trust", "--json"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains(&sha256), "{}", String::from_utf8_lossy(&out.stdout));
    // Unknown ids are not found.
    let (status, unknown) = daemon.post("/api/approvals/nope/decline", json!({})).await;
    assert_eq!((status, unknown["code"].as_str()), (404, Some("not_found")), "{unknown}");

    // Unattended, nothing answers one: a start held when the service stops is forgotten
    // with it, and the service that starts next (recovering runs) starts nothing for it.
    let out = common::factory_in(state.path(), &["trust", "--revoke", &sha256]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let (_, pending) = daemon.post("/api/runs", json!({ "name": "hello", "approvalWaitSeconds": 0 })).await;
    let id = pending["approvalId"].as_str().expect("held once the trust is revoked").to_string();
    let (_, before) = daemon.get("/api/runs").await;
    drop(daemon);
    let daemon = start(state.path());
    let (_, listed) = daemon.get("/api/approvals").await;
    assert_eq!(listed, json!([]), "a restart forgets pending approvals");
    let (status, _) = daemon.get(&format!("/api/approvals/{id}")).await;
    assert_eq!(status, 404);
    let (_, after) = daemon.get("/api/runs").await;
    assert_eq!(after.as_array().map(Vec::len), before.as_array().map(Vec::len), "nothing started for it");
}

/// Issue 52: a resume over HTTP of a run whose factory is not trusted waits for the owner's
/// approval too: the question says `resume`, names the run's factory and its sha256 and the
/// limits raised by the resume; approved, the same run resumes to completion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_of_an_untrusted_factory_waits_for_the_owners_approval() {
    let state = tempfile::tempdir().unwrap();
    let probe = common::component("probe");
    let out = common::factory_in(state.path(), &["add", probe.to_str().unwrap()]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let daemon = start(state.path());
    // Its first attempt, approved in the request, stops at its subagent limit (resumable).
    let start_body = json!({ "name": "probe", "args": { "case": "fanout", "n": 3 }, "limits": { "maxTotalSubagents": 1 }, "approved": true });
    let (status, started) = daemon.post("/api/runs", start_body).await;
    assert_eq!(status, 202, "{started}");
    let run_id = started["runId"].as_str().unwrap().to_string();
    let (_, stopped) = daemon.get(&format!("/api/runs/{run_id}/wait")).await;
    assert_eq!(
        (stopped["status"].as_str(), stopped["failure"]["type"].as_str()),
        (Some("error"), Some("factory_limit_reached")),
        "{stopped}"
    );
    // The resume is held: the question is about resuming this factory under the raised limit.
    let body = json!({ "limits": { "maxTotalSubagents": 10 }, "approvalWaitSeconds": 0 });
    let (status, pending) = daemon.post(&format!("/api/runs/{run_id}/resume"), body).await;
    assert_eq!((status, pending["status"].as_str()), (202, Some("pending_approval")), "{pending}");
    let question = &pending["approval"]["question"];
    assert_eq!((question["operation"].as_str(), question["factory"].as_str()), (Some("resume"), Some("probe")));
    assert_eq!(question["limits"]["maxTotalSubagents"], 10, "{pending}");
    let (_, registration) = daemon.get("/api/factories/probe").await;
    assert_eq!(question["sha256"], registration["hash"], "{pending}");
    let (_, still) = daemon.get(&format!("/api/runs/{run_id}/envelope")).await;
    assert_eq!(still["status"], "error", "nothing resumed before the answer");
    let id = pending["approvalId"].as_str().unwrap();
    let (status, approved) = daemon.post(&format!("/api/approvals/{id}/approve"), json!({})).await;
    assert_eq!((status, approved["state"]["runId"].as_str()), (200, Some(run_id.as_str())), "{approved}");
    let (_, done) = daemon.get(&format!("/api/runs/{run_id}/wait")).await;
    assert_eq!((done["status"].as_str(), done["attempts"].as_u64()), (Some("completed"), Some(2)), "{done}");
    assert_eq!(done["result"]["done"], 3, "{done}");
}

/// The API's token is the user's: it has the owner's view. `GET /api/runs` lists every
/// session's runs, each naming its `session`, and `?session=NAME` narrows the list; a run
/// of another session than the daemon's can be read, cancelled and resumed, and its updates
/// come on the event stream; a run started over HTTP goes in the daemon's session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_sees_and_controls_every_session_and_filters_by_one() {
    let state = prepared_state();
    // Before the daemon: a run in session `cli-a`, in process.
    let out = common::factory_in(
        state.path(),
        &["--session", "cli-a", "run", "probe", "--args", r#"{"case":"fanout","n":2}"#, "--json", "-q"],
    );
    assert!(out.status.success(), "{}", common::stderr(&out));
    let a_done = common::stdout_json(&out)["runId"].as_str().expect("a run id").to_string();
    let daemon = start(state.path());
    let mut events =
        daemon.client().get(format!("{}/api/events", daemon.base)).bearer_auth(&daemon.token).send().await.unwrap();

    // One run started over HTTP (the daemon's session), one slow one in `cli-a` through the
    // daemon's control socket.
    let (status, started) =
        daemon.post("/api/runs", json!({"name": "probe", "args": {"case": "fanout", "n": 2}})).await;
    assert_eq!(status, 202, "{started}");
    let own = started["runId"].as_str().expect("a run id").to_string();
    let (_, own_done) = daemon.get(&format!("/api/runs/{own}/wait")).await;
    assert_eq!(
        (own_done["status"].as_str(), own_done["session"].as_str()),
        (Some("completed"), Some("default")),
        "{own_done}"
    );
    let slow = common::factory_in(
        state.path(),
        &[
            "--session",
            "cli-a",
            "run",
            "probe",
            "--args",
            r#"{"case":"fanout","n":200}"#,
            "--max-concurrent-subagents",
            "1",
            "--detach",
            "-q",
        ],
    );
    assert!(slow.status.success(), "{}", common::stderr(&slow));
    let a_slow = String::from_utf8(slow.stdout).unwrap().trim().to_string();

    let sessions = |runs: &Value| {
        let mut listed: Vec<(String, String)> = runs
            .as_array()
            .expect("a list")
            .iter()
            .map(|r| {
                (
                    r["runId"].as_str().unwrap_or_default().to_string(),
                    r["session"].as_str().unwrap_or("(none)").to_string(),
                )
            })
            .collect();
        listed.sort();
        listed
    };
    let pairs = |list: &[(&String, &str)]| {
        let mut list: Vec<(String, String)> = list.iter().map(|(id, s)| (id.to_string(), s.to_string())).collect();
        list.sort();
        list
    };
    let (status, all) = daemon.get("/api/runs").await;
    assert_eq!(status, 200, "{all}");
    assert_eq!(sessions(&all), pairs(&[(&a_done, "cli-a"), (&own, "default"), (&a_slow, "cli-a")]), "{all:#}");
    let (_, only_a) = daemon.get("/api/runs?session=cli-a").await;
    assert_eq!(sessions(&only_a), pairs(&[(&a_done, "cli-a"), (&a_slow, "cli-a")]), "{only_a:#}");
    let (_, only_default) = daemon.get("/api/runs?session=default").await;
    assert_eq!(sessions(&only_default), pairs(&[(&own, "default")]), "{only_default:#}");
    let (_, nobody) = daemon.get("/api/runs?session=nobody").await;
    assert_eq!(nobody, json!([]));
    let (status, bad) = daemon.get("/api/runs?all=1").await;
    assert_eq!((status, bad["code"].as_str()), (400, Some("invalid_params")), "{bad}");

    // Another session's run: detail and progress, its updates on the stream, cancel, resume.
    let (status, detail) = daemon.get(&format!("/api/runs/{a_done}")).await;
    assert_eq!((status, detail["session"].as_str()), (200, Some("cli-a")), "{detail}");
    let (status, page) = daemon.get(&format!("/api/runs/{a_done}/progress?afterSeq=0&limit=5")).await;
    assert!(status == 200 && !page.as_array().expect("entries").is_empty(), "{page}");
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !text.split("\n\n").any(|e| e.starts_with("event: run_updated") && e.contains(&a_slow)) {
        let chunk = tokio::time::timeout_at(deadline, events.chunk())
            .await
            .expect("events of cli-a's run come")
            .unwrap()
            .unwrap();
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let (status, cancelled) = daemon.post(&format!("/api/runs/{a_slow}/cancel"), json!({})).await;
    assert_eq!((status, cancelled["status"].as_str()), (200, Some("cancelled")), "{cancelled}");
    let (status, resumed) =
        daemon.post(&format!("/api/runs/{a_slow}/resume"), json!({"limits": {"maxConcurrentSubagents": 50}})).await;
    assert_eq!(status, 202, "{resumed}");
    let (_, done) = daemon.get(&format!("/api/runs/{a_slow}/wait")).await;
    assert_eq!((done["status"].as_str(), done["attempts"].as_u64()), (Some("completed"), Some(2)), "{done}");
    assert_eq!(done["session"], "cli-a", "a resumed run stays in its session");

    // The listing pages (`limit`, `after`); `DELETE` removes an ended run of any session.
    let (_, first) = daemon.get("/api/runs?limit=2").await;
    let first = first.as_array().expect("a page").clone();
    assert_eq!(first.len(), 2, "{first:?}");
    let (_, rest) = daemon.get(&format!("/api/runs?after={}", first[1]["runId"].as_str().unwrap())).await;
    assert_eq!(rest.as_array().map(Vec::len), Some(1), "{rest}");
    let (status, removed) = daemon.call(reqwest::Method::DELETE, &format!("/api/runs/{a_done}"), None).await;
    assert_eq!((status, &removed), (200, &json!({ "runId": a_done, "removed": true })));
    let (status, gone) = daemon.get(&format!("/api/runs/{a_done}")).await;
    assert_eq!((status, gone["code"].as_str()), (404, Some("not_found")), "{gone}");
    let (status, again) = daemon.call(reqwest::Method::DELETE, &format!("/api/runs/{a_done}"), None).await;
    assert_eq!((status, again["code"].as_str()), (404, Some("not_found")), "{again}");
    let (_, all) = daemon.get("/api/runs").await;
    assert_eq!(sessions(&all), pairs(&[(&own, "default"), (&a_slow, "cli-a")]), "{all:#}");

    // `POST /api/gc`: a policy is needed; as a session, only that session's ended runs go;
    // as the owner, every session's (a dry run first lists them and deletes nothing).
    let (status, refused) = daemon.post("/api/gc", json!({})).await;
    assert_eq!((status, refused["code"].as_str()), (400, Some("invalid_params")), "{refused}");
    let as_a = daemon
        .client()
        .post(format!("{}/api/gc", daemon.base))
        .bearer_auth(&daemon.token)
        .header("factory-session", "cli-a")
        .json(&json!({"keepDays": 0}))
        .send()
        .await
        .expect("the API answers");
    assert_eq!(as_a.status().as_u16(), 200);
    let as_a: Value = as_a.json().await.expect("JSON");
    assert_eq!(as_a, json!({"removed": [a_slow], "kept": 0, "dryRun": false}), "cli-a's own run only");
    let (status, dry) = daemon.post("/api/gc", json!({"keepLast": 0, "dryRun": true})).await;
    assert_eq!((status, &dry), (200, &json!({"removed": [own], "kept": 1, "dryRun": true})), "{dry}");
    let (_, all) = daemon.get("/api/runs").await;
    assert_eq!(sessions(&all), pairs(&[(&own, "default")]), "{all:#}");
    let (status, done) = daemon.post("/api/gc", json!({"keepDays": 0})).await;
    assert_eq!((status, &done), (200, &json!({"removed": [own], "kept": 0, "dryRun": false})), "{done}");
    assert_eq!(daemon.get("/api/runs").await.1, json!([]));

    // `GET /api/stats`: where the store's bytes go, its parts adding up to the file.
    let (status, stats) = daemon.get("/api/stats").await;
    assert_eq!(status, 200, "{stats}");
    let parts = stats["parts"].as_array().expect("the parts");
    let sum: u64 = parts.iter().map(|p| p["bytes"].as_u64().expect("bytes")).sum();
    assert_eq!(Some(sum), stats["fileBytes"].as_u64(), "{stats:#}");
}

/// A field of `/proc/PID/status` in bytes (`VmRSS`, `VmHWM`: given in kB).
fn proc_status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the daemon's /proc status");
    let line = status
        .lines()
        .find(|l| l.starts_with(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in {status}"));
    let kb: u64 = line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{line}"));
    kb * 1024
}

/// Issue 49, item 5: unauthenticated clients that send headers (a sign-in exchange claiming a
/// 4 MiB body, a token-less start, a header line that never ends) and part of a body, then
/// stall, cost the real `factory serve --http` under 64 MiB of memory, 256 of them at once
/// (its peak RSS, `VmHWM` reset just before, against its RSS before; `main` before this
/// change grew by about 137 MiB here): the exchange's `Content-Length` is
/// checked before any body is read, a small one must arrive in time, a request without the
/// token is answered before its body is read, and a connection's read buffer is capped.
/// Afterwards the service answers as before, and the refusals are typed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_unauthenticated_connections_cost_the_service_little_memory() {
    use tokio::io::AsyncWriteExt;
    let state = tempfile::tempdir().unwrap();
    let daemon = start(state.path());
    let pid = daemon.child.id();
    let addr = daemon.base.trim_start_matches("http://").to_string();
    // Warm up what a first request allocates, then take the baseline.
    assert_eq!(daemon.get("/api/runs").await.0, 200);
    let before = proc_status_bytes(pid, "VmRSS");
    // Reset the peak (VmHWM) to the current RSS, so the peak read below is the attack's.
    std::fs::write(format!("/proc/{pid}/clear_refs"), b"5")
        .expect("resetting the daemon's peak RSS (/proc/PID/clear_refs)");

    const STALLED: usize = 256;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..STALLED {
        let addr = addr.clone();
        tasks.spawn(async move {
            let mut stream = tokio::net::TcpStream::connect(&addr).await.expect("connect");
            let host = format!("Host: {addr}\r\n");
            let (head, body) = match i % 8 {
                // A sign-in exchange claiming 4 MiB, then 1 MiB of it.
                0..=3 => (format!("POST /api/ui/exchange HTTP/1.1\r\n{host}Content-Type: application/json\r\nContent-Length: 4194304\r\n\r\n"), 1 << 20),
                // One within the cap that never finishes.
                4 | 5 => (format!("POST /api/ui/exchange HTTP/1.1\r\n{host}Content-Type: application/json\r\nContent-Length: 4000\r\n\r\n"), 3000),
                // A start without the token, claiming 4 MiB, then 1 MiB of it.
                6 => (format!("POST /api/runs HTTP/1.1\r\n{host}Content-Type: application/json\r\nContent-Length: 4194304\r\n\r\n"), 1 << 20),
                // Headers that never end.
                _ => (format!("POST /api/ui/exchange HTTP/1.1\r\n{host}X-Pad: {}", "a".repeat(1 << 20)), 0),
            };
            // The server may stop reading or close: what it refuses is not an error here.
            let sent = async {
                stream.write_all(head.as_bytes()).await?;
                stream.write_all(&vec![b'x'; body]).await
            };
            let _ = tokio::time::timeout(Duration::from_secs(20), sent).await;
            stream
        });
    }
    let mut held = Vec::new();
    while let Some(stream) = tasks.join_next().await {
        held.push(stream.expect("a stalled client"));
    }
    // Let the server read whatever it is going to read of what was sent.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let peak = proc_status_bytes(pid, "VmHWM");
    let grown = peak.saturating_sub(before);
    eprintln!("RSS before {} KiB, peak with {STALLED} stalled connections {} KiB", before / 1024, peak / 1024);
    assert!(grown < 64 << 20, "{STALLED} stalled unauthenticated connections grew the service by {} MiB", grown >> 20);
    drop(held);

    // The service still answers, and the refusals are typed.
    let (status, runs) = daemon.get("/api/runs").await;
    assert_eq!(status, 200, "{runs}");
    let client = daemon.client();
    let exchange = |body: Vec<u8>| {
        let request = client
            .post(format!("{}/api/ui/exchange", daemon.base))
            .header("content-type", "application/json")
            .body(body);
        async move {
            let response = request.send().await.expect("the daemon answers");
            (response.status().as_u16(), response.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (status, big) = exchange(vec![b' '; 8192]).await;
    assert_eq!((status, big["code"].as_str()), (413, Some("invalid_params")), "{big}");
    let (status, odd) = exchange(br#"{"code":"not-a-code"}"#.to_vec()).await;
    assert_eq!((status, odd["code"].as_str()), (401, Some("invalid_code")), "{odd}");
    let (status, unknown) = exchange(format!(r#"{{"code":"{}"}}"#, "0".repeat(64)).into_bytes()).await;
    assert_eq!((status, unknown["code"].as_str()), (401, Some("invalid_code")), "{unknown}");
}

/// Issue 49: `POST /api/factories {path}` reads no unbounded file: a device that never ends
/// (`/dev/zero`) or a file over the component cap is refused (400 `invalid_params`, saying
/// why) before it is read, and the service goes on answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registering_a_path_reads_no_unbounded_file() {
    let state = tempfile::tempdir().unwrap();
    let daemon = start(state.path());
    let (status, refused) = daemon.post("/api/factories", json!({ "path": "/dev/zero" })).await;
    assert_eq!((status, refused["code"].as_str()), (400, Some("invalid_params")), "{refused}");
    assert!(refused["message"].as_str().unwrap_or_default().contains("not a regular file"), "{refused}");
    // A sparse file just over 256 MiB: its size alone refuses it.
    let big = state.path().join("big.wasm");
    std::fs::File::create(&big).unwrap().set_len((256 << 20) + 1).unwrap();
    let (status, refused) = daemon.post("/api/factories", json!({ "path": big })).await;
    assert_eq!((status, refused["code"].as_str()), (400, Some("invalid_params")), "{refused}");
    assert!(refused["message"].as_str().unwrap_or_default().contains("is over 268435456 bytes"), "{refused}");
    assert_eq!(daemon.get("/api/runs").await.0, 200);
}
