//! The service implemented over an in-process [`Host`]: what the process holding the store
//! answers, to its own front doors and (through the control socket) to every other one.
//! Queries read the host; `run` and `resume` check consent, start the attempt in the
//! background and answer once the run has an id; a start with consent `ask` the trust
//! check refuses is held as a pending approval ([`Approvals`]) instead, and started when the
//! owner approves it (`decide`).

use super::approvals::{Approval, ApprovalState, Approvals, Decision, Started};
use super::consent::{consented, trust_key, Consent, Operation, Question, TrustCheck};
use super::wire::{Request, Response, Source, Tape, Target};
use crate::backend::cassette::Recording;
use crate::backend::AgentBackend;
use crate::engine::host::{Host, ResumeOptions, RunOptions};
use crate::error::ApprovalError;
use crate::error::Error;
use crate::model::scope::Scope;
use crate::BackendChoice;
use std::sync::Arc;

/// A caller's working directory as a request names it: absolute, and resolved here (so a
/// symlinked spelling hides the directory itself); one that no longer exists hides nothing.
fn checked_cwd(cwd: Option<std::path::PathBuf>) -> Result<Option<std::path::PathBuf>, Error> {
    match cwd {
        Some(dir) if !dir.is_absolute() => {
            Err(Error::BadRequest(format!("callerCwd `{}` is not an absolute path", dir.display())))
        }
        Some(dir) => Ok(std::fs::canonicalize(&dir).ok()),
        None => Ok(None),
    }
}

/// The backend of a cassette a caller sent ([`Tape`]): its entries served from memory,
/// checked against their keys here as a file's are; with `live`, what it does not hold goes
/// there.
fn sent_cassette(tape: Tape, live: Option<Arc<dyn AgentBackend>>) -> Arc<dyn AgentBackend> {
    Arc::new(crate::backend::Cassette::replay_sent(&tape.shown, tape.entries, live))
}

/// `backend` recording its exchanges in memory for the caller when it asked (`record`).
fn recorded(backend: Arc<dyn AgentBackend>, record: bool) -> (Arc<dyn AgentBackend>, Option<Recording>) {
    if !record {
        return (backend, None);
    }
    let recording = Recording::default();
    (Arc::new(crate::backend::Cassette::record_into(backend, recording.clone())), Some(recording))
}

/// What a front door in this process hands over with a start, which no request can carry.
#[derive(Default)]
pub struct InProcess {
    /// The backend instead of the one the request names: one the door built itself (a
    /// cassette, a configuration file of its own).
    pub backend: Option<Arc<dyn AgentBackend>>,
    /// Receives every progress entry as it happens (committed or not yet).
    pub events: Option<tokio::sync::mpsc::UnboundedSender<crate::model::progress::ProgressEntry>>,
    /// Called with the run's id once it exists, before its first progress entry.
    pub on_start: Option<crate::engine::host::OnStart>,
}

/// An attempt started in this process: its task, which answers the run's envelope.
pub type Attempt = tokio::task::JoinHandle<Result<crate::model::envelope::RunEnvelope, Error>>;

/// How [`Local::begin`] ended: the run started (its id and its attempt), or the start is
/// held for the owner's approval.
enum Begun {
    Run(String, Attempt, Option<Recording>),
    Held(Started),
}

/// The service over a [`Host`] this process opened, with its trust check.
#[derive(Clone)]
pub struct Local {
    host: Arc<Host>,
    trusted: TrustCheck,
    approvals: Arc<Approvals>,
    remember: Option<Arc<crate::trust::TrustStore>>,
}

impl Local {
    /// The service over `host`; `trusted` says which trust keys run without consent.
    pub fn new(host: Arc<Host>, trusted: TrustCheck) -> Self {
        Local { host, trusted, approvals: Arc::default(), remember: None }
    }

    /// The same service holding its pending approvals in `approvals` (every door of one
    /// serving process shares one set) and recording "always" answers in `trust`.
    pub fn with_approvals(self, approvals: Arc<Approvals>, trust: Option<Arc<crate::trust::TrustStore>>) -> Self {
        Local { approvals, remember: trust, ..self }
    }

