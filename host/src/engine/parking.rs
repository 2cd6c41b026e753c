//! Runs parked for a spent quota, and how a run was stopped: what the run engine
//! ([`crate::engine::host`]) and automatic recovery ([`crate::engine::recover`]) both read of
//! a run record ([`is_interrupted`], [`is_parked`], [`parked_until`]), the timer's book of
//! parked runs this process resumes by itself ([`Parking`]), and the command that resumes a
//! run by hand ([`resume_command`]).

use crate::model::envelope::{Failure, RunStatus};
use crate::store::{Interruption, RunRecord, DEFAULT_SESSION};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// True when `record` is a run its process stopped: `halted` with an interruption mark (a
/// crash or a shutdown; a run parked for its quota is [`parked_until`]'s).
pub fn is_interrupted(record: &RunRecord) -> bool {
    record.envelope.status == RunStatus::Halted
        && matches!(record.interrupted, Some(Interruption::Crash | Interruption::Shutdown))
}

/// True when `record` is a run its backend's spent quota stopped (`halted`, failure
/// `backend`/`quota`), whether or not the provider said when the quota resets.
pub fn is_parked(record: &RunRecord) -> bool {
    record.envelope.status == RunStatus::Halted && record.envelope.failure.as_ref().is_some_and(Failure::is_spent_quota)
}

/// When the service resumes `record` by itself: for a run parked until a known reset, its
/// `resumeAt` (an unreadable one: now); `None` for every other run.
pub fn parked_until(record: &RunRecord) -> Option<SystemTime> {
    if !(record.envelope.status == RunStatus::Halted && record.interrupted == Some(Interruption::Quota)) {
        return None;
    }
    let at = record.envelope.resume_at.as_deref().and_then(|t| humantime::parse_rfc3339_weak(t).ok());
    Some(at.unwrap_or_else(SystemTime::now))
}

/// The longest the timer of parked runs sleeps before it looks again (a clock that jumped,
/// a run parked by another worker of a shared store that this one armed at its start).
pub(crate) const PARKED_RECHECK: Duration = Duration::from_secs(30);

/// The runs this process resumes by itself when their quota resets, and when: armed when an
/// attempt parks its run, and at a service's start ([`arm_parked`]). One entry per parked run.
#[derive(Default)]
pub(crate) struct Parking {
    due: Mutex<HashMap<String, SystemTime>>,
    pub(crate) changed: tokio::sync::Notify,
    /// Set when the host shuts down or drains: no parked run is resumed here any more.
    closed: std::sync::atomic::AtomicBool,
}

impl Parking {
    fn due(&self) -> std::sync::MutexGuard<'_, HashMap<String, SystemTime>> {
        self.due.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Resume `run_id` at `at` (replacing an earlier time).
    pub(crate) fn arm(&self, run_id: &str, at: SystemTime) {
        self.due().insert(run_id.to_string(), at);
        self.changed.notify_one();
    }

    /// Forget `run_id` (cancelled, or resumed by a caller).
    pub(crate) fn disarm(&self, run_id: &str) {
        self.due().remove(run_id);
    }

    /// Resume no parked run here any more (the host shuts down or drains).
    pub(crate) fn close(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub(crate) fn closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// How many parked runs wait for their time here.
    pub(crate) fn waiting(&self) -> usize {
        self.due().len()
    }

    /// Take the runs due at `now`; and the next time after them, if any.
    pub(crate) fn take_due(&self, now: SystemTime) -> (Vec<String>, Option<SystemTime>) {
        let mut due = self.due();
        let ready: Vec<String> = due.iter().filter(|(_, at)| **at <= now).map(|(id, _)| id.clone()).collect();
        for id in &ready {
            due.remove(id);
        }
        (ready, due.values().min().copied())
    }
}

/// `factory resume ID`, with `--session` when the run is not in the default session.
pub(crate) fn resume_command(run_id: &str, session: &str) -> String {
    if session == DEFAULT_SESSION {
        return format!("factory resume {run_id}");
    }
    let plain = session.chars().all(|c| c.is_ascii_alphanumeric() || "-_.:@/".contains(c));
    let quoted = if plain { session.to_string() } else { format!("'{}'", session.replace('\'', r"'\''")) };
    format!("factory resume {run_id} --session {quoted}")
}

#[cfg(test)]
mod tests {
    use super::{resume_command, Parking};
    use std::time::{Duration, SystemTime};

    #[test]
    fn parking_hands_out_each_run_once_when_due_and_forgets_disarmed_ones() {
        let parking = Parking::default();
        let now = SystemTime::now();
        parking.arm("past", now - Duration::from_secs(5));
        parking.arm("soon", now + Duration::from_secs(60));
        parking.arm("gone", now - Duration::from_secs(1));
        parking.disarm("gone");
        assert_eq!(parking.waiting(), 2);
        let (ready, next) = parking.take_due(now);
        assert_eq!(ready, vec!["past".to_string()]);
        assert_eq!(next, Some(now + Duration::from_secs(60)));
        assert_eq!(parking.take_due(now).0, Vec::<String>::new(), "handed out once");
        // Armed again with a later time: the later one holds.
        parking.arm("soon", now + Duration::from_secs(120));
        assert_eq!(parking.take_due(now + Duration::from_secs(90)).0, Vec::<String>::new());
        assert_eq!(parking.take_due(now + Duration::from_secs(120)).0, vec!["soon".to_string()]);
        assert_eq!(parking.waiting(), 0);
        assert!(!parking.closed());
        parking.close();
        assert!(parking.closed());
    }

    #[test]
    fn the_resume_command_names_a_session_other_than_the_default_quoted_for_a_shell() {
        assert_eq!(resume_command("r1", "default"), "factory resume r1");
        assert_eq!(resume_command("r1", "mcp:claude"), "factory resume r1 --session mcp:claude");
        assert_eq!(resume_command("r1", "it's mine"), r"factory resume r1 --session 'it'\''s mine'");
    }
}
