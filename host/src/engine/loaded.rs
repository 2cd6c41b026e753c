//! The factories a host has loaded, kept by component hash so that a run's resume in the same
//! host (a long-lived `factory serve` resuming a run it started) skips reading the stored
//! component, deserializing its compiled code and asking its `meta` again. A handful are kept,
//! the least recently used leaving first; a component's hash names its bytes, so a kept
//! factory is what loading them again would give.

use std::sync::Mutex;

/// How many loaded factories a host keeps.
pub(crate) const KEPT: usize = 8;

/// Values by key, at most `capacity`, most recently used last.
pub(crate) struct Kept<T> {
    entries: Mutex<Vec<(String, T)>>,
    capacity: usize,
}

impl<T: Clone> Kept<T> {
    /// Room for `capacity` values.
    pub(crate) fn new(capacity: usize) -> Self {
        Kept { entries: Mutex::new(Vec::with_capacity(capacity)), capacity }
    }

    /// The value of `key`, if kept (it becomes the most recently used).
    pub(crate) fn get(&self, key: &str) -> Option<T> {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let at = entries.iter().position(|(k, _)| k == key)?;
        let entry = entries.remove(at);
        let value = entry.1.clone();
        entries.push(entry);
        Some(value)
    }

    /// Keep `value` under `key` (the least recently used leaves when full).
    pub(crate) fn keep(&self, key: &str, value: T) {
        if self.capacity == 0 {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.retain(|(k, _)| k != key);
        if entries.len() >= self.capacity {
            entries.remove(0);
        }
        entries.push((key.to_string(), value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_leaves_first() {
        let kept = Kept::new(3);
        assert_eq!(kept.get("a"), None);
        for (key, value) in [("a", 1), ("b", 2), ("c", 3)] {
            kept.keep(key, value);
        }
        assert_eq!(kept.get("a"), Some(1), "a is now the most recently used");
        kept.keep("d", 4);
        assert_eq!(kept.get("b"), None, "b was the least recently used");
        assert_eq!((kept.get("a"), kept.get("c"), kept.get("d")), (Some(1), Some(3), Some(4)));
        kept.keep("c", 30);
        assert_eq!(kept.get("c"), Some(30), "keeping a key again replaces its value");
        kept.keep("e", 5);
        assert_eq!(kept.get("a"), None);
        let none = Kept::new(0);
        none.keep("a", 1);
        assert_eq!(none.get("a"), None, "a capacity of 0 keeps nothing");
    }
}
