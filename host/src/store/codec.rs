//! How journal values are stored: the value codec every store shares. A value of at least
//! [`RAW_BELOW`] bytes (and at most [`MAX_DECODED_BYTES`]) is stored as one zstd frame at
//! [`LEVEL`] when that is smaller, anything else as it is. A zstd frame starts with the bytes
//! `28 b5 2f fd`, and no JSON text starts with `(` (0x28): so a stored value that starts with
//! them is compressed, and every value written before compression existed (raw JSON, or a
//! progress chunk's 0 tag) reads as it is, with no marker of its own. A raw value that would
//! start with those bytes is always compressed, so the two never meet.
//!
//! A store may hold [`Dictionaries`] (the redb store trains one from the values of the first
//! large run that stops, see `redb/settle.rs`): a frame compressed with one names it in the
//! frame header's dictionary ID (zstd's own field, 0 or absent for a frame without), and is
//! decoded with the same dictionary, prepared once and shared by every thread. A frame naming
//! a dictionary the store does not hold is [`CodecError::MissingDictionary`].
//!
//! Decompression is bounded: the frame must declare its size, at most
//! [`MAX_DECODED_BYTES`] (no value larger is ever compressed), the buffer is that size and no
//! larger, and a frame that does not fill it exactly is refused. A value that cannot be
//! decoded is a [`CodecError`], which the stores answer as a typed corrupt-record error,
//! never a panic. Component bytes ([`encode_blob`], [`decode_blob`]) follow the same rules
//! with their own level and bound ([`MAX_BLOB_BYTES`]).

use std::borrow::Cow;
use std::cell::RefCell;
use std::num::NonZeroU32;
use std::sync::{Arc, RwLock};

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

/// zstd's level for component bytes up to [`BLOB_LEVEL_BELOW`] (written once by the writer
/// thread, read when a host first loads one): on the probe component's 422,326 B (`zstd`
/// 1.5), level 19 kept 27.4 % in some 150 ms, 12 29.7 %, 9 29.8 %, 3 31.8 %.
pub const BLOB_LEVEL: i32 = 19;

/// Component bytes from this size on are compressed at [`BLOB_LEVEL_LARGE`]: level 19 takes
/// about a third of a second a MiB, which every commit would wait for.
pub const BLOB_LEVEL_BELOW: usize = 1 << 20;

/// zstd's level for component bytes of [`BLOB_LEVEL_BELOW`] or more.
pub const BLOB_LEVEL_LARGE: i32 = 9;

/// The largest component bytes stored compressed, and so the most a stored one can
/// decompress to: the sandbox's limit on a component's size (256 MiB). Larger ones (which the
/// sandbox refuses to load anyway) are stored raw.
pub const MAX_BLOB_BYTES: usize = 256 << 20;

/// The most bytes a trained dictionary may take: 64 KiB.
pub const MAX_DICTIONARY_BYTES: usize = 64 << 10;

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
    /// The frame was compressed with a dictionary the store does not hold.
    #[error("a compressed value that names dictionary {0}, which the store does not hold")]
    MissingDictionary(u32),
    /// Stored dictionary bytes that zstd cannot prepare.
    #[error("dictionary {0} cannot be prepared: it is not a zstd dictionary")]
    BadDictionary(u32),
    /// Training a dictionary failed (too few or too uniform samples).
    #[error("no dictionary could be trained: {0}")]
    Training(#[source] std::sync::Arc<std::io::Error>),
}

/// A dictionary prepared once for both directions: decoding every frame that names it, and
/// (the store's newest) encoding new values.
struct Prepared {
    id: u32,
    decoder: zstd::zstd_safe::DDict<'static>,
    encoder: zstd::zstd_safe::CDict<'static>,
}

/// The dictionaries a store holds, by ID, prepared: the frames naming them decode, and new
/// values are compressed with the newest ([`Dictionaries::encoder`]). Empty for a store
/// without (PostgreSQL's, a new redb store). Shared by the store's threads.
#[derive(Default)]
pub struct Dictionaries {
    prepared: RwLock<Vec<Arc<Prepared>>>,
}

