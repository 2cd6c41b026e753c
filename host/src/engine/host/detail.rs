//! A run's detail: its phases, agent summaries, live agents and flows and latest progress page,
//! bounded however long its history is ([`RunDetail`]).

use super::Host;
use crate::backend::BackendRef;
use crate::error::Error;
use crate::guests::script::ScriptRef;
use crate::model::envelope::{RunEnvelope, RunStatus};
use crate::model::limits::Limits;
use crate::model::progress::{AgentSummary, ProgressEntry, ProgressEvent};
use crate::model::scope::Scope;
use crate::sandbox::SandboxLimits;
use crate::store::ProgressQuery;

/// A run with its phases, agent summaries and latest progress page. On the wire it is the
/// envelope's fields and its own side by side (see its `Deserialize`).
#[derive(Debug, Clone, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunDetail {
    /// The envelope.
    #[serde(flatten)]
    pub envelope: RunEnvelope,
    /// Effective limits of the latest attempt.
    pub limits: Limits,
    /// Phases entered, in order (consecutive repeats folded).
    pub phases: Vec<String>,
    /// Agent summaries (no prompts), in completion order.
    pub agents: Vec<AgentSummary>,
    /// The latest progress page.
    pub progress: Vec<ProgressEntry>,
    /// Component sha256 of each attempt.
    pub component_hashes: Vec<String>,
    /// The source each attempt ran, for a script factory (index-aligned with
    /// `component_hashes`; `null` for a component).
    pub scripts: Vec<Option<ScriptRef>>,
    /// The modules the run's script loaded (module name -> sha256, the directory, every
    /// answered import), over the attempts that ran its latest source (`resume --component`
    /// starts a new record); absent when it loaded none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modules: Option<crate::guests::modules::Manifest>,
    /// The backend of each attempt.
    pub backends: Vec<BackendRef>,
    /// Read-only directory grants (canonical host paths; the `i`-th is `/grant/<i>`).
    pub grants: Vec<String>,
    /// The sandbox limits of the host answering (every run of it gets these).
    pub sandbox: SandboxLimits,
    /// True when `phases` and `agents` come from the newest [`DETAIL_SCAN_ENTRIES`]
    /// progress entries only, or `agents` were cut to the newest [`DETAIL_AGENTS`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// How the flows of the run's backend stand while it executes in the process answering
    /// (calls queued, in flight, the rate and why calls wait; shared with every other run of
    /// that backend); absent when it does not execute here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flows: Vec<crate::model::flow::FlowStats>,
    /// The phases the latest attempt's factory declares, the entered and current ones marked
    /// (empty when it declares none, or for runs recorded before they were kept).
    #[serde(default)]
    pub declared_phases: Vec<crate::engine::live::DeclaredPhase>,
    /// The latest attempt's agents that run now, oldest first (none unless it executes).
    #[serde(default)]
    pub running_agents: Vec<crate::engine::live::LiveAgent>,
    /// Its agents that wait for a concurrency slot, oldest first.
    #[serde(default)]
    pub queued_agents: Vec<crate::engine::live::LiveAgent>,
    /// When this detail was read (RFC 3339).
    #[serde(default)]
    pub observed_at: String,
}

impl<'de> serde::Deserialize<'de> for RunDetail {
    /// The flat form, read in two passes over one JSON object: the envelope's fields, then
    /// the detail's own (serde's `flatten` cannot hand a result's raw JSON text through).
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Own {
            limits: Limits,
            phases: Vec<String>,
            agents: Vec<AgentSummary>,
            progress: Vec<ProgressEntry>,
            component_hashes: Vec<String>,
            scripts: Vec<Option<ScriptRef>>,
            #[serde(default)]
            modules: Option<crate::guests::modules::Manifest>,
            backends: Vec<BackendRef>,
            grants: Vec<String>,
            sandbox: SandboxLimits,
            #[serde(default)]
            truncated: bool,
            #[serde(default)]
            flows: Vec<crate::model::flow::FlowStats>,
            #[serde(default)]
            declared_phases: Vec<crate::engine::live::DeclaredPhase>,
            #[serde(default)]
            running_agents: Vec<crate::engine::live::LiveAgent>,
            #[serde(default)]
            queued_agents: Vec<crate::engine::live::LiveAgent>,
            #[serde(default)]
            observed_at: String,
        }
        use serde::de::Error as _;
        let text = Box::<serde_json::value::RawValue>::deserialize(deserializer)?;
        let envelope: RunEnvelope = serde_json::from_str(text.get()).map_err(D::Error::custom)?;
        let own: Own = serde_json::from_str(text.get()).map_err(D::Error::custom)?;
        Ok(RunDetail {
            envelope,
            limits: own.limits,
            phases: own.phases,
            agents: own.agents,
            progress: own.progress,
            component_hashes: own.component_hashes,
            scripts: own.scripts,
            modules: own.modules,
            backends: own.backends,
            grants: own.grants,
            sandbox: own.sandbox,
            truncated: own.truncated,
            flows: own.flows,
            declared_phases: own.declared_phases,
            running_agents: own.running_agents,
            queued_agents: own.queued_agents,
            observed_at: own.observed_at,
        })
    }
}

