//! The service's wire form: the typed [`Request`]s and [`Response`]s, framed with a wire
//! version, as the control socket carries them (one JSON line each way; a subscription
//! answers with one line per event). Stable camelCase JSON; a frame of another version is
//! refused with `unsupported_version`, and a request with a field this version does not
//! know is refused with `bad_request` rather than half understood.
//!
//! Every answer is bounded: a listing (`runs`) is a page of [`RunSummary`]s (no results,
//! short messages) of at most [`crate::MAX_RUNS_PAGE`] runs, taken after a cursor (`after`,
//! a run id); a run's result is read per run (`envelope`, `detail`), at most the host's
//! `maxResultBytes`, and its messages are cut at
//! [`crate::model::envelope::MAX_MESSAGE_BYTES`].
//!
//! Reading and controlling runs is on behalf of a [`Scope`] (`"scope": {"session": "x"}`
//! or `"scope": "owner"`); starting a run or authoring a factory names the concrete
//! `session` it happens in.

use crate::engine::host::{BackendChoice, RunDetail};
use crate::error::{Error, ErrorCode};
use crate::model::limits::Limits;
use crate::model::scope::Scope;
use crate::store::{ProgressQuery, Registration};
use crate::{ProgressEntry, RunEnvelope, RunSummary, RunUpdated};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

/// The version of the wire form: every frame carries it as `"wire"`.
/// Version 5: `runs` answers with a page of [`RunSummary`]s (`after`, `limit`); `remove`
/// deletes a run. Version 6: a limit override given as `null` lifts the limit (no limit of
/// that kind for the run), where version 5 read it as not given. Version 7: `pause`, a run
/// status `paused`, and a resume's `input` (the answer to the checkpoint a run waits at);
/// `runsPage` pages the runs by creation sequence ([`crate::RunsPage`]), and summaries carry
/// their `seq`. Version 8: `register` of a script file that offers several factories
/// registers each and answers `factories`; pending approvals (a start with consent `ask` may
/// answer `approval`; `approvals`, `approval` and `decide` list, wait on and answer them);
/// `gc` deletes the ended runs a retention policy no longer keeps (of those the scope sees),
/// answered by `collected`; `usage` says where the store's bytes go. Version 9: `describe` says
/// what a factory is (file or registered) as the service loads it, answered by `described`;
/// a `run` or `resume` may carry a cassette the caller read (`replay`, a [`Tape`]), and a
/// request carrying one may be up to [`MAX_TAPE_REQUEST_BYTES`]; with `record` its exchanges
/// come back on the `startFollowing` stream (`recorded` events).
pub const WIRE_VERSION: u32 = 9;

/// The longest request line a server reads (requests are small: ids, paths, limits).
pub const MAX_REQUEST_BYTES: u64 = 1 << 20;

/// The longest request line that carries a cassette ([`Tape`]): the cassette's bound and
/// a request's.
pub const MAX_TAPE_REQUEST_BYTES: u64 = MAX_REQUEST_BYTES + crate::backend::cassette::MAX_CASSETTE_BYTES;

/// The longest response line a client reads (progress pages and details can be large).
pub const MAX_RESPONSE_BYTES: u64 = 64 << 20;

/// One line on the wire: the version and a request, a response or an event.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Frame<T> {
    /// [`WIRE_VERSION`] of the sender.
    pub wire: u32,
    /// What the frame carries.
    pub body: T,
}

impl<T> Frame<T> {
    /// A frame of this build's version.
    pub fn new(body: T) -> Self {
        Frame { wire: WIRE_VERSION, body }
    }
}

/// Only the version of a frame, read first so another version gets a clear answer.
#[derive(Deserialize)]
struct VersionOnly {
    #[serde(default)]
    wire: Option<u32>,
}

