//! `factory serve --http ADDR`: the JSON API over HTTP, for dashboards and scripts. Every
//! endpoint is one typed service [`Request`] answered through a service [`Client`] — the
//! same operations the CLI, the control socket and MCP speak, with the same error codes —
//! plus a Server-Sent Events stream of `run_updated {runId, revision}` (the client's
//! [`factory_host::service::Updates`]).
//! Every method and path served is a row of the route table in [`routes`], which the
//! router matches against and `GET /api/openapi.json` describes (an OpenAPI 3.1 document);
//! a path served with another method is answered 405, any other path 404.
//!
//! Access: loopback only unless `--http-any-address`; a random bearer token made at start
//! and written to `<state-dir>/http.token` (0600) is required on every `/api` call (no
//! cookies, so no cross-site request can carry it); the `Host` header must name the address
//! served (DNS rebinding); no CORS headers are sent, so other origins cannot read answers.
//! The token is the user's, so the API has the owner's view: it lists, reads, follows,
//! cancels, pauses, resumes (with `input`, a checkpoint's answer) and deletes (`DELETE
//! /api/runs/ID`) the runs of every session (each
//! envelope names its `session`; `GET /api/runs?session=NAME` lists one session's, a page of
//! summaries at a time: `after=RUN&limit=N`), and its events cover every run. A run
//! started over HTTP goes in the daemon's session (`--session`, shown at `/api/session`).
//! A request with a [`SESSION_HEADER`] instead acts as that session (the Node client's
//! `joinSession`): it starts runs and registers factories (`POST /api/factories`) there, and
//! lists, reads, follows and controls only that session's runs, as an MCP connection does.
//! A start of an untrusted factory without `approved` is held by the service as a pending
//! approval (`GET /api/approvals`, answered with `POST /api/approvals/ID/approve|decline`);
//! the request waits for the answer a bounded time, then answers `pending_approval`.
//!
//! `GET /` and `/ui/*` serve the web dashboard (assets embedded from `ui/`, no token needed:
//! they hold no data). The token never goes into a URL: `factory ui` asks `POST
//! /api/ui/code` (with the owner's token only) for a one-time code and hands the browser a
//! private file that opens `/#code=...`; the page takes the code off its URL at once and
//! exchanges it, once, at `POST /api/ui/exchange` (no token: the code is the credential) for
//! a dashboard session token of its own, which it keeps in `sessionStorage` and sends only
//! as a header. A code lives [`CODE_TTL`] and is redeemed once; presented again, it ends the
//! session it gave (see [`OneTimeCodes`]). A dashboard session drives the API like the
//! owner's token, but cannot mint codes or manage sessions; it lasts `--ui-session-ttl`
//! (default [`bearer::SESSION_TTL`]); the owner lists (`GET /api/ui/sessions`) and revokes (`DELETE
//! /api/ui/sessions/{id|all}`) them, and a page signing out (`POST /api/ui/signout`) ends
//! its own.
//!
//! Connections: see [`crate::doors::http::bind`] (header timeout, connection cap, buffer cap,
//! accept backoff); a request body must arrive within [`BODY_READ_TIMEOUT`]. The one
//! unauthenticated body (`POST /api/ui/exchange`) is refused unless its `Content-Length` is
//! at most [`MAX_UNAUTHENTICATED_BODY_BYTES`], and must arrive within
//! [`UNAUTHENTICATED_BODY_TIMEOUT`]; every other request is authenticated before its body
//! is read.

pub mod bearer;
pub mod bind;
pub mod routes;

