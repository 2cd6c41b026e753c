//! The run engine: [`host::Host`] loads factories, runs, resumes, cancels and observes
//! them, and recovers halted runs ([`recover`]); [`run`] drives one attempt to its end and
//! classifies its outcome; [`queue`] is a worker's side of a shared store's run queue. The hooks an attempt serves are [`crate::capabilities`].

pub mod host;
pub mod queue;
pub mod recover;
pub(crate) mod run;