impl std::fmt::Debug for Dictionaries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dictionaries").field("ids", &self.ids()).finish()
    }
}

impl Dictionaries {
    /// Prepare the dictionary `bytes` stored under `id` (which its own header must name) and
    /// hold it; the newest added is the one new values are compressed with.
    pub fn add(&self, id: u32, bytes: &[u8]) -> Result<(), CodecError> {
        if zstd::zstd_safe::get_dict_id_from_dict(bytes).map(NonZeroU32::get) != Some(id) {
            return Err(CodecError::BadDictionary(id));
        }
        let decoder = zstd::zstd_safe::DDict::try_create(bytes).ok_or(CodecError::BadDictionary(id))?;
        let encoder = zstd::zstd_safe::CDict::try_create(bytes, LEVEL).ok_or(CodecError::BadDictionary(id))?;
        let mut prepared = self.prepared.write().unwrap_or_else(|p| p.into_inner());
        prepared.retain(|p| p.id != id);
        prepared.push(Arc::new(Prepared { id, decoder, encoder }));
        Ok(())
    }

    /// The IDs held, oldest first.
    pub fn ids(&self) -> Vec<u32> {
        self.prepared.read().unwrap_or_else(|p| p.into_inner()).iter().map(|p| p.id).collect()
    }

    /// The ID new values are compressed with, if any.
    pub fn encoder(&self) -> Option<u32> {
        self.newest().map(|p| p.id)
    }

    fn newest(&self) -> Option<Arc<Prepared>> {
        self.prepared.read().unwrap_or_else(|p| p.into_inner()).last().cloned()
    }

    fn get(&self, id: u32) -> Option<Arc<Prepared>> {
        self.prepared.read().unwrap_or_else(|p| p.into_inner()).iter().find(|p| p.id == id).cloned()
    }
}

/// Train a dictionary of at most `max_bytes` ([`MAX_DICTIONARY_BYTES`] at most) from
/// `samples` (raw values), its header naming `id` (zstd's trainer picks a random one, which
/// is replaced: the store numbers its dictionaries).
pub fn train(samples: &[&[u8]], max_bytes: usize, id: NonZeroU32) -> Result<Vec<u8>, CodecError> {
    let training = |e: std::io::Error| CodecError::Training(Arc::new(e));
    let mut dictionary = zstd::dict::from_samples(samples, max_bytes.min(MAX_DICTIONARY_BYTES)).map_err(training)?;
    // A zstd dictionary: its magic (4 bytes), then its ID, u32 little-endian.
    let header = zstd::zstd_safe::get_dict_id_from_dict(&dictionary).is_some();
    match dictionary.get_mut(4..8) {
        Some(field) if header => field.copy_from_slice(&id.get().to_le_bytes()),
        _ => return Err(training(std::io::Error::other("the trainer returned no dictionary header"))),
    }
    Ok(dictionary)
}

