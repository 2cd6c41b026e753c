//! The run engine: [`host::Host`] loads factories, runs, resumes, cancels and observes
//! them; [`run`] drives one attempt (memo, limits, accounting, stop, outcome) with the
//! store's journal it writes through and the [`cache`] of compiled components.

pub(crate) mod abort;
pub(crate) mod cache;
pub mod host;
pub mod recover;
pub(crate) mod run;
