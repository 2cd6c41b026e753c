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

// ---------------------------------------------------------------------------------------
// Parsing

/// One step of a path, inside a schema or inside a checked value.
#[derive(Debug, Clone, Copy)]
enum Seg<'a> {
    Key(&'a str),
    Index(usize),
}

fn parse_node<'v>(value: &'v Value, path: &mut Vec<Seg<'v>>, nodes: &mut usize) -> Result<Node, SchemaError> {
    *nodes += 1;
    if *nodes > MAX_NODES {
        return Err(SchemaError::TooLarge { limit: MAX_NODES });
    }
    match value {
        Value::Bool(_) => Ok(Node::Any),
        Value::Object(map) => Ok(Node::Rule(Box::new(parse_rule(map, path, nodes)?))),
        other => Err(malformed(path, "a schema (object or boolean)", kind_of(other))),
    }
}

fn parse_rule<'v>(
    map: &'v Map<String, Value>,
    path: &mut Vec<Seg<'v>>,
    nodes: &mut usize,
) -> Result<Rule, SchemaError> {
    let mut rule = Rule::default();
    // Only honoured keywords are looked at; anything else in `map` is never inspected.
    for (key, value) in map {
        path.push(Seg::Key(key));
        match key.as_str() {
            "type" => rule.types = Some(parse_types(value, path)?),
            "required" => rule.required = parse_required(value, path)?,
            "enum" => match value {
                Value::Array(values) if !values.is_empty() => rule.enumeration = Some(values.clone()),
                // An empty enum matches nothing: almost certainly a mistake in the factory.
                Value::Array(_) => return Err(malformed(path, "a non-empty array", "an empty array")),
                other => return Err(malformed(path, "a non-empty array", kind_of(other))),
            },
            "const" => rule.constant = Some(value.clone()),
            "properties" => match value {
                Value::Object(props) => {
                    for (name, schema) in props {
                        path.push(Seg::Key(name));
                        rule.properties.insert(name.clone(), parse_node(schema, path, nodes)?);
                        path.pop();
                    }
                }
                other => return Err(malformed(path, "an object of schemas", kind_of(other))),
            },
            "items" => match value {
                // The tuple form is outside the subset, so it is ignored rather than enforced.
                Value::Array(_) => {}
                other => rule.items = Some(parse_node(other, path, nodes)?),
            },
            "allOf" => rule.all_of = parse_branches(value, path, nodes)?,
            "anyOf" => rule.any_of = Some(parse_branches(value, path, nodes)?),
            "oneOf" => rule.one_of = Some(parse_branches(value, path, nodes)?),
            _ => {}
        }
        path.pop();
    }
    let enum_cost: usize = rule.enumeration.iter().flatten().map(json_nodes).sum();
    rule.eq_cost = enum_cost.saturating_add(rule.constant.as_ref().map_or(0, json_nodes));
    Ok(rule)
}

fn parse_types<'v>(value: &'v Value, path: &mut Vec<Seg<'v>>) -> Result<Vec<Kind>, SchemaError> {
    const EXPECTED: &str = "a type name or a non-empty array of type names";
    match value {
        Value::String(name) => Ok(vec![parse_kind(name, path)?]),
        Value::Array(names) if names.is_empty() => Err(malformed(path, EXPECTED, "an empty array")),
        Value::Array(names) => {
            let mut kinds = Vec::with_capacity(names.len());
            for (i, name) in names.iter().enumerate() {
                path.push(Seg::Index(i));
                match name {
                    Value::String(name) => kinds.push(parse_kind(name, path)?),
                    other => return Err(malformed(path, "a type name", kind_of(other))),
                }
                path.pop();
            }
            Ok(kinds)
        }
        other => Err(malformed(path, EXPECTED, kind_of(other))),
    }
}

fn parse_kind(name: &str, path: &[Seg<'_>]) -> Result<Kind, SchemaError> {
    Kind::from_name(name).ok_or_else(|| SchemaError::UnknownType { path: schema_path(path), name: name.to_owned() })
}

fn parse_required<'v>(value: &'v Value, path: &mut Vec<Seg<'v>>) -> Result<Vec<String>, SchemaError> {
    let Value::Array(names) = value else {
        return Err(malformed(path, "an array of property names", kind_of(value)));
    };
    let mut required = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        match name {
            Value::String(name) => required.push(name.clone()),
            other => {
                path.push(Seg::Index(i));
                return Err(malformed(path, "a property name (string)", kind_of(other)));
            }
        }
    }
    Ok(required)
}

fn parse_branches<'v>(value: &'v Value, path: &mut Vec<Seg<'v>>, nodes: &mut usize) -> Result<Vec<Node>, SchemaError> {
    const EXPECTED: &str = "a non-empty array of schemas";
    match value {
        // Empty branch lists are invalid JSON Schema and would make anyOf unsatisfiable.
        Value::Array(branches) if branches.is_empty() => Err(malformed(path, EXPECTED, "an empty array")),
        Value::Array(branches) => {
            let mut parsed = Vec::with_capacity(branches.len());
            for (i, branch) in branches.iter().enumerate() {
                path.push(Seg::Index(i));
                parsed.push(parse_node(branch, path, nodes)?);
                path.pop();
            }
            Ok(parsed)
        }
        other => Err(malformed(path, EXPECTED, kind_of(other))),
    }
}

fn malformed(path: &[Seg<'_>], expected: &'static str, got: &str) -> SchemaError {
    SchemaError::Malformed { path: schema_path(path), expected, got: got.to_owned() }
}

// ---------------------------------------------------------------------------------------
// Checking

/// The JSON nodes of a value (itself, and every element and member, recursively).
fn json_nodes(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(json_nodes).sum::<usize>(),
        Value::Object(map) => 1 + map.values().map(json_nodes).sum::<usize>(),
        _ => 1,
    }
}

