//! Integration tests of the real subagent backends (issue 5): the OpenAI-compatible and
//! Anthropic backends against HTTP servers this file starts on 127.0.0.1 (speaking their wire
//! formats, errors and rate limits included), the agent-CLI backend against real child
//! processes (shell scripts that behave like agent CLIs, one of which ignores SIGTERM),
//! cassettes, config and routing, and whole runs of the `probe` guest through them.

mod common;

use factory_host::backend::cassette::{read_cassette, CASSETTE_VERSION};
use factory_host::backend::{
    self, AgentBackend, AgentCli, AgentCliConfig, AgentRequest, Anthropic, AnthropicConfig, Cassette, OpenAi,
    OpenAiConfig, OutageKind, Price, Pricing, RetryPolicy, SandboxMode, StructuredMode, Usage,
};
use factory_host::config::Config;
use factory_host::{Host, HostConfig, Limits, RunOptions, RunStatus};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------
// A tiny HTTP server on 127.0.0.1 that records what it is sent and answers per a handler.

/// One request the server saw.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    headers: HashMap<String, String>,
    body: Value,
}

/// What the server answers.
struct Reply {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: String,
}

type Handler = dyn Fn(usize, &Seen) -> Reply + Send + Sync;

struct Server {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    /// Start a server; `handler` gets the request's index (0-based) and the request.
    async fn start(handler: impl Fn(usize, &Seen) -> Reply + Send + Sync + 'static) -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1");
        let addr = listener.local_addr().expect("local addr");
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let handler: Arc<Handler> = Arc::new(handler);
        let task = {
            let seen = seen.clone();
            tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    let (seen, handler) = (seen.clone(), handler.clone());
                    let service = service_fn(move |req: Request<Incoming>| {
                        let (seen, handler) = (seen.clone(), handler.clone());
                        async move {
                            let path = req.uri().path().to_string();
                            let headers = req
                                .headers()
                                .iter()
                                .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or_default().to_string()))
                                .collect();
                            let bytes = req.into_body().collect().await?.to_bytes();
                            let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                            let request = Seen { path, headers, body };
                            let index = {
                                let mut seen = seen.lock().unwrap();
                                seen.push(request.clone());
                                seen.len() - 1
                            };
                            let reply = handler(index, &request);
                            let mut response =
                                Response::builder().status(reply.status).header("content-type", "application/json");
                            for (name, value) in reply.headers {
                                response = response.header(name, value);
                            }
                            Ok::<_, hyper::Error>(response.body(Full::new(Bytes::from(reply.body))).unwrap())
                        }
                    });
                    tokio::spawn(async move {
                        let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                    });
                }
            })
        };
        Server { addr, seen, task }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// OpenAI chat-completions wire format.

fn openai_ok(content: &str, prompt_tokens: u64, completion_tokens: u64) -> Reply {
    let body = json!({
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "test-model",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content, "refusal": null},
            "logprobs": null,
            "finish_reason": "stop"
        }],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens
        }
    });
    Reply { status: 200, headers: vec![], body: body.to_string() }
}

fn openai_ok_without_usage(content: &str) -> Reply {
    let body = json!({
        "id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": "local",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]
    });
    Reply { status: 200, headers: vec![], body: body.to_string() }
}

fn openai_error(status: u16, kind: &str, message: &str, param: Option<&str>) -> Reply {
    let body = json!({"error": {"message": message, "type": kind, "param": param, "code": null}});
    Reply { status, headers: vec![], body: body.to_string() }
}

// Anthropic Messages wire format.

fn anthropic_message(content: Value, stop_reason: &str, input_tokens: u64, output_tokens: u64) -> Reply {
    let body = json!({
        "id": "msg_test",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": null,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens}
    });
    Reply { status: 200, headers: vec![], body: body.to_string() }
}

fn anthropic_error(status: u16, kind: &str, message: &str) -> Reply {
    let body = json!({"type": "error", "error": {"type": kind, "message": message}});
    Reply { status, headers: vec![], body: body.to_string() }
}

fn fast_retries() -> RetryPolicy {
    RetryPolicy {
        max_retries: 3,
        base_delay: Duration::from_millis(10),
        max_delay: Duration::from_millis(40),
        timeout: Duration::from_secs(30),
        ..RetryPolicy::default()
    }
}

fn openai_config(server: &Server) -> OpenAiConfig {
    OpenAiConfig {
        api_key: Some("sk-test".into()),
        model: Some("default-model".into()),
        retry: fast_retries(),
        ..OpenAiConfig::new("openai", format!("{}/v1", server.url()))
    }
}

fn anthropic_config(server: &Server) -> AnthropicConfig {
    AnthropicConfig {
        api_key: Some("ak-test".into()),
        model: Some("claude-test".into()),
        retry: fast_retries(),
        ..AnthropicConfig::new("anthropic", server.url())
    }
}

fn request(prompt: &str, label: Option<&str>, schema: Option<Value>, model: Option<&str>) -> Arc<AgentRequest> {
    Arc::new(AgentRequest {
        prompt: prompt.into(),
        label: label.map(str::to_string),
        model: model.map(str::to_string),
        schema,
        attempt: 0,
        feedback: None,
        limits: Default::default(),
        tuning: Default::default(),
    })
}

fn verdict_schema() -> Value {
    json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]})
}

// ---------------------------------------------------------------------------------------
// OpenAI-compatible backend

