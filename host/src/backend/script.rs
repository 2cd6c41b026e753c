//! `script:FILE`: a backend driven by a JSON file of rules, for tests and demos. The first
//! rule whose matchers all hold answers the call: a text or JSON reply (or a sequence of
//! them, one per matching call), an injected error, latency, and token usage or credits.
//!
//! ```json
//! { "rules": [
//!     { "labelPrefix": "verify:", "reply": { "json": { "isReal": true } },
//!       "latencyMs": 5, "usage": { "inputTokens": 100, "outputTokens": 20, "cacheReadTokens": 50, "credits": 0.25 } },
//!     { "promptContains": "flaky", "replies": [ { "error": "boom" }, { "text": "ok" } ] },
//!     { "label": "silent", "reply": { "text": "hi" }, "noUsage": true }
//!   ],
//!   "fallback": "dry-run" }
//! ```

use super::{estimate_tokens, AgentBackend, AgentReply, AgentRequest, BackendError, DryRun, Usage};
use futures::future::BoxFuture;
use serde::Deserialize;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A script file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    /// The file could not be read.
    #[error("cannot read script `{path}`: {source}")]
    Read { path: String, source: std::io::Error },
    /// The file is not a valid script.
    #[error("invalid script `{path}`: {source}")]
    Invalid {
        path: String,
        #[source]
        source: ScriptRulesError,
    },
}

/// Script text that is no valid script.
#[derive(Debug, thiserror::Error)]
pub enum ScriptRulesError {
    /// Not JSON of the script's shape.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// A `fallback` that is neither `dry-run` nor `error`.
    #[error("fallback must be `dry-run` or `error`, got `{0}`")]
    Fallback(String),
    /// A rule with nothing to reply (its index).
    #[error("rule {0} has neither `reply` nor `replies`")]
    NoReply(usize),
}

/// One reply in a script.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum ReplySpec {
    /// Reply with this text.
    Text(String),
    /// Reply with this JSON value (serialized as the reply text).
    Json(serde_json::Value),
    /// Fail the spawn with this message (an ordinary failure: `null` to the factory).
    Error(String),
    /// Fail the spawn as a backend outage of this kind (`unavailable`, `auth`, ...): the
    /// attempt stops with `failure.type = "backend"`.
    Outage(super::OutageKind),
}

/// Token usage of a scripted reply.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct UsageSpec {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    cache_read_tokens: u64,
    #[serde(default)]
    cache_write_tokens: u64,
    #[serde(default)]
    credits: Option<f64>,
    /// The credits are a lower bound.
    #[serde(default)]
    credits_at_least: bool,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RuleSpec {
    #[serde(default)]
    label: Option<String>,
    #[serde(default)]
    label_prefix: Option<String>,
    #[serde(default)]
    prompt_contains: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    reply: Option<ReplySpec>,
    #[serde(default)]
    replies: Vec<ReplySpec>,
    #[serde(default)]
    latency_ms: u64,
    #[serde(default)]
    usage: Option<UsageSpec>,
    #[serde(default)]
    no_usage: bool,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ScriptSpec {
    #[serde(default)]
    rules: Vec<RuleSpec>,
    /// `dry-run` (default) or `error`: what answers a call no rule matches.
    #[serde(default)]
    fallback: Option<String>,
}

#[derive(Debug)]
struct Rule {
    spec: RuleSpec,
    /// How many calls this rule has answered (selects from `replies`).
    hits: AtomicUsize,
}

/// The scripted backend.
#[derive(Debug)]
pub struct Script {
    rules: Vec<Rule>,
    fallback_error: bool,
}

impl Script {
    /// Load a script file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, ScriptError> {
        let path_str = path.as_ref().display().to_string();
        let text = std::fs::read_to_string(path.as_ref())
            .map_err(|source| ScriptError::Read { path: path_str.clone(), source })?;
        Script::from_json(&text).map_err(|source| ScriptError::Invalid { path: path_str, source })
    }

    /// Parse a script from JSON text.
    pub fn from_json(text: &str) -> Result<Self, ScriptRulesError> {
        let spec: ScriptSpec = serde_json::from_str(text)?;
        let fallback_error = match spec.fallback.as_deref() {
            None | Some("dry-run") => false,
            Some("error") => true,
            Some(other) => return Err(ScriptRulesError::Fallback(other.to_string())),
        };
        if let Some(i) = spec.rules.iter().position(|rule| rule.reply.is_none() && rule.replies.is_empty()) {
            return Err(ScriptRulesError::NoReply(i));
        }
        let rules = spec.rules.into_iter().map(|spec| Rule { spec, hits: AtomicUsize::new(0) }).collect();
        Ok(Script { rules, fallback_error })
    }

    fn matching(&self, request: &AgentRequest) -> Option<&Rule> {
        self.rules.iter().find(|rule| {
            let s = &rule.spec;
            let label = request.label.as_deref();
            s.label.as_deref().is_none_or(|l| label == Some(l))
                && s.label_prefix.as_deref().is_none_or(|p| label.is_some_and(|l| l.starts_with(p)))
                && s.prompt_contains.as_deref().is_none_or(|p| request.prompt.contains(p))
                && s.model.as_deref().is_none_or(|m| request.model.as_deref() == Some(m))
        })
    }
}

