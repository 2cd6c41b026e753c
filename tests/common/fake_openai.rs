//! A small OpenAI-compatible chat-completions server on 127.0.0.1 for tests that drive the
//! real binary: it answers with latency, can be switched to fail (an HTTP status, an absurd
//! `Retry-After`, usage near `u64::MAX`, a body that is not UTF-8) while the test runs, and
//! records every prompt it was asked and every prompt it answered, so a test can count what
//! reached the backend.

use super::throttling::user_prompt;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::Response;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How the server answers.
#[derive(Debug, Clone)]
pub enum Mode {
    /// A chat completion `real answer to: <prompt>` after `latency`, with small usage.
    Answer { latency: Duration },
    /// Answer `ok` more requests, then switch to `then`.
    AnswerThen { ok: usize, then: Box<Mode> },
    /// This HTTP status with an OpenAI-style error body.
    Status(u16),
    /// 429 with this `retry-after-ms` header value.
    RetryAfterMs(&'static str),
    /// A completion whose usage reports `u64::MAX` tokens each way.
    HugeUsage,
    /// 200 with a body that is not UTF-8.
    NotUtf8,
    /// An answer whose `usage` object is exactly this value (cache fields, hostile numbers).
    /// A request to `.../v1/messages` gets an Anthropic Messages reply, any other a chat
    /// completion.
    Usage(Value),
    /// OpenAI's spent quota: 429 `insufficient_quota`. With `for_`, the quota is spent until
    /// that long after the first request this mode refuses (T): each refusal says when with a
    /// `retry-after` (whole seconds, rounded up) and `x-ratelimit-reset-requests` header,
    /// and from T on the server answers as `Answer` does. Without, it is spent for good and
    /// no header says until when.
    QuotaSpent { for_: Option<Duration> },
}

#[derive(Default)]
struct State {
    mode: Option<Mode>,
    answered: Vec<String>,
    asked: Vec<String>,
    requests: usize,
    /// Answers being prepared now (`Mode::Answer`), and the most there were at once.
    in_flight: usize,
    max_in_flight: usize,
    /// When a `QuotaSpent { for_: Some(_) }` quota resets (set by its first refusal).
    quota_until: Option<std::time::Instant>,
}

/// Counts an answer in flight until it is sent or its request is dropped.
struct InFlight<'a>(&'a Mutex<State>);

impl<'a> InFlight<'a> {
    fn enter(state: &'a Mutex<State>) -> Self {
        let mut s = state.lock().unwrap();
        s.in_flight += 1;
        s.max_in_flight = s.max_in_flight.max(s.in_flight);
        InFlight(state)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut s = self.0.lock().unwrap_or_else(|p| p.into_inner());
        s.in_flight -= 1;
    }
}

/// The running server (stopped when dropped).
pub struct FakeOpenAi {
    port: u16,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeOpenAi {
    /// Start on a free port.
    pub async fn start(mode: Mode) -> FakeOpenAi {
        FakeOpenAi::start_on(0, mode).await
    }

    /// Start on `port` (0: any free one).
    pub async fn start_on(port: u16, mode: Mode) -> FakeOpenAi {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.expect("bind 127.0.0.1");
        let port = listener.local_addr().expect("local addr").port();
        let state = Arc::new(Mutex::new(State { mode: Some(mode), ..State::default() }));
        let task = super::throttling::serve(listener, state.clone(), |state, body, anthropic| async move {
            answer(&state, &body, anthropic).await
        });
        FakeOpenAi { port, state, task }
    }

    /// A port nothing listens on (it was free a moment ago).
    pub fn free_port() -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        listener.local_addr().expect("local addr").port()
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:PORT/v1`, the `base_url` of a backend pointing here.
    pub fn base_url(&self) -> String {
        base_url(self.port)
    }

    /// Answer the next requests this way (a `QuotaSpent` quota is spent anew).
    pub fn set(&self, mode: Mode) {
        let mut state = self.state.lock().unwrap();
        state.mode = Some(mode);
        state.quota_until = None;
    }

    /// The prompts answered with a completion, in order.
    pub fn answered(&self) -> Vec<String> {
        self.state.lock().unwrap().answered.clone()
    }

    /// Requests received, answered or not.
    pub fn requests(&self) -> usize {
        self.state.lock().unwrap().requests
    }

    /// The most requests answered with `Mode::Answer` that were in flight at once.
    pub fn max_in_flight(&self) -> usize {
        self.state.lock().unwrap().max_in_flight
    }

    /// When the spent quota of `Mode::QuotaSpent { for_: Some(_) }` resets (T), once it has
    /// refused a request.
    pub fn quota_until(&self) -> Option<std::time::Instant> {
        self.state.lock().unwrap().quota_until
    }

    /// The prompt of every request received (answered or not), in arrival order.
    pub fn asked(&self) -> Vec<String> {
        self.state.lock().unwrap().asked.clone()
    }
}

impl Drop for FakeOpenAi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `http://127.0.0.1:PORT/v1`.
pub fn base_url(port: u16) -> String {
    format!("http://127.0.0.1:{port}/v1")
}

/// A `factory.toml` in `state` with backend `local` pointing at `port`: fast retries, a
/// model, and (when `priced`) a price per 1000 tokens; `extra` lines go in its table.
pub fn write_config(state: &std::path::Path, port: u16, priced: bool, extra: &str) {
    let pricing = if priced { "[backends.local.pricing]\ninput = 0.001\noutput = 0.002\n" } else { "" };
    let text = format!(
        "[backends.local]\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"m-test\"\nmax_retries = 1\n\
         retry_base_ms = 5\n{extra}\n{pricing}",
        base_url(port)
    );
    std::fs::write(state.join("factory.toml"), text).unwrap();
}

/// The text the server answers `prompt` with.
pub fn answer_text(prompt: &str) -> String {
    format!("real answer to: {prompt}")
}

fn completion(content: &str, prompt_tokens: u64, completion_tokens: u64) -> String {
    json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "model": "fake",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
    })
    .to_string()
}

