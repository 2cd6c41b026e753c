//! Journal values stored once per store: a step value or an agent reply of at least
//! [`SHARED_FROM`] bytes (its JSON text) is kept in the store's shared values table under the
//! SHA-256 of its text, in the [`codec`]'s stored form, with a count of the journal rows
//! that refer to it; the row keeps a [`Reference`] in its place (its place in the journal
//! does not change). Every run that journals the same bytes shares one stored copy; writing a
//! row counts it (in the row's transaction), deleting a run uncounts each of its references
//! and deletes a value nothing counts any more (in the transaction that deletes the rows).
//!
//! A reference is [`TAG`], the value's length (u64 little-endian) and its hash: 41 bytes. No
//! stored value started with `&` before (JSON text cannot, a zstd frame starts with `(`, a
//! progress chunk with 0), so rows written before read as they are. A reference is resolved
//! by [`Reference::check`]: the stored value must decode to the length and the hash the
//! reference names, else the read is a typed corrupt-record error, as a reference to a value
//! that is not stored is.

use crate::store::codec::{self, CodecError, Dictionaries};
use sha2::{Digest, Sha256};
use std::borrow::Cow;

/// Values (JSON text) of at least this many bytes are stored once, by hash. Measured on a
/// redb file (`tests/shared_values.rs`, 1,000 step values each just over and just under the
/// threshold): a value stored shared that no other run shares costs its reference (41 B in
/// the row), the hash twice as the shared tables' keys and its count, about 113 B more rows
/// than inline, and its leaf's room: on English text at 4 KiB (about 1.9 KB compressed) the
/// values, under random hash keys, share leaves that stay part empty, 795 B a value more
/// than inline (+34 %); at 8 KiB (3.4 KB compressed, a page's worth) 172 B (+4 %); at 16 KiB
/// 176 B (+2 %). Each further run that journals the same value adds its reference only.
/// Shorter values (the 2 KiB replies of `tests/store_size.rs`'s fan-out, tiny replies) stay
/// inline.
pub const SHARED_FROM: usize = 8192;

/// The first byte of a reference.
pub const TAG: u8 = b'&';

/// Bytes of a hash.
pub const HASH: usize = 32;

/// Bytes of a reference: the tag, the length, the hash.
pub const REFERENCE: usize = 1 + 8 + HASH;

/// A shared value's key: the SHA-256 of its JSON text.
pub type Hash = [u8; HASH];

/// A journal row's reference to a shared value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reference {
    /// The value's length (its JSON text, decoded).
    pub len: u64,
    /// The SHA-256 of its JSON text.
    pub hash: Hash,
}

/// Whether the JSON text `raw` is stored shared (else inline in its row).
pub fn shares(raw: &[u8]) -> bool {
    raw.len() >= SHARED_FROM
}

/// Whether a stored value is a reference (well formed or not).
pub fn is_reference(stored: &[u8]) -> bool {
    stored.first() == Some(&TAG)
}

impl Reference {
    /// The reference to the JSON text `raw`.
    pub fn of(raw: &[u8]) -> Reference {
        Reference { len: raw.len() as u64, hash: Sha256::digest(raw).into() }
    }

    /// Its stored form.
    pub fn encode(&self) -> [u8; REFERENCE] {
        let mut out = [0u8; REFERENCE];
        out[0] = TAG;
        out[1..9].copy_from_slice(&self.len.to_le_bytes());
        out[9..].copy_from_slice(&self.hash);
        out
    }

    /// The reference `stored` is: `None` when it is no reference (a value inline), an error
    /// when it starts as one and is not one.
    pub fn parse(stored: &[u8]) -> Option<Result<Reference, SharedError>> {
        if !is_reference(stored) {
            return None;
        }
        let Ok(bytes) = <&[u8; REFERENCE]>::try_from(stored) else {
            return Some(Err(SharedError::Malformed(stored.len())));
        };
        let len = u64::from_le_bytes(bytes[1..9].try_into().unwrap_or_default());
        let hash: Hash = bytes[9..].try_into().unwrap_or_default();
        Some(Ok(Reference { len, hash }))
    }