use crate::doors::http::bearer::{is_code_shaped, OneTimeCodes, CODE_TTL};
use crate::doors::http::bind::BODY_READ_TIMEOUT;
use crate::doors::http::routes::{
    ApproveBody, Auth, CodeBody, ErrorBody, ExchangeBody, GcBody, NoRoute, Op, RegisterBody, ResumeBody, RevokedBody,
    SessionBody, SessionsBody, StartBody, StatsBody, TokenBody,
};
use factory_host::model::retention::Retention;
use factory_host::service::{
    Approval, ApprovalState, Client, Consent, Decision, Request, Scope, Source, Started, Target,
};
use factory_host::store::ProgressQuery;
use factory_host::trace::TraceParent;
use factory_host::{ErrorCode, ProgressEntry, ProgressEvent, RunSettled, RunStarted};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, HOST};
use hyper::service::service_fn;
use hyper::{Method, Request as HttpRequest, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// The token file's name in the state directory.
pub const TOKEN_FILE: &str = crate::doors::state_files::HTTP_TOKEN;

/// The file in the state directory naming the address served (for `factory ui`).
pub const ADDR_FILE: &str = crate::doors::state_files::HTTP_ADDR;

/// The web dashboard's assets, embedded (plain files: no build step, no Node).
const UI_ASSETS: &[(&str, &str, &str)] = &[
    ("/", "text/html; charset=utf-8", include_str!("ui/index.html")),
    ("/ui/app.js", "text/javascript; charset=utf-8", include_str!("ui/app.js")),
    ("/ui/style.css", "text/css; charset=utf-8", include_str!("ui/style.css")),
];

/// The page may load only its own scripts and styles and talk only to this server; it may
/// not be framed; nothing it loads sees a referrer.
const UI_CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
    connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The request header naming the session a call acts as (absent: the owner's view, and the
/// daemon's session for new runs).
pub const SESSION_HEADER: &str = "factory-session";

/// The longest session name [`SESSION_HEADER`] may carry.
const MAX_SESSION_NAME: usize = 128;

/// The largest request body accepted (a start request with its args).
const MAX_BODY_BYTES: usize = 4 << 20;

/// The largest body of an unauthenticated request (`POST /api/ui/exchange`: `{"code"}`).
pub const MAX_UNAUTHENTICATED_BODY_BYTES: usize = 4 << 10;

/// How long an unauthenticated request's body may take to arrive.
pub const UNAUTHENTICATED_BODY_TIMEOUT: Duration = Duration::from_secs(5);

/// Who a request to the API comes from.
enum Caller {
    /// The owner: the bearer token of the token file.
    Owner,
    /// A dashboard session (its id), opened with a one-time code.
    Dashboard(String),
}

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// What every request handler shares.
struct Api {
    /// The service every endpoint speaks (in this process, or the one holding the store).
    client: Client,
    /// The session runs started over HTTP go in.
    session: String,
    /// The bearer token every `/api` call must carry.
    bearer: crate::doors::http::bearer::Bearer,
    /// One-time codes for `factory ui`, exchanged once for a dashboard session.
    codes: Arc<OneTimeCodes>,
    /// `Host` header values accepted (the address served, by IP and as `localhost`).
    hosts: Vec<String>,
}

/// Start serving the API on `addr`: writes the token file (the cluster's `token` when given,
/// else a random one) and returns the bound address. Dashboard sessions last `ui_session_ttl`.
pub async fn serve(
    client: Client,
    addr: SocketAddr,
    state_dir: &Path,
    session: String,
    token: Option<&str>,
    ui_session_ttl: Duration,
) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let bearer = crate::doors::http::bearer::Bearer::create(&state_dir.join(TOKEN_FILE), token)?;
    {
        use std::io::Write;
        let mut file = factory_host::access::create_private_file(&state_dir.join(ADDR_FILE))?;
        file.write_all(bound.to_string().as_bytes())?;
    }
    let mut hosts = vec![bound.to_string(), format!("localhost:{}", bound.port())];
    if bound.ip().is_unspecified() {
        hosts.push(format!("127.0.0.1:{}", bound.port()));
    }
    let api =
        Arc::new(Api { client, session, bearer, codes: Arc::new(OneTimeCodes::new(CODE_TTL, ui_session_ttl)), hosts });
    tokio::spawn(crate::doors::http::bind::accept_loop(listener, "factory serve --http", move |stream| {
        let api = api.clone();
        async move {
            let service = service_fn(move |req| {
                let api = api.clone();
                async move { Ok::<_, Infallible>(api.handle(req).await) }
            });
            let _ = crate::doors::http::bind::http1().serve_connection(TokioIo::new(stream), service).await;
        }
    }));
    Ok(bound)
}

fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(CONTENT_TYPE, "application/json")
        .header("cache-control", "no-store")
        .body(Full::new(Bytes::from(value.to_string())).boxed())
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()))
}

/// `GET /` and `/ui/*`: the dashboard's embedded assets (no token: they hold no data; the
/// page asks for the token-protected API itself).
fn ui_asset(method: &Method, path: &str) -> Response<Body> {
    let Some((_, content_type, text)) = UI_ASSETS.iter().find(|(p, _, _)| *p == path) else {
        return error(StatusCode::NOT_FOUND, ErrorCode::NotFound, format!("no route {path}"));
    };
    if method != Method::GET && method != Method::HEAD {
        return error(StatusCode::METHOD_NOT_ALLOWED, ErrorCode::NotFound, format!("no route {method} {path}"));
    }
    let body = if method == Method::HEAD { Bytes::new() } else { Bytes::from_static(text.as_bytes()) };
    Response::builder()
        .status(StatusCode::OK)
        .header(CONTENT_TYPE, *content_type)
        .header("cache-control", "no-cache")
        .header("content-security-policy", UI_CSP)
        .header("x-content-type-options", "nosniff")
        .header("referrer-policy", "no-referrer")
        .header("x-frame-options", "DENY")
        .body(Full::new(body).boxed())
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()))
}

fn error(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Response<Body> {
    typed_response(status, &ErrorBody { code, message: message.into() })
}

/// A JSON answer of one of the API's typed bodies ([`routes`]).
fn typed_response(status: StatusCode, body: &impl serde::Serialize) -> Response<Body> {
    match serde_json::to_value(body) {
        Ok(value) => json_response(status, &value),
        Err(e) => json_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            &json!({ "code": ErrorCode::Error, "message": e.to_string() }),
        ),
    }
}

