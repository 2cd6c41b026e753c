//! `factory ui`: sign a browser in to the web dashboard of the daemon that serves HTTP here,
//! and manage its dashboard sessions. The bearer token never leaves this process: it asks the
//! daemon (`POST /api/ui/code`, with the token from the owner-only token file) for a one-time
//! code that lives two minutes, and writes it into a private file in the state directory,
//! [`SIGN_IN_FILE`] (0600, in the 0700 directory), that sends the browser on to
//! `http://ADDR/#code=...` (as Jupyter does). The browser is started on that file's path, so
//! no command line (which every local user can read in `ps` or `/proc/PID/cmdline`) holds
//! the code. `--url` prints the URL with the code instead, for a browser on another machine.
//! The page exchanges the code once for a dashboard session of its own, which cannot mint
//! codes; `--sessions` lists those sessions and `--revoke ID|all` ends them.
//!
//! The browser: the first command in `$BROWSER` (colon-separated, as the convention has it;
//! `%s` in it stands for the file's `file://` URL, else it is appended), else `xdg-open`.

use crate::doors::args::GlobalArgs;
use crate::doors::cli::escape::esc;
use crate::doors::http::{ADDR_FILE, TOKEN_FILE};
use anyhow::{Context, Result};
use clap::Args;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The sign-in file `factory ui` writes in the state directory.
pub const SIGN_IN_FILE: &str = "dashboard.html";

#[derive(Args)]
pub struct UiArgs {
    /// Only write the sign-in file and print its path; do not start a browser.
    #[arg(long, conflicts_with = "open")]
    no_open: bool,
    /// Start the browser even when stdout is not a terminal.
    #[arg(long)]
    open: bool,
    /// Print a sign-in URL (with its one-time code) instead of writing a file, for a browser
    /// that cannot open files here (e.g. through an SSH tunnel). Open it within two minutes.
    #[arg(long, conflicts_with_all = ["open", "no_open", "sessions", "revoke"])]
    url: bool,
    /// List the live dashboard sessions (id, opened, expires).
    #[arg(long, conflicts_with_all = ["open", "no_open", "revoke"])]
    sessions: bool,
    /// End the dashboard session ID (from --sessions), or `all` of them.
    #[arg(long, value_name = "ID|all", conflicts_with_all = ["open", "no_open"])]
    revoke: Option<String>,
}

/// The largest token or address file read.
const MAX_STATE_FILE_BYTES: usize = 4096;

