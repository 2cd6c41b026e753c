//! One attempt of a run, driven to its end ([`execute`]): instantiate, call `run` inside
//! `run_concurrent`, race it against the stop signal and the deadline, drop the store to stop
//! the guest, flush the journal, and classify the outcome. What the attempt's hooks share and
//! do is in [`crate::capabilities`].

pub(crate) use crate::capabilities::abort::{Abort, LimitKind, Pause};
pub(crate) use crate::capabilities::attempt::AttemptSetup;
use crate::capabilities::attempt::StopCause;
pub(crate) use crate::capabilities::Capabilities;
use crate::engine::state::{self, LoadedComponent};
use crate::model::envelope::{Failure, RunStatus};
use crate::sandbox::SandboxLimits;
use std::sync::Arc;
use std::time::Duration;

/// How an attempt ended.
#[derive(Debug, Clone)]
pub(crate) struct AttemptOutcome {
    pub status: RunStatus,
    pub result: Option<crate::model::json::RawJson>,
    pub failure: Option<Failure>,
}

/// How long a stopped attempt's guest may run on to react to the stop (abort listeners,
/// a last log line) before its store is dropped.
pub(crate) const STOP_GRACE: Duration = Duration::from_millis(500);

/// Run one attempt to its end. `args` is JSON text; `budget` the active time left;
/// `grants` the run's checked read-only directories.
pub(crate) async fn execute(
    engine: &wasmtime::Engine,
    component: &LoadedComponent,
    shared: Arc<Capabilities>,
    args: String,
    budget: Option<Duration>,
    grants: &[String],
) -> AttemptOutcome {
    let stop = shared.attempt.stop_signal().clone();
    // An attempt stopped before it began (no active time left, a cancel that came first)
    // never starts its guest, grace or not.
    let stopped_before = stop.is_cancelled();
    let returned = {
        let mut store = match state::new_store(engine, &shared.attempt.sandbox, shared.clone(), component, grants) {
            Ok(store) => store,
            Err(e) => {
                return outcome_failed(Failure::new(
                    crate::model::envelope::FailureType::Sandbox,
                    None,
                    format!("{e:#}"),
                ))
            }
        };
        let pre = component.pre.clone();
        let call = async {
            let factory = pre.instantiate_async(&mut store).await?;
            store.run_concurrent(async move |accessor| factory.call_run(accessor, args).await).await?
        };
        let deadline = async {
            match budget {
                Some(left) => tokio::time::sleep(left).await,
                None => std::future::pending().await,
            }
        };
        let returned = {
            let mut call = std::pin::pin!(call);
            let returned = tokio::select! {
                biased;
                _ = stop.cancelled() => None,
                _ = deadline => {
                    shared.attempt.abort(Abort::Limit(LimitKind::TimeoutSeconds));
                    None
                }
                r = &mut call => Some(r),
            };
            // A stop lets a guest that can react to it (a script, whose runner fires
            // `ctx.signal`; a component that has asked `ctx.cancelled` or `ctx.stop-reason`)
            // run on for [`STOP_GRACE`] (its sleeps and agent calls answer at once, with the
            // abort) so that its listeners run; then the store goes. A component that never
            // asked has nothing to run: it stops at once. What the guest returns meanwhile
            // does not count: the cause wins.
            let reacts = component.script.is_some() || shared.attempt.watched();
            if returned.is_none() && !stopped_before && reacts {
                let _ = tokio::time::timeout(STOP_GRACE, &mut call).await;
            }
            returned
        };
        // Dropping the store here stops the guest and every host future it spawned.
        let output = store.data().captured_output();
        drop(store);
        for line in String::from_utf8_lossy(&output).lines() {
            shared.progress.log(format!("[guest] {line}"));
        }
        returned
    };

    // Whatever happened, nothing is reported before the journal is durable.
    let flushed = shared.attempt.journal.flush().await;
    let cause = shared.attempt.cause();
    let mut outcome = match (cause, returned) {
        (Some(StopCause::Cancelled), _) => AttemptOutcome {
            status: RunStatus::Cancelled,
            result: None,
            failure: Some(Failure::new(crate::model::envelope::FailureType::Cancelled, None, "the run was cancelled")),
        },
        // A recorded failure wins over whatever the guest returned after it.
        (Some(StopCause::Failed(failure, _)), _) => outcome_failed(failure),
        (Some(StopCause::Paused(pause)), _) => {
            AttemptOutcome { status: RunStatus::Paused, result: None, failure: Some(paused_failure(&pause)) }
        }
        (Some(StopCause::Halted), _) => AttemptOutcome {
            status: RunStatus::Halted,
            result: None,
            failure: Some(Failure::new(
                crate::model::envelope::FailureType::Halted,
                None,
                "the host shut down during this attempt; resume to continue",
            )),
        },
        // Only a cancel from outside stops an attempt without recording a cause.
        (None, None) => AttemptOutcome {
            status: RunStatus::Cancelled,
            result: None,
            failure: Some(Failure::new(crate::model::envelope::FailureType::Cancelled, None, "the run was cancelled")),
        },
        (None, Some(Err(trap))) => outcome_failed(classify_trap(&trap)),
        (None, Some(Ok(Err(message)))) if component.script.is_some() => {
            match crate::guests::script::runner_error(message) {
                crate::guests::script::RunnerError::InvalidResult(message) => {
                    outcome_failed(Failure::new(crate::model::envelope::FailureType::InvalidResult, None, message))
                }
                crate::guests::script::RunnerError::Thrown(message) => {
                    outcome_failed(Failure::new(crate::model::envelope::FailureType::GuestError, None, message))
                }
            }
        }
        (None, Some(Ok(Err(message)))) => {
            outcome_failed(Failure::new(crate::model::envelope::FailureType::GuestError, None, message))
        }
        (None, Some(Ok(Ok(result)))) => match check_result(result, &shared.attempt.sandbox) {
            Ok(result) => AttemptOutcome { status: RunStatus::Completed, result, failure: None },
            Err(failure) => outcome_failed(failure),
        },
    };
    if let Err(e) = flushed {
        outcome = outcome_failed(Failure::new(crate::model::envelope::FailureType::Storage, None, e.to_string()));
    }
    outcome
}

