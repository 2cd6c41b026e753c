//! The bearer token that guards `factory serve --http` and `factory mcp --http`: 256 random
//! bits made at start, written owner-only (0600) into the state directory for the owner's
//! clients to read, and checked on every request without stopping at the first difference.

use std::path::Path;

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

    /// Does the `Authorization` header value `presented` carry the token?
    pub fn accepts(&self, presented: Option<&str>) -> bool {
        constant_time_eq(presented.unwrap_or_default().as_bytes(), self.expected.as_bytes())
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
    }
}
