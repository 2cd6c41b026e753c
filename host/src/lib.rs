//! `factory-host`: runs agent factories — WebAssembly components of the `agent:factory`
//! world — in a sandbox, with memoized and journaled subagent calls and hard limits.
//!
//! Start with [`Host`]: load a component ([`Host::load_file`]), run it ([`Host::run`]),
//! read the [`RunEnvelope`].

mod abort;
pub mod access;
mod agent_key;
mod cache;
pub mod backend;
pub mod builder;
pub mod config;
pub mod component;
pub mod control;
mod contract;
mod envelope;
mod error;
mod grant;
mod hooks;
mod host;
pub mod journal;
pub mod json;
pub mod limits;
mod meta;
mod progress;
pub mod pybuild;
pub mod recover;
mod run;
pub mod sandbox;
pub mod schema;
pub mod script;
pub mod store;
pub mod trust;
mod typescript;

pub use agent_key::AgentKey;
pub use envelope::{Accounting, Failure, FailureType, RunEnvelope, RunStatus};
pub use error::{Error, ErrorCode};
pub use host::{
    default_cache_dir, BackendChoice, Factory, Host, HostConfig, ResumeOptions, RunDetail, RunOptions, DETAIL_AGENTS,
    DETAIL_SCAN_ENTRIES, DEFAULT_SESSION,
};
pub use limits::Limits;
pub use meta::{FactoryMeta, MetaError, PhaseDecl};
pub use progress::{AgentStatus, AgentSummary, ProgressEntry, ProgressEvent, RunUpdated};
