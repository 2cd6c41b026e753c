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

use crate::error::Error;
use crate::engine::host::{Host, ResumeOptions, ResumedBy};
use crate::store::{RunRecord, Store, DEFAULT_SESSION};
use crate::model::envelope::RunStatus;
use std::sync::Arc;

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
        }
    }
}

/// True when `record` is a run its process stopped: `halted` with an interruption mark.
pub fn is_interrupted(record: &RunRecord) -> bool {
    record.envelope.status == RunStatus::Halted && record.interrupted.is_some()
}

/// Recover every interrupted run of `host`'s store, at most `max` times each. Returns once
/// each recovered run's new attempt has started (it then runs in the background) or the
/// run was left `halted`; one [`Recovery`] per interrupted run, in creation order.
pub async fn recover_interrupted(host: &Arc<Host>, max: u32) -> Result<Vec<Recovery>, Error> {
    // Read as a listing reads them, without results: an interrupted run has none (only a
    // completed one does), and a start need not hold every completed run's result at once.
    let listed = host.store().listed_runs().await?;
    let interrupted: Vec<RunRecord> = listed.into_iter().map(|l| l.record).filter(is_interrupted).collect();
    let recovered = futures::future::join_all(interrupted.into_iter().map(|record| recover_one(host, record, max))).await;
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
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let options = ResumeOptions {
        scope: Some(crate::model::scope::Scope::Session(record.session.clone())),
        on_start: Some(Box::new(move |_| {
            let _ = started_tx.send(());
        })),
        ..ResumeOptions::default()
    };
    let task = {
        let (host, run_id) = (host.clone(), run_id.clone());
        tokio::spawn(async move { host.resume_as(&run_id, options, ResumedBy::Recovery).await })
    };
    if started_rx.await.is_ok() {
        return recovery;
    }
    // The resume ended before its attempt started: its error says why.
    let error = match task.await {
        Ok(Err(error)) => error,
        Ok(Ok(_)) => return recovery,
        Err(join) => Error::Task(join),
    };
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

/// `factory resume ID`, with `--session` when the run is not in the default session.
fn resume_command(run_id: &str, session: &str) -> String {
    if session == DEFAULT_SESSION {
        return format!("factory resume {run_id}");
    }
    let plain = session.chars().all(|c| c.is_ascii_alphanumeric() || "-_.:@/".contains(c));
    let quoted = if plain { session.to_string() } else { format!("'{}'", session.replace('\'', r"'\''")) };
    format!("factory resume {run_id} --session {quoted}")
}

#[cfg(test)]
mod tests {
    use super::resume_command;

    #[test]
    fn the_resume_command_names_a_session_other_than_the_default_quoted_for_a_shell() {
        assert_eq!(resume_command("r1", "default"), "factory resume r1");
        assert_eq!(resume_command("r1", "mcp:claude"), "factory resume r1 --session mcp:claude");
        assert_eq!(resume_command("r1", "it's mine"), r"factory resume r1 --session 'it'\''s mine'");
    }
}
