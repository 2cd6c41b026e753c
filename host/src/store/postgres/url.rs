//! The PostgreSQL store's URL: parsed into a connection config, and [`redact`]ed wherever it
//! is shown (errors, logs, `factory workers`), so a password never leaves the process.

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

/// Parse `url` into a tokio-postgres config; errors name the URL redacted.
pub fn config(url: &str) -> Result<tokio_postgres::Config, StoreError> {
    if !is_postgres_url(url) {
        return Err(StoreError::Url { url: redact(url), reason: "not a postgres:// URL".into() });
    }
    tokio_postgres::Config::from_str(url).map_err(|e| StoreError::Url { url: redact(url), reason: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        assert_eq!(redact("postgres://ann:s3cret@db:5432/factory"), "postgres://ann:***@db:5432/factory");
        assert_eq!(redact("postgres://ann@127.0.0.1:5/f"), "postgres://ann@127.0.0.1:5/f");
        assert_eq!(redact("postgresql://ann:p@ss@w@host/db?sslmode=disable&password=x"), "postgresql://ann:***@host/db");
        assert_eq!(redact("postgres://host"), "postgres://host");
        assert_eq!(redact("nonsense s3cret"), "(not a URL)");
        assert!(is_postgres_url("postgresql://x") && !is_postgres_url("/var/lib/x"));
        let error = config("postgres://ann:s3cret@h:notaport/db").expect_err("a bad port");
        assert!(!error.to_string().contains("s3cret"), "{error}");
    }
}
