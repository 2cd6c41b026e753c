//! Where a PostgreSQL store's bytes go ([`usage`]), in the [`StoreUsage`] form `factory stats`
//! prints for a redb file, measured by the server: per table of the store's schema its rows,
//! the bytes of those rows as stored (`pg_column_size` of each row: values compressed or
//! moved out of line by TOAST counted as they are kept), its indexes (`pg_indexes_size`), and
//! the rest of what `pg_total_relation_size` counts (page and row headers, free room in pages,
//! dead rows autovacuum has not reclaimed yet). The store's size is the sum of its tables'
//! totals, in the server's pages (`block_size`); nothing of it is free in the redb sense.

use super::{pg, PoolHandle};
use crate::store::{StoreError, StoreUsage, TableUsage};

/// Measure every table of the store's schema, one scan of each.
pub(super) async fn usage(pool: &PoolHandle) -> Result<StoreUsage, StoreError> {
    let url = pool.url.clone();
    let e = |e| pg(&url, e);
    let client = pool.get().await?;
    let page_size: i64 = client.query_one("SELECT current_setting('block_size')::bigint", &[]).await.map_err(e)?.get(0);
    let page_size = u64::try_from(page_size).unwrap_or(8192).max(1);
    let relations = client
        .query(
            "SELECT c.relname::text, pg_total_relation_size(c.oid), pg_relation_size(c.oid), pg_indexes_size(c.oid)
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE c.relkind = 'r' AND n.nspname = current_schema() ORDER BY c.relname",
            &[],
        )
        .await
        .map_err(e)?;
    let mut tables = Vec::new();
    let mut total = 0u64;
    for relation in relations {
        let name: String = relation.get(0);
        let bytes = |i: usize| u64::try_from(relation.get::<_, i64>(i)).unwrap_or(0);
        let (all, heap, indexes) = (bytes(1), bytes(2), bytes(3));
        // The name comes from the catalog; quoted as an identifier all the same.
        let quoted = format!("\"{}\"", name.replace('"', "\"\""));
        let row = client
            .query_one(&format!("SELECT count(*), coalesce(sum(pg_column_size(t.*)), 0)::bigint FROM {quoted} t"), &[])
            .await
            .map_err(e)?;
        let entries = u64::try_from(row.get::<_, i64>(0)).unwrap_or(0);
        let stored = u64::try_from(row.get::<_, i64>(1)).unwrap_or(0).min(all.saturating_sub(indexes));
        total = total.saturating_add(all);
        tables.push(TableUsage {
            name,
            entries,
            stored_bytes: stored,
            leaf_pages: heap / page_size,
            branch_pages: indexes / page_size,
            fragmented_bytes: all.saturating_sub(indexes).saturating_sub(stored),
            metadata_bytes: indexes,
        });
    }
    Ok(StoreUsage {
        file_bytes: total,
        disk_bytes: total,
        page_size,
        allocated_pages: total.div_ceil(page_size),
        tables,
    })
}
