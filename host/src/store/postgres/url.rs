//! The PostgreSQL store's URL: parsed into a connection config, and [`redact`]ed wherever it
//! is shown (errors, logs, `factory workers`), so a password never leaves the process. A URL
//! without a password takes one from the caller (`--store-password-file`), else
//! `PGPASSWORD`, else the password file libpq reads (`PGPASSFILE`, else `~/.pgpass`:
//! `host:port:database:user:password` lines, `*` matching anything, `\:` and `\\` escapes;
//! a file others can read is ignored, as libpq does), which tokio-postgres does not read
//! itself ([`config`]).

use crate::store::StoreError;
use std::str::FromStr;

/// Whether `spec` names a PostgreSQL store (`postgres://` or `postgresql://`).
pub fn is_postgres_url(spec: &str) -> bool {
    spec.starts_with("postgres://") || spec.starts_with("postgresql://")
}

/// `url` with any password replaced by `***` (and nothing else changed); a text that does
/// not parse as a URL is shown only up to its scheme.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return "(not a URL)".into() };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(at) => rest.split_at(at),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
            let password = if userinfo.contains(':') { ":***" } else { "" };
            // Query parameters may carry a password too (`?password=`): dropped.
            let path = tail.split_once('?').map_or(tail, |(path, _)| path);
            format!("{scheme}://{user}{password}@{host}{path}")
        }
        None => {
            let path = tail.split_once('?').map_or(tail, |(path, _)| path);
            format!("{scheme}://{authority}{path}")
        }
    }
}

/// Parse `url` into a tokio-postgres config, as it says; errors name the URL redacted.
fn parse(url: &str) -> Result<tokio_postgres::Config, StoreError> {
    if !is_postgres_url(url) {
        return Err(StoreError::Url { url: redact(url), reason: "not a postgres:// URL".into() });
    }
    tokio_postgres::Config::from_str(url).map_err(|e| StoreError::UrlParse { url: redact(url), source: e.into() })
}

/// Whether `url` itself carries a password (in its user info or a `password=` parameter).
pub fn has_password(url: &str) -> bool {
    parse(url).is_ok_and(|config| config.get_password().is_some())
}

/// Parse `url` into a tokio-postgres config; errors name the URL redacted. Without a
/// password in the URL: `password`, else `PGPASSWORD`, else the matching line of the
/// password file ([`pgpass_file`]).
pub fn config(url: &str, password: Option<&str>) -> Result<tokio_postgres::Config, StoreError> {
    let mut config = parse(url)?;
    if config.get_password().is_none() {
        let found = password
            .map(str::to_string)
            .or_else(|| std::env::var("PGPASSWORD").ok().filter(|p| !p.is_empty()))
            .or_else(|| pgpass_file().and_then(|text| pgpass_lookup(&text, &config)));
        if let Some(password) = found {
            config.password(password);
        }
    }
    Ok(config)
}

/// The longest password file read.
const MAX_PGPASS_BYTES: u64 = 64 * 1024;

/// The text of the password file: `PGPASSFILE`, else `~/.pgpass`; `None` when there is none,
/// it is not a regular file, or others can read it (ignored with a warning, as libpq does).
fn pgpass_file() -> Option<String> {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;
    let path = match std::env::var_os("PGPASSFILE").filter(|p| !p.is_empty()) {
        Some(path) => std::path::PathBuf::from(path),
        None => std::path::PathBuf::from(std::env::var_os("HOME")?).join(".pgpass"),
    };
    let file = std::fs::File::open(&path).ok()?;
    let metadata = file.metadata().ok()?;
    if !metadata.is_file() {
        return None;
    }
    if metadata.permissions().mode() & 0o077 != 0 {
        tracing::warn!("password file {} has group or world access; ignored (chmod 600 it)", path.display());
        return None;
    }
    let mut text = String::new();
    file.take(MAX_PGPASS_BYTES).read_to_string(&mut text).ok()?;
    Some(text)
}

/// The password of the first line of password file `text` matching `config`'s first host,
/// port, database and user (`*` matches anything; `localhost` stands for a Unix socket).
fn pgpass_lookup(text: &str, config: &tokio_postgres::Config) -> Option<String> {
    let host = match config.get_hosts().first()? {
        tokio_postgres::config::Host::Tcp(name) => name.clone(),
        tokio_postgres::config::Host::Unix(_) => "localhost".to_string(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432).to_string();
    let user = config.get_user()?;
    let db = config.get_dbname().unwrap_or(user);
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let fields = pgpass_fields(line);
        let [h, p, d, u, password] = fields.as_slice() else { continue };
        let matches = |field: &String, value: &str| field == "*" || field == value;
        if matches(h, &host) && matches(p, &port) && matches(d, db) && matches(u, user) {
            return Some(password.clone());
        }
    }
    None
}

/// The `:`-separated fields of a password file line, `\:` and `\\` unescaped.
fn pgpass_fields(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let (Some(next), Some(field)) = (chars.next(), fields.last_mut()) {
                    field.push(next);
                }
            }
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => {
                if let Some(field) = fields.last_mut() {
                    field.push(c);
                }
            }
        }
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        assert_eq!(redact("postgres://ann:s3cret@db:5432/factory"), "postgres://ann:***@db:5432/factory");
        assert_eq!(redact("postgres://ann@127.0.0.1:5/f"), "postgres://ann@127.0.0.1:5/f");
        assert_eq!(
            redact("postgresql://ann:p@ss@w@host/db?sslmode=disable&password=x"),
            "postgresql://ann:***@host/db"
        );
        assert_eq!(redact("postgres://host"), "postgres://host");
        assert_eq!(redact("nonsense s3cret"), "(not a URL)");
        assert!(is_postgres_url("postgresql://x") && !is_postgres_url("/var/lib/x"));
        let error = config("postgres://ann:s3cret@h:notaport/db", None).expect_err("a bad port");
        assert!(!error.to_string().contains("s3cret"), "{error}");
        assert!(has_password("postgres://ann:s3cret@h/db") && has_password("postgres://ann@h/db?password=x"));
        assert!(!has_password("postgres://ann@h/db"));
    }

    #[test]
    fn a_password_comes_from_the_caller_or_the_password_file() {
        let url = "postgres://ann@db.internal:5433/factory";
        assert_eq!(config(url, Some("given")).unwrap().get_password(), Some(&b"given"[..]));
        // The URL's own password wins over the one given.
        assert_eq!(config("postgres://ann:inurl@h/db", Some("given")).unwrap().get_password(), Some(&b"inurl"[..]));
        let parsed = parse(url).unwrap();
        let text = "# comment\nother:5433:factory:ann:no\ndb.internal:5432:factory:ann:wrong-port\n\
                    db.internal:5433:*:ann:p\\:w\\\\d\n*:*:*:*:fallback\n";
        assert_eq!(pgpass_lookup(text, &parsed).as_deref(), Some("p:w\\d"));
        assert_eq!(pgpass_lookup("*:*:*:*:fallback\n", &parsed).as_deref(), Some("fallback"));
        assert_eq!(pgpass_lookup("*:*:*:bob:x\n", &parsed), None);
    }
}
