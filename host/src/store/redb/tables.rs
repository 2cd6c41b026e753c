//! The redb tables of the store and the schema version they form. Keys are ours: run ids
//! are UUIDv7 text, journal keys are (run id, step key | agent key hex), progress is keyed
//! by (run id, seq) so a run's entries are one contiguous, ordered range.

use redb::TableDefinition;

/// The layout version this build writes. On open, a store of version 1 (every progress entry
/// a row of its own, read as it is) or 2 (step values in [`STEPS_V2`], agent rows with no
/// place) has its step rows moved to [`STEPS`]; a store of version 1 to 4 is then marked
/// 5: values of step, agent and progress rows in the [`codec`](crate::store::codec)'s form
/// (which reads every older raw value as it is), frames compressed with a dictionary of
/// [`DICTIONARIES`] among them, blobs compressed too (raw ones read as they are), and large
/// step values and replies stored once in [`JOURNAL_VALUES`], their rows holding a
/// [`shared`](crate::store::shared) reference (no older row is one); a store of any other
/// version is refused (a newer one with a message saying so).
pub const SCHEMA_VERSION: u64 = 5;

/// `"schema_version"` -> version; `"next_run_seq"` -> creation counter.
pub const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// Run id -> run record (JSON).
pub const RUNS: TableDefinition<&str, &[u8]> = TableDefinition::new("runs");
/// Creation seq -> run id: runs in creation order.
pub const RUN_ORDER: TableDefinition<u64, &str> = TableDefinition::new("run_order");
/// (run id, step key) -> the value's place in the journal, then its JSON text in the value
/// codec's form (see `rows.rs`).
pub const STEPS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("step_rows");
/// Schema 2's step table: (run id, step key) -> JSON value. Emptied into [`STEPS`] and
/// deleted on open.
pub const STEPS_V2: TableDefinition<(&str, &str), &str> = TableDefinition::new("steps");
/// (run id, agent key) -> outcome: `2` for an ordinary failure, `3` for a reply, then its
/// place in the journal and the reply's JSON (see `rows.rs`); schema 2 wrote `0` and `1` +
/// JSON, with no place.
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
/// Component sha256 -> component bytes (content-addressed), in the
/// [`codec`](crate::store::codec)'s blob form (compressed; raw before schema 5).
pub const BLOBS: TableDefinition<&str, &[u8]> = TableDefinition::new("blobs");
/// Run id -> the run's module manifest (JSON; see `modules.rs`).
pub const RUN_MODULES: TableDefinition<&str, &[u8]> = TableDefinition::new("run_modules");
/// Shared value hash (SHA-256 of its JSON text) -> the value in the value codec's form: large
/// step values and replies, stored once (see [`shared`](crate::store::shared)).
pub const JOURNAL_VALUES: TableDefinition<&[u8], &[u8]> = TableDefinition::new("journal_values");
/// Shared value hash -> how many journal rows refer to it (a value counted 0 is deleted).
pub const JOURNAL_VALUE_REFS: TableDefinition<&[u8], u64> = TableDefinition::new("journal_value_refs");
/// (dictionary ID, piece) -> a piece of a zstd dictionary the store trained (see
/// `settle.rs`), in order, each of [`DICTIONARY_PIECE_BYTES`] but the last: the frames that
/// name the dictionary decode with it. Never deleted (any row may use it); one a store as
/// this build trains them.
pub const DICTIONARIES: TableDefinition<(u32, u32), &[u8]> = TableDefinition::new("dictionaries");

/// Bytes of a piece of a dictionary: 4,000, one to a 4 KiB leaf. A value larger than a page takes a run of pages
/// of its own, which a compaction moves only into a free run of its size below it: where
/// packing left the free pages scattered, a 64 KiB dictionary written late kept most of the
/// file from being given back. Pieces live in ordinary leaves.
pub const DICTIONARY_PIECE_BYTES: usize = 4000;
