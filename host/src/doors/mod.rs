//! The front doors of the `factory` binary, each a thin codec over the typed
//! [`factory_host::service`] API: the command line ([`cli`]), the [`control`] socket
//! other local processes talk to, the JSON API and dashboard ([`http`]) and the Model
//! Context Protocol server ([`mcp`]). [`reach`] and [`daemon`] find (or start) the state
//! directory's service that every door is a client of; [`args`] are the options they share,
//! [`state_files`] the files they keep in the state directory, [`trusted`] what this machine
//! trusts to run; [`telemetry`] sets up the binary's logs.

pub mod args;
pub mod cli;
pub mod control;
pub mod daemon;
pub mod elicit;
pub mod http;
pub mod mcp;
pub mod reach;
pub mod state_files;
pub mod telemetry;
pub mod trusted;
