//! Shared fixtures for the integration tests: build the example and test-guest crates into
//! real components once per test binary (cargo's cache makes later builds no-ops), and
//! locate the workspace.

#![allow(dead_code)]

pub mod counting;
pub mod fake_openai;
pub mod faulty;
pub mod postgres;
pub mod prose;
pub mod service;
pub mod throttling;

use factory_host::builder::BuildTarget;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Where guests are built: a directory of their own under the target dir, so building them
/// never waits on the lock of the `cargo test` that runs us.
pub fn guest_target_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root().join("target"));
    target.join("guests")
}

/// The crate directory of an example (`examples/NAME`) or test guest (`tests/guests/NAME`).
pub fn crate_dir(name: &str) -> PathBuf {
    let example = root().join("examples").join(name);
    if example.is_dir() {
        example
    } else {
        root().join("tests").join("guests").join(name)
    }
}

/// Build `name` and return its component file.
pub fn component(name: &str) -> PathBuf {
    component_for(name, BuildTarget::Unknown)
}

/// Build `name` for `wasm32-wasip2` (a component that imports WASI) and return it.
pub fn wasi_component(name: &str) -> PathBuf {
    component_for(name, BuildTarget::WasiP2)
}

fn component_for(name: &str, target: BuildTarget) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<(String, BuildTarget), PathBuf>>> = OnceLock::new();
    let built = BUILT.get_or_init(Default::default);
    let mut built = built.lock().unwrap_or_else(|p| p.into_inner());
    let key = (name.to_string(), target);
    if let Some(path) = built.get(&key) {
        return path.clone();
    }
    let out = factory_host::builder::build_crate_for(&crate_dir(name), target, Some(&guest_target_dir()), &mut |_| {})
        .unwrap_or_else(|e| panic!("building {name} for {}: {e}", target.triple()));
    built.insert(key, out.component.clone());
    out.component
}

/// The core module cargo built for `name` (before componentizing).
pub fn core_module(name: &str) -> PathBuf {
    let component = component(name);
    let file = component.file_name().and_then(|f| f.to_str()).unwrap_or_default().replace(".component.wasm", ".wasm");
    component.with_file_name(file)
}

/// The `factory` binary under test.
pub fn factory_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_factory"))
}

