//! What a factory's author expects of a run (`NAME.test.json`, read by `factory test`): the
//! factory and cassette it tests, and cases, each with its args, the expected status,
//! assertions on the result (a JSON pointer that `equals` / `contains` / matches a `schema`
//! of the host's subset, [`crate::model::schema`]), on accounting (agents spawned, AI
//! credits) and on the journal (step keys present). Checking is plain data in, failures
//! out ([`Case::check`]): running the case is the caller's business.
//!
//! ```json
//! { "factory": "ideas.ts", "cassette": "ideas.cassette.jsonl",
//!   "cases": [ { "name": "two ideas", "args": { "ideas": 2 }, "status": "completed",
//!                "result": [ { "pointer": "/ideas", "schema": { "type": "array" } },
//!                            { "pointer": "/topic", "equals": "release notes" } ],
//!                "accounting": { "agentsSpawned": 4, "maxAiCredits": 1 },
//!                "journal": { "steps": ["report-v1"] } } ] }
//! ```

use crate::model::envelope::{RunEnvelope, RunStatus};
use crate::model::schema::Schema;
use serde::Deserialize;
use serde_json::Value;

/// The most bytes of a value a failure message quotes.
const QUOTE_BYTES: usize = 200;

/// A test file: `NAME.test.json`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestFile {
    /// The factory, relative to the test file's directory (a file, or `.` for the directory).
    #[serde(default)]
    pub factory: Option<String>,
    /// The cassette, relative to the test file's directory (default `NAME.cassette.jsonl`).
    #[serde(default)]
    pub cassette: Option<String>,
    /// The cases, run in order.
    pub cases: Vec<Case>,
}

/// One case: a run and what is expected of it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    /// Its name in reports.
    pub name: String,
    /// The run's args (default `{}`).
    #[serde(default)]
    pub args: Option<Value>,
    /// The expected status (default `completed`).
    #[serde(default)]
    pub status: Option<String>,
    /// Assertions on the result.
    #[serde(default)]
    pub result: Vec<Assertion>,
    /// Assertions on accounting.
    #[serde(default)]
    pub accounting: AccountingExpect,
    /// Assertions on the journal.
    #[serde(default)]
    pub journal: JournalExpect,
}

/// An assertion on the value at `pointer` in the result (RFC 6901; `""` is the whole result).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Assertion {
    /// Where in the result.
    pub pointer: String,
    /// The value there equals this.
    #[serde(default)]
    pub equals: Option<Value>,
    /// The value there contains this: a substring of a string, an element of an array, the
    /// members of an object (each equal).
    #[serde(default)]
    pub contains: Option<Value>,
    /// The value there matches this schema (the host's subset).
    #[serde(default)]
    pub schema: Option<Value>,
}

/// Assertions on a run's accounting.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AccountingExpect {
    /// Exactly this many subagents spawned.
    #[serde(default)]
    pub agents_spawned: Option<u64>,
    /// At most this many subagents spawned.
    #[serde(default)]
    pub max_agents_spawned: Option<u64>,
    /// At most this many AI credits.
    #[serde(default)]
    pub max_ai_credits: Option<f64>,
}

/// Assertions on a run's journal.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JournalExpect {
    /// Step keys the journal holds.
    #[serde(default)]
    pub steps: Vec<String>,
}

/// Why a test file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TestFileError {
    /// Not JSON of the test file's shape.
    #[error("not a test file: {0}")]
    Parse(#[from] serde_json::Error),
    /// An expected status the host does not have.
    #[error("case `{case}`: unknown status `{status}` (completed, error, halted, cancelled)")]
    Status { case: String, status: String },
    /// An assertion that asserts nothing, or whose pointer is malformed.
    #[error("case `{case}`, result assertion at `{pointer}`: {message}")]
    Assertion { case: String, pointer: String, message: String },
    /// A result assertion whose `schema` is no schema.
    #[error("case `{case}`, result assertion at `{pointer}`: invalid schema: {source}")]
    Schema {
        case: String,
        pointer: String,
        #[source]
        source: crate::model::schema::SchemaError,
    },
    /// No cases.
    #[error("the test file has no cases")]
    NoCases,
}

impl TestFile {
    /// Parse and check a test file's text: every status known, every assertion asserting
    /// something, every schema accepted by the host.
    pub fn parse(text: &str) -> Result<TestFile, TestFileError> {
        let file: TestFile = serde_json::from_str(text)?;
        if file.cases.is_empty() {
            return Err(TestFileError::NoCases);
        }
        for case in &file.cases {
            case.expected_status()?;
            for a in &case.result {
                let bad = |message: String| TestFileError::Assertion {
                    case: case.name.clone(),
                    pointer: a.pointer.clone(),
                    message,
                };
                if a.equals.is_none() && a.contains.is_none() && a.schema.is_none() {
                    return Err(bad("asserts nothing: give `equals`, `contains` or `schema`".into()));
                }
                if !a.pointer.is_empty() && !a.pointer.starts_with('/') {
                    return Err(bad("a JSON pointer is empty or starts with `/`".into()));
                }
                if let Some(schema) = &a.schema {
                    Schema::from_value(schema.clone()).map_err(|source| TestFileError::Schema {
                        case: case.name.clone(),
                        pointer: a.pointer.clone(),
                        source,
                    })?;
                }
            }
        }
        Ok(file)
    }
}

impl Case {
    /// The expected status.
    pub fn expected_status(&self) -> Result<RunStatus, TestFileError> {
        let status = self.status.as_deref().unwrap_or("completed");
        [RunStatus::Completed, RunStatus::Error, RunStatus::Halted, RunStatus::Cancelled]
            .into_iter()
            .find(|s| s.as_str() == status)
            .ok_or_else(|| TestFileError::Status { case: self.name.clone(), status: status.to_string() })
    }

