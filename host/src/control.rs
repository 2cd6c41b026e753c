//! The control socket: redb lets one process open the store, so the process that holds it
//! (a foreground `factory run`, or `factory serve`) answers control requests on a Unix
//! socket in the state directory. Another `factory runs/show/progress/wait/cancel` connects
//! there instead of failing on the lock. One JSON request line, one JSON response line.
//!
//! Only the user who owns the process may talk to it: the socket lives in the `0700` state
//! directory, is itself `0600`, and the server checks every peer's uid (`SO_PEERCRED`) and
//! answers any other uid with a `forbidden` error and nothing else. A request line is at
//! most [`MAX_REQUEST_BYTES`] and must arrive within [`REQUEST_READ_TIMEOUT`]; the client
//! reads at most [`MAX_RESPONSE_BYTES`] of answer. At most [`MAX_CONNECTIONS`] are served
//! at once, and a failed accept (out of descriptors, say) is retried after a pause
//! ([`AcceptBackoff`]): the server never stops answering and never spins.

use crate::error::{Error, ErrorCode};
use crate::host::{BackendChoice, Host, ResumeOptions, RunOptions};
use crate::limits::Limits;
use crate::store::ProgressQuery;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

/// The socket's file name inside the state directory.
pub const SOCKET_FILE: &str = "control.sock";

/// The longest request line the server reads (requests are small: ids, paths, limits).
pub const MAX_REQUEST_BYTES: u64 = 1 << 20;

/// How long the server waits for a whole request line after a client connects.
pub const REQUEST_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The longest response line the client reads (progress pages can be large).
pub const MAX_RESPONSE_BYTES: u64 = 64 << 20;

/// Read one `\n`-terminated line of at most `limit` bytes (the newline excluded). `Ok(None)`:
/// the line is longer than `limit`.
async fn read_line_bounded<R: tokio::io::AsyncRead + Unpin>(read: R, limit: u64) -> std::io::Result<Option<Vec<u8>>> {
    let mut line = Vec::new();
    BufReader::new(read.take(limit + 1)).read_until(b'\n', &mut line).await?;
    if line.last() == Some(&b'\n') {
        line.pop();
    } else if line.len() as u64 > limit {
        return Ok(None);
    }
    Ok(Some(line))
}

/// Is the peer of `stream` this process's user? `Err` names the peer's uid (or why it is
/// unknown).
fn peer_is_us(stream: &UnixStream) -> Result<(), String> {
    let ours = crate::access::our_uid();
    match stream.peer_cred() {
        Ok(cred) if cred.uid() == ours => Ok(()),
        Ok(cred) => Err(format!("the control socket serves only uid {ours}; uid {} was refused", cred.uid())),
        Err(e) => Err(format!("the control socket cannot identify its peer ({e}); refused")),
    }
}

/// Answer one connection: check the peer, read one bounded request, answer it.
async fn handle(host: Arc<Host>, stream: UnixStream, trusted: &TrustCheck) {
    let refused = peer_is_us(&stream).err();
    let (read, mut write) = stream.into_split();
    let response = match refused {
        Some(message) => {
            tracing::warn!("{message}");
            Response::Err(RemoteError { code: ErrorCode::Forbidden, message })
        }
        None => match tokio::time::timeout(REQUEST_READ_TIMEOUT, read_line_bounded(read, MAX_REQUEST_BYTES)).await {
            Err(_) => Response::Err(RemoteError {
                code: ErrorCode::BadRequest,
                message: format!("no complete request within {} s", REQUEST_READ_TIMEOUT.as_secs()),
            }),
            Ok(Err(_)) => return,
            Ok(Ok(None)) => Response::Err(RemoteError {
                code: ErrorCode::BadRequest,
                message: format!("request larger than {MAX_REQUEST_BYTES} bytes"),
            }),
            Ok(Ok(Some(line))) => match parse_request(&line) {
                Err(e) => Response::Err(e),
                Ok(request) => match answer(&host, request, trusted).await {
                    Ok(value) => Response::Ok(value),
                    Err(e) => Response::Err(RemoteError::from(&e)),
                },
            },
        },
    };
    if let Ok(mut bytes) = serde_json::to_vec(&Frame { wire: WIRE_VERSION, body: response }) {
        bytes.push(b'\n');
        let _ = write.write_all(&bytes).await;
        let _ = write.shutdown().await;
    }
}

