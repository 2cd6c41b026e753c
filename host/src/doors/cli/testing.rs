//! `factory test [PATH...]`: run factories against their cassettes and check what their
//! authors assert. A PATH is a test file (`NAME.test.json`, [`TestFile`]) or a directory
//! whose `*.test.json` files are used (default: the working directory). Each case runs in
//! a private in-memory host (no state directory is touched), started through the service
//! over it as every run is ([`Local::start_with`]), with every agent call served from the
//! cassette; a call the cassette does not hold fails the case with the call's label
//! and a hint (the recorded call of the same label whose prompt differs, and where). With
//! `--update` those misses go to the live backend (`--backend`, `--model`, `--config`, as
//! for `run`) and the cassette is rewritten with exactly the calls the cases made (a missing
//! cassette is recorded whole). After each file, a replay-safety report lists the recorded
//! calls the factory no longer makes and the new calls it makes (changed memo keys): what a
//! resume of a run recorded with the old factory would replay for nothing and pay again.
//! Exit code 0 when every case passes, 1 when one fails, 2 for unusable input; `--junit
//! FILE` writes a JUnit XML report.
//!
//! A test file comes with a project that may not be the user's own, so every path it names
//! (`factory`, `cassette`) is confined to its project directory: the directory holding the
//! test file, symlinks resolved ([`confine`]). `..` out of it, an absolute path elsewhere, a
//! symlinked directory or a symlink at the cassette's path leading out are refused
//! ([`ProjectPathError`]); the scratch files and a rewritten cassette are created only in
//! there, the cassette replaced by renaming a fresh file (created exclusively) over it, so a
//! symlink planted at its path is replaced, never followed.

use crate::doors::args::GlobalArgs;
use crate::doors::cli::backends::load_config;
use crate::doors::cli::conventions::{paint, stderr_colored};
use crate::doors::cli::escape::{esc, esc_lines};
use crate::doors::cli::target;
use crate::doors::cli::trust::{self, YesArg};
use anstyle::AnsiColor;
use anyhow::{bail, Context, Result};
use clap::Args;
use factory_host::backend::cassette::{read_cassette, CassetteUsage, Exchange, RecordedCall};
use factory_host::backend::{AgentBackend, Cassette};
use factory_host::model::expect::{Case, TestFile};
use factory_host::service::{Client, Consent, InProcess, Local, Request, Target};
use factory_host::{Host, HostConfig, Limits};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

/// The most bytes of a test file `factory test` reads.
const MAX_TEST_FILE_BYTES: u64 = 1 << 20;

/// A path a test file names that `factory test` refuses to use.
#[derive(Debug, thiserror::Error)]
pub enum ProjectPathError {
    /// It resolves (symlinks followed) outside the project directory.
    #[error(
        "{file}: `{field}` names `{named}`, which resolves to {resolved}, outside the project directory {project} \
         (paths a test file names must stay inside the directory holding it)"
    )]
    Outside { file: String, field: &'static str, named: String, resolved: String, project: String },
    /// It goes up (`..`) through a directory that does not exist.
    #[error("{file}: `{field}` names `{named}`, which goes up (`..`) through a missing directory")]
    UpThroughMissing { file: String, field: &'static str, named: String },
    /// It is a symlink whose target does not exist.
    #[error(
        "{file}: `{field}` names `{named}`, a symlink to a missing file ({target}): refusing to follow or replace it"
    )]
    DanglingSymlink { file: String, field: &'static str, named: String, target: String },
    /// The project directory or a path in it could not be resolved.
    #[error("{file}: resolving {path}: {source}")]
    Resolve { file: String, path: String, source: std::io::Error },
}

