//! `openai`: a backend for any server that speaks the OpenAI chat-completions wire format
//! (OpenAI itself, llama.cpp's server, Ollama, vLLM, LM Studio). A schema call asks for
//! structured output (`response_format` json_schema), and falls back to `json_object`, then
//! to plain prompting, when the server answers 400 about `response_format`; the fallback is
//! remembered for the life of the backend. Usage comes from the reply's `usage` (cached prompt
//! tokens split from the uncached ones), credits from the backend's [`Pricing`]. This file
//! owns the wire format ([`ChatCompletions`]: body, bearer key, reply, fallback); sending,
//! retries, timeouts, flows, status errors and redaction are the shared HTTP core's
//! ([`HttpBackend`], [`RetryPolicy`]).

use super::flow::FlowLimits;
use super::http::{non_empty_env, Endpoint, HttpBackend, HttpReply, RetryPolicy, Wire};
use super::pricing::Pricing;
use super::prompting::{schema_instruction, user_prompt};
use super::redact;
use super::{AgentRequest, BackendError, OutageKind, Usage};
use serde::Deserialize;
use serde_json::json;
use std::sync::atomic::{AtomicU8, Ordering};

/// The default base URL, as the official SDKs use it.
pub const DEFAULT_OPENAI_BASE_URL: &str = "https://api.openai.com/v1";

/// How a schema call asks for structured output, from most to least constrained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum StructuredMode {
    /// `response_format: {type: json_schema, ...}`.
    JsonSchema = 0,
    /// `response_format: {type: json_object}`.
    JsonObject = 1,
    /// No `response_format`: the schema is only in the system message.
    Plain = 2,
}

impl StructuredMode {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => StructuredMode::JsonSchema,
            1 => StructuredMode::JsonObject,
            _ => StructuredMode::Plain,
        }
    }
}

/// How an OpenAI-compatible backend is set up.
#[derive(Clone)]
pub struct OpenAiConfig {
    /// The backend's name in progress output and errors.
    pub name: String,
    /// The API root, e.g. `https://api.openai.com/v1` or `http://127.0.0.1:8080/v1`.
    pub base_url: String,
    /// The bearer token; `None` for local servers that need none.
    pub api_key: Option<String>,
    /// The environment variable the key came from (named in 401 errors).
    pub api_key_var: String,
    /// The model used when a call names none.
    pub model: Option<String>,
    /// An optional system message sent with every call.
    pub system_prompt: Option<String>,
    /// `max_tokens`, if set.
    pub max_tokens: Option<u32>,
    /// The first structured-output mode to try.
    pub structured: StructuredMode,
    /// Prices that turn usage into credits (none by default; a server on this machine
    /// charges 0 credits for the models they leave unpriced).
    pub pricing: Pricing,
    /// Retries and timeouts.
    pub retry: RetryPolicy,
    /// Configured bounds of the backend's flow (rates, concurrency, wait bound).
    pub flow: FlowLimits,
}

/// Never prints the key (`api_key: Some("***")`) or credentials in the base URL.
impl std::fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("name", &self.name)
            .field("base_url", &redact::redact(&self.base_url, &[]))
            .field("api_key", &self.api_key.as_ref().map(|_| redact::MASK))
            .field("api_key_var", &self.api_key_var)
            .field("model", &self.model)
            .field("system_prompt", &self.system_prompt)
            .field("max_tokens", &self.max_tokens)
            .field("structured", &self.structured)
            .field("pricing", &self.pricing)
            .field("retry", &self.retry)
            .field("flow", &self.flow)
            .finish()
    }
}

impl OpenAiConfig {
    /// A config for `base_url` with no key, no default model, zero prices.
    pub fn new(name: impl Into<String>, base_url: impl Into<String>) -> Self {
        OpenAiConfig {
            name: name.into(),
            base_url: base_url.into().trim_end_matches('/').to_string(),
            api_key: None,
            api_key_var: "OPENAI_API_KEY".into(),
            model: None,
            system_prompt: None,
            max_tokens: None,
            structured: StructuredMode::JsonSchema,
            pricing: Pricing::default(),
            retry: RetryPolicy::default(),
            flow: FlowLimits::default(),
        }
    }

