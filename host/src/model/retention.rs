//! The retention policy (`[retention]` in `factory.toml`, `factory gc`'s flags): which ended
//! runs are kept and which [`Retention::expired`] picks for deletion. A run is deleted only
//! when no rule keeps it: it ended for good (`completed`, `error` or `cancelled`; a `halted`
//! or `paused` run waits for a resume and is always kept), it was last updated more than
//! `keep_days` days ago (when set), and it is not among the newest `keep_last` runs of its
//! factory (when set). A policy with neither rule keeps everything.

use crate::model::envelope::RunStatus;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::time::{Duration, SystemTime};

/// Seconds between two passes of the service's collector when the config names none: 1 hour.
pub const DEFAULT_GC_INTERVAL_SECONDS: u64 = 3600;

/// Which ended runs are kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Retention {
    /// Keep runs updated in the last `keep_days` days.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_days: Option<u32>,
    /// Keep the newest `keep_last` runs of each factory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_last: Option<u32>,
}

/// What [`Retention::expired`] reads of a run.
#[derive(Debug, Clone)]
pub struct Candidate<'a> {
    /// The run's id.
    pub run_id: &'a str,
    /// Its factory's name.
    pub factory: &'a str,
    /// Its status.
    pub status: RunStatus,
    /// When its record was last written (`None`: unreadable time, kept).
    pub updated: Option<SystemTime>,
    /// Its creation sequence (larger: newer).
    pub seq: u64,
}

impl Retention {
    /// Whether the policy has a rule (one without keeps everything).
    pub fn is_set(&self) -> bool {
        self.keep_days.is_some() || self.keep_last.is_some()
    }

    /// The ids of the `runs` no rule keeps at `now`, oldest first.
    pub fn expired<'a>(&self, runs: &[Candidate<'a>], now: SystemTime) -> Vec<&'a str> {
        if !self.is_set() {
            return Vec::new();
        }
        // The newest `keep_last` of each factory, by creation sequence.
        let mut by_factory: HashMap<&str, Vec<u64>> = HashMap::new();
        for run in runs {
            by_factory.entry(run.factory).or_default().push(run.seq);
        }
        let newest_kept: HashMap<&str, u64> = match self.keep_last {
            None => HashMap::new(),
            Some(keep) => by_factory
                .into_iter()
                .map(|(factory, mut seqs)| {
                    seqs.sort_unstable_by(|a, b| b.cmp(a));
                    // The oldest sequence still kept (none kept: past every run).
                    let floor = if keep == 0 { u64::MAX } else { *seqs.get(keep as usize - 1).unwrap_or(&0) };
                    (factory, floor)
                })
                .collect(),
        };
        let cutoff = self.keep_days.map(|days| now.checked_sub(Duration::from_secs(u64::from(days) * 86_400)));
        let mut out: Vec<&Candidate<'a>> = runs
            .iter()
            .filter(|run| matches!(run.status, RunStatus::Completed | RunStatus::Error | RunStatus::Cancelled))
            .filter(|run| match self.keep_last {
                None => true,
                Some(_) => newest_kept.get(run.factory).is_some_and(|floor| run.seq < *floor),
            })
            .filter(|run| match cutoff {
                None => true,
                // A cutoff before the epoch keeps everything.
                Some(None) => false,
                Some(Some(cutoff)) => run.updated.is_some_and(|updated| updated < cutoff),
            })
            .collect();
        out.sort_by_key(|run| run.seq);
        out.into_iter().map(|run| run.run_id).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<'a>(id: &'a str, factory: &'a str, status: RunStatus, days_ago: u64, seq: u64) -> Candidate<'a> {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(100 * 86_400);
        Candidate { run_id: id, factory, status, updated: Some(now - Duration::from_secs(days_ago * 86_400)), seq }
    }

    #[test]
    fn a_run_goes_only_when_no_rule_keeps_it() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(100 * 86_400);
        let runs = [
            run("a1", "a", RunStatus::Completed, 30, 1),
            run("a2", "a", RunStatus::Error, 20, 2),
            run("b1", "b", RunStatus::Cancelled, 20, 3),
            run("a3", "a", RunStatus::Halted, 20, 4),
            run("a4", "a", RunStatus::Paused, 20, 5),
            run("a5", "a", RunStatus::Running, 20, 6),
            run("a6", "a", RunStatus::Completed, 1, 7),
        ];
        assert!(Retention::default().expired(&runs, now).is_empty(), "no rule keeps everything");
        let days = Retention { keep_days: Some(7), keep_last: None };
        assert_eq!(days.expired(&runs, now), ["a1", "a2", "b1"], "halted, paused, running and recent runs stay");
        let last = Retention { keep_days: None, keep_last: Some(4) };
        assert_eq!(last.expired(&runs, now), ["a1", "a2"], "the newest 4 of `a` and the one of `b` stay");
        let both = Retention { keep_days: Some(25), keep_last: Some(4) };
        assert_eq!(both.expired(&runs, now), ["a1"], "old and beyond the last 4");
        let none_kept = Retention { keep_days: None, keep_last: Some(0) };
        assert_eq!(none_kept.expired(&runs, now), ["a1", "a2", "b1", "a6"]);
    }
}
