//! How journal values are stored: the value codec every store shares. A value of at least
//! [`RAW_BELOW`] bytes (and at most [`MAX_DECODED_BYTES`]) is stored as one zstd frame at
//! [`LEVEL`] when that is smaller, anything else as it is. A zstd frame starts with the bytes
//! `28 b5 2f fd`, and no JSON text starts with `(` (0x28): so a stored value that starts with
//! them is compressed, and every value written before compression existed (raw JSON, or a
//! progress chunk's 0 tag) reads as it is, with no marker of its own. A raw value that would
//! start with those bytes is always compressed, so the two never meet.
//!
//! Decompression is bounded: the frame must declare its size, at most
//! [`MAX_DECODED_BYTES`] (no value larger is ever compressed), the buffer is that size and no
//! larger, and a frame that does not fill it exactly is refused. A value that cannot be
//! decoded is a [`CodecError`], which the stores answer as a typed corrupt-record error,
//! never a panic.

use std::borrow::Cow;
use std::cell::RefCell;

/// zstd's level for journal values: chosen by measurement on 2 KiB English replies
/// (`tests/store_size.rs`): level 1 kept 55.0 % of the bytes, 3 kept 54.1 %, 9 53.3 %, 19
/// 52.9 %; 3 costs about as little time as 1 at these sizes.
pub const LEVEL: i32 = 3;

/// Values shorter than this are stored raw: a frame's header and the first literals cost
/// more than short text saves (an `"ok"` reply, a number).
pub const RAW_BELOW: usize = 96;

/// The largest value stored compressed, and so the most a stored value can decompress to: a
/// corrupt or hostile frame cannot make a read allocate more. Larger values (over the 16 MiB
/// a step value or a reply may hold, escaped as JSON) are stored raw.
pub const MAX_DECODED_BYTES: usize = 64 << 20;

