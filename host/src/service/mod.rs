//! The service API: one typed API that owns the runs and that every front door speaks. The
//! CLI, the control socket, the HTTP API and MCP all turn what they are asked into a
//! [`Request`], hand it to a [`Client`] and turn the typed [`Response`] back into their own
//! form; none of them reads a run, a store or a backend itself.
//!
//! A [`Client`] has two transports: [`Local`], the service implemented over an in-process
//! [`crate::Host`] (the process that holds the store), and [`Remote`], a client of the
//! control socket of the process that does. Both answer the same requests with the same
//! responses and the same [`ErrorCode`]s; one [`Follower`] follows a run through either.
//! The consent policy ([`Consent`], [`consented`]) and the one trust-key derivation
//! ([`trust_key`]) live here too, so every front door decides the same way, and the
//! pending approvals ([`Approvals`]) a start waits in for the owner's answer. Every read or
//! control of a run carries a [`Scope`]: the front doors of the local user (the CLI, the
//! HTTP API) ask as [`Scope::Owner`], other callers (an MCP connection) as their session.

pub mod approvals;
mod client;
mod consent;
mod follow;
mod local;
mod remote;
mod wire;

pub use crate::error::ErrorCode;
pub use crate::model::scope::Scope;
pub use approvals::{Approval, ApprovalState, Approvals, Decision, Started};
pub use client::{Client, ServiceError, Updates};
pub use consent::{consented, registration_trust_key, trust_key, Consent, Operation, Question, TrustCheck};
pub use follow::{Followed, Follower};
pub use local::{Attempt, InProcess, Local};
pub use remote::{ClientError, FollowStream, Remote};
pub use wire::{
    caller_cwd, parse_request, read_line_bounded, Answer, Description, Event, FollowEvent, Frame, RemoteError, Removed,
    Request, Response, Source, StartedAnswer, Tape, Target, MAX_REQUEST_BYTES, MAX_RESPONSE_BYTES,
    MAX_TAPE_REQUEST_BYTES, WIRE_VERSION,
};