/// `factory test`: what to test and how.
#[derive(Args)]
pub struct TestArgs {
    /// Test files (`NAME.test.json`) or directories holding them (default: `.`).
    paths: Vec<PathBuf>,
    /// Send the calls a cassette does not hold to the live backend, and rewrite the cassette
    /// with exactly the calls the cases made (a missing cassette is recorded whole).
    #[arg(long)]
    update: bool,
    /// With --update: who answers the missed calls (as for `run`; default: the config's default).
    #[arg(long, value_name = "SPEC")]
    backend: Option<String>,
    /// With --update: the model for calls that name none.
    #[arg(long, value_name = "MODEL")]
    model: Option<String>,
    /// The backend config file (default: factory.toml in the state directory, if present).
    #[arg(long, env = "FACTORY_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// Write a JUnit XML report to FILE (one test suite per test file, one test case per case).
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
    #[command(flatten)]
    yes: YesArg,
}

/// One case's outcome.
struct CaseReport {
    name: String,
    seconds: f64,
    failures: Vec<String>,
}

/// One test file's outcome.
struct FileReport {
    name: String,
    cases: Vec<CaseReport>,
    /// The file could not be run at all (its message).
    error: Option<String>,
}

/// `factory test`.
pub async fn test(g: &GlobalArgs, a: TestArgs) -> Result<ExitCode> {
    let files = discover(&a.paths)?;
    if a.backend.is_some() && !a.update {
        bail!("--backend is used only with --update (a test serves every call from its cassette)");
    }
    let live = if a.update {
        let config = load_config(g, a.config.as_ref())?;
        Some(config.run_backend(a.backend.as_deref(), a.model.as_deref())?)
    } else {
        None
    };
    let mut reports = Vec::new();
    for file in &files {
        let report = match test_file(g, &a.yes, file, live.clone()).await {
            Ok(report) => report,
            Err(e) => FileReport { name: file.display().to_string(), cases: Vec::new(), error: Some(format!("{e:#}")) },
        };
        if let Some(error) = &report.error {
            let (name, error) = (esc(&report.name), esc_lines(error));
            eprintln!("{} {name}: {error}", paint(stderr_colored(), AnsiColor::Red.on_default().bold(), "error"));
        }
        reports.push(report);
    }
    let cases: usize = reports.iter().map(|r| r.cases.len()).sum();
    let failed: usize = reports.iter().map(|r| r.cases.iter().filter(|c| !c.failures.is_empty()).count()).sum();
    let errors = reports.iter().filter(|r| r.error.is_some()).count();
    if let Some(path) = &a.junit {
        std::fs::write(path, junit(&reports))
            .with_context(|| format!("writing the JUnit report {}", path.display()))?;
    }
    let summary = format!("{} passed, {failed} failed, {errors} test files unusable", cases - failed);
    let colored = stderr_colored();
    if failed == 0 && errors == 0 {
        eprintln!("factory test: {}", paint(colored, AnsiColor::Green.on_default(), &summary));
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("factory test: {}", paint(colored, AnsiColor::Red.on_default(), &summary));
        Ok(ExitCode::from(if errors > 0 && failed == 0 { 2 } else { 1 }))
    }
}

/// The test files `paths` name: files as given, directories' `*.test.json` (sorted).
fn discover(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let paths = if paths.is_empty() { vec![PathBuf::from(".")] } else { paths.to_vec() };
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(&path)
                .with_context(|| format!("reading {}", path.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.is_file() && p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.ends_with(".test.json"))
                })
                .collect();
            if found.is_empty() {
                bail!("{} holds no `*.test.json` test file", path.display());
            }
            found.sort();
            files.extend(found);
        } else if path.is_file() {
            files.push(path);
        } else {
            bail!("{}: no such test file or directory", path.display());
        }
    }
    Ok(files)
}

/// The project directory of a test file: the directory holding it, resolved.
fn project_of(file: &Path) -> Result<PathBuf, ProjectPathError> {
    let dir = file.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    dir.canonicalize().map_err(|source| ProjectPathError::Resolve {
        file: esc(&file.display().to_string()).into_owned(),
        path: esc(&dir.display().to_string()).into_owned(),
        source,
    })
}