/// The HTTP status of an error code shared with the other front doors.
fn status_of(code: ErrorCode) -> StatusCode {
    match code {
        ErrorCode::NotFound | ErrorCode::UnknownFactory => StatusCode::NOT_FOUND,
        ErrorCode::AlreadyActive | ErrorCode::NonResumable | ErrorCode::NotRunning | ErrorCode::NotAtCheckpoint => {
            StatusCode::CONFLICT
        }
        ErrorCode::NoApprovalProvider
        | ErrorCode::Forbidden
        | ErrorCode::ForbiddenHost
        | ErrorCode::Refused
        | ErrorCode::Declined => StatusCode::FORBIDDEN,
        ErrorCode::InvalidLimits
        | ErrorCode::InvalidArgs
        | ErrorCode::InvalidParams
        | ErrorCode::InvalidScript
        | ErrorCode::InvalidInput
        | ErrorCode::BackendUnavailable
        | ErrorCode::BadRequest => StatusCode::BAD_REQUEST,
        ErrorCode::Unauthorized | ErrorCode::InvalidCode => StatusCode::UNAUTHORIZED,
        ErrorCode::StorageUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::UnsupportedVersion
        | ErrorCode::Unavailable
        | ErrorCode::Cancelled
        | ErrorCode::StorageCorrupt
        | ErrorCode::Error => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// What a start's body says about a pending approval (when the factory is not trusted and
/// `approved` is not given): by default it waits for the owner's answer at most
/// [`APPROVAL_WAIT`] (`approvalWaitSeconds` sets less or more, up to
/// [`factory_host::service::approvals::MAX_WAIT`]), then answers `pending_approval`;
/// `"ask": false` refuses it at once (`no_approval_provider`), as before approvals existed.
struct Ask {
    ask: Option<bool>,
    approval_wait_seconds: Option<u64>,
}

impl Ask {
    /// The consent a start carries: the caller's own (`approved`), else asking the owner.
    fn consent(&self, approved: bool) -> Consent {
        match (approved, self.ask) {
            (true, _) => Consent::Any,
            (false, Some(false)) => Consent::None,
            (false, _) => Consent::Ask,
        }
    }

    /// How long the request waits for an answer.
    fn wait(&self) -> Duration {
        self.approval_wait_seconds.map_or(APPROVAL_WAIT, Duration::from_secs)
    }
}

/// How long a start that waits for the owner's approval holds its request by default.
pub const APPROVAL_WAIT: Duration = Duration::from_secs(30);

impl RegisterBody {
    /// What it registers, or why it is not one of the two forms.
    fn source(self) -> Result<Source, String> {
        match (self.path, self.meta, self.run) {
            (Some(path), None, None) if path.is_absolute() => Ok(Source::File(path)),
            (Some(path), None, None) => {
                Err(format!("`path` must be absolute (the service resolves no relative path): {}", path.display()))
            }
            (None, Some(meta), Some(run)) => Ok(Source::Authored { meta, run }),
            _ => {
                Err("give either `path` (a factory file or directory) or both `meta` and `run` (the authoring form)"
                    .into())
            }
        }
    }
}

/// The session a request acts as, from [`SESSION_HEADER`] (`Ok(None)`: no header). A name is
/// 1 to [`MAX_SESSION_NAME`] characters of letters, digits and `.`, `_`, `-`, `:`, `@`.
fn session_of(headers: &hyper::HeaderMap) -> Result<Option<String>, String> {
    let Some(value) = headers.get(SESSION_HEADER) else { return Ok(None) };
    let name = value.to_str().map_err(|_| format!("`{SESSION_HEADER}` must be plain text"))?;
    let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':' | '@');
    if name.is_empty() || name.len() > MAX_SESSION_NAME || !name.chars().all(valid) {
        return Err(format!("`{SESSION_HEADER}` names a session: 1 to {MAX_SESSION_NAME} letters, digits or `._-:@`"));
    }
    Ok(Some(name.to_string()))
}

impl Api {
    async fn handle(&self, req: HttpRequest<Incoming>) -> Response<Body> {
        // DNS rebinding: a page on another name that resolves here is refused.
        let host = req.headers().get(HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
        if !self.hosts.iter().any(|h| h == host) {
            tracing::warn!(event = "refused", door = "http", host = %host.chars().take(256).collect::<String>(), "HTTP request for another Host refused");
            return error(StatusCode::FORBIDDEN, ErrorCode::ForbiddenHost, format!("Host `{host}` is not served here"));
        }
        let path = req.uri().path().to_string();
        let method = req.method().clone();
        // Every method and path answered is a row of the route table (and so of the
        // OpenAPI document); the API's own refusals come after the token check.
        let found = routes::find(&method, &path);
        let auth = match &found {
            Ok((route, _)) => route.auth,
            Err(_) if path.starts_with("/api/") || path == "/metrics" => Auth::Token,
            Err(_) => Auth::Public,
        };
        let caller = if auth == Auth::Public {
            None
        } else {
            let presented = req.headers().get(AUTHORIZATION).and_then(|h| h.to_str().ok());
            if self.bearer.accepts(presented) {
                Some(Caller::Owner)
            } else if let Some(id) = self.codes.session_of(presented) {
                Some(Caller::Dashboard(id))
            } else {
                tracing::warn!(event = "refused", door = "http", path = %path.chars().take(256).collect::<String>(), "HTTP request without a valid bearer token refused");
                return error(
                    StatusCode::UNAUTHORIZED,
                    ErrorCode::Unauthorized,
                    "an `Authorization: Bearer <token>` header is required",
                );
            }
        };
        let (route, params) = match found {
            Ok(found) => found,
            Err(NoRoute::NotFound) => {
                return error(StatusCode::NOT_FOUND, ErrorCode::NotFound, format!("no route {method} {path}"));
            }
            Err(NoRoute::MethodNotAllowed(allowed)) => {
                let allow = allowed.iter().map(Method::as_str).collect::<Vec<_>>().join(", ");
                let mut response = error(
                    StatusCode::METHOD_NOT_ALLOWED,
                    ErrorCode::NotFound,
                    format!("no route {method} {path} (it answers {allow})"),
                );
                if let Ok(value) = hyper::header::HeaderValue::from_str(&allow) {
                    response.headers_mut().insert(hyper::header::ALLOW, value);
                }
                return response;
            }
        };
        if route.auth == Auth::Owner && !matches!(caller, Some(Caller::Owner)) {
            tracing::warn!(
                event = "refused",
                door = "http",
                path = "/api/ui",
                "dashboard session refused an owner-only call"
            );
            let message = "only the owner's token (the token file) may do this, not a dashboard session";
            return error(StatusCode::FORBIDDEN, ErrorCode::Forbidden, message);
        }
        let param = params.first().copied().unwrap_or_default().to_string();
        let caller = match (route.op, caller) {
            (Op::Asset, _) => return ui_asset(&method, &path),
            (Op::UiExchange, _) => return self.exchange(req).await,
            (Op::Metrics, _) => return self.metrics().await,
            (Op::OpenApi, _) => return json_response(StatusCode::OK, &routes::document()),
            (Op::UiCode | Op::UiSessions | Op::UiRevoke | Op::UiSignout, Some(caller)) => {
                return self.ui_route(route.op, &param, &caller);
            }
            (_, Some(caller)) => caller,
            (_, None) => return error(StatusCode::UNAUTHORIZED, ErrorCode::Unauthorized, "a token is required"),
        };
        let joined = match session_of(req.headers()) {
            Ok(joined) => joined,
            Err(message) => return error(StatusCode::BAD_REQUEST, ErrorCode::InvalidParams, message),
        };
        // The caller's trace, continued by a run this request starts.
        let trace_parent = match req
            .headers()
            .get("traceparent")
            .map(|v| v.to_str().map_err(|_| ()).and_then(|t| TraceParent::parse(t).map_err(|_| ())))
        {
            None => None,
            Some(Ok(parent)) => Some(parent),
            Some(Err(())) => {
                let message = "`traceparent` must be a W3C trace context: 00-<32 hex>-<16 hex>-<2 hex>";
                return error(StatusCode::BAD_REQUEST, ErrorCode::InvalidParams, message);
            }
        };
        // A joined session sees its own runs; without one, the owner sees every session's.
        let scope = joined.clone().map_or(Scope::Owner, Scope::Session);
        let query = req.uri().query().unwrap_or_default().to_string();
        let body = match read_body(req, MAX_BODY_BYTES, BODY_READ_TIMEOUT).await {
            Ok(body) => body,
            Err(response) => return *response,
        };
        let session = joined.unwrap_or_else(|| self.session.clone());
        let run_id = param;
        let request = match route.op {
            Op::Events => return self.events(scope, caller).await,
            Op::Session => return typed_response(StatusCode::OK, &SessionBody { session }),
            Op::Stats => return self.stats(scope).await,
            Op::Runs | Op::RunsPage => match parse_runs_query(&query) {
                Ok(q) if scope != Scope::Owner && q.scope != Scope::Owner && q.scope != scope => {
                    let message = format!("a call as {scope} cannot list the runs of {}", q.scope);
                    return error(StatusCode::BAD_REQUEST, ErrorCode::InvalidParams, message);
                }
                Ok(q) => {
                    // A joined session lists its own runs; the owner those of `session=`, or all.
                    let scope = if q.scope == Scope::Owner { scope } else { q.scope };
                    let paged = route.op == Op::RunsPage || q.after_seq.is_some() || q.before_seq.is_some();
                    match (paged, q.after) {
                        (true, Some(_)) => {
                            let message =
                                "`after` (a run id) pages the plain listing; a page by sequence takes `afterSeq`";
                            return error(StatusCode::BAD_REQUEST, ErrorCode::InvalidParams, message);
                        }
                        (true, None) => Request::RunsPage {
                            scope,
                            after_seq: q.after_seq,
                            before_seq: q.before_seq,
                            limit: q.limit,
                        },
                        (false, after) => Request::Runs { scope, after, limit: q.limit },
                    }
                }
                Err(message) => return error(StatusCode::BAD_REQUEST, ErrorCode::InvalidParams, message),
            },
            Op::Factories => Request::Factories { session },
            Op::Inspect => Request::Inspect { session, name: run_id },
            Op::Register => {
                let source = serde_json::from_slice::<RegisterBody>(&body)
                    .map_err(|e| e.to_string())
                    .and_then(RegisterBody::source);
                match source {
                    Ok(source) => Request::Register { source, session: Some(session) },
                    Err(message) => return error(StatusCode::BAD_REQUEST, ErrorCode::InvalidParams, message),
                }
            }
            Op::Detail => Request::Detail { scope, run_id },
            Op::Envelope => Request::Envelope { scope, run_id },
            Op::Progress => {
                let query = match parse_progress_query(&query) {
                    Ok(query) => query,
                    Err(message) => return error(StatusCode::BAD_REQUEST, ErrorCode::InvalidParams, message),
                };
                Request::Progress { scope, run_id, query }
            }
            Op::Wait => Request::Wait { scope, run_id },
            Op::Cancel => Request::Cancel { scope, run_id },
            Op::Pause => Request::Pause { scope, run_id },
            Op::Remove => Request::Remove { scope, run_id },
            Op::Gc => match serde_json::from_slice::<GcBody>(&body) {
                Ok(body) => {
                    let policy = Retention { keep_days: body.keep_days, keep_last: body.keep_last };
                    if !policy.is_set() {
                        let message = "no retention policy: give keepDays or keepLast";
                        return error(StatusCode::BAD_REQUEST, ErrorCode::InvalidParams, message);
                    }
                    Request::Gc { scope, policy, dry_run: body.dry_run }
                }
                Err(e) => return error(StatusCode::BAD_REQUEST, ErrorCode::InvalidParams, e.to_string()),
            },
            Op::Resume => {
                let body: ResumeBody = if body.is_empty() {
                    ResumeBody::default()
                } else {
                    match serde_json::from_slice(&body) {
                        Ok(body) => body,
                        Err(e) => return error(StatusCode::BAD_REQUEST, ErrorCode::InvalidParams, e.to_string()),
                    }
                };
                let ask = Ask { ask: body.ask, approval_wait_seconds: body.approval_wait_seconds };
                let start = Request::Resume {
                    scope: scope.clone(),
                    run_id,
                    component: None,
                    limits: body.limits,
                    backend: Default::default(),
                    consent: ask.consent(body.approved),
                    trace_parent,
                    caller_cwd: None,
                    input: body.input,
                    replay: None,
                    record: false,
                };
                return self.start(scope, start, ask.wait()).await;
            }
            Op::Start => {
                let body: StartBody = match serde_json::from_slice(&body) {
                    Ok(body) => body,
                    Err(e) => return error(StatusCode::BAD_REQUEST, ErrorCode::InvalidParams, e.to_string()),
                };
                let ask = Ask { ask: body.ask, approval_wait_seconds: body.approval_wait_seconds };
                let start = Request::Run {
                    session,
                    component: Target::Registered(body.name),
                    args: body.args,
                    limits: body.limits,
                    backend: Default::default(),
                    grants: Vec::new(),
                    declined: false,
                    consent: ask.consent(body.approved),
                    trace_parent,
                    caller_cwd: None,
                    replay: None,
                    record: false,
                };
                return self.start(scope, start, ask.wait()).await;
            }
            Op::Approvals => Request::Approvals { scope },
            Op::Approval => {
                let wait_ms = match parse_wait_query(&query) {
                    Ok(wait) => wait.map(|w| w.as_millis() as u64),
                    Err(message) => return error(StatusCode::BAD_REQUEST, ErrorCode::InvalidParams, message),
                };
                Request::Approval { scope, id: run_id, wait_ms }
            }
            Op::Approve | Op::Decline => {
                let decision = if route.op == Op::Decline {
                    Decision::Decline
                } else {
                    let body: ApproveBody = if body.is_empty() {
                        ApproveBody::default()
                    } else {
                        match serde_json::from_slice(&body) {
                            Ok(body) => body,
                            Err(e) => return error(StatusCode::BAD_REQUEST, ErrorCode::InvalidParams, e.to_string()),
                        }
                    };
                    if body.always {
                        Decision::Always
                    } else {
                        Decision::Once
                    }
                };
                Request::Decide { scope, id: run_id, decision }
            }
            Op::OpenApi
            | Op::UiCode
            | Op::UiSessions
            | Op::UiRevoke
            | Op::UiSignout
            | Op::UiExchange
            | Op::Metrics
            | Op::Asset => {
                return error(StatusCode::NOT_FOUND, ErrorCode::NotFound, format!("no route {method} {path}"));
            }
        };
        match self.client.call(request).await {
            Ok(response) => match response.body() {
                Ok(value) => json_response(StatusCode::OK, &value),
                Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Error, e.to_string()),
            },
            Err(e) => {
                let code = e.code();
                error(status_of(code), code, e.to_string())
            }
        }
    }

    /// `POST /api/runs` and `/resume`: start, or (not trusted, consent `ask`) hold the start
    /// for the owner's approval and wait for the answer at most `wait`: `202 {runId}` once it
    /// runs, `202 {status: "pending_approval", approvalId, approval}` while it waits (the
    /// caller waits on `GET /api/approvals/{id}?wait=S`), `403 declined` when the owner
    /// declined or nobody answered in time.
    async fn start(&self, scope: Scope, start: Request, wait: Duration) -> Response<Body> {
        let failed = |e: factory_host::service::ServiceError| {
            let code = e.code();
            error(status_of(code), code, e.to_string())
        };
        let approval = match self.client.start_or_hold(start).await {
            Ok(Started::Run(run_id)) => return json_response(StatusCode::ACCEPTED, &json!({ "runId": run_id })),
            Ok(Started::Pending(approval)) => approval,
            Err(e) => return failed(e),
        };
        let approval = if wait.is_zero() {
            *approval
        } else {
            match self.client.approval(scope, &approval.id, Some(wait)).await {
                Ok(approval) => approval,
                Err(e) => return failed(e),
            }
        };
        approval_answer(&approval)
    }

    /// `GET /api/stats`: where the store's bytes go, with its parts (`null` for a store that
    /// does not measure itself); the owner's only (`bad_request` as a session).
    async fn stats(&self, scope: Scope) -> Response<Body> {
        match self.client.usage(scope).await {
            Ok(Some(usage)) => {
                let parts = usage.parts();
                typed_response(StatusCode::OK, &StatsBody { usage, parts })
            }
            Ok(None) => json_response(StatusCode::OK, &Value::Null),
            Err(e) => {
                let code = e.code();
                error(status_of(code), code, e.to_string())
            }
        }
    }

    /// `GET /metrics`: the service's metrics in the Prometheus (OpenMetrics) text format, behind the same
    /// bearer token as the API.
    async fn metrics(&self) -> Response<Body> {
        match self.client.metrics().await {
            Ok(text) => Response::builder()
                .status(StatusCode::OK)
                .header(CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")
                .header("cache-control", "no-store")
                .body(Full::new(Bytes::from(text)).boxed())
                .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed())),
            Err(e) => {
                let code = e.code();
                error(status_of(code), code, e.to_string())
            }
        }
    }

    /// `/api/ui/...` for an authenticated `caller` (the router has refused a dashboard
    /// session the owner-only ones): `POST code` (a one-time code), `GET sessions` and
    /// `DELETE sessions/{id|all}`; `POST signout` ends the dashboard session that calls it.
    fn ui_route(&self, op: Op, id: &str, caller: &Caller) -> Response<Body> {
        match (op, caller) {
            (Op::UiSignout, Caller::Dashboard(id)) => {
                typed_response(StatusCode::OK, &RevokedBody { revoked: self.codes.revoke(Some(id.as_str())) })
            }
            (Op::UiSignout, Caller::Owner) => {
                error(StatusCode::BAD_REQUEST, ErrorCode::InvalidParams, "the owner's token is not a dashboard session")
            }
            (Op::UiCode, _) => {
                let code = self.codes.issue();
                typed_response(StatusCode::OK, &CodeBody { code, expires_in_seconds: CODE_TTL.as_secs() })
            }
            (Op::UiSessions, _) => typed_response(StatusCode::OK, &SessionsBody { sessions: self.codes.sessions() }),
            (Op::UiRevoke, _) => {
                let revoked = self.codes.revoke(if id == "all" { None } else { Some(id) });
                if revoked == 0 && id != "all" {
                    return error(StatusCode::NOT_FOUND, ErrorCode::NotFound, format!("no dashboard session `{id}`"));
                }
                typed_response(StatusCode::OK, &RevokedBody { revoked })
            }
            _ => error(StatusCode::NOT_FOUND, ErrorCode::NotFound, format!("no route {op:?}")),
        }
    }

    /// `POST /api/ui/exchange {"code"}`: a one-time code from `POST /api/ui/code`, redeemed
    /// once for a dashboard session token (`{"token"}`); a used, expired, unknown or
    /// malformed code gets 401 (and a used one ends the session it gave). The body is read
    /// only when its `Content-Length` is at most [`MAX_UNAUTHENTICATED_BODY_BYTES`], within
    /// [`UNAUTHENTICATED_BODY_TIMEOUT`]; refused, the connection is closed.
    async fn exchange(&self, req: HttpRequest<Incoming>) -> Response<Body> {
        // Nothing is read from a stranger before its size is known to be small.
        let length =
            req.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
        if length.is_none_or(|n| n > MAX_UNAUTHENTICATED_BODY_BYTES as u64) {
            tracing::warn!(
                event = "refused",
                door = "http",
                path = "/api/ui/exchange",
                "sign-in exchange with a missing or large Content-Length refused"
            );
            let message = format!(
                "a sign-in exchange needs a `Content-Length` of at most {MAX_UNAUTHENTICATED_BODY_BYTES} bytes"
            );
            return closing(error(StatusCode::PAYLOAD_TOO_LARGE, ErrorCode::InvalidParams, message));
        }
        let body = match read_body(req, MAX_UNAUTHENTICATED_BODY_BYTES, UNAUTHENTICATED_BODY_TIMEOUT).await {
            Ok(body) => body,
            Err(response) => return closing(*response),
        };
        let exchange: ExchangeBody = match serde_json::from_slice(&body) {
            Ok(exchange) => exchange,
            Err(e) => return error(StatusCode::BAD_REQUEST, ErrorCode::InvalidParams, e.to_string()),
        };
        if !is_code_shaped(&exchange.code) {
            return error(
                StatusCode::UNAUTHORIZED,
                ErrorCode::InvalidCode,
                "this is not a sign-in code: run `factory ui` again",
            );
        }
        match self.codes.redeem(&exchange.code) {
            Some(token) => typed_response(StatusCode::OK, &TokenBody { token }),
            None => error(
                StatusCode::UNAUTHORIZED,
                ErrorCode::InvalidCode,
                "this sign-in code was already used, has expired or is unknown: run `factory ui` again",
            ),
        }
    }

    /// `GET /api/events`: `run_updated` for the runs `scope` sees (the owner: every
    /// session's), as Server-Sent Events, in the order the host announces them (revisions of
    /// one run only grow), each followed by `progress {runId, entry}` events for the entries
    /// committed since the last sent. A dashboard session's stream ends once the session is
    /// revoked or expires (checked at each update).
    async fn events(&self, scope: Scope, caller: Caller) -> Response<Body> {
        let mut updates = match self.client.updates(scope.clone()).await {
            Ok(updates) => updates,
            Err(e) => return error(status_of(e.code()), e.code(), e.to_string()),
        };
        let client = self.client.clone();
        let codes = self.codes.clone();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(SSE_FRAMES_BUFFERED);
        tokio::spawn(async move {
            // A comment line first, so a client sees the stream open at once.
            if tx.send(Ok(Frame::data(Bytes::from_static(b": factory events\n\n")))).await.is_err() {
                return;
            }
            // The last progress seq sent per run (one per run seen here).
            let mut sent: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
            // Attempts that start or settle from now on are announced (`run_started`,
            // `run_settled`); the history a first update of a run brings along is not.
            let opened_ms =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
            loop {
                let Some(update) = updates.next().await else { return };
                if let Caller::Dashboard(id) = &caller {
                    if !codes.is_live(id) {
                        return;
                    }
                }
                // Live progress: the entries committed since the last one sent for this run,
                // a page a frame. Each send waits while the client is behind, so a slow reader
                // holds at most SSE_FRAMES_BUFFERED frames of SSE_ENTRIES_PER_FRAME entries.
                let mut after = sent.get(&update.run_id).copied().unwrap_or(0);
                let mut frames = {
                    let data = json!({ "runId": update.run_id, "revision": update.revision });
                    format!("event: run_updated\ndata: {data}\n\n")
                };
                loop {
                    let query = ProgressQuery {
                        after_seq: Some(after),
                        limit: Some(SSE_ENTRIES_PER_FRAME),
                        ..Default::default()
                    };
                    let entries = client.progress(scope.clone(), &update.run_id, query).await.unwrap_or_default();
                    for entry in &entries {
                        let data = json!({ "runId": update.run_id, "entry": entry });
                        frames.push_str(&format!("event: progress\ndata: {data}\n\n"));
                        if entry.at_ms >= opened_ms {
                            if let Some((name, data)) = lifecycle_event(&client, &scope, &update.run_id, entry).await {
                                frames.push_str(&format!("event: {name}\ndata: {data}\n\n"));
                            }
                        }
                    }
                    if let Some(last) = entries.last() {
                        after = last.seq;
                        sent.insert(update.run_id.clone(), last.seq);
                    }
                    if !frames.is_empty()
                        && tx.send(Ok(Frame::data(Bytes::from(std::mem::take(&mut frames))))).await.is_err()
                    {
                        return;
                    }
                    if entries.len() < SSE_ENTRIES_PER_FRAME {
                        break;
                    }
                }
            }
        });
        let stream = tokio_stream_from(rx);
        Response::builder()
            .status(StatusCode::OK)
            .header(CONTENT_TYPE, "text/event-stream")
            .header("cache-control", "no-store")
            .body(StreamBody::new(stream).boxed())
            .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()))
    }
}

