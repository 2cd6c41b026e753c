//! `factory-host`: runs agent factories — WebAssembly components of the `agent:factory`
//! world — in a sandbox, with memoized and journaled subagent calls and hard limits.
//!
//! Start with [`Host`]: load a component ([`Host::load_file`]), run it ([`Host::run`]),
//! read the [`RunEnvelope`]. Front doors speak the typed [`service`] API.
//!
//! The tree follows the way data flows: [`service`] (the typed API every front door
//! speaks) -> [`engine`] (`Host`, the run engine) -> [`sandbox`] | [`store`] | [`backend`],
//! with [`capabilities`] (what the guest may call), [`guests`] (building and loading each
//! guest language) and [`model`] (the vocabulary every layer shares: envelopes, progress,
//! limits, meta, schemas, guest JSON). [`trace`] names the spans every layer opens;
//! [`metrics`] counts what they do.

pub mod access;
pub mod backend;
pub mod bwrap;
mod capabilities;
pub mod engine;
mod error;
pub mod guests;
pub mod metrics;
pub mod model;
pub mod sandbox;
pub mod service;
pub mod store;
pub mod trace;

// The public paths of modules that moved into their layer.
pub use backend::config;
pub use guests::{python as pybuild, rust as builder, script};
pub use model::{json, limits, schema, tuning};
pub use sandbox::component;
pub use store::journal;
pub use store::trust;

pub use engine::host::{
    default_cache_dir, BackendChoice, Factory, Host, HostConfig, ResumeOptions, RunDetail, RunOptions, DEFAULT_SESSION,
    DETAIL_AGENTS, DETAIL_SCAN_ENTRIES, MAX_RUNS_PAGE, RUNS_PAGE_DEFAULT_LIMIT, RUNS_PAGE_MAX_LIMIT,
};
pub use engine::recover;
pub use error::{Error, ErrorCode};
pub use model::agent_key::AgentKey;
pub use model::envelope::{Accounting, Failure, FailureType, RunEnvelope, RunStatus, RunSummary, RunsPage};
pub use model::limits::Limits;
pub use model::meta::{FactoryMeta, MetaError, PhaseDecl};
pub use model::progress::{
    AgentStatus, AgentSummary, LogLevel, ProgressEntry, ProgressEvent, RunSettled, RunStarted, RunUpdated,
};
pub use model::scope::Scope;
