//! [`FactoryMeta`]: what a factory declares about itself, read from its `meta` export and
//! checked (name, limits, args schema) before anything runs.

use crate::model::limits::{AgentLimits, Limits};
use crate::model::schema::Schema;
use serde::{Deserialize, Serialize};

/// A declared phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PhaseDecl {
    /// Title, as passed to `ctx.phase`.
    pub title: String,
    /// Optional explanation.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub detail: Option<String>,
}

/// A factory's metadata.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FactoryMeta {
    /// Stable identifier.
    pub name: String,
    /// Human-readable description (states the args shape).
    pub description: String,
    /// Declared phases.
    pub phases: Vec<PhaseDecl>,
    /// Declared limits.
    pub limits: Limits,
    /// Schema the arguments must match, if declared.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub args_schema: Option<crate::model::json::RawJson>,
    /// Default soft limits of every agent call (absent: none).
    #[serde(skip_serializing_if = "AgentLimits::is_empty", default)]
    pub agent_limits: AgentLimits,
}

/// Metadata a factory exported that the host cannot accept.
#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    /// The name is empty or has characters that do not belong in a name.
    #[error("invalid factory name `{0}`: use letters, digits, `-`, `_` and `.`")]
    Name(String),
    /// A declared limit is out of range.
    #[error("the factory declares an {0}")]
    Limits(#[from] crate::model::limits::LimitError),
    /// The args schema is not a usable schema.
    #[error("the factory's args schema is invalid: {0}")]
    ArgsSchema(crate::model::schema::SchemaError),
    /// A default agent soft limit is out of range.
    #[error("the factory declares an {0} in meta.agentLimits")]
    AgentLimits(#[from] crate::model::limits::AgentLimitError),
    /// The args schema is not one JSON value.
    #[error("the factory's args schema is invalid: {0}")]
    ArgsSchemaText(#[source] crate::model::json::NotJson),
}

impl FactoryMeta {
    /// Check what a factory's `meta` export declared (its args schema as the factory wrote it).
    pub(crate) fn checked(
        name: String,
        description: String,
        phases: Vec<PhaseDecl>,
        limits: Limits,
        args_schema: Option<String>,
        agent_limits: AgentLimits,
    ) -> Result<Self, MetaError> {
        let name_ok = !name.is_empty()
            && name.len() <= 128
            && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !name_ok {
            return Err(MetaError::Name(name));
        }
        limits.validate()?;
        // A factory declares limits; lifting one is an invocation's.
        let limits = Limits { lifted: Default::default(), ..limits };
        agent_limits.validate()?;
        let args_schema = match args_schema {
            None => None,
            Some(text) => {
                Schema::parse(&text).map_err(MetaError::ArgsSchema)?;
                // Checked above, kept as the factory wrote it.
                Some(crate::model::json::RawJson::from_text(text).map_err(MetaError::ArgsSchemaText)?)
            }
        };
        Ok(FactoryMeta { name, description, phases, limits, args_schema, agent_limits })
    }
}
