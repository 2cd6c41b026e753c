//! [`Attempt`]: what every capability of one attempt shares, and nothing a single capability
//! owns. It is the run's identity and limits, the stop signal (the first cause wins), the
//! attempt's clock, and the journal view: a byte-bounded cache of journal values in front of
//! the store, with the `maxJournalBytes` budget charged by every write. It also holds the
//! progress journal (seq, the current phase, revisions announced to subscribers). Steps,
//! agents, phase/log and sleep each keep their own state in their own module. The hooks
//! reach it through [`AttemptView`], which the run's state in the store data implements.

use super::abort::{Abort, LimitKind, Pause};
use super::cache::ValueCache;
use super::stop::StopSignal;
use crate::backend::AgentBackend;
use crate::model::agent_key::AgentKey;
use crate::model::envelope::Accounting;
use crate::model::envelope::{Failure, FailureType};
use crate::model::limits::Limits;
use crate::model::progress::{JournaledProgress, ProgressEntry, ProgressEvent, RunUpdated};
use crate::model::sandbox_limits::SandboxLimitKind;
use crate::model::sandbox_limits::SandboxLimits;
use crate::store::journal::{decode_outcome, AgentOutcome, Fingerprints, Journal, JournalError, Loaded, LoadedEntries};
use futures::future::{BoxFuture, FutureExt as _};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{broadcast, mpsc};

/// How an attempt was told to stop, and the abort every later hook call answers with.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum StopCause {
    /// Cancelled from outside (the caller) or by the guest's own cancel.
    Cancelled,
    /// The host is shutting down: the run ends `halted`.
    Halted,
    /// A caller paused it, or the body reached a checkpoint: the run ends `paused`.
    Paused(Pause),
    /// A limit, the store, the backend or a bad call: the failure to record.
    Failed(Failure, Abort),
}

/// The journal view and the progress journal, behind one lock that is never held across an
/// await (so a charge and its write are one step, and seqs are written in order).
struct Book {
    /// Step and agent values recently read or written (bounded in bytes).
    cache: ValueCache,
    /// Bytes journaled so far, all attempts (counted against `maxJournalBytes`).
    journal_bytes: u64,
    /// The agent outcomes the journal held at load.
    loaded_agents: LoadedAgents,
    /// The fingerprints of agent keys this attempt journaled.
    added_agents: Fingerprints,
    /// The current phase: the seq of the `Phase` entry that set it, and its title.
    phase: Option<(u64, String)>,
    /// The latest progress seq.
    next_seq: u64,
    /// Where progress entries are encoded, reused from entry to entry: each entry is then
    /// copied out at its exact size, not grown into `serde_json::to_vec`'s doubling buffer.
    encoded: Vec<u8>,
}

/// The largest encoding buffer a [`Book`] keeps between progress entries.
const MAX_KEPT_ENCODING: usize = 64 << 10;

/// The agent outcomes an attempt's load found ([`crate::store::journal::JournalSnapshot`]).
pub(crate) struct LoadedAgents {
    /// The keys, and the outcomes that fit the load budget.
    pub entries: LoadedEntries,
    /// Whether `entries` lists every journaled key (then a key neither there nor journaled
    /// by this attempt needs no store read).
    pub listed: bool,
}

/// What a new attempt starts from.
pub(crate) struct AttemptSetup {
    pub run_id: String,
    pub limits: Limits,
    pub sandbox: SandboxLimits,
    pub journal: Arc<dyn Journal>,
    pub backend: Arc<dyn AgentBackend>,
    pub prior: crate::model::envelope::Accounting,
    pub next_seq: u64,
    pub events: Option<mpsc::UnboundedSender<ProgressEntry>>,
    pub updates: broadcast::Sender<RunUpdated>,
    pub record_writes: u64,
    pub stop: StopSignal,
    /// Bytes pending agent calls hold over every run of the host.
    pub host_pending_bytes: Arc<std::sync::atomic::AtomicU64>,
    /// The attempt's span ([`crate::trace::attempt`]; `Span::none()` when traces are off).
    pub span: tracing::Span,
    /// The factory's default agent soft limits (`meta.agentLimits`).
    pub agent_limits: crate::model::limits::AgentLimits,
    /// The checkpoints the run has passed, each with its answer (JSON text; `None`: resumed
    /// without one): what `ctx.pause(key)` returns for them.
    pub answers: std::collections::BTreeMap<String, Option<String>>,
}