/// The version of the control socket's wire format: every request and response line carries
/// it as `"wire"`; a peer speaking another version is refused with `unsupported_version`.
pub const WIRE_VERSION: u32 = 2;

/// One line on the socket: the wire version and the request or response.
#[derive(Serialize, Deserialize)]
struct Frame<T> {
    wire: u32,
    #[serde(flatten)]
    body: T,
}

/// Only the version of a frame, read first so another version gets a clear answer.
#[derive(Deserialize)]
struct VersionOnly {
    #[serde(default)]
    wire: Option<u32>,
}

fn parse_request(line: &[u8]) -> Result<Request, RemoteError> {
    let bad = |message: String| RemoteError { code: ErrorCode::BadRequest, message };
    let version = serde_json::from_slice::<VersionOnly>(line).map_err(|e| bad(e.to_string()))?;
    if version.wire != Some(WIRE_VERSION) {
        return Err(RemoteError {
            code: ErrorCode::UnsupportedVersion,
            message: format!(
                "this factory process speaks control wire version {WIRE_VERSION}, the request {}; use the same factory version",
                version.wire.map_or("names none".to_string(), |v| format!("version {v}"))
            ),
        });
    }
    serde_json::from_slice::<Frame<Request>>(line).map(|f| f.body).map_err(|e| bad(e.to_string()))
}

/// The socket path for a state directory.
pub fn socket_path(state_dir: &Path) -> PathBuf {
    state_dir.join(SOCKET_FILE)
}

/// A control request; every one is on behalf of a session.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum Request {
    /// The session's runs, in creation order.
    Runs { session: String },
    /// A run's envelope.
    Envelope { session: String, run_id: String },
    /// A run's detail.
    Detail { session: String, run_id: String },
    /// A page of a run's progress.
    Progress { session: String, run_id: String, query: ProgressQuery },
    /// Wait for a terminal envelope.
    Wait { session: String, run_id: String },
    /// Cancel a run; answers with its terminal envelope.
    Cancel { session: String, run_id: String },
    /// The factories the session can run: its own authored ones and those registered for
    /// everyone (name, description, phases, limits, args schema, sha256).
    Factories { session: String },
    /// One factory, as the session sees it.
    Inspect { session: String, name: String },
    /// Register a factory in the authoring form (`meta` JSON and a `run` body, one async
    /// function expression) in the session's own scope, without running it.
    Author { session: String, meta: serde_json::Value, run: String },
    /// Start a run in the serving process; answers `{"runId"}` once the run exists.
    Run {
        session: String,
        component: Target,
        #[serde(default)]
        args: Option<serde_json::Value>,
        #[serde(default)]
        limits: Limits,
        /// The backend by name and model, built from the server's own configuration
        /// (empty: the server's default).
        #[serde(default)]
        backend: BackendChoice,
        /// Read-only directories to grant (absolute paths).
        #[serde(default)]
        grants: Vec<PathBuf>,
        /// The user declined to run it: record the run as declined ([`Host::decline`]).
        #[serde(default)]
        declined: bool,
        /// What the user consented to on the client (a prompt answered yes, `--yes`).
        #[serde(default)]
        consent: Consent,
    },
    /// Resume a run in the serving process; answers `{"runId"}` once the attempt starts.
    Resume {
        session: String,
        run_id: String,
        #[serde(default)]
        component: Option<PathBuf>,
        #[serde(default)]
        limits: Limits,
        /// Another backend or model than the run recorded (empty: the recorded one).
        #[serde(default)]
        backend: BackendChoice,
        /// What the user consented to for the component this resume runs (see `Run`).
        #[serde(default)]
        consent: Consent,
    },
}

/// The consent a start request carries.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Consent {
    /// None: the server runs only a component its own trust check accepts.
    #[default]
    None,
    /// The user approved exactly this trust key (a component's sha256, or a script
    /// source's): the server runs the factory only if what it loads has that key, so a file
    /// swapped after the client read it is refused, not run.
    Sha256(String),
    /// The caller consents to whatever the server loads (a front door without files of its
    /// own to show, e.g. the HTTP API, whose bearer token is the user's).
    Any,
}