/// The mismatch of a check that ran out of its budget.
fn too_costly(path: &[Seg<'_>]) -> Mismatch {
    mismatch(
        path,
        format!("a value checkable within {CHECK_BUDGET} schema-node visits"),
        "one that needs more (the schema or the value is too large)".to_owned(),
    )
}

impl Rule {
    fn check<'s>(&'s self, value: &Value, path: &mut Vec<Seg<'s>>, budget: &mut Budget) -> Result<(), Mismatch> {
        if !budget.spend(1usize.saturating_add(self.eq_cost)) {
            return Err(too_costly(path));
        }
        if let Some(types) = &self.types {
            if !types.iter().any(|kind| kind.matches(value)) {
                let got = match value {
                    // "got number" alone would be confusing next to "expected integer".
                    Value::Number(n) if types.contains(&Kind::Integer) => format!("number {n}"),
                    _ => kind_of(value).to_owned(),
                };
                return Err(mismatch(path, join_kinds(types), got));
            }
        }
        if let Some(constant) = &self.constant {
            if !json_eq(constant, value) {
                return Err(mismatch(path, render(constant), render(value)));
            }
        }
        if let Some(values) = &self.enumeration {
            if !values.iter().any(|allowed| json_eq(allowed, value)) {
                let expected = format!("one of {}", render_slice(values));
                return Err(mismatch(path, expected, render(value)));
            }
        }
        // `required` and `properties` only constrain objects, `items` only arrays.
        if let Value::Object(object) = value {
            if let Some(missing) = self.required.iter().find(|name| !object.contains_key(*name)) {
                let expected = format!("required property {}", quote(missing));
                return Err(mismatch(path, expected, "an object without it".to_owned()));
            }
            for (name, node) in &self.properties {
                if let Some(child) = object.get(name) {
                    path.push(Seg::Key(name));
                    node.check(child, path, budget)?;
                    path.pop();
                }
            }
        }
        if let (Some(node), Value::Array(elements)) = (&self.items, value) {
            for (i, element) in elements.iter().enumerate() {
                path.push(Seg::Index(i));
                node.check(element, path, budget)?;
                path.pop();
            }
        }
        for branch in &self.all_of {
            branch.check(value, path, budget)?;
        }
        if let Some(branches) = &self.any_of {
            check_any("anyOf", branches, value, path, budget)?;
        }
        if let Some(branches) = &self.one_of {
            check_any("oneOf", branches, value, path, budget)?;
        }
        Ok(())
    }
}

/// At least one branch must match; `oneOf` deliberately goes through here too. The
/// explanation quotes branches only up to [`REASONS_LIMIT`] bytes, so nested combinators
/// cannot multiply message sizes.
fn check_any<'s>(
    keyword: &str,
    branches: &'s [Node],
    value: &Value,
    path: &mut Vec<Seg<'s>>,
    budget: &mut Budget,
) -> Result<(), Mismatch> {
    let depth = path.len();
    let mut reasons = String::new();
    let mut only = None;
    for (i, branch) in branches.iter().enumerate() {
        let result = branch.check(value, path, budget);
        path.truncate(depth);
        let failure = match result {
            Ok(()) => return Ok(()),
            Err(failure) => failure,
        };
        if budget.spent() {
            // Out of budget: no other branch can be checked, and this is why.
            return Err(failure);
        }
        if branches.len() == 1 {
            // One branch: its own message is the clearest explanation.
            only = Some(failure);
        } else if reasons.len() < REASONS_LIMIT {
            if !reasons.is_empty() {
                reasons.push_str("; ");
            }
            reasons.push_str(&format!("branch {i}: {failure}"));
            truncate_text(&mut reasons, REASONS_LIMIT);
        }
    }
    if let Some(failure) = only {
        return Err(failure);
    }
    Err(mismatch(
        path,
        format!("a value matching at least one {keyword} branch"),
        format!("one matching none ({reasons})"),
    ))
}

/// Cut `text` to at most `limit` bytes (on a char boundary), marking the cut with `…`.
fn truncate_text(text: &mut String, limit: usize) {
    if text.len() <= limit {
        return;
    }
    let mut cut = limit;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    text.push('…');
}

fn mismatch(path: &[Seg<'_>], expected: String, got: String) -> Mismatch {
    Mismatch { path: value_path(path), expected, got }
}

fn is_integer(n: &Number) -> bool {
    n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.is_finite() && f.fract() == 0.0)
}

/// JSON equality where numbers compare by value, so `1 == 1.0`.
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (exact_int(x), exact_int(y)) {
            (Some(x), Some(y)) => x == y,
            _ => x.as_f64() == y.as_f64(),
        },
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| json_eq(x, y)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

/// Integers stored as integers compare exactly, beyond f64's 53 bits.
fn exact_int(n: &Number) -> Option<i128> {
    n.as_i64().map(i128::from).or_else(|| n.as_u64().map(i128::from))
}

// ---------------------------------------------------------------------------------------
// Replies

/// Strips surrounding whitespace and, if present, one enclosing markdown code fence.
fn strip_code_fence(text: &str) -> &str {
    let text = text.trim();
    let Some(inner) = text.strip_prefix("```") else {
        return text;
    };
    // A reply cut off before the closing fence still gets its chance to parse.
    let inner = inner.strip_suffix("```").unwrap_or(inner);
    let body = match inner.split_once('\n') {
        // The first line is the info string (`json`, `JSON`, empty...) unless it looks like data.
        Some((info, rest)) if is_info_string(info) => rest,
        Some(_) => inner,
        None => {
            // One-line fence: "```json {...}```" carries its tag before the data.
            let tag_len = inner.len() - inner.trim_start_matches(|c: char| c.is_ascii_alphanumeric()).len();
            let rest = &inner[tag_len..];
            if !rest.trim().is_empty() && rest.starts_with(char::is_whitespace) {
                rest
            } else {
                inner
            }
        }
    };
    body.trim()
}

fn is_info_string(line: &str) -> bool {
    line.trim().chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '+' | '.'))
}

// ---------------------------------------------------------------------------------------
// Minimal instances