/// A request to the service. Reads and controls of runs are on behalf of a [`Scope`] (a
/// session sees its own runs, the owner every session's); factories and new runs belong to
/// a concrete session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase", rename_all_fields = "camelCase", deny_unknown_fields)]
pub enum Request {
    /// A page of the runs the scope sees, in creation order: the summaries of at most
    /// `limit` runs ([`crate::MAX_RUNS_PAGE`] when absent or larger) created after run
    /// `after` (from the first when absent). Each summary names its `session`.
    Runs {
        scope: Scope,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<usize>,
    },
    /// A page of the runs the scope sees by creation sequence ([`crate::RunsPage`]): after
    /// `afterSeq` walking newer, else the newest before `beforeSeq` (the newest page without
    /// either); at most `limit` terminal runs ([`crate::RUNS_PAGE_DEFAULT_LIMIT`] when absent,
    /// [`crate::RUNS_PAGE_MAX_LIMIT`] at most).
    RunsPage {
        scope: Scope,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after_seq: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        before_seq: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<usize>,
    },
    /// A run's envelope.
    Envelope { scope: Scope, run_id: String },
    /// A run's detail.
    Detail { scope: Scope, run_id: String },
    /// A page of a run's progress.
    Progress { scope: Scope, run_id: String, query: ProgressQuery },
    /// Wait for a terminal envelope.
    Wait { scope: Scope, run_id: String },
    /// Cancel a run; answers with its terminal envelope.
    Cancel { scope: Scope, run_id: String },
    /// Pause a running run; answers with its `paused` envelope (`not_running` for a run
    /// with no attempt executing).
    Pause { scope: Scope, run_id: String },
    /// Delete a run that is not executing, and its journal; answers [`Response::Removed`].
    Remove { scope: Scope, run_id: String },
    /// Where the store's bytes go (the owner only); answers [`Response::Usage`].
    Usage { scope: Scope },
    /// Delete the ended runs `policy` no longer keeps among those `scope` sees; with `dry_run`, only
    /// say which. Answers [`Response::Collected`].
    Gc {
        scope: Scope,
        policy: crate::model::retention::Retention,
        #[serde(default)]
        dry_run: bool,
    },
    /// The factories the session can run: its own authored ones and those registered for
    /// everyone.
    Factories { session: String },
    /// One factory, as the session sees it.
    Inspect { session: String, name: String },
    /// What a factory is, loaded as a run would load it (a file, or one registered for the
    /// session), without running it; answers [`Response::Described`].
    Describe { session: String, component: Target },
    /// Register a factory in the authoring form (`meta` JSON and a `run` body, one async
    /// function expression) in the session's own scope, without running it.
    Author { session: String, meta: serde_json::Value, run: String },
    /// Start a run in the background; answers [`Response::Started`] once the run exists.
    Run {
        session: String,
        component: Target,
        #[serde(default)]
        args: Option<serde_json::Value>,
        #[serde(default)]
        limits: Limits,
        /// The backend by name and model, built from the service's own configuration
        /// (empty: the service's default).
        #[serde(default)]
        backend: BackendChoice,
        /// Read-only directories to grant (absolute paths).
        #[serde(default)]
        grants: Vec<PathBuf>,
        /// The user declined to run it: record the run as declined.
        #[serde(default)]
        declined: bool,
        /// What the user consented to on the client (a prompt answered yes, `--yes`).
        #[serde(default)]
        consent: super::Consent,
        /// The caller's trace (W3C `traceparent`), which the run's spans continue.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        trace_parent: Option<crate::trace::TraceParent>,
        /// The caller's working directory (absolute, canonical): hidden from the run's
        /// agent-CLI sandboxes unless granted, as the serving process's own is. Optional
        /// within wire 4, as `traceParent` is: an older service refuses the unknown field
        /// (`bad_request`) rather than running without hiding it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        caller_cwd: Option<PathBuf>,
        /// A cassette the caller read from its own file (`--replay`): the run's calls are
        /// served from it, the service's backend called only for what it does not hold
        /// with `thenLive`. The service never opens a file a request names.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        replay: Option<Tape>,
        /// Record the run's exchanges in memory (at most a cassette's bound) for the caller
        /// (`--record`): they follow the run's progress on a `startFollowing` stream, each a
        /// [`FollowEvent::Recorded`] before the envelope; refused on a plain `run`.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        record: bool,
    },
    /// Resume a run the scope sees in the background (it stays in its own session); answers
    /// [`Response::Started`] once the attempt starts.
    Resume {
        scope: Scope,
        run_id: String,
        #[serde(default)]
        component: Option<PathBuf>,
        #[serde(default)]
        limits: Limits,
        /// Another backend or model than the run recorded (empty: the recorded one).
        #[serde(default)]
        backend: BackendChoice,
        /// What the user consented to for the component this resume runs.
        #[serde(default)]
        consent: super::Consent,
        /// The caller's trace (W3C `traceparent`), which the attempt's spans continue.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        trace_parent: Option<crate::trace::TraceParent>,
        /// The caller's working directory, as [`Request::Run`]'s `callerCwd`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        caller_cwd: Option<PathBuf>,
        /// The answer to the checkpoint the run waits at (`ctx.pause(key)` returns it);
        /// absent: it returns none. Refused (`not_at_checkpoint`) for a run that waits at none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        input: Option<serde_json::Value>,
        /// A cassette the caller read, as [`Request::Run`]'s `replay` (`thenLive`: calls it
        /// does not hold go to the backend the resume runs on).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        replay: Option<Tape>,
        /// Record the attempt's exchanges for the caller, as [`Request::Run`]'s `record`.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        record: bool,
    },
    /// Register a factory under its meta name: for everyone (what `factory add` does), or
    /// with `session` in that session's own scope only (it shadows one of the same name
    /// registered for everyone, as an authored factory does).
    Register {
        source: Source,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<String>,
    },
    /// Announce every update of the runs the scope sees, one [`Frame`] of [`RunUpdated`]
    /// per update, until the client goes away (after a first [`Response::Subscribed`]).
    Subscribe { scope: Scope },
    /// Follow a run the scope sees: a first [`Response::Following`], then one [`Frame`] of
    /// [`FollowEvent`] per progress entry after `after_seq`, in order, and last the terminal
    /// envelope (or the error that ended the follow); then the service closes the stream.
    Follow {
        scope: Scope,
        run_id: String,
        #[serde(default)]
        after_seq: u64,
    },
    /// Start a run or a resume (`start`: a [`Request::Run`] or [`Request::Resume`]) and follow
    /// it on the same connection: a first [`Response::Started`], then the stream of a
    /// [`Request::Follow`] from the run's first entry of this attempt on (one connection per
    /// foreground run). The run is followed as its own session (a run) or the resume's scope.
    StartFollowing { start: Box<Request> },
    /// The service's metrics in the Prometheus text format ([`crate::metrics`]).
    Metrics,
    /// The pending approvals the scope sees ([`super::Approvals`]); answers
    /// [`Response::Approvals`].
    Approvals { scope: Scope },
    /// One approval the scope sees, once answered or after `waitMs` (none: at once; at most
    /// [`super::approvals::MAX_WAIT`]); answers [`Response::Approval`].
    Approval {
        scope: Scope,
        id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wait_ms: Option<u64>,
    },
    /// Answer a pending approval the scope sees: an approval starts the held run; answers
    /// [`Response::Approval`] as it then stands.
    Decide { scope: Scope, id: String, decision: super::Decision },
}

