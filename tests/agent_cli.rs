//! Agent-CLI subagents and backend credentials (issue 20), through the real `factory` binary
//! and real child processes: fake agent CLIs (shell scripts, found by their preset's name on
//! PATH or named by a `command`) run inside bubblewrap by default, see a scratch working
//! directory and the run's grants but not the host's working directory, cannot write the
//! home directory, and never get the prompt in argv; a missing `bwrap` fails the spawn as a
//! `not_installed` backend failure; the consent prompt names the backend; API keys stay out
//! of `Debug` output, and a server echoing a key or a URL's credentials puts neither into
//! the envelope or the store. Under a service (issue 49), a fake agent CLI sees nothing of
//! the state directory in use (`FACTORY_STATE_DIR` or `--state-dir`), the user-level state
//! and config directories, the token files or the caller's working directory, and a start
//! request it sends on the control socket (reached through a hard link in a grant) is
//! refused as `forbidden` for its mount namespace, logged, and starts no run.

mod common;

use factory_host::backend::{AnthropicConfig, OpenAiConfig};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// bubblewrap must be installed: these tests are about it.
fn require_bwrap() {
    let found = Command::new("bwrap").arg("--version").output().is_ok_and(|o| o.status.success());
    assert!(
        found,
        "bubblewrap (`bwrap`) is needed for the agent-CLI sandbox tests: install it (apt install bubblewrap)"
    );
}

/// Write an executable shell script.
fn script(path: &Path, body: &str) -> PathBuf {
    common::script_file(path, "/bin/sh", body)
}

use common::config_file;

/// `factory run probe` (case `memo`: its first spawn's reply is `result.first`) in
/// `workdir` with `home` as HOME, on `backend` from `config`, plus `extra` arguments.
fn run_probe(workdir: &Path, home: &Path, state: &Path, config: &Path, backend: &str, extra: &[&str]) -> Command {
    let probe = common::component("probe");
    let mut args = vec!["run", probe.to_str().unwrap(), "--yes", "--args", r#"{"case":"memo"}"#, "--json", "--quiet"];
    args.extend(["--backend", backend, "--config", config.to_str().unwrap()]);
    args.extend(extra);
    let mut cmd = common::factory_cmd(state, &args);
    cmd.current_dir(workdir).env("HOME", home);
    cmd
}

fn output(mut cmd: Command) -> (Output, Value) {
    let out = cmd.output().expect("the factory binary starts");
    let envelope = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out, envelope)
}

fn first_reply(out: &Output, envelope: &Value) -> String {
    envelope["result"]["first"].as_str().map(str::to_string).unwrap_or_else(|| {
        panic!(
            "no reply: {envelope}\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            common::stderr(out)
        )
    })
}

