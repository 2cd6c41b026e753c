//! The smallest value a schema accepts (for the offline dry-run backend): a depth-first
//! search of its `allOf`/`anyOf` branches within [`SOLVE_BUDGET`] steps.

use super::*;

/// Finds the first value satisfying every rule of a conjunction.
///
/// `done` are rules whose `allOf` is already folded in, `todo` rules still to fold, `groups`
/// the anyOf/oneOf choices not yet made. Branches are tried in order, depth first, so the
/// answer uses the first branch that leads to a satisfying value, and is found whenever one
/// exists (within the budget).
pub(super) fn solve<'s>(
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
pub(super) fn minimal_object(parts: &[&Rule], budget: &mut Budget) -> Value {
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
