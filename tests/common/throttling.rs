//! A throttling provider on 127.0.0.1, as real ones behave: an OpenAI-compatible
//! chat-completions server (and Anthropic Messages at `.../v1/messages`) that admits at most
//! `requests_per_second` with a token bucket (of one second's worth), and optionally
//! `tokens_per_minute` the same way, and answers everything past them with 429 and the
//! providers' headers: OpenAI `retry-after-ms`, `x-ratelimit-{limit,remaining,reset}-
//! {requests,tokens}` (reset as a Go duration), or Anthropic `retry-after` (whole seconds)
//! and `anthropic-ratelimit-requests-{limit,remaining,reset}` (reset as RFC 3339). Every
//! reply carries the rate-limit headers, as providers send them. It counts requests, 429s,
//! answers, and the most requests it admitted in any one-second window.

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// The style of 429s and headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// OpenAI's headers.
    OpenAi,
    /// Anthropic's headers.
    Anthropic,
}

/// How the server throttles.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Requests admitted per second (bucket of one second's worth).
    pub requests_per_second: f64,
    /// Tokens (prompt + completion) per minute, if metered.
    pub tokens_per_minute: Option<f64>,
    /// How long an admitted request takes to answer.
    pub latency: Duration,
    /// Header style.
    pub style: Style,
}

impl Limits {
    /// `rps` requests per second, OpenAI style, answering after 5 ms.
    pub fn rps(rps: f64) -> Limits {
        Limits {
            requests_per_second: rps,
            tokens_per_minute: None,
            latency: Duration::from_millis(5),
            style: Style::OpenAi,
        }
    }
}

struct Bucket {
    rate: f64,
    burst: f64,
    level: f64,
}

impl Bucket {
    fn new(rate: f64, burst: f64) -> Bucket {
        Bucket { rate, burst, level: burst }
    }

    fn refill(&mut self, elapsed: f64) {
        self.level = (self.level + self.rate * elapsed).min(self.burst);
    }

    /// Seconds until `n` is there.
    fn wait(&self, n: f64) -> f64 {
        ((n - self.level) / self.rate).max(0.0)
    }

    /// Seconds until full.
    fn reset(&self) -> f64 {
        ((self.burst - self.level) / self.rate).max(0.0)
    }
}

struct State {
    limits: Limits,
    requests: Bucket,
    tokens: Option<Bucket>,
    refilled: Instant,
    /// Admission instants in the last second.
    window: VecDeque<Instant>,
    max_per_second: usize,
    /// Arrival instants (admitted or not) in the last second.
    arrivals: VecDeque<Instant>,
    max_received_per_second: usize,
    received: usize,
    throttled: usize,
    answered: Vec<String>,
}

/// The running server (stopped when dropped).
pub struct Throttling {
    port: u16,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

/// What the server counted.
#[derive(Debug, Clone, PartialEq)]
pub struct Counts {
    /// Requests received.
    pub requests: usize,
    /// Requests answered 429.
    pub throttled: usize,
    /// Requests answered with a completion.
    pub answered: usize,
    /// The most requests admitted in any one-second window.
    pub max_per_second: usize,
    /// The most requests received (admitted or not) in any one-second window.
    pub max_received_per_second: usize,
}

impl Counts {
    /// The share of requests answered 429.
    pub fn throttled_share(&self) -> f64 {
        self.throttled as f64 / self.requests.max(1) as f64
    }
}

impl Throttling {
    /// Start on a free port.
    pub async fn start(limits: Limits) -> Throttling {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await.expect("bind 127.0.0.1");
        let port = listener.local_addr().expect("local addr").port();
        let burst = limits.requests_per_second.max(1.0);
        let tokens = limits.tokens_per_minute.map(|tpm| Bucket::new(tpm / 60.0, tpm / 60.0));
        let state = Arc::new(Mutex::new(State {
            requests: Bucket::new(limits.requests_per_second, burst),
            tokens,
            limits,
            refilled: Instant::now(),
            window: VecDeque::new(),
            max_per_second: 0,
            arrivals: VecDeque::new(),
            max_received_per_second: 0,
            received: 0,
            throttled: 0,
            answered: Vec::new(),
        }));
        let task =
            serve(
                listener,
                state.clone(),
                |state, body, anthropic| async move { answer(&state, &body, anthropic).await },
            );
        Throttling { port, state, task }
    }

