//! The service implemented over an in-process [`Host`]: what the process holding the store
//! answers, to its own front doors and (through the control socket) to every other one.
//! Queries read the host; `run` and `resume` check consent, start the attempt in the
//! background and answer once the run has an id.

use super::consent::{consented, trust_key, TrustCheck};
use super::wire::{Request, Response, Source, Target};
use crate::engine::host::{Host, ResumeOptions, RunOptions};
use crate::error::Error;
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

/// The service over a [`Host`] this process opened, with its trust check.
#[derive(Clone)]
pub struct Local {
    host: Arc<Host>,
    trusted: TrustCheck,
}

impl Local {
    /// The service over `host`; `trusted` says which trust keys run without consent.
    pub fn new(host: Arc<Host>, trusted: TrustCheck) -> Self {
        Local { host, trusted }
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
            Request::Metrics => Response::Metrics { text: crate::metrics::metrics().render(host.active_runs().len()) },
            start @ (Request::Run { .. } | Request::Resume { .. }) => {
                Response::Started { run_id: self.start(start).await? }
            }
            Request::Subscribe { .. } => {
                return Err(Error::Misrouted("a subscription is a stream: use Client::updates"))
            }
            Request::Follow { .. } | Request::StartFollowing { .. } => {
                return Err(Error::Misrouted("a follow is a stream: use Follower"))
            }
        })
    }

    /// Start a run or a resume in the background; answer its id once it exists (or the
    /// error that kept it from existing).
    async fn start(&self, request: Request) -> Result<String, Error> {
        let host = self.host.clone();
        let (started, started_rx) = tokio::sync::oneshot::channel::<String>();
        let on_start: Box<dyn FnOnce(&str) + Send> = Box::new(move |id: &str| {
            let _ = started.send(id.to_string());
        });
        let task = match request {
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
            } => {
                // Refuse an unusable backend before the run exists.
                let backend = Some(host.chosen_backend(&choice)?);
                let factory = match &component {
                    Target::File(path) => host.load_file(path).await?,
                    Target::Registered(name) => host.load_registered_for(&session, name).await?,
                };
                if !declined {
                    let key = trust_key(&factory);
                    let authored = host.authored_in(&session, key).await?;
                    consented(&self.trusted, &consent, authored, key, &format!("factory `{}`", factory.meta.name))?;
                }
                let options = RunOptions {
                    args,
                    limits,
                    session: Some(session),
                    events: None,
                    on_start: Some(on_start),
                    backend,
                    choice: BackendChoice::default(),
                    grants,
                    trace_parent,
                    caller_cwd: checked_cwd(caller_cwd)?,
                };
                tokio::spawn(async move {
                    if declined {
                        host.decline(&factory, options).await
                    } else {
                        host.run(&factory, options).await
                    }
                })
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
            } => {
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
                    consented(&self.trusted, &consent, authored, &key, &format!("the component of run {run_id}"))?;
                }
                let options = ResumeOptions {
                    limits,
                    component,
                    scope: Some(scope),
                    events: None,
                    on_start: Some(on_start),
                    backend: None,
                    choice,
                    trace_parent,
                    caller_cwd: checked_cwd(caller_cwd)?,
                    input,
                };
                tokio::spawn(async move { host.resume(&run_id, options).await })
            }
            _ => return Err(Error::Misrouted("not a start request")),
        };
        match started_rx.await {
            Ok(run_id) => Ok(run_id),
            // The run failed before it existed: its error is the answer.
            Err(_) => match task.await {
                Ok(Err(e)) => Err(e),
                Ok(Ok(envelope)) => Ok(envelope.run_id),
                Err(e) => Err(Error::Task(e)),
            },
        }
    }
}
