//! Automatic recovery of interrupted runs: what a long-lived service (`factory serve`) does
//! when it starts. A run whose attempt was stopped by its process — the process holding the
//! store died (found `running` at the next open, [`Interruption::Crash`]) or the host shut
//! down during it ([`Interruption::Shutdown`]) — is resumed as it was: its last component or
//! script, its recorded backend and model, its grants and limits, in its own session, with
//! no new consent (it was consented when it started or was last resumed). Runs that ended
//! for a reason of their own (a limit, a cancel, a guest error, a decline) are never touched.
//!
//! Each run gets at most `max` automatic recoveries, counted in its record
//! ([`RunRecord::recoveries`]: automatic recoveries since a caller last started or resumed
//! it). Past the bound, or when its resume cannot start, the run stays `halted` with a
//! failure that says so and how to resume it by hand, and later starts leave it alone.
//! Journaled agent calls and steps replay for free, as on every resume.
//!
//! On a store several workers share, each run is recovered by one of them: a worker first
//! claims the run through the store ([`Store::claim_interrupted`], an atomic update in the
//! database), and a run another live worker claimed first is left to it
//! ([`RecoveryOutcome::TakenElsewhere`]).
//!
//! A run *parked* because its backend's quota is spent ([`Interruption::Quota`]: `halted`,
//! failure `backend`/`quota`, `resumeAt` in its envelope) is resumed the same way, by itself,
//! once `resumeAt` has passed: [`resume_parked_when_due`] is the service's timer, armed when
//! an attempt parks its run and, at a service's start, for every parked run in the store
//! ([`arm_parked`]: at once when the time has passed). Such a resume is no recovery: it is not
//! counted against `--max-recoveries`. On a shared store each worker arms its own timer and
//! the claim lets exactly one of them resume the run; a worker whose timer fires for a run
//! that was resumed, cancelled or parked again meanwhile reads it again and leaves it (or
//! waits for its new `resumeAt`).
//!
//! [`Interruption::Quota`]: crate::store::Interruption::Quota

use crate::engine::host::{Host, ResumeOptions, ResumedBy};
pub use crate::engine::parking::{is_interrupted, is_parked, parked_until};
pub(crate) use crate::engine::parking::{resume_command, PARKED_RECHECK};
use crate::error::Error;
use crate::store::{RunRecord, Store};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Automatic recoveries a run gets by default.
pub const DEFAULT_MAX_RECOVERIES: u32 = 3;

/// What recovery did with one interrupted run.
#[derive(Debug)]
pub struct Recovery {
    /// The run.
    pub run_id: String,
    /// Its factory's name.
    pub factory: String,
    /// Its owner session.
    pub session: String,
    /// What happened to it.
    pub outcome: RecoveryOutcome,
}

/// How one interrupted run was recovered, or why not.
#[derive(Debug)]
pub enum RecoveryOutcome {
    /// A new attempt started (in the background): automatic recovery `attempt` of `max`.
    Resumed { attempt: u32, max: u32 },
    /// It was recovered `recoveries` times already, the bound: left `halted`.
    Exhausted { recoveries: u32, max: u32 },
    /// Its resume could not start: left `halted`.
    Failed { error: Error },
    /// Another worker sharing the store claimed it first (or it is no longer `halted`): left
    /// to that worker.
    TakenElsewhere,
    /// Parked for its backend's quota: resumed by itself at `resume_at` (not a recovery).
    Parked { resume_at: SystemTime },
}

impl Recovery {
    /// The command that resumes the run by hand.
    pub fn resume_command(&self) -> String {
        resume_command(&self.run_id, &self.session)
    }
}

impl std::fmt::Display for Recovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let run = format!("run {} (factory {}, session {})", self.run_id, self.factory, self.session);
        match &self.outcome {
            RecoveryOutcome::Resumed { attempt, max } => write!(f, "recovering {run}: automatic recovery {attempt}/{max}"),
            RecoveryOutcome::Exhausted { recoveries, max } => write!(
                f,
                "not recovering {run}: it was recovered automatically {recoveries} time{} already (--max-recoveries {max}); \
                 resume it with: {}",
                plural(*recoveries),
                self.resume_command()
            ),
            RecoveryOutcome::Failed { error } => {
                write!(f, "cannot recover {run}: {error}; resume it with: {}", self.resume_command())
            }
            RecoveryOutcome::TakenElsewhere => write!(f, "not recovering {run}: another worker of the store recovers it"),
            RecoveryOutcome::Parked { resume_at } => write!(
                f,
                "{run} is parked: its backend's quota is spent; it resumes by itself at {}",
                humantime::format_rfc3339_seconds(*resume_at)
            ),
        }
    }
}

