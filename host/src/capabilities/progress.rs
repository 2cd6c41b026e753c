//! Phase and log (`ctx.phase`, `ctx.log`): the guest's own progress lines. This module owns
//! their semantics and per-run state: the caps on log lines (count, line length, total
//! bytes; lines over a cap are dropped and counted, long lines truncated) and on phase
//! titles. Entries are written to the attempt's progress journal
//! ([`super::attempt::Attempt::emit`]). The hooks reach them through [`ProgressView`].

use super::attempt::Attempt;
use crate::model::progress::{LogLevel, ProgressEvent};
use crate::model::sandbox_limits::SandboxLimitKind;
use std::sync::{Arc, Mutex};

/// Log lines kept and dropped so far in this attempt.
#[derive(Default)]
struct LogCounters {
    lines: usize,
    bytes: usize,
    dropped: u64,
}

/// How the hooks reach the phase and log state of the attempt a store runs (the run's state
/// in the store data implements it).
pub(crate) trait ProgressView: Send + 'static {
    /// The attempt's phase and log state.
    fn progress(&self) -> &Progress;
}

/// The phase and log hooks of one attempt.
pub(crate) struct Progress {
    attempt: Arc<Attempt>,
    log: Mutex<LogCounters>,
}

impl Progress {
    /// Phase and log over `attempt`.
    pub(crate) fn new(attempt: Arc<Attempt>) -> Progress {
        Progress { attempt, log: Mutex::new(LogCounters::default()) }
    }

    /// `ctx.phase`: a title over `maxPhaseBytes` stops the attempt and is not recorded.
    pub(crate) fn phase(&self, title: String) {
        let attempt = &self.attempt;
        if attempt
            .cap(SandboxLimitKind::MaxPhaseBytes, "phase title", title.len(), attempt.sandbox.max_phase_bytes)
            .is_err()
        {
            return;
        }
        attempt.enter_phase(&title);
        attempt.emit(ProgressEvent::Phase { title });
    }

    /// `ctx.log` (and the host's own lines about the run): [`Progress::log_at`] level `info`.
    pub(crate) fn log(&self, message: String) {
        self.log_at(LogLevel::Info, message)
    }

    /// `ctx.log-at` (a JS `console` line): capped in line count, line length and total
    /// bytes, every level together; lines over a cap are dropped and counted.
    pub(crate) fn log_at(&self, level: LogLevel, mut message: String) {
        let sandbox = &self.attempt.sandbox;
        let kept = message.len().min(sandbox.max_log_line_bytes);
        {
            let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
            if log.lines >= sandbox.max_log_lines || log.bytes + kept > sandbox.max_log_bytes {
                log.dropped += 1;
                return;
            }
            log.lines += 1;
            log.bytes += kept;
        }
        if message.len() > sandbox.max_log_line_bytes {
            let mut cut = sandbox.max_log_line_bytes;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
            message.push_str(" [truncated]");
        }
        self.attempt.emit(ProgressEvent::Log { message, level });
    }

    /// Log lines dropped over the cap.
    pub(crate) fn dropped_log_lines(&self) -> u64 {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).dropped
    }
}
