//! `--http ADDR` / `--http-any-address`, shared by `factory serve` and `factory mcp`: where
//! an HTTP server listens, loopback unless the user says otherwise.

use clap::Args;
use std::net::SocketAddr;

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
