//! Trust is consent, not privilege: before `factory run` (or `resume --component`) starts a
//! component that was neither built on this machine nor approved before, the user agrees to
//! it — "y" at a prompt on a terminal showing its name, sha256, declared limits and requested
//! grants, `--yes` for this run only, or a prior `factory trust <component>`. Without any of
//! those a non-interactive run stops with exit code 2 before a run exists; a run declined at
//! the prompt is created and ends at once as `cancelled` (failure kind `declined`) with its
//! run id. Trust changes nothing the sandbox enforces: the decision is made here, in the
//! CLI, and the host never reads the trust store. Also `--allow-read DIR` (read-only grants)
//! and the `factory trust` subcommand.

use crate::doors::args::GlobalArgs;
use crate::doors::cli::escape::esc;
use crate::doors::cli::target;
use crate::doors::reach;
use crate::doors::trusted::store;
use anyhow::{bail, Context, Result};
use clap::Args;
use factory_host::sandbox;
use factory_host::service::{Client, Description, ServiceError, Target};
use factory_host::trust::{TrustSource, TrustedComponent};
use factory_host::{Limits, RunEnvelope};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

/// `--yes`: consent without a prompt.
#[derive(Args, Debug, Default, Clone)]
pub struct YesArg {
    /// Run a component that is not trusted on this machine without asking (this run only;
    /// nothing is recorded — use `factory trust` for that). Where bubblewrap cannot confine
    /// the build of a crate directory, also build it natively without asking.
    #[arg(long)]
    pub yes: bool,
}

/// What `factory run` asks for beyond the sandbox defaults, and consent to it.
#[derive(Args, Debug, Default, Clone)]
pub struct ConsentArgs {
    /// Let the factory read DIR, read-only (repeatable). Inside the guest the first DIR is
    /// `/grant/0`, the next `/grant/1`, ...; the run records its grants and resumes keep them.
    #[arg(long = "allow-read", value_name = "DIR")]
    pub allow_read: Vec<PathBuf>,
    #[command(flatten)]
    pub yes: YesArg,
}

impl ConsentArgs {
    /// The grants, checked (each must be a directory) and absolute (canonical), so another
    /// process can mount them too.
    pub fn grants(&self) -> Result<Vec<PathBuf>> {
        Ok(sandbox::check_grants(&self.allow_read)?.into_iter().map(PathBuf::from).collect())
    }
}

/// `factory trust`.
#[derive(Args)]
pub struct TrustArgs {
    /// A component file (`.wasm`) or a script factory (a crate directory is not built here:
    /// `factory build DIR` first); with `--revoke`, also a sha256. Without it, lists the
    /// trusted components.
    target: Option<String>,
    /// Stop trusting it.
    #[arg(long)]
    revoke: bool,
    /// Print JSON (the list).
    #[arg(long)]
    json: bool,
}

/// Record the components this process built as trusted (built on this machine). A failure
/// is only a warning: the next run of such a component asks again.
pub fn remember_built(g: &GlobalArgs) {
    let store = match store(g) {
        Ok(store) => store,
        Err(e) => {
            eprintln!("factory: warning: cannot record a built component as trusted: {e:#}");
            return;
        }
    };
    for (hash, path) in target::built_here() {
        let entry = TrustedComponent {
            path: Some(path.display().to_string()),
            ..TrustedComponent::new(hash, TrustSource::Built)
        };
        if let Err(e) = store.trust(entry) {
            eprintln!("factory: warning: cannot record a built component as trusted: {e}");
            return;
        }
    }
}

/// `outcome`, after recording what the command built (for `factory add <crate-dir>`).
pub fn after_build(g: &GlobalArgs, outcome: Result<ExitCode>) -> Result<ExitCode> {
    remember_built(g);
    outcome
}

/// Read one line from the terminal: did the user answer "y" or "yes"?
async fn answered_yes() -> Result<bool> {
    let answer = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| line)
    })
    .await
    .context("reading the answer")?
    .context("reading the answer")?;
    Ok(matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes"))
}

fn interactive() -> bool {
    std::io::stdin().is_terminal() && std::io::stderr().is_terminal()
}

