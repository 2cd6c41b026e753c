//! The caps a worker of a shared store runs under ([`Caps`]), and the cluster-wide cap on
//! concurrent agent calls per backend ([`capped`]): each call holds one of the backend's slot
//! rows in the database while it runs, so the cap is exact among live workers. The engine's
//! [`Host`](crate::engine::host::Host) wraps its backends with it; the claim loop
//! ([`crate::engine::queue`]) reads the run caps. A store of one process has no call slots.

use crate::backend::{AgentBackend, AgentReply, AgentRequest, BackendError, BackendRef, OutageKind};
use crate::store::queue::RunQueue;
use crate::store::Store;
use futures::future::{BoxFuture, FutureExt};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

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

    fn describe(&self) -> String {
        self.inner.describe()
    }
}
