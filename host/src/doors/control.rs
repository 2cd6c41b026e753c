//! The control socket: the service's front door for other local processes. The process
//! that holds the store (`factory serve`, or a foreground `factory run` in `--no-daemon`
//! mode) answers [`crate::service`] requests on a Unix socket in the state directory, and
//! every other front door of the same user (`factory runs/show/run/...`, another MCP
//! server, `factory serve --http`) is its client ([`factory_host::service::Remote`]). One request
//! line, one answer line; a subscription then streams one line per run update.
//!
//! Only the user who owns the process may talk to it: the socket lives in the `0700` state
//! directory, is itself `0600`, and the server checks every peer's uid (`SO_PEERCRED`) and
//! answers any other uid with a `forbidden` error and nothing else. A peer of our uid in
//! another mount namespace than the service's (an agent CLI inside its bubblewrap sandbox,
//! which has one of its own: the uid alone cannot tell it from the user) is refused the same
//! way, and the reason is logged; [`ANY_MOUNT_NS_ENV`] set on the serving process lifts that
//! rule for a service deliberately run in a namespace of its own. A request line is at
//! most [`MAX_REQUEST_BYTES`] (a start carrying a cassette the caller read, at most
//! [`MAX_TAPE_REQUEST_BYTES`]) and must arrive within [`REQUEST_READ_TIMEOUT`]; the client
//! reads at most [`factory_host::service::MAX_RESPONSE_BYTES`] of answer. At most
//! [`MAX_CONNECTIONS`] are served at once, and a failed accept (out of descriptors, say) is
//! retried after a pause ([`AcceptBackoff`]): the server never stops answering and never
//! spins.

use factory_host::service::MAX_TAPE_REQUEST_BYTES;
use factory_host::service::{parse_request, read_line_bounded, Local, RemoteError, Request, MAX_REQUEST_BYTES};
use factory_host::service::{Answer, Frame};
use factory_host::ErrorCode;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

/// The socket's file name inside the state directory.
pub const SOCKET_FILE: &str = crate::doors::state_files::CONTROL_SOCKET;

/// How long the server waits for a whole request line after a client connects.
pub const REQUEST_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The socket path for a state directory.
pub fn socket_path(state_dir: &Path) -> PathBuf {
    state_dir.join(SOCKET_FILE)
}

/// Set (to anything but empty or `0`) on the serving process, it answers peers in another
/// mount namespace too: for a service run in a namespace of its own (a systemd unit with
/// `PrivateTmp=`, say), whose clients are all elsewhere. Agent sandboxes then rely on the
/// socket being hidden from them alone.
pub const ANY_MOUNT_NS_ENV: &str = "FACTORY_CONTROL_ANY_MOUNT_NS";

/// Why a peer of the control socket was refused (its message is the `forbidden` answer).
#[derive(Debug, thiserror::Error)]
enum PeerRefused {
    /// Another user.
    #[error("the control socket serves only uid {ours}; uid {theirs} was refused")]
    OtherUid { ours: u32, theirs: u32 },
    /// No credentials, no pid, or a pid outside this process's pid namespace.
    #[error("the control socket cannot identify its peer ({0}); refused")]
    Unidentified(#[source] std::io::Error),
    /// The peer's credentials carry no pid.
    #[error("the control socket cannot identify its peer (no pid); refused")]
    NoPid,
    /// The peer's mount namespace cannot be read.
    #[error("the control socket cannot identify its peer (the mount namespace of pid {pid}: {source}); refused")]
    MountNamespace { pid: String, source: std::io::Error },
    /// Our uid, from another mount namespace: an agent sandbox, or a namespace of the user's own.
    #[error(
        "the control socket refuses peers in another mount namespace (pid {pid} is in {theirs}, the service in \
         {ours}): an agent sandbox may not drive the service; a service run in a namespace of its own needs \
         {ANY_MOUNT_NS_ENV}=1 in its environment"
    )]
    OtherMountNs { pid: i32, theirs: String, ours: String },
}

