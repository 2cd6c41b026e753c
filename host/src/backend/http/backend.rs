//! The one HTTP backend both providers are: [`HttpBackend`] owns what every HTTP backend
//! does whatever its wire format — the HTTP client with its timeouts, the flows its calls are
//! admitted through, the default model, the call's clock, sending with retries and reading a
//! bounded reply ([`super::send`]), the errors of a reply that is not 2xx
//! ([`super::status_error`]), pricing the usage and charging it to the flow, the redaction of
//! the key from every failure, and what the backend records about itself. A provider is a
//! [`Wire`]: its request body and headers, the parsing of its reply, and its fallback when
//! the server refuses a structured-output feature.

use super::{CallClock, HttpReply, RetryPolicy};
use crate::backend::flow::{self, Flow, FlowLimits, Flows};
use crate::backend::pricing::{CallPricing, Pricing};
use crate::backend::{
    estimate_tokens, redact, AgentBackend, AgentReply, AgentRequest, BackendError, BackendRef, OutageKind, SoftLimit,
    Usage,
};
use futures::future::BoxFuture;
use std::sync::Arc;

/// What sets up any HTTP backend, whatever its wire format (each provider's config has these
/// fields, and its own).
#[derive(Clone)]
pub(crate) struct Endpoint {
    /// The backend's name in progress output and errors.
    pub name: String,
    /// The API root (no trailing `/`).
    pub base_url: String,
    /// The key sent with every request, if any.
    pub api_key: Option<String>,
    /// The environment variable the key came from (named in 401 and 403 errors).
    pub api_key_var: String,
    /// The model used when a call names none.
    pub model: Option<String>,
    /// Prices that turn usage into credits.
    pub pricing: Pricing,
    /// Retries and timeouts.
    pub retry: RetryPolicy,
    /// Configured bounds of the backend's flow.
    pub flow: FlowLimits,
}

/// What a provider's wire format owns: how a call becomes a request, and a reply an answer.
/// State a provider keeps across calls (a fallback once the server refused a feature) lives
/// in its [`Wire`] value, shared by the calls of the backend.
pub trait Wire: Send + Sync + 'static {
    /// What one request was sent as, that reading its reply (or its refusal) needs.
    type Sent: Send + Sync;

    /// The provider's word in its flows' key (one flow per provider, endpoint and key).
    const KIND: &'static str;

    /// The path of the endpoint after the base URL.
    const PATH: &'static str;

    /// The body of the request for `request` on `model`, and what it was sent as.
    fn body(&self, request: &AgentRequest, model: &str) -> (serde_json::Value, Self::Sent);

    /// `builder` with the provider's headers, its key `key` among them when there is one.
    fn headers(&self, builder: reqwest::RequestBuilder, key: Option<&str>) -> reqwest::RequestBuilder;

    /// The text and the (unpriced) usage of a 2xx reply's `body`; `who` prefixes errors.
    fn parse(&self, who: &str, sent: &Self::Sent, body: &str) -> Result<(String, Option<Usage>), BackendError>;

    /// Whether a non-2xx `reply` to a request sent as `sent` refuses a feature the provider
    /// can do without: if so, the wire falls back (for the life of the backend) and the
    /// call is sent again.
    fn fall_back(&self, who: &str, request: &AgentRequest, sent: &Self::Sent, reply: &HttpReply) -> bool;
}

/// An HTTP backend speaking the wire format `W` (see [`crate::backend::OpenAi`] and
/// [`crate::backend::Anthropic`]).
pub struct HttpBackend<W> {
    inner: Arc<Shared<W>>,
}

struct Shared<W> {
    endpoint: Endpoint,
    /// The endpoint's URL (base URL and [`Wire::PATH`]).
    url: String,
    client: reqwest::Client,
    /// The flow every backend of this endpoint and key shares in the process.
    flows: Flows,
    /// What calls are charged (free for a server on this machine, unless priced).
    pricing: CallPricing,
    wire: W,
}

