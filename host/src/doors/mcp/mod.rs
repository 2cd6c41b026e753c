//! `factory mcp`: the host behind the Model Context Protocol (stdio), so an agent in any MCP
//! client can run factories, resume them, and observe its runs. Two tools, as in the spec:
//! `run_factory` (`{ name, args?, limits? }` or `{ resumeFromRunId, limits?, input? }`; the
//! run envelope for every outcome, progress notifications while it runs, a client
//! cancellation cancels the run) and `factories_manage` (`list`, `inspect`, `runs`, `show`,
//! `progress`, `wait`, `cancel`, `pause`, `resume` with a checkpoint's answer, `remove`, `gc`). A factory the
//! service does not trust is asked about through MCP elicitation ([`super::elicit`]) when the
//! client can show a form.
//!
//! Every tool call is one or a few typed service [`Request`]s through a service [`Client`]:
//! the state directory's service (started if none runs), so the runs live there and outlive
//! this server; with `--no-daemon`, the `Host` this process opened. A client cancellation of
//! a waiting call (`notifications/cancelled`) cancels its run; a client that goes away does
//! not. One MCP connection (a stdio server
//! process, or one `Mcp-Session-Id` over HTTP) is one session, `mcp-<random hex>`, unless
//! `--session NAME` pins it; the client's self-reported name is only logged, never an identity.
//! The tools' inputs, their schemas and the tool errors are [`params`].

mod params;

use crate::doors::args::GlobalArgs;
use crate::doors::cli::backends;
use crate::doors::elicit;
use crate::doors::reach::{self, serve};
use anyhow::{Context, Result};
use clap::Args;
use factory_host::model::retention::Retention;
use factory_host::service::{Client, Consent, Followed, Follower, Request, Scope, ServiceError, Target};
use factory_host::store::ProgressQuery;
use factory_host::{ErrorCode, Limits, ProgressEvent, RunEnvelope};
use params::{ManageParams, Operation, RunFactoryParams, ToolError};
use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
use rmcp::model::{CallToolResult, ContentBlock, ProgressNotificationParam, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, RoleServer, ServerHandler, ServiceExt};
use serde::Deserialize;
use serde_json::{json, Value};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// `factory mcp` (the session: `--session NAME` or `FACTORY_SESSION` pins it; otherwise each
/// MCP connection is a fresh session).
#[derive(Args)]
pub struct McpArgs {
    /// The backend config file (default: factory.toml in the state directory, if present).
    #[arg(long, env = "FACTORY_CONFIG", value_name = "FILE")]
    config: Option<std::path::PathBuf>,
    /// With --http: MCP's streamable HTTP transport at `/mcp` instead of stdio (the bearer
    /// token is written to <state-dir>/mcp.token).
    #[command(flatten)]
    bind: crate::doors::http::bind::HttpBindArgs,
    /// The longest `run_factory` and `factories_manage` `wait` wait for a run before they
    /// answer with its current envelope (`running`); the run keeps going.
    #[arg(long, env = "FACTORY_MCP_WAIT_SECONDS", default_value = "50", value_parser = wait_seconds, value_name = "S")]
    wait_seconds: Duration,
}

/// `--wait-seconds`: a positive, finite number of seconds.
fn wait_seconds(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text.parse().map_err(|e| format!("{e}"))?;
    if seconds.is_nan() || seconds <= 0.0 {
        return Err("must be more than 0".into());
    }
    Duration::try_from_secs_f64(seconds).map_err(|e| e.to_string())
}

/// The token file of `factory mcp --http`, in the state directory.
pub const TOKEN_FILE: &str = crate::doors::state_files::MCP_TOKEN;

/// Whether the user named the session (`--session`, or `FACTORY_SESSION`), rather than
/// leaving the global default.
fn session_pinned() -> bool {
    std::env::var_os("FACTORY_SESSION").is_some()
        || std::env::args().any(|a| a == "--session" || a.starts_with("--session="))
}

/// Serve MCP on stdin/stdout until the client goes away.
pub async fn mcp(g: &GlobalArgs, a: McpArgs) -> Result<ExitCode> {
    let http = a.bind.address()?;
    let config = Arc::new(backends::load_config(g, a.config.as_ref())?);
    let access = reach::open_or_reach(g, config, reach::Holder::Service).await?;
    if !g.no_daemon {
        if a.config.is_some() {
            eprintln!("factory mcp: runs execute in the state directory's service, which uses its own backend configuration; --config applies with --no-daemon");
        }
        // This server is a client of the service while it lives; its runs live in the service.
        crate::doors::daemon::keep_alive(g);
    }
    // Holding the store, this process also answers other terminals on the control socket.
    let serving = match &access {
        Client::Local(local) => serve(g, local.host()),
        Client::Remote(_) => None,
    };
    let session = session_pinned().then(|| g.session.clone());
    let wait = a.wait_seconds;
    let trust = Arc::new(factory_host::trust::TrustStore::in_state_dir(&g.trust_dir()?));
    // One call per MCP connection (stdio: once; HTTP: once per `Mcp-Session-Id`).
    let make = move || FactoryMcp {
        client: access.clone(),
        session: session.clone().unwrap_or_else(|| format!("mcp-{}", uuid::Uuid::new_v4().simple())),
        wait,
        trust: trust.clone(),
        cancelled_calls: Default::default(),
        tool_router: FactoryMcp::tool_router(),
    };
    let ended = match http {
        None => match make().serve(rmcp::transport::stdio()).await {
            Ok(service) => service.waiting().await.map(|_| ()).context("the MCP connection failed"),
            Err(e) => Err(anyhow::Error::new(e).context("starting the MCP server on stdio")),
        },
        Some(addr) => serve_http(g, addr, make).await,
    };
    if let Some(serving) = serving {
        serving.drain().await;
    }
    ended?;
    Ok(ExitCode::SUCCESS)
}

