//! [`Follower`]: the one way to follow a run live, through either transport. It hands out
//! the run's progress entries after a given seq, in order, then the terminal envelope.
//! Over the control socket it is one `follow` stream (one connection; the service runs a
//! follower in process and sends what it hands out). In process, or against a service
//! that has no `follow`, it wakes on the service's run updates and re-reads on a slow timer
//! too, so a missed update only makes an entry a little late; a terminal envelope is
//! written after the run's last progress, so everything before it has been handed out when
//! it comes. In the process executing the run, it also hands out how the run's backend flows
//! stand ([`ProgressEvent::Flows`], live, not journaled: carrying the seq of the entry before
//! it) when they changed while calls wait in them, so a follow stream carries them too. The
//! exchanges a start that records sends before its envelope are kept (bounded as a
//! cassette) for [`Follower::take_recorded`].

use super::client::{Client, ServiceError, Updates};
use super::remote::{ClientError, FollowStream};
use super::wire::FollowEvent;
use crate::backend::cassette::{Exchange, MAX_CASSETTE_BYTES};
use crate::error::ErrorCode;
use crate::model::flow::FlowWatch;
use crate::model::scope::Scope;
use crate::store::ProgressQuery;
use crate::{ProgressEntry, ProgressEvent, RunEnvelope};
use std::collections::VecDeque;
use std::time::Duration;

/// Entries read per progress page.
const PAGE: usize = 1000;

/// The longest a follower sleeps without an update before it re-reads the run.
const POLL: Duration = Duration::from_millis(250);

/// What following a run yields.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant, reason = "`Ended` comes once per run, last; boxing it buys nothing")]
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
    /// The service's follow stream, when the client is remote and the service has one.
    stream: Option<FollowStream>,
    /// Why opening the stream failed, handed out by the first [`Follower::next`].
    first_error: Option<ServiceError>,
    done: bool,
    first: bool,
    /// When the run's flows are worth handing out again.
    flows: FlowWatch,
    /// The exchanges the run recorded for us (a start that records), and their bytes.
    recorded: Vec<Exchange>,
    recorded_bytes: u64,
}

impl Follower {
    /// Follow `run_id`, as `scope` sees it, from the entry after `after_seq` (0: from the
    /// start).
    pub async fn new(client: Client, scope: impl Into<Scope>, run_id: &str, after_seq: u64) -> Self {
        let mut follower = Follower::bare(client, scope.into(), run_id, after_seq);
        if let Client::Remote(remote) = &follower.client {
            match remote.follow(follower.scope.clone(), run_id, after_seq).await {
                Ok(stream) => {
                    follower.stream = Some(stream);
                    return follower;
                }
                // A service without `follow` (another build of this wire version): poll.
                Err(ClientError::Remote(e)) if e.code == ErrorCode::BadRequest => {}
                Err(e) => {
                    // Reported by the first `next`, as a failed read would be.
                    follower.first_error = Some(e.into());
                    return follower;
                }
            }
        }
        // Without updates the follower polls.
        follower.updates = follower.client.updates(&follower.scope).await.ok();
        follower
    }

    /// Start a run or a resume (`request`: a [`super::Request::Run`] or
    /// [`super::Request::Resume`]) and follow it from its first entry of this attempt (see
    /// [`Follower::start_after_seq`]), as `scope` sees it
    /// (the run's session, or the resume's scope). Over the control socket this is one
    /// connection (`startFollowing`, which every service of this wire version serves).
    pub async fn start(client: Client, scope: impl Into<Scope>, request: super::Request) -> Result<Self, ServiceError> {
        let scope = scope.into();
        if let Client::Remote(remote) = &client {
            let (run_id, stream) = remote.start_following(request).await?;
            let mut follower = Follower::bare(client, scope, &run_id, 0);
            follower.stream = Some(stream);
            return Ok(follower);
        }
        let after_seq = Follower::start_after_seq(&client, &scope, &request).await?;
        let run_id = client.start(request).await?;
        Ok(Follower::new(client, scope, &run_id, after_seq).await)
    }

