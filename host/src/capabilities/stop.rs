//! The stop signal of one attempt: fired once (a cancel, a limit, a shutdown, a failure),
//! awaited by whatever must end with the attempt (the guest's store, its sleeps and waits),
//! and checked by every hook call before it does anything. A [`CancellationToken`] to await,
//! beside a flag to check: the token's own check takes its lock, the flag is one load.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

/// An attempt's stop signal; clones share it.
#[derive(Clone, Default)]
pub(crate) struct StopSignal(Arc<Signal>);

#[derive(Default)]
struct Signal {
    /// Set before the token fires, so whoever wakes from the token sees it set.
    fired: AtomicBool,
    token: CancellationToken,
}

impl StopSignal {
    /// A signal not fired yet.
    pub(crate) fn new() -> StopSignal {
        StopSignal::default()
    }

    /// Fire the signal (again is a no-op).
    pub(crate) fn cancel(&self) {
        self.0.fired.store(true, Ordering::Release);
        self.0.token.cancel();
    }

    /// Whether the signal has fired.
    pub(crate) fn is_cancelled(&self) -> bool {
        self.0.fired.load(Ordering::Acquire)
    }

    /// Resolves once the signal has fired.
    pub(crate) fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.0.token.cancelled()
    }
}

impl std::fmt::Debug for StopSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StopSignal").field("fired", &self.is_cancelled()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_fired_signal_is_seen_by_every_clone_and_wakes_its_waiters() {
        let signal = StopSignal::new();
        let clone = signal.clone();
        assert!(!clone.is_cancelled());
        let waiter = tokio::spawn(async move {
            clone.cancelled().await;
            clone.is_cancelled()
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "nothing fired yet");
        signal.cancel();
        assert!(signal.is_cancelled());
        let seen =
            tokio::time::timeout(Duration::from_secs(60), waiter).await.expect("the waiter woke").expect("it ran");
        assert!(seen, "the waiter woke with the flag set");
        signal.cancel();
        assert!(signal.is_cancelled(), "firing again changes nothing");
    }
}
