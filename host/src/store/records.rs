//! The records the store keeps, as serde types: a run ([`RunRecord`]), a registered
//! factory ([`Registration`]), and the query that pages progress ([`ProgressQuery`]), with
//! what every store does to them alike (crash repair, the stand-in for an unreadable record).

use crate::model::envelope::RunEnvelope;
use crate::model::limits::Limits;
use crate::model::meta::FactoryMeta;
use serde::{Deserialize, Serialize};

/// The session runs belong to when the caller names none.
pub const DEFAULT_SESSION: &str = "default";

/// RFC 3339 UTC timestamp, milliseconds.
pub fn timestamp() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

/// Everything the store keeps about a run besides its journal and progress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRecord {
    /// The envelope as of the last record write.
    pub envelope: RunEnvelope,
    /// The owner session: other sessions do not see the run.
    pub session: String,
    /// The arguments (JSON text), fixed at creation.
    pub args: String,
    /// Limit overrides given so far (run, then each resume).
    pub overrides: Limits,
    /// Effective limits of the latest attempt.
    pub limits: Limits,
    /// The component sha256 each attempt ran.
    pub component_hashes: Vec<String>,
    /// The source each attempt ran, for a script factory (index-aligned with
    /// `component_hashes`; empty for runs recorded before scripts existed).
    #[serde(default)]
    pub scripts: Vec<Option<crate::model::script::ScriptRef>>,
    /// The backend each attempt used (empty for runs recorded before backends were).
    #[serde(default)]
    pub backends: Vec<crate::model::recorded::BackendRef>,
    /// Read-only directories granted to the run.
    #[serde(default)]
    pub grants: Vec<String>,
    /// Record writes so far; with the progress seq it forms the revision.
    pub writes: u64,
    /// Creation order.
    pub seq: u64,
    /// Why the last attempt ended `halted` when its process stopped it (a crash found at
    /// reopen, or a shutdown), or that it is parked until its backend's quota resets: what
    /// automatic recovery ([`crate::engine::recover`]) resumes. `None` for every other ending;
    /// each attempt's start clears it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<Interruption>,
    /// Automatic recoveries since a caller last started or resumed the run (a caller's
    /// resume sets it back to 0).
    #[serde(default)]
    pub recoveries: u32,
    /// On a shared store: the seal (hex) binding the consent given to this run to what its
    /// latest attempt runs (component, backend, grants, limits, args), made by the worker that
    /// started or resumed it and checked by one that executes it without a caller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seal: Option<String>,
    /// The working directories (canonical) of the callers in other processes that started or
    /// resumed the run, the latest [`MAX_CALLER_DIRS`]: hidden from its subagent sandboxes
    /// unless granted on every attempt, also one that a recovery or another worker runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub caller_dirs: Vec<String>,
    /// The phases the latest attempt's factory declares (empty for runs recorded before
    /// they were kept).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phases: Vec<crate::model::meta::PhaseDecl>,
    /// The checkpoints (`ctx.pause(key)`) the run has passed, each with the answer the
    /// resume that passed it carried (JSON text; `None`: resumed without one). Every later
    /// attempt's `ctx.pause(key)` returns it. Bounded by the engine: at most 256, each
    /// answer at most 64 KiB, 1 MiB of answers in all.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub checkpoints: std::collections::BTreeMap<String, Option<String>>,
}

/// A run record as a listing reads it ([`crate::store::Store::listed_runs`]): its result
/// left in the store, only the result's size kept.
#[derive(Debug, Clone, PartialEq)]
pub struct ListedRun {
    /// The record, its envelope's `result` absent.
    pub record: RunRecord,
    /// Bytes of the result's JSON text, when the run has one.
    pub result_bytes: Option<u64>,
}

impl ListedRun {
    /// `record` with its result dropped and its size kept.
    pub fn of(mut record: RunRecord) -> ListedRun {
        let result_bytes = record.envelope.result.take().map(|r| r.get().len() as u64);
        ListedRun { record, result_bytes }
    }
}

/// A run remembers at most this many callers' working directories ([`RunRecord::caller_dirs`]).
pub const MAX_CALLER_DIRS: usize = 16;

impl RunRecord {
    /// Remember `dir` as a caller's working directory (once; the oldest is forgotten past
    /// [`MAX_CALLER_DIRS`]).
    pub fn add_caller_dir(&mut self, dir: &std::path::Path) {
        let dir = dir.to_string_lossy().into_owned();
        self.caller_dirs.retain(|d| *d != dir);
        self.caller_dirs.push(dir);
        if self.caller_dirs.len() > MAX_CALLER_DIRS {
            self.caller_dirs.remove(0);
        }
    }
}