/// What a start that waited for approval answers, as its approval stands.
fn approval_answer(approval: &Approval) -> Response<Body> {
    let q = &approval.question;
    let not = |why: &str| {
        let message = format!(
            "{why}: factory `{}` (sha256 {}) was not approved to {}; nothing started",
            q.factory,
            q.sha256,
            q.operation.as_str()
        );
        json_response(
            StatusCode::FORBIDDEN,
            &json!({ "code": ErrorCode::Declined, "message": message, "approvalId": approval.id }),
        )
    };
    match &approval.state {
        ApprovalState::Approved { run_id, .. } => json_response(StatusCode::ACCEPTED, &json!({ "runId": run_id })),
        ApprovalState::Pending => json_response(
            StatusCode::ACCEPTED,
            &json!({ "status": "pending_approval", "approvalId": approval.id, "approval": approval }),
        ),
        ApprovalState::Declined => not("the owner declined"),
        ApprovalState::Expired => not("no answer came in time"),
        ApprovalState::Failed { code, message } => error(status_of(*code), *code, message.clone()),
    }
}

/// `wait=S` (seconds, fractions allowed) from the query string of `GET /api/approvals/{id}`.
fn parse_wait_query(query: &str) -> Result<Option<Duration>, String> {
    let mut wait = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "wait" => {
                let seconds = value
                    .parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && *s >= 0.0)
                    .ok_or_else(|| "`wait` must be a non-negative number of seconds".to_string())?;
                wait = Some(Duration::from_secs_f64(seconds.min(3600.0)));
            }
            other => return Err(format!("unknown query parameter `{other}`")),
        }
    }
    Ok(wait)
}

