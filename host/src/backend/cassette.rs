//! Cassettes: a wrapper backend that records every agent exchange of a run to a versioned
//! JSON-lines file (`--record FILE`) and serves calls from one (`--replay FILE`) with zero
//! calls to a live backend, failing clearly on a miss unless misses go live
//! (`--replay-then-live`). An exchange is keyed by the canonical [`AgentKey`] of the call
//! (prompt, label, schema, model, soft limits, agent options) plus the spawn's attempt number (0, or 1 for the schema
//! retry). The file's first line is a header naming the format and its version.
//!
//! A cassette is untrusted input (a third-party project ships its own): reading one is
//! bounded ([`MAX_CASSETTE_BYTES`] a file, [`MAX_CASSETTE_LINE_BYTES`] a line), and an entry
//! is replayed only when its recorded request hashes to its recorded key: one that does not
//! (edited by hand, or tampered to answer another call than it shows) is never served, and a
//! call it would have answered is a miss that says so ([`Cassette::rejected`]).
//!
//! ```text
//! {"cassette":"factory","version":1}
//! {"key":"…","attempt":0,"request":{"prompt":"…","label":"a"},"reply":{"text":"…","usage":{…}}}
//! {"key":"…","attempt":0,"request":{…},"error":"openai: rate limited …"}
//! ```

use super::{AgentBackend, AgentReply, AgentRequest, BackendError, BackendRef, OutageKind, Usage};
use crate::model::agent_key::AgentKey;
use crate::model::limits::AgentLimits;
use crate::model::tuning::AgentTuning;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The cassette format this build reads and writes.
pub const CASSETTE_VERSION: u32 = 1;
const FORMAT: &str = "factory";
/// The most bytes of a cassette file read.
pub const MAX_CASSETTE_BYTES: u64 = 128 << 20;
/// The most bytes of one cassette line (one exchange).
pub const MAX_CASSETTE_LINE_BYTES: usize = 32 << 20;

/// A cassette file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CassetteError {
    /// The file could not be read or created.
    #[error("cassette `{path}`: {source}")]
    Io { path: String, source: std::io::Error },
    /// The file is not a cassette of a version this build reads.
    #[error("cassette `{path}` line {line}: {message}")]
    Invalid { path: String, line: usize, message: String },
    /// The file is not UTF-8 text.
    #[error("cassette `{path}`: not UTF-8 text: {source}")]
    NotText {
        path: String,
        #[source]
        source: std::string::FromUtf8Error,
    },
    /// The first line is not a cassette header.
    #[error("cassette `{path}` line 1: not a cassette header: {source}")]
    Header {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    /// A line is not an exchange.
    #[error("cassette `{path}` line {line}: {source}")]
    Exchange {
        path: String,
        line: usize,
        #[source]
        source: serde_json::Error,
    },
    /// The file is larger than [`MAX_CASSETTE_BYTES`].
    #[error("cassette `{path}` is {bytes} bytes, over the limit of {limit}: refusing to read it")]
    TooLarge { path: String, bytes: u64, limit: u64 },
    /// A line is longer than [`MAX_CASSETTE_LINE_BYTES`].
    #[error("cassette `{path}` line {line} is {bytes} bytes, over the limit of {limit} a line: refusing to read it")]
    LineTooLong { path: String, line: usize, bytes: usize, limit: usize },
}

#[derive(Debug, Serialize, Deserialize)]
struct Header {
    cassette: String,
    version: u32,
}

/// The request part of a recorded exchange.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedRequest {
    /// The prompt.
    pub prompt: String,
    /// The label, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// The requested model, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The schema, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<serde_json::Value>,
    /// The call's soft limits, if any (part of its key).
    #[serde(default, skip_serializing_if = "no_limits")]
    pub limits: AgentLimits,
    /// The call's agent, if any (part of its key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The call's reasoning effort, if any (part of its key).
    #[serde(default, rename = "reasoningEffort", skip_serializing_if = "Option::is_none")]
    pub reasoning_effort: Option<String>,
    /// The call's context tier, if any (part of its key).
    #[serde(default, rename = "contextTier", skip_serializing_if = "Option::is_none")]
    pub context_tier: Option<String>,
}

fn no_limits(limits: &AgentLimits) -> bool {
    *limits == AgentLimits::default()
}