/// What the journal view knows of an agent call's key ([`Attempt::cached_agent`]).
pub(crate) enum Memo {
    /// Journaled: its outcome.
    Hit(Option<String>),
    /// Never journaled.
    Absent,
    /// Not in the cache: ask the store.
    Unknown,
}

/// The state one attempt's capabilities share (see the module docs).
pub(crate) struct Attempt {
    pub(crate) run_id: String,
    pub(crate) limits: Limits,
    pub(crate) sandbox: SandboxLimits,
    pub(crate) journal: Arc<dyn Journal>,
    /// The checkpoints passed and their answers ([`AttemptSetup::answers`]).
    pub(crate) answers: std::collections::BTreeMap<String, Option<String>>,
    book: Mutex<Book>,
    stop: StopSignal,
    cause: Mutex<Option<StopCause>>,
    events: Option<mpsc::UnboundedSender<ProgressEntry>>,
    updates: broadcast::Sender<RunUpdated>,
    /// Record writes of the run so far: the revision is this plus the progress seq.
    record_writes: u64,
    prior_active: Duration,
    started: Instant,
    /// Whether the guest has asked if the attempt is stopping (`ctx.cancelled`,
    /// `ctx.stop-reason`): only such a guest gets the stop grace.
    watched: std::sync::atomic::AtomicBool,
    /// The attempt's span, and the current phase's under it (the parent of calls' spans).
    span: tracing::Span,
    phase_span: Mutex<Option<tracing::Span>>,
}

/// How the hooks reach an attempt's shared core in the run's state (the store data's host
/// part, which the engine builds): what the identity, stop and checkpoint hooks of `ctx`
/// and `agents.sleep` need.
pub(crate) trait AttemptView: Send + 'static {
    /// The attempt this store runs.
    fn attempt(&self) -> &Arc<Attempt>;
}

