//! `anthropic`: a backend for the Anthropic Messages API (`ANTHROPIC_API_KEY`,
//! `ANTHROPIC_BASE_URL`). The prompt is the user message, the configured system prompt the
//! system one. A schema call forces a tool (`respond`, whose `input_schema` is the call's
//! schema, wrapped in an object when its root is not one) and replies with the tool's input;
//! a server that answers 400 about tools gets plain prompting from then on. Usage comes from
//! `usage` (input, output, cache-read and cache-write tokens apart). This file owns the wire
//! format ([`Messages`]: body, headers, reply, fallback); sending, retries ([`RetryPolicy`]),
//! flows, status errors and redaction are the shared HTTP core's ([`HttpBackend`]).

use super::flow::FlowLimits;
use super::http::{non_empty_env, Endpoint, HttpBackend, HttpReply, RetryPolicy, Wire};
use super::pricing::Pricing;
use super::prompting::{schema_instruction, user_prompt};
use super::redact;
use super::{AgentRequest, BackendError, OutageKind, Usage};
use serde::Deserialize;
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};

/// The default base URL.
pub const DEFAULT_ANTHROPIC_BASE_URL: &str = "https://api.anthropic.com";
/// The API version header value this backend speaks.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";
/// The name of the forced tool that carries structured replies.
pub const RESPOND_TOOL: &str = "respond";

/// How an Anthropic backend is set up.
#[derive(Clone)]
pub struct AnthropicConfig {
    /// The backend's name in progress output and errors.
    pub name: String,
    /// The API root (without `/v1`).
    pub base_url: String,
    /// The `x-api-key` value.
    pub api_key: Option<String>,
    /// The environment variable the key came from (named in 401 errors).
    pub api_key_var: String,
    /// The model used when a call names none.
    pub model: Option<String>,
    /// An optional system prompt sent with every call.
    pub system_prompt: Option<String>,
    /// `max_tokens` (required by the API).
    pub max_tokens: u32,
    /// Force the `respond` tool for schema calls (else prompt for JSON).
    pub use_tool: bool,
    /// Prices that turn usage into credits (none by default; a server on this machine
    /// charges 0 credits for the models they leave unpriced).
    pub pricing: Pricing,
    /// Retries and timeouts.
    pub retry: RetryPolicy,
    /// Configured bounds of the backend's flow (rates, concurrency, wait bound).
    pub flow: FlowLimits,
}

/// Never prints the key (`api_key: Some("***")`) or credentials in the base URL.
impl std::fmt::Debug for AnthropicConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnthropicConfig")
            .field("name", &self.name)
            .field("base_url", &redact::redact(&self.base_url, &[]))
            .field("api_key", &self.api_key.as_ref().map(|_| redact::MASK))
            .field("api_key_var", &self.api_key_var)
            .field("model", &self.model)
            .field("system_prompt", &self.system_prompt)
            .field("max_tokens", &self.max_tokens)
            .field("use_tool", &self.use_tool)
            .field("pricing", &self.pricing)
            .field("retry", &self.retry)
            .field("flow", &self.flow)
            .finish()
    }
}

impl AnthropicConfig {
    /// A config for `base_url` with no key, no default model, zero prices.
    pub fn new(name: impl Into<String>, base_url: impl Into<String>) -> Self {
        AnthropicConfig {
            name: name.into(),
            base_url: base_url.into().trim_end_matches('/').to_string(),
            api_key: None,
            api_key_var: "ANTHROPIC_API_KEY".into(),
            model: None,
            system_prompt: None,
            max_tokens: 4096,
            use_tool: true,
            pricing: Pricing::default(),
            retry: RetryPolicy::default(),
            flow: FlowLimits::default(),
        }
    }

    /// The config `--backend anthropic` uses: `ANTHROPIC_BASE_URL` (default
    /// [`DEFAULT_ANTHROPIC_BASE_URL`]) and `ANTHROPIC_API_KEY`.
    pub fn from_env() -> Self {
        let base = non_empty_env("ANTHROPIC_BASE_URL").unwrap_or_else(|| DEFAULT_ANTHROPIC_BASE_URL.to_string());
        AnthropicConfig { api_key: non_empty_env("ANTHROPIC_API_KEY"), ..AnthropicConfig::new("anthropic", base) }
    }
}

