//! The redb form of a journal row's value: each step value and agent outcome keeps its place
//! in the run's journal (the run's journal bytes counted with it, which grows with every
//! put), so a load can lay a run's entries out in the order a replay asks for them while the
//! tables keep them in key order. Rows that schema 2 wrote have no place: they read as place
//! 0, before every newer entry, in key order.

use crate::store::journal::UnknownOutcome;

/// Bytes a step row keeps before its JSON text: the place, u64 little-endian.
pub(super) const PLACE: usize = 8;

/// An agent row with a place: `2` (an ordinary failure) or `3` (a reply, its JSON text
/// after the place); rows of schema 2 are [`encode_outcome`](crate::store::journal::encode_outcome)'s
/// `0` and `1` + JSON, with no place.
const PLACED: u8 = 2;

/// A step row (the [`STEPS`](super::tables::STEPS) table): the place, then the JSON text,
/// written into `out` (cleared first).
pub(super) fn encode_step(place: u64, json: &str, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&place.to_le_bytes());
    out.extend_from_slice(json.as_bytes());
}

/// A step row's place and JSON text.
pub(super) fn decode_step(bytes: &[u8]) -> Result<(u64, &str), BadRow> {
    let (place, json) = split_place(bytes)?;
    Ok((place, std::str::from_utf8(json).map_err(|_| BadRow::NotUtf8)?))
}

/// A step row's place and JSON text's bytes, not checked as UTF-8 (whoever reads the text
/// checks it).
pub(super) fn step_parts(bytes: &[u8]) -> Result<(u64, &[u8]), BadRow> {
    split_place(bytes)
}

/// An agent row (the [`AGENTS`](super::tables::AGENTS) table) of an outcome in
/// [`encode_outcome`](crate::store::journal::encode_outcome)'s form, with its place,
/// written into `out` (cleared first).
pub(super) fn encode_agent(place: u64, outcome: &[u8], out: &mut Vec<u8>) {
    out.clear();
    let (tag, json) = outcome.split_first().map_or((0, &[][..]), |(tag, json)| (*tag, json));
    out.push(tag.saturating_add(PLACED));
    out.extend_from_slice(&place.to_le_bytes());
    out.extend_from_slice(json);
}

/// An agent row's place (0 for a row of schema 2) and outcome: `None` for an ordinary
/// failure, else the reply's JSON text.
pub(super) fn decode_agent(bytes: &[u8]) -> Result<(u64, Option<&str>), BadRow> {
    match agent_parts(bytes)? {
        (place, 0, _) => Ok((place, None)),
        (place, _, json) => Ok((place, Some(std::str::from_utf8(json).map_err(|_| BadRow::NotUtf8)?))),
    }
}

/// An agent row's place (0 for a row of schema 2), its tag in
/// [`encode_outcome`](crate::store::journal::encode_outcome)'s form (`0` alone, or `1`
/// before the reply) and its reply's bytes, not checked as UTF-8 (whoever reads the reply
/// checks it).
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

/// Bytes of an agent row that are its place (0 for a row of schema 2).
pub(super) fn place_bytes(row: &[u8]) -> usize {
    match row.first() {
        Some(&tag) if tag >= PLACED => PLACE,
        _ => 0,
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::journal::encode_outcome;

    #[test]
    fn rows_keep_their_place_and_schema_2_rows_read_as_place_0() {
        let mut row = Vec::new();
        encode_step(42, "\"v\"", &mut row);
        assert_eq!(decode_step(&row).unwrap(), (42, "\"v\""));
        for outcome in [None, Some("{\"a\":1}")] {
            encode_agent(7, &encode_outcome(outcome), &mut row);
            assert_eq!(decode_agent(&row).unwrap(), (7, outcome));
            assert_eq!(decode_agent(&encode_outcome(outcome)).unwrap(), (0, outcome), "schema 2's form");
        }
        assert!(matches!(decode_step(b"short"), Err(BadRow::Short)));
        assert!(matches!(decode_step(&[0, 0, 0, 0, 0, 0, 0, 0, 0xff]), Err(BadRow::NotUtf8)));
        for bad in [&[][..], &[0, 1], &[4], &[2, 1], &[3, 0, 0, 0, 0, 0, 0, 0, 0, 0xff], &[1, 0xff]] {
            assert!(decode_agent(bad).is_err(), "{bad:?}");
        }
        assert!(decode_agent(&[2, 0, 0, 0, 0, 0, 0, 0, 0]).is_ok(), "a failure with its place");
        // The parts a load keeps, their text not yet checked.
        assert_eq!(step_parts(&[5, 0, 0, 0, 0, 0, 0, 0, 0xff]).unwrap(), (5, &[0xff][..]));
        assert_eq!(agent_parts(&[3, 5, 0, 0, 0, 0, 0, 0, 0, 0xff]).unwrap(), (5, 1, &[0xff][..]));
        assert_eq!(agent_parts(&[0]).unwrap(), (0, 0, &[][..]));
        assert!(agent_parts(&[2, 0, 0, 0, 0, 0, 0, 0, 0, b'x']).is_err(), "a failure with a reply");
    }
}
