//! The redb form of a journal row's value: each step value and agent outcome keeps its place
//! in the run's journal (the run's journal bytes counted with it, which grows with every
//! put), so a load can lay a run's entries out in the order a replay asks for them while the
//! tables keep them in key order. Rows that schema 2 wrote have no place: they read as place
//! 0, before every newer entry, in key order. The JSON text after the place is in the
//! [`codec`]'s stored form (a zstd frame, or raw as every row before schema 4 is).

use crate::store::codec::{self, CodecError, Dictionaries};
use crate::store::journal::UnknownOutcome;
use crate::store::shared::{decode_inline, Reference, SharedError};
use std::borrow::Cow;

/// Bytes a step row keeps before its JSON text: the place, u64 little-endian.
pub(super) const PLACE: usize = 8;

/// An agent row with a place: `2` (an ordinary failure) or `3` (a reply, its JSON text
/// after the place); rows of schema 2 are [`encode_outcome`](crate::store::journal::encode_outcome)'s
/// `0` and `1` + JSON, with no place.
const PLACED: u8 = 2;

/// A step row (the [`STEPS`](super::tables::STEPS) table): the place, then the JSON text
/// in its stored form, written into `out` (cleared first).
/// Compressed with the newest of `dictionaries`, if any.
pub(super) fn encode_step(place: u64, json: &str, out: &mut Vec<u8>, dictionaries: Option<&Dictionaries>) {
    out.clear();
    out.extend_from_slice(&place.to_le_bytes());
    codec::encode_with(json.as_bytes(), out, dictionaries);
}

/// A step row (the [`STEPS`](super::tables::STEPS) table) whose value is shared: the place,
/// then the [`Reference`] to it, written into `out` (cleared first).
pub(super) fn encode_step_reference(place: u64, reference: &Reference, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&place.to_le_bytes());
    out.extend_from_slice(&reference.encode());
}

/// A step row's place and JSON text, for a row whose value is inline (a reference is
/// [`BadRow::Shared`]: the store resolves it, see `values.rs`).
#[cfg(test)]
pub(super) fn decode_step<'a>(
    bytes: &'a [u8],
    dictionaries: Option<&Dictionaries>,
) -> Result<(u64, Cow<'a, str>), BadRow> {
    let (place, stored) = split_place(bytes)?;
    Ok((place, text(decode_inline(stored, dictionaries)?)?))
}

/// A step row's place and JSON text's stored form (decoded by [`codec::decode`], checked as
/// UTF-8 by whoever reads the text).
pub(super) fn step_parts(bytes: &[u8]) -> Result<(u64, &[u8]), BadRow> {
    split_place(bytes)
}

/// Decoded bytes as text.
pub(super) fn text(bytes: Cow<'_, [u8]>) -> Result<Cow<'_, str>, BadRow> {
    match bytes {
        Cow::Borrowed(b) => std::str::from_utf8(b).map(Cow::Borrowed).map_err(|_| BadRow::NotUtf8),
        Cow::Owned(b) => String::from_utf8(b).map(Cow::Owned).map_err(|_| BadRow::NotUtf8),
    }
}

/// An agent row (the [`AGENTS`](super::tables::AGENTS) table) of an outcome in
/// [`encode_outcome`](crate::store::journal::encode_outcome)'s form, with its place,
/// written into `out` (cleared first), compressed with the newest of `dictionaries`, if any.
pub(super) fn encode_agent(place: u64, outcome: &[u8], out: &mut Vec<u8>, dictionaries: Option<&Dictionaries>) {
    out.clear();
    let (tag, json) = outcome.split_first().map_or((0, &[][..]), |(tag, json)| (*tag, json));
    out.push(tag.saturating_add(PLACED));
    out.extend_from_slice(&place.to_le_bytes());
    codec::encode_with(json, out, dictionaries);
}

/// An agent row of a reply that is shared: `3`, the place, then the [`Reference`] to the
/// reply, written into `out` (cleared first).
pub(super) fn encode_agent_reference(place: u64, reference: &Reference, out: &mut Vec<u8>) {
    out.clear();
    out.push(1 + PLACED);
    out.extend_from_slice(&place.to_le_bytes());
    out.extend_from_slice(&reference.encode());
}

/// An agent row's place (0 for a row of schema 2) and outcome: `None` for an ordinary
/// failure, else the reply's JSON text, for a row whose reply is inline (a reference is
/// [`BadRow::Shared`]: the store resolves it, see `values.rs`).
pub(super) fn decode_agent<'a>(
    bytes: &'a [u8],
    dictionaries: Option<&Dictionaries>,
) -> Result<(u64, Option<Cow<'a, str>>), BadRow> {
    match agent_parts(bytes)? {
        (place, 0, _) => Ok((place, None)),
        (place, _, stored) => Ok((place, Some(text(decode_inline(stored, dictionaries)?)?))),
    }
}

/// A step row (`agent` false) or agent row written again into `out` with its value
/// compressed with the newest of `dictionaries` (see `settle.rs`): `false`, `out` left as it
/// is, when the row holds no value to compress (a failure, a short value, a reference to a
/// shared value) or its value already uses that dictionary.
pub(super) fn recode(agent: bool, row: &[u8], dictionaries: &Dictionaries, out: &mut Vec<u8>) -> Result<bool, BadRow> {
    let (place, tag, stored) = match agent {
        true => agent_parts(row)?,
        false => split_place(row).map(|(place, stored)| (place, 1, stored))?,
    };
    if tag == 0
        || stored.len() < codec::RAW_BELOW
        || crate::store::shared::is_reference(stored)
        || codec::dictionary_of(stored) == dictionaries.encoder()
    {
        return Ok(false);
    }
    let raw = codec::decode_with(stored, Some(dictionaries))?;
    out.clear();
    if agent {
        out.push(tag.saturating_add(PLACED));
    }
    out.extend_from_slice(&place.to_le_bytes());
    codec::encode_with(&raw, out, Some(dictionaries));
    Ok(true)
}

