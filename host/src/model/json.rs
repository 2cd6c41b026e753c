//! Guest JSON inside host records: [`RawJson`] keeps a value a guest produced (a run's
//! result, a factory's args schema) as the exact JSON text it crossed the boundary with, and
//! [`MAX_DEPTH`] is the one nesting rule applied to every such value when it crosses.
//!
//! Why opaque: a host record (a run record, a registration) wraps guest JSON in objects of
//! its own. Parsed as a tree, a value nested just under a parser's recursion limit would
//! push the record over it, and the record could never be read again. Kept as text, the
//! record's reader skips over the value without recursing (serde_json reads a raw value
//! with an iterative scan), so no guest value can make a record unreadable; the value is
//! parsed only where someone asks for it, at its own depth.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

/// The deepest nesting of arrays and objects a guest value may have when it crosses into
/// the host (results, step values, schemas), and the ceiling of
/// `SandboxLimits::max_json_depth`. Well under serde_json's recursion
/// limit of 128, so a value nested this deep still parses inside every envelope, record and
/// wire frame the host (or a client in any language) wraps around it.
pub const MAX_DEPTH: usize = 64;

/// A JSON value kept as its text. Serializes verbatim; deserializes without a depth limit
/// (it is not parsed into a tree).
#[derive(Clone)]
pub struct RawJson(Box<RawValue>);

/// Any JSON value: its schema is the empty one.
impl schemars::JsonSchema for RawJson {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "AnyJson".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "description": "any JSON value (a guest's, kept as its text)" })
    }
}

/// Text that is not one JSON value.
#[derive(Debug, thiserror::Error)]
#[error("not JSON: {0}")]
pub struct NotJson(#[source] serde_json::Error);

impl RawJson {
    /// Keep `text` if it is one JSON value (checked by a scan, not a parse into a tree).
    pub fn from_text(text: impl Into<String>) -> Result<RawJson, NotJson> {
        RawValue::from_string(text.into()).map(RawJson).map_err(NotJson)
    }

    /// The text of a value (always valid JSON).
    pub fn from_value(value: &serde_json::Value) -> RawJson {
        // A `Value` always serializes; its text is one JSON value.
        match serde_json::value::to_raw_value(value) {
            Ok(raw) => RawJson(raw),
            Err(_) => RawJson(RawValue::NULL.to_owned()),
        }
    }

    /// The JSON text.
    pub fn get(&self) -> &str {
        self.0.get()
    }

    /// Parse it into a tree (fails only for a value nested deeper than serde_json's
    /// recursion limit, which no value that crossed the boundary is).
    pub fn to_value(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::from_str(self.0.get())
    }

    /// Parse it into `T`.
    pub fn parse<'a, T: Deserialize<'a>>(&'a self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.0.get())
    }
}

impl std::fmt::Debug for RawJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.get())
    }
}

impl std::fmt::Display for RawJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.get())
    }
}

/// Equal when the texts are equal (no normalisation: the host keeps what the guest sent).
impl PartialEq for RawJson {
    fn eq(&self, other: &Self) -> bool {
        self.0.get() == other.0.get()
    }
}

/// Equal when the text parses to `other` (tests and callers that hold a tree).
impl PartialEq<serde_json::Value> for RawJson {
    fn eq(&self, other: &serde_json::Value) -> bool {
        self.to_value().is_ok_and(|v| &v == other)
    }
}

impl Serialize for RawJson {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RawJson {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Box::<RawValue>::deserialize(deserializer).map(RawJson)
    }
}

/// The deepest nesting of arrays and objects in JSON text (strings skipped), computed
/// without parsing so a hostile value costs one linear scan.
pub fn depth(text: &str) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for b in text.bytes() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_counts_nesting_outside_strings() {
        assert_eq!(depth("1"), 0);
        assert_eq!(depth(r#"{"a":[1,{"b":[]}]}"#), 4);
        assert_eq!(depth(r#"["[[[[", "\"{{{"]"#), 1);
        assert_eq!(depth(&"[".repeat(500)), 500);
    }

    #[test]
    fn a_record_holding_a_value_of_any_depth_reads_back() {
        #[derive(Serialize, Deserialize)]
        struct Outer {
            inner: Inner,
        }
        #[derive(Serialize, Deserialize)]
        struct Inner {
            value: RawJson,
        }
        // Deeper than serde_json's own limit: a tree parse of the record would fail.
        let deep = format!("{}1{}", "[".repeat(5000), "]".repeat(5000));
        let record = Outer { inner: Inner { value: RawJson::from_text(deep.clone()).unwrap() } };
        let bytes = serde_json::to_vec(&record).unwrap();
        let back: Outer = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(back.inner.value.get(), deep);
        assert!(back.inner.value.to_value().is_err(), "a tree parse of it hits the recursion limit");
    }

    #[test]
    fn text_that_is_not_one_value_is_refused() {
        assert!(RawJson::from_text("{").is_err());
        assert!(RawJson::from_text("1 2").is_err());
        assert!(RawJson::from_text(" [1] ").is_ok());
    }

    #[test]
    fn compares_with_a_tree() {
        let raw = RawJson::from_text(r#"{"a": [1, 2]}"#).unwrap();
        assert!(raw == serde_json::json!({"a": [1, 2]}));
        assert_eq!(RawJson::from_value(&serde_json::json!({"a": 1})).get(), r#"{"a":1}"#);
    }
}
