//! The canonical identity of a subagent call: a sha256 over (prompt, label, schema, model)
//! with the schema in canonical JSON (sorted keys, no whitespace), and the call's soft limits
//! and its tuning (agent, reasoning effort, context tier) when it has any (a call without them
//! keeps the key it had before they existed, so older journals and cassettes still replay). Keyed by content, never by position, so a
//! resume after the factory's code changed still hits every unchanged call.

use crate::model::limits::AgentLimits;
use crate::model::tuning::AgentTuning;
use sha2::{Digest, Sha256};

/// Bytes of a call's key preimage [`AgentKey::with_limits`] gathers on the stack before it
/// hashes them; a longer one is hashed field by field.
const SHORT_PREIMAGE: usize = 256;

/// A hex sha256 naming one subagent call: its 64 characters held inline, so making one
/// allocates nothing ([`AgentKey::as_str`] borrows them).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct AgentKey([u8; 64]);

/// Hashed by its first 16 hex digits only (64 bits of a sha256, which no guest chooses):
/// a map keyed by agent keys hashes 16 bytes per lookup, not 64. Equal keys hash equal;
/// keys that share those digits are still told apart by `Eq`.
impl std::hash::Hash for AgentKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let [a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p, ..] = self.0;
        state.write_u64(u64::from_le_bytes([a, b, c, d, e, f, g, h]));
        state.write_u64(u64::from_le_bytes([i, j, k, l, m, n, o, p]));
    }
}

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
        Self::with_limits(prompt, label, schema, model, &AgentLimits::default())
    }

    /// The key of a call with soft limits `limits` (the effective ones: the call's own over
    /// the factory's defaults). Without any, the key is [`AgentKey::new`]'s.
    ///
    /// ```
    /// use factory_host::AgentKey;
    /// use factory_host::limits::AgentLimits;
    ///
    /// let plain = AgentKey::new("Review", Some("r"), None, None);
    /// assert_eq!(plain, AgentKey::with_limits("Review", Some("r"), None, None, &AgentLimits::default()));
    /// let bounded = AgentLimits { max_turns: Some(3), ..AgentLimits::default() };
    /// assert_ne!(plain, AgentKey::with_limits("Review", Some("r"), None, None, &bounded));
    /// ```
    pub fn with_limits(
        prompt: &str,
        label: Option<&str>,
        schema: Option<&serde_json::Value>,
        model: Option<&str>,
        limits: &AgentLimits,
    ) -> Self {
        Self::of(prompt, label, schema, model, limits, &AgentTuning::default())
    }

    /// The key of a call with soft limits and `tuning` (its agent, reasoning effort and
    /// context tier). Without any tuning, the key is [`AgentKey::with_limits`]'s.
    ///
    /// ```
    /// use factory_host::AgentKey;
    /// use factory_host::limits::AgentLimits;
    /// use factory_host::tuning::AgentTuning;
    ///
    /// let none = AgentLimits::default();
    /// let plain = AgentKey::new("Review", Some("r"), None, None);
    /// assert_eq!(plain, AgentKey::of("Review", Some("r"), None, None, &none, &AgentTuning::default()));
    /// let high = AgentTuning { reasoning_effort: Some("high".into()), ..AgentTuning::default() };
    /// assert_ne!(plain, AgentKey::of("Review", Some("r"), None, None, &none, &high));
    /// ```
    pub fn of(
        prompt: &str,
        label: Option<&str>,
        schema: Option<&serde_json::Value>,
        model: Option<&str>,
        limits: &AgentLimits,
        tuning: &AgentTuning,
    ) -> Self {
        // serde_json's default map is a BTreeMap, so `to_string` emits sorted keys: that is
        // the canonical form. Each field is length-prefixed so no two tuples collide.
        // SHA-256 through `sha2` (SHA-NI where the CPU has it: about half of `ring`'s time
        // on a short call in a release build), hex through `data-encoding` into the key's
        // own bytes.
        let schema = schema.map(|s| s.to_string());
        let turns = limits.max_turns.map(|n| n.to_string());
        // The duration is hashed by its exact bits (1.5 and 1.50 are the same f64).
        let duration = limits.max_duration_seconds.map(|d| format!("{:016x}", d.to_bits()));
        let fields = Fields {
            prompt,
            label,
            schema: schema.as_deref(),
            model,
            limits,
            turns: turns.as_deref(),
            duration: duration.as_deref(),
            tuning,
        };
        // A short call's fields are gathered on the stack and hashed at once (a fifth
        // faster than a hasher update per field); a longer one is streamed through.
        let mut short = [0u8; SHORT_PREIMAGE];
        let mut len = 0;
        fields.feed(&mut |bytes: &[u8]| {
            if let Some(room) = short.get_mut(len..len + bytes.len()) {
                room.copy_from_slice(bytes);
            }
            len += bytes.len();
        });
        let digest = match short.get(..len) {
            Some(whole) => Sha256::digest(whole),
            None => {
                let mut hash = Sha256::new();
                fields.feed(&mut |bytes: &[u8]| hash.update(bytes));
                hash.finalize()
            }
        };
        let mut hex = [0; 64];
        data_encoding::HEXLOWER.encode_mut(&digest, &mut hex);
        AgentKey(hex)
    }

    /// The key's 64 lowercase hex characters.
    pub fn as_str(&self) -> &str {
        // Written only by `HEXLOWER`, so ASCII; the fallback is never taken.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

/// The parts of a call's key, in the order they are hashed.
struct Fields<'a> {
    prompt: &'a str,
    label: Option<&'a str>,
    schema: Option<&'a str>,
    model: Option<&'a str>,
    limits: &'a AgentLimits,
    turns: Option<&'a str>,
    duration: Option<&'a str>,
    tuning: &'a AgentTuning,
}