thread_local! {
    /// The thread's compression context, and the buffer a frame is written to.
    static COMPRESSOR: RefCell<Option<(zstd::zstd_safe::CCtx<'static>, Vec<u8>)>> = const { RefCell::new(None) };
    static DECOMPRESSOR: RefCell<Option<zstd::zstd_safe::DCtx<'static>>> = const { RefCell::new(None) };
}

/// Whether `stored` is a compressed value.
pub fn is_compressed(stored: &[u8]) -> bool {
    stored.starts_with(&MAGIC)
}

/// The ID of the dictionary the frame `stored` was compressed with, if it is a frame that
/// names one.
pub fn dictionary_of(stored: &[u8]) -> Option<u32> {
    if !is_compressed(stored) {
        return None;
    }
    zstd::zstd_safe::get_dict_id_from_frame(stored).map(NonZeroU32::get)
}

/// Append the stored form of `raw` to `out`, compressed per value.
pub fn encode_into(raw: &[u8], out: &mut Vec<u8>) {
    encode_with(raw, out, None);
}

/// Append the stored form of `raw` to `out`: compressed with the newest of `dictionaries`
/// when there is one, else per value.
pub fn encode_with(raw: &[u8], out: &mut Vec<u8>, dictionaries: Option<&Dictionaries>) {
    let dictionary = dictionaries.and_then(Dictionaries::newest);
    encode_at(raw, out, LEVEL, MAX_DECODED_BYTES, dictionary.as_deref());
}

/// Append the stored form of `raw` to `out`: a frame at `level` when `raw` is
/// [`RAW_BELOW`]..=`max` bytes long and that is smaller (always when `raw` looks like a
/// frame), else `raw` itself.
fn encode_at(raw: &[u8], out: &mut Vec<u8>, level: i32, max: usize, dictionary: Option<&Prepared>) {
    let must = is_compressed(raw);
    if (raw.len() >= RAW_BELOW && raw.len() <= max) || must {
        let done = COMPRESSOR.with(|c| {
            let mut c = c.borrow_mut();
            if c.is_none() {
                *c = zstd::zstd_safe::CCtx::try_create().map(|context| (context, Vec::new()));
            }
            let (context, frame) = c.as_mut()?;
            frame.clear();
            frame.reserve(zstd::zstd_safe::compress_bound(raw.len()));
            let written = match dictionary {
                Some(dictionary) => context.compress_using_cdict(frame, raw, &dictionary.encoder),
                None => {
                    context.set_parameter(zstd::zstd_safe::CParameter::CompressionLevel(level)).ok()?;
                    context.compress2(frame, raw)
                }
            };
            let n = written.ok()?;
            if n < raw.len() || must {
                out.extend_from_slice(&frame[..n]);
                // A large frame's buffer is not kept for the thread's life.
                if frame.capacity() > 1 << 20 {
                    *frame = Vec::new();
                }
                return Some(());
            }
            None
        });
        if done.is_some() {
            return;
        }
    }
    out.extend_from_slice(raw);
}

/// The stored form of component bytes: compressed at [`BLOB_LEVEL`] (or
/// [`BLOB_LEVEL_LARGE`]) up to [`MAX_BLOB_BYTES`], never with a dictionary.
pub fn encode_blob(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let level = if raw.len() < BLOB_LEVEL_BELOW { BLOB_LEVEL } else { BLOB_LEVEL_LARGE };
    encode_at(raw, &mut out, level, MAX_BLOB_BYTES, None);
    out
}

/// Component bytes from their stored form ([`encode_blob`]; raw as every blob before schema
/// 5), bounded by [`MAX_BLOB_BYTES`].
pub fn decode_blob(stored: Vec<u8>) -> Result<Vec<u8>, CodecError> {
    if !is_compressed(&stored) {
        return Ok(stored);
    }
    decode_bounded(&stored, MAX_BLOB_BYTES, None).map(Cow::into_owned)
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

fn damaged(e: std::io::Error) -> CodecError {
    CodecError::Damaged(Arc::new(e))
}

/// The size `stored` decodes to, read from the frame's header without decoding it.
pub fn decoded_len(stored: &[u8]) -> Result<usize, CodecError> {
    decoded_len_within(stored, MAX_DECODED_BYTES)
}

fn decoded_len_within(stored: &[u8], max: usize) -> Result<usize, CodecError> {
    if !is_compressed(stored) {
        return Ok(stored.len());
    }
    match zstd::zstd_safe::get_frame_content_size(stored) {
        Ok(Some(n)) if n <= max as u64 => Ok(n as usize),
        Ok(Some(n)) => Err(CodecError::TooLarge(n)),
        Ok(None) => Err(CodecError::NoSize),
        Err(_) => Err(CodecError::NoHeader),
    }
}

/// The value `stored` holds: itself when raw, else its frame decoded (bounded, see the
/// module's doc). A frame that names a dictionary is [`CodecError::MissingDictionary`]: see
/// [`decode_with`].
pub fn decode(stored: &[u8]) -> Result<Cow<'_, [u8]>, CodecError> {
    decode_with(stored, None)
}

/// [`decode`], a frame that names a dictionary decoded with that of `dictionaries`.
pub fn decode_with<'a>(stored: &'a [u8], dictionaries: Option<&Dictionaries>) -> Result<Cow<'a, [u8]>, CodecError> {
    decode_bounded(stored, MAX_DECODED_BYTES, dictionaries)
}

