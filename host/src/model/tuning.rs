//! How one subagent call asks to be run beyond its prompt and model: the agent (persona),
//! the reasoning effort and the context tier ([`AgentTuning`]), the options upstream's
//! Dynamic Workflows added to `ctx.agent`. Part of the call's identity (its memo key) when
//! set; each backend maps what it has a knob for (README, "Agent options").

/// Bytes one tuning value may hold (each is a short name).
pub const MAX_TUNING_BYTES: usize = 256;

/// The reasoning efforts a call may ask for, as OpenAI names them.
pub const REASONING_EFFORTS: &[&str] = &["none", "minimal", "low", "medium", "high", "xhigh"];

/// A call's agent, reasoning effort and context tier (unchecked until [`AgentTuning::validate`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentTuning {
    /// The agent (persona) to run the call as, where the backend has one.
    pub agent: Option<String>,
    /// One of [`REASONING_EFFORTS`].
    pub reasoning_effort: Option<String>,
    /// The context-window tier asked for (no backend maps it today).
    pub context_tier: Option<String>,
}

/// A tuning value that is not allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TuningError {
    /// A value is empty, holds a control character, or is longer than [`MAX_TUNING_BYTES`].
    #[error("invalid agent option `{field}`: must be a non-empty name of at most {MAX_TUNING_BYTES} bytes without control characters")]
    BadName {
        /// The option as the SDKs spell it.
        field: &'static str,
    },
    /// `reasoningEffort` is not one of [`REASONING_EFFORTS`].
    #[error("invalid agent option `reasoningEffort`: {0:?} is not one of none, minimal, low, medium, high, xhigh")]
    ReasoningEffort(String),
}

impl AgentTuning {
    /// Whether nothing is set (the call keys and runs as it did before these options existed).
    pub fn is_empty(&self) -> bool {
        self.agent.is_none() && self.reasoning_effort.is_none() && self.context_tier.is_none()
    }

    /// Bytes the values hold.
    pub fn len(&self) -> usize {
        [&self.agent, &self.reasoning_effort, &self.context_tier]
            .iter()
            .map(|v| v.as_ref().map_or(0, String::len))
            .sum()
    }

    /// Check every present value.
    ///
    /// ```
    /// use factory_host::tuning::{AgentTuning, TuningError};
    ///
    /// let ok = AgentTuning { reasoning_effort: Some("high".into()), ..Default::default() };
    /// assert!(ok.validate().is_ok());
    /// let bad = AgentTuning { reasoning_effort: Some("max".into()), ..Default::default() };
    /// assert_eq!(bad.validate(), Err(TuningError::ReasoningEffort("max".into())));
    /// ```
    pub fn validate(&self) -> Result<(), TuningError> {
        let named = |field, value: &Option<String>| match value {
            Some(v) if v.is_empty() || v.len() > MAX_TUNING_BYTES || v.chars().any(char::is_control) => {
                Err(TuningError::BadName { field })
            }
            _ => Ok(()),
        };
        named("agent", &self.agent)?;
        named("reasoningEffort", &self.reasoning_effort)?;
        named("contextTier", &self.context_tier)?;
        match &self.reasoning_effort {
            Some(effort) if !REASONING_EFFORTS.contains(&effort.as_str()) => {
                Err(TuningError::ReasoningEffort(effort.clone()))
            }
            _ => Ok(()),
        }
    }

    /// The extended-thinking budget (tokens) an Anthropic call gets for its reasoning effort:
    /// none for `none`/`minimal` or no effort, then 1024 (the API's minimum), 4096, 16384 and
    /// 32768 for `low` to `xhigh`.
    pub fn thinking_budget(&self) -> Option<u32> {
        match self.reasoning_effort.as_deref()? {
            "low" => Some(1024),
            "medium" => Some(4096),
            "high" => Some(16384),
            "xhigh" => Some(32768),
            _ => None,
        }
    }
}
