//! Storage failures (issue 15): the store runs on a redb backend over a real file that
//! fails on command (`tests/common/faulty.rs`: failed writes, failed fsyncs, a full disk).
//! A fault mid-run ends the attempt with a typed store error, never `completed` before its
//! journal is durable; the failure is sticky in the process that met it (every later write
//! is refused with a typed error) but does not poison the store: after a reopen the run is
//! `halted` and resumes to completion, other runs start and complete, and nothing that was
//! committed before the fault is lost.

mod common;

use common::counting::{Counting, Shared};
use common::faulty::{Fault, Faults, Faulty};
use factory_host::backend::{AgentBackend, AgentReply, AgentRequest, BackendError, Usage};
use factory_host::store::{RedbStore, Store, StoreOptions, STORE_FILE};
use factory_host::{
    Error, Factory, Host, HostConfig, Limits, ProgressEvent, ResumeOptions, RunOptions, RunStatus, DEFAULT_SESSION as S,
};
use futures::future::BoxFuture;
use serde_json::json;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Agents of the faulted run.
const N: u64 = 30;

/// A backend that answers its first `free` calls at once and holds the others until the
/// test releases them (so it can arm a fault at a known point of the run).
struct Held {
    free: u64,
    calls: AtomicU64,
    release: tokio::sync::Semaphore,
}

impl Held {
    fn new(free: u64) -> Arc<Self> {
        Arc::new(Held { free, calls: AtomicU64::new(0), release: tokio::sync::Semaphore::new(0) })
    }
    fn release(&self) {
        self.release.add_permits(1 << 20);
    }
}

struct HeldShared(Arc<Held>);

impl AgentBackend for HeldShared {
    fn name(&self) -> String {
        "held".into()
    }
    fn call(&self, request: Arc<AgentRequest>) -> BoxFuture<'static, Result<AgentReply, BackendError>> {
        let me = self.0.clone();
        Box::pin(async move {
            let n = me.calls.fetch_add(1, Ordering::SeqCst) + 1;
            if n > me.free {
                if let Ok(permit) = me.release.acquire().await {
                    permit.forget();
                }
            }
            let usage = Usage::tokens(1, 1, Some(0));
            Ok(AgentReply::new(format!("answer to {}", request.prompt), Some(usage)))
        })
    }
}

fn cache() -> Option<std::path::PathBuf> {
    Some(common::guest_target_dir().join("cache"))
}

async fn load(host: &Host, name: &str) -> Factory {
    host.load_file(&common::component(name)).await.unwrap_or_else(|e| panic!("loading {name}: {e}"))
}

fn steps() -> RunOptions {
    RunOptions { args: Some(json!({"case": "steps"})), ..Default::default() }
}

