//! A byte-bounded cache of journal values (step values and agent outcomes) for one run:
//! what a run keeps in host memory besides what its guest holds. Entries leave oldest
//! first; a value larger than a quarter of the budget is never kept (it is read back from
//! the store when asked for).

use crate::model::agent_key::AgentKey;
use std::collections::{HashMap, VecDeque};

/// Bookkeeping bytes counted per entry on top of its key and value.
const ENTRY_OVERHEAD: usize = 64;

/// An entry of the eviction order: which map it is in, under which key. An agent's memo
/// key is held inline (no allocation of its own).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Step(String),
    Agent(AgentKey),
}

fn outcome_len(outcome: &Option<String>) -> usize {
    outcome.as_ref().map_or(0, String::len)
}

/// The cache; `limit` bytes at most (keys, values and [`ENTRY_OVERHEAD`] counted).
#[derive(Debug, Default)]
pub(crate) struct ValueCache {
    steps: HashMap<String, String>,
    /// By memo key: a SHA-256 the host computed, which no guest chooses, so hashed by a fast
    /// hasher (a step key is the guest's: SipHash).
    agents: HashMap<AgentKey, Option<String>, foldhash::fast::RandomState>,
    /// Insertion order, oldest first (may hold keys since replaced or removed).
    order: VecDeque<Key>,
    bytes: usize,
    limit: usize,
}

impl ValueCache {
    pub(crate) fn new(limit: usize) -> Self {
        ValueCache { limit, ..Default::default() }
    }

    pub(crate) fn step(&self, key: &str) -> Option<&String> {
        self.steps.get(key)
    }

    pub(crate) fn agent(&self, key: &AgentKey) -> Option<&Option<String>> {
        self.agents.get(key)
    }

    /// Bytes held.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Keep a step value (replacing what was there).
    pub(crate) fn put_step(&mut self, key: String, value: String) {
        self.remove_step(&key);
        let size = key.len() + value.len() + ENTRY_OVERHEAD;
        if self.make_room(size) {
            self.order.push_back(Key::Step(key.clone()));
            self.steps.insert(key, value);
            self.bytes += size;
            self.compact();
        }
    }

    /// Keep an agent outcome (replacing what was there).
    pub(crate) fn put_agent(&mut self, key: AgentKey, outcome: Option<String>) {
        self.remove_agent(&key);
        let size = key.as_str().len() + outcome_len(&outcome) + ENTRY_OVERHEAD;
        if self.make_room(size) {
            self.order.push_back(Key::Agent(key));
            self.agents.insert(key, outcome);
            self.bytes += size;
            self.compact();
        }
    }

    /// Evict oldest entries until `size` more bytes fit; false for a value over a quarter
    /// of the limit (never kept).
    fn make_room(&mut self, size: usize) -> bool {
        if size > self.limit / 4 {
            return false;
        }
        while self.bytes + size > self.limit {
            match self.order.pop_front() {
                Some(Key::Step(key)) => self.remove_step(&key),
                Some(Key::Agent(key)) => self.remove_agent(&key),
                None => break,
            }
        }
        true
    }

    fn remove_step(&mut self, key: &str) {
        if let Some(value) = self.steps.remove(key) {
            self.bytes -= key.len() + value.len() + ENTRY_OVERHEAD;
        }
    }

    fn remove_agent(&mut self, key: &AgentKey) {
        if let Some(outcome) = self.agents.remove(key) {
            self.bytes -= key.as_str().len() + outcome_len(&outcome) + ENTRY_OVERHEAD;
        }
    }

    /// Replaced keys leave stale places in `order`: drop them before it grows past twice
    /// the entries.
    fn compact(&mut self) {
        let live = self.steps.len() + self.agents.len();
        if self.order.len() <= 2 * live + 16 {
            return;
        }
        let mut seen = std::collections::HashSet::new();
        let mut order: Vec<Key> = self
            .order
            .drain(..)
            .rev()
            .filter(|key| {
                let present = match key {
                    Key::Step(key) => self.steps.contains_key(key),
                    Key::Agent(key) => self.agents.contains_key(key),
                };
                present && seen.insert(key.clone())
            })
            .collect();
        order.reverse();
        self.order = order.into();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_stays_within_its_bytes() {
        let mut cache = ValueCache::new(10_000);
        for i in 0..1000 {
            cache.put_step(format!("k{i}"), "x".repeat(100));
            assert!(cache.bytes() <= 10_000);
        }
        // The newest are kept, the oldest evicted.
        assert!(cache.step("k999").is_some());
        assert!(cache.step("k0").is_none());
        // Too big to keep: not kept, and an older value under the key is dropped.
        cache.put_step("k999".into(), "y".repeat(5000));
        assert!(cache.step("k999").is_none());
        // Rewriting one key many times keeps the order compact.
        let a = AgentKey::new("a", None, None, None);
        for _ in 0..10_000 {
            cache.put_agent(a, None);
        }
        assert_eq!(cache.agent(&a), Some(&None));
        assert!(cache.order.len() <= 2 * (cache.steps.len() + cache.agents.len()) + 16);
        assert!(cache.bytes() <= 10_000);
    }
}