/// May `hash` run without asking? Built here or trusted: yes; `--yes`: yes, this once. When
/// it would have to ask and cannot (no terminal), the error says what to do.
fn settled(g: &GlobalArgs, yes: &YesArg, hash: &str, source: &str, name: Option<&str>) -> Result<bool> {
    if target::built_here().iter().any(|(built, _)| built == hash) {
        remember_built(g);
        return Ok(true);
    }
    let store = store(g)?;
    if store.is_trusted(hash)? {
        return Ok(true);
    }
    if yes.yes {
        return Ok(true);
    }
    if interactive() {
        return Ok(false);
    }
    let named = name.map(|n| format!("factory `{}`, ", esc(n))).unwrap_or_default();
    bail!(
        "`{source}` ({named}sha256 {hash}) is not trusted on this machine and there is no terminal to ask for consent: \
         pass --yes to run it this once, or approve it first with `factory trust {source}` (trust store: {})",
        store.path().display()
    )
}

fn show_limits(limits: &Limits) -> String {
    let mut parts = Vec::new();
    if let Some(n) = limits.max_concurrent_subagents {
        parts.push(format!("maxConcurrentSubagents={n}"));
    }
    if let Some(n) = limits.max_total_subagents {
        parts.push(format!("maxTotalSubagents={n}"));
    }
    if let Some(t) = limits.timeout_seconds {
        parts.push(format!("timeoutSeconds={t}"));
    }
    if let Some(c) = limits.max_ai_credits {
        parts.push(format!("maxAiCredits={c}"));
    }
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(" ")
    }
}

/// Show what `factory` is and asks for, and read the answer from the terminal. "y" also
/// records the approval, so the next run does not ask.
async fn ask(
    g: &GlobalArgs,
    factory: &Description,
    source: &str,
    overrides: &Limits,
    grants: Option<&[PathBuf]>,
    backend: &str,
) -> Result<bool> {
    let meta = &factory.meta;
    let effective = meta.limits.overridden_by(overrides);
    // A bad override is an input error, reported before anyone is asked anything.
    effective.validate()?;
    let wasi = factory.imports_wasi();
    let mut text = String::new();
    text.push_str("factory: this component was not built on this machine and is not trusted yet:\n");
    text.push_str(&format!("  source:   {}\n", esc(source)));
    text.push_str(&format!("  name:     {}\n", esc(&meta.name)));
    if let Some(line) = meta.description.lines().next() {
        text.push_str(&format!("            {}\n", esc(line)));
    }
    match &factory.script {
        Some(script) => text.push_str(&format!(
            "  sha256:   {} (source {}; JS runner {})\n",
            script.sha256,
            esc(&script.file_name),
            factory.sha256
        )),
        None => text.push_str(&format!("  sha256:   {}\n", factory.sha256)),
    }
    let mut limits = show_limits(&effective);
    // A declared limit this run lifts shows as lifted, not just missing.
    let lifted: Vec<String> = overrides.lifted.names().iter().map(|name| format!("{name}=none (lifted)")).collect();
    if !lifted.is_empty() {
        limits =
            if effective == Limits::default() { lifted.join(" ") } else { format!("{limits} {}", lifted.join(" ")) };
    }
    text.push_str(&format!("  limits:   {limits} (declared: {})\n", show_limits(&meta.limits)));
    text.push_str(&format!(
        "  imports:  {}\n",
        if wasi {
            "agent:factory and WASI (no env, args, network or files beyond the grants)"
        } else {
            "agent:factory only"
        }
    ));
    match grants {
        None => text.push_str("  grants:   those recorded on the run\n"),
        Some([]) => text.push_str("  grants:   none\n"),
        Some(grants) => {
            for (i, dir) in grants.iter().enumerate() {
                let label = if i == 0 { "grants:" } else { "" };
                text.push_str(&format!(
                    "  {label:<9} read-only {} (as {})\n",
                    dir.display(),
                    sandbox::grant_mount_point(i)
                ));
            }
        }
    }
    text.push_str(&format!("  backend:  its subagents will run with {}\n", esc(backend)));
    text.push_str("  It runs in the same sandbox either way; approving only lets it start.\n");
    text.push_str("Run it? [y/N] ");
    eprint!("{text}");
    let yes = answered_yes().await?;
    let approved = yes;
    if approved {
        let entry = TrustedComponent {
            name: Some(meta.name.clone()),
            path: Some(source.to_string()),
            ..TrustedComponent::new(factory.trust_key().to_string(), TrustSource::Approved)
        };
        if let Err(e) = store(g).and_then(|s| Ok(s.trust(entry)?)) {
            eprintln!("factory: warning: cannot remember the approval: {e}");
        }
    }
    Ok(approved)
}