    /// The config `--backend openai` uses: `OPENAI_BASE_URL` (default
    /// [`DEFAULT_OPENAI_BASE_URL`]) and `OPENAI_API_KEY` (optional), as the SDKs read them.
    pub fn from_env() -> Self {
        let base = non_empty_env("OPENAI_BASE_URL").unwrap_or_else(|| DEFAULT_OPENAI_BASE_URL.to_string());
        OpenAiConfig { api_key: non_empty_env("OPENAI_API_KEY"), ..OpenAiConfig::new("openai", base) }
    }
}

/// The OpenAI-compatible backend: the shared HTTP core speaking [`ChatCompletions`].
pub type OpenAi = HttpBackend<ChatCompletions>;

impl OpenAi {
    /// Set up the backend (builds the HTTP client; sends nothing).
    pub fn new(config: OpenAiConfig) -> Result<Self, BackendError> {
        let OpenAiConfig {
            name,
            base_url,
            api_key,
            api_key_var,
            model,
            system_prompt,
            max_tokens,
            structured,
            pricing,
            retry,
            flow,
        } = config;
        let wire = ChatCompletions { system_prompt, max_tokens, mode: AtomicU8::new(structured as u8) };
        HttpBackend::open(Endpoint { name, base_url, api_key, api_key_var, model, pricing, retry, flow }, wire)
    }

    /// The structured-output mode schema calls currently use.
    pub fn structured_mode(&self) -> StructuredMode {
        self.wire().mode()
    }
}

/// The chat-completions wire format: what the OpenAI backend keeps of its own.
pub struct ChatCompletions {
    /// An optional system message sent with every call.
    system_prompt: Option<String>,
    /// `max_tokens`, if set.
    max_tokens: Option<u32>,
    /// The current [`StructuredMode`]; only ever moves down the list.
    mode: AtomicU8,
}

impl ChatCompletions {
    fn mode(&self) -> StructuredMode {
        StructuredMode::from_u8(self.mode.load(Ordering::SeqCst))
    }
}

#[derive(Deserialize)]
struct ChatResponse {
    #[serde(default)]
    choices: Vec<Choice>,
    /// Read field by field ([`super::Counts`]): a hostile value cannot fail the reply.
    #[serde(default)]
    usage: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct Choice {
    message: Message,
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    refusal: Option<String>,
}

impl Wire for ChatCompletions {
    /// The structured-output mode of the request.
    type Sent = StructuredMode;

    const KIND: &'static str = "openai";

    const PATH: &'static str = "/chat/completions";

    fn body(&self, request: &AgentRequest, model: &str) -> (serde_json::Value, StructuredMode) {
        let mode = self.mode();
        let system: Vec<String> =
            self.system_prompt.iter().cloned().chain(request.schema.as_ref().map(schema_instruction)).collect();
        let mut messages = Vec::new();
        if !system.is_empty() {
            messages.push(json!({"role": "system", "content": system.join("\n\n")}));
        }
        messages.push(json!({"role": "user", "content": user_prompt(request)}));
        let mut body = json!({"model": model, "messages": messages});
        if let Some(schema) = &request.schema {
            match mode {
                StructuredMode::JsonSchema => {
                    body["response_format"] = json!({
                        "type": "json_schema",
                        "json_schema": {"name": "reply", "schema": schema, "strict": false}
                    });
                }
                StructuredMode::JsonObject => body["response_format"] = json!({"type": "json_object"}),
                StructuredMode::Plain => {}
            }
        }
        if let Some(max) = self.max_tokens {
            body["max_tokens"] = json!(max);
        }
        // A call's `reasoningEffort` (checked: one of the values the API names).
        if let Some(effort) = &request.tuning.reasoning_effort {
            body["reasoning_effort"] = json!(effort);
        }
        (body, mode)
    }

