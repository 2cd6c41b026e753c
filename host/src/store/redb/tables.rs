//! The redb tables of the store and the schema version they form. Keys are ours: run ids
//! are UUIDv7 text, journal keys are (run id, step key | agent key hex), progress is keyed
//! by (run id, seq) so a run's entries are one contiguous, ordered range.

use redb::TableDefinition;

/// The layout version this build writes. Version 1 (every progress entry a row of its own)
/// is read as it is and marked 2 on open; a store of any other version is refused.
pub const SCHEMA_VERSION: u64 = 2;

/// `"schema_version"` -> version; `"next_run_seq"` -> creation counter.
pub const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// Run id -> run record (JSON).
pub const RUNS: TableDefinition<&str, &[u8]> = TableDefinition::new("runs");
/// Creation seq -> run id: runs in creation order.
pub const RUN_ORDER: TableDefinition<u64, &str> = TableDefinition::new("run_order");
/// (run id, step key) -> JSON value.
pub const STEPS: TableDefinition<(&str, &str), &str> = TableDefinition::new("steps");
/// (run id, agent key) -> outcome: `0` for an ordinary failure, `1` + JSON for a reply.
pub const AGENTS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("agents");
/// (run id, seq of the row's last entry) -> progress entries: one entry's JSON, or a chunk of
/// several (see `progress.rs`).
pub const PROGRESS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("progress");
/// Run id -> latest accounting of the running attempt (JSON), so a crash loses no spend.
pub const LIVE_ACCOUNTING: TableDefinition<&str, &[u8]> = TableDefinition::new("live_accounting");
/// Run id -> bytes the run has journaled (steps, agent outcomes, progress), all attempts.
pub const JOURNAL_USAGE: TableDefinition<&str, u64> = TableDefinition::new("journal_usage");
/// Factory name -> registration (JSON: hash, meta, added at).
pub const FACTORIES: TableDefinition<&str, &[u8]> = TableDefinition::new("factories");
/// Component sha256 -> component bytes (content-addressed).
pub const BLOBS: TableDefinition<&str, &[u8]> = TableDefinition::new("blobs");
/// Run id -> the run's module manifest (JSON; see `modules.rs`).
pub const RUN_MODULES: TableDefinition<&str, &[u8]> = TableDefinition::new("run_modules");

/// Encode an agent outcome for [`AGENTS`] (decoded by [`crate::store::journal::decode_outcome`]).
pub use crate::store::journal::encode_outcome;
