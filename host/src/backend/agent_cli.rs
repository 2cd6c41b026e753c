//! `cli:<preset>`: a backend that runs an agent CLI (Claude Code, Codex, Copilot CLI, Gemini
//! CLI, or any command) as a child process per subagent. It owns the command template
//! (`{prompt}`, `{prompt_file}` and `{model}` placeholders; without `{prompt}` the prompt goes
//! on stdin, and no preset puts it in argv, which every local user can read in `ps`), the
//! child's environment (only PATH, HOME and an allow-list), the OS sandbox it runs in
//! (bubblewrap by default, see [`SandboxMode`]), the per-spawn tool restriction flags, parsing
//! the final text (plain stdout, or a JSON output mode with paths for the text, usage, cost
//! and an error flag), the call's soft limits (`maxTurns` through the CLI's turn flag;
//! `maxDurationSeconds` by the wrap-up prompt, when the CLI takes one, then the kill ladder),
//! and the kill ladder: on timeout, on cancellation and when the call's future is dropped,
//! stdin is closed, the child's process group gets SIGTERM, then SIGKILL after a grace period.

use super::flow::{Flow, FlowLimits};
use super::pricing::{float_credits_nano, Pricing};
use super::prompting::{prompt_with_schema, user_prompt};
use super::{AgentBackend, AgentReply, AgentRequest, BackendError, Hidden, OutageKind, SoftLimit, Usage};
use futures::future::BoxFuture;
use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

/// The presets `cli:<preset>` knows.
pub const PRESETS: &[&str] = &["claude", "codex", "copilot", "gemini", "generic"];

/// Where in a JSON output the reply's parts are (dotted paths like `usage.input_tokens`, or
/// JSON pointers like `/usage/input_tokens`); also a `[backends.NAME.json]` table of the
/// config file.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonOutput {
    /// The final text (a string; any other value is serialized).
    pub text: String,
    /// Prompt tokens.
    pub input_tokens: Option<String>,
    /// Completion tokens.
    pub output_tokens: Option<String>,
    /// Prompt tokens read from the provider's cache.
    pub cache_read_tokens: Option<String>,
    /// Prompt tokens written to the provider's cache.
    pub cache_write_tokens: Option<String>,
    /// A cost the CLI reports, in units of [`AgentCliConfig::credits_per_cost_nano`] (wins
    /// over token pricing).
    pub cost: Option<String>,
    /// A boolean that, when true, makes the call a failure with the text as its message.
    pub is_error: Option<String>,
    /// A string saying why the CLI stopped; [`MAX_TURNS_REASON`] there means its turn limit
    /// ended the call (claude: `subtype`).
    pub stop_reason: Option<String>,
}

/// The `stop_reason` value that means the CLI's turn limit ended the call (Claude Code's
/// `subtype` spelling).
pub const MAX_TURNS_REASON: &str = "error_max_turns";

/// Whether (and how) a CLI takes a wrap-up prompt while it works.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WrapUp {
    /// It does not: at `maxDurationSeconds` the kill ladder starts at once.
    #[default]
    None,
    /// Its stdin carries messages, one JSON string per line: the prompt is the first line
    /// (when the prompt goes on stdin); stdin stays open while a `maxDurationSeconds` runs,
    /// and when it is up the wrap-up prompt is the next line and stdin closes. The CLI then
    /// has [`AgentCliConfig::wrap_up_grace`] to print its answer and exit before the ladder.
    Stdin,
}

/// How the child's stdout is read.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputMode {
    /// All of stdout, trimmed, is the reply; usage is unknown.
    Text,
    /// Stdout (or its last line that is JSON) is a JSON document read with these paths.
    Json(JsonOutput),
}

/// Where an agent CLI's child runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SandboxMode {
    /// Inside bubblewrap (`bwrap`), the default: a fresh scratch working directory per spawn
    /// (writable, removed after), the run's grants read-only (at their own paths and at
    /// `/grant/<i>`), the system directories and the home directory read-only (except the
    /// CLI's own config, [`AgentCliConfig::writable`], and minus [`AgentCliConfig::hidden`]),
    /// the host's working directory hidden, [`AgentCliConfig::sealed`] hidden everywhere,
    /// `/tmp` private, new pid/ipc/uts namespaces, a new session, no capabilities, dying with
    /// the host; the network is shared (the CLI must reach its model). Without `bwrap` a
    /// spawn fails as a `not_installed` backend failure.
    #[default]
    Bubblewrap,
    /// No sandbox (`sandbox = "none"`): the CLI runs as the user, in `cwd` or the host's
    /// working directory, with everything the user can reach.
    None,
}

/// The flags a CLI takes to restrict its tools; each list is passed as one `FLAG=a,b`
/// argument. `None`: the CLI has no such flag (a list for it is refused).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolFlags {
    /// The flag that lists the tools the agent may use (claude: `--allowedTools`).
    pub allowed: Option<String>,
    /// The flag that lists the tools it may not use (claude: `--disallowedTools`).
    pub disallowed: Option<String>,
}

