//! `factory describe`: a factory's metadata, content hash, imports, and the sandbox limits
//! it would run under, as text or `--json`. It never builds a Rust crate (see
//! [`target::resolve_built`]).

use crate::doors::cli::escape::esc;
use crate::doors::cli::target;
use anyhow::{Context, Result};
use clap::Args;
use factory_host::{Host, HostConfig};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub struct DescribeArgs {
    /// A component file (`.wasm`), a script factory (`.js`, `.ts`; `file.js#name`) or a Python
    /// factory (a crate directory is not built here: `factory build DIR` first).
    target: PathBuf,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub async fn describe(a: DescribeArgs) -> Result<ExitCode> {
    let host = Host::new(HostConfig::default())?;
    let path = target::resolve_built(&a.target, "describe")?;
    let factory = host.load_file(&path).await.with_context(|| format!("loading {}", path.display()))?;
    let meta = &factory.meta;
    if a.json {
        let out = serde_json::json!({
            "meta": meta,
            "sha256": factory.component.hash,
            "script": factory.component.script.as_ref().map(|s| s.reference()),
            "imports": factory.component.imports,
            "sandbox": host.sandbox_limits(),
        });
        outln!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(ExitCode::SUCCESS);
    }
    outln!("{}", esc(&meta.name));
    for line in meta.description.lines() {
        outln!("  {}", esc(line));
    }
    match &factory.component.script {
        Some(script) => {
            outln!("sha256:  {} (source {})", script.hash, esc(&script.file_name));
            outln!("runner:  {} (the built-in JS runner)", factory.component.hash);
        }
        None => outln!("sha256:  {}", factory.component.hash),
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
    for import in &factory.component.imports {
        outln!("  {}", esc(import));
    }
    let s = host.sandbox_limits();
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
