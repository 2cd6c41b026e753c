//! The journal: what a run writes as it goes — step values, agent outcomes, progress, and
//! live accounting — keyed by run. A trait, so the run engine does not depend on where the
//! entries live; every durable [`Store`](crate::store::Store) is one.
//!
//! A run does not hold its journal in memory: an attempt starts from a [`JournalSnapshot`]
//! (every step key's fingerprint, the bytes journaled so far, and as many values as fit a
//! byte budget, kept compact in [`LoadedEntries`]: one buffer and one index, nothing
//! allocated per entry) and reads the other values back on demand ([`Journal::get_step`],
//! [`Journal::get_agent`]), which see every put at once, committed or not. Reads are futures
//! (a store across a network cannot answer at once); puts are not: they hand the entry to
//! the store's writer and return, so the hot paths never wait for a store.

use crate::model::envelope::Accounting;
use futures::future::BoxFuture;
use std::collections::HashSet;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::{Arc, OnceLock};

/// A step key's fingerprint: a 64-bit keyed hash (SipHash with a key random per process, so
/// a guest cannot aim for collisions). Only compared within one process.
pub fn fingerprint(key: &str) -> u64 {
    static KEYS: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    KEYS.get_or_init(Default::default).hash_one(key)
}

/// An agent key's fingerprint: an agent key is the hex of a sha256 ([`crate::model::agent_key::AgentKey`]),
/// so its first 64 bits already are one (no second hash of its 64 characters). Any other key
/// gets its [`fingerprint`]. A guest cannot choose a call's sha256, so it cannot aim these
/// at each other either; two that meet are told apart by their full key where it matters.
pub fn agent_fingerprint(key: &str) -> u64 {
    let bytes = key.as_bytes();
    if bytes.len() != 64 {
        return fingerprint(key);
    }
    // The lowercase hex [`crate::model::agent_key::AgentKey`] writes, read by hand and without a branch per
    // digit (they are random: each branch would be a coin toss for the predictor): this runs
    // for every agent key a load reads and every call a replay answers.
    let (mut prefix, mut hex) = (0u64, true);
    for &b in &bytes[..16] {
        hex &= b.is_ascii_digit() | (b'a'..=b'f').contains(&b);
        // '0'..='9' are 0x30..=0x39, 'a'..='f' 0x61..=0x66: bit 6 tells letters from digits.
        let digit = (b & 0x0f) + 9 * (b >> 6);
        prefix = prefix << 4 | u64::from(digit);
    }
    if hex {
        prefix
    } else {
        fingerprint(key)
    }
}

/// Hashes a [`fingerprint`] as itself: it is already a keyed hash, so maps keyed by one need
/// not hash it again.
#[derive(Debug, Default, Clone, Copy)]
pub struct FingerprintHasher(u64);

