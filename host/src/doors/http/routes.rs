//! The HTTP API's route table: every method and path `factory serve --http` answers, who
//! may call it, its query parameters and the types of its request and response bodies. The
//! router ([`find`]) matches requests against this table and nothing else, and the OpenAPI
//! document served at `GET /api/openapi.json` ([`document`]) is generated from it, with
//! the bodies' JSON Schemas derived from their Rust types (`schemars`), so the document and
//! what is served cannot drift apart.

use factory_host::service::{Approval, Removed, StartedAnswer};
use factory_host::store::Registration;
use factory_host::{ErrorCode, Limits, ProgressEntry, RunDetail, RunEnvelope, RunSummary, RunsPage};
use hyper::Method;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::path::PathBuf;

/// What a route does: the handler the router hands the request to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `GET /api/runs`: a page of run summaries.
    Runs,
    /// `GET /api/runs/page`: a page by creation sequence.
    RunsPage,
    /// `GET /api/runs/{id}`: a run's detail.
    Detail,
    /// `GET /api/runs/{id}/envelope`.
    Envelope,
    /// `GET /api/runs/{id}/progress`.
    Progress,
    /// `GET /api/runs/{id}/wait`.
    Wait,
    /// `POST /api/runs`.
    Start,
    /// `POST /api/runs/{id}/resume`.
    Resume,
    /// `POST /api/runs/{id}/cancel`.
    Cancel,
    /// `POST /api/runs/{id}/pause`.
    Pause,
    /// `DELETE /api/runs/{id}`.
    Remove,
    /// `POST /api/gc`: delete the ended runs a retention policy no longer keeps.
    Gc,
    /// `GET /api/stats`: where the store's bytes go.
    Stats,
    /// `GET /api/approvals`: the pending approvals.
    Approvals,
    /// `GET /api/approvals/{id}`: one approval (waiting for its answer with `wait`).
    Approval,
    /// `POST /api/approvals/{id}/approve`.
    Approve,
    /// `POST /api/approvals/{id}/decline`.
    Decline,
    /// `GET /api/factories`.
    Factories,
    /// `GET /api/factories/{name}`.
    Inspect,
    /// `POST /api/factories`.
    Register,
    /// `GET /api/events`: the event stream.
    Events,
    /// `GET /api/session`.
    Session,
    /// `GET /api/openapi.json`: this table as an OpenAPI document.
    OpenApi,
    /// `POST /api/ui/code`.
    UiCode,
    /// `GET /api/ui/sessions`.
    UiSessions,
    /// `DELETE /api/ui/sessions/{id}`.
    UiRevoke,
    /// `POST /api/ui/signout`.
    UiSignout,
    /// `POST /api/ui/exchange`.
    UiExchange,
    /// `GET /metrics`.
    Metrics,
    /// `GET /` and `/ui/*`: the dashboard's embedded assets.
    Asset,
}

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auth {
    /// Anyone who names the right `Host` (the dashboard's assets, the code exchange).
    Public,
    /// The owner's bearer token or a dashboard session's.
    Token,
    /// The owner's bearer token only.
    Owner,
}

/// A query parameter's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamType {
    /// Text.
    Text,
    /// A non-negative integer.
    Count,
    /// A non-negative number of seconds.
    Seconds,
}

/// A query parameter a route reads.
#[derive(Debug, Clone, Copy)]
pub struct Param {
    /// Its name in the query string.
    pub name: &'static str,
    /// Its type.
    pub kind: ParamType,
    /// What it asks for.
    pub doc: &'static str,
}

/// A body's schema, put in the generator's definitions (a `$ref` to it is returned).
pub type SchemaFn = fn(&mut SchemaGenerator) -> Schema;

