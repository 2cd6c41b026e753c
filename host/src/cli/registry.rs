//! `factory add/list/inspect`: register factories by their meta name (component bytes are
//! stored content-addressed), list them, and show what one declares.

use super::context::open_host;
use super::observe::JsonArg;
use super::escape::esc;
use super::{target, GlobalArgs};
use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Args)]
pub struct AddArgs {
    /// A component file or a Rust factory crate directory.
    target: PathBuf,
}

#[derive(Args)]
pub struct InspectArgs {
    /// The registered name.
    name: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

fn host(g: &GlobalArgs) -> Result<Arc<factory_host::Host>> {
    open_host(g, Arc::new(factory_host::backend::BuiltinCatalog))
        .with_context(|| format!("opening the store in {}", g.state_dir.display()))
}

pub async fn add(g: &GlobalArgs, a: AddArgs) -> Result<ExitCode> {
    let host = host(g)?;
    let file = target::resolve(&a.target)?;
    let factory = host.load_file(&file).await.with_context(|| format!("loading {}", file.display()))?;
    let registration = host.register(&factory).await?;
    println!("registered {} (sha256 {})", registration.meta.name, registration.hash);
    Ok(ExitCode::SUCCESS)
}

pub async fn list(g: &GlobalArgs, a: JsonArg) -> Result<ExitCode> {
    let registered = host(g)?.registered()?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&registered)?);
        return Ok(ExitCode::SUCCESS);
    }
    for r in registered {
        let first_line = r.meta.description.lines().next().unwrap_or_default();
        println!("{:<24} {}  {}", esc(&r.meta.name), &r.hash[..12.min(r.hash.len())], esc(first_line));
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn inspect(g: &GlobalArgs, a: InspectArgs) -> Result<ExitCode> {
    let registration = host(g)?
        .store()
        .factory(&a.name)?
        .with_context(|| format!("no factory named `{}` is registered", a.name))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&registration)?);
        return Ok(ExitCode::SUCCESS);
    }
    let m = &registration.meta;
    println!("{}  (sha256 {}, added {})", esc(&m.name), registration.hash, registration.added_at);
    for line in m.description.lines() {
        println!("  {}", esc(line));
    }
    for p in &m.phases {
        let detail = p.detail.as_deref().map(|d| format!(" — {}", esc(d))).unwrap_or_default();
        println!("phase: {}{detail}", esc(&p.title));
    }
    println!("limits: {}", serde_json::to_string(&m.limits)?);
    if let Some(schema) = &m.args_schema {
        println!("args schema: {schema}");
    }
    Ok(ExitCode::SUCCESS)
}
