//! Collecting ended runs by a retention policy ([`Host::gc`]): the runs the policy no longer
//! keeps ([`Retention::expired`]) are deleted as `factory rm` deletes them (a run executing
//! is never deleted; a session's pass considers its own runs only), then, once for the pass,
//! the blobs none of the runs left refers to, and the store gives the space back. Asked by
//! `factory gc`, `POST /api/gc`, the MCP `factories_manage` operation `gc`, the clients' `gc`
//! and, on a schedule, by `factory serve` when its config has a `[retention]` table.
//! [`Host::usage`] says where the store's bytes go (`factory stats`, `GET /api/stats`).

use crate::engine::host::Host;
use crate::error::Error;
use crate::model::retention::{Candidate, Retention};
use crate::model::scope::Scope;
use serde::{Deserialize, Serialize};

/// What one pass of [`Host::gc`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GcReport {
    /// Runs the policy no longer keeps, deleted (or, for a dry run, to delete), oldest first.
    pub removed: Vec<String>,
    /// Runs the caller sees (the owner: the store holds) after the pass.
    pub kept: usize,
    /// Whether this was a dry run (nothing deleted).
    pub dry_run: bool,
}

impl Host {
    /// Delete the runs `policy` no longer keeps among those `scope` sees (the owner: every
    /// session's; a session: its own, as `rm` deletes only the runs its caller sees, so a
    /// session never deletes another's); with `dry_run`, only say which. A run that started
    /// executing meanwhile, or was deleted meanwhile, is skipped.
    pub async fn gc(&self, scope: Scope, policy: &Retention, dry_run: bool) -> Result<GcReport, Error> {
        let mut listed = self.store().listed_runs().await?;
        listed.retain(|l| scope.sees(&l.record.session));
        let candidates: Vec<Candidate<'_>> = listed
            .iter()
            .map(|l| Candidate {
                run_id: &l.record.envelope.run_id,
                factory: &l.record.envelope.factory,
                status: l.record.envelope.status,
                updated: humantime::parse_rfc3339_weak(&l.record.envelope.updated_at).ok(),
                seq: l.record.seq,
            })
            .collect();
        let expired = policy.expired(&candidates, std::time::SystemTime::now());
        let mut removed = Vec::new();
        let mut blobs = Vec::new();
        let mut failed = None;
        for run_id in expired {
            if dry_run {
                removed.push(run_id.to_string());
                continue;
            }
            match self.remove_run(scope.clone(), run_id).await {
                Ok(of_run) => {
                    removed.push(run_id.to_string());
                    blobs.extend(of_run);
                }
                Err(Error::AlreadyActive(_) | Error::NotFound(_)) => {}
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        if !removed.is_empty() && !dry_run {
            tracing::info!(event = "runs_collected", removed = removed.len(), "runs collected by the retention policy");
            // Once for the pass: the blobs none of the runs left refers to, then the space.
            blobs.sort();
            blobs.dedup();
            self.give_space_back(&blobs).await;
        }
        if let Some(e) = failed {
            return Err(e);
        }
        let kept = listed.len() - if dry_run { 0 } else { removed.len() };
        Ok(GcReport { removed, kept, dry_run })
    }

    /// Where the store's bytes go (the owner only; `None` for a store that does not measure
    /// itself).
    pub async fn usage(&self, scope: Scope) -> Result<Option<crate::store::StoreUsage>, Error> {
        if scope != Scope::Owner {
            return Err(Error::BadRequest(
                "the store's usage covers every session's runs: the owner only may ask it".into(),
            ));
        }
        Ok(self.store().usage_report().await?)
    }
}