/// A home directory of this test process's own (created once, empty at first), so a
/// developer's `~/.config/factory` or `~/.local/state/factory` is never used by a test.
pub fn test_home() -> PathBuf {
    static HOME: OnceLock<PathBuf> = OnceLock::new();
    HOME.get_or_init(|| {
        let home = std::env::temp_dir().join(format!("factory-test-home-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&home);
        std::fs::create_dir_all(&home).expect("a test home directory");
        home
    })
    .clone()
}

/// The `factory` binary as a command against the state directory `state`, with guests and
/// the compile cache under the guest target dir and stdin closed (no terminal to ask on).
/// The user's config and state locations are cut off: no `FACTORY_CONFIG`,
/// `XDG_CONFIG_HOME` or `XDG_STATE_HOME`, and `HOME` is [`test_home`]. Single-process mode
/// (`FACTORY_NO_DAEMON=1`): a test of the service itself removes that variable.
pub fn factory_cmd(state: &Path, args: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new(factory_bin());
    cmd.args(args)
        .env_remove("FACTORY_CONFIG")
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("XDG_STATE_HOME")
        .env("HOME", test_home())
        .env("FACTORY_STATE_DIR", state)
        .env("FACTORY_NO_DAEMON", "1")
        .env("CARGO_TARGET_DIR", guest_target_dir())
        .env("FACTORY_CACHE_DIR", guest_target_dir().join("cache"))
        .stdin(std::process::Stdio::null());
    // cargo and rustup find their homes through HOME unless told: keep the real ones, so
    // `factory run <crate-dir>` still builds.
    let real_home = std::env::var_os("HOME").map(PathBuf::from);
    for (var, dir) in [("CARGO_HOME", ".cargo"), ("RUSTUP_HOME", ".rustup")] {
        if std::env::var_os(var).is_none() {
            if let Some(home) = &real_home {
                cmd.env(var, home.join(dir));
            }
        }
    }
    cmd
}

/// Write an executable script: `interpreter` (e.g. `/bin/sh`) on its `#!` line, then `body`.
pub fn script_file(path: &Path, interpreter: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, format!("#!{interpreter}\n{body}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.to_path_buf()
}

/// A config file of the user's own (0600, as the host requires).
pub fn config_file(path: &Path, text: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path.to_path_buf()
}

/// Run the binary against `state` with `env` and no inherited backend variables
/// (`FACTORY_CONFIG`, the OpenAI and Anthropic keys and base URLs), off the async runtime.
pub async fn factory_clean(state: &Path, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = factory_cmd(state, args);
    for var in ["FACTORY_CONFIG", "OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    tokio::task::spawn_blocking(move || cmd.output().expect("the factory binary starts")).await.unwrap()
}

/// The probe test component's path, as an argument.
pub fn probe_arg() -> String {
    component("probe").display().to_string()
}

/// The probe's `fanout` case with `n` agents, as `--args`.
pub fn fanout_args(n: usize) -> String {
    serde_json::json!({"case": "fanout", "n": n}).to_string()
}

/// Run the binary against `state` and collect its output.
pub fn factory_in(state: &Path, args: &[&str]) -> std::process::Output {
    factory_cmd(state, args).output().expect("the factory binary starts")
}

/// A command's stdout as JSON (the panic shows both streams and the exit status).
pub fn stdout_json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}), {}: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// A command's stderr as text.
pub fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A state dir with `probe` registered and trusted, and as its default backend a script
/// backend answering every `t:` prompt after `latency_ms`.
pub fn slow_probe_state(latency_ms: u64) -> tempfile::TempDir {
    let state = tempfile::tempdir().expect("a temporary state dir");
    let script = state.path().join("slow.json");
    let rules = format!(r#"{{"rules":[{{"labelPrefix":"t:","reply":{{"text":"ok"}},"latencyMs":{latency_ms}}}]}}"#);
    std::fs::write(&script, rules).expect("the script backend's rules");
    let config = format!("default = \"slow\"\n[backends.slow]\nkind = \"script\"\npath = \"{}\"\n", script.display());
    std::fs::write(state.path().join("factory.toml"), config).expect("factory.toml");
    register_trusted_probe(state.path());
    state
}

/// Register the `probe` test guest in `state` and trust it (as `factory add` + `factory
/// trust` would for a user), so front doors that cannot ask for consent may run it.
pub fn register_trusted_probe(state: &Path) {
    let probe = component("probe");
    for args in [["add", probe.to_str().unwrap_or_default()], ["trust", probe.to_str().unwrap_or_default()]] {
        let out = factory_in(state, &args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    }
}

/// Run `cmd` (its program, arguments, environment and working directory) on a
/// pseudo-terminal through util-linux `script`, typing `answer`: its exit code and everything
/// the terminal showed. Without `script` the test fails: it must never pass without having
/// run (Debian package `bsdutils`).
pub fn on_a_terminal(cmd: &std::process::Command, answer: &str) -> (Option<i32>, String) {
    use std::io::Write;
    let available = std::process::Command::new("script").arg("--version").output().is_ok_and(|o| o.status.success());
    assert!(available, "util-linux `script` is needed to test a prompt on a terminal (apt-get install bsdutils)");
    let mut command = vec![cmd.get_program().to_string_lossy().into_owned()];
    command.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    let quoted: Vec<String> = command.iter().map(|a| format!("'{}'", a.replace('\'', r"'\''"))).collect();
    let mut script = std::process::Command::new("script");
    script.args(["-qfec", &quoted.join(" "), "/dev/null"]);
    for (key, value) in cmd.get_envs() {
        match value {
            Some(value) => script.env(key, value),
            None => script.env_remove(key),
        };
    }
    if let Some(dir) = cmd.get_current_dir() {
        script.current_dir(dir);
    }
    let mut child = script
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("script starts");
    child.stdin.take().expect("stdin").write_all(answer.as_bytes()).expect("type the answer");
    let out = child.wait_with_output().expect("script ends");
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Start `factory mcp --http` on `state`: the process, the URL it says it serves, its token.
pub fn mcp_http(state: &std::path::Path) -> (std::process::Child, String, String) {
    use std::io::BufRead;
    let mut daemon = factory_cmd(state, &["mcp", "--http", "127.0.0.1:0"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("factory mcp --http starts");
    let mut lines = std::io::BufReader::new(daemon.stderr.take().unwrap()).lines();
    let url = loop {
        let line = lines.next().expect("it says where it listens").unwrap();
        if let Some(rest) = line.split("streamable HTTP on ").nth(1) {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    let token = std::fs::read_to_string(state.join("mcp.token")).unwrap();
    (daemon, url, token)
}

/// A JS factory file `name.js` in `dir` around a `run` body, with `meta` (JS object text).
pub fn js_factory_file(dir: &Path, name: &str, meta: &str, run: &str) -> PathBuf {
    let path = dir.join(format!("{name}.js"));
    let text = format!(
        "import {{ defineFactory }} from \"factory\";\nexport default defineFactory({{ meta: {meta}, run: {run} }});\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// Every committed progress entry of a run (at most 1000), as `factory progress` prints them.
pub fn progress_entries(state: &Path, run_id: &str) -> Vec<serde_json::Value> {
    let out = factory_in(state, &["progress", run_id, "--after-seq", "0", "--limit", "1000", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    stdout_json(&out).as_array().cloned().expect("a list of entries")
}

/// Run the official MCP Python SDK's side of a test, `tests/mcp/SCRIPT` with `args`, in the
/// environment a `factory` command against `state` gets (plus `env`); its JSON report.
pub async fn python_mcp_client(state: &Path, script: &str, args: &[&str], env: &[(&str, &str)]) -> serde_json::Value {
    let template = factory_cmd(state, &[]);
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(root().join("tests/mcp").join(script)).args(args).env_remove("FACTORY_SESSION");
    for (key, value) in template.get_envs() {
        match value {
            Some(value) => cmd.env(key, value),
            None => cmd.env_remove(key),
        };
    }
    for (key, value) in env {
        cmd.env(key, value);
    }
    let out =
        tokio::task::spawn_blocking(move || cmd.output().expect("python3 runs")).await.expect("the client's thread");
    assert!(
        out.status.success(),
        "the MCP client failed (is the `mcp` package installed? ./test installs it into .venv and puts it first on PATH): {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", String::from_utf8_lossy(&out.stdout), stderr(&out)))
}
