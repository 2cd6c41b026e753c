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
