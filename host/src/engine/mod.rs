//! The run engine: [`host::Host`] loads factories, runs, resumes, cancels and observes
//! them, and recovers halted runs ([`recover`]) and runs parked for a spent quota ([`parking`]); [`run`] drives one attempt to its end and
//! classifies its outcome; [`queue`] is a worker's side of a shared store's run queue, under
//! the [`caps`] it is given (what it checks before it runs what a shared store says is
//! [`crate::sandbox::admission`]); [`gc`] deletes the ended runs a retention policy no longer
//! keeps. The hooks an attempt serves are [`crate::capabilities`]; [`state`] is what the
//! engine puts in each store for them (the host part of the sandbox's store data, which the
//! capabilities reach through their views) and the components linked against it.

pub mod caps;
pub mod gc;
pub mod host;
pub mod live;
pub(crate) mod loaded;
pub mod parking;
pub mod queue;
pub mod recover;
pub(crate) mod run;
pub mod state;
