//! `factory runs/show/progress/wait/cancel`: observe and control runs, through the store
//! when this process can open it, or through the control socket of the process holding it.

use super::context::access;
use super::GlobalArgs;
use anyhow::Result;
use clap::Args;
use factory_host::control::Request;
use factory_host::store::ProgressQuery;
use serde_json::Value;
use std::process::ExitCode;

#[derive(Args)]
pub struct JsonArg {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct RunIdArgs {
    /// The run id.
    run_id: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct ProgressArgs {
    /// The run id.
    run_id: String,
    /// Entries after this seq, oldest first.
    #[arg(long, value_name = "N")]
    after_seq: Option<u64>,
    /// Entries before this seq (the page ending just before it).
    #[arg(long, value_name = "N")]
    before_seq: Option<u64>,
    /// Only entries of this phase (its title).
    #[arg(long, value_name = "TITLE")]
    phase: Option<String>,
    /// Page size (default 50, at most 1000).
    #[arg(long, value_name = "N")]
    limit: Option<usize>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Answer `request` locally or through the holder of the store.
async fn ask(g: &GlobalArgs, request: Request) -> Result<Value> {
    access(g).await?.ask(request).await
}

/// A field for human output; strings (guest-chosen names, labels, messages) escaped.
fn s(v: &Value) -> String {
    match v {
        Value::String(s) => super::escape::esc(s).into_owned(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

fn credits(v: &Value) -> String {
    format!("{}", v.as_u64().unwrap_or(0) as f64 / 1e9)
}

pub async fn runs(g: &GlobalArgs, a: JsonArg) -> Result<ExitCode> {
    let runs = ask(g, Request::Runs { session: g.session.clone() }).await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&runs)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("{:<36}  {:<20}  {:<9}  {:>8}  {:>6}  {:>9}  CREATED", "RUN", "FACTORY", "STATUS", "ATTEMPTS", "AGENTS", "CREDITS");
    for r in runs.as_array().into_iter().flatten() {
        println!(
            "{:<36}  {:<20}  {:<9}  {:>8}  {:>6}  {:>9}  {}",
            s(&r["runId"]),
            s(&r["factory"]),
            s(&r["status"]),
            s(&r["attempts"]),
            s(&r["accounting"]["agentsSpawned"]),
            credits(&r["accounting"]["aiCreditsNano"]),
            s(&r["createdAt"])
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn print_entry(e: &Value) {
    let mut detail = e.clone();
    if let Some(obj) = detail.as_object_mut() {
        for k in ["seq", "atMs", "phase", "event"] {
            obj.remove(k);
        }
    }
    let phase = e["phase"].as_str().map(|p| format!("[{}] ", super::escape::esc(p))).unwrap_or_default();
    println!("{:>6}  {phase}{} {}", s(&e["seq"]), s(&e["event"]), detail);
}

pub async fn show(g: &GlobalArgs, a: RunIdArgs) -> Result<ExitCode> {
    let d = ask(g, Request::Detail { session: g.session.clone(), run_id: a.run_id }).await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&d)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("run:       {}", s(&d["runId"]));
    println!("factory:   {}", s(&d["factory"]));
    println!("status:    {} (attempt {}, revision {})", s(&d["status"]), s(&d["attempts"]), s(&d["revision"]));
    if let Some(f) = d.get("failure") {
        println!("failure:   {} {} {}", s(&f["type"]), f.get("kind").map(s).unwrap_or_default(), s(&f["message"]));
    }
    let acc = &d["accounting"];
    println!(
        "spent:     {} agents spawned, {} replayed, {:.2}s active, {} AI credits",
        s(&acc["agentsSpawned"]),
        s(&acc["agentCacheHits"]),
        acc["activeSeconds"].as_f64().unwrap_or(0.0),
        credits(&acc["aiCreditsNano"])
    );
    println!("limits:    {}", d["limits"]);
    let backends: Vec<String> = d["backends"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, b)| {
            let model = b.get("model").map(|m| format!(" model {}", s(m))).unwrap_or_default();
            let config = b["config"].as_str().map(|c| format!(" config {}", &c[..c.len().min(12)])).unwrap_or_default();
            let key = b.get("keyEnv").map(|k| format!(" key from ${}", s(k))).unwrap_or_default();
            format!("attempt {}: {}{model}{config}{key}", i + 1, s(&b["name"]))
        })
        .collect();
    println!("backend:   {}", if backends.is_empty() { "(not recorded)".to_string() } else { backends.join("; ") });
    let sb = &d["sandbox"];
    println!(
        "sandbox:   memory {} MiB, fuel {}, prompt <= {} KiB, step <= {} MiB, result <= {} MiB",
        sb["memoryBytes"].as_u64().unwrap_or(0) >> 20,
        s(&sb["fuel"]),
        sb["maxPromptBytes"].as_u64().unwrap_or(0) >> 10,
        sb["maxStepBytes"].as_u64().unwrap_or(0) >> 20,
        sb["maxResultBytes"].as_u64().unwrap_or(0) >> 20
    );
    // An older server's form lacks the newer fields: they read as this build's defaults.
    if let Ok(limits) = serde_json::from_value::<factory_host::sandbox::SandboxLimits>(sb.clone()) {
        println!("bounds:    {}", limits.bounds_line());
    }
    let grants: Vec<String> = d["grants"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, dir)| format!("{} (read-only, as {})", s(dir), factory_host::sandbox::grant_mount_point(i)))
        .collect();
    println!("grants:    {}", if grants.is_empty() { "none".to_string() } else { grants.join(", ") });
    let phases: Vec<String> = d["phases"].as_array().into_iter().flatten().map(s).collect();
    println!("phases:    {}", phases.join(" > "));
    if let Some(result) = d.get("result") {
        println!("result:    {result}");
    }
    let agents = d["agents"].as_array().cloned().unwrap_or_default();
    println!("agents:    {}", agents.len());
    for agent in agents.iter().rev().take(20).rev() {
        println!(
            "  {:<40} {:<7} spawns {} credits {} {} ms",
            s(&agent["label"]),
            s(&agent["status"]),
            s(&agent["spawns"]),
            credits(&agent["creditsNano"]),
            s(&agent["millis"])
        );
    }
    println!("progress (latest):");
    for e in d["progress"].as_array().into_iter().flatten() {
        print_entry(e);
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn progress(g: &GlobalArgs, a: ProgressArgs) -> Result<ExitCode> {
    let query = ProgressQuery { after_seq: a.after_seq, before_seq: a.before_seq, phase: a.phase, limit: a.limit };
    let page = ask(g, Request::Progress { session: g.session.clone(), run_id: a.run_id, query }).await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&page)?);
    } else {
        for e in page.as_array().into_iter().flatten() {
            print_entry(e);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn envelope_exit(envelope: &Value) -> ExitCode {
    if envelope["status"] == "completed" {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

pub async fn wait(g: &GlobalArgs, a: RunIdArgs) -> Result<ExitCode> {
    let envelope = ask(g, Request::Wait { session: g.session.clone(), run_id: a.run_id }).await?;
    println!("{}", serde_json::to_string_pretty(&envelope)?);
    Ok(envelope_exit(&envelope))
}

pub async fn cancel(g: &GlobalArgs, a: RunIdArgs) -> Result<ExitCode> {
    let envelope = ask(g, Request::Cancel { session: g.session.clone(), run_id: a.run_id }).await?;
    println!("{}", serde_json::to_string_pretty(&envelope)?);
    Ok(ExitCode::SUCCESS)
}

pub async fn watch(g: &GlobalArgs, a: RunIdArgs) -> Result<ExitCode> {
    let access = access(g).await?;
    // Start from the latest page, then follow live until the run ends.
    let tail: Vec<factory_host::ProgressEntry> = serde_json::from_value(
        access.ask(Request::Progress { session: g.session.clone(), run_id: a.run_id.clone(), query: ProgressQuery::default() }).await?,
    )?;
    let after = tail.first().map_or(0, |e| e.seq.saturating_sub(1));
    let envelope = super::remote::follow(g, &access, &a.run_id, false, None, false, after).await?;
    let envelope = serde_json::to_value(&envelope)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&envelope)?);
    } else {
        eprintln!("factory: run {} is {}", a.run_id, s(&envelope["status"]));
    }
    Ok(envelope_exit(&envelope))
}
