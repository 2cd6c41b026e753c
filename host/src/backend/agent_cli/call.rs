//! One call of an agent CLI: its command line from the template (the prompt, its file, the
//! model and the per-call flags, each checked), the child started (inside the sandbox or
//! not) with only the allowed environment, the conversation on its pipes under the call's
//! duration limit and the backend's timeout (with the wrap-up), and its reply read.

use super::process::{read_capped, GroupGuard};
use super::sandbox::{no_bubblewrap, resolve_program, Layout};
use super::{parse_json_output, AgentCliConfig, JsonOutput, OutputMode, SandboxMode, WrapUp};
use crate::backend::prompting::{prompt_with_schema, user_prompt};
use crate::backend::{AgentReply, AgentRequest, BackendError, OutageKind, SoftLimit};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Instant;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

/// [`fill_with`] without a prompt file.
#[cfg(test)]
pub(super) fn fill(template: &str, prompt: &str, model: Option<&str>) -> String {
    fill_with(template, prompt, None, model)
}

/// Substitute `{prompt}`, `{prompt_file}` and `{model}` in one pass, so text inside the
/// prompt is never substituted again (a prompt containing `{model}` stays as it is).
pub(super) fn fill_with(template: &str, prompt: &str, prompt_file: Option<&str>, model: Option<&str>) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(at) = rest.find('{') {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        if let Some(after) = tail.strip_prefix("{prompt}") {
            out.push_str(prompt);
            rest = after;
        } else if let Some(after) = tail.strip_prefix("{prompt_file}") {
            out.push_str(prompt_file.unwrap_or(""));
            rest = after;
        } else if let Some(after) = tail.strip_prefix("{model}") {
            out.push_str(model.unwrap_or(""));
            rest = after;
        } else {
            out.push('{');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

/// The longest single command-line argument Linux accepts (`MAX_ARG_STRLEN`, 32 pages).
pub const MAX_ARG_BYTES: usize = 128 * 1024;

/// A model name a factory asked for, checked before it becomes an argument: it must not
/// look like an option or carry whitespace or control characters (it is guest data).
pub(super) fn check_model(who: &str, model: &str) -> Result<(), BackendError> {
    check_name(who, "model", model)
}

/// A name a factory chose (`what`: a model, an agent), checked as [`check_model`] checks a
/// model name.
fn check_name(who: &str, what: &str, name: &str) -> Result<(), BackendError> {
    let bad = name.is_empty() || name.starts_with('-') || name.chars().any(|c| c.is_whitespace() || c.is_control());
    if bad {
        let shown: String = name.chars().take(60).flat_map(char::escape_default).collect();
        return Err(BackendError::ordinary(format!(
            "{who}: {what} name \"{shown}\" refused: it is empty, starts with `-`, or holds whitespace or control characters"
        )));
    }
    Ok(())
}

/// A private directory (0700) for one spawn: the sandboxed CLI's working directory and the
/// home of its prompt file; removed with everything in it when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(who: &str) -> Result<Self, BackendError> {
        use std::os::unix::fs::DirBuilderExt;
        let base = std::env::temp_dir();
        let path = base.join(format!("factory-agent-{}", uuid::Uuid::new_v4().simple()));
        std::fs::DirBuilder::new().mode(0o700).create(&path).map_err(|e| {
            BackendError::outage(
                OutageKind::Unavailable,
                format!("{who}: cannot create a scratch directory in {}: {e}", base.display()),
            )
        })?;
        // Mounted by its real path, so it is the same inside the sandbox and out.
        let path = std::fs::canonicalize(&path).unwrap_or(path);
        Ok(Scratch(path))
    }

    /// Write `prompt` to a new 0600 file in the scratch directory.
    fn prompt_file(&self, who: &str, prompt: &str) -> Result<PathBuf, BackendError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.0.join("prompt.md");
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut file| file.write_all(prompt.as_bytes()));
        written.map_err(|e| {
            BackendError::outage(OutageKind::Unavailable, format!("{who}: cannot write the prompt file: {e}"))
        })?;
        Ok(path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Run one call of the agent CLI `config` describes, to its reply.
pub(super) async fn run(config: &AgentCliConfig, request: &AgentRequest) -> Result<AgentReply, BackendError> {
    let who = &config.name;
    let prompt = prompt_with_schema(&user_prompt(request), request.schema.as_ref());
    let model = request.model.clone().or_else(|| config.model.clone());
    if let Some(model) = &model {
        check_model(who, model)?;
    }
    if config.prompt_in_args() && prompt.len() >= MAX_ARG_BYTES {
        return Err(BackendError::ordinary(format!(
            "{who}: the prompt is {} bytes, over the {MAX_ARG_BYTES}-byte limit of one command-line argument; \
             use a command that reads the prompt on stdin (no `{{prompt}}` in its template)",
            prompt.len()
        )));
    }
    let tool_args = config.tool_args().map_err(|e| BackendError::outage(OutageKind::Misconfigured, e.to_string()))?;
    // Declared before the guard, so it is removed after the child is gone.
    let scratch = Scratch::new(who)?;
    let prompt_file = match config.prompt_in_file() {
        true => Some(scratch.prompt_file(who, &prompt)?.display().to_string()),
        false => None,
    };
    let argv = argv(config, request, tool_args, &prompt, prompt_file.as_deref(), model.as_deref())?;
    let Some((program, args)) = argv.split_first() else {
        return Err(BackendError::outage(OutageKind::Misconfigured, format!("{who}: empty command")));
    };
    let on_stdin = !config.prompt_in_args() && !config.prompt_in_file();
    let soft = request.limits.max_duration();
    // Stdin stays open for the wrap-up while a duration limit runs.
    let keep_open = config.wrap_up == WrapUp::Stdin && soft.is_some();
    let mut child = spawn(config, program, args, &scratch, on_stdin || keep_open)?;
    let pgid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .ok_or_else(|| BackendError::outage(OutageKind::Unavailable, format!("{who}: the child has no pid")))?;
    let stdin = child.stdin.take();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let mut guard = GroupGuard { child: Some(child), pgid, grace: config.grace };

    let cap = config.max_output_bytes;
    let out_task = tokio::spawn(async move {
        match stdout {
            Some(pipe) => read_capped(pipe, cap).await,
            None => (Vec::new(), false),
        }
    });
    let err_task = tokio::spawn(async move {
        match stderr {
            Some(pipe) => read_capped(pipe, 64 * 1024).await,
            None => (Vec::new(), false),
        }
    });

    // In wrap-up mode the prompt is one JSON string line; the pipe is kept for the wrap-up.
    let first = match (on_stdin, config.wrap_up) {
        (false, _) => String::new(),
        (true, WrapUp::None) => prompt,
        (true, WrapUp::Stdin) => message_line(&prompt),
    };
    let fed = Fed { stdin, first, keep_open, soft };
    let (status, ended_by) = match converse(config, request, &mut guard, fed).await? {
        Conversed::Exited(status, ended_by) => (status, ended_by),
        Conversed::CutOff => return Ok(AgentReply::cut_off(SoftLimit::MaxDurationSeconds)),
    };
    guard.sweep().await;
    let (stdout, over) = out_task.await.unwrap_or_default();
    let (stderr, _) = err_task.await.unwrap_or_default();
    let output = Output { status, ended_by, stdout, over, stderr: String::from_utf8_lossy(&stderr).into_owned() };
    reply(config, output, model.as_deref())
}

/// The command line of one call: the template filled in (the prompt, its file, the model),
/// the model's flags, the tool restriction flags, and the call's turn limit, agent and grants
/// where the CLI has flags for them (each name a factory chose checked first).
fn argv(
    config: &AgentCliConfig,
    request: &AgentRequest,
    tool_args: Vec<String>,
    prompt: &str,
    prompt_file: Option<&str>,
    model: Option<&str>,
) -> Result<Vec<String>, BackendError> {
    let who = &config.name;
    let fill = |a: &String| fill_with(a, prompt, prompt_file, model);
    let mut argv: Vec<String> = config.command.iter().map(fill).collect();
    if model.is_some() {
        argv.extend(config.model_args.iter().map(fill));
    }
    argv.extend(tool_args);
    if let Some(turns) = request.limits.max_turns {
        let Some(flag) = &config.turns_flag else {
            return Err(BackendError::outage(
                OutageKind::Misconfigured,
                format!(
                    "{who}: the call sets maxTurns ({turns}) but this agent CLI has no turn-limit flag, so it cannot be \
                     honoured; set `turns_flag` in its factory.toml entry, or drop maxTurns (see README, \"Per-agent soft limits\")"
                ),
            ));
        };
        argv.push(format!("{flag}={turns}"));
    }
    // A call's `agent`, where the CLI has a flag for it (ignored otherwise, as upstream's
    // options are: accepted whatever runs them).
    if let (Some(agent), Some(flag)) = (&request.tuning.agent, &config.agent_flag) {
        check_name(who, "agent", agent)?;
        argv.push(format!("{flag}={agent}"));
    }
    if let Some(flag) = &config.grant_flag {
        argv.extend(config.grants.iter().map(|dir| format!("{flag}={}", dir.display())));
    }
    Ok(argv)
}

/// Start `program` with `args`: inside its bubblewrap sandbox (working in `scratch` unless
/// the config names a directory) or as it is, with only PATH, HOME and the allowed variables,
/// in a process group of its own; its stdin piped when `piped`, else empty.
fn spawn(
    config: &AgentCliConfig,
    program: &str,
    args: &[String],
    scratch: &Scratch,
    piped: bool,
) -> Result<tokio::process::Child, BackendError> {
    let who = &config.name;
    let host_path = std::env::var_os("PATH");
    let mut command = match config.sandbox {
        SandboxMode::None => {
            let mut command = Command::new(program);
            command.args(args);
            if let Some(dir) = &config.cwd {
                command.current_dir(dir);
            }
            command
        }
        SandboxMode::Bubblewrap => {
            let bwrap = resolve_program(&config.bwrap.to_string_lossy(), host_path.as_deref())
                .ok_or_else(|| no_bubblewrap(who, &config.bwrap, "is not installed (not found on PATH)"))?;
            let resolved = resolve_program(program, host_path.as_deref()).ok_or_else(|| {
                BackendError::outage(OutageKind::NotInstalled, format!("{who}: cannot start `{program}`: not found"))
            })?;
            let layout = Layout {
                config,
                home: std::env::var_os("HOME").map(PathBuf::from).filter(|h| h.is_absolute()),
                host_cwd: std::env::current_dir().ok().and_then(|d| std::fs::canonicalize(d).ok()),
                program: &resolved,
                scratch: &scratch.0,
            };
            let mut command = Command::new(&bwrap);
            command.args(layout.args()).arg(&resolved).args(args);
            // bwrap itself starts in a neutral directory; the CLI's is set with --chdir.
            command.current_dir("/");
            command
        }
    };
    command
        .env_clear()
        .stdin(if piped { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(false);
    for var in ["PATH", "HOME"].into_iter().chain(config.env.iter().map(String::as_str)) {
        if let Some(value) = std::env::var_os(var) {
            command.env(var, value);
        }
    }
    command.spawn().map_err(|e| {
        let missing = matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied);
        if config.sandbox == SandboxMode::Bubblewrap && missing {
            return no_bubblewrap(who, &config.bwrap, &format!("cannot be started ({e})"));
        }
        // A CLI that is missing or not executable fails every call alike: a backend failure.
        let kind = if missing { OutageKind::NotInstalled } else { OutageKind::Unavailable };
        BackendError::outage(kind, format!("{who}: cannot start `{program}`: {e}"))
    })
}

/// What a call writes to the child's stdin.
struct Fed {
    /// The child's stdin, when piped.
    stdin: Option<tokio::process::ChildStdin>,
    /// Written first: the prompt (or nothing, when it is in the arguments).
    first: String,
    /// Kept open after `first`, for the wrap-up.
    keep_open: bool,
    /// The call's duration limit.
    soft: Option<std::time::Duration>,
}

/// How the conversation with the child ended.
enum Conversed {
    /// It exited (`ended_by` the duration limit when it answered the wrap-up).
    Exited(std::process::ExitStatus, Option<SoftLimit>),
    /// The duration ran out and the wrap-up, if any, went unanswered: it was stopped.
    CutOff,
}

/// Feed the child and wait for it, until the first of the call's duration limit (then the
/// wrap-up and its grace, when the CLI takes one) and the backend's timeout; a child past
/// them is stopped by the kill ladder.
async fn converse(
    config: &AgentCliConfig,
    request: &AgentRequest,
    guard: &mut GroupGuard,
    fed: Fed,
) -> Result<Conversed, BackendError> {
    let who = &config.name;
    let Fed { stdin, first, keep_open, soft } = fed;
    let mut kept = None;
    let feed = async {
        if let Some(mut pipe) = stdin {
            // A child that exits without reading its stdin is not an error here.
            let _ = pipe.write_all(first.as_bytes()).await;
            match keep_open {
                true => kept = Some(pipe),
                false => {
                    let _ = pipe.shutdown().await;
                }
            }
        }
    };
    let started = Instant::now();
    // The call ends at the first of its soft duration and the backend's own timeout.
    let hard = config.timeout;
    let first_stop = match (soft, hard) {
        (Some(s), Some(h)) => Some(s.min(h)),
        (s, h) => s.or(h),
    };
    let soft_first = soft.is_some_and(|s| hard.is_none_or(|h| s <= h));
    let waited = {
        let child = guard.child()?;
        let work = async {
            let (_, status) = futures::join!(feed, child.wait());
            status
        };
        match first_stop {
            Some(limit) => tokio::time::timeout(limit, work).await.ok(),
            None => Some(work.await),
        }
    };
    let mut ended_by = None;
    let waited = match waited {
        None if soft_first => {
            ended_by = Some(SoftLimit::MaxDurationSeconds);
            match kept.take() {
                // The CLI takes a wrap-up: ask it to finish, and give it its grace (within
                // the backend's own timeout) to answer.
                Some(mut pipe) => {
                    let line = message_line(request.limits.wrap_up_prompt());
                    let _ = pipe.write_all(line.as_bytes()).await;
                    let _ = pipe.shutdown().await;
                    drop(pipe);
                    let mut grace = config.wrap_up_grace;
                    if let Some(h) = hard {
                        grace = grace.min(h.saturating_sub(started.elapsed()));
                    }
                    let child = guard.child()?;
                    tokio::time::timeout(grace, child.wait()).await.ok()
                }
                None => None,
            }
        }
        other => other,
    };
    drop(kept);
    match waited {
        None if ended_by.is_some() => {
            // The duration ran out (and the wrap-up, if any, went unanswered): stopped, with
            // no answer, and the run goes on.
            guard.ladder().await;
            Ok(Conversed::CutOff)
        }
        None => {
            guard.ladder().await;
            let limit = config.timeout.unwrap_or_default();
            Err(BackendError::ordinary(format!("{who}: timed out after {}s and was killed", limit.as_secs_f64())))
        }
        Some(Err(e)) => {
            guard.ladder().await;
            Err(BackendError::outage(OutageKind::Unavailable, format!("{who}: waiting for the child failed: {e}")))
        }
        Some(Ok(status)) => Ok(Conversed::Exited(status, ended_by)),
    }
}

/// What an exited child left: its status, its output (capped: `over` when more came).
struct Output {
    status: std::process::ExitStatus,
    ended_by: Option<SoftLimit>,
    stdout: Vec<u8>,
    over: bool,
    stderr: String,
}

/// The reply of a child that exited: its answer read as the config's output mode says, or
/// why it gave none (bubblewrap could not start, it failed, its output was over the cap).
fn reply(config: &AgentCliConfig, output: Output, model: Option<&str>) -> Result<AgentReply, BackendError> {
    let who = &config.name;
    let Output { status, ended_by, stdout, over, stderr } = output;
    if !status.success() {
        // bwrap reports its own failures (no user namespaces, a mount it cannot make) as
        // `bwrap: ...` on stderr: the sandbox could not start, so no answer was given.
        if config.sandbox == SandboxMode::Bubblewrap {
            if let Some(line) = crate::bwrap::own_failure(&stderr) {
                let line: String = line.chars().take(300).collect();
                return Err(BackendError::outage(
                    OutageKind::Misconfigured,
                    format!("{who}: the bubblewrap sandbox could not start: {line}"),
                ));
            }
        }
        if let Some(limit) = ended_by {
            // It stopped on the wrap-up without an answer: the soft limit ended it.
            return Ok(AgentReply::cut_off(limit));
        }
        let tail: String = {
            let t = stderr.trim();
            let skip = t.chars().count().saturating_sub(500);
            t.chars().skip(skip).collect()
        };
        return Err(BackendError::ordinary(format!("{who}: exited with {status}: {tail}")));
    }
    if over {
        return Err(BackendError::ordinary(format!("{who}: output over {} bytes", config.max_output_bytes)));
    }
    let stdout = String::from_utf8_lossy(&stdout);
    let mut reply = match &config.output {
        OutputMode::Text => AgentReply::new(stdout.trim(), None),
        OutputMode::Json(paths) => {
            let mut reply = parse_json_output(who, &stdout, paths, &config.pricing, model)?;
            if let (Some(usage), true) = (&mut reply.usage, get_cost_path(paths)) {
                usage.credits_nano = usage.credits_nano.map(|c| scale_cost(c, config.credits_per_cost_nano));
            }
            reply
        }
    };
    // Answered after the wrap-up: the duration limit ended it (a turn limit it reports too
    // came first).
    reply.ended_by = reply.ended_by.or(ended_by);
    Ok(reply)
}

/// One stdin message of a CLI that takes a wrap-up: `text` as a JSON string, one line.
fn message_line(text: &str) -> String {
    let mut line = serde_json::Value::String(text.to_string()).to_string();
    line.push('\n');
    line
}

/// Whether credits in a parsed reply came from a reported cost (and so need scaling).
fn get_cost_path(paths: &JsonOutput) -> bool {
    paths.cost.is_some()
}

/// `cost_nano` units of reported cost at `per_unit` nano-credits each, saturating.
fn scale_cost(cost_nano: u64, per_unit: u64) -> u64 {
    let scaled = u128::from(cost_nano) * u128::from(per_unit) / u128::from(crate::backend::pricing::NANO_PER_CREDIT);
    u64::try_from(scaled).unwrap_or(u64::MAX)
}