/// Arm the timer of every run parked in `host`'s store until a known reset (at a service's
/// start, after a crash or a stop): each is resumed at its `resumeAt`, at once when it has
/// passed. Returns them, one [`Recovery`] ([`RecoveryOutcome::Parked`]) each.
pub async fn arm_parked(host: &Arc<Host>) -> Result<Vec<Recovery>, Error> {
    let listed = host.store().listed_runs().await?;
    let mut parked = Vec::new();
    for record in listed.into_iter().map(|l| l.record) {
        let Some(at) = parked_until(&record) else { continue };
        host.parking().arm(&record.envelope.run_id, at);
        tracing::info!(event = "parked", run = %record.envelope.run_id, resume_at = %humantime::format_rfc3339_seconds(at), "a run parked for its backend's quota resumes at its reset");
        parked.push(Recovery {
            run_id: record.envelope.run_id.clone(),
            factory: record.envelope.factory.clone(),
            session: record.session.clone(),
            outcome: RecoveryOutcome::Parked { resume_at: at },
        });
    }
    Ok(parked)
}

/// The timer of parked runs, for as long as the service runs: each run [`Parking`] holds is
/// resumed once its time has come ([`resume_parked`]).
pub async fn resume_parked_when_due(host: Arc<Host>) {
    loop {
        let now = SystemTime::now();
        let (ready, next) = host.parking().take_due(now);
        for run_id in ready {
            let host = host.clone();
            tokio::spawn(async move { resume_parked(&host, &run_id).await });
        }
        let sleep =
            next.map_or(PARKED_RECHECK, |at| at.duration_since(now).unwrap_or(Duration::ZERO).min(PARKED_RECHECK));
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            _ = host.parking().changed.notified() => {}
        }
    }
}

/// Resume run `run_id`, parked for its quota, if it still is and its time has come: claimed
/// through the store first (on a shared store, one worker resumes it), read again under the
/// claim, then resumed as it was (its backend, grants and limits, its session, no new
/// consent). A run parked again with a later time is armed again; a run resumed, cancelled
/// or removed meanwhile is left. A resume that cannot start leaves the run `halted` with why
/// and how to resume it by hand.
pub(crate) async fn resume_parked(host: &Arc<Host>, run_id: &str) {
    if host.parking().closed() {
        return;
    }
    let store: &dyn Store = &**host.store();
    let due = |record: &RunRecord| parked_until(record).map(|at| (at, at <= SystemTime::now()));
    let record = match store.run(run_id).await {
        Ok(Some(record)) => record,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(run = %run_id, error = %e, "cannot read a parked run; trying again later");
            host.parking().arm(run_id, SystemTime::now() + PARKED_RECHECK);
            return;
        }
    };
    match due(&record) {
        None => return,
        Some((at, false)) => return host.parking().arm(run_id, at),
        Some((_, true)) if host.runs_here(run_id) => return,
        Some((_, true)) => {}
    }
    match store.claim_interrupted(run_id).await {
        Ok(true) => {}
        Ok(false) => return,
        Err(e) => {
            tracing::warn!(run = %run_id, error = %e, "cannot claim a parked run; trying again later");
            host.parking().arm(run_id, SystemTime::now() + PARKED_RECHECK);
            return;
        }
    }
    // Read again under the claim: another worker may have resumed it (and it parked again).
    let record = match store.run(run_id).await {
        Ok(Some(record)) => record,
        _ => return release(host, run_id).await,
    };
    match due(&record) {
        Some((_, true)) => {}
        later => {
            release(host, run_id).await;
            if let Some((at, _)) = later {
                host.parking().arm(run_id, at);
            }
            return;
        }
    }
    if host.parking().closed() {
        return release(host, run_id).await;
    }
    let by_hand = resume_command(run_id, &record.session);
    tracing::info!(event = "parked_resume", run = %run_id, factory = %record.envelope.factory, session = %record.session, "resuming a run parked for its backend's quota");
    if let Err(error) = start_resume(host, run_id, &record.session, ResumedBy::Parked).await {
        tracing::warn!(run = %run_id, error = %error, "a parked run could not be resumed");
        let message =
            format!("the quota reset but the run could not be resumed ({error}); resume it by hand: {by_hand}");
        if let Err(e) = host.leave_halted(run_id, message).await {
            tracing::warn!(run = %run_id, error = %e, "cannot record why the parked run was not resumed");
        }
        release(host, run_id).await;
    }
}

/// Start a new attempt of `run_id` (claimed) in the background, on behalf of `by`: `Ok` once
/// it has started (or the resume ended at once without an error), else why not.
async fn start_resume(host: &Arc<Host>, run_id: &str, session: &str, by: ResumedBy) -> Result<(), Error> {
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let options = ResumeOptions {
        scope: Some(crate::model::scope::Scope::Session(session.to_string())),
        on_start: Some(Box::new(move |_| {
            let _ = started_tx.send(());
        })),
        ..ResumeOptions::default()
    };
    let task = {
        let (host, run_id) = (host.clone(), run_id.to_string());
        tokio::spawn(async move { host.resume_as(&run_id, options, by).await })
    };
    if started_rx.await.is_ok() {
        return Ok(());
    }
    // The resume ended before its attempt started: its error says why.
    match task.await {
        Ok(Err(error)) => Err(error),
        Ok(Ok(_)) => Ok(()),
        Err(join) => Err(Error::Task(join)),
    }
}