/// `named` (a test file's `field`, relative to `project`) resolved with symlinks followed,
/// when it stays inside `project` (itself resolved). A part that does not exist yet (a
/// cassette to record, its directories) must be plain names below the longest existing
/// ancestor, which must be inside; a symlink at the end leading nowhere is refused.
fn confine(project: &Path, file: &Path, field: &'static str, named: &str) -> Result<PathBuf, ProjectPathError> {
    use std::path::Component;
    let shown_file = || esc(&file.display().to_string()).into_owned();
    let shown_named = || esc(named).into_owned();
    let joined = project.join(named);
    // Split into the longest ancestor that resolves and the missing names after it.
    let mut existing = joined.as_path();
    let mut missing = Vec::new();
    let resolved = loop {
        match existing.canonicalize() {
            Ok(resolved) => break resolved,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if std::fs::symlink_metadata(existing).is_ok_and(|m| m.file_type().is_symlink()) {
                    let target = std::fs::read_link(existing).map(|t| t.display().to_string()).unwrap_or_default();
                    return Err(ProjectPathError::DanglingSymlink {
                        file: shown_file(),
                        field,
                        named: shown_named(),
                        target: esc(&target).into_owned(),
                    });
                }
                match (existing.parent(), existing.components().next_back()) {
                    (Some(parent), Some(Component::Normal(name))) => {
                        missing.push(name.to_os_string());
                        existing = parent;
                    }
                    (_, Some(Component::ParentDir)) => {
                        return Err(ProjectPathError::UpThroughMissing {
                            file: shown_file(),
                            field,
                            named: shown_named(),
                        })
                    }
                    _ => {
                        return Err(ProjectPathError::Resolve { file: shown_file(), path: shown_named(), source: e });
                    }
                }
            }
            Err(source) => {
                return Err(ProjectPathError::Resolve {
                    file: shown_file(),
                    path: esc(&existing.display().to_string()).into_owned(),
                    source,
                })
            }
        }
    };
    let resolved = missing.iter().rev().fold(resolved, |path, name| path.join(name));
    if !resolved.starts_with(project) {
        return Err(ProjectPathError::Outside {
            file: shown_file(),
            field,
            named: shown_named(),
            resolved: esc(&resolved.display().to_string()).into_owned(),
            project: esc(&project.display().to_string()).into_owned(),
        });
    }
    Ok(resolved)
}

/// The factory a test file names (`factory`, relative to its project directory), or the one
/// beside it: the directory itself when it is a crate or a Python project, else
/// `NAME.ts|js|py`.
fn factory_of(project: &Path, file: &Path, test: &TestFile) -> Result<PathBuf> {
    if let Some(named) = &test.factory {
        return Ok(confine(project, file, "factory", named)?);
    }
    if project.join("Cargo.toml").is_file() || project.join("app.py").is_file() {
        return Ok(project.to_path_buf());
    }
    let stem = stem(file);
    ["ts", "js", "py"]
        .iter()
        .map(|ext| project.join(format!("{stem}.{ext}")))
        .find(|p| p.is_file())
        .map(|p| confine(project, file, "factory", &p.to_string_lossy()))
        .transpose()?
        .with_context(|| {
            format!("{}: name the factory with `\"factory\"` (no {stem}.ts, .js or .py beside it)", file.display())
        })
}

/// `NAME` of `NAME.test.json`.
fn stem(file: &Path) -> String {
    let name = file.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    name.strip_suffix(".test.json").unwrap_or(name).to_string()
}

/// The cassette a test file uses, inside its project directory.
fn cassette_of(project: &Path, file: &Path, test: &TestFile) -> Result<PathBuf, ProjectPathError> {
    match &test.cassette {
        Some(named) => confine(project, file, "cassette", named),
        None => confine(project, file, "cassette", &format!("{}.cassette.jsonl", stem(file))),
    }
}