/// Read a small state file of ours (owner-checked, no symlink followed); `None`: missing.
fn read_state_file(path: &Path) -> Result<Option<String>> {
    let bytes = factory_host::access::read_private_file(path).with_context(|| format!("reading {}", path.display()))?;
    let Some(bytes) = bytes else { return Ok(None) };
    anyhow::ensure!(bytes.len() <= MAX_STATE_FILE_BYTES, "{} is over {MAX_STATE_FILE_BYTES} bytes", path.display());
    Ok(Some(String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8", path.display()))?.trim().to_string()))
}

pub async fn ui(g: &GlobalArgs, a: UiArgs) -> Result<ExitCode> {
    let not_serving = || {
        format!(
            "no dashboard is served from {}: start `factory serve --http 127.0.0.1:8080` first",
            g.state_dir.display()
        )
    };
    let addr = read_state_file(&g.state_dir.join(ADDR_FILE))?.with_context(not_serving)?;
    let addr: std::net::SocketAddr = addr.parse().with_context(not_serving)?;
    let token = read_state_file(&g.state_dir.join(TOKEN_FILE))?.with_context(not_serving)?;
    // An unspecified bind address is reached through loopback (and the Host check accepts it).
    let shown =
        if addr.ip().is_unspecified() { std::net::SocketAddr::from(([127, 0, 0, 1], addr.port())) } else { addr };
    let daemon = Daemon {
        addr: shown,
        token,
        client: reqwest::Client::builder().timeout(std::time::Duration::from_secs(5)).build()?,
    };
    if a.sessions {
        return list_sessions(&daemon).await.with_context(|| format!("{} (nothing answers on {addr})", not_serving()));
    }
    if let Some(id) = a.revoke {
        let revoked = daemon.revoke(&id).await?;
        outln!("revoked {revoked} dashboard session{}", if revoked == 1 { "" } else { "s" });
        return Ok(ExitCode::SUCCESS);
    }
    // The files outlive a daemon killed with SIGKILL: asking for a code checks that it runs.
    let code =
        daemon.one_time_code().await.with_context(|| format!("{} (nothing answers on {addr})", not_serving()))?;
    let url = format!("http://{shown}/#code={code}");
    if a.url {
        outln!("{url}");
        eprintln!("(a one-time sign-in URL: open it within two minutes; keep it off command lines others can read)");
        return Ok(ExitCode::SUCCESS);
    }
    let file = write_sign_in_file(&g.state_dir, &url)?;
    outln!("{}", file.display());
    // Percent-encoded, so a state directory with spaces or `#` in its path still opens.
    let file_url =
        reqwest::Url::from_file_path(&file).map(String::from).unwrap_or_else(|()| format!("file://{}", file.display()));
    if a.open || (!a.no_open && std::io::stdout().is_terminal()) {
        let opened = browser_command(&file_url)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
        if opened.is_err() {
            eprintln!(
                "(open {file_url} in a browser on this machine within two minutes: it signs the browser in once)"
            );
        }
    } else {
        eprintln!(
            "(open {file_url} in a browser on this machine within two minutes: it signs the browser in once; \
             `factory ui --url` prints a URL instead)"
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Write the sign-in page: owner-only, replacing an earlier one (never through a symlink
/// or into someone else's file), that sends the browser on to `url`.
fn write_sign_in_file(state_dir: &Path, url: &str) -> Result<PathBuf> {
    use std::io::Write;
    let path = std::path::absolute(state_dir.join(SIGN_IN_FILE)).context("the state directory's path")?;
    // `url` is `http://ADDR/#code=HEX`: nothing in it needs escaping in an attribute or text.
    let page = format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><meta name=\"referrer\" content=\"no-referrer\">\n\
         <meta http-equiv=\"refresh\" content=\"0;url={url}\">\n<title>factory dashboard</title></head>\n\
         <body><p>Signing in to the <a href=\"{url}\">factory dashboard</a>…</p></body></html>\n"
    );
    let mut file =
        factory_host::access::create_private_file(&path).with_context(|| format!("writing {}", path.display()))?;
    file.write_all(page.as_bytes()).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// The daemon serving HTTP here, reached with the owner's token.
struct Daemon {
    addr: std::net::SocketAddr,
    token: String,
    client: reqwest::Client,
}

/// One dashboard session, as `GET /api/ui/sessions` lists it.
#[derive(serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct SessionInfo {
    id: String,
    created_at: String,
    expires_at: String,
}

impl Daemon {
    /// `method path` with the owner's token; the answer's JSON, or the daemon's error.
    async fn call<T: serde::de::DeserializeOwned>(&self, method: reqwest::Method, path: &str) -> Result<T> {
        let url = format!("http://{}{path}", self.addr);
        let response = self.client.request(method, url).bearer_auth(&self.token).send().await?;
        let status = response.status();
        if !status.is_success() {
            /// An error answer.
            #[derive(serde::Deserialize)]
            struct Refused {
                message: String,
            }
            let message = response.json::<Refused>().await.map(|r| r.message).unwrap_or_default();
            anyhow::bail!("the daemon refused (HTTP {status}): {}", esc(&message));
        }
        response.json().await.context("the daemon's answer is malformed")
    }

    /// A one-time code.
    async fn one_time_code(&self) -> Result<String> {
        /// `POST /api/ui/code`'s answer.
        #[derive(serde::Deserialize)]
        struct Issued {
            code: String,
        }
        let issued: Issued = self.call(reqwest::Method::POST, "/api/ui/code").await?;
        anyhow::ensure!(
            crate::doors::http::bearer::is_code_shaped(&issued.code),
            "the daemon's sign-in code is malformed"
        );
        Ok(issued.code)
    }

    /// End session `id` (or `all`); how many ended.
    async fn revoke(&self, id: &str) -> Result<u64> {
        anyhow::ensure!(
            !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric()),
            "--revoke takes a session id from `factory ui --sessions`, or `all`"
        );
        /// `DELETE /api/ui/sessions/ID`'s answer.
        #[derive(serde::Deserialize)]
        struct Revoked {
            revoked: u64,
        }
        let revoked: Revoked = self.call(reqwest::Method::DELETE, &format!("/api/ui/sessions/{id}")).await?;
        Ok(revoked.revoked)
    }
}

/// `--sessions`: one line per live session.
async fn list_sessions(daemon: &Daemon) -> Result<ExitCode> {
    /// `GET /api/ui/sessions`'s answer.
    #[derive(serde::Deserialize)]
    struct Listed {
        sessions: Vec<SessionInfo>,
    }
    let listed: Listed = daemon.call(reqwest::Method::GET, "/api/ui/sessions").await?;
    if listed.sessions.is_empty() {
        eprintln!("(no dashboard sessions)");
    }
    for s in &listed.sessions {
        outln!("{}  opened {}  expires {}", esc(&s.id), esc(&s.created_at), esc(&s.expires_at));
    }
    Ok(ExitCode::SUCCESS)
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