/// The most MCP sessions `factory mcp --http` keeps at once: a new one past them is refused
/// (503, `unavailable`) until one ends (closed by its client, or idle [`MCP_SESSION_IDLE`]).
pub const MAX_MCP_SESSIONS: usize = 64;

/// An MCP-over-HTTP session with no request for this long is closed.
pub const MCP_SESSION_IDLE: Duration = Duration::from_secs(300);

/// MCP over streamable HTTP on `addr` (path `/mcp`), one [`FactoryMcp`] per MCP session,
/// until SIGINT/SIGTERM. A bearer token (in `<state-dir>/mcp.token`, 0600) is required on
/// every request; the SDK checks the `Host` header against loopback names. Connections are
/// bounded as [`crate::doors::http::bind`] says (header timeout, connection cap, accept
/// backoff); sessions by [`MAX_MCP_SESSIONS`] and [`MCP_SESSION_IDLE`].
async fn serve_http(
    g: &GlobalArgs,
    addr: std::net::SocketAddr,
    make: impl Fn() -> FactoryMcp + Send + Sync + 'static,
) -> Result<()> {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
    let bound = listener.local_addr()?;
    let token_file = g.state_dir.join(TOKEN_FILE);
    let shared = g.cluster_token()?;
    let bearer = crate::doors::http::bearer::Bearer::create(&token_file, shared.as_deref())
        .with_context(|| format!("writing {}", token_file.display()))?;
    let mut config = StreamableHttpServerConfig::default();
    if !bound.ip().is_loopback() {
        config.allowed_hosts.push(bound.ip().to_string());
    }
    let max_body = config.max_request_body_bytes;
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.keep_alive = Some(MCP_SESSION_IDLE);
    let sessions = Arc::new(sessions);
    let service = Arc::new(StreamableHttpService::new(move || Ok(make()), sessions.clone(), config));
    let bearer = Arc::new(bearer);
    eprintln!(
        "factory mcp: streamable HTTP on http://{bound}/mcp (bearer token in {})",
        g.state_dir.join(TOKEN_FILE).display()
    );
    let accept = crate::doors::http::bind::accept_loop(listener, "factory mcp --http", move |stream| {
        let (service, bearer, sessions) = (service.clone(), bearer.clone(), sessions.clone());
        async move {
            let handler = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let (service, bearer, sessions) = (service.clone(), bearer.clone(), sessions.clone());
                async move {
                    let presented = req.headers().get(hyper::header::AUTHORIZATION).and_then(|h| h.to_str().ok());
                    if !bearer.accepts(presented) || req.uri().path() != "/mcp" {
                        let status = if req.uri().path() != "/mcp" { 404 } else { 401 };
                        let body = http_body_util::BodyExt::boxed(http_body_util::Full::new(hyper::body::Bytes::from_static(
                            b"{\"code\":\"unauthorized\",\"message\":\"an `Authorization: Bearer <token>` header is required at /mcp\"}",
                        )));
                        let mut response = hyper::Response::new(body);
                        *response.status_mut() =
                            hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::UNAUTHORIZED);
                        return Ok::<_, std::convert::Infallible>(response);
                    }
                    // A request without a session id opens one: refused past the cap.
                    let opens = req.method() == hyper::Method::POST && !req.headers().contains_key("mcp-session-id");
                    if opens && sessions.sessions.read().await.len() >= MAX_MCP_SESSIONS {
                        tracing::warn!(
                            event = "refused",
                            door = "mcp",
                            "MCP session refused: {MAX_MCP_SESSIONS} sessions open"
                        );
                        let message = format!(
                            "{{\"code\":\"unavailable\",\"message\":\"{MAX_MCP_SESSIONS} MCP sessions are open: close one (DELETE /mcp) or wait {} s for an idle one to expire\"}}",
                            MCP_SESSION_IDLE.as_secs()
                        );
                        let mut response = hyper::Response::new(http_body_util::BodyExt::boxed(
                            http_body_util::Full::new(hyper::body::Bytes::from(message)),
                        ));
                        *response.status_mut() = hyper::StatusCode::SERVICE_UNAVAILABLE;
                        return Ok(response);
                    }
                    // The body is read here, bounded in size (the SDK's bound) and in time.
                    let (parts, body) = req.into_parts();
                    let limited = http_body_util::BodyExt::collect(http_body_util::Limited::new(body, max_body));
                    let body = match tokio::time::timeout(crate::doors::http::bind::BODY_READ_TIMEOUT, limited).await {
                        Ok(Ok(collected)) => collected.to_bytes(),
                        failed => {
                            let (status, message): (_, &'static [u8]) = match failed {
                                Err(_) => (hyper::StatusCode::REQUEST_TIMEOUT, b"{\"code\":\"invalid_params\",\"message\":\"the request body did not arrive in time\"}"),
                                _ => (hyper::StatusCode::PAYLOAD_TOO_LARGE, b"{\"code\":\"invalid_params\",\"message\":\"the request body is too large or broken\"}"),
                            };
                            let mut response = hyper::Response::new(http_body_util::BodyExt::boxed(
                                http_body_util::Full::new(hyper::body::Bytes::from_static(message)),
                            ));
                            *response.status_mut() = status;
                            return Ok(response);
                        }
                    };
                    Ok(service.handle(hyper::Request::from_parts(parts, http_body_util::Full::new(body))).await)
                }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = crate::doors::http::bind::http1().serve_connection(io, handler).await;
        }
    });
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = accept => {}
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    Ok(())
}

