//! The agent calls `agents.agent-start` started and `agents.agent-wait` reports: one set per
//! attempt, which the run's state in the store data holds (the hooks reach it, with the
//! attempt's [`Agents`], through [`AgentsView`]), so the calls end with the store as the
//! async `agents.agent` calls do (a dropped call is abandoned, its spend marked a lower
//! bound). `agent-start` polls a new call once, at once: a call the host can answer without
//! a wait (a backend that answered in that poll) comes back as a reply and never enters the
//! set. Every other call is kept here and polled while an `agent-wait` is in flight; each
//! `agent-wait` reports every call done by then, so a fan-out's answers cross the component
//! boundary in batches, not in one async call each. The calls' semantics (memo, limits,
//! journal, accounting) are [`super::agents`]'; this module only holds and drives them.

use super::abort::Abort;
use super::agents::{Agents, Call};
use super::attempt::Attempt;
use futures::stream::{FuturesUnordered, StreamExt};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use tokio_util::sync::ReusableBoxFuture;

/// What a call came back with, as `agents.agent` answers it.
pub(crate) type Outcome = Result<Option<String>, Abort>;

/// A started call, tagged with its id.
type Running = ReusableBoxFuture<'static, (u32, Outcome)>;

/// What [`Started::launch`] made of an admitted call.
pub(crate) enum Launch {
    /// Answered in its first poll.
    Answered(Outcome),
    /// Pending under this id: [`Started::poll_done`] reports it.
    Pending(u32),
}

/// How the hooks reach the subagent calls of the attempt a store runs (the run's state in
/// the store data implements it, as wasmtime-wasi's state implements `WasiView`).
pub(crate) trait AgentsView: Send + 'static {
    /// The attempt's calls, and the calls `agents.agent-start` started in this store.
    fn agents(&mut self) -> AgentsCtx<'_>;
}

/// What [`AgentsView::agents`] lends: the attempt's calls and the store's started calls.
pub(crate) struct AgentsCtx<'a> {
    /// The attempt's subagent calls.
    pub(crate) agents: &'a Arc<Agents>,
    /// The calls `agents.agent-start` started; they end with the store.
    pub(crate) started: &'a mut Started,
}

/// The calls `agents.agent-start` started in one attempt and not yet reported.
pub(crate) struct Started {
    running: FuturesUnordered<Running>,
    /// The box of the last call answered in its first poll, for the next call.
    spare: Option<Running>,
    /// The next call's id: ids count up (wrapping only after 2^32 calls of one attempt), so
    /// an outcome a guest holds is not mistaken for a later call's.
    next: u32,
    /// Wakes the `agent-wait` in flight, if any.
    wakeup: Arc<Wakeup>,
    /// The waker of [`Started::wakeup`], made once.
    waker: Waker,
}

impl Default for Started {
    fn default() -> Self {
        let wakeup = Arc::new(Wakeup::default());
        let waker = Waker::from(wakeup.clone());
        Started { running: FuturesUnordered::new(), spare: None, next: 0, wakeup, waker }
    }
}

impl Started {
    /// Start `call`: poll it once, and keep it under a fresh id when it must wait. Once the
    /// attempt is stopping it ends at once with the abort, as `agents.agent` does.
    pub(crate) fn launch(&mut self, agents: Arc<Agents>, attempt: Arc<Attempt>, call: Box<Call>) -> Launch {
        let id = self.next;
        self.next = self.next.wrapping_add(1);
        let future = async move { (id, settle(agents, attempt, call).await) };
        // The box a call answered in its first poll left behind, reused: a backend that
        // answers at once costs no allocation of the call's future (some 2 KB) per call.
        let mut running = match self.spare.take() {
            Some(mut spare) => {
                spare.set(future);
                spare
            }
            None => Running::new(future),
        };
        // The first poll's waker is the `agent-wait` in flight's (through `wakeup`): the call
        // enters the set only after it, and the set is polled only from `agent-wait`.
        match running.poll(&mut Context::from_waker(&self.waker)) {
            Poll::Ready((_, outcome)) => {
                self.spare = Some(running);
                Launch::Answered(outcome)
            }
            Poll::Pending => {
                self.running.push(running);
                Launch::Pending(id)
            }
        }
    }

    /// `agents.agent-wait`'s poll: every call done by now, or pending while none is and some
    /// still run; an empty list once none is pending.
    pub(crate) fn poll_done(&mut self, cx: &Context<'_>) -> Poll<Vec<(u32, Outcome)>> {
        self.wakeup.register(cx.waker());
        let mut done = Vec::new();
        let mut set = Context::from_waker(&self.waker);
        while let Poll::Ready(Some(finished)) = self.running.poll_next_unpin(&mut set) {
            done.push(finished);
        }
        if done.is_empty() && !self.running.is_empty() {
            return Poll::Pending;
        }
        Poll::Ready(done)
    }
}

/// One agent call that waits: its answer, or the abort at once when the attempt stops first
/// (the call is then abandoned as a dropped store would abandon it). Polled out of tokio's
/// cooperative budget: a fan-out's thousands of calls are polled by the one task that drives
/// the guest, and a budget spent after the first 128 would leave every later call pending
/// (another pass through the set, or the async call's machinery) though its answer is at hand.
pub(crate) fn settle(
    agents: Arc<Agents>,
    attempt: Arc<Attempt>,
    call: Box<Call>,
) -> impl std::future::Future<Output = Outcome> {
    tokio::task::unconstrained(async move {
        tokio::select! {
            biased;
            outcome = agents.finish(call) => outcome,
            _ = attempt.stop_signal().cancelled() => Err(attempt.stopping().unwrap_or(Abort::Cancelled)),
        }
    })
}

/// Forwards a wake-up of the started calls to the `agent-wait`s in flight (one, from the
/// SDKs); with none in flight the next one polls the calls anyway.
#[derive(Default)]
struct Wakeup(Mutex<Vec<Waker>>);

/// The most `agent-wait`s in flight at once that are each woken; a guest with more (only
/// hostile code waits twice at once) has its oldest wait woken by later wake-ups no more.
const MAX_WAITERS: usize = 64;

impl Wakeup {
    fn register(&self, waker: &Waker) {
        let mut waiters = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if waiters.iter().any(|w| w.will_wake(waker)) {
            return;
        }
        if waiters.len() >= MAX_WAITERS {
            waiters.remove(0);
        }
        waiters.push(waker.clone());
    }
}

impl Wake for Wakeup {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let waiters = std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()));
        for waker in waiters {
            waker.wake();
        }
    }
}
