//! Credential redaction for backend failure messages, which reach envelopes, journals and
//! terminals: known secrets (a backend's API key), URL userinfo (`https://user:pass@host`),
//! credential query parameters (`key=`, `api_key=`, `token=`, ...), and `Authorization`,
//! `x-api-key` and bearer values a server or a CLI echoes back. Each is replaced by `***`.

use super::BackendError;

/// The mask that replaces a credential.
pub const MASK: &str = "***";

/// Query parameter names (compared case-insensitively, `-` and `_` ignored) whose values are
/// credentials.
const SECRET_PARAMS: &[&str] =
    &["key", "apikey", "token", "accesstoken", "authtoken", "secret", "clientsecret", "password", "sig", "signature"];

/// Header-like names whose value (after `:` or `=`, to the end of the word) is a credential.
const SECRET_HEADERS: &[&str] = &["authorization", "x-api-key", "api-key", "x-goog-api-key", "proxy-authorization"];

/// `text` with `secrets` (values shorter than 4 characters are ignored) and every credential
/// pattern masked.
pub fn redact(text: &str, secrets: &[&str]) -> String {
    let mut out = text.to_string();
    for secret in secrets.iter().map(|s| s.trim()).filter(|s| s.chars().count() >= 4) {
        out = out.replace(secret, MASK);
    }
    let out = userinfo(&out);
    let out = query_params(&out);
    let out = headers(&out);
    bearer(&out)
}

/// A failure with its message redacted (its class and kind kept).
pub fn redact_error(error: BackendError, secrets: &[&str]) -> BackendError {
    match error {
        BackendError::Ordinary(message) => BackendError::Ordinary(redact(&message, secrets)),
        BackendError::Outage { kind, message } => BackendError::Outage { kind, message: redact(&message, secrets) },
        BackendError::QuotaSpent { message, until } => {
            BackendError::QuotaSpent { message: redact(&message, secrets), until }
        }
    }
}

/// A character that ends a URL or a credential value in running text.
fn ends_value(c: char) -> bool {
    c.is_whitespace() || matches!(c, '"' | '\'' | '`' | '<' | '>' | ')' | '(' | '[' | ']' | '{' | '}' | ',' | ';')
}

/// `scheme://user:pass@host` and `scheme://token@host` → `scheme://***@host`.
fn userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        // The authority ends at `/`, `?`, `#` or the end of the URL.
        let end = tail.find(|c: char| ends_value(c) || matches!(c, '/' | '?' | '#')).unwrap_or(tail.len());
        match tail[..end].rfind('@') {
            Some(userinfo_end) => {
                out.push_str(MASK);
                rest = &tail[userinfo_end..];
            }
            None => rest = tail,
        }
    }
    out.push_str(rest);
    out
}

fn normalized(name: &str) -> String {
    name.chars().filter(|c| *c != '_' && *c != '-').flat_map(char::to_lowercase).collect()
}