/// What a route answers when it succeeds.
#[derive(Clone, Copy)]
pub enum Answer {
    /// JSON with this status and schema.
    Json(u16, SchemaFn),
    /// A Server-Sent Events stream.
    Events,
    /// Text of this media type.
    Text(&'static str),
}

/// One method and path served.
pub struct Route {
    /// The method.
    pub method: Method,
    /// The path; a `{name}` segment matches any one segment.
    pub path: &'static str,
    /// What it does.
    pub op: Op,
    /// Who may call it.
    pub auth: Auth,
    /// One line saying what it does.
    pub summary: &'static str,
    /// The query parameters it reads.
    pub query: &'static [Param],
    /// Its request body's schema, when it takes one.
    pub body: Option<SchemaFn>,
    /// What it answers.
    pub answer: Answer,
}

/// The query of `GET /api/runs` and `GET /api/runs/page`.
pub const RUNS_QUERY: &[Param] = &[
    Param { name: "session", kind: ParamType::Text, doc: "list only this session's runs" },
    Param { name: "after", kind: ParamType::Text, doc: "the plain listing after this run id" },
    Param { name: "limit", kind: ParamType::Count, doc: "at most this many runs" },
    Param { name: "afterSeq", kind: ParamType::Count, doc: "a page of runs created after this sequence" },
    Param { name: "beforeSeq", kind: ParamType::Count, doc: "a page of the newest runs created before this sequence" },
];

/// The query of `GET /api/approvals/{id}`.
pub const APPROVAL_QUERY: &[Param] =
    &[Param { name: "wait", kind: ParamType::Seconds, doc: "wait at most this long for the owner's answer" }];

/// The query of `GET /api/runs/{id}/progress`.
pub const PROGRESS_QUERY: &[Param] = &[
    Param { name: "afterSeq", kind: ParamType::Count, doc: "entries after this sequence" },
    Param { name: "beforeSeq", kind: ParamType::Count, doc: "the newest entries before this sequence" },
    Param { name: "phase", kind: ParamType::Text, doc: "entries of this phase only" },
    Param { name: "limit", kind: ParamType::Count, doc: "at most this many entries" },
];

/// Body of `POST /api/runs`.
#[derive(Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StartBody {
    /// The registered factory to run.
    pub name: String,
    /// Its arguments (checked against its args schema).
    #[serde(default)]
    pub args: Option<Value>,
    /// Limits overriding the factory's (`null` lifts one).
    #[serde(default)]
    pub limits: Limits,
    /// The user consented in the UI to a component that is not trusted.
    #[serde(default)]
    pub approved: bool,
    /// `false`: refuse an untrusted factory at once (`no_approval_provider`) rather than hold
    /// it as a pending approval for the owner.
    #[serde(default)]
    pub ask: Option<bool>,
    /// How long to wait for the owner's answer before answering `pending_approval` (default
    /// 30, at most 60).
    #[serde(default)]
    pub approval_wait_seconds: Option<u64>,
}

/// Body of `POST /api/runs/{id}/resume` (optional).
#[derive(Deserialize, Default, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResumeBody {
    /// Limits overriding the run's (raised to go on).
    #[serde(default)]
    pub limits: Limits,
    /// The user consented to a component that is not trusted.
    #[serde(default)]
    pub approved: bool,
    /// The answer to the checkpoint the run waits at (`ctx.pause(key)` returns it).
    #[serde(default)]
    pub input: Option<Value>,
    /// As [`StartBody::ask`].
    #[serde(default)]
    pub ask: Option<bool>,
    /// As [`StartBody::approval_wait_seconds`].
    #[serde(default)]
    pub approval_wait_seconds: Option<u64>,
}

/// Body of `POST /api/approvals/{id}/approve` (optional).
#[derive(Deserialize, Default, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApproveBody {
    /// Trust the sha256 from now on.
    #[serde(default)]
    pub always: bool,
}

/// Body of `POST /api/factories`: a factory file (absolute path on the service's machine),
/// or the authoring form (`meta` and a `run` body).
#[derive(Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegisterBody {
    /// A factory file or component directory (absolute).
    #[serde(default)]
    pub path: Option<PathBuf>,
    /// The authoring form's metadata.
    #[serde(default)]
    pub meta: Option<Value>,
    /// The authoring form's `run` body (JavaScript).
    #[serde(default)]
    pub run: Option<String>,
}

/// Body of `POST /api/gc`: the retention policy (at least one rule) and whether to only say
/// which runs it would delete.
#[derive(Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GcBody {
    /// Keep runs updated in the last this many days.
    #[serde(default)]
    pub keep_days: Option<u32>,
    /// Keep the newest this many runs of each factory.
    #[serde(default)]
    pub keep_last: Option<u32>,
    /// Only say which runs would go; delete nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// Answer of `GET /api/stats`: the store's usage and its parts, as `factory stats --json`
/// prints them.
#[derive(Serialize)]
pub struct StatsBody {
    /// The usage: size, pages, each table.
    #[serde(flatten)]
    pub usage: factory_host::store::StoreUsage,
    /// Where the bytes go, by part.
    pub parts: Vec<factory_host::store::StorePart>,
}

