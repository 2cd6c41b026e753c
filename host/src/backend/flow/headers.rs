//! What a provider's reply says about its rate limits: OpenAI's
//! `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` (reset as a Go duration, `6m0s`,
//! `20ms`) and Anthropic's `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-
//! {limit,remaining,reset}` (reset as an RFC 3339 time), read into [`Learned`]. Every value is
//! parsed defensively: a missing, negative, huge or garbled header reads as absent, never as
//! a panic or a wrapped number.

use reqwest::header::HeaderMap;
use std::time::{Duration, SystemTime};

/// One metered quantity as the server reported it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    /// The bucket's size (`-limit`).
    pub limit: f64,
    /// What is left of it now (`-remaining`).
    pub remaining: f64,
    /// How long until the bucket is full again (`-reset`), when said.
    pub reset: Option<Duration>,
}

impl Window {
    /// The refill rate per second the window implies: what was used, refilled over the time
    /// to reset (a token bucket), kept between `limit` per minute and `limit` per second.
    /// `None` when nothing was used or no reset was said.
    pub fn rate(&self) -> Option<f64> {
        let reset = self.reset?.as_secs_f64();
        let used = self.limit - self.remaining;
        if used < 1.0 || reset <= 0.0 || self.limit < 1.0 {
            return None;
        }
        Some((used / reset).clamp(self.limit / 60.0, self.limit))
    }
}

/// What one reply taught about the provider's limits.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Learned {
    /// Requests.
    pub requests: Option<Window>,
    /// Tokens (Anthropic: the tighter of tokens, input and output tokens).
    pub tokens: Option<Window>,
}

impl Learned {
    /// Read the rate-limit headers of a reply (OpenAI or Anthropic style; absent: nothing).
    pub fn of(headers: &HeaderMap, now: SystemTime) -> Learned {
        // Most replies of an unlimited server carry none: one pass over the names says so.
        let metered = headers.keys().any(|name| {
            let name = name.as_str();
            name.starts_with("x-ratelimit-") || name.starts_with("anthropic-ratelimit-")
        });
        if !metered {
            return Learned::default();
        }
        let openai = |[limit, remaining, reset]: [&str; 3]| window(headers, limit, remaining, reset, go_duration);
        let anthropic =
            |[limit, remaining, reset]: [&str; 3]| window(headers, limit, remaining, reset, |v| rfc3339_from(v, now));
        let tightest = |windows: [Option<Window>; 3]| {
            windows.into_iter().flatten().min_by(|a, b| (a.remaining / a.limit).total_cmp(&(b.remaining / b.limit)))
        };
        Learned {
            requests: openai(OPENAI_REQUESTS).or_else(|| anthropic(ANTHROPIC_REQUESTS)),
            tokens: openai(OPENAI_TOKENS).or_else(|| {
                tightest([
                    anthropic(ANTHROPIC_TOKENS),
                    anthropic(ANTHROPIC_INPUT_TOKENS),
                    anthropic(ANTHROPIC_OUTPUT_TOKENS),
                ])
            }),
        }
    }
}

/// The header names of one window: limit, remaining, reset.
const OPENAI_REQUESTS: [&str; 3] =
    ["x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"];
const OPENAI_TOKENS: [&str; 3] =
    ["x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"];
const ANTHROPIC_REQUESTS: [&str; 3] = [
    "anthropic-ratelimit-requests-limit",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-requests-reset",
];
const ANTHROPIC_TOKENS: [&str; 3] =
    ["anthropic-ratelimit-tokens-limit", "anthropic-ratelimit-tokens-remaining", "anthropic-ratelimit-tokens-reset"];
const ANTHROPIC_INPUT_TOKENS: [&str; 3] = [
    "anthropic-ratelimit-input-tokens-limit",
    "anthropic-ratelimit-input-tokens-remaining",
    "anthropic-ratelimit-input-tokens-reset",
];
const ANTHROPIC_OUTPUT_TOKENS: [&str; 3] = [
    "anthropic-ratelimit-output-tokens-limit",
    "anthropic-ratelimit-output-tokens-remaining",
    "anthropic-ratelimit-output-tokens-reset",
];

fn window(
    headers: &HeaderMap,
    limit: &str,
    remaining: &str,
    reset: &str,
    parse_reset: impl Fn(&str) -> Option<Duration>,
) -> Option<Window> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    let count = |name: &str| text(name)?.parse::<f64>().ok().filter(|n| n.is_finite() && *n >= 0.0 && *n <= 1e15);
    let limit = count(limit)?;
    let remaining = count(remaining)?.min(limit);
    Some(Window { limit, remaining, reset: text(reset).and_then(parse_reset) })
}

/// The longest reset a header may say (a day): beyond it the value reads as absent.
const MAX_RESET: Duration = Duration::from_secs(24 * 3600);

