//! The worker side of a shared store's run queue ([`RunQueue`]): the caps a worker runs
//! under ([`Caps`]), the claim loop that takes queued runs while the worker has room
//! ([`claim_loop`]; woken by the queue's notifications, with a slow poll as the fallback),
//! the reaper that fences dead workers and requeues their runs ([`reap_loop`]), and the
//! cluster-wide cap on concurrent agent calls per backend ([`capped`]: each call holds one
//! of the backend's slot rows in the database while it runs, so the cap is exact among live
//! workers). A store of one process has no queue, and none of this runs.

use crate::backend::{AgentBackend, AgentReply, AgentRequest, BackendError, BackendRef, OutageKind};
use crate::engine::host::Host;
use crate::store::queue::{Claimed, RunQueue};
use crate::store::Store;
use futures::future::{BoxFuture, FutureExt};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often a worker claims without being woken (a lost notification costs at most this).
pub const POLL: Duration = Duration::from_secs(5);

/// How often the reaper looks for workers whose lease ran out.
pub const REAP_EVERY: Duration = Duration::from_secs(2);

/// Runs a worker claims in one transaction at most.
const CLAIM_BATCH: usize = 16;

/// Runs this worker could not serve, remembered so it does not claim them again (at most).
const SKIP_AT_MOST: usize = 1024;

/// The caps a worker of a shared store runs under (none by default).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caps {
    /// Runs this worker executes at once from the queue (`Some(0)`: it claims none and only
    /// enqueues: a front door).
    pub worker_runs: Option<usize>,
    /// Runs owned by all the workers together; a worker claims only while fewer are.
    pub cluster_runs: Option<usize>,
    /// Agent calls in flight at once across the cluster, per backend name.
    pub backend_calls: BTreeMap<String, u32>,
}

/// Claim queued runs while this worker has room, and execute each, until `stop` (a drain).
/// Returns once it stopped claiming; the runs it started go on.
pub async fn claim_loop(host: Arc<Host>, max_recoveries: u32, stop: CancellationToken) {
    let store = host.store().clone();
    let Some(queue) = store.run_queue() else { return };
    let mut wakeups = queue.wakeups();
    let mut skip: Vec<String> = Vec::new();
    loop {
        if stop.is_cancelled() {
            return;
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
                                if let Err(e) = queue.release(run.run_id.clone()).await {
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
        Some(start) if record.envelope.status == crate::RunStatus::Pending && record.envelope.attempts == 0 => {
            tracing::info!(run = %run.run_id, factory = %record.envelope.factory, "starting a queued run");
            if let Err(e) = host.start_queued(record, start).await {
                tracing::warn!(run = %run.run_id, error = %e, "a queued run could not start");
            }
        }
        _ if crate::recover::is_interrupted(&record) => {
            let recovery = crate::recover::recover_one(host, record, max_recoveries).await;
            tracing::info!(run = %run.run_id, "{recovery} (requeued)");
            if matches!(recovery.outcome, crate::recover::RecoveryOutcome::Resumed { .. }) {
                // The permit is held until the attempt ends.
                if let Err(e) = host.wait(crate::Scope::Owner, &run.run_id).await {
                    tracing::warn!(run = %run.run_id, error = %e, "waiting for a recovered run");
                }
            }
        }
        // Ended, or started elsewhere: nothing to do.
        _ => {}
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

/// `backend` under the cluster-wide cap of its name in `caps`, when the store has a queue
/// and a cap is set for it; else `backend` itself.
pub(crate) fn capped(store: &Arc<dyn Store>, caps: &Caps, backend: Arc<dyn AgentBackend>) -> Arc<dyn AgentBackend> {
    let name = backend.reference().name;
    match (store.run_queue(), caps.backend_calls.get(&name)) {
        (Some(_), Some(&cap)) => Arc::new(Capped { inner: backend, store: store.clone(), name, cap }),
        _ => backend,
    }
}

/// A backend whose calls each hold one of `cap` call slots of `name` in the shared store.
struct Capped {
    inner: Arc<dyn AgentBackend>,
    store: Arc<dyn Store>,
    name: String,
    cap: u32,
}

/// Gives the slot back when the call ends, however it ends.
struct Slot {
    store: Arc<dyn Store>,
    name: String,
    slot: i32,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(queue) = self.store.run_queue() {
            // Started on the store's own runtime at once; awaited here only to log a failure
            // (a slot not given back is free again once this worker's lease runs out).
            let give = queue.give_call_slot(self.name.clone(), self.slot);
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    if let Err(e) = give.await {
                        tracing::warn!(error = %e, "giving a call slot back");
                    }
                });
            }
        }
    }
}

fn queue_of(store: &Arc<dyn Store>) -> Option<&dyn RunQueue> {
    store.run_queue()
}

impl AgentBackend for Capped {
    fn name(&self) -> String {
        self.inner.name()
    }

    fn call(&self, request: Arc<AgentRequest>) -> BoxFuture<'static, Result<AgentReply, BackendError>> {
        let (inner, store, name, cap) = (self.inner.clone(), self.store.clone(), self.name.clone(), self.cap);
        async move {
            let mut pause = Duration::from_millis(20);
            let slot = loop {
                let Some(queue) = queue_of(&store) else { return inner.call(request).await };
                match queue.take_call_slot(name.clone(), cap).await {
                    Ok(Some(slot)) => break Slot { store: store.clone(), name: name.clone(), slot },
                    Ok(None) => {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_millis(250));
                    }
                    Err(e) => return Err(BackendError::outage(OutageKind::Unavailable, format!("taking a call slot of backend `{name}`: {e}"))),
                }
            };
            let reply = inner.call(request).await;
            drop(slot);
            reply
        }
        .boxed()
    }

    fn reference(&self) -> BackendRef {
        self.inner.reference()
    }

    fn unpriced(&self, model: Option<&str>) -> Option<String> {
        self.inner.unpriced(model)
    }

    fn with_grants(&self, grants: &[String]) -> Option<Arc<dyn AgentBackend>> {
        let inner = self.inner.with_grants(grants)?;
        Some(Arc::new(Capped { inner, store: self.store.clone(), name: self.name.clone(), cap: self.cap }))
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }
}
