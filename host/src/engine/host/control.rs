//! Stopping runs: cancel, pause and remove on behalf of a scope (here, through a shared store,
//! parked for a quota or waiting in the queue), and the answers to requests another process
//! sends for runs executing here (cancel, pause, a stale attempt, shutdown).

use super::Host;
use crate::engine::run::{self};
use crate::error::Error;
use crate::model::envelope::{Failure, RunEnvelope, RunStatus};
use crate::model::scope::Scope;
use crate::store::RunRecord;
use std::time::Duration;

impl Host {
    /// Cancel a run and return its terminal envelope. A run executing here stops promptly
    /// (its store is dropped, its backend calls abandoned) and keeps its journal; a run that
    /// another process sharing the store executes is asked to stop through the store
    /// ([`Store::request_cancel`]) and waited for; a run that is not executing is returned as
    /// it is.
    pub async fn cancel(&self, scope: impl Into<Scope>, run_id: &str) -> Result<RunEnvelope, Error> {
        let scope = scope.into();
        self.record(&scope, run_id).await?;
        if self.cancel_parked(run_id).await? {
            return self.envelope(scope, run_id).await;
        }
        if !self.cancel_here(run_id) {
            // Executed by another process sharing the store (or not running): ask it.
            self.store.request_cancel(run_id).await?;
            if let Some(queue) = self.store.run_queue() {
                // Still waiting in a shared store's queue, nobody executes it: it ends here.
                // A worker may hold it for a moment (claiming it, or putting it back): tried
                // again each second until it ends one way or the other.
                loop {
                    if queue.dequeue(run_id.to_string()).await? {
                        self.cancel_queued(run_id).await?;
                        break;
                    }
                    if let Ok(ended) =
                        tokio::time::timeout(Duration::from_secs(1), self.wait(scope.clone(), run_id)).await
                    {
                        return ended;
                    }
                }
            }
        }
        self.wait(scope, run_id).await
    }

