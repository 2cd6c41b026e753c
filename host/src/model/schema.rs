//! The `schema` of an agent call: parsing it, checking a model's reply against it, and
//! building the smallest value that satisfies it (for the offline dry-run backend). Per the
//! factory contract this is a structural subset of JSON Schema, not a validator: `type`,
//! `required`, `enum`, `const`, recursive `properties`/`items`, `anyOf`, `oneOf` (treated as
//! anyOf: at least one branch) and `allOf` are honoured; boolean schemas and every other
//! keyword are accepted without being inspected or enforced.
//!
//! Every operation is bounded, because schemas come from guests and replies from models:
//! a schema has at most [`MAX_NODES`] sub-schemas (else [`SchemaError::TooLarge`]); one
//! check visits at most [`CHECK_BUDGET`] schema nodes (else a [`Mismatch`] saying so, which
//! a reply check treats like any mismatch); the minimal-instance search spends at most
//! [`SOLVE_BUDGET`] steps (else [`SolveExhausted`]); and every message quotes at most a
//! few hundred bytes of the value or the schema, however many branches failed.

use std::collections::BTreeMap;

use serde_json::{Map, Number, Value};

/// A parsed schema, ready to check values against.
#[derive(Debug, Clone)]
pub struct Schema {
    raw: Value,
    root: Node,
}

