//! `factory ui`: print (and on a terminal, open) the web dashboard's URL for the daemon that
//! serves HTTP here — `http://ADDR/#token=...`. The token rides in the fragment, which a
//! browser never sends to a server; the page moves it to `sessionStorage` and off the URL.

use super::http::{ADDR_FILE, TOKEN_FILE};
use super::GlobalArgs;
use anyhow::{Context, Result};
use clap::Args;
use std::io::IsTerminal;
use std::process::ExitCode;

#[derive(Args)]
pub struct UiArgs {
    /// Only print the URL; do not start a browser.
    #[arg(long)]
    no_open: bool,
}

pub async fn ui(g: &GlobalArgs, a: UiArgs) -> Result<ExitCode> {
    let not_serving = || {
        format!(
            "no dashboard is served from {}: start `factory serve --http 127.0.0.1:8080` first",
            g.state_dir.display()
        )
    };
    let addr = std::fs::read_to_string(g.state_dir.join(ADDR_FILE)).with_context(not_serving)?;
    let addr: std::net::SocketAddr = addr.trim().parse().with_context(not_serving)?;
    let token = std::fs::read_to_string(g.state_dir.join(TOKEN_FILE)).with_context(not_serving)?;
    // The files outlive a daemon killed with SIGKILL: check that something listens.
    let reachable = tokio::time::timeout(std::time::Duration::from_secs(2), tokio::net::TcpStream::connect(addr)).await;
    if !matches!(reachable, Ok(Ok(_))) {
        anyhow::bail!("{} (nothing listens on {addr})", not_serving());
    }
    // An unspecified bind address is reached through loopback (and the Host check accepts it).
    let shown = if addr.ip().is_unspecified() { std::net::SocketAddr::from(([127, 0, 0, 1], addr.port())) } else { addr };
    let url = format!("http://{shown}/#token={}", token.trim());
    println!("{url}");
    if !a.no_open && std::io::stdout().is_terminal() {
        // xdg-open gets the URL as an argument: visible to local `ps` for a moment, like the
        // token file is to its owner; it is never sent over the network.
        let opened = std::process::Command::new("xdg-open")
            .arg(&url)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
        if opened.is_err() {
            eprintln!("(open the URL above in a browser)");
        }
    }
    Ok(ExitCode::SUCCESS)
}
