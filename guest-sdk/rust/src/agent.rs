//! [`AgentCall`]: the builder for one subagent call.

use crate::__bindings::agent::factory::{agents, types as wit};
use crate::Abort;
use core::future::{Future, IntoFuture};
use core::pin::Pin;
use core::task::{Context, Poll};
use serde::de::DeserializeOwned;

/// One subagent call: set `label`, `model`, `schema`, soft limits (`max_turns`,
/// `max_duration_seconds`, `wrap_up`) and tuning (`agent`, `reasoning_effort`,
/// `context_tier`), then `.await` it for the text reply, or call
/// [`AgentCall::json`] / [`AgentCall::value`] for a structured one.
///
/// `Ok(None)` is an ordinary failure (guard it); `Err(Abort)` means the run must stop.
#[derive(Debug, Clone)]
#[must_use = "an agent call does nothing until awaited"]
pub struct AgentCall {
    prompt: String,
    label: Option<String>,
    model: Option<String>,
    schema: Option<serde_json::Value>,
    limits: wit::AgentLimits,
    agent: Option<String>,
    reasoning_effort: Option<String>,
    context_tier: Option<String>,
}

/// No soft limits (the factory's defaults apply).
pub(crate) fn no_limits() -> wit::AgentLimits {
    wit::AgentLimits { max_turns: None, max_duration_seconds: None, wrap_up: None }
}

/// The JSON Schema of a serde type, inlined (the host's schema subset has no `$ref`).
pub(crate) fn schema_for<T: schemars::JsonSchema>() -> serde_json::Value {
    let mut settings = schemars::generate::SchemaSettings::draft07();
    settings.inline_subschemas = true;
    settings.into_generator().into_root_schema_for::<T>().to_value()
}

impl AgentCall {
    pub(crate) fn new(prompt: String) -> Self {
        AgentCall {
            prompt,
            label: None,
            model: None,
            schema: None,
            limits: no_limits(),
            agent: None,
            reasoning_effort: None,
            context_tier: None,
        }
    }

    /// Label: distinguishes otherwise identical calls and names the agent in progress.
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// Model name, resolved by the host's backend configuration.
    pub fn model(mut self, model: impl Into<String>) -> Self {
        self.model = Some(model.into());
        self
    }

    /// Soft limit: the subagent may take at most `turns` model turns (an agent CLI's turn
    /// flag). Reaching it ends this call, not the run; part of the call's identity.
    pub fn max_turns(mut self, turns: u32) -> Self {
        self.limits.max_turns = Some(turns);
        self
    }

    /// Soft limit: the call may take at most `seconds` of wall time; then the subagent gets
    /// the wrap-up prompt (when its backend takes one) and is stopped. Ends this call, not
    /// the run; part of the call's identity.
    pub fn max_duration_seconds(mut self, seconds: f64) -> Self {
        self.limits.max_duration_seconds = Some(seconds);
        self
    }

    /// The prompt sent when `max_duration_seconds` is up (default: the host's).
    pub fn wrap_up(mut self, prompt: impl Into<String>) -> Self {
        self.limits.wrap_up = Some(prompt.into());
        self
    }

    /// The agent (persona) to run the call as, where the backend has one (an agent CLI's
    /// `--agent`); part of the call's identity.
    pub fn agent(mut self, agent: impl Into<String>) -> Self {
        self.agent = Some(agent.into());
        self
    }

    /// How hard the model reasons: `none`, `minimal`, `low`, `medium`, `high` or `xhigh`
    /// (OpenAI's `reasoning_effort`, Anthropic's thinking budget); part of the call's identity.
    pub fn reasoning_effort(mut self, effort: impl Into<String>) -> Self {
        self.reasoning_effort = Some(effort.into());
        self
    }

    /// The context-window tier asked for (accepted and keyed; no backend maps it today).
    pub fn context_tier(mut self, tier: impl Into<String>) -> Self {
        self.context_tier = Some(tier.into());
        self
    }

    /// Require a JSON reply matching `schema` (the host's structural subset).
    pub fn schema(mut self, schema: serde_json::Value) -> Self {
        self.schema = Some(schema);
        self
    }