impl RecordedRequest {
    /// The canonical key this request hashes to (what its exchange's `key` must be).
    pub fn key(&self) -> AgentKey {
        let tuning = AgentTuning {
            agent: self.agent.clone(),
            reasoning_effort: self.reasoning_effort.clone(),
            context_tier: self.context_tier.clone(),
        };
        AgentKey::of(
            &self.prompt,
            self.label.as_deref(),
            self.schema.as_ref(),
            self.model.as_deref(),
            &self.limits,
            &tuning,
        )
    }
}

/// Recorded usage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordedUsage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// Prompt tokens read from the provider's cache (absent: none; older cassettes).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_read_tokens: u64,
    /// Prompt tokens written to the provider's cache (absent: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_write_tokens: u64,
    /// Credits in nano-credits, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credits_nano: Option<u64>,
    /// The credits are a lower bound (absent: exact).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub credits_at_least: bool,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A recorded reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedReply {
    /// The reply text.
    pub text: String,
    /// The usage, when the backend reported it.
    #[serde(default)]
    pub usage: Option<RecordedUsage>,
}

/// One line of a cassette: a spawn and its outcome (a reply or an error).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Exchange {
    /// The call's canonical key ([`AgentKey`]).
    pub key: String,
    /// The spawn's attempt number.
    pub attempt: u32,
    /// What was asked.
    pub request: RecordedRequest,
    /// The reply, for a spawn that succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<RecordedReply>,
    /// The error, for a spawn that failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Exchange {
    /// The exchange of `request` and its outcome.
    pub fn new(request: &AgentRequest, outcome: &Result<AgentReply, BackendError>) -> Self {
        let (reply, error) = match outcome {
            Ok(r) => (
                Some(RecordedReply {
                    text: r.text.clone(),
                    usage: r.usage.as_ref().map(|u| RecordedUsage {
                        input_tokens: u.input_tokens,
                        output_tokens: u.output_tokens,
                        cache_read_tokens: u.cache_read_tokens,
                        cache_write_tokens: u.cache_write_tokens,
                        credits_nano: u.credits_nano,
                        credits_at_least: u.credits_at_least,
                    }),
                }),
                None,
            ),
            Err(e) => (None, Some(e.message().to_string())),
        };
        Exchange {
            key: key_of(request).to_string(),
            attempt: request.attempt,
            request: RecordedRequest {
                prompt: request.prompt.clone(),
                label: request.label.clone(),
                model: request.model.clone(),
                schema: request.schema.clone(),
                limits: request.limits.clone(),
                agent: request.tuning.agent.clone(),
                reasoning_effort: request.tuning.reasoning_effort.clone(),
                context_tier: request.tuning.context_tier.clone(),
            },
            reply,
            error,
        }
    }

    /// The recorded outcome.
    pub fn outcome(&self) -> Result<AgentReply, BackendError> {
        match (&self.reply, &self.error) {
            (Some(r), _) => Ok(AgentReply {
                text: r.text.clone(),
                usage: r.usage.as_ref().map(|u| Usage {
                    input_tokens: u.input_tokens,
                    output_tokens: u.output_tokens,
                    cache_read_tokens: u.cache_read_tokens,
                    cache_write_tokens: u.cache_write_tokens,
                    credits_nano: u.credits_nano,
                    credits_at_least: u.credits_at_least,
                }),
                ..AgentReply::default()
            }),
            (None, Some(e)) => Err(BackendError::ordinary(e.clone())),
            (None, None) => Err(BackendError::ordinary("cassette: the exchange has neither reply nor error")),
        }
    }
}

/// The canonical key of a request, as the run engine computes it.
pub fn key_of(request: &AgentRequest) -> AgentKey {
    AgentKey::of(
        &request.prompt,
        request.label.as_deref(),
        request.schema.as_ref(),
        request.model.as_deref(),
        &request.limits,
        &request.tuning,
    )
}

/// One exchange of a cassette as a caller sends it to the service with a start: the
/// exchange and its line in the caller's file (for messages).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TapeEntry {
    /// Its line in the caller's cassette file (1-based).
    pub line: usize,
    /// The exchange.
    pub exchange: Exchange,
}

