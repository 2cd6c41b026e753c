//! The agent calls of a run in flight, owned by the runner rather than by QuickJS: this
//! module holds the calls `agents.agent-start` left pending (by the host's id), the one
//! `agents.agent-wait` in flight that reports them, the outcomes that came back and not yet
//! handed to JS, and the [`Driven`] future that wraps a run to collect outcomes in batches.
//!
//! `ctx.agent` calls `__factory_native.agentStart`, which starts the call with the
//! synchronous `agent-start` and answers an id (the JS side keeps the call's promise under
//! it); a memo hit or a reply the host had at once is done then. Every outcome is kept until
//! the next time JS runs, when `__factory_settle` gets all of them in one call. [`Driven`]
//! collects outcomes without entering JS while the host has more of them ready (it asks the
//! async runtime to poll again, which first delivers the host's pending events), so a
//! fan-out's thousand replies are settled in a few passes instead of one pass (an engine
//! entry, its promise jobs) each.
//!
//! It also parks a run that waits on nothing the host does (a body awaiting only
//! `ctx.signal`, or a promise that never settles): with no agent call and no sleep in flight,
//! [`Driven`] keeps one long `agents.sleep` in flight (the host ends it at once when the run
//! stops), so the task always waits on the host, burning no fuel, until the run is
//! cancelled, paused or times out; then the run's signal fires, and a body still waiting on
//! nothing ends (the host records the stop's cause, whatever the runner returns).

use crate::bindings::agent::factory::agents;
use crate::bindings::agent::factory::types::{Abort, AgentOptions, Finished, Started};
use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// What one call came back with.
pub type Outcome = Result<Option<String>, Abort>;

type Wait = Pin<Box<dyn Future<Output = Vec<Finished>>>>;

/// How many outcomes wait for JS at most before the run enters it anyway.
const MAX_BATCH: usize = 1024;

/// How long one park sleep lasts (then the next one starts); the host ends it at once when
/// the run stops, so its length only bounds how often an idle run wakes.
const PARK_MS: u64 = 3_600_000;

#[derive(Default)]
struct Calls {
    /// The pending calls: the host's id to the JS id.
    running: HashMap<u32, u32>,
    /// The `agent-wait` in flight, if any.
    wait: Option<Wait>,
    /// Outcomes not yet handed to JS, with their call ids.
    done: Vec<(u32, Outcome)>,
    /// Ids free for reuse (JS indexes arrays by them, so they stay dense).
    free: Vec<u32>,
    next: u32,
    /// The `agents.sleep` calls of timers and `ctx.sleep` in flight.
    sleeping: usize,
    /// The park sleep in flight, while the run waits on nothing else.
    park: Option<Pin<Box<dyn Future<Output = ()>>>>,
    /// The run is stopping and JS has not been told since a park saw it.
    stop_check: bool,
    /// A park saw the run stopping (and JS was told).
    stopped: bool,
}

thread_local! {
    static CALLS: RefCell<Calls> = RefCell::new(Calls::default());
}

/// Start one agent call; its id. A call `agent-start` answers at once (a memo hit: a
/// replayed or repeated call) is done at once; its outcome is settled with the others.
pub fn start(prompt: String, options: AgentOptions) -> u32 {
    let started = agents::agent_start(&prompt, &options);
    CALLS.with(|calls| {
        let mut calls = calls.borrow_mut();
        let id = match calls.free.pop() {
            Some(id) => id,
            None => {
                calls.next += 1;
                calls.next - 1
            }
        };
        match started {
            Ok(Started::Pending(host_id)) => {
                calls.running.insert(host_id, id);
            }
            Ok(Started::Reply(reply)) => calls.done.push((id, Ok(reply))),
            Err(abort) => calls.done.push((id, Err(abort))),
        }
        id
    })
}