/// A Go duration as OpenAI writes it (`1s`, `6m0s`, `20ms`, `1m30.5s`, `1h2m`), at most a day.
pub fn go_duration(text: &str) -> Option<Duration> {
    Duration::try_from_secs_f64(go_seconds(text)?).ok().filter(|d| *d <= MAX_RESET)
}

/// The seconds a Go duration says (finite, not negative); `None` for anything else (a sign, a
/// unit it does not know, no number, more than 64 characters).
pub(crate) fn go_seconds(text: &str) -> Option<f64> {
    let mut rest = text.trim();
    if rest.is_empty() || rest.len() > 64 {
        return None;
    }
    let mut total = 0.0f64;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" | "μs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += number * seconds;
    }
    (total.is_finite() && total >= 0.0).then_some(total)
}

/// The time from `now` until an RFC 3339 instant (Anthropic's resets); zero when it passed,
/// absent when garbled or more than a day away.
pub fn rfc3339_from(text: &str, now: SystemTime) -> Option<Duration> {
    let text = text.trim();
    if text.len() > 64 {
        return None;
    }
    let at = humantime::parse_rfc3339_weak(text.trim_end_matches('Z')).ok()?;
    let wait = at.duration_since(now).unwrap_or(Duration::ZERO);
    (wait <= MAX_RESET).then_some(wait)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use reqwest::header::{HeaderName, HeaderValue};

    /// A header map of `pairs` (for the flow's tests too).
    pub(crate) fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn go_durations_parse_and_garbage_does_not() {
        assert_eq!(go_duration("1s"), Some(Duration::from_secs(1)));
        assert_eq!(go_duration("6m0s"), Some(Duration::from_secs(360)));
        assert_eq!(go_duration("20ms"), Some(Duration::from_millis(20)));
        assert_eq!(go_duration("1m30.5s"), Some(Duration::from_millis(90_500)));
        for bad in ["", "s", "1x", "-1s", "1e400s", "99999999h", "1..2s", &"9".repeat(100)] {
            assert_eq!(go_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn openai_headers_give_a_refill_rate() {
        let now = SystemTime::now();
        let h = headers(&[
            ("x-ratelimit-limit-requests", "500"),
            ("x-ratelimit-remaining-requests", "499"),
            ("x-ratelimit-reset-requests", "120ms"),
            ("x-ratelimit-limit-tokens", "30000"),
            ("x-ratelimit-remaining-tokens", "29000"),
            ("x-ratelimit-reset-tokens", "2s"),
        ]);
        let learned = Learned::of(&h, now);
        let requests = learned.requests.unwrap();
        assert!((requests.rate().unwrap() - 500.0 / 60.0).abs() < 0.01);
        assert_eq!(learned.tokens.unwrap().rate(), Some(500.0));
    }

    #[test]
    fn anthropic_headers_take_the_tightest_token_window() {
        let now = humantime::parse_rfc3339("2026-12-06T05:00:00Z").unwrap();
        let h = headers(&[
            ("anthropic-ratelimit-requests-limit", "50"),
            ("anthropic-ratelimit-requests-remaining", "0"),
            ("anthropic-ratelimit-requests-reset", "2026-12-06T05:01:00Z"),
            ("anthropic-ratelimit-input-tokens-limit", "40000"),
            ("anthropic-ratelimit-input-tokens-remaining", "39000"),
            ("anthropic-ratelimit-output-tokens-limit", "8000"),
            ("anthropic-ratelimit-output-tokens-remaining", "100"),
        ]);
        let learned = Learned::of(&h, now);
        let requests = learned.requests.unwrap();
        assert_eq!(requests.reset, Some(Duration::from_secs(60)));
        assert_eq!(requests.rate(), Some(50.0 / 60.0));
        assert_eq!(learned.tokens.unwrap().limit, 8000.0);
    }

    #[test]
    fn hostile_values_read_as_absent() {
        let now = SystemTime::now();
        for (limit, remaining, reset) in
            [("-5", "1", "1s"), ("1e300", "1", "1s"), ("NaN", "1", "1s"), ("10", "x", "1s"), ("inf", "1", "1s")]
        {
            let h = headers(&[
                ("x-ratelimit-limit-requests", limit),
                ("x-ratelimit-remaining-requests", remaining),
                ("x-ratelimit-reset-requests", reset),
            ]);
            assert_eq!(Learned::of(&h, now).requests, None, "{limit} {remaining}");
        }
        let h = headers(&[
            ("x-ratelimit-limit-requests", "10"),
            ("x-ratelimit-remaining-requests", "50"),
            ("x-ratelimit-reset-requests", "1e9h"),
        ]);
        let w = Learned::of(&h, now).requests.unwrap();
        assert_eq!((w.remaining, w.reset, w.rate()), (10.0, None, None));
        assert_eq!(rfc3339_from("not a time", now), None);
        assert_eq!(rfc3339_from("9999-12-31T23:59:59Z", now), None);
    }
}