/// A cassette file read as a caller sends it ([`read_cassette_lines`], bounded alike): its
/// entries with their lines, refused as [`CassetteError::TooLarge`] when their wire form
/// would be over [`MAX_CASSETTE_BYTES`] (a file written by hand may be spelled shorter than
/// its entries are sent).
pub fn read_tape(path: &Path) -> Result<Vec<TapeEntry>, CassetteError> {
    let entries: Vec<TapeEntry> =
        read_cassette_lines(path)?.into_iter().map(|(line, exchange)| TapeEntry { line, exchange }).collect();
    let mut sized = SizeCount(0);
    // Counting into a sink cannot fail but on an entry serde cannot write (none here).
    let _ = serde_json::to_writer(&mut sized, &entries);
    if sized.0 > MAX_CASSETTE_BYTES {
        let shown = path.display().to_string();
        return Err(CassetteError::TooLarge { path: shown, bytes: sized.0, limit: MAX_CASSETTE_BYTES });
    }
    Ok(entries)
}

/// A writer that only counts the bytes written to it.
struct SizeCount(u64);

impl Write for SizeCount {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Read every exchange of a cassette file (bounded: [`MAX_CASSETTE_BYTES`] a file,
/// [`MAX_CASSETTE_LINE_BYTES`] a line). Each exchange's line number is [`read_cassette_lines`]'.
pub fn read_cassette(path: &Path) -> Result<Vec<Exchange>, CassetteError> {
    Ok(read_cassette_lines(path)?.into_iter().map(|(_, exchange)| exchange).collect())
}

/// Every exchange of a cassette file with its line number (1-based), bounded as [`read_cassette`].
pub fn read_cassette_lines(path: &Path) -> Result<Vec<(usize, Exchange)>, CassetteError> {
    use std::io::Read;
    let shown = path.display().to_string();
    let io = |source| CassetteError::Io { path: shown.clone(), source };
    let file = std::fs::File::open(path).map_err(io)?;
    let size = file.metadata().map_err(io)?.len();
    if size > MAX_CASSETTE_BYTES {
        return Err(CassetteError::TooLarge { path: shown, bytes: size, limit: MAX_CASSETTE_BYTES });
    }
    // The file may grow after the size was read (or not be a regular file): read one byte
    // past the limit at most.
    let mut bytes = Vec::new();
    file.take(MAX_CASSETTE_BYTES + 1).read_to_end(&mut bytes).map_err(io)?;
    if bytes.len() as u64 > MAX_CASSETTE_BYTES {
        return Err(CassetteError::TooLarge { path: shown, bytes: bytes.len() as u64, limit: MAX_CASSETTE_BYTES });
    }
    let text = String::from_utf8(bytes).map_err(|source| CassetteError::NotText { path: shown.clone(), source })?;
    let invalid = |line: usize, message: String| CassetteError::Invalid { path: shown.clone(), line, message };
    if let Some((i, line)) = text.lines().enumerate().find(|(_, l)| l.len() > MAX_CASSETTE_LINE_BYTES) {
        return Err(CassetteError::LineTooLong {
            path: shown,
            line: i + 1,
            bytes: line.len(),
            limit: MAX_CASSETTE_LINE_BYTES,
        });
    }
    let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty());
    let Some((_, first)) = lines.next() else {
        return Err(invalid(1, "empty file, expected a cassette header".into()));
    };
    let header: Header =
        serde_json::from_str(first).map_err(|source| CassetteError::Header { path: shown.clone(), source })?;
    if header.cassette != FORMAT {
        return Err(invalid(1, format!("not a factory cassette (`{}`)", header.cassette)));
    }
    if header.version != CASSETTE_VERSION {
        return Err(invalid(
            1,
            format!(
                "cassette version {} is not supported (this build reads version {CASSETTE_VERSION})",
                header.version
            ),
        ));
    }
    lines
        .map(|(i, line)| {
            serde_json::from_str(line).map(|e| (i + 1, e)).map_err(|source| CassetteError::Exchange {
                path: shown.clone(),
                line: i + 1,
                source,
            })
        })
        .collect()
}

/// Appends exchanges to a new cassette file, one flushed line each, or keeps them in
/// memory for a caller in another process ([`Recording`]).
struct Recorder {
    path: Option<PathBuf>,
    sink: Sink,
}

/// Where a [`Recorder`] puts its exchanges.
enum Sink {
    File(Mutex<std::fs::File>),
    Memory(Recording),
}

/// The exchanges a run records in memory for its caller, who writes them to its own file
/// ([`write_cassette`]): at most [`MAX_CASSETTE_BYTES`] of them as a cassette's lines (a
/// replay reads no more), past which recording a call fails it.
#[derive(Clone)]
pub struct Recording {
    kept: Arc<Mutex<Kept>>,
    limit: u64,
}

#[derive(Default)]
struct Kept {
    exchanges: Vec<Exchange>,
    bytes: u64,
}

impl Default for Recording {
    fn default() -> Self {
        Recording::with_limit(MAX_CASSETTE_BYTES)
    }
}

impl Recording {
    /// A recording of at most `limit` bytes of cassette text.
    pub fn with_limit(limit: u64) -> Self {
        Recording { kept: Arc::default(), limit }
    }

