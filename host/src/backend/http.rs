//! The HTTP core of the HTTP backends (OpenAI-compatible and Anthropic): the backend itself
//! ([`HttpBackend`], in `http/backend.rs`, over a provider's [`Wire`]), the retry policy
//! (bounded retries with exponential backoff and jitter on 429, 5xx and transport errors,
//! honouring `Retry-After`), the HTTP client with its timeouts, and the error messages for
//! statuses that retrying cannot fix (401, 403, 404, other 4xx). A reply body is read at
//! most [`MAX_REPLY_BYTES`] into memory (chunk by chunk): a longer one, endless or not, ends
//! the call as an `invalid_reply` backend failure. Reply headers are bounded by hyper's
//! HTTP/1 client (at most 100 headers in a read buffer of about 400 KiB).

mod backend;

pub(crate) use backend::{non_empty_env, Endpoint};
pub use backend::{HttpBackend, Wire};

use super::flow::Flow;
pub(crate) use super::reply::{error_message, retry_after};
use super::{BackendError, OutageKind};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The largest reply body a backend call reads (replies are a model's text or JSON; 16 MiB is
/// far past any model's output limit). A body past it is not read further.
pub const MAX_REPLY_BYTES: usize = 16 << 20;

/// How an HTTP backend retries and times out.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Retries after the first try (so at most `max_retries + 1` requests per call).
    pub max_retries: u32,
    /// The first backoff delay; each retry doubles it.
    pub base_delay: Duration,
    /// The cap on one backoff delay.
    pub max_delay: Duration,
    /// A `Retry-After` longer than this is not waited for: the call fails instead.
    pub max_retry_after: Duration,
    /// Timeout of one whole request (connect, send, read the reply).
    pub timeout: Duration,
    /// Timeout of establishing a connection.
    pub connect_timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 4,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(120),
            timeout: Duration::from_secs(600),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

impl RetryPolicy {
    /// The backoff before retry number `retry` (0-based): half the exponential delay plus a
    /// random part of up to the other half ("equal jitter"), so it never falls below half.
    pub fn backoff(&self, retry: u32) -> Duration {
        let exp = self.base_delay.saturating_mul(1u32.checked_shl(retry.min(20)).unwrap_or(u32::MAX));
        let capped = exp.min(self.max_delay);
        let half = capped / 2;
        let jitter_nanos = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
        let random = (uuid::Uuid::new_v4().as_u128() as u64) % jitter_nanos.saturating_add(1);
        half + Duration::from_nanos(random)
    }

    /// An HTTP client with this policy's timeouts.
    pub(crate) fn client(&self) -> Result<reqwest::Client, BackendError> {
        reqwest::Client::builder()
            .timeout(self.timeout)
            .connect_timeout(self.connect_timeout)
            .build()
            .map_err(|e| BackendError::outage(OutageKind::Misconfigured, format!("cannot set up the HTTP client: {e}")))
    }
}

/// A reply that was not retried (any status but a retryable one, or the last try's).
#[derive(Debug, Clone)]
pub struct HttpReply {
    /// The HTTP status.
    pub status: u16,
    /// The body, at most [`MAX_REPLY_BYTES`] (invalid UTF-8 replaced).
    pub body: String,
    /// Tokens charged to the flow's token budget at admission (see [`Flow::used_tokens`]).
    pub charged: f64,
}

impl HttpReply {
    /// A 2xx status.
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// Statuses worth retrying: rate limits, timeouts and server errors (529 is Anthropic's
/// "overloaded").
fn retryable(status: u16) -> bool {
    matches!(status, 408 | 409 | 425 | 429 | 500..=599)
}

/// Statuses that are the server pushing back (rate limited, overloaded): the call waits in
/// its flow and goes again without spending a retry.
fn pushback(status: u16) -> bool {
    matches!(status, 429 | 529)
}

/// Send a request built by `make` through `flow` (admitted under the backend's budgets, see
/// [`super::flow`]), retrying per `policy`, within `clock` (`Ok(None)`: it ran out first). A pushback (429, 529) does not spend a retry: the
/// call waits in the flow (closed for everyone until the server's `retry-after`) and goes
/// again, until the server has kept it waiting past the flow's bound (a `rate_limited`
/// outage); a single `retry-after` beyond the bound is a spent quota. Transport errors and
/// other retryable statuses spend the bounded retries. `input_tokens`: the prompt's estimated
/// size, charged to a token budget. `who` prefixes error messages. Returns the first reply
/// that is neither, or the last one once retries are exhausted.
pub(crate) async fn send(
    policy: &RetryPolicy,
    flow: &Arc<Flow>,
    input_tokens: u64,
    clock: &CallClock,
    who: &str,
    make: impl Fn() -> reqwest::RequestBuilder,
) -> Result<Option<HttpReply>, BackendError> {
    tokio::select! {
        biased;
        reply = send_admitted(policy, flow, input_tokens, clock, who, make) => reply.map(Some),
        () = clock.expired() => Ok(None),
    }
}

/// A call's `maxDurationSeconds`, counted from its first admission through the flow: its
/// wait in the flow before that is queue time, as a wait for a `maxConcurrentSubagents` slot
/// is. Shared by the requests of one call (a schema fallback's second request continues it).
#[derive(Debug)]
pub(crate) struct CallClock {
    limit: Option<Duration>,
    deadline: tokio::sync::watch::Sender<Option<tokio::time::Instant>>,
}

impl CallClock {
    /// A clock of `limit` (none: it never runs out), not started.
    pub fn new(limit: Option<Duration>) -> CallClock {
        CallClock { limit, deadline: tokio::sync::watch::Sender::new(None) }
    }

    /// Start it (the call was admitted), unless it runs already.
    fn start(&self) {
        if let Some(limit) = self.limit {
            self.deadline.send_if_modified(|d| {
                if d.is_some() {
                    return false;
                }
                *d = tokio::time::Instant::now().checked_add(limit);
                d.is_some()
            });
        }
    }

    /// Ready once it has run out (never, without a limit).
    async fn expired(&self) {
        let mut started = self.deadline.subscribe();
        loop {
            let deadline = *started.borrow_and_update();
            match deadline {
                Some(at) => return tokio::time::sleep_until(at).await,
                None => {
                    if started.changed().await.is_err() {
                        return std::future::pending().await;
                    }
                }
            }
        }
    }
}

async fn send_admitted(
    policy: &RetryPolicy,
    flow: &Arc<Flow>,
    input_tokens: u64,
    clock: &CallClock,
    who: &str,
    make: impl Fn() -> reqwest::RequestBuilder,
) -> Result<HttpReply, BackendError> {
    let mut retry = 0u32;
    let mut pushbacks = 0u32;
    let bound = flow.max_wait();
    // When the server first pushed this call back: the bound counts from there.
    let mut pushed_since: Option<Instant> = None;
    loop {
        let permit = match pushed_since {
            None => flow.admit(input_tokens).await,
            Some(since) => {
                let left = bound.saturating_sub(since.elapsed());
                match tokio::time::timeout(left, flow.admit(input_tokens)).await {
                    Ok(permit) => permit,
                    Err(_) => {
                        return Err(BackendError::outage(OutageKind::RateLimited, format!(
                            "{who}: rate limited (HTTP 429): the server kept the call waiting {:.0}s, past the {}s bound (max_wait_seconds)",
                            since.elapsed().as_secs_f64(),
                            bound.as_secs()
                        )))
                    }
                }
            }
        };
        clock.start();
        let last = retry >= policy.max_retries;
        let wait = match make().send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                let after = retry_after(response.headers());
                if pushback(status) {
                    let headers = response.headers().clone();
                    let body = read_capped(response, who, status).await?;
                    // A spent quota (read from the body) is no pushback a wait in the queue fixes.
                    if let Some(e) = super::quota::spent(status, &headers, &body) {
                        permit.failed();
                        return Err(BackendError::quota(format!("{who}: {}", e.message()), e.resume_at()));
                    }
                    if let Some(after) = after.filter(|a| *a > bound) {
                        permit.pushed_back(status, &headers, Some(after), Duration::ZERO);
                        return Err(BackendError::quota(
                            format!(
                                "{who}: HTTP {status}: the server asks to come back in {:.0}s, past the {}s this backend waits: {}",
                                after.as_secs_f64(),
                                bound.as_secs(),
                                error_message(&body)
                            ),
                            std::time::SystemTime::now().checked_add(after),
                        ));
                    }
                    permit.pushed_back(status, &headers, after, policy.backoff(pushbacks.min(6)));
                    pushbacks = pushbacks.saturating_add(1);
                    let since = *pushed_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > bound {
                        return Ok(HttpReply { status, body, charged: 0.0 });
                    }
                    tracing::debug!(
                        event = "pushback",
                        backend = who,
                        status,
                        pushbacks,
                        "the server pushed back; waiting in the flow"
                    );
                    continue;
                }
                if !retryable(status) || last {
                    let headers = response.headers().clone();
                    let charged = permit.answered(&headers);
                    let body = read_capped(response, who, status).await?;
                    // A spent quota said in a 4xx (a credit balance, a billing limit) is no
                    // error a retry fixes.
                    if let Some(e) = super::quota::spent(status, &headers, &body) {
                        return Err(BackendError::quota(format!("{who}: {}", e.message()), e.resume_at()));
                    }
                    return Ok(HttpReply { status, body, charged });
                }
                if status == 503 {
                    permit.pushed_back(status, response.headers(), after, policy.backoff(retry));
                } else {
                    permit.failed();
                }
                if let Some(after) = after {
                    if after > policy.max_retry_after {
                        return Err(BackendError::outage(OutageKind::ServerError, format!(
                            "{who}: HTTP {status}: the server asks to retry after {}s, longer than the {}s this backend waits",
                            after.as_secs_f64(),
                            policy.max_retry_after.as_secs_f64()
                        )));
                    }
                }
                let wait = after.unwrap_or_else(|| policy.backoff(retry));
                tracing::info!(
                    event = "retry",
                    backend = who,
                    status,
                    retry = retry + 1,
                    wait_ms = wait.as_millis() as u64,
                    "retrying after a retryable HTTP status"
                );
                wait
            }
            Err(e) if e.is_builder() => {
                return Err(BackendError::outage(
                    OutageKind::Misconfigured,
                    format!("{who}: invalid request: {}", chain(&e)),
                ))
            }
            Err(e) if last => {
                return Err(BackendError::outage(
                    transport_kind(&e),
                    format!("{who}: request failed after {} tries: {}", retry + 1, chain(&e)),
                ))
            }
            Err(e) => {
                drop(permit);
                let wait = policy.backoff(retry);
                tracing::info!(event = "retry", backend = who, retry = retry + 1, wait_ms = wait.as_millis() as u64, error = %chain(&e), "retrying after a transport error");
                wait
            }
        };
        tokio::time::sleep(wait).await;
        retry += 1;
    }
}

