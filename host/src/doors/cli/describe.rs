//! `factory describe`: a factory's metadata, content hash, imports, and the sandbox limits
//! it would run under, as text or `--json`. It asks the service ([`Request::Describe`]):
//! the one answering on the state directory's socket, which loads the file as it would for
//! a run and answers with its own sandbox limits, or else one in this process over a
//! private in-memory host; a bare name that is no file names a registered factory, which the
//! service holding the store describes. It never builds a Rust crate (see
//! [`target::resolve_built`]).
//!
//! [`Request::Describe`]: factory_host::service::Request::Describe

use crate::doors::args::GlobalArgs;
use crate::doors::cli::escape::esc;
use crate::doors::cli::target;
use crate::doors::reach;
use anyhow::{Context, Result};
use clap::Args;
use factory_host::service::Target;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub struct DescribeArgs {
    /// A component file (`.wasm`), a script factory (`.js`, `.ts`; `file.js#name`), a Python
    /// factory (a crate directory is not built here: `factory build DIR` first), or the name
    /// of a registered factory (a bare name that is no file).
    target: PathBuf,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub async fn describe(g: &GlobalArgs, a: DescribeArgs) -> Result<ExitCode> {
    let named = a.target.to_string_lossy().to_string();
    let registered = matches!(target::classify(&named), target::Named::Registered(_)) && !a.target.exists();
    let description = if registered {
        let describe = |client: factory_host::service::Client| {
            let component = Target::Registered(named.clone());
            async move { client.describe(&g.session, component).await }
        };
        reach::ask(g, describe).await?
    } else {
        let path = std::path::absolute(target::resolve_built(&a.target, "describe")?)?;
        let client = reach::serving_or_private(g).await?;
        client
            .describe(&g.session, Target::File(path.clone()))
            .await
            .with_context(|| format!("loading {}", path.display()))?
    };
    let meta = &description.meta;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&description)?);
        return Ok(ExitCode::SUCCESS);
    }
    outln!("{}", esc(&meta.name));
    for line in meta.description.lines() {
        outln!("  {}", esc(line));
    }
    match &description.script {
        Some(script) => {
            outln!("sha256:  {} (source {})", script.sha256, esc(&script.file_name));
            outln!("runner:  {} (the built-in JS runner)", description.sha256);
        }
        None => outln!("sha256:  {}", description.sha256),
    }
    let phases: Vec<_> = meta.phases.iter().map(|p| esc(&p.title)).collect();
    outln!("phases:  {}", if phases.is_empty() { "-".into() } else { phases.join(", ") });
    let limits = serde_json::to_value(meta.limits)?;
    let limits = limits.as_object().map(|m| m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" "));
    outln!("limits:  {}", limits.filter(|s| !s.is_empty()).unwrap_or_else(|| "none declared".into()));
    if let Some(schema) = &meta.args_schema {
        outln!("args:    {schema}");
    }
    outln!("imports:");
    for import in &description.imports {
        outln!("  {}", esc(import));
    }
    let s = &description.sandbox;
    outln!(
        "sandbox: memory {} MiB, fuel {}, prompt <= {} KiB, step <= {} MiB, result <= {} MiB, {} log lines",
        s.memory_bytes >> 20,
        s.fuel,
        s.max_prompt_bytes >> 10,
        s.max_step_bytes >> 20,
        s.max_result_bytes >> 20,
        s.max_log_lines
    );
    outln!("bounds:  {}", s.bounds_line());
    Ok(ExitCode::SUCCESS)
}