/// The shared value a step row refers to, if its value is a well-formed reference (what an
/// overwrite or a deletion of the row releases).
pub(super) fn step_reference(row: &[u8]) -> Option<Reference> {
    step_parts(row).ok().and_then(|(_, stored)| Reference::parse(stored)?.ok())
}

/// The shared value an agent row refers to, as [`step_reference`].
pub(super) fn agent_reference(row: &[u8]) -> Option<Reference> {
    agent_parts(row).ok().and_then(|(_, _, stored)| Reference::parse(stored)?.ok())
}

/// An agent row's place (0 for a row of schema 2), its tag in
/// [`encode_outcome`](crate::store::journal::encode_outcome)'s form (`0` alone, or `1`
/// before the reply) and its reply's stored form (decoded by [`codec::decode`], checked as
/// UTF-8 by whoever reads the reply).
pub(super) fn agent_parts(bytes: &[u8]) -> Result<(u64, u8, &[u8]), BadRow> {
    let (place, tag, json) = match bytes.split_first() {
        Some((&tag, rest)) if tag >= PLACED => {
            let (place, json) = split_place(rest)?;
            (place, tag - PLACED, json)
        }
        Some((&tag, json)) => (0, tag, json),
        None => return Err(BadRow::Outcome(UnknownOutcome)),
    };
    match (tag, json) {
        (0, []) | (1, _) => Ok((place, tag, json)),
        _ => Err(BadRow::Outcome(UnknownOutcome)),
    }
}

fn split_place(bytes: &[u8]) -> Result<(u64, &[u8]), BadRow> {
    let (place, rest) = bytes.split_first_chunk::<PLACE>().ok_or(BadRow::Short)?;
    Ok((u64::from_le_bytes(*place), rest))
}

/// A row of the step or agent table this build did not write.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BadRow {
    /// Shorter than its place.
    #[error("a journal row shorter than its place")]
    Short,
    /// Its text is not UTF-8.
    #[error("a journal row whose text is not UTF-8")]
    NotUtf8,
    /// Not an agent outcome.
    #[error(transparent)]
    Outcome(UnknownOutcome),
    /// Its value is compressed and cannot be decoded.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// Its value is shared and cannot be read (see `values.rs`).
    #[error(transparent)]
    Shared(#[from] SharedError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::journal::encode_outcome;

    #[test]
    fn rows_keep_their_place_and_schema_2_rows_read_as_place_0() {
        let mut row = Vec::new();
        encode_step(42, "\"v\"", &mut row, None);
        assert_eq!(decode_step(&row, None).unwrap(), (42, "\"v\"".into()));
        let long = format!("\"{}\"", "a reply of ordinary words, said twice. ".repeat(20));
        encode_step(43, &long, &mut row, None);
        assert!(row.len() < long.len() / 2, "compressed: {} of {}", row.len(), long.len());
        assert_eq!(decode_step(&row, None).unwrap(), (43, long.as_str().into()));
        for outcome in [None, Some("{\"a\":1}"), Some(long.as_str())] {
            encode_agent(7, &encode_outcome(outcome), &mut row, None);
            assert_eq!(decode_agent(&row, None).unwrap(), (7, outcome.map(Cow::Borrowed)));
            assert_eq!(
                decode_agent(&encode_outcome(outcome), None).unwrap(),
                (0, outcome.map(Cow::Borrowed)),
                "schema 2's form"
            );
        }
        // A damaged frame is an error.
        encode_agent(7, &encode_outcome(Some(&long)), &mut row, None);
        row.truncate(row.len() - 4);
        assert!(matches!(decode_agent(&row, None), Err(BadRow::Shared(SharedError::Codec(_)))));
        // A shared value's row keeps its place and the reference.
        let reference = Reference::of(long.as_bytes());
        encode_step_reference(9, &reference, &mut row);
        assert_eq!(step_parts(&row).unwrap(), (9, &reference.encode()[..]));
        assert!(matches!(decode_step(&row, None), Err(BadRow::Shared(SharedError::Unresolved(_)))));
        encode_agent_reference(9, &reference, &mut row);
        assert_eq!(agent_parts(&row).unwrap(), (9, 1, &reference.encode()[..]));
        assert!(matches!(decode_step(b"short", None), Err(BadRow::Short)));
        assert!(matches!(decode_step(&[0, 0, 0, 0, 0, 0, 0, 0, 0xff], None), Err(BadRow::NotUtf8)));
        for bad in [&[][..], &[0, 1], &[4], &[2, 1], &[3, 0, 0, 0, 0, 0, 0, 0, 0, 0xff], &[1, 0xff]] {
            assert!(decode_agent(bad, None).is_err(), "{bad:?}");
        }
        assert!(decode_agent(&[2, 0, 0, 0, 0, 0, 0, 0, 0], None).is_ok(), "a failure with its place");
        // The parts a load keeps, their text not yet checked.
        assert_eq!(step_parts(&[5, 0, 0, 0, 0, 0, 0, 0, 0xff]).unwrap(), (5, &[0xff][..]));
        assert_eq!(agent_parts(&[3, 5, 0, 0, 0, 0, 0, 0, 0, 0xff]).unwrap(), (5, 1, &[0xff][..]));
        assert_eq!(agent_parts(&[0]).unwrap(), (0, 0, &[][..]));
        assert!(agent_parts(&[2, 0, 0, 0, 0, 0, 0, 0, 0, b'x']).is_err(), "a failure with a reply");
    }
}