/// The Anthropic Messages backend: the shared HTTP core speaking [`Messages`].
pub type Anthropic = HttpBackend<Messages>;

impl Anthropic {
    /// Set up the backend (builds the HTTP client; sends nothing).
    pub fn new(config: AnthropicConfig) -> Result<Self, BackendError> {
        let AnthropicConfig {
            name,
            base_url,
            api_key,
            api_key_var,
            model,
            system_prompt,
            max_tokens,
            use_tool,
            pricing,
            retry,
            flow,
        } = config;
        let wire = Messages { system_prompt, max_tokens, no_tools: AtomicBool::new(!use_tool) };
        HttpBackend::open(Endpoint { name, base_url, api_key, api_key_var, model, pricing, retry, flow }, wire)
    }

    /// Whether schema calls currently force the `respond` tool.
    pub fn uses_tool(&self) -> bool {
        !self.wire().no_tools.load(Ordering::SeqCst)
    }
}

/// The Messages wire format: what the Anthropic backend keeps of its own.
pub struct Messages {
    /// An optional system prompt sent with every call.
    system_prompt: Option<String>,
    /// `max_tokens` (required by the API).
    max_tokens: u32,
    /// Set once the server refused tools: schema calls are prompted from then on.
    no_tools: AtomicBool,
}

/// How one Messages request asked for its answer.
#[derive(Debug, Clone, Copy)]
pub struct Asked {
    /// The `respond` tool carries the answer.
    tool: bool,
    /// The tool's schema wraps the call's in `{value: ..}` ([`tool_schema`]).
    wrapped: bool,
}

#[derive(Deserialize)]
struct MessagesResponse {
    #[serde(default)]
    content: Vec<Block>,
    /// Read field by field ([`super::Counts`]): a hostile value cannot fail the reply.
    #[serde(default)]
    usage: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct Block {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    input: Option<serde_json::Value>,
}

/// The token counts of a Messages `usage`: Anthropic reports cache reads and writes
/// (`cache_read_input_tokens`, `cache_creation_input_tokens`) apart from `input_tokens`.
/// Cache writes are priced at the 5-minute rate; writes to the 1-hour cache
/// (`cache_creation.ephemeral_1h_input_tokens`) cost more, so with any of them the cost is
/// a lower bound.
fn usage_of(usage: &serde_json::Value) -> Usage {
    let mut counts = super::Counts::of(usage);
    let one_hour = counts.get(usage, "/cache_creation/ephemeral_1h_input_tokens");
    let usage = Usage {
        input_tokens: counts.get(usage, "/input_tokens"),
        output_tokens: counts.get(usage, "/output_tokens"),
        cache_read_tokens: counts.get(usage, "/cache_read_input_tokens"),
        cache_write_tokens: counts.get(usage, "/cache_creation_input_tokens"),
        ..Usage::default()
    };
    Usage { credits_at_least: counts.unreadable || one_hour > 0, ..usage }
}

/// The tool's input schema for a call's schema, and whether it was wrapped in `{value: ..}`
/// (the API wants an object at the root).
fn tool_schema(schema: &serde_json::Value) -> (serde_json::Value, bool) {
    if schema.get("type").and_then(|t| t.as_str()) == Some("object") {
        (schema.clone(), false)
    } else {
        (json!({"type": "object", "properties": {"value": schema}, "required": ["value"]}), true)
    }
}

impl Wire for Messages {
    type Sent = Asked;

    const KIND: &'static str = "anthropic";

    const PATH: &'static str = "/v1/messages";