/// The lifecycle event a progress entry announces on the event stream: `run_started`
/// ([`RunStarted`]) for an attempt's start, `run_settled` ([`RunSettled`]) for its end.
async fn lifecycle_event(
    client: &Client,
    scope: &Scope,
    run_id: &str,
    entry: &ProgressEntry,
) -> Option<(&'static str, Value)> {
    if let ProgressEvent::AttemptStarted { attempt } = &entry.event {
        let factory_name = client.envelope(scope.clone(), run_id).await.map(|e| e.factory).unwrap_or_default();
        let started = RunStarted { run_id: run_id.to_string(), attempt: *attempt, factory_name };
        return serde_json::to_value(started).ok().map(|data| ("run_started", data));
    }
    let settled = RunSettled::of(run_id, &entry.event)?;
    serde_json::to_value(settled).ok().map(|data| ("run_settled", data))
}

/// Frames an event stream holds for a client that reads slowly (then it waits for it).
const SSE_FRAMES_BUFFERED: usize = 4;

/// Progress entries in one frame of an event stream.
const SSE_ENTRIES_PER_FRAME: usize = 100;

/// A receiver as a stream of frames.
fn tokio_stream_from(
    rx: tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, Infallible>>,
) -> impl futures::Stream<Item = Result<Frame<Bytes>, Infallible>> + Send + Sync + 'static {
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) })
}

