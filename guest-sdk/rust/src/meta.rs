//! [`Meta`]: the builder for what a factory declares about itself.

use crate::__bindings::agent::factory::types as wit;

/// Name, description, phases, limits and args schema of a factory.
#[derive(Debug, Clone)]
pub struct Meta {
    name: String,
    description: String,
    phases: Vec<(String, Option<String>)>,
    limits: wit::Limits,
    args_schema: Option<serde_json::Value>,
    agent_limits: wit::AgentLimits,
}

impl Meta {
    /// A factory called `name`. State the expected shape of `args` in `description`.
    pub fn new(name: impl Into<String>, description: impl Into<String>) -> Self {
        Meta {
            name: name.into(),
            description: description.into(),
            limits: wit::Limits {
                max_concurrent_subagents: None,
                max_total_subagents: None,
                timeout_seconds: None,
                max_ai_credits: None,
            },
            phases: Vec::new(),
            args_schema: None,
            agent_limits: crate::agent::no_limits(),
        }
    }

    /// Declare a phase.
    pub fn phase(mut self, title: impl Into<String>) -> Self {
        self.phases.push((title.into(), None));
        self
    }

    /// Declare a phase with a longer explanation.
    pub fn phase_with_detail(mut self, title: impl Into<String>, detail: impl Into<String>) -> Self {
        self.phases.push((title.into(), Some(detail.into())));
        self
    }

    /// Subagents running at once; more wait in a queue.
    pub fn max_concurrent_subagents(mut self, n: u32) -> Self {
        self.limits.max_concurrent_subagents = Some(n);
        self
    }

    /// Subagent spawns over the whole run.
    pub fn max_total_subagents(mut self, n: u32) -> Self {
        self.limits.max_total_subagents = Some(n);
        self
    }

    /// Accumulated active seconds over all attempts.
    pub fn timeout_seconds(mut self, seconds: f64) -> Self {
        self.limits.timeout_seconds = Some(seconds);
        self
    }

    /// AI-credit budget for the run.
    pub fn max_ai_credits(mut self, credits: f64) -> Self {
        self.limits.max_ai_credits = Some(credits);
        self
    }

    /// Default soft limit of every agent call: at most `turns` model turns (a call's own
    /// [`crate::AgentCall::max_turns`] wins).
    pub fn agent_max_turns(mut self, turns: u32) -> Self {
        self.agent_limits.max_turns = Some(turns);
        self
    }

    /// Default soft limit of every agent call: at most `seconds` of wall time.
    pub fn agent_max_duration_seconds(mut self, seconds: f64) -> Self {
        self.agent_limits.max_duration_seconds = Some(seconds);
        self
    }

    /// Default wrap-up prompt of every agent call.
    pub fn agent_wrap_up(mut self, prompt: impl Into<String>) -> Self {
        self.agent_limits.wrap_up = Some(prompt.into());
        self
    }

    /// A JSON Schema the host checks `args` against before the run starts.
    pub fn args_schema(mut self, schema: serde_json::Value) -> Self {
        self.args_schema = Some(schema);
        self
    }

    /// The args schema derived from a serde type.
    pub fn args_schema_for<T: schemars::JsonSchema>(self) -> Self {
        self.args_schema(crate::agent::schema_for::<T>())
    }

    pub(crate) fn into_wit(self) -> wit::Meta {
        wit::Meta {
            name: self.name,
            description: self.description,
            phases: self.phases.into_iter().map(|(title, detail)| wit::PhaseDecl { title, detail }).collect(),
            limits: self.limits,
            args_schema: self.args_schema.map(|s| s.to_string()),
            agent_limits: self.agent_limits,
        }
    }
}
