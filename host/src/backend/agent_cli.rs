//! `cli:<preset>`: a backend that runs an agent CLI (Claude Code, Codex, Copilot CLI, Gemini
//! CLI, or any command) as a child process per subagent. It owns the command template
//! (`{prompt}` and `{model}` placeholders; without `{prompt}` the prompt goes on stdin), the
//! child's environment (only PATH, HOME and an allow-list), parsing the final text (plain
//! stdout, or a JSON output mode with paths for the text, usage, cost and an error flag), and
//! the kill ladder: on timeout, on cancellation and when the call's future is dropped, stdin
//! is closed, the child's process group gets SIGTERM, then SIGKILL after a grace period.

use super::pricing::{float_credits_nano, Pricing};
use super::prompting::{prompt_with_schema, user_prompt};
use super::{AgentBackend, AgentReply, AgentRequest, BackendError, OutageKind, Usage};
use futures::future::BoxFuture;
use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

/// The presets `cli:<preset>` knows.
pub const PRESETS: &[&str] = &["claude", "codex", "copilot", "gemini", "generic"];

/// Where in a JSON output the reply's parts are (dotted paths like `usage.input_tokens`, or
/// JSON pointers like `/usage/input_tokens`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JsonOutput {
    /// The final text (a string; any other value is serialized).
    pub text: String,
    /// Prompt tokens.
    pub input_tokens: Option<String>,
    /// Completion tokens.
    pub output_tokens: Option<String>,
    /// A cost the CLI reports, taken as credits (wins over token pricing).
    pub cost: Option<String>,
    /// A boolean that, when true, makes the call a failure with the text as its message.
    pub is_error: Option<String>,
}

/// How the child's stdout is read.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputMode {
    /// All of stdout, trimmed, is the reply; usage is unknown.
    Text,
    /// Stdout (or its last line that is JSON) is a JSON document read with these paths.
    Json(JsonOutput),
}

/// How an agent-CLI backend is set up.
#[derive(Debug, Clone)]
pub struct AgentCliConfig {
    /// The backend's name in progress output and errors.
    pub name: String,
    /// Program and arguments; `{prompt}` and `{model}` are replaced in each argument.
    pub command: Vec<String>,
    /// Arguments appended when a model is known (`{model}` replaced), e.g. `--model {model}`.
    pub model_args: Vec<String>,
    /// The model used when a call names none (`None`: the CLI's own default).
    pub model: Option<String>,
    /// The child's working directory (default: the host's).
    pub cwd: Option<PathBuf>,
    /// Environment variables passed through besides PATH and HOME.
    pub env: Vec<String>,
    /// How long one call may take (`None`: no limit of its own).
    pub timeout: Option<Duration>,
    /// How long SIGTERM gets before SIGKILL.
    pub grace: Duration,
    /// How stdout is read.
    pub output: OutputMode,
    /// Prices that turn token usage into credits when the CLI reports no cost.
    pub pricing: Pricing,
    /// Nano-credits per unit of the cost the CLI reports (default one credit per unit: a
    /// `total_cost_usd` of 0.5 is 0.5 credits).
    pub credits_per_cost_nano: u64,
    /// Stdout beyond this many bytes is an error (stderr is cut silently).
    pub max_output_bytes: usize,
}

/// A preset name `cli:` does not know, or a generic preset with no command.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CliPresetError {
    /// Not one of [`PRESETS`].
    #[error("unknown agent CLI preset `{0}` (expected one of: claude, codex, copilot, gemini, generic)")]
    Unknown(String),
    /// `generic` needs a command from the config file.
    #[error("the `generic` agent CLI needs a `command` in factory.toml")]
    NoCommand,
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

impl AgentCliConfig {
    /// A config running `command` with plain text output and the defaults.
    pub fn generic(name: impl Into<String>, command: Vec<String>) -> Self {
        AgentCliConfig {
            name: name.into(),
            command,
            model_args: Vec::new(),
            model: None,
            cwd: None,
            env: Vec::new(),
            timeout: Some(Duration::from_secs(30 * 60)),
            grace: Duration::from_secs(5),
            output: OutputMode::Text,
            pricing: Pricing::default(),
            credits_per_cost_nano: super::pricing::NANO_PER_CREDIT,
            max_output_bytes: 16 << 20,
        }
    }