/// `response`, closing its connection (a refused body is not drained).
fn closing(mut response: Response<Body>) -> Response<Body> {
    response.headers_mut().insert(hyper::header::CONNECTION, hyper::header::HeaderValue::from_static("close"));
    response
}

/// The request body, at most `max` bytes arriving within `timeout`.
async fn read_body(req: HttpRequest<Incoming>, max: usize, timeout: Duration) -> Result<Bytes, Box<Response<Body>>> {
    let limited = http_body_util::Limited::new(req.into_body(), max);
    match tokio::time::timeout(timeout, limited.collect()).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) => {
            Err(Box::new(error(StatusCode::PAYLOAD_TOO_LARGE, ErrorCode::InvalidParams, format!("request body: {e}"))))
        }
        Err(_) => Err(Box::new(error(
            StatusCode::REQUEST_TIMEOUT,
            ErrorCode::InvalidParams,
            format!("the request body did not arrive within {} s", timeout.as_secs()),
        ))),
    }
}

/// What `GET /api/runs` asks for: every session's runs, or with `session=NAME` one
/// session's; a page of them after run `after`, at most `limit`; or with `afterSeq` /
/// `beforeSeq` (and always at `GET /api/runs/page`) a page by creation sequence.
#[derive(Debug, PartialEq)]
struct RunsQuery {
    scope: Scope,
    after: Option<String>,
    limit: Option<usize>,
    after_seq: Option<u64>,
    before_seq: Option<u64>,
}