impl Hasher for FingerprintHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u64`s are hashed with it; anything else is folded in, not lost.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Builds [`FingerprintHasher`]s.
pub type Fingerprinted = BuildHasherDefault<FingerprintHasher>;

/// A set of [`fingerprint`]s.
pub type Fingerprints = HashSet<u64, Fingerprinted>;

/// A key the load found, under its fingerprint, in [`LoadedEntries`]' open-addressed table:
/// 16 bytes, four to a cache line.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Slot {
    fingerprint: u64,
    /// Where the entry is in the buffer, or [`UNLOADED`] (the key is journaled, its value
    /// was not loaded or no longer holds), or [`EMPTY`] (no key in this slot). An entry ends
    /// within 32 bits, so it never starts at either.
    at: u32,
}

const UNLOADED: u32 = u32::MAX - 1;
const EMPTY: u32 = u32::MAX;

impl Slot {
    const EMPTY: Slot = Slot { fingerprint: 0, at: EMPTY };

    fn key_only(fingerprint: u64) -> Slot {
        Slot { fingerprint, at: UNLOADED }
    }

    fn is_empty(&self) -> bool {
        self.at == EMPTY
    }

    fn has_value(&self) -> bool {
        self.at < UNLOADED
    }
}

/// An entry's header in the buffer: its key's length (with [`DEAD`] set once its value no
/// longer holds) and its value's length; the key and the value follow. No fingerprint: a
/// lookup by the walk needs none, and the table hashes the key when it is made.
const HEADER: usize = 8;

/// The bit of an entry's key length that says its value no longer holds: a newer one was
/// journaled, or another key shares its fingerprint. A key this long or longer keeps no
/// value ([`LoadingEntries::value`]).
const DEAD: u32 = 1 << 31;

/// An entry's header, read at `at`.
#[derive(Debug, Clone, Copy)]
struct Header {
    key_len: usize,
    value_len: usize,
    live: bool,
}

impl Header {
    /// Where the entry that starts at `at` ends.
    fn end(&self, at: usize) -> usize {
        at + HEADER + self.key_len + self.value_len
    }
}

/// The header of the entry at `at`, if one starts there.
fn header(bytes: &[u8], at: usize) -> Option<Header> {
    let header: &[u8; HEADER] = bytes.get(at..at.checked_add(HEADER)?)?.try_into().ok()?;
    let [k0, k1, k2, k3, v0, v1, v2, v3] = *header;
    let key_len = u32::from_le_bytes([k0, k1, k2, k3]);
    Some(Header {
        key_len: (key_len & !DEAD) as usize,
        value_len: u32::from_le_bytes([v0, v1, v2, v3]) as usize,
        live: key_len & DEAD == 0,
    })
}

/// What [`LoadedEntries::get`] knows of a key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Loaded<'a> {
    /// Not journaled when the load was made.
    Absent,
    /// Journaled, its value not in memory: ask the journal.
    Unloaded,
    /// Journaled with this value.
    Value(&'a [u8]),
}

/// The entries of one kind (steps, agent outcomes) a [`Journal::load`] is reading, in the
/// order the journal hands them over: each key and value appended to one buffer, with its
/// place in the journal (no key is hashed but those whose value is not loaded).
/// [`LoadingEntries::finish`] lays them out in journal order and sizes, once, the table they
/// are looked up by off the walk (no growth, no rehash when it is made).
pub struct LoadingEntries {
    bytes: Vec<u8>,
    /// Each loaded value's place in the journal, and where its entry starts in `bytes` and
    /// how long it is (so the move to journal order need not read its header first).
    placed: Vec<(u64, u32, u32)>,
    /// Whether `placed` came in journal order (then nothing moves).
    in_order: bool,
    /// The fingerprints of the keys whose value is not loaded.
    keys_only: Vec<u64>,
    /// How its keys are fingerprinted ([`fingerprint`] for steps, [`agent_fingerprint`] for
    /// agent keys).
    hash: fn(&str) -> u64,
}

impl LoadingEntries {
    /// Step entries.
    pub fn steps() -> Self {
        LoadingEntries {
            bytes: Vec::new(),
            placed: Vec::new(),
            in_order: true,
            keys_only: Vec::new(),
            hash: fingerprint,
        }
    }

    /// Agent entries.
    pub fn agents() -> Self {
        LoadingEntries { hash: agent_fingerprint, ..LoadingEntries::steps() }
    }

    /// Room for `keys` keys and `bytes` bytes of keys and values, set aside before a load (a
    /// bound, not an exact figure: [`LoadingEntries::finish`] hands back what the load did
    /// not use). Without the memory at hand, the buffers grow as entries come instead.
    pub fn reserve(&mut self, keys: usize, bytes: usize) {
        let _ = self.placed.try_reserve_exact(keys);
        let _ = self.bytes.try_reserve_exact(bytes);
    }

    /// A journaled key whose value is not loaded. Each key is given once.
    pub fn key(&mut self, key: &str) {
        self.keys_only.push((self.hash)(key));
    }

    /// A journaled key with its value (its bytes as the journal keeps them: the parts one
    /// after the other) and its place in the journal (any figure that grows with each put of
    /// the run, such as the run's journal bytes counted with it; ties keep the order given).
    /// Each key is given once.
    pub fn value(&mut self, key: &str, value: &[&[u8]], place: u64) {
        let value_len = value.iter().fold(0usize, |sum, part| sum.saturating_add(part.len()));
        // An entry that would end past 32 bits, or whose key's length reaches the dead bit,
        // leaves its key known, its value unloaded. One that ends within them has its place
        // and both lengths under 32 bits, and starts below the slots' sentinels.
        let at = self.bytes.len();
        let end = at.saturating_add(HEADER).saturating_add(key.len()).saturating_add(value_len);
        if u32::try_from(end).is_err() || key.len() >= DEAD as usize {
            self.keys_only.push((self.hash)(key));
            return;
        }
        self.bytes.extend_from_slice(&(key.len() as u32).to_le_bytes());
        self.bytes.extend_from_slice(&(value_len as u32).to_le_bytes());
        self.bytes.extend_from_slice(key.as_bytes());
        for part in value {
            self.bytes.extend_from_slice(part);
        }
        if self.placed.last().is_some_and(|&(last, ..)| last > place) {
            self.in_order = false;
        }
        self.placed.push((place, at as u32, (end - at) as u32));
    }

    /// The entries, laid out in journal order (see [`LoadedEntries`]).
    pub fn finish(self) -> LoadedEntries {
        let LoadingEntries { mut bytes, mut placed, in_order, keys_only, hash } = self;
        // Journal order is the order a replay asks in: its lookups then read the buffer from
        // start to end. Without the memory for a second buffer, the load's order stays.
        let mut ordered = Vec::new();
        if !in_order && ordered.try_reserve_exact(bytes.len()).is_ok() {
            sort_by_place(&mut placed);
            for &(_, at, len) in &placed {
                let at = at as usize;
                if let Some(entry) = bytes.get(at..at + len as usize) {
                    ordered.extend_from_slice(entry);
                }
            }
            bytes = ordered;
        } else {
            bytes.shrink_to_fit();
        }
        let keys = placed.len() + keys_only.len();
        let values = placed.len();
        drop(placed);
        // At most two thirds full: a lookup of a key not there stops at an empty slot soon.
        let slots = if keys == 0 { 0 } else { (keys + keys / 2 + 1).next_power_of_two() };
        LoadedEntries { bytes, table: Vec::new(), slots, keys_only, keys, values, next: 0, hash }
    }
}

/// Sort loaded entries by place, keeping the order given among equal places: a radix sort,
/// one byte of the place per pass, skipping the bytes in which no two places differ (a
/// run's places fit in a few bytes). About two thirds of a comparison sort's time on the
/// 50,000 shuffled places of a large resume (0.69 against 1.07 ms, release); without the
/// memory for its second buffer, a comparison sort.
fn sort_by_place(placed: &mut Vec<(u64, u32, u32)>) {
    let n = placed.len();
    let mut other = Vec::new();
    if n < 64 || other.try_reserve_exact(n).is_err() {
        // `at` grows with the order given: sorting by it too keeps that order among ties.
        placed.sort_unstable();
        return;
    }
    let mut counts = [[0usize; 256]; 8];
    for &(place, ..) in placed.iter() {
        for (byte, count) in counts.iter_mut().enumerate() {
            count[(place >> (8 * byte)) as usize & 0xff] += 1;
        }
    }
    other.resize(n, (0, 0, 0));
    for (byte, count) in counts.iter().enumerate() {
        if count.contains(&n) {
            continue;
        }
        let mut next = [0usize; 256];
        let mut sum = 0;
        for (digit, &c) in count.iter().enumerate() {
            next[digit] = sum;
            sum += c;
        }
        for &entry in placed.iter() {
            let digit = (entry.0 >> (8 * byte)) as usize & 0xff;
            if let Some(slot) = other.get_mut(next[digit]) {
                *slot = entry;
            }
            next[digit] += 1;
        }
        std::mem::swap(placed, &mut other);
    }
}

/// The entries of one kind (steps, agent outcomes) a [`Journal::load`] found: every key, as
/// its [`fingerprint`], and the values that fit the load's budget, each entry (a header, its
/// key, its value) one after the other in one buffer in journal order. A lookup first tries
/// the entry after the last one found, by its key text: a replay, which asks in journal
/// order, reads the buffer front to back, and hashes no key. Other lookups go through an
/// open-addressed table of fingerprints (linear probing; a fingerprint is already a uniform
/// keyed hash, so its low bits place it), made at the first of them: a replay that only
/// asks in journal order never makes it. No allocation per entry; a value is returned only
/// for its exact key. Made by [`LoadingEntries::finish`].
#[derive(Clone)]
pub struct LoadedEntries {
    bytes: Vec<u8>,
    /// Empty until made ([`LoadedEntries::index`]), then `slots` long and never full.
    table: Vec<Slot>,
    /// The table's length once made: a power of two, or 0 when no key is known.
    slots: usize,
    /// The fingerprints of the keys whose value is not loaded, until the table holds them.
    keys_only: Vec<u64>,
    /// Keys known; until the table is made, keys sharing a fingerprint count twice.
    keys: usize,
    values: usize,
    /// Where the entry after the last one found starts.
    next: u32,
    hash: fn(&str) -> u64,
}

/// Step entries, none.
impl Default for LoadedEntries {
    fn default() -> Self {
        LoadingEntries::steps().finish()
    }
}

impl LoadedEntries {
    /// The fingerprint of `key` here (what [`LoadedEntries::knows`] and the others take).
    pub fn fingerprint(&self, key: &str) -> u64 {
        (self.hash)(key)
    }

    /// Make the table, if it is not made yet. Two keys sharing a fingerprint are both
    /// [`Loaded::Unloaded`] from then on (the journal tells them apart).
    fn index(&mut self) {
        if !self.table.is_empty() || self.slots == 0 {
            return;
        }
        self.table = vec![Slot::EMPTY; self.slots];
        (self.keys, self.values) = (0, 0);
        let mut at = 0;
        while let Some(header) = header(&self.bytes, at) {
            let key_at = at + HEADER;
            // Every key was a `&str` when it was loaded.
            if let Some(key) = self.bytes.get(key_at..key_at + header.key_len).and_then(|k| std::str::from_utf8(k).ok())
            {
                let fingerprint = (self.hash)(key);
                self.insert(if header.live {
                    Slot { fingerprint, at: at as u32 }
                } else {
                    Slot::key_only(fingerprint)
                });
            }
            at = header.end(at);
        }
        for fingerprint in std::mem::take(&mut self.keys_only) {
            self.insert(Slot::key_only(fingerprint));
        }
    }

    /// The slot of `fingerprint`, or the empty one its probe ends at (`None`: no table).
    fn probe(&self, fingerprint: u64) -> Option<usize> {
        let mask = self.table.len().checked_sub(1)?;
        let mut i = fingerprint as usize & mask;
        loop {
            let slot = &self.table[i];
            if slot.is_empty() || slot.fingerprint == fingerprint {
                return Some(i);
            }
            i = (i + 1) & mask;
        }
    }

    fn insert(&mut self, slot: Slot) {
        let Some(i) = self.probe(slot.fingerprint) else { return };
        let taken = self.table[i];
        if taken.is_empty() {
            self.table[i] = slot;
            self.keys += 1;
            self.values += usize::from(slot.has_value());
        } else {
            // A second key with this fingerprint: neither is answered from memory.
            self.unload(i);
            self.kill(slot);
        }
    }

    /// The value in slot `i` no longer answers: the key stays known.
    fn unload(&mut self, i: usize) {
        let slot = self.table[i];
        if slot.has_value() {
            self.kill(slot);
            self.table[i] = Slot::key_only(slot.fingerprint);
            self.values -= 1;
        }
    }

    /// Mark `slot`'s entry dead in its header, so no lookup finds it there.
    fn kill(&mut self, slot: Slot) {
        if slot.has_value() {
            let at = slot.at as usize;
            if let Some(key_len) = self.bytes.get_mut(at..at + 4) {
                let marked = u32::from_le_bytes([key_len[0], key_len[1], key_len[2], key_len[3]]) | DEAD;
                key_len.copy_from_slice(&marked.to_le_bytes());
            }
        }
    }

    /// Where the value of the entry at `at` is, if the entry is `key`'s and holds, and where
    /// the entry ends.
    fn entry(&self, at: usize, key: &str) -> Option<(std::ops::Range<usize>, usize)> {
        let header = header(&self.bytes, at)?;
        if !header.live || header.key_len != key.len() {
            return None;
        }
        let key_at = at + HEADER;
        let value_at = key_at + header.key_len;
        let end = header.end(at);
        if self.bytes.get(key_at..value_at)? != key.as_bytes() || end > self.bytes.len() {
            return None;
        }
        Some((value_at..end, end))
    }

    /// The value of the entry at `at` if it is `key`'s and holds, the next lookup starting
    /// after it; [`Loaded::Unloaded`] if not.
    fn found(&mut self, at: usize, key: &str) -> Loaded<'_> {
        let Some((value, end)) = self.entry(at, key) else { return Loaded::Unloaded };
        self.next = end as u32;
        self.bytes.get(value).map_or(Loaded::Unloaded, Loaded::Value)
    }

    /// What the load knew of `key`.
    pub fn get(&mut self, key: &str) -> Loaded<'_> {
        self.find(key, &mut None)
    }

    /// [`LoadedEntries::get`], with `fingerprint` the key's [`LoadedEntries::fingerprint`] if
    /// the caller has it; a lookup that needs it fills it in.
    pub fn find(&mut self, key: &str, fingerprint: &mut Option<u64>) -> Loaded<'_> {
        if self.slots == 0 {
            return Loaded::Absent;
        }
        // The walk: the entry after the last one found.
        if let Some((value, end)) = self.entry(self.next as usize, key) {
            self.next = end as u32;
            return self.bytes.get(value).map_or(Loaded::Unloaded, Loaded::Value);
        }
        let fingerprint = *fingerprint.get_or_insert_with(|| (self.hash)(key));
        self.index();
        let Some(slot) = self.probe(fingerprint).map(|i| self.table[i]) else { return Loaded::Absent };
        if slot.is_empty() {
            return Loaded::Absent;
        }
        if !slot.has_value() {
            return Loaded::Unloaded;
        }
        self.found(slot.at as usize, key)
    }

    /// Whether the key of `fingerprint` was journaled.
    pub fn knows(&mut self, fingerprint: u64) -> bool {
        self.index();
        self.probe(fingerprint).is_some_and(|i| !self.table[i].is_empty())
    }

    /// The value of the key of `fingerprint` no longer holds (a newer one was journaled
    /// since): the key stays known, its value is asked of the journal.
    pub fn forget(&mut self, fingerprint: u64) {
        self.index();
        if let Some(i) = self.probe(fingerprint) {
            self.unload(i);
        }
    }

    /// Keys known (two sharing a fingerprint count once).
    pub fn len(&mut self) -> usize {
        self.index();
        self.keys
    }

    /// Whether no key is known.
    pub fn is_empty(&self) -> bool {
        self.keys == 0
    }

    /// Values held.
    pub fn values(&mut self) -> usize {
        self.index();
        self.values
    }

    /// Bytes this holds in memory, or will once its table is made: its buffer and its table.
    pub fn memory(&self) -> usize {
        self.bytes.capacity()
            + self.slots.max(self.table.capacity()) * std::mem::size_of::<Slot>()
            + self.keys_only.capacity() * 8
    }

    /// Every loaded (key, value) that still holds, in journal order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &[u8])> + '_ {
        let mut at = 0;
        std::iter::from_fn(move || loop {
            let header = header(&self.bytes, at)?;
            let key_at = at + HEADER;
            at = header.end(at);
            if header.live {
                let key = std::str::from_utf8(self.bytes.get(key_at..key_at + header.key_len)?).ok()?;
                return Some((key, self.bytes.get(key_at + header.key_len..at)?));
            }
        })
    }
}

impl std::fmt::Debug for LoadedEntries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedEntries")
            .field("keys", &self.keys)
            .field("values", &self.values)
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

/// An agent outcome as journals keep it: `0` for an ordinary failure, `1` + the reply's
/// JSON text for a reply.
pub fn encode_outcome(outcome: Option<&str>) -> Vec<u8> {
    match outcome {
        None => vec![0],
        Some(json) => {
            let mut bytes = Vec::with_capacity(json.len() + 1);
            bytes.push(1);
            bytes.extend_from_slice(json.as_bytes());
            bytes
        }
    }
}

/// A running attempt's live accounting as every store keeps it (JSON), written into `out`
/// (cleared first), so the redb and PostgreSQL forms cannot drift apart.
pub(crate) fn encode_live_accounting(accounting: &Accounting, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
    out.clear();
    serde_json::to_writer(out, accounting)
}

/// Live accounting [`encode_live_accounting`] wrote.
pub(crate) fn decode_live_accounting(bytes: &[u8]) -> Result<Accounting, serde_json::Error> {
    serde_json::from_slice(bytes)
}

/// Bytes that are not an agent outcome [`encode_outcome`] wrote.
#[derive(Debug, Clone, thiserror::Error)]
#[error("unknown agent outcome encoding")]
pub struct UnknownOutcome;

/// An agent outcome [`encode_outcome`] wrote, read in place.
pub fn decode_outcome(bytes: &[u8]) -> Result<Option<&str>, UnknownOutcome> {
    match bytes.split_first() {
        Some((0, [])) => Ok(None),
        Some((1, json)) => std::str::from_utf8(json).map(Some).map_err(|_| UnknownOutcome),
        _ => Err(UnknownOutcome),
    }
}

/// A journal operation that failed, with the error of whatever keeps the journal (the
/// store's [`StoreError`](crate::store::StoreError)). Never a cache miss: the run must stop.
#[derive(Debug, Clone)]
pub struct JournalError(pub Arc<dyn std::error::Error + Send + Sync + 'static>);

impl std::fmt::Display for JournalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "journal: {}", self.0)
    }
}

impl std::error::Error for JournalError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

impl JournalError {
    /// A journal failure caused by `source`.
    pub fn new(source: impl std::error::Error + Send + Sync + 'static) -> Self {
        JournalError(Arc::new(source))
    }

    /// Whether the cause is the shared store out of reach for this worker
    /// ([`StoreError::is_outage`](crate::store::StoreError::is_outage)).
    pub fn is_outage(&self) -> bool {
        self.0.downcast_ref::<crate::store::StoreError>().is_some_and(|e| e.is_outage())
    }
}

/// The same failure (one shared cause), not merely the same text.
impl PartialEq for JournalError {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// What an attempt starts from.
#[derive(Debug, Clone)]
pub struct JournalSnapshot {
    /// Every journaled step key (all of them, whether or not its value is loaded: what counts
    /// distinct steps), with its JSON text for as many steps as fit the load budget.
    pub steps: LoadedEntries,
    /// Journaled agent keys (hex), with their outcome ([`encode_outcome`]'s form) for as many
    /// calls as fit the load budget.
    pub agents: LoadedEntries,
    /// Whether `agents` lists every journaled agent key (then a call whose key is not among
    /// them was never journaled, without a read); otherwise ask [`Journal::get_agent`].
    pub agents_listed: bool,
    /// Bytes the run has journaled so far, all attempts together (as last recorded with a
    /// put).
    pub journal_bytes: u64,
}

/// An empty journal.
impl Default for JournalSnapshot {
    fn default() -> Self {
        JournalSnapshot {
            steps: LoadedEntries::default(),
            agents: LoadingEntries::agents().finish(),
            agents_listed: false,
            journal_bytes: 0,
        }
    }
}

/// What an answered agent call journals at once ([`Journal::put_agent_outcome`]); each
/// entry with the run's journal total as counted with it (an entry the journal budget had no
/// room for is left out).
pub struct AgentOutcome<'a> {
    /// Its progress entry: seq, stored JSON form, journal total.
    pub progress: Option<(u64, Vec<u8>, u64)>,
    /// The attempt's accounting with the call counted.
    pub accounting: &'a Accounting,
    /// The outcome: the call's key, its reply (`None`: an ordinary failure), journal total.
    pub agent: Option<(&'a str, Option<&'a str>, u64)>,
}

/// Where a run's entries go. Puts may return before the entry is durable; [`Journal::flush`]
/// resolves once everything put so far is.
pub trait Journal: Send + Sync + 'static {
    /// The run's journal so far: every step key, the journal bytes recorded with the last
    /// put, and values (steps first, then agent outcomes) up to `value_bytes` bytes in all,
    /// none over a quarter of that. A value's bytes are its key's plus, for a step, its JSON
    /// text's, for an agent outcome, 1 plus its reply's (0 for an ordinary failure).
    fn load<'a>(&'a self, run_id: &'a str, value_bytes: usize) -> BoxFuture<'a, Result<JournalSnapshot, JournalError>>;

    /// A step value, as last put (committed or not).
    fn get_step<'a>(&'a self, run_id: &'a str, key: &'a str) -> BoxFuture<'a, Result<Option<String>, JournalError>>;

    /// An agent outcome, as put (committed or not): `None` when the call was never journaled.
    fn get_agent<'a>(
        &'a self,
        run_id: &'a str,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<Option<String>>, JournalError>>;

    /// What an entry of `key_bytes` (every part of its key, run id included) and
    /// `value_bytes` occupies where this journal keeps it: what the run's journal budget is
    /// charged for it.
    fn footprint(&self, key_bytes: usize, value_bytes: usize) -> u64 {
        (key_bytes as u64).saturating_add(value_bytes as u64)
    }

    // Each put carries `journal_bytes`: the run's journal total with this entry counted,
    // recorded together with the entry (so after a crash the total never counts less than
    // what was kept).

    /// Record a step value.
    fn put_step(&self, run_id: &str, key: &str, value: &str, journal_bytes: u64) -> Result<(), JournalError>;

    /// Record an agent outcome.
    fn put_agent(&self, run_id: &str, key: &str, outcome: Option<&str>, journal_bytes: u64)
        -> Result<(), JournalError>;

    /// Record a progress entry: `entry` is its stored JSON form
    /// ([`JournaledProgress`](crate::model::progress::JournaledProgress)).
    fn put_progress(&self, run_id: &str, seq: u64, entry: Vec<u8>, journal_bytes: u64) -> Result<(), JournalError>;

    /// Record the running attempt's accounting so far.
    fn put_accounting(&self, run_id: &str, accounting: &Accounting) -> Result<(), JournalError>;

    /// Record what an answered agent call journals, in this order: its progress entry, the
    /// attempt's accounting, its outcome. A store queues them as one write (so they share a
    /// commit); by default they are put one after the other.
    fn put_agent_outcome(&self, run_id: &str, outcome: AgentOutcome<'_>) -> Result<(), JournalError> {
        if let Some((seq, entry, journal_bytes)) = outcome.progress {
            self.put_progress(run_id, seq, entry, journal_bytes)?;
        }
        self.put_accounting(run_id, outcome.accounting)?;
        match outcome.agent {
            Some((key, reply, journal_bytes)) => self.put_agent(run_id, key, reply, journal_bytes),
            None => Ok(()),
        }
    }

    /// Resolve once every entry put so far is durable.
    fn flush(&self) -> BoxFuture<'_, Result<(), JournalError>>;

    /// Have every entry put so far committed now rather than at the end of the commit
    /// window, without waiting for it (an attempt's start, which its followers wait to see).
    /// Nothing by default: a journal without a window commits at once.
    fn commit_soon(&self) {}

    /// Whether this process may still start work whose outcome the journal must record (a
    /// paid subagent call): a journal that already knows its writes would be refused says
    /// why (a worker whose lease ran out by its own clock, or was fenced, or whose attempt of
    /// run `run_id` began under a generation it lost). `Ok` by default.
    fn writable(&self, _run_id: &str) -> Result<(), JournalError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loaded_entries_answer_by_exact_key_and_forget_replaced_values() {
        let mut loading = LoadingEntries::steps();
        loading.value("plan", &[b"\"v1\""], 1);
        loading.key("big");
        let mut entries = loading.finish();
        assert_eq!((entries.len(), entries.values()), (2, 1));
        assert_eq!(entries.get("plan"), Loaded::Value(&b"\"v1\""[..]));
        assert_eq!(entries.get("big"), Loaded::Unloaded, "known, its value not loaded");
        assert_eq!(entries.get("none"), Loaded::Absent);
        // A key text that does not match the entry under its fingerprint gets no value.
        assert_eq!(entries.find("other", &mut Some(fingerprint("plan"))), Loaded::Unloaded);
        entries.forget(fingerprint("plan"));
        assert_eq!(entries.get("plan"), Loaded::Unloaded, "replaced: ask the journal");
        assert!(entries.knows(fingerprint("plan")), "still journaled");
        assert_eq!(entries.values(), 0);
        assert_eq!(entries.iter().count(), 0);
    }

    #[test]
    fn two_keys_sharing_a_fingerprint_are_left_to_the_journal() {
        let mut loading = LoadingEntries { hash: |key| if key.len() == 1 { 7 } else { 8 }, ..LoadingEntries::agents() };
        loading.value("a", &[b"1"], 1);
        loading.value("cc", &[b"3"], 2);
        loading.value("b", &[b"2"], 3);
        let mut entries = loading.finish();
        // The walk finds an entry by its key's text, fingerprints aside.
        assert_eq!(entries.get("a"), Loaded::Value(&b"1"[..]), "the walk, before any table");
        // Off the walk, the table is made: from then on, keys sharing a fingerprint are left
        // to the journal.
        assert_eq!(entries.get("b"), Loaded::Unloaded);
        assert_eq!(entries.get("a"), Loaded::Unloaded);
        assert_eq!(entries.get("cc"), Loaded::Value(&b"3"[..]));
        assert_eq!((entries.len(), entries.values()), (2, 1));
    }

    #[test]
    fn thousands_of_keys_are_found_and_keys_never_loaded_are_absent() {
        let mut loading = LoadingEntries::steps();
        for i in 0..5000 {
            match i % 3 {
                0 => loading.key(&format!("k{i}")),
                _ => loading.value(&format!("k{i}"), &[format!("{i}").as_bytes()], i),
            }
        }
        let mut entries = loading.finish();
        assert_eq!((entries.len(), entries.values()), (5000, 3333));
        for i in 0..5000 {
            let key = format!("k{i}");
            let found = entries.get(&key);
            match i % 3 {
                0 => assert_eq!(found, Loaded::Unloaded, "{key}"),
                _ => assert_eq!(found, Loaded::Value(format!("{i}").as_bytes()), "{key}"),
            }
            let never = format!("n{i}");
            assert_eq!(entries.get(&never), Loaded::Absent);
            assert!(!entries.knows(fingerprint(&never)));
        }
        let mut all: Vec<_> = entries.iter().map(|(k, v)| (k.to_string(), v.to_vec())).collect();
        all.sort();
        assert_eq!(all.len(), 3333);
        assert_eq!(all[0], ("k1".to_string(), b"1".to_vec()));
        entries.forget(fingerprint("k1"));
        assert_eq!((entries.len(), entries.values()), (5000, 3332));
        assert!(entries.memory() < 5000 * 64, "{} bytes", entries.memory());
    }

    #[test]
    fn entries_are_laid_out_in_journal_order_and_found_from_the_last_one() {
        // Given in key order (as a store's table hands them over), placed otherwise.
        let mut loading = LoadingEntries::steps();
        for (key, place) in [("a", 30), ("b", 10), ("c", 40), ("d", 20), ("e", 20)] {
            loading.value(key, &[key.as_bytes(), b"!"], place);
        }
        loading.key("f");
        let mut entries = loading.finish();
        let order: Vec<_> = entries.iter().map(|(k, v)| (k.to_string(), v.to_vec())).collect();
        let expected = ["b", "d", "e", "a", "c"].map(|k| (k.to_string(), format!("{k}!").into_bytes()));
        assert_eq!(order, expected, "journal order, ties in the order given");
        // A replay in journal order walks the buffer: each lookup starts where the last ended.
        let mut ends = Vec::new();
        for key in ["b", "d", "e", "a", "c"] {
            assert_eq!(entries.get(key), Loaded::Value(format!("{key}!").as_bytes()), "{key}");
            ends.push(entries.next as usize);
        }
        assert_eq!(ends, [11, 22, 33, 44, 55], "each entry right after the one before (8 + 1 + 2 bytes)");
        assert!(entries.table.is_empty(), "a replay in journal order makes no table");
        let memory = entries.memory();
        // Out of order, the table (made now) finds it and the walk goes on from there.
        assert_eq!(entries.get("d"), Loaded::Value(b"d!"));
        assert_eq!(entries.next, 22);
        assert_eq!(entries.table.len(), 16, "6 keys, at most two thirds full");
        assert!(
            entries.memory() <= memory,
            "the table was counted before it was made: {} > {memory}",
            entries.memory()
        );
        assert_eq!(entries.get("f"), Loaded::Unloaded);
        assert_eq!(entries.get("g"), Loaded::Absent);
        // A value forgotten is not found by the walk either, though its bytes are still there.
        entries.forget(fingerprint("e"));
        assert_eq!(entries.get("e"), Loaded::Unloaded, "the entry after the last one found, forgotten");
        assert_eq!(entries.get("a"), Loaded::Value(b"a!"));
        assert_eq!(entries.iter().map(|(k, _)| k).collect::<Vec<_>>(), ["b", "d", "a", "c"]);
        // Keys sharing a fingerprint are not found by the walk once the table is made.
        let mut loading = LoadingEntries { hash: |key| if key.len() == 1 { 7 } else { 8 }, ..LoadingEntries::steps() };
        loading.value("x", &[b"1"], 1);
        loading.value("yy", &[b"2"], 2);
        loading.value("z", &[b"3"], 3);
        let mut entries = loading.finish();
        assert_eq!(entries.get("x"), Loaded::Value(b"1"), "the walk, by the key's text, before any table");
        assert_eq!(entries.get("z"), Loaded::Unloaded, "off the walk: the table, where x and z share a fingerprint");
        assert_eq!(entries.get("yy"), Loaded::Value(b"2"), "the walk goes on after x");
        assert_eq!(entries.get("z"), Loaded::Unloaded, "the entry after the last one found, shared");
        assert_eq!(entries.iter().map(|(k, _)| k).collect::<Vec<_>>(), ["yy"]);
    }

    #[test]
    fn a_radix_sort_by_place_keeps_the_order_given_among_ties() {
        // Places spread over every byte (and a byte no place differs in), many ties; the
        // reference is a stable sort by place.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut random = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for n in [0, 1, 63, 64, 1000, 20_000] {
            let mut placed: Vec<(u64, u32, u32)> = (0..n)
                .map(|i| {
                    let r = random();
                    let place = match r % 4 {
                        0 => r >> 60,
                        1 => (r >> 8) | 0x0100_0000_0000_0000,
                        2 => u64::MAX - (r >> 62),
                        _ => r & 0xffff_00ff,
                    };
                    (place, i as u32, (r >> 32) as u32)
                })
                .collect();
            let mut expected = placed.clone();
            expected.sort_by_key(|&(place, ..)| place);
            sort_by_place(&mut placed);
            assert_eq!(placed, expected, "{n} entries");
        }
    }

    #[test]
    fn a_probe_that_runs_off_the_tables_end_goes_on_at_its_start() {
        // Three keys: a table of eight slots; 7 and 15 both start at the last one.
        let mut loading = LoadingEntries { hash: |key| key.parse().unwrap_or(0), ..LoadingEntries::steps() };
        for key in ["7", "15", "3"] {
            loading.value(key, &[key.as_bytes()], 0);
        }
        let mut entries = loading.finish();
        // Asked off the walk (each key's entry is not the one after the last found): by the table.
        for key in ["3", "15", "7"] {
            assert_eq!(entries.get(key), Loaded::Value(key.as_bytes()));
        }
        assert_eq!(entries.table.len(), 8);
        assert_eq!(entries.get("23"), Loaded::Absent, "past both, to the empty slot after them");
        assert_eq!(LoadedEntries::default().get("7"), Loaded::Absent, "no table at all");
    }

    #[test]
    fn an_agent_keys_fingerprint_is_its_sha256_prefix() {
        let key = crate::model::agent_key::AgentKey::new("p", Some("l"), None, None).to_string();
        assert_eq!(agent_fingerprint(&key), u64::from_str_radix(&key[..16], 16).unwrap());
        assert_eq!(agent_fingerprint("a1"), fingerprint("a1"), "a key that is no sha256 is hashed");
        let upper = key.to_uppercase();
        assert_eq!(agent_fingerprint(&upper), fingerprint(&upper), "nor is uppercase hex, which AgentKey never writes");
        let max = "f".repeat(64);
        assert_eq!(agent_fingerprint(&max), u64::MAX);
        let not_hex = "z".repeat(64);
        assert_eq!(agent_fingerprint(&not_hex), fingerprint(&not_hex));
        let mut loading = LoadingEntries::agents();
        loading.value(&key, &[b"\x01", b"\"ok\""], 0);
        let mut entries = loading.finish();
        assert!(entries.knows(agent_fingerprint(&key)));
        assert_eq!(entries.get(&key), Loaded::Value(&b"\x01\"ok\""[..]));
    }

    #[test]
    fn outcomes_round_trip_and_foreign_bytes_are_refused() {
        assert_eq!(decode_outcome(&encode_outcome(Some("\"ok\""))).unwrap(), Some("\"ok\""));
        assert_eq!(decode_outcome(&encode_outcome(None)).unwrap(), None);
        assert!(decode_outcome(b"").is_err());
        assert!(decode_outcome(&[0, 1]).is_err());
        assert!(decode_outcome(&[2]).is_err());
        assert!(decode_outcome(&[1, 0xff]).is_err(), "not UTF-8");
    }
}