/// Read and parse a test file (bounded).
fn read_test_file(file: &Path) -> Result<TestFile> {
    let size = std::fs::metadata(file).with_context(|| format!("reading {}", file.display()))?.len();
    if size > MAX_TEST_FILE_BYTES {
        bail!("{} is {size} bytes, over the limit of {MAX_TEST_FILE_BYTES}", file.display());
    }
    let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    TestFile::parse(&text).with_context(|| file.display().to_string())
}

/// Run every case of one test file.
async fn test_file(
    g: &GlobalArgs,
    yes: &YesArg,
    file: &Path,
    live: Option<Arc<dyn AgentBackend>>,
) -> Result<FileReport> {
    let test = read_test_file(file)?;
    let project = project_of(file)?;
    let factory_path = factory_of(&project, file, &test)?;
    let cassette = cassette_of(&project, file, &test)?;
    let exists = cassette.is_file();
    if !exists && live.is_none() {
        bail!(
            "no cassette at {}: record it with `factory test --update --backend SPEC {}`",
            cassette.display(),
            file.display()
        );
    }
    // Each case runs in a store of its own in this process, through the service over it: the
    // one start and consent check every run goes through (the consent is asked here, once).
    let host = Host::new(HostConfig { state_dir: None, sandbox_hidden: g.sandbox_hidden(), ..HostConfig::default() })?;
    let service = Local::new(Arc::new(host), Arc::new(|_: &str| false));
    let built = std::path::absolute(target::resolve(&factory_path, &target::BuildConsent::new(g, yes.yes))?)?;
    let described = Client::Local(service.clone()).describe("test", Target::File(built.clone())).await;
    let factory = described.with_context(|| format!("loading {}", built.display()))?;
    let shown = factory_path.display().to_string();
    if !trust::consent(g, yes, &shown, &factory, &Limits::default(), None, "a cassette").await? {
        bail!("{shown}: not approved (run it once with --yes, or `factory trust` it)");
    }
    let under_test = Under { service: &service, component: built, consent: factory.trust_key().to_string() };
    let name = file.display().to_string();
    outln!("{} ({} cases, {})", esc(&name), test.cases.len(), esc(&factory_path.display().to_string()));
    let scratch = scratch_dir(&cassette)?;
    let mut cases = Vec::new();
    let mut recorded_paths = Vec::new();
    let mut usage = CassetteUsage::default();
    let mut recorded_calls: Option<Vec<RecordedCall>> = None;
    for (i, case) in test.cases.iter().enumerate() {
        let recording = scratch.path.join(format!("case-{i}.jsonl"));
        let backend = match (&live, exists) {
            (None, _) => Cassette::replay(&cassette)?.misses_fail_calls(),
            (Some(live), true) => Cassette::replay_then_live(&cassette, live.clone())?.recording_to(&recording)?,
            (Some(live), false) => Cassette::record(live.clone(), &recording)?,
        };
        if recorded_calls.is_none() {
            recorded_calls = Some(backend.recorded());
            for entry in backend.rejected() {
                outln!("  cassette {}: {}", esc(&cassette.display().to_string()), esc(&entry.to_string()));
            }
        }
        let backend = Arc::new(backend);
        let started = Instant::now();
        let checked = run_case(&under_test, case, backend.clone()).await?;
        // The misses first: they explain the failures that follow from them.
        let mut failures = Vec::new();
        if let Some(used) = backend.usage() {
            if live.is_none() {
                for miss in &used.missed {
                    failures.push(miss_message(miss, recorded_calls.as_deref().unwrap_or_default(), &cassette));
                }
            }
            merge_usage(&mut usage, used, i == 0);
        }
        failures.extend(checked);
        if live.is_some() {
            recorded_paths.push(recording);
        }
        let report = CaseReport { name: case.name.clone(), seconds: started.elapsed().as_secs_f64(), failures };
        print_case(&report);
        cases.push(report);
    }
    print_safety(&usage);
    if live.is_some() {
        write_cassette(&cassette, &recorded_paths)?;
        outln!(
            "  cassette {} rewritten ({})",
            esc(&cassette.display().to_string()),
            if exists { "misses recorded live" } else { "recorded whole" }
        );
    }
    drop(scratch);
    Ok(FileReport { name, cases, error: None })
}