    /// The exchanges recorded so far, in the order made (taken: the recording is empty after).
    pub fn take(&self) -> Vec<Exchange> {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        kept.bytes = 0;
        std::mem::take(&mut kept.exchanges)
    }

    fn keep(&self, exchange: &Exchange, line_bytes: u64) -> Result<(), BackendError> {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        if kept.bytes.saturating_add(line_bytes) > self.limit {
            return Err(BackendError::outage(
                OutageKind::Misconfigured,
                format!(
                    "cassette: cannot record: the run's exchanges are over {} bytes, the most a cassette holds; \
                     record a shorter run",
                    self.limit
                ),
            ));
        }
        kept.bytes += line_bytes;
        kept.exchanges.push(exchange.clone());
        Ok(())
    }
}

/// The header line of a cassette of this build.
fn header_line() -> String {
    let header = Header { cassette: FORMAT.into(), version: CASSETTE_VERSION };
    serde_json::to_string(&header).unwrap_or_default()
}

/// Write `exchanges` as a new cassette at `path`: a fresh file of our own (`0600`, created
/// exclusively in the cassette's directory, never one planted there nor a symlink), synced
/// and renamed over `path` (a symlink at `path` is replaced, not followed).
pub fn write_cassette(path: &Path, exchanges: &[Exchange]) -> Result<(), CassetteError> {
    let io = |source| CassetteError::Io { path: path.display().to_string(), source };
    let mut text = header_line();
    text.push('\n');
    for exchange in exchanges {
        let line = serde_json::to_string(exchange).map_err(|e| io(std::io::Error::other(e)))?;
        text.push_str(&line);
        text.push('\n');
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let temp = path.with_file_name(format!(".{name}.tmp-{}", uuid::Uuid::new_v4()));
    let mut out = crate::access::private_file_options().create_new(true).open(&temp).map_err(io)?;
    let written = out.write_all(text.as_bytes()).and_then(|()| out.sync_all());
    let renamed = written.and_then(|()| std::fs::rename(&temp, path));
    if renamed.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    renamed.map_err(io)
}

impl Recorder {
    fn create(path: &Path) -> Result<Self, CassetteError> {
        let io = |source| CassetteError::Io { path: path.display().to_string(), source };
        let mut file = crate::access::create_private_file(path).map_err(io)?;
        writeln!(file, "{}", header_line()).and_then(|_| file.flush()).map_err(io)?;
        Ok(Recorder { path: Some(path.to_path_buf()), sink: Sink::File(Mutex::new(file)) })
    }

    fn write(&self, exchange: &Exchange) -> Result<(), BackendError> {
        let fail = |e: &dyn std::fmt::Display| {
            let shown = self.path.as_ref().map_or("(in memory)".to_string(), |p| p.display().to_string());
            BackendError::outage(OutageKind::Misconfigured, format!("cassette `{shown}`: cannot record: {e}"))
        };
        let mut line = serde_json::to_string(exchange).map_err(|e| fail(&e))?;
        line.push('\n');
        match &self.sink {
            Sink::File(file) => {
                let mut file = file.lock().unwrap_or_else(|p| p.into_inner());
                file.write_all(line.as_bytes()).and_then(|_| file.flush()).map_err(|e| fail(&e))
            }
            Sink::Memory(recording) => recording.keep(exchange, line.len() as u64),
        }
    }
}

/// Recorded exchanges by (key, attempt), served in order (the last one repeats), and the
/// calls asked for that the cassette does not hold.
struct Replay {
    path: PathBuf,
    /// Every exchange in file order (for [`CassetteUsage::unused`]).
    order: Vec<Exchange>,
    exchanges: HashMap<(String, u32), Vec<Exchange>>,
    served: Mutex<HashMap<(String, u32), usize>>,
    /// Calls the cassette held no exchange for, in the order they were asked (bounded).
    missed: Mutex<Vec<RecordedCall>>,
    /// Entries never served: their recorded request does not hash to their key.
    rejected: Vec<RejectedEntry>,
}

/// A cassette entry that is never replayed: its recorded request does not hash to its
/// recorded key (the file was edited, or tampered to answer another call than it shows).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectedEntry {
    /// Its line in the cassette file (1-based).
    pub line: usize,
    /// The key it claims.
    pub key: String,
    /// The key its recorded request hashes to.
    pub actual: String,
    /// Its attempt number.
    pub attempt: u32,
    /// Its recorded label, if any.
    pub label: Option<String>,
}

impl std::fmt::Display for RejectedEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "line {} (key {}, attempt {}) is not replayed: its recorded request hashes to key {}, not to its key \
             (the entry was edited or tampered with; re-record it)",
            self.line,
            self.key.chars().take(12).collect::<String>(),
            self.attempt,
            self.actual.chars().take(12).collect::<String>()
        )
    }
}

