//! Parsing a schema's JSON into its checked form ([`Node`], [`Rule`]), counting its
//! sub-schemas against [`MAX_NODES`] and naming where a malformed keyword is.

use super::*;

/// One step of a path, inside a schema or inside a checked value.
#[derive(Debug, Clone, Copy)]
pub(super) enum Seg<'a> {
    Key(&'a str),
    Index(usize),
}

pub(super) fn parse_node<'v>(
    value: &'v Value,
    path: &mut Vec<Seg<'v>>,
    nodes: &mut usize,
) -> Result<Node, SchemaError> {
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

pub(super) fn parse_rule<'v>(
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

pub(super) fn parse_types<'v>(value: &'v Value, path: &mut Vec<Seg<'v>>) -> Result<Vec<Kind>, SchemaError> {
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

pub(super) fn parse_kind(name: &str, path: &[Seg<'_>]) -> Result<Kind, SchemaError> {
    Kind::from_name(name).ok_or_else(|| SchemaError::UnknownType { path: schema_path(path), name: name.to_owned() })
}

pub(super) fn parse_required<'v>(value: &'v Value, path: &mut Vec<Seg<'v>>) -> Result<Vec<String>, SchemaError> {
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

pub(super) fn parse_branches<'v>(
    value: &'v Value,
    path: &mut Vec<Seg<'v>>,
    nodes: &mut usize,
) -> Result<Vec<Node>, SchemaError> {
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

pub(super) fn malformed(path: &[Seg<'_>], expected: &'static str, got: &str) -> SchemaError {
    SchemaError::Malformed { path: schema_path(path), expected, got: got.to_owned() }
}
