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
//!
//! This file holds the configuration, the presets and the backend; one call is [`call`], the
//! sandbox's mounts [`sandbox`], the child's process group [`process`].

use super::flow::{Flow, FlowLimits};
use super::pricing::{float_credits_nano, Pricing};
use super::{AgentBackend, AgentReply, AgentRequest, BackendError, Hidden, SoftLimit, Usage};
use futures::future::BoxFuture;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

mod call;
mod process;
mod sandbox;

pub use process::group_alive;

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
            call::run(&config, &request).await.map_err(|e| super::redact::redact_error(e, &secrets))
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
    use super::call::{check_model, fill, fill_with};
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