/// A failed request, with the library error's code when it has one.
#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct RemoteError {
    /// What kind of refusal it is.
    pub code: ErrorCode,
    /// What went wrong.
    pub message: String,
}

impl From<&Error> for RemoteError {
    fn from(e: &Error) -> Self {
        RemoteError { code: e.code(), message: e.to_string() }
    }
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
enum Response {
    Ok(serde_json::Value),
    Err(RemoteError),
}

/// What a `Run` request runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Target {
    /// A component file on this machine (an absolute path).
    File(PathBuf),
    /// A registered factory, by name (never a path, whatever files exist).
    Registered(String),
}

/// Start a run or a resume in the background; answer once it has an id (or failed early).
/// Whether a component (by sha256) may run without the user's consent in the request: built
/// on this machine or approved before. The server checks it itself, whatever the client did.
pub type TrustCheck = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// Refuse a component the request's `consent` does not cover and `trusted` does not accept
/// (`authored`: the session's own authored factory, which needs no consent).
fn consented(trusted: &TrustCheck, consent: &Consent, authored: bool, hash: &str, what: &str) -> Result<(), Error> {
    match consent {
        Consent::Sha256(approved) if approved != hash => Err(Error::NotApproved(format!(
            "{what} is not what was approved: the approval was for sha256 {approved}, the file now has sha256 \
             {hash} (it changed after it was read for consent); nothing ran"
        ))),
        Consent::Sha256(_) | Consent::Any => Ok(()),
        Consent::None if authored || trusted(hash) => Ok(()),
        Consent::None => Err(Error::NotApproved(format!(
            "{what} (sha256 {hash}) is not trusted on this machine and the request carries no consent: \
             run it with --yes, or approve it with `factory trust`"
        ))),
    }
}

async fn start(host: Arc<Host>, request: Request, trusted: &TrustCheck) -> Result<serde_json::Value, Error> {
    let (started, started_rx) = tokio::sync::oneshot::channel::<String>();
    let on_start: Box<dyn FnOnce(&str) + Send> = Box::new(move |id: &str| {
        let _ = started.send(id.to_string());
    });
    let task = match request {
        Request::Run { session, component, args, limits, backend: choice, grants, declined, consent } => {
            // Refuse an unusable backend before the run exists.
            let backend = Some(host.chosen_backend(&choice)?);
            let factory = match &component {
                Target::File(path) => host.load_file(path).await?,
                Target::Registered(name) => host.load_registered_for(&session, name).await?,
            };
            if !declined {
                // A script factory is trusted by its source (the runner ships in the binary).
                let key = factory.component.script.as_ref().map_or(&factory.component.hash, |s| &s.hash);
                let authored = host.authored_in(&session, key)?;
                consented(trusted, &consent, authored, key, &format!("factory `{}`", factory.meta.name))?;
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
            };
            tokio::spawn(async move {
                if declined {
                    host.decline(&factory, options).await
                } else {
                    host.run(&factory, options).await
                }
            })
        }
        Request::Resume { session, run_id, component, limits, backend: choice, consent } => {
            let component = match component {
                Some(path) => Some(host.load_file(&path).await?),
                None => None,
            };
            // The component this attempt runs: the edited one, else the run's last.
            let hash = match &component {
                Some(factory) => {
                    Some(factory.component.script.as_ref().map_or(&factory.component.hash, |s| &s.hash).clone())
                }
                None => host.trust_key_of_run(&session, &run_id)?,
            };
            if let Some(hash) = hash {
                let authored = host.authored_in(&session, &hash)?;
                consented(trusted, &consent, authored, &hash, &format!("the component of run {run_id}"))?;
            }
            let options = ResumeOptions {
                limits,
                component,
                session: Some(session),
                events: None,
                on_start: Some(on_start),
                backend: None,
                choice,
            };
            tokio::spawn(async move { host.resume(&run_id, options).await })
        }
        _ => return Err(Error::Misrouted("not a start request")),
    };
    match started_rx.await {
        Ok(run_id) => Ok(serde_json::json!({ "runId": run_id })),
        // The run failed before it existed: its error is the answer.
        Err(_) => match task.await {
            Ok(Err(e)) => Err(e),
            Ok(Ok(envelope)) => Ok(serde_json::json!({ "runId": envelope.run_id })),
            Err(e) => Err(Error::Task(e)),
        },
    }
}

