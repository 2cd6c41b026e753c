//! The PostgreSQL store's schema and its versioned migrations. Every worker migrates at
//! connect, inside one transaction holding a transaction-level advisory lock, so workers
//! starting together apply each migration once and in order; a database whose schema is
//! newer than this build knows is refused ([`StoreError::Version`]), never written.
//!
//! Keys a guest or a session chooses (step keys, registration keys, which hold NULs) are
//! `bytea`: PostgreSQL `text` cannot hold a NUL.

use super::pg;
use crate::store::StoreError;

/// The schema version this build writes and reads.
pub const SCHEMA_VERSION: i64 = 9;

/// The notification channel of the run queue: an enqueue or a requeue wakes the claimers.
pub(crate) const QUEUE_CHANNEL: &str = "factory_queue";

/// The advisory lock migrations hold (`"factory"` in ASCII, then 1).
const MIGRATION_LOCK: i64 = 0x6661_6374_6f72_7901;

/// Migration `n` (1-based) brings the schema from version `n - 1` to `n`.
const MIGRATIONS: &[&str] = &[
    // 1: the tables of the redb store, plus the workers and their leases.
    "CREATE TABLE workers (
        id text PRIMARY KEY,
        generation bigint NOT NULL,
        lease_until timestamptz NOT NULL,
        host text NOT NULL,
        pid integer NOT NULL,
        started_at timestamptz NOT NULL DEFAULT now()
    );
    CREATE SEQUENCE run_seq MINVALUE 0 START 0;
    CREATE TABLE runs (
        id text PRIMARY KEY,
        seq bigint NOT NULL UNIQUE,
        status text NOT NULL,
        owner text,
        cancel_requested boolean NOT NULL DEFAULT false,
        record bytea NOT NULL
    );
    CREATE INDEX runs_unfinished ON runs (owner) WHERE status IN ('running', 'pending');
    CREATE TABLE steps (run_id text NOT NULL, key bytea NOT NULL, value bytea NOT NULL, PRIMARY KEY (run_id, key));
    CREATE TABLE agents (run_id text NOT NULL, key bytea NOT NULL, outcome bytea NOT NULL, PRIMARY KEY (run_id, key));
    CREATE TABLE progress (run_id text NOT NULL, seq bigint NOT NULL, entry bytea NOT NULL, PRIMARY KEY (run_id, seq));
    CREATE TABLE live_accounting (run_id text PRIMARY KEY, accounting bytea NOT NULL);
    CREATE TABLE journal_usage (run_id text PRIMARY KEY, bytes bigint NOT NULL);
    CREATE TABLE factories (key bytea PRIMARY KEY, registration bytea NOT NULL);
    CREATE TABLE blobs (hash text PRIMARY KEY, bytes bytea NOT NULL);
    CREATE TABLE run_modules (run_id text PRIMARY KEY, manifest bytea NOT NULL);",
    // 2: the run queue workers claim from, and the per-backend call slots.
    "CREATE TABLE run_queue (
        run_id text PRIMARY KEY,
        enqueued_at timestamptz NOT NULL DEFAULT now(),
        start bytea,
        claimed_by text
    );
    CREATE INDEX run_queue_free ON run_queue (enqueued_at) WHERE claimed_by IS NULL;
    CREATE INDEX runs_owned ON runs (owner) WHERE owner IS NOT NULL;
    CREATE TABLE call_slots (
        backend text NOT NULL,
        slot integer NOT NULL,
        holder text,
        holder_generation bigint,
        PRIMARY KEY (backend, slot)
    );",
    // 3: the fencing check a commit makes inside its transaction, as a statement that fails
    // (SQLSTATE [`FENCE_SQLSTATE`]) when the worker no longer holds its generation and an
    // unexpired lease: the check, the upserts and `COMMIT` can then be pipelined in one round
    // trip, a refused check aborting the transaction so its `COMMIT` commits nothing. The row
    // is read-locked (`FOR KEY SHARE`): a reaper fencing the worker waits for the commit.
    "CREATE FUNCTION factory_fence(worker_id text, held_generation bigint) RETURNS void LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM 1 FROM workers WHERE id = worker_id AND generation = held_generation AND lease_until > now() FOR KEY SHARE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'worker % (generation %) no longer holds its lease', worker_id, held_generation USING ERRCODE = 'FA001';
        END IF;
    END
    $$;",
    // 4: why workers that claimed a queued run could not serve it (worker id -> reason).
    "ALTER TABLE run_queue ADD COLUMN refused jsonb NOT NULL DEFAULT '{}'::jsonb;",
    // 5: each step value's and agent outcome's place in its run's journal (the run's journal
    // bytes counted with it), so a load lays the entries out in the order a replay asks for
    // them; rows journaled before have place 0 (before every newer one).
    "ALTER TABLE steps ADD COLUMN place bigint NOT NULL DEFAULT 0;
    ALTER TABLE agents ADD COLUMN place bigint NOT NULL DEFAULT 0;",
    // 6: the flow budgets the workers share, one row per backend endpoint and key (the flow's
    // key, which names the key by a fingerprint only): a request and a token bucket, their
    // rates (NULL: not metered) and sizes, and until when the server closed it.
    "CREATE TABLE flow_budgets (
        key text PRIMARY KEY,
        request_rate float8,
        request_burst float8 NOT NULL DEFAULT 1,
        requests float8 NOT NULL DEFAULT 0,
        token_rate float8,
        token_burst float8 NOT NULL DEFAULT 1,
        tokens float8 NOT NULL DEFAULT 0,
        refilled_at timestamptz NOT NULL DEFAULT now(),
        closed_until timestamptz
    );",
    // 7: step values and agent replies are stored in the value codec's form (store/codec.rs:
    // a zstd frame when smaller, else raw, as every row before): no table changes, but a build
    // before this one could not read the compressed values, so it must refuse the database.
    "SELECT 1;",
    // 8: a pause asked through a worker that does not execute the run (cleared when the run
    // no longer runs), as `cancel_requested` is for a cancel.
    "ALTER TABLE runs ADD COLUMN pause_requested boolean NOT NULL DEFAULT false;",
    // 9: large step values and replies stored once, by the SHA-256 of their JSON text, with
    // the count of the journal rows referring to them (store/shared.rs); those rows hold a
    // reference instead. The values are compressed already (the codec's form): kept out of
    // line as they are. The partial index holds the values counted 0, which each commit that
    // uncounts deletes.
    "CREATE TABLE journal_values (hash bytea PRIMARY KEY, refs bigint NOT NULL, value bytea NOT NULL);
    ALTER TABLE journal_values ALTER COLUMN value SET STORAGE EXTERNAL;
    CREATE INDEX journal_values_unreferenced ON journal_values (hash) WHERE refs <= 0;",
];