impl Fields<'_> {
    /// Hand the preimage to `out` piece by piece: each field length-prefixed (`+` and its
    /// length as 8 little-endian bytes, then its bytes) or `-` when absent, so no two tuples
    /// collide. Generic over `out`, so each gathering is compiled with it inlined.
    fn feed<F: FnMut(&[u8])>(&self, out: &mut F) {
        let mut field = |field: Option<&str>| match field {
            None => out(b"-"),
            Some(text) => {
                let mut head = [b'+'; 9];
                head[1..].copy_from_slice(&(text.len() as u64).to_le_bytes());
                out(&head);
                out(text.as_bytes());
            }
        };
        for part in [Some(self.prompt), self.label, self.schema, self.model] {
            field(part);
        }
        if !self.limits.is_empty() {
            // Appended only when present: a call without soft limits keeps its old key.
            field(Some("soft-limits/1"));
            for part in [self.turns, self.duration, self.limits.wrap_up.as_deref()] {
                field(part);
            }
        }
        if !self.tuning.is_empty() {
            // Likewise: a call without tuning keeps its old key.
            field(Some("tuning/1"));
            let t = self.tuning;
            for part in [t.agent.as_deref(), t.reasoning_effort.as_deref(), t.context_tier.as_deref()] {
                field(part);
            }
        }
    }
}

impl std::fmt::Display for AgentKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Debug for AgentKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("AgentKey").field(&self.as_str()).finish()
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
        assert_eq!(base.as_str().len(), 64);
        assert!(base.as_str().bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        let _ = json!(null);
    }

    #[test]
    fn a_long_call_is_keyed_as_a_short_one_is() {
        // Keys computed apart from this code (Python's hashlib over the same length-prefixed
        // fields), on both sides of the stack buffer's 256 bytes: 256 bytes of preimage are
        // hashed at once, 257 and more field by field.
        let key = |prompt: &str, model: Option<&str>, limits: &AgentLimits| {
            AgentKey::with_limits(prompt, Some("l"), None, model, limits)
        };
        let none = AgentLimits::default();
        assert_eq!(
            key(&"x".repeat(235), None, &none).as_str(),
            "f2000a2e89b691fed32b855d30ef25c1320eb0ec19c7a08280e9dbdaf391c3a4"
        );
        assert_eq!(
            key(&"x".repeat(236), None, &none).as_str(),
            "589ce26b8c2c7b71d0be45d87e389a826005e82033692b1ed0523200a05ea34e"
        );
        let limits = AgentLimits { max_turns: Some(3), wrap_up: Some("wrap".into()), ..AgentLimits::default() };
        assert_eq!(
            key(&"x".repeat(300), Some("m"), &limits).as_str(),
            "c65d04e49fcabeec4b805423203dda6c85425fb7a2f53670775e28aba3eb2476"
        );
    }

    #[test]
    fn soft_limits_split_the_key_and_their_absence_keeps_the_old_one() {
        // The key of ("p", label "l", no schema, no model) as computed before soft limits
        // existed: journals and cassettes recorded then must still replay.
        assert_eq!(
            AgentKey::new("p", Some("l"), None, None).as_str(),
            "4ab5a2f523eae875a139f0cd9bdd1e3a71f80ea7f335e124c32a1d1cdc3bc9cc"
        );
        let key = |limits: AgentLimits| AgentKey::with_limits("p", Some("l"), None, None, &limits);
        let turns = AgentLimits { max_turns: Some(3), ..AgentLimits::default() };
        let more_turns = AgentLimits { max_turns: Some(4), ..AgentLimits::default() };
        let duration = AgentLimits { max_duration_seconds: Some(3.0), ..AgentLimits::default() };
        let wrap = AgentLimits { wrap_up: Some("3".into()), ..AgentLimits::default() };
        let all = [key(AgentLimits::default()), key(turns.clone()), key(more_turns), key(duration), key(wrap)];
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(key(turns.clone()), key(turns));
    }
}