impl Request {
    /// The request's operation name, as on the wire (for messages).
    pub fn op(&self) -> &'static str {
        match self {
            Request::Runs { .. } => "runs",
            Request::RunsPage { .. } => "runsPage",
            Request::Envelope { .. } => "envelope",
            Request::Detail { .. } => "detail",
            Request::Progress { .. } => "progress",
            Request::Wait { .. } => "wait",
            Request::Cancel { .. } => "cancel",
            Request::Pause { .. } => "pause",
            Request::Remove { .. } => "remove",
            Request::Gc { .. } => "gc",
            Request::Usage { .. } => "usage",
            Request::Factories { .. } => "factories",
            Request::Inspect { .. } => "inspect",
            Request::Describe { .. } => "describe",
            Request::Author { .. } => "author",
            Request::Run { .. } => "run",
            Request::Resume { .. } => "resume",
            Request::Register { .. } => "register",
            Request::Subscribe { .. } => "subscribe",
            Request::Follow { .. } => "follow",
            Request::StartFollowing { .. } => "startFollowing",
            Request::Metrics => "metrics",
            Request::Approvals { .. } => "approvals",
            Request::Approval { .. } => "approval",
            Request::Decide { .. } => "decide",
        }
    }
}

impl Request {
    /// Whether the request (a start) asks for its exchanges recorded for the caller.
    pub fn records(&self) -> bool {
        matches!(self, Request::Run { record: true, .. } | Request::Resume { record: true, .. })
    }

