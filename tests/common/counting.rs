//! A counting backend for tests: it is the boundary the host calls, not the thing under
//! test. It answers like a plain text model, counts calls per prompt, fails labels that
//! start with `fail`, and records the most calls ever in flight at once.

use factory_host::backend::{AgentBackend, AgentReply, AgentRequest, BackendError, Usage};
use futures::future::BoxFuture;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A backend that answers every call like dry-run text, counts calls per prompt, fails
/// labels starting with `fail`, and records the most calls ever in flight at once.
#[derive(Default)]
pub struct Counting {
    calls: Mutex<HashMap<String, u64>>,
    in_flight: AtomicU64,
    pub max_in_flight: AtomicU64,
    latency: Duration,
}

impl Counting {
    pub fn with_latency(latency: Duration) -> Arc<Self> {
        Arc::new(Counting { latency, ..Default::default() })
    }
    pub fn total(&self) -> u64 {
        self.calls.lock().unwrap().values().sum()
    }
    pub fn calls_for(&self, prompt: &str) -> u64 {
        self.calls.lock().unwrap().get(prompt).copied().unwrap_or(0)
    }
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
            if !me.latency.is_zero() {
                tokio::time::sleep(me.latency).await;
            }
            me.in_flight.fetch_sub(1, Ordering::SeqCst);
            if request.label.as_deref().is_some_and(|l| l.starts_with("fail")) {
                return Err(BackendError::ordinary("injected failure"));
            }
            let usage = Usage { input_tokens: 1, output_tokens: 1, credits_nano: Some(0) };
            Ok(AgentReply { text: format!("reply #{} to {}", me.total(), request.prompt), usage: Some(usage) })
        })
    }
}
