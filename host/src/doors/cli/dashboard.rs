//! `factory ui`: print (and on a terminal, or with `--open`, open) the web dashboard's URL
//! for the daemon that serves HTTP here — `http://ADDR/#code=...`. The bearer token never
//! leaves this process: it asks the daemon (`POST /api/ui/code`, with the token from the
//! owner-only token file) for a one-time code that lives two minutes, and only that code
//! reaches the browser's command line (which every local user can read in `ps`). The page
//! exchanges the code once for the token and keeps the token off the URL.
//!
//! The browser: the first command in `$BROWSER` (colon-separated, as the convention has it;
//! `%s` in it stands for the URL, else the URL is appended), else `xdg-open`.

use crate::doors::http::{ADDR_FILE, TOKEN_FILE};
use crate::doors::args::GlobalArgs;
use anyhow::{Context, Result};
use clap::Args;
use std::io::IsTerminal;
use std::process::ExitCode;

#[derive(Args)]
pub struct UiArgs {
    /// Only print the URL; do not start a browser.
    #[arg(long, conflicts_with = "open")]
    no_open: bool,
    /// Start the browser even when stdout is not a terminal.
    #[arg(long)]
    open: bool,
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
    // An unspecified bind address is reached through loopback (and the Host check accepts it).
    let shown = if addr.ip().is_unspecified() { std::net::SocketAddr::from(([127, 0, 0, 1], addr.port())) } else { addr };
    // The files outlive a daemon killed with SIGKILL: asking for a code checks that it runs.
    let code = one_time_code(shown, token.trim()).await.with_context(|| format!("{} (nothing answers on {addr})", not_serving()))?;
    let url = format!("http://{shown}/#code={code}");
    outln!("{url}");
    if a.open || (!a.no_open && std::io::stdout().is_terminal()) {
        let opened = browser_command(&url)
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

/// A one-time code from the daemon on `addr`, asked for with `token`.
async fn one_time_code(addr: std::net::SocketAddr, token: &str) -> Result<String> {
    let client = reqwest::Client::builder().timeout(std::time::Duration::from_secs(5)).build()?;
    let response = client.post(format!("http://{addr}/api/ui/code")).bearer_auth(token).send().await?;
    let status = response.status();
    anyhow::ensure!(status.is_success(), "the daemon refused a sign-in code (HTTP {status})");
    /// `POST /api/ui/code`'s answer.
    #[derive(serde::Deserialize)]
    struct Issued {
        code: String,
    }
    let issued: Issued = response.json().await.context("the daemon's answer holds no sign-in code")?;
    anyhow::ensure!(
        !issued.code.is_empty() && issued.code.bytes().all(|b| b.is_ascii_alphanumeric()),
        "the daemon's sign-in code is malformed"
    );
    Ok(issued.code)
}

/// The command that opens `url`: `$BROWSER`'s first entry, else `xdg-open`.
fn browser_command(url: &str) -> std::process::Command {
    let chosen = std::env::var("BROWSER").ok();
    let entry = chosen.as_deref().and_then(|b| b.split(':').map(str::trim).find(|e| !e.is_empty()));
    let words: Vec<&str> = entry.map(|e| e.split_whitespace().collect()).unwrap_or_else(|| vec!["xdg-open"]);
    let mut command = std::process::Command::new(words[0]);
    let mut placed = false;
    for word in &words[1..] {
        if word.contains("%s") {
            command.arg(word.replace("%s", url));
            placed = true;
        } else {
            command.arg(word);
        }
    }
    if !placed {
        command.arg(url);
    }
    command
}