/// How a run's process stopped its attempt, leaving it `halted` through no fault or choice of
/// the run's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Interruption {
    /// The process holding the store died during the attempt (found at the next open).
    Crash,
    /// The host shut down during the attempt (`factory serve` stopped, a terminated `factory run`).
    Shutdown,
    /// The backend's quota is spent: the run is parked until its envelope's `resumeAt`, when
    /// the service resumes it by itself (not counted as an automatic recovery). A run whose
    /// provider did not say when the quota resets has no mark: it is resumed by hand.
    Quota,
}

/// A registered factory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Registration {
    /// Its metadata at registration.
    pub meta: FactoryMeta,
    /// The component's sha256 (its bytes are in the store under it).
    pub hash: String,
    /// For a script factory: its source (the text is stored under its sha256; `hash` is
    /// then the runner's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<crate::model::script::ScriptRef>,
    /// When it was registered.
    pub added_at: String,
    /// The session it was authored in (an MCP connection's), which alone sees and runs it;
    /// `None`: registered for everyone (`factory add`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
}

impl Registration {
    /// Its key in the store: the name, or the name within its session.
    pub fn key(&self) -> String {
        registration_key(self.session.as_deref(), &self.meta.name)
    }
}

/// The store key of factory `name` registered in `session` (`None`: for everyone). Session
/// keys start with a NUL, which no global name can, so the two never collide.
pub fn registration_key(session: Option<&str>, name: &str) -> String {
    match session {
        Some(session) => format!("\u{0}{session}\u{0}{name}"),
        None => name.to_string(),
    }
}

/// The printable form of a registration key (a session key's NULs shown as `/`).
pub fn display_key(key: &str) -> String {
    key.trim_start_matches('\u{0}').replace('\u{0}', "/")
}

/// Crash repair of one run record, as every store does at open: a run the crash left
/// `running` (or `pending`) becomes `halted` with [`Interruption::Crash`], its accounting the
/// last recorded by the attempt (`live`, when there is one) — a lower bound once it has
/// spawned a subagent (calls in flight or not yet committed at the crash may have been
/// billed), so its AI credits are marked "at least". Returns whether it changed.
pub fn halt_interrupted(record: &mut RunRecord, live: Option<crate::model::envelope::Accounting>) -> bool {
    use crate::model::envelope::{Failure, FailureType, RunStatus};
    if !matches!(record.envelope.status, RunStatus::Running | RunStatus::Pending) {
        return false;
    }
    if let Some(accounting) = live {
        record.envelope.accounting = accounting;
    }
    if record.envelope.accounting.agents_spawned > 0 {
        record.envelope.accounting.ai_credits_at_least = true;
    }
    record.envelope.status = RunStatus::Halted;
    let failure = Failure::new(FailureType::Halted, None, "the host stopped during this attempt; resume to continue");
    record.envelope.error = Some(failure.message.clone());
    record.envelope.failure = Some(failure);
    record.envelope.updated_at = timestamp();
    record.interrupted = Some(Interruption::Crash);
    record.writes += 1;
    true
}

/// What [`crate::store::Store::remove_run`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removed {
    /// The run and its journal are gone.
    Removed,
    /// No run has that id.
    NotFound,
    /// The run's record says it executes (`running` or `pending`): nothing was deleted.
    Active,
}

/// Whether a stored run record says its run executes (`running` or `pending`): read
/// leniently, so a record that cannot be read otherwise is not executing.
pub(crate) fn record_says_active(bytes: &[u8]) -> bool {
    use crate::model::envelope::RunStatus;
    #[derive(Deserialize)]
    struct Status {
        status: RunStatus,
    }
    #[derive(Deserialize)]
    struct Header {
        envelope: Status,
    }
    serde_json::from_slice::<Header>(bytes)
        .is_ok_and(|h| matches!(h.envelope.status, RunStatus::Running | RunStatus::Pending))
}

/// What a damaged run record still tells: read leniently (every field optional, the rest
/// skipped without being parsed), to list the run instead of failing the list.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RecordHeader {
    envelope: EnvelopeHeader,
    session: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct EnvelopeHeader {
    factory: Option<String>,
    attempts: u32,
    created_at: Option<String>,
    updated_at: Option<String>,
}