    /// The host answering.
    pub fn host(&self) -> &Arc<Host> {
        &self.host
    }

    /// Answer `request` (everything but the streams [`Request::Subscribe`] and
    /// [`Request::Follow`], which [`super::Client::updates`] and [`super::Follower`] serve).
    pub async fn answer(&self, request: Request) -> Result<Response, Error> {
        let host = &self.host;
        Ok(match request {
            Request::Runs { scope, after, limit } => Response::Runs(
                host.run_summaries(scope, after.as_deref(), limit.unwrap_or(crate::MAX_RUNS_PAGE)).await?,
            ),
            Request::RunsPage { scope, after_seq, before_seq, limit } => {
                Response::RunsPage(Box::new(host.runs_page(scope, after_seq, before_seq, limit).await?))
            }
            Request::Envelope { scope, run_id } => Response::Envelope(Box::new(host.envelope(scope, &run_id).await?)),
            Request::Detail { scope, run_id } => Response::Detail(Box::new(host.detail(scope, &run_id).await?)),
            Request::Progress { scope, run_id, query } => {
                Response::Progress(host.progress(scope, &run_id, &query).await?)
            }
            Request::Wait { scope, run_id } => Response::Envelope(Box::new(host.wait(scope, &run_id).await?)),
            Request::Cancel { scope, run_id } => Response::Envelope(Box::new(host.cancel(scope, &run_id).await?)),
            Request::Pause { scope, run_id } => Response::Envelope(Box::new(host.pause(scope, &run_id).await?)),
            Request::Remove { scope, run_id } => {
                host.remove(scope, &run_id).await?;
                Response::Removed { run_id }
            }
            Request::Usage { scope } => Response::Usage(host.usage(scope).await?.map(Box::new)),
            Request::Gc { scope, policy, dry_run } => Response::Collected(host.gc(scope, &policy, dry_run).await?),
            Request::Factories { session } => Response::Factories(host.registered_for(&session).await?),
            Request::Author { session, meta, run } => {
                Response::Registration(Box::new(host.author_in(&session, &meta, &run).await?))
            }
            Request::Register { source: Source::File(path), session } if self.offers_several(&path).await? => {
                let mut registered = Vec::new();
                for name in host.script_factories(&path).await? {
                    let entry = std::path::PathBuf::from(format!("{}#{name}", path.display()));
                    registered.push(host.register_in(&host.load_file(&entry).await?, session.clone()).await?);
                }
                Response::Factories(registered)
            }
            Request::Register { source, session } => Response::Registration(Box::new(match (source, session) {
                (Source::File(path), session) => host.register_in(&host.load_file(&path).await?, session).await?,
                (Source::Document(text), session) => {
                    let script = crate::guests::script::author_document(&text).map_err(Error::Script)?;
                    host.register_in(&host.load_script(script).await?, session).await?
                }
                (Source::Authored { meta, run }, None) => host.author(&meta, &run).await?,
                (Source::Authored { meta, run }, Some(session)) => host.author_in(&session, &meta, &run).await?,
            })),
            Request::Inspect { session, name } => match host.store().factory_in(&session, &name).await? {
                Some(registration) => Response::Registration(Box::new(registration)),
                None => return Err(Error::NotRegistered(format!("no factory named `{name}` is registered"))),
            },
            Request::Describe { session, component } => {
                let factory = match &component {
                    Target::File(path) => host.load_file(path).await?,
                    Target::Registered(name) => host.load_registered_for(&session, name).await?,
                };
                Response::Described(Box::new(super::wire::Description {
                    meta: factory.meta.clone(),
                    sha256: factory.component.hash.clone(),
                    script: factory.component.script.as_ref().map(|s| s.reference()),
                    imports: factory.component.imports.clone(),
                    sandbox: host.sandbox_limits().clone(),
                }))
            }
            Request::Metrics => Response::Metrics { text: crate::metrics::metrics().render(host.active_runs().len()) },
            start @ (Request::Run { .. } | Request::Resume { .. }) if start.records() => {
                return Err(Error::BadRequest(
                    "`record` sends the run's exchanges on its follow stream: start it with `startFollowing`".into(),
                ))
            }
            start @ (Request::Run { .. } | Request::Resume { .. }) => match self.start(start).await? {
                Started::Run(run_id) => Response::Started { run_id },
                Started::Pending(approval) => Response::Approval(approval),
            },
            Request::Approvals { scope } => Response::Approvals(self.approvals.pending(&scope)),
            Request::Approval { scope, id, wait_ms: None } => {
                Response::Approval(Box::new(self.approvals.get(&scope, &id)?))
            }
            Request::Approval { scope, id, wait_ms: Some(ms) } => Response::Approval(Box::new(
                self.approvals.wait(&scope, &id, std::time::Duration::from_millis(ms)).await?,
            )),
            Request::Decide { scope, id, decision } => {
                Response::Approval(Box::new(self.decide(&scope, &id, decision).await?))
            }
            Request::Subscribe { .. } => {
                return Err(Error::Misrouted("a subscription is a stream: use Client::updates"))
            }
            Request::Follow { .. } | Request::StartFollowing { .. } => {
                return Err(Error::Misrouted("a follow is a stream: use Follower"))
            }
        })
    }

