//! A counting backend for tests: it is the boundary the host calls, not the thing under
//! test. It answers like a plain text model, counts calls per prompt, fails labels that
//! start with `fail`, and records the most calls ever in flight at once. A gated one holds
//! its first calls until a given number are in flight at once, so a test can tell "the cap
//! was reached" from "the calls happened not to overlap" without relying on timing.

use factory_host::backend::{AgentBackend, AgentReply, AgentRequest, BackendError, Usage};
use futures::future::BoxFuture;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a gated call waits for the gate before giving up (an anti-hang bound: a host
/// that never lets `hold_until` calls run at once fails the test's assertion instead).
pub const GATE_GIVE_UP: Duration = Duration::from_secs(60);

/// A backend that answers every call like dry-run text, counts calls per prompt, fails
/// labels starting with `fail`, and records the most calls ever in flight at once.
#[derive(Default)]
pub struct Counting {
    calls: Mutex<HashMap<String, u64>>,
    in_flight: AtomicU64,
    pub max_in_flight: AtomicU64,
    latency: Duration,
    /// Hold calls until this many are in flight at once (0: no gate).
    hold_until: u64,
    opened: AtomicBool,
    open: tokio::sync::Notify,
}

impl Counting {
    pub fn with_latency(latency: Duration) -> Arc<Self> {
        Arc::new(Counting { latency, ..Default::default() })
    }
    /// Hold every call until `hold_until` calls are in flight at once; from then on answer
    /// after `latency`.
    pub fn gated(latency: Duration, hold_until: u64) -> Arc<Self> {
        Arc::new(Counting { latency, hold_until, ..Default::default() })
    }
    pub fn total(&self) -> u64 {
        self.calls.lock().unwrap().values().sum()
    }
    pub fn calls_for(&self, prompt: &str) -> u64 {
        self.calls.lock().unwrap().get(prompt).copied().unwrap_or(0)
    }
    pub fn max_in_flight(&self) -> u64 {
        self.max_in_flight.load(Ordering::SeqCst)
    }
}

/// Wait at the gate: returns once `hold_until` calls were in flight at once (or after
/// [`GATE_GIVE_UP`]). `now` is the in-flight count including this call.
pub async fn wait_at_gate(hold_until: u64, now: u64, opened: &AtomicBool, open: &tokio::sync::Notify) {
    if hold_until == 0 || opened.load(Ordering::SeqCst) {
        return;
    }
    if now >= hold_until {
        opened.store(true, Ordering::SeqCst);
        open.notify_waiters();
        return;
    }
    let notified = open.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();
    if opened.load(Ordering::SeqCst) {
        return;
    }
    let _ = tokio::time::timeout(GATE_GIVE_UP, notified).await;
}

/// The backend handle the host owns; the test keeps the `Arc<Counting>` to count.
pub struct Shared(pub Arc<Counting>);

impl AgentBackend for Shared {
    fn name(&self) -> String {
        "counting".into()
    }
    fn call(&self, request: Arc<AgentRequest>) -> BoxFuture<'static, Result<AgentReply, BackendError>> {
        let me = self.0.clone();
        Box::pin(async move {
            *me.calls.lock().unwrap().entry(request.prompt.clone()).or_default() += 1;
            let now = me.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            me.max_in_flight.fetch_max(now, Ordering::SeqCst);
            // Leave on drop too: the host may abandon a call when it stops a run.
            struct Leave<'a>(&'a AtomicU64);
            impl Drop for Leave<'_> {
                fn drop(&mut self) {
                    self.0.fetch_sub(1, Ordering::SeqCst);
                }
            }
            let leave = Leave(&me.in_flight);
            wait_at_gate(me.hold_until, now, &me.opened, &me.open).await;
            if !me.latency.is_zero() {
                tokio::time::sleep(me.latency).await;
            }
            drop(leave);
            if request.label.as_deref().is_some_and(|l| l.starts_with("fail")) {
                return Err(BackendError::ordinary("injected failure"));
            }
            let usage = Usage::tokens(1, 1, Some(0));
            Ok(AgentReply::new(format!("reply #{} to {}", me.total(), request.prompt), Some(usage)))
        })
    }
}

/// A durable host on `state` whose backend is `backend` (shared, so the test keeps counting),
/// with the guests' compile cache.
pub fn durable_host(state: &std::path::Path, backend: &Arc<Counting>) -> factory_host::Host {
    factory_host::Host::new(factory_host::HostConfig {
        state_dir: Some(state.to_path_buf()),
        backend: Arc::new(Shared(backend.clone())),
        cache_dir: Some(super::guest_target_dir().join("cache")),
        ..factory_host::HostConfig::default()
    })
    .expect("host")
}

/// Load the test component `name` into `host`.
pub async fn load(host: &factory_host::Host, name: &str) -> factory_host::Factory {
    host.load_file(&super::component(name)).await.unwrap_or_else(|e| panic!("loading {name}: {e}"))
}
