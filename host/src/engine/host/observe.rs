//! Observing runs: a run's record as a scope sees it, its envelope as callers see it (live
//! accounting, the claimed, queued and halted readings), listings and pages of summaries,
//! progress, consent keys, and waiting for a run's end.

use super::revision::Revisions;
use super::Host;
use crate::error::Error;
use crate::model::envelope::{Failure, RunEnvelope, RunStatus, RunSummary, RunsPage};
use crate::model::progress::ProgressEntry;
use crate::model::scope::Scope;
use crate::store::{ProgressQuery, RunRecord};
use std::time::Duration;

/// The most run summaries one page of a listing carries ([`Host::run_summaries`]): with
/// messages of at most [`crate::model::envelope::SUMMARY_MESSAGE_BYTES`], a page stays a few
/// MiB, well under what a client of the control socket reads of one answer.
pub const MAX_RUNS_PAGE: usize = 1_000;

/// The terminal runs a page by sequence ([`Host::runs_page`]) holds when the caller names no
/// `limit`.
pub const RUNS_PAGE_DEFAULT_LIMIT: usize = 200;

/// The most terminal runs a page by sequence holds (a larger `limit` is cut to it).
pub const RUNS_PAGE_MAX_LIMIT: usize = 500;

impl Host {
    /// Whether `run_id` exists and `scope` sees it (false when it cannot be read).
    pub async fn owned_by(&self, scope: impl Into<Scope>, run_id: &str) -> bool {
        self.record(&scope.into(), run_id).await.is_ok()
    }

    /// The record of `run_id`, if `scope` sees it (another session's run is `NotFound`,
    /// as if it did not exist).
    pub(super) async fn record(&self, scope: &Scope, run_id: &str) -> Result<RunRecord, Error> {
        match self.store.run(run_id).await? {
            Some(record) if scope.sees(&record.session) => Ok(record),
            _ => Err(Error::NotFound(run_id.to_string())),
        }
    }

    /// The envelope of a record as callers see it: every reader (`envelope`, `runs`,
    /// `wait`, `detail`) goes through here, so the rules live in one place.
    ///
    /// - Live accounting and revision while an attempt runs here.
    /// - Claimed here for a new attempt that has not recorded its start yet: `running`
    ///   (its earlier ending is no longer the answer).
    /// - `pending` in a shared store's queue, tried by workers that could not serve it: its
    ///   `error` says which and why.
    /// - `running` with no attempt here: first read again (the attempt writes its end before
    ///   it leaves `active`, so it may have just ended); still `running`, it is an attempt
    ///   that could not record its end (this process holds the store), and it reads as
    ///   `halted`, resumable, like a crash found at reopen. On a [shared](Store::shared)
    ///   store it reads as `running`: another worker may be executing it.
    pub(super) async fn current(&self, record: RunRecord) -> Result<RunEnvelope, Error> {
        let mut envelope = record.envelope;
        // A record stored before messages were bounded may hold longer ones.
        envelope.bound_messages();
        envelope.session = Some(record.session.clone());
        let (active, live) = {
            let active = self.active();
            let run = active.get(&envelope.run_id);
            (run.is_some(), run.and_then(|a| a.shared.clone()))
        };
        match live {
            Some(shared) => {
                envelope.accounting = shared.accounting();
                envelope.revision = Revisions::live(record.writes, &shared);
            }
            None => envelope.revision = self.revisions.stored(&envelope.run_id, record.writes).await?,
        }
        if active && envelope.status.is_terminal() {
            // Claimed for a new attempt that has not recorded its start yet.
            envelope.status = RunStatus::Running;
            envelope.failure = None;
            envelope.error = None;
            envelope.result = None;
            envelope.resume_at = None;
            envelope.checkpoint = None;
        }
        if envelope.status == RunStatus::Running && !active {
            // The attempt may have ended between reading the record and looking at `active`:
            // it writes its end before it leaves `active`, so a fresh read has it.
            if let Some(fresh) = self.store.run(&envelope.run_id).await? {
                if fresh.envelope.status != RunStatus::Running {
                    return Box::pin(self.current(fresh)).await;
                }
            }
        }
        // Waiting in a shared store's queue: why the workers that tried it could not serve it.
        if envelope.status == RunStatus::Pending && !active {
            if let Some(queue) = self.store.run_queue() {
                let refusals = queue.refusals(envelope.run_id.clone()).await?;
                if !refusals.is_empty() {
                    let why: Vec<String> =
                        refusals.iter().map(|(worker, reason)| format!("worker {worker}: {reason}")).collect();
                    let error = format!(
                        "waiting in the queue for a worker that can serve it; tried and could not: {}",
                        why.join("; ")
                    );
                    envelope.error =
                        Some(crate::model::envelope::bounded_text(error, crate::model::envelope::MAX_MESSAGE_BYTES));
                }
            }
        }
        // On a shared store, another process may be executing it: it reads as it is.
        if envelope.status == RunStatus::Running && !active && !self.store.shared() {
            envelope.status = RunStatus::Halted;
            let failure = Failure::new(
                crate::model::envelope::FailureType::Halted,
                None,
                "the attempt ended without recording its outcome; resume to continue",
            );
            envelope.error.get_or_insert_with(|| failure.message.clone());
            envelope.failure.get_or_insert(failure);
        }
        Ok(envelope)
    }

