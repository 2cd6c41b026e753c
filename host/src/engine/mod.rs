//! The run engine: [`host::Host`] loads factories, runs, resumes, cancels and observes
//! them, and recovers halted runs ([`recover`]); [`run`] drives one attempt to its end and
//! classifies its outcome. The hooks an attempt serves are [`crate::capabilities`].

pub mod host;
pub mod recover;
pub(crate) mod run;