    /// Where following a start begins, asked before it starts: a new run from its first
    /// entry (0), a resume after the run's last entry so far (the attempts before it are
    /// history, not this attempt's progress: a resume of a long run would show them all).
    pub async fn start_after_seq(
        client: &Client,
        scope: &Scope,
        request: &super::Request,
    ) -> Result<u64, ServiceError> {
        let super::Request::Resume { run_id, .. } = request else { return Ok(0) };
        // A page backwards from the tail: the last entry alone.
        let last =
            client.progress(scope.clone(), run_id, ProgressQuery { limit: Some(1), ..Default::default() }).await?;
        Ok(last.last().map_or(0, |entry| entry.seq))
    }

    fn bare(client: Client, scope: Scope, run_id: &str, after_seq: u64) -> Self {
        Follower {
            client,
            scope,
            run_id: run_id.to_string(),
            after_seq,
            pending: VecDeque::new(),
            ended: None,
            updates: None,
            stream: None,
            first_error: None,
            done: false,
            first: true,
            flows: FlowWatch::default(),
            recorded: Vec::new(),
            recorded_bytes: 0,
        }
    }

    /// The run followed.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The exchanges the run recorded for this caller (a start with `record` followed over
    /// the control socket), once its envelope was handed out; taken.
    pub fn take_recorded(&mut self) -> Vec<Exchange> {
        self.recorded_bytes = 0;
        std::mem::take(&mut self.recorded)
    }

    /// The seq of the last entry handed out.
    pub fn after_seq(&self) -> u64 {
        self.after_seq
    }

    /// What [`Follower::next`] would hand out at once, without waiting or reading: an entry
    /// or the envelope already read (over the socket's stream: nothing, it is read by
    /// `next`). Lets a caller batch what is at hand.
    pub fn ready(&mut self) -> Option<Followed> {
        if self.stream.is_some() || self.first_error.is_some() || self.done {
            return None;
        }
        if let Some(entry) = self.pending.pop_front() {
            self.after_seq = entry.seq;
            return Some(Followed::Progress(entry));
        }
        let envelope = self.ended.take()?;
        self.done = true;
        Some(Followed::Ended(envelope))
    }

    /// The next entry or the terminal envelope; `None` after the envelope.
    pub async fn next(&mut self) -> Option<Result<Followed, ServiceError>> {
        if let Some(e) = self.first_error.take() {
            self.done = true;
            return Some(Err(e));
        }
        if let Some(stream) = &mut self.stream {
            if self.done {
                return None;
            }
            let mut event = stream.next().await;
            // The exchanges a start that records sent are kept for [`Follower::take_recorded`]
            // (bounded as a cassette's lines are).
            while let Ok(FollowEvent::Recorded(exchange)) = event {
                let bytes = serde_json::to_string(&exchange).map_or(u64::MAX, |line| line.len() as u64 + 1);
                self.recorded_bytes = self.recorded_bytes.saturating_add(bytes);
                if self.recorded_bytes > MAX_CASSETTE_BYTES {
                    self.done = true;
                    let message = format!("the run's recorded exchanges sent are over {MAX_CASSETTE_BYTES} bytes");
                    return Some(Err(ClientError::Protocol { path: stream.path().to_string(), message }.into()));
                }
                self.recorded.push(*exchange);
                event = stream.next().await;
            }
            return Some(match event {
                Ok(FollowEvent::Recorded(_)) => Err(ServiceError::Unexpected { asked: "follow", got: "recorded" }),
                Ok(FollowEvent::Progress(entry)) => {
                    self.after_seq = entry.seq;
                    Ok(Followed::Progress(entry))
                }
                Ok(FollowEvent::Ended(envelope)) => {
                    self.done = true;
                    Ok(Followed::Ended(*envelope))
                }
                Ok(FollowEvent::Failed(e)) => {
                    self.done = true;
                    Err(ServiceError::Remote(ClientError::Remote(e)))
                }
                Err(e) => {
                    self.done = true;
                    Err(e.into())
                }
            });
        }
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
        } else if let Client::Local(local) = &self.client {
            if let Some(flows) = self.flows.next(local.host().run_flows(&self.run_id)) {
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
                let at_ms = now.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
                self.pending.push_back(ProgressEntry {
                    seq: after,
                    at_ms,
                    phase: None,
                    event: ProgressEvent::Flows { flows },
                });
            }
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