/// Record the cassette of a test file `factory init` just wrote, on the dry-run backend
/// (what `factory test --update --backend dry-run FILE` does), so `factory test` passes
/// at once. Prints what `factory test` prints.
pub async fn record_scaffold(g: &GlobalArgs, file: &Path) -> Result<()> {
    let live: Arc<dyn AgentBackend> = Arc::new(factory_host::backend::DryRun);
    let report = test_file(g, &YesArg { yes: true }, file, Some(live)).await?;
    match report.cases.iter().find(|c| !c.failures.is_empty()) {
        Some(failed) => bail!("the scaffold's own test `{}` failed: {}", failed.name, failed.failures.join("; ")),
        None => Ok(()),
    }
}

/// The factory a test file runs and the service that runs it.
struct Under<'a> {
    service: &'a Local,
    /// The built component (absolute).
    component: PathBuf,
    /// The trust key consented to.
    consent: String,
}

/// Run one case and check it; the failures (empty: passed).
async fn run_case(under: &Under<'_>, case: &Case, backend: Arc<Cassette>) -> Result<Vec<String>> {
    let request = Request::Run {
        session: "test".into(),
        component: Target::File(under.component.clone()),
        args: Some(case.args.clone().unwrap_or_else(|| serde_json::json!({}))),
        limits: Limits::default(),
        backend: Default::default(),
        grants: Vec::new(),
        declined: false,
        consent: Consent::Sha256(under.consent.clone()),
        trace_parent: None,
        caller_cwd: None,
        replay: None,
        record: false,
    };
    let here = InProcess { backend: Some(backend), ..InProcess::default() };
    let ended = match under.service.start_with(request, here).await {
        Ok((_, attempt)) => attempt.await.map_err(factory_host::Error::Task).and_then(|ended| ended),
        Err(e) => Err(e),
    };
    let envelope = match ended {
        Ok(envelope) => envelope,
        // Refused before a run exists (invalid args): the case fails, saying why.
        Err(e) => return Ok(vec![format!("the run did not start: {e}")]),
    };
    let mut present = std::collections::HashSet::new();
    let store = under.service.host().store();
    for key in &case.journal.steps {
        if store.get_step(&envelope.run_id, key).await.map_err(anyhow::Error::new)?.is_some() {
            present.insert(key.clone());
        }
    }
    Ok(case.check(&envelope, &|key| present.contains(key)))
}

/// The recorded calls no case used (intersection over cases) and the new calls (union).
fn merge_usage(total: &mut CassetteUsage, case: CassetteUsage, first: bool) {
    if first {
        total.unused = case.unused;
    } else {
        total.unused.retain(|u| case.unused.iter().any(|c| c.key == u.key && c.attempt == u.attempt));
    }
    for miss in case.missed {
        if !total.missed.iter().any(|m| m.key == miss.key && m.attempt == miss.attempt) {
            total.missed.push(miss);
        }
    }
}

