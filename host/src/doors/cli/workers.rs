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
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub async fn workers(g: &crate::doors::args::GlobalArgs, a: WorkersArgs) -> Result<ExitCode> {
    let store = match a.store {
        Some(store) => store,
        None => crate::doors::cli::backends::load_config(g, None)?
            .store
            .context("no shared store: give --store, set FACTORY_STORE, or set `store` in the config file")?,
    };
    let workers = factory_host::store::postgres::workers::list(&store).await.context("listing the workers")?;
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
