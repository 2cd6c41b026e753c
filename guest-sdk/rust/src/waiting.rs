//! The agent calls `agents.agent-start` left pending, awaiting their outcomes: one
//! `agents.agent-wait` in flight serves all of them. Whichever pending call is polled drives
//! it; when it reports a batch, each outcome is kept for its call and that call woken. A call
//! dropped before its outcome came (its `parallel` was aborted, say) has the outcome
//! discarded when it comes; the host runs it to its end (and journals it) while a later
//! `agent-wait` is in flight.

use crate::__bindings::agent::factory::{agents, types as wit};
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll, Waker};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

type Outcome = Result<Option<String>, wit::Abort>;
type Wait = Pin<Box<dyn Future<Output = Vec<wit::Finished>>>>;

#[derive(Default)]
struct Waiting {
    /// The `agent-wait` in flight, if any.
    wait: Option<Wait>,
    /// Outcomes reported and not yet taken by their call.
    outcomes: HashMap<u32, Outcome>,
    /// The pending calls polled so far, to wake when their outcome comes.
    wakers: HashMap<u32, Waker>,
    /// Calls dropped while pending: their outcomes are discarded.
    abandoned: HashSet<u32>,
}

thread_local! {
    static WAITING: RefCell<Waiting> = RefCell::new(Waiting::default());
}

/// A call `agent-start` answered with `pending(id)`: its outcome.
pub(crate) struct Pending {
    id: u32,
    done: bool,
}

impl Pending {
    pub(crate) fn new(id: u32) -> Self {
        Pending { id, done: false }
    }
}

impl Future for Pending {
    type Output = Outcome;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Outcome> {
        let id = self.id;
        loop {
            let wait = WAITING.with(|w| {
                let mut w = w.borrow_mut();
                match w.outcomes.remove(&id) {
                    Some(outcome) => {
                        w.wakers.remove(&id);
                        Err(outcome)
                    }
                    None => Ok(w.wait.take()),
                }
            });
            let mut wait = match wait {
                Err(outcome) => {
                    self.done = true;
                    return Poll::Ready(outcome);
                }
                Ok(wait) => wait.unwrap_or_else(|| Box::pin(agents::agent_wait())),
            };
            // Polled outside the borrow: the import's future does not call back into this.
            match wait.as_mut().poll(cx) {
                Poll::Pending => {
                    WAITING.with(|w| {
                        let mut w = w.borrow_mut();
                        w.wait = Some(wait);
                        w.wakers.insert(id, cx.waker().clone());
                    });
                    return Poll::Pending;
                }
                Poll::Ready(finished) => {
                    if finished.is_empty() {
                        // The host has no call pending, so this one's outcome will never come.
                        self.done = true;
                        return Poll::Ready(Err(wit::Abort::InvalidCall(format!(
                            "agent call {id} was started but the host reports no pending call"
                        ))));
                    }
                    let next = WAITING.with(|w| {
                        let mut w = w.borrow_mut();
                        for f in finished {
                            if w.abandoned.remove(&f.call) {
                                continue;
                            }
                            if let Some(waker) = w.wakers.remove(&f.call) {
                                waker.wake();
                            }
                            w.outcomes.insert(f.call, f.outcome);
                        }
                        // This call is done: a call still pending makes the next wait.
                        match w.outcomes.contains_key(&id) {
                            true => w.wakers.values().next().cloned(),
                            false => None,
                        }
                    });
                    if let Some(waker) = next {
                        waker.wake();
                    }
                }
            }
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let id = self.id;
        let (next, idle) = WAITING.with(|w| {
            let mut w = w.borrow_mut();
            w.wakers.remove(&id);
            if w.outcomes.remove(&id).is_none() {
                w.abandoned.insert(id);
            }
            // The wait in flight may wake only this call's task: hand it to another one, or
            // cancel it when no call waits any more (a task must not end with it in flight).
            match w.wakers.values().next() {
                Some(waker) if w.wait.is_some() => (Some(waker.clone()), None),
                Some(_) => (None, None),
                None => (None, w.wait.take()),
            }
        });
        if let Some(waker) = next {
            waker.wake();
        }
        drop(idle);
    }
}
