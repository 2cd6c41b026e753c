//! `factory add/list/inspect`: register factories by their meta name (component bytes are
//! stored content-addressed), list them, and show what one declares.

use crate::doors::args::GlobalArgs;
use crate::doors::cli::escape::esc;
use crate::doors::cli::observe::JsonArg;
use crate::doors::cli::target;
use crate::doors::reach::ask;
use anyhow::{Context, Result};
use clap::Args;
use factory_host::service::Source;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub struct AddArgs {
    /// A component file, a script factory (`.js`, `.ts`: every factory it offers, or
    /// `file.js#name` for one), a Rust factory crate directory, or an authoring document (`.json`: `{ "meta": {...}, "run": "async (ctx) => ..." }`).
    #[arg(required_unless_present_all = ["meta", "run"], conflicts_with_all = ["meta", "run"])]
    target: Option<PathBuf>,
    /// Authoring form: the factory's meta as a JSON file (with --run).
    #[arg(long, value_name = "FILE", requires = "run")]
    meta: Option<PathBuf>,
    /// Authoring form: a file holding the `run` body, one self-contained async function
    /// expression such as `async ({ args, agent, phase }) => { ... }` (with --meta).
    #[arg(long, value_name = "FILE", requires = "meta")]
    run: Option<PathBuf>,
    /// Where bubblewrap cannot confine the build of a crate directory, build it natively
    /// (its build.rs and proc macros run as you) without asking.
    #[arg(long)]
    yes: bool,
}

#[derive(Args)]
pub struct InspectArgs {
    /// The registered name.
    name: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub async fn add(g: &GlobalArgs, a: AddArgs) -> Result<ExitCode> {
    let read = |p: &PathBuf| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()));
    let (source, authored) = match (&a.target, &a.meta, &a.run) {
        (_, Some(meta), Some(run)) => {
            let meta: serde_json::Value =
                serde_json::from_str(&read(meta)?).with_context(|| format!("{} is not JSON", meta.display()))?;
            (Source::Authored { meta, run: read(run)? }, true)
        }
        (Some(document), _, _) if document.extension().is_some_and(|e| e == "json") => {
            (Source::Document(read(document)?), true)
        }
        (Some(target), _, _) => {
            // A crate is built here (with consent), then the service loads the component.
            let file = target::resolve(target, &target::BuildConsent::new(g, a.yes))?;
            (Source::File(std::path::absolute(&file)?), false)
        }
        _ => anyhow::bail!("give a factory to add, or --meta FILE --run FILE"),
    };
    // A script that offers several factories (no `#name`): each is registered, as `file#name`.
    let sources = match &source {
        Source::File(path) if factory_host::script::is_script(path) && path.exists() => {
            let host = factory_host::Host::new(factory_host::HostConfig::default())?;
            let names = host.script_factories(path).await.with_context(|| format!("loading {}", path.display()))?;
            match names.len() {
                0 | 1 => vec![source.clone()],
                _ => {
                    names.iter().map(|name| Source::File(PathBuf::from(format!("{}#{name}", path.display())))).collect()
                }
            }
        }
        _ => vec![source.clone()],
    };
    for source in &sources {
        let registration = ask(g, |client| async move { client.register(source.clone()).await }).await?;
        if authored {
            trust_authored(g, &registration);
        }
        print_registered(&registration);
    }
    Ok(ExitCode::SUCCESS)
}

/// `registered NAME (...)`.
fn print_registered(registration: &factory_host::store::Registration) {
    match &registration.script {
        Some(script) => outln!(
            "registered {} (source sha256 {}, JS runner sha256 {})",
            esc(&registration.meta.name),
            script.sha256,
            registration.hash
        ),
        None => outln!("registered {} (sha256 {})", esc(&registration.meta.name), registration.hash),
    }
}

/// A factory authored here is the user's own source, like a crate built here: trusted.
fn trust_authored(g: &GlobalArgs, registration: &factory_host::store::Registration) {
    if let Some(script) = &registration.script {
        target::remember_source(&script.sha256, &script.file_name);
        crate::doors::cli::trust::remember_built(g);
    }
}

pub async fn list(g: &GlobalArgs, a: JsonArg) -> Result<ExitCode> {
    let registered = ask(g, |client| async move { client.factories(&g.session).await }).await?;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&registered)?);
        return Ok(ExitCode::SUCCESS);
    }
    for r in registered {
        let first_line = r.meta.description.lines().next().unwrap_or_default();
        outln!("{:<24} {}  {}", esc(&r.meta.name), &r.hash[..12.min(r.hash.len())], esc(first_line));
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn inspect(g: &GlobalArgs, a: InspectArgs) -> Result<ExitCode> {
    let name = a.name.as_str();
    let registration = ask(g, |client| async move { client.inspect(&g.session, name).await }).await?;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&registration)?);
        return Ok(ExitCode::SUCCESS);
    }
    let m = &registration.meta;
    outln!("{}  (sha256 {}, added {})", esc(&m.name), registration.hash, registration.added_at);
    for line in m.description.lines() {
        outln!("  {}", esc(line));
    }
    for p in &m.phases {
        let detail = p.detail.as_deref().map(|d| format!(" — {}", esc(d))).unwrap_or_default();
        outln!("phase: {}{detail}", esc(&p.title));
    }
    outln!("limits: {}", serde_json::to_string(&m.limits)?);
    if let Some(schema) = &m.args_schema {
        outln!("args schema: {schema}");
    }
    Ok(ExitCode::SUCCESS)
}
