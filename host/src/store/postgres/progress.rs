//! Reading a run's progress from the PostgreSQL store: a page of entries (forwards after a
//! seq, backwards before one or from the tail, optionally one phase's, fetched in chunks
//! until the page is full), each given the title of its phase (entries store the seq of the
//! entry that set it, resolved once per read), and the run's last seq.

use super::{pg, PoolHandle};
use crate::model::progress::ProgressEntry;
use crate::store::records::{decode_progress, phase_title, title_set_by, PhaseTitle};
use crate::store::{ProgressQuery, StoreError};
use std::collections::HashMap;

/// Rows fetched at a time when a phase filter may skip some.
const CHUNK: i64 = 500;

fn db_seq(seq: u64) -> i64 {
    i64::try_from(seq).unwrap_or(i64::MAX)
}

/// Progress entries of a run, paged (see [`ProgressQuery`]), in ascending seq order.
pub(super) async fn read(
    pool: &PoolHandle,
    run_id: &str,
    query: &ProgressQuery,
) -> Result<Vec<ProgressEntry>, StoreError> {
    let limit = query.limit();
    let mut lo = query.after_seq.map_or(0, |s| s.saturating_add(1));
    let mut hi = query.before_seq.map_or(u64::MAX, |s| s.saturating_sub(1));
    if lo > hi || query.before_seq == Some(0) {
        return Ok(Vec::new());
    }
    let client = pool.get().await?;
    let e = |e| pg(&pool.url, e);
    let forwards = query.after_seq.is_some();
    let chunk = if query.phase.is_some() { CHUNK } else { limit as i64 };
    let sql = if forwards {
        "SELECT seq, entry FROM progress WHERE run_id = $1 AND seq >= $2 AND seq <= $3 ORDER BY seq ASC LIMIT $4"
    } else {
        "SELECT seq, entry FROM progress WHERE run_id = $1 AND seq >= $2 AND seq <= $3 ORDER BY seq DESC LIMIT $4"
    };
    let mut titles: HashMap<u64, Option<String>> = HashMap::new();
    let mut out = Vec::new();
    'pages: loop {
        let rows = client.query(sql, &[&run_id, &db_seq(lo), &db_seq(hi), &chunk]).await.map_err(e)?;
        let fetched = rows.len() as i64;
        for row in rows {
            let seq = row.get::<_, i64>(0).max(0) as u64;
            let mut stored = decode_progress(row.get::<_, &[u8]>(1))?;
            let phase = match phase_title(&mut stored) {
                PhaseTitle::Known(title) => title,
                PhaseTitle::SetAt(at) => match titles.get(&at) {
                    Some(title) => title.clone(),
                    None => {
                        let title = title_at(&client, &pool.url, run_id, at).await?;
                        titles.insert(at, title.clone());
                        title
                    }
                },
            };
            if forwards {
                lo = seq.saturating_add(1);
            } else {
                hi = seq.saturating_sub(1);
            }
            if query.phase.as_deref().is_none_or(|p| phase.as_deref() == Some(p)) {
                out.push(ProgressEntry { seq: stored.seq, at_ms: stored.at_ms, phase, event: stored.event });
                if out.len() >= limit {
                    break 'pages;
                }
            }
            if seq == 0 {
                break 'pages;
            }
        }
        if fetched < chunk || lo > hi {
            break;
        }
    }
    if !forwards {
        out.reverse();
    }
    Ok(out)
}

/// The title the phase entry at `seq` set.
async fn title_at(
    client: &tokio_postgres::Client,
    url: &str,
    run_id: &str,
    seq: u64,
) -> Result<Option<String>, StoreError> {
    let row = client
        .query_opt("SELECT entry FROM progress WHERE run_id = $1 AND seq = $2", &[&run_id, &db_seq(seq)])
        .await
        .map_err(|e| pg(url, e))?;
    match row {
        Some(row) => title_set_by(row.get::<_, &[u8]>(0)),
        None => Ok(None),
    }
}

/// The highest progress seq of a run (0 when it has none).
pub(super) async fn last_seq(pool: &PoolHandle, run_id: &str) -> Result<u64, StoreError> {
    let client = pool.get().await?;
    let row = client
        .query_one("SELECT coalesce(max(seq), 0) FROM progress WHERE run_id = $1", &[&run_id])
        .await
        .map_err(|e| pg(&pool.url, e))?;
    Ok(row.get::<_, i64>(0).max(0) as u64)
}
