//! The redb store's shared journal values ([`shared`](crate::store::shared)): counting a row
//! that refers to one ([`share`], storing the value when it is new) and one that no longer
//! does ([`release`], deleting the value at 0), both inside the write transaction of the row,
//! and resolving a row's stored value, inline or shared ([`resolve`]).

use super::tables::{JOURNAL_VALUES, JOURNAL_VALUE_REFS};
use crate::store::codec::{self, Dictionaries};
use crate::store::shared::{decode_inline, Reference, SharedError};
use crate::store::StoreError;
use redb::{ReadableTable, Table, WriteTransaction};
use std::borrow::Cow;

/// The shared values table of a write transaction.
pub(super) type Values<'txn> = Table<'txn, &'static [u8], &'static [u8]>;
/// The shared values' counts of a write transaction.
pub(super) type Refs<'txn> = Table<'txn, &'static [u8], u64>;

/// One more row refers to `reference`, the JSON text `raw`: its count goes up, and the value
/// is stored (in the codec's form, compressed with the newest of `dictionaries` if any) when
/// nothing counted it yet.
pub(super) fn share(
    values: &mut Values,
    refs: &mut Refs,
    reference: &Reference,
    raw: &[u8],
    dictionaries: Option<&Dictionaries>,
) -> Result<(), StoreError> {
    let key = &reference.hash[..];
    let count = refs.get(key)?.map_or(0, |n| n.value());
    if count == 0 {
        let mut stored = Vec::new();
        codec::encode_with(raw, &mut stored, dictionaries);
        values.insert(key, stored.as_slice())?;
    }
    refs.insert(key, count.saturating_add(1))?;
    Ok(())
}

/// One row fewer refers to `reference`: its count goes down, and the value is deleted at 0.
pub(super) fn release(values: &mut Values, refs: &mut Refs, reference: &Reference) -> Result<(), StoreError> {
    let key = &reference.hash[..];
    let count = refs.get(key)?.map_or(0, |n| n.value());
    match count {
        0 | 1 => {
            refs.remove(key)?;
            values.remove(key)?;
        }
        n => {
            refs.insert(key, n - 1)?;
        }
    }
    Ok(())
}

/// Release every reference of `released` (the rows a deletion took), in `txn`.
pub(super) fn release_all(txn: &WriteTransaction, released: &[Reference]) -> Result<(), StoreError> {
    if released.is_empty() {
        return Ok(());
    }
    let mut values = txn.open_table(JOURNAL_VALUES)?;
    let mut refs = txn.open_table(JOURNAL_VALUE_REFS)?;
    for reference in released {
        release(&mut values, &mut refs, reference)?;
    }
    Ok(())
}

/// The JSON text a row's stored value holds: decoded (with `dictionaries` when its frame
/// names one) when inline, read from `values` and checked when a reference. A value that cannot be read is the inner error (the caller
/// answers it as corrupt, or leaves it unloaded); the outer one is the database's.
pub(super) fn resolve<'a>(
    values: &impl ReadableTable<&'static [u8], &'static [u8]>,
    stored: &'a [u8],
    dictionaries: Option<&Dictionaries>,
) -> Result<Result<Cow<'a, [u8]>, SharedError>, StoreError> {
    let reference = match Reference::parse(stored) {
        None => return Ok(decode_inline(stored, dictionaries)),
        Some(Err(e)) => return Ok(Err(e)),
        Some(Ok(reference)) => reference,
    };
    let Some(kept) = values.get(&reference.hash[..])? else {
        return Ok(Err(SharedError::Missing(hex::encode(reference.hash))));
    };
    Ok(reference.check(kept.value(), dictionaries).map(Cow::Owned))
}
