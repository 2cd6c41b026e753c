//! `--http ADDR` / `--http-any-address`, shared by `factory serve` and `factory mcp`: where
//! an HTTP server listens, loopback unless the user says otherwise, and how it holds up
//! against clients that connect and then stall: every connection must finish its request
//! headers within [`HEADER_READ_TIMEOUT`] (which also bounds an idle keep-alive connection)
//! and its body within [`BODY_READ_TIMEOUT`], at most [`MAX_CONNECTIONS`] are served at once (more wait in the kernel's listen queue
//! until one ends), each reading into at most [`MAX_READ_BUFFER`] bytes, and a failed accept
//! (out of descriptors) is retried after a pause.

use clap::Args;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// How long a connection may take to send a request's headers, counted from when the
/// server is ready to read them: from the connection's start, and again after each answer
/// (so it is also the keep-alive idle limit). A slow or silent client is then closed.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a request body may take to arrive once its headers have (a client trickling it
/// is answered 408 and its connection closed).
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The most connections one HTTP server serves at once. Beyond it the server stops
/// accepting until one ends: new clients wait in the kernel's listen queue (none is
/// refused), and a stalled one frees its slot after [`HEADER_READ_TIMEOUT`] at the latest.
pub const MAX_CONNECTIONS: usize = 256;

/// The most bytes a connection's read buffer holds (request headers must fit in it): with
/// [`MAX_CONNECTIONS`], it bounds what clients that send and stall can make the server hold.
pub const MAX_READ_BUFFER: usize = 64 << 10;

/// An HTTP/1 connection builder with the timeouts and the buffer cap above.
pub fn http1() -> hyper::server::conn::http1::Builder {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_READ_BUFFER)
        .keep_alive(true);
    builder
}

/// Accept connections on `listener` for ever, each handed to `connection` in a task of its
/// own while it holds one of [`MAX_CONNECTIONS`] slots. `what` names the server in logs.
pub async fn accept_loop<F, Fut>(listener: tokio::net::TcpListener, what: &'static str, connection: F)
where
    F: Fn(tokio::net::TcpStream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut backoff = crate::doors::control::AcceptBackoff::default();
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        match listener.accept().await {
            Ok((stream, _)) => {
                backoff.accepted();
                let served = connection(stream);
                tokio::spawn(async move {
                    served.await;
                    drop(slot);
                });
            }
            Err(e) => backoff.failed(what, &e).await,
        }
    }
}

/// Where to serve HTTP, if at all.
#[derive(Args, Debug, Clone)]
pub struct HttpBindArgs {
    /// Serve over HTTP on ADDR (loopback, e.g. 127.0.0.1:8080; port 0 picks one). Every
    /// request needs the bearer token the server writes into the state directory.
    #[arg(long, value_name = "ADDR")]
    pub http: Option<SocketAddr>,
    /// Allow --http on an address that is not loopback (anyone who can reach it and has the
    /// token can drive your runs).
    #[arg(long, requires = "http")]
    pub http_any_address: bool,
}

impl HttpBindArgs {
    /// The address to serve, refused when it is not loopback and `--http-any-address` was
    /// not given.
    pub fn address(&self) -> anyhow::Result<Option<SocketAddr>> {
        match self.http {
            Some(addr) if !addr.ip().is_loopback() && !self.http_any_address => {
                anyhow::bail!("--http {addr} is not a loopback address; add --http-any-address to serve it anyway")
            }
            other => Ok(other),
        }
    }
}
