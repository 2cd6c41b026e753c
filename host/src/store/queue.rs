//! The run queue of a store that several workers share ([`RunQueue`]): a run started on any
//! worker is stored with a queue entry ([`QueuedStart`]: what its first attempt needs, so the
//! consent and grants given at its start travel with it), and workers claim entries while
//! they have room under their caps. A dead worker's runs go back to the queue (the reaper),
//! as do the runs a draining worker hands back. Cluster-wide call slots per backend live
//! here too ([`RunQueue::take_call_slot`]), and the flow budgets the workers share per
//! backend endpoint and key ([`RunQueue::take_flow_budget`]). A store of one process has no
//! queue ([`crate::store::Store::run_queue`] is `None`): its runs execute where they start.

use super::{RunRecord, StoreError};
pub use crate::model::flow::FlowRates;
use crate::model::recorded::BackendRef;
use crate::model::script::ScriptRef;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

/// What a worker needs to start a queued run's first attempt, stored with the run when it
/// is enqueued (the component and script bytes are stored blobs already).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueuedStart {
    /// sha256 of the component (for a script factory, of the JS runner).
    pub component: String,
    /// The script a script factory runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<ScriptRef>,
    /// The backend the run was started with.
    pub backend: BackendRef,
}

/// A queue entry a worker claimed: the run is now owned by it.
#[derive(Debug, Clone)]
pub struct Claimed {
    /// The run.
    pub run_id: String,
    /// Its first attempt's start, when it was enqueued as a new run (`None`: a run handed
    /// back or requeued, resumed from its record).
    pub start: Option<QueuedStart>,
    /// Whether the run became this worker's (`false`: another live worker executes it; the
    /// entry is stale and only to be finished).
    pub owned: bool,
}

/// What the reaper took from workers whose lease ran out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reaped {
    /// The dead workers fenced (their generation raised).
    pub workers: Vec<String>,
    /// Their runs put back in the queue.
    pub runs: Vec<String>,
}

/// The queue and call slots of a shared store; every call is one transaction that first
/// checks this worker's lease (a fenced worker claims, enqueues and reaps nothing).
pub trait RunQueue: Send + Sync {
    /// Store the new run `record` (giving it its creation seq and bumping its writes) with its
    /// queue entry `start`, in one transaction, and notify the workers once. With `here`, the
    /// entry is claimed for this worker at once when `cluster_runs` (runs owned cluster-wide)
    /// leaves room; returns whether it was.
    fn enqueue<'a>(
        &'a self,
        record: &'a mut RunRecord,
        start: &'a QueuedStart,
        here: bool,
        cluster_runs: Option<usize>,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Claim at most `max` unclaimed entries, oldest first (`FOR UPDATE SKIP LOCKED`, so
    /// workers claiming together never wait on each other's rows), except those in `skip`,
    /// and no more than `cluster_runs` leaves room for.
    fn claim(
        &self,
        max: usize,
        skip: Vec<String>,
        cluster_runs: Option<usize>,
    ) -> BoxFuture<'_, Result<Vec<Claimed>, StoreError>>;

    /// Put a claimed entry back unclaimed: this worker cannot serve it, for `reason` (kept
    /// with the entry, one per worker, for [`RunQueue::refusals`]).
    fn release(&self, run_id: String, reason: String) -> BoxFuture<'_, Result<(), StoreError>>;

    /// Why the workers that claimed queued run `run_id` could not serve it: (worker, reason)
    /// pairs, empty when none refused it or it is not queued.
    fn refusals(&self, run_id: String) -> BoxFuture<'_, Result<Vec<(String, String)>, StoreError>>;

    /// Drop a run's entry this worker claimed: its attempt ended, or it needs none (an entry
    /// handed back or claimed by another worker meanwhile stays).
    fn finish(&self, run_id: String) -> BoxFuture<'_, Result<(), StoreError>>;

    /// Take a run that waits in the queue, unclaimed and never started, out of it (it is
    /// being cancelled); `Ok(false)` when a worker claimed it already.
    fn dequeue(&self, run_id: String) -> BoxFuture<'_, Result<bool, StoreError>>;

    /// Put the runs of `run_ids`, executing here, in the queue held by this worker (a
    /// draining worker about to stop them): from the moment their attempts end `halted` until
    /// [`RunQueue::hand_back`], they read as runs the cluster continues
    /// ([`crate::store::Store::continues`]).
    fn hold(&self, run_ids: Vec<String>) -> BoxFuture<'_, Result<(), StoreError>>;

    /// Put back in the queue the runs of `run_ids` that are `halted` (a draining worker's),
    /// for any worker to resume, and drop this worker's held entries of the others (they
    /// ended); notify the workers once. Returns the ones queued.
    fn hand_back(&self, run_ids: Vec<String>) -> BoxFuture<'_, Result<Vec<String>, StoreError>>;

    /// Fence every other worker whose lease ran out and that still owns runs or entries
    /// (generation + 1) and requeue its runs, in one transaction: a run that had started is
    /// halted (an interruption, resumed from its journal by whoever claims it), one still
    /// waiting for its first attempt is queued as it was.
    fn reap(&self) -> BoxFuture<'_, Result<Reaped, StoreError>>;

    /// Woken when runs are enqueued or requeued (a notification, at most one per
    /// transaction); a lost one costs a slow poll.
    fn wakeups(&self) -> tokio::sync::broadcast::Receiver<()>;

    /// Take one of `cap` cluster-wide call slots of `backend` for this worker: `Some(slot)`,
    /// or `None` when all are held by live workers.
    fn take_call_slot(&self, backend: String, cap: u32) -> BoxFuture<'static, Result<Option<i32>, StoreError>>;

    /// Give a call slot back.
    fn give_call_slot(&self, backend: String, slot: i32) -> BoxFuture<'static, Result<(), StoreError>>;

    /// Take one request and `tokens` tokens from the budget of flow `key` shared by every
    /// worker (its buckets refilled since the last take at the rates then in force, on the
    /// database's clock, then set to `rates`; made on first use with what the caller's own
    /// buckets hold), in one statement:
    /// `Ok(None)` when taken, `Ok(Some(wait))` when not there yet (or the budget is closed),
    /// with how long until it would be. No lease is checked: a budget pays for no write.
    fn take_flow_budget(
        &self,
        key: String,
        rates: FlowRates,
        tokens: f64,
    ) -> BoxFuture<'static, Result<Option<std::time::Duration>, StoreError>>;

    /// Close the budget of flow `key` for every worker for `wait` from now on the database's
    /// clock (a later close stands), and empty its request bucket (the server said none is left).
    fn close_flow_budget(&self, key: String, wait: std::time::Duration) -> BoxFuture<'static, Result<(), StoreError>>;

    /// Put `tokens` back in the token bucket of flow `key` (negative: take more), kept within
    /// its size either way: a call's usage trued up against what its take charged.
    fn true_up_flow_budget(&self, key: String, tokens: f64) -> BoxFuture<'static, Result<(), StoreError>>;

    /// Bound the buckets of flow `key` by what the server says remains (`None`: not said).
    fn bound_flow_budget(
        &self,
        key: String,
        requests: Option<f64>,
        tokens: Option<f64>,
    ) -> BoxFuture<'static, Result<(), StoreError>>;
}
