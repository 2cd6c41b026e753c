//! Spent quotas: which replies of the HTTP backends say the provider's quota (not a rate
//! limit) is spent, and until when. A spent quota is no error a retry fixes: the call fails
//! as [`BackendError::QuotaSpent`] at once, and the run is parked until the reset
//! ([`crate::engine::recover`]). Recognised: OpenAI `insufficient_quota` (and
//! `billing_hard_limit_reached`), Anthropic's credit balance and spend limits (HTTP 400
//! "Your credit balance is too low", "You have reached your specified API usage limits",
//! 402 `billing_error`, 429 `enforced_spend_limit_reached`), and a "usage limit" message.
//!
//! The reset is read from `retry-after-ms` / `retry-after`, OpenAI's
//! `x-ratelimit-reset-requests|tokens` (Go durations such as `6m0s`), Anthropic's
//! `anthropic-ratelimit-*-reset` (RFC 3339), a time the message states, or for a monthly
//! spend limit the first of the next month (UTC); else it is unknown. Whatever a server
//! sends is bounded here: only a bounded body is parsed, only short header values are read,
//! and a reset is never sooner than [`MIN_WAIT`] nor later than [`MAX_WAIT`] from now.

use super::BackendError;
use reqwest::header::HeaderMap;
use std::time::{Duration, SystemTime};

/// The soonest a spent quota is tried again (a reset in the past or "now" would otherwise
/// spin: park, resume, be refused, park).
pub const MIN_WAIT: Duration = Duration::from_secs(1);

/// The latest a spent quota is tried again: a later reset (or an absurd header) is waited
/// for this long, then tried (and parked again if still spent).
pub const MAX_WAIT: Duration = Duration::from_secs(31 * 86400);

/// The largest error body parsed for its JSON (error bodies are a few hundred bytes).
const MAX_PARSED_BODY: usize = 64 << 10;

/// The longest header value read as a reset time.
const MAX_HEADER_CHARS: usize = 64;

/// The spent quota `status`, `headers` and `body` say, if they say one: its message (the
/// provider's, shortened) and when it resets, if known.
pub(crate) fn spent(status: u16, headers: &HeaderMap, body: &str) -> Option<BackendError> {
    if !(400..500).contains(&status) {
        return None;
    }
    let parsed: Option<serde_json::Value> =
        (body.len() <= MAX_PARSED_BODY).then(|| serde_json::from_str(body).ok()).flatten();
    let text = |pointer: &str| parsed.as_ref().and_then(|v| v.pointer(pointer)).and_then(|v| v.as_str()).unwrap_or("");
    let (code, kind, detail) = (text("/error/code"), text("/error/type"), text("/error/details/error_code"));
    let message = super::reply::error_message(body);
    let lower = message.to_ascii_lowercase();
    let openai = status == 429 && [code, kind].contains(&"insufficient_quota");
    let billing = [code, kind].iter().any(|c| *c == "billing_hard_limit_reached" || *c == "billing_error");
    let monthly = status == 429 && detail == "enforced_spend_limit_reached";
    let credits = lower.contains("credit balance is too low") || lower.contains("insufficient credits");
    let usage = lower.contains("usage limit");
    if !(openai || billing || monthly || credits || usage) {
        return None;
    }
    let now = SystemTime::now();
    let wait = header_reset(headers, now)
        .or_else(|| stated_reset(&message, now))
        .or_else(|| monthly.then(|| next_month(now)).flatten());
    let until = wait.map(|w| whole_second(now + w.clamp(MIN_WAIT, MAX_WAIT)));
    let when = match until {
        Some(t) => format!("it resets at {}", humantime::format_rfc3339_seconds(t)),
        None => "the provider did not say when it resets".to_string(),
    };
    Some(BackendError::quota(format!("quota spent (HTTP {status}): {message}; {when}"), until))
}

/// `at` rounded up to a whole second (as `resumeAt` shows it: never before the reset).
fn whole_second(at: SystemTime) -> SystemTime {
    match at.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) if d.subsec_nanos() > 0 => SystemTime::UNIX_EPOCH + Duration::from_secs(d.as_secs().saturating_add(1)),
        _ => at,
    }
}

/// The latest reset the headers give, as a wait from `now`.
fn header_reset(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty() && v.len() <= MAX_HEADER_CHARS)
    };
    let mut waits = Vec::new();
    waits.extend(super::reply::retry_after(headers));
    for name in ["x-ratelimit-reset-requests", "x-ratelimit-reset-tokens"] {
        waits.extend(value(name).and_then(go_duration));
    }
    for kind in ["requests", "tokens", "input-tokens", "output-tokens"] {
        let at = value(&format!("anthropic-ratelimit-{kind}-reset")).and_then(rfc3339);
        waits.extend(at.map(|at| at.duration_since(now).unwrap_or(Duration::ZERO)));
    }
    waits.into_iter().max()
}