/// The body of `response` as text (invalid UTF-8 replaced), read chunk by chunk and never
/// more than [`MAX_REPLY_BYTES`]: a longer body (or a `Content-Length` saying so) is an
/// `invalid_reply` failure, and the connection is dropped unread.
async fn read_capped(mut response: reqwest::Response, who: &str, status: u16) -> Result<String, BackendError> {
    let too_large = || {
        BackendError::outage(
            OutageKind::InvalidReply,
            format!("{who}: the HTTP {status} reply is larger than {} MiB; not read further", MAX_REPLY_BYTES >> 20),
        )
    };
    if response.content_length().is_some_and(|n| n > MAX_REPLY_BYTES as u64) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    loop {
        let chunk = response.chunk().await.map_err(|e| {
            BackendError::outage(
                transport_kind(&e),
                format!("{who}: reading the HTTP {status} reply failed: {}", chain(&e)),
            )
        })?;
        let Some(chunk) = chunk else { break };
        if body.len().saturating_add(chunk.len()) > MAX_REPLY_BYTES {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(match String::from_utf8(body) {
        Ok(text) => text,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

/// A transport error's kind: a timeout, or the backend being unreachable.
fn transport_kind(e: &reqwest::Error) -> OutageKind {
    if e.is_timeout() {
        OutageKind::Timeout
    } else {
        OutageKind::Unavailable
    }
}

/// An error and its sources, one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let message = s.to_string();
        if !text.contains(&message) {
            text.push_str(": ");
            text.push_str(&message);
        }
        source = s.source();
    }
    text
}

/// The error for a reply that is not 2xx. `key_var` names the API key's environment
/// variable, `url` and `model` what a 404 most likely got wrong. Statuses that say nothing
/// about the prompt (401, 403, 404, and 408/429/5xx once retries are spent) are backend
/// failures; any other 4xx (a prompt too long, say) is an ordinary failure of this call.
pub(crate) fn status_error(who: &str, reply: &HttpReply, key_var: &str, url: &str, model: &str) -> BackendError {
    let message = error_message(&reply.body);
    let outage = |kind, text: String| BackendError::outage(kind, text);
    match reply.status {
        401 => {
            outage(OutageKind::Auth, format!("{who}: authentication failed (HTTP 401): {message} (check {key_var})"))
        }
        403 => outage(
            OutageKind::Auth,
            format!(
                "{who}: permission denied (HTTP 403): {message} (check {key_var} and its access to model `{model}`)"
            ),
        ),
        404 => outage(
            OutageKind::ModelNotFound,
            format!("{who}: not found (HTTP 404): {message} (check the base URL `{url}` and the model `{model}`)"),
        ),
        429 | 529 => outage(
            OutageKind::RateLimited,
            format!("{who}: rate limited (HTTP {}), kept waiting past the bound: {message}", reply.status),
        ),
        s if s >= 500 => {
            outage(OutageKind::ServerError, format!("{who}: server error (HTTP {s}), retries exhausted: {message}"))
        }
        s if retryable(s) => outage(OutageKind::Unavailable, format!("{who}: HTTP {s}, retries exhausted: {message}")),
        s => BackendError::ordinary(format!("{who}: HTTP {s}: {message}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::{HeaderMap, HeaderValue};

    #[test]
    fn backoff_grows_is_capped_and_never_below_half() {
        let policy = RetryPolicy {
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(1000),
            ..RetryPolicy::default()
        };
        for _ in 0..50 {
            let d0 = policy.backoff(0);
            assert!(d0 >= Duration::from_millis(50) && d0 <= Duration::from_millis(100), "{d0:?}");
            let d3 = policy.backoff(3);
            assert!(d3 >= Duration::from_millis(400) && d3 <= Duration::from_millis(800), "{d3:?}");
            let d30 = policy.backoff(30);
            assert!(d30 >= Duration::from_millis(500) && d30 <= Duration::from_millis(1000), "{d30:?}");
        }
    }

    #[test]
    fn retry_after_reads_seconds_and_milliseconds() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert("retry-after", HeaderValue::from_static("2"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(2)));
        h.insert("retry-after-ms", HeaderValue::from_static("250"));
        assert_eq!(retry_after(&h), Some(Duration::from_millis(250)));
        let mut date = HeaderMap::new();
        date.insert("retry-after", HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"));
        assert_eq!(retry_after(&date), None);
        // Absurd values from a hostile server: never a panic, never a negative wait.
        for (name, value) in [("retry-after-ms", "1e300"), ("retry-after", "1e300"), ("retry-after", "inf")] {
            let mut h = HeaderMap::new();
            h.insert(name, HeaderValue::from_static(value));
            assert_eq!(retry_after(&h), Some(Duration::MAX), "{name}: {value}");
        }
        for value in ["-5", "NaN", "-inf"] {
            let mut h = HeaderMap::new();
            h.insert("retry-after", HeaderValue::from_static(value));
            assert_eq!(retry_after(&h), None, "{value}");
        }
    }

    #[test]
    fn error_messages_name_the_likely_fix() {
        let reply =
            HttpReply { status: 401, body: r#"{"error":{"message":"Incorrect API key"}}"#.into(), charged: 0.0 };
        let e = status_error("openai", &reply, "OPENAI_API_KEY", "http://x/v1", "m");
        assert_eq!(e.outage_kind(), Some(OutageKind::Auth));
        let e = e.message().to_string();
        assert!(e.contains("HTTP 401") && e.contains("Incorrect API key") && e.contains("OPENAI_API_KEY"), "{e}");
        let reply = HttpReply { status: 404, body: "no such route".into(), charged: 0.0 };
        let e = status_error("openai", &reply, "K", "http://x/v1", "gpt-x");
        assert_eq!(e.outage_kind(), Some(OutageKind::ModelNotFound));
        let e = e.message().to_string();
        let too_long = HttpReply { status: 400, body: "context length exceeded".into(), charged: 0.0 };
        assert_eq!(status_error("openai", &too_long, "K", "u", "m").outage_kind(), None);
        assert!(e.contains("HTTP 404") && e.contains("http://x/v1") && e.contains("gpt-x"), "{e}");
        assert_eq!(error_message(&"x".repeat(400)).len(), 303);
    }
}