    /// What consent for a resume of `run_id` is about: the sha256 of its last attempt's
    /// script source for a script factory, else of its last component (`None` before any
    /// attempt).
    pub async fn trust_key_of_run(&self, scope: impl Into<Scope>, run_id: &str) -> Result<Option<String>, Error> {
        let record = self.record(&scope.into(), run_id).await?;
        if let Some(Some(script)) = record.scripts.last() {
            return Ok(Some(script.sha256.clone()));
        }
        Ok(record.component_hashes.last().cloned())
    }

    /// The runs `scope` sees (a session's, or every session's for the owner), in creation
    /// order.
    pub async fn runs(&self, scope: impl Into<Scope>) -> Result<Vec<RunEnvelope>, Error> {
        let scope = scope.into();
        let records = self.store.runs().await?;
        let mut out = Vec::with_capacity(records.len());
        for record in records.into_iter().filter(|r| scope.sees(&r.session)) {
            out.push(self.current(record).await?);
        }
        Ok(out)
    }

    /// A page of the summaries of the runs `scope` sees, in creation order: those created
    /// after run `after` (from the first when `None`), at most `limit` (capped at
    /// [`MAX_RUNS_PAGE`]). A summary has no result and short messages
    /// ([`RunEnvelope::summary`]), so a page's size does not depend on what the runs returned.
    pub async fn run_summaries(
        &self,
        scope: impl Into<Scope>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<RunSummary>, Error> {
        let scope = scope.into();
        let limit = limit.clamp(1, MAX_RUNS_PAGE);
        // Read without results (only their sizes): a listing's memory does not grow with
        // what the runs returned.
        let listed = self.store.listed_runs().await?;
        let visible = listed.into_iter().filter(|l| scope.sees(&l.record.session));
        let mut out = Vec::new();
        let mut started = after.is_none();
        for listed in visible {
            if !started {
                started = after == Some(listed.record.envelope.run_id.as_str());
                continue;
            }
            out.push(self.listed_summary(listed).await?);
            if out.len() == limit {
                break;
            }
        }
        if !started {
            // The cursor names no run this scope sees (deleted, or another session's).
            return Err(Error::NotFound(after.unwrap_or_default().to_string()));
        }
        Ok(out)
    }

    /// A page of the summaries of the runs `scope` sees by creation sequence: with
    /// `after_seq`, the oldest runs created after it (walking newer); else the newest created
    /// before `before_seq` (before none: the newest page). A page holds at most `limit`
    /// terminal runs ([`RUNS_PAGE_DEFAULT_LIMIT`] when `None`, at most
    /// [`RUNS_PAGE_MAX_LIMIT`]); the runs still pending or running among them come along
    /// without counting, up to [`MAX_RUNS_PAGE`] runs in all.
    pub async fn runs_page(
        &self,
        scope: impl Into<Scope>,
        after_seq: Option<u64>,
        before_seq: Option<u64>,
        limit: Option<usize>,
    ) -> Result<RunsPage, Error> {
        let scope = scope.into();
        let limit = limit.unwrap_or(RUNS_PAGE_DEFAULT_LIMIT).clamp(1, RUNS_PAGE_MAX_LIMIT);
        let mut visible: Vec<_> =
            self.store.listed_runs().await?.into_iter().filter(|l| scope.sees(&l.record.session)).collect();
        visible.sort_by_key(|l| l.record.seq);
        let start = after_seq.map_or(0, |after| visible.partition_point(|l| l.record.seq <= after));
        let end =
            before_seq.map_or(visible.len(), |before| visible.partition_point(|l| l.record.seq < before)).max(start);
        let total = visible.len();
        let mut slots: Vec<_> = visible.into_iter().map(Some).collect();
        let order: Vec<usize> = if after_seq.is_some() { (start..end).collect() } else { (start..end).rev().collect() };
        let (mut picked, mut terminal) = (Vec::new(), 0usize);
        for index in order {
            let Some(listed) = slots[index].take() else { continue };
            let summary = self.listed_summary(listed).await?;
            terminal += usize::from(summary.status.is_terminal());
            picked.push((index, summary));
            if terminal == limit || picked.len() == MAX_RUNS_PAGE {
                break;
            }
        }
        picked.sort_by_key(|(index, _)| *index);
        let (lowest, highest) = (picked.first().map(|p| p.0), picked.last().map(|p| p.0));
        let runs: Vec<RunSummary> = picked.into_iter().map(|(_, summary)| summary).collect();
        Ok(RunsPage {
            oldest_seq: runs.first().and_then(|r| r.seq),
            newest_seq: runs.last().and_then(|r| r.seq),
            has_more_newer: highest.map_or(end < total, |h| h + 1 < total),
            omitted_older: lowest.map_or(start > 0, |l| l > 0),
            runs,
        })
    }

    /// The summary of a listed run: its current status, its result's size, its `seq`.
    pub(super) async fn listed_summary(&self, listed: crate::store::ListedRun) -> Result<RunSummary, Error> {
        let seq = listed.record.seq;
        let mut summary = self.current(listed.record).await?.summary();
        summary.result_bytes = listed.result_bytes;
        summary.seq = Some(seq);
        Ok(summary)
    }

    /// The latest envelope of a run.
    pub async fn envelope(&self, scope: impl Into<Scope>, run_id: &str) -> Result<RunEnvelope, Error> {
        let record = self.record(&scope.into(), run_id).await?;
        self.current(record).await
    }

    /// Progress entries of a run, paged.
    pub async fn progress(
        &self,
        scope: impl Into<Scope>,
        run_id: &str,
        query: &ProgressQuery,
    ) -> Result<Vec<ProgressEntry>, Error> {
        self.record(&scope.into(), run_id).await?;
        Ok(self.store.progress(run_id, query).await?)
    }

    /// Wait until the run is in a terminal status and return that envelope (on a shared
    /// store, a `halted` run that is back in the queue or claimed by a live worker is waited
    /// for further: its next attempt's end is the answer). Watches
    /// `run_updated` and re-reads on a low-frequency timer too, so a missed event only makes
    /// the answer a little late.
    pub async fn wait(&self, scope: impl Into<Scope>, run_id: &str) -> Result<RunEnvelope, Error> {
        let scope = scope.into();
        let mut updates = self.subscribe();
        loop {
            let envelope = self.envelope(&scope, run_id).await?;
            // On a shared store, a `halted` attempt the cluster continues (the run is back in
            // the queue, or a live worker claimed it for its next attempt) is not the run's end.
            if envelope.status.is_terminal()
                && !self.active().contains_key(run_id)
                && !(envelope.status == RunStatus::Halted && self.store.continues(run_id).await?)
            {
                return Ok(envelope);
            }
            tokio::select! {
                _ = updates.recv() => {}
                _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            }
        }
    }
}