/// The most misses a replay remembers (a runaway factory cannot grow the list for ever).
const MAX_MISSES_KEPT: usize = 1000;

/// A call identified by its memo key: what a cassette holds or was asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedCall {
    /// The call's canonical key ([`AgentKey`]).
    pub key: String,
    /// The spawn's attempt number.
    pub attempt: u32,
    /// The label, if any.
    pub label: Option<String>,
    /// The prompt.
    pub prompt: String,
}

impl RecordedCall {
    fn of(exchange: &Exchange) -> Self {
        RecordedCall {
            key: exchange.key.clone(),
            attempt: exchange.attempt,
            label: exchange.request.label.clone(),
            prompt: exchange.request.prompt.clone(),
        }
    }
}

/// What a replay used of its cassette: the recorded calls nobody asked for, and the calls
/// asked for that it did not hold (served live, or failed as misses).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CassetteUsage {
    /// Recorded calls never served, in file order (each (key, attempt) once).
    pub unused: Vec<RecordedCall>,
    /// Calls the cassette held nothing for, in the order asked (each (key, attempt) once).
    pub missed: Vec<RecordedCall>,
}

impl Replay {
    fn load(path: &Path) -> Result<Self, CassetteError> {
        Ok(Replay::of(path, read_cassette_lines(path)?))
    }

    /// The replay of `lines` (each exchange with its line in the file `path`), every entry
    /// checked against its key as a file's are.
    fn of(path: &Path, lines: Vec<(usize, Exchange)>) -> Self {
        let mut order = Vec::new();
        let mut rejected = Vec::new();
        for (line, exchange) in lines {
            let actual = exchange.request.key().to_string();
            if actual == exchange.key {
                order.push(exchange);
            } else {
                let (key, attempt, label) = (exchange.key, exchange.attempt, exchange.request.label);
                rejected.push(RejectedEntry { line, key, actual, attempt, label });
            }
        }
        let mut exchanges: HashMap<(String, u32), Vec<Exchange>> = HashMap::new();
        for exchange in &order {
            exchanges.entry((exchange.key.clone(), exchange.attempt)).or_default().push(exchange.clone());
        }
        let (served, missed) = (Mutex::new(HashMap::new()), Mutex::new(Vec::new()));
        Replay { path: path.to_path_buf(), order, exchanges, served, missed, rejected }
    }

    fn find(&self, request: &AgentRequest) -> Option<Exchange> {
        let id = (key_of(request).to_string(), request.attempt);
        let Some(list) = self.exchanges.get(&id) else {
            let mut missed = self.missed.lock().unwrap_or_else(|p| p.into_inner());
            if missed.len() < MAX_MISSES_KEPT && !missed.iter().any(|m| m.key == id.0 && m.attempt == id.1) {
                missed.push(RecordedCall {
                    key: id.0,
                    attempt: id.1,
                    label: request.label.clone(),
                    prompt: request.prompt.clone(),
                });
            }
            return None;
        };
        let mut served = self.served.lock().unwrap_or_else(|p| p.into_inner());
        let n = served.entry(id).or_insert(0);
        let exchange = list.get(*n).or_else(|| list.last()).cloned();
        *n += 1;
        exchange
    }
}