/// The MCP server of one connection: the store (or its holder) and the session it serves.
#[derive(Clone)]
struct FactoryMcp {
    /// The service (in this process, or the one holding the store).
    client: Client,
    /// The owner session of this connection (pinned, or fresh per connection).
    session: String,
    /// The longest a call waits for a run before answering with its current envelope.
    wait: Duration,
    /// The trust store an "always" answer to a consent question adds to.
    trust: Arc<factory_host::trust::TrustStore>,
    /// Calls of this connection the client cancelled (`notifications/cancelled`), until the
    /// call sees it.
    cancelled_calls: Arc<std::sync::Mutex<std::collections::HashSet<rmcp::model::RequestId>>>,
    #[allow(dead_code)] // read by the `tool_handler` macro
    tool_router: ToolRouter<Self>,
}

/// A success: `value` as structured content, `summary` as the text a model reads.
fn answer(value: Value, summary: String) -> CallToolResult {
    let mut result = CallToolResult::structured(value);
    result.content = vec![ContentBlock::text(summary)];
    result
}

#[tool_router]
impl FactoryMcp {
    #[tool(
        name = "run_factory",
        description = "Run an agent factory — a sandboxed workflow that coordinates many subagents — and wait for it to end, or resume a run that stopped. A factory this machine does not trust is asked about first (an elicitation form to your user: approve once, always, or decline). Give { name, args?, limits? } to start one (factories_manage `list` shows what exists and what args each expects), or { resumeFromRunId, limits? } to continue a run that hit a limit, was cancelled or was interrupted: its finished work replays for free. Returns the run envelope for every outcome: status (completed, error, halted, paused, cancelled), result (when completed), a typed failure (e.g. factory_limit_reached with the limit's name: resume with that limit raised), accounting, and the runId. Only failures before a run exists are tool errors (unknown name, bad limits, not_found, non_resumable, already_active, declined, no_approval_provider when your client cannot show the question)."
    )]
    async fn run_factory(
        &self,
        Parameters(params): Parameters<RunFactoryParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        Ok(match self.run_factory_inner(params, &context).await {
            Ok(result) => result,
            Err(e) => e.result(),
        })
    }

    #[tool(
        name = "factories_manage",
        description = "Look at factories and at this session's factory runs, or write a new factory. operation `list` (factories you can run), `inspect` {name}, `author` {meta, run} (register a JavaScript factory in this session without running it), `runs` (your runs with ids and statuses — use it to recover a run id for run_factory's resumeFromRunId), `show` {runId}, `progress` {runId, afterSeq?, beforeSeq?, phase?, limit?}, `wait` {runId}, `cancel` {runId}, `pause` {runId}, `resume` {runId, input?} (answer the checkpoint a paused run waits at). Prompts are never shown."
    )]
    async fn factories_manage(
        &self,
        Parameters(params): Parameters<ManageParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        Ok(match self.manage_inner(params, &context).await {
            Ok(result) => result,
            Err(e) => e.result(),
        })
    }
}

#[tool_handler]
impl ServerHandler for FactoryMcp {
    // Logging: the channel the completion and phase notifications use (rmcp marks it
    // deprecated by SEP-2577; MCP clients surface it today).
    #[allow(deprecated)]
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_logging().build()).with_instructions(
            "factory runs agent factories: sandboxed, durable workflows of many subagents. Use factories_manage \
             (operation list) to see what can run, run_factory to run or resume one, and factories_manage (runs, \
             show, progress) to observe your runs.",
        )
    }

    async fn on_cancelled(
        &self,
        notification: rmcp::model::CancelledNotificationParam,
        _context: rmcp::service::NotificationContext<RoleServer>,
    ) {
        if let Some(id) = notification.request_id {
            let mut calls = self.cancelled_calls.lock().unwrap_or_else(|p| p.into_inner());
            // Bounded: a client cancelling calls that already ended leaves ids nobody takes.
            if calls.len() >= 1024 {
                calls.clear();
            }
            calls.insert(id);
        }
    }

    async fn on_initialized(&self, context: rmcp::service::NotificationContext<RoleServer>) {
        // The client's name is shown, never used as an identity.
        let name = context.peer.peer_info().map(|info| info.client_info.name.clone()).unwrap_or_default();
        let name: String = name.chars().filter(|c| !c.is_control()).take(64).collect();
        eprintln!("factory mcp: client `{name}` connected as session {}", self.session);
    }
}

impl FactoryMcp {
    /// The session of this connection (never derived from what the client says of itself).
    fn session(&self, _context: &RequestContext<RoleServer>) -> String {
        self.session.clone()
    }

    /// A service error as a tool error, with its code.
    fn tool_error(e: ServiceError) -> ToolError {
        ToolError::new(e.code(), e.to_string())
    }

    /// The consent question for running the registered factory `name` under `overrides`.
    async fn run_question(&self, session: &str, name: &str, overrides: &Limits) -> Result<elicit::Question, ToolError> {
        let registration = self.client.inspect(session, name).await.map_err(Self::tool_error)?;
        let meta = &registration.meta;
        Ok(elicit::Question {
            factory: meta.name.clone(),
            sha256: factory_host::service::registration_trust_key(&registration).to_string(),
            operation: elicit::Operation::Run,
            backend: "the service's default backend".into(),
            limits: meta.limits.overridden_by(overrides),
            phases: meta.phases.iter().map(|p| p.title.clone()).collect(),
            grants: Vec::new(),
        })
    }

