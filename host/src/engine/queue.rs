//! The worker side of a shared store's run queue
//! ([`RunQueue`](crate::store::queue::RunQueue)): the claim loop that takes queued runs while
//! the worker has room under its [`Caps`](crate::engine::caps::Caps) ([`claim_loop`]; woken
//! by the queue's notifications, with a slow poll as the fallback) and the reaper that fences
//! dead workers and requeues their runs ([`reap_loop`]). A store of one process has no queue,
//! and none of this runs.

use crate::engine::host::Host;
use crate::store::queue::Claimed;
use crate::store::Store;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often a worker claims without being woken (a lost notification costs at most this).
pub const POLL: Duration = Duration::from_secs(5);

/// How often the reaper looks for workers whose lease ran out.
pub const REAP_EVERY: Duration = Duration::from_secs(2);

/// Runs a worker claims in one transaction at most.
const CLAIM_BATCH: usize = 16;

/// Runs this worker could not serve, remembered so it does not claim them again (at most);
/// forgotten every [`POLL`], so each is tried again (what it needs may be here by then).
const SKIP_AT_MOST: usize = 1024;

/// Claim queued runs while this worker has room, and execute each, until `stop` (a drain).
/// Returns once it stopped claiming; the runs it started go on.
pub async fn claim_loop(host: Arc<Host>, max_recoveries: u32, stop: CancellationToken) {
    let store = host.store().clone();
    let Some(queue) = store.run_queue() else { return };
    let mut wakeups = queue.wakeups();
    let mut skip: Vec<String> = Vec::new();
    let mut skipping_since = tokio::time::Instant::now();
    loop {
        if stop.is_cancelled() {
            return;
        }
        if skipping_since.elapsed() >= POLL {
            // Tried again: a granted directory back in place, a transient failure gone.
            skip.clear();
            skipping_since = tokio::time::Instant::now();
        }
        let mut permits = Vec::new();
        while permits.len() < CLAIM_BATCH {
            match host.queue_room().clone().try_acquire_owned() {
                Ok(permit) => permits.push(permit),
                Err(_) => break,
            }
        }
        let mut full = false;
        if !permits.is_empty() {
            match queue.claim(permits.len(), skip.clone(), host.caps().cluster_runs).await {
                Ok(claimed) => {
                    full = claimed.len() == permits.len();
                    for run in claimed {
                        let Some(permit) = permits.pop() else { break };
                        if !run.owned {
                            drop(permit);
                            if let Err(e) = queue.finish(run.run_id.clone()).await {
                                tracing::warn!(run = %run.run_id, error = %e, "dropping a stale queue entry");
                            }
                            continue;
                        }
                        match host.can_serve(&run).await {
                            Ok(()) => {
                                let host = host.clone();
                                tokio::spawn(async move {
                                    execute(&host, run, max_recoveries).await;
                                    drop(permit);
                                    host.queue_freed().notify_one();
                                });
                            }
                            Err(why) => {
                                tracing::info!(run = %run.run_id, reason = %why, "a queued run this worker cannot serve goes back to the queue");
                                if let Err(e) = queue.release(run.run_id.clone(), why.to_string()).await {
                                    tracing::warn!(run = %run.run_id, error = %e, "handing a queued run back");
                                }
                                if skip.len() == SKIP_AT_MOST {
                                    skip.remove(0);
                                }
                                skip.push(run.run_id);
                            }
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "claiming queued runs"),
            }
        }
        drop(permits);
        if full {
            // There may be more waiting.
            continue;
        }
        tokio::select! {
            _ = wakeups.recv() => {}
            _ = host.queue_freed().notified() => {}
            _ = tokio::time::sleep(POLL) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// Execute one claimed run: its first attempt (a new run), or a resume from its journal (a
/// run requeued by the reaper or handed back by a draining worker); then drop its entry.
async fn execute(host: &Arc<Host>, run: Claimed, max_recoveries: u32) {
    let store = host.store().clone();
    let Some(queue) = store.run_queue() else { return };
    let record = match store.run(&run.run_id).await {
        Ok(Some(record)) => record,
        Ok(None) => {
            let _ = queue.finish(run.run_id).await;
            return;
        }
        Err(e) => {
            tracing::warn!(run = %run.run_id, error = %e, "reading a claimed run");
            return;
        }
    };
    match &run.start {
        Some(start)
            if record.envelope.status == crate::model::envelope::RunStatus::Pending
                && record.envelope.attempts == 0 =>
        {
            tracing::info!(run = %run.run_id, factory = %record.envelope.factory, "starting a queued run");
            if let Err(e) = host.start_queued(record, start).await {
                tracing::warn!(run = %run.run_id, error = %e, "a queued run could not start");
            }
        }
        _ if crate::engine::recover::is_interrupted(&record)
            && host.runs_here(&run.run_id)
            && !store.attempt_fenced(&run.run_id) =>
        {
            // Already resumed here, under the lease held now (this worker's start-up recovery
            // took it before the claim, which read the record from before that attempt's
            // start): that attempt is the run's, not a stale one. Held until it ends.
            host.attempt_gone(&run.run_id).await;
        }
        _ if crate::engine::recover::is_interrupted(&record) => {
            // Requeued while an attempt of it still winds down here (this worker lost its
            // lease, rejoined, and claimed its own run back): that attempt goes first.
            host.end_stale_attempt(&run.run_id).await;
            let recovery = crate::engine::recover::recover_one(host, record, max_recoveries).await;
            tracing::info!(run = %run.run_id, "{recovery} (requeued)");
            if matches!(recovery.outcome, crate::engine::recover::RecoveryOutcome::Resumed { .. }) {
                // The permit is held until the attempt ends here (not the run: a `halted`
                // end may be continued elsewhere).
                host.attempt_gone(&run.run_id).await;
            }
        }
        // Parked for its quota (handed back by a draining worker): this worker's timer
        // resumes it at its reset (the store's claim lets one worker do so).
        _ if crate::engine::recover::parked_until(&record).is_some() => {
            if let Some(at) = crate::engine::recover::parked_until(&record) {
                host.parking().arm(&run.run_id, at);
            }
        }
        // Ended, or started elsewhere: nothing to do.
        _ => {}
    }
    // A draining worker keeps the entry of a run it stopped: it hands it back.
    if host.draining()
        && store
            .run(&run.run_id)
            .await
            .ok()
            .flatten()
            .is_some_and(|r| r.envelope.status == crate::model::envelope::RunStatus::Halted)
    {
        return;
    }
    if let Err(e) = queue.finish(run.run_id.clone()).await {
        tracing::warn!(run = %run.run_id, error = %e, "dropping a finished run's queue entry");
    }
}

/// Every [`REAP_EVERY`], fence the workers whose lease ran out and requeue their runs, until
/// `stop`.
pub async fn reap_loop(store: Arc<dyn Store>, stop: CancellationToken) {
    if store.run_queue().is_none() {
        return;
    }
    loop {
        tokio::select! {
            _ = tokio::time::sleep(REAP_EVERY) => {}
            _ = stop.cancelled() => return,
        }
        let Some(queue) = store.run_queue() else { return };
        match queue.reap().await {
            Ok(reaped) if !reaped.workers.is_empty() => tracing::warn!(
                workers = ?reaped.workers,
                runs = ?reaped.runs,
                "fenced workers whose lease ran out and requeued their runs"
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "reaping dead workers"),
        }
    }
}