/// The cassette wrapper backend.
pub struct Cassette {
    live: Option<Arc<dyn AgentBackend>>,
    replay: Option<Arc<Replay>>,
    recorder: Option<Arc<Recorder>>,
    /// A replay miss fails only its call (an ordinary failure), not the attempt.
    lenient: bool,
}

impl Replay {
    fn usage(&self) -> CassetteUsage {
        let served = self.served.lock().unwrap_or_else(|p| p.into_inner());
        let mut seen = std::collections::HashSet::new();
        let unused = self
            .order
            .iter()
            .filter(|e| !served.contains_key(&(e.key.clone(), e.attempt)) && seen.insert((e.key.clone(), e.attempt)))
            .map(RecordedCall::of)
            .collect();
        CassetteUsage { unused, missed: self.missed.lock().unwrap_or_else(|p| p.into_inner()).clone() }
    }
}

impl Cassette {
    /// What the replay used of its cassette so far (`None` when not replaying).
    pub fn usage(&self) -> Option<CassetteUsage> {
        self.replay.as_ref().map(|r| r.usage())
    }

    /// The cassette's entries that are never replayed because their request does not hash
    /// to their key (empty when not replaying).
    pub fn rejected(&self) -> &[RejectedEntry] {
        self.replay.as_ref().map(|r| r.rejected.as_slice()).unwrap_or_default()
    }

    /// The recorded calls of the cassette, in file order (empty when not replaying).
    pub fn recorded(&self) -> Vec<RecordedCall> {
        self.replay.as_ref().map(|r| r.order.iter().map(RecordedCall::of).collect()).unwrap_or_default()
    }

    /// Record every exchange with `live` to a new cassette at `path` (truncated).
    pub fn record(live: Arc<dyn AgentBackend>, path: impl AsRef<Path>) -> Result<Self, CassetteError> {
        Ok(Cassette {
            live: Some(live),
            replay: None,
            recorder: Some(Arc::new(Recorder::create(path.as_ref())?)),
            lenient: false,
        })
    }

    /// Serve every call from the cassette at `path`; a miss is a [`BackendError`].
    pub fn replay(path: impl AsRef<Path>) -> Result<Self, CassetteError> {
        Ok(Cassette {
            live: None,
            replay: Some(Arc::new(Replay::load(path.as_ref())?)),
            recorder: None,
            lenient: false,
        })
    }

    /// Serve every call from the exchanges of a cassette a caller read from its own file
    /// (`shown`, named in messages and never opened here) and sent: each entry with its line
    /// in that file, checked against its key as a file's are (the wire is not trusted); a
    /// miss is a [`BackendError`]. With `live`, a call they do not hold goes to it instead.
    pub fn replay_sent(shown: &Path, entries: Vec<TapeEntry>, live: Option<Arc<dyn AgentBackend>>) -> Self {
        let lines = entries.into_iter().map(|e| (e.line, e.exchange)).collect();
        Cassette { live, replay: Some(Arc::new(Replay::of(shown, lines))), recorder: None, lenient: false }
    }

    /// Serve calls from the cassette at `path`; a call it does not hold goes to `live`.
    pub fn replay_then_live(path: impl AsRef<Path>, live: Arc<dyn AgentBackend>) -> Result<Self, CassetteError> {
        Ok(Cassette {
            live: Some(live),
            replay: Some(Arc::new(Replay::load(path.as_ref())?)),
            recorder: None,
            lenient: false,
        })
    }

    /// Make a replay miss an ordinary failure of its call (the factory sees `null` and goes
    /// on) instead of an outage that stops the attempt: `factory test` then finds every call
    /// an edited factory makes anew, not only the first.
    pub fn misses_fail_calls(mut self) -> Self {
        self.lenient = true;
        self
    }