fn decode_bounded<'a>(
    stored: &'a [u8],
    max: usize,
    dictionaries: Option<&Dictionaries>,
) -> Result<Cow<'a, [u8]>, CodecError> {
    if !is_compressed(stored) {
        return Ok(Cow::Borrowed(stored));
    }
    let size = decoded_len_within(stored, max)?;
    let dictionary = match dictionary_of(stored) {
        Some(id) => Some(dictionaries.and_then(|d| d.get(id)).ok_or(CodecError::MissingDictionary(id))?),
        None => None,
    };
    let mut out = Vec::new();
    out.try_reserve_exact(size).map_err(CodecError::NoMemory)?;
    DECOMPRESSOR.with(|d| {
        let mut d = d.borrow_mut();
        // The thread's context, made on first use.
        if d.is_none() {
            *d = zstd::zstd_safe::DCtx::try_create();
        }
        let context = d.as_mut().ok_or_else(|| damaged(std::io::Error::other("no zstd context")))?;
        let decoded = match &dictionary {
            Some(dictionary) => context.decompress_using_ddict(&mut out, stored, &dictionary.decoder),
            None => context.decompress(&mut out, stored),
        };
        let n = decoded.map_err(|code| damaged(std::io::Error::other(zstd::zstd_safe::get_error_name(code))))?;
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

    /// Replies alike as one model's are: the same words and phrasing, in other orders.
    fn replies(n: usize, seed: u64) -> Vec<String> {
        let words = [
            "the", "review", "found", "nothing", "to", "change", "in", "this", "file", "tests", "cover", "it", "a",
            "function", "returns", "error", "when", "input", "is", "empty", "and", "caller", "checks", "result",
            "module", "reads", "config", "once", "at", "start",
        ];
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                let mut reply = String::from("\"");
                while reply.len() < 600 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    reply += words[(x % words.len() as u64) as usize];
                    reply += if x.is_multiple_of(11) { ". " } else { " " };
                }
                reply + "\""
            })
            .collect()
    }

    fn dictionary(id: u32) -> Vec<u8> {
        let samples = replies(400, 7);
        let samples: Vec<&[u8]> = samples.iter().map(|s| s.as_bytes()).collect();
        train(&samples, 8 << 10, NonZeroU32::new(id).unwrap()).expect("a dictionary")
    }

    #[test]
    fn a_frame_compressed_with_a_dictionary_names_it_and_decodes_with_it() {
        let dictionaries = Dictionaries::default();
        let trained = dictionary(40_000);
        assert_eq!(zstd::zstd_safe::get_dict_id_from_dict(&trained).map(NonZeroU32::get), Some(40_000));
        dictionaries.add(40_000, &trained).expect("prepared");
        assert_eq!(dictionaries.encoder(), Some(40_000));
        let (mut alone, mut with) = (0, 0);
        for reply in replies(50, 99) {
            let mut stored = Vec::new();
            encode_with(reply.as_bytes(), &mut stored, Some(&dictionaries));
            assert_eq!(dictionary_of(&stored), Some(40_000));
            assert_eq!(decoded_len(&stored).unwrap(), reply.len());
            assert_eq!(decode_with(&stored, Some(&dictionaries)).unwrap(), reply.as_bytes());
            with += stored.len();
            alone += encode(reply.as_bytes()).len();
        }
        assert!(with < alone, "{with} B with the dictionary, {alone} B without");
        // Frames without one, and raw values, read as before; short values stay raw.
        let plain = encode(replies(1, 5)[0].as_bytes());
        assert_eq!(dictionary_of(&plain), None);
        assert_eq!(decode_with(&plain, Some(&dictionaries)).unwrap(), replies(1, 5)[0].as_bytes());
        let mut short = Vec::new();
        encode_with(b"\"ok\"", &mut short, Some(&dictionaries));
        assert_eq!(short, b"\"ok\"");
        // A second dictionary: new values use it, frames of the first still decode.
        let mut old = Vec::new();
        encode_with(replies(1, 3)[0].as_bytes(), &mut old, Some(&dictionaries));
        dictionaries.add(40_001, &dictionary(40_001)).expect("prepared");
        assert_eq!(dictionaries.ids(), vec![40_000, 40_001]);
        let mut new = Vec::new();
        encode_with(replies(1, 3)[0].as_bytes(), &mut new, Some(&dictionaries));
        assert_eq!((dictionary_of(&old), dictionary_of(&new)), (Some(40_000), Some(40_001)));
        for stored in [&old, &new] {
            assert_eq!(decode_with(stored, Some(&dictionaries)).unwrap(), replies(1, 3)[0].as_bytes());
        }
    }

    #[test]
    fn a_frame_naming_a_dictionary_the_store_lacks_is_a_typed_error() {
        let dictionaries = Dictionaries::default();
        dictionaries.add(40_000, &dictionary(40_000)).expect("prepared");
        let mut stored = Vec::new();
        encode_with(replies(1, 9)[0].as_bytes(), &mut stored, Some(&dictionaries));
        // Without dictionaries (PostgreSQL's decode), or with others: refused, typed.
        assert!(matches!(decode(&stored), Err(CodecError::MissingDictionary(40_000))));
        let others = Dictionaries::default();
        others.add(40_001, &dictionary(40_001)).expect("prepared");
        assert!(matches!(decode_with(&stored, Some(&others)), Err(CodecError::MissingDictionary(40_000))));
        // Dictionary bytes that are not one, or that name another ID, are refused.
        assert!(matches!(others.add(5, b"not a dictionary"), Err(CodecError::BadDictionary(5))));
        assert!(matches!(others.add(40_002, &dictionary(40_000)), Err(CodecError::BadDictionary(40_002))));
        // A frame claiming a huge size and naming a dictionary is refused before anything
        // is allocated or looked up: FCS flag 3, single segment, dictionary ID flag 2 (2 bytes).
        let mut bomb = MAGIC.to_vec();
        bomb.push(0xe2);
        bomb.extend_from_slice(&40_000u16.to_le_bytes());
        bomb.extend_from_slice(&(1u64 << 40).to_le_bytes());
        bomb.extend_from_slice(&[0x01, 0x00, 0x00]);
        assert_eq!(dictionary_of(&bomb), Some(40_000));
        assert!(matches!(decode_with(&bomb, Some(&dictionaries)), Err(CodecError::TooLarge(n)) if n == 1 << 40));
        // Too few samples: no dictionary, an error.
        assert!(matches!(train(&[b"x"], 4096, NonZeroU32::MIN), Err(CodecError::Training(_))));
    }

    #[test]
    fn components_are_stored_compressed_and_raw_ones_of_old_read_as_they_are() {
        let component: Vec<u8> =
            b"\0asm\x0d\x00\x01\x00".iter().copied().chain((0..200_000u32).map(|i| (i % 97) as u8)).collect();
        let stored = encode_blob(&component);
        assert!(is_compressed(&stored) && stored.len() < component.len() / 10);
        assert_eq!(decode_blob(stored).unwrap(), component);
        assert_eq!(decode_blob(component.clone()).unwrap(), component, "raw, as before schema 5");
        // Bounded by the component limit, not the value one.
        let mut header = MAGIC.to_vec();
        header.push(0xe0);
        header.extend_from_slice(&(MAX_BLOB_BYTES as u64 + 1).to_le_bytes());
        header.extend_from_slice(&[0x01, 0x00, 0x00]);
        assert!(matches!(decode_blob(header), Err(CodecError::TooLarge(_))));
    }
}
