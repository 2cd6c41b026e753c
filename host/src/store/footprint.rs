//! What a journal entry occupies in the store file: the figure a run's journal budget
//! (`maxJournalBytes`) is charged, so that the store grows by at most the budget.
//!
//! redb keeps entries in B-tree leaves of 4 KiB pages. Small entries share a leaf, but a
//! leaf may be only half full after a split, so a small entry is counted twice. An entry
//! larger than a page gets a leaf of its own, allocated as a power-of-two run of pages (a
//! 1 MiB + 1 byte value takes 2 MiB), so it is counted as that run. Branch pages and the
//! file's own headers are small against these and are not counted. Measured on redb 4.6:
//! 1 KiB entries took 2.07x their size, 17 KiB entries 1.89x, 15 MiB entries 1.07x.
//!
//! Entries are charged at their raw size, the bytes the guest controls: the store keeps
//! values compressed when that is smaller ([`codec`](super::codec)), which only leaves the
//! file smaller than the budget says.

/// redb's page size.
const PAGE: u64 = 4096;

/// Per-entry bytes beside key and value in a leaf (offsets, lengths, the tuple key's
/// framing), rounded up.
const ENTRY_OVERHEAD: u64 = 64;

/// Store bytes an entry of `key_bytes` (all parts of the table key together) and
/// `value_bytes` takes: twice its size when it fits a page, else the power-of-two run of
/// pages its leaf is allocated as.
pub fn entry_bytes(key_bytes: usize, value_bytes: usize) -> u64 {
    let bytes = (key_bytes as u64).saturating_add(value_bytes as u64).saturating_add(ENTRY_OVERHEAD);
    if bytes <= PAGE {
        return 2 * bytes;
    }
    let pages = bytes.div_ceil(PAGE);
    pages.checked_next_power_of_two().map_or(u64::MAX, |p| p.saturating_mul(PAGE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_entries_count_twice_and_large_ones_as_their_page_run() {
        assert_eq!(entry_bytes(36, 100), 2 * (36 + 100 + 64));
        // Just past one page: two pages.
        assert_eq!(entry_bytes(0, 4096), 2 * PAGE);
        // Just past 1 MiB: 2 MiB.
        assert_eq!(entry_bytes(40, 1 << 20), 2 << 20);
        // 15 MiB: 16 MiB.
        assert_eq!(entry_bytes(40, 15 << 20), 16 << 20);
        assert_eq!(entry_bytes(usize::MAX, usize::MAX), u64::MAX);
    }
}