/// The mount namespace of process `pid` (`mnt:[N]`), as `/proc` links it.
fn mount_ns(pid: &str) -> std::io::Result<String> {
    Ok(std::fs::read_link(format!("/proc/{pid}/ns/mnt"))?.to_string_lossy().into_owned())
}

/// Whether the serving process answers peers in any mount namespace ([`ANY_MOUNT_NS_ENV`]).
fn any_mount_ns() -> bool {
    std::env::var_os(ANY_MOUNT_NS_ENV).is_some_and(|v| !v.is_empty() && v != "0")
}

/// Is the peer of `stream` this process's user, in this process's mount namespace (unless
/// `any_ns`)? `Err` says who was refused and why.
fn peer_is_us(stream: &UnixStream, any_ns: bool) -> Result<(), PeerRefused> {
    let ours = factory_host::access::our_uid();
    let cred = stream.peer_cred().map_err(PeerRefused::Unidentified)?;
    if cred.uid() != ours {
        return Err(PeerRefused::OtherUid { ours, theirs: cred.uid() });
    }
    if any_ns {
        return Ok(());
    }
    // The pid the peer had when it connected, as this process's pid namespace numbers it
    // (0 when the peer's namespace is not below ours).
    let pid = cred.pid().filter(|pid| *pid > 0).ok_or(PeerRefused::NoPid)?;
    let ns = |pid: &str| mount_ns(pid).map_err(|source| PeerRefused::MountNamespace { pid: pid.to_string(), source });
    let (theirs, ours) = (ns(&pid.to_string())?, ns("self")?);
    if theirs != ours {
        return Err(PeerRefused::OtherMountNs { pid, theirs, ours });
    }
    Ok(())
}

/// Append one frame as a line to `out`; false (logged) if it cannot be encoded.
fn encode_frame<T: serde::Serialize>(out: &mut Vec<u8>, body: T) -> bool {
    match serde_json::to_writer(&mut *out, &Frame::new(body)) {
        Ok(()) => {
            out.push(b'\n');
            true
        }
        Err(e) => {
            tracing::warn!("control socket: cannot encode an answer: {e}");
            false
        }
    }
}

/// Write one frame as a line.
async fn write_frame<T: serde::Serialize>(write: &mut tokio::net::unix::OwnedWriteHalf, body: T) -> bool {
    let mut bytes = Vec::new();
    encode_frame(&mut bytes, body) && write.write_all(&bytes).await.is_ok()
}

/// Answer one connection: check the peer, read one bounded request, answer it (a
/// subscription: stream updates until either side goes away).
async fn handle(service: Local, stream: UnixStream, any_ns: bool) {
    let refused = peer_is_us(&stream, any_ns).err();
    let (mut read, mut write) = stream.into_split();
    let request = match refused {
        Some(refused) => {
            let message = refused.to_string();
            tracing::warn!(event = "refused", door = "control", reason = %message, "control socket refused a peer");
            Err(RemoteError { code: ErrorCode::Forbidden, message })
        }
        None => match tokio::time::timeout(REQUEST_READ_TIMEOUT, read_line_bounded(&mut read, MAX_TAPE_REQUEST_BYTES))
            .await
        {
            Err(_) => Err(RemoteError::bad_request(format!(
                "no complete request within {} s",
                REQUEST_READ_TIMEOUT.as_secs()
            ))),
            Ok(Err(_)) => return,
            Ok(Ok(None)) => {
                Err(RemoteError::bad_request(format!("request larger than {MAX_TAPE_REQUEST_BYTES} bytes")))
            }
            Ok(Ok(Some(line))) if line.len() as u64 <= MAX_REQUEST_BYTES => parse_request(&line),
            // Only a start that carries a cassette may be longer than an ordinary request.
            Ok(Ok(Some(line))) => match parse_request(&line) {
                Ok(request) if request.carries_tape() => Ok(request),
                _ => Err(RemoteError::bad_request(format!(
                    "request larger than {MAX_REQUEST_BYTES} bytes (only a start carrying a cassette may be longer)"
                ))),
            },
        },
    };
    let answer = match request {
        Err(e) => Answer::Err(e),
        Ok(Request::Subscribe { scope }) => return subscription(service, scope, read, write).await,
        Ok(Request::Follow { scope, run_id, after_seq }) => {
            return follow(service, scope, run_id, after_seq, read, write).await
        }
        Ok(Request::StartFollowing { start }) => return start_following(service, *start, read, write).await,
        Ok(request) => match service.answer(request).await {
            Ok(response) => Answer::Ok(response),
            Err(e) => Answer::Err(RemoteError::from(&e)),
        },
    };
    if write_frame(&mut write, answer).await {
        let _ = write.shutdown().await;
    }
}