impl AgentBackend for Script {
    fn name(&self) -> String {
        "script".to_string()
    }

    fn call(&self, request: Arc<AgentRequest>) -> BoxFuture<'static, Result<AgentReply, BackendError>> {
        let Some(rule) = self.matching(&request) else {
            if self.fallback_error {
                let who = request.label.clone().unwrap_or_default();
                return Box::pin(
                    async move { Err(BackendError::ordinary(format!("script: no rule matches `{who}`"))) },
                );
            }
            return DryRun.call(request);
        };
        let n = rule.hits.fetch_add(1, Ordering::SeqCst);
        let s = &rule.spec;
        let reply = match (&s.reply, s.replies.as_slice()) {
            (_, [first, ..]) => s.replies.get(n).unwrap_or(s.replies.last().unwrap_or(first)).clone(),
            (Some(reply), []) => reply.clone(),
            (None, []) => ReplySpec::Error("script: rule has no reply".into()),
        };
        let latency = Duration::from_millis(s.latency_ms);
        let usage = (!s.no_usage).then(|| s.usage.clone());
        Box::pin(async move {
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            let text = match reply {
                ReplySpec::Text(t) => t,
                ReplySpec::Json(v) => v.to_string(),
                ReplySpec::Error(e) => return Err(BackendError::ordinary(e)),
                ReplySpec::Outage(kind) => {
                    return Err(BackendError::outage(kind, format!("script: injected `{kind}` outage")))
                }
            };
            let usage = usage.map(|spec| match spec {
                Some(u) => Usage {
                    input_tokens: u.input_tokens,
                    output_tokens: u.output_tokens,
                    cache_read_tokens: u.cache_read_tokens,
                    cache_write_tokens: u.cache_write_tokens,
                    credits_nano: Some(u.credits.map_or(0, |c| (c * 1e9).round() as u64)),
                    credits_at_least: u.credits_at_least,
                },
                None => Usage::tokens(estimate_tokens(&request.prompt), estimate_tokens(&text), Some(0)),
            });
            Ok(AgentReply::new(text, usage))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(label: &str, prompt: &str) -> Arc<AgentRequest> {
        Arc::new(AgentRequest {
            prompt: prompt.into(),
            label: Some(label.into()),
            model: None,
            schema: None,
            attempt: 0,
            feedback: None,
            limits: Default::default(),
            tuning: Default::default(),
        })
    }

    #[tokio::test]
    async fn first_matching_rule_answers_and_replies_advance() {
        let script = Script::from_json(
            r#"{"rules":[
                {"labelPrefix":"v:","replies":[{"error":"boom"},{"json":{"ok":true}}],
                 "usage":{"inputTokens":3,"outputTokens":4,"credits":0.5}},
                {"promptContains":"hello","reply":{"text":"hi"},"noUsage":true}
            ],"fallback":"error"}"#,
        )
        .unwrap();
        assert_eq!(script.call(req("v:1", "x")).await, Err(BackendError::ordinary("boom")));
        let second = script.call(req("v:2", "x")).await.unwrap();
        assert_eq!(second.text, r#"{"ok":true}"#);
        assert_eq!(second.usage.unwrap().credits_nano, Some(500_000_000));
        // The last reply repeats.
        assert_eq!(script.call(req("v:3", "x")).await.unwrap().text, r#"{"ok":true}"#);
        let hi = script.call(req("other", "say hello")).await.unwrap();
        assert_eq!((hi.text.as_str(), hi.usage), ("hi", None));
        assert!(script.call(req("nobody", "nothing")).await.is_err());
    }

    #[test]
    fn rejects_bad_scripts_with_reasons() {
        assert!(matches!(Script::from_json(r#"{"rules":[{"label":"a"}]}"#), Err(ScriptRulesError::NoReply(0))));
        let maybe = Script::from_json(r#"{"rules":[],"fallback":"maybe"}"#);
        assert!(matches!(maybe, Err(ScriptRulesError::Fallback(f)) if f == "maybe"));
        assert!(matches!(Script::from_json(r#"{"rulez":[]}"#), Err(ScriptRulesError::Json(_))));
    }
}