    /// A preset's config: `claude` (`claude -p --output-format json`), `codex` (`codex exec`),
    /// `copilot` (`copilot -p`), `gemini` (`gemini`, prompt on stdin); `generic` has no command.
    pub fn preset(preset: &str) -> Result<Self, CliPresetError> {
        let name = format!("cli:{preset}");
        let config = match preset {
            "claude" => AgentCliConfig {
                model_args: strings(&["--model", "{model}"]),
                env: strings(&["ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CONFIG_DIR"]),
                output: OutputMode::Json(JsonOutput {
                    text: "result".into(),
                    input_tokens: Some("usage.input_tokens".into()),
                    output_tokens: Some("usage.output_tokens".into()),
                    cost: Some("total_cost_usd".into()),
                    is_error: Some("is_error".into()),
                }),
                ..AgentCliConfig::generic(name, strings(&["claude", "-p", "--output-format", "json"]))
            },
            "codex" => AgentCliConfig {
                model_args: strings(&["-m", "{model}"]),
                env: strings(&["OPENAI_API_KEY", "OPENAI_BASE_URL", "CODEX_HOME"]),
                ..AgentCliConfig::generic(name, strings(&["codex", "exec", "-"]))
            },
            "copilot" => AgentCliConfig {
                model_args: strings(&["--model", "{model}"]),
                env: strings(&["GH_TOKEN", "GITHUB_TOKEN", "COPILOT_GITHUB_TOKEN", "XDG_CONFIG_HOME"]),
                ..AgentCliConfig::generic(name, strings(&["copilot", "-p", "{prompt}"]))
            },
            "gemini" => AgentCliConfig {
                model_args: strings(&["-m", "{model}"]),
                env: strings(&[
                    "GEMINI_API_KEY",
                    "GOOGLE_API_KEY",
                    "GOOGLE_CLOUD_PROJECT",
                    "GOOGLE_APPLICATION_CREDENTIALS",
                    "GOOGLE_GENAI_USE_VERTEXAI",
                ]),
                // Gemini CLI reads a piped stdin as its prompt (non-interactive mode).
                ..AgentCliConfig::generic(name, strings(&["gemini"]))
            },
            "generic" => AgentCliConfig::generic(name, Vec::new()),
            other => return Err(CliPresetError::Unknown(other.to_string())),
        };
        Ok(config)
    }

    /// Whether the prompt goes into an argument (`{prompt}` in the template) or on stdin.
    pub fn prompt_in_args(&self) -> bool {
        self.command.iter().any(|a| a.contains("{prompt}"))
    }
}

/// The agent-CLI backend.
pub struct AgentCli {
    config: Arc<AgentCliConfig>,
}

impl AgentCli {
    /// Set up the backend (runs nothing).
    pub fn new(config: AgentCliConfig) -> Result<Self, CliPresetError> {
        if config.command.is_empty() {
            return Err(CliPresetError::NoCommand);
        }
        Ok(AgentCli { config: Arc::new(config) })
    }

    /// The backend's config.
    pub fn config(&self) -> &AgentCliConfig {
        &self.config
    }
}

impl AgentBackend for AgentCli {
    fn name(&self) -> String {
        self.config.name.clone()
    }

    fn call(&self, request: Arc<AgentRequest>) -> BoxFuture<'static, Result<AgentReply, BackendError>> {
        let config = self.config.clone();
        Box::pin(async move { run(&config, &request).await })
    }

    fn unpriced(&self, model: Option<&str>) -> Option<String> {
        let config = &self.config;
        match &config.output {
            OutputMode::Json(paths) if paths.cost.is_some() => None,
            OutputMode::Json(_) => config.pricing.unpriced(&config.name, model.or(config.model.as_deref()).unwrap_or("")),
            OutputMode::Text => Some(format!(
                "backend `{}` reads plain text output, which reports no usage, so maxAiCredits cannot be enforced; \
                 configure `output = \"json\"` with a `cost` or token paths (and prices) in factory.toml, \
                 or run without --max-ai-credits",
                config.name
            )),
        }
    }
}

