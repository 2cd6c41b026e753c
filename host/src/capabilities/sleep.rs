//! Sleep (`agents.sleep`): the guest's only clock. A sleep counts as active time (the
//! attempt's clock and its deadline keep running). Once the attempt is stopping
//! (cancellation, a limit, the deadline) a sleep ends at once, so the guest sees the stop
//! (the JS runner fires `ctx.signal`) within the stop grace
//! ([`crate::engine::run::STOP_GRACE`]); then the store, and this future, go. No per-run
//! state.

use super::attempt::Attempt;
use std::time::Duration;

/// Sleep `ms` milliseconds on the host's timer, or until the attempt stops.
pub(crate) async fn sleep(attempt: &Attempt, ms: u64) {
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_millis(ms)) => {}
        _ = attempt.stop_signal().cancelled() => {}
    }
}