#[tokio::test]
async fn openai_schema_call_asks_for_json_schema_and_prices_usage_exactly() {
    let server = Server::start(|_, _| openai_ok(r#"{"ok":true}"#, 1234, 567)).await;
    let mut pricing = Pricing::default();
    // 0.002 credits per 1k input tokens, 0.006 per 1k output tokens.
    pricing.models.insert("priced".into(), Price::new(2_000_000, 6_000_000));
    let backend = OpenAi::new(OpenAiConfig { pricing, ..openai_config(&server) }).unwrap();

    let reply = backend.call(request("judge it", Some("judge"), Some(verdict_schema()), Some("priced"))).await.unwrap();
    assert_eq!(reply.text, r#"{"ok":true}"#);
    // 1234 * 2_000_000 / 1000 + 567 * 6_000_000 / 1000 = 2_468_000 + 3_402_000
    assert_eq!(reply.usage, Some(Usage::tokens(1234, 567, Some(5_870_000))));

    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    let call = &seen[0];
    assert_eq!(call.path, "/v1/chat/completions");
    assert_eq!(call.headers.get("authorization").map(String::as_str), Some("Bearer sk-test"));
    assert_eq!(call.body["model"], "priced");
    let messages = call.body["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[0]["role"], "system");
    assert!(messages[0]["content"].as_str().unwrap().contains(&verdict_schema().to_string()));
    assert_eq!(messages[1], json!({"role": "user", "content": "judge it"}));
    assert_eq!(
        call.body["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "reply", "schema": verdict_schema(), "strict": false}})
    );

    // A text call: the default model, no system message, no response_format, unpriced model
    // (its cost would be unknown, not zero, but the server is on this machine: 0 credits).
    let reply = backend.call(request("say hi", None, None, None)).await.unwrap();
    assert_eq!(reply.usage.unwrap().credits_nano, Some(0));
    assert!(backend.free_notice(None).is_some_and(|n| n.contains("`default-model`")), "the notice names the model");
    assert_eq!(backend.free_notice(Some("priced")), None, "a priced model is not free");
    let text_call = &server.seen()[1];
    assert_eq!(text_call.body["model"], "default-model");
    assert_eq!(text_call.body["messages"], json!([{"role": "user", "content": "say hi"}]));
    assert!(text_call.body.get("response_format").is_none());
}

#[tokio::test]
async fn openai_falls_back_to_json_object_then_plain_and_remembers_it() {
    let server = Server::start(|_, seen| match seen.body.pointer("/response_format/type").and_then(Value::as_str) {
        Some("json_schema") => openai_error(
            400,
            "invalid_request_error",
            "Invalid parameter: 'response_format' of type 'json_schema' is not supported with this model.",
            Some("response_format"),
        ),
        Some("json_object") => {
            openai_error(400, "invalid_request_error", "'response_format.type' must be 'text'", Some("response_format"))
        }
        _ => openai_ok(r#"{"ok":false}"#, 10, 5),
    })
    .await;
    let backend = OpenAi::new(openai_config(&server)).unwrap();
    assert_eq!(backend.structured_mode(), StructuredMode::JsonSchema);

    let reply = backend.call(request("judge", None, Some(verdict_schema()), None)).await.unwrap();
    assert_eq!(reply.text, r#"{"ok":false}"#);
    let kinds: Vec<Value> = server.seen().iter().map(|s| s.body["response_format"]["type"].clone()).collect();
    assert_eq!(kinds, vec![json!("json_schema"), json!("json_object"), Value::Null]);
    assert_eq!(backend.structured_mode(), StructuredMode::Plain);
    // Plain prompting still carries the schema in the system message.
    let plain = &server.seen()[2];
    assert!(plain.body["messages"][0]["content"].as_str().unwrap().contains("JSON Schema"));

    // Remembered: the next schema call goes straight to plain prompting.
    backend.call(request("judge again", None, Some(verdict_schema()), None)).await.unwrap();
    assert_eq!(server.count(), 4);
    assert!(server.seen()[3].body.get("response_format").is_none());
}

#[tokio::test]
async fn openai_retries_429_and_5xx_honouring_retry_after() {
    let server = Server::start(|i, _| match i {
        0 => Reply {
            headers: vec![("retry-after", "1".into())],
            ..openai_error(429, "rate_limit_exceeded", "Rate limit reached for requests", None)
        },
        1 => openai_error(500, "server_error", "The server had an error while processing your request.", None),
        _ => openai_ok("finally", 3, 1),
    })
    .await;
    let backend = OpenAi::new(openai_config(&server)).unwrap();
    let started = Instant::now();
    let reply = backend.call(request("hello", None, None, None)).await.unwrap();
    assert_eq!(reply.text, "finally");
    assert_eq!(server.count(), 3, "429, then 500, then success");
    assert!(started.elapsed() >= Duration::from_secs(1), "Retry-After: 1 was honoured: {:?}", started.elapsed());
}

#[tokio::test]
async fn openai_retries_are_bounded() {
    let server = Server::start(|_, _| openai_error(503, "server_error", "overloaded", None)).await;
    let config = OpenAiConfig { retry: RetryPolicy { max_retries: 2, ..fast_retries() }, ..openai_config(&server) };
    let backend = OpenAi::new(config).unwrap();
    let err = backend.call(request("hello", None, None, None)).await.unwrap_err();
    assert_eq!(server.count(), 3, "one try and two retries");
    assert!(err.message().contains("HTTP 503") && err.message().contains("overloaded"), "{err}");
    assert_eq!(err.outage_kind(), Some(OutageKind::ServerError), "5xx past the retries is a backend failure");

    // A Retry-After longer than the backend waits (max_wait_seconds, 600 by default) fails at
    // once, without retrying: the quota is spent until then, and the error says when.
    let slow = Server::start(|_, _| Reply {
        headers: vec![("retry-after", "3600".into())],
        ..openai_error(429, "rate_limit_exceeded", "slow down", None)
    })
    .await;
    let before = std::time::SystemTime::now();
    let err = OpenAi::new(openai_config(&slow)).unwrap().call(request("hello", None, None, None)).await.unwrap_err();
    assert_eq!(slow.count(), 1);
    assert!(err.message().contains("3600"), "{err}");
    assert_eq!(err.outage_kind(), Some(OutageKind::Quota));
    let resume_at = err.resume_at().expect("the reset time the server gave");
    assert!(resume_at >= before + Duration::from_secs(3600), "{resume_at:?}");
}

#[tokio::test]
async fn openai_connection_errors_are_retried_then_reported() {
    // A port that was just free: nothing listens there.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let config = OpenAiConfig {
        retry: RetryPolicy { max_retries: 2, ..fast_retries() },
        ..OpenAiConfig::new("openai", format!("http://127.0.0.1:{port}/v1"))
    };
    let err = OpenAi::new(OpenAiConfig { model: Some("m".into()), ..config })
        .unwrap()
        .call(request("hello", None, None, None))
        .await
        .unwrap_err();
    assert!(err.message().contains("after 3 tries"), "{err}");
    assert_eq!(err.outage_kind(), Some(OutageKind::Unavailable), "a refused connection is an outage, not an answer");
}

#[tokio::test]
async fn openai_401_and_404_fail_clearly_without_retrying() {
    let server = Server::start(|_, seen| {
        if seen.headers.get("authorization").map(String::as_str) != Some("Bearer sk-good") {
            openai_error(401, "invalid_request_error", "Incorrect API key provided: sk-bad.", None)
        } else {
            openai_error(404, "invalid_request_error", "The model `gpt-nope` does not exist", Some("model"))
        }
    })
    .await;
    let bad_key = OpenAi::new(OpenAiConfig { api_key: Some("sk-bad".into()), ..openai_config(&server) }).unwrap();
    let err = bad_key.call(request("hi", None, None, None)).await.unwrap_err();
    assert!(
        err.message().contains("HTTP 401")
            && err.message().contains("Incorrect API key")
            && err.message().contains("OPENAI_API_KEY"),
        "{err}"
    );
    assert_eq!(err.outage_kind(), Some(OutageKind::Auth));
    assert_eq!(server.count(), 1);

    let good_key = OpenAi::new(OpenAiConfig { api_key: Some("sk-good".into()), ..openai_config(&server) }).unwrap();
    let err = good_key.call(request("hi", None, None, Some("gpt-nope"))).await.unwrap_err();
    assert!(err.message().contains("HTTP 404") && err.message().contains("gpt-nope"), "{err}");
    assert_eq!(err.outage_kind(), Some(OutageKind::ModelNotFound));
    assert_eq!(server.count(), 2);

    // No key and no model at all: a clear error before any request.
    let no_model = OpenAi::new(OpenAiConfig { model: None, ..openai_config(&server) }).unwrap();
    let err = no_model.call(request("hi", None, None, None)).await.unwrap_err();
    assert!(err.message().contains("--model"), "{err}");
    assert_eq!(err.outage_kind(), Some(OutageKind::Misconfigured));
    assert_eq!(server.count(), 2);
}

// ---------------------------------------------------------------------------------------
// Anthropic backend

#[tokio::test]
async fn anthropic_schema_call_forces_the_respond_tool() {
    let server = Server::start(|_, seen| {
        let input = if seen.body["tools"][0]["input_schema"]["properties"].get("value").is_some() {
            json!({"value": ["a", "b"]})
        } else {
            json!({"ok": true})
        };
        anthropic_message(
            json!([{"type": "tool_use", "id": "toolu_1", "name": "respond", "input": input}]),
            "tool_use",
            321,
            45,
        )
    })
    .await;
    let pricing = Pricing { default: Some(Price::new(3_000_000, 15_000_000)), ..Pricing::default() };
    let backend = Anthropic::new(AnthropicConfig {
        system_prompt: Some("You are terse.".into()),
        pricing,
        ..anthropic_config(&server)
    })
    .unwrap();

    let reply = backend.call(request("judge it", Some("judge"), Some(verdict_schema()), None)).await.unwrap();
    assert_eq!(serde_json::from_str::<Value>(&reply.text).unwrap(), json!({"ok": true}));
    // 321 * 3_000_000 / 1000 + 45 * 15_000_000 / 1000 = 963_000 + 675_000
    assert_eq!(reply.usage, Some(Usage::tokens(321, 45, Some(1_638_000))));

    let call = &server.seen()[0];
    assert_eq!(call.path, "/v1/messages");
    assert_eq!(call.headers.get("x-api-key").map(String::as_str), Some("ak-test"));
    assert_eq!(call.headers.get("anthropic-version").map(String::as_str), Some("2023-06-01"));
    assert_eq!(call.body["model"], "claude-test");
    assert!(call.body["max_tokens"].as_u64().unwrap() > 0);
    assert_eq!(call.body["system"], "You are terse.");
    assert_eq!(call.body["messages"], json!([{"role": "user", "content": "judge it"}]));
    assert_eq!(call.body["tools"][0]["name"], "respond");
    assert_eq!(call.body["tools"][0]["input_schema"], verdict_schema());
    assert_eq!(call.body["tool_choice"], json!({"type": "tool", "name": "respond"}));

    // A schema whose root is not an object is wrapped in {value: ...} and unwrapped.
    let list = json!({"type": "array", "items": {"type": "string"}});
    let reply = backend.call(request("list", None, Some(list.clone()), None)).await.unwrap();
    assert_eq!(serde_json::from_str::<Value>(&reply.text).unwrap(), json!(["a", "b"]));
    assert_eq!(server.seen()[1].body["tools"][0]["input_schema"]["properties"]["value"], list);
}

#[tokio::test]
async fn anthropic_text_calls_retries_and_tool_fallback() {
    let server = Server::start(|i, seen| {
        if seen.body.get("tools").is_some() {
            return anthropic_error(400, "invalid_request_error", "tools: this endpoint does not support tools");
        }
        match i {
            0 => Reply {
                headers: vec![("retry-after", "1".into())],
                ..anthropic_error(429, "rate_limit_error", "Number of requests has exceeded your rate limit")
            },
            1 => anthropic_error(529, "overloaded_error", "Overloaded"),
            _ => anthropic_message(json!([{"type": "text", "text": "{\"ok\": true}"}]), "end_turn", 7, 3),
        }
    })
    .await;
    let backend = Anthropic::new(anthropic_config(&server)).unwrap();
    let started = Instant::now();
    let reply = backend.call(request("hello", None, None, None)).await.unwrap();
    assert_eq!(reply.text, "{\"ok\": true}");
    assert_eq!(reply.usage.as_ref().map(|u| (u.input_tokens, u.output_tokens)), Some((7, 3)));
    assert_eq!(server.count(), 3, "429, 529, then success");
    assert!(started.elapsed() >= Duration::from_secs(1), "Retry-After honoured: {:?}", started.elapsed());
    assert!(server.seen().iter().all(|s| s.body.get("system").is_none()));

    // The server refuses tools: the schema call is prompted instead, and that is remembered.
    assert!(backend.uses_tool());
    let reply = backend.call(request("judge", None, Some(verdict_schema()), None)).await.unwrap();
    assert_eq!(reply.text, "{\"ok\": true}");
    assert!(!backend.uses_tool());
    let seen = server.seen();
    assert_eq!(seen.len(), 5);
    assert!(seen[4].body.get("tools").is_none());
    assert!(seen[4].body["system"].as_str().unwrap().contains("JSON Schema"));
    backend.call(request("judge 2", None, Some(verdict_schema()), None)).await.unwrap();
    assert_eq!(server.count(), 6);

    // 401 is reported clearly and not retried.
    let denied = Server::start(|_, _| anthropic_error(401, "authentication_error", "invalid x-api-key")).await;
    let err =
        Anthropic::new(anthropic_config(&denied)).unwrap().call(request("hi", None, None, None)).await.unwrap_err();
    assert!(
        err.message().contains("HTTP 401")
            && err.message().contains("invalid x-api-key")
            && err.message().contains("ANTHROPIC_API_KEY")
    );
    assert_eq!(denied.count(), 1);
}

// ---------------------------------------------------------------------------------------
// Agent-CLI backend

/// Write an executable shell script into `dir`.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// An unsandboxed generic CLI: these tests are about the process handling (stdin, argv, the
/// kill ladder, host pids); the bubblewrap sandbox has its own tests in tests/agent_cli.rs.
fn cli(name: &str, command: &[&str]) -> AgentCliConfig {
    AgentCliConfig {
        sandbox: SandboxMode::None,
        ..AgentCliConfig::generic(name, command.iter().map(|s| s.to_string()).collect())
    }
}

/// `kill -0 PID` succeeds: the pid exists (running, or a zombie nobody reaped).
fn pid_exists(pid: i32) -> bool {
    std::process::Command::new("kill")
        .arg("-0")
        .arg(pid.to_string())
        .stderr(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// The pid exists and is not a zombie. (Where PID 1 does not reap orphans, a killed
/// grandchild stays a zombie forever: it runs nothing and holds nothing but its pid.)
fn pid_running(pid: i32) -> bool {
    if !pid_exists(pid) {
        return false;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, Some(Some('Z')) | Some(None) | None)
}

async fn read_pid(path: &Path) -> i32 {
    for _ in 0..2000 {
        if let Ok(text) = std::fs::read_to_string(path) {
            if let Ok(pid) = text.trim().parse() {
                return pid;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{} never appeared", path.display());
}

/// Wait (up to a generous deadline, so a broken kill fails instead of hanging) until the
/// leader is gone entirely and the grandchild runs no more.
async fn await_gone(leader: i32, grandchild: i32) {
    for _ in 0..3000 {
        if !pid_exists(leader) && !pid_running(grandchild) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("left behind: leader exists={} grandchild running={}", pid_exists(leader), pid_running(grandchild));
}

#[tokio::test]
async fn cli_prompt_on_stdin_env_allow_list_cwd_and_model_args() {
    let dir = tempfile::tempdir().unwrap();
    let agent = script(
        dir.path(),
        "agent.sh",
        r#"prompt=$(cat)
echo "prompt=[$prompt]"
echo "cwd=$(pwd)"
echo "allowed=${FACTORY_TEST_ALLOWED:-unset} secret=${FACTORY_TEST_SECRET:-unset} path=${PATH:+set}"
echo "args=$*""#,
    );
    std::env::set_var("FACTORY_TEST_ALLOWED", "yes");
    std::env::set_var("FACTORY_TEST_SECRET", "leaked");
    let workdir = tempfile::tempdir().unwrap();
    let config = AgentCliConfig {
        model_args: vec!["--model".into(), "{model}".into()],
        env: vec!["FACTORY_TEST_ALLOWED".into()],
        cwd: Some(workdir.path().to_path_buf()),
        ..cli("cli:test", &["sh", agent.to_str().unwrap(), "--flag"])
    };
    let backend = AgentCli::new(config).unwrap();
    let reply = backend.call(request("do the thing", None, None, Some("m1"))).await.unwrap();
    let cwd = workdir.path().canonicalize().unwrap();
    let expected = format!(
        "prompt=[do the thing]\ncwd={}\nallowed=yes secret=unset path=set\nargs=--flag --model m1",
        cwd.display()
    );
    assert_eq!(reply.text, expected);
    assert_eq!(reply.usage, None, "a text CLI reports no usage");

    // A schema call puts the schema into the prompt.
    let reply = backend.call(request("judge", None, Some(verdict_schema()), None)).await.unwrap();
    assert!(reply.text.contains("JSON Schema") && reply.text.contains(r#""required":["ok"]"#), "{}", reply.text);
    assert!(reply.text.ends_with("args=--flag"), "no model, no model args: {}", reply.text);
}

#[tokio::test]
async fn cli_prompt_as_argument_json_output_and_failures() {
    let backend = AgentCli::new(cli("cli:arg", &["sh", "-c", "printf '%s' \"$1\"", "sh", "{prompt}"])).unwrap();
    let reply = backend.call(request("it's \"quoted\" $HOME", None, None, None)).await.unwrap();
    assert_eq!(reply.text, "it's \"quoted\" $HOME");

    let dir = tempfile::tempdir().unwrap();
    let claude_like = script(
        dir.path(),
        "claude.sh",
        r#"cat > /dev/null
echo '{"type":"result","subtype":"success","is_error":false,"result":"hello","total_cost_usd":0.25,"usage":{"input_tokens":12,"output_tokens":3}}'"#,
    );
    let config = AgentCliConfig {
        command: vec!["sh".into(), claude_like.display().to_string()],
        sandbox: SandboxMode::None,
        ..AgentCliConfig::preset("claude").unwrap()
    };
    let reply = AgentCli::new(config).unwrap().call(request("hi", None, None, None)).await.unwrap();
    assert_eq!(reply.text, "hello");
    // US$0.25 at 100 credits per dollar (one credit is US$0.01): 25 credits.
    assert_eq!(reply.usage, Some(Usage::tokens(12, 3, Some(25_000_000_000))));

    let failing = AgentCli::new(cli("cli:fail", &["sh", "-c", "echo 'quota exhausted' >&2; exit 3"])).unwrap();
    let err = failing.call(request("hi", None, None, None)).await.unwrap_err();
    assert!(err.message().contains("exit status: 3") && err.message().contains("quota exhausted"), "{err}");
    assert_eq!(err.outage_kind(), None, "a CLI that ran and failed is an ordinary failure");

    let missing = AgentCli::new(cli("cli:missing", &["/nonexistent/agent-cli"])).unwrap();
    let err = missing.call(request("hi", None, None, None)).await.unwrap_err();
    assert!(err.message().contains("cannot start"), "{err}");
    assert_eq!(err.outage_kind(), Some(OutageKind::NotInstalled), "a missing CLI is a backend failure");
}

#[tokio::test]
async fn cli_argv_is_never_chosen_by_the_factory() {
    // The model goes into argv after `--model`, the prompt into `$1`: a factory's model that
    // looks like an option (or holds whitespace) is refused before anything runs, and a
    // prompt that mentions `{model}` is passed as written.
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let command = format!("touch {}; printf '%s|%s' \"$1\" \"$3\"", marker.display());
    let config = AgentCliConfig {
        model_args: vec!["--model".into(), "{model}".into()],
        ..cli("cli:argv", &["sh", "-c", &command, "sh", "{prompt}"])
    };
    let backend = AgentCli::new(config).unwrap();
    let reply = backend.call(request("use {model} here", None, None, Some("m-1"))).await.unwrap();
    assert_eq!(reply.text, "use {model} here|m-1");
    std::fs::remove_file(&marker).unwrap();
    for model in ["--dangerously-skip-permissions", "-x", "two words", "bell\u{7}"] {
        let err = backend.call(request("hi", None, None, Some(model))).await.unwrap_err();
        assert!(err.message().contains("refused"), "{model:?}: {err}");
        assert!(!marker.exists(), "{model:?}: the command ran");
    }
    // A prompt too long for one argument fails clearly, before anything runs.
    let huge = "x".repeat(200 * 1024);
    let err = backend.call(request(&huge, None, None, None)).await.unwrap_err();
    assert!(err.message().contains("command-line argument") && err.message().contains("stdin"), "{err}");
    assert!(!marker.exists());
}

#[tokio::test]
async fn cli_leftover_processes_are_swept_after_a_normal_exit() {
    let dir = tempfile::tempdir().unwrap();
    let agent = script(
        dir.path(),
        "leaves.sh",
        r#"sleep 300 > /dev/null 2>&1 &
echo $! > "$1/left.pid"
echo done"#,
    );
    let backend =
        AgentCli::new(cli("cli:leaves", &["sh", agent.to_str().unwrap(), dir.path().to_str().unwrap()])).unwrap();
    let reply = backend.call(request("hi", None, None, None)).await.unwrap();
    assert_eq!(reply.text, "done");
    let left = read_pid(&dir.path().join("left.pid")).await;
    assert!(!pid_running(left), "the background sleep {left} was killed with the group");
}

const STUBBORN: &str = r#"trap '' TERM
sleep 300 &
echo $! > "$1/child.pid"
echo $$ > "$1/self.pid"
wait"#;

#[tokio::test]
async fn cli_timeout_runs_the_kill_ladder_on_a_process_ignoring_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let agent = script(dir.path(), "stubborn.sh", STUBBORN);
    let config = AgentCliConfig {
        timeout: Some(Duration::from_millis(300)),
        grace: Duration::from_millis(700),
        ..cli("cli:stubborn", &["sh", agent.to_str().unwrap(), dir.path().to_str().unwrap()])
    };
    let backend = AgentCli::new(config).unwrap();
    let started = Instant::now();
    let err = backend.call(request("hi", None, None, None)).await.unwrap_err();
    let elapsed = started.elapsed();
    assert!(err.message().contains("timed out"), "{err}");
    // SIGTERM is ignored, so only SIGKILL after the grace period ends it.
    assert!(elapsed >= Duration::from_millis(1000), "timeout + grace elapsed: {elapsed:?}");
    let leader = read_pid(&dir.path().join("self.pid")).await;
    let grandchild = read_pid(&dir.path().join("child.pid")).await;
    assert!(!pid_exists(leader), "the leader {leader} was killed and reaped");
    assert!(!pid_running(grandchild), "the grandchild {grandchild} was killed with the group");
}

#[tokio::test]
async fn cli_dropping_the_call_kills_the_whole_group_after_the_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let agent = script(dir.path(), "stubborn.sh", STUBBORN);
    let grace = Duration::from_millis(1500);
    let config =
        AgentCliConfig { grace, ..cli("cli:stubborn", &["sh", agent.to_str().unwrap(), dir.path().to_str().unwrap()]) };
    let backend = AgentCli::new(config).unwrap();
    let call = backend.call(request("hi", None, None, None));
    // The host cancels a run by dropping its futures: drop the call once the agent runs.
    let (leader, grandchild) = tokio::select! {
        _ = call => panic!("the stubborn agent finished by itself"),
        pids = async {
            let grandchild = read_pid(&dir.path().join("child.pid")).await;
            (read_pid(&dir.path().join("self.pid")).await, grandchild)
        } => pids,
    };
    let dropped = Instant::now();
    // SIGTERM was sent and ignored: the group lives on until the grace period ends.
    assert!(pid_running(leader) && pid_running(grandchild), "SIGKILL must wait for the grace period");
    await_gone(leader, grandchild).await;
    assert!(dropped.elapsed() >= grace - Duration::from_millis(100), "killed after {:?}", dropped.elapsed());
}

#[tokio::test]
async fn cli_cancel_sends_sigterm_first_to_a_cooperative_agent() {
    let dir = tempfile::tempdir().unwrap();
    let agent = script(
        dir.path(),
        "polite.sh",
        r#"trap 'echo term > "$1/got"; kill $child 2>/dev/null; exit 0' TERM
sleep 300 &
child=$!
echo $child > "$1/child.pid"
echo $$ > "$1/self.pid"
wait"#,
    );
    let config = AgentCliConfig {
        grace: Duration::from_secs(30),
        ..cli("cli:polite", &["sh", agent.to_str().unwrap(), dir.path().to_str().unwrap()])
    };
    let backend = AgentCli::new(config).unwrap();
    let call = backend.call(request("hi", None, None, None));
    let (leader, grandchild) = tokio::select! {
        _ = call => panic!("the agent finished by itself"),
        pids = async {
            let grandchild = read_pid(&dir.path().join("child.pid")).await;
            (read_pid(&dir.path().join("self.pid")).await, grandchild)
        } => pids,
    };
    await_gone(leader, grandchild).await;
    assert_eq!(std::fs::read_to_string(dir.path().join("got")).unwrap().trim(), "term", "SIGTERM reached the agent");
}

// ---------------------------------------------------------------------------------------
// Cassettes

#[tokio::test]
async fn cassette_records_then_replays_with_zero_network_calls() {
    let server = Server::start(|_, seen| {
        let prompt = seen.body["messages"].as_array().unwrap().last().unwrap()["content"].as_str().unwrap().to_string();
        if prompt.contains("outage") {
            openai_error(401, "invalid_request_error", "bad key", None)
        } else if prompt.contains("fail") {
            openai_error(400, "invalid_request_error", "context length exceeded", None)
        } else {
            openai_ok(&format!("live reply to {prompt}"), 100, 10)
        }
    })
    .await;
    let pricing = Pricing { default: Some(Price::new(1_000_000, 2_000_000)), ..Pricing::default() };
    let live: Arc<dyn AgentBackend> =
        Arc::new(OpenAi::new(OpenAiConfig { pricing, ..openai_config(&server) }).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("run.cassette.jsonl");

    let recorder = Cassette::record(live.clone(), &file).unwrap();
    let calls = [
        request("first", Some("a"), None, None),
        request("second", Some("b"), Some(verdict_schema()), Some("m2")),
        Arc::new(AgentRequest {
            attempt: 1,
            feedback: None,
            limits: Default::default(),
            tuning: Default::default(),
            ..(*request("second", Some("b"), Some(verdict_schema()), Some("m2"))).clone()
        }),
        request("please fail", None, None, None),
    ];
    let mut recorded = Vec::new();
    for call in &calls {
        recorded.push(recorder.call(call.clone()).await);
    }
    assert_eq!(server.count(), 4);
    assert_eq!(recorded[0].as_ref().unwrap().usage.as_ref().unwrap().credits_nano, Some(120_000));
    assert!(recorded[3].as_ref().is_err_and(|e| e.outage_kind().is_none()), "a 400 is an ordinary failure");
    // An outage (401) is not an answer: it is returned but not recorded.
    let outage = recorder.call(request("outage", None, None, None)).await.unwrap_err();
    assert_eq!(outage.outage_kind(), Some(OutageKind::Auth));
    assert_eq!(server.count(), 5);

    let header: Value = serde_json::from_str(std::fs::read_to_string(&file).unwrap().lines().next().unwrap()).unwrap();
    assert_eq!(header, json!({"cassette": "factory", "version": CASSETTE_VERSION}));
    let exchanges = read_cassette(&file).unwrap();
    assert_eq!(exchanges.len(), 4);
    assert_eq!(exchanges[0].key, factory_host::AgentKey::new("first", Some("a"), None, None).to_string());
    assert_eq!((exchanges[1].attempt, exchanges[2].attempt), (0, 1));
    assert_eq!(exchanges[1].key, exchanges[2].key);
    assert_eq!(exchanges[1].request.model.as_deref(), Some("m2"));

    // Replay: same outcomes (usage and errors included), and the server sees nothing.
    let replay = Cassette::replay(&file).unwrap();
    for (call, expected) in calls.iter().zip(&recorded) {
        assert_eq!(&replay.call(call.clone()).await, expected);
    }
    assert_eq!(server.count(), 5, "replay made zero network calls");
    let missed = replay.call(request("outage", None, None, None)).await.unwrap_err();
    assert_eq!(missed.outage_kind(), Some(OutageKind::ReplayMiss), "the outage was not recorded as an answer");

    // A miss fails clearly, still without any network call.
    let err = replay.call(request("never recorded", Some("new"), None, None)).await.unwrap_err();
    assert!(
        err.message().contains("cassette miss")
            && err.message().contains("`new`")
            && err.message().contains("--replay-then-live"),
        "{err}"
    );
    assert_eq!(err.outage_kind(), Some(OutageKind::ReplayMiss));
    assert_eq!(server.count(), 5);
}

#[tokio::test]
async fn cassette_replay_then_live_serves_hits_offline_and_misses_live() {
    let server = Server::start(|_, _| openai_ok("live", 5, 5)).await;
    let live: Arc<dyn AgentBackend> = Arc::new(OpenAi::new(openai_config(&server)).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("first.jsonl");
    let second = dir.path().join("second.jsonl");

    // Record one exchange from a different "live" backend, so hits are recognisable.
    let recorder = Cassette::record(Arc::new(backend::DryRun), &first).unwrap();
    let hit = recorder.call(request("known", Some("k"), None, None)).await.unwrap();

    let mixed = Cassette::replay_then_live(&first, live).unwrap().recording_to(&second).unwrap();
    assert_eq!(mixed.call(request("known", Some("k"), None, None)).await.unwrap(), hit);
    assert_eq!(server.count(), 0, "a hit is served from the cassette");
    assert_eq!(mixed.call(request("unknown", Some("u"), None, None)).await.unwrap().text, "live");
    assert_eq!(server.count(), 1, "a miss goes live");
    assert_eq!(mixed.call(request("known", Some("k"), None, None)).await.unwrap(), hit);
    assert_eq!(server.count(), 1, "hits after the miss are still replayed");

    // The new cassette holds every exchange served, and replays the live one offline.
    assert_eq!(read_cassette(&second).unwrap().len(), 3);
    let replay = Cassette::replay(&second).unwrap();
    assert_eq!(replay.call(request("unknown", Some("u"), None, None)).await.unwrap().text, "live");
    assert_eq!(server.count(), 1);

    // A file that is not a cassette of this version is refused.
    std::fs::write(dir.path().join("v9.jsonl"), "{\"cassette\":\"factory\",\"version\":9}\n").unwrap();
    let Err(e) = Cassette::replay(dir.path().join("v9.jsonl")) else { panic!("version 9 accepted") };
    assert!(e.to_string().contains("version 9"), "{e}");
}

// ---------------------------------------------------------------------------------------
// Specs, config and routing

#[tokio::test]
async fn specs_and_config_file_build_and_route_backends() {
    assert_eq!(backend::from_spec_with_model("cli:claude", Some("opus")).unwrap().name(), "cli:claude");
    assert!(backend::from_spec("cli:nope").is_err());
    assert!(backend::from_spec("cli:generic").is_err(), "generic needs a command from config");
    assert_eq!(backend::from_spec("openai").unwrap().name(), "openai");
    assert_eq!(backend::from_spec("anthropic").unwrap().name(), "anthropic");
    let Err(unknown) = backend::from_spec("carrier-pigeon") else { panic!("an unknown spec was accepted") };
    assert!(unknown.to_string().contains("cli:PRESET"), "{unknown}");

    let server =
        Server::start(|_, seen| openai_ok(&format!("model={}", seen.body["model"].as_str().unwrap()), 1000, 1000))
            .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("factory.toml");
    let toml = format!(
        r#"
default = "local"

[backends.local]
kind = "openai"
base_url = "{url}/v1"
model = "small"
max_retries = 0
[backends.local.pricing]
input = "0.001"
output = 0.002

[backends.echo]
kind = "cli"
command = ["sh", "-c", "echo cli:$0", "{{model}}"]

[[routes]]
model = "fast"
backend = "local"
as = "qwen-7b"

[[routes]]
model = "echo-*"
backend = "echo"
"#,
        url = server.url()
    );
    std::fs::write(&path, toml).unwrap();
    let config = Config::load(&path).unwrap();
    let run = config.run_backend(None, None).unwrap();
    let reply = run.call(request("a", None, None, None)).await.unwrap();
    assert_eq!(reply.text, "model=small");
    // 1000 tokens at 0.001 + 1000 at 0.002 credits per 1k = 0.003 credits.
    assert_eq!(reply.usage.unwrap().credits_nano, Some(3_000_000));
    assert_eq!(run.call(request("b", None, None, Some("fast"))).await.unwrap().text, "model=qwen-7b");
    assert_eq!(run.call(request("c", None, None, Some("echo-1"))).await.unwrap().text, "cli:echo-1");
    assert_eq!(run.call(request("d", None, None, Some("other"))).await.unwrap().text, "model=other");
    assert_eq!(server.count(), 3);
    // --model replaces the default model; --backend picks another backend.
    let run = config.run_backend(None, Some("big")).unwrap();
    assert_eq!(run.call(request("e", None, None, None)).await.unwrap().text, "model=big");
    assert_eq!(config.run_backend(Some("dry-run"), None).unwrap().name(), "dry-run");
}

// ---------------------------------------------------------------------------------------
// Whole runs through the engine

async fn run_probe(backend: Arc<dyn AgentBackend>, args: Value, limits: Limits) -> factory_host::RunEnvelope {
    let host = Host::new(HostConfig {
        backend,
        cache_dir: Some(common::guest_target_dir().join("cache")),
        ..HostConfig::default()
    })
    .expect("host");
    let probe = host.load_file(&common::component("probe")).await.expect("probe");
    host.run(&probe, RunOptions { args: Some(args), limits, ..Default::default() }).await.expect("run")
}

#[tokio::test]
async fn a_run_retries_a_bad_schema_reply_over_http_and_accounts_both_spawns() {
    let server = Server::start(|i, _| match i {
        0 => openai_ok(r#"{"ok":"yes"}"#, 1000, 100),
        _ => openai_ok(r#"{"ok":true}"#, 1000, 100),
    })
    .await;
    let pricing = Pricing { default: Some(Price::new(1_500_000, 7_000_000)), ..Pricing::default() };
    let backend = Arc::new(OpenAi::new(OpenAiConfig { pricing, ..openai_config(&server) }).unwrap());
    let envelope = run_probe(backend, json!({"case": "schema"}), Limits::default()).await;
    assert_eq!(envelope.status, RunStatus::Completed, "{envelope:#?}");
    assert_eq!(envelope.result_value().as_ref().unwrap()["verdict"], json!({"ok": true}));
    assert_eq!(envelope.accounting.agents_spawned, 2);
    assert_eq!(server.count(), 2);
    assert!(server.seen().iter().all(|s| s.body["response_format"]["type"] == "json_schema"));
    // The retry tells the model what was wrong with its first reply.
    let user = |i: usize| {
        server.seen()[i].body["messages"].as_array().unwrap().last().unwrap()["content"].as_str().unwrap().to_string()
    };
    assert!(!user(0).contains("rejected"));
    assert!(user(1).contains("Your previous reply was rejected") && user(1).contains("$.ok"), "{}", user(1));
    // Per spawn: 1000 * 1_500_000 / 1000 + 100 * 7_000_000 / 1000 = 2_200_000.
    assert_eq!(envelope.accounting.ai_credits_nano, 4_400_000);
    assert_eq!((envelope.accounting.input_tokens, envelope.accounting.output_tokens), (2000, 200));
}

#[tokio::test]
async fn a_budgeted_run_stops_when_the_server_reports_no_usage() {
    let server = Server::start(|_, _| openai_ok_without_usage("some text")).await;
    let backend: Arc<dyn AgentBackend> = Arc::new(OpenAi::new(openai_config(&server)).unwrap());
    let budget = Limits { max_ai_credits: Some(5.0), ..Default::default() };
    let envelope = run_probe(backend.clone(), json!({"case": "memo"}), budget).await;
    assert_eq!(envelope.status, RunStatus::Error, "{envelope:#?}");
    assert_eq!(envelope.failure.as_ref().and_then(|f| f.kind.as_deref()), Some("maxAiCredits"));
    // Without a budget the same replies are fine.
    let envelope = run_probe(backend, json!({"case": "memo"}), Limits::default()).await;
    assert_eq!(envelope.status, RunStatus::Completed, "{envelope:#?}");
}

#[tokio::test]
async fn a_recorded_run_replays_offline_to_the_same_result() {
    let server = Server::start(|_, seen| {
        let prompt = seen.body["messages"].as_array().unwrap().last().unwrap()["content"].as_str().unwrap().to_string();
        openai_ok(&format!("model says: {prompt}"), 40, 8)
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("memo.jsonl");
    let live: Arc<dyn AgentBackend> = Arc::new(OpenAi::new(openai_config(&server)).unwrap());
    let recorded =
        run_probe(Arc::new(Cassette::record(live, &file).unwrap()), json!({"case": "memo"}), Limits::default()).await;
    assert_eq!(recorded.status, RunStatus::Completed, "{recorded:#?}");
    let live_calls = server.count();
    assert_eq!(live_calls, 3);

    let replayed =
        run_probe(Arc::new(Cassette::replay(&file).unwrap()), json!({"case": "memo"}), Limits::default()).await;
    assert_eq!(replayed.status, RunStatus::Completed, "{replayed:#?}");
    assert_eq!(replayed.result, recorded.result);
    assert_eq!(replayed.accounting.agents_spawned, recorded.accounting.agents_spawned);
    assert_eq!(replayed.accounting.input_tokens, recorded.accounting.input_tokens);
    assert_eq!(server.count(), live_calls, "the replayed run made zero network calls");
}

// ---------------------------------------------------------------------------------------
// The `factory` binary: run with --backend openai --record, then --replay offline; and
// `factory backends check`.

async fn factory(args: &[&str], env: &[(&str, String)]) -> (i32, String, String) {
    let mut command = tokio::process::Command::new(common::factory_bin());
    command
        .args(args)
        .env_remove("FACTORY_CONFIG")
        .env("FACTORY_NO_DAEMON", "1")
        .env("FACTORY_CACHE_DIR", common::guest_target_dir().join("cache"));
    for (k, v) in env {
        command.env(k, v);
    }
    let out = command.output().await.expect("run factory");
    let text = |b: &[u8]| String::from_utf8_lossy(b).to_string();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

#[tokio::test]
async fn the_cli_records_a_live_run_and_replays_it_offline() {
    let server = Server::start(|i, _| match i {
        0 => openai_ok(r#"{"ok":"not a bool"}"#, 50, 5),
        _ => openai_ok(r#"{"ok":true}"#, 50, 5),
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let tape = dir.path().join("schema.cassette.jsonl");
    let probe = common::component("probe");
    let env = [("OPENAI_BASE_URL", format!("{}/v1", server.url())), ("OPENAI_API_KEY", "sk-cli".to_string())];
    let base = [probe.to_str().unwrap(), "--yes", "--args", r#"{"case":"schema"}"#, "--json", "--quiet", "--state-dir"];

    let mut live = vec!["run"];
    live.extend(base);
    live.extend([
        state.to_str().unwrap(),
        "--backend",
        "openai",
        "--model",
        "m-cli",
        "--record",
        tape.to_str().unwrap(),
    ]);
    let (code, stdout, stderr) = factory(&live, &env).await;
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let envelope: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(envelope["result"]["verdict"], json!({"ok": true}));
    assert_eq!(server.count(), 2, "the schema retry was a second live spawn");
    assert_eq!(server.seen()[0].body["model"], "m-cli");
    assert_eq!(read_cassette(&tape).unwrap().len(), 2);

    // Replay offline: the same result, and the server sees nothing more.
    let mut replay = vec!["run"];
    replay.extend(base);
    replay.extend([state.to_str().unwrap(), "--replay", tape.to_str().unwrap()]);
    let (code, stdout, stderr) = factory(&replay, &env).await;
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let replayed: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(replayed["result"], envelope["result"]);
    assert_eq!(replayed["accounting"]["agentsSpawned"], 2);
    assert_eq!(server.count(), 2, "the replayed run made zero network calls");

    // A different factory input misses the cassette: the run stops (a miss is not an
    // answer), with no network call.
    let mut miss = vec!["run", probe.to_str().unwrap(), "--yes", "--args", r#"{"case":"memo"}"#, "--json", "--quiet"];
    miss.extend(["--state-dir", state.to_str().unwrap(), "--replay", tape.to_str().unwrap()]);
    let (code, stdout, stderr) = factory(&miss, &env).await;
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    let missed: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(missed["failure"]["type"], "backend", "{missed}");
    assert_eq!(missed["failure"]["kind"], "replay_miss", "{missed}");
    assert_eq!(server.count(), 2);

    // `factory backends check` sends one tiny request and reports it.
    let (code, stdout, stderr) = factory(
        &["backends", "check", "openai", "--model", "m-check", "--json", "--state-dir", state.to_str().unwrap()],
        &env,
    )
    .await;
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let check: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!((check["ok"].clone(), check["model"].clone()), (json!(true), json!("m-check")));
    assert_eq!(check["usage"]["inputTokens"], 50);
    assert_eq!(server.count(), 3);
    assert_eq!(server.seen()[2].body["model"], "m-check");
}

// ---------------------------------------------------------------------------------------
// Agent options (`agent`, `reasoningEffort`, `contextTier`) from a JS factory to the wire

/// Run a JS factory whose body is `run` through `backend` (the real JS runner and engine).
async fn run_js(backend: Arc<dyn AgentBackend>, run: &str) -> factory_host::RunEnvelope {
    let host = Host::new(HostConfig {
        backend,
        cache_dir: Some(common::guest_target_dir().join("cache")),
        ..HostConfig::default()
    })
    .expect("host");
    let source = format!(
        "import {{ defineWorkflow }} from \"factory\";\nexport default defineWorkflow({{ meta: {{ name: \"tuned\", description: \"d\" }}, run: {run} }});\n"
    );
    let factory = host
        .load_script(factory_host::script::Script::new("tuned.js", source.as_str(), None))
        .await
        .expect("the script loads");
    host.run(&factory, RunOptions::default()).await.expect("run")
}

#[tokio::test]
async fn reasoning_effort_reaches_the_openai_request_and_is_part_of_the_call_identity() {
    let server = Server::start(|_, _| openai_ok("fine", 10, 2)).await;
    let backend = Arc::new(OpenAi::new(openai_config(&server)).unwrap());
    let envelope = run_js(
        backend,
        r#"async (ctx) => [
            await ctx.agent("think", { label: "t", reasoningEffort: "high", agent: "reviewer", contextTier: "long_context" }),
            await ctx.agent("think", { label: "t" }),
            await ctx.agent("think", { label: "t", reasoningEffort: "high", agent: "reviewer", contextTier: "long_context" }),
        ]"#,
    )
    .await;
    assert_eq!(envelope.status, RunStatus::Completed, "{envelope:#?}");
    assert_eq!(envelope.result_value().unwrap(), json!(["fine", "fine", "fine"]));
    // The tuned call and the plain one are two subagents; the repeated tuned call is a memo hit.
    let seen = server.seen();
    assert_eq!(seen.len(), 2, "{seen:#?}");
    let tuned: Vec<&Seen> = seen.iter().filter(|s| s.body.get("reasoning_effort").is_some()).collect();
    assert_eq!(tuned.len(), 1, "{seen:#?}");
    assert_eq!(tuned[0].body["reasoning_effort"], "high");
    // Neither an agent nor a context tier has an OpenAI knob: nothing else is sent.
    assert!(tuned[0].body.get("agent").is_none() && tuned[0].body.get("context_tier").is_none(), "{:#}", tuned[0].body);

    // A value outside the set is refused before any request: in JS a RangeError the body can
    // catch, so the run goes on.
    let server = Server::start(|_, _| openai_ok("fine", 10, 2)).await;
    let backend = Arc::new(OpenAi::new(openai_config(&server)).unwrap());
    let envelope = run_js(
        backend,
        r#"async (ctx) => ctx.agent("x", { reasoningEffort: "max" }).catch((e) => `${e.name}: ${e.message}`)"#,
    )
    .await;
    let refused = envelope.result_value().unwrap();
    assert!(
        refused.as_str().unwrap().starts_with("RangeError: ctx.agent: `reasoningEffort` must be one of"),
        "{refused}"
    );
    assert_eq!(server.count(), 0);
}

#[tokio::test]
async fn reasoning_effort_turns_on_anthropic_extended_thinking() {
    let server = Server::start(|_, seen| {
        if seen.body["tools"].is_array() {
            let input = json!({"ok": true});
            anthropic_message(
                json!([{"type": "tool_use", "id": "toolu_1", "name": "respond", "input": input}]),
                "tool_use",
                9,
                4,
            )
        } else {
            anthropic_message(
                json!([{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "fine"}]),
                "end_turn",
                9,
                4,
            )
        }
    })
    .await;
    let backend = Arc::new(Anthropic::new(AnthropicConfig { max_tokens: 2048, ..anthropic_config(&server) }).unwrap());
    let schema = verdict_schema();
    let envelope = run_js(
        backend,
        &format!(
            r#"async (ctx) => [
                await ctx.agent("plain", {{ label: "p" }}),
                await ctx.agent("deep", {{ label: "d", reasoningEffort: "medium" }}),
                await ctx.agent("judge", {{ label: "j", reasoningEffort: "low", schema: {schema} }}),
            ]"#
        ),
    )
    .await;
    assert_eq!(envelope.status, RunStatus::Completed, "{envelope:#?}");
    assert_eq!(envelope.result_value().unwrap(), json!(["fine", "fine", {"ok": true}]));
    let seen = server.seen();
    let body =
        |prompt: &str| seen.iter().find(|s| s.body["messages"][0]["content"] == prompt).expect("asked").body.clone();
    assert!(body("plain").get("thinking").is_none(), "{:#}", body("plain"));
    // `medium`: a 4096-token budget; max_tokens is raised above it (the API requires that).
    let deep = body("deep");
    assert_eq!(deep["thinking"], json!({"type": "enabled", "budget_tokens": 4096}));
    assert_eq!(deep["max_tokens"], 4096 + 2048);
    // `low`: 1024 (the API's minimum), under max_tokens; thinking cannot force a tool: offered.
    let judge = body("judge");
    assert_eq!(judge["thinking"], json!({"type": "enabled", "budget_tokens": 1024}));
    assert_eq!(judge["max_tokens"], 2048);
    assert_eq!(judge["tool_choice"], json!({"type": "auto"}));
    assert_eq!(judge["tools"][0]["name"], "respond");
}

#[tokio::test]
async fn an_agent_cli_gets_the_call_agent_with_its_agent_flag_and_others_ignore_it() {
    let dir = tempfile::tempdir().unwrap();
    let agent = script(dir.path(), "agent.sh", r#"cat >/dev/null; echo "args=$*""#);
    let with_flag =
        AgentCliConfig { agent_flag: Some("--agent".into()), ..cli("cli:test", &["sh", agent.to_str().unwrap()]) };
    let run = r#"async (ctx) => [await ctx.agent("a", { label: "x", agent: "reviewer" }), await ctx.agent("b", { label: "y" })]"#;
    let envelope = run_js(Arc::new(AgentCli::new(with_flag).unwrap()), run).await;
    assert_eq!(envelope.result_value().unwrap(), json!(["args=--agent=reviewer", "args="]), "{envelope:#?}");
    // An agent name that looks like an option is refused before anything runs (an ordinary
    // failure: the call is `null`).
    let odd = r#"async (ctx) => ctx.agent("a", { label: "z", agent: "--dangerously-skip-permissions" })"#;
    let with_flag =
        AgentCliConfig { agent_flag: Some("--agent".into()), ..cli("cli:test", &["sh", agent.to_str().unwrap()]) };
    let envelope = run_js(Arc::new(AgentCli::new(with_flag).unwrap()), odd).await;
    assert_eq!(envelope.result_value(), Some(Value::Null), "{envelope:#?}");
    // A CLI without an agent flag runs the call without one (upstream accepts the option
    // whatever runs it).
    let without = cli("cli:test", &["sh", agent.to_str().unwrap()]);
    let envelope = run_js(Arc::new(AgentCli::new(without).unwrap()), run).await;
    assert_eq!(envelope.result_value().unwrap(), json!(["args=", "args="]), "{envelope:#?}");
    // The presets that have such a flag.
    assert_eq!(AgentCliConfig::preset("claude").unwrap().agent_flag.as_deref(), Some("--agent"));
    assert_eq!(AgentCliConfig::preset("copilot").unwrap().agent_flag.as_deref(), Some("--agent"));
    assert_eq!(AgentCliConfig::preset("codex").unwrap().agent_flag, None);
}

#[tokio::test]
async fn a_rust_guest_passes_its_reasoning_effort_to_the_openai_request() {
    let server = Server::start(|_, _| openai_ok("fine", 10, 2)).await;
    let backend = Arc::new(OpenAi::new(openai_config(&server)).unwrap());
    let envelope = run_probe(backend, json!({"case": "tuned"}), Limits::default()).await;
    assert_eq!(envelope.status, RunStatus::Completed, "{envelope:#?}");
    assert_eq!(envelope.result_value().unwrap(), json!({"tuned": "fine"}));
    assert_eq!(server.seen()[0].body["reasoning_effort"], "low");
}