/// Answer an observation or control request (everything but `Run`/`Resume`, which start
/// work in the serving process and answer through [`serve`]). Used by the server and by a process
/// that opened the store itself.
pub async fn answer_query(host: &Host, request: Request) -> Result<serde_json::Value, Error> {
    let json = |v: Result<serde_json::Value, serde_json::Error>| v.map_err(Error::Encode);
    match request {
        Request::Runs { session } => json(serde_json::to_value(host.runs(&session)?)),
        Request::Envelope { session, run_id } => json(serde_json::to_value(host.envelope(&session, &run_id)?)),
        Request::Detail { session, run_id } => json(serde_json::to_value(host.detail(&session, &run_id)?)),
        Request::Progress { session, run_id, query } => {
            json(serde_json::to_value(host.progress(&session, &run_id, &query)?))
        }
        Request::Wait { session, run_id } => json(serde_json::to_value(host.wait(&session, &run_id).await?)),
        Request::Cancel { session, run_id } => json(serde_json::to_value(host.cancel(&session, &run_id).await?)),
        Request::Factories { session } => json(serde_json::to_value(host.registered_for(&session)?)),
        Request::Author { session, meta, run } => json(serde_json::to_value(host.author_in(&session, &meta, &run).await?)),
        Request::Inspect { session, name } => match host.store().factory_in(&session, &name)? {
            Some(registration) => json(serde_json::to_value(registration)),
            None => Err(Error::NotRegistered(format!("no factory named `{name}` is registered"))),
        },
        Request::Run { .. } | Request::Resume { .. } => {
            Err(Error::Misrouted("runs start through the process serving the control socket"))
        }
    }
}

/// Answer any request for `host`, in this process: queries as [`answer_query`] does, and
/// `Run`/`Resume` by starting the attempt in the background and answering `{"runId"}` once
/// it exists. What the socket server does with each request, and what a front door that
/// opened the store itself (the MCP server) calls.
pub async fn answer(host: &Arc<Host>, request: Request, trusted: &TrustCheck) -> Result<serde_json::Value, Error> {
    match request {
        start_request @ (Request::Run { .. } | Request::Resume { .. }) => {
            start(host.clone(), start_request, trusted).await
        }
        query => answer_query(host, query).await,
    }
}

/// A running control server.
pub struct Server {
    accept: tokio::task::JoinHandle<()>,
    in_flight: Arc<std::sync::atomic::AtomicUsize>,
}