/// Finds the first value satisfying every rule of a conjunction.
///
/// `done` are rules whose `allOf` is already folded in, `todo` rules still to fold, `groups`
/// the anyOf/oneOf choices not yet made. Branches are tried in order, depth first, so the
/// answer uses the first branch that leads to a satisfying value, and is found whenever one
/// exists (within the budget).
fn solve<'s>(
    mut done: Vec<&'s Rule>,
    mut todo: Vec<&'s Rule>,
    mut groups: Vec<&'s [Node]>,
    budget: &mut Budget,
) -> Option<Value> {
    // Each call copies its state: charge for it, so deep allOf chains cannot multiply work.
    let cost = 1usize.saturating_add(done.len()).saturating_add(todo.len()).saturating_add(groups.len());
    if !budget.spend(cost) {
        return None;
    }
    // Folded in listed order, so "first listed type" prefers the outer schema's own list.
    while !todo.is_empty() {
        let rule = todo.remove(0);
        done.push(rule);
        todo.extend(rule.all_of.iter().filter_map(Node::rule));
        groups.extend(rule.any_of.as_deref());
        groups.extend(rule.one_of.as_deref());
    }
    if !groups.is_empty() {
        let group = groups.remove(0);
        for branch in group {
            let todo = branch.rule().into_iter().collect();
            if let Some(value) = solve(done.clone(), todo, groups.clone(), budget) {
                return Some(value);
            }
            if budget.spent() {
                return None;
            }
        }
        return None;
    }
    // Every choice is made: try the candidates of this plain conjunction in preference order.
    // Innermost rules first: they are the cheapest to fail, and the outer ones re-walk every
    // anyOf branch.
    let satisfies = |value: &Value, budget: &mut Budget| {
        done.iter().rev().all(|rule| rule.check(value, &mut Vec::new(), budget).is_ok())
    };
    if let Some(constant) = done.iter().find_map(|rule| rule.constant.as_ref()) {
        return satisfies(constant, budget).then(|| constant.clone());
    }
    // A satisfying value must be in every enum, so the first enum's values are enough to try.
    if let Some(values) = done.iter().find_map(|rule| rule.enumeration.as_ref()) {
        return values.iter().find(|value| satisfies(value, budget)).cloned();
    }
    // Likewise its kind is in the first type list; with no type anywhere, null passes every
    // structural keyword.
    let kinds = done.iter().find_map(|rule| rule.types.as_deref()).unwrap_or(&[Kind::Null]);
    for kind in kinds {
        let value = kind.minimal(&done, budget);
        if satisfies(&value, budget) {
            return Some(value);
        }
        if budget.spent() {
            return None;
        }
    }
    None
}

/// An object with only the required properties of every part, each minimal for all the
/// schemas the parts give that property (null where none does).
fn minimal_object(parts: &[&Rule], budget: &mut Budget) -> Value {
    let mut object = Map::new();
    for name in parts.iter().flat_map(|rule| rule.required.iter()) {
        if object.contains_key(name) || !budget.spend(parts.len()) {
            continue;
        }
        let schemas: Vec<&Rule> =
            parts.iter().filter_map(|rule| rule.properties.get(name).and_then(Node::rule)).collect();
        let value = if schemas.is_empty() {
            Value::Null
        } else {
            solve(Vec::new(), schemas, Vec::new(), budget).unwrap_or(Value::Null)
        };
        object.insert(name.clone(), value);
    }
    Value::Object(object)
}

// ---------------------------------------------------------------------------------------
// Rendering

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn join_kinds(kinds: &[Kind]) -> String {
    match kinds {
        [] => String::new(),
        [only] => only.name().to_owned(),
        [init @ .., last] => {
            let init: Vec<&str> = init.iter().map(|kind| kind.name()).collect();
            format!("{} or {}", init.join(", "), last.name())
        }
    }
}

/// Compact JSON, cut short so a huge reply does not flood an error message. Serializes no
/// more than it shows: a huge value costs no more than a small one.
fn render(value: &Value) -> String {
    render_with(|w| serde_json::to_writer(w, value))
}

/// [`render`] for an array held as a slice (no copy of it is made).
fn render_slice(values: &[Value]) -> String {
    render_with(|w| serde_json::to_writer(w, values))
}

fn render_with(write: impl FnOnce(&mut Capped) -> serde_json::Result<()>) -> String {
    let mut out = Capped(Vec::with_capacity(QUOTE_LIMIT + 8));
    // Stopping early is the point: the error only says the text was cut.
    let cut = write(&mut out).is_err();
    let mut text = String::from_utf8_lossy(&out.0).into_owned();
    let chars = text.char_indices().nth(QUOTE_LIMIT);
    match chars {
        Some((at, _)) => {
            text.truncate(at);
            text.push('…');
        }
        None if cut => text.push('…'),
        None => {}
    }
    text
}