    /// Record every exchange with `live` in memory, into `recording` (for a caller in
    /// another process, who writes its own file).
    pub fn record_into(live: Arc<dyn AgentBackend>, recording: Recording) -> Self {
        let recorder = Recorder { path: None, sink: Sink::Memory(recording) };
        Cassette { live: Some(live), replay: None, recorder: Some(Arc::new(recorder)), lenient: false }
    }

    /// Also record every exchange served (replayed or live) to a new cassette at `path`.
    pub fn recording_to(mut self, path: impl AsRef<Path>) -> Result<Self, CassetteError> {
        self.recorder = Some(Arc::new(Recorder::create(path.as_ref())?));
        Ok(self)
    }
}

impl AgentBackend for Cassette {
    fn name(&self) -> String {
        match (&self.replay, &self.live) {
            (Some(_), None) => "replay".to_string(),
            (Some(_), Some(live)) => format!("replay-then-{}", live.name()),
            (None, Some(live)) => live.name(),
            (None, None) => "cassette".to_string(),
        }
    }

    fn reference(&self) -> BackendRef {
        match (&self.replay, &self.live) {
            (Some(replay), None) => BackendRef::named(format!("replay:{}", replay.path.display())),
            (_, Some(live)) => live.reference(),
            (None, None) => BackendRef::named("cassette"),
        }
    }

    fn unpriced(&self, model: Option<&str>) -> Option<String> {
        // Replayed exchanges carry their recorded usage; live calls are priced by the live backend.
        self.live.as_ref().and_then(|live| live.unpriced(model))
    }

    fn free_notice(&self, model: Option<&str>) -> Option<String> {
        self.live.as_ref().and_then(|live| live.free_notice(model))
    }

    fn with_grants(&self, grants: &[String]) -> Option<Arc<dyn AgentBackend>> {
        let live = self.live.as_ref()?.with_grants(grants)?;
        Some(Arc::new(Cassette {
            live: Some(live),
            replay: self.replay.clone(),
            recorder: self.recorder.clone(),
            lenient: self.lenient,
        }))
    }

    fn hiding(&self, hidden: &super::Hidden) -> Option<Arc<dyn AgentBackend>> {
        let live = self.live.as_ref()?.hiding(hidden)?;
        Some(Arc::new(Cassette {
            live: Some(live),
            replay: self.replay.clone(),
            recorder: self.recorder.clone(),
            lenient: self.lenient,
        }))
    }

    fn flows(&self) -> Vec<Arc<super::flow::Flow>> {
        self.live.as_ref().map(|live| live.flows()).unwrap_or_default()
    }

    fn describe(&self) -> String {
        match &self.live {
            Some(live) if self.replay.is_some() => format!("replay, then {}", live.describe()),
            Some(live) => live.describe(),
            None => self.name(),
        }
    }

