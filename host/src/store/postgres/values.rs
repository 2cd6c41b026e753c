//! The PostgreSQL store's shared journal values ([`shared`](crate::store::shared)), in the
//! `journal_values` table (migration 9: hash, count of the rows referring to it, the value in
//! the codec's form). A commit counts the values its rows share ([`SHARE`]), uncounts those
//! the rows it overwrites referred to ([`RELEASE_OVERWRITTEN`]) and deletes the values
//! counted 0 ([`DELETE_UNREFERENCED`], through a partial index that holds only those), in its
//! transaction; a deletion of a run's rows does the same, a batch of rows a transaction
//! ([`delete_rows`]). A load fetches the values its rows refer to in one query ([`fetch`]).
//!
//! The SQL finds references by their form: a step value of 41 bytes starting `&`, an agent
//! outcome of 42 bytes starting `1 &` (the reply's tag, then the reference); the hash is the
//! last 32 bytes.

use crate::store::shared::{decode_inline, is_reference, Hash, Reference, SharedError, HASH, REFERENCE};
use std::borrow::Cow;
use std::collections::HashMap;

/// Count the values a commit's rows share: hashes, counts, values (in the codec's form), in
/// hash order (so concurrent commits lock the rows in one order).
pub(super) const SHARE: &str = "INSERT INTO journal_values (hash, refs, value)
     SELECT * FROM unnest($1::bytea[], $2::int8[], $3::bytea[]) ORDER BY 1
     ON CONFLICT (hash) DO UPDATE SET refs = journal_values.refs + EXCLUDED.refs";

/// Uncount the values the rows a commit overwrites refer to: the step rows of ($1 run ids,
/// $2 keys) and the agent rows of ($3, $4) as they are before the commit writes them.
pub(super) const RELEASE_OVERWRITTEN: &str = "UPDATE journal_values j SET refs = j.refs - o.n FROM (
       SELECT hash, count(*) AS n FROM (
         SELECT substring(s.value FROM 10 FOR 32) AS hash FROM steps s
           JOIN unnest($1::text[], $2::bytea[]) AS u(run_id, key) ON s.run_id = u.run_id AND s.key = u.key
           WHERE octet_length(s.value) = 41 AND substring(s.value FOR 1) = '\\x26'::bytea
         UNION ALL
         SELECT substring(a.outcome FROM 11 FOR 32) FROM agents a
           JOIN unnest($3::text[], $4::bytea[]) AS u(run_id, key) ON a.run_id = u.run_id AND a.key = u.key
           WHERE octet_length(a.outcome) = 42 AND substring(a.outcome FOR 2) = '\\x0126'::bytea
       ) AS old GROUP BY hash
     ) AS o WHERE j.hash = o.hash";

/// Delete the values no row counts any more (the partial index `journal_values_unreferenced`
/// holds only those: the statement reads nothing else).
pub(super) const DELETE_UNREFERENCED: &str = "DELETE FROM journal_values WHERE refs <= 0";

/// Delete a batch of run $1's rows of `steps` (up to $2 rows), uncounting the values they
/// refer to; answers the rows deleted and the values uncounted.
const DELETE_STEPS: &str = "WITH gone AS (
       DELETE FROM steps WHERE ctid = ANY(ARRAY(SELECT ctid FROM steps WHERE run_id = $1 LIMIT $2)) RETURNING value AS v
     ), released AS (
       UPDATE journal_values j SET refs = j.refs - o.n FROM (
         SELECT substring(v FROM 10 FOR 32) AS hash, count(*) AS n FROM gone
           WHERE octet_length(v) = 41 AND substring(v FOR 1) = '\\x26'::bytea GROUP BY 1
       ) AS o WHERE j.hash = o.hash RETURNING 1
     ) SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM released)";

/// [`DELETE_STEPS`] for `agents`.
const DELETE_AGENTS: &str = "WITH gone AS (
       DELETE FROM agents WHERE ctid = ANY(ARRAY(SELECT ctid FROM agents WHERE run_id = $1 LIMIT $2)) RETURNING outcome AS v
     ), released AS (
       UPDATE journal_values j SET refs = j.refs - o.n FROM (
         SELECT substring(v FROM 11 FOR 32) AS hash, count(*) AS n FROM gone
           WHERE octet_length(v) = 42 AND substring(v FOR 2) = '\\x0126'::bytea GROUP BY 1
       ) AS o WHERE j.hash = o.hash RETURNING 1
     ) SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM released)";