    /// The consent question for resuming `run_id` under `overrides`: its latest factory.
    async fn resume_question(
        &self,
        session: &str,
        run_id: &str,
        overrides: &Limits,
    ) -> Result<elicit::Question, ToolError> {
        let detail = self.client.detail(Scope::Session(session.to_string()), run_id).await.map_err(Self::tool_error)?;
        let script = detail.scripts.last().cloned().flatten().map(|s| s.sha256);
        let sha256 = script.or_else(|| detail.component_hashes.last().cloned()).unwrap_or_default();
        Ok(elicit::Question {
            factory: detail.envelope.factory.clone(),
            sha256,
            operation: elicit::Operation::Resume,
            backend: detail.backends.last().map_or_else(|| "the service's default backend".into(), |b| b.name.clone()),
            limits: detail.limits.overridden_by(overrides),
            phases: detail.phases.clone(),
            grants: detail.grants.clone(),
        })
    }

    /// Trust `sha256` (of factory `name`) from now on: an "always" answer.
    fn trust(&self, sha256: &str, name: &str) -> Result<(), ToolError> {
        let entry = factory_host::trust::TrustedComponent {
            name: Some(name.to_string()),
            ..factory_host::trust::TrustedComponent::new(sha256, factory_host::trust::TrustSource::Approved)
        };
        self.trust.trust(entry).map_err(|e| ToolError::new(ErrorCode::Error, e.to_string()))?;
        tracing::info!(event = "trusted", door = "mcp", factory = %name, sha256 = %sha256, "approved always over MCP");
        Ok(())
    }

    /// Ask `question` of the client's user: whether it was approved always or once, or a
    /// `declined` tool error (nothing started).
    async fn approved(
        &self,
        context: &RequestContext<RoleServer>,
        question: &elicit::Question,
    ) -> Result<elicit::Answer, ToolError> {
        let answer =
            elicit::ask(&context.peer, question).await.map_err(|e| ToolError::new(ErrorCode::Error, e.to_string()))?;
        match answer {
            elicit::Answer::Once | elicit::Answer::Always => Ok(answer),
            elicit::Answer::Declined(why) => Err(ToolError::new(
                ErrorCode::Declined,
                format!(
                    "{}: factory `{}` (sha256 {}) was not approved to {}; nothing started",
                    why.says(),
                    question.factory,
                    question.sha256,
                    match question.operation {
                        elicit::Operation::Run => "run",
                        elicit::Operation::Resume => "resume",
                        elicit::Operation::Author => "be registered",
                    }
                ),
            )),
        }
    }