/// Why a schema was rejected.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// The schema text is not JSON at all.
    #[error("schema is not valid JSON: {0}")]
    InvalidJson(#[from] serde_json::Error),
    /// A `type` names something other than the seven JSON Schema types.
    #[error("{path}: unknown type {}", quote(.name))]
    UnknownType { path: String, name: String },
    /// The schema has more sub-schemas than [`MAX_NODES`].
    #[error("the schema has more than {limit} sub-schemas")]
    TooLarge { limit: usize },
    /// The schema is nested deeper than [`crate::model::json::MAX_DEPTH`].
    #[error("the schema is nested {depth} deep, over the limit of {limit}")]
    TooDeep { depth: usize, limit: usize },
    /// An honoured keyword (or a nested schema) has the wrong shape.
    #[error("{path}: expected {expected}, got {got}")]
    Malformed { path: String, expected: &'static str, got: String },
}

impl SchemaError {
    /// The path of the offending keyword inside the schema, if the schema was JSON.
    pub fn path(&self) -> Option<&str> {
        match self {
            SchemaError::InvalidJson(_) | SchemaError::TooLarge { .. } | SchemaError::TooDeep { .. } => None,
            SchemaError::UnknownType { path, .. } | SchemaError::Malformed { path, .. } => Some(path),
        }
    }
}

/// Why a value (or a reply) does not satisfy a schema: where, what was expected, what was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: expected {expected}, got {got}")]
pub struct Mismatch {
    /// Location in the value, e.g. `$.findings[2].title`.
    pub path: String,
    /// What the schema asks for at that location.
    pub expected: String,
    /// What the value has there.
    pub got: String,
}

/// Sub-schemas (objects and booleans, the root included) one schema may have.
pub const MAX_NODES: usize = 10_000;

/// Schema nodes one check may visit (each visit of a sub-schema for a value, and each
/// `enum`/`const` comparison weighed by the size of the schema's value).
pub const CHECK_BUDGET: usize = 1_000_000;

/// Steps the minimal-instance search may spend (each branch choice weighed by the state it
/// copies, each candidate check as in [`CHECK_BUDGET`]).
pub const SOLVE_BUDGET: usize = 1_000_000;

/// Bytes of a value or schema text quoted in a message.
const QUOTE_LIMIT: usize = 80;

/// Bytes of branch explanations one `anyOf`/`oneOf` mismatch carries.
const REASONS_LIMIT: usize = 512;

/// The minimal-instance search ran out of its [`SOLVE_BUDGET`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the schema is too complex to solve within {limit} search steps")]
pub struct SolveExhausted {
    /// The budget that ran out.
    pub limit: usize,
}

/// Work left for one operation; once spent, stays spent.
struct Budget {
    left: usize,
}

impl Budget {
    fn new(left: usize) -> Self {
        Budget { left }
    }

    /// Spend `n`; false (and nothing left) when there was not enough.
    fn spend(&mut self, n: usize) -> bool {
        match self.left.checked_sub(n) {
            Some(left) => {
                self.left = left;
                true
            }
            None => {
                self.left = 0;
                false
            }
        }
    }

    fn spent(&self) -> bool {
        self.left == 0
    }
}

impl Schema {
    /// Parses a schema from JSON text.
    pub fn parse(text: &str) -> Result<Schema, SchemaError> {
        let depth = crate::model::json::depth(text);
        if depth > crate::model::json::MAX_DEPTH {
            return Err(SchemaError::TooDeep { depth, limit: crate::model::json::MAX_DEPTH });
        }
        Schema::from_value(serde_json::from_str(text)?)
    }

    /// Parses a schema from an already-decoded JSON value.
    pub fn from_value(raw: Value) -> Result<Schema, SchemaError> {
        let mut nodes = 0;
        let root = parse_node(&raw, &mut Vec::new(), &mut nodes)?;
        Ok(Schema { raw, root })
    }

    /// The schema exactly as given.
    pub fn as_value(&self) -> &Value {
        &self.raw
    }

    /// Checks `value` against the honoured keywords.
    pub fn check(&self, value: &Value) -> Result<(), Mismatch> {
        let mut budget = Budget::new(CHECK_BUDGET);
        self.root.check(value, &mut Vec::new(), &mut budget)
    }

    /// Parses a model's reply as JSON (allowing surrounding whitespace and one markdown code
    /// fence) and checks it.
    pub fn parse_reply(&self, text: &str) -> Result<Value, Mismatch> {
        let value: Value = serde_json::from_str(strip_code_fence(text)).map_err(|e| Mismatch {
            path: "$".to_owned(),
            expected: "a JSON value".to_owned(),
            got: format!("text that is not JSON ({e})"),
        })?;
        self.check(&value)?;
        Ok(value)
    }

    /// The smallest value satisfying the schema, or null when no value can satisfy it (or
    /// the search runs out of its budget: see [`Schema::solve`]).
    pub fn minimal_instance(&self) -> Value {
        self.solve().unwrap_or(Value::Null)
    }

    /// The smallest value satisfying the schema (null when none can), or
    /// [`SolveExhausted`] when the search needs more than [`SOLVE_BUDGET`] steps.
    pub fn solve(&self) -> Result<Value, SolveExhausted> {
        match &self.root {
            Node::Any => Ok(Value::Null),
            Node::Rule(rule) => {
                let mut budget = Budget::new(SOLVE_BUDGET);
                let found = solve(Vec::new(), vec![rule], Vec::new(), &mut budget);
                match found {
                    Some(value) => Ok(value),
                    None if budget.spent() => Err(SolveExhausted { limit: SOLVE_BUDGET }),
                    None => Ok(Value::Null),
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Parsed form

/// A schema node. Boolean schemas and schemas without honoured keywords accept anything.
#[derive(Debug, Clone)]
enum Node {
    Any,
    Rule(Box<Rule>),
}

impl Node {
    fn rule(&self) -> Option<&Rule> {
        match self {
            Node::Any => None,
            Node::Rule(rule) => Some(rule.as_ref()),
        }
    }

    fn check<'s>(&'s self, value: &Value, path: &mut Vec<Seg<'s>>, budget: &mut Budget) -> Result<(), Mismatch> {
        match self {
            Node::Any => Ok(()),
            Node::Rule(rule) => rule.check(value, path, budget),
        }
    }
}

/// The honoured keywords of one object schema; absent keywords constrain nothing.
#[derive(Debug, Clone, Default)]
struct Rule {
    types: Option<Vec<Kind>>,
    required: Vec<String>,
    enumeration: Option<Vec<Value>>,
    constant: Option<Value>,
    properties: BTreeMap<String, Node>,
    items: Option<Node>,
    all_of: Vec<Node>,
    any_of: Option<Vec<Node>>,
    one_of: Option<Vec<Node>>,
    /// What comparing a value with `enum` and `const` may cost (their JSON nodes).
    eq_cost: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Object,
    Array,
    String,
    Number,
    Integer,
    Boolean,
    Null,
}

impl Kind {
    fn from_name(name: &str) -> Option<Kind> {
        Some(match name {
            "object" => Kind::Object,
            "array" => Kind::Array,
            "string" => Kind::String,
            "number" => Kind::Number,
            "integer" => Kind::Integer,
            "boolean" => Kind::Boolean,
            "null" => Kind::Null,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Object => "object",
            Kind::Array => "array",
            Kind::String => "string",
            Kind::Number => "number",
            Kind::Integer => "integer",
            Kind::Boolean => "boolean",
            Kind::Null => "null",
        }
    }

    fn matches(self, value: &Value) -> bool {
        match (self, value) {
            (Kind::Object, Value::Object(_))
            | (Kind::Array, Value::Array(_))
            | (Kind::String, Value::String(_))
            | (Kind::Number, Value::Number(_))
            | (Kind::Boolean, Value::Bool(_))
            | (Kind::Null, Value::Null) => true,
            (Kind::Integer, Value::Number(n)) => is_integer(n),
            _ => false,
        }
    }

    /// The smallest value of this kind before nested constraints are applied.
    fn minimal(self, parts: &[&Rule], budget: &mut Budget) -> Value {
        match self {
            Kind::Object => minimal_object(parts, budget),
            Kind::Array => Value::Array(Vec::new()),
            Kind::String => Value::String(String::new()),
            // 0 is an integer, so it also satisfies a part that only allows integers.
            Kind::Number | Kind::Integer => Value::from(0),
            Kind::Boolean => Value::Bool(false),
            Kind::Null => Value::Null,
        }
    }
}

mod check;
mod parse;
mod render;
mod solve;
#[cfg(test)]
mod tests;

use check::*;
use parse::*;
use render::*;
use solve::*;