    /// Require a JSON reply shaped like `T` (schema derived from `T` unless one was set)
    /// and deserialize it.
    pub async fn json<T: DeserializeOwned + schemars::JsonSchema>(mut self) -> Result<Option<T>, Abort> {
        if self.schema.is_none() {
            self.schema = Some(schema_for::<T>());
        }
        let reply = self.call().await?;
        // The host already checked the reply against the schema; a value that still does
        // not deserialize (an ignored keyword, say) is an ordinary failure.
        Ok(reply.and_then(|json| serde_json::from_str(&json).ok()))
    }

    /// The reply as a JSON value (with a schema: the checked value; without: a string).
    pub async fn value(self) -> Result<Option<serde_json::Value>, Abort> {
        let reply = self.call().await?;
        Ok(reply.and_then(|json| serde_json::from_str(&json).ok()))
    }

    /// The raw JSON text of the reply.
    async fn call(self) -> Result<Option<String>, Abort> {
        match self.start() {
            Begun::Answered(reply) => reply,
            Begun::Pending(pending) => pending.await.map_err(Abort::from),
        }
    }

    /// One synchronous call starts it: a memo hit (a replayed or repeated call) or a reply
    /// the host had at once comes back here; any other call's outcome comes from the one
    /// `agent-wait` the run's pending calls share.
    fn start(self) -> Begun {
        let options = wit::AgentOptions {
            label: self.label,
            schema: self.schema.map(|s| s.to_string()),
            model: self.model,
            limits: self.limits,
            agent: self.agent,
            reasoning_effort: self.reasoning_effort,
            context_tier: self.context_tier,
        };
        match agents::agent_start(&self.prompt, &options) {
            Ok(wit::Started::Reply(reply)) => Begun::Answered(Ok(reply)),
            Ok(wit::Started::Pending(id)) => Begun::Pending(crate::waiting::Pending::new(id)),
            Err(abort) => Begun::Answered(Err(Abort::from(abort))),
        }
    }

    /// The text reply (for a schema call: the JSON text). Same as `.await`ing the call.
    pub async fn text(self) -> Result<Option<String>, Abort> {
        self.await
    }
}

/// A call [`AgentCall::start`] made.
enum Begun {
    /// Its outcome, had at once.
    Answered(Result<Option<String>, Abort>),
    /// Its outcome comes from `agent-wait`.
    Pending(crate::waiting::Pending),
}

/// A reply as text: a JSON string's text, any other JSON as it is.
fn text_of(json: String) -> String {
    match json.trim_start().starts_with('"') {
        true => serde_json::from_str::<String>(&json).unwrap_or(json),
        false => json,
    }
}

/// An awaited [`AgentCall`]: its text reply (a JSON string's text, any other reply's JSON).
/// It starts the call when first polled.
#[must_use = "an agent call does nothing until awaited"]
pub struct AgentFuture {
    state: State,
}

enum State {
    Unstarted(Box<AgentCall>),
    Waiting(crate::waiting::Pending),
    Done,
}

impl Future for AgentFuture {
    type Output = Result<Option<String>, Abort>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            match core::mem::replace(&mut this.state, State::Done) {
                State::Unstarted(call) => match call.start() {
                    Begun::Answered(reply) => return Poll::Ready(reply.map(|r| r.map(text_of))),
                    Begun::Pending(pending) => this.state = State::Waiting(pending),
                },
                State::Waiting(mut pending) => {
                    return match Pin::new(&mut pending).poll(cx) {
                        Poll::Ready(outcome) => Poll::Ready(outcome.map(|r| r.map(text_of)).map_err(Abort::from)),
                        Poll::Pending => {
                            this.state = State::Waiting(pending);
                            Poll::Pending
                        }
                    };
                }
                State::Done => panic!("an agent call's future was polled after it completed"),
            }
        }
    }
}

impl IntoFuture for AgentCall {
    type Output = Result<Option<String>, Abort>;
    type IntoFuture = AgentFuture;

    /// Lazy, like an `async fn`: the call starts when the future is first polled. No
    /// allocation of its own (a memo hit is answered in that first poll).
    fn into_future(self) -> AgentFuture {
        AgentFuture { state: State::Unstarted(Box::new(self)) }
    }
}