    /// Whether the client cancelled the call `id` (`notifications/cancelled`), rather than
    /// going away: rmcp cancels a call's token for both. The notification reaches
    /// [`ServerHandler::on_cancelled`] just after the token fires, so it is waited for a
    /// moment.
    async fn client_cancelled(&self, id: &rmcp::model::RequestId) -> bool {
        let deadline = tokio::time::Instant::now() + CANCEL_NOTICE;
        loop {
            if self.cancelled_calls.lock().unwrap_or_else(|p| p.into_inner()).remove(id) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn run_factory_inner(
        &self,
        params: RunFactoryParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ToolError> {
        let session = self.session(context);
        let limits = params.limits.unwrap_or_default();
        let trace_parent = trace_parent_of(context)?;
        let resume = match (&params.name, &params.resume_from_run_id) {
            (Some(_), None) if params.input.is_some() => {
                return Err(ToolError::new(
                    ErrorCode::InvalidParams,
                    "`input` answers a paused run's checkpoint: give it with `resumeFromRunId`",
                ));
            }
            (Some(_), None) => false,
            (None, Some(_)) if params.args.is_some() => {
                return Err(ToolError::new(ErrorCode::InvalidParams, "a resume keeps the run's args: give no `args`"))
            }
            (None, Some(_)) => true,
            _ => return Err(ToolError::new(
                ErrorCode::InvalidParams,
                "give either `name` (with optional `args` and `limits`) or `resumeFromRunId` (with optional `limits`)",
            )),
        };
        // Consent: the service's own trust check decides first (factories authored in this
        // session run without it); one it refuses is asked of the client's user, when the
        // client can be asked, and started again with exactly the sha256 approved.
        let start = |consent: Consent| match (&params.name, &params.resume_from_run_id) {
            (Some(name), _) => Request::Run {
                session: session.clone(),
                component: Target::Registered(name.clone()),
                args: params.args.clone(),
                limits,
                backend: Default::default(),
                grants: Vec::new(),
                declined: false,
                consent,
                trace_parent: trace_parent.clone(),
                // This server's working directory (the project its client works in).
                caller_cwd: factory_host::service::caller_cwd(),
                replay: None,
                record: false,
            },
            (None, run_id) => Request::Resume {
                scope: session.clone().into(),
                run_id: run_id.clone().unwrap_or_default(),
                component: None,
                limits,
                backend: Default::default(),
                consent,
                trace_parent: trace_parent.clone(),
                // This server's working directory (the project its client works in).
                caller_cwd: factory_host::service::caller_cwd(),
                input: params.input.clone(),
                replay: None,
                record: false,
            },
        };
        let run_id = match self.client.start(start(Consent::None)).await {
            Ok(run_id) => run_id,
            Err(e) if e.code() == ErrorCode::NoApprovalProvider && elicit::can_ask(&context.peer) => {
                let question = match (&params.name, &params.resume_from_run_id) {
                    (Some(name), _) => self.run_question(&session, name, &limits).await?,
                    (None, run_id) => {
                        self.resume_question(&session, run_id.as_deref().unwrap_or_default(), &limits).await?
                    }
                };
                let question = elicit::Question {
                    operation: if resume { elicit::Operation::Resume } else { elicit::Operation::Run },
                    ..question
                };
                if self.approved(context, &question).await? == elicit::Answer::Always {
                    self.trust(&question.sha256, &question.factory)?;
                }
                self.client.start(start(Consent::Sha256(question.sha256.clone()))).await.map_err(Self::tool_error)?
            }
            Err(e) => return Err(Self::tool_error(e)),
        };
        let (notify, log_phases) = (params.notify_on_complete.unwrap_or(true), params.log_phase_names.unwrap_or(false));
        let (envelope, cancelled, seen) = self.follow(&session, &run_id, context, log_phases).await?;
        let mut summary = summarize(&envelope);
        self.still_running(&envelope, &mut summary);
        if !envelope.status.is_terminal() && (notify || log_phases) {
            // The call answers now; the session is told the rest as it happens.
            let (client, peer, id) = (self.client.clone(), context.peer.clone(), run_id.clone());
            tokio::spawn(tell_session(client, Scope::Session(session.clone()), id, seen, peer, notify, log_phases));
            if notify {
                summary.push_str(" This session will be told when it ends (a `factory_completed` log notification).");
            }
        }
        if cancelled {
            summary.push_str(&format!(
                " The client cancelled the call, so the run was cancelled; resume it with run_factory {{\"resumeFromRunId\": \"{run_id}\"}}."
            ));
        }
        Ok(answer(to_value(&envelope)?, summary))
    }

    /// If the bound passed before the run ended: say how to go on.
    fn still_running(&self, envelope: &RunEnvelope, summary: &mut String) {
        if !envelope.status.is_terminal() {
            let id = &envelope.run_id;
            summary.push_str(&format!(
                " It is still running after {}s and keeps running: wait for it with factories_manage {{\"operation\": \"wait\", \"runId\": \"{id}\"}} (also bounded), or stop it with factories_manage {{\"operation\": \"cancel\", \"runId\": \"{id}\"}}.",
                self.wait.as_secs_f64()
            ));
        }
    }

    /// Follow a run with the service's [`Follower`] to its end, or at most
    /// [`FactoryMcp::wait`]: progress notifications when the client gave a token, and with
    /// `log_phases` a log notification per phase entered. A client cancellation of the call
    /// cancels the run (a deliberate stop); a client that goes away leaves it running.
    /// Returns the envelope (terminal, or `running` at the bound), whether the client
    /// cancelled, and the last progress seq seen.
    async fn follow(
        &self,
        session: &str,
        run_id: &str,
        context: &RequestContext<RoleServer>,
        log_phases: bool,
    ) -> Result<(RunEnvelope, bool, u64), ToolError> {
        let token = context.meta.get_progress_token();
        let mut seen = 0u64;
        let (mut done, mut phase) = (0u64, None::<String>);
        let mut cancelled = false;
        let bound = tokio::time::sleep(self.wait);
        tokio::pin!(bound);
        let mut follower = Follower::new(self.client.clone(), Scope::Session(session.to_string()), run_id, 0).await;
        loop {
            tokio::select! {
                next = follower.next() => match next {
                    Some(Ok(Followed::Progress(entry))) => {
                        seen = seen.max(entry.seq);
                        match &entry.event {
                            ProgressEvent::Phase { title } => {
                                if log_phases {
                                    let _ = log_to(&context.peer, phase_note(run_id, title)).await;
                                }
                                phase = Some(title.clone());
                            }
                            ProgressEvent::AgentFinished { .. } => done += 1,
                            _ => continue,
                        }
                        if let Some(token) = &token {
                            let message = match &phase {
                                Some(phase) => format!("phase {phase}: {done} agents done"),
                                None => format!("{done} agents done"),
                            };
                            let note = ProgressNotificationParam::new(token.clone(), done as f64).with_message(message);
                            let _ = context.peer.notify_progress(note).await;
                        }
                    }
                    Some(Ok(Followed::Ended(envelope))) => return Ok((envelope, cancelled, seen)),
                    Some(Err(e)) => return Err(Self::tool_error(e)),
                    None => return Err(ToolError::new(ErrorCode::Error, "following the run ended without its envelope")),
                },
                _ = &mut bound, if !cancelled => {
                    let envelope = self.client.envelope(Scope::Session(session.to_string()), run_id).await.map_err(Self::tool_error)?;
                    return Ok((envelope, false, seen));
                }
                _ = context.ct.cancelled(), if !cancelled => {
                    if !self.client_cancelled(&context.id).await {
                        // The client went away: nobody reads an answer; the run goes on.
                        return Err(ToolError::new(ErrorCode::Cancelled, "the client went away; the run keeps running"));
                    }
                    cancelled = true;
                    self.client.cancel(Scope::Session(session.to_string()), run_id).await.map_err(Self::tool_error)?;
                }
            }
        }
    }

    async fn manage_inner(
        &self,
        p: ManageParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ToolError> {
        let session = self.session(context);
        let scope = || Scope::Session(session.clone());
        let operation = Operation::named(&p.operation)?;
        let need = |field: Option<String>, what: &str| {
            field.ok_or_else(|| {
                ToolError::new(ErrorCode::InvalidParams, format!("operation `{}` needs `{what}`", operation.as_str()))
            })
        };
        match operation {
            Operation::List => {
                let registered = self.client.factories(&session).await.map_err(Self::tool_error)?;
                let factories: Vec<Value> = registered.iter().map(|r| factory_summary(&r.meta)).collect();
                let names: Vec<&str> = registered.iter().map(|r| r.meta.name.as_str()).collect();
                let summary = if names.is_empty() {
                    "No factories are registered (a user adds them with `factory add`).".to_string()
                } else {
                    format!("{} factories: {}.", names.len(), names.join(", "))
                };
                Ok(answer(json!({ "factories": factories }), summary))
            }
            Operation::Author => {
                let meta = p
                    .meta
                    .ok_or_else(|| ToolError::new(ErrorCode::InvalidParams, "operation `author` needs `meta`"))?;
                let run = need(p.run, "run")?;
                // Code an agent just wrote: asked of the client's user first, when it can be.
                let approval = match elicit::can_ask(&context.peer) {
                    true => Some(self.approved(context, &author_question(&meta, &run)).await?),
                    false => None,
                };
                let registration = self.client.author(&session, meta, run).await.map_err(Self::tool_error)?;
                // "Always" trusts the body as registered (its source's sha256).
                if let (Some(elicit::Answer::Always), Some(script)) = (approval, &registration.script) {
                    self.trust(&script.sha256, &registration.meta.name)?;
                }
                let name = &registration.meta.name;
                let summary = format!(
                    "Registered factory `{name}` in this session (not run). Run it with run_factory {{\"name\": \"{name}\"}}."
                );
                let mut value = factory_summary(&registration.meta);
                value["sha256"] = json!(registration.script.as_ref().map(|s| s.sha256.clone()));
                Ok(answer(value, summary))
            }
            Operation::Inspect => {
                let name = need(p.name, "name")?;
                let registration = self.client.inspect(&session, &name).await.map_err(Self::tool_error)?;
                let m = &registration.meta;
                let mut value = factory_summary(m);
                value["argsSchema"] = match &m.args_schema {
                    Some(schema) => schema.to_value().map_err(|e| ToolError::new(ErrorCode::Error, e.to_string()))?,
                    None => Value::Null,
                };
                value["sha256"] = json!(registration.hash);
                Ok(answer(value, format!("{}: {}", m.name, m.description)))
            }
            Operation::Runs if p.after_seq.is_some() || p.before_seq.is_some() => {
                let page = self
                    .client
                    .runs_by_seq(scope(), p.after_seq, p.before_seq, p.limit)
                    .await
                    .map_err(Self::tool_error)?;
                let listed: Vec<Value> = page
                    .runs
                    .iter()
                    .map(|r| {
                        json!({"runId": r.run_id, "seq": r.seq, "factory": r.factory, "status": r.status,
                               "attempts": r.attempts, "createdAt": r.created_at, "updatedAt": r.updated_at})
                    })
                    .collect();
                let mut lines: Vec<String> = page
                    .runs
                    .iter()
                    .map(|r| format!("{} {} {} {}", r.seq.unwrap_or_default(), r.run_id, r.factory, r.status.as_str()))
                    .collect();
                if lines.is_empty() {
                    lines.push("No runs in this page.".into());
                }
                if page.omitted_older {
                    lines.push(format!(
                        "Older runs: beforeSeq {}.",
                        page.oldest_seq.map_or("?".into(), |s| s.to_string())
                    ));
                }
                if page.has_more_newer {
                    lines.push(format!(
                        "Newer runs: afterSeq {}.",
                        page.newest_seq.map_or("?".into(), |s| s.to_string())
                    ));
                }
                let value = json!({ "runs": listed, "oldestSeq": page.oldest_seq, "newestSeq": page.newest_seq,
                                    "hasMoreNewer": page.has_more_newer, "omittedOlder": page.omitted_older });
                Ok(answer(value, lines.join("\n")))
            }
            Operation::Runs => {
                let limit = p.limit.unwrap_or(factory_host::MAX_RUNS_PAGE).min(factory_host::MAX_RUNS_PAGE);
                let runs = self.client.runs_page(scope(), p.after, Some(limit)).await.map_err(Self::tool_error)?;
                let listed: Vec<Value> = runs
                    .iter()
                    .map(|r| {
                        json!({"runId": r.run_id, "seq": r.seq, "factory": r.factory, "status": r.status,
                               "attempts": r.attempts, "createdAt": r.created_at, "updatedAt": r.updated_at})
                    })
                    .collect();
                let lines: Vec<String> =
                    runs.iter().map(|r| format!("{} {} {}", r.run_id, r.factory, r.status.as_str())).collect();
                let summary = if lines.is_empty() { "No runs in this session.".into() } else { lines.join("\n") };
                let next = runs.last().filter(|_| runs.len() >= limit).map(|r| r.run_id.clone());
                Ok(answer(json!({ "runs": listed, "next": next }), summary))
            }
            Operation::Show => {
                let run_id = need(p.run_id, "runId")?;
                let detail = self.client.detail(scope(), &run_id).await.map_err(Self::tool_error)?;
                Ok(answer(to_value(&detail)?, summarize(&detail.envelope)))
            }
            Operation::Progress => {
                let run_id = need(p.run_id, "runId")?;
                let query =
                    ProgressQuery { after_seq: p.after_seq, before_seq: p.before_seq, phase: p.phase, limit: p.limit };
                let page = self.client.progress(scope(), &run_id, query).await.map_err(Self::tool_error)?;
                let n = page.len();
                Ok(answer(json!({ "entries": page }), format!("{n} progress entries.")))
            }
            Operation::Wait => {
                let run_id = need(p.run_id, "runId")?;
                let (envelope, cancelled, _) = self.follow(&session, &run_id, context, false).await?;
                let mut summary = summarize(&envelope);
                self.still_running(&envelope, &mut summary);
                if cancelled {
                    summary.push_str(" The client cancelled the wait, so the run was cancelled.");
                }
                Ok(answer(to_value(&envelope)?, summary))
            }
            Operation::Cancel => {
                let run_id = need(p.run_id, "runId")?;
                let envelope = tokio::select! {
                    envelope = self.client.cancel(scope(), &run_id) => envelope.map_err(Self::tool_error)?,
                    _ = context.ct.cancelled() => return Err(ToolError::new(ErrorCode::Cancelled, "the call was cancelled")),
                };
                Ok(answer(to_value(&envelope)?, summarize(&envelope)))
            }
            Operation::Pause => {
                let run_id = need(p.run_id, "runId")?;
                let envelope = tokio::select! {
                    envelope = self.client.pause(scope(), &run_id) => envelope.map_err(Self::tool_error)?,
                    _ = context.ct.cancelled() => return Err(ToolError::new(ErrorCode::Cancelled, "the call was cancelled")),
                };
                Ok(answer(to_value(&envelope)?, summarize(&envelope)))
            }
            Operation::Resume => {
                let run_id = need(p.run_id, "runId")?;
                let params = RunFactoryParams {
                    name: None,
                    args: None,
                    resume_from_run_id: Some(run_id),
                    limits: None,
                    input: p.input,
                    notify_on_complete: None,
                    log_phase_names: None,
                };
                Box::pin(self.run_factory_inner(params, context)).await
            }
            Operation::Remove => {
                let run_id = need(p.run_id, "runId")?;
                self.client.remove(scope(), &run_id).await.map_err(Self::tool_error)?;
                Ok(answer(
                    json!({ "runId": run_id, "removed": true }),
                    format!("Run {run_id} and its journal were deleted."),
                ))
            }
            Operation::Gc => {
                let policy = Retention { keep_days: p.keep_days, keep_last: p.keep_last };
                if !policy.is_set() {
                    let message = "operation `gc` needs `keepDays` or `keepLast` (the retention policy)";
                    return Err(ToolError::new(ErrorCode::InvalidParams, message));
                }
                let dry_run = p.dry_run.unwrap_or(false);
                let report = self.client.gc(scope(), policy, dry_run).await.map_err(Self::tool_error)?;
                let verb = if report.dry_run { "would be deleted" } else { "were deleted" };
                let summary = format!("{} ended runs {verb}, {} kept.", report.removed.len(), report.kept);
                let body =
                    serde_json::to_value(&report).map_err(|e| ToolError::new(ErrorCode::Error, e.to_string()))?;
                Ok(answer(body, summary))
            }
        }
    }
}

/// The longest result preview a completion notification carries, in bytes of JSON text.
const RESULT_PREVIEW_BYTES: usize = 500;

/// Send `data` to the MCP session as a log notification (`notifications/message`, logger
/// `factory`); an error when the session is gone.
#[allow(deprecated)] // rmcp marks logging deprecated (SEP-2577); it is what MCP clients surface today.
async fn log_to(
    peer: &rmcp::Peer<RoleServer>,
    (level, data): (rmcp::model::LoggingLevel, Value),
) -> Result<(), rmcp::service::ServiceError> {
    peer.notify_logging_message(rmcp::model::LoggingMessageNotificationParam::new(level, data).with_logger("factory"))
        .await
}

/// The log notification of a phase the run entered.
#[allow(deprecated)]
fn phase_note(run_id: &str, title: &str) -> (rmcp::model::LoggingLevel, Value) {
    let message = format!("run {run_id}: phase {title}");
    (rmcp::model::LoggingLevel::Info, json!({ "event": "phase", "runId": run_id, "phase": title, "message": message }))
}

/// The log notification of a run that ended after its call answered: its status, a preview
/// of its result, and how to read it or go on (upstream's `factory_completed`).
#[allow(deprecated)]
fn completion_note(envelope: &RunEnvelope) -> (rmcp::model::LoggingLevel, Value) {
    let id = &envelope.run_id;
    let preview = envelope.result.as_ref().map(|r| {
        let text = r.get();
        let mut end = text.len().min(RESULT_PREVIEW_BYTES);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        if end < text.len() {
            format!("{}…", &text[..end])
        } else {
            text.to_string()
        }
    });
    let message = format!(
        "{} Read its whole envelope and result with factories_manage {{\"operation\": \"show\", \"runId\": \"{id}\"}}.",
        summarize(envelope)
    );
    let level = if envelope.status == factory_host::RunStatus::Completed {
        rmcp::model::LoggingLevel::Info
    } else {
        rmcp::model::LoggingLevel::Warning
    };
    let data = json!({ "event": "factory_completed", "runId": id, "factory": envelope.factory, "status": envelope.status,
                       "resultPreview": preview, "message": message });
    (level, data)
}

/// After a call answered with the run still going: follow it from progress seq `after` to its
/// end, logging the phases it enters (`log_phases`) and, with `notify`, its completion into
/// the session. Ends with the run, or when the session is gone.
async fn tell_session(
    client: Client,
    scope: Scope,
    run_id: String,
    after: u64,
    peer: rmcp::Peer<RoleServer>,
    notify: bool,
    log_phases: bool,
) {
    let mut follower = Follower::new(client, scope, &run_id, after).await;
    while let Some(next) = follower.next().await {
        let told = match next {
            Ok(Followed::Progress(entry)) => match &entry.event {
                ProgressEvent::Phase { title } if log_phases => log_to(&peer, phase_note(&run_id, title)).await,
                _ => Ok(()),
            },
            Ok(Followed::Ended(envelope)) => {
                if notify {
                    let _ = log_to(&peer, completion_note(&envelope)).await;
                }
                return;
            }
            Err(_) => return,
        };
        if told.is_err() || peer.is_transport_closed() {
            return;
        }
    }
}

/// How long a call whose token fired waits for the client's `notifications/cancelled`
/// before it takes the client for gone.
const CANCEL_NOTICE: Duration = Duration::from_millis(500);

/// A typed answer as structured content.
fn to_value<T: serde::Serialize>(value: &T) -> Result<Value, ToolError> {
    serde_json::to_value(value).map_err(|e| ToolError::new(ErrorCode::Error, e.to_string()))
}

/// The caller's trace for a run this call starts: the request's `_meta.traceparent`, else
/// (streamable HTTP) its `traceparent` header; one that is not W3C trace context is refused.
fn trace_parent_of(
    context: &RequestContext<RoleServer>,
) -> Result<Option<factory_host::trace::TraceParent>, ToolError> {
    let from_meta = match context.meta.get("traceparent") {
        None => None,
        Some(Value::String(text)) => Some(text.clone()),
        Some(_) => return Err(ToolError::new(ErrorCode::InvalidParams, "`_meta.traceparent` must be a string")),
    };
    let from_header = || {
        let parts = context.extensions.get::<hyper::http::request::Parts>()?;
        Some(parts.headers.get("traceparent")?.to_str().unwrap_or_default().to_string())
    };
    match from_meta.or_else(from_header) {
        None => Ok(None),
        Some(text) => factory_host::trace::TraceParent::parse(&text)
            .map(Some)
            .map_err(|e| ToolError::new(ErrorCode::InvalidParams, e.to_string())),
    }
}

/// What a model is shown of a factory's meta: name, description, phases, limits.
fn factory_summary(meta: &factory_host::FactoryMeta) -> Value {
    json!({"name": meta.name, "description": meta.description, "phases": meta.phases, "limits": meta.limits})
}

/// What the consent question for an authored body shows of its `meta` (the service checks
/// the whole of it when it registers the body).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct AuthoredMeta {
    name: String,
    phases: Vec<AuthoredPhase>,
    /// Limits that do not read show as none declared (the service then refuses them).
    #[serde(deserialize_with = "limits_or_none")]
    limits: Limits,
}

fn limits_or_none<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Limits, D::Error> {
    Ok(serde_json::from_value(Value::deserialize(deserializer)?).unwrap_or_default())
}

/// A phase of an authored `meta`: its title.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct AuthoredPhase {
    title: String,
}

/// The consent question for registering the body `run` an agent wrote with `meta`, before
/// the service has seen it: the sha256 is of the body's text as given. A `meta` that does not
/// read shows what it can (the service refuses it after the question).
fn author_question(meta: &Value, run: &str) -> elicit::Question {
    use sha2::Digest;
    let shown: AuthoredMeta = serde_json::from_value(meta.clone()).unwrap_or_default();
    elicit::Question {
        factory: shown.name,
        sha256: hex::encode(sha2::Sha256::digest(run.as_bytes())),
        operation: elicit::Operation::Author,
        backend: "the service's default backend".into(),
        limits: shown.limits,
        phases: shown.phases.into_iter().map(|p| p.title).collect(),
        grants: Vec::new(),
    }
}

/// A short text a model can read: what happened and what to do next.
fn summarize(e: &RunEnvelope) -> String {
    let status = e.status.as_str();
    let acc = &e.accounting;
    let mut text = format!(
        "Run {} of `{}` is {status} after {} attempt(s): {} subagents spawned, {} replayed, {:.1}s active, {}{} AI credits.",
        e.run_id,
        e.factory,
        e.attempts,
        acc.agents_spawned,
        acc.agent_cache_hits,
        acc.active_seconds,
        if acc.ai_credits_at_least { "at least " } else { "" },
        acc.ai_credits()
    );
    if let Some(f) = &e.failure {
        let kind = f.kind.as_deref().map(|k| format!(" ({k})")).unwrap_or_default();
        text.push_str(&format!(" Failure: {}{kind}: {}", f.kind_type, f.message));
        if let Some(key) = e.checkpoint.as_deref().filter(|_| e.status == factory_host::RunStatus::Paused) {
            let id = &e.run_id;
            text.push_str(&format!(
                " It waits at checkpoint `{key}`: answer it with factories_manage {{\"operation\": \"resume\", \"runId\": \"{id}\", \"input\": <your answer as JSON>}} (ctx.pause(\"{key}\") returns the input; without one it returns null)."
            ));
        } else if e.status != factory_host::RunStatus::Completed {
            text.push_str(&format!(" Resume with run_factory {{\"resumeFromRunId\": \"{}\"}}", e.run_id));
            if f.kind_type == factory_host::FailureType::FactoryLimitReached {
                text.push_str(" and the limit raised in `limits`");
            }
            text.push('.');
        }
    }
    if let Some(result) = &e.result {
        let shown = result.to_string();
        let cut: String = shown.chars().take(2000).collect();
        text.push_str(&format!(" Result: {cut}{}", if cut.len() < shown.len() { "…" } else { "" }));
    }
    text
}
