//! Checking a value against a parsed schema within [`CHECK_BUDGET`], each mismatch said
//! with its path; and a model's reply text read as JSON (an enclosing code fence stripped).

use super::*;

/// The JSON nodes of a value (itself, and every element and member, recursively).
pub(super) fn json_nodes(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(json_nodes).sum::<usize>(),
        Value::Object(map) => 1 + map.values().map(json_nodes).sum::<usize>(),
        _ => 1,
    }
}

/// The mismatch of a check that ran out of its budget.
pub(super) fn too_costly(path: &[Seg<'_>]) -> Mismatch {
    mismatch(
        path,
        format!("a value checkable within {CHECK_BUDGET} schema-node visits"),
        "one that needs more (the schema or the value is too large)".to_owned(),
    )
}

impl Rule {
    pub(super) fn check<'s>(
        &'s self,
        value: &Value,
        path: &mut Vec<Seg<'s>>,
        budget: &mut Budget,
    ) -> Result<(), Mismatch> {
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
pub(super) fn check_any<'s>(
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
pub(super) fn truncate_text(text: &mut String, limit: usize) {
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

pub(super) fn mismatch(path: &[Seg<'_>], expected: String, got: String) -> Mismatch {
    Mismatch { path: value_path(path), expected, got }
}

pub(super) fn is_integer(n: &Number) -> bool {
    n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.is_finite() && f.fract() == 0.0)
}

/// JSON equality where numbers compare by value, so `1 == 1.0`.
pub(super) fn json_eq(a: &Value, b: &Value) -> bool {
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
pub(super) fn exact_int(n: &Number) -> Option<i128> {
    n.as_i64().map(i128::from).or_else(|| n.as_u64().map(i128::from))
}

// ---------------------------------------------------------------------------------------
// Replies

/// Strips surrounding whitespace and, if present, one enclosing markdown code fence.
pub(super) fn strip_code_fence(text: &str) -> &str {
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

pub(super) fn is_info_string(line: &str) -> bool {
    line.trim().chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '+' | '.'))
}
