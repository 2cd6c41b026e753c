//! `factory workers --store postgres://...`: the workers of a shared store, their leases and
//! the runs each owns (read without registering as a worker). The URL is shown redacted.

use anyhow::{Context, Result};
use clap::Args;
use std::process::ExitCode;

#[derive(Args)]
pub struct WorkersArgs {
    /// The shared store (postgres://USER[:PASSWORD]@HOST:PORT/DB); else `FACTORY_STORE`,
    /// else the config file's `store` key.
    #[arg(long, env = "FACTORY_STORE", value_name = "URL")]
    store: Option<String>,
    /// Read the database password from this file (readable by its owner only); else
    /// `PGPASSWORD`, else `~/.pgpass` (or `PGPASSFILE`).
    #[arg(long, env = "FACTORY_STORE_PASSWORD_FILE", value_name = "FILE")]
    store_password_file: Option<std::path::PathBuf>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub async fn workers(g: &crate::doors::args::GlobalArgs, a: WorkersArgs) -> Result<ExitCode> {
    let store = match a.store.clone() {
        Some(store) => store,
        None => crate::doors::cli::backends::load_config(g, None)?
            .store
            .context("no shared store: give --store, set FACTORY_STORE, or set `store` in the config file")?,
    };
    let password = store_password(&store, a.store_password_file.as_deref(), a.store.is_some())?;
    let workers = factory_host::store::postgres::workers::list(&store, password.as_deref())
        .await
        .context("listing the workers")?;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&workers)?);
        return Ok(ExitCode::SUCCESS);
    }
    if workers.is_empty() {
        outln!("no workers on {}", factory_host::store::postgres::redact(&store));
        return Ok(ExitCode::SUCCESS);
    }
    outln!("{:<28} {:<20} {:>8} {:>5} {:>14} {:>5}", "WORKER", "HOST", "PID", "GEN", "LEASE", "RUNS");
    for w in workers {
        let lease = if w.live { format!("{:.1}s left", w.lease_seconds) } else { "expired".to_string() };
        outln!("{:<28} {:<20} {:>8} {:>5} {:>14} {:>5}", w.id, w.host, w.pid, w.generation, lease, w.runs);
    }
    Ok(ExitCode::SUCCESS)
}

/// The password of the store `url` from `file` (`--store-password-file`: owner-only, its
/// first line), when given; `None` leaves it to the URL, `PGPASSWORD` or `~/.pgpass`. A
/// password in a URL given on the command line (`flag`, not `FACTORY_STORE`) is warned about:
/// other local users can read a process's arguments.
pub fn store_password(url: &str, file: Option<&std::path::Path>, flag: bool) -> Result<Option<String>> {
    let from_env = std::env::var("FACTORY_STORE").is_ok_and(|v| v == url);
    if flag && !from_env && factory_host::store::postgres::url::has_password(url) {
        eprintln!(
            "factory: warning: the --store URL holds a password, which other local users can read in the process \
             list; give it with --store-password-file FILE, PGPASSWORD or ~/.pgpass instead"
        );
    }
    let Some(path) = file else { return Ok(None) };
    let text = crate::doors::http::bearer::read_secret_file(path, "password file")?;
    let password = text.lines().next().unwrap_or_default().to_string();
    anyhow::ensure!(!password.is_empty(), "the password file {} is empty", path.display());
    Ok(Some(password))
}