/// Body of `POST /api/ui/exchange`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExchangeBody {
    /// The one-time code from `POST /api/ui/code` (64 hex digits).
    pub code: String,
}

/// Every refusal: the error code the other front doors give, and a message.
#[derive(Serialize, JsonSchema)]
pub struct ErrorBody {
    /// The code.
    pub code: ErrorCode,
    /// What went wrong.
    pub message: String,
}

/// Answer of `GET /api/session`.
#[derive(Serialize, JsonSchema)]
pub struct SessionBody {
    /// The session runs started over HTTP go in.
    pub session: String,
}

/// Answer of `POST /api/ui/code`.
#[derive(Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CodeBody {
    /// The one-time code.
    pub code: String,
    /// How long it may be redeemed.
    pub expires_in_seconds: u64,
}

/// Answer of `GET /api/ui/sessions`.
#[derive(Serialize, JsonSchema)]
pub struct SessionsBody {
    /// The dashboard sessions open.
    pub sessions: Vec<crate::doors::http::bearer::SessionInfo>,
}

/// Answer of `DELETE /api/ui/sessions/{id}` and `POST /api/ui/signout`.
#[derive(Serialize, JsonSchema)]
pub struct RevokedBody {
    /// How many sessions ended.
    pub revoked: usize,
}

/// Answer of `POST /api/ui/exchange`.
#[derive(Serialize, JsonSchema)]
pub struct TokenBody {
    /// The dashboard session's bearer token.
    pub token: String,
}

fn schema<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    generator.subschema_for::<T>()
}

/// `GET /api/runs`: the plain listing, or a page by sequence when `afterSeq`/`beforeSeq` is given.
fn runs_answer(generator: &mut SchemaGenerator) -> Schema {
    let list = generator.subschema_for::<Vec<RunSummary>>();
    let page = generator.subschema_for::<RunsPage>();
    Schema::try_from(json!({ "anyOf": [list, page] })).unwrap_or_default()
}

/// A run's detail: the envelope's fields beside its own (phases, agents, progress, ...).
fn detail_answer(generator: &mut SchemaGenerator) -> Schema {
    generator.subschema_for::<RunDetail>()
}

/// An open JSON object (its type is not described by a schema).
fn object(description: &'static str) -> impl Fn(&mut SchemaGenerator) -> Schema {
    move |_| Schema::try_from(json!({ "type": "object", "description": description })).unwrap_or_default()
}

/// A pending approval: its id, state, the question's facts (factory, sha256, operation,
/// backend, limits, phases, grants), the session that asked and when it expires.
fn approval_answer(generator: &mut SchemaGenerator) -> Schema {
    generator.subschema_for::<Approval>()
}

fn approvals_answer(generator: &mut SchemaGenerator) -> Schema {
    generator.subschema_for::<Vec<Approval>>()
}

fn progress_answer(generator: &mut SchemaGenerator) -> Schema {
    generator.subschema_for::<Vec<ProgressEntry>>()
}

/// One registered factory, or (a file that defines several) the list of them.
fn registered_answer(generator: &mut SchemaGenerator) -> Schema {
    let one = generator.subschema_for::<Registration>();
    let several = generator.subschema_for::<Vec<Registration>>();
    Schema::try_from(json!({ "anyOf": [one, several] })).unwrap_or_default()
}

fn registration_answer(generator: &mut SchemaGenerator) -> Schema {
    generator.subschema_for::<Registration>()
}

fn factories_answer(generator: &mut SchemaGenerator) -> Schema {
    generator.subschema_for::<Vec<Registration>>()
}

fn stats_answer(generator: &mut SchemaGenerator) -> Schema {
    object(
        "where the store's bytes go, as `factory stats --json` prints it: fileBytes, diskBytes, pageSize, \
         allocatedPages, tables [{ name, entries, storedBytes, leafPages, branchPages, fragmentedBytes, \
         metadataBytes }], parts [{ part, bytes, rows }]",
    )(generator)
}

fn document_answer(generator: &mut SchemaGenerator) -> Schema {
    object("this document (OpenAPI 3.1)")(generator)
}