/// Run a fan-out of [`N`] agents (one at a time) on a store whose file fails with `fault`
/// from the moment `answered` agents have been answered; then reopen the store and check
/// what survived.
async fn fault_after(fault: Fault, answered: u64) {
    let state = tempfile::tempdir().unwrap();
    let faults = Arc::new(Faults::default());
    let held = Held::new(answered);
    let store = RedbStore::open_with_backend(
        Faulty::open(&state.path().join(STORE_FILE), faults.clone()),
        StoreOptions::default(),
    )
    .expect("the store opens on the faulty backend");
    let config =
        HostConfig { backend: Arc::new(HeldShared(held.clone())), cache_dir: cache(), ..HostConfig::default() };
    let host = Arc::new(Host::with_store(config, Arc::new(store)).expect("host"));
    let probe = load(&host, "probe").await;

    // Committed before the fault: a completed run.
    let before = host.run(&probe, steps()).await.unwrap();
    assert_eq!(before.status, RunStatus::Completed, "{before:#?}");

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let limits = Limits { max_concurrent_subagents: Some(1), ..Default::default() };
    let options =
        RunOptions { args: Some(json!({"case": "fanout", "n": N})), limits, events: Some(tx), ..Default::default() };
    let task = {
        let (host, probe) = (host.clone(), probe.clone());
        tokio::spawn(async move { host.run(&probe, options).await })
    };
    let mut finished = 0;
    while finished < answered {
        let entry = rx.recv().await.expect("the run goes on until the backend holds it");
        if let ProgressEvent::AgentFinished { cached: false, .. } = entry.event {
            finished += 1;
        }
    }
    let run_id = host.runs(S).await.unwrap().last().expect("the faulted run").run_id.clone();
    assert_ne!(run_id, before.run_id);
    // Everything so far is committed; then the disk starts failing and the backend answers.
    host.store().flush().await.unwrap();
    let committed = host.store().load(&run_id, usize::MAX).await.unwrap().agents.len();
    assert!(committed as u64 + 1 >= answered, "{committed} of {answered} outcomes committed");
    faults.arm(fault);
    held.release();

    match task.await.unwrap() {
        Err(Error::Store(e)) => {
            eprintln!("{fault:?}: {e}");
            assert!(e.to_string().contains("injected"), "the error says what failed: {e}");
        }
        Err(other) => panic!("expected a store error, got {other:?}"),
        Ok(envelope) => panic!("the run ended with a verdict its journal could not make durable: {envelope:#?}"),
    }
    assert!(faults.injected() > 0, "the fault was hit");
    // The attempt's verdict was an error, never `completed`.
    let mut verdicts = Vec::new();
    while let Ok(entry) = rx.try_recv() {
        if let ProgressEvent::AttemptEnded { status, .. } = entry.event {
            verdicts.push(status);
        }
    }
    assert!(verdicts.iter().all(|s| *s != RunStatus::Completed), "{verdicts:?}");
    // In this process the failure is sticky: a new run is refused with a typed error.
    match host.run(&probe, steps()).await {
        Err(Error::Store(_)) => {}
        other => panic!("expected a store error after a failed commit, got {other:?}"),
    }
    drop(probe);
    drop(host);

    // Reopened (on the plain file): nothing committed is lost, nothing is poisoned.
    let backend = Counting::with_latency(Duration::ZERO);
    let host = Host::new(HostConfig {
        state_dir: Some(state.path().to_path_buf()),
        backend: Arc::new(Shared(backend.clone())),
        cache_dir: cache(),
        ..HostConfig::default()
    })
    .expect("the store reopens after the fault");
    let again = host.envelope(S, &before.run_id).await.unwrap();
    assert_eq!(again.status, RunStatus::Completed);
    assert_eq!(again.result, before.result, "a run committed before the fault is intact");
    let halted = host.envelope(S, &run_id).await.unwrap();
    assert_eq!(halted.status, RunStatus::Halted, "the faulted run is not completed: {halted:#?}");
    let journaled = host.store().load(&run_id, usize::MAX).await.unwrap().agents.len();
    assert!(journaled >= committed, "committed outcomes survive ({journaled} < {committed})");

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    // The run recorded the `held` backend; this host resumes it on another one, named.
    let options =
        ResumeOptions { events: Some(tx), backend: Some(Arc::new(Shared(backend.clone()))), ..Default::default() };
    let done = host.resume(&run_id, options).await.unwrap();
    assert_eq!(done.status, RunStatus::Completed, "{done:#?}");
    assert_eq!(done.result_value().as_ref().unwrap()["done"], N);
    let (mut replayed, mut spawned) = (0u64, 0u64);
    while let Ok(entry) = rx.try_recv() {
        match entry.event {
            ProgressEvent::AgentFinished { cached: true, .. } => replayed += 1,
            ProgressEvent::AgentStarted { .. } => spawned += 1,
            _ => {}
        }
    }
    assert!(replayed >= committed as u64, "{replayed} replayed, {committed} were committed");
    assert_eq!(replayed + spawned, N, "each item replayed or spawned once");
    assert_eq!(backend.total(), spawned);

    let fresh = host.run(&load(&host, "probe").await, steps()).await.unwrap();
    assert_eq!(fresh.status, RunStatus::Completed, "a new run on the reopened store: {fresh:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_fsync_mid_run_is_a_typed_store_error_and_the_store_recovers() {
    fault_after(Fault::Sync, 10).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_write_mid_run_is_a_typed_store_error_and_the_store_recovers() {
    fault_after(Fault::Write, 10).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_mid_run_is_a_typed_store_error_and_the_store_recovers() {
    fault_after(Fault::DiskFullAfter(1024), 10).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_last_writes_cannot_be_made_durable_is_never_completed() {
    // The fault strikes while the last agent is answered: the guest finishes its work and
    // returns a result, but neither its journal nor its verdict can be made durable.
    fault_after(Fault::Sync, N - 1).await;
}

#[tokio::test]
async fn the_faulty_backend_passes_through_when_not_armed() {
    // The harness itself: unarmed, the backend is a plain file store that reopens.
    let state = tempfile::tempdir().unwrap();
    let path = state.path().join(STORE_FILE);
    let faults = Arc::new(Faults::default());
    drop(RedbStore::open_with_backend(Faulty::open(&path, faults.clone()), StoreOptions::default()).unwrap());
    assert_eq!(faults.injected(), 0);
    let reopened = RedbStore::open(state.path(), StoreOptions::default()).unwrap();
    assert!(reopened.runs().await.unwrap().is_empty());
    assert!(Path::new(&path).is_file());
}