#[test]
fn a_sandboxed_agent_cli_sees_a_scratch_dir_and_its_grants_but_not_the_working_directory() {
    require_bwrap();
    let root = tempfile::tempdir().unwrap();
    let home = root.path().join("home");
    // The working directory lies inside the home directory, which the sandbox shows
    // read-only: the working directory itself must still be hidden.
    let project = home.join("work/project");
    let grant = root.path().join("granted");
    let other = root.path().join("other");
    let tools = root.path().join("tools");
    for dir in [&project, &grant, &other, &tools, &home.join(".ssh")] {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(project.join("secret.txt"), "project secret").unwrap();
    std::fs::write(home.join("notes.txt"), "home notes").unwrap();
    std::fs::write(home.join(".ssh/id_test"), "private key").unwrap();
    std::fs::write(other.join("secret.txt"), "other secret").unwrap();
    std::fs::write(grant.join("data.txt"), "granted data").unwrap();
    // The config named with --config lies in the home directory too: hidden all the same.
    let config_path = home.join("conf/factory.toml");
    std::fs::create_dir_all(config_path.parent().unwrap()).unwrap();
    let (p, h, o, g) = (project.display(), home.display(), other.display(), grant.display());
    let c = config_path.display();
    let agent = script(
        &tools.join("agent.sh"),
        &format!(
            r#"cat > /dev/null
check() {{ if sh -c "$2" >/dev/null 2>&1; then printf '%s=yes ' "$1"; else printf '%s=no ' "$1"; fi; }}
check scratch-write 'touch ./scratch-file'
check cwd-read 'cat {p}/secret.txt'
check cwd-write 'touch {p}/from-agent'
check home-read 'cat {h}/notes.txt'
check home-write 'touch {h}/from-agent'
check ssh-read 'cat {h}/.ssh/id_test'
check other-read 'cat {o}/secret.txt'
check grant-read 'cat {g}/data.txt'
check grant-alias-read 'cat /grant/0/data.txt'
check grant-write 'touch {g}/from-agent'
check config-read 'cat {c}'
printf 'pwd=%s' "$(pwd)""#
        ),
    );
    let config =
        config_file(&config_path, &format!("[backends.agent]\nkind = \"cli\"\ncommand = [\"{}\"]\n", agent.display()));
    let state = root.path().join("state");
    let (out, envelope) =
        output(run_probe(&project, &home, &state, &config, "agent", &["--allow-read", grant.to_str().unwrap()]));
    let reply = first_reply(&out, &envelope);
    let (checks, pwd) = reply.rsplit_once("pwd=").unwrap_or_else(|| panic!("{reply}"));
    assert_eq!(
        checks.trim(),
        "scratch-write=yes cwd-read=no cwd-write=no home-read=yes home-write=no ssh-read=no \
         other-read=no grant-read=yes grant-alias-read=yes grant-write=no config-read=no",
        "what the sandboxed agent could do"
    );
    let pwd = PathBuf::from(pwd.trim());
    assert!(pwd.is_absolute() && !pwd.starts_with(&project) && pwd != project, "it ran in {}", pwd.display());
    assert!(!pwd.exists(), "the scratch directory {} was removed after the spawn", pwd.display());
    for path in [project.join("from-agent"), home.join("from-agent"), grant.join("from-agent")] {
        assert!(!path.exists(), "{} was written", path.display());
    }
}

#[test]
fn without_bubblewrap_a_sandboxed_agent_cli_is_a_not_installed_backend_failure() {
    let root = tempfile::tempdir().unwrap();
    let marker = root.path().join("ran-unsandboxed");
    let agent = script(&root.path().join("agent.sh"), &format!("cat > /dev/null; touch {}; echo hi", marker.display()));
    let config = config_file(
        &root.path().join("factory.toml"),
        &format!("[backends.agent]\nkind = \"cli\"\ncommand = [\"{}\"]\n", agent.display()),
    );
    let mut cmd = run_probe(root.path(), root.path(), &root.path().join("state"), &config, "agent", &[]);
    // No directory on PATH holds `bwrap`.
    cmd.env("PATH", root.path().join("empty-bin"));
    let (out, envelope) = output(cmd);
    assert_eq!(out.status.code(), Some(1), "{envelope}\n{}", common::stderr(&out));
    assert_eq!(envelope["failure"]["type"], "backend", "{envelope}");
    assert_eq!(envelope["failure"]["kind"], "not_installed", "{envelope}");
    let message = envelope["failure"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("bubblewrap") && message.contains("sandbox = \"none\""), "{message}");
    assert!(!marker.exists(), "the agent ran without the sandbox");
}

/// A fake agent CLI for every preset name: it replies with its argv, the prompt it got (on
/// stdin, or from the file an argument names) and that file's mode; `claude` in JSON.
const FAKE_PRESET: &str = r#"name=$(basename "$0")
args="$*"
file=$(printf '%s\n' "$@" | grep -o '/[^ ]*/prompt\.md' | head -n 1)
if [ -n "$file" ]; then prompt=$(cat "$file"); mode=$(stat -c %a "$file"); else prompt=$(cat); mode=none; fi
if touch "$HOME/.$name/written" 2>/dev/null; then state=yes; else state=no; fi
if touch "$HOME/written" 2>/dev/null; then home=yes; else home=no; fi
reply="argv=[$args] state-write=$state home-write=$home prompt=[$prompt] file-mode=$mode"
if [ "$name" = claude ]; then
  escaped=$(printf '%s' "$reply" | tr '\n' ' ' | sed 's/\\/\\\\/g; s/"/\\"/g')
  printf '{"type":"result","is_error":false,"result":"%s"}\n' "$escaped"
else
  printf '%s\n' "$reply"
fi"#;

#[test]
fn no_preset_puts_the_prompt_in_argv_and_tool_restrictions_become_the_presets_flags() {
    require_bwrap();
    let root = tempfile::tempdir().unwrap();
    let bin = root.path().join("bin");
    let home = root.path().join("home");
    std::fs::create_dir_all(&bin).unwrap();
    for name in ["claude", "codex", "copilot", "gemini"] {
        script(&bin.join(name), FAKE_PRESET);
        std::fs::create_dir_all(home.join(format!(".{name}"))).unwrap();
    }
    let config = config_file(
        &root.path().join("factory.toml"),
        r#"
[backends.claude-tools]
kind = "cli"
preset = "claude"
allowed_tools = ["Read", "Bash(git log:*)"]
disallowed_tools = ["WebFetch"]

[backends.copilot-tools]
kind = "cli"
preset = "copilot"
allowed_tools = ["shell(git)"]
disallowed_tools = ["shell(rm)"]

[backends.gemini-tools]
kind = "cli"
preset = "gemini"
allowed_tools = ["read_file"]

[backends.codex-tools]
kind = "cli"
preset = "codex"
allowed_tools = ["anything"]
"#,
    );
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let state = root.path().join("state");
    let cases = [
        ("cli:claude", "", "none"),
        ("cli:codex", "", "none"),
        ("cli:copilot", "", "600"),
        ("cli:gemini", "", "none"),
        ("claude-tools", "--allowedTools=Read,Bash(git log:*) --disallowedTools=WebFetch", "none"),
        ("copilot-tools", "--allow-tool=shell(git) --deny-tool=shell(rm)", "600"),
        ("gemini-tools", "--allowed-tools=read_file", "none"),
    ];
    // The built-in presets with an empty config: they need none.
    let empty = config_file(&root.path().join("empty.toml"), "");
    let grant = root.path().join("granted");
    std::fs::create_dir_all(&grant).unwrap();
    let granted = grant.canonicalize().unwrap();
    for (backend, flags, mode) in cases {
        let file = if backend.starts_with("cli:") { &empty } else { &config };
        let mut cmd = run_probe(root.path(), &home, &state, file, backend, &["--allow-read", grant.to_str().unwrap()]);
        cmd.env("PATH", &path);
        let (out, envelope) = output(cmd);
        let reply = first_reply(&out, &envelope);
        let argv = reply.split(" state-write=").next().unwrap_or_default();
        assert!(!argv.contains("find a bug"), "{backend}: the prompt is in argv: {reply}");
        assert!(reply.contains("prompt=[find a bug]"), "{backend}: the prompt did not arrive: {reply}");
        assert!(reply.ends_with(&format!("file-mode={mode}")), "{backend}: {reply}");
        // Its own config directory is writable, the rest of the home directory is not.
        assert!(reply.contains("state-write=yes home-write=no"), "{backend}: {reply}");
        assert!(!home.join("written").exists());
        // Claude Code and Copilot CLI are told they may read the grants.
        let add = match backend.contains("claude") || backend.contains("copilot") {
            true => format!(" --add-dir={}", granted.display()),
            false => String::new(),
        };
        assert!(argv.ends_with(&format!("{flags}{add}]")), "{backend}: tool and grant flags: {reply}");
    }
    // Codex has no tool-restriction flag: the restriction is refused, never silently dropped.
    let mut cmd = run_probe(root.path(), &home, &state, &config, "codex-tools", &[]);
    cmd.env("PATH", &path);
    let (out, _) = output(cmd);
    assert!(!out.status.success());
    assert!(common::stderr(&out).contains("has no flag to pass `allowed_tools`"), "{}", common::stderr(&out));
}

/// Run `cmd` on a pseudo-terminal, answer "n" to the consent question, and return
/// everything it printed.
fn on_a_terminal(cmd: &Command) -> String {
    common::on_a_terminal(cmd, "n\n").1
}

#[test]
fn the_consent_prompt_names_the_backend_its_subagents_run_with() {
    let root = tempfile::tempdir().unwrap();
    let probe = common::component("probe");
    let state = root.path().join("state");
    let args = ["run", probe.to_str().unwrap(), "--args", r#"{"case":"memo"}"#, "--backend", "cli:claude"];
    let mut cmd = common::factory_cmd(&state, &args);
    cmd.current_dir(root.path());
    let shown = on_a_terminal(&cmd);
    assert!(shown.contains("Run it? [y/N]"), "no consent prompt: {shown}");
    assert!(
        shown.contains("its subagents will run with cli:claude (an agent CLI with tools, sandboxed by bubblewrap"),
        "{shown}"
    );
}

#[test]
fn api_keys_never_appear_in_the_configs_debug_output() {
    let key = "sk-debug-0123456789";
    let openai = OpenAiConfig {
        api_key: Some(key.into()),
        ..OpenAiConfig::new("o", "https://user:url-secret-42@api.example.com/v1")
    };
    let anthropic =
        AnthropicConfig { api_key: Some(key.into()), ..AnthropicConfig::new("a", "https://api.example.com") };
    for shown in [format!("{openai:?}"), format!("{anthropic:?}"), format!("{openai:#?}")] {
        assert!(!shown.contains(key) && !shown.contains("url-secret-42"), "{shown}");
        assert!(shown.contains("api_key: Some(\"***\")") || shown.contains("api_key: Some(\n"), "{shown}");
    }
}

/// An HTTP server on 127.0.0.1 that answers every request with `status` and `body`.
fn echoing_server(status: u16, body: String) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream);
            let mut length = 0usize;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                let lower = line.to_ascii_lowercase();
                if let Some(v) = lower.strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
            let mut request = vec![0u8; length];
            let _ = reader.read_exact(&mut request);
            let reply = format!(
                "HTTP/1.1 {status} Error\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = reader.get_mut().write_all(reply.as_bytes());
        }
    });
    port
}

