//! Collecting the PostgreSQL store's blobs once nothing refers to them ([`collect`]), and
//! the check that keeps a blob a start just put ([`keep`]; see
//! [`store::blobs`](crate::store::blobs) for the race). Both take the advisory lock
//! [`BLOB_LOCK`] inside their transaction: a collection holds it alone while it reads every
//! reference and deletes, a check shares it. A check made after a record is committed thus
//! either runs before a collection (which then reads that record) or waits for one to end
//! (and finds what it deleted, and stores it again): whichever worker does which.

use super::{pg, PoolHandle};
use crate::store::blobs::Referenced;
use crate::store::StoreError;
use futures::TryStreamExt;
use std::sync::Arc;

/// The advisory lock of blob collection (`"factory"` in ASCII, then 2).
const BLOB_LOCK: i64 = 0x6661_6374_6f72_7902;

/// Every value of column 0 of `query`, handed to `read` row by row as the server sends them,
/// until every one of `stored` is found referred to.
async fn each_row(
    tx: &tokio_postgres::Transaction<'_>,
    url: &str,
    query: &str,
    (refs, stored): (&mut Referenced, &[String]),
    read: fn(&mut Referenced, &[u8]) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    if refs.covers(stored) {
        return Ok(());
    }
    let no_params: [&str; 0] = [];
    let rows = tx.query_raw(query, no_params).await.map_err(|e| pg(url, e))?;
    let mut rows = std::pin::pin!(rows);
    while let Some(row) = rows.try_next().await.map_err(|e| pg(url, e))? {
        read(refs, row.get::<_, &[u8]>(0))?;
        if refs.covers(stored) {
            break;
        }
    }
    Ok(())
}

/// Delete those of `candidates` nothing refers to (runs, registrations, module records,
/// queued starts, the manifests scripts name), in one transaction holding [`BLOB_LOCK`]
/// alone; the hashes deleted.
pub(super) async fn collect(pool: &PoolHandle, candidates: Vec<String>) -> Result<Vec<String>, StoreError> {
    let url = pool.url.clone();
    let e = |e| pg(&url, e);
    let mut client = pool.get().await?;
    let tx = client.transaction().await.map_err(e)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&BLOB_LOCK]).await.map_err(e)?;
    // Each statement from here reads what was committed when it began (read committed):
    // every record committed before the lock was taken.
    let stored: Vec<String> = tx
        .query("SELECT hash FROM blobs WHERE hash = ANY($1)", &[&candidates])
        .await
        .map_err(e)?
        .iter()
        .map(|row| row.get(0))
        .collect();
    if stored.is_empty() {
        return Ok(Vec::new());
    }
    let mut refs = Referenced::default();
    let each = (&mut refs, &stored[..]);
    each_row(&tx, &url, "SELECT record FROM runs", each, Referenced::run).await?;
    let each = (&mut refs, &stored[..]);
    each_row(&tx, &url, "SELECT registration FROM factories", each, Referenced::registration).await?;
    let each = (&mut refs, &stored[..]);
    each_row(&tx, &url, "SELECT manifest FROM run_modules", each, Referenced::manifest).await?;
    let each = (&mut refs, &stored[..]);
    each_row(&tx, &url, "SELECT start FROM run_queue WHERE start IS NOT NULL", each, Referenced::start).await?;
    let manifests = refs.manifests();
    for row in tx.query("SELECT bytes FROM blobs WHERE hash = ANY($1)", &[&manifests]).await.map_err(e)? {
        refs.manifest(row.get::<_, &[u8]>(0))?;
    }
    let dead = refs.unreferenced(&stored);
    if !dead.is_empty() {
        tx.execute("DELETE FROM blobs WHERE hash = ANY($1)", &[&dead]).await.map_err(e)?;
    }
    tx.commit().await.map_err(e)?;
    Ok(dead)
}

/// After a committed record referring to them: store again those of the pinned blobs `due`
/// a collection deleted, in one transaction sharing [`BLOB_LOCK`]; the hashes stored again.
pub(super) async fn keep(pool: &PoolHandle, due: Vec<(String, Arc<[u8]>)>) -> Result<Vec<String>, StoreError> {
    let url = pool.url.clone();
    let e = |e| pg(&url, e);
    let mut client = pool.get().await?;
    let tx = client.transaction().await.map_err(e)?;
    tx.execute("SELECT pg_advisory_xact_lock_shared($1)", &[&BLOB_LOCK]).await.map_err(e)?;
    let hashes: Vec<&str> = due.iter().map(|(hash, _)| hash.as_str()).collect();
    let present: std::collections::HashSet<String> = tx
        .query("SELECT hash FROM blobs WHERE hash = ANY($1)", &[&hashes])
        .await
        .map_err(e)?
        .iter()
        .map(|row| row.get(0))
        .collect();
    let mut stored = Vec::new();
    for (hash, bytes) in due.iter().filter(|(hash, _)| !present.contains(hash)) {
        tx.execute(
            "INSERT INTO blobs (hash, bytes) VALUES ($1, $2) ON CONFLICT (hash) DO NOTHING",
            &[hash, &&bytes[..]],
        )
        .await
        .map_err(e)?;
        stored.push(hash.clone());
    }
    tx.commit().await.map_err(e)?;
    Ok(stored)
}