/// Home-relative paths a sandboxed CLI never sees (besides the host's working directory and
/// what [`AgentCliConfig::hidden`] and [`AgentCliConfig::sealed`] add): keys and credentials
/// of other tools, and the factory's own default state and config directories.
pub const DEFAULT_HIDDEN: &[&str] = &[
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".kube",
    ".docker",
    ".netrc",
    ".git-credentials",
    ".password-store",
    ".local/state/factory",
    ".config/factory",
];

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
    /// Nano-credits per unit of the cost the CLI reports (default one credit per unit; the
    /// `claude` preset's `total_cost_usd` is in US dollars: 100 credits per unit).
    pub credits_per_cost_nano: u64,
    /// Stdout beyond this many bytes is an error (stderr is cut silently).
    pub max_output_bytes: usize,
    /// Where the child runs (default: inside bubblewrap).
    pub sandbox: SandboxMode,
    /// The bubblewrap program (default `bwrap`, looked up on PATH).
    pub bwrap: PathBuf,
    /// Paths (relative to the home directory, or absolute) the sandboxed CLI may write: its
    /// own config and session state (the preset's, e.g. `.claude` and `.claude.json`).
    pub writable: Vec<PathBuf>,
    /// Paths (relative to the home directory, or absolute) hidden from the sandboxed CLI,
    /// besides [`DEFAULT_HIDDEN`], unless a grant shows them (a run's [`Hidden::unless_granted`],
    /// the caller's working directory, is added here).
    pub hidden: Vec<PathBuf>,
    /// Absolute paths hidden from the sandboxed CLI wherever they appear, inside a grant,
    /// `cwd` or a writable path too: the serving process's state directories, token files and
    /// control socket, set per run by [`AgentBackend::hiding`] ([`Hidden::sealed`]).
    pub sealed: Vec<PathBuf>,
    /// Directories the run was granted (read-only): set per run by
    /// [`AgentBackend::with_grants`].
    pub grants: Vec<PathBuf>,
    /// The tools the agent may use (passed with [`ToolFlags::allowed`]); empty: no flag.
    pub allowed_tools: Vec<String>,
    /// The tools the agent may not use (passed with [`ToolFlags::disallowed`]).
    pub disallowed_tools: Vec<String>,
    /// The CLI's tool-restriction flags (the preset's).
    pub tool_flags: ToolFlags,
    /// The flag that lets the CLI's own file tools reach a directory outside its working
    /// directory, passed as `FLAG=DIR` for each grant (claude and copilot: `--add-dir`).
    pub grant_flag: Option<String>,
    /// The flag that caps the agent's turns, passed as `FLAG=N` for a call with `maxTurns`
    /// (claude: `--max-turns`); `None`: a call with `maxTurns` is refused (a backend failure).
    pub turns_flag: Option<String>,
    /// The flag that picks the agent (persona) a call runs as, passed as `FLAG=NAME` for a
    /// call with `agent` (claude and copilot: `--agent`); `None`: the option is ignored.
    pub agent_flag: Option<String>,
    /// Whether the CLI takes a wrap-up prompt (no preset does today).
    pub wrap_up: WrapUp,
    /// How long a CLI has to answer after the wrap-up prompt, before the kill ladder.
    pub wrap_up_grace: Duration,
    /// Agents of this backend running at once in the process (`None`: the machine's cores);
    /// the rest wait in its flow, first come first served.
    pub max_concurrent: Option<u32>,
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
    /// A tool restriction the CLI has no flag for (it would be silently ignored).
    #[error("agent CLI `{name}` has no flag to pass `{field}` (see README, \"Restricting an agent CLI's tools\"); remove it, or set `{field}_flag` for a CLI that has one")]
    NoToolFlag { name: String, field: &'static str },
    /// A tool name that is empty, starts with `-`, or holds a comma or a control character.
    #[error("agent CLI `{name}`: tool name {tool:?} refused (empty, starts with `-`, or holds a comma or a control character)")]
    BadTool { name: String, tool: String },
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn paths(items: &[&str]) -> Vec<PathBuf> {
    items.iter().map(PathBuf::from).collect()
}

fn flags(allowed: Option<&str>, disallowed: Option<&str>) -> ToolFlags {
    ToolFlags { allowed: allowed.map(str::to_string), disallowed: disallowed.map(str::to_string) }
}

/// The copilot preset's `-p` text: it names the prompt's file, never the prompt.
const COPILOT_PROMPT: &str =
    "Your task is in the file {prompt_file}. Read that file and do exactly what it says; your reply is your final answer.";

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
            sandbox: SandboxMode::Bubblewrap,
            bwrap: PathBuf::from("bwrap"),
            writable: Vec::new(),
            hidden: Vec::new(),
            sealed: Vec::new(),
            grants: Vec::new(),
            allowed_tools: Vec::new(),
            disallowed_tools: Vec::new(),
            tool_flags: ToolFlags::default(),
            grant_flag: None,
            turns_flag: None,
            agent_flag: None,
            wrap_up: WrapUp::None,
            wrap_up_grace: Duration::from_secs(30),
            max_concurrent: None,
        }
    }

    /// A preset's config: `claude` (`claude -p --output-format json`, prompt on stdin, tools
    /// via `--allowedTools`/`--disallowedTools`, writes `~/.claude` and `~/.claude.json`),
    /// `codex` (`codex exec -`, prompt on stdin, no tool flags, writes `~/.codex`), `copilot`
    /// (`copilot -p` naming a 0600 file that holds the prompt, tools via
    /// `--allow-tool`/`--deny-tool`, writes `~/.copilot`), `gemini` (`gemini`, prompt on stdin,
    /// `--allowed-tools` only, writes `~/.gemini`); `generic` has no command.
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
                    cache_read_tokens: Some("usage.cache_read_input_tokens".into()),
                    cache_write_tokens: Some("usage.cache_creation_input_tokens".into()),
                    cost: Some("total_cost_usd".into()),
                    is_error: Some("is_error".into()),
                    stop_reason: Some("subtype".into()),
                }),
                // `total_cost_usd` is in US dollars: 100 credits each.
                credits_per_cost_nano: super::pricing::CREDITS_PER_USD * super::pricing::NANO_PER_CREDIT,
                writable: paths(&[".claude", ".claude.json"]),
                tool_flags: flags(Some("--allowedTools"), Some("--disallowedTools")),
                grant_flag: Some("--add-dir".into()),
                turns_flag: Some("--max-turns".into()),
                agent_flag: Some("--agent".into()),
                ..AgentCliConfig::generic(name, strings(&["claude", "-p", "--output-format", "json"]))
            },
            "codex" => AgentCliConfig {
                model_args: strings(&["-m", "{model}"]),
                env: strings(&["OPENAI_API_KEY", "OPENAI_BASE_URL", "CODEX_HOME"]),
                writable: paths(&[".codex"]),
                ..AgentCliConfig::generic(name, strings(&["codex", "exec", "-"]))
            },
            "copilot" => AgentCliConfig {
                model_args: strings(&["--model", "{model}"]),
                env: strings(&["GH_TOKEN", "GITHUB_TOKEN", "COPILOT_GITHUB_TOKEN", "XDG_CONFIG_HOME"]),
                writable: paths(&[".copilot"]),
                tool_flags: flags(Some("--allow-tool"), Some("--deny-tool")),
                grant_flag: Some("--add-dir".into()),
                agent_flag: Some("--agent".into()),
                // Copilot CLI takes its prompt only as `-p TEXT`; argv is readable by every
                // local user, so the text only names the private file that holds the prompt.
                ..AgentCliConfig::generic(name, strings(&["copilot", "-p", COPILOT_PROMPT]))
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
                writable: paths(&[".gemini"]),
                tool_flags: flags(Some("--allowed-tools"), None),
                // Gemini CLI reads a piped stdin as its prompt (non-interactive mode).
                ..AgentCliConfig::generic(name, strings(&["gemini"]))
            },
            "generic" => AgentCliConfig::generic(name, Vec::new()),
            other => return Err(CliPresetError::Unknown(other.to_string())),
        };
        Ok(config)
    }

    /// Whether the prompt goes into an argument (`{prompt}` in the template: visible to every
    /// local user in `ps`) rather than on stdin or in a file.
    pub fn prompt_in_args(&self) -> bool {
        self.command.iter().any(|a| a.contains("{prompt}"))
    }

    /// Whether the prompt goes into a private file whose path is `{prompt_file}` (then, as with
    /// `{prompt}`, stdin is not used).
    pub fn prompt_in_file(&self) -> bool {
        self.command.iter().any(|a| a.contains("{prompt_file}"))
    }

    /// The tool-restriction arguments (`FLAG=a,b`), checked.
    pub fn tool_args(&self) -> Result<Vec<String>, CliPresetError> {
        let mut args = Vec::new();
        let lists = [
            ("allowed_tools", &self.allowed_tools, &self.tool_flags.allowed),
            ("disallowed_tools", &self.disallowed_tools, &self.tool_flags.disallowed),
        ];
        for (field, tools, flag) in lists {
            if tools.is_empty() {
                continue;
            }
            let Some(flag) = flag else { return Err(CliPresetError::NoToolFlag { name: self.name.clone(), field }) };
            if let Some(bad) = tools.iter().find(|t| {
                t.trim().is_empty() || t.starts_with('-') || t.contains(',') || t.chars().any(char::is_control)
            }) {
                return Err(CliPresetError::BadTool { name: self.name.clone(), tool: bad.clone() });
            }
            args.push(format!("{flag}={}", tools.join(",")));
        }
        Ok(args)
    }

    /// This config with `hidden` added: [`Hidden::unless_granted`] to [`AgentCliConfig::hidden`],
    /// [`Hidden::sealed`] to [`AgentCliConfig::sealed`].
    pub fn hiding(&self, hidden: &Hidden) -> Self {
        let mut config = self.clone();
        config.hidden.extend(hidden.unless_granted.iter().cloned());
        config.sealed.extend(hidden.sealed.iter().cloned());
        config
    }

    /// One line for consent prompts: what runs the subagents, and with what reach.
    pub fn describe(&self) -> String {
        let mut tools = String::new();
        if !self.allowed_tools.is_empty() {
            tools.push_str(&format!("; tools allowed: {}", self.allowed_tools.join(", ")));
        }
        if !self.disallowed_tools.is_empty() {
            tools.push_str(&format!("; tools denied: {}", self.disallowed_tools.join(", ")));
        }
        match self.sandbox {
            SandboxMode::Bubblewrap => {
                let writable: Vec<String> = self.writable.iter().map(|p| format!("~/{}", p.display())).collect();
                let workdir = match &self.cwd {
                    Some(dir) => format!("working directory {} (writable)", dir.display()),
                    None => "a scratch working directory".to_string(),
                };
                format!(
                    "{} (an agent CLI with tools, sandboxed by bubblewrap: {workdir}, the grants read-only, \
                     system and home read-only{}, network allowed{tools})",
                    self.name,
                    if writable.is_empty() { String::new() } else { format!(" except {}", writable.join(" ")) },
                )
            }
            SandboxMode::None => format!(
                "{} (an agent CLI with tools, NOT sandboxed: it runs as you in {}, with your files, tools and network{tools})",
                self.name,
                self.cwd.as_ref().map_or("the working directory".to_string(), |d| d.display().to_string()),
            ),
        }
    }
}

