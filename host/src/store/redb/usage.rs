//! Where a redb store's bytes go: [`StoreUsage`], per table the entries, the bytes of their
//! keys and values, the pages its B-tree takes and the bytes those pages leave unused, and for
//! the file its size, the pages allocated to live data and those free (left by copy-on-write
//! commits, reused by later ones; the file does not shrink without compaction). Read by
//! `tests/store_size.rs` and quoted in README's "Storage: where the bytes go".

use super::RedbStore;
use crate::store::StoreError;
use redb::{ReadableDatabase, ReadableTableMetadata, TableHandle};

/// One table's share of the store.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TableUsage {
    /// The table's name (see `tables.rs`).
    pub name: String,
    /// Rows.
    pub entries: u64,
    /// Bytes of the rows' keys and values as stored.
    pub stored_bytes: u64,
    /// Leaf pages holding the rows.
    pub leaf_pages: u64,
    /// Branch pages indexing them.
    pub branch_pages: u64,
    /// Bytes of the table's pages that hold nothing (half-full leaves, a value's page run
    /// rounded up to a power of two).
    pub fragmented_bytes: u64,
    /// Bytes of the keys in its branch pages, and other metadata.
    pub metadata_bytes: u64,
}

impl TableUsage {
    /// Bytes of the file the table takes: its rows, the room its pages leave unused, its
    /// branches.
    pub fn bytes(&self) -> u64 {
        self.stored_bytes + self.fragmented_bytes + self.metadata_bytes
    }
}

/// Where a store's bytes go.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoreUsage {
    /// The file's size (0 for a store that is not a file).
    pub file_bytes: u64,
    /// The disk space the file takes (its allocated blocks: redb grows the file ahead of its
    /// use, and a tail never written takes no space).
    pub disk_bytes: u64,
    /// redb's page size.
    pub page_size: u64,
    /// Pages holding live data (every table, redb's own metadata).
    pub allocated_pages: u64,
    /// Each table, by name.
    pub tables: Vec<TableUsage>,
}

/// One part of a store's bytes, as `factory stats` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StorePart {
    /// What the bytes hold (`journal values`, `progress and agent summaries`, ...).
    pub part: String,
    /// Bytes of the file it takes.
    pub bytes: u64,
    /// Rows (0 for the file's own parts: page overhead, free pages).
    pub rows: u64,
}

/// Which part of [`StoreUsage::parts`] a table's rows are.
fn part_of(table: &str) -> &'static str {
    match table {
        "step_rows" | "steps" | "agents" => "journal values (step values, agent replies)",
        "progress" => "progress records (entries, agent summaries)",
        "runs" | "run_order" | "live_accounting" | "journal_usage" | "run_modules" => {
            "run records (envelopes, accounting, module lists)"
        }
        "journal_values" | "journal_value_refs" => "shared journal values (large step values and replies, once each)",
        "blobs" | "factories" => "components and registrations",
        "dictionaries" => "compression dictionaries (pieces)",
        _ => "store metadata",
    }
}

impl StoreUsage {
    /// Where the file's bytes go, by part: the rows of each part (keys and values as
    /// stored), then the room the tables' pages leave unused and their branches (page
    /// overhead), redb's own pages, and the pages free (the file's tail included).
    pub fn parts(&self) -> Vec<StorePart> {
        let mut parts: Vec<StorePart> = Vec::new();
        let mut overhead = 0u64;
        for table in &self.tables {
            let name = part_of(&table.name);
            // A shared value's count is a row of its own table: the part's rows are the values.
            let rows = if table.name == "journal_value_refs" { 0 } else { table.entries };
            match parts.iter_mut().find(|p| p.part == name) {
                Some(part) => {
                    part.bytes += table.stored_bytes;
                    part.rows += rows;
                }
                None => parts.push(StorePart { part: name.into(), bytes: table.stored_bytes, rows }),
            }
            overhead += table.fragmented_bytes + table.metadata_bytes;
        }
        let tables: u64 = self.tables.iter().map(TableUsage::bytes).sum();
        let allocated = self.allocated_pages.saturating_mul(self.page_size);
        parts.push(StorePart {
            part: "page overhead (unused room in pages, branches)".into(),
            bytes: overhead,
            rows: 0,
        });
        parts.push(StorePart {
            part: "redb's own pages (allocator, table roots)".into(),
            bytes: allocated.saturating_sub(tables),
            rows: 0,
        });
        parts.push(StorePart {
            part: "free pages (reused by later commits)".into(),
            bytes: self.free_bytes(),
            rows: 0,
        });
        parts
    }
    /// The table `name`'s usage, if it exists.
    pub fn table(&self, name: &str) -> Option<&TableUsage> {
        self.tables.iter().find(|t| t.name == name)
    }

    /// Bytes of the file's pages that hold no live data (free pages, the file's tail).
    pub fn free_bytes(&self) -> u64 {
        self.file_bytes.saturating_sub(self.allocated_pages.saturating_mul(self.page_size))
    }
}

impl RedbStore {
    /// Where the store's bytes go, as of its last commit. Waits for the writer's current
    /// commit (the page counts are read in a write transaction, then abandoned).
    pub fn usage(&self) -> Result<StoreUsage, StoreError> {
        let txn = self.db.get().begin_read()?;
        let mut tables = Vec::new();
        for handle in txn.list_tables()? {
            let name = handle.name().to_string();
            let table = txn.open_untyped_table(handle)?;
            let stats = table.stats()?;
            tables.push(TableUsage {
                name,
                entries: table.len()?,
                stored_bytes: stats.stored_bytes(),
                leaf_pages: stats.leaf_pages(),
                branch_pages: stats.branch_pages(),
                fragmented_bytes: stats.fragmented_bytes(),
                metadata_bytes: stats.metadata_bytes(),
            });
        }
        tables.sort_by(|a, b| a.name.cmp(&b.name));
        let write = self.db.get().begin_write()?;
        let stats = write.stats()?;
        write.abort()?;
        let (file_bytes, disk_bytes) = match &self.path {
            Some(path) => {
                use std::os::unix::fs::MetadataExt;
                let file = std::fs::metadata(path)
                    .map_err(|e| StoreError::File { path: path.clone(), source: std::sync::Arc::new(e) })?;
                (file.len(), file.blocks().saturating_mul(512))
            }
            None => (0, 0),
        };
        Ok(StoreUsage {
            file_bytes,
            disk_bytes,
            page_size: stats.page_size() as u64,
            allocated_pages: stats.allocated_pages(),
            tables,
        })
    }
}