fn respond(status: u16, headers: &[(&str, &str)], body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::builder().status(status).header("content-type", "application/json");
    for (name, value) in headers {
        response = response.header(*name, *value);
    }
    response.body(Full::new(body.into())).expect("a valid response")
}

/// An Anthropic Messages reply with `usage`.
fn message(content: &str, usage: &Value) -> String {
    json!({
        "id": "msg_fake", "type": "message", "role": "assistant", "model": "fake",
        "content": [{"type": "text", "text": content}],
        "stop_reason": "end_turn", "stop_sequence": null, "usage": usage
    })
    .to_string()
}

async fn answer(state: &Mutex<State>, body: &Value, anthropic: bool) -> Response<Full<Bytes>> {
    let prompt = user_prompt(body);
    let mode = {
        let mut state = state.lock().unwrap();
        state.requests += 1;
        state.asked.push(prompt.clone());
        let mode = state.mode.clone().unwrap_or(Mode::Status(500));
        let mode = match mode {
            Mode::AnswerThen { ok: 0, then } => {
                state.mode = Some((*then).clone());
                *then
            }
            Mode::AnswerThen { ok, then } => {
                state.mode = Some(Mode::AnswerThen { ok: ok - 1, then });
                Mode::Answer { latency: Duration::ZERO }
            }
            other => other,
        };
        match mode {
            Mode::QuotaSpent { for_: Some(d) } => {
                let until = *state.quota_until.get_or_insert_with(|| std::time::Instant::now() + d);
                if std::time::Instant::now() >= until {
                    Mode::Answer { latency: Duration::ZERO }
                } else {
                    Mode::QuotaSpent { for_: Some(d) }
                }
            }
            other => other,
        }
    };
    match mode {
        Mode::Answer { latency } => {
            let _counted = InFlight::enter(state);
            tokio::time::sleep(latency).await;
            state.lock().unwrap().answered.push(prompt.clone());
            respond(200, &[], completion(&answer_text(&prompt), 10, 5))
        }
        Mode::AnswerThen { .. } => unreachable!("resolved above"),
        Mode::Status(status) => {
            let body = json!({"error": {"message": format!("injected HTTP {status}"), "type": "test"}}).to_string();
            respond(status, &[], body)
        }
        Mode::RetryAfterMs(value) => {
            let body = json!({"error": {"message": "slow down", "type": "rate_limit"}}).to_string();
            respond(429, &[("retry-after-ms", value), ("retry-after", value)], body)
        }
        Mode::HugeUsage => {
            state.lock().unwrap().answered.push(prompt.clone());
            respond(200, &[], completion(&answer_text(&prompt), u64::MAX, u64::MAX))
        }
        Mode::QuotaSpent { for_ } => {
            let body = json!({"error": {
                "message": "You exceeded your current quota, please check your plan and billing details.",
                "type": "insufficient_quota", "param": null, "code": "insufficient_quota"
            }})
            .to_string();
            let until = state.lock().unwrap().quota_until;
            match (for_, until) {
                (Some(_), Some(until)) => {
                    let left = until.saturating_duration_since(std::time::Instant::now());
                    let seconds = left.as_secs() + u64::from(left.subsec_nanos() > 0);
                    let (after, reset) = (seconds.to_string(), format!("{}ms", left.as_millis()));
                    respond(429, &[("retry-after", &after), ("x-ratelimit-reset-requests", &reset)], body)
                }
                _ => respond(429, &[], body),
            }
        }
        Mode::NotUtf8 => respond(200, &[], Bytes::from_static(b"{\"choices\": [\xff\xfe\xc3\x28]}")),
        Mode::Usage(usage) => {
            state.lock().unwrap().answered.push(prompt.clone());
            let text = answer_text(&prompt);
            if anthropic {
                respond(200, &[], message(&text, &usage))
            } else {
                let mut reply: Value = serde_json::from_str(&completion(&text, 0, 0)).expect("a completion");
                reply["usage"] = usage;
                respond(200, &[], reply.to_string())
            }
        }
    }
}