/// Poll the `agent-wait` in flight (made when calls are pending and none is); how many
/// outcomes that collected.
fn collect(cx: &mut Context<'_>) -> usize {
    let mut collected = 0;
    loop {
        let wait = CALLS.with(|calls| {
            let mut calls = calls.borrow_mut();
            if calls.running.is_empty() {
                return None;
            }
            Some(calls.wait.take().unwrap_or_else(|| Box::pin(agents::agent_wait())))
        });
        let Some(mut wait) = wait else { return collected };
        // Polled outside the borrow: the import's future does not call back into this.
        let finished = match wait.as_mut().poll(cx) {
            Poll::Pending => {
                CALLS.with(|calls| calls.borrow_mut().wait = Some(wait));
                return collected;
            }
            Poll::Ready(finished) => finished,
        };
        CALLS.with(|calls| {
            let mut calls = calls.borrow_mut();
            if finished.is_empty() {
                // The host has no call pending: the ones kept here will never be answered.
                let lost: Vec<u32> = calls.running.drain().map(|(_, id)| id).collect();
                for id in lost {
                    let message = "the agent call was started but the host reports no pending call".to_string();
                    calls.done.push((id, Err(Abort::InvalidCall(message))));
                    collected += 1;
                }
            }
            for f in finished {
                if let Some(id) = calls.running.remove(&f.call) {
                    calls.done.push((id, f.outcome));
                    collected += 1;
                }
            }
        });
    }
}

/// Count one `agents.sleep` in flight until the guard goes (the sleep ended or was dropped).
pub fn sleeping() -> impl Drop {
    struct Sleeping;
    impl Drop for Sleeping {
        fn drop(&mut self) {
            CALLS.with(|calls| calls.borrow_mut().sleeping -= 1);
        }
    }
    CALLS.with(|calls| calls.borrow_mut().sleeping += 1);
    Sleeping
}

/// Whether JS must poll the run's stop reason now (a park saw the run stopping); once.
pub fn take_stop_check() -> bool {
    CALLS.with(|calls| std::mem::take(&mut calls.borrow_mut().stop_check))
}

/// The run waits on nothing the host does: keep a park sleep in flight. `Ready` when the
/// run stopped and JS was already told, yet it still waits on nothing: it never ends.
fn park(cx: &mut Context<'_>) -> Poll<()> {
    loop {
        let park = CALLS.with(|calls| {
            let mut calls = calls.borrow_mut();
            let idle = calls.running.is_empty() && calls.done.is_empty() && calls.sleeping == 0;
            if !idle {
                return None;
            }
            Some(calls.park.take().unwrap_or_else(|| Box::pin(agents::sleep(PARK_MS))))
        });
        let Some(mut park) = park else { return Poll::Pending };
        if CALLS.with(|calls| calls.borrow().stopped) {
            return Poll::Ready(());
        }
        // Polled outside the borrow, as in `collect`.
        if park.as_mut().poll(cx).is_pending() {
            CALLS.with(|calls| calls.borrow_mut().park = Some(park));
            return Poll::Pending;
        }
        if crate::bindings::agent::factory::ctx::stop_reason().is_some() {
            CALLS.with(|calls| {
                let mut calls = calls.borrow_mut();
                calls.stop_check = true;
                calls.stopped = true;
            });
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
    }
}

/// The outcomes waiting for JS (their ids stay taken until [`release`]).
pub fn take_done() -> Vec<(u32, Outcome)> {
    CALLS.with(|calls| std::mem::take(&mut calls.borrow_mut().done))
}

/// The ids of settled calls, free again.
pub fn release(ids: impl IntoIterator<Item = u32>) {
    CALLS.with(|calls| calls.borrow_mut().free.extend(ids));
}

/// Forget every call of the run (the `agent-wait` in flight is cancelled; the host ends the
/// calls with the run).
pub fn clear() {
    let calls = CALLS.with(|calls| std::mem::take(&mut *calls.borrow_mut()));
    drop(calls);
}

/// A run's future, with its agent calls driven around it: the calls are polled before and
/// after each poll of the run, and while polling them collects new outcomes the run is not
/// polled (its JS not entered): the runtime is asked to poll again at once, after handing
/// over whatever else the host has ready. A run that waits on nothing is parked; one that
/// still waits on nothing once it was told it stopped ends with `stuck`, the runner's
/// encoded error outcome.
pub struct Driven<F>(pub Pin<Box<F>>, pub fn() -> String);

impl<F: Future<Output = rquickjs::Result<String>>> Future for Driven<F> {
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
            return Poll::Pending;
        }
        match park(cx) {
            Poll::Ready(()) => Poll::Ready(Ok((self.1)())),
            Poll::Pending => Poll::Pending,
        }
    }
}
