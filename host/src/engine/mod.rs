//! The run engine: [`host::Host`] loads factories, runs, resumes, cancels and observes
//! them; [`run`] drives one attempt (memo, limits, accounting, stop, outcome) with the
//! [`journal`] it writes through and the [`cache`] of compiled components.

pub(crate) mod abort;
pub(crate) mod cache;
pub(crate) mod grant;
pub mod host;
pub mod journal;
pub(crate) mod run;