/// `session`, `after` and `limit` from the query string of `GET /api/runs`.
fn parse_runs_query(query: &str) -> Result<RunsQuery, String> {
    let mut out = RunsQuery { scope: Scope::Owner, after: None, limit: None, after_seq: None, before_seq: None };
    let seq = |key: &str, v: &str| v.parse::<u64>().map_err(|_| format!("`{key}` must be a non-negative integer"));
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "session" if value.is_empty() => return Err("`session` names a session: give it a value".into()),
            "session" if out.scope != Scope::Owner => return Err("give `session` once".into()),
            "session" => out.scope = Scope::Session(percent_decode(value)),
            "after" if value.is_empty() => return Err("`after` names a run id: give it a value".into()),
            "after" => out.after = Some(percent_decode(value)),
            "limit" => out.limit = Some(value.parse().map_err(|_| "`limit` must be a positive integer".to_string())?),
            "afterSeq" => out.after_seq = Some(seq(key, value)?),
            "beforeSeq" => out.before_seq = Some(seq(key, value)?),
            other => return Err(format!("unknown query parameter `{other}`")),
        }
    }
    Ok(out)
}

/// `afterSeq`, `beforeSeq`, `phase`, `limit` from a query string.
fn parse_progress_query(query: &str) -> Result<ProgressQuery, String> {
    let mut out = ProgressQuery::default();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decode(value);
        let number = |v: &str| v.parse::<u64>().map_err(|_| format!("`{key}` must be a non-negative integer"));
        match key {
            "afterSeq" => out.after_seq = Some(number(&value)?),
            "beforeSeq" => out.before_seq = Some(number(&value)?),
            "limit" => out.limit = Some(number(&value)? as usize),
            "phase" => out.phase = Some(value),
            other => return Err(format!("unknown query parameter `{other}`")),
        }
    }
    Ok(out)
}