/// Recover every interrupted run of `host`'s store, at most `max` times each. Returns once
/// each recovered run's new attempt has started (it then runs in the background) or the
/// run was left `halted`; one [`Recovery`] per interrupted run, in creation order.
pub async fn recover_interrupted(host: &Arc<Host>, max: u32) -> Result<Vec<Recovery>, Error> {
    // Read as a listing reads them, without results: an interrupted run has none (only a
    // completed one does), and a start need not hold every completed run's result at once.
    let listed = host.store().listed_runs().await?;
    let interrupted: Vec<RunRecord> = listed.into_iter().map(|l| l.record).filter(is_interrupted).collect();
    let recovered =
        futures::future::join_all(interrupted.into_iter().map(|record| recover_one(host, record, max))).await;
    for r in &recovered {
        match &r.outcome {
            RecoveryOutcome::Resumed { attempt, max } => {
                tracing::info!(event = "recovery", run = %r.run_id, factory = %r.factory, session = %r.session, outcome = "resumed", attempt, max, "recovering an interrupted run")
            }
            RecoveryOutcome::Exhausted { recoveries, max } => {
                tracing::warn!(event = "recovery", run = %r.run_id, factory = %r.factory, session = %r.session, outcome = "exhausted", recoveries, max, "an interrupted run was left halted: automatic recoveries exhausted")
            }
            RecoveryOutcome::Failed { error } => {
                tracing::warn!(event = "recovery", run = %r.run_id, factory = %r.factory, session = %r.session, outcome = "failed", error = %error, "an interrupted run could not be recovered")
            }
            RecoveryOutcome::TakenElsewhere => {
                tracing::info!(event = "recovery", run = %r.run_id, factory = %r.factory, session = %r.session, outcome = "taken_elsewhere", "an interrupted run is recovered by another worker")
            }
            RecoveryOutcome::Parked { .. } => {}
        }
    }
    Ok(recovered)
}

pub(crate) async fn recover_one(host: &Arc<Host>, record: RunRecord, max: u32) -> Recovery {
    let run_id = record.envelope.run_id.clone();
    let mut recovery = Recovery {
        run_id: run_id.clone(),
        factory: record.envelope.factory.clone(),
        session: record.session.clone(),
        outcome: RecoveryOutcome::TakenElsewhere,
    };
    // Claimed first, so no other worker sharing the store resumes it too; read again under
    // the claim (the list may be older than another worker's recovery of it). A run no
    // longer interrupted goes on with the listed record: its resume refuses it, as before.
    let claimed = async {
        let store: &dyn Store = &**host.store();
        if !store.claim_interrupted(&run_id).await? {
            return Ok(None);
        }
        Ok::<_, crate::store::StoreError>(Some(store.run(&run_id).await?.filter(is_interrupted).unwrap_or(record)))
    };
    let record = match claimed.await {
        Ok(Some(record)) => record,
        Ok(None) => return recovery,
        Err(error) => {
            recovery.outcome = RecoveryOutcome::Failed { error: error.into() };
            return recovery;
        }
    };
    recovery.outcome = RecoveryOutcome::Resumed { attempt: record.recoveries.saturating_add(1), max };
    let by_hand = recovery.resume_command();
    if record.recoveries >= max {
        let n = record.recoveries;
        let message = format!(
            "the run was recovered automatically {n} time{} (at most {max}: `factory serve --max-recoveries`) and was \
             interrupted again; resume it by hand: {by_hand}",
            plural(n)
        );
        recovery.outcome = match host.leave_halted(&run_id, message).await {
            Ok(written) => {
                if !written {
                    release(host, &run_id).await;
                }
                RecoveryOutcome::Exhausted { recoveries: n, max }
            }
            Err(error) => {
                release(host, &run_id).await;
                RecoveryOutcome::Failed { error }
            }
        };
        return recovery;
    }
    let Err(error) = start_resume(host, &run_id, &record.session, ResumedBy::Recovery).await else { return recovery };
    let message = format!("automatic recovery could not resume the run ({error}); resume it by hand: {by_hand}");
    if let Err(e) = host.leave_halted(&run_id, message).await {
        tracing::warn!(run = %run_id, error = %e, "cannot record why the run was not recovered");
    }
    release(host, &run_id).await;
    recovery.outcome = RecoveryOutcome::Failed { error };
    recovery
}

/// Give up the store's claim of a run whose recovery did not start (on a shared store, a
/// claim left behind would read as a recovery under way).
async fn release(host: &Arc<Host>, run_id: &str) {
    if let Err(e) = host.store().release_claim(run_id).await {
        tracing::warn!(run = %run_id, error = %e, "cannot release the claim of a recovery that did not start");
    }
}

fn plural(n: u32) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}
