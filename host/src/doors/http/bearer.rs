//! The bearer token that guards `factory serve --http` and `factory mcp --http`: 256 random
//! bits made at start, or the cluster's token shared by every worker of a PostgreSQL store
//! ([`cluster_token`]: `FACTORY_TOKEN`, or `--token-file`), written owner-only (0600) into
//! the state directory for the owner's clients to read, and checked on every request without
//! stopping at the first difference; and the one-time codes `factory ui` hands a browser
//! instead of the token, with the dashboard sessions they open ([`OneTimeCodes`]).

use anyhow::{bail, Context};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

/// A server's bearer token.
pub struct Bearer {
    /// `Bearer <token>`: the `Authorization` header value accepted.
    expected: String,
}

/// The environment variable that holds the cluster's token.
pub const TOKEN_ENV: &str = "FACTORY_TOKEN";

/// The shortest cluster token accepted (a random one is 64 characters).
pub const MIN_TOKEN_CHARS: usize = 32;

/// The longest token file read.
const MAX_TOKEN_FILE_BYTES: u64 = 4096;

/// The cluster's token, when one is given: `FACTORY_TOKEN` (non-empty) wins, else the
/// file `file` (`--token-file` / `FACTORY_TOKEN_FILE`), which must be readable by its owner
/// only; `None`: each server makes a random token of its own. A token is at least
/// [`MIN_TOKEN_CHARS`] visible ASCII characters (surrounding whitespace is dropped).
pub fn cluster_token(file: Option<&Path>) -> anyhow::Result<Option<String>> {
    if let Some(value) = std::env::var_os(TOKEN_ENV).filter(|v| !v.is_empty()) {
        let Some(text) = value.to_str() else { bail!("{TOKEN_ENV} is not UTF-8") };
        return checked_token(text, TOKEN_ENV).map(Some);
    }
    let Some(path) = file else { return Ok(None) };
    let text = read_secret_file(path, "token file")?;
    checked_token(&text, &format!("the token file {}", path.display())).map(Some)
}

/// The text of a secret the user keeps in a file (`what`: `token file`, `password file`):
/// readable by its owner only, at most [`MAX_TOKEN_FILE_BYTES`].
pub fn read_secret_file(path: &Path, what: &str) -> anyhow::Result<String> {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;
    let opened = std::fs::File::open(path).with_context(|| format!("reading the {what} {}", path.display()))?;
    let mode =
        opened.metadata().with_context(|| format!("reading the {what} {}", path.display()))?.permissions().mode();
    if mode & 0o077 != 0 {
        bail!("the {what} {} is readable by others (mode {:o}): chmod 600 it", path.display(), mode & 0o777);
    }
    let mut text = String::new();
    opened
        .take(MAX_TOKEN_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("reading the {what} {}", path.display()))?;
    if text.len() as u64 > MAX_TOKEN_FILE_BYTES {
        bail!("the {what} {} is over {MAX_TOKEN_FILE_BYTES} bytes", path.display());
    }
    Ok(text)
}

fn checked_token(text: &str, from: &str) -> anyhow::Result<String> {
    let token = text.trim();
    if token.len() < MIN_TOKEN_CHARS || !token.bytes().all(|b| b.is_ascii_graphic()) {
        bail!("the token in {from} must be at least {MIN_TOKEN_CHARS} visible ASCII characters (no spaces)");
    }
    Ok(token.to_string())
}

impl Bearer {
    /// Make a new token (two UUID v4s: 244 bits from the OS's generator), or take the
    /// cluster's `shared` one, and write it to `path`, owner-only, replacing an earlier one.
    pub fn create(path: &Path, shared: Option<&str>) -> std::io::Result<Bearer> {
        use std::io::Write;
        let token = match shared {
            Some(token) => token.to_string(),
            None => random_secret(),
        };
        let mut file = factory_host::access::create_private_file(path)?;
        file.write_all(token.as_bytes())?;
        Ok(Bearer { expected: format!("Bearer {token}") })
    }

    /// Does the `Authorization` header value `presented` carry the token?
    pub fn accepts(&self, presented: Option<&str>) -> bool {
        constant_time_eq(presented.unwrap_or_default().as_bytes(), self.expected.as_bytes())
    }
}

/// How long a one-time code stays redeemable.
pub const CODE_TTL: Duration = Duration::from_secs(120);

/// How long a dashboard session lasts by default (`factory serve --ui-session-ttl`).
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);

/// The most codes outstanding at once (issuing another drops the oldest).
pub const MAX_CODES: usize = 16;

/// The most dashboard sessions alive at once (another exchange ends the oldest).
pub const MAX_SESSIONS: usize = 16;

/// Characters in a one-time code (hex; 244 random bits from the OS's generator).
pub const CODE_CHARS: usize = 64;

