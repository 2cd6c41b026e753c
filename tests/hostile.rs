//! The hostile-guest suite (issue 4, items 5 and 6): `tests/guests/hostile` misbehaves in
//! one way per test (spins, exhausts memory, overflows its stack, floods the log, returns or
//! journals oversized values, panics, over-fans-out, ignores cancellation and aborts), and
//! each test asserts the typed failure the host ends the run with, and that a well-behaved
//! run (`examples/review-changed` on a backend with latency) started at the same time on the
//! same `Host` completes unharmed. The last tests measure the concurrency and total caps
//! with a counting backend.

mod common;

use factory_host::backend::{AgentBackend, AgentReply, AgentRequest, BackendError, Usage};
use factory_host::sandbox::SandboxLimits;
use factory_host::store::ProgressQuery;
use factory_host::{
    Factory, Host, HostConfig, Limits, ProgressEvent, RunEnvelope, RunOptions, RunStatus, DEFAULT_SESSION,
};
use futures::future::BoxFuture;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Labels of the hostile guest's agent calls start with this; the companion's with `review:`.
const HOSTILE: &str = "h:";

/// The files the companion reviews (one subagent each).
const FILES: [&str; 3] = ["a.rs", "b.rs", "c.rs"];

/// A backend that answers every call after `latency`, records every call's label, and
/// records the most hostile-guest calls (labels starting with [`HOSTILE`]) ever in flight
/// at once. It is the boundary, not the thing under test.
#[derive(Default)]
struct Counting {
    latency: Duration,
    labels: Mutex<Vec<String>>,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
    /// Hold hostile calls until this many are in flight at once (0: no gate), so a test
    /// can tell "the cap was reached" from "the calls happened not to overlap".
    hold_until: u64,
    opened: std::sync::atomic::AtomicBool,
    open: tokio::sync::Notify,
}

impl Counting {
    /// Calls whose label starts with `prefix`.
    fn calls(&self, prefix: &str) -> usize {
        self.labels.lock().unwrap().iter().filter(|l| l.starts_with(prefix)).count()
    }

    fn max_in_flight(&self) -> u64 {
        self.max_in_flight.load(Ordering::SeqCst)
    }
}

struct Shared(Arc<Counting>);

impl AgentBackend for Shared {
    fn name(&self) -> String {
        "counting".into()
    }

    fn call(&self, request: Arc<AgentRequest>) -> BoxFuture<'static, Result<AgentReply, BackendError>> {
        let me = self.0.clone();
        Box::pin(async move {
            let label = request.label.clone().unwrap_or_default();
            me.labels.lock().unwrap().push(label.clone());
            let hostile = label.starts_with(HOSTILE);
            let mut now = 0;
            if hostile {
                now = me.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                me.max_in_flight.fetch_max(now, Ordering::SeqCst);
            }
            // Decrement on drop too: the host may abandon a call when it stops a run.
            struct Leave<'a>(&'a AtomicU64, bool);
            impl Drop for Leave<'_> {
                fn drop(&mut self) {
                    if self.1 {
                        self.0.fetch_sub(1, Ordering::SeqCst);
                    }
                }
            }
            let _leave = Leave(&me.in_flight, hostile);
            if hostile {
                common::counting::wait_at_gate(me.hold_until, now, &me.opened, &me.open).await;
            }
            if !me.latency.is_zero() {
                tokio::time::sleep(me.latency).await;
            }
            // The companion declares a credit budget: report (zero-cost) usage.
            let usage = Usage::tokens(1, 1, Some(0));
            Ok(AgentReply::new(format!("[{label}] reviewed"), Some(usage)))
        })
    }
}

/// One host with the hostile guest and the companion loaded, on a counting backend.
struct Fixture {
    host: Host,
    backend: Arc<Counting>,
    hostile: Factory,
    companion: Factory,
}

async fn fixture_with(sandbox: SandboxLimits, latency: Duration) -> Fixture {
    fixture_gated(sandbox, latency, 0).await
}

/// Like [`fixture_with`], with the backend holding hostile calls until `hold_until` of them
/// are in flight at once.
async fn fixture_gated(sandbox: SandboxLimits, latency: Duration, hold_until: u64) -> Fixture {
    let backend = Arc::new(Counting { latency, hold_until, ..Default::default() });
    let host = Host::new(HostConfig {
        backend: Arc::new(Shared(backend.clone())),
        cache_dir: Some(common::guest_target_dir().join("cache")),
        sandbox,
        ..HostConfig::default()
    })
    .expect("host");
    let hostile = host.load_file(&common::component("hostile")).await.expect("loading hostile");
    let companion = host.load_file(&common::component("review-changed")).await.expect("loading review-changed");
    Fixture { host, backend, hostile, companion }
}

/// Default sandbox limits, 20 ms of backend latency.
async fn fixture() -> Fixture {
    fixture_with(SandboxLimits::default(), Duration::from_millis(20)).await
}

fn hostile_options(args: Value, limits: Limits) -> RunOptions {
    RunOptions { args: Some(args), limits, ..Default::default() }
}