/// A writer that takes a little more than [`QUOTE_LIMIT`] characters' worth, then refuses.
struct Capped(Vec<u8>);

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // Four bytes per char at most, plus one more char to know there was more.
        let room = (QUOTE_LIMIT + 1) * 4 - self.0.len().min((QUOTE_LIMIT + 1) * 4);
        if room == 0 {
            return Err(std::io::Error::other("quote limit"));
        }
        let n = buf.len().min(room);
        self.0.extend_from_slice(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn quote(text: &str) -> String {
    Value::String(text.to_owned()).to_string()
}

/// A location in a schema, e.g. `properties.findings.items.type`.
fn schema_path(path: &[Seg<'_>]) -> String {
    let rendered = render_path(String::new(), path);
    if rendered.is_empty() {
        "(root)".to_owned()
    } else {
        rendered
    }
}

/// A location in a value, e.g. `$.findings[2].title`.
fn value_path(path: &[Seg<'_>]) -> String {
    render_path("$".to_owned(), path)
}

fn render_path(mut out: String, path: &[Seg<'_>]) -> String {
    for seg in path {
        match seg {
            Seg::Key(key) if is_identifier(key) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            // Keys with dots, spaces or quotes stay unambiguous in bracket form.
            Seg::Key(key) => out.push_str(&format!("[{}]", quote(key))),
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

fn is_identifier(key: &str) -> bool {
    let mut chars = key.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == '$')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
}

// ---------------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema(value: Value) -> Schema {
        match Schema::from_value(value.clone()) {
            Ok(schema) => schema,
            Err(e) => panic!("schema {value} rejected: {e}"),
        }
    }

    /// Each row: a schema, values it must accept, values it must reject.
    fn table(rows: Vec<(Value, Vec<Value>, Vec<Value>)>) {
        for (raw, good, bad) in rows {
            let s = schema(raw.clone());
            for value in good {
                if let Err(e) = s.check(&value) {
                    panic!("schema {raw} should accept {value}, got: {e}");
                }
            }
            for value in bad {
                assert!(s.check(&value).is_err(), "schema {raw} should reject {value}");
            }
        }
    }

    fn error_of(raw: Value, value: Value) -> String {
        match schema(raw.clone()).check(&value) {
            Ok(()) => panic!("schema {raw} should reject {value}"),
            Err(e) => e.to_string(),
        }
    }

    fn all_kinds() -> Vec<Value> {
        vec![
            json!(null),
            json!(true),
            json!(false),
            json!(0),
            json!(-7),
            json!(2.5),
            json!(""),
            json!("text"),
            json!([]),
            json!([1, "a"]),
            json!({}),
            json!({"a": 1}),
        ]
    }

    fn findings() -> Value {
        json!({
            "type": "object",
            "properties": {
                "findings": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": { "title": { "type": "string" } },
                        "required": ["title"],
                    },
                },
            },
            "required": ["findings"],
        })
    }

    fn verdict() -> Value {
        json!({ "type": "object", "properties": { "isReal": { "type": "boolean" } }, "required": ["isReal"] })
    }

    fn bugs() -> Value {
        json!({
            "type": "object",
            "properties": {
                "bugs": {
                    "type": "array",
                    "items": { "type": "object", "properties": { "title": { "type": "string" } }, "required": ["title"] },
                },
            },
            "required": ["bugs"],
        })
    }

    #[test]
    fn type_keyword() {
        table(vec![
            (json!({"type": "object"}), vec![json!({}), json!({"a": [1]})], vec![json!([]), json!(null), json!("{}")]),
            (json!({"type": "array"}), vec![json!([]), json!([{}])], vec![json!({}), json!("[]"), json!(null)]),
            (json!({"type": "string"}), vec![json!(""), json!("3")], vec![json!(3), json!(null), json!(["a"])]),
            (
                json!({"type": "number"}),
                vec![json!(0), json!(3), json!(-3), json!(3.5), json!(u64::MAX), json!(1e300)],
                vec![json!("3"), json!(null), json!(true)],
            ),
            (
                json!({"type": "integer"}),
                vec![
                    json!(0),
                    json!(3),
                    json!(3.0),
                    json!(-3),
                    json!(-4.0),
                    json!(u64::MAX),
                    json!(i64::MIN),
                    json!(1e20),
                ],
                vec![json!(3.5), json!(-0.1), json!("3"), json!(null)],
            ),
            (json!({"type": "boolean"}), vec![json!(true), json!(false)], vec![json!(0), json!("true"), json!(null)]),
            (json!({"type": "null"}), vec![json!(null)], vec![json!(0), json!(""), json!(false), json!({})]),
            (json!({"type": ["string", "null"]}), vec![json!("x"), json!(null)], vec![json!(0), json!({}), json!([])]),
            (
                json!({"type": ["integer", "boolean"]}),
                vec![json!(1), json!(1.0), json!(true)],
                vec![json!(1.5), json!("1")],
            ),
            (json!({"type": ["string", "string"]}), vec![json!("dup ok")], vec![json!(1)]),
        ]);
    }

    #[test]
    fn required_keyword() {
        table(vec![
            (
                json!({"required": ["a", "b"]}),
                // Only objects are constrained; other kinds pass, as in JSON Schema.
                vec![json!({"a": 1, "b": null}), json!({"a": 1, "b": 2, "c": 3}), json!([]), json!("a"), json!(null)],
                vec![json!({}), json!({"a": 1}), json!({"b": 1})],
            ),
            (json!({"type": "object", "required": []}), vec![json!({})], vec![json!([])]),
            (
                json!({"type": "object", "required": ["x"]}),
                vec![json!({"x": null})],
                vec![json!({"y": 1}), json!(null)],
            ),
        ]);
    }

    #[test]
    fn enum_keyword() {
        table(vec![
            (
                json!({"enum": ["a", 1, null, {"x": [1, 2]}, [true]]}),
                vec![json!("a"), json!(1), json!(1.0), json!(null), json!({"x": [1.0, 2]}), json!([true])],
                vec![
                    json!("b"),
                    json!(2),
                    json!(1.5),
                    json!(false),
                    json!({"x": [2, 1]}),
                    json!({"x": [1, 2], "y": 0}),
                    json!([]),
                ],
            ),
            (json!({"type": "string", "enum": ["a", 1]}), vec![json!("a")], vec![json!(1), json!("b")]),
        ]);
    }

    #[test]
    fn const_keyword() {
        table(vec![
            (json!({"const": 1}), vec![json!(1), json!(1.0)], vec![json!(1.5), json!("1"), json!(true), json!(null)]),
            (json!({"const": 2.0}), vec![json!(2), json!(2.0)], vec![json!(3)]),
            (json!({"const": null}), vec![json!(null)], vec![json!(0), json!(false)]),
            (json!({"const": "x"}), vec![json!("x")], vec![json!("X"), json!(["x"])]),
            (
                json!({"const": {"a": [1, {"b": 2}]}}),
                vec![json!({"a": [1.0, {"b": 2.0}]})],
                vec![json!({"a": [1, {"b": 3}]}), json!({"a": [1]}), json!({"a": [1, {"b": 2}], "c": 0}), json!({})],
            ),
            (json!({"const": u64::MAX}), vec![json!(u64::MAX)], vec![json!(u64::MAX - 1)]),
            (json!({"const": -1}), vec![json!(-1), json!(-1.0)], vec![json!(1), json!(u64::MAX)]),
        ]);
    }

    #[test]
    fn properties_and_items_recurse() {
        table(vec![
            (
                json!({"properties": {"a": {"type": "string"}, "b": {"properties": {"c": {"type": "integer"}}}}}),
                // Absent properties are fine unless required.
                vec![json!({}), json!({"a": "x"}), json!({"b": {"c": 3}}), json!({"b": 5}), json!({"z": 1}), json!(7)],
                vec![json!({"a": 1}), json!({"b": {"c": "3"}}), json!({"a": "x", "b": {"c": 1.5}})],
            ),
            (
                json!({"items": {"type": "integer"}}),
                vec![json!([]), json!([1, 2, 3.0]), json!({"not": "an array"}), json!("s")],
                vec![json!([1, "2"]), json!([1.5])],
            ),
            (
                json!({"type": "array", "items": {"type": "array", "items": {"enum": [1, 2]}}}),
                vec![json!([]), json!([[], [1, 2, 2]])],
                vec![json!([[1], [3]]), json!([1])],
            ),
            (
                findings(),
                vec![json!({"findings": []}), json!({"findings": [{"title": "t", "extra": 1}]})],
                vec![
                    json!({}),
                    json!({"findings": {}}),
                    json!({"findings": [{"title": "t"}, {}]}),
                    json!({"findings": [{"title": null}]}),
                ],
            ),
        ]);
    }

    #[test]
    fn combinators() {
        table(vec![
            (
                json!({"anyOf": [{"type": "string"}, {"type": "integer"}]}),
                vec![json!("a"), json!(3)],
                vec![json!(3.5), json!(null), json!({})],
            ),
            (
                // Both branches match 5: oneOf is anyOf here, so it still passes.
                json!({"oneOf": [{"type": "integer"}, {"type": "number"}]}),
                vec![json!(5), json!(5.5)],
                vec![json!("5")],
            ),
            (
                json!({"oneOf": [{"required": ["a"]}, {"required": ["b"]}]}),
                vec![json!({"a": 1}), json!({"b": 1}), json!({"a": 1, "b": 2})],
                vec![json!({}), json!({"c": 1})],
            ),
            (
                json!({"allOf": [{"type": "object", "required": ["a"]}, {"required": ["b"]}, {"properties": {"a": {"type": "string"}}}]}),
                vec![json!({"a": "x", "b": 0})],
                vec![json!({"a": "x"}), json!({"b": 0}), json!({"a": 1, "b": 0}), json!([])],
            ),
            (
                json!({"type": "object", "anyOf": [{"required": ["a"]}], "oneOf": [{"required": ["b"]}, {"required": ["c"]}]}),
                vec![json!({"a": 1, "b": 1}), json!({"a": 1, "c": 1})],
                vec![json!({"a": 1}), json!({"b": 1}), json!({"b": 1, "c": 1})],
            ),
            (
                json!({"allOf": [{"anyOf": [{"const": 1}, {"const": 2}]}, {"anyOf": [{"const": 2}, {"const": 3}]}]}),
                vec![json!(2)],
                vec![json!(1), json!(3)],
            ),
        ]);
    }

    #[test]
    fn boolean_schemas_accept_anything() {
        for raw in [
            json!(true),
            json!(false),
            json!({"properties": {"a": false}}),
            json!({"items": false}),
            json!({"anyOf": [false, {"type": "string"}]}),
            json!({"allOf": [false, true]}),
            json!({"oneOf": [false]}),
        ] {
            let s = schema(raw.clone());
            for value in all_kinds().into_iter().chain([json!({"a": 1}), json!([1, 2])]) {
                assert!(s.check(&value).is_ok(), "{raw} should accept {value}");
            }
        }
        // A boolean property schema still lets `required` apply.
        table(vec![(json!({"properties": {"a": false}, "required": ["a"]}), vec![json!({"a": 1})], vec![json!({})])]);
    }

    #[test]
    fn ignored_keywords_are_not_enforced() {
        let rows = vec![
            (json!({"type": "object", "additionalProperties": false}), json!({"extra": 1})),
            (json!({"type": "object", "properties": {}, "additionalProperties": {"type": "string"}}), json!({"x": 1})),
            (json!({"type": "string", "pattern": "^a+$"}), json!("bbb")),
            (json!({"type": "string", "minLength": 5}), json!("ab")),
            (json!({"type": "string", "maxLength": 1}), json!("abc")),
            (json!({"type": "number", "minimum": 10}), json!(1)),
            (json!({"type": "number", "maximum": 0}), json!(5)),
            (json!({"type": "number", "exclusiveMinimum": 5, "exclusiveMaximum": 5}), json!(5)),
            (json!({"type": "integer", "multipleOf": 3}), json!(4)),
            (json!({"type": "string", "format": "email"}), json!("not an email")),
            (json!({"type": "array", "minItems": 3}), json!([])),
            (json!({"type": "array", "maxItems": 0, "uniqueItems": true}), json!([1, 1])),
            (json!({"type": "array", "contains": {"const": 9}}), json!([1])),
            (json!({"type": "object", "minProperties": 2}), json!({})),
            (
                json!({"$schema": "http://json-schema.org/draft-07/schema#", "title": "T", "description": "D", "type": "string"}),
                json!("x"),
            ),
            (json!({"$ref": "#/definitions/n", "definitions": {"n": {"type": "number"}}}), json!("not a number")),
            (json!({"$ref": "#/$defs/n", "$defs": {"n": {"type": "strng"}}}), json!(1)),
            (json!({"not": {"type": "string"}}), json!("string")),
            (json!({"if": {"type": "string"}, "then": {"const": "a"}}), json!("b")),
            (json!({"patternProperties": {"^x": {"type": "string"}}}), json!({"x1": 1})),
            (json!({"dependentRequired": {"a": ["b"]}, "dependencies": {"a": ["b"]}}), json!({"a": 1})),
            (json!({"propertyNames": {"maxLength": 1}}), json!({"long": 1})),
            (json!({"type": "array", "items": [{"type": "string"}, "garbage"]}), json!([1, 2])),
            (json!({"type": "array", "additionalItems": false, "prefixItems": [{"type": "string"}]}), json!([1])),
            (json!({"type": "string", "nullable": true, "default": 3, "examples": [1]}), json!("x")),
            // Unhonoured keywords with nonsense values are never inspected.
            (json!({"minLength": "five", "additionalProperties": "nope", "format": 12, "pattern": ["x"]}), json!(null)),
        ];
        for (raw, value) in rows {
            let s = schema(raw.clone());
            if let Err(e) = s.check(&value) {
                panic!("{raw} should accept {value} (keyword ignored), got: {e}");
            }
        }
    }

    #[test]
    fn mismatch_messages_name_the_path() {
        let value = json!({"findings": [{"title": "a"}, {"title": "b"}, {"title": 3}]});
        assert_eq!(error_of(findings(), value), "$.findings[2].title: expected string, got number");

        let e = schema(findings()).check(&json!({"findings": [{"title": "a"}, {}]}));
        assert_eq!(
            e,
            Err(Mismatch {
                path: "$.findings[1]".to_owned(),
                expected: "required property \"title\"".to_owned(),
                got: "an object without it".to_owned(),
            })
        );
        assert_eq!(error_of(findings(), json!([])), "$: expected object, got array");
        assert_eq!(error_of(json!({"type": "integer"}), json!(2.5)), "$: expected integer, got number 2.5");
        assert_eq!(
            error_of(json!({"type": ["string", "integer", "null"]}), json!(true)),
            "$: expected string, integer or null, got boolean"
        );
        assert_eq!(error_of(json!({"const": "yes"}), json!("no")), "$: expected \"yes\", got \"no\"");
        assert_eq!(error_of(json!({"enum": [1, "a"]}), json!(2)), "$: expected one of [1,\"a\"], got 2");
        assert_eq!(
            error_of(
                json!({"properties": {"a b": {"properties": {"c.d": {"type": "null"}}}}}),
                json!({"a b": {"c.d": 0}})
            ),
            "$[\"a b\"][\"c.d\"]: expected null, got number"
        );
        assert_eq!(
            error_of(json!({"items": {"items": {"type": "string"}}}), json!([[], ["x", 1]])),
            "$[1][1]: expected string, got number"
        );
        assert_eq!(
            error_of(
                json!({"anyOf": [{"type": "string"}, {"properties": {"a": {"type": "string"}}}]}),
                json!({"a": 1})
            ),
            "$: expected a value matching at least one anyOf branch, got one matching none \
             (branch 0: $: expected string, got object; branch 1: $.a: expected string, got number)"
        );
        // A single-branch anyOf reports the branch's own mismatch.
        assert_eq!(
            error_of(json!({"properties": {"x": {"oneOf": [{"type": "string"}]}}}), json!({"x": 1})),
            "$.x: expected string, got number"
        );
        assert_eq!(
            error_of(
                json!({"properties": {"x": {"allOf": [{"type": "number"}, {"type": "integer"}]}}}),
                json!({"x": 1.5})
            ),
            "$.x: expected integer, got number 1.5"
        );
        // Long values are cut short in messages.
        let long = "x".repeat(500);
        assert!(error_of(json!({"const": 1}), json!(long)).len() < 200);
    }

    #[test]
    fn invalid_schemas_are_rejected_with_a_path() {
        let rows = [
            (
                r#"{"properties": {"findings": {"items": {"type": "strng"}}}}"#,
                r#"properties.findings.items.type: unknown type "strng""#,
            ),
            (r#"{"type": "Object"}"#, r#"type: unknown type "Object""#),
            (r#"{"type": 5}"#, "type: expected a type name or a non-empty array of type names, got number"),
            (r#"{"type": []}"#, "type: expected a type name or a non-empty array of type names, got an empty array"),
            (r#"{"type": ["string", 1]}"#, "type[1]: expected a type name, got number"),
            (r#"{"type": ["string", "float"]}"#, r#"type[1]: unknown type "float""#),
            (r#"{"required": "a"}"#, "required: expected an array of property names, got string"),
            (r#"{"required": ["a", 2]}"#, "required[1]: expected a property name (string), got number"),
            (r#"{"enum": "a"}"#, "enum: expected a non-empty array, got string"),
            (r#"{"enum": []}"#, "enum: expected a non-empty array, got an empty array"),
            (r#"{"properties": []}"#, "properties: expected an object of schemas, got array"),
            (r#"{"properties": {"a": "string"}}"#, "properties.a: expected a schema (object or boolean), got string"),
            (r#"{"properties": {"a.b": {"type": "x"}}}"#, r#"properties["a.b"].type: unknown type "x""#),
            (r#"{"items": "string"}"#, "items: expected a schema (object or boolean), got string"),
            (r#"{"items": {"required": {}}}"#, "items.required: expected an array of property names, got object"),
            (r#"{"anyOf": {"type": "string"}}"#, "anyOf: expected a non-empty array of schemas, got object"),
            (r#"{"anyOf": []}"#, "anyOf: expected a non-empty array of schemas, got an empty array"),
            (r#"{"oneOf": [{"type": "string"}, 3]}"#, "oneOf[1]: expected a schema (object or boolean), got number"),
            (
                r#"{"allOf": [true, {"properties": {"x": {"type": ["nul"]}}}]}"#,
                r#"allOf[1].properties.x.type[0]: unknown type "nul""#,
            ),
            (r#""object""#, "(root): expected a schema (object or boolean), got string"),
            (r#"null"#, "(root): expected a schema (object or boolean), got null"),
            (r#"[{"type": "string"}]"#, "(root): expected a schema (object or boolean), got array"),
        ];
        for (text, message) in rows {
            match Schema::parse(text) {
                Ok(_) => panic!("{text} should be rejected"),
                Err(e) => {
                    assert_eq!(e.to_string(), message, "for {text}");
                    assert!(e.path().is_some());
                }
            }
        }
        for text in ["", "{", "{\"type\": \"string\",}", "not json"] {
            let e = Schema::parse(text).err();
            assert!(matches!(e, Some(SchemaError::InvalidJson(_))), "{text:?} -> {e:?}");
            assert!(e.is_some_and(|e| e.to_string().starts_with("schema is not valid JSON: ")));
        }
    }

    #[test]
    fn parse_and_from_value_agree() {
        let text = findings().to_string();
        let parsed = Schema::parse(&text).expect("valid");
        assert_eq!(parsed.as_value(), &findings());
        let good = json!({"findings": [{"title": "t"}]});
        assert!(parsed.check(&good).is_ok());
        assert!(schema(findings()).check(&good).is_ok());
    }

    #[test]
    fn replies_tolerate_whitespace_and_one_code_fence() {
        let s = schema(verdict());
        let want = json!({"isReal": true});
        for reply in [
            r#"{"isReal": true}"#,
            "  \n\t{\"isReal\": true}\n\n",
            "```json\n{\"isReal\": true}\n```",
            "```JSON\n{\"isReal\": true}\n```\n",
            "\n```\n{\"isReal\": true}\n```  ",
            "```json\r\n{\"isReal\": true}\r\n```",
            "```json\n{\n  \"isReal\": true\n}",
            "```{\"isReal\": true}```",
            "```json {\"isReal\": true}```",
            "```\n{\"isReal\":\ntrue}\n```",
        ] {
            match s.parse_reply(reply) {
                Ok(value) => assert_eq!(value, want, "for {reply:?}"),
                Err(e) => panic!("{reply:?} should parse: {e}"),
            }
        }
        // Scalars inside a fence, with and without a tag.
        let any = schema(json!({}));
        assert_eq!(any.parse_reply("```\ntrue\n```"), Ok(json!(true)));
        assert_eq!(any.parse_reply("```true```"), Ok(json!(true)));
        assert_eq!(any.parse_reply("```json 12```"), Ok(json!(12)));
        assert_eq!(any.parse_reply("```\n\"a ``` b\"\n```"), Ok(json!("a ``` b")));

        // Not JSON, or text around the fence: a parse failure at `$`.
        for reply in [
            "",
            "sure! {\"isReal\": true}",
            "Here:\n```json\n{\"isReal\": true}\n```",
            "```json\n{\"isReal\": tru}\n```",
            "{\"isReal\": true} {}",
        ] {
            match s.parse_reply(reply) {
                Ok(value) => panic!("{reply:?} should fail, got {value}"),
                Err(e) => {
                    assert_eq!(e.path, "$");
                    assert_eq!(e.expected, "a JSON value");
                    assert!(e.got.starts_with("text that is not JSON ("), "{e}");
                }
            }
        }
        // JSON that does not match.
        assert_eq!(
            s.parse_reply("```json\n{\"isReal\": \"yes\"}\n```").map_err(|e| e.to_string()),
            Err("$.isReal: expected boolean, got string".to_owned())
        );
    }

    #[test]
    fn minimal_instances() {
        let rows = [
            (findings(), json!({"findings": []})),
            (verdict(), json!({"isReal": false})),
            (bugs(), json!({"bugs": []})),
            (
                json!({"type": "object", "properties": {"real": {"type": "boolean"}}, "required": ["real"]}),
                json!({"real": false}),
            ),
            (json!(true), json!(null)),
            (json!(false), json!(null)),
            (json!({}), json!(null)),
            (json!({"type": "string"}), json!("")),
            (json!({"type": "integer"}), json!(0)),
            (json!({"type": "number"}), json!(0)),
            (json!({"type": "boolean"}), json!(false)),
            (json!({"type": "array", "items": {"type": "string"}}), json!([])),
            (json!({"type": ["string", "null"]}), json!("")),
            (json!({"type": ["null", "string"]}), json!(null)),
            (json!({"const": {"k": 1.5}}), json!({"k": 1.5})),
            (json!({"enum": ["b", "a"]}), json!("b")),
            (json!({"type": "integer", "enum": ["a", 2.5, 3]}), json!(3)),
            (
                json!({"type": "object", "required": ["a", "b"], "properties": {"a": {"type": "string"}}}),
                json!({"a": "", "b": null}),
            ),
            (json!({"required": ["a"]}), json!(null)),
            (json!({"anyOf": [{"type": "string"}, {"type": "integer"}]}), json!("")),
            (json!({"type": "integer", "anyOf": [{"type": "string"}, {"type": "integer"}]}), json!(0)),
            (json!({"oneOf": [{"const": "x"}, {"type": "number"}], "type": "number"}), json!(0)),
            (
                json!({"allOf": [{"type": "object", "required": ["a"]}, {"required": ["b"], "properties": {"b": {"type": "array"}}}]}),
                json!({"a": null, "b": []}),
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "string"}}, "allOf": [{"properties": {"a": {"enum": [1, "x"]}}}], "required": ["a"]}),
                json!({"a": "x"}),
            ),
            (
                json!({"type": "object", "required": ["kind"], "anyOf": [
                    {"properties": {"kind": {"const": "a"}}, "required": ["x"]},
                    {"properties": {"kind": {"const": "b"}}}
                ], "properties": {"kind": {"type": "string"}}}),
                json!({"kind": "a", "x": null}),
            ),
            (
                json!({"type": "object", "required": ["kind"], "anyOf": [
                    {"properties": {"kind": {"const": 1}}},
                    {"properties": {"kind": {"const": "b"}}}
                ], "properties": {"kind": {"type": "string"}}}),
                json!({"kind": "b"}),
            ),
            (
                json!({"type": "object", "required": ["n"], "properties": {"n": {"allOf": [{"type": ["string", "number"]}, {"type": "integer"}]}}}),
                json!({"n": 0}),
            ),
            (
                json!({"type": "object", "required": ["deep"], "properties": {"deep": {"type": "object", "required": ["deeper"],
                    "properties": {"deeper": {"type": ["array", "null"], "items": {"type": "string"}}}}}}),
                json!({"deep": {"deeper": []}}),
            ),
            (json!({"type": "string", "minLength": 3, "pattern": "^a"}), json!("")),
            (json!({"$ref": "#/definitions/x", "definitions": {"x": {"type": "string"}}}), json!(null)),
        ];
        for (raw, want) in rows {
            let s = schema(raw.clone());
            let got = s.minimal_instance();
            assert_eq!(got, want, "minimal instance of {raw}");
            if let Err(e) = s.check(&got) {
                panic!("minimal instance {got} of {raw} fails its own schema: {e}");
            }
        }
    }

    #[test]
    fn minimal_instance_of_unsatisfiable_schema_is_null() {
        for raw in [
            json!({"type": "string", "const": 1}),
            json!({"allOf": [{"type": "string"}, {"type": "number"}]}),
            json!({"enum": [1, 2], "const": 3}),
            json!({"type": "object", "required": ["a"], "properties": {"a": {"allOf": [{"const": 1}, {"const": 2}]}}}),
        ] {
            let s = schema(raw.clone());
            assert_eq!(s.minimal_instance(), json!(null), "{raw}");
            assert!(s.check(&json!(null)).is_err());
        }
    }

    #[test]
    fn minimal_instance_search_is_bounded() {
        // 2^30 branch combinations in front of a contradiction: the budget stops the search.
        let choice = json!({"anyOf": [{"title": "a"}, {"title": "b"}]});
        let mut parts = vec![json!({"type": "string"}), json!({"type": "number"})];
        parts.extend(std::iter::repeat_n(choice, 30));
        let s = schema(json!({"allOf": parts}));
        let started = std::time::Instant::now();
        assert_eq!(s.minimal_instance(), json!(null));
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
    }

    #[test]
    fn the_exhaustive_search_is_a_typed_error() {
        let choice = json!({"anyOf": [{"title": "a"}, {"title": "b"}]});
        let mut parts = vec![json!({"type": "string"}), json!({"type": "number"})];
        parts.extend(std::iter::repeat_n(choice, 30));
        let s = schema(json!({"allOf": parts}));
        assert_eq!(s.solve(), Err(SolveExhausted { limit: SOLVE_BUDGET }));
        // An unsatisfiable schema the search exhausts within budget is null, not an error.
        assert_eq!(schema(json!({"type": "string", "const": 1})).solve(), Ok(json!(null)));
    }

    /// A full binary tree of `anyOf` nodes `depth` levels deep with `leaf` at the bottom, as text.
    fn any_of_tree(depth: usize, leaf: &str) -> String {
        let mut text = leaf.to_owned();
        for _ in 0..depth {
            text = format!(r#"{{"anyOf":[{text},{text}]}}"#);
        }
        text
    }

    #[test]
    fn a_schema_with_too_many_sub_schemas_is_refused_at_parse() {
        // 2^21 - 1 nodes, ~30 MB of text, the shape that took 7 GB to check before.
        let text = any_of_tree(20, r#"{"type":"string"}"#);
        assert!(text.len() > 16 << 20);
        match Schema::parse(&text) {
            Err(SchemaError::TooLarge { limit }) => assert_eq!(limit, MAX_NODES),
            other => panic!("expected TooLarge, got {other:?}"),
        }
        // One node over: still refused; at the cap: accepted.
        let flat = |n: usize| {
            let props: Vec<String> = (0..n).map(|i| format!(r#""p{i}":{{"type":"string"}}"#)).collect();
            format!(r#"{{"type":"object","properties":{{{}}}}}"#, props.join(","))
        };
        assert!(Schema::parse(&flat(MAX_NODES - 1)).is_ok());
        assert!(matches!(Schema::parse(&flat(MAX_NODES)), Err(SchemaError::TooLarge { .. })));
    }

    #[test]
    fn nested_any_of_mismatches_stay_small() {
        // 8191 nodes, every branch fails: the explanation does not multiply per level.
        let s = Schema::parse(&any_of_tree(12, r#"{"type":"string"}"#)).expect("under the cap");
        let failure = s.check(&json!(1)).expect_err("no branch takes a number");
        let text = failure.to_string();
        assert!(text.len() < 4 << 10, "{} bytes: {}", text.len(), &text[..200]);
        assert!(text.contains("at least one anyOf branch"), "{text}");
    }

    #[test]
    fn a_check_past_its_budget_is_a_mismatch_that_says_so() {
        // 999 failing branches before the one that fits, for each of 2000 elements: ~2M visits.
        let mut branches = vec![json!({"type": "string"}); 999];
        branches.push(json!({"type": "number"}));
        let s = schema(json!({"type": "array", "items": {"anyOf": branches}}));
        assert!(s.check(&json!([1, 2, 3])).is_ok());
        let failure = s.check(&Value::Array(vec![json!(1); 2000])).expect_err("over budget");
        assert!(failure.expected.contains(&format!("checkable within {CHECK_BUDGET}")), "{failure}");
        // A reply check reports it as a mismatch (the caller retries, then answers null).
        let reply = Value::Array(vec![json!(1); 2000]).to_string();
        assert!(s.parse_reply(&reply).is_err());
    }

    #[test]
    fn big_enums_and_consts_are_weighed_and_quoted_briefly() {
        let values: Vec<Value> = (0..5000).map(|i| json!(format!("value-{i}"))).collect();
        let s = schema(json!({"type": "array", "items": {"enum": values}}));
        // 5000 comparisons per element: 300 elements is over the budget.
        let failure = s.check(&Value::Array(vec![json!("value-4999"); 300])).expect_err("over budget");
        assert!(failure.expected.contains("checkable within"), "{failure}");
        let failure = s.check(&json!(["nope"])).expect_err("not in the enum");
        assert!(failure.to_string().len() < 400, "{failure}");
        let huge = Value::Array(vec![json!("x".repeat(1000)); 10_000]);
        let failure = schema(json!({"const": 1})).check(&huge).expect_err("not 1");
        assert!(failure.got.len() < 400, "{}", failure.got.len());
        assert!(failure.got.ends_with('…'));
    }

    #[test]
    fn the_dry_run_solver_is_bounded_on_deep_nests() {
        // A nest of allOf/anyOf under the node cap: the search answers or fails typed.
        let text = any_of_tree(11, r#"{"allOf":[{"type":"string"},{"type":"number"}]}"#);
        let s = Schema::parse(&text).expect("under the cap");
        match s.solve() {
            Ok(value) => assert_eq!(value, json!(null)),
            Err(e) => assert_eq!(e.limit, SOLVE_BUDGET),
        }
    }

    #[test]
    fn json_equality_compares_numbers_by_value() {
        assert!(json_eq(&json!(1), &json!(1.0)));
        assert!(json_eq(&json!(-0.0), &json!(0)));
        assert!(json_eq(&json!([1, {"a": 2}]), &json!([1.0, {"a": 2.0}])));
        assert!(!json_eq(&json!(u64::MAX), &json!(i64::MAX)));
        assert!(!json_eq(&json!({"a": 1}), &json!({"b": 1})));
        assert!(!json_eq(&json!([1]), &json!([1, 1])));
        assert!(!json_eq(&json!("1"), &json!(1)));
    }
}
