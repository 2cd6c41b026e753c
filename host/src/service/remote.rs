//! The service over the control socket of the process that holds the store: one request
//! line, one answer line (a subscription: then one line per update). The client checks
//! that the socket's server is this user's before it sends anything, and reads at most
//! [`MAX_RESPONSE_BYTES`] of any line.

use super::wire::{
    parse_frame, read_line_bounded, Answer, Event, FollowEvent, Frame, RemoteError, Request, Response,
    MAX_RESPONSE_BYTES,
};
use crate::model::scope::Scope;
use crate::RunUpdated;
use std::path::{Path, PathBuf};
use tokio::io::AsyncWriteExt;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;

/// Why a request over the control socket failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nobody answers on the socket.
    #[error("cannot reach the factory service ({path}): {source}")]
    Connect {
        /// The socket.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The process listening on the socket is not this user's: nothing is sent to it.
    #[error("the control socket {path} is served by uid {uid}, not by us (uid {ours}); refusing to talk to it")]
    NotOurs {
        /// The socket.
        path: String,
        /// The server's uid.
        uid: u32,
        /// Ours.
        ours: u32,
    },
    /// The exchange broke.
    #[error("control socket {path}: {source}")]
    Io {
        /// The socket.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The answer was not understood (another version, a line too long, not JSON).
    #[error("control socket {path}: {message}")]
    Protocol {
        /// The socket.
        path: String,
        /// What was wrong with it.
        message: String,
    },
    /// The service closed a stream before its last event (it stopped or was killed).
    #[error("control socket {path}: the service went away mid-stream")]
    Disconnected {
        /// The socket.
        path: String,
    },
    /// The service answered with an error.
    #[error(transparent)]
    Remote(#[from] RemoteError),
}

/// The service of the process answering on a control socket.
#[derive(Debug, Clone)]
pub struct Remote {
    socket: PathBuf,
}

impl Remote {
    /// The service answering on `socket`.
    pub fn new(socket: PathBuf) -> Self {
        Remote { socket }
    }

    /// The socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    fn path(&self) -> String {
        self.socket.display().to_string()
    }

    /// Connect, check the server is ours, send `request`; the stream to read answers from.
    async fn send(&self, request: &Request) -> Result<(OwnedReadHalf, OwnedWriteHalf), ClientError> {
        let path = self.path();
        let stream = UnixStream::connect(&self.socket)
            .await
            .map_err(|source| ClientError::Connect { path: path.clone(), source })?;
        // The server checks us; we check the server: a socket planted by another user gets
        // neither our requests nor our consent.
        let ours = crate::access::our_uid();
        match stream.peer_cred() {
            Ok(cred) if cred.uid() == ours => {}
            Ok(cred) => return Err(ClientError::NotOurs { path, uid: cred.uid(), ours }),
            Err(source) => return Err(ClientError::Connect { path, source }),
        }
        let (read, mut write) = stream.into_split();
        let mut bytes = serde_json::to_vec(&Frame::new(request))
            .map_err(|e| ClientError::Protocol { path: path.clone(), message: e.to_string() })?;
        bytes.push(b'\n');
        write.write_all(&bytes).await.map_err(|source| ClientError::Io { path: path.clone(), source })?;
        Ok((read, write))
    }

    /// Read one answer line.
    async fn answer(&self, read: &mut OwnedReadHalf) -> Result<Response, ClientError> {
        let path = self.path();
        let line = read_line_bounded(read, MAX_RESPONSE_BYTES)
            .await
            .map_err(|source| ClientError::Io { path: path.clone(), source })?
            .ok_or_else(|| ClientError::Protocol {
                path: path.clone(),
                message: format!("answer larger than {MAX_RESPONSE_BYTES} bytes"),
            })?;
        self.parse_answer(&line)
    }

    /// An answer line, parsed.
    fn parse_answer(&self, line: &[u8]) -> Result<Response, ClientError> {
        let path = self.path();
        if line.is_empty() {
            return Err(ClientError::Protocol {
                path,
                message: "the service closed the connection without answering".into(),
            });
        }
        match parse_frame::<Answer>(line).map_err(|message| ClientError::Protocol { path, message })? {
            Answer::Ok(response) => Ok(response),
            Answer::Err(e) => Err(ClientError::Remote(e)),
        }
    }

    /// Send a stream's request and read its first answer through the stream's own buffer
    /// (events may arrive in the same read as the answer).
    async fn open_stream(&self, request: &Request, limit: usize) -> Result<(Lines, Response), ClientError> {
        let (read, write) = self.send(request).await?;
        let mut lines = Lines::new(read, write, self.path(), limit.max(MAX_ANSWER_LINE));
        let first = match lines.next().await {
            Ok(line) => line,
            Err(LineEnd::Closed) => Vec::new(),
            Err(LineEnd::Broken(message)) => return Err(ClientError::Protocol { path: self.path(), message }),
        };
        let response = self.parse_answer(&first)?;
        lines.limit = limit;
        Ok((lines, response))
    }

    /// Send one request and read its answer.
    pub async fn call(&self, request: &Request) -> Result<Response, ClientError> {
        let (mut read, _write) = self.send(request).await?;
        self.answer(&mut read).await
    }

    /// Open a subscription to the updates of the runs `scope` sees.
    pub async fn subscribe(&self, scope: Scope) -> Result<Subscription, ClientError> {
        match self.open_stream(&Request::Subscribe { scope }, MAX_EVENT_BYTES).await? {
            (lines, Response::Subscribed) => Ok(Subscription { lines }),
            (_, other) => Err(self.unexpected("subscription", &other)),
        }
    }

    /// Follow `run_id` as `scope` sees it, from the entry after `after_seq`: one connection
    /// that streams the run's progress and then its terminal envelope.
    pub async fn follow(&self, scope: Scope, run_id: &str, after_seq: u64) -> Result<FollowStream, ClientError> {
        let request = Request::Follow { scope, run_id: run_id.to_string(), after_seq };
        match self.open_stream(&request, MAX_RESPONSE_BYTES as usize).await? {
            (lines, Response::Following) => Ok(FollowStream { lines }),
            (_, other) => Err(self.unexpected("follow", &other)),
        }
    }

    /// Start a run or a resume (`start`) and follow it on one connection: its id, and the
    /// stream of its progress from the first entry, then its envelope.
    pub async fn start_following(&self, start: Request) -> Result<(String, FollowStream), ClientError> {
        let request = Request::StartFollowing { start: Box::new(start) };
        match self.open_stream(&request, MAX_RESPONSE_BYTES as usize).await? {
            (lines, Response::Started { run_id }) => Ok((run_id, FollowStream { lines })),
            (_, other) => Err(self.unexpected("started follow", &other)),
        }
    }

    fn unexpected(&self, what: &str, got: &Response) -> ClientError {
        ClientError::Protocol { path: self.path(), message: format!("a {what} was answered with `{}`", got.kind()) }
    }
}

/// The longest event line of a subscription.
const MAX_EVENT_BYTES: usize = 64 << 10;

/// The longest first answer of a stream (an error's message included).
const MAX_ANSWER_LINE: usize = 1 << 20;

/// The lines of a stream the service sends on one connection, each at most `limit` bytes.
/// The write half stays open while we read: its end tells the service we left.
struct Lines {
    read: tokio::io::BufReader<OwnedReadHalf>,
    _write: OwnedWriteHalf,
    path: String,
    limit: usize,
}

/// Why a stream's next line is missing.
enum LineEnd {
    /// The service closed the stream.
    Closed,
    /// The line is longer than the stream's limit, or the read failed.
    Broken(String),
}

impl Lines {
    fn new(read: OwnedReadHalf, write: OwnedWriteHalf, path: String, limit: usize) -> Self {
        Lines { read: tokio::io::BufReader::new(read), _write: write, path, limit }
    }

    /// The next line, without its newline.
    async fn next(&mut self) -> Result<Vec<u8>, LineEnd> {
        use tokio::io::AsyncBufReadExt;
        let mut line = Vec::new();
        loop {
            let chunk = self.read.fill_buf().await.map_err(|e| LineEnd::Broken(e.to_string()))?;
            if chunk.is_empty() {
                return Err(LineEnd::Closed);
            }
            match chunk.iter().position(|b| *b == b'\n') {
                Some(at) => {
                    line.extend_from_slice(&chunk[..at]);
                    self.read.consume(at + 1);
                    break;
                }
                None => {
                    let n = chunk.len();
                    line.extend_from_slice(chunk);
                    self.read.consume(n);
                }
            }
            if line.len() > self.limit {
                return Err(LineEnd::Broken(format!("a line longer than {} bytes", self.limit)));
            }
        }
        if line.len() > self.limit {
            return Err(LineEnd::Broken(format!("a line longer than {} bytes", self.limit)));
        }
        Ok(line)
    }
}

/// An open subscription over the socket.
pub struct Subscription {
    lines: Lines,
}

impl Subscription {
    /// The next update; `None` when the service closed the subscription or sent a line
    /// that is not an update (logged).
    pub async fn next(&mut self) -> Option<RunUpdated> {
        let line = match self.lines.next().await {
            Ok(line) => line,
            Err(LineEnd::Closed) => return None,
            Err(LineEnd::Broken(why)) => {
                tracing::warn!("control socket {}: {why}; closing the subscription", self.lines.path);
                return None;
            }
        };
        match parse_frame::<Event>(&line) {
            Ok(update) => Some(update),
            Err(e) => {
                tracing::warn!("control socket {}: {e}; closing the subscription", self.lines.path);
                None
            }
        }
    }
}

/// An open follow stream over the socket ([`Remote::follow`]).
pub struct FollowStream {
    lines: Lines,
}

impl FollowStream {
    /// The control socket it reads.
    pub fn path(&self) -> &str {
        &self.lines.path
    }

    /// The next event. A stream the service closes before its last event (an envelope or
    /// a failure) is [`ClientError::Disconnected`].
    pub async fn next(&mut self) -> Result<FollowEvent, ClientError> {
        let line = match self.lines.next().await {
            Ok(line) => line,
            Err(LineEnd::Closed) => return Err(ClientError::Disconnected { path: self.lines.path.clone() }),
            Err(LineEnd::Broken(message)) => {
                return Err(ClientError::Protocol { path: self.lines.path.clone(), message })
            }
        };
        parse_frame::<FollowEvent>(&line)
            .map_err(|message| ClientError::Protocol { path: self.lines.path.clone(), message })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::envelope::{Accounting, RunEnvelope, RunStatus};
    use crate::model::progress::ProgressEvent;
    use crate::ProgressEntry;
    use tokio::io::AsyncReadExt;

    fn line<T: serde::Serialize>(body: T) -> Vec<u8> {
        let mut bytes = serde_json::to_vec(&Frame::new(body)).unwrap();
        bytes.push(b'\n');
        bytes
    }

    /// A server that answers a stream's request with its answer and every event in one
    /// write (as a fast service does): the client must lose none of them to the buffer it
    /// read the answer with.
    #[tokio::test]
    async fn a_follow_stream_whose_answer_and_events_arrive_in_one_read_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("control.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let envelope = RunEnvelope {
            run_id: "r".into(),
            factory: "f".into(),
            status: RunStatus::Completed,
            result: None,
            failure: None,
            error: None,
            accounting: Accounting::default(),
            attempts: 1,
            backend: None,
            resume_at: None,
            checkpoint: None,
            session: None,
            created_at: String::new(),
            updated_at: String::new(),
            revision: 3,
        };
        let mut all = line(Answer::Ok(Response::Following));
        for seq in 1..=3 {
            let entry = ProgressEntry {
                seq,
                at_ms: 0,
                phase: None,
                event: ProgressEvent::Log { message: format!("line {seq}"), level: Default::default() },
            };
            all.extend(line(FollowEvent::Progress(entry)));
        }
        all.extend(line(FollowEvent::Ended(Box::new(envelope.clone()))));
        let server = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut request = vec![0u8; 4096];
            let n = stream.read(&mut request).await.unwrap();
            assert!(String::from_utf8_lossy(&request[..n]).contains(r#""op":"follow""#));
            stream.write_all(&all).await.unwrap();
        });
        let mut stream = Remote::new(socket).follow(Scope::Owner, "r", 0).await.unwrap();
        for seq in 1..=3 {
            match stream.next().await.unwrap() {
                FollowEvent::Progress(entry) => assert_eq!(entry.seq, seq),
                other => panic!("{other:?}"),
            }
        }
        match stream.next().await.unwrap() {
            FollowEvent::Ended(ended) => assert_eq!(*ended, envelope),
            other => panic!("{other:?}"),
        }
        assert!(matches!(stream.next().await, Err(ClientError::Disconnected { .. })));
        server.await.unwrap();
    }
}
