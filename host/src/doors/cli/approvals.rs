//! `factory approvals`: the starts that wait for the owner's approval (an untrusted factory
//! started over HTTP, say), listed with the question's facts, and answered: `approve ID`
//! (once, or `--always` to trust its sha256 from now on) starts the run; `decline ID` starts
//! nothing. Through the service ([`factory_host::service::Client::approvals`] and
//! [`decide`](factory_host::service::Client::decide)), as the dashboard and the API answer them.

use crate::doors::args::GlobalArgs;
use crate::doors::cli::escape::esc;
use crate::doors::reach::ask;
use anyhow::Result;
use clap::{Args, Subcommand};
use factory_host::service::{Approval, ApprovalState, Decision};
use factory_host::Scope;
use std::process::ExitCode;

#[derive(Args)]
pub struct ApprovalsArgs {
    #[command(subcommand)]
    action: Option<Action>,
    /// Print JSON (the pending approvals, each with its `question`).
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum Action {
    /// Approve a pending start: the run starts.
    Approve {
        /// The approval's id (from `factory approvals`).
        id: String,
        /// Trust the factory's sha256 from now on (no approval next time).
        #[arg(long)]
        always: bool,
        /// Print the approval as it then stands, as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Decline a pending start: nothing starts.
    Decline {
        /// The approval's id (from `factory approvals`).
        id: String,
        /// Print the approval as it then stands, as JSON.
        #[arg(long)]
        json: bool,
    },
}

pub async fn approvals(g: &GlobalArgs, a: ApprovalsArgs) -> Result<ExitCode> {
    let (id, decision, json) = match a.action {
        None => return list(g, a.json).await,
        Some(Action::Approve { id, always, json }) => {
            (id, if always { Decision::Always } else { Decision::Once }, json)
        }
        Some(Action::Decline { id, json }) => (id, Decision::Decline, json),
    };
    let id = id.as_str();
    let approval = ask(g, |client| async move { client.decide(Scope::Owner, id, decision).await }).await?;
    if json {
        outln!("{}", serde_json::to_string_pretty(&approval)?);
        return Ok(ExitCode::SUCCESS);
    }
    let q = &approval.question;
    match &approval.state {
        ApprovalState::Approved { run_id, always } => {
            let trusted = if *always { " (its sha256 is trusted from now on)" } else { "" };
            outln!("approved: factory `{}` runs as {}{trusted}", esc(&q.factory), esc(run_id));
        }
        ApprovalState::Declined => outln!("declined: factory `{}` did not start", esc(&q.factory)),
        other => outln!("approval {}: {}", esc(id), state_name(other)),
    }
    Ok(ExitCode::SUCCESS)
}

fn state_name(state: &ApprovalState) -> &'static str {
    match state {
        ApprovalState::Pending => "pending",
        ApprovalState::Approved { .. } => "approved",
        ApprovalState::Declined => "declined",
        ApprovalState::Expired => "expired",
        ApprovalState::Failed { .. } => "failed",
    }
}

/// `factory approvals`: the pending ones, each with what it asks.
async fn list(g: &GlobalArgs, json: bool) -> Result<ExitCode> {
    let pending: Vec<Approval> = ask(g, |client| async move { client.approvals(Scope::Owner).await }).await?;
    if json {
        outln!("{}", serde_json::to_string_pretty(&pending)?);
        return Ok(ExitCode::SUCCESS);
    }
    if pending.is_empty() {
        outln!("no pending approvals");
        return Ok(ExitCode::SUCCESS);
    }
    for approval in &pending {
        let q = &approval.question;
        let limits = serde_json::to_string(&q.limits).unwrap_or_default();
        let list = |items: &[String], none: &str| if items.is_empty() { none.to_string() } else { items.join(", ") };
        outln!("{}", esc(&approval.id));
        outln!("  factory:   {}", esc(&q.factory));
        outln!("  sha256:    {}", esc(&q.sha256));
        outln!("  operation: {}", q.operation.as_str());
        outln!("  backend:   {}", esc(&q.backend));
        outln!("  limits:    {}", esc(&limits));
        outln!("  phases:    {}", esc(&list(&q.phases, "none declared")));
        outln!("  grants:    {}", esc(&list(&q.grants, "none")));
        if let Some(session) = &approval.session {
            outln!("  session:   {}", esc(session));
        }
    }
    outln!("answer with `factory approvals approve ID [--always]` or `factory approvals decline ID`");
    Ok(ExitCode::SUCCESS)
}