    /// Whether the request (or the start it follows) carries a cassette, so may be up to
    /// [`MAX_TAPE_REQUEST_BYTES`] long.
    pub fn carries_tape(&self) -> bool {
        match self {
            Request::Run { replay, .. } | Request::Resume { replay, .. } => replay.is_some(),
            Request::StartFollowing { start } => start.carries_tape(),
            _ => false,
        }
    }
}

/// A cassette a caller read from its own file and sends with a start (wire 9): the service
/// checks every entry against its key again and serves calls from them in memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Tape {
    /// The file as the caller named it: shown in messages, never opened by the service.
    pub shown: PathBuf,
    /// Its exchanges in file order, each with its line.
    pub entries: Vec<crate::backend::cassette::TapeEntry>,
    /// Calls it does not hold go to the run's backend (`--replay-then-live`); otherwise
    /// such a call is a replay miss.
    #[serde(default)]
    pub then_live: bool,
}

/// This process's working directory, canonical, as a `Run` or `Resume` request carries it
/// for the serving process to hide (`None` when it cannot be read).
pub fn caller_cwd() -> Option<PathBuf> {
    std::env::current_dir().and_then(std::fs::canonicalize).ok()
}

/// What a `Run` request runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Target {
    /// A component or script file on the service's machine (an absolute path).
    File(PathBuf),
    /// A registered factory, by name (never a path, whatever files exist).
    Registered(String),
}

/// What a `Register` request registers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase", deny_unknown_fields)]
pub enum Source {
    /// A component or script file on the service's machine (an absolute path).
    File(PathBuf),
    /// An authoring document's text (`{ "meta": {...}, "run": "async (ctx) => ..." }`).
    Document(String),
    /// The authoring form: `meta` JSON and a `run` body.
    Authored { meta: serde_json::Value, run: String },
}

/// A successful answer, one variant per kind of result.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum Response {
    /// A page of run summaries, in creation order (`runs`).
    Runs(Vec<RunSummary>),
    /// A page of run summaries by creation sequence (`runsPage`).
    RunsPage(Box<crate::RunsPage>),
    /// One run's envelope (`envelope`, `wait`, `cancel`, `pause`).
    Envelope(Box<RunEnvelope>),
    /// One run's detail (`detail`).
    Detail(Box<RunDetail>),
    /// A page of progress (`progress`).
    Progress(Vec<ProgressEntry>),
    /// Factories (`factories`; `register` of a script file that offers several).
    Factories(Vec<Registration>),
    /// One factory (`inspect`, `author`).
    Registration(Box<Registration>),
    /// What a factory is ([`Request::Describe`]).
    Described(Box<Description>),
    /// A run or attempt started in the background (`run`, `resume`).
    Started { run_id: String },
    /// A run and its journal were deleted (`remove`).
    Removed { run_id: String },
    /// Where the store's bytes go (`usage`; `null` for a store that does not measure itself).
    Usage(Option<Box<crate::store::StoreUsage>>),
    /// What a retention pass deleted (`gc`).
    Collected(crate::engine::gc::GcReport),
    /// A subscription is open: [`RunUpdated`] frames follow (`subscribe`).
    Subscribed,
    /// A follow stream is open: [`FollowEvent`] frames follow (`follow`).
    Following,
    /// The Prometheus text exposition (`metrics`).
    Metrics { text: String },
    /// Pending approvals (`approvals`).
    Approvals(Vec<super::Approval>),
    /// One approval (`approval`, `decide`, and a `run` or `resume` with consent `ask` that
    /// now waits for the owner).
    Approval(Box<super::Approval>),
}