    fn body(&self, request: &AgentRequest, model: &str) -> (serde_json::Value, Asked) {
        let tool = request.schema.is_some() && !self.no_tools.load(Ordering::SeqCst);
        let instruction = match (&request.schema, tool) {
            (Some(schema), false) => Some(schema_instruction(schema)),
            _ => None,
        };
        let system: Vec<String> = self.system_prompt.iter().cloned().chain(instruction).collect();
        let mut body = json!({
            "model": model,
            "max_tokens": self.max_tokens,
            "messages": [{"role": "user", "content": user_prompt(request)}],
        });
        if !system.is_empty() {
            body["system"] = json!(system.join("\n\n"));
        }
        let mut wrapped = false;
        if let (Some(schema), true) = (&request.schema, tool) {
            let (input_schema, w) = tool_schema(schema);
            wrapped = w;
            body["tools"] = json!([{
                "name": RESPOND_TOOL,
                "description": "Give your final answer as this tool's input.",
                "input_schema": input_schema,
            }]);
            body["tool_choice"] = json!({"type": "tool", "name": RESPOND_TOOL});
        }
        // A call's `reasoningEffort` becomes an extended-thinking budget. The API wants
        // `max_tokens` above the budget, and refuses a forced tool with thinking on: the
        // answer tool is then offered, not forced (a text reply is parsed as before).
        if let Some(budget) = request.tuning.thinking_budget() {
            body["thinking"] = json!({"type": "enabled", "budget_tokens": budget});
            if self.max_tokens <= budget {
                body["max_tokens"] = json!(u64::from(budget) + u64::from(self.max_tokens));
            }
            if body.get("tool_choice").is_some() {
                body["tool_choice"] = json!({"type": "auto"});
            }
        }
        (body, Asked { tool, wrapped })
    }

    fn headers(&self, builder: reqwest::RequestBuilder, key: Option<&str>) -> reqwest::RequestBuilder {
        let builder = builder.header("anthropic-version", ANTHROPIC_VERSION);
        match key {
            Some(key) => builder.header("x-api-key", key),
            None => builder,
        }
    }

    fn parse(&self, who: &str, asked: &Asked, body: &str) -> Result<(String, Option<Usage>), BackendError> {
        let parsed: MessagesResponse = serde_json::from_str(body).map_err(|e| {
            BackendError::outage(OutageKind::InvalidReply, format!("{who}: the reply is not a Messages response: {e}"))
        })?;
        let tool_input = parsed
            .content
            .iter()
            .find(|b| b.kind == "tool_use" && b.name.as_deref() == Some(RESPOND_TOOL))
            .and_then(|b| b.input.clone());
        let text = match tool_input {
            Some(input) if asked.tool => {
                let value =
                    if asked.wrapped { input.get("value").cloned().unwrap_or(serde_json::Value::Null) } else { input };
                value.to_string()
            }
            _ => parsed
                .content
                .iter()
                .filter(|b| b.kind == "text")
                .filter_map(|b| b.text.as_deref())
                .collect::<Vec<_>>()
                .join(""),
        };
        Ok((text, parsed.usage.filter(|u| !u.is_null()).map(|u| usage_of(&u))))
    }

    fn fall_back(&self, who: &str, _: &AgentRequest, asked: &Asked, reply: &HttpReply) -> bool {
        if !asked.tool || !refuses_tools(reply) {
            return false;
        }
        tracing::info!(backend = %who, "server refused the forced tool; prompting for JSON instead");
        self.no_tools.store(true, Ordering::SeqCst);
        true
    }
}

/// A 400 whose message is about tools.
fn refuses_tools(reply: &HttpReply) -> bool {
    reply.status == 400 && {
        let body = reply.body.to_ascii_lowercase();
        body.contains("tool")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_keeps_cache_reads_and_writes_apart_and_flags_what_it_cannot_price() {
        let usage = json!({"input_tokens": 12, "output_tokens": 3, "cache_read_input_tokens": 400,
                           "cache_creation_input_tokens": 50});
        let expected = Usage {
            input_tokens: 12,
            output_tokens: 3,
            cache_read_tokens: 400,
            cache_write_tokens: 50,
            ..Usage::default()
        };
        assert_eq!(usage_of(&usage), expected);
        // Writes to the 1-hour cache cost more than the 5-minute rate they are priced at.
        let one_hour = json!({"input_tokens": 1, "cache_creation_input_tokens": 50,
                              "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 50}});
        assert!(usage_of(&one_hour).credits_at_least);
        // No count, a negative, a string: read as 0 and flagged; never a failed reply.
        for hostile in [json!("many"), json!({"input_tokens": -1}), json!({"output_tokens": "3"})] {
            let read = usage_of(&hostile);
            assert!(read.credits_at_least && read.input_tokens == 0 && read.output_tokens == 0, "{hostile}: {read:?}");
        }
        assert_eq!(usage_of(&json!({"input_tokens": 1e300})).input_tokens, u64::MAX);
    }
}