/// Run the hostile guest with `options` and the companion at the same time on the same
/// host; assert the companion completed unharmed. Returns the hostile run's envelope and
/// how long it took.
async fn against_companion(fx: &Fixture, options: RunOptions) -> (RunEnvelope, Duration) {
    let hostile = async {
        let started = Instant::now();
        let envelope = fx.host.run(&fx.hostile, options).await.expect("the hostile run exists");
        (envelope, started.elapsed())
    };
    let companion =
        fx.host.run(&fx.companion, RunOptions { args: Some(json!({ "files": FILES })), ..Default::default() });
    let ((envelope, took), companion) = tokio::join!(hostile, companion);
    assert_unharmed(fx, &companion.expect("the companion run exists"));
    (envelope, took)
}

/// The companion completed with one review per file from the backend.
fn assert_unharmed(fx: &Fixture, envelope: &RunEnvelope) {
    assert_eq!(envelope.status, RunStatus::Completed, "the companion run was harmed: {envelope:#?}");
    assert!(envelope.failure.is_none(), "{envelope:#?}");
    let result = envelope.result_value();
    let reviews = result.as_ref().and_then(|r| r["reviews"].as_array()).expect("reviews");
    assert_eq!(reviews.len(), FILES.len(), "{reviews:?}");
    for (review, file) in reviews.iter().zip(FILES) {
        assert_eq!(review["file"], file);
        assert_eq!(review["review"], format!("[review:{file}] reviewed"), "{review}");
    }
    assert_eq!(envelope.accounting.agents_spawned, FILES.len() as u64);
    assert!(fx.backend.calls("review:") >= FILES.len());
}

/// The run ended with status `error` and failure `type`/`kind`; returns the message.
fn assert_failure(envelope: &RunEnvelope, kind_type: factory_host::FailureType, kind: Option<&str>) -> String {
    assert_eq!(envelope.status, RunStatus::Error, "{envelope:#?}");
    let failure = envelope.failure.as_ref().expect("a failure");
    assert_eq!(failure.kind_type, kind_type, "{failure:#?}");
    assert_eq!(failure.kind.as_deref(), kind, "{failure:#?}");
    assert!(envelope.result.is_none(), "a failed run has no result: {envelope:#?}");
    failure.message.clone()
}