    /// Every way `envelope` (and the journal's answer to `has_step`) falls short of the case;
    /// empty when it passes.
    pub fn check(&self, envelope: &RunEnvelope, has_step: &dyn Fn(&str) -> bool) -> Vec<String> {
        let mut failures = Vec::new();
        match self.expected_status() {
            Ok(expected) if expected != envelope.status => {
                let why = envelope
                    .failure
                    .as_ref()
                    .map(|f| format!(" ({}: {})", f.kind_type, quote(&f.message)))
                    .unwrap_or_default();
                failures.push(format!("status: expected {}, got {}{why}", expected.as_str(), envelope.status.as_str()));
            }
            Ok(_) => {}
            Err(e) => failures.push(e.to_string()),
        }
        let result = envelope.result.as_ref().and_then(|r| r.to_value().ok());
        for a in &self.result {
            let Some(value) = result.as_ref().and_then(|r| r.pointer(&a.pointer)) else {
                failures.push(format!("result{}: nothing there", shown(&a.pointer)));
                continue;
            };
            if let Some(expected) = &a.equals {
                if value != expected {
                    failures.push(format!(
                        "result{}: expected {}, got {}",
                        shown(&a.pointer),
                        quote_json(expected),
                        quote_json(value)
                    ));
                }
            }
            if let Some(part) = &a.contains {
                if !contains(value, part) {
                    failures.push(format!(
                        "result{}: {} does not contain {}",
                        shown(&a.pointer),
                        quote_json(value),
                        quote_json(part)
                    ));
                }
            }
            if let Some(schema) = &a.schema {
                match Schema::from_value(schema.clone()) {
                    Ok(schema) => {
                        if let Err(m) = schema.check(value) {
                            failures.push(format!("result{}: does not match the schema: {m}", shown(&a.pointer)));
                        }
                    }
                    Err(e) => failures.push(format!("result{}: invalid schema: {e}", shown(&a.pointer))),
                }
            }
        }
        let acc = &envelope.accounting;
        if let Some(n) = self.accounting.agents_spawned {
            if acc.agents_spawned != n {
                failures.push(format!("accounting: expected {n} agents spawned, got {}", acc.agents_spawned));
            }
        }
        if let Some(n) = self.accounting.max_agents_spawned {
            if acc.agents_spawned > n {
                failures.push(format!("accounting: expected at most {n} agents spawned, got {}", acc.agents_spawned));
            }
        }
        if let Some(max) = self.accounting.max_ai_credits {
            if acc.ai_credits() > max {
                failures.push(format!("accounting: expected at most {max} AI credits, got {}", acc.ai_credits()));
            }
        }
        for key in &self.journal.steps {
            if !has_step(key) {
                failures.push(format!("journal: no step `{}`", quote(key)));
            }
        }
        failures
    }
}

/// `value` contains `part`: a substring, an array element, or an object's members.
fn contains(value: &Value, part: &Value) -> bool {
    match (value, part) {
        (Value::String(s), Value::String(p)) => s.contains(p.as_str()),
        (Value::Array(items), _) => items.contains(part),
        (Value::Object(members), Value::Object(wanted)) => wanted.iter().all(|(k, v)| members.get(k) == Some(v)),
        _ => false,
    }
}

fn shown(pointer: &str) -> String {
    if pointer.is_empty() {
        String::new()
    } else {
        format!(" at `{pointer}`")
    }
}

/// At most [`QUOTE_BYTES`] of `text`, cut at a character boundary.
fn quote(text: &str) -> String {
    if text.len() <= QUOTE_BYTES {
        return text.to_string();
    }
    let mut end = QUOTE_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

fn quote_json(value: &Value) -> String {
    quote(&value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn contains_follows_the_value_kind() {
        assert!(contains(&json!("release notes"), &json!("notes")));
        assert!(!contains(&json!("release"), &json!("notes")));
        assert!(contains(&json!([1, {"a": 2}]), &json!({"a": 2})));
        assert!(contains(&json!({"a": 1, "b": 2}), &json!({"b": 2})));
        assert!(!contains(&json!({"a": 1}), &json!({"a": 2})));
        assert!(!contains(&json!(5), &json!(5)));
    }

    #[test]
    fn parse_refuses_what_asserts_nothing() {
        let empty = r#"{"cases":[{"name":"x","result":[{"pointer":"/a"}]}]}"#;
        assert!(matches!(TestFile::parse(empty), Err(TestFileError::Assertion { .. })));
        let status = r#"{"cases":[{"name":"x","status":"done"}]}"#;
        assert!(matches!(TestFile::parse(status), Err(TestFileError::Status { .. })));
        let unknown = r#"{"cases":[{"name":"x","expect":1}]}"#;
        assert!(matches!(TestFile::parse(unknown), Err(TestFileError::Parse(_))));
        assert!(matches!(TestFile::parse(r#"{"cases":[]}"#), Err(TestFileError::NoCases)));
        let schema = r#"{"cases":[{"name":"x","result":[{"pointer":"","schema":{"type":"thing"}}]}]}"#;
        let Err(e) = TestFile::parse(schema) else { panic!("an invalid schema was taken") };
        // The schema's own error is kept as the source, and named in the message.
        assert!(
            matches!(&e, TestFileError::Schema { source: crate::model::schema::SchemaError::UnknownType { .. }, .. }),
            "{e:?}"
        );
        let source = std::error::Error::source(&e).map(ToString::to_string).unwrap_or_default();
        assert!(source.contains("thing") && e.to_string().ends_with(&format!("invalid schema: {source}")), "{e}");
    }
}