/// A cassette miss, with the recorded call of the same label as the hint (where its prompt
/// first differs), or the recorded labels.
fn miss_message(miss: &RecordedCall, recorded: &[RecordedCall], cassette: &Path) -> String {
    let label = miss.label.as_deref().unwrap_or("(no label)");
    let mut message = format!(
        "cassette miss: agent `{}` (key {}, attempt {}) is not in {}",
        esc(label),
        short(&miss.key),
        miss.attempt,
        cassette.display()
    );
    match recorded.iter().find(|r| r.label == miss.label && r.attempt == miss.attempt) {
        Some(old) if old.prompt != miss.prompt => {
            let at = old
                .prompt
                .char_indices()
                .zip(miss.prompt.chars())
                .find(|((_, a), b)| a != b)
                .map_or_else(|| old.prompt.len().min(miss.prompt.len()), |((i, _), _)| i);
            message.push_str(&format!(
                "\n    hint: the prompt changed at byte {at}:\n      recorded: {}\n      now:      {}",
                excerpt(&old.prompt, at),
                excerpt(&miss.prompt, at)
            ));
        }
        Some(_) => message
            .push_str("\n    hint: the recorded call of this label has the same prompt: its schema or model changed"),
        None => message.push_str("\n    hint: no recorded call has this label: a new call"),
    }
    message.push_str("\n    re-record the misses with `factory test --update --backend SPEC`");
    message
}

/// Up to 60 characters of `text` around byte `at`, escaped.
fn excerpt(text: &str, at: usize) -> String {
    let mut start = at.saturating_sub(20);
    while !text.is_char_boundary(start) {
        start -= 1;
    }
    let tail: String = text[start..].chars().take(60).collect();
    format!("{}{}", if start > 0 { "..." } else { "" }, esc(&tail))
}

fn short(key: &str) -> String {
    esc(&key.chars().take(12).collect::<String>()).into_owned()
}

fn print_case(report: &CaseReport) {
    let colored = stderr_colored();
    if report.failures.is_empty() {
        outln!(
            "  {} {} ({:.2}s)",
            paint(colored, AnsiColor::Green.on_default(), "ok  "),
            esc(&report.name),
            report.seconds
        );
    } else {
        outln!(
            "  {} {} ({:.2}s)",
            paint(colored, AnsiColor::Red.on_default(), "FAIL"),
            esc(&report.name),
            report.seconds
        );
        for failure in &report.failures {
            // A failure may quote the run's error (guest text): each of its lines escaped.
            outln!("    - {}", esc_lines(failure));
        }
    }
}

/// The replay-safety report: recorded calls no longer made, new calls made.
fn print_safety(usage: &CassetteUsage) {
    if usage.unused.is_empty() && usage.missed.is_empty() {
        outln!("  replay safety: every call matches the cassette");
        return;
    }
    let label = |c: &RecordedCall| esc(c.label.as_deref().unwrap_or("(no label)")).into_owned();
    if !usage.unused.is_empty() {
        outln!(
            "  replay safety: {} recorded call(s) no longer made (a resume of an older run replays nothing for them):",
            usage.unused.len()
        );
        for c in &usage.unused {
            outln!("    - {} key {} attempt {}", label(c), short(&c.key), c.attempt);
        }
    }
    if !usage.missed.is_empty() {
        outln!("  replay safety: {} new call(s) (a resume of an older run pays for them again):", usage.missed.len());
        for c in &usage.missed {
            outln!("    + {} key {} attempt {}", label(c), short(&c.key), c.attempt);
        }
    }
}

/// A private scratch directory beside the cassette (removed when dropped).
struct Scratch {
    path: PathBuf,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

fn scratch_dir(cassette: &Path) -> Result<Scratch> {
    let dir = cassette.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let path = dir.join(format!(".factory-test-{}", uuid::Uuid::new_v4()));
    factory_host::access::create_private_dir(&path).with_context(|| format!("creating {}", path.display()))?;
    Ok(Scratch { path })
}

/// Rewrite `cassette` with the exchanges of `recordings` (each (key, attempt, outcome) once,
/// in the order first made), through a temporary file renamed into place.
fn write_cassette(cassette: &Path, recordings: &[PathBuf]) -> Result<()> {
    let mut exchanges: Vec<Exchange> = Vec::new();
    for path in recordings {
        for exchange in read_cassette(path)? {
            if !exchanges.contains(&exchange) {
                exchanges.push(exchange);
            }
        }
    }
    // A fresh file of our own in the cassette's directory (`O_EXCL`: never one planted
    // there, nor a symlink), renamed over the cassette: a symlink at its path is replaced,
    // not followed.
    Ok(factory_host::backend::cassette::write_cassette(cassette, &exchanges)?)
}

/// XML text with `&`, `<`, `>`, `"`, `'` escaped and characters XML 1.0 cannot hold shown
/// as `\u{..}`.
fn xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{fffe}' || c == '\u{ffff}' => {
                out.push_str(&format!("\\u{{{:x}}}", c as u32))
            }
            c => out.push(c),
        }
    }
    out
}