/// Does the user consent to running `factory` (named `source` on the command line) with
/// `overrides` and `grants` (`None`: the run's recorded ones), its subagents on `backend`
/// (a description, shown)? `Ok(false)`: declined at the
/// prompt; `Err`: consent is needed and cannot be asked for (exit 2).
pub async fn consent(
    g: &GlobalArgs,
    yes: &YesArg,
    source: &str,
    factory: &Description,
    overrides: &Limits,
    grants: Option<&[PathBuf]>,
    backend: &str,
) -> Result<bool> {
    // Bad input is reported as such, before any question of trust.
    factory.meta.limits.overridden_by(overrides).validate()?;
    if settled(g, yes, factory.trust_key(), source, Some(&factory.meta.name))? {
        return Ok(true);
    }
    ask(g, factory, source, overrides, grants, backend).await
}

/// Consent to a run the service starts (`client`: in this process or the one holding the
/// store): `component` is an absolute component path or a registered name, which the
/// service describes as it would load it for the run ([`Client::describe`]), so the
/// question shows what runs, and bad input (not a component, bad limits) is reported
/// before any question. Answers the trust key consented to (`None`: declined); the service
/// runs the factory only if what it loads then has that key.
#[allow(clippy::too_many_arguments, reason = "the prompt's facts, each its own")]
pub async fn consent_remote(
    g: &GlobalArgs,
    yes: &YesArg,
    source: &str,
    component: &Target,
    overrides: &Limits,
    grants: Option<&[PathBuf]>,
    backend: &str,
    client: &Client,
) -> Result<Option<String>> {
    let description = match component {
        Target::File(path) => {
            if target::is_script_target(&path.to_string_lossy()) {
                // A script factory on the command line is the user's own source (see `target`).
                target::resolve_built(path, "run")?;
            }
            let described = client.describe(&g.session, component.clone()).await;
            described.with_context(|| format!("loading {}", path.display()))?
        }
        Target::Registered(name) => match client.describe(&g.session, component.clone()).await {
            Ok(description) => description,
            Err(ServiceError::Host(e)) => return Err(target::not_registered(name, e)),
            Err(e) => return Err(e.into()),
        },
    };
    let approved = consent(g, yes, source, &description, overrides, grants, backend).await?;
    Ok(approved.then(|| description.trust_key().to_string()))
}

/// How the consent prompt names a backend the process holding the store builds.
pub fn remote_backend(choice: &factory_host::BackendChoice) -> String {
    match &choice.name {
        Some(name) => format!("`{name}` as the process holding the store configures it"),
        None => "the default backend of the process holding the store".to_string(),
    }
}

/// Consent again before a resume runs a run's recorded component: one built here or trusted
/// runs; `--yes` runs it this once; otherwise (its approval was revoked, or it first ran with
/// `--yes`) the user is asked on a terminal. Errors: `reapproval_declined` (answered no),
/// `no_approval_provider` (no terminal to ask on).
pub async fn reapprove(g: &GlobalArgs, yes: &YesArg, run_id: &str, factory: &str, hash: &str) -> Result<()> {
    if target::built_here().iter().any(|(built, _)| built == hash) {
        return Ok(());
    }
    let store = store(g)?;
    if store.is_trusted(hash)? || yes.yes {
        return Ok(());
    }
    if !interactive() {
        bail!(
            "no_approval_provider: run {run_id} runs factory `{factory}` (sha256 {hash}), which is not trusted on this \
             machine (its approval was revoked, or it ran with --yes), and there is no terminal to ask: pass --yes to \
             resume it this once, or approve it with `factory trust`"
        );
    }
    eprint!(
        "factory: run {run_id} runs factory `{factory}` (sha256 {hash}), which is not trusted on this machine \
         (its approval was revoked, or it ran with --yes).\n  It runs in the same sandbox either way; approving only \
         lets it start.\nResume it? [y/N] "
    );
    let yes = answered_yes().await?;
    if !yes {
        bail!("reapproval_declined: run {run_id} was not resumed (its component was declined)");
    }
    let entry = TrustedComponent {
        name: Some(factory.to_string()),
        ..TrustedComponent::new(hash.to_string(), TrustSource::Approved)
    };
    if let Err(e) = store.trust(entry) {
        eprintln!("factory: warning: cannot remember the approval: {e}");
    }
    Ok(())
}