    /// The value the shared table keeps as `stored` (its codec form, decoded with
    /// `dictionaries` when its frame names one), checked against the reference: its decoded
    /// length and its hash.
    pub fn check(&self, stored: &[u8], dictionaries: Option<&Dictionaries>) -> Result<Vec<u8>, SharedError> {
        let declared = codec::decoded_len(stored)?;
        if declared as u64 != self.len {
            return Err(SharedError::WrongSize {
                hash: hex::encode(self.hash),
                found: declared as u64,
                named: self.len,
            });
        }
        let value = codec::decode_with(stored, dictionaries)?.into_owned();
        let hash: Hash = Sha256::digest(&value).into();
        if hash != self.hash {
            return Err(SharedError::WrongHash(hex::encode(self.hash)));
        }
        Ok(value)
    }
}

/// The length a stored value decodes to: a reference's, or the [`codec`]'s (read from its
/// frame's header).
pub fn decoded_len(stored: &[u8]) -> Result<usize, SharedError> {
    match Reference::parse(stored) {
        Some(reference) => Ok(usize::try_from(reference?.len).unwrap_or(usize::MAX)),
        None => Ok(codec::decoded_len(stored)?),
    }
}

/// A stored value inline (not a reference), decoded; a reference is an error here (its
/// value is in the shared table: the store resolves it).
pub fn decode_inline<'a>(stored: &'a [u8], dictionaries: Option<&Dictionaries>) -> Result<Cow<'a, [u8]>, SharedError> {
    match Reference::parse(stored) {
        Some(reference) => Err(SharedError::Unresolved(hex::encode(reference?.hash))),
        None => Ok(codec::decode_with(stored, dictionaries)?),
    }
}

/// A reference or a shared value that cannot be read: the stores answer it as a typed
/// corrupt-record error.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SharedError {
    /// A value starting as a reference, of another length.
    #[error("a reference to a shared value of {0} bytes, where a reference takes {REFERENCE}")]
    Malformed(usize),
    /// The reference names a value the store does not keep.
    #[error("a reference to the shared value {0}, which is not stored")]
    Missing(String),
    /// A reference read where its value was expected inline.
    #[error("a reference to the shared value {0} read as a value")]
    Unresolved(String),
    /// The shared value decodes to another length than its reference names.
    #[error("the shared value {hash} holds {found} bytes where its reference names {named}")]
    WrongSize { hash: String, found: u64, named: u64 },
    /// The shared value does not hash to its key.
    #[error("the shared value {0} does not hash to its key")]
    WrongHash(String),
    /// The shared value cannot be decoded.
    #[error(transparent)]
    Codec(#[from] CodecError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_round_trip_and_check_what_they_name() {
        let value = format!("\"{}\"", "a long value of ordinary words. ".repeat(300));
        assert!(shares(value.as_bytes()) && !shares(b"\"ok\""));
        let reference = Reference::of(value.as_bytes());
        let stored = reference.encode();
        assert_eq!(Reference::parse(&stored).map(|r| r.ok()), Some(Some(reference)));
        assert_eq!(decoded_len(&stored).ok(), Some(value.len()));
        assert!(matches!(decode_inline(&stored, None), Err(SharedError::Unresolved(_))));
        // Values written before read as they are; a cut reference is an error.
        for inline in [&b"\"ok\""[..], b"{}", b"\x00\x01", b""] {
            assert!(Reference::parse(inline).is_none());
            assert_eq!(decode_inline(inline, None).ok().as_deref(), Some(inline));
        }
        assert!(matches!(Reference::parse(&stored[..20]), Some(Err(SharedError::Malformed(20)))));
        // The value checks against its reference; another value does not.
        let kept = codec::encode(value.as_bytes());
        assert_eq!(reference.check(&kept, None).ok().as_deref(), Some(value.as_bytes()));
        let other = value.replace("long", "LONG");
        assert!(matches!(reference.check(&codec::encode(other.as_bytes()), None), Err(SharedError::WrongHash(_))));
        assert!(matches!(reference.check(b"\"short\"", None), Err(SharedError::WrongSize { .. })));
        assert!(matches!(reference.check(&kept[..kept.len() - 3], None), Err(SharedError::Codec(_))));
    }
}
