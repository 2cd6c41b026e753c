//! What a store's group-commit writer has done: [`WriterStats`], counters a caller reads to
//! measure how writes are grouped (the bench, the group-commit tests). Every store with a
//! group-commit writer keeps them.

use std::sync::atomic::AtomicU64;

/// Counters for measuring a store's writer.
#[derive(Debug, Default)]
pub struct WriterStats {
    /// Write transactions committed (each one durable sync).
    pub commits: AtomicU64,
    /// Operations applied (flushes excluded).
    pub ops: AtomicU64,
    /// Notifications sent to the other processes sharing the store (one per commit that
    /// touched a run; a store of one process sends none).
    pub notifies: AtomicU64,
}
