//! The caps a worker of a shared store runs under ([`Caps`]), and the cluster-wide cap on
//! concurrent agent calls per backend ([`capped`]): each call holds one of the backend's slot
//! rows in the database while it runs, so the cap is exact among live workers. The engine's
//! [`Host`](crate::engine::host::Host) wraps its backends with it; the claim loop
//! ([`crate::engine::queue`]) reads the run caps. A store of one process has no call slots.
//!
//! On such a store the flows of a run's backends also share one budget per backend endpoint
//! and key across the workers ([`share_flows`]): [`StoreBudget`] is the flow's
//! [`SharedBudget`] over the store's `flow_budgets`; while the database does not answer, the
//! flows fall back to their own buckets (a warning, then the database is left alone a while).

use crate::backend::flow::{SharedBudget, SharedBudgetError, SharedRates};
use crate::backend::{AgentBackend, AgentReply, AgentRequest, BackendError, BackendRef, OutageKind};
use crate::store::queue::RunQueue;
use crate::store::{Store, StoreError};
use futures::future::{BoxFuture, FutureExt};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime};

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
                    Err(e) => {
                        return Err(BackendError::outage(
                            OutageKind::Unavailable,
                            format!("taking a call slot of backend `{name}`: {e}"),
                        ))
                    }
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

    fn free_notice(&self, model: Option<&str>) -> Option<String> {
        self.inner.free_notice(model)
    }

    fn with_grants(&self, grants: &[String]) -> Option<Arc<dyn AgentBackend>> {
        let inner = self.inner.with_grants(grants)?;
        Some(Arc::new(Capped { inner, store: self.store.clone(), name: self.name.clone(), cap: self.cap }))
    }

    fn hiding(&self, hidden: &crate::backend::Hidden) -> Option<Arc<dyn AgentBackend>> {
        let inner = self.inner.hiding(hidden)?;
        Some(Arc::new(Capped { inner, store: self.store.clone(), name: self.name.clone(), cap: self.cap }))
    }

    fn flows(&self) -> Vec<Arc<crate::backend::flow::Flow>> {
        self.inner.flows()
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }
}

/// Share the flows of `backend` (every endpoint and key it calls through) with the other
/// workers of the store, when the store has a queue (a cluster); else leave them local.
pub(crate) fn share_flows(store: &Arc<dyn Store>, backend: &dyn AgentBackend) {
    if store.run_queue().is_none() {
        return;
    }
    let budget: Arc<dyn SharedBudget> = Arc::new(StoreBudget::new(store));
    for flow in backend.flows() {
        flow.share(budget.clone());
    }
}

/// How long a shared budget that failed is left alone (the flows pace on their own buckets).
const BUDGET_PAUSE: Duration = Duration::from_secs(10);

/// How long a take from the shared budget may take before the flow paces on its own.
const BUDGET_PATIENCE: Duration = Duration::from_secs(2);

/// A flow budget shared through the store's run queue (table `flow_budgets` on PostgreSQL).
pub(crate) struct StoreBudget {
    /// Weak: flows outlive the service (one per endpoint and key in the process), and a store
    /// dropped must close (commit what is queued, give its lease up), not live on in them.
    store: Weak<dyn Store>,
    /// Until when the store is not asked (it failed lately).
    paused_until: Arc<Mutex<Option<Instant>>>,
}

/// Why the shared budget could not be used.
#[derive(Debug, thiserror::Error)]
enum BudgetError {
    /// The store has no queue (not a cluster), or was closed.
    #[error("the store is not shared, or was closed")]
    NotShared,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The store did not answer in time.
    #[error("no answer from the store in {0:?}")]
    Slow(Duration),
    /// The store failed lately and is left alone until then.
    #[error("the store failed lately; local buckets pace for {0:.0?} more")]
    Paused(Duration),
}

impl StoreBudget {
    /// The shared budget of `store`'s workers.
    pub(crate) fn new(store: &Arc<dyn Store>) -> StoreBudget {
        StoreBudget { store: Arc::downgrade(store), paused_until: Arc::new(Mutex::new(None)) }
    }

