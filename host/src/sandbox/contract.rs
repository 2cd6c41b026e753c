//! The host side of `wit/`: `bindgen!` of the `factory` world, and the conversions between
//! its generated types and the host's own.

wasmtime::component::bindgen!({
    path: "../wit",
    world: "factory",
    imports: {
        "agent:factory/agents.agent": async | store | trappable,
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