/// Every route served, in the order they are matched (a literal segment before `{id}`).
pub const ROUTES: &[Route] = &[
    Route {
        method: Method::GET,
        path: "/api/openapi.json",
        op: Op::OpenApi,
        auth: Auth::Token,
        summary: "this document",
        query: &[],
        body: None,
        answer: Answer::Json(200, document_answer),
    },
    Route {
        method: Method::GET,
        path: "/api/session",
        op: Op::Session,
        auth: Auth::Token,
        summary: "the session runs started over HTTP go in",
        query: &[],
        body: None,
        answer: Answer::Json(200, schema::<SessionBody>),
    },
    Route {
        method: Method::GET,
        path: "/api/events",
        op: Op::Events,
        auth: Auth::Token,
        summary: "Server-Sent Events: run_updated, progress, run_started, run_settled",
        query: &[],
        body: None,
        answer: Answer::Events,
    },
    Route {
        method: Method::GET,
        path: "/api/runs",
        op: Op::Runs,
        auth: Auth::Token,
        summary: "the runs the caller sees, oldest first, as summaries",
        query: RUNS_QUERY,
        body: None,
        answer: Answer::Json(200, runs_answer),
    },
    Route {
        method: Method::POST,
        path: "/api/runs",
        op: Op::Start,
        auth: Auth::Token,
        summary: "start a registered factory",
        query: &[],
        body: Some(schema::<StartBody>),
        answer: Answer::Json(202, schema::<StartedAnswer>),
    },
    Route {
        method: Method::GET,
        path: "/api/runs/page",
        op: Op::RunsPage,
        auth: Auth::Token,
        summary: "a page of runs by creation sequence",
        query: RUNS_QUERY,
        body: None,
        answer: Answer::Json(200, schema::<RunsPage>),
    },
    Route {
        method: Method::GET,
        path: "/api/runs/{id}",
        op: Op::Detail,
        auth: Auth::Token,
        summary: "a run's detail",
        query: &[],
        body: None,
        answer: Answer::Json(200, detail_answer),
    },
    Route {
        method: Method::DELETE,
        path: "/api/runs/{id}",
        op: Op::Remove,
        auth: Auth::Token,
        summary: "delete an ended run and its journal",
        query: &[],
        body: None,
        answer: Answer::Json(200, schema::<Removed>),
    },
    Route {
        method: Method::POST,
        path: "/api/gc",
        op: Op::Gc,
        auth: Auth::Token,
        summary: "delete the ended runs a retention policy no longer keeps (a session's own runs; the owner's: every session's)",
        query: &[],
        body: Some(schema::<GcBody>),
        answer: Answer::Json(200, schema::<factory_host::engine::gc::GcReport>),
    },
    Route {
        method: Method::GET,
        path: "/api/stats",
        op: Op::Stats,
        auth: Auth::Token,
        summary: "where the store's bytes go, by part and by table (the owner's only)",
        query: &[],
        body: None,
        answer: Answer::Json(200, stats_answer),
    },
    Route {
        method: Method::GET,
        path: "/api/runs/{id}/envelope",
        op: Op::Envelope,
        auth: Auth::Token,
        summary: "a run's latest envelope",
        query: &[],
        body: None,
        answer: Answer::Json(200, schema::<RunEnvelope>),
    },
    Route {
        method: Method::GET,
        path: "/api/runs/{id}/progress",
        op: Op::Progress,
        auth: Auth::Token,
        summary: "a page of a run's progress",
        query: PROGRESS_QUERY,
        body: None,
        answer: Answer::Json(200, progress_answer),
    },
    Route {
        method: Method::GET,
        path: "/api/runs/{id}/wait",
        op: Op::Wait,
        auth: Auth::Token,
        summary: "the run's envelope once it ends",
        query: &[],
        body: None,
        answer: Answer::Json(200, schema::<RunEnvelope>),
    },
    Route {
        method: Method::POST,
        path: "/api/runs/{id}/resume",
        op: Op::Resume,
        auth: Auth::Token,
        summary: "resume a run (raised limits, a checkpoint's answer)",
        query: &[],
        body: Some(schema::<ResumeBody>),
        answer: Answer::Json(202, schema::<StartedAnswer>),
    },
    Route {
        method: Method::POST,
        path: "/api/runs/{id}/cancel",
        op: Op::Cancel,
        auth: Auth::Token,
        summary: "cancel a run; its terminal envelope",
        query: &[],
        body: None,
        answer: Answer::Json(200, schema::<RunEnvelope>),
    },
    Route {
        method: Method::POST,
        path: "/api/runs/{id}/pause",
        op: Op::Pause,
        auth: Auth::Token,
        summary: "pause a running run; its paused envelope",
        query: &[],
        body: None,
        answer: Answer::Json(200, schema::<RunEnvelope>),
    },
    Route {
        method: Method::GET,
        path: "/api/approvals",
        op: Op::Approvals,
        auth: Auth::Token,
        summary: "the pending approvals the caller sees",
        query: &[],
        body: None,
        answer: Answer::Json(200, approvals_answer),
    },
    Route {
        method: Method::GET,
        path: "/api/approvals/{id}",
        op: Op::Approval,
        auth: Auth::Token,
        summary: "one approval, once answered or after `wait`",
        query: APPROVAL_QUERY,
        body: None,
        answer: Answer::Json(200, approval_answer),
    },
    Route {
        method: Method::POST,
        path: "/api/approvals/{id}/approve",
        op: Op::Approve,
        auth: Auth::Token,
        summary: "approve a pending start (once, or always: trust its sha256)",
        query: &[],
        body: Some(schema::<ApproveBody>),
        answer: Answer::Json(200, approval_answer),
    },
    Route {
        method: Method::POST,
        path: "/api/approvals/{id}/decline",
        op: Op::Decline,
        auth: Auth::Token,
        summary: "decline a pending start: nothing starts",
        query: &[],
        body: None,
        answer: Answer::Json(200, approval_answer),
    },
    Route {
        method: Method::GET,
        path: "/api/factories",
        op: Op::Factories,
        auth: Auth::Token,
        summary: "the factories the caller can run",
        query: &[],
        body: None,
        answer: Answer::Json(200, factories_answer),
    },
    Route {
        method: Method::POST,
        path: "/api/factories",
        op: Op::Register,
        auth: Auth::Token,
        summary: "register a factory file or one in the authoring form",
        query: &[],
        body: Some(schema::<RegisterBody>),
        answer: Answer::Json(200, registered_answer),
    },
    Route {
        method: Method::GET,
        path: "/api/factories/{name}",
        op: Op::Inspect,
        auth: Auth::Token,
        summary: "one registered factory",
        query: &[],
        body: None,
        answer: Answer::Json(200, registration_answer),
    },
    Route {
        method: Method::POST,
        path: "/api/ui/code",
        op: Op::UiCode,
        auth: Auth::Owner,
        summary: "a one-time sign-in code for the dashboard",
        query: &[],
        body: None,
        answer: Answer::Json(200, schema::<CodeBody>),
    },
    Route {
        method: Method::GET,
        path: "/api/ui/sessions",
        op: Op::UiSessions,
        auth: Auth::Owner,
        summary: "the dashboard sessions open",
        query: &[],
        body: None,
        answer: Answer::Json(200, schema::<SessionsBody>),
    },
    Route {
        method: Method::DELETE,
        path: "/api/ui/sessions/{id}",
        op: Op::UiRevoke,
        auth: Auth::Owner,
        summary: "end one dashboard session (`all`: every one)",
        query: &[],
        body: None,
        answer: Answer::Json(200, schema::<RevokedBody>),
    },
    Route {
        method: Method::POST,
        path: "/api/ui/signout",
        op: Op::UiSignout,
        auth: Auth::Token,
        summary: "a dashboard session ends itself (400 for the owner's token)",
        query: &[],
        body: None,
        answer: Answer::Json(200, schema::<RevokedBody>),
    },
    Route {
        method: Method::POST,
        path: "/api/ui/exchange",
        op: Op::UiExchange,
        auth: Auth::Public,
        summary: "a one-time code, redeemed once, for a dashboard session token",
        query: &[],
        body: Some(schema::<ExchangeBody>),
        answer: Answer::Json(200, schema::<TokenBody>),
    },
    Route {
        method: Method::GET,
        path: "/metrics",
        op: Op::Metrics,
        auth: Auth::Token,
        summary: "the service's metrics (OpenMetrics text)",
        query: &[],
        body: None,
        answer: Answer::Text("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    },
    Route {
        method: Method::GET,
        path: "/",
        op: Op::Asset,
        auth: Auth::Public,
        summary: "the dashboard's page",
        query: &[],
        body: None,
        answer: Answer::Text("text/html; charset=utf-8"),
    },
    Route {
        method: Method::GET,
        path: "/ui/app.js",
        op: Op::Asset,
        auth: Auth::Public,
        summary: "the dashboard's script",
        query: &[],
        body: None,
        answer: Answer::Text("text/javascript; charset=utf-8"),
    },
    Route {
        method: Method::GET,
        path: "/ui/style.css",
        op: Op::Asset,
        auth: Auth::Public,
        summary: "the dashboard's style sheet",
        query: &[],
        body: None,
        answer: Answer::Text("text/css; charset=utf-8"),
    },
];

/// Why no route answers a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoRoute {
    /// No route has this path.
    NotFound,
    /// Routes have this path, with these other methods.
    MethodNotAllowed(Vec<Method>),
}

/// Whether `path` matches the route path `pattern`, and the values of its `{name}` segments.
fn matches<'a>(pattern: &str, path: &'a str) -> Option<Vec<&'a str>> {
    let mut params = Vec::new();
    let (mut want, mut have) = (pattern.split('/'), path.split('/'));
    loop {
        match (want.next(), have.next()) {
            (None, None) => return Some(params),
            (Some(w), Some(h)) if w.starts_with('{') && w.ends_with('}') && !h.is_empty() => params.push(h),
            (Some(w), Some(h)) if w == h => {}
            _ => return None,
        }
    }
}