    /// Answer pending approval `id`: decline it, or start its run (trusting its sha256 from
    /// now on first, for [`Decision::Always`]); the approval as it then stands. A start that
    /// fails is the error, and the approval says so to its waiter.
    async fn decide(&self, scope: &Scope, id: &str, decision: Decision) -> Result<Approval, Error> {
        let (approval, request) = self.approvals.take(scope, id)?;
        let settle = |state| self.approvals.settle(id, state).ok_or_else(|| ApprovalError::Unknown(id.to_string()));
        let always = match decision {
            Decision::Decline => return Ok(settle(ApprovalState::Declined)?),
            Decision::Once => false,
            Decision::Always => true,
        };
        let failed = |e: Error| {
            let _ = settle(ApprovalState::Failed { code: e.code(), message: e.to_string() });
            e
        };
        if always {
            let q = &approval.question;
            let Some(trust) = &self.remember else {
                return Err(failed(Error::BadRequest(
                    "this service keeps no trust store, so it cannot approve always: approve once".into(),
                )));
            };
            let entry = crate::trust::TrustedComponent {
                name: Some(q.factory.clone()),
                ..crate::trust::TrustedComponent::new(&q.sha256, crate::trust::TrustSource::Approved)
            };
            trust.trust(entry).map_err(|e| failed(ApprovalError::Remember(e).into()))?;
            tracing::info!(event = "trusted", factory = %q.factory, sha256 = %q.sha256, "approved always");
        }
        match self.start(request).await {
            Ok(Started::Run(run_id)) => Ok(settle(ApprovalState::Approved { run_id, always })?),
            // The held start carries the question's sha256, which the trust check never asks about.
            Ok(Started::Pending(_)) => Err(failed(Error::Misrouted("an approved start asked again"))),
            Err(e) => Err(failed(e)),
        }
    }

    /// Hold `request` (consent `ask`, refused by the trust check) for the owner: it will
    /// carry exactly the sha256 `question` names.
    fn hold(&self, session: Option<String>, question: Question, request: Option<Request>) -> Result<Started, Error> {
        let mut request = request.ok_or(Error::Misrouted("a start that does not ask was held"))?;
        match &mut request {
            Request::Run { consent, record, .. } | Request::Resume { consent, record, .. } => {
                *consent = Consent::Sha256(question.sha256.clone());
                // Nobody follows a held start to take its recording.
                *record = false;
            }
            _ => return Err(Error::Misrouted("not a start request")),
        }
        Ok(Started::Pending(Box::new(self.approvals.hold(session, question, request)?)))
    }

    /// Whether `path` is a script file (no `#name`) that offers more than one factory.
    async fn offers_several(&self, path: &std::path::Path) -> Result<bool, Error> {
        if !crate::guests::script::is_script(path) || !path.is_file() {
            return Ok(false);
        }
        Ok(self.host.script_factories(path).await?.len() > 1)
    }