/// `%XX` and `+` decoding of one query value (invalid escapes stay as written).
fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let hex = |b: u8| (b as char).to_digit(16);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match (bytes[i], bytes.get(i + 1).and_then(|b| hex(*b)), bytes.get(i + 2).and_then(|b| hex(*b))) {
            (b'+', _, _) => out.push(b' '),
            (b'%', Some(high), Some(low)) => {
                out.push((high * 16 + low) as u8);
                i += 2;
            }
            (b, _, _) => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_decode_and_reject_what_they_do_not_know() {
        let q = parse_progress_query("afterSeq=3&phase=Verify%20it&limit=5").unwrap();
        assert_eq!((q.after_seq, q.phase.as_deref(), q.limit), (Some(3), Some("Verify it"), Some(5)));
        assert!(parse_progress_query("afterSeq=-1").is_err());
        assert!(parse_progress_query("nope=1").is_err());
        assert_eq!(percent_decode("a%2"), "a%2");
        assert_eq!(percent_decode("%zz+b"), "%zz b");
    }

    #[test]
    fn a_session_header_names_a_plain_session_and_a_registration_one_form() {
        let mut headers = hyper::HeaderMap::new();
        assert_eq!(session_of(&headers), Ok(None));
        headers.insert(SESSION_HEADER, "node-3f2a:x@y".parse().unwrap());
        assert_eq!(session_of(&headers), Ok(Some("node-3f2a:x@y".into())));
        for bad in ["", "a b", "a/b", &"x".repeat(MAX_SESSION_NAME + 1)] {
            headers.insert(SESSION_HEADER, bad.parse().unwrap());
            assert!(session_of(&headers).is_err(), "{bad:?}");
        }
        let body = |v: Value| serde_json::from_value::<RegisterBody>(v).unwrap().source();
        assert_eq!(body(json!({"path": "/a/f.js"})), Ok(Source::File("/a/f.js".into())));
        assert!(body(json!({"path": "f.js"})).unwrap_err().contains("absolute"));
        assert!(matches!(body(json!({"meta": {}, "run": "async () => 1"})), Ok(Source::Authored { .. })));
        assert!(body(json!({"meta": {}})).is_err());
        assert!(body(json!({"path": "/a", "run": "x"})).is_err());
        assert!(serde_json::from_value::<RegisterBody>(json!({"paths": "/a"})).is_err());
    }

    #[test]
    fn the_runs_list_is_every_session_unless_one_is_named() {
        assert_eq!(
            parse_runs_query(""),
            Ok(RunsQuery { scope: Scope::Owner, after: None, limit: None, after_seq: None, before_seq: None })
        );
        assert_eq!(
            parse_runs_query("session=mcp%3Aclaude"),
            Ok(RunsQuery {
                scope: Scope::Session("mcp:claude".into()),
                after: None,
                limit: None,
                after_seq: None,
                before_seq: None
            })
        );
        assert_eq!(
            parse_runs_query("after=r%2D1&limit=20"),
            Ok(RunsQuery {
                scope: Scope::Owner,
                after: Some("r-1".into()),
                limit: Some(20),
                after_seq: None,
                before_seq: None
            })
        );
        assert_eq!(
            parse_runs_query("afterSeq=3&beforeSeq=9&limit=1"),
            Ok(RunsQuery { scope: Scope::Owner, after: None, limit: Some(1), after_seq: Some(3), before_seq: Some(9) })
        );
        assert!(parse_runs_query("afterSeq=-1").is_err());
        assert!(parse_runs_query("limit=many").is_err());
        assert!(parse_runs_query("after=").is_err());
        assert!(parse_runs_query("session=").is_err());
        assert!(parse_runs_query("session=a&session=b").is_err());
        assert!(parse_runs_query("all=1").is_err());
    }

    #[test]
    fn the_dashboard_assets_are_embedded_with_a_strict_policy() {
        let page = ui_asset(&Method::GET, "/");
        assert_eq!(page.status(), StatusCode::OK);
        assert_eq!(page.headers()[CONTENT_TYPE], "text/html; charset=utf-8");
        let csp = page.headers()["content-security-policy"].to_str().unwrap();
        assert!(
            csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'") && !csp.contains("unsafe"),
            "{csp}"
        );
        assert_eq!(ui_asset(&Method::GET, "/ui/app.js").headers()[CONTENT_TYPE], "text/javascript; charset=utf-8");
        assert_eq!(ui_asset(&Method::GET, "/ui/nope.js").status(), StatusCode::NOT_FOUND);
        assert_eq!(ui_asset(&Method::POST, "/").status(), StatusCode::METHOD_NOT_ALLOWED);
        // The page never builds HTML from strings.
        let app = UI_ASSETS.iter().find(|(p, _, _)| *p == "/ui/app.js").unwrap().2;
        assert!(!app.contains("innerHTML") && !app.contains("outerHTML") && !app.contains("insertAdjacentHTML"));
    }
}
