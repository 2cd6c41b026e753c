//! A byte-bounded cache of journal values (step values and agent outcomes) for one run:
//! what a run keeps in host memory besides what its guest holds. Entries leave oldest
//! first; a value larger than a quarter of the budget is never kept (it is read back from
//! the store when asked for).

use std::collections::{HashMap, VecDeque};

/// What a cached value is filed under.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum CacheKey {
    Step(String),
    Agent(String),
}

/// A cached value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Cached {
    Step(String),
    Agent(Option<String>),
}

/// Bookkeeping bytes counted per entry on top of its key and value.
const ENTRY_OVERHEAD: usize = 64;

fn key_len(key: &CacheKey) -> usize {
    match key {
        CacheKey::Step(k) | CacheKey::Agent(k) => k.len(),
    }
}

fn value_len(value: &Cached) -> usize {
    match value {
        Cached::Step(v) => v.len(),
        Cached::Agent(v) => v.as_ref().map_or(0, String::len),
    }
}

/// The cache; `limit` bytes at most (keys, values and [`ENTRY_OVERHEAD`] counted).
#[derive(Debug, Default)]
pub(crate) struct ValueCache {
    map: HashMap<CacheKey, Cached>,
    order: VecDeque<CacheKey>,
    bytes: usize,
    limit: usize,
}

impl ValueCache {
    pub(crate) fn new(limit: usize) -> Self {
        ValueCache { limit, ..Default::default() }
    }

    pub(crate) fn get(&self, key: &CacheKey) -> Option<&Cached> {
        self.map.get(key)
    }

    /// Bytes held.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Keep `value` under `key` (replacing what was there), evicting the oldest entries to
    /// stay within the limit. A value over a quarter of the limit is not kept.
    pub(crate) fn insert(&mut self, key: CacheKey, value: Cached) {
        self.remove(&key);
        let size = key_len(&key) + value_len(&value) + ENTRY_OVERHEAD;
        if size > self.limit / 4 {
            return;
        }
        while self.bytes + size > self.limit {
            let Some(old) = self.order.pop_front() else { break };
            self.remove(&old);
        }
        self.bytes += size;
        self.order.push_back(key.clone());
        self.map.insert(key, value);
        // Replaced keys leave stale places in `order`; compact it before it grows past the map.
        if self.order.len() > 2 * self.map.len() + 16 {
            let map = &self.map;
            let mut seen = std::collections::HashSet::new();
            let mut order: Vec<CacheKey> = self.order.drain(..).rev().filter(|k| map.contains_key(k) && seen.insert(k.clone())).collect();
            order.reverse();
            self.order = order.into();
        }
    }

    fn remove(&mut self, key: &CacheKey) {
        if let Some(value) = self.map.remove(key) {
            self.bytes -= key_len(key) + value_len(&value) + ENTRY_OVERHEAD;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_stays_within_its_bytes() {
        let mut cache = ValueCache::new(10_000);
        for i in 0..1000 {
            cache.insert(CacheKey::Step(format!("k{i}")), Cached::Step("x".repeat(100)));
            assert!(cache.bytes() <= 10_000);
        }
        // The newest are kept, the oldest evicted.
        assert!(cache.get(&CacheKey::Step("k999".into())).is_some());
        assert!(cache.get(&CacheKey::Step("k0".into())).is_none());
        // Too big to keep: not kept, and an older value under the key is dropped.
        cache.insert(CacheKey::Step("k999".into()), Cached::Step("y".repeat(5000)));
        assert!(cache.get(&CacheKey::Step("k999".into())).is_none());
        // Rewriting one key many times keeps the order compact.
        for _ in 0..10_000 {
            cache.insert(CacheKey::Agent("a".into()), Cached::Agent(None));
        }
        assert!(cache.order.len() <= 2 * cache.map.len() + 16);
        assert!(cache.bytes() <= 10_000);
    }
}
