//! [`Client`]: the one way a front door reaches the service, with two transports — the
//! in-process [`Local`] service (this process holds the store) or the [`Remote`] one (the
//! control socket of the process that does). Typed methods over [`Request`]/[`Response`],
//! errors with one [`ErrorCode`], and [`Updates`], the stream of run updates. Methods about
//! runs take a [`Scope`] (a session name is that session's scope).

use super::approvals::Started;
use super::local::Local;
use super::remote::{ClientError, Remote, Subscription};
use super::wire::{Description, Request, Response, Target};
use super::Consent;
use crate::engine::host::RunDetail;
use crate::error::{Error, ErrorCode};
use crate::model::scope::Scope;
use crate::store::{ProgressQuery, Registration};
use crate::{ProgressEntry, RunEnvelope, RunSummary, RunUpdated};
use std::collections::HashMap;

/// Why a service call failed.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The in-process service refused or failed.
    #[error(transparent)]
    Host(#[from] Error),
    /// The remote service refused (its error and code), or could not be reached.
    #[error(transparent)]
    Remote(#[from] ClientError),
    /// The service answered with another kind of response than the request calls for.
    #[error("the service answered a `{asked}` request with `{got}`")]
    Unexpected {
        /// The request's operation.
        asked: &'static str,
        /// The response's kind.
        got: &'static str,
    },
}

impl ServiceError {
    /// The error's code, the same whichever transport carried it.
    pub fn code(&self) -> ErrorCode {
        match self {
            ServiceError::Host(e) => e.code(),
            ServiceError::Remote(ClientError::Remote(e)) => e.code,
            ServiceError::Remote(_) => ErrorCode::Unavailable,
            ServiceError::Unexpected { .. } => ErrorCode::Error,
        }
    }
}

/// A client of the service, in process or over the control socket.
#[derive(Clone)]
pub enum Client {
    /// This process holds the store.
    Local(Local),
    /// Another process holds it and answers on its control socket.
    Remote(Remote),
}

/// A typed method: send `$request`, take the `$variant` answer apart.
macro_rules! expect {
    ($self:ident, $request:expr, $($pattern:pat => $value:expr),+) => {{
        let request = $request;
        let asked = request.op();
        match $self.call(request).await? {
            $($pattern => Ok($value),)+
            other => Err(ServiceError::Unexpected { asked, got: other.kind() }),
        }
    }};
}

impl Client {
    /// Answer one request.
    pub async fn call(&self, request: Request) -> Result<Response, ServiceError> {
        match self {
            Client::Local(local) => Ok(local.answer(request).await?),
            Client::Remote(remote) => Ok(remote.call(&request).await?),
        }
    }

    /// The in-process service, when this process holds the store.
    pub fn local(&self) -> Option<&Local> {
        match self {
            Client::Local(local) => Some(local),
            Client::Remote(_) => None,
        }
    }

    /// The summaries of every run `scope` sees, in creation order, asked a page at a time
    /// (each answer bounded).
    pub async fn runs(&self, scope: impl Into<Scope>) -> Result<Vec<RunSummary>, ServiceError> {
        let scope = scope.into();
        let mut all: Vec<RunSummary> = Vec::new();
        loop {
            let after = all.last().map(|r| r.run_id.clone());
            let page = self.runs_page(scope.clone(), after, None).await?;
            let full = page.len() >= crate::MAX_RUNS_PAGE;
            all.extend(page);
            if !full {
                return Ok(all);
            }
        }
    }

    /// One page of the summaries of the runs `scope` sees: at most `limit` (the most a page
    /// holds when `None`) created after run `after`.
    pub async fn runs_page(
        &self,
        scope: impl Into<Scope>,
        after: Option<String>,
        limit: Option<usize>,
    ) -> Result<Vec<RunSummary>, ServiceError> {
        expect!(self, Request::Runs { scope: scope.into(), after, limit }, Response::Runs(runs) => runs)
    }

    /// A page of the runs `scope` sees by creation sequence (see [`Request::RunsPage`]).
    pub async fn runs_by_seq(
        &self,
        scope: impl Into<Scope>,
        after_seq: Option<u64>,
        before_seq: Option<u64>,
        limit: Option<usize>,
    ) -> Result<crate::RunsPage, ServiceError> {
        let request = Request::RunsPage { scope: scope.into(), after_seq, before_seq, limit };
        expect!(self, request, Response::RunsPage(page) => *page)
    }

    /// A run's latest envelope.
    pub async fn envelope(&self, scope: impl Into<Scope>, run_id: &str) -> Result<RunEnvelope, ServiceError> {
        let request = Request::Envelope { scope: scope.into(), run_id: run_id.into() };
        expect!(self, request, Response::Envelope(envelope) => *envelope)
    }

    /// A run's detail.
    pub async fn detail(&self, scope: impl Into<Scope>, run_id: &str) -> Result<RunDetail, ServiceError> {
        let request = Request::Detail { scope: scope.into(), run_id: run_id.into() };
        expect!(self, request, Response::Detail(detail) => *detail)
    }

    /// A page of a run's progress.
    pub async fn progress(
        &self,
        scope: impl Into<Scope>,
        run_id: &str,
        query: ProgressQuery,
    ) -> Result<Vec<ProgressEntry>, ServiceError> {
        let request = Request::Progress { scope: scope.into(), run_id: run_id.into(), query };
        expect!(self, request, Response::Progress(page) => page)
    }

    /// Wait until the run is terminal; its envelope.
    pub async fn wait(&self, scope: impl Into<Scope>, run_id: &str) -> Result<RunEnvelope, ServiceError> {
        let request = Request::Wait { scope: scope.into(), run_id: run_id.into() };
        expect!(self, request, Response::Envelope(envelope) => *envelope)
    }

    /// Cancel a run; its terminal envelope.
    pub async fn cancel(&self, scope: impl Into<Scope>, run_id: &str) -> Result<RunEnvelope, ServiceError> {
        let request = Request::Cancel { scope: scope.into(), run_id: run_id.into() };
        expect!(self, request, Response::Envelope(envelope) => *envelope)
    }

    /// Pause a running run; its `paused` envelope.
    pub async fn pause(&self, scope: impl Into<Scope>, run_id: &str) -> Result<RunEnvelope, ServiceError> {
        let request = Request::Pause { scope: scope.into(), run_id: run_id.into() };
        expect!(self, request, Response::Envelope(envelope) => *envelope)
    }

    /// Delete a run that is not executing, and its journal.
    pub async fn remove(&self, scope: impl Into<Scope>, run_id: &str) -> Result<(), ServiceError> {
        let request = Request::Remove { scope: scope.into(), run_id: run_id.into() };
        expect!(self, request, Response::Removed { .. } => ())
    }

    /// Where the store's bytes go (the owner only; `None` for a store that does not measure
    /// itself).
    pub async fn usage(&self, scope: impl Into<Scope>) -> Result<Option<crate::store::StoreUsage>, ServiceError> {
        expect!(self, Request::Usage { scope: scope.into() }, Response::Usage(usage) => usage.map(|u| *u))
    }

    /// Delete the ended runs `policy` no longer keeps among those `scope` sees (the owner:
    /// every session's); with `dry_run`, only say which.
    pub async fn gc(
        &self,
        scope: impl Into<Scope>,
        policy: crate::model::retention::Retention,
        dry_run: bool,
    ) -> Result<crate::engine::gc::GcReport, ServiceError> {
        let request = Request::Gc { scope: scope.into(), policy, dry_run };
        expect!(self, request, Response::Collected(report) => report)
    }

    /// The factories the session can run.
    pub async fn factories(&self, session: &str) -> Result<Vec<Registration>, ServiceError> {
        expect!(self, Request::Factories { session: session.into() }, Response::Factories(list) => list)
    }

    /// One factory as the session sees it.
    pub async fn inspect(&self, session: &str, name: &str) -> Result<Registration, ServiceError> {
        let request = Request::Inspect { session: session.into(), name: name.into() };
        expect!(self, request, Response::Registration(registration) => *registration)
    }

    /// What a factory is (a file, or one registered for `session`), as the service loads it.
    pub async fn describe(&self, session: &str, component: Target) -> Result<Description, ServiceError> {
        let request = Request::Describe { session: session.into(), component };
        expect!(self, request, Response::Described(description) => *description)
    }

    /// Register an authored factory in the session's scope.
    pub async fn author(
        &self,
        session: &str,
        meta: serde_json::Value,
        run: String,
    ) -> Result<Registration, ServiceError> {
        let request = Request::Author { session: session.into(), meta, run };
        expect!(self, request, Response::Registration(registration) => *registration)
    }

    /// The service's metrics, in the Prometheus text format.
    pub async fn metrics(&self) -> Result<String, ServiceError> {
        expect!(self, Request::Metrics, Response::Metrics { text } => text)
    }

    /// Start a run or a resume in the background (`request` is a [`Request::Run`] or
    /// [`Request::Resume`]); the run's id once it exists.
    pub async fn start(&self, request: Request) -> Result<String, ServiceError> {
        expect!(self, request, Response::Started { run_id } => run_id)
    }

    /// Start a run or a resume that may wait for the owner's approval (its consent
    /// [`Consent::Ask`]): the run, or the pending approval.
    pub async fn start_or_hold(&self, request: Request) -> Result<Started, ServiceError> {
        expect!(self, request, Response::Started { run_id } => Started::Run(run_id), Response::Approval(approval) => Started::Pending(approval))
    }

    /// The pending approvals `scope` sees, oldest first.
    pub async fn approvals(&self, scope: impl Into<Scope>) -> Result<Vec<super::Approval>, ServiceError> {
        expect!(self, Request::Approvals { scope: scope.into() }, Response::Approvals(list) => list)
    }

    /// Approval `id` once answered, or as it stands after `wait` (none: at once).
    pub async fn approval(
        &self,
        scope: impl Into<Scope>,
        id: &str,
        wait: Option<std::time::Duration>,
    ) -> Result<super::Approval, ServiceError> {
        let wait_ms = wait.map(|w| w.as_millis().min(u64::MAX as u128) as u64);
        let request = Request::Approval { scope: scope.into(), id: id.into(), wait_ms };
        expect!(self, request, Response::Approval(approval) => *approval)
    }

    /// Answer pending approval `id`; the approval as it then stands (approved: with its run).
    pub async fn decide(
        &self,
        scope: impl Into<Scope>,
        id: &str,
        decision: super::Decision,
    ) -> Result<super::Approval, ServiceError> {
        let request = Request::Decide { scope: scope.into(), id: id.into(), decision };
        expect!(self, request, Response::Approval(approval) => *approval)
    }

    /// Start the registered factory `name` with `args` in `session` under the service's own
    /// consent policy (what a front door without files to show does).
    pub async fn start_registered(
        &self,
        session: &str,
        name: &str,
        args: Option<serde_json::Value>,
        limits: crate::Limits,
        consent: Consent,
    ) -> Result<String, ServiceError> {
        self.start(Request::Run {
            session: session.into(),
            component: Target::Registered(name.into()),
            args,
            limits,
            backend: Default::default(),
            grants: Vec::new(),
            declined: false,
            consent,
            trace_parent: None,
            caller_cwd: None,
            replay: None,
            record: false,
        })
        .await
    }

    /// Register a factory for everyone.
    pub async fn register(&self, source: super::Source) -> Result<Registration, ServiceError> {
        expect!(self, Request::Register { source, session: None }, Response::Registration(registration) => *registration)
    }

    /// Register a factory in `session`'s own scope only.
    pub async fn register_in(&self, session: &str, source: super::Source) -> Result<Registration, ServiceError> {
        let request = Request::Register { source, session: Some(session.into()) };
        expect!(self, request, Response::Registration(registration) => *registration)
    }

    /// Every update of the runs `scope` sees, from now on.
    pub async fn updates(&self, scope: impl Into<Scope>) -> Result<Updates, ServiceError> {
        let scope = scope.into();
        Ok(match self {
            Client::Local(local) => Updates::Local {
                receiver: local.host().subscribe(),
                local: local.clone(),
                scope,
                owned: HashMap::new(),
            },
            Client::Remote(remote) => Updates::Remote(remote.subscribe(scope).await?),
        })
    }
}

/// The most runs whose owner an in-process [`Updates`] remembers (then it forgets them all
/// and looks owners up again).
const OWNERS_REMEMBERED: usize = 4096;

/// A stream of [`RunUpdated`] for the runs a scope sees, in the order the service announces
/// them (revisions of one run only grow). Updates missed while the reader was slow are
/// skipped, never queued without bound: a reader re-reads what it shows.
pub enum Updates {
    /// From the host in this process.
    Local {
        /// The host's broadcast.
        receiver: tokio::sync::broadcast::Receiver<RunUpdated>,
        /// The service (to look up each run's owner).
        local: Local,
        /// Whose runs are announced.
        scope: Scope,
        /// Whether the scope sees a run id (looked up once).
        owned: HashMap<String, bool>,
    },
    /// From the service's socket.
    Remote(Subscription),
}

impl Updates {
    /// The next update; `None` once the service has gone away.
    pub async fn next(&mut self) -> Option<RunUpdated> {
        match self {
            Updates::Local { receiver, local, scope, owned } => loop {
                let update = match receiver.recv().await {
                    Ok(update) => update,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                };
                if owned.len() >= OWNERS_REMEMBERED {
                    owned.clear();
                }
                let ours = *scope == Scope::Owner
                    || match owned.get(&update.run_id) {
                        Some(known) => *known,
                        None => {
                            let known = local.host().owned_by(&*scope, &update.run_id).await;
                            owned.insert(update.run_id.clone(), known);
                            known
                        }
                    };
                if ours {
                    return Some(update);
                }
            },
            Updates::Remote(subscription) => subscription.next().await,
        }
    }
}
