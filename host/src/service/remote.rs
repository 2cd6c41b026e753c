//! The service over the control socket of the process that holds the store: one request
//! line, one answer line (a subscription: then one line per update). The client checks
//! that the socket's server is this user's before it sends anything, and reads at most
//! [`MAX_RESPONSE_BYTES`] of any line.

use super::wire::{parse_frame, read_line_bounded, Answer, Event, Frame, RemoteError, Request, Response, MAX_RESPONSE_BYTES};
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
        let stream = UnixStream::connect(&self.socket).await.map_err(|source| ClientError::Connect { path: path.clone(), source })?;
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
            .ok_or_else(|| ClientError::Protocol { path: path.clone(), message: format!("answer larger than {MAX_RESPONSE_BYTES} bytes") })?;
        if line.is_empty() {
            return Err(ClientError::Protocol { path, message: "the service closed the connection without answering".into() });
        }
        match parse_frame::<Answer>(&line).map_err(|message| ClientError::Protocol { path, message })? {
            Answer::Ok(response) => Ok(response),
            Answer::Err(e) => Err(ClientError::Remote(e)),
        }
    }

    /// Send one request and read its answer.
    pub async fn call(&self, request: &Request) -> Result<Response, ClientError> {
        let (mut read, _write) = self.send(request).await?;
        self.answer(&mut read).await
    }

    /// Open a subscription to the updates of the runs `scope` sees.
    pub async fn subscribe(&self, scope: Scope) -> Result<Subscription, ClientError> {
        let (mut read, write) = self.send(&Request::Subscribe { scope }).await?;
        match self.answer(&mut read).await? {
            // The write half stays open while we listen: its end tells the service we left.
            Response::Subscribed => Ok(Subscription { read: tokio::io::BufReader::new(read), _write: write, path: self.path() }),
            other => Err(ClientError::Protocol {
                path: self.path(),
                message: format!("a subscription was answered with `{}`", other.kind()),
            }),
        }
    }
}

/// The longest event line of a subscription.
const MAX_EVENT_BYTES: usize = 64 << 10;

/// An open subscription over the socket.
pub struct Subscription {
    read: tokio::io::BufReader<OwnedReadHalf>,
    _write: OwnedWriteHalf,
    path: String,
}

impl Subscription {
    /// The next update; `None` when the service closed the subscription or sent a line
    /// that is not an update (logged).
    pub async fn next(&mut self) -> Option<RunUpdated> {
        use tokio::io::AsyncBufReadExt;
        let mut line = Vec::new();
        loop {
            let chunk = self.read.fill_buf().await.ok()?;
            if chunk.is_empty() {
                return None;
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
            if line.len() > MAX_EVENT_BYTES {
                tracing::warn!("control socket {}: an update line longer than {MAX_EVENT_BYTES} bytes; closing", self.path);
                return None;
            }
        }
        match parse_frame::<Event>(&line) {
            Ok(update) => Some(update),
            Err(e) => {
                tracing::warn!("control socket {}: {e}; closing the subscription", self.path);
                None
            }
        }
    }
}