/// Whether any process of group `pgid` is still running (zombies waiting for a reaper do
/// not count: where PID 1 does not reap, they linger harmlessly).
pub fn group_alive(pgid: i32) -> bool {
    match killpg(Pid::from_raw(pgid), None) {
        Err(Errno::ESRCH) => false,
        Err(_) => true,
        Ok(()) => live_members(pgid).unwrap_or(true),
    }
}

/// Scan /proc for a non-zombie process in group `pgid` (`None` when /proc is unreadable).
fn live_members(pgid: i32) -> Option<bool> {
    let entries = std::fs::read_dir("/proc").ok()?;
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // `pid (comm) state ppid pgrp ...`; comm may hold spaces and parentheses.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else { continue };
        let mut fields = rest.split_whitespace();
        let state = fields.next();
        let pgrp = fields.nth(1).and_then(|p| p.parse::<i32>().ok());
        if pgrp == Some(pgid) && !matches!(state, Some("Z") | Some("X")) {
            return Some(true);
        }
    }
    Some(false)
}

fn signal_group(pgid: i32, signal: Signal) {
    // ESRCH (nothing left) is the good case; nothing else can be done about other errors.
    let _ = killpg(Pid::from_raw(pgid), signal);
}

/// Owns the child; unless disarmed, dropping it runs the kill ladder on a helper thread.
struct GroupGuard {
    child: Option<Child>,
    pgid: i32,
    grace: Duration,
}

impl GroupGuard {
    fn child(&mut self) -> Result<&mut Child, BackendError> {
        self.child.as_mut().ok_or_else(|| BackendError::ordinary("agent CLI: the child is gone"))
    }

