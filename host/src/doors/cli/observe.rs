//! `factory runs/show/progress/wait/cancel/pause/rm/watch`: observe and control runs, through the
//! store when this process can open it, or through the control socket of the process
//! holding it (asked again, through the store or the next holder, when that process ended
//! between being found and being asked: [`ask`]). The local user is the owner of the state
//! directory: `runs` lists the current session's runs (every session's with `--all`), and a
//! run id names a run of any session.

use crate::doors::args::GlobalArgs;
use crate::doors::reach::{access, ask};
use anyhow::Result;
use clap::Args;
use factory_host::store::ProgressQuery;
use factory_host::{ProgressEntry, RunEnvelope, RunStatus, Scope};
use std::process::ExitCode;

#[derive(Args)]
pub struct JsonArg {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct RunsArgs {
    /// Every session's runs (with a SESSION column), not only the current session's.
    #[arg(long)]
    all: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// A page by creation sequence: the runs created after run seq SEQ, oldest first (walk newer).
    #[arg(long, value_name = "SEQ")]
    after: Option<u64>,
    /// A page by creation sequence: the newest runs created before run seq SEQ (walk older).
    #[arg(long, value_name = "SEQ")]
    before: Option<u64>,
    /// A page by creation sequence holding at most N ended runs (default 200, at most 500;
    /// running ones come along); with neither --after nor --before, the newest page. With
    /// --json, prints `{runs, oldestSeq, newestSeq, hasMoreNewer, omittedOlder}`.
    #[arg(long, value_name = "N")]
    limit: Option<usize>,
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
pub struct RmArgs {
    /// The runs to delete.
    #[arg(required = true)]
    run_ids: Vec<String>,
    /// Print JSON: one `{runId, removed}` or `{runId, error: {code, message}}` per run.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct StatsArgs {
    /// Print JSON: the usage (`fileBytes`, `diskBytes`, `pageSize`, `allocatedPages`, `tables`)
    /// and its `parts`.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct GcArgs {
    /// Keep runs updated in the last N days (over the config file's `retention.keep_days`).
    #[arg(long, value_name = "N")]
    keep_days: Option<u32>,
    /// Keep the newest M runs of each factory (over the config file's `retention.keep_last`).
    #[arg(long, value_name = "M")]
    keep_last: Option<u32>,
    /// Say which runs would be deleted; delete nothing.
    #[arg(long)]
    dry_run: bool,
    /// The config file whose `[retention]` to read (default: the one found as for `run`).
    #[arg(long)]
    config: Option<std::path::PathBuf>,
    /// Print JSON: `{removed: [ids], kept, dryRun}`.
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

/// A guest-chosen string (name, label, message) for human output, escaped.
fn s(text: &str) -> String {
    crate::doors::cli::escape::esc(text).into_owned()
}

fn credits(nano: u64) -> String {
    format!("{}", nano as f64 / 1e9)
}

/// Credits, prefixed `>=` when the amount is a lower bound ("at least").
fn credits_at_least(nano: u64, at_least: bool) -> String {
    if at_least {
        format!(">={}", credits(nano))
    } else {
        credits(nano)
    }
}

pub async fn runs(g: &GlobalArgs, a: RunsArgs) -> Result<ExitCode> {
    let scope = if a.all { Scope::Owner } else { Scope::from(&g.session) };
    let scope = &scope;
    let paged = a.after.is_some() || a.before.is_some() || a.limit.is_some();
    let (runs, page) = if paged {
        let (after, before, limit) = (a.after, a.before, a.limit);
        let page =
            ask(g, |client| async move { client.runs_by_seq(scope.clone(), after, before, limit).await }).await?;
        if a.json {
            outln!("{}", serde_json::to_string_pretty(&page)?);
            return Ok(ExitCode::SUCCESS);
        }
        (page.runs.clone(), Some(page))
    } else {
        (ask(g, |client| async move { client.runs(scope.clone()).await }).await?, None)
    };
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&runs)?);
        return Ok(ExitCode::SUCCESS);
    }
    let session = |text: &str| if a.all { format!("{text:<20}  ") } else { String::new() };
    let seq = |n: Option<u64>| {
        if paged {
            format!("{:>6}  ", n.map_or(String::new(), |n| n.to_string()))
        } else {
            String::new()
        }
    };
    outln!(
        "{}{:<36}  {}{:<20}  {:<9}  {:>8}  {:>6}  {:>9}  CREATED",
        if paged { format!("{:>6}  ", "SEQ") } else { String::new() },
        "RUN",
        session("SESSION"),
        "FACTORY",
        "STATUS",
        "ATTEMPTS",
        "AGENTS",
        "CREDITS"
    );
    for r in &runs {
        outln!(
            "{}{:<36}  {}{:<20}  {:<9}  {:>8}  {:>6}  {:>9}  {}",
            seq(r.seq),
            s(&r.run_id),
            session(&s(r.session.as_deref().unwrap_or_default())),
            s(&r.factory),
            r.status.as_str(),
            r.attempts,
            r.accounting.agents_spawned,
            credits_at_least(r.accounting.ai_credits_nano, r.accounting.ai_credits_at_least),
            s(&r.created_at)
        );
    }
    if let Some(page) = page {
        if let (true, Some(oldest)) = (page.omitted_older, page.oldest_seq) {
            outln!("older runs: factory runs --before {oldest}");
        }
        if let (true, Some(newest)) = (page.has_more_newer, page.newest_seq) {
            outln!("newer runs: factory runs --after {newest}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_entry(e: &ProgressEntry) {
    let mut detail = serde_json::to_value(e).unwrap_or_default();
    let event = detail.get("event").and_then(|v| v.as_str()).unwrap_or_default().to_string();
    if let Some(obj) = detail.as_object_mut() {
        for k in ["seq", "atMs", "phase", "event"] {
            obj.remove(k);
        }
    }
    let phase = e.phase.as_deref().map(|p| format!("[{}] ", s(p))).unwrap_or_default();
    outln!("{:>6}  {phase}{} {}", e.seq, event, detail);
}

pub async fn show(g: &GlobalArgs, a: RunIdArgs) -> Result<ExitCode> {
    let run_id = a.run_id.as_str();
    let d = ask(g, |client| async move { client.detail(Scope::Owner, run_id).await }).await?;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&d)?);
        return Ok(ExitCode::SUCCESS);
    }
    let e = &d.envelope;
    outln!("run:       {}", s(&e.run_id));
    outln!("factory:   {}", s(&e.factory));
    outln!("session:   {}", s(e.session.as_deref().unwrap_or_default()));
    outln!("status:    {} (attempt {}, revision {})", e.status.as_str(), e.attempts, e.revision);
    if let Some(f) = &e.failure {
        outln!("failure:   {} {} {}", f.kind_type, f.kind.as_deref().map(s).unwrap_or_default(), s(&f.message));
    }
    if let Some(at) = &e.resume_at {
        outln!("resumes:   {} (parked: its backend's quota is spent; `factory cancel` ends it)", s(at));
    }
    if let Some(key) = &e.checkpoint {
        outln!("waits at:  checkpoint {} (answer: factory resume {} --input JSON)", s(key), s(&e.run_id));
    }
    let acc = &e.accounting;
    outln!(
        "spent:     {} agents spawned, {} replayed, {:.2}s active, {}{} AI credits (1 credit = US$0.01)",
        acc.agents_spawned,
        acc.agent_cache_hits,
        acc.active_seconds,
        if acc.ai_credits_at_least { "at least " } else { "" },
        credits(acc.ai_credits_nano)
    );
    outln!(
        "tokens:    {} input, {} output, {} cache read, {} cache write",
        acc.input_tokens,
        acc.output_tokens,
        acc.cache_read_tokens,
        acc.cache_write_tokens
    );
    outln!("limits:    {}", serde_json::to_value(d.limits)?);
    let backends: Vec<String> = d
        .backends
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let model = b.model.as_deref().map(|m| format!(" model {}", s(m))).unwrap_or_default();
            let config = b.config.as_deref().map(|c| format!(" config {}", &c[..c.len().min(12)])).unwrap_or_default();
            let key = b.key_env.as_deref().map(|k| format!(" key from ${}", s(k))).unwrap_or_default();
            format!("attempt {}: {}{model}{config}{key}", i + 1, s(&b.name))
        })
        .collect();
    outln!("backend:   {}", if backends.is_empty() { "(not recorded)".to_string() } else { backends.join("; ") });
    // While the run executes in the process answering: how its backend's flows stand.
    for f in &d.flows {
        let rate = f.requests_per_second.map_or("no rate limit known".to_string(), |r| format!("{r:.1} req/s"));
        let why =
            f.waiting_for.filter(|_| f.queued > 0).map(|w| format!(", waiting for {}", w.as_str())).unwrap_or_default();
        outln!(
            "flow:      {}: {} queued, {} in flight (limit {}), {rate}{why}, {} throttled, {:.1}s waited in all",
            s(&f.backend),
            f.queued,
            f.in_flight,
            f.limit,
            f.throttled,
            f.wait_seconds
        );
    }
    let sb = &d.sandbox;
    outln!(
        "sandbox:   memory {} MiB, fuel {}, prompt <= {} KiB, step <= {} MiB, result <= {} MiB",
        sb.memory_bytes >> 20,
        sb.fuel,
        sb.max_prompt_bytes >> 10,
        sb.max_step_bytes >> 20,
        sb.max_result_bytes >> 20
    );
    outln!("bounds:    {}", sb.bounds_line());
    let grants: Vec<String> = d
        .grants
        .iter()
        .enumerate()
        .map(|(i, dir)| format!("{} (read-only, as {})", s(dir), factory_host::sandbox::grant_mount_point(i)))
        .collect();
    outln!("grants:    {}", if grants.is_empty() { "none".to_string() } else { grants.join(", ") });
    let phases: Vec<String> = d.phases.iter().map(|p| s(p)).collect();
    outln!("phases:    {}", phases.join(" > "));
    if let Some(result) = &e.result {
        outln!("result:    {}", crate::doors::cli::escape::esc_lines(&result.to_string()));
    }
    outln!("agents:    {} (tokens: input/output/cache read/cache write)", d.agents.len());
    for agent in d.agents.iter().rev().take(20).rev() {
        outln!(
            "  {:<40} {:<7} spawns {} credits {} tokens {}/{}/{}/{} {} ms{}",
            s(&agent.label),
            agent.status.as_str(),
            agent.spawns,
            credits_at_least(agent.credits_nano, agent.credits_at_least),
            agent.input_tokens,
            agent.output_tokens,
            agent.cache_read_tokens,
            agent.cache_write_tokens,
            agent.millis,
            agent.ended_by.map(|l| format!(" (ended by {l})")).unwrap_or_default()
        );
    }
    outln!("progress (latest):");
    for e in &d.progress {
        print_entry(e);
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn progress(g: &GlobalArgs, a: ProgressArgs) -> Result<ExitCode> {
    let query = ProgressQuery { after_seq: a.after_seq, before_seq: a.before_seq, phase: a.phase, limit: a.limit };
    let (run_id, query) = (a.run_id.as_str(), &query);
    let page = ask(g, |client| async move { client.progress(Scope::Owner, run_id, query.clone()).await }).await?;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&page)?);
    } else {
        for e in &page {
            print_entry(e);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn envelope_exit(envelope: &RunEnvelope) -> ExitCode {
    if envelope.status == RunStatus::Completed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

pub async fn wait(g: &GlobalArgs, a: RunIdArgs) -> Result<ExitCode> {
    let run_id = a.run_id.as_str();
    let envelope = ask(g, |client| async move { client.wait(Scope::Owner, run_id).await }).await?;
    outln!("{}", serde_json::to_string_pretty(&envelope)?);
    Ok(envelope_exit(&envelope))
}

pub async fn cancel(g: &GlobalArgs, a: RunIdArgs) -> Result<ExitCode> {
    let run_id = a.run_id.as_str();
    let envelope = ask(g, |client| async move { client.cancel(Scope::Owner, run_id).await }).await?;
    outln!("{}", serde_json::to_string_pretty(&envelope)?);
    Ok(ExitCode::SUCCESS)
}

pub async fn pause(g: &GlobalArgs, a: RunIdArgs) -> Result<ExitCode> {
    let run_id = a.run_id.as_str();
    let envelope = ask(g, |client| async move { client.pause(Scope::Owner, run_id).await }).await?;
    outln!("{}", serde_json::to_string_pretty(&envelope)?);
    Ok(ExitCode::SUCCESS)
}

/// `factory rm RUN...`: delete each run and its journal; one that cannot be deleted (unknown,
/// running) is said and the others go on; the exit code is 1 if any failed.
pub async fn rm(g: &GlobalArgs, a: RmArgs) -> Result<ExitCode> {
    let mut failed = false;
    let mut answers = Vec::new();
    for run_id in &a.run_ids {
        let run_id = run_id.as_str();
        match ask(g, |client| async move { client.remove(Scope::Owner, run_id).await }).await {
            Ok(()) => {
                answers.push(serde_json::json!({ "runId": run_id, "removed": true }));
                if !a.json {
                    outln!("removed {}", s(run_id));
                }
            }
            Err(e) => {
                failed = true;
                let code = e
                    .downcast_ref::<factory_host::service::ServiceError>()
                    .map_or(factory_host::ErrorCode::Error, |e| e.code());
                if !a.json {
                    eprintln!("factory: rm {}: {}", s(run_id), s(&format!("{e:#}")));
                }
                answers.push(
                    serde_json::json!({ "runId": run_id, "error": { "code": code, "message": format!("{e:#}") } }),
                );
            }
        }
    }
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&answers)?);
    }
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

pub async fn watch(g: &GlobalArgs, a: RunIdArgs) -> Result<ExitCode> {
    let client = access(g).await?;
    // Start from the latest page, then follow live until the run ends.
    let tail = client.progress(Scope::Owner, &a.run_id, ProgressQuery::default()).await?;
    let after = tail.first().map_or(0, |e| e.seq.saturating_sub(1));
    let envelope = crate::doors::cli::remote::follow(&client, &a.run_id, false, None, false, after, Some(g)).await?;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&envelope)?);
    } else {
        eprintln!("factory: run {} is {}", a.run_id, envelope.status.as_str());
    }
    Ok(envelope_exit(&envelope))
}

