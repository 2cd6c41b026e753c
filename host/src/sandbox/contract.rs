//! The host side of `wit/`: `bindgen!` of the `factory` world, and the conversions between
//! its generated types and the host's own.

wasmtime::component::bindgen!({
    path: "../wit",
    world: "factory",
    imports: {
        "agent:factory/agents.agent": async | store | trappable,
        "agent:factory/agents.agent-wait": async | store | trappable,
        "agent:factory/agents.sleep": async | store | trappable,
        default: trappable,
    },
    exports: { default: async },
});

/// `bindgen!` of world `script-runner` for its one extra import, `agent:factory/script`
/// (the rest is the `factory` world's, reused through `with`).
pub(crate) mod script_runner {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "script-runner",
        imports: { default: trappable },
        exports: { default: async },
        with: {
            "agent:factory/types": crate::sandbox::contract::agent::factory::types,
            "agent:factory/ctx": crate::sandbox::contract::agent::factory::ctx,
            "agent:factory/agents": crate::sandbox::contract::agent::factory::agents,
        },
    });
}

use crate::model::limits::{AgentLimits, Limits};
use crate::model::meta::{FactoryMeta, MetaError, PhaseDecl};
use agent::factory::types as wit;

/// Convert and check the `meta` export's value.
pub(crate) fn meta_from_wit(meta: wit::Meta) -> Result<FactoryMeta, MetaError> {
    let limits = Limits {
        max_concurrent_subagents: meta.limits.max_concurrent_subagents,
        max_total_subagents: meta.limits.max_total_subagents,
        timeout_seconds: meta.limits.timeout_seconds,
        max_ai_credits: meta.limits.max_ai_credits,
        lifted: Default::default(),
    };
    let phases = meta.phases.into_iter().map(|p| PhaseDecl { title: p.title, detail: p.detail }).collect();
    let agent_limits = agent_limits_from_wit(meta.agent_limits);
    FactoryMeta::checked(meta.name, meta.description, phases, limits, meta.args_schema, agent_limits)
}

/// The host's form of a WIT `agent-limits` record (unchecked).
pub(crate) fn agent_limits_from_wit(limits: wit::AgentLimits) -> AgentLimits {
    AgentLimits {
        max_turns: limits.max_turns,
        max_duration_seconds: limits.max_duration_seconds,
        wrap_up: limits.wrap_up,
    }
}