impl<W: Wire> HttpBackend<W> {
    /// Set up the backend for `endpoint` speaking `wire` (builds the HTTP client; sends nothing).
    pub(crate) fn open(endpoint: Endpoint, wire: W) -> Result<Self, BackendError> {
        let client = endpoint.retry.client()?;
        let key = format!("{} {} {}", W::KIND, endpoint.base_url, flow::key_fingerprint(endpoint.api_key.as_deref()));
        let flows = Flows::new(&key, &endpoint.name, &endpoint.flow);
        let pricing = CallPricing::new(&endpoint.pricing, &endpoint.base_url);
        let url = format!("{}{}", endpoint.base_url, W::PATH);
        Ok(HttpBackend { inner: Arc::new(Shared { endpoint, url, client, flows, pricing, wire }) })
    }

    /// The provider's wire, with the state it keeps across calls.
    pub(crate) fn wire(&self) -> &W {
        &self.inner.wire
    }

    /// The model a call for `model` (`None`: the backend's default) is sent as; "" when none.
    fn model_or_default<'a>(&'a self, model: Option<&'a str>) -> &'a str {
        model.or(self.inner.endpoint.model.as_deref()).unwrap_or("")
    }
}

impl<W: Wire> AgentBackend for HttpBackend<W> {
    fn name(&self) -> String {
        self.inner.endpoint.name.clone()
    }

    fn flows(&self) -> Vec<Arc<Flow>> {
        self.inner.flows.all()
    }

    fn call(&self, request: Arc<AgentRequest>) -> BoxFuture<'static, Result<AgentReply, BackendError>> {
        let inner = self.inner.clone();
        Box::pin(async move {
            // Failure messages reach envelopes and journals: no key, no credentials in URLs
            // or in what the server echoed.
            let key = inner.endpoint.api_key.as_deref().unwrap_or("");
            // maxDurationSeconds bounds the request from its admission through the flow (retries
            // included; see `http::CallClock`); maxTurns always holds
            // (one request is one turn) and a request cannot take a wrap-up.
            inner.call(&request).await.map_err(|e| redact::redact_error(e, &[key]))
        })
    }

    fn reference(&self) -> BackendRef {
        // The *name* of the variable its key came from when it has a key (never the key).
        let endpoint = &self.inner.endpoint;
        let key_env = endpoint.api_key.as_ref().map(|_| endpoint.api_key_var.clone());
        BackendRef { key_env, ..BackendRef::named(self.name()) }
    }

    fn unpriced(&self, model: Option<&str>) -> Option<String> {
        self.inner.pricing.unpriced(&self.inner.endpoint.name, self.model_or_default(model))
    }

    fn free_notice(&self, model: Option<&str>) -> Option<String> {
        self.inner.pricing.free_notice(&self.inner.endpoint.name, self.model_or_default(model))
    }
}

impl<W: Wire> Shared<W> {
    async fn call(&self, request: &AgentRequest) -> Result<AgentReply, BackendError> {
        let endpoint = &self.endpoint;
        let who = &endpoint.name;
        let model = request.model.clone().or_else(|| endpoint.model.clone()).ok_or_else(|| {
            BackendError::outage(
                OutageKind::Misconfigured,
                format!("{who}: the call names no model and the backend has no default (pass --model)"),
            )
        })?;
        let flow = self.flows.get(&model);
        // maxDurationSeconds counts from the call's admission, not its wait in the flow.
        let clock = CallClock::new(request.limits.max_duration());
        loop {
            let (body, sent) = self.wire.body(request, &model);
            let make = || self.wire.headers(self.client.post(&self.url), endpoint.api_key.as_deref()).json(&body);
            let reply = super::send(&endpoint.retry, flow, estimate_tokens(&request.prompt), &clock, who, make).await?;
            let Some(reply) = reply else { return Ok(AgentReply::cut_off(SoftLimit::MaxDurationSeconds)) };
            if reply.ok() {
                let (text, usage) = self.wire.parse(who, &sent, &reply.body)?;
                let usage = usage.map(|u| self.pricing.priced(&model, u));
                if let Some(u) = &usage {
                    flow.used_tokens(
                        reply.charged,
                        u.input_tokens + u.cache_read_tokens + u.cache_write_tokens,
                        u.output_tokens,
                    );
                }
                return Ok(AgentReply::new(text, usage));
            }
            if self.wire.fall_back(who, request, &sent, &reply) {
                continue;
            }
            return Err(super::status_error(who, &reply, &endpoint.api_key_var, &endpoint.base_url, &model));
        }
    }
}

/// An environment variable, unless unset or empty.
pub(crate) fn non_empty_env(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|v| !v.trim().is_empty())
}
