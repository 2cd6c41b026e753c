//! The files the front doors keep in the state directory, named in one place: each door
//! writes its own, and the options every door shares hide them all from agent-CLI sandboxes
//! (`GlobalArgs::sandbox_hidden`).

/// The control socket every front door's client talks to.
pub const CONTROL_SOCKET: &str = "control.sock";
/// The bearer token of `factory serve --http`.
pub const HTTP_TOKEN: &str = "http.token";
/// The address `factory serve --http` listens on.
pub const HTTP_ADDR: &str = "http.addr";
/// The bearer token of `factory mcp --http`.
pub const MCP_TOKEN: &str = "mcp.token";