/// The JUnit XML report: `<testsuites>`, one `<testsuite>` per test file, one `<testcase>`
/// per case with a `<failure>` per failed case and an `<error>` for an unusable file.
fn junit(reports: &[FileReport]) -> String {
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let total: usize = reports.iter().map(|r| r.cases.len()).sum();
    let failed: usize = reports.iter().map(|r| r.cases.iter().filter(|c| !c.failures.is_empty()).count()).sum();
    let errors = reports.iter().filter(|r| r.error.is_some()).count();
    out.push_str(&format!(
        "<testsuites name=\"factory test\" tests=\"{total}\" failures=\"{failed}\" errors=\"{errors}\">\n"
    ));
    for r in reports {
        let failed = r.cases.iter().filter(|c| !c.failures.is_empty()).count();
        let seconds: f64 = r.cases.iter().map(|c| c.seconds).sum();
        out.push_str(&format!(
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{failed}\" errors=\"{}\" time=\"{seconds:.3}\">\n",
            xml(&r.name),
            r.cases.len(),
            usize::from(r.error.is_some())
        ));
        if let Some(error) = &r.error {
            out.push_str(&format!(
                "    <testcase name=\"(test file)\" classname=\"{}\" time=\"0\">\n      <error message=\"{}\">{}</error>\n    </testcase>\n",
                xml(&r.name),
                xml(error.lines().next().unwrap_or_default()),
                xml(error)
            ));
        }
        for c in &r.cases {
            out.push_str(&format!(
                "    <testcase name=\"{}\" classname=\"{}\" time=\"{:.3}\"",
                xml(&c.name),
                xml(&r.name),
                c.seconds
            ));
            if c.failures.is_empty() {
                out.push_str("/>\n");
            } else {
                let first = c.failures[0].lines().next().unwrap_or_default();
                out.push_str(&format!(
                    ">\n      <failure message=\"{}\">{}</failure>\n    </testcase>\n",
                    xml(first),
                    xml(&c.failures.join("\n"))
                ));
            }
        }
        out.push_str("  </testsuite>\n");
    }
    out.push_str("</testsuites>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xml_escapes_markup_and_control_characters() {
        assert_eq!(xml("a<b & \"c\" 'd'>"), "a&lt;b &amp; &quot;c&quot; &apos;d&apos;&gt;");
        assert_eq!(xml("x\u{1b}[31m"), "x\\u{1b}[31m");
        assert_eq!(xml("line\nnext"), "line\nnext");
    }

    #[test]
    fn usage_merges_across_cases() {
        let call = |k: &str| RecordedCall { key: k.into(), attempt: 0, label: None, prompt: String::new() };
        let mut total = CassetteUsage::default();
        merge_usage(&mut total, CassetteUsage { unused: vec![call("a"), call("b")], missed: vec![call("x")] }, true);
        merge_usage(
            &mut total,
            CassetteUsage { unused: vec![call("b"), call("c")], missed: vec![call("x"), call("y")] },
            false,
        );
        assert_eq!(total.unused, vec![call("b")], "unused by every case");
        assert_eq!(total.missed, vec![call("x"), call("y")], "new in any case");
    }
}
