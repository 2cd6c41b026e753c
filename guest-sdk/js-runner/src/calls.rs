//! The agent calls of a run in flight, owned by the runner rather than by QuickJS: this
//! module holds the `agents.agent` import futures (one set for the run, polled only when
//! woken), the outcomes that came back and not yet handed to JS, and the [`Driven`] future
//! that wraps a run to collect outcomes in batches.
//!
//! `ctx.agent` calls `__factory_native.agentStart`, which starts nothing itself: it pushes
//! the import's future here and answers an id (the JS side keeps the call's promise under
//! it). The futures are first polled — the import called — right after the JS turn that
//! made them, and every outcome is kept until the next time JS runs, when
//! `__factory_settle` gets all of them in one call. [`Driven`] collects outcomes without
//! entering JS while the host has more of them ready (it asks the async runtime to poll
//! again, which first delivers the host's pending events), so a fan-out's thousand replies
//! are settled in a few passes instead of one pass (an engine entry, its promise jobs) each.

use crate::bindings::agent::factory::agents;
use crate::bindings::agent::factory::types::{Abort, AgentOptions, ReadyReply};
use futures::stream::{FuturesUnordered, StreamExt};
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// What one call came back with.
pub type Outcome = Result<Option<String>, Abort>;

type CallFuture = Pin<Box<dyn Future<Output = (u32, Outcome)>>>;

/// How many outcomes wait for JS at most before the run enters it anyway.
const MAX_BATCH: usize = 1024;

#[derive(Default)]
struct Calls {
    running: FuturesUnordered<CallFuture>,
    /// Outcomes not yet handed to JS, with their call ids.
    done: Vec<(u32, Outcome)>,
    /// Ids free for reuse (JS indexes arrays by them, so they stay dense).
    free: Vec<u32>,
    next: u32,
}

thread_local! {
    static CALLS: RefCell<Calls> = RefCell::new(Calls::default());
}

/// Queue one `agents.agent` call; its id. A call the synchronous `agents.agent-ready`
/// answers (a memo hit: a replayed or repeated call) is done at once, without the async
/// call; its outcome is settled with the others.
pub fn start(prompt: String, options: AgentOptions) -> u32 {
    let ready = match agents::agent_ready(&prompt, &options) {
        Ok(ReadyReply::MustWait) => None,
        Ok(ReadyReply::Reply(reply)) => Some(Ok(reply)),
        Err(abort) => Some(Err(abort)),
    };
    CALLS.with(|calls| {
        let mut calls = calls.borrow_mut();
        let id = match calls.free.pop() {
            Some(id) => id,
            None => {
                calls.next += 1;
                calls.next - 1
            }
        };
        match ready {
            Some(outcome) => calls.done.push((id, outcome)),
            None => calls.running.push(Box::pin(async move { (id, agents::agent(prompt, options).await) })),
        }
        id
    })
}

/// Poll the calls that are new or woken; how many outcomes that collected.
fn collect(cx: &mut Context<'_>) -> usize {
    CALLS.with(|calls| {
        let mut calls = calls.borrow_mut();
        let mut collected = 0;
        while let Poll::Ready(Some(outcome)) = calls.running.poll_next_unpin(cx) {
            calls.done.push(outcome);
            collected += 1;
        }
        collected
    })
}

/// The outcomes waiting for JS (their ids stay taken until [`release`]).
pub fn take_done() -> Vec<(u32, Outcome)> {
    CALLS.with(|calls| std::mem::take(&mut calls.borrow_mut().done))
}

/// The ids of settled calls, free again.
pub fn release(ids: impl IntoIterator<Item = u32>) {
    CALLS.with(|calls| calls.borrow_mut().free.extend(ids));
}

/// Drop every call of the run (each pending import is cancelled).
pub fn clear() {
    let calls = CALLS.with(|calls| std::mem::take(&mut *calls.borrow_mut()));
    drop(calls);
}

/// A run's future, with its agent calls driven around it: the calls are polled before and
/// after each poll of the run, and while polling them collects new outcomes the run is not
/// polled (its JS not entered): the runtime is asked to poll again at once, after handing
/// over whatever else the host has ready.
pub struct Driven<F>(pub Pin<Box<F>>);

impl<F: Future> Future for Driven<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let waiting = collect(cx);
        if waiting > 0 && CALLS.with(|calls| calls.borrow().done.len()) < MAX_BATCH {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        if let Poll::Ready(output) = self.0.as_mut().poll(cx) {
            return Poll::Ready(output);
        }
        // Start the calls that turn made (and keep any that answered at once for the next,
        // as the ones `agent-ready` answered).
        if collect(cx) > 0 || CALLS.with(|calls| !calls.borrow().done.is_empty()) {
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }
}