/// 244 random bits (two UUID v4s) from the OS's generator, as 64 hex characters.
fn random_secret() -> String {
    format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

/// Is `code` shaped like a code [`OneTimeCodes::issue`] makes ([`CODE_CHARS`] hex digits)?
pub fn is_code_shaped(code: &str) -> bool {
    code.len() == CODE_CHARS && code.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Short-lived, single-use codes that stand in for the bearer token where it would be seen
/// by others, and the dashboard sessions they open: `factory ui` asks for a code (with the
/// owner's token; a dashboard session cannot) and hands it to the browser in a private file;
/// the page exchanges it once for a session token of its own, which the API accepts like the
/// bearer token except for minting codes and managing sessions. A code is 244 random bits,
/// redeemable once within its time to live; a session lasts its time to live (12 h by
/// default) unless revoked first, by the owner ([`OneTimeCodes::revoke`]) or by its own
/// page signing out. A code presented again after it was redeemed was seen by someone else
/// (the browser or whoever raced it): the session it gave is ended.
pub struct OneTimeCodes {
    ttl: Duration,
    session_ttl: Duration,
    inner: Mutex<Codes>,
}

/// A live dashboard session.
struct Session {
    /// Its public id (shown by `factory ui --sessions`; not a credential).
    id: String,
    /// The code redeemed for it.
    code: String,
    /// Its token, the credential.
    token: String,
    /// When it was opened (wall clock, shown).
    created_at: SystemTime,
    /// When it ends.
    expires: Instant,
}

/// One dashboard session as the owner sees it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionInfo {
    /// Its id, for `factory ui --revoke ID`.
    pub id: String,
    /// When it was opened (RFC 3339).
    pub created_at: String,
    /// When it ends unless revoked first (RFC 3339).
    pub expires_at: String,
}

#[derive(Default)]
struct Codes {
    /// Outstanding codes and when each expires.
    pending: Vec<(String, Instant)>,
    /// Live sessions, oldest first.
    sessions: Vec<Session>,
}

impl Codes {
    /// Forget expired codes and sessions.
    fn expire(&mut self, now: Instant) {
        self.pending.retain(|(_, expires)| *expires > now);
        self.sessions.retain(|s| s.expires > now);
    }
}

impl OneTimeCodes {
    /// No codes yet; each issued one lives `ttl`, each session `session_ttl`.
    pub fn new(ttl: Duration, session_ttl: Duration) -> OneTimeCodes {
        OneTimeCodes { ttl, session_ttl, inner: Mutex::new(Codes::default()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Codes> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new code (expired ones are forgotten; past [`MAX_CODES`], the oldest too).
    pub fn issue(&self) -> String {
        let code = random_secret();
        let now = Instant::now();
        let mut codes = self.lock();
        codes.expire(now);
        if codes.pending.len() >= MAX_CODES {
            codes.pending.remove(0);
        }
        codes.pending.push((code.clone(), now + self.ttl));
        code
    }

    /// Redeem `presented`: a new session token, once, for a code issued and not yet expired
    /// or redeemed. A code redeemed before ends the session it gave and gets `None`.
    pub fn redeem(&self, presented: &str) -> Option<String> {
        let now = Instant::now();
        let mut codes = self.lock();
        codes.expire(now);
        if let Some(at) = position(codes.pending.iter().map(|(code, _)| code), presented) {
            let (code, _) = codes.pending.remove(at);
            let token = random_secret();
            if codes.sessions.len() >= MAX_SESSIONS {
                codes.sessions.remove(0);
            }
            let id = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
            let session = Session {
                id,
                code,
                token: token.clone(),
                created_at: SystemTime::now(),
                expires: now + self.session_ttl,
            };
            codes.sessions.push(session);
            return Some(token);
        }
        if let Some(at) = position(codes.sessions.iter().map(|s| &s.code), presented) {
            codes.sessions.remove(at);
        }
        None
    }

    /// The id of the live session whose token the `Authorization` header value `presented`
    /// carries.
    pub fn session_of(&self, presented: Option<&str>) -> Option<String> {
        let token = presented.and_then(|p| p.strip_prefix("Bearer "))?;
        let mut codes = self.lock();
        codes.expire(Instant::now());
        position(codes.sessions.iter().map(|s| &s.token), token).map(|at| codes.sessions[at].id.clone())
    }

    /// Is the session `id` still live (not revoked, not expired)?
    pub fn is_live(&self, id: &str) -> bool {
        let mut codes = self.lock();
        codes.expire(Instant::now());
        codes.sessions.iter().any(|s| s.id == id)
    }

    /// Does the `Authorization` header value `presented` carry a live session token?
    #[cfg(test)]
    pub fn accepts(&self, presented: Option<&str>) -> bool {
        self.session_of(presented).is_some()
    }

    /// The live sessions, oldest first.
    pub fn sessions(&self) -> Vec<SessionInfo> {
        let now = Instant::now();
        let wall = SystemTime::now();
        let mut codes = self.lock();
        codes.expire(now);
        let shown = |t: SystemTime| humantime::format_rfc3339_seconds(t).to_string();
        codes
            .sessions
            .iter()
            .map(|s| SessionInfo {
                id: s.id.clone(),
                created_at: shown(s.created_at),
                expires_at: shown(wall + s.expires.saturating_duration_since(now)),
            })
            .collect()
    }

    /// End the session `id` (`None`: every session); how many ended.
    pub fn revoke(&self, id: Option<&str>) -> usize {
        let mut codes = self.lock();
        let before = codes.sessions.len();
        codes.sessions.retain(|s| id.is_some_and(|id| s.id != id));
        before - codes.sessions.len()
    }
}

/// Where `presented` is among `secrets`, every one compared in constant time.
fn position<'a>(secrets: impl Iterator<Item = &'a String>, presented: &str) -> Option<usize> {
    secrets.enumerate().fold(None, |found, (at, secret)| {
        if constant_time_eq(secret.as_bytes(), presented.as_bytes()) {
            Some(at)
        } else {
            found
        }
    })
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
        let bearer = Bearer::create(&path, None).expect("the token file");
        let token = std::fs::read_to_string(&path).expect("written");
        assert_eq!(token.len(), 64);
        assert!(bearer.accepts(Some(&format!("Bearer {token}"))));
        assert!(!bearer.accepts(Some(&format!("Bearer {}x", &token[..63]))));
        assert!(!bearer.accepts(Some(&token)));
        assert!(!bearer.accepts(None));
        assert!(
            constant_time_eq(b"abc", b"abc") && !constant_time_eq(b"abc", b"abd") && !constant_time_eq(b"a", b"ab")
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).expect("metadata").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // A new server replaces the token: the old one no longer works.
        let again = Bearer::create(&path, None).expect("a new token");
        assert!(!again.accepts(Some(&format!("Bearer {token}"))));
    }

    #[test]
    fn a_code_is_redeemed_once_and_only_before_it_expires() {
        let codes = OneTimeCodes::new(Duration::from_secs(60), SESSION_TTL);
        assert!(is_code_shaped(&codes.issue()) && !is_code_shaped("0123") && !is_code_shaped(&"g".repeat(CODE_CHARS)));
        let code = codes.issue();
        assert_eq!(codes.redeem("not-a-code"), None);
        assert_eq!(codes.redeem(""), None);
        let session = codes.redeem(&code).expect("redeemed once");
        assert_eq!(session.len(), 64);
        assert!(codes.accepts(Some(&format!("Bearer {session}"))));
        assert!(!codes.accepts(Some(&session)) && !codes.accepts(None) && !codes.accepts(Some("Bearer ")));
        // A second redemption fails and ends the session the first one gave.
        assert_eq!(codes.redeem(&code), None, "never twice");
        assert!(!codes.accepts(Some(&format!("Bearer {session}"))), "the session is ended");
        // Past MAX_CODES, the oldest is forgotten.
        let first = codes.issue();
        let rest: Vec<String> = (0..MAX_CODES).map(|_| codes.issue()).collect();
        assert_eq!(codes.redeem(&first), None);
        let sessions: Vec<String> = rest.iter().map(|c| codes.redeem(c).expect("redeemed")).collect();
        assert!(sessions.iter().all(|s| codes.accepts(Some(&format!("Bearer {s}")))));
        // Past MAX_SESSIONS, the oldest session ends.
        let newest = codes.redeem(&codes.issue()).expect("redeemed");
        assert!(!codes.accepts(Some(&format!("Bearer {}", sessions[0]))));
        assert!(codes.accepts(Some(&format!("Bearer {newest}"))));

        let short = OneTimeCodes::new(Duration::from_millis(50), SESSION_TTL);
        let code = short.issue();
        std::thread::sleep(Duration::from_millis(120));
        assert_eq!(short.redeem(&code), None, "an expired code fails");
    }

    #[test]
    fn sessions_are_listed_revoked_and_expire() {
        let codes = OneTimeCodes::new(Duration::from_secs(60), SESSION_TTL);
        let a = codes.redeem(&codes.issue()).expect("a");
        let b = codes.redeem(&codes.issue()).expect("b");
        let listed = codes.sessions();
        assert_eq!(listed.len(), 2);
        let id_a = codes.session_of(Some(&format!("Bearer {a}"))).expect("a is live");
        assert_eq!(listed[0].id, id_a);
        assert!(listed[0].expires_at > listed[0].created_at, "{listed:?}");
        assert_eq!(codes.revoke(Some("nope")), 0);
        assert_eq!(codes.revoke(Some(&id_a)), 1);
        assert!(!codes.accepts(Some(&format!("Bearer {a}"))) && codes.accepts(Some(&format!("Bearer {b}"))));
        assert_eq!(codes.revoke(None), 1);
        assert!(!codes.accepts(Some(&format!("Bearer {b}"))) && codes.sessions().is_empty());

        let short = OneTimeCodes::new(Duration::from_secs(60), Duration::from_millis(50));
        let c = short.redeem(&short.issue()).expect("c");
        assert!(short.accepts(Some(&format!("Bearer {c}"))));
        std::thread::sleep(Duration::from_millis(120));
        assert!(!short.accepts(Some(&format!("Bearer {c}"))), "an expired session is refused");
        assert!(short.sessions().is_empty());
    }
}