/// What a paused run's envelope says: why it paused and how to go on.
fn paused_failure(pause: &Pause) -> Failure {
    let message = match pause {
        Pause::Caller => "the run was paused; resume it to continue (its journaled work replays for free)".to_string(),
        Pause::Checkpoint(key) => format!(
            "the run waits at checkpoint `{key}`; resume it to continue, with an answer (`factory resume RUN --input JSON`) \
             that ctx.pause returns, or without one (it returns none)"
        ),
    };
    Failure::new(crate::model::envelope::FailureType::Paused, Some(pause.kind()), message)
}

fn outcome_failed(failure: Failure) -> AttemptOutcome {
    AttemptOutcome { status: RunStatus::Error, result: None, failure: Some(failure) }
}

/// The run's result must be JSON within the size cap.
fn check_result(
    result: Option<String>,
    sandbox: &SandboxLimits,
) -> Result<Option<crate::model::json::RawJson>, Failure> {
    let Some(text) = result else { return Ok(None) };
    if text.len() > sandbox.max_result_bytes {
        return Err(Failure::sandbox_limit(
            crate::model::sandbox_limits::SandboxLimitKind::MaxResultBytes,
            format!("result is {} bytes, over the {} byte limit", text.len(), sandbox.max_result_bytes),
        ));
    }
    let depth = crate::model::json::depth(&text);
    if depth > sandbox.max_json_depth {
        return Err(Failure::sandbox_limit(
            crate::model::sandbox_limits::SandboxLimitKind::MaxJsonDepth,
            format!("result is nested {depth} deep, over the limit of {}", sandbox.max_json_depth),
        ));
    }
    crate::model::json::RawJson::from_text(text).map(Some).map_err(|e| {
        Failure::new(crate::model::envelope::FailureType::InvalidResult, None, format!("the result is {e}"))
    })
}

/// Name what stopped a guest: fuel, memory, stack, or a plain trap (a panic is `unreachable`).
pub(crate) fn classify_trap(error: &wasmtime::Error) -> Failure {
    let message = format!("{error:#}");
    if let Some(trap) = error.downcast_ref::<wasmtime::Trap>() {
        match trap {
            wasmtime::Trap::OutOfFuel => {
                return Failure::sandbox_limit(
                    crate::model::sandbox_limits::SandboxLimitKind::Fuel,
                    "the guest used up its CPU fuel budget",
                )
            }
            wasmtime::Trap::StackOverflow => {
                return Failure::sandbox_limit(
                    crate::model::sandbox_limits::SandboxLimitKind::Stack,
                    "the guest overflowed its stack",
                )
            }
            wasmtime::Trap::UnreachableCodeReached => {
                return Failure::new(
                    crate::model::envelope::FailureType::Trap,
                    Some("unreachable"),
                    format!("the guest trapped (a panic?): {message}"),
                )
            }
            _ => {}
        }
    }
    // The refused growth alone: the wasm backtrace around it says nothing to the factory's
    // author.
    match error.downcast_ref::<crate::sandbox::GrowthRefused>() {
        Some(refused @ crate::sandbox::GrowthRefused::Memory { .. }) => {
            return Failure::sandbox_limit(
                crate::model::sandbox_limits::SandboxLimitKind::Memory,
                format!("the guest exceeded its memory limit: {refused}"),
            );
        }
        Some(refused @ crate::sandbox::GrowthRefused::Table { .. }) => {
            return Failure::sandbox_limit(
                crate::model::sandbox_limits::SandboxLimitKind::Table,
                format!("the guest exceeded its table limit: {refused}"),
            );
        }
        None => {}
    }
    Failure::new(crate::model::envelope::FailureType::Trap, None, message)
}
