//! The bearer token that guards `factory serve --http` and `factory mcp --http`: 256 random
//! bits made at start, written owner-only (0600) into the state directory for the owner's
//! clients to read, and checked on every request without stopping at the first difference;
//! and the one-time codes `factory ui` hands a browser instead of the token ([`OneTimeCodes`]).

use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A server's bearer token.
pub struct Bearer {
    /// `Bearer <token>`: the `Authorization` header value accepted.
    expected: String,
}

impl Bearer {
    /// Make a new token (two UUID v4s: 244 bits from the OS's generator) and write it to
    /// `path`, owner-only, replacing an earlier one.
    pub fn create(path: &Path) -> std::io::Result<Bearer> {
        use std::io::Write;
        let token = format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
        let mut file = factory_host::access::create_private_file(path)?;
        file.write_all(token.as_bytes())?;
        Ok(Bearer { expected: format!("Bearer {token}") })
    }

    /// The token itself (what a redeemed [`OneTimeCodes`] code is exchanged for).
    pub fn token(&self) -> &str {
        self.expected.strip_prefix("Bearer ").unwrap_or_default()
    }

    /// Does the `Authorization` header value `presented` carry the token?
    pub fn accepts(&self, presented: Option<&str>) -> bool {
        constant_time_eq(presented.unwrap_or_default().as_bytes(), self.expected.as_bytes())
    }
}

/// How long a one-time code stays redeemable.
pub const CODE_TTL: Duration = Duration::from_secs(120);

/// The most codes outstanding at once (issuing another drops the oldest).
pub const MAX_CODES: usize = 16;

/// Short-lived, single-use codes that stand in for the bearer token where it would be seen
/// by others: `factory ui` asks for one (with the token) and gives the browser only the code
/// (a command line every local user can read in `ps`); the page exchanges it once for the
/// token. A code is 128 random bits, redeemable once within its time to live.
pub struct OneTimeCodes {
    ttl: Duration,
    /// Outstanding codes and when each expires.
    codes: Mutex<Vec<(String, Instant)>>,
}

impl OneTimeCodes {
    /// No codes yet; each issued one lives `ttl`.
    pub fn new(ttl: Duration) -> OneTimeCodes {
        OneTimeCodes { ttl, codes: Mutex::new(Vec::new()) }
    }

    /// A new code (expired ones are forgotten; past [`MAX_CODES`], the oldest too).
    pub fn issue(&self) -> String {
        let code = uuid::Uuid::new_v4().simple().to_string();
        let now = Instant::now();
        let mut codes = self.codes.lock().unwrap_or_else(|p| p.into_inner());
        codes.retain(|(_, expires)| *expires > now);
        if codes.len() >= MAX_CODES {
            codes.remove(0);
        }
        codes.push((code.clone(), now + self.ttl));
        code
    }

    /// Redeem `presented`: true once for a code issued and not yet expired or redeemed.
    pub fn redeem(&self, presented: &str) -> bool {
        let now = Instant::now();
        let mut codes = self.codes.lock().unwrap_or_else(|p| p.into_inner());
        codes.retain(|(_, expires)| *expires > now);
        // Every code is compared, in constant time each.
        let found = codes.iter().fold(None, |found, (code, _)| {
            if constant_time_eq(code.as_bytes(), presented.as_bytes()) {
                Some(code.clone())
            } else {
                found
            }
        });
        match found {
            Some(code) => {
                codes.retain(|(c, _)| *c != code);
                true
            }
            None => false,
        }
    }
}

/// Compare secrets without stopping at the first difference.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_written_token_is_accepted() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("t.token");
        let bearer = Bearer::create(&path).expect("the token file");
        let token = std::fs::read_to_string(&path).expect("written");
        assert_eq!(token.len(), 64);
        assert!(bearer.accepts(Some(&format!("Bearer {token}"))));
        assert!(!bearer.accepts(Some(&format!("Bearer {}x", &token[..63]))));
        assert!(!bearer.accepts(Some(&token)));
        assert!(!bearer.accepts(None));
        assert!(constant_time_eq(b"abc", b"abc") && !constant_time_eq(b"abc", b"abd") && !constant_time_eq(b"a", b"ab"));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).expect("metadata").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // A new server replaces the token: the old one no longer works.
        let again = Bearer::create(&path).expect("a new token");
        assert!(!again.accepts(Some(&format!("Bearer {token}"))));
        assert_eq!(again.token(), std::fs::read_to_string(&path).expect("rewritten"));
    }

    #[test]
    fn a_code_is_redeemed_once_and_only_before_it_expires() {
        let codes = OneTimeCodes::new(Duration::from_secs(60));
        let code = codes.issue();
        assert!(!codes.redeem("not-a-code") && !codes.redeem(""));
        assert!(codes.redeem(&code), "redeemed once");
        assert!(!codes.redeem(&code), "never twice");
        // Past MAX_CODES, the oldest is forgotten.
        let first = codes.issue();
        let rest: Vec<String> = (0..MAX_CODES).map(|_| codes.issue()).collect();
        assert!(!codes.redeem(&first));
        assert!(rest.iter().all(|c| codes.redeem(c)));

        let short = OneTimeCodes::new(Duration::from_millis(50));
        let code = short.issue();
        std::thread::sleep(Duration::from_millis(120));
        assert!(!short.redeem(&code), "an expired code fails");
    }
}