/// A run's detail reads at most this many progress entries, the newest.
pub const DETAIL_SCAN_ENTRIES: usize = 10_000;

/// A run's detail lists at most this many agent summaries, the newest.
pub const DETAIL_AGENTS: usize = 2_000;

impl Host {
    /// A run with its phases, agent summaries and latest progress page.
    pub async fn detail(&self, scope: impl Into<Scope>, run_id: &str) -> Result<RunDetail, Error> {
        let record = self.record(&scope.into(), run_id).await?;
        // The newest entries only, in pages backwards from the tail (the query caps a page
        // at 1000): a run's detail costs the same however long its history is.
        let mut pages = Vec::new();
        let (mut before, mut scanned, mut truncated) = (None, 0usize, false);
        loop {
            let query = ProgressQuery { before_seq: before, limit: Some(1000), ..Default::default() };
            let page = self.store.progress(run_id, &query).await?;
            let full = page.len() == 1000;
            scanned += page.len();
            before = page.first().map(|e| e.seq);
            pages.push(page);
            if !full || before.is_none_or(|seq| seq <= 1) {
                break;
            }
            if scanned >= DETAIL_SCAN_ENTRIES {
                truncated = true;
                break;
            }
        }
        let mut phases: Vec<String> = Vec::new();
        let mut agents = std::collections::VecDeque::new();
        for entry in pages.iter().rev().flatten() {
            match &entry.event {
                ProgressEvent::Phase { title } if phases.last() != Some(title) => phases.push(title.clone()),
                ProgressEvent::AgentFinished { summary, cached: false } => {
                    if agents.len() == DETAIL_AGENTS {
                        agents.pop_front();
                        truncated = true;
                    }
                    agents.push_back(summary.clone());
                }
                _ => {}
            }
        }
        let agents = Vec::from(agents);
        let executing = record.envelope.status == RunStatus::Running;
        let live = crate::engine::live::live(pages.iter().rev().flatten(), executing);
        let declared_phases = crate::engine::live::declared_phases(&record.phases, &phases);
        let progress = self.store.progress(run_id, &ProgressQuery::default()).await?;
        let limits = record.limits;
        let component_hashes = record.component_hashes.clone();
        let mut scripts = record.scripts.clone();
        scripts.resize(component_hashes.len(), None);
        let backends = record.backends.clone();
        let grants = record.grants.clone();
        let sandbox = self.config.sandbox.clone();
        let modules = self.store.run_modules(run_id).await?;
        let flows = self.run_flows(run_id);
        Ok(RunDetail {
            envelope: self.current(record).await?,
            limits,
            phases,
            agents,
            progress,
            component_hashes,
            scripts,
            modules,
            backends,
            grants,
            sandbox,
            truncated,
            flows,
            declared_phases,
            running_agents: live.running,
            queued_agents: live.queued,
            observed_at: crate::store::records_timestamp(),
        })
    }

    /// How the flows of `run_id`'s backend stand, while an attempt of it executes in this
    /// process (else none). The caller has checked the scope sees the run.
    pub fn run_flows(&self, run_id: &str) -> Vec<crate::model::flow::FlowStats> {
        let shared = self.active().get(run_id).and_then(|a| a.shared.clone());
        shared.map(|s| s.agents.flows().iter().map(|f| f.stats()).collect()).unwrap_or_default()
    }
}