    /// Pause a run and return its envelope once the attempt has stopped (`paused`, resumable
    /// under the same id by a caller; its journaled steps and agent calls kept). The attempt
    /// stops cooperatively, as a cancel stops it, with a pause as its reason (a JS body's
    /// `ctx.signal.reason` says so). A run that another process sharing the store executes is
    /// asked to pause through the store ([`Store::request_pause`]) and waited for. A run with
    /// no attempt executing is refused with [`Error::NotRunning`].
    pub async fn pause(&self, scope: impl Into<Scope>, run_id: &str) -> Result<RunEnvelope, Error> {
        let scope = scope.into();
        let record = self.record(&scope, run_id).await?;
        // (A run waiting in a shared store's queue has no attempt to pause: refused below.)
        let elsewhere = record.envelope.status == RunStatus::Running && !self.runs_here(run_id) && self.store.shared();
        if elsewhere && self.store.request_pause(run_id).await? {
            return self.wait(scope, run_id).await;
        }
        // An attempt claimed here builds its capabilities before its guest runs: waited for
        // (briefly), so a pause right after a start pauses it rather than being refused.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let running = self.active().get(run_id).map(|a| a.shared.clone());
            match running {
                Some(Some(shared)) => {
                    shared.attempt.abort(run::Abort::Paused(run::Pause::Caller));
                    break;
                }
                Some(None) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                _ => {
                    let status = record.envelope.status.as_str();
                    return Err(Error::NotRunning(format!("run `{run_id}` is {status}: it has no attempt executing")));
                }
            }
        }
        self.wait(scope, run_id).await
    }

    /// Delete a run `scope` sees and its journal from the store (`factory rm`), so a user can
    /// always repair a session, and the blobs (its component, script, modules) no other run
    /// or registration refers to. A run with an attempt executing (here, or by its record
    /// elsewhere on a shared store) is refused with [`Error::AlreadyActive`]: cancel it
    /// first. Held as this host's active run meanwhile, so no resume starts under it.
    pub async fn remove(&self, scope: impl Into<Scope>, run_id: &str) -> Result<(), Error> {
        let blobs = self.remove_run(scope.into(), run_id).await?;
        self.give_space_back(&blobs).await;
        Ok(())
    }

    /// Delete a run as [`Host::remove`] does, leaving its blobs and the space: the blobs it
    /// referred to (to hand to [`Host::give_space_back`] once the runs to delete are gone).
    pub(crate) async fn remove_run(&self, scope: Scope, run_id: &str) -> Result<Vec<String>, Error> {
        let record = match self.store.run(run_id).await {
            Ok(Some(record)) if scope.sees(&record.session) => Some(record),
            // A record that cannot be read names no session: only the owner, who sees every
            // session's runs, may remove it (its blobs stay: it names none that can be read).
            Err(crate::store::StoreError::Corrupt(_)) if scope == Scope::Owner => None,
            Ok(_) => return Err(Error::NotFound(run_id.to_string())),
            Err(e) => return Err(e.into()),
        };
        let _claim = self.claim(run_id)?;
        // Read before the run (and its module record) is gone.
        let blobs = match &record {
            Some(record) => crate::store::blobs::of_run(&*self.store, record).await.unwrap_or_else(|e| {
                tracing::warn!(event = "blobs_unread", run = %run_id, error = %e, "the run's blobs stay");
                Vec::new()
            }),
            None => Vec::new(),
        };
        match self.store.remove_run(run_id).await? {
            crate::store::Removed::Removed => {
                self.parking.disarm(run_id);
                tracing::info!(event = "run_removed", run = %run_id, "run removed");
                Ok(blobs)
            }
            crate::store::Removed::NotFound => Err(Error::NotFound(run_id.to_string())),
            crate::store::Removed::Active => Err(Error::AlreadyActive(run_id.to_string())),
        }
    }

    /// After runs were deleted: delete those of the blobs they referred to (`blobs`) that
    /// nothing refers to any more, then give the store's free space back when worthwhile.
    /// The runs are gone whether or not this succeeds (a failure is logged).
    pub(crate) async fn give_space_back(&self, blobs: &[String]) {
        match self.store.collect_blobs(blobs).await {
            Ok(0) => {}
            Ok(collected) => tracing::info!(event = "blobs_collected", blobs = collected, "unreferenced blobs deleted"),
            Err(e) => tracing::warn!(event = "blobs_collect_failed", error = %e, "unreferenced blobs were not deleted"),
        }
        if let Err(e) = self.store.reclaim().await {
            tracing::warn!(event = "store_reclaim_failed", error = %e, "the store's free space was not given back");
        }
    }

    /// Cancel run `run_id` if it is parked for its backend's quota (not executing): it ends
    /// `cancelled` and its timer is disarmed. On a shared store the run is first claimed
    /// there ([`Store::claim_resume`]), so no worker's timer resumes it meanwhile. `false`
    /// when it is not parked (or executes, here or elsewhere): the caller cancels it as usual.
    pub(super) async fn cancel_parked(&self, run_id: &str) -> Result<bool, Error> {
        let Ok(claim) = self.claim(run_id) else { return Ok(false) };
        let parked = |record: &Option<RunRecord>| record.as_ref().is_some_and(crate::engine::parking::is_parked);
        if !parked(&self.store.run(run_id).await?) {
            return Ok(false);
        }
        let shared = self.store.shared();
        if shared && !self.store.claim_resume(run_id).await? {
            return Ok(false);
        }
        // Read again under the claims: a timer may have resumed it meanwhile.
        let cancelled = async {
            let record = self.store.run(run_id).await?;
            if !parked(&record) {
                return Ok::<_, Error>(None);
            }
            let Some(mut record) = record else { return Ok(None) };
            record.interrupted = None;
            let envelope = &mut record.envelope;
            envelope.resume_at = None;
            envelope.status = RunStatus::Cancelled;
            let failure = Failure::new(
                crate::model::envelope::FailureType::Cancelled,
                None,
                "the run was cancelled while it was parked for its backend's quota",
            );
            envelope.error = Some(failure.message.clone());
            envelope.failure = Some(failure);
            envelope.updated_at = crate::store::records_timestamp();
            self.store.put_run(&mut record, false).await?;
            Ok(Some(record))
        }
        .await;
        if shared {
            if let Err(e) = self.store.release_claim(run_id).await {
                tracing::warn!(run = %run_id, error = %e, "cannot release the claim of a cancelled parked run");
            }
        }
        let Some(record) = cancelled? else { return Ok(false) };
        self.parking.disarm(run_id);
        drop(claim);
        tracing::info!(event = "parked_cancelled", run = %run_id, "a run parked for its quota was cancelled");
        self.announce_end(&record).await;
        Ok(true)
    }

    /// End a run taken out of the queue before any attempt: `cancelled`, nothing ran.
    pub(super) async fn cancel_queued(&self, run_id: &str) -> Result<(), Error> {
        let Some(mut record) = self.store.run(run_id).await? else { return Err(Error::NotFound(run_id.to_string())) };
        let envelope = &mut record.envelope;
        envelope.status = RunStatus::Cancelled;
        let failure = Failure::new(
            crate::model::envelope::FailureType::Cancelled,
            None,
            "the run was cancelled while it waited in the queue; nothing ran",
        );
        envelope.error = Some(failure.message.clone());
        envelope.failure = Some(failure);
        envelope.updated_at = crate::store::records_timestamp();
        self.store.put_run(&mut record, false).await?;
        self.announce_end(&record).await;
        Ok(())
    }

    /// Cancel run `run_id` if it executes in this process; whether it does.
    pub fn cancel_here(&self, run_id: &str) -> bool {
        let running = self.active().get(run_id).map(|a| (a.stop.clone(), a.shared.clone()));
        match running {
            Some((_, Some(shared))) => {
                shared.attempt.abort(run::Abort::Cancelled);
                true
            }
            Some((stop, None)) => {
                stop.cancel();
                true
            }
            None => false,
        }
    }

    /// Pause run `run_id` if it executes in this process (a pause another process asked for
    /// through a shared store); whether it does.
    pub fn pause_here(&self, run_id: &str) -> bool {
        let shared = self.active().get(run_id).and_then(|a| a.shared.clone());
        match shared {
            Some(shared) => {
                shared.attempt.abort(run::Abort::Paused(run::Pause::Caller));
                true
            }
            None => false,
        }
    }

    /// Whether an attempt of `run_id` executes in this process.
    pub(crate) fn runs_here(&self, run_id: &str) -> bool {
        self.active().contains_key(run_id)
    }

    /// Resolves once no attempt of `run_id` executes in this process.
    pub(crate) async fn attempt_gone(&self, run_id: &str) {
        let mut updates = self.subscribe();
        while self.active().contains_key(run_id) {
            tokio::select! {
                _ = updates.recv() => {}
                _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            }
        }
    }

    /// Stop an attempt of `run_id` still executing in this process although the run went
    /// back to a shared store's queue (it began under a generation this worker lost, so it
    /// writes nothing more and starts no call), and wait until it has left (at most 30 s):
    /// the worker that claimed the run again can then resume it.
    pub(crate) async fn end_stale_attempt(&self, run_id: &str) {
        let running = self.active().get(run_id).map(|a| (a.stop.clone(), a.shared.clone()));
        match running {
            Some((_, Some(shared))) => {
                shared.attempt.abort(run::Abort::Halted);
            }
            Some((stop, None)) => stop.cancel(),
            None => return,
        }
        tracing::info!(run = %run_id, "stopping a stale attempt of a requeued run");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while self.active().contains_key(run_id) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stop every run executing in this process because the host is shutting down: each
    /// ends as `halted` (resumable), not `cancelled`.
    pub fn shutdown(&self) {
        // No parked run is resumed from now on: the next service's start arms it again.
        self.parking.close();
        for run in self.active().values() {
            match &run.shared {
                Some(shared) => {
                    shared.attempt.abort(run::Abort::Halted);
                }
                None => run.stop.cancel(),
            }
        }
    }

    /// Cancel every run executing in this process (for signal handlers).
    pub fn cancel_all(&self) {
        for run in self.active().values() {
            run.stop.cancel();
        }
    }

    /// Ids of the runs executing in this process.
    pub fn active_runs(&self) -> Vec<String> {
        self.active().keys().cloned().collect()
    }
}
