//! `ctx.pause(key)`: durable one-shot checkpoints. A checkpoint the run has passed answers
//! with what the resume that passed it carried (the run's record keeps every answer, so a
//! later attempt, or one after a crash, gets the same); one reached for the first time stops
//! the attempt with [`Pause::Checkpoint`], and the run ends `paused` waiting at its key.

use super::abort::{Abort, Pause};
use super::attempt::Attempt;
use crate::model::sandbox_limits::SandboxLimitKind;

/// The most checkpoints one run may pass: each answer is kept in the run's record.
pub(crate) const MAX_CHECKPOINTS: usize = 256;

/// The longest answer (a resume's `input`, as JSON text) a checkpoint keeps (64 KiB): the
/// answers live in the run's record, which every listing reads.
pub const MAX_ANSWER_BYTES: usize = 64 << 10;

/// The most bytes of answers one run keeps over all its checkpoints (1 MiB).
pub const MAX_ANSWERS_BYTES: usize = 1 << 20;

/// `ctx.pause(key)`: the answer of a checkpoint passed before, else the abort that pauses
/// the run at `key` (or the abort of a stop already under way).
pub(crate) fn pause(attempt: &Attempt, key: String) -> Result<Option<String>, Abort> {
    if let Some(abort) = attempt.stopping() {
        return Err(abort);
    }
    attempt.cap(SandboxLimitKind::MaxStepKeyBytes, "checkpoint key", key.len(), attempt.sandbox.max_step_key_bytes)?;
    if key.is_empty() {
        return Err(attempt.abort(Abort::InvalidCall("ctx.pause: the checkpoint key is empty".into())));
    }
    if let Some(answer) = attempt.answers.get(&key) {
        return Ok(answer.clone());
    }
    if attempt.answers.len() >= MAX_CHECKPOINTS {
        let message = format!("the run has passed {MAX_CHECKPOINTS} checkpoints, the most one run may pass");
        return Err(attempt.abort(Abort::SandboxLimit { kind: SandboxLimitKind::MaxCheckpoints, message }));
    }
    Err(attempt.abort(Abort::Paused(Pause::Checkpoint(key))))
}