/// Milliseconds since the epoch, for progress entries.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Attempt {
    /// The shared core of an attempt, its cache filled from the journal's snapshot.
    pub(crate) fn new(
        setup: &AttemptSetup,
        cache: ValueCache,
        journal_bytes: u64,
        loaded_agents: LoadedAgents,
    ) -> Attempt {
        Attempt {
            run_id: setup.run_id.clone(),
            limits: setup.limits,
            sandbox: setup.sandbox.clone(),
            journal: setup.journal.clone(),
            answers: setup.answers.clone(),
            book: Mutex::new(Book {
                cache,
                journal_bytes,
                loaded_agents,
                added_agents: Fingerprints::default(),
                phase: None,
                next_seq: setup.next_seq,
                encoded: Vec::new(),
            }),
            stop: setup.stop.clone(),
            cause: Mutex::new(None),
            events: setup.events.clone(),
            updates: setup.updates.clone(),
            record_writes: setup.record_writes,
            prior_active: Duration::from_secs_f64(setup.prior.active_seconds),
            started: Instant::now(),
            watched: std::sync::atomic::AtomicBool::new(false),
            span: setup.span.clone(),
            phase_span: Mutex::new(None),
        }
    }

    /// The span calls of the attempt go under: the current phase's, else the attempt's.
    pub(crate) fn parent_span(&self) -> tracing::Span {
        if self.span.is_disabled() {
            return tracing::Span::none();
        }
        let phase = self.phase_span.lock().unwrap_or_else(|p| p.into_inner());
        phase.clone().unwrap_or_else(|| self.span.clone())
    }

    /// A new phase: its span replaces (ends) the previous phase's.
    pub(crate) fn enter_phase(&self, title: &str) {
        if self.span.is_disabled() {
            return;
        }
        let span = crate::trace::phase(&self.span, title);
        *self.phase_span.lock().unwrap_or_else(|p| p.into_inner()) = Some(span);
    }

    /// End the current phase's span (the attempt is over).
    pub(crate) fn end_phase(&self) {
        self.phase_span.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    fn book(&self) -> MutexGuard<'_, Book> {
        // A panic while holding the lock cannot leave the book half-updated in a way that
        // matters more than losing the run, so recover the guard rather than propagate.
        self.book.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Active time over every attempt, this one so far included.
    pub(crate) fn active_time(&self) -> Duration {
        self.prior_active + self.started.elapsed()
    }

    // ---- the stop signal -------------------------------------------------------------

    /// Stop the attempt: the first cause wins. Returns the abort to hand the guest.
    pub(crate) fn abort(&self, abort: Abort) -> Abort {
        let failure = match &abort {
            Abort::Cancelled | Abort::Halted | Abort::Paused(_) => None,
            Abort::Limit(kind) => Some(Failure::limit(kind.name(), limit_message(*kind, &self.limits))),
            Abort::Storage(e) => Some(Failure::new(FailureType::Storage, None, e.to_string())),
            Abort::InvalidCall(m) => Some(Failure::new(FailureType::InvalidCall, None, m.clone())),
            Abort::SandboxLimit { kind, message } => Some(Failure::sandbox_limit(*kind, message.clone())),
            Abort::Backend { kind, message, .. } => {
                Some(Failure::new(FailureType::Backend, Some(kind.as_str()), message.clone()))
            }
            Abort::Unpriced(message) => Some(Failure::limit(LimitKind::MaxAiCredits.name(), message.clone())),
        };
        let cause = match (failure, &abort) {
            (None, Abort::Halted) => StopCause::Halted,
            (None, Abort::Paused(pause)) => StopCause::Paused(pause.clone()),
            (None, _) => StopCause::Cancelled,
            (Some(failure), _) => StopCause::Failed(failure, abort.clone()),
        };
        self.cause.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(cause);
        self.stop.cancel();
        abort
    }

    /// The abort a hook returns once the attempt is stopping, if it is.
    /// The guest asks whether the attempt is stopping: it watches the stop.
    pub(crate) fn watch(&self) {
        self.watched.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Has the guest ever asked whether the attempt is stopping?
    pub(crate) fn watched(&self) -> bool {
        self.watched.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn stopping(&self) -> Option<Abort> {
        if !self.stop.is_cancelled() {
            return None;
        }
        Some(match self.cause.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            Some(StopCause::Failed(_, abort)) => abort.clone(),
            Some(StopCause::Halted) => Abort::Halted,
            Some(StopCause::Paused(pause)) => Abort::Paused(pause.clone()),
            _ => Abort::Cancelled,
        })
    }

    /// Whether the attempt is stopping (`ctx.cancelled`).
    pub(crate) fn cancelled(&self) -> bool {
        self.stop.is_cancelled()
    }

    /// The signal that fires when the attempt stops.
    pub(crate) fn stop_signal(&self) -> &StopSignal {
        &self.stop
    }

    /// Why the attempt stopped, if it did.
    pub(crate) fn cause(&self) -> Option<StopCause> {
        self.cause.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Refuse a guest value of `len` bytes over `limit`: the attempt stops with a
    /// `sandbox_limit` failure named `kind`. The value itself is never copied into the message.
    pub(crate) fn cap(&self, kind: SandboxLimitKind, what: &str, len: usize, limit: usize) -> Result<(), Abort> {
        if len <= limit {
            return Ok(());
        }
        let message = format!("{what} is {len} bytes, over the {limit} byte limit ({kind})");
        Err(self.abort(Abort::SandboxLimit { kind, message }))
    }

    // ---- the journal view ------------------------------------------------------------

    /// Charge `cost` journal bytes (book locked by the caller) and return the new total, which
    /// the put records with its entry: `Err` with the abort when they would pass
    /// `maxJournalBytes` (then nothing is charged). `essential` entries (an attempt's start
    /// and end) are always charged and written.
    fn charge(&self, book: &mut Book, cost: u64, essential: bool) -> Result<u64, Abort> {
        let total = book.journal_bytes.saturating_add(cost);
        if total > self.sandbox.max_journal_bytes && !essential {
            let message = format!(
                "the run has journaled {} bytes; {cost} more would pass the {} byte journal budget (maxJournalBytes)",
                book.journal_bytes, self.sandbox.max_journal_bytes
            );
            return Err(Abort::SandboxLimit { kind: SandboxLimitKind::MaxJournalBytes, message });
        }
        book.journal_bytes = total;
        crate::metrics::metrics().journaled(cost);
        Ok(total)
    }

    /// A step value in the cache.
    pub(crate) fn cached_step(&self, key: &str) -> Option<String> {
        self.book().cache.step(key).cloned()
    }

    /// A step value from the store (cached once read). Asked from a synchronous hook, so
    /// the journal's read is waited for here ([`wait_for_read`]).
    pub(crate) fn read_step(&self, key: &str) -> Result<Option<String>, JournalError> {
        let value = wait_for_read(self.journal.get_step(&self.run_id, key))?;
        if let Some(value) = &value {
            self.book().cache.put_step(key.to_string(), value.clone());
        }
        Ok(value)
    }

    /// Charge and journal a step value, and cache it. The abort is not yet raised.
    pub(crate) fn write_step(&self, key: String, value: String) -> Result<(), Abort> {
        let cost = self.journal.footprint(self.run_id.len() + key.len(), value.len());
        let mut book = self.book();
        let total = self.charge(&mut book, cost, false)?;
        self.journal.put_step(&self.run_id, &key, &value, total).map_err(Abort::Storage)?;
        book.cache.put_step(key, value);
        Ok(())
    }

    /// An agent outcome as the journal view knows it, without a wait: from what the load
    /// found or the cache, or known never journaled (the journal listed the run's agent keys),
    /// else unknown.
    pub(crate) fn cached_agent(&self, memo_key: &AgentKey) -> Memo {
        let key = memo_key.as_str();
        let mut guard = self.book();
        let book = &mut *guard;
        // Hashed only if a lookup needs it: a fresh run loaded nothing, and a replay in
        // journal order finds each key as the entry after the last one found.
        let mut hashed = None;
        if let Loaded::Value(bytes) = book.loaded_agents.entries.find(key, &mut hashed) {
            // Bytes that do not decode are read again from the store, which says why.
            return match decode_outcome(bytes) {
                Ok(outcome) => Memo::Hit(outcome.map(str::to_string)),
                Err(_) => Memo::Unknown,
            };
        }
        if let Some(outcome) = book.cache.agent(memo_key) {
            return Memo::Hit(outcome.clone());
        }
        if book.loaded_agents.listed {
            let fingerprint = hashed.unwrap_or_else(|| book.loaded_agents.entries.fingerprint(key));
            if !book.loaded_agents.entries.knows(fingerprint) && !book.added_agents.contains(&fingerprint) {
                return Memo::Absent;
            }
        }
        Memo::Unknown
    }

    /// An agent outcome from the store (for a key [`Attempt::cached_agent`] did not know).
    pub(crate) async fn read_agent(&self, key: &str) -> Result<Option<Option<String>>, JournalError> {
        self.journal.get_agent(&self.run_id, key).await
    }

    // ---- the progress journal --------------------------------------------------------

    /// Record a progress event (journaled, so `progress` pages and revisions survive a
    /// crash), stream it to the subscriber, and announce the new revision. The journal keeps
    /// a reference to the current phase, not its text. An entry past the journal budget is
    /// not recorded and stops the attempt (attempt start and end are always recorded).
    pub(crate) fn emit(&self, event: ProgressEvent) {
        let essential = matches!(event, ProgressEvent::AttemptStarted { .. } | ProgressEvent::AttemptEnded { .. });
        let written = {
            let mut book = self.book();
            self.prepare_progress(&mut book, event, essential).and_then(|(stored, bytes, total)| {
                self.journal.put_progress(&self.run_id, stored.seq, bytes, total).map_err(Abort::Storage)?;
                let seq = stored.seq;
                Ok((seq, self.progressed(&mut book, stored)))
            })
        };
        match written {
            Ok((seq, entry)) => self.publish(seq, entry),
            Err(abort) => {
                self.abort(abort);
            }
        }
    }

    /// Number, encode and charge a progress entry (book locked by the caller): the entry,
    /// its stored form and the journal total with it counted. Not yet put: once it is,
    /// [`Attempt::progressed`] makes it the latest.
    fn prepare_progress(
        &self,
        book: &mut Book,
        event: ProgressEvent,
        essential: bool,
    ) -> Result<(JournaledProgress, Vec<u8>, u64), Abort> {
        let seq = book.next_seq + 1;
        let phase_seq = match &event {
            ProgressEvent::Phase { .. } => Some(seq),
            _ => book.phase.as_ref().map(|(at, _)| *at),
        };
        let stored = JournaledProgress { seq, at_ms: now_ms(), phase_seq, phase: None, event };
        book.encoded.clear();
        serde_json::to_writer(&mut book.encoded, &stored).map_err(|e| Abort::Storage(JournalError::new(e)))?;
        let bytes = book.encoded.clone();
        if book.encoded.capacity() > MAX_KEPT_ENCODING {
            // One large entry does not keep its buffer for the rest of the attempt.
            book.encoded = Vec::new();
        }
        let cost = self.journal.footprint(self.run_id.len() + 8, bytes.len());
        let total = self.charge(book, cost, essential)?;
        Ok((stored, bytes, total))
    }

    /// A prepared entry was put: it is the latest (and a phase entry sets the phase). The
    /// entry as the subscriber gets it, when there is one (none is made for nobody).
    fn progressed(&self, book: &mut Book, stored: JournaledProgress) -> Option<ProgressEntry> {
        if let ProgressEvent::Phase { title } = &stored.event {
            book.phase = Some((stored.seq, title.clone()));
        }
        book.next_seq = stored.seq;
        self.events.as_ref()?;
        let phase = book.phase.as_ref().map(|(_, title)| title.clone());
        Some(ProgressEntry { seq: stored.seq, at_ms: stored.at_ms, phase, event: stored.event })
    }

    /// Announce a recorded entry: the new revision (to whoever listens), and the entry to
    /// the subscriber.
    fn publish(&self, seq: u64, entry: Option<ProgressEntry>) {
        if self.updates.receiver_count() > 0 {
            let _ = self.updates.send(RunUpdated { run_id: self.run_id.clone(), revision: self.record_writes + seq });
        }
        if let (Some(tx), Some(entry)) = (&self.events, entry) {
            let _ = tx.send(entry);
        }
    }

    /// An answered agent call: its `finished` progress entry (as [`Attempt::emit`] records
    /// one), the attempt's `accounting` and its outcome (then cached), charged in that order
    /// and handed to the journal as one write. An entry past the journal budget stops the
    /// attempt as `emit` does; the outcome's own abort (the budget, the store) is returned,
    /// not yet raised.
    pub(crate) fn finish_agent(
        &self,
        memo_key: &AgentKey,
        reply: &Option<String>,
        finished: ProgressEvent,
        accounting: &Accounting,
    ) -> Result<(), Abort> {
        let key = memo_key.as_str();
        let agent_cost =
            self.journal.footprint(self.run_id.len() + key.len(), 1 + reply.as_ref().map_or(0, String::len));
        let (entry, progress_refused, agent_charged) = {
            let mut book = self.book();
            let (stored, progress, progress_refused) = match self.prepare_progress(&mut book, finished, false) {
                Ok((stored, bytes, total)) => {
                    let progress = Some((stored.seq, bytes, total));
                    (Some(stored), progress, None)
                }
                Err(abort) => (None, None, Some(abort)),
            };
            let agent_charged = self.charge(&mut book, agent_cost, false);
            let agent = agent_charged.as_ref().ok().map(|total| (key, reply.as_deref(), *total));
            if let Err(e) = self.journal.put_agent_outcome(&self.run_id, AgentOutcome { progress, accounting, agent }) {
                drop(book);
                if let Some(abort) = progress_refused {
                    self.abort(abort);
                }
                return Err(Abort::Storage(e));
            }
            let entry = stored.map(|stored| (stored.seq, self.progressed(&mut book, stored)));
            if agent_charged.is_ok() {
                if book.loaded_agents.listed {
                    let fingerprint = book.loaded_agents.entries.fingerprint(key);
                    book.added_agents.insert(fingerprint);
                }
                book.cache.put_agent(*memo_key, reply.clone());
            }
            (entry, progress_refused, agent_charged)
        };
        if let Some((seq, entry)) = entry {
            self.publish(seq, entry);
        }
        if let Some(abort) = progress_refused {
            self.abort(abort);
        }
        agent_charged.map(|_| ())
    }

    /// Tell live subscribers (not the journal) about an event, made only when someone
    /// listens; the entry carries the latest durable seq and phase.
    pub(crate) fn announce(&self, event: impl FnOnce() -> ProgressEvent) {
        if let Some(tx) = &self.events {
            let book = self.book();
            let entry = ProgressEntry {
                seq: book.next_seq,
                at_ms: now_ms(),
                phase: book.phase.as_ref().map(|(_, title)| title.clone()),
                event: event(),
            };
            drop(book);
            let _ = tx.send(entry);
        }
    }

    /// Whether live subscribers listen ([`Attempt::announce`] tells them).
    pub(crate) fn listened(&self) -> bool {
        self.events.as_ref().is_some_and(|tx| !tx.is_closed())
    }

    /// The latest progress seq of this run.
    pub(crate) fn last_seq(&self) -> u64 {
        self.book().next_seq
    }
}

/// What a limit's failure says, with how to go on.
fn limit_message(kind: LimitKind, limits: &Limits) -> String {
    match kind {
        LimitKind::MaxTotalSubagents => format!(
            "maxTotalSubagents ({}) reached: resume with a higher --max-total-subagents to continue",
            limits.max_total_subagents.unwrap_or(0)
        ),
        LimitKind::TimeoutSeconds => format!(
            "timeoutSeconds ({}) of active time reached: resume with a higher --timeout-seconds to continue",
            limits.timeout_seconds.unwrap_or(0.0)
        ),
        LimitKind::MaxAiCredits => format!(
            "maxAiCredits ({}) reached or usage could not be accounted: resume with a higher --max-ai-credits to continue",
            limits.max_ai_credits.unwrap_or(0.0)
        ),
    }
}

/// A journal read a synchronous hook (`ctx.step-get`) could not wait for: the read was not
/// ready at once, and this thread cannot block on it (no multi-threaded tokio runtime).
#[derive(Debug, thiserror::Error)]
#[error("a journal read that is not ready at once needs a multi-threaded tokio runtime to wait on")]
pub struct CannotWaitForRead;

/// The answer of a journal read asked from a synchronous hook. A read that is ready at once
/// (the redb store's always are) is taken as it is; one that is not blocks this worker
/// thread until it is ([`tokio::task::block_in_place`]: the runtime's other work moves to
/// other threads), which needs a multi-threaded runtime: on any other, [`CannotWaitForRead`].
fn wait_for_read<T>(mut read: BoxFuture<'_, Result<T, JournalError>>) -> Result<T, JournalError> {
    if let Some(answer) = (&mut read).now_or_never() {
        return answer;
    }
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(|| handle.block_on(read))
        }
        _ => Err(JournalError::new(CannotWaitForRead)),
    }
}