/// The journal tables whose rows may refer to shared values.
#[derive(Debug, Clone, Copy)]
pub(super) enum Rows {
    Steps,
    Agents,
}

/// SQLSTATE of a deadlock PostgreSQL broke by aborting one transaction: two transactions
/// counting the same shared values in another order. The transaction did nothing; it is
/// tried again.
pub(super) const DEADLOCK_SQLSTATE: &str = "40P01";

/// Tries of a deletion's batch aborted by a deadlock.
const DEADLOCK_TRIES: u32 = 5;

/// Whether `error` is a deadlock the server broke ([`DEADLOCK_SQLSTATE`]).
pub(super) fn is_deadlock(error: &tokio_postgres::Error) -> bool {
    error.code().is_some_and(|code| code.code() == DEADLOCK_SQLSTATE)
}

/// Delete run `run_id`'s rows of `table`, `batch` at a time, each batch in its own short
/// transaction with the uncounting of the shared values its rows referred to (and the
/// deletion of those counted 0). The rows deleted.
pub(super) async fn delete_rows(
    client: &mut tokio_postgres::Client,
    table: Rows,
    run_id: &str,
    batch: i64,
) -> Result<u64, tokio_postgres::Error> {
    let statement = match table {
        Rows::Steps => DELETE_STEPS,
        Rows::Agents => DELETE_AGENTS,
    };
    let mut deleted = 0u64;
    let mut tries = 0;
    loop {
        let attempt = async {
            let tx = client.transaction().await?;
            let row = tx.query_one(statement, &[&run_id, &batch]).await?;
            let (gone, released) = (row.get::<_, i64>(0), row.get::<_, i64>(1));
            if released > 0 {
                tx.execute(DELETE_UNREFERENCED, &[]).await?;
            }
            tx.commit().await?;
            Ok::<_, tokio_postgres::Error>(gone)
        };
        match attempt.await {
            Ok(0) => return Ok(deleted),
            Ok(gone) => {
                deleted += gone as u64;
                tries = 0;
            }
            Err(e) if is_deadlock(&e) && tries + 1 < DEADLOCK_TRIES => tries += 1,
            Err(e) => return Err(e),
        }
    }
}

/// The shared values of `hashes` (each once), as stored (the codec's form): those the
/// store does not keep are absent.
pub(super) async fn fetch(
    client: &tokio_postgres::Client,
    hashes: &[Vec<u8>],
) -> Result<HashMap<Hash, Vec<u8>>, tokio_postgres::Error> {
    let mut out = HashMap::with_capacity(hashes.len());
    if hashes.is_empty() {
        return Ok(out);
    }
    let rows = client.query("SELECT hash, value FROM journal_values WHERE hash = ANY($1::bytea[])", &[&hashes]).await?;
    for row in rows {
        let Ok(hash) = <Hash>::try_from(row.get::<_, &[u8]>(0)) else { continue };
        out.insert(hash, row.get::<_, Vec<u8>>(1));
    }
    Ok(out)
}

/// The hash a stored value names, if it is a reference (of [`REFERENCE`] bytes): the shared
/// value a load fetches for it.
pub(super) fn hash_of(stored: &[u8]) -> Option<Vec<u8>> {
    (is_reference(stored) && stored.len() == REFERENCE).then(|| stored[REFERENCE - HASH..].to_vec())
}

/// The JSON text a row's stored value holds: decoded when inline, else `kept` (the shared
/// value its reference names, as stored; `None` when the store does not keep it) checked
/// against the reference.
pub(super) fn resolve<'a>(stored: &'a [u8], kept: Option<&[u8]>) -> Result<Cow<'a, [u8]>, SharedError> {
    match Reference::parse(stored) {
        None => decode_inline(stored, None),
        Some(reference) => {
            let reference = reference?;
            let kept = kept.ok_or_else(|| SharedError::Missing(hex::encode(reference.hash)))?;
            reference.check(kept, None).map(Cow::Owned)
        }
    }
}