impl Server {
    /// Stop accepting, then wait (at most `patience`) for requests being answered, so a
    /// process that is about to exit does not cut off a client mid-answer (a `cancel`
    /// whose run has just ended, say).
    pub async fn drain(&self, patience: std::time::Duration) {
        self.accept.abort();
        let deadline = std::time::Instant::now() + patience;
        while self.in_flight.load(std::sync::atomic::Ordering::SeqCst) > 0 && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// The most connections the control socket serves at once; more wait (in the kernel's
/// listen queue) until one ends. Each is bounded by [`REQUEST_READ_TIMEOUT`] until its
/// request arrives.
pub const MAX_CONNECTIONS: usize = 512;

/// What an accept loop does when `accept` fails: the error is about the process (out of
/// file descriptors, `EMFILE`/`ENFILE`, or memory) or one aborted connection, never about
/// the listener, so the loop sleeps and tries again, never ends and never spins. The pause
/// starts at [`AcceptBackoff::FIRST`], doubles up to [`AcceptBackoff::MAX`] while accepts
/// keep failing, and resets on the first success. Shared by every server of the host.
#[derive(Debug, Default)]
pub struct AcceptBackoff {
    /// Failures in a row.
    failures: u32,
}

impl AcceptBackoff {
    /// The first pause after a failed accept.
    pub const FIRST: std::time::Duration = std::time::Duration::from_millis(5);
    /// The longest pause.
    pub const MAX: std::time::Duration = std::time::Duration::from_secs(1);

    /// An accept succeeded: the next failure starts over with a short pause.
    pub fn accepted(&mut self) {
        self.failures = 0;
    }

    /// An accept failed with `error` on the server `what`: log the first of a run of
    /// failures and sleep before the next try.
    pub async fn failed(&mut self, what: &str, error: &std::io::Error) {
        if self.failures == 0 {
            tracing::warn!("{what}: accepting a connection failed ({error}); retrying with backoff");
        }
        let pause = Self::FIRST.saturating_mul(1u32 << self.failures.min(16)).min(Self::MAX);
        self.failures = self.failures.saturating_add(1);
        tokio::time::sleep(pause).await;
    }
}

/// Counts a request as in flight while it lives.
struct InFlight(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Serve control requests for `host` on `path` until the returned server is drained or
/// dropped, at most [`MAX_CONNECTIONS`] at once; a failed accept is retried after a pause
/// ([`AcceptBackoff`]). A stale socket file (no one listening) is replaced.
pub fn serve(host: Arc<Host>, path: &Path, trusted: TrustCheck) -> std::io::Result<Server> {
    if path.exists() {
        // We hold the store, so nobody else can be serving it: the file is stale.
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path)?;
    // The directory is private already; the socket is too, in case it is not.
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    let in_flight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = in_flight.clone();
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let accept = tokio::spawn(async move {
        let mut backoff = AcceptBackoff::default();
        loop {
            // At the cap, wait for a slot before accepting: new clients queue in the kernel.
            let Ok(slot) = slots.clone().acquire_owned().await else { return };
            let stream = match listener.accept().await {
                Ok((stream, _)) => {
                    backoff.accepted();
                    stream
                }
                Err(e) => {
                    backoff.failed("control socket", &e).await;
                    continue;
                }
            };
            let host = host.clone();
            let trusted = trusted.clone();
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let guard = InFlight(counter.clone());
            tokio::spawn(async move {
                let _guard = guard;
                let _slot = slot;
                handle(host, stream, &trusted).await;
            });
        }
    });
    Ok(Server { accept, in_flight })
}

/// Why a control request failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nobody answers on the socket.
    #[error("cannot reach the factory process holding the store ({path}): {source}")]
    Connect { path: String, source: std::io::Error },
    /// The process listening on the socket is not this user's: nothing is sent to it.
    #[error("the control socket {path} is served by uid {uid}, not by us (uid {ours}); refusing to talk to it")]
    NotOurs { path: String, uid: u32, ours: u32 },
    /// The exchange broke or the answer was not understood.
    #[error("control socket: {0}")]
    Protocol(String),
    /// The holder answered with an error.
    #[error(transparent)]
    Remote(#[from] RemoteError),
}

/// Send one request to the process serving `path` and return its answer.
pub async fn request(path: &Path, request: &Request) -> Result<serde_json::Value, ClientError> {
    let stream = UnixStream::connect(path)
        .await
        .map_err(|source| ClientError::Connect { path: path.display().to_string(), source })?;
    // The server checks us; we check the server: a socket planted by another user gets
    // neither our requests nor our consent.
    let ours = crate::access::our_uid();
    match stream.peer_cred() {
        Ok(cred) if cred.uid() == ours => {}
        Ok(cred) => return Err(ClientError::NotOurs { path: path.display().to_string(), uid: cred.uid(), ours }),
        Err(source) => return Err(ClientError::Connect { path: path.display().to_string(), source }),
    }
    let (read, mut write) = stream.into_split();
    let mut bytes =
        serde_json::to_vec(&Frame { wire: WIRE_VERSION, body: request }).map_err(|e| ClientError::Protocol(e.to_string()))?;
    bytes.push(b'\n');
    write.write_all(&bytes).await.map_err(|e| ClientError::Protocol(e.to_string()))?;
    let line = read_line_bounded(read, MAX_RESPONSE_BYTES)
        .await
        .map_err(|e| ClientError::Protocol(e.to_string()))?
        .ok_or_else(|| ClientError::Protocol(format!("response larger than {MAX_RESPONSE_BYTES} bytes")))?;
    let parsed = serde_json::from_slice::<Frame<Response>>(&line).map(|f| f.body).map_err(|e| {
        let start = String::from_utf8_lossy(&line[..line.len().min(200)]).into_owned();
        ClientError::Protocol(format!("{e}: {start:?}"))
    });
    match parsed? {
        Response::Ok(value) => Ok(value),
        Response::Err(e) => Err(ClientError::Remote(e)),
    }
}