/// A stand-in for the record of run `id` that cannot be read (`error`): status `error`,
/// failure `storage`/`unreadable_record`, the factory, session and timestamps when they can
/// still be read. A record whose session is unreadable is listed in the default session.
pub fn unreadable_run(id: &str, seq: u64, bytes: &[u8], error: &serde_json::Error) -> RunRecord {
    let header: RecordHeader = serde_json::from_slice(bytes).unwrap_or_default();
    let message = format!("the record of this run cannot be read ({error}); the rest of the store is intact");
    let failure = crate::model::envelope::Failure::new(
        crate::model::envelope::FailureType::Storage,
        Some("unreadable_record"),
        message.clone(),
    );
    let created_at = header.envelope.created_at.unwrap_or_default();
    RunRecord {
        envelope: RunEnvelope {
            run_id: id.to_string(),
            factory: header.envelope.factory.unwrap_or_else(|| "(unreadable)".into()),
            status: crate::model::envelope::RunStatus::Error,
            result: None,
            failure: Some(failure),
            error: Some(message),
            accounting: Default::default(),
            attempts: header.envelope.attempts,
            backend: None,
            resume_at: None,
            checkpoint: None,
            session: None,
            updated_at: header.envelope.updated_at.unwrap_or_else(|| created_at.clone()),
            created_at,
            revision: 0,
        },
        session: header.session.unwrap_or_else(|| DEFAULT_SESSION.to_string()),
        args: "{}".into(),
        overrides: Limits::default(),
        limits: Limits::default(),
        component_hashes: Vec::new(),
        scripts: Vec::new(),
        backends: Vec::new(),
        grants: Vec::new(),
        writes: 0,
        seq,
        interrupted: None,
        recoveries: 0,
        seal: None,
        caller_dirs: Vec::new(),
        phases: Vec::new(),
        checkpoints: Default::default(),
    }
}

/// Which progress entries to read.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProgressQuery {
    /// Entries after this seq, forwards.
    #[serde(default)]
    pub after_seq: Option<u64>,
    /// Entries before this seq, backwards (returned in ascending order).
    #[serde(default)]
    pub before_seq: Option<u64>,
    /// Only entries recorded in this phase.
    #[serde(default)]
    pub phase: Option<String>,
    /// At most this many (default 50, at most 1000).
    #[serde(default)]
    pub limit: Option<usize>,
}

impl ProgressQuery {
    /// The effective page size.
    pub fn limit(&self) -> usize {
        self.limit.unwrap_or(50).clamp(1, 1000)
    }
}

/// Where a stored progress entry's phase title comes from, as every store resolves it.
pub(crate) enum PhaseTitle {
    /// Known from the entry itself (its text, the title it set, or no phase).
    Known(Option<String>),
    /// The title the entry at this seq set: the store reads it (once per read).
    SetAt(u64),
}

/// A stored progress entry, or [`StoreError::Corrupt`].
pub(crate) fn decode_progress(
    bytes: &[u8],
) -> Result<crate::model::progress::JournaledProgress, crate::store::StoreError> {
    serde_json::from_slice(bytes).map_err(|e| crate::store::corrupt("progress", e))
}

/// Where `stored`'s phase title comes from (its stored text is moved out).
pub(crate) fn phase_title(stored: &mut crate::model::progress::JournaledProgress) -> PhaseTitle {
    use crate::model::progress::ProgressEvent;
    match (stored.phase.take(), stored.phase_seq) {
        (Some(text), _) => PhaseTitle::Known(Some(text)),
        (None, None) => PhaseTitle::Known(None),
        (None, Some(at)) if at == stored.seq => PhaseTitle::Known(match &stored.event {
            ProgressEvent::Phase { title } => Some(title.clone()),
            _ => None,
        }),
        (None, Some(at)) => PhaseTitle::SetAt(at),
    }
}

/// The title the stored progress entry `bytes` set (`None` for an entry of another kind).
pub(crate) fn title_set_by(bytes: &[u8]) -> Result<Option<String>, crate::store::StoreError> {
    Ok(match decode_progress(bytes)?.event {
        crate::model::progress::ProgressEvent::Phase { title } => Some(title),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_written_before_recovery_existed_reads_as_not_interrupted_and_never_recovered() {
        let error = serde_json::from_str::<u8>("x").unwrap_err();
        let mut record = unreadable_run("r1", 0, b"{}", &error);
        let mut old = serde_json::to_value(&record).unwrap();
        assert!(old.get("interrupted").is_none(), "not written when absent: {old:#}");
        old.as_object_mut().unwrap().remove("recoveries");
        let read: RunRecord = serde_json::from_value(old).unwrap();
        assert_eq!((read.interrupted, read.recoveries), (None, 0));

        record.interrupted = Some(Interruption::Crash);
        record.recoveries = 2;
        let text = serde_json::to_value(&record).unwrap();
        assert_eq!((&text["interrupted"], &text["recoveries"]), (&serde_json::json!("crash"), &serde_json::json!(2)));
        assert_eq!(serde_json::from_value::<RunRecord>(text).unwrap(), record);
        let shutdown = serde_json::to_value(Interruption::Shutdown).unwrap();
        assert_eq!(shutdown, serde_json::json!("shutdown"));
        assert_eq!(serde_json::to_value(Interruption::Quota).unwrap(), serde_json::json!("quota"));
    }
}