/// The agent-CLI backend.
pub struct AgentCli {
    config: Arc<AgentCliConfig>,
    /// Agents running at once: one flow per backend name in the process.
    flow: Arc<Flow>,
}

impl AgentCli {
    /// Set up the backend (runs nothing).
    pub fn new(config: AgentCliConfig) -> Result<Self, CliPresetError> {
        if config.command.is_empty() {
            return Err(CliPresetError::NoCommand);
        }
        config.tool_args()?;
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get()) as u32;
        let limits = FlowLimits::concurrency(config.max_concurrent.unwrap_or(cores));
        let flow = super::flow::flow(&format!("cli {}", config.name), &config.name, &limits);
        Ok(AgentCli { config: Arc::new(config), flow })
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
        let flow = self.flow.clone();
        Box::pin(async move {
            // Held while the agent runs; the rest of a fan-out waits for a place.
            let _permit = flow.admit(0).await;
            // A CLI's stderr can echo the keys it was given: mask their values, and the
            // credential patterns, before the message reaches an envelope or a journal.
            let secrets: Vec<String> = config
                .env
                .iter()
                .filter(|var| {
                    ["KEY", "TOKEN", "SECRET", "PASSWORD"].iter().any(|w| var.to_ascii_uppercase().contains(w))
                })
                .filter_map(|var| std::env::var(var).ok())
                .collect();
            let secrets: Vec<&str> = secrets.iter().map(String::as_str).collect();
            run(&config, &request).await.map_err(|e| super::redact::redact_error(e, &secrets))
        })
    }

    fn with_grants(&self, grants: &[String]) -> Option<Arc<dyn AgentBackend>> {
        let grants = grants.iter().map(PathBuf::from).collect();
        Some(Arc::new(AgentCli {
            config: Arc::new(AgentCliConfig { grants, ..(*self.config).clone() }),
            flow: self.flow.clone(),
        }))
    }

    fn hiding(&self, hidden: &Hidden) -> Option<Arc<dyn AgentBackend>> {
        Some(Arc::new(AgentCli { config: Arc::new(self.config.hiding(hidden)), flow: self.flow.clone() }))
    }

    fn flows(&self) -> Vec<Arc<Flow>> {
        vec![self.flow.clone()]
    }

    fn describe(&self) -> String {
        self.config.describe()
    }

    fn unpriced(&self, model: Option<&str>) -> Option<String> {
        let config = &self.config;
        match &config.output {
            OutputMode::Json(paths) if paths.cost.is_some() => None,
            OutputMode::Json(_) => {
                config.pricing.unpriced(&config.name, model.or(config.model.as_deref()).unwrap_or(""))
            }
            OutputMode::Text => Some(format!(
                "backend `{}` reads plain text output, which reports no usage, so maxAiCredits cannot be enforced; \
                 configure `output = \"json\"` with a `cost` or token paths (and prices) in factory.toml, \
                 or lift the budget for one run with --max-ai-credits none",
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

/// [`fill_with`] without a prompt file.
#[cfg(test)]
fn fill(template: &str, prompt: &str, model: Option<&str>) -> String {
    fill_with(template, prompt, None, model)
}

/// Substitute `{prompt}`, `{prompt_file}` and `{model}` in one pass, so text inside the
/// prompt is never substituted again (a prompt containing `{model}` stays as it is).
fn fill_with(template: &str, prompt: &str, prompt_file: Option<&str>, model: Option<&str>) -> String {
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
fn check_model(who: &str, model: &str) -> Result<(), BackendError> {
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

/// The system directories a sandboxed CLI sees, read-only (those that exist).
const SYSTEM_DIRS: &[&str] = &[
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/opt",
    "/nix",
    "/snap",
    "/run/systemd/resolve",
    "/run/resolvconf",
];

/// `program` as an absolute path: as given when it holds a `/`, else found on `path`.
fn resolve_program(program: &str, path: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    if program.contains('/') {
        return std::path::absolute(program).ok().filter(|p| p.is_file());
    }
    std::env::split_paths(path?).map(|dir| dir.join(program)).find(|candidate| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(candidate).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// What a sandboxed spawn's mounts depend on.
struct Layout<'a> {
    config: &'a AgentCliConfig,
    /// `$HOME`, when set.
    home: Option<PathBuf>,
    /// The host's working directory (canonical), hidden unless granted.
    host_cwd: Option<PathBuf>,
    /// The CLI itself, bound read-only when it lies outside what the sandbox shows.
    program: &'a Path,
    scratch: &'a Path,
}

impl Layout<'_> {
    /// Whether `path` lies in a tree the sandbox mounts (system directories, home).
    fn visible(&self, path: &Path) -> bool {
        SYSTEM_DIRS.iter().any(|d| path.starts_with(d)) || self.home.as_ref().is_some_and(|h| path.starts_with(h))
    }

    /// The paths hidden unless granted ([`DEFAULT_HIDDEN`], [`AgentCliConfig::hidden`], the
    /// host's working directory), canonical, those that exist.
    fn hidden(&self) -> Vec<PathBuf> {
        let mut hidden: Vec<PathBuf> = DEFAULT_HIDDEN.iter().filter_map(|p| self.in_home(Path::new(p))).collect();
        hidden.extend(self.config.hidden.iter().filter_map(|p| self.in_home(p)));
        hidden.extend(self.host_cwd.clone());
        canonical_set(&hidden)
    }

    /// Where `real` appears inside the sandbox once everything is mounted: at its own path
    /// when a mounted tree holds it (system directories, home, a grant, `cwd`), and below
    /// `/grant/<i>` when grant `i` holds it.
    fn appearances(&self, real: &Path) -> Vec<PathBuf> {
        let mut at = Vec::new();
        let own = self.visible(real)
            || self.config.grants.iter().any(|g| real.starts_with(g))
            || self.config.cwd.as_ref().is_some_and(|c| real.starts_with(c));
        if own {
            at.push(real.to_path_buf());
        }
        for (index, grant) in self.config.grants.iter().enumerate() {
            if let Ok(rest) = real.strip_prefix(grant) {
                at.push(PathBuf::from(crate::model::grant::mount_point(index)).join(rest));
            }
        }
        at
    }

    fn in_home(&self, path: &Path) -> Option<PathBuf> {
        if path.is_absolute() {
            Some(path.to_path_buf())
        } else {
            self.home.as_ref().map(|h| h.join(path))
        }
    }

    /// The `bwrap` arguments before `--` and the command.
    fn args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = Vec::new();
        let mut push = |items: &[&std::ffi::OsStr]| args.extend(items.iter().map(|s| s.to_os_string()));
        let os = |s: &'static str| std::ffi::OsStr::new(s);
        push(&[
            os("--die-with-parent"),
            os("--new-session"),
            os("--unshare-pid"),
            os("--unshare-ipc"),
            os("--unshare-uts"),
            os("--unshare-cgroup-try"),
            os("--cap-drop"),
            os("ALL"),
        ]);
        for &dir in SYSTEM_DIRS {
            push(&[os("--ro-bind-try"), os(dir), os(dir)]);
        }
        push(&[os("--dev"), os("/dev"), os("--proc"), os("/proc"), os("--tmpfs"), os("/tmp")]);
        if let Some(home) = &self.home {
            push(&[os("--ro-bind-try"), home.as_os_str(), home.as_os_str()]);
        }
        // Hidden unless granted: other tools' keys, the factory's default state, the host's
        // (and the caller's) working directory.
        let hidden = self.hidden();
        for real in &hidden {
            if self.visible(real) {
                push(&refs(&mask(real, real)));
            }
        }
        for path in self.config.writable.iter().filter_map(|p| self.in_home(p)) {
            push(&[os("--bind-try"), path.as_os_str(), path.as_os_str()]);
        }
        let masked = |p: &Path| hidden.iter().any(|h| p.starts_with(h));
        if !self.visible(self.program) || masked(self.program) {
            push(&[os("--ro-bind"), self.program.as_os_str(), self.program.as_os_str()]);
        }
        for (index, grant) in self.config.grants.iter().enumerate() {
            let inside = OsString::from(crate::model::grant::mount_point(index));
            push(&[os("--ro-bind"), grant.as_os_str(), grant.as_os_str()]);
            push(&[os("--ro-bind"), grant.as_os_str(), inside.as_os_str()]);
        }
        if let Some(dir) = &self.config.cwd {
            push(&[os("--bind"), dir.as_os_str(), dir.as_os_str()]);
        }
        // Sealed, last, so no grant, `cwd` or writable path shows them again: the serving
        // process's state directories, token files and control socket.
        for real in canonical_set(&self.config.sealed) {
            for at in self.appearances(&real) {
                push(&refs(&mask(&real, &at)));
            }
        }
        push(&[os("--bind"), self.scratch.as_os_str(), self.scratch.as_os_str()]);
        let workdir = self.config.cwd.as_deref().unwrap_or(self.scratch);
        push(&[os("--chdir"), workdir.as_os_str()]);
        args
    }
}

/// `paths` canonical (those that exist), sorted, without `/` and without those inside another
/// (a mask over a path inside a masked directory would create it there again, empty).
fn canonical_set(paths: &[PathBuf]) -> Vec<PathBuf> {
    let mut real: Vec<PathBuf> =
        paths.iter().filter_map(|p| std::fs::canonicalize(p).ok()).filter(|p| p != Path::new("/")).collect();
    real.sort();
    let mut kept: Vec<PathBuf> = Vec::with_capacity(real.len());
    for path in real {
        if !kept.iter().any(|outer| path.starts_with(outer)) {
            kept.push(path);
        }
    }
    kept
}

/// The `bwrap` arguments that hide `real` (an existing path) where it appears as `at`: an
/// empty directory nobody in the sandbox can write (it has no capabilities) over a
/// directory, `/dev/null` over anything else (a file, a socket).
fn mask(real: &Path, at: &Path) -> Vec<OsString> {
    let at = at.as_os_str().to_os_string();
    match std::fs::metadata(real) {
        Ok(m) if m.is_dir() => vec!["--perms".into(), "0555".into(), "--tmpfs".into(), at],
        _ => vec!["--ro-bind".into(), "/dev/null".into(), at],
    }
}

/// Borrowed views of `args`, for the layout's `push`.
fn refs(args: &[OsString]) -> Vec<&std::ffi::OsStr> {
    args.iter().map(OsString::as_os_str).collect()
}

/// A bubblewrap that is not there: a backend failure naming what to install.
fn no_bubblewrap(who: &str, bwrap: &Path, why: &str) -> BackendError {
    BackendError::outage(
        OutageKind::NotInstalled,
        format!(
            "{who}: bubblewrap (`{}`), which sandboxes agent CLIs, {why}: install it (Debian/Ubuntu: \
             `apt install bubblewrap`), or run this backend unsandboxed with `sandbox = \"none\"` in its \
             factory.toml entry (see README, \"Security model\")",
            bwrap.display()
        ),
    )
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
    let tool_args = config.tool_args().map_err(|e| BackendError::outage(OutageKind::Misconfigured, e.to_string()))?;
    // Declared before the guard, so it is removed after the child is gone.
    let scratch = Scratch::new(who)?;
    let prompt_file = match config.prompt_in_file() {
        true => Some(scratch.prompt_file(who, &prompt)?.display().to_string()),
        false => None,
    };
    let fill = |a: &String| fill_with(a, &prompt, prompt_file.as_deref(), model.as_deref());
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
    let Some((program, args)) = argv.split_first() else {
        return Err(BackendError::outage(OutageKind::Misconfigured, format!("{who}: empty command")));
    };
    let on_stdin = !config.prompt_in_args() && !config.prompt_in_file();
    let soft = request.limits.max_duration();
    // Stdin stays open for the wrap-up while a duration limit runs.
    let keep_open = config.wrap_up == WrapUp::Stdin && soft.is_some();
    let piped = on_stdin || keep_open;
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
            command.args(layout.args()).arg("--").arg(&resolved).args(args);
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
    let mut child = command.spawn().map_err(|e| {
        let missing = matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied);
        if config.sandbox == SandboxMode::Bubblewrap && missing {
            return no_bubblewrap(who, &config.bwrap, &format!("cannot be started ({e})"));
        }
        // A CLI that is missing or not executable fails every call alike: a backend failure.
        let kind = if missing { OutageKind::NotInstalled } else { OutageKind::Unavailable };
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

    // In wrap-up mode the prompt is one JSON string line; the pipe is kept for the wrap-up.
    let first = match (on_stdin, config.wrap_up) {
        (false, _) => String::new(),
        (true, WrapUp::None) => prompt,
        (true, WrapUp::Stdin) => message_line(&prompt),
    };
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
    let status = match waited {
        None if ended_by.is_some() => {
            // The duration ran out (and the wrap-up, if any, went unanswered): stopped, with
            // no answer, and the run goes on.
            guard.ladder().await;
            return Ok(AgentReply::cut_off(SoftLimit::MaxDurationSeconds));
        }
        None => {
            guard.ladder().await;
            let limit = config.timeout.unwrap_or_default();
            return Err(BackendError::ordinary(format!(
                "{who}: timed out after {}s and was killed",
                limit.as_secs_f64()
            )));
        }
        Some(Err(e)) => {
            guard.ladder().await;
            return Err(BackendError::outage(
                OutageKind::Unavailable,
                format!("{who}: waiting for the child failed: {e}"),
            ));
        }
        Some(Ok(status)) => status,
    };
    guard.sweep().await;
    let (stdout, over) = out_task.await.unwrap_or_default();
    let (stderr, _) = err_task.await.unwrap_or_default();
    let stderr = String::from_utf8_lossy(&stderr);
    if !status.success() {
        // bwrap reports its own failures (no user namespaces, a mount it cannot make) as
        // `bwrap: ...` on stderr: the sandbox could not start, so no answer was given.
        if config.sandbox == SandboxMode::Bubblewrap {
            if let Some(line) = stderr.trim_start().lines().next().filter(|l| l.starts_with("bwrap: ")) {
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
            let mut reply = parse_json_output(who, &stdout, paths, &config.pricing, model.as_deref())?;
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
    // The CLI's turn limit ended the call: what it answered (if anything) is the reply, its
    // usage still counts, and the error flag it sets for this is no failure of the call.
    let turns_out = get(&paths.stop_reason).and_then(|v| v.as_str()) == Some(MAX_TURNS_REASON);
    let text = match doc.pointer(&pointer(&paths.text)) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Null) | None if turns_out => String::new(),
        Some(other) => other.to_string(),
        None => return Err(BackendError::ordinary(format!("{who}: the JSON output has no `{}`", paths.text))),
    };
    let is_error = get(&paths.is_error).and_then(|v| v.as_bool()) == Some(true);
    if is_error && !turns_out {
        return Err(BackendError::ordinary(format!("{who}: the agent reported an error: {text}")));
    }
    // A reply flagged as an error is no answer, even at the turn limit.
    let text = if is_error { String::new() } else { text };
    // Counts read as the HTTP backends read a server's: saturating, and a value present
    // that is no count (negative, a string) reads as 0 and makes a priced cost "at least".
    let mut counts = super::Counts::default();
    let mut count = |path: &Option<String>| get(path).map(|v| counts.get(v, ""));
    let input = count(&paths.input_tokens);
    let output = count(&paths.output_tokens);
    let cache_read = count(&paths.cache_read_tokens).unwrap_or(0);
    let cache_write = count(&paths.cache_write_tokens).unwrap_or(0);
    let unreadable = counts.unreadable;
    let cost = get(&paths.cost).and_then(|v| v.as_f64());
    let tokens = |i: Option<u64>, o: Option<u64>| Usage {
        input_tokens: i.unwrap_or(0),
        output_tokens: o.unwrap_or(0),
        cache_read_tokens: cache_read,
        cache_write_tokens: cache_write,
        credits_at_least: unreadable,
        ..Usage::default()
    };
    let usage = match (input, output, cost) {
        (None, None, None) => None,
        (i, o, Some(cost)) => {
            let credits =
                float_credits_nano(cost).map_err(|e| BackendError::ordinary(format!("{who}: reported cost: {e}")))?;
            // The reported cost is the bill: exact whatever the token counts said.
            Some(Usage { credits_nano: Some(credits), credits_at_least: false, ..tokens(i, o) })
        }
        (i, o, None) => Some(pricing.priced(model.unwrap_or(""), tokens(i, o))),
    };
    let ended_by = turns_out.then_some(SoftLimit::MaxTurns);
    Ok(AgentReply { text, usage, ended_by })
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
    fn no_preset_puts_the_prompt_in_argv_and_tool_lists_need_a_flag() {
        for preset in PRESETS.iter().filter(|p| **p != "generic") {
            let config = AgentCliConfig::preset(preset).unwrap();
            assert!(!config.prompt_in_args(), "{preset} puts the prompt in argv");
            assert_eq!(config.sandbox, SandboxMode::Bubblewrap, "{preset} is sandboxed by default");
        }
        assert!(AgentCliConfig::preset("copilot").unwrap().prompt_in_file());
        assert_eq!(fill_with("see {prompt_file}.", "p", Some("/s/prompt.md"), None), "see /s/prompt.md.");
        let claude = AgentCliConfig {
            allowed_tools: vec!["Read".into(), "Bash(git log:*)".into()],
            disallowed_tools: vec!["WebFetch".into()],
            ..AgentCliConfig::preset("claude").unwrap()
        };
        assert_eq!(claude.tool_args().unwrap(), ["--allowedTools=Read,Bash(git log:*)", "--disallowedTools=WebFetch"]);
        let codex = AgentCliConfig { allowed_tools: vec!["x".into()], ..AgentCliConfig::preset("codex").unwrap() };
        assert!(matches!(AgentCli::new(codex), Err(CliPresetError::NoToolFlag { field: "allowed_tools", .. })));
        for bad in ["", "-x", "a,b", "a\nb"] {
            let config =
                AgentCliConfig { disallowed_tools: vec![bad.into()], ..AgentCliConfig::preset("claude").unwrap() };
            assert!(matches!(config.tool_args(), Err(CliPresetError::BadTool { .. })), "{bad:?}");
        }
    }

    #[test]
    fn sealed_paths_are_masked_last_wherever_they_appear_and_the_callers_dir_unless_granted() {
        let root = std::env::temp_dir().join(format!("factory-layout-{}", uuid::Uuid::new_v4().simple()));
        let grant = root.join("granted");
        let state = grant.join("state");
        let caller = root.join("project");
        for dir in [&state, &caller, &root.join("scratch")] {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(grant.join("cluster.token"), "t").unwrap();
        let root = root.canonicalize().unwrap();
        let (grant, state, caller) = (root.join("granted"), root.join("granted/state"), root.join("project"));
        let token = grant.join("cluster.token");
        let config =
            AgentCliConfig { grants: vec![grant.clone()], ..AgentCliConfig::generic("cli:t", vec!["true".into()]) };
        std::fs::write(state.join("control.sock"), "").unwrap();
        let sealed = vec![state.join("control.sock"), state.clone(), token.clone(), root.join("missing")];
        let config = config.hiding(&Hidden { sealed, unless_granted: vec![caller.clone()] });
        let scratch = root.join("scratch");
        let program = Path::new("/usr/bin/true");
        let layout = Layout { config: &config, home: Some(root.clone()), host_cwd: None, program, scratch: &scratch };
        let args: Vec<String> = layout.args().iter().map(|a| a.to_string_lossy().into_owned()).collect();
        let at = |window: &[&str]| {
            args.windows(window.len()).position(|w| w == window).unwrap_or_else(|| panic!("no {window:?} in {args:?}"))
        };
        let path = |p: &Path| p.display().to_string();
        let granted = at(&["--ro-bind", &path(&grant), "/grant/0"]);
        // The caller's directory is hidden before the grants (a grant of it shows it again)...
        assert!(at(&["--tmpfs", &path(&caller)]) < granted);
        // ...the service's files after them, at their own path and at the grant's alias.
        assert!(at(&["--tmpfs", &path(&state)]) > granted);
        assert!(at(&["--tmpfs", "/grant/0/state"]) > granted);
        assert!(at(&["--ro-bind", "/dev/null", &path(&token)]) > granted);
        assert!(at(&["--ro-bind", "/dev/null", "/grant/0/cluster.token"]) > granted);
        assert!(!args.iter().any(|a| a.contains("missing")), "a path that does not exist is skipped: {args:?}");
        // A path inside a masked directory is not masked again (that would create it there).
        assert!(!args.iter().any(|a| a.contains("control.sock")), "{args:?}");
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn claude_json_output_gives_text_usage_and_cost() {
        let OutputMode::Json(paths) = AgentCliConfig::preset("claude").unwrap().output else { panic!("json") };
        let out = r#"{"type":"result","is_error":false,"result":"hi","total_cost_usd":0.0123,
                     "usage":{"input_tokens":10,"output_tokens":5}}"#;
        let reply = parse_json_output("c", out, &paths, &Pricing::default(), None).unwrap();
        assert_eq!(reply.text, "hi");
        assert_eq!(reply.usage, Some(Usage::tokens(10, 5, Some(12_300_000))));
        let err = r#"{"is_error":true,"result":"quota"}"#;
        assert!(parse_json_output("c", err, &paths, &Pricing::default(), None)
            .unwrap_err()
            .message()
            .contains("quota"));
        let lines = "progress\n{\"result\":\"last\"}\n";
        let reply = parse_json_output("c", lines, &paths, &Pricing::default(), None).unwrap();
        assert_eq!((reply.text.as_str(), reply.usage), ("last", None));
        // Cache counts kept apart; hostile counts neither fail nor wrap, and make a priced
        // cost (no reported cost) a lower bound.
        let priced = Pricing { default: Some(super::super::Price::new(1_000_000, 0)), ..Pricing::default() };
        let out = r#"{"result":"x","usage":{"input_tokens":-4,"output_tokens":1e300,"cache_read_input_tokens":9}}"#;
        let usage = parse_json_output("c", out, &paths, &priced, None).unwrap().usage.unwrap();
        assert_eq!((usage.input_tokens, usage.output_tokens, usage.cache_read_tokens), (0, u64::MAX, 9));
        assert_eq!((usage.credits_nano, usage.credits_at_least), (Some(0), true));
        assert!(parse_json_output("c", "plain", &paths, &Pricing::default(), None).is_err());
    }
}