    /// Start a run or a resume in the background; answer its id once it exists (or the
    /// error that kept it from existing), or the pending approval it now waits in.
    async fn start(&self, request: Request) -> Result<Started, Error> {
        Ok(self.start_recorded(request).await?.0)
    }

    /// [`Local::start`], with the exchanges the run records for its caller when the request
    /// asks (`record`): taken once the run has ended.
    pub async fn start_recorded(&self, request: Request) -> Result<(Started, Option<Recording>), Error> {
        Ok(match self.begin(request, InProcess::default()).await? {
            Begun::Run(run_id, _, recording) => (Started::Run(run_id), recording),
            Begun::Held(held) => (held, None),
        })
    }

    /// [`Request::Run`] or [`Request::Resume`] as every door starts one (the same consent
    /// check, the same start), with what only a front door in this process can hand over
    /// ([`InProcess`]). Answers the run's id and the attempt's task, which ends once
    /// everything the attempt writes is written. Such a start does not wait for an approval:
    /// its door asked its own user.
    pub async fn start_with(&self, request: Request, here: InProcess) -> Result<(String, Attempt), Error> {
        match self.begin(request, here).await? {
            Begun::Run(run_id, attempt, _) => Ok((run_id, attempt)),
            Begun::Held(_) => Err(Error::Misrouted("a start in this process was held for approval")),
        }
    }