/// The first bytes of a zstd frame: a stored value that starts with them is compressed.
const MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// A stored value that starts as a zstd frame but cannot be decoded.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CodecError {
    /// The frame does not say how large its content is (this codec always writes it).
    #[error("a compressed value whose frame does not declare its size")]
    NoSize,
    /// The frame declares more than [`MAX_DECODED_BYTES`].
    #[error("a compressed value declaring {0} bytes, over the {MAX_DECODED_BYTES} byte bound")]
    TooLarge(u64),
    /// The frame's header cannot be read.
    #[error("a compressed value that does not decode: its frame header cannot be read")]
    NoHeader,
    /// The memory for the decoded value cannot be had.
    #[error("a compressed value that does not decode: {0}")]
    NoMemory(#[source] std::collections::TryReserveError),
    /// The frame is damaged.
    #[error("a compressed value that does not decode: {0}")]
    Damaged(#[source] std::sync::Arc<std::io::Error>),
    /// The frame decodes to another size than it declares.
    #[error("a compressed value that does not decode: {decoded} bytes where its frame declares {declared}")]
    WrongSize { decoded: usize, declared: usize },
}

thread_local! {
    static COMPRESSOR: RefCell<Option<zstd::bulk::Compressor<'static>>> = const { RefCell::new(None) };
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

/// Whether `stored` is a compressed value.
pub fn is_compressed(stored: &[u8]) -> bool {
    stored.starts_with(&MAGIC)
}

/// Append the stored form of `raw` to `out`.
pub fn encode_into(raw: &[u8], out: &mut Vec<u8>) {
    let must = is_compressed(raw);
    if (raw.len() >= RAW_BELOW && raw.len() <= MAX_DECODED_BYTES) || must {
        let frame = COMPRESSOR.with(|c| {
            let mut c = c.borrow_mut();
            if c.is_none() {
                *c = zstd::bulk::Compressor::new(LEVEL).ok();
            }
            c.as_mut()?.compress(raw).ok()
        });
        if let Some(frame) = frame {
            if frame.len() < raw.len() || must {
                out.extend_from_slice(&frame);
                return;
            }
        }
    }
    out.extend_from_slice(raw);
}

/// The stored form of `raw`.
pub fn encode(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(raw, &mut out);
    out
}

/// An agent outcome in [`encode_outcome`](crate::store::journal::encode_outcome)'s form
/// (`0`, or `1` + the reply's JSON), stored: its tag, then its reply's stored form.
pub fn encode_outcome(outcome: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(outcome.len());
    match outcome.split_first() {
        Some((tag, json)) => {
            out.push(*tag);
            encode_into(json, &mut out);
        }
        None => out.extend_from_slice(outcome),
    }
    out
}

/// A stored agent outcome ([`encode_outcome`]) back in
/// [`encode_outcome`](crate::store::journal::encode_outcome)'s form: borrowed when its reply
/// was stored raw (as every outcome before compression was).
pub fn decode_outcome(stored: &[u8]) -> Result<Cow<'_, [u8]>, CodecError> {
    match stored.split_first() {
        Some((tag, json)) if is_compressed(json) => {
            let json = decode(json)?;
            let mut out = Vec::with_capacity(json.len() + 1);
            out.push(*tag);
            out.extend_from_slice(&json);
            Ok(Cow::Owned(out))
        }
        _ => Ok(Cow::Borrowed(stored)),
    }
}

/// The size `stored` decodes to, read from the frame's header without decoding it.
pub fn decoded_len(stored: &[u8]) -> Result<usize, CodecError> {
    if !is_compressed(stored) {
        return Ok(stored.len());
    }
    match zstd::zstd_safe::get_frame_content_size(stored) {
        Ok(Some(n)) if n <= MAX_DECODED_BYTES as u64 => Ok(n as usize),
        Ok(Some(n)) => Err(CodecError::TooLarge(n)),
        Ok(None) => Err(CodecError::NoSize),
        Err(_) => Err(CodecError::NoHeader),
    }
}

/// The value `stored` holds: itself when raw, else its frame decoded (bounded, see the
/// module's doc).
pub fn decode(stored: &[u8]) -> Result<Cow<'_, [u8]>, CodecError> {
    if !is_compressed(stored) {
        return Ok(Cow::Borrowed(stored));
    }
    let size = decoded_len(stored)?;
    let mut out = Vec::new();
    out.try_reserve_exact(size).map_err(CodecError::NoMemory)?;
    DECOMPRESSOR.with(|d| {
        let mut d = d.borrow_mut();
        // The thread's decompressor, made on first use and put back after.
        let mut decompressor = match d.take() {
            Some(decompressor) => decompressor,
            None => zstd::bulk::Decompressor::new().map_err(|e| CodecError::Damaged(e.into()))?,
        };
        let decoded = decompressor.decompress_to_buffer(stored, &mut out);
        *d = Some(decompressor);
        let n = decoded.map_err(|e| CodecError::Damaged(e.into()))?;
        if n != size {
            return Err(CodecError::WrongSize { decoded: n, declared: size });
        }
        Ok(())
    })?;
    Ok(Cow::Owned(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_short_ones_stay_raw_and_raw_values_of_old_read_as_they_are() {
        let long = "The review found nothing to change in this file; the tests cover it. ".repeat(30);
        for raw in [&b"\"ok\""[..], b"", b"{\"a\":1}", long.as_bytes(), &MAGIC[..], b"(not json"] {
            let stored = encode(raw);
            assert_eq!(decode(&stored).unwrap(), raw, "{:?}", String::from_utf8_lossy(raw));
            assert_eq!(decoded_len(&stored).unwrap(), raw.len());
        }
        assert_eq!(encode(b"\"ok\""), b"\"ok\"", "short: raw");
        let stored = encode(long.as_bytes());
        assert!(is_compressed(&stored) && stored.len() < long.len() / 4, "{} of {}", stored.len(), long.len());
        assert!(is_compressed(&encode(&MAGIC)), "a raw value that looks compressed is compressed");
        // What every release before compression wrote: JSON text, a progress chunk's 0 tag.
        for old in [&b"{\"seq\":1}"[..], b"[1,2]", b"\"text\"", b"\x00\x01\x00", b"42"] {
            assert!(matches!(decode(old).unwrap(), Cow::Borrowed(v) if v == old));
        }
        let mut out = b"prefix".to_vec();
        encode_into(long.as_bytes(), &mut out);
        assert_eq!(&out[..6], b"prefix");
        assert_eq!(decode(&out[6..]).unwrap(), long.as_bytes());
    }

    #[test]
    fn outcomes_keep_their_tag_and_compress_their_reply() {
        let reply = format!("\"{}\"", "ordinary words in a reply ".repeat(20));
        let outcome = crate::store::journal::encode_outcome(Some(&reply));
        let stored = encode_outcome(&outcome);
        assert_eq!(stored[0], 1);
        assert!(is_compressed(&stored[1..]) && stored.len() < outcome.len() / 2);
        assert_eq!(decode_outcome(&stored).unwrap(), outcome.as_slice());
        for raw in [&[0u8][..], b"\x01\"ok\"", b""] {
            assert_eq!(encode_outcome(raw), raw, "short: as it is");
            assert!(matches!(decode_outcome(raw).unwrap(), Cow::Borrowed(v) if v == raw));
        }
    }

    #[test]
    fn a_damaged_or_hostile_frame_is_an_error_never_a_panic_nor_a_large_allocation() {
        let long = "word ".repeat(400);
        let stored = encode(long.as_bytes());
        // Cut short, bit-flipped in its body: refused.
        assert!(decode(&stored[..stored.len() - 3]).is_err());
        let mut flipped = stored.clone();
        let last = flipped.len() - 2;
        flipped[last] ^= 0x55;
        assert!(decode(&flipped).is_err() || decode(&flipped).unwrap() != long.as_bytes());
        // A frame declaring 1 TiB is refused before anything is allocated.
        let bomb = zstd::bulk::compress(&vec![0u8; 1 << 16], 1).unwrap();
        let mut header = bomb.clone();
        // Frame header descriptor: content size in 8 bytes (FCS flag 3), single segment.
        header.truncate(4);
        header.extend_from_slice(&[0xe0]);
        header.extend_from_slice(&(1u64 << 40).to_le_bytes());
        header.extend_from_slice(&[0x01, 0x00, 0x00]);
        assert!(matches!(decoded_len(&header), Err(CodecError::TooLarge(n)) if n == 1 << 40));
        assert!(matches!(decode(&header), Err(CodecError::TooLarge(_))));
        // A real bomb within the bound decodes to exactly what it declares.
        assert_eq!(decode(&bomb).unwrap().len(), 1 << 16);
        // The magic alone, or with garbage after it.
        assert!(decode(&MAGIC).is_err());
        assert!(decode(&[0x28, 0xb5, 0x2f, 0xfd, 0xff, 0xff, 0xff]).is_err());
    }
}