    fn headers(&self, builder: reqwest::RequestBuilder, key: Option<&str>) -> reqwest::RequestBuilder {
        match key {
            Some(key) => builder.bearer_auth(key),
            None => builder,
        }
    }

    fn parse(&self, who: &str, _: &StructuredMode, body: &str) -> Result<(String, Option<Usage>), BackendError> {
        let parsed: ChatResponse = serde_json::from_str(body).map_err(|e| {
            BackendError::outage(OutageKind::InvalidReply, format!("{who}: the reply is not a chat completion: {e}"))
        })?;
        let message = parsed
            .choices
            .into_iter()
            .next()
            .map(|c| c.message)
            .ok_or_else(|| BackendError::ordinary(format!("{who}: the reply has no choices")))?;
        let text = match (message.content, message.refusal) {
            (Some(text), _) => text,
            (None, Some(refusal)) => {
                return Err(BackendError::ordinary(format!("{who}: the model refused: {refusal}")))
            }
            (None, None) => String::new(),
        };
        Ok((text, parsed.usage.filter(|u| !u.is_null()).map(|u| usage_of(&u))))
    }

    fn fall_back(&self, who: &str, request: &AgentRequest, mode: &StructuredMode, reply: &HttpReply) -> bool {
        let mode = *mode;
        if request.schema.is_none() || mode == StructuredMode::Plain || !refuses_response_format(reply) {
            return false;
        }
        let next = StructuredMode::from_u8(mode as u8 + 1);
        tracing::info!(backend = %who, from = ?mode, to = ?next, "server refused response_format; falling back");
        self.mode.fetch_max(next as u8, Ordering::SeqCst);
        true
    }
}

/// The token counts of a chat completion's `usage`. OpenAI counts cached prompt tokens
/// (`prompt_tokens_details.cached_tokens`) inside `prompt_tokens`: they are moved out, so
/// `input_tokens` is the uncached part. Writing the cache is not reported (nor billed).
fn usage_of(usage: &serde_json::Value) -> Usage {
    let mut counts = super::Counts::of(usage);
    let prompt = counts.get(usage, "/prompt_tokens");
    let output = counts.get(usage, "/completion_tokens");
    let cached = counts.get(usage, "/prompt_tokens_details/cached_tokens");
    // More cached than prompt tokens (a hostile server): all of them are cache reads.
    let usage = Usage {
        input_tokens: prompt.saturating_sub(cached),
        output_tokens: output,
        cache_read_tokens: cached,
        ..Usage::default()
    };
    Usage { credits_at_least: counts.unreadable, ..usage }
}

/// A 400 (or 422) whose message is about `response_format`.
fn refuses_response_format(reply: &HttpReply) -> bool {
    if !matches!(reply.status, 400 | 422) {
        return false;
    }
    let body = reply.body.to_ascii_lowercase();
    ["response_format", "json_schema", "json_object"].iter().any(|w| body.contains(w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_prompt_tokens_are_moved_out_of_input() {
        let usage = json!({"prompt_tokens": 1000, "completion_tokens": 7,
                           "prompt_tokens_details": {"cached_tokens": 800}});
        let read = usage_of(&usage);
        assert_eq!(
            (read.input_tokens, read.cache_read_tokens, read.output_tokens, read.cache_write_tokens),
            (200, 800, 7, 0)
        );
        assert!(!read.credits_at_least);
        // More cached than prompt tokens: no underflow.
        let odd = usage_of(&json!({"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": u64::MAX}}));
        assert_eq!((odd.input_tokens, odd.cache_read_tokens), (0, u64::MAX));
        // A details object that is null is no cache at all; one that is no count is flagged.
        assert!(!usage_of(&json!({"prompt_tokens": 3, "prompt_tokens_details": null})).credits_at_least);
        assert!(
            usage_of(&json!({"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": [1]}})).credits_at_least
        );
    }
}