/// The route answering `method` on `path` (a `HEAD` of an asset as its `GET`), with its path
/// parameters in order.
pub fn find<'a>(method: &Method, path: &'a str) -> Result<(&'static Route, Vec<&'a str>), NoRoute> {
    let mut allowed = Vec::new();
    for route in ROUTES {
        if let Some(params) = matches(route.path, path) {
            if route.method == *method || (*method == Method::HEAD && route.op == Op::Asset) {
                return Ok((route, params));
            }
            allowed.push(route.method.clone());
        }
    }
    if allowed.is_empty() {
        Err(NoRoute::NotFound)
    } else {
        Err(NoRoute::MethodNotAllowed(allowed))
    }
}

/// The OpenAPI 3.1 document of [`ROUTES`]: each route an operation, its bodies' schemas in
/// `components.schemas`; the bearer token is the security scheme of every route not public.
pub fn document() -> Value {
    let mut generator = schemars::generate::SchemaSettings::draft2020_12()
        .with(|s| s.definitions_path = "#/components/schemas/".into())
        .into_generator();
    let error = generator.subschema_for::<ErrorBody>();
    let mut paths = Map::new();
    for route in ROUTES {
        let mut parameters: Vec<Value> = route
            .path
            .split('/')
            .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .map(|name| json!({ "name": name, "in": "path", "required": true, "schema": { "type": "string" } }))
            .collect();
        for param in route.query {
            let schema = match param.kind {
                ParamType::Text => json!({ "type": "string" }),
                ParamType::Count => json!({ "type": "integer", "minimum": 0 }),
                ParamType::Seconds => json!({ "type": "number", "minimum": 0 }),
            };
            parameters.push(json!({ "name": param.name, "in": "query", "description": param.doc, "schema": schema }));
        }
        if route.auth != Auth::Public && route.path.starts_with("/api/") {
            let doc = "act as this session (its runs and factories only)";
            parameters.push(json!({ "name": crate::doors::http::SESSION_HEADER, "in": "header", "description": doc, "schema": { "type": "string" } }));
        }
        if matches!(route.op, Op::Start | Op::Resume) {
            let doc = "a W3C trace context the run continues";
            parameters.push(
                json!({ "name": "traceparent", "in": "header", "description": doc, "schema": { "type": "string" } }),
            );
        }
        let (status, content) = match route.answer {
            Answer::Json(status, schema) => {
                (status, json!({ "application/json": { "schema": schema(&mut generator) } }))
            }
            Answer::Events => (200, json!({ "text/event-stream": { "schema": { "type": "string" } } })),
            Answer::Text(media) => (200, json!({ media: { "schema": { "type": "string" } } })),
        };
        let mut operation = json!({
            "operationId": format!("{:?}", route.op).to_lowercase() + &operation_suffix(route),
            "summary": route.summary,
            "parameters": parameters,
            "responses": {
                status.to_string(): { "description": route.summary, "content": content },
                "default": { "description": "a refusal", "content": { "application/json": { "schema": error.clone() } } },
            },
        });
        if let Some(body) = route.body {
            // Resuming and approving take an optional body; the others a required one.
            let required = !matches!(route.op, Op::Resume | Op::Approve);
            operation["requestBody"] =
                json!({ "required": required, "content": { "application/json": { "schema": body(&mut generator) } } });
        }
        if route.auth == Auth::Public {
            operation["security"] = json!([]);
        }
        let item = paths.entry(route.path.to_string()).or_insert_with(|| json!({}));
        item[route.method.as_str().to_lowercase()] = operation;
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "factory HTTP API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "The JSON API of `factory serve --http`: every route one typed service operation.",
        },
        "paths": paths,
        "components": {
            "schemas": generator.take_definitions(true),
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
        },
        "security": [{ "bearer": [] }],
    })
}

