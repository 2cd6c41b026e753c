//! Consent from where the caller is, over MCP (issue 52): a factory the machine does not trust
//! is asked about through MCP elicitation, to the person behind the official Python client
//! (`tests/mcp/consent.py`, which declares elicitation and answers every question one way):
//! approve once runs it and asks again next time, approve always trusts its sha256, decline
//! starts nothing (no run, no backend call) and says so; `factories_manage author` asks before
//! it registers an agent's body. Over stdio and over streamable HTTP. (A client without
//! elicitation keeps the refusal: `tests/mcp.rs`.)

mod common;

use common::fake_openai::{base_url, FakeOpenAi, Mode};
use common::{factory_in, stderr, stdout_json};
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

/// A state dir whose default backend is the fake server, with `probe` registered but not
/// trusted; and probe's sha256.
fn untrusted_probe(port: u16) -> (tempfile::TempDir, String) {
    let state = tempfile::tempdir().unwrap();
    let config = format!(
        "default = \"local\"\n[backends.local]\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"\n",
        base_url(port)
    );
    std::fs::write(state.path().join("factory.toml"), config).unwrap();
    common::register_trusted_probe(state.path());
    let probe = common::component("probe");
    let out = factory_in(state.path(), &["trust", "--revoke", probe.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let hash = factory_host::component::content_hash(&std::fs::read(&probe).unwrap());
    (state, hash)
}

/// `tests/mcp/consent.py` with `args` (stdio: the binary and the answer) against `state`.
async fn consent_client(state: &Path, args: &[&str]) -> Value {
    common::python_mcp_client(state, "consent.py", args, &[]).await
}

async fn over_stdio(state: &Path, answer: &str) -> Value {
    consent_client(state, &[common::factory_bin().to_str().unwrap(), answer]).await
}

fn trusted(state: &Path) -> Vec<String> {
    let listed = stdout_json(&factory_in(state, &["trust", "--json"]));
    listed.as_array().unwrap().iter().map(|t| t["sha256"].as_str().unwrap().to_string()).collect()
}

fn questions(report: &Value) -> Vec<String> {
    report["questions"].as_array().unwrap().iter().map(|q| q["message"].as_str().unwrap().to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approve_once_runs_it_and_the_next_run_asks_again() {
    let server = FakeOpenAi::start(Mode::Answer { latency: Duration::ZERO }).await;
    let (state, hash) = untrusted_probe(server.port());
    let report = over_stdio(state.path(), "once").await;
    for run in ["first", "second"] {
        assert_eq!(report[run]["isError"], false, "{report:#}");
        assert_eq!(report[run]["structured"]["status"], "completed", "{report:#}");
    }
    let asked = questions(&report);
    assert_eq!(asked.len(), 3, "each run, then the author: {asked:#?}");
    for fact in ["factory: probe", &format!("sha256: {hash}"), "operation: run", "grants: none"] {
        assert!(asked[0].contains(fact), "the question names {fact}: {}", asked[0]);
    }
    assert!(report["questions"][0]["schema"]["properties"]["always"].is_object(), "{report:#}");
    assert!(asked[2].contains("factory: greeter") && asked[2].contains("operation: author"), "{}", asked[2]);
    assert!(asked[2].contains("phases: Greet"), "{}", asked[2]);
    assert_eq!(report["author"]["isError"], false, "{report:#}");
    let names: Vec<&str> = report["list"]["structured"]["factories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"greeter"), "{names:?}");
    assert_eq!(server.requests(), 4, "two runs of two agents");
    assert!(!trusted(state.path()).contains(&hash), "once is not always");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approve_always_trusts_the_sha256_from_then_on() {
    let server = FakeOpenAi::start(Mode::Answer { latency: Duration::ZERO }).await;
    let (state, hash) = untrusted_probe(server.port());
    let report = over_stdio(state.path(), "always").await;
    assert_eq!(report["first"]["structured"]["status"], "completed", "{report:#}");
    assert_eq!(report["second"]["structured"]["status"], "completed", "{report:#}");
    let asked = questions(&report);
    assert_eq!(asked.len(), 2, "the first run and the author; the second run is trusted: {asked:#?}");
    let trusted = trusted(state.path());
    assert!(trusted.contains(&hash), "{trusted:?}");
    // The authored body's source sha256 is trusted too (the author answer named its text).
    assert_eq!(trusted.len(), 2, "{trusted:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decline_starts_nothing_and_says_so() {
    let server = FakeOpenAi::start(Mode::Answer { latency: Duration::ZERO }).await;
    let (state, _) = untrusted_probe(server.port());
    for answer in ["decline", "dismiss"] {
        let report = over_stdio(state.path(), answer).await;
        for refused in ["first", "second", "author"] {
            assert_eq!(report[refused]["isError"], true, "{answer}: {report:#}");
            assert_eq!(report[refused]["structured"]["code"], "declined", "{answer}: {report:#}");
            assert!(report[refused]["text"].as_str().unwrap().contains("nothing started"), "{report:#}");
        }
        assert_eq!(report["runs"]["structured"]["runs"].as_array().map(Vec::len), Some(0), "no run exists: {report:#}");
        let names: Vec<&str> = report["list"]["structured"]["factories"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["name"].as_str().unwrap())
            .collect();
        assert!(!names.contains(&"greeter"), "a declined body is not registered: {names:?}");
    }
    assert_eq!(server.requests(), 0, "no backend call");
    let out = factory_in(state.path(), &["runs", "--all", "--json"]);
    assert_eq!(stdout_json(&out).as_array().map(Vec::len), Some(0), "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_question_is_asked_over_streamable_http_too() {
    let server = FakeOpenAi::start(Mode::Answer { latency: Duration::ZERO }).await;
    let (state, hash) = untrusted_probe(server.port());
    let (mut daemon, url, token) = common::mcp_http(state.path());
    let report = consent_client(state.path(), &["--http", &url, token.trim(), "once"]).await;
    let _ = daemon.kill();
    let _ = daemon.wait();
    assert_eq!(report["first"]["structured"]["status"], "completed", "{report:#}");
    let asked = questions(&report);
    assert_eq!(asked.len(), 3, "{asked:#?}");
    assert!(asked[0].contains(&format!("sha256: {hash}")), "{}", asked[0]);
}