/// The answer [`Response::body`] gives for `run` and `resume`: `{"runId"}`.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StartedAnswer {
    /// The run started or resumed.
    pub run_id: String,
}

/// The answer [`Response::body`] gives for `remove`: `{"runId", "removed": true}`.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Removed {
    /// The run deleted with its journal.
    pub run_id: String,
    /// Always true.
    pub removed: bool,
}

/// What a factory is, as the service loaded it ([`Request::Describe`]): what a consent
/// question shows and `factory describe` prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Description {
    /// Its metadata.
    pub meta: crate::model::meta::FactoryMeta,
    /// sha256 of the component (for a script factory, of the JS runner that runs it).
    pub sha256: String,
    /// The script source, for a script factory.
    #[serde(default)]
    pub script: Option<crate::model::script::ScriptRef>,
    /// The component's imports.
    pub imports: Vec<String>,
    /// The sandbox limits every run of the service answering gets.
    pub sandbox: crate::model::sandbox_limits::SandboxLimits,
}

impl Description {
    /// What consent to run it is about: its script source's sha256 for a script factory,
    /// else its component's ([`super::trust_key`] of the factory it describes).
    pub fn trust_key(&self) -> &str {
        self.script.as_ref().map_or(&self.sha256, |s| &s.sha256)
    }

    /// Whether it imports WASI (beyond the factory interfaces).
    pub fn imports_wasi(&self) -> bool {
        self.imports.iter().any(|i| i.starts_with("wasi:"))
    }
}

impl Response {
    /// The variant's name, as on the wire (for messages).
    pub fn kind(&self) -> &'static str {
        match self {
            Response::Runs(_) => "runs",
            Response::RunsPage(_) => "runsPage",
            Response::Envelope(_) => "envelope",
            Response::Detail(_) => "detail",
            Response::Progress(_) => "progress",
            Response::Factories(_) => "factories",
            Response::Registration(_) => "registration",
            Response::Described(_) => "described",
            Response::Started { .. } => "started",
            Response::Removed { .. } => "removed",
            Response::Collected(_) => "collected",
            Response::Usage(_) => "usage",
            Response::Subscribed => "subscribed",
            Response::Following => "following",
            Response::Metrics { .. } => "metrics",
            Response::Approvals(_) => "approvals",
            Response::Approval(_) => "approval",
        }
    }

    /// The answer as the HTTP API and MCP show it: the result itself, without the variant
    /// tag (`{"runId"}` for a start).
    pub fn body(&self) -> Result<serde_json::Value, serde_json::Error> {
        match self {
            Response::Runs(runs) => serde_json::to_value(runs),
            Response::RunsPage(page) => serde_json::to_value(page),
            Response::Envelope(envelope) => serde_json::to_value(envelope),
            Response::Detail(detail) => serde_json::to_value(detail),
            Response::Progress(page) => serde_json::to_value(page),
            Response::Factories(factories) => serde_json::to_value(factories),
            Response::Registration(registration) => serde_json::to_value(registration),
            Response::Described(description) => serde_json::to_value(description),
            Response::Started { run_id } => serde_json::to_value(StartedAnswer { run_id: run_id.clone() }),
            Response::Removed { run_id } => serde_json::to_value(Removed { run_id: run_id.clone(), removed: true }),
            Response::Collected(report) => serde_json::to_value(report),
            Response::Usage(usage) => serde_json::to_value(usage),
            Response::Subscribed | Response::Following => Ok(serde_json::json!({})),
            Response::Metrics { text } => Ok(serde_json::json!({ "text": text })),
            Response::Approvals(approvals) => serde_json::to_value(approvals),
            Response::Approval(approval) => serde_json::to_value(approval),
        }
    }
}