/// Say that the run was declined; `--json` prints its envelope. Exit code 1.
pub fn report_declined(envelope: &RunEnvelope, json: bool) -> Result<ExitCode> {
    if json {
        outln!("{}", serde_json::to_string_pretty(envelope)?);
    }
    eprintln!("factory: run {} declined: nothing ran; it ends as cancelled", envelope.run_id);
    Ok(ExitCode::from(1))
}

/// `factory trust [TARGET] [--revoke] [--json]`.
pub async fn trust(g: &GlobalArgs, a: TrustArgs) -> Result<ExitCode> {
    let store = store(g)?;
    let Some(target) = a.target else {
        if a.revoke {
            bail!("--revoke needs the component (file, crate directory or sha256) to stop trusting");
        }
        let list = store.list()?;
        if a.json {
            outln!("{}", serde_json::to_string_pretty(&list)?);
        } else {
            for c in list {
                let source = serde_json::to_value(c.source)?;
                outln!(
                    "{}  {:<8}  {:<20}  {}  {}",
                    c.sha256,
                    source.as_str().unwrap_or("?"),
                    esc(c.name.as_deref().unwrap_or("-")),
                    c.added_at,
                    c.path.as_deref().unwrap_or("")
                );
            }
        }
        return Ok(ExitCode::SUCCESS);
    };
    let path = PathBuf::from(&target);
    if a.revoke {
        let hash = if target::is_script_target(&target) {
            describe_file(g, &path).await?.trust_key().to_string()
        } else if path.exists() {
            let file = target::resolve_built(&path, "trust --revoke")?;
            let bytes = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            factory_host::component::content_hash(&bytes)
        } else if target.len() == 64 && target.chars().all(|c| c.is_ascii_hexdigit()) {
            target.to_ascii_lowercase()
        } else {
            bail!("`{target}` is neither a component file nor a sha256");
        };
        if store.revoke(&hash)? {
            outln!("no longer trusted: sha256 {hash}");
        } else {
            outln!("was not trusted: sha256 {hash}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    if !path.exists() && !target::is_script_target(&target) {
        bail!("`{target}` is neither a component file nor a script factory");
    }
    let file = target::resolve_built(&path, "trust")?;
    // Only a loadable factory is worth trusting: the service loads it to check and name it.
    let factory = describe_file(g, &file).await?;
    let hash = factory.trust_key().to_string();
    let built = target::built_here().iter().any(|(h, _)| *h == hash);
    let entry = TrustedComponent {
        name: Some(factory.meta.name.clone()),
        path: Some(std::path::absolute(&file).unwrap_or(file).display().to_string()),
        ..TrustedComponent::new(hash.clone(), if built { TrustSource::Built } else { TrustSource::Approved })
    };
    if store.trust(entry)? {
        outln!("trusted {} (sha256 {hash})", esc(&factory.meta.name));
    } else {
        outln!("already trusted: {} (sha256 {hash})", esc(&factory.meta.name));
    }
    Ok(ExitCode::SUCCESS)
}

/// A factory file as the service describes it: the one serving the state directory, else
/// one in this process ([`reach::serving_or_private`]).
async fn describe_file(g: &GlobalArgs, path: &std::path::Path) -> Result<Description> {
    let path = std::path::absolute(path)?;
    let client = reach::serving_or_private(g).await?;
    let described = client.describe(&g.session, Target::File(path.clone())).await;
    described.with_context(|| format!("loading {}", path.display()))
}