    /// [`Local::start`] and [`Local::start_with`]: the one place a run or an attempt starts.
    async fn begin(&self, request: Request, here: InProcess) -> Result<Begun, Error> {
        let InProcess { backend, events, on_start: told } = here;
        // What a start that waits for the owner holds (only one that may wait is copied).
        let asks = matches!(
            &request,
            Request::Run { consent: Consent::Ask, .. } | Request::Resume { consent: Consent::Ask, .. }
        );
        let held = asks.then(|| request.clone());
        let host = self.host.clone();
        let (started, started_rx) = tokio::sync::oneshot::channel::<String>();
        let on_start: Box<dyn FnOnce(&str) + Send> = Box::new(move |id: &str| {
            if let Some(told) = told {
                told(id);
            }
            let _ = started.send(id.to_string());
        });
        let (task, recording) = match request {
            Request::Run {
                session,
                component,
                args,
                limits,
                backend: choice,
                grants,
                declined,
                consent,
                trace_parent,
                caller_cwd,
                replay,
                record,
            } => {
                // Refuse an unusable backend before the run exists.
                let chosen = match (backend, replay) {
                    (Some(backend), _) => backend,
                    (None, Some(tape)) => {
                        let live = if tape.then_live { Some(host.chosen_backend(&choice)?) } else { None };
                        sent_cassette(tape, live)
                    }
                    (None, None) => host.chosen_backend(&choice)?,
                };
                let (chosen, recording) = recorded(chosen, record);
                let factory = match &component {
                    Target::File(path) => host.load_file(path).await?,
                    Target::Registered(name) => host.load_registered_for(&session, name).await?,
                };
                if !declined {
                    let key = trust_key(&factory);
                    let authored = host.authored_in(&session, key).await?;
                    if consent == Consent::Ask && !authored && !(self.trusted)(key) {
                        let question = Question {
                            factory: factory.meta.name.clone(),
                            sha256: key.to_string(),
                            operation: Operation::Run,
                            backend: chosen.reference().name,
                            limits: factory.meta.limits.overridden_by(&limits),
                            phases: factory.meta.phases.iter().map(|p| p.title.clone()).collect(),
                            grants: grants.iter().map(|g| g.display().to_string()).collect(),
                        };
                        return self.hold(Some(session), question, held).map(Begun::Held);
                    }
                    consented(&self.trusted, &consent, authored, key, &format!("factory `{}`", factory.meta.name))?;
                }
                let backend = Some(chosen);
                let options = RunOptions {
                    args,
                    limits,
                    session: Some(session),
                    events,
                    on_start: Some(on_start),
                    backend,
                    choice: BackendChoice::default(),
                    grants,
                    trace_parent,
                    caller_cwd: checked_cwd(caller_cwd)?,
                };
                let task = tokio::spawn(async move {
                    if declined {
                        host.decline(&factory, options).await
                    } else {
                        host.run(&factory, options).await
                    }
                });
                (task, recording)
            }
            Request::Resume {
                scope,
                run_id,
                component,
                limits,
                backend: choice,
                consent,
                trace_parent,
                caller_cwd,
                input,
                replay,
                record,
            } => {
                // A cassette sent with the resume wraps the backend the resume runs on.
                let backend = match (backend, replay) {
                    (Some(backend), _) => Some(backend),
                    (None, Some(tape)) => {
                        let live = match tape.then_live {
                            true => Some(host.resumed_backend(&scope, &run_id, &choice).await?),
                            false => None,
                        };
                        Some(sent_cassette(tape, live))
                    }
                    (None, None) => None,
                };
                let backend = match (backend, record) {
                    (Some(backend), true) => Some(backend),
                    (None, true) => Some(host.resumed_backend(&scope, &run_id, &choice).await?),
                    (backend, false) => backend,
                };
                let (backend, recording) = match backend {
                    Some(backend) => {
                        let (backend, recording) = recorded(backend, record);
                        (Some(backend), recording)
                    }
                    None => (None, None),
                };
                let component = match component {
                    Some(path) => Some(host.load_file(&path).await?),
                    None => None,
                };
                // The component this attempt runs: the edited one, else the run's last.
                let key = match &component {
                    Some(factory) => Some(trust_key(factory).to_string()),
                    None => host.trust_key_of_run(&scope, &run_id).await?,
                };
                if let Some(key) = key {
                    // Authored in the run's own session: the session could resume it without
                    // consent itself, so the owner resuming it there gains nothing more.
                    let run_session = host.envelope(&scope, &run_id).await?.session.unwrap_or_default();
                    let authored = host.authored_in(&run_session, &key).await?;
                    if consent == Consent::Ask && !authored && !(self.trusted)(&key) {
                        let detail = host.detail(&scope, &run_id).await?;
                        let (factory, declared, phases) = match &component {
                            Some(f) => (
                                f.meta.name.clone(),
                                f.meta.limits,
                                f.meta.phases.iter().map(|p| p.title.clone()).collect(),
                            ),
                            None => (detail.envelope.factory.clone(), detail.limits, detail.phases.clone()),
                        };
                        let question = Question {
                            factory,
                            sha256: key,
                            operation: Operation::Resume,
                            backend: match &choice.name {
                                Some(name) => name.clone(),
                                None => detail.backends.last().map_or_else(String::new, |b| b.name.clone()),
                            },
                            limits: declared.overridden_by(&limits),
                            phases,
                            grants: detail.grants.clone(),
                        };
                        let asker = match &scope {
                            Scope::Owner => None,
                            Scope::Session(name) => Some(name.clone()),
                        };
                        return self.hold(asker, question, held).map(Begun::Held);
                    }
                    consented(&self.trusted, &consent, authored, &key, &format!("the component of run {run_id}"))?;
                }
                let options = ResumeOptions {
                    limits,
                    component,
                    scope: Some(scope),
                    events,
                    on_start: Some(on_start),
                    backend,
                    choice,
                    trace_parent,
                    caller_cwd: checked_cwd(caller_cwd)?,
                    input,
                };
                (tokio::spawn(async move { host.resume(&run_id, options).await }), recording)
            }
            _ => return Err(Error::Misrouted("not a start request")),
        };
        match started_rx.await {
            Ok(run_id) => Ok(Begun::Run(run_id, task, recording)),
            // The run failed before it existed: its error is the answer.
            Err(_) => match task.await {
                Ok(Err(e)) => Err(e),
                Ok(Ok(envelope)) => {
                    let run_id = envelope.run_id.clone();
                    Ok(Begun::Run(run_id, tokio::spawn(async move { Ok(envelope) }), recording))
                }
                Err(e) => Err(Error::Task(e)),
            },
        }
    }
}