/// `?key=VALUE` / `&api_key=VALUE` (and the other [`SECRET_PARAMS`]) → `key=***`.
fn query_params(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(eq) = rest.find('=') {
        let (before, after) = (&rest[..eq], &rest[eq + 1..]);
        let name_start =
            before.rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-')).map_or(0, |i| i + 1);
        let name = &before[name_start..];
        let preceded = before[..name_start].chars().next_back();
        let is_param =
            matches!(preceded, Some('?') | Some('&') | Some(';')) || preceded.is_none_or(char::is_whitespace);
        let secret = is_param
            && SECRET_PARAMS.iter().any(|p| normalized(name) == *p || normalized(name).ends_with(&format!("api{p}")));
        out.push_str(before);
        out.push('=');
        if secret {
            let end = after.find(|c: char| ends_value(c) || c == '&' || c == '#').unwrap_or(after.len());
            if end > 0 {
                out.push_str(MASK);
            }
            rest = &after[end..];
        } else {
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// `Authorization: Basic abc`, `"x-api-key":"abc"`, `api-key=abc` → the value masked.
fn headers(text: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    while at < text.len() {
        let found = SECRET_HEADERS.iter().filter_map(|h| lower[at..].find(h).map(|i| (at + i, h.len()))).min();
        let Some((start, len)) = found else { break };
        let mut cursor = start + len;
        // Optional closing quote, then `:` or `=`, then spaces and an opening quote.
        let bytes = text.as_bytes();
        if cursor < bytes.len() && matches!(bytes[cursor], b'"' | b'\'') {
            cursor += 1;
        }
        if cursor >= bytes.len() || !matches!(bytes[cursor], b':' | b'=') {
            out.push_str(&text[at..start + len]);
            at = start + len;
            continue;
        }
        cursor += 1;
        while cursor < bytes.len() && matches!(bytes[cursor], b' ' | b'\t' | b'"' | b'\'') {
            cursor += 1;
        }
        // A scheme word (`Bearer`, `Basic`) stays; the credential after it goes.
        let word_end = |from: usize| text[from..].find(ends_value).map_or(text.len(), |i| from + i);
        let first_end = word_end(cursor);
        let first = &text[cursor..first_end];
        let scheme = ["bearer", "basic", "token"].contains(&first.to_ascii_lowercase().as_str());
        let (value_start, value_end) = if scheme && text[first_end..].starts_with(' ') {
            (first_end + 1, word_end(first_end + 1))
        } else {
            (cursor, first_end)
        };
        out.push_str(&text[at..value_start]);
        if value_end > value_start {
            out.push_str(MASK);
        }
        at = value_end;
    }
    out.push_str(&text[at.min(text.len())..]);
    out
}

/// `Bearer abc` anywhere → `Bearer ***`.
fn bearer(text: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    while let Some(i) = lower[at..].find("bearer ") {
        let start = at + i + "bearer ".len();
        let end = text[start..].find(ends_value).map_or(text.len(), |j| start + j);
        out.push_str(&text[at..start]);
        if end > start && &text[start..end] != MASK {
            out.push_str(MASK);
        } else {
            out.push_str(&text[start..end]);
        }
        at = end;
    }
    out.push_str(&text[at..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_secrets_userinfo_params_and_auth_values() {
        assert_eq!(redact("bad key sk-live-123456 here", &["sk-live-123456"]), "bad key *** here");
        assert_eq!(redact("x", &["ab"]), "x", "too-short secrets are not masked");
        assert_eq!(
            redact("error sending request for url (https://bob:hunter2@api.example.com/v1/chat?x=1)", &[]),
            "error sending request for url (https://***@api.example.com/v1/chat?x=1)"
        );
        assert_eq!(redact("see http://127.0.0.1:9/v1 now", &[]), "see http://127.0.0.1:9/v1 now");
        assert_eq!(
            redact("GET https://h/v1?alt=json&key=AIzaSECRET&api_key=s2 then", &[]),
            "GET https://h/v1?alt=json&key=***&api_key=*** then"
        );
        assert_eq!(redact("?access_token=abc#frag", &[]), "?access_token=***#frag");
        assert_eq!(redact("monkey=banana keyboard=x", &[]), "monkey=banana keyboard=x");
        assert_eq!(redact(r#"{"Authorization":"Bearer sk-abc"}"#, &[]), r#"{"Authorization":"Bearer ***"}"#);
        assert_eq!(redact("authorization: Basic dXNlcjpwYXNz", &[]), "authorization: Basic ***");
        assert_eq!(redact(r#"got x-api-key: "ant-123" ok"#, &[]), r#"got x-api-key: "***" ok"#);
        assert_eq!(redact("token was Bearer abc.def, retry", &[]), "token was Bearer ***, retry");
        assert_eq!(redact("ünïcode Bearer ✓✓ end", &[]), "ünïcode Bearer *** end");
    }
}