    fn call(&self, request: Arc<AgentRequest>) -> BoxFuture<'static, Result<AgentReply, BackendError>> {
        let live = self.live.clone();
        let replay = self.replay.clone();
        let recorder = self.recorder.clone();
        let lenient = self.lenient;
        Box::pin(async move {
            let recorded = replay.as_ref().and_then(|r| r.find(&request));
            let outcome = match (recorded, live, &replay) {
                (Some(exchange), _, _) => exchange.outcome(),
                (None, Some(live), _) => live.call(request.clone()).await,
                (None, None, Some(replay)) => {
                    let who = request.label.as_deref().unwrap_or("agent");
                    let key = key_of(&request).to_string();
                    let mut message = format!(
                        "cassette miss: `{}` holds no exchange for agent `{who}` (attempt {}, key {}); \
                         record one with --record, or use --replay-then-live",
                        replay.path.display(),
                        request.attempt,
                        &key[..12.min(key.len())]
                    );
                    if let Some(entry) = replay.rejected.iter().find(|r| r.key == key && r.attempt == request.attempt) {
                        message.push_str(&format!(" (its entry at {entry})"));
                    }
                    return Err(if lenient {
                        BackendError::ordinary(message)
                    } else {
                        BackendError::outage(OutageKind::ReplayMiss, message)
                    });
                }
                (None, None, None) => {
                    return Err(BackendError::outage(OutageKind::Misconfigured, "cassette: nothing to serve the call"))
                }
            };
            // An outage is not an answer: it is not recorded, so a replay retries the call.
            let answered = outcome.as_ref().err().and_then(BackendError::outage_kind).is_none();
            if let (Some(recorder), true) = (&recorder, answered) {
                recorder.write(&Exchange::new(&request, &outcome))?;
            }
            outcome
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error reading a cassette file of `text`.
    fn refused(text: &[u8]) -> CassetteError {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.jsonl");
        std::fs::write(&path, text).unwrap();
        read_cassette_lines(&path).expect_err("a broken cassette was read")
    }

    #[test]
    fn a_broken_cassette_keeps_the_decoders_error_as_its_source() {
        let header = format!(r#"{{"cassette":"{FORMAT}","version":{CASSETTE_VERSION}}}"#);
        let e = refused(format!("{header}\n\n{{\"key\": 3").as_bytes());
        assert!(matches!(&e, CassetteError::Exchange { line: 3, .. }), "{e:?}");
        let source = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<serde_json::Error>());
        assert!(source.is_some_and(|s| e.to_string().ends_with(&format!("line 3: {s}"))), "{e}");
        let e = refused(b"[1, 2]\n");
        assert!(matches!(&e, CassetteError::Header { .. }), "{e:?}");
        assert!(e.to_string().contains("line 1: not a cassette header: "), "{e}");
        let e = refused(b"\xff\xfe\n");
        assert!(matches!(&e, CassetteError::NotText { .. }), "{e:?}");
        let source = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<std::string::FromUtf8Error>());
        assert!(source.is_some(), "{e:?}");
    }

    fn request(prompt: &str) -> Arc<AgentRequest> {
        Arc::new(AgentRequest {
            prompt: prompt.into(),
            label: Some("t".into()),
            model: None,
            schema: None,
            attempt: 0,
            feedback: None,
            limits: Default::default(),
            tuning: Default::default(),
        })
    }

    /// A recording in memory keeps what fits its bound; the call that would go over it fails
    /// as an outage naming the bound, and nothing past it is kept.
    #[tokio::test]
    async fn a_recording_in_memory_stops_at_its_bound() {
        let recording = Recording::with_limit(600);
        let cassette = Cassette::record_into(Arc::new(super::super::dry_run::DryRun), recording.clone());
        let mut answered = 0;
        let refused = loop {
            match cassette.call(request(&format!("call {answered}"))).await {
                Ok(_) => answered += 1,
                Err(e) => break e,
            }
            assert!(answered < 100, "the bound never bit");
        };
        assert!(answered >= 1, "one exchange fits");
        assert_eq!(refused.outage_kind(), Some(OutageKind::Misconfigured), "{refused}");
        assert!(refused.message().contains("over 600 bytes"), "{refused}");
        let kept = recording.take();
        assert_eq!(kept.len(), answered);
        let bytes: usize = kept.iter().map(|e| serde_json::to_string(e).unwrap().len() + 1).sum();
        assert!(bytes <= 600, "{bytes}");
        // What a caller writes replays: each entry hashes to its key.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tape.jsonl");
        write_cassette(&path, &kept).unwrap();
        let replay = Cassette::replay(&path).unwrap();
        assert!(replay.rejected().is_empty());
        assert_eq!(replay.recorded().len(), answered);
    }

    /// Entries a caller sent are checked against their keys again: one whose request was
    /// changed is never served, and the miss names its line.
    #[tokio::test]
    async fn sent_entries_are_checked_again() {
        let good = Exchange::new(&request("a"), &Ok(AgentReply { text: "A".into(), ..Default::default() }));
        let mut forged = Exchange::new(&request("b"), &Ok(AgentReply { text: "B".into(), ..Default::default() }));
        forged.request.prompt = "not b".into();
        let entries = vec![TapeEntry { line: 2, exchange: good }, TapeEntry { line: 3, exchange: forged }];
        let cassette = Cassette::replay_sent(Path::new("tape.jsonl"), entries, None);
        assert_eq!(cassette.rejected().len(), 1);
        assert_eq!(cassette.call(request("a")).await.unwrap().text, "A");
        let miss = cassette.call(request("b")).await.unwrap_err();
        assert_eq!(miss.outage_kind(), Some(OutageKind::ReplayMiss), "{miss}");
        assert!(miss.message().contains("`tape.jsonl`") && miss.message().contains("line 3"), "{miss}");
    }
}