/// A Go duration (`1s`, `6m0s`, `20ms`, `1h2m3.5s`): `None` for anything else (a sign, a
/// unit it does not know, no number). Too large a value reads as [`Duration::MAX`].
pub(crate) fn go_duration(text: &str) -> Option<Duration> {
    let seconds = super::flow::headers::go_seconds(text)?;
    Some(Duration::try_from_secs_f64(seconds).unwrap_or(Duration::MAX))
}

/// An RFC 3339 time in UTC (`Z` or `+00:00`); `None` for anything else.
fn rfc3339(text: &str) -> Option<SystemTime> {
    let text = text.strip_suffix("+00:00").map(|t| format!("{t}Z")).unwrap_or_else(|| text.to_string());
    humantime::parse_rfc3339_weak(&text).ok()
}

/// A reset a message states: Anthropic's "... regain access on 2026-01-01 at 00:00 UTC", or
/// a Unix time after a `|` ("Claude AI usage limit reached|1750000000").
fn stated_reset(message: &str, now: SystemTime) -> Option<Duration> {
    if let Some((_, after)) = message.rsplit_once('|') {
        let secs: u64 = after.trim().parse().ok()?;
        let at = SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(secs))?;
        return Some(at.duration_since(now).unwrap_or(Duration::ZERO));
    }
    let at = message.find(" on ")?;
    let rest = &message[at + 4..];
    let date = rest.get(..10)?;
    let time = rest.get(10..)?.strip_prefix(" at ")?.get(..5)?;
    let at = rfc3339(&format!("{date}T{time}:00Z"))?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The wait from `now` to the first of the next month, 00:00 UTC (a monthly spend limit's
/// reset).
fn next_month(now: SystemTime) -> Option<Duration> {
    let today = humantime::format_rfc3339_seconds(now).to_string();
    let year: u32 = today.get(..4)?.parse().ok()?;
    let month: u32 = today.get(5..7)?.parse().ok()?;
    let (year, month) = if month == 12 { (year + 1, 1) } else { (year, month + 1) };
    let at = rfc3339(&format!("{year:04}-{month:02}-01T00:00:00Z"))?;
    at.duration_since(now).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::OutageKind;
    use reqwest::header::HeaderValue;

    const OPENAI: &str = r#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details.",
        "type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        h
    }

    /// The wait a spent quota says, from now, in seconds.
    fn wait_of(e: &BackendError) -> Option<f64> {
        e.resume_at().map(|t| t.duration_since(SystemTime::now()).unwrap_or_default().as_secs_f64())
    }

    /// `e` resets about `secs` from now (rounded up to a whole second, less the test's time).
    fn resets_in(e: &BackendError, secs: u64) {
        let wait = wait_of(e).expect("a reset");
        assert!(wait > secs as f64 - 1.0 && wait <= secs as f64 + 1.0, "{wait} s, not about {secs} s");
    }

    #[test]
    fn openai_insufficient_quota_is_a_spent_quota_with_its_reset_from_the_headers() {
        let e = spent(429, &headers(&[("retry-after", "20")]), OPENAI).expect("a spent quota");
        assert_eq!(e.outage_kind(), Some(OutageKind::Quota));
        assert!(
            e.message().contains("You exceeded your current quota") && e.message().contains("resets at"),
            "{}",
            e.message()
        );
        resets_in(&e, 20);
        let e =
            spent(429, &headers(&[("x-ratelimit-reset-requests", "1s"), ("x-ratelimit-reset-tokens", "6m0s")]), OPENAI)
                .unwrap();
        resets_in(&e, 360); // the later of the two resets
        let e = spent(429, &headers(&[("retry-after-ms", "20")]), OPENAI).unwrap();
        resets_in(&e, 1); // never sooner than MIN_WAIT
        let e = spent(429, &HeaderMap::new(), OPENAI).unwrap();
        assert_eq!(e.resume_at(), None);
        assert!(e.message().contains("did not say when"), "{}", e.message());
    }

    #[test]
    fn a_plain_rate_limit_or_another_error_is_no_spent_quota() {
        let rate =
            r#"{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}"#;
        assert!(spent(429, &headers(&[("retry-after", "2")]), rate).is_none());
        assert!(spent(500, &HeaderMap::new(), OPENAI).is_none(), "a 5xx is an outage, whatever it says");
        assert!(spent(400, &HeaderMap::new(), r#"{"error":{"message":"context length exceeded"}}"#).is_none());
        assert!(spent(404, &HeaderMap::new(), "").is_none());
    }

    #[test]
    fn anthropic_credit_and_spend_limits_are_spent_quotas() {
        let credit = r#"{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."}}"#;
        let e = spent(400, &HeaderMap::new(), credit).expect("credit balance");
        assert_eq!(e.resume_at(), None);
        let limits = r#"{"type":"error","error":{"type":"invalid_request_error","message":"You have reached your specified API usage limits. You will regain access on 2999-01-01 at 00:00 UTC."}}"#;
        let e = spent(400, &HeaderMap::new(), limits).expect("usage limits");
        resets_in(&e, MAX_WAIT.as_secs()); // a far reset is capped
        let soon = humantime::format_rfc3339_seconds(SystemTime::now() + Duration::from_secs(3600)).to_string();
        let reset =
            headers(&[("anthropic-ratelimit-tokens-reset", &soon), ("anthropic-ratelimit-requests-reset", "garbage")]);
        let e = spent(400, &reset, credit).unwrap();
        resets_in(&e, 3600);
        let monthly = r#"{"type":"error","error":{"type":"rate_limit_error","message":"spend limit","details":{"error_code":"enforced_spend_limit_reached"}}}"#;
        let e = spent(429, &HeaderMap::new(), monthly).expect("monthly spend limit");
        let days = wait_of(&e).unwrap() / 86400.0;
        assert!(days <= 31.0, "{days}");
        let billing = r#"{"type":"error","error":{"type":"billing_error","message":"payment required"}}"#;
        assert!(spent(402, &HeaderMap::new(), billing).is_some());
        let cli = spent(429, &HeaderMap::new(), "Claude AI usage limit reached|1").expect("a usage limit message");
        resets_in(&cli, 1); // a reset in the past: tried again after MIN_WAIT
    }

    #[test]
    fn hostile_reset_values_never_panic_and_stay_in_bounds() {
        let values = [
            "1e300",
            "-5",
            "NaN",
            "inf",
            "-inf",
            "99999999999999999999999",
            "18446744073709551616",
            "1.5",
            "0",
            "",
            " ",
            "garbage",
            "1s2",
            "-1s",
            "1x",
            "ms",
            "1..5s",
            "9999999999h",
            "1e5s",
            "2h3m4.5s",
            "\u{00b5}s",
        ];
        let long = "9".repeat(10_000);
        for value in values.iter().copied().chain([long.as_str()]) {
            let Ok(v) = HeaderValue::from_str(value) else { continue };
            for name in [
                "retry-after",
                "retry-after-ms",
                "x-ratelimit-reset-requests",
                "x-ratelimit-reset-tokens",
                "anthropic-ratelimit-requests-reset",
                "anthropic-ratelimit-output-tokens-reset",
            ] {
                let mut h = HeaderMap::new();
                h.insert(name, v.clone());
                let e = spent(429, &h, OPENAI).expect("still a spent quota");
                if let Some(at) = e.resume_at() {
                    let wait =
                        at.duration_since(SystemTime::now() - Duration::from_secs(1)).expect("never in the past");
                    assert!(wait <= MAX_WAIT + Duration::from_secs(2), "{name}: {value}: {wait:?}");
                    // It formats as RFC 3339 (a time past year 9999 would not).
                    assert!(e.message().contains("resets at"), "{}", e.message());
                }
            }
        }
        let datey =
            ["9999-12-31T23:59:59Z", "0000-01-01T00:00:00Z", "1969-12-31T23:59:59Z", "2026-13-45T99:99:99Z", "now"];
        for value in datey {
            let h = headers(&[("anthropic-ratelimit-tokens-reset", value)]);
            let _ = spent(429, &h, OPENAI).expect("a spent quota");
        }
        for body in [
            "Claude AI usage limit reached|99999999999999999999",
            "usage limit|-1",
            "usage limit on 2026-99-99 at 99:99 UTC",
        ] {
            let _ = spent(429, &HeaderMap::new(), body).expect("a usage limit message");
        }
        // A huge body is not parsed (bounded), and never panics.
        let huge = format!(r#"{{"error":{{"code":"insufficient_quota","message":"{}"}}}}"#, "x".repeat(1 << 20));
        assert!(spent(429, &HeaderMap::new(), &huge).is_none());
    }

    #[test]
    fn go_durations_read_as_openai_writes_them() {
        assert_eq!(go_duration("1s"), Some(Duration::from_secs(1)));
        assert_eq!(go_duration("6m0s"), Some(Duration::from_secs(360)));
        assert_eq!(go_duration("20ms"), Some(Duration::from_millis(20)));
        assert_eq!(go_duration("1h2m3.5s"), Some(Duration::from_secs_f64(3723.5)));
        assert_eq!(go_duration("9999999999999999999999h"), Some(Duration::MAX));
        for bad in ["", "-1s", "1", "s", "1x", "1..2s", "NaNs", "infs"] {
            assert_eq!(go_duration(bad), None, "{bad}");
        }
    }
}