/// An answer line: the response, or the error with its code.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Answer {
    /// The request succeeded.
    Ok(Response),
    /// The request failed.
    Err(RemoteError),
}

/// An event line of a subscription.
pub type Event = RunUpdated;

/// An event line of a follow stream ([`Request::Follow`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FollowEvent {
    /// The run's next progress entry.
    Progress(ProgressEntry),
    /// One exchange the run recorded for its caller (a start with `record`), in the order
    /// made: all of them come after the run's progress, right before `ended`.
    Recorded(Box<crate::backend::cassette::Exchange>),
    /// The run is terminal: its envelope, the stream's last event.
    Ended(Box<RunEnvelope>),
    /// Following failed (the run went away, the store failed): the stream's last event.
    Failed(RemoteError),
}

/// A failed request, with the library error's code.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[serde(deny_unknown_fields)]
#[error("{message}")]
pub struct RemoteError {
    /// What kind of refusal it is.
    pub code: ErrorCode,
    /// What went wrong.
    pub message: String,
}

impl From<&Error> for RemoteError {
    fn from(e: &Error) -> Self {
        RemoteError { code: e.code(), message: e.to_string() }
    }
}

impl RemoteError {
    /// A `bad_request` refusal.
    pub fn bad_request(message: impl Into<String>) -> Self {
        RemoteError { code: ErrorCode::BadRequest, message: message.into() }
    }
}

/// Parse a request line: its version first (another version is `unsupported_version`),
/// then the request itself (an unknown operation or field is `bad_request`).
pub fn parse_request(line: &[u8]) -> Result<Request, RemoteError> {
    let version = serde_json::from_slice::<VersionOnly>(line).map_err(|e| RemoteError::bad_request(e.to_string()))?;
    if version.wire != Some(WIRE_VERSION) {
        return Err(RemoteError {
            code: ErrorCode::UnsupportedVersion,
            message: format!(
                "this factory process speaks service wire version {WIRE_VERSION}, the request {}; use the same factory version",
                version.wire.map_or("names none".to_string(), |v| format!("version {v}"))
            ),
        });
    }
    serde_json::from_slice::<Frame<Request>>(line).map(|f| f.body).map_err(|e| RemoteError::bad_request(e.to_string()))
}

/// Parse an answer or event line of this version (`what` names it in errors).
pub(crate) fn parse_frame<T: serde::de::DeserializeOwned>(line: &[u8]) -> Result<T, String> {
    let version = serde_json::from_slice::<VersionOnly>(line).map_err(|e| e.to_string())?;
    if version.wire != Some(WIRE_VERSION) {
        return Err(format!(
            "the factory process holding the store speaks service wire version {}, this one {WIRE_VERSION}; \
             stop it (or let it go idle) and use one factory version",
            version.wire.map_or("(none)".to_string(), |v| v.to_string())
        ));
    }
    serde_json::from_slice::<Frame<T>>(line).map(|f| f.body).map_err(|e| {
        let start = String::from_utf8_lossy(&line[..line.len().min(200)]).into_owned();
        format!("{e}: {start:?}")
    })
}

