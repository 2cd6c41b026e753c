//! What a run's detail says of the moment it was read: the agents of the latest attempt that
//! run and those that wait for a concurrency slot (label, since when), and the phases its
//! factory declares with the ones entered and the current one marked. Folded from the
//! progress log as [`crate::engine::host::Host::detail`] reads it, oldest entry first.

use crate::model::meta::PhaseDecl;
use crate::model::progress::{ProgressEntry, ProgressEvent};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// The most agents [`Live`] lists as running and as queued (each): the oldest are left out.
pub const MAX_LIVE_AGENTS: usize = 1_000;

/// An agent call running or queued.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LiveAgent {
    /// Its label.
    pub label: String,
    /// When it started or was queued (milliseconds since the Unix epoch).
    pub since_ms: u64,
}

/// A declared phase, marked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeclaredPhase {
    /// Its title.
    pub title: String,
    /// Its explanation, when declared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Whether the run entered it (in the entries read).
    pub entered: bool,
    /// Whether it is the phase the run is in (the last one entered).
    pub current: bool,
}

/// The live part of a run's detail.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Live {
    /// Agents of the latest attempt that run, oldest first.
    pub running: Vec<LiveAgent>,
    /// Agents of the latest attempt that wait for a slot, oldest first.
    pub queued: Vec<LiveAgent>,
}

/// Fold `entries` (oldest first) into the agents running and queued now; `executing`:
/// whether an attempt executes (else none runs, whatever the log says last).
pub fn live<'a>(entries: impl IntoIterator<Item = &'a ProgressEntry>, executing: bool) -> Live {
    let (mut running, mut queued) = (VecDeque::<LiveAgent>::new(), VecDeque::<LiveAgent>::new());
    let take = |list: &mut VecDeque<LiveAgent>, label: &str| {
        list.iter().position(|a| a.label == label).and_then(|i| list.remove(i))
    };
    for entry in entries {
        match &entry.event {
            ProgressEvent::AttemptStarted { .. } | ProgressEvent::AttemptEnded { .. } => {
                running.clear();
                queued.clear();
            }
            ProgressEvent::AgentQueued { label } => {
                queued.push_back(LiveAgent { label: label.clone(), since_ms: entry.at_ms });
                if queued.len() > MAX_LIVE_AGENTS {
                    queued.pop_front();
                }
            }
            ProgressEvent::AgentStarted { label, attempt } => {
                take(&mut queued, label);
                // A retry's spawn is the same call, still running.
                let retry = *attempt > 1 && running.iter().any(|a| a.label == *label);
                if !retry {
                    running.push_back(LiveAgent { label: label.clone(), since_ms: entry.at_ms });
                    if running.len() > MAX_LIVE_AGENTS {
                        running.pop_front();
                    }
                }
            }
            ProgressEvent::AgentFinished { summary, cached: false } => {
                take(&mut running, &summary.label).or_else(|| take(&mut queued, &summary.label));
            }
            _ => {}
        }
    }
    if !executing {
        return Live::default();
    }
    Live { running: running.into(), queued: queued.into() }
}

/// The `declared` phases, marked with those in `entered` (in order) and the current one.
pub fn declared_phases(declared: &[PhaseDecl], entered: &[String]) -> Vec<DeclaredPhase> {
    let current = entered.last();
    declared
        .iter()
        .map(|p| DeclaredPhase {
            title: p.title.clone(),
            detail: p.detail.clone(),
            entered: entered.contains(&p.title),
            current: current == Some(&p.title),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::progress::AgentSummary;

    fn entry(at_ms: u64, event: ProgressEvent) -> ProgressEntry {
        ProgressEntry { seq: at_ms, at_ms, phase: None, event }
    }

    fn finished(label: &str) -> ProgressEvent {
        ProgressEvent::AgentFinished {
            summary: AgentSummary { label: label.into(), ..AgentSummary::default() },
            cached: false,
        }
    }

    #[test]
    fn agents_move_from_queued_to_running_to_done() {
        let log = [
            entry(1, ProgressEvent::AttemptStarted { attempt: 1 }),
            entry(2, ProgressEvent::AgentStarted { label: "a".into(), attempt: 1 }),
            entry(3, ProgressEvent::AgentQueued { label: "b".into() }),
            entry(4, ProgressEvent::AgentQueued { label: "c".into() }),
            entry(5, finished("a")),
            entry(6, ProgressEvent::AgentStarted { label: "b".into(), attempt: 1 }),
        ];
        let now = live(&log, true);
        assert_eq!(now.running, [LiveAgent { label: "b".into(), since_ms: 6 }]);
        assert_eq!(now.queued, [LiveAgent { label: "c".into(), since_ms: 4 }]);
        assert_eq!(live(&log, false), Live::default(), "a run that does not execute has none");
    }

    #[test]
    fn a_new_attempt_forgets_the_last_ones_agents() {
        let log = [
            entry(1, ProgressEvent::AgentStarted { label: "a".into(), attempt: 1 }),
            entry(2, ProgressEvent::AttemptStarted { attempt: 2 }),
            entry(3, ProgressEvent::AgentStarted { label: "z".into(), attempt: 1 }),
        ];
        assert_eq!(live(&log, true).running, [LiveAgent { label: "z".into(), since_ms: 3 }]);
    }

    #[test]
    fn declared_phases_are_marked() {
        let declared: Vec<PhaseDecl> =
            ["Scan", "Verify", "Merge"].iter().map(|t| PhaseDecl { title: t.to_string(), detail: None }).collect();
        let marked = declared_phases(&declared, &["Scan".into(), "Verify".into()]);
        assert_eq!(
            marked.iter().map(|p| (p.entered, p.current)).collect::<Vec<_>>(),
            [(true, false), (true, true), (false, false)]
        );
    }
}