    /// `work` on the store's queue, while the store is open and has one.
    fn on_queue<T>(
        &self,
        work: impl FnOnce(&dyn RunQueue) -> BoxFuture<'static, Result<T, StoreError>>,
    ) -> Option<BoxFuture<'static, Result<T, StoreError>>> {
        let store = self.store.upgrade()?;
        let queue = store.run_queue()?;
        Some(work(queue))
    }

    /// The time left of a pause after a failure, if any.
    fn paused(&self) -> Option<Duration> {
        let until = (*self.paused_until.lock().unwrap_or_else(|p| p.into_inner()))?;
        until.checked_duration_since(Instant::now()).filter(|left| !left.is_zero())
    }

    /// `work` on the store within [`BUDGET_PATIENCE`]; a failure pauses the budget.
    fn ask<T: Send + 'static>(
        &self,
        work: Option<BoxFuture<'static, Result<T, StoreError>>>,
    ) -> BoxFuture<'static, Result<T, SharedBudgetError>> {
        let paused_until = self.paused_until.clone();
        let paused = self.paused();
        async move {
            let result = match (paused, work) {
                (Some(left), _) => return Err(SharedBudgetError(Box::new(BudgetError::Paused(left)))),
                (None, None) => Err(BudgetError::NotShared),
                (None, Some(work)) => match tokio::time::timeout(BUDGET_PATIENCE, work).await {
                    Ok(result) => result.map_err(BudgetError::from),
                    Err(_) => Err(BudgetError::Slow(BUDGET_PATIENCE)),
                },
            };
            result.map_err(|e| {
                *paused_until.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now() + BUDGET_PAUSE);
                SharedBudgetError(Box::new(e))
            })
        }
        .boxed()
    }
}

impl SharedBudget for StoreBudget {
    fn take(
        &self,
        key: &str,
        rates: SharedRates,
        tokens: f64,
    ) -> BoxFuture<'static, Result<Option<Duration>, SharedBudgetError>> {
        let work = self.on_queue(|queue| queue.take_flow_budget(budget_key(key), rates, tokens));
        self.ask(work)
    }

    fn close_until(&self, key: &str, until: SystemTime) -> BoxFuture<'static, Result<(), SharedBudgetError>> {
        // As a wait from now: the database's clock closes it, whatever this worker's says.
        let wait = until.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO);
        let work = self.on_queue(|queue| queue.close_flow_budget(budget_key(key), wait));
        self.ask(work)
    }

    fn remaining(
        &self,
        key: &str,
        requests: Option<f64>,
        tokens: Option<f64>,
    ) -> BoxFuture<'static, Result<(), SharedBudgetError>> {
        let work = self.on_queue(|queue| queue.bound_flow_budget(budget_key(key), requests, tokens));
        self.ask(work)
    }

    fn true_up(&self, key: &str, tokens: f64) -> BoxFuture<'static, Result<(), SharedBudgetError>> {
        let work = self.on_queue(|queue| queue.true_up_flow_budget(budget_key(key), tokens));
        self.ask(work)
    }
}

/// A flow's key as the database keeps it: the key (endpoint and key fingerprint) with any
/// credentials of a URL in it (`https://user:secret@host`) replaced by their fingerprint.
fn budget_key(key: &str) -> String {
    key.split(' ')
        .map(|word| match reqwest::Url::parse(word) {
            Ok(mut url) if !url.username().is_empty() || url.password().is_some() => {
                let userinfo = format!("{}:{}", url.username(), url.password().unwrap_or(""));
                let fingerprint = crate::backend::flow::key_fingerprint(Some(&userinfo));
                let _ = url.set_password(None);
                let _ = url.set_username(&format!("user-{fingerprint}"));
                url.to_string()
            }
            _ => word.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_budget_key_carries_no_credentials_of_a_url() {
        let key = super::budget_key("openai https://ann:s3cret@api.example.com/v1 1a2b3c4d5e6f");
        assert!(!key.contains("s3cret") && !key.contains("ann"), "{key}");
        assert!(key.starts_with("openai https://user-") && key.ends_with("@api.example.com/v1 1a2b3c4d5e6f"), "{key}");
        assert_eq!(super::budget_key("openai http://127.0.0.1:8080/v1 nokey"), "openai http://127.0.0.1:8080/v1 nokey");
    }
}