/// Stream the updates of the runs a scope sees to a subscriber until it hangs up (its write half
/// ends) or the host goes away.
async fn subscription(
    service: Local,
    scope: factory_host::Scope,
    mut read: tokio::net::unix::OwnedReadHalf,
    mut write: tokio::net::unix::OwnedWriteHalf,
) {
    let client = factory_host::service::Client::Local(service);
    let Ok(mut updates) = client.updates(scope).await else { return };
    if !write_frame(&mut write, Answer::Ok(factory_host::service::Response::Subscribed)).await {
        return;
    }
    let mut sink = [0u8; 64];
    loop {
        tokio::select! {
            update = updates.next() => match update {
                Some(update) => if !write_frame(&mut write, update).await { return },
                None => return,
            },
            // The subscriber sends nothing more: anything read (or the end) means it left.
            _ = read.read(&mut sink) => return,
        }
    }
}

/// A service error as the wire carries it.
fn remote_error(e: factory_host::service::ServiceError) -> RemoteError {
    match e {
        factory_host::service::ServiceError::Host(e) => RemoteError::from(&e),
        other => RemoteError { code: other.code(), message: other.to_string() },
    }
}

/// Answer with `error` and close.
async fn refuse(mut write: tokio::net::unix::OwnedWriteHalf, error: RemoteError) {
    if write_frame(&mut write, Answer::Err(error)).await {
        let _ = write.shutdown().await;
    }
}

/// `follow`: refuse a run the scope cannot see as a plain answer, else open the stream.
async fn follow(
    service: Local,
    scope: factory_host::Scope,
    run_id: String,
    after_seq: u64,
    read: tokio::net::unix::OwnedReadHalf,
    mut write: tokio::net::unix::OwnedWriteHalf,
) {
    let client = factory_host::service::Client::Local(service);
    if let Err(e) = client.envelope(scope.clone(), &run_id).await {
        return refuse(write, remote_error(e)).await;
    }
    if !write_frame(&mut write, Answer::Ok(factory_host::service::Response::Following)).await {
        return;
    }
    stream_run(client, scope, run_id, after_seq, None, read, write).await
}

/// `startFollowing`: start the run (or refuse as `run`/`resume` would), answer `started`,
/// then stream it as its session (or the resume's scope) sees it.
async fn start_following(
    service: Local,
    start: Request,
    read: tokio::net::unix::OwnedReadHalf,
    mut write: tokio::net::unix::OwnedWriteHalf,
) {
    let scope = match &start {
        Request::Run { session, .. } => factory_host::Scope::Session(session.clone()),
        Request::Resume { scope, .. } => scope.clone(),
        other => {
            let message = format!("startFollowing starts a `run` or a `resume`, not `{}`", other.op());
            return refuse(write, RemoteError::bad_request(message)).await;
        }
    };
    let client = factory_host::service::Client::Local(service.clone());
    let after_seq = match factory_host::service::Follower::start_after_seq(&client, &scope, &start).await {
        Ok(seq) => seq,
        Err(e) => return refuse(write, remote_error(e)).await,
    };
    let (run_id, recording) = match service.start_recorded(start).await {
        Ok((factory_host::service::Started::Run(run_id), recording)) => (run_id, recording),
        // Held for the owner's approval: answered as a plain start is.
        Ok((factory_host::service::Started::Pending(approval), _)) => {
            if write_frame(&mut write, Answer::Ok(factory_host::service::Response::Approval(approval))).await {
                let _ = write.shutdown().await;
            }
            return;
        }
        Err(e) => return refuse(write, RemoteError::from(&e)).await,
    };
    let started = factory_host::service::Response::Started { run_id: run_id.clone() };
    if !write_frame(&mut write, Answer::Ok(started)).await {
        return;
    }
    stream_run(client, scope, run_id, after_seq, recording, read, write).await
}

