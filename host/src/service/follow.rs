//! [`Follower`]: the one way to follow a run live, through either transport. It hands out
//! the run's progress entries after a given seq, in order, then the terminal envelope.
//! It wakes on the service's run updates and re-reads on a slow timer too, so a missed
//! update only makes an entry a little late; a terminal envelope is written after the
//! run's last progress, so everything before it has been handed out when it comes.

use super::client::{Client, ServiceError, Updates};
use crate::model::scope::Scope;
use crate::store::ProgressQuery;
use crate::{ProgressEntry, RunEnvelope};
use std::collections::VecDeque;
use std::time::Duration;

/// Entries read per progress page.
const PAGE: usize = 1000;

/// The longest a follower sleeps without an update before it re-reads the run.
const POLL: Duration = Duration::from_millis(250);

/// What following a run yields.
#[derive(Debug, Clone)]
pub enum Followed {
    /// A progress entry, in seq order.
    Progress(ProgressEntry),
    /// The run is terminal: its envelope, last.
    Ended(RunEnvelope),
}

/// Follows one run; see the module docs.
pub struct Follower {
    client: Client,
    scope: Scope,
    run_id: String,
    after_seq: u64,
    pending: VecDeque<ProgressEntry>,
    ended: Option<RunEnvelope>,
    updates: Option<Updates>,
    done: bool,
    first: bool,
}

impl Follower {
    /// Follow `run_id`, as `scope` sees it, from the entry after `after_seq` (0: from the
    /// start).
    pub async fn new(client: Client, scope: impl Into<Scope>, run_id: &str, after_seq: u64) -> Self {
        let scope = scope.into();
        // Without updates (an older service, say) the follower polls.
        let updates = client.updates(&scope).await.ok();
        Follower {
            client,
            scope,
            run_id: run_id.to_string(),
            after_seq,
            pending: VecDeque::new(),
            ended: None,
            updates,
            done: false,
            first: true,
        }
    }

    /// The run followed.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The seq of the last entry handed out.
    pub fn after_seq(&self) -> u64 {
        self.after_seq
    }

    /// The next entry or the terminal envelope; `None` after the envelope.
    pub async fn next(&mut self) -> Option<Result<Followed, ServiceError>> {
        loop {
            if let Some(entry) = self.pending.pop_front() {
                self.after_seq = entry.seq;
                return Some(Ok(Followed::Progress(entry)));
            }
            if let Some(envelope) = self.ended.take() {
                self.done = true;
                return Some(Ok(Followed::Ended(envelope)));
            }
            if self.done {
                return None;
            }
            if !self.first {
                self.wait().await;
            }
            self.first = false;
            if let Err(e) = self.read().await {
                self.done = true;
                return Some(Err(e));
            }
        }
    }

    /// Read the envelope, then every entry after the last handed out.
    async fn read(&mut self) -> Result<(), ServiceError> {
        let envelope = self.client.envelope(&self.scope, &self.run_id).await?;
        let mut after = self.pending.back().map_or(self.after_seq, |e| e.seq);
        loop {
            let query = ProgressQuery { after_seq: Some(after), limit: Some(PAGE), ..Default::default() };
            let page = self.client.progress(&self.scope, &self.run_id, query).await?;
            let full = page.len() == PAGE;
            if let Some(last) = page.last() {
                after = last.seq;
            }
            self.pending.extend(page);
            if !full {
                break;
            }
        }
        if envelope.status.is_terminal() {
            self.ended = Some(envelope);
        }
        Ok(())
    }

    /// Until an update of this run, or [`POLL`].
    async fn wait(&mut self) {
        let run_id = self.run_id.clone();
        match &mut self.updates {
            Some(updates) => {
                let deadline = tokio::time::sleep(POLL);
                tokio::pin!(deadline);
                loop {
                    tokio::select! {
                        update = updates.next() => match update {
                            Some(update) if update.run_id == run_id => return,
                            Some(_) => continue,
                            None => {
                                self.updates = None;
                                return;
                            }
                        },
                        _ = &mut deadline => return,
                    }
                }
            }
            None => tokio::time::sleep(POLL).await,
        }
    }
}