/// The run's `ctx.log` lines, read page by page.
async fn log_lines(host: &Host, envelope: &RunEnvelope) -> Vec<String> {
    let mut lines = Vec::new();
    let mut after = 0;
    loop {
        let query = ProgressQuery { after_seq: Some(after), limit: Some(1000), ..Default::default() };
        let page = host.progress(DEFAULT_SESSION, &envelope.run_id, &query).await.expect("progress");
        let Some(last) = page.last() else { break };
        after = last.seq;
        lines.extend(page.into_iter().filter_map(|entry| match entry.event {
            ProgressEvent::Log { message, .. } => Some(message),
            _ => None,
        }));
    }
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spinning_guest_stops_at_its_timeout() {
    let fx = fixture().await;
    let limits = Limits { timeout_seconds: Some(0.5), ..Default::default() };
    let (envelope, took) = against_companion(&fx, hostile_options(json!({ "case": "spin" }), limits)).await;
    assert_failure(&envelope, factory_host::FailureType::FactoryLimitReached, Some("timeoutSeconds"));
    // How soon after its budget it stops is measured by the bench, not asserted here.
    assert!(envelope.accounting.active_seconds >= 0.5, "stopped before its budget: {envelope:#?}");
    eprintln!("a 0.5 s timeout stopped the spinning guest after {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spinning_guest_runs_out_of_fuel() {
    // Plenty for the companion (and for `meta`); a fraction of a second of spinning, long
    // enough for the spin to overlap the whole companion run.
    let sandbox = SandboxLimits { fuel: 2_000_000_000, ..Default::default() };
    let fx = fixture_with(sandbox, Duration::from_millis(20)).await;
    let (envelope, took) = against_companion(&fx, hostile_options(json!({ "case": "spin" }), Limits::default())).await;
    assert_failure(&envelope, factory_host::FailureType::SandboxLimit, Some("fuel"));
    eprintln!("2G fuel ran out after {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_bomb_hits_the_memory_cap() {
    let fx = fixture().await;
    let (envelope, _) = against_companion(&fx, hostile_options(json!({ "case": "memory" }), Limits::default())).await;
    assert_failure(&envelope, factory_host::FailureType::SandboxLimit, Some("memory"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_recursion_overflows_the_stack_as_a_typed_failure() {
    let fx = fixture().await;
    let (envelope, _) =
        against_companion(&fx, hostile_options(json!({ "case": "recursion" }), Limits::default())).await;
    assert_failure(&envelope, factory_host::FailureType::SandboxLimit, Some("stack"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_flood_is_capped_and_counted() {
    let fx = fixture().await;
    let max = fx.host.sandbox_limits().max_log_lines;
    let n = 2_000_000;
    let (envelope, _) =
        against_companion(&fx, hostile_options(json!({ "case": "log-flood", "n": n }), Limits::default())).await;
    // Over the cap, lines are dropped and counted (the documented behaviour), not a failure.
    assert_eq!(envelope.status, RunStatus::Completed, "{envelope:#?}");
    assert_eq!(envelope.result_value(), Some(json!({ "logged": n })));
    let lines = log_lines(&fx.host, &envelope).await;
    assert_eq!(lines.len(), max, "the host kept exactly max_log_lines lines");
    assert_eq!(lines.first().map(String::as_str), Some("flood 0"));
    assert_eq!(lines.last().cloned(), Some(format!("flood {}", max - 1)), "the first lines are kept");
    let note = envelope.error.as_deref().unwrap_or_default();
    assert!(note.contains(&format!("{} log lines over the cap were dropped", n - max)), "{envelope:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_log_lines_are_truncated() {
    let fx = fixture().await;
    let cap = fx.host.sandbox_limits().max_log_line_bytes;
    let args = json!({ "case": "long-logs", "n": 20, "bytes": 1 << 20 });
    let (envelope, _) = against_companion(&fx, hostile_options(args, Limits::default())).await;
    assert_eq!(envelope.status, RunStatus::Completed, "{envelope:#?}");
    let lines = log_lines(&fx.host, &envelope).await;
    assert_eq!(lines.len(), 20);
    for line in lines {
        assert!(line.ends_with(" [truncated]"), "{}", &line[line.len().saturating_sub(40)..]);
        assert!(line.len() <= cap + " [truncated]".len(), "a retained line is {} bytes", line.len());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_text_a_run_keeps_is_capped_in_bytes() {
    let fx = fixture().await;
    let line = fx.host.sandbox_limits().max_log_line_bytes;
    // 32 MiB of log lines, each within the per-line cap, far under the line-count cap.
    let n = (32 << 20) / line;
    let args = json!({ "case": "long-logs", "n": n, "bytes": line });
    let (envelope, _) = against_companion(&fx, hostile_options(args, Limits::default())).await;
    // Over the byte cap, lines are dropped and counted, as over the line cap: the run
    // completes with everything the guest said it logged.
    assert_eq!(envelope.status, RunStatus::Completed, "{envelope:#?}");
    assert_eq!(envelope.result_value(), Some(json!({ "logged": n })));
    let lines = log_lines(&fx.host, &envelope).await;
    let kept: usize = lines.iter().map(String::len).sum();
    let cap = fx.host.sandbox_limits().max_log_bytes;
    assert!(lines.iter().all(|l| l.len() == line), "every kept line is whole (no truncation at this size)");
    // The cap is a multiple of the line size: it is filled exactly, and the rest dropped.
    assert_eq!(cap % line, 0);
    assert_eq!(kept, cap, "the host keeps exactly the cap's worth of one run's log");
    assert_eq!(lines.len(), cap / line);
    let note = envelope.error.as_deref().unwrap_or_default();
    assert!(note.contains(&format!("{} log lines over the cap were dropped", n - cap / line)), "{envelope:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_result_is_refused_by_size() {
    let fx = fixture().await;
    let args = json!({ "case": "huge-result", "n": 32 << 20 });
    let (envelope, _) = against_companion(&fx, hostile_options(args, Limits::default())).await;
    let message = assert_failure(&envelope, factory_host::FailureType::SandboxLimit, Some("maxResultBytes"));
    assert!(message.contains(&format!("over the {} byte limit", 16 << 20)), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_detail_reads_a_bounded_window_of_a_long_history() {
    let fx = fixture_with(SandboxLimits::default(), Duration::ZERO).await;
    // More agent calls than a detail lists, then more log lines than it reads.
    let agents = factory_host::DETAIL_AGENTS + 500;
    let (envelope, _) =
        against_companion(&fx, hostile_options(json!({ "case": "raw-fanout", "n": agents }), Limits::default())).await;
    assert_eq!(envelope.status, RunStatus::Completed, "{envelope:#?}");
    let detail = fx.host.detail(DEFAULT_SESSION, &envelope.run_id).await.expect("detail");
    assert_eq!(detail.agents.len(), factory_host::DETAIL_AGENTS, "the newest agent summaries only");
    assert!(detail.truncated);

    let lines = factory_host::DETAIL_SCAN_ENTRIES * 3;
    let (envelope, _) =
        against_companion(&fx, hostile_options(json!({ "case": "log-flood", "n": lines }), Limits::default())).await;
    assert_eq!(envelope.status, RunStatus::Completed, "{envelope:#?}");
    let detail = fx.host.detail(DEFAULT_SESSION, &envelope.run_id).await.expect("detail");
    assert!(detail.truncated, "a history longer than the window is said to be cut");
    assert!(!detail.progress.is_empty());
    // A short run's detail is whole.
    let (envelope, _) =
        against_companion(&fx, hostile_options(json!({ "case": "log-flood", "n": 10 }), Limits::default())).await;
    let detail = fx.host.detail(DEFAULT_SESSION, &envelope.run_id).await.expect("detail");
    assert!(!detail.truncated);
    assert_eq!(detail.phases, vec!["Attack".to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_nested_too_deep_is_refused_by_depth() {
    let fx = fixture().await;
    let args = json!({ "case": "deep-result", "n": 200 });
    let (envelope, _) = against_companion(&fx, hostile_options(args, Limits::default())).await;
    let message = assert_failure(&envelope, factory_host::FailureType::SandboxLimit, Some("maxJsonDepth"));
    assert!(message.contains("nested 200 deep"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_json_step_value_is_refused_and_the_run_goes_on() {
    let fx = fixture().await;
    let (envelope, _) = against_companion(&fx, hostile_options(json!({ "case": "bad-step" }), Limits::default())).await;
    // The guest itself checks that `step-put` answered `invalid-json` (else it fails).
    assert_eq!(envelope.status, RunStatus::Completed, "{envelope:#?}");
    let out = envelope.result_value().expect("a result");
    assert!(out["refused"].as_str().is_some_and(|m| m.contains("not JSON")), "{out}");
    assert_eq!(out["badJournaled"], Value::Null, "nothing was journaled under the bad key");
    assert_eq!(out["good"], 7, "a later step still works");
    assert_eq!(out["reply"], "[h:after-bad-step] reviewed", "a later agent call still works");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_step_value_is_a_sandbox_limit_failure() {
    let fx = fixture().await;
    let args = json!({ "case": "big-step", "n": 17 << 20 });
    // The guest ignores the refusal and returns Ok: the recorded failure still wins.
    let (envelope, _) = against_companion(&fx, hostile_options(args, Limits::default())).await;
    assert_eq!(envelope.status, RunStatus::Error, "{envelope:#?}");
    let failure = envelope.failure.as_ref().expect("a failure");
    assert_eq!(failure.kind_type, factory_host::FailureType::SandboxLimit, "{failure:#?}");
    assert!(failure.message.contains(&format!("over the {} byte limit", 16 << 20)), "{failure:#?}");
    assert!(envelope.result.is_none(), "{envelope:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_prompt_is_a_sandbox_limit_failure() {
    let fx = fixture().await;
    let args = json!({ "case": "huge-prompt", "n": 2 << 20 });
    let (envelope, _) = against_companion(&fx, hostile_options(args, Limits::default())).await;
    assert_eq!(envelope.status, RunStatus::Error, "{envelope:#?}");
    let failure = envelope.failure.as_ref().expect("a failure");
    assert_eq!(failure.kind_type, factory_host::FailureType::SandboxLimit, "{failure:#?}");
    assert!(failure.message.contains(&format!("over the {} byte limit", 1 << 20)), "{failure:#?}");
    assert_eq!(fx.backend.calls(HOSTILE), 0, "the oversized prompt never reached the backend");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_limit_failures_from_hooks_name_their_limit() {
    let fx = fixture().await;
    let cases = [
        (json!({ "case": "big-step", "n": 17 << 20 }), "maxStepBytes"),
        (json!({ "case": "huge-prompt", "n": 2 << 20 }), "maxPromptBytes"),
    ];
    for (args, kind) in cases {
        let (envelope, _) = against_companion(&fx, hostile_options(args, Limits::default())).await;
        assert_failure(&envelope, factory_host::FailureType::SandboxLimit, Some(kind));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_is_a_trap() {
    let fx = fixture().await;
    let (envelope, _) = against_companion(&fx, hostile_options(json!({ "case": "panic" }), Limits::default())).await;
    assert_failure(&envelope, factory_host::FailureType::Trap, Some("unreachable"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_4097_item_parallel_is_refused_before_any_agent_runs() {
    let fx = fixture().await;
    let args = json!({ "case": "too-many", "n": 4097 });
    let (envelope, _) = against_companion(&fx, hostile_options(args, Limits::default())).await;
    let message = assert_failure(&envelope, factory_host::FailureType::GuestError, None);
    assert!(message.contains("too many items: 4097"), "{message}");
    assert_eq!(fx.backend.calls(HOSTILE), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_calls_past_the_sdk_item_cap_still_queue_under_the_concurrency_cap() {
    let fx = fixture_gated(SandboxLimits::default(), Duration::from_millis(1), 8).await;
    let limits = Limits { max_concurrent_subagents: Some(8), ..Default::default() };
    let args = json!({ "case": "raw-fanout", "n": 5000 });
    let (envelope, _) = against_companion(&fx, hostile_options(args, limits)).await;
    assert_eq!(envelope.status, RunStatus::Completed, "{envelope:#?}");
    assert_eq!(envelope.result_value(), Some(json!({ "done": 5000 })));
    assert_eq!(fx.backend.calls(HOSTILE), 5000);
    assert_eq!(fx.backend.max_in_flight(), 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_pending_agent_calls_are_a_sandbox_limit() {
    let sandbox = SandboxLimits { max_pending_agent_calls: 100, ..Default::default() };
    let fx = fixture_with(sandbox, Duration::from_millis(1)).await;
    let limits = Limits { max_concurrent_subagents: Some(8), ..Default::default() };
    let args = json!({ "case": "raw-fanout", "n": 5000 });
    let (envelope, _) = against_companion(&fx, hostile_options(args, limits)).await;
    let message = assert_failure(&envelope, factory_host::FailureType::SandboxLimit, Some("maxPendingAgentCalls"));
    assert!(message.contains("more than 100 agent calls pending"), "{message}");
    assert!(fx.backend.calls(HOSTILE) < 5000, "the pile-up was stopped early");
}

/// What [`cancel_mid_loop`] observed.
struct CancelledRun {
    fx: Arc<Fixture>,
    /// The hostile run's envelope as `Host::run` returned it.
    envelope: RunEnvelope,
    /// The envelope `Host::cancel` returned.
    from_cancel: RunEnvelope,
}

/// Run `cancel-loop` next to the companion and cancel it with `Host::cancel` from another
/// thread while the guest busy-waits on `cancelled()`, so the guest (usually) sees the
/// cancellation and goes on calling hooks.
async fn cancel_mid_loop() -> CancelledRun {
    let fx = Arc::new(fixture().await);
    let (id_tx, id_rx) = std::sync::mpsc::channel::<String>();
    let (events_tx, mut events_rx) = tokio::sync::mpsc::unbounded_channel::<factory_host::ProgressEntry>();
    let canceller = {
        let fx = fx.clone();
        let runtime = tokio::runtime::Handle::current();
        std::thread::spawn(move || -> Option<RunEnvelope> {
            let run_id = id_rx.recv().ok()?;
            while let Some(entry) = events_rx.blocking_recv() {
                if matches!(&entry.event, ProgressEvent::Log { message, .. } if message == "looping") {
                    let envelope = runtime.block_on(fx.host.cancel(DEFAULT_SESSION, &run_id)).expect("a known run");
                    return Some(envelope);
                }
            }
            None
        })
    };
    let options = RunOptions {
        args: Some(json!({ "case": "cancel-loop" })),
        events: Some(events_tx),
        on_start: Some(Box::new(move |run_id: &str| {
            let _ = id_tx.send(run_id.to_string());
        })),
        ..Default::default()
    };
    let (envelope, _) = against_companion(&fx, options).await;
    let from_cancel = canceller.join().expect("the canceller thread").expect("the guest reached its loop");
    CancelledRun { fx, envelope, from_cancel }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_after_cancellation_are_refused_and_the_run_stops_promptly() {
    // The guest sees the cancellation only when it runs between the cancel and the host
    // dropping its store; that is the case under test, so try until it happens (it does
    // nearly always: the guest spins on `cancelled()`), and fail if it never does.
    const TRIES: usize = 20;
    for _ in 0..TRIES {
        let CancelledRun { fx, envelope, from_cancel } = cancel_mid_loop().await;
        let failure = envelope.failure.as_ref().expect("a failure");
        assert_eq!(failure.kind_type, factory_host::FailureType::Cancelled, "{envelope:#?}");
        assert!(envelope.result.is_none());
        assert_eq!(from_cancel.run_id, envelope.run_id);
        assert_eq!(from_cancel.status, envelope.status, "`cancel` returns the terminal envelope");
        assert_eq!(fx.backend.calls("h:before"), 1);
        let lines = log_lines(&fx.host, &envelope).await;
        if !lines.iter().any(|l| l == "saw cancellation; carrying on") {
            eprintln!("the host stopped the guest before it ran again; trying again");
            continue;
        }
        // The guest ran after the cancellation and went straight on to an agent call:
        // that call, and every later one it got to make, was refused, and none reached
        // the backend.
        assert_eq!(fx.backend.calls("h:after:"), 0, "an agent call after cancellation reached the backend");
        let after: Vec<&String> = lines.iter().filter(|l| l.starts_with("after-cancel agent")).collect();
        for line in &after {
            assert!(line.ends_with("refused: run aborted: cancelled"), "{line}");
        }
        eprintln!("the guest made {} agent calls after it saw the cancellation", after.len());
        return;
    }
    panic!("in {TRIES} tries the guest never ran after its cancellation: nothing was tested");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_run_ends_with_status_cancelled() {
    let CancelledRun { envelope, from_cancel, .. } = cancel_mid_loop().await;
    assert_eq!(envelope.status, RunStatus::Cancelled, "{envelope:#?}");
    assert_eq!(from_cancel.status, RunStatus::Cancelled, "{from_cancel:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawning_past_the_total_cap_ends_with_max_total_subagents() {
    let fx = fixture().await;
    let limits = Limits { max_total_subagents: Some(10), ..Default::default() };
    let args = json!({ "case": "spawn-past-cap", "n": 50 });
    let (envelope, _) = against_companion(&fx, hostile_options(args, limits)).await;
    assert_failure(&envelope, factory_host::FailureType::FactoryLimitReached, Some("maxTotalSubagents"));
    assert_eq!(fx.backend.calls(HOSTILE), 10);
    assert_eq!(envelope.accounting.agents_spawned, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_that_ignores_the_abort_still_ends_in_error() {
    let fx = fixture().await;
    let limits = Limits { max_total_subagents: Some(10), ..Default::default() };
    // It swallows every `Err(Abort)`, keeps spawning, and returns Ok.
    let args = json!({ "case": "ignore-abort", "n": 200 });
    let (envelope, _) = against_companion(&fx, hostile_options(args, limits)).await;
    assert_failure(&envelope, factory_host::FailureType::FactoryLimitReached, Some("maxTotalSubagents"));
    assert_eq!(fx.backend.calls(HOSTILE), 10, "no spawn past the cap reached the backend");
    assert_eq!(envelope.accounting.agents_spawned, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_concurrency_cap_of_8_holds_exactly_over_4096_agents() {
    let fx = fixture_gated(SandboxLimits::default(), Duration::from_millis(2), 8).await;
    let limits = Limits { max_concurrent_subagents: Some(8), ..Default::default() };
    let envelope =
        fx.host.run(&fx.hostile, hostile_options(json!({ "case": "fanout", "n": 4096 }), limits)).await.expect("run");
    assert_eq!(envelope.status, RunStatus::Completed, "{envelope:#?}");
    assert_eq!(envelope.result_value(), Some(json!({ "done": 4096 })));
    assert_eq!(fx.backend.calls(HOSTILE), 4096);
    assert_eq!(fx.backend.max_in_flight(), 8, "queued, never more than 8 in flight, and 8 reached");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_total_cap_admits_exactly_its_count_of_4096_agents() {
    // The backend holds the calls until 100 are in flight at once: without a concurrency
    // cap the total cap is the concurrency, reached and never passed.
    let fx = fixture_gated(SandboxLimits::default(), Duration::from_millis(2), 100).await;
    let limits = Limits { max_total_subagents: Some(100), ..Default::default() };
    let envelope =
        fx.host.run(&fx.hostile, hostile_options(json!({ "case": "fanout", "n": 4096 }), limits)).await.expect("run");
    assert_failure(&envelope, factory_host::FailureType::FactoryLimitReached, Some("maxTotalSubagents"));
    assert_eq!(fx.backend.calls(HOSTILE), 100, "exactly maxTotalSubagents backend calls");
    assert_eq!(envelope.accounting.agents_spawned, 100);
    assert_eq!(
        fx.backend.max_in_flight(),
        100,
        "without a concurrency cap the total cap bounds concurrency, and is reached"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_call_with_a_schema_that_is_not_json_is_an_invalid_call() {
    let fx = fixture().await;
    // The guest ignores the abort and returns Ok: the recorded failure still wins.
    let (envelope, _) =
        against_companion(&fx, hostile_options(json!({ "case": "bad-schema" }), Limits::default())).await;
    let message = assert_failure(&envelope, factory_host::FailureType::InvalidCall, None);
    assert!(message.contains("agent `h:bad-schema`: invalid schema"), "{message}");
    assert_eq!(fx.backend.calls(HOSTILE), 0, "the invalid call never reached the backend");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_that_is_not_json_is_an_invalid_result() {
    let fx = fixture().await;
    let (envelope, _) =
        against_companion(&fx, hostile_options(json!({ "case": "invalid-result" }), Limits::default())).await;
    let message = assert_failure(&envelope, factory_host::FailureType::InvalidResult, None);
    assert!(message.contains("the result is not JSON"), "{message}");
}

// ---------------------------------------------------------------------------------------
// Issue 10: every guest value that crosses is capped, the journal has a budget, and the
// store and host memory stay bounded. Each case runs beside the companion, on a durable
// store where its growth is measured (the redb file's size).

/// A fixture whose host keeps its store in a fresh directory (returned, to keep it alive).
async fn durable_fixture(sandbox: SandboxLimits) -> (Fixture, tempfile::TempDir) {
    let state = tempfile::tempdir().expect("a state dir");
    let fx = durable_fixture_in(state.path(), sandbox).await;
    (fx, state)
}

async fn durable_fixture_in(state: &std::path::Path, sandbox: SandboxLimits) -> Fixture {
    let backend = Arc::new(Counting { latency: Duration::from_millis(20), ..Default::default() });
    let host = Host::new(HostConfig {
        state_dir: Some(state.to_path_buf()),
        backend: Arc::new(Shared(backend.clone())),
        cache_dir: Some(common::guest_target_dir().join("cache")),
        sandbox,
        ..HostConfig::default()
    })
    .expect("host");
    let hostile = host.load_file(&common::component("hostile")).await.expect("loading hostile");
    let companion = host.load_file(&common::component("review-changed")).await.expect("loading review-changed");
    Fixture { host, backend, hostile, companion }
}

/// The store file's size now.
/// The disk space the store file takes (redb extends the file sparsely, by doubling: its
/// length runs ahead of the space used).
fn store_bytes(fx: &Fixture) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let path = fx.host.store().path().expect("a durable store");
    std::fs::metadata(path).expect("the store file").blocks() * 512
}

const MIB: u64 = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_phase_title_is_refused_and_the_log_after_it_stays_small() {
    let (fx, _state) = durable_fixture(SandboxLimits::default()).await;
    let before = store_bytes(&fx);
    // Measured before the cap: an 8 MiB title then 200 log lines grew the store by 1.6 GB.
    let args = json!({ "case": "huge-phase", "n": 8 << 20, "count": 200 });
    let (envelope, _) = against_companion(&fx, hostile_options(args, Limits::default())).await;
    let message = assert_failure(&envelope, factory_host::FailureType::SandboxLimit, Some("maxPhaseBytes"));
    assert!(message.contains(&format!("over the {} byte limit", 1 << 10)), "{message}");
    let grown = store_bytes(&fx).saturating_sub(before);
    assert!(grown < 4 * MIB, "the store grew by {grown} bytes");
    let detail = fx.host.detail(DEFAULT_SESSION, &envelope.run_id).await.expect("detail");
    assert!(
        detail.phases.iter().all(|p| p.len() <= 1 << 10),
        "the long title was not recorded: {:?}",
        detail.phases.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_phase_is_stored_once_not_per_progress_entry() {
    // A title at a raised cap, then 400 log lines: copied per entry it would be 100 MiB.
    let title_bytes = 256 << 10;
    let sandbox = SandboxLimits { max_phase_bytes: title_bytes, ..Default::default() };
    let (fx, _state) = durable_fixture(sandbox).await;
    let before = store_bytes(&fx);
    let args = json!({ "case": "huge-phase", "n": title_bytes, "count": 400 });
    let (envelope, _) = against_companion(&fx, hostile_options(args, Limits::default())).await;
    assert_eq!(envelope.status, RunStatus::Completed, "{envelope:#?}");
    let grown = store_bytes(&fx).saturating_sub(before);
    assert!(grown < 8 * MIB, "the store grew by {grown} bytes");
    // Clients still see the phase as text on every entry, and can filter by it.
    let title = "p".repeat(title_bytes);
    let query =
        ProgressQuery { phase: Some(title.clone()), limit: Some(1000), after_seq: Some(0), ..Default::default() };
    let page = fx.host.progress(DEFAULT_SESSION, &envelope.run_id, &query).await.expect("progress");
    let logs = page.iter().filter(|e| matches!(e.event, ProgressEvent::Log { .. })).count();
    assert_eq!(logs, 400, "every log line is in the phase");
    assert!(page.iter().all(|e| e.phase.as_deref() == Some(title.as_str())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_label_is_a_sandbox_limit_failure() {
    let fx = fixture().await;
    let args = json!({ "case": "huge-label", "n": 4 << 20 });
    let (envelope, _) = against_companion(&fx, hostile_options(args, Limits::default())).await;
    assert_failure(&envelope, factory_host::FailureType::SandboxLimit, Some("maxLabelBytes"));
    assert_eq!(fx.backend.calls(HOSTILE), 0, "the call never reached the backend");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_model_name_is_a_sandbox_limit_failure() {
    let fx = fixture().await;
    let args = json!({ "case": "huge-model", "n": 16 << 20 });
    let (envelope, _) = against_companion(&fx, hostile_options(args, Limits::default())).await;
    assert_failure(&envelope, factory_host::FailureType::SandboxLimit, Some("maxModelBytes"));
    assert_eq!(fx.backend.calls(HOSTILE), 0, "the call never reached the backend");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_step_key_is_a_sandbox_limit_failure() {
    let (fx, _state) = durable_fixture(SandboxLimits::default()).await;
    let before = store_bytes(&fx);
    let args = json!({ "case": "huge-key", "n": 16 << 20 });
    let (envelope, _) = against_companion(&fx, hostile_options(args, Limits::default())).await;
    assert_failure(&envelope, factory_host::FailureType::SandboxLimit, Some("maxStepKeyBytes"));
    let grown = store_bytes(&fx).saturating_sub(before);
    assert!(grown < 4 * MIB, "the key was not journaled: the store grew by {grown} bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_large_distinct_steps_stop_at_the_journal_budget() {
    let budget = 32 * MIB;
    let sandbox = SandboxLimits { max_journal_bytes: budget, ..Default::default() };
    let (fx, _state) = durable_fixture(sandbox).await;
    let before = store_bytes(&fx);
    // 20 steps of ~4 MB: 80 MB asked for, 32 MiB allowed (each step is charged the 4 MiB
    // run of pages it takes in the store).
    let args = json!({ "case": "many-steps", "n": 4_000_000, "count": 20 });
    let (envelope, _) = against_companion(&fx, hostile_options(args, Limits::default())).await;
    let message = assert_failure(&envelope, factory_host::FailureType::SandboxLimit, Some("maxJournalBytes"));
    assert!(message.contains(&format!("{budget} byte journal budget")), "{message}");
    let written = envelope.result_value().as_ref().map(|r| r["written"].clone());
    // The budget charges what each entry would occupy stored raw (values are stored
    // compressed when that is smaller, so the file may grow less): the file's disk space grew
    // by at most the budget, and the 7 steps that fit are journaled and charged.
    let grown = store_bytes(&fx).saturating_sub(before);
    assert!(grown <= budget, "the store grew by {grown} bytes, the budget is {budget} ({written:?})");
    let store = fx.host.store();
    let journal = store.load(&envelope.run_id, 0).await.expect("the journal loads");
    assert!(
        journal.journal_bytes >= 7 * 4_000_000 && journal.journal_bytes <= budget,
        "charged {} bytes of a {budget} byte budget",
        journal.journal_bytes
    );
    for i in 0..7 {
        let value = store.get_step(&envelope.run_id, &format!("s{i}")).await.expect("a step read");
        assert_eq!(value.map(|v| v.len()), Some(4_000_000), "step s{i} is journaled whole");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_distinct_steps_are_a_sandbox_limit() {
    let sandbox = SandboxLimits { max_steps: 100, ..Default::default() };
    let fx = fixture_with(sandbox, Duration::from_millis(20)).await;
    let args = json!({ "case": "many-steps", "n": 10, "count": 500 });
    let (envelope, _) = against_companion(&fx, hostile_options(args, Limits::default())).await;
    let message = assert_failure(&envelope, factory_host::FailureType::SandboxLimit, Some("maxSteps"));
    assert!(message.contains("100 distinct steps"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_journal_budget_counts_across_attempts_and_restarts() {
    let sandbox = SandboxLimits { max_journal_bytes: 8 * MIB, ..Default::default() };
    let state = tempfile::tempdir().expect("a state dir");
    // Each attempt journals 3 MiB more (three ~1 MB steps, each taking a 1 MiB run of pages),
    // then fails on purpose (so it can be resumed): two fit, the third passes 8 MiB.
    let args = json!({ "case": "grow-steps", "n": 1_000_000, "count": 3, "fail": true });
    let run_id = {
        let fx = durable_fixture_in(state.path(), sandbox.clone()).await;
        let (first, _) = against_companion(&fx, hostile_options(args, Limits::default())).await;
        let message = assert_failure(&first, factory_host::FailureType::GuestError, None);
        assert!(message.contains("after round 1"), "{message}");
        let second = fx.host.resume(&first.run_id, Default::default()).await.expect("resume");
        let message = assert_failure(&second, factory_host::FailureType::GuestError, None);
        assert!(message.contains("after round 2"), "{message}");
        first.run_id
    };
    // A new host on the same store: the count survived.
    let fx = durable_fixture_in(state.path(), sandbox).await;
    let third = fx.host.resume(&run_id, Default::default()).await.expect("resume");
    assert_failure(&third, factory_host::FailureType::SandboxLimit, Some("maxJournalBytes"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deeply_nested_any_of_schema_fails_fast_with_a_typed_error() {
    let fx = fixture().await;
    // 2^14 - 1 sub-schemas in ~140 KiB (under maxSchemaBytes): refused by the node cap.
    let args = json!({ "case": "nested-schema", "n": 13 });
    let (envelope, _) = against_companion(&fx, hostile_options(args, Limits::default())).await;
    let message = assert_failure(&envelope, factory_host::FailureType::InvalidCall, None);
    assert!(message.contains("more than 10000 sub-schemas"), "{message}");
    // ~17 MB of the same shape (the one measured at 7.2 GB RSS): refused by size first.
    let args = json!({ "case": "nested-schema", "n": 20 });
    let (envelope, _) = against_companion(&fx, hostile_options(args, Limits::default())).await;
    assert_failure(&envelope, factory_host::FailureType::SandboxLimit, Some("maxSchemaBytes"));
    assert_eq!(fx.backend.calls(HOSTILE), 0, "neither schema reached the backend");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_values_past_the_memory_cache_are_read_back_from_the_store() {
    // 40 steps of 64 KiB against a 256 KiB cache: most reads go to the store.
    let sandbox = SandboxLimits { journal_cache_bytes: 256 << 10, ..Default::default() };
    let (fx, _state) = durable_fixture(sandbox).await;
    let args = json!({ "case": "steps-roundtrip", "n": 64 << 10, "count": 40, "fail": true });
    let (envelope, _) = against_companion(&fx, hostile_options(args, Limits::default())).await;
    // The guest read every value back intact, then failed on purpose.
    let message = assert_failure(&envelope, factory_host::FailureType::GuestError, None);
    assert!(message.contains("after 40 fresh steps"), "{message}");
    // A resume finds every step journaled (none written again) and reads each back intact.
    let resumed = fx.host.resume(&envelope.run_id, Default::default()).await.expect("resume");
    let message = assert_failure(&resumed, factory_host::FailureType::GuestError, None);
    assert!(message.contains("after 0 fresh steps"), "{message}");
}

/// `agent-start` called through the canonical ABI with parameters made by hand: a
/// well-formed call is answered (so the hand-made layout is right), and a prompt past the
/// end of memory or a prompt or label that is not UTF-8 ends the run as a trap that says
/// which, the host and the companion run unharmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_start_reads_only_well_formed_strings_inside_guest_memory() {
    let fx = fixture().await;
    let (envelope, _) =
        against_companion(&fx, hostile_options(json!({ "case": "abi-agent-start", "n": 0 }), Limits::default())).await;
    assert_eq!(envelope.status, RunStatus::Completed, "{envelope:#?}");
    assert_eq!(envelope.result_value(), Some(json!({ "started": "pending" })), "{envelope:#?}");
    for (n, expect) in [(1, "out of bounds"), (2, "utf-8"), (3, "utf-8")] {
        let (envelope, _) =
            against_companion(&fx, hostile_options(json!({ "case": "abi-agent-start", "n": n }), Limits::default()))
                .await;
        assert_eq!(envelope.status, RunStatus::Error, "case {n}: {envelope:#?}");
        let failure = envelope.failure.as_ref().expect("a failure");
        assert_eq!(failure.kind_type, factory_host::FailureType::Trap, "case {n}: {failure:#?}");
        assert!(failure.message.to_lowercase().contains(expect), "case {n}: {failure:#?}");
        assert!(envelope.result.is_none(), "{envelope:#?}");
    }
}