/// What tells apart routes of one [`Op`] (the dashboard's assets).
fn operation_suffix(route: &Route) -> String {
    match route.op {
        Op::Asset => route.path.replace(['/', '.'], "_"),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_match_the_table_with_their_parameters() {
        let (route, params) = find(&Method::GET, "/api/runs/r-1/progress").unwrap();
        assert_eq!((route.op, params), (Op::Progress, vec!["r-1"]));
        assert_eq!(find(&Method::GET, "/api/runs/page").unwrap().0.op, Op::RunsPage);
        assert_eq!(find(&Method::DELETE, "/api/runs/r-1").unwrap().0.op, Op::Remove);
        assert_eq!(find(&Method::POST, "/api/gc").unwrap().0.op, Op::Gc);
        assert_eq!(find(&Method::GET, "/api/stats").unwrap().0.op, Op::Stats);
        assert_eq!(find(&Method::HEAD, "/").unwrap().0.op, Op::Asset);
        assert_eq!(find(&Method::GET, "/api/runs//wait").err(), Some(NoRoute::NotFound));
        assert_eq!(find(&Method::GET, "/api/nope").err(), Some(NoRoute::NotFound));
        assert_eq!(
            find(&Method::PUT, "/api/runs").err(),
            Some(NoRoute::MethodNotAllowed(vec![Method::GET, Method::POST]))
        );
    }

    #[test]
    fn every_operation_has_a_route_and_the_document_lists_every_route() {
        use Op::*;
        let all = [
            Runs, RunsPage, Detail, Envelope, Progress, Wait, Start, Resume, Cancel, Pause, Remove, Gc, Stats,
            Factories, Inspect, Register, Events, Session, OpenApi, UiCode, UiSessions, UiRevoke, UiSignout,
            UiExchange, Metrics, Asset, Approvals, Approval, Approve, Decline,
        ];
        // A new operation must be added here (the match is exhaustive) and to the table.
        for op in all {
            match op {
                Runs | RunsPage | Detail | Envelope | Progress | Wait | Start | Resume | Cancel | Pause | Remove
                | Gc | Stats | Factories | Inspect | Register | Events | Session | OpenApi | UiCode | UiSessions
                | UiRevoke | UiSignout | UiExchange | Metrics | Asset | Approvals | Approval | Approve | Decline => {
                    assert!(ROUTES.iter().any(|r| r.op == op), "{op:?}")
                }
            }
        }
        let doc = document();
        for route in ROUTES {
            let operation = &doc["paths"][route.path][route.method.as_str().to_lowercase()];
            assert!(operation.is_object(), "{} {}", route.method, route.path);
        }
        let listed: usize =
            doc["paths"].as_object().unwrap().values().map(|item| item.as_object().unwrap().len()).sum();
        assert_eq!(listed, ROUTES.len());
        // The bodies' schemas are derived: the start body names its fields, the limits theirs.
        let schemas = &doc["components"]["schemas"];
        assert!(schemas["StartBody"]["properties"]["name"].is_object(), "{schemas:#}");
        assert!(schemas["Limits"]["properties"]["maxAiCredits"].is_object(), "{schemas:#}");
        assert!(schemas["ErrorCode"].to_string().contains("not_found"));
        // Every `$ref` names a schema the document holds.
        let text = doc.to_string();
        for reference in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
            let name = reference.split('"').next().unwrap();
            assert!(schemas[name].is_object(), "{name}");
        }
    }

    #[test]
    fn the_query_parameters_listed_are_the_ones_the_parsers_read() {
        use crate::doors::http::{parse_progress_query, parse_runs_query};
        for param in RUNS_QUERY {
            assert!(parse_runs_query(&format!("{}=1", param.name)).is_ok(), "{}", param.name);
        }
        for param in PROGRESS_QUERY {
            assert!(parse_progress_query(&format!("{}=1", param.name)).is_ok(), "{}", param.name);
        }
    }
}
