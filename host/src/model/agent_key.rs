//! The canonical identity of a subagent call: a sha256 over (prompt, label, schema, model)
//! with the schema in canonical JSON (sorted keys, no whitespace). Keyed by content, never by
//! position, so a resume after the factory's code changed still hits every unchanged call.

use sha2::{Digest, Sha256};

/// A hex sha256 naming one subagent call.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AgentKey(pub String);

impl AgentKey {
    /// The key of a call. `schema` must already be parsed: its canonical form is hashed, so
    /// `{"a":1, "b":2}` and `{"b":2,"a":1}` are the same call.
    ///
    /// ```
    /// use factory_host::AgentKey;
    /// use serde_json::json;
    ///
    /// let a = AgentKey::new("Find a bug", Some("finder:1"), Some(&json!({"a": 1, "b": 2})), None);
    /// let b = AgentKey::new("Find a bug", Some("finder:1"), Some(&json!({"b": 2, "a": 1})), None);
    /// let c = AgentKey::new("Find a bug", Some("finder:2"), Some(&json!({"a": 1, "b": 2})), None);
    /// assert_eq!(a, b);
    /// assert_ne!(a, c);
    /// ```
    pub fn new(prompt: &str, label: Option<&str>, schema: Option<&serde_json::Value>, model: Option<&str>) -> Self {
        // serde_json's default map is a BTreeMap, so `to_string` emits sorted keys: that is
        // the canonical form. Each field is length-prefixed so no two tuples collide.
        let schema = schema.map(|s| s.to_string());
        let mut hash = Sha256::new();
        for field in [Some(prompt), label, schema.as_deref(), model] {
            match field {
                None => hash.update(b"-"),
                Some(text) => {
                    hash.update(b"+");
                    hash.update((text.len() as u64).to_le_bytes());
                    hash.update(text.as_bytes());
                }
            }
        }
        AgentKey(hex::encode(hash.finalize()))
    }
}

impl std::fmt::Display for AgentKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn equal_calls_share_a_key_and_any_difference_splits_it() {
        let schema_a: serde_json::Value = serde_json::from_str(r#"{"type":"object","required":["a"]}"#).unwrap();
        let schema_b: serde_json::Value = serde_json::from_str(r#"{ "required": ["a"], "type": "object" }"#).unwrap();
        let base = AgentKey::new("p", Some("l"), Some(&schema_a), Some("m"));
        assert_eq!(base, AgentKey::new("p", Some("l"), Some(&schema_b), Some("m")));
        assert_ne!(base, AgentKey::new("p", Some("l2"), Some(&schema_a), Some("m")));
        assert_ne!(base, AgentKey::new("p2", Some("l"), Some(&schema_a), Some("m")));
        assert_ne!(base, AgentKey::new("p", Some("l"), None, Some("m")));
        assert_ne!(base, AgentKey::new("p", Some("l"), Some(&schema_a), None));
        // No label and an empty label are different calls; so are shifted boundaries.
        assert_ne!(AgentKey::new("p", None, None, None), AgentKey::new("p", Some(""), None, None));
        assert_ne!(AgentKey::new("ab", Some("c"), None, None), AgentKey::new("a", Some("bc"), None, None));
        assert_eq!(base.0.len(), 64);
        let _ = json!(null);
    }
}
