//! What a provider's reply says besides its answer, read defensively: when to come back
//! ([`retry_after`]) and the human message of an error body ([`error_message`]). Shared by
//! the HTTP plumbing ([`super::http`]) and the spent-quota reading ([`super::quota`]).

use reqwest::header::HeaderMap;
use std::time::Duration;

/// `retry-after-ms` (OpenAI) or `Retry-After` in seconds (an HTTP-date is ignored). A value
/// too large for a `Duration` reads as the largest one (so it is refused as too long), a
/// negative or non-numeric one as absent: nothing a server sends can panic here.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    let seconds = |s: f64| {
        (s.is_finite() || s == f64::INFINITY)
            .then_some(s)
            .filter(|s| *s >= 0.0)
            .map(|s| Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX))
    };
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        if let Some(d) = seconds(ms / 1000.0) {
            return Some(d);
        }
    }
    seconds(header("retry-after")?.parse::<f64>().ok()?)
}

/// The human message inside an error body (`{"error":{"message":...}}` in both wire
/// formats), else the body itself, shortened.
pub(crate) fn error_message(body: &str) -> String {
    let parsed: Option<serde_json::Value> = serde_json::from_str(body).ok();
    let message = parsed.as_ref().and_then(|v| {
        v.pointer("/error/message")
            .or_else(|| v.get("message"))
            .or_else(|| v.get("error"))
            .and_then(|m| m.as_str())
            .map(str::to_string)
    });
    let text = message.unwrap_or_else(|| body.trim().to_string());
    if text.chars().count() > 300 {
        let short: String = text.chars().take(300).collect();
        format!("{short}...")
    } else {
        text
    }
}