    /// The ladder, awaited: SIGTERM to the group, up to `grace` for it to go, then SIGKILL;
    /// the leader is reaped either way. Stdin must already be closed.
    async fn ladder(&mut self) {
        let pgid = self.pgid;
        let Some(child) = self.child.as_mut() else { return };
        signal_group(pgid, Signal::SIGTERM);
        let deadline = Instant::now() + self.grace;
        loop {
            let leader_done = !matches!(child.try_wait(), Ok(None));
            if leader_done && !group_alive(pgid) {
                return;
            }
            if Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        signal_group(pgid, Signal::SIGKILL);
        let _ = child.wait().await;
    }

    /// After a normal exit: end whatever the agent left running in its group.
    async fn sweep(&mut self) {
        if group_alive(self.pgid) {
            self.ladder().await;
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        let (pgid, grace) = (self.pgid, self.grace);
        if matches!(child.try_wait(), Ok(Some(_))) && !group_alive(pgid) {
            return;
        }
        // Dropped mid-call (cancelled): stdin is already closed with the call's future.
        signal_group(pgid, Signal::SIGTERM);
        let ladder = move || {
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline {
                if !matches!(child.try_wait(), Ok(None)) && !group_alive(pgid) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            signal_group(pgid, Signal::SIGKILL);
            // SIGKILL cannot be ignored: reap the leader so no zombie of ours is left.
            while matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        if std::thread::Builder::new().name("agent-cli-reaper".into()).spawn(ladder).is_err() {
            signal_group(pgid, Signal::SIGKILL);
        }
    }
}

/// Read a pipe to its end, keeping the first `cap` bytes; whether more came.
async fn read_capped(mut pipe: impl AsyncRead + Unpin, cap: usize) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut over = false;
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return (kept, over),
            Ok(n) => {
                let room = cap.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
                over |= n > room;
            }
        }
    }
}

/// Substitute `{prompt}` and `{model}` in one pass, so text inside the prompt is never
/// substituted again (a prompt containing `{model}` stays as it is).
fn fill(template: &str, prompt: &str, model: Option<&str>) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(at) = rest.find('{') {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        if let Some(after) = tail.strip_prefix("{prompt}") {
            out.push_str(prompt);
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
fn check_model(who: &str, model: &str) -> Result<(), BackendError> {
    let bad = model.is_empty() || model.starts_with('-') || model.chars().any(|c| c.is_whitespace() || c.is_control());
    if bad {
        let shown: String = model.chars().take(60).flat_map(char::escape_default).collect();
        return Err(BackendError::ordinary(format!(
            "{who}: model name \"{shown}\" refused: it is empty, starts with `-`, or holds whitespace or control characters"
        )));
    }
    Ok(())
}

async fn run(config: &AgentCliConfig, request: &AgentRequest) -> Result<AgentReply, BackendError> {
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
    let mut argv: Vec<String> = config.command.iter().map(|a| fill(a, &prompt, model.as_deref())).collect();
    if let Some(model) = model.as_deref() {
        argv.extend(config.model_args.iter().map(|a| fill(a, &prompt, Some(model))));
    }
    let Some((program, args)) = argv.split_first() else {
        return Err(BackendError::outage(OutageKind::Misconfigured, format!("{who}: empty command")));
    };
    let on_stdin = !config.prompt_in_args();

    let mut command = Command::new(program);
    command
        .args(args)
        .env_clear()
        .stdin(if on_stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(false);
    for var in ["PATH", "HOME"].into_iter().chain(config.env.iter().map(String::as_str)) {
        if let Some(value) = std::env::var_os(var) {
            command.env(var, value);
        }
    }
    if let Some(dir) = &config.cwd {
        command.current_dir(dir);
    }
    let mut child = command.spawn().map_err(|e| {
        // A CLI that is missing or not executable fails every call alike: a backend failure.
        let kind = match e.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => OutageKind::NotInstalled,
            _ => OutageKind::Unavailable,
        };
        BackendError::outage(kind, format!("{who}: cannot start `{program}`: {e}"))
    })?;
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

    let feed = async move {
        if let Some(mut pipe) = stdin {
            // A child that exits without reading its stdin is not an error here.
            let _ = pipe.write_all(prompt.as_bytes()).await;
            let _ = pipe.shutdown().await;
        }
    };
    let waited = {
        let child = guard.child()?;
        let work = async {
            let (_, status) = futures::join!(feed, child.wait());
            status
        };
        match config.timeout {
            Some(limit) => tokio::time::timeout(limit, work).await.ok(),
            None => Some(work.await),
        }
    };
    let status = match waited {
        None => {
            guard.ladder().await;
            let limit = config.timeout.unwrap_or_default();
            return Err(BackendError::ordinary(format!("{who}: timed out after {}s and was killed", limit.as_secs_f64())));
        }
        Some(Err(e)) => {
            guard.ladder().await;
            return Err(BackendError::outage(OutageKind::Unavailable, format!("{who}: waiting for the child failed: {e}")));
        }
        Some(Ok(status)) => status,
    };
    guard.sweep().await;
    let (stdout, over) = out_task.await.unwrap_or_default();
    let (stderr, _) = err_task.await.unwrap_or_default();
    let stderr = String::from_utf8_lossy(&stderr);
    if !status.success() {
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
    match &config.output {
        OutputMode::Text => Ok(AgentReply { text: stdout.trim().to_string(), usage: None }),
        OutputMode::Json(paths) => {
            let mut reply = parse_json_output(who, &stdout, paths, &config.pricing, model.as_deref())?;
            if let (Some(usage), true) = (&mut reply.usage, get_cost_path(paths)) {
                usage.credits_nano = usage.credits_nano.map(|c| scale_cost(c, config.credits_per_cost_nano));
            }
            Ok(reply)
        }
    }
}

/// Whether credits in a parsed reply came from a reported cost (and so need scaling).
fn get_cost_path(paths: &JsonOutput) -> bool {
    paths.cost.is_some()
}

/// `cost_nano` units of reported cost at `per_unit` nano-credits each, saturating.
fn scale_cost(cost_nano: u64, per_unit: u64) -> u64 {
    let scaled = u128::from(cost_nano) * u128::from(per_unit) / u128::from(super::pricing::NANO_PER_CREDIT);
    u64::try_from(scaled).unwrap_or(u64::MAX)
}

/// A dotted path (`a.b.0`) or a JSON pointer (`/a/b/0`) as a pointer.
fn pointer(path: &str) -> String {
    if path.starts_with('/') {
        path.to_string()
    } else {
        path.split('.').map(|p| format!("/{}", p.replace('~', "~0").replace('/', "~1"))).collect()
    }
}

/// Parse a JSON output: the whole stdout, else its last line that is a JSON object.
pub fn parse_json_output(
    who: &str,
    stdout: &str,
    paths: &JsonOutput,
    pricing: &Pricing,
    model: Option<&str>,
) -> Result<AgentReply, BackendError> {
    let doc: serde_json::Value = serde_json::from_str(stdout.trim())
        .ok()
        .or_else(|| {
            stdout
                .lines()
                .rev()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l.trim()).ok())
                .find(|v| v.is_object())
        })
        .ok_or_else(|| BackendError::ordinary(format!("{who}: the output is not JSON")))?;
    let get = |path: &Option<String>| path.as_deref().and_then(|p| doc.pointer(&pointer(p)));
    let text = match doc.pointer(&pointer(&paths.text)) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => return Err(BackendError::ordinary(format!("{who}: the JSON output has no `{}`", paths.text))),
    };
    if get(&paths.is_error).and_then(|v| v.as_bool()) == Some(true) {
        return Err(BackendError::ordinary(format!("{who}: the agent reported an error: {text}")));
    }
    let input = get(&paths.input_tokens).and_then(|v| v.as_u64());
    let output = get(&paths.output_tokens).and_then(|v| v.as_u64());
    let cost = get(&paths.cost).and_then(|v| v.as_f64());
    let usage = match (input, output, cost) {
        (None, None, None) => None,
        (i, o, Some(cost)) => {
            let credits = float_credits_nano(cost).map_err(|e| BackendError::ordinary(format!("{who}: reported cost: {e}")))?;
            Some(Usage { input_tokens: i.unwrap_or(0), output_tokens: o.unwrap_or(0), credits_nano: Some(credits) })
        }
        (i, o, None) => Some(pricing.usage(model.unwrap_or(""), i.unwrap_or(0), o.unwrap_or(0))),
    };
    Ok(AgentReply { text, usage })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_filled_once_and_models_cannot_be_options() {
        assert_eq!(fill("--model={model}", "p", Some("m")), "--model=m");
        // A prompt that mentions `{model}` is not substituted again.
        assert_eq!(fill("{prompt}", "say {model} and {prompt}", Some("-rf")), "say {model} and {prompt}");
        assert_eq!(fill("{x}{prompt}{", "p", None), "{x}p{");
        for bad in ["-x", "--dangerously-skip-permissions", "a b", "a\nb", "", "m\u{1b}[2J"] {
            assert!(check_model("c", bad).is_err(), "{bad:?} accepted");
        }
        assert!(check_model("c", "claude-opus-4.1").is_ok());
    }

    #[test]
    fn presets_and_placeholders() {
        let claude = AgentCliConfig::preset("claude").unwrap();
        assert!(!claude.prompt_in_args());
        assert!(!AgentCliConfig::preset("gemini").unwrap().prompt_in_args(), "gemini reads the prompt on stdin");
        assert_eq!(AgentCliConfig::preset("nope").unwrap_err(), CliPresetError::Unknown("nope".into()));
        assert!(matches!(AgentCli::new(AgentCliConfig::preset("generic").unwrap()), Err(CliPresetError::NoCommand)));
        assert_eq!(fill("--m={model}:{prompt}", "p", Some("m")), "--m=m:p");
        assert_eq!(pointer("usage.input_tokens"), "/usage/input_tokens");
        assert_eq!(pointer("/a/0"), "/a/0");
    }

    #[test]
    fn claude_json_output_gives_text_usage_and_cost() {
        let OutputMode::Json(paths) = AgentCliConfig::preset("claude").unwrap().output else { panic!("json") };
        let out = r#"{"type":"result","is_error":false,"result":"hi","total_cost_usd":0.0123,
                     "usage":{"input_tokens":10,"output_tokens":5}}"#;
        let reply = parse_json_output("c", out, &paths, &Pricing::default(), None).unwrap();
        assert_eq!(reply.text, "hi");
        assert_eq!(reply.usage, Some(Usage { input_tokens: 10, output_tokens: 5, credits_nano: Some(12_300_000) }));
        let err = r#"{"is_error":true,"result":"quota"}"#;
        assert!(parse_json_output("c", err, &paths, &Pricing::default(), None).unwrap_err().message().contains("quota"));
        let lines = "progress\n{\"result\":\"last\"}\n";
        let reply = parse_json_output("c", lines, &paths, &Pricing::default(), None).unwrap();
        assert_eq!((reply.text.as_str(), reply.usage), ("last", None));
        assert!(parse_json_output("c", "plain", &paths, &Pricing::default(), None).is_err());
    }
}
