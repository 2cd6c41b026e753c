//! What an operator sees of the workers of a shared store (`factory workers`): each worker's
//! row (id, host, pid, generation, lease) with the runs it owns, read on a connection of
//! its own, without registering as a worker or migrating anything.

use super::{pg, redact, schema::SCHEMA_VERSION, url};
use crate::store::StoreError;
use serde::Serialize;

/// One worker of a shared store.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkerInfo {
    /// Its id.
    pub id: String,
    /// The machine it runs on.
    pub host: String,
    /// Its process id there.
    pub pid: i32,
    /// Its generation (raised each time it registers, or is fenced).
    pub generation: i64,
    /// Seconds its lease has left (0 once it ran out).
    pub lease_seconds: f64,
    /// Whether its lease is current.
    pub live: bool,
    /// When it registered (RFC 3339, UTC).
    pub started_at: String,
    /// Runs it owns: executing, or claimed from the queue and about to.
    pub runs: i64,
    /// Their ids, oldest first.
    pub run_ids: Vec<String>,
}

/// Every worker of the store at `url`, by id. An empty database has none; a schema newer than
/// this build is refused ([`StoreError::Version`]). `password`: as [`url::config`] takes it.
pub async fn list(url: &str, password: Option<&str>) -> Result<Vec<WorkerInfo>, StoreError> {
    let config = url::config(url, password)?;
    let shown = redact(url);
    let e = |e| pg(&shown, e);
    let (client, connection) = config.connect(tokio_postgres::NoTls).await.map_err(e)?;
    let driver = tokio::spawn(connection);
    let version: Option<i64> = client
        .query_one("SELECT CASE WHEN to_regclass('factory_schema') IS NULL THEN NULL ELSE 0 END::int8", &[])
        .await
        .map_err(e)?
        .get(0);
    if version.is_none() {
        driver.abort();
        return Ok(Vec::new());
    }
    let found: i64 =
        client.query_one("SELECT coalesce(max(version), 0) FROM factory_schema", &[]).await.map_err(e)?.get(0);
    if found > SCHEMA_VERSION {
        driver.abort();
        return Err(StoreError::Version { found: found as u64, expected: SCHEMA_VERSION as u64 });
    }
    let rows = client
        .query(
            "SELECT w.id, w.host, w.pid, w.generation,
                    greatest(extract(epoch FROM w.lease_until - now()), 0)::float8,
                    w.lease_until > now(),
                    to_char(w.started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
                    (SELECT count(*) FROM runs r WHERE r.owner = w.id),
                    coalesce((SELECT array_agg(r.id ORDER BY r.seq) FROM runs r WHERE r.owner = w.id), '{}')
             FROM workers w ORDER BY w.id",
            &[],
        )
        .await
        .map_err(e)?;
    driver.abort();
    Ok(rows
        .iter()
        .map(|row| WorkerInfo {
            id: row.get(0),
            host: row.get(1),
            pid: row.get(2),
            generation: row.get(3),
            lease_seconds: row.get(4),
            live: row.get(5),
            started_at: row.get(6),
            runs: row.get(7),
            run_ids: row.get(8),
        })
        .collect())
}