/// Read one `\n`-terminated line of at most `limit` bytes (the newline excluded). `Ok(None)`:
/// the line is longer than `limit`. At end of stream, whatever was read (possibly empty).
pub async fn read_line_bounded<R: tokio::io::AsyncRead + Unpin>(
    read: R,
    limit: u64,
) -> std::io::Result<Option<Vec<u8>>> {
    let mut line = Vec::new();
    BufReader::new(read.take(limit + 1)).read_until(b'\n', &mut line).await?;
    if line.last() == Some(&b'\n') {
        line.pop();
    } else if line.len() as u64 > limit {
        return Ok(None);
    }
    Ok(Some(line))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line<T: Serialize>(frame: &Frame<T>) -> Vec<u8> {
        serde_json::to_vec(frame).unwrap()
    }

    #[test]
    fn requests_round_trip_in_camel_case() {
        let resume = Request::Resume {
            scope: Scope::Owner,
            run_id: "r".into(),
            component: None,
            limits: Limits::default(),
            backend: BackendChoice::default(),
            consent: super::super::Consent::Any,
            trace_parent: None,
            caller_cwd: Some(PathBuf::from("/home/me/project")),
            input: Some(serde_json::json!({"approved": true})),
            replay: None,
            record: true,
        };
        let requests = vec![
            Request::Runs { scope: Scope::from("s"), after: None, limit: None },
            Request::Runs { scope: Scope::Owner, after: Some("r".into()), limit: Some(10) },
            Request::RunsPage { scope: Scope::from("s"), after_seq: None, before_seq: Some(3), limit: Some(1) },
            Request::Detail { scope: Scope::from("s"), run_id: "r".into() },
            Request::Cancel { scope: Scope::Owner, run_id: "r".into() },
            Request::Pause { scope: Scope::from("s"), run_id: "r".into() },
            Request::Remove { scope: Scope::from("s"), run_id: "r".into() },
            Request::Usage { scope: Scope::Owner },
            Request::Gc {
                scope: Scope::Owner,
                policy: crate::model::retention::Retention { keep_days: Some(30), keep_last: None },
                dry_run: true,
            },
            Request::Progress {
                scope: Scope::from("s"),
                run_id: "r".into(),
                query: ProgressQuery { after_seq: Some(3), ..Default::default() },
            },
            Request::Run {
                session: "s".into(),
                component: Target::Registered("review".into()),
                args: Some(serde_json::json!({"files": ["a"]})),
                // A lifted limit goes as null and comes back lifted.
                limits: Limits {
                    max_total_subagents: Some(4),
                    lifted: crate::model::limits::Lifted { max_ai_credits: true, ..Default::default() },
                    ..Default::default()
                },
                backend: BackendChoice::default(),
                grants: vec![PathBuf::from("/tmp")],
                declined: false,
                consent: super::super::Consent::Sha256("ab".into()),
                trace_parent: Some(
                    crate::trace::TraceParent::parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
                        .unwrap(),
                ),
                caller_cwd: None,
                replay: Some(Tape { shown: PathBuf::from("tape.jsonl"), entries: Vec::new(), then_live: true }),
                record: false,
            },
            resume.clone(),
            Request::Subscribe { scope: Scope::from("s") },
            Request::Subscribe { scope: Scope::Owner },
            Request::Approvals { scope: Scope::Owner },
            Request::Approval { scope: Scope::from("s"), id: "a".into(), wait_ms: Some(5) },
            Request::Decide { scope: Scope::Owner, id: "a".into(), decision: super::super::Decision::Always },
            Request::Follow { scope: Scope::from("s"), run_id: "r".into(), after_seq: 7 },
            Request::StartFollowing { start: Box::new(resume) },
        ];
        for request in requests {
            let bytes = line(&Frame::new(request.clone()));
            assert_eq!(parse_request(&bytes).unwrap(), request, "{}", String::from_utf8_lossy(&bytes));
        }
        let text =
            String::from_utf8(line(&Frame::new(Request::Detail { scope: Scope::from("s"), run_id: "r".into() })))
                .unwrap();
        assert_eq!(text, r#"{"wire":9,"body":{"op":"detail","scope":{"session":"s"},"runId":"r"}}"#);
        let text = String::from_utf8(line(&Frame::new(Request::Follow {
            scope: Scope::Owner,
            run_id: "r".into(),
            after_seq: 2,
        })))
        .unwrap();
        assert_eq!(text, r#"{"wire":9,"body":{"op":"follow","scope":"owner","runId":"r","afterSeq":2}}"#);
        let text =
            String::from_utf8(line(&Frame::new(Request::Runs { scope: Scope::Owner, after: None, limit: None })))
                .unwrap();
        assert_eq!(text, r#"{"wire":9,"body":{"op":"runs","scope":"owner"}}"#);
        // Starting a run names its session, not a scope.
        let text = String::from_utf8(line(&Frame::new(Request::Factories { session: "s".into() }))).unwrap();
        assert_eq!(text, r#"{"wire":9,"body":{"op":"factories","session":"s"}}"#);
    }

    #[test]
    fn another_version_is_refused_with_its_code() {
        for text in [
            r#"{"wire":2,"op":"runs","session":"s"}"#,
            r#"{"body":{"op":"runs","scope":"owner"}}"#,
            // Version 3 named a bare session where a scope is now.
            r#"{"wire":3,"body":{"op":"runs","session":"s"}}"#,
            // Version 4 answered `runs` with whole envelopes.
            r#"{"wire":4,"body":{"op":"runs","scope":"owner"}}"#,
            // Version 5 read a limit given as null as not given; it now lifts the limit.
            r#"{"wire":5,"body":{"op":"runs","scope":"owner"}}"#,
            // Version 6 knew no `paused` status, `pause` or resume `input`, no `runsPage`
            // and no `seq` in summaries.
            r#"{"wire":6,"body":{"op":"runs","scope":"owner"}}"#,
            // Version 7 knew no pending approvals and no `gc`.
            r#"{"wire":7,"body":{"op":"runs","scope":"owner"}}"#,
            // Version 8 knew no `describe` and no cassette sent with a start.
            r#"{"wire":8,"body":{"op":"runs","scope":"owner"}}"#,
        ] {
            let e = parse_request(text.as_bytes()).unwrap_err();
            assert_eq!(e.code, ErrorCode::UnsupportedVersion, "{text}: {e}");
        }
        let answer = r#"{"wire":10,"body":{"ok":"subscribed"}}"#;
        let e = parse_frame::<Answer>(answer.as_bytes()).unwrap_err();
        assert!(e.contains("version 10"), "{e}");
    }

    #[test]
    fn unknown_fields_and_operations_are_refused() {
        for text in [
            r#"{"wire":9,"body":{"op":"runs","scope":"owner","all":true}}"#,
            r#"{"wire":9,"body":{"op":"detail","scope":"owner","run_id":"r"}}"#,
            r#"{"wire":9,"body":{"op":"drop","scope":"owner"}}"#,
            r#"{"wire":9,"body":{"op":"runs","scope":"owner"},"extra":1}"#,
            // A bare session where a scope goes, a scope that is neither form, a session
            // with more beside it, and a start request without its concrete session.
            r#"{"wire":9,"body":{"op":"runs","session":"s"}}"#,
            r#"{"wire":9,"body":{"op":"runs","scope":"all"}}"#,
            r#"{"wire":9,"body":{"op":"cancel","scope":{"session":"s","owner":true},"runId":"r"}}"#,
            r#"{"wire":9,"body":{"op":"author","scope":"owner","meta":{},"run":"x"}}"#,
        ] {
            let e = parse_request(text.as_bytes()).unwrap_err();
            assert_eq!(e.code, ErrorCode::BadRequest, "{text}: {e}");
        }
    }

    #[test]
    fn answers_round_trip() {
        let answer = Answer::Ok(Response::Started { run_id: "r1".into() });
        let bytes = line(&Frame::new(answer));
        assert_eq!(String::from_utf8_lossy(&bytes), r#"{"wire":9,"body":{"ok":{"started":{"runId":"r1"}}}}"#);
        match parse_frame::<Answer>(&bytes).unwrap() {
            Answer::Ok(Response::Started { run_id }) => assert_eq!(run_id, "r1"),
            other => panic!("{other:?}"),
        }
        let err = Answer::Err(RemoteError { code: ErrorCode::NotFound, message: "no run".into() });
        match parse_frame::<Answer>(&line(&Frame::new(err))).unwrap() {
            Answer::Err(e) => assert_eq!((e.code, e.message.as_str()), (ErrorCode::NotFound, "no run")),
            other => panic!("{other:?}"),
        }
    }
}