/// Stream what a [`Follower`](factory_host::service::Follower) in this process hands out of
/// a run: its progress entries, then (for a start that records, `recording`) the exchanges it
/// recorded, then its envelope (or the error that ended following), then close. What the follower has at hand goes out in one write (one wake of the client, not
/// one per entry). A client that hangs up ends it.
async fn stream_run(
    client: factory_host::service::Client,
    scope: factory_host::Scope,
    run_id: String,
    after_seq: u64,
    recording: Option<factory_host::backend::cassette::Recording>,
    mut read: tokio::net::unix::OwnedReadHalf,
    mut write: tokio::net::unix::OwnedWriteHalf,
) {
    use factory_host::service::{FollowEvent, Followed, Follower};
    let mut follower = Follower::new(client, scope, &run_id, after_seq).await;
    let mut sink = [0u8; 64];
    loop {
        let next = tokio::select! {
            next = follower.next() => next,
            // The follower sends nothing more: anything read (or the end) means it left.
            _ = read.read(&mut sink) => return,
        };
        // The run's recorded exchanges go right before its envelope (the run has ended:
        // nothing more is recorded).
        let as_events = |followed: Followed| match followed {
            Followed::Progress(entry) => (vec![FollowEvent::Progress(entry)], false),
            Followed::Ended(envelope) => {
                let recorded = recording.as_ref().map(|r| r.take()).unwrap_or_default();
                let mut events: Vec<_> = recorded.into_iter().map(|e| FollowEvent::Recorded(Box::new(e))).collect();
                events.push(FollowEvent::Ended(Box::new(envelope)));
                (events, true)
            }
        };
        let (events, mut last) = match next {
            Some(Ok(followed)) => as_events(followed),
            Some(Err(e)) => (vec![FollowEvent::Failed(remote_error(e))], true),
            None => return,
        };
        let mut batch = Vec::new();
        if !events.into_iter().all(|event| encode_frame(&mut batch, event)) {
            return;
        }
        while !last && batch.len() < STREAM_BATCH_BYTES {
            let Some(followed) = follower.ready() else { break };
            let (events, end) = as_events(followed);
            if !events.into_iter().all(|event| encode_frame(&mut batch, event)) {
                return;
            }
            last = end;
        }
        if write.write_all(&batch).await.is_err() {
            return;
        }
        if last {
            let _ = write.shutdown().await;
            return;
        }
    }
}

/// A follow stream writes what its follower has at hand in one write of at most about
/// this many bytes (one entry more may go over it).
const STREAM_BATCH_BYTES: usize = 256 << 10;

/// A running control server.
pub struct Server {
    accept: tokio::task::JoinHandle<()>,
    in_flight: Arc<std::sync::atomic::AtomicUsize>,
}

impl Server {
    /// Connections being answered now (a subscription counts while it is open).
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(std::sync::atomic::Ordering::SeqCst)
    }

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

/// Serve `service` on `path` until the returned server is drained or dropped, at most
/// [`MAX_CONNECTIONS`] at once; a failed accept is retried after a pause
/// ([`AcceptBackoff`]). A stale socket file (no one listening) is replaced.
pub fn serve(service: Local, path: &Path) -> std::io::Result<Server> {
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
    let any_ns = any_mount_ns();
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
            let service = service.clone();
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let guard = InFlight(counter.clone());
            tokio::spawn(async move {
                let _guard = guard;
                let _slot = slot;
                handle(service, stream, any_ns).await;
            });
        }
    });
    Ok(Server { accept, in_flight })
}
