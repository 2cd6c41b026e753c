//! Pending agent calls are bounded in host memory: a guest that starts thousands of calls
//! with megabyte prompts behind one concurrency slot cannot make the host hold a copy of
//! each. Its own test binary, so the process's peak RSS is this test's alone.

mod common;

use common::counting::{Counting, Shared};
use factory_host::sandbox::SandboxLimits;
use factory_host::{Host, HostConfig, Limits, ProgressEvent, RunEnvelope, RunOptions, RunStatus};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// A field of `/proc/self/status`, in KiB.
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status (Linux)");
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.trim().strip_suffix("kB")?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

/// A host with `sandbox` on `backend`, and the hostile guest loaded on it.
async fn hostile_on(backend: Arc<Counting>, sandbox: SandboxLimits) -> (Host, factory_host::Factory) {
    let host = Host::new(HostConfig {
        backend: Arc::new(Shared(backend)),
        cache_dir: Some(common::guest_target_dir().join("cache")),
        sandbox,
        ..HostConfig::default()
    })
    .expect("host");
    let hostile = host.load_file(&common::component("hostile")).await.expect("loading hostile");
    (host, hostile)
}

fn failure_kind(envelope: &RunEnvelope) -> (factory_host::FailureType, Option<String>) {
    let failure = envelope.failure.as_ref().unwrap_or_else(|| panic!("a failure: {envelope:#?}"));
    (failure.kind_type, failure.kind.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_pending_megabyte_prompts_keep_host_memory_under_twice_the_guest_limit() {
    let sandbox = SandboxLimits::default();
    let guest_limit_kib = sandbox.memory_bytes as u64 / 1024;
    // A backend slow enough that no call ends while the guest piles them up.
    let backend = Counting::with_latency(Duration::from_secs(600));
    let (host, hostile) = hostile_on(backend.clone(), sandbox).await;
    // Start from the steady state after loading: reset the peak, then measure from here.
    std::fs::write("/proc/self/clear_refs", "5").expect("resetting the peak RSS");
    let before = status_kib("VmRSS:");

    let args = json!({ "case": "pending-prompts", "n": 10_000, "bytes": (1 << 20) - 64 });
    let limits = Limits { max_concurrent_subagents: Some(1), ..Limits::default() };
    let envelope = tokio::time::timeout(
        Duration::from_secs(300),
        host.run(&hostile, RunOptions { args: Some(args), limits, ..Default::default() }),
    )
    .await
    .expect("the run ends (hang guard)")
    .expect("the run exists");
    let grown = status_kib("VmHWM:").saturating_sub(before);
    eprintln!("host RSS grew {} MiB (bound {} MiB)", grown / 1024, 2 * guest_limit_kib / 1024);

    assert_eq!(envelope.status, RunStatus::Error, "{envelope:#?}");
    assert_eq!(failure_kind(&envelope), (factory_host::FailureType::SandboxLimit, Some("maxPendingAgentBytes".into())));
    let message = &envelope.failure.as_ref().unwrap().message;
    assert!(message.contains(&format!("over the {} byte limit", 128 << 20)), "{message}");
    assert!(
        grown < 2 * guest_limit_kib,
        "host RSS grew {} MiB, over twice the guest memory limit ({} MiB)",
        grown / 1024,
        guest_limit_kib / 1024
    );
    // Only the one slot's call reached the backend.
    assert!(backend.total() <= 1, "{} backend calls", backend.total());
}

/// A host with the hostile guest on a counting backend answering after `latency`, with
/// per-run and per-host pending-byte bounds of 8 and 12 MiB.
async fn small_bounds_host(latency: Duration) -> (Host, factory_host::Factory) {
    let sandbox = SandboxLimits {
        max_pending_agent_bytes: 8 << 20,
        max_host_pending_agent_bytes: 12 << 20,
        ..SandboxLimits::default()
    };
    hostile_on(Counting::with_latency(latency), sandbox).await
}

/// `n` calls of about 1 MiB each, all pending at once behind one concurrency slot.
fn megabyte_calls(n: u64) -> RunOptions {
    RunOptions {
        args: Some(json!({ "case": "pending-prompts", "n": n, "bytes": (1 << 20) - 64 })),
        limits: Limits { max_concurrent_subagents: Some(1), ..Limits::default() },
        ..Default::default()
    }
}

/// A backend slow enough that no call ends while a run piles its calls up.
const SLOW: Duration = Duration::from_secs(600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_per_run_bound_admits_what_fits_and_stops_what_does_not() {
    let (host, hostile) = small_bounds_host(Duration::from_millis(1)).await;
    let envelope = host.run(&hostile, megabyte_calls(7)).await.expect("the run exists");
    assert_eq!(envelope.status, RunStatus::Completed, "{envelope:#?}");
    assert_eq!(envelope.result_value().unwrap()["done"], 7);
    let (host, hostile) = small_bounds_host(SLOW).await;
    for _ in 0..2 {
        // The second time too: the first run gave back every byte (else the host's 12 MiB
        // would stop the second one first, with `maxHostPendingAgentBytes`).
        let envelope = host.run(&hostile, megabyte_calls(9)).await.expect("the run exists");
        assert_eq!(
            failure_kind(&envelope),
            (factory_host::FailureType::SandboxLimit, Some("maxPendingAgentBytes".into()))
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_started_and_never_waited_for_stay_pending_under_the_same_bound() {
    // `agent-start` leaves each call pending in the host until an `agent-wait` reports it:
    // a guest that starts 9 calls of ~1 MiB and never waits crosses the run's 8 MiB.
    let (host, hostile) = small_bounds_host(SLOW).await;
    let started = |n: u64| RunOptions {
        args: Some(json!({ "case": "started-prompts", "n": n, "bytes": (1 << 20) - 64 })),
        limits: Limits { max_concurrent_subagents: Some(1), ..Limits::default() },
        ..Default::default()
    };
    for _ in 0..2 {
        // Twice: the run that stopped gave its bytes back with its store.
        let envelope = host.run(&hostile, started(9)).await.expect("the run exists");
        assert_eq!(
            failure_kind(&envelope),
            (factory_host::FailureType::SandboxLimit, Some("maxPendingAgentBytes".into()))
        );
    }
    // Within the bound, the run ends with its started calls still pending (ended with it).
    let envelope = host.run(&hostile, started(7)).await.expect("the run exists");
    assert_eq!(envelope.status, RunStatus::Completed, "{envelope:#?}");
    assert_eq!(envelope.result_value().unwrap()["started"], 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_wide_bound_stops_the_run_that_crosses_it_and_gives_its_bytes_back() {
    // Two runs of 7 calls of ~1 MiB on a backend that answers none of them: each is within
    // its own 8 MiB, together they cross the host's 12 MiB. The second starts once the first
    // holds all 7 (one started, six queued for the slot), so the second is the one that
    // crosses it (at its fifth call), whatever the timing.
    let (host, hostile) = small_bounds_host(SLOW).await;
    let host = Arc::new(host);
    let (events, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let first = {
        let (host, hostile) = (host.clone(), hostile.clone());
        tokio::spawn(async move { host.run(&hostile, RunOptions { events: Some(events), ..megabyte_calls(7) }).await })
    };
    let piled = tokio::time::timeout(Duration::from_secs(120), async {
        let mut entered = 0;
        while entered < 7 {
            match seen.recv().await.map(|entry| entry.event) {
                Some(ProgressEvent::AgentStarted { .. } | ProgressEvent::AgentQueued { .. }) => entered += 1,
                Some(_) => {}
                None => break,
            }
        }
        entered
    })
    .await
    .expect("the first run piles its calls up (hang guard)");
    assert_eq!(piled, 7, "the first run holds its 7 calls");
    let second = tokio::time::timeout(Duration::from_secs(120), host.run(&hostile, megabyte_calls(7)))
        .await
        .expect("the second run is stopped by the host's bound (hang guard)")
        .expect("the run exists");
    assert_eq!(
        failure_kind(&second),
        (factory_host::FailureType::SandboxLimit, Some("maxHostPendingAgentBytes".into()))
    );
    // The first is still waiting on the backend: cancel it.
    assert!(!first.is_finished(), "the first run still waits");
    let runs = host.runs(factory_host::DEFAULT_SESSION).await.unwrap();
    let waiting = runs.into_iter().find(|e| e.run_id != second.run_id).expect("the first run");
    let cancelled = host.cancel(factory_host::DEFAULT_SESSION, &waiting.run_id).await.expect("cancel");
    assert_eq!(cancelled.status, RunStatus::Cancelled);
    let ended = first.await.expect("the run task").expect("the run exists");
    assert_eq!(ended.status, RunStatus::Cancelled, "{ended:#?}");
    // Every byte was given back: a run of 9 meets its own bound, not the host's.
    let envelope = host.run(&hostile, megabyte_calls(9)).await.expect("the run exists");
    assert_eq!(failure_kind(&envelope), (factory_host::FailureType::SandboxLimit, Some("maxPendingAgentBytes".into())));
}