    /// `http://127.0.0.1:PORT/v1` (an OpenAI backend's `base_url`).
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// `http://127.0.0.1:PORT` (an Anthropic backend's `base_url`).
    pub fn root_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// What the server counted so far.
    pub fn counts(&self) -> Counts {
        let s = self.state.lock().unwrap();
        Counts {
            requests: s.received,
            throttled: s.throttled,
            answered: s.answered.len(),
            max_per_second: s.max_per_second,
            max_received_per_second: s.max_received_per_second,
        }
    }

    /// The prompts answered, in order.
    pub fn answered(&self) -> Vec<String> {
        self.state.lock().unwrap().answered.clone()
    }
}

impl Drop for Throttling {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serve HTTP/1 on `listener` until the task is aborted: each request's body read as JSON
/// (`null` when it is not) and answered by `answer(state, body, anthropic)`, `anthropic` when
/// its path is Anthropic's `.../v1/messages`. (The fake providers of the tests share it.)
pub fn serve<S, F, Fut>(listener: tokio::net::TcpListener, state: Arc<S>, answer: F) -> tokio::task::JoinHandle<()>
where
    S: Send + Sync + 'static,
    F: Fn(Arc<S>, Value, bool) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    eprintln!("fake provider: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
            };
            let (state, answer) = (state.clone(), answer.clone());
            let service = service_fn(move |req: Request<Incoming>| {
                let (state, answer) = (state.clone(), answer.clone());
                async move {
                    let anthropic = req.uri().path().ends_with("/v1/messages");
                    let bytes = req.into_body().collect().await?.to_bytes();
                    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                    Ok::<_, hyper::Error>(answer(state, body, anthropic).await)
                }
            });
            tokio::spawn(async move {
                let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    })
}

/// The last user message of a chat request (OpenAI or Anthropic); empty when none.
pub fn user_prompt(body: &Value) -> String {
    body["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_string()
}

const OUTPUT_TOKENS: f64 = 20.0;

async fn answer(state: &Mutex<State>, body: &Value, anthropic: bool) -> Response<Full<Bytes>> {
    let prompt = user_prompt(body);
    let prompt_tokens = (prompt.len() as f64 / 4.0).ceil().max(1.0);
    let (admitted, headers, latency, style) = {
        let mut s = state.lock().unwrap();
        s.received += 1;
        let now = Instant::now();
        while s.arrivals.front().is_some_and(|t| now.duration_since(*t) >= Duration::from_secs(1)) {
            s.arrivals.pop_front();
        }
        s.arrivals.push_back(now);
        s.max_received_per_second = s.max_received_per_second.max(s.arrivals.len());
        let elapsed = now.duration_since(s.refilled).as_secs_f64();
        s.refilled = now;
        s.requests.refill(elapsed);
        if let Some(t) = s.tokens.as_mut() {
            t.refill(elapsed);
        }
        let cost = prompt_tokens + OUTPUT_TOKENS;
        let request_wait = s.requests.wait(1.0);
        let token_wait = s.tokens.as_ref().map_or(0.0, |t| t.wait(cost.min(t.burst)));
        let admitted = request_wait <= 0.0 && token_wait <= 0.0;
        if admitted {
            s.requests.level -= 1.0;
            if let Some(t) = s.tokens.as_mut() {
                t.level -= cost;
            }
            while s.window.front().is_some_and(|t| now.duration_since(*t) >= Duration::from_secs(1)) {
                s.window.pop_front();
            }
            s.window.push_back(now);
            s.max_per_second = s.max_per_second.max(s.window.len());
        } else {
            s.throttled += 1;
        }
        let wait = request_wait.max(token_wait);
        let style = s.limits.style;
        let headers = headers(&s, style, wait);
        (admitted, headers, s.limits.latency, style)
    };
    if !admitted {
        let body = match style {
            Style::OpenAi => {
                json!({"error": {"message": "Rate limit reached for requests", "type": "requests", "code": "rate_limit_exceeded"}})
            }
            Style::Anthropic => {
                json!({"type": "error", "error": {"type": "rate_limit_error", "message": "Number of requests has exceeded your rate limit"}})
            }
        };
        return reply(429, headers, body.to_string());
    }
    tokio::time::sleep(latency).await;
    state.lock().unwrap().answered.push(prompt.clone());
    let text = format!("answer to: {prompt}");
    let body = if anthropic {
        json!({
            "id": "msg_fake", "type": "message", "role": "assistant", "model": "fake",
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
            "usage": {"input_tokens": prompt_tokens as u64, "output_tokens": OUTPUT_TOKENS as u64}
        })
    } else {
        json!({
            "id": "chatcmpl-fake", "object": "chat.completion", "model": "fake",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens as u64, "completion_tokens": OUTPUT_TOKENS as u64}
        })
    };
    reply(200, headers, body.to_string())
}

/// The rate-limit headers of a reply (after the request was counted); `wait`: seconds until
/// a refused request could be admitted.
fn headers(s: &State, style: Style, wait: f64) -> Vec<(String, String)> {
    let mut h = Vec::new();
    let go = |secs: f64| format!("{}ms", (secs * 1000.0).ceil() as u64);
    let rfc3339 =
        |secs: f64| humantime::format_rfc3339_millis(SystemTime::now() + Duration::from_secs_f64(secs)).to_string();
    match style {
        Style::OpenAi => {
            h.push(("x-ratelimit-limit-requests".into(), format!("{}", s.requests.burst as u64)));
            h.push(("x-ratelimit-remaining-requests".into(), format!("{}", s.requests.level.max(0.0).floor() as u64)));
            h.push(("x-ratelimit-reset-requests".into(), go(s.requests.reset())));
            if let Some(t) = &s.tokens {
                h.push(("x-ratelimit-limit-tokens".into(), format!("{}", t.burst as u64)));
                h.push(("x-ratelimit-remaining-tokens".into(), format!("{}", t.level.max(0.0).floor() as u64)));
                h.push(("x-ratelimit-reset-tokens".into(), go(t.reset())));
            }
            if wait > 0.0 {
                h.push(("retry-after-ms".into(), format!("{}", (wait * 1000.0).ceil() as u64)));
                h.push(("retry-after".into(), format!("{}", wait.ceil() as u64)));
            }
        }
        Style::Anthropic => {
            h.push(("anthropic-ratelimit-requests-limit".into(), format!("{}", s.requests.burst as u64)));
            h.push((
                "anthropic-ratelimit-requests-remaining".into(),
                format!("{}", s.requests.level.max(0.0).floor() as u64),
            ));
            h.push(("anthropic-ratelimit-requests-reset".into(), rfc3339(s.requests.reset())));
            if let Some(t) = &s.tokens {
                h.push(("anthropic-ratelimit-tokens-limit".into(), format!("{}", t.burst as u64)));
                h.push(("anthropic-ratelimit-tokens-remaining".into(), format!("{}", t.level.max(0.0).floor() as u64)));
                h.push(("anthropic-ratelimit-tokens-reset".into(), rfc3339(t.reset())));
            }
            if wait > 0.0 {
                // Anthropic says whole seconds.
                h.push(("retry-after".into(), format!("{}", wait.ceil() as u64)));
            }
        }
    }
    h
}

fn reply(status: u16, headers: Vec<(String, String)>, body: String) -> Response<Full<Bytes>> {
    let mut builder = Response::builder().status(status).header("content-type", "application/json");
    for (k, v) in headers {
        builder = builder.header(k, v);
    }
    builder.body(Full::new(Bytes::from(body))).expect("a valid response")
}