/// `factory gc`: delete the ended runs the retention policy (the config file's `[retention]`,
/// each rule overridden by its flag) no longer keeps.
pub async fn gc(g: &GlobalArgs, a: GcArgs) -> Result<ExitCode> {
    let config = crate::doors::cli::backends::load_config(g, a.config.as_ref())?;
    let mut policy = config.retention.as_ref().map(|r| r.policy()).unwrap_or_default();
    policy.keep_days = a.keep_days.or(policy.keep_days);
    policy.keep_last = a.keep_last.or(policy.keep_last);
    if !policy.is_set() {
        anyhow::bail!(
            "no retention policy: give --keep-days N or --keep-last M, or set them in the config file's [retention] table"
        );
    }
    let dry_run = a.dry_run;
    let report = ask(g, |client| async move { client.gc(Scope::Owner, policy, dry_run).await }).await?;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(ExitCode::SUCCESS);
    }
    let verb = if report.dry_run { "would remove" } else { "removed" };
    for run_id in &report.removed {
        outln!("{verb} {}", s(run_id));
    }
    outln!("{} runs {verb}, {} kept", report.removed.len(), report.kept);
    Ok(ExitCode::SUCCESS)
}

/// `factory stats`: where the store's bytes go.
pub async fn stats(g: &GlobalArgs, a: StatsArgs) -> Result<ExitCode> {
    let Some(usage) = ask(g, |client| async move { client.usage(Scope::Owner).await }).await? else {
        anyhow::bail!("this store does not measure itself");
    };
    let parts = usage.parts();
    if a.json {
        let mut out = serde_json::to_value(&usage)?;
        out["parts"] = serde_json::to_value(&parts)?;
        outln!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(ExitCode::SUCCESS);
    }
    outln!(
        "store {} B ({} B on disk), {} pages of {} B in use, {} B free",
        usage.file_bytes,
        usage.disk_bytes,
        usage.allocated_pages,
        usage.page_size,
        usage.free_bytes()
    );
    for part in &parts {
        let share = part.bytes as f64 * 100.0 / usage.file_bytes.max(1) as f64;
        let rows = if part.rows > 0 { format!("{:>8} rows", part.rows) } else { String::new() };
        outln!("  {:<52} {:>12} B {:>5.1} % {rows}", part.part, part.bytes, share);
    }
    outln!("tables:");
    for t in usage.tables.iter().filter(|t| t.entries > 0) {
        outln!(
            "  {:<16} {:>8} rows {:>12} B stored {:>10} B unused {:>8} B branches",
            t.name,
            t.entries,
            t.stored_bytes,
            t.fragmented_bytes,
            t.metadata_bytes
        );
    }
    Ok(ExitCode::SUCCESS)
}