/// Every file under `dir`, as bytes.
fn all_bytes(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(bytes) = std::fs::read(&path) {
                files.push((path, bytes));
            }
        }
    }
    files
}

#[test]
fn a_server_echoing_the_key_or_url_credentials_puts_neither_into_the_envelope_or_the_store() {
    let key = "sk-echo-SECRET-7f3a9c";
    let url_secret = "pw-URL-SECRET-55e1";
    let body =
        format!(r#"{{"error":{{"message":"no such model for key {key}; you sent Authorization: Bearer {key}"}}}}"#);
    // 404: a backend failure whose message names the base URL; 400: an ordinary failure of
    // the call, journaled.
    for status in [404u16, 400] {
        let port = echoing_server(status, body.clone());
        let root = tempfile::tempdir().unwrap();
        let state = root.path().join("state");
        let probe = common::component("probe");
        let args = [
            "run",
            probe.to_str().unwrap(),
            "--yes",
            "--args",
            r#"{"case":"memo"}"#,
            "--json",
            "--quiet",
            "--backend",
            "openai",
            "--model",
            "m",
        ];
        let mut cmd = common::factory_cmd(&state, &args);
        cmd.current_dir(root.path())
            .env("OPENAI_API_KEY", key)
            .env("OPENAI_BASE_URL", format!("http://alice:{url_secret}@127.0.0.1:{port}/v1"));
        let (out, envelope) = output(cmd);
        let printed = format!("{}{}", String::from_utf8_lossy(&out.stdout), common::stderr(&out));
        if status == 404 {
            assert_eq!(envelope["failure"]["kind"], "model_not_found", "{printed}");
            let message = envelope["failure"]["message"].as_str().unwrap_or_default();
            assert!(message.contains("HTTP 404") && message.contains("no such model"), "{message}");
            assert!(
                message.contains("http://***@127.0.0.1"),
                "the base URL is shown without its credentials: {message}"
            );
        } else {
            assert_eq!(envelope["status"], "completed", "{printed}");
        }
        assert!(!printed.contains(key) && !printed.contains(url_secret), "HTTP {status}: printed: {printed}");
        // Also what `factory progress` shows of the run.
        let run_id = envelope["runId"].as_str().unwrap_or_default().to_string();
        let progress = common::factory_in(&state, &["progress", &run_id, "--json"]);
        let shown = format!("{}{}", String::from_utf8_lossy(&progress.stdout), common::stderr(&progress));
        assert!(!shown.contains(key) && !shown.contains(url_secret), "HTTP {status}: progress: {shown}");
        for (path, bytes) in all_bytes(&state) {
            let text = String::from_utf8_lossy(&bytes);
            assert!(
                !text.contains(key) && !text.contains(url_secret),
                "HTTP {status}: {} holds a credential",
                path.display()
            );
        }
    }
}

/// Host pids of processes whose command line is exactly `argv`.
fn processes_running(argv: &[&str]) -> Vec<i32> {
    let wanted: Vec<u8> = argv.iter().flat_map(|a| a.bytes().chain([0])).collect();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == wanted))
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            !matches!(stat.rsplit_once(')').and_then(|(_, r)| r.trim_start().chars().next()), Some('Z') | None)
        })
        .collect()
}