/// The SQLSTATE of `factory_fence` (migration 3) refusing a commit: the worker is fenced.
pub(crate) const FENCE_SQLSTATE: &str = "FA001";

/// Bring the database to [`SCHEMA_VERSION`], serialized across workers by an advisory lock;
/// refuse a newer schema. Returns the version found before migrating (0: an empty database).
pub(super) async fn migrate(client: &mut tokio_postgres::Client, url: &str) -> Result<i64, StoreError> {
    let e = |e| pg(url, e);
    let tx = client.transaction().await.map_err(e)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).await.map_err(e)?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS factory_schema (version bigint PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())")
        .await
        .map_err(e)?;
    let found: i64 = tx.query_one("SELECT coalesce(max(version), 0) FROM factory_schema", &[]).await.map_err(e)?.get(0);
    if found > SCHEMA_VERSION {
        return Err(StoreError::Version { found: found as u64, expected: SCHEMA_VERSION as u64 });
    }
    for version in found + 1..=SCHEMA_VERSION {
        tx.batch_execute(MIGRATIONS[(version - 1) as usize]).await.map_err(e)?;
        tx.execute("INSERT INTO factory_schema (version) VALUES ($1)", &[&version]).await.map_err(e)?;
    }
    tx.commit().await.map_err(e)?;
    Ok(found)
}

#[cfg(test)]
mod tests {
    #[test]
    fn there_is_one_migration_per_version() {
        assert_eq!(super::MIGRATIONS.len() as i64, super::SCHEMA_VERSION);
    }
}
