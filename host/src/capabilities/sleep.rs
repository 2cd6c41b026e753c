//! Sleep (`agents.sleep`): the guest's only clock. A sleep counts as active time (the
//! attempt's clock and its deadline keep running), and the attempt's stop (cancellation, a
//! limit, the deadline) drops the store and with it this future mid-sleep. No per-run state.

use super::attempt::Attempt;
use std::time::Duration;

/// Sleep `ms` milliseconds on the host's timer.
pub(crate) async fn sleep(_attempt: &Attempt, ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}