#[tokio::test]
async fn a_sandboxed_agent_that_times_out_is_killed_with_everything_it_started() {
    use factory_host::backend::{AgentBackend, AgentCli, AgentCliConfig, AgentRequest};
    use std::sync::Arc;
    use std::time::Duration;
    require_bwrap();
    let dir = tempfile::tempdir().unwrap();
    let marker = format!("{}", 900_000 + std::process::id() % 10_000);
    let agent = script(&dir.path().join("stubborn.sh"), &format!("trap '' TERM\nsleep {marker} &\nwait"));
    let config = AgentCliConfig {
        timeout: Some(Duration::from_millis(500)),
        grace: Duration::from_millis(500),
        ..AgentCliConfig::generic("cli:stubborn", vec![agent.display().to_string()])
    };
    let backend = AgentCli::new(config).unwrap();
    let request = AgentRequest {
        prompt: "hi".into(),
        label: None,
        model: None,
        schema: None,
        attempt: 0,
        feedback: None,
        limits: Default::default(),
        tuning: Default::default(),
    };
    let started = async {
        for _ in 0..1000 {
            if !processes_running(&["sleep", &marker]).is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the sandboxed agent never started its sleep");
    };
    let (outcome, ()) = futures::join!(backend.call(Arc::new(request)), started);
    let err = outcome.unwrap_err();
    assert!(err.message().contains("timed out"), "{err}");
    for _ in 0..1000 {
        if processes_running(&["sleep", &marker]).is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the agent's background sleep outlived the call: {:?}", processes_running(&["sleep", &marker]));
}

#[tokio::test]
async fn a_sandbox_that_cannot_start_is_a_backend_failure_not_an_answer() {
    use factory_host::backend::{AgentBackend, AgentCli, AgentCliConfig, AgentRequest, OutageKind};
    require_bwrap();
    // bwrap cannot mount a working directory that does not exist, and says so on stderr.
    let config = AgentCliConfig {
        cwd: Some(PathBuf::from("/nonexistent/factory-agent-cwd")),
        ..AgentCliConfig::generic("cli:nowhere", vec!["sh".into(), "-c".into(), "echo ran".into()])
    };
    let request = AgentRequest {
        prompt: "hi".into(),
        label: None,
        model: None,
        schema: None,
        attempt: 0,
        feedback: None,
        limits: Default::default(),
        tuning: Default::default(),
    };
    let err = AgentCli::new(config).unwrap().call(std::sync::Arc::new(request)).await.unwrap_err();
    assert_eq!(err.outage_kind(), Some(OutageKind::Misconfigured), "{err}");
    assert!(err.message().contains("the bubblewrap sandbox could not start: bwrap: "), "{err}");
}

/// The paths an attack on the service from inside the sandbox goes for (issue 49, item 3).
struct ServicePaths {
    home: PathBuf,
    /// The caller's working directory (in the home directory, which the sandbox shows).
    project: PathBuf,
    /// A non-default state directory in the home directory.
    state: PathBuf,
    /// `$XDG_STATE_HOME` and `$XDG_CONFIG_HOME`: the user-level directories, not the default ones.
    xdg_state: PathBuf,
    xdg_config: PathBuf,
    /// The cluster's `--token-file` (`FACTORY_TOKEN_FILE`).
    token_file: PathBuf,
    /// A granted directory holding a hard link to the control socket, so the socket is
    /// reachable from the sandbox whatever hides it: the mount-namespace check must refuse.
    grant: PathBuf,
    agent: PathBuf,
    config: PathBuf,
    /// `--state-dir DIR` when the state directory is given by flag (then `FACTORY_STATE_DIR`
    /// names a decoy that must stay unused), else empty (it comes from `FACTORY_STATE_DIR`).
    state_flag: bool,
}

const CLUSTER_TOKEN: &str = "cluster-token-0123456789abcdef0123456789";

/// Lay out a home directory with a project, a non-default state directory, user-level
/// state and config directories, a token file, a grant, and a fake agent CLI that tries to
/// reach each and to start a run over the control socket (directly, and through the link
/// in the grant at both of its paths), and replies with what it observed.
fn service_paths(root: &Path, state_name: &str) -> ServicePaths {
    let python = Path::new("/usr/bin/python3");
    assert!(
        python.is_file(),
        "the fake agent talks to the control socket with /usr/bin/python3: apt-get install python3"
    );
    let home = root.join("home");
    let paths = ServicePaths {
        project: home.join("work/project"),
        state: home.join(state_name),
        xdg_state: home.join("xdg-state"),
        xdg_config: home.join("xdg-config"),
        token_file: home.join("keys/cluster.token"),
        grant: home.join("granted"),
        agent: root.join("tools/agent.sh"),
        config: home.join(state_name).join("factory.toml"),
        home,
        state_flag: false,
    };
    for dir in [
        &paths.project,
        &paths.xdg_state.join("factory"),
        &paths.xdg_config.join("factory"),
        &paths.grant,
        &root.join("tools"),
    ] {
        std::fs::create_dir_all(dir).unwrap();
    }
    factory_host::access::private_state_dir(&paths.state).unwrap();
    factory_host::access::private_state_dir(paths.token_file.parent().unwrap()).unwrap();
    std::fs::write(paths.project.join("secret.txt"), "project secret").unwrap();
    std::fs::write(paths.home.join("notes.txt"), "home notes").unwrap();
    std::fs::write(paths.xdg_state.join("factory/marker.txt"), "user-level state").unwrap();
    std::fs::write(paths.xdg_config.join("factory/factory.toml"), "").unwrap();
    std::fs::write(paths.grant.join("data.txt"), "granted data").unwrap();
    std::io::Write::write_all(
        &mut factory_host::access::create_private_file(&paths.token_file).unwrap(),
        CLUSTER_TOKEN.as_bytes(),
    )
    .unwrap();
    // The MCP server's token file, as `factory mcp --http` leaves it.
    std::io::Write::write_all(
        &mut factory_host::access::create_private_file(&paths.state.join("mcp.token")).unwrap(),
        b"mcp-token",
    )
    .unwrap();
    let connect = paths.home.join("bin/connect.py");
    std::fs::create_dir_all(connect.parent().unwrap()).unwrap();
    std::fs::write(
        &connect,
        r#"import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except OSError:
    print("unreachable")
    sys.exit(0)
try:
    s.sendall(sys.argv[2].encode() + b"\n")
except OSError:
    pass  # a refused peer's request is never read: the answer is waiting all the same
data = b""
while True:
    try:
        chunk = s.recv(65536)
    except OSError:
        break  # reset after the answer: the request was left unread
    if not chunk:
        break
    data += chunk
print("forbidden" if b'"code":"forbidden"' in data else "answered")
"#,
    )
    .unwrap();
    // What a hijacked agent sends: a run of any factory, consented to, on a backend of its choice.
    let start = serde_json::json!({ "wire": factory_host::service::WIRE_VERSION, "body": {
        "op": "run", "session": "default", "component": { "file": common::component("probe") },
        "args": { "case": "memo" }, "consent": "any", "backend": { "name": "dry-run" },
    }})
    .to_string();
    let (h, p, s, g) = (paths.home.display(), paths.project.display(), paths.state.display(), paths.grant.display());
    let (xs, xc, t, c) =
        (paths.xdg_state.display(), paths.xdg_config.display(), paths.token_file.display(), connect.display());
    script(
        &paths.agent,
        &format!(
            r#"cat > /dev/null
check() {{ if sh -c "$2" >/dev/null 2>&1; then printf '%s=yes ' "$1"; else printf '%s=no ' "$1"; fi; }}
check state-list 'ls -A {s} | grep -q .'
check socket-stat 'test -e {s}/control.sock'
check store-stat 'test -e {s}/factory.redb'
check http-token 'grep -q . {s}/http.token'
check mcp-token 'grep -q . {s}/mcp.token'
check cluster-token 'grep -q . {t}'
check xdg-state 'ls -A {xs}/factory | grep -q .'
check xdg-config 'ls -A {xc}/factory | grep -q .'
check cwd-read 'cat {p}/secret.txt'
check cwd-list 'ls -A {p} | grep -q .'
check home-read 'cat {h}/notes.txt'
check grant-read 'cat {g}/data.txt'
for sock in {s}/control.sock {g}/control-link /grant/0/control-link; do
  printf 'connect=%s ' "$(/usr/bin/python3 {c} "$sock" '{start}' 2>&1)"
done"#
        ),
    );
    std::fs::write(
        &paths.config,
        format!("[backends.agent]\nkind = \"cli\"\ncommand = [\"{}\"]\n", paths.agent.display()),
    )
    .unwrap();
    paths
}

/// What the fake agent must observe: nothing of the service's files or the caller's
/// directory, the home directory and the grant as usual, and a control socket that is
/// hidden where it lives and refuses a start through a link the sandbox can reach.
const NOTHING_OF_THE_SERVICE: &str = "state-list=no socket-stat=no store-stat=no http-token=no mcp-token=no \
    cluster-token=no xdg-state=no xdg-config=no cwd-read=no cwd-list=no home-read=yes grant-read=yes \
    connect=unreachable connect=forbidden connect=forbidden";

impl ServicePaths {
    /// The directory `FACTORY_STATE_DIR` names when the flag gives the state directory.
    fn decoy(&self) -> PathBuf {
        self.home.join("decoy-state")
    }

    /// `factory ARGS` as the user runs it in the project, through the service (not
    /// `--no-daemon`), with this home, user-level directories and token file.
    fn factory(&self, args: &[&str]) -> Command {
        let mut argv: Vec<&str> = Vec::new();
        if self.state_flag {
            argv.extend(["--state-dir", self.state.to_str().unwrap()]);
        }
        argv.extend_from_slice(args);
        let env_state = if self.state_flag { self.decoy() } else { self.state.clone() };
        let mut cmd = common::factory_cmd(&env_state, &argv);
        cmd.env_remove("FACTORY_NO_DAEMON")
            .env("FACTORY_IDLE_SECONDS", "30")
            .env("HOME", &self.home)
            .env("XDG_STATE_HOME", &self.xdg_state)
            .env("XDG_CONFIG_HOME", &self.xdg_config)
            .env("FACTORY_TOKEN_FILE", &self.token_file)
            .current_dir(&self.project);
        cmd
    }

    /// Start `factory serve --http` on this state directory, in a directory of its own under
    /// `root` (so its working directory is not the project's), its log in `root/serve.log`;
    /// returns once it serves, with its address and token files written.
    fn serve_http(&self, root: &Path) -> (Killed, PathBuf) {
        let log_path = root.join("serve.log");
        let elsewhere = root.join("elsewhere");
        std::fs::create_dir_all(&elsewhere).unwrap();
        let mut serve = self.factory(&["serve", "--http", "127.0.0.1:0"]);
        serve
            .current_dir(&elsewhere)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap());
        let mut child = serve.spawn().expect("factory serve starts");
        let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        let files = || ["http.token", "http.addr"].iter().all(|f| self.state.join(f).exists());
        while !(log().contains("HTTP API on") && files()) {
            assert!(child.try_wait().unwrap().is_none(), "factory serve exited: {}", log());
            assert!(std::time::Instant::now() < deadline, "factory serve did not come up: {}", log());
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        (Killed(child), log_path)
    }

    /// Link the control socket into the grant, so only the mount-namespace check stands
    /// between the sandbox and the service.
    fn link_socket(&self) {
        let socket = self.state.join("control.sock");
        assert!(socket.exists(), "the service serves {}", socket.display());
        std::fs::hard_link(&socket, self.grant.join("control-link")).unwrap();
    }

    /// Run the probe on the fake agent through the service, granted the directory with the
    /// link; assert what the agent observed, that its start request started nothing and was
    /// logged, and that the user's own front door still reaches the service.
    fn attack(&self, service_log: &dyn Fn() -> String) {
        let probe = common::component("probe");
        let grant = self.grant.to_str().unwrap();
        let run = ["run", probe.to_str().unwrap(), "--yes", "--args", r#"{"case":"memo"}"#, "--json", "--quiet"];
        let (out, envelope) =
            output(self.factory(&[&run[..], &["--backend", "agent", "--allow-read", grant]].concat()));
        let reply = first_reply(&out, &envelope);
        assert_eq!(reply.trim(), NOTHING_OF_THE_SERVICE, "what the sandboxed agent reached");
        let runs = self.factory(&["runs", "--all", "--json"]).output().unwrap();
        assert!(runs.status.success(), "{}", common::stderr(&runs));
        let runs = common::stdout_json(&runs);
        assert_eq!(runs.as_array().map(Vec::len), Some(1), "one run, the user's: {runs}");
        let log = service_log();
        assert!(log.contains("refuses peers in another mount namespace"), "the refusal is logged: {log}");
        let run_id = envelope["runId"].as_str().unwrap_or_default();
        let shown = self.factory(&["show", run_id, "--json"]).output().unwrap();
        assert!(shown.status.success(), "{}", common::stderr(&shown));
        assert!(!self.decoy().exists(), "FACTORY_STATE_DIR was not used over --state-dir");
    }
}

/// Kills a process this test started when the test ends.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Kills the daemons of a state directory when the test ends.
struct Daemons(PathBuf);

impl Drop for Daemons {
    fn drop(&mut self) {
        for pid in common::service::live_services(&self.0) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

#[test]
fn an_agent_cli_under_a_service_reaches_neither_its_state_nor_its_tokens_nor_the_callers_directory() {
    require_bwrap();
    let root = tempfile::tempdir().unwrap();
    // The state directory from FACTORY_STATE_DIR, served by `factory serve --http` (which
    // writes http.token there) started in a directory of its own; the run comes from the
    // project as a client.
    let paths = service_paths(root.path(), ".factory-alt");
    let (_serve, log_path) = paths.serve_http(root.path());
    paths.link_socket();
    paths.attack(&|| std::fs::read_to_string(&log_path).unwrap_or_default());
}

#[test]
fn an_agent_cli_under_the_daemon_of_a_state_dir_flag_cannot_drive_it() {
    require_bwrap();
    let root = tempfile::tempdir().unwrap();
    let paths = ServicePaths { state_flag: true, ..service_paths(root.path(), ".state-flag") };
    let _daemons = Daemons(paths.state.clone());
    // The first front door starts the state directory's daemon.
    let out = paths.factory(&["runs", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    paths.link_socket();
    paths.attack(&|| std::fs::read_to_string(paths.state.join("serve.log")).unwrap_or_default());
    // A caller's directory that is not absolute would hide nothing: refused as a bad request.
    let mut stream = std::os::unix::net::UnixStream::connect(paths.state.join("control.sock")).unwrap();
    let request = serde_json::json!({ "wire": factory_host::service::WIRE_VERSION, "body": {
        "op": "run", "session": "default", "component": { "file": common::component("probe") },
        "consent": "any", "backend": { "name": "dry-run" }, "callerCwd": "work/project",
    }});
    stream.write_all(format!("{request}\n").as_bytes()).unwrap();
    let mut answer = String::new();
    BufReader::new(stream).read_line(&mut answer).unwrap();
    assert!(answer.contains(r#""code":"bad_request""#) && answer.contains("not an absolute path"), "{answer}");
}

/// `POST PATH` with `body` to the HTTP API of the service in `state` (its address and
/// bearer token from the files it leaves there); the status line and the body.
fn http_post(state: &Path, path: &str, body: &str) -> (String, String) {
    let addr = std::fs::read_to_string(state.join("http.addr")).unwrap();
    let token = std::fs::read_to_string(state.join("http.token")).unwrap();
    let mut stream = std::net::TcpStream::connect(addr.trim()).unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        addr.trim(),
        token.trim(),
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    (head.lines().next().unwrap_or_default().to_string(), body.to_string())
}

#[test]
fn a_resume_that_names_no_caller_still_hides_the_directories_of_the_runs_callers() {
    require_bwrap();
    let root = tempfile::tempdir().unwrap();
    let paths = service_paths(root.path(), ".factory-resume");
    // The first spawn fails as a sandbox that could not start (a backend failure: the run
    // ends `error`, resumable); the next says whether the caller's project is readable.
    std::fs::create_dir_all(paths.home.join("agent-state")).unwrap();
    script(
        &paths.agent,
        &format!(
            r#"cat > /dev/null
if [ ! -e "$HOME/agent-state/failed-once" ]; then
  touch "$HOME/agent-state/failed-once"; echo "bwrap: a sandbox that did not start" >&2; exit 1
fi
if cat {}/secret.txt >/dev/null 2>&1; then echo cwd-read=yes; else echo cwd-read=no; fi"#,
            paths.project.display()
        ),
    );
    std::fs::write(
        &paths.config,
        format!(
            "[backends.agent]\nkind = \"cli\"\ncommand = [\"{}\"]\nsandbox_writable = [\"agent-state\"]\n",
            paths.agent.display()
        ),
    )
    .unwrap();
    let (_serve, _log) = paths.serve_http(root.path());

    // Started by the user from the project, through the service: the first attempt fails.
    let probe = common::component("probe");
    let run = [
        "run",
        probe.to_str().unwrap(),
        "--yes",
        "--args",
        r#"{"case":"memo"}"#,
        "--json",
        "--quiet",
        "--backend",
        "agent",
    ];
    let (out, envelope) = output(paths.factory(&run));
    assert_eq!(envelope["status"], "error", "{envelope}\n{}", common::stderr(&out));
    assert_eq!(envelope["failure"]["type"], "backend", "{envelope}");
    let run_id = envelope["runId"].as_str().unwrap().to_string();

    // Resumed over HTTP, which names no caller's directory (as a recovery after a restart
    // does not): the run still hides the directory it was started from.
    let (status, body) = http_post(&paths.state, &format!("/api/runs/{run_id}/resume"), r#"{"approved":true}"#);
    assert!(status.contains(" 20"), "{status}: {body}");
    let (out, envelope) = output(paths.factory(&["wait", &run_id, "--json"]));
    assert_eq!(envelope["status"], "completed", "{envelope}\n{}", common::stderr(&out));
    assert_eq!(
        first_reply(&out, &envelope).trim(),
        "cwd-read=no",
        "the caller's project stays hidden on a resume without a caller"
    );
}
