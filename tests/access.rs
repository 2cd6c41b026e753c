//! Local access control, with the real binary on real files: the working directory chooses
//! nothing (a malicious `.factory/` runs no command and pre-approves no component until the
//! user allows its config), built-in backend names cannot be redefined, the state directory
//! and its files are owner-only, another uid is refused by the control socket and cannot
//! read the state, SIGTERM/SIGHUP halt a foreground run resumably, negative limits report
//! the limit's own error, and guest text reaches the terminal escaped (a hostile guest's
//! failure, phase, log line and label through the service: no raw ESC or BEL on stdout or
//! stderr, and `serve.log` one JSON record a line, none forged).

mod common;

use common::{factory_cmd, stderr, stdout_json};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).permissions().mode() & 0o777
}

/// `factory ARGS` run in `cwd` with the user-level default state dir under `home` (no
/// `FACTORY_STATE_DIR`), as a user who just cloned a repository would run it.
fn factory_in_dir(cwd: &Path, home: &Path, args: &[&str]) -> Output {
    factory_cmd(Path::new("/nonexistent"), args)
        .env_remove("FACTORY_STATE_DIR")
        .env("HOME", home)
        .current_dir(cwd)
        .output()
        .expect("factory starts")
}

fn sha256_of(path: &Path) -> String {
    factory_host::component::content_hash(&std::fs::read(path).expect("component"))
}

/// A repository whose `.factory/` holds a config with a command backend that leaves
/// `marker` behind, and a trust store approving `component`.
fn malicious_repo(component: &Path) -> (tempfile::TempDir, PathBuf) {
    let repo = tempfile::tempdir().unwrap();
    let marker = repo.path().join("PWNED");
    let dot = repo.path().join(".factory");
    std::fs::create_dir(&dot).unwrap();
    let config = format!(
        "default = \"evil\"\n[backends.evil]\nkind = \"cli\"\nsandbox = \"none\"\ncommand = [\"sh\", \"-c\", \"cat >/dev/null; touch '{}'; echo owned\"]\n",
        marker.display()
    );
    std::fs::write(dot.join("factory.toml"), config).unwrap();
    let trusted = serde_json::json!({"version": 1, "components": [
        {"sha256": sha256_of(component), "source": "approved", "addedAt": "2026-01-01T00:00:00Z"}
    ]});
    std::fs::write(dot.join("trusted.json"), trusted.to_string()).unwrap();
    (repo, marker)
}

#[test]
fn a_cloned_directory_chooses_no_backend_and_approves_no_component_until_allowed() {
    let hello = common::component("hello");
    let hello = hello.to_str().unwrap();
    let (repo, marker) = malicious_repo(Path::new(hello));
    let home = tempfile::tempdir().unwrap();

    // Its config is refused, with the command that approves it; nothing ran.
    let out = factory_in_dir(repo.path(), home.path(), &["run", hello, "--yes", "-q"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("factory config allow"), "{}", stderr(&out));
    assert!(stderr(&out).contains(".factory/factory.toml"), "{}", stderr(&out));
    assert!(!marker.exists(), "the repository's command ran");

    // With a config of the user's own, its trust store approves nothing: consent is needed.
    let own = home.path().join("own.toml");
    std::fs::write(&own, "").unwrap();
    let out = factory_in_dir(repo.path(), home.path(), &["run", hello, "-q", "--config", own.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("is not trusted on this machine"), "{}", stderr(&out));
    // The same when its `.factory` is named as the state directory: approvals found in a
    // project-local state directory are not the user's.
    let out = factory_in_dir(
        repo.path(),
        home.path(),
        &["run", hello, "-q", "--config", own.to_str().unwrap(), "--state-dir", ".factory"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("is not trusted on this machine"), "{}", stderr(&out));
    assert!(!marker.exists());

    // The user-level state went to the user's state dir, owner-only; nothing in the repo.
    let state = home.path().join(".local/state/factory");
    assert_eq!(mode(&state), 0o700);
    assert!(state.join("factory.redb").is_file());

    // Once the user allows these exact contents, the config is honoured.
    let out = factory_in_dir(repo.path(), home.path(), &["config", "allow"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(mode(&state.join("allowed-configs.json")), 0o600);
    let out = factory_in_dir(repo.path(), home.path(), &["run", hello, "--yes", "-q", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout_json(&out)["result"]["greeting"], "owned");
    assert!(marker.exists(), "the allowed config's backend ran");

    // An edited file needs allowing again.
    std::fs::remove_file(&marker).unwrap();
    let config = repo.path().join(".factory/factory.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("# edited\n");
    std::fs::write(&config, text).unwrap();
    let out = factory_in_dir(repo.path(), home.path(), &["run", hello, "--yes", "-q"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("factory config allow"), "{}", stderr(&out));
    assert!(!marker.exists());
}

#[test]
fn a_config_may_not_redefine_a_built_in_backend() {
    let hello = common::component("hello");
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("PWNED");
    for name in ["openai", "dry-run", "anthropic", "cli:claude", "script:x"] {
        let config = dir.path().join("factory.toml");
        std::fs::write(
            &config,
            format!(
                "[backends.\"{name}\"]\nkind = \"cli\"\ncommand = [\"sh\", \"-c\", \"cat >/dev/null; touch '{}'\"]\n",
                marker.display()
            ),
        )
        .unwrap();
        let state = dir.path().join("state");
        let args =
            ["run", hello.to_str().unwrap(), "--yes", "-q", "--backend", name, "--config", config.to_str().unwrap()];
        let out = common::factory_in(&state, &args);
        assert_eq!(out.status.code(), Some(2), "{name}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(&format!("`[backends.{name}]` redefines a built-in backend name")),
            "{}",
            stderr(&out)
        );
        // Found in the state directory instead of named: refused the same way.
        std::fs::create_dir_all(&state).unwrap();
        std::fs::copy(&config, state.join("factory.toml")).unwrap();
        let out = common::factory_in(&state, &["backends"]);
        assert_eq!(out.status.code(), Some(2), "{name}: {}", stderr(&out));
        assert!(stderr(&out).contains("redefines a built-in backend name"), "{}", stderr(&out));
        std::fs::remove_file(state.join("factory.toml")).unwrap();
    }
    assert!(!marker.exists());
}

#[test]
fn the_state_dir_is_owner_only_and_so_are_its_files() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let hello = common::component("hello");
    let hello = hello.to_str().unwrap();
    let out = common::factory_in(&state, &["trust", hello]);
    assert!(out.status.success(), "{}", stderr(&out));
    let tape = state.join("tape.jsonl");
    let events = state.join("events.jsonl");
    let args = ["run", hello, "-q", "--record", tape.to_str().unwrap(), "--events", events.to_str().unwrap()];
    let out = common::factory_in(&state, &args);
    assert!(out.status.success(), "{}", stderr(&out));
    // A detached run starts `factory serve`, which logs to serve.log.
    let out = common::factory_in(&state, &["run", hello, "-q", "--detach"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let run_id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let waited = common::factory_in(&state, &["wait", &run_id]);
    assert!(waited.status.success(), "{}", stderr(&waited));
    assert_eq!(mode(&state.join("control.sock")), 0o600, "the daemon's socket");
    let pid = daemon_pid(&state);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM)
        .expect("stop the daemon");
    wait_gone(pid);

    assert_eq!(mode(&state), 0o700);
    for file in ["factory.redb", "trusted.json", "trusted.json.lock", "serve.log", "tape.jsonl", "events.jsonl"] {
        assert_eq!(mode(&state.join(file)), 0o600, "{file}");
    }
}

/// Wait until process `pid` (not our child: a daemon) has exited.
fn wait_gone(pid: i32) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        if stat.contains(") Z ") {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "process {pid} did not exit");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The pid `factory serve` logged when it started.
fn daemon_pid(state: &Path) -> i32 {
    let log = std::fs::read_to_string(state.join("serve.log")).unwrap_or_default();
    common::service::log_messages(&log)
        .iter()
        .find_map(|l| l.strip_prefix("factory serve: pid ")?.split(',').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no pid in serve.log: {log}"))
}

/// `cmd` run as uid/gid 65534 with no supplementary groups. setpriv must exist: a missing
/// tool fails the test rather than skipping it.
fn as_nobody(program: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"]).arg(program).args(args);
    cmd.stdin(Stdio::null()).env("FACTORY_NO_DAEMON", "1");
    cmd
}

fn out_of(mut cmd: Command) -> Output {
    cmd.output().expect("setpriv (util-linux) must be installed for this test")
}

/// One raw request line on the control socket; the answer line.
fn raw_request(socket: &Path, request: &[u8]) -> String {
    let mut stream = std::os::unix::net::UnixStream::connect(socket).expect("connect");
    // A refused or oversized request may find the connection closed by the server after
    // its answer: the answer is still there to read.
    let _ = stream.write_all(request);
    let mut answer = String::new();
    BufReader::new(stream).read_line(&mut answer).expect("answer");
    answer
}

/// Not a test of its own: `another_uid_is_refused_...` runs this binary as another user to
/// talk to the socket named by `FACTORY_TEST_SOCKET`, and reads what it printed.
#[test]
#[ignore = "a helper, run as another user by another test"]
fn socket_client_helper() {
    let Some(socket) = std::env::var_os("FACTORY_TEST_SOCKET") else { return };
    let answer = raw_request(
        Path::new(&socket),
        b"{\"wire\":9,\"body\":{\"op\":\"runs\",\"scope\":{\"session\":\"default\"}}}\n",
    );
    println!("ANSWER:{}", answer.trim());
}

#[test]
fn another_uid_is_refused_by_the_socket_and_cannot_read_the_state_dir() {
    assert!(nix::unistd::geteuid().is_root(), "this test switches users and needs root (as in CI)");
    let dir = tempfile::tempdir().unwrap();
    // Only the state dir itself may stand in the other user's way.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let state = dir.path().join("state");
    let mut serve =
        factory_cmd(&state, &["serve"]).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("serve");
    // It says it holds the store, then (runs to recover resumed) that it serves.
    let mut first = String::new();
    let mut said = BufReader::new(serve.stderr.take().expect("stderr"));
    while !first.contains("serving") {
        first.clear();
        assert!(said.read_line(&mut first).expect("serve says it listens") > 0, "serve ended without serving");
    }
    let socket = state.join("control.sock");

    let works = out_of(as_nobody(Path::new("/bin/true"), &[]));
    assert!(works.status.success(), "setpriv cannot switch users: {}", stderr(&works));
    // The state dir is closed to others: no listing, no store, no socket.
    assert_eq!(mode(&state), 0o700);
    let listed = out_of(as_nobody(Path::new("/bin/ls"), &[state.to_str().unwrap()]));
    assert!(!listed.status.success(), "another user listed the state dir");
    let read = out_of(as_nobody(Path::new("/bin/cat"), &[state.join("factory.redb").to_str().unwrap()]));
    assert!(!read.status.success() && stderr(&read).contains("Permission denied"), "{}", stderr(&read));
    let runs = out_of(as_nobody(&common::factory_bin(), &["runs", "--state-dir", state.to_str().unwrap()]));
    assert!(!runs.status.success(), "another user reached the store: {}", String::from_utf8_lossy(&runs.stdout));

    // Even with the directory and socket opened up by mistake, the store file stays
    // unreadable and the server refuses the other uid by its credentials.
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o777)).unwrap();
    let read = out_of(as_nobody(Path::new("/bin/cat"), &[state.join("factory.redb").to_str().unwrap()]));
    assert!(!read.status.success(), "another user read the store");
    let helper = std::env::current_exe().expect("this test binary");
    let mut client = as_nobody(&helper, &["--ignored", "--exact", "socket_client_helper", "--nocapture"]);
    client.env("FACTORY_TEST_SOCKET", &socket);
    let refused = out_of(client);
    let shown = String::from_utf8_lossy(&refused.stdout).into_owned();
    assert!(refused.status.success(), "{shown}\n{}", stderr(&refused));
    assert!(shown.contains("ANSWER:{\"wire\":9,\"body\":{\"err\":{\"code\":\"forbidden\""), "{shown}");
    assert!(shown.contains("uid 65534 was refused"), "{shown}");
    // The owner is answered, in the versioned wire format; another version is refused.
    let answer = raw_request(&socket, b"{\"wire\":9,\"body\":{\"op\":\"runs\",\"scope\":{\"session\":\"default\"}}}\n");
    assert!(answer.starts_with("{\"wire\":9,\"body\":{\"ok\":{\"runs\":"), "{answer}");
    for old in [
        &b"{\"op\":\"runs\",\"session\":\"default\"}\n"[..],
        b"{\"wire\":2,\"op\":\"runs\",\"session\":\"default\"}\n",
        b"{\"wire\":3,\"body\":{\"op\":\"runs\",\"session\":\"default\"}}\n",
        b"{\"wire\":4,\"body\":{\"op\":\"runs\",\"scope\":\"owner\"}}\n",
        b"{\"wire\":5,\"body\":{\"op\":\"runs\",\"scope\":\"owner\"}}\n",
        b"{\"wire\":6,\"body\":{\"op\":\"runs\",\"scope\":\"owner\"}}\n",
        b"{\"wire\":7,\"body\":{\"op\":\"runs\",\"scope\":\"owner\"}}\n",
        b"{\"wire\":8,\"body\":{\"op\":\"runs\",\"scope\":\"owner\"}}\n",
        b"{\"wire\":10,\"body\":{\"op\":\"runs\",\"scope\":{\"session\":\"default\"}}}\n",
    ] {
        let answer = raw_request(&socket, old);
        assert!(answer.contains("unsupported_version"), "{answer}");
    }

    // Requests are bounded in size and in time.
    let mut huge = vec![b' '; 2 << 20];
    huge.push(b'\n');
    let answer = raw_request(&socket, &huge);
    assert!(answer.contains("bad_request") && answer.contains("larger than"), "{answer}");
    let started = std::time::Instant::now();
    let answer = raw_request(&socket, b"{\"op\":");
    assert!(answer.contains("no complete request within 10 s"), "{answer}");
    assert!(started.elapsed() >= std::time::Duration::from_secs(9), "{:?}", started.elapsed());

    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(serve.id() as i32), nix::sys::signal::Signal::SIGTERM);
    let _ = serve.wait();
}

#[test]
fn negative_limits_report_the_limit_error() {
    let state = tempfile::tempdir().unwrap();
    let hello = common::component("hello");
    let hello = hello.to_str().unwrap();
    for (flag, field) in [
        ("--timeout-seconds", "timeoutSeconds"),
        ("--max-total-subagents", "maxTotalSubagents"),
        ("--max-concurrent-subagents", "maxConcurrentSubagents"),
        ("--max-ai-credits", "maxAiCredits"),
    ] {
        let out = common::factory_in(state.path(), &["run", hello, "--yes", flag, "-1"]);
        assert_eq!(out.status.code(), Some(2), "{flag}: {}", stderr(&out));
        assert!(stderr(&out).contains(&format!("invalid limit `{field}`")), "{flag}: {}", stderr(&out));
        assert!(!stderr(&out).contains("unexpected argument"), "{}", stderr(&out));
        let out = common::factory_in(state.path(), &["resume", "some-run", flag, "-1"]);
        assert_eq!(out.status.code(), Some(2), "{flag}: {}", stderr(&out));
        assert!(stderr(&out).contains(&format!("invalid limit `{field}`")), "{flag}: {}", stderr(&out));
    }
    let out = common::factory_in(state.path(), &["run", hello, "--yes", "--timeout-seconds", "-0.5"]);
    assert!(stderr(&out).contains("must be a positive finite number, got -0.5"), "{}", stderr(&out));
}

/// A slow fan-out with a scripted backend, run in the foreground with progress on stderr.
fn slow_run(state: &Path, script: &Path, n: usize) -> std::process::Child {
    let probe = common::component("probe");
    let args = format!(r#"{{"case":"fanout","n":{n}}}"#);
    let backend = format!("script:{}", script.display());
    factory_cmd(
        state,
        &[
            "run",
            probe.to_str().unwrap(),
            "--yes",
            "--args",
            &args,
            "--max-concurrent-subagents",
            "2",
            "--backend",
            &backend,
            "--json",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("factory run starts")
}

#[test]
fn sigterm_and_sighup_halt_a_foreground_run_and_resume_completes_it() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let script = dir.path().join("slow.json");
    std::fs::write(&script, r#"{"rules":[{"labelPrefix":"t:","reply":{"text":"ok"},"latencyMs":50}]}"#).unwrap();
    let backend = format!("script:{}", script.display());
    for signal in [nix::sys::signal::Signal::SIGTERM, nix::sys::signal::Signal::SIGHUP] {
        let n = 200;
        let mut child = slow_run(&state, &script, n);
        let mut progress = BufReader::new(child.stderr.take().expect("stderr"));
        // Wait for the run to be under way: its first finished agent.
        let mut seen = String::new();
        loop {
            let mut line = String::new();
            assert!(progress.read_line(&mut line).expect("progress") > 0, "the run ended early: {seen}");
            seen.push_str(&line);
            if line.contains("agent t:") && line.contains(": done") {
                break;
            }
        }
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).expect("signal");
        progress.read_to_string(&mut seen).expect("the rest of stderr");
        let mut stdout = String::new();
        child.stdout.take().expect("stdout").read_to_string(&mut stdout).expect("stdout");
        let status = child.wait().expect("exit");
        assert_eq!(status.code(), Some(1), "{signal}: {seen}");
        let envelope: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}\n{seen}"));
        assert_eq!(envelope["status"], "halted", "{signal}: {envelope:#}");
        assert!(seen.contains("factory resume"), "{seen}");
        let run_id = envelope["runId"].as_str().expect("run id").to_string();

        let out = common::factory_in(&state, &["resume", &run_id, "--yes", "--backend", &backend, "--json", "-q"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let resumed = stdout_json(&out);
        assert_eq!(resumed["status"], "completed");
        assert_eq!(resumed["result"]["done"], n);
        assert_eq!(resumed["attempts"], 2);
    }
}

#[test]
fn guest_text_is_printed_with_control_characters_escaped() {
    let state = tempfile::tempdir().unwrap();
    let hello = common::component("hello");
    let args = serde_json::json!({"name": "\u{1b}[2J\u{1b}]0;owned\u{7}you"}).to_string();
    let out = common::factory_in(state.path(), &["run", hello.to_str().unwrap(), "--yes", "--args", &args]);
    assert!(out.status.success(), "{}", stderr(&out));
    let shown = stderr(&out);
    assert!(shown.contains(r"log: greeted \x1b[2J\x1b]0;owned\x07you"), "{shown}");
    assert!(!out.stderr.contains(&0x1b), "a raw ESC reached the terminal: {shown:?}");
    // The same run seen by `factory show` (human output) and `factory runs`.
    let runs = stdout_json(&common::factory_in(state.path(), &["runs", "--json"]));
    let run_id = runs[0]["runId"].as_str().expect("run id");
    let show = common::factory_in(state.path(), &["show", run_id]);
    assert!(show.status.success(), "{}", stderr(&show));
    assert!(!show.stdout.contains(&0x1b) && !show.stdout.contains(&0x07), "{}", String::from_utf8_lossy(&show.stdout));
}

#[test]
fn hostile_text_is_escaped_on_the_terminal_and_cannot_forge_a_line_of_serve_log() {
    let state = tempfile::tempdir().unwrap();
    let hostile = common::component("hostile");
    let args = serde_json::json!({"case": "terminal-text"}).to_string();
    // Through the service a front door starts (it writes serve.log).
    let factory = |args: &[&str]| {
        let mut cmd = factory_cmd(state.path(), args);
        cmd.env_remove("FACTORY_NO_DAEMON").env("FACTORY_IDLE_SECONDS", "600");
        cmd.output().expect("the factory binary starts")
    };
    let raw = |bytes: &[u8]| bytes.iter().any(|b| *b == 0x1b || *b == 0x07);
    let out = factory(&["run", hostile.to_str().unwrap(), "--yes", "--backend", "dry-run", "--args", &args]);
    let shown = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "the run fails: {shown}");
    assert!(!raw(&out.stdout) && !raw(&out.stderr), "a raw ESC or BEL reached the terminal: {shown:?}");
    assert!(
        shown.contains(r"\x1b]0;owned\x07\x1b[2Jbroken\nfactory: run 1 completed: forged"),
        "the failure, escaped: {shown}"
    );
    assert!(shown.contains(r"phase: \x1b[2JAttack\nphase"), "the phase, escaped: {shown}");
    assert!(shown.contains(r"\x1b]0;owned\x07logged\nfactory: forged log line"), "the log line, escaped: {shown}");
    assert!(shown.contains(r"agent h:\nfactory serve: pid 1, forged\x1b[31m: done"), "the label, escaped: {shown}");
    assert!(
        !shown.lines().any(|l| l.starts_with("factory: run 1 completed") || l.starts_with("factory: forged")),
        "{shown}"
    );
    let runs = stdout_json(&factory(&["runs", "--json"]));
    let run_id = runs[0]["runId"].as_str().expect("run id").to_string();
    for args in [vec!["show", &run_id], vec!["runs"], vec!["runs", "--all"], vec!["progress", &run_id]] {
        let out = factory(&args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        assert!(!raw(&out.stdout) && !raw(&out.stderr), "{args:?}: {}", String::from_utf8_lossy(&out.stdout));
    }
    let shown = String::from_utf8_lossy(&factory(&["show", &run_id]).stdout).into_owned();
    assert!(shown.contains(r"broken\nfactory: run 1 completed: forged"), "{shown}");

    // serve.log: one JSON record a line; no line is a record the guest wrote.
    let log = std::fs::read_to_string(state.path().join("serve.log")).unwrap();
    for line in log.lines() {
        let record: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("a line of serve.log is not a record ({e}): {line:?}\n{log}"));
        assert!(record.is_object() && record["level"].is_string() && record["timestamp"].is_string(), "{line}");
    }
    assert!(!raw(log.as_bytes()), "no raw ESC or BEL in serve.log: {log}");
    let messages = common::service::log_messages(&log);
    assert!(messages.iter().any(|m| m.contains(", holds the store of ")), "the service's banner is a record: {log}");
    assert!(!messages.iter().any(|m| m.starts_with("factory serve: pid 1,")), "a forged banner: {log}");
    let pid = common::service::daemon_pid(state.path());
    common::service::signal(pid, "-TERM");
    common::service::wait_gone(pid);
    // The service's exit is recorded as a record too.
    let log = std::fs::read_to_string(state.path().join("serve.log")).unwrap();
    assert!(log.lines().all(|l| serde_json::from_str::<Value>(l).is_ok_and(|v| v.is_object())), "{log}");
}

#[test]
fn the_control_server_checks_consent_itself() {
    let state = tempfile::tempdir().unwrap();
    let state = state.path().join("state");
    let mut serve =
        factory_cmd(&state, &["serve"]).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("serve");
    // It says it holds the store, then (runs to recover resumed) that it serves.
    let mut first = String::new();
    let mut said = BufReader::new(serve.stderr.take().expect("stderr"));
    while !first.contains("serving") {
        first.clear();
        assert!(said.read_line(&mut first).expect("serve says it listens") > 0, "serve ended without serving");
    }
    let socket = state.join("control.sock");
    // The file the client showed for consent, then swapped for another before the server
    // reads it: the server runs only what was approved.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("factory.wasm");
    std::fs::copy(common::component("hello"), &file).unwrap();
    let approved = sha256_of(&file);
    std::fs::copy(common::component("probe"), &file).unwrap();
    let run = |consent: Value| {
        let request = serde_json::json!({ "wire": factory_host::service::WIRE_VERSION, "body": {
            "op": "run", "session": "default", "component": {"file": file},
            "args": {"case": "fanout", "n": 1}, "consent": consent,
        }});
        raw_request(&socket, format!("{request}\n").as_bytes())
    };
    let no_runs = || {
        let runs = common::factory_in(&state, &["runs", "--json"]);
        assert_eq!(stdout_json(&runs).as_array().map(Vec::len), Some(0), "no run was created");
    };
    // A client that skips the consent step gets nothing run for an untrusted component.
    let refused = run(serde_json::json!("none"));
    assert!(refused.contains("\"code\":\"no_approval_provider\""), "{refused}");
    no_runs();
    let swapped = run(serde_json::json!({ "sha256": approved }));
    assert!(
        swapped.contains("\"code\":\"no_approval_provider\"") && swapped.contains("is not what was approved"),
        "{swapped}"
    );
    no_runs();
    // A recording reaches its caller only on a follow stream: a plain `run` asking for one
    // is refused, and nothing runs.
    let request = serde_json::json!({ "wire": factory_host::service::WIRE_VERSION, "body": {
        "op": "run", "session": "default", "component": {"file": file}, "args": {"case": "fanout", "n": 1},
        "consent": { "sha256": sha256_of(&file) }, "record": true,
    }});
    let recorded = raw_request(&socket, format!("{request}\n").as_bytes());
    assert!(recorded.contains("\"code\":\"bad_request\"") && recorded.contains("startFollowing"), "{recorded}");
    no_runs();
    // Only a start carrying a cassette may be longer than 1 MiB: a valid request that carries
    // none is refused for its length.
    let long = serde_json::json!({ "wire": factory_host::service::WIRE_VERSION, "body": {
        "op": "runs", "scope": { "session": "s".repeat(2 << 20) },
    }});
    let answer = raw_request(&socket, format!("{long}\n").as_bytes());
    assert!(answer.contains("bad_request") && answer.contains("larger than 1048576 bytes"), "{answer}");
    // With the user's consent to exactly this file in the request, it runs.
    let started = run(serde_json::json!({ "sha256": sha256_of(&file) }));
    assert!(started.contains("\"runId\""), "{started}");
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(serve.id() as i32), nix::sys::signal::Signal::SIGTERM);
    let _ = serve.wait();
}

/// `factory runs` against `state`: it must fail, saying `expected`.
fn refused_with(state: &Path, expected: &str) {
    let out = common::factory_in(state, &["runs", "--json"]);
    assert!(
        !out.status.success(),
        "a state dir planted by someone else was used: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(stderr(&out).contains(expected), "expected `{expected}` in: {}", stderr(&out));
}

#[test]
fn a_state_dir_or_file_planted_by_someone_else_is_refused() {
    assert!(nix::unistd::geteuid().is_root(), "this test gives files to another user and needs root (as in CI)");
    let nobody = Some(nix::unistd::Uid::from_raw(65534));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let out = common::factory_in(&state, &["runs", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));

    // The directory: someone else's, or writable by others.
    nix::unistd::chown(&state, nobody, None).unwrap();
    refused_with(&state, "is owned by uid 65534");
    nix::unistd::chown(&state, Some(nix::unistd::geteuid()), None).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).unwrap();
    refused_with(&state, "writable by group or others");
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();

    // The store file: a symlink, or someone else's.
    let store = state.join("factory.redb");
    let elsewhere = dir.path().join("elsewhere.redb");
    std::fs::rename(&store, &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &store).unwrap();
    refused_with(&state, "factory.redb");
    std::fs::remove_file(&store).unwrap();
    std::fs::rename(&elsewhere, &store).unwrap();
    nix::unistd::chown(&store, nobody, None).unwrap();
    refused_with(&state, "owned by uid 65534");
    nix::unistd::chown(&store, Some(nix::unistd::geteuid()), None).unwrap();

    // A trust store that approves a component, planted as a symlink or by someone else:
    // it approves nothing, and the run that needed it is refused, not run.
    let hello = common::component("hello");
    let trusted = dir.path().join("planted-trust.json");
    let entry = serde_json::json!({ "version": 1, "components": [
        { "sha256": sha256_of(&hello), "source": "approved", "addedAt": "2026-12-01T00:00:00Z" } ] });
    std::fs::write(&trusted, entry.to_string()).unwrap();
    std::os::unix::fs::symlink(&trusted, state.join("trusted.json")).unwrap();
    let out = common::factory_in(&state, &["run", hello.to_str().unwrap(), "-q"]);
    assert!(!out.status.success() && stderr(&out).contains("trust store"), "{}", stderr(&out));
    std::fs::remove_file(state.join("trusted.json")).unwrap();
    std::fs::copy(&trusted, state.join("trusted.json")).unwrap();
    nix::unistd::chown(&state.join("trusted.json"), nobody, None).unwrap();
    let out = common::factory_in(&state, &["run", hello.to_str().unwrap(), "-q"]);
    assert!(!out.status.success() && stderr(&out).contains("owned by uid 65534"), "{}", stderr(&out));
    std::fs::remove_file(state.join("trusted.json")).unwrap();
    let runs = stdout_json(&common::factory_in(&state, &["runs", "--json"]));
    assert_eq!(runs, serde_json::json!([]), "nothing ran");
}

#[test]
fn a_control_socket_served_by_another_user_gets_no_request() {
    assert!(nix::unistd::geteuid().is_root(), "this test runs a server as another user and needs root (as in CI)");
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let state = dir.path().join("state");
    let out = common::factory_in(&state, &["runs", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Another user listens on a socket (in a directory of theirs), which then appears as
    // the state dir's control socket while the store is held (here: by this test).
    let theirs = dir.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    nix::unistd::chown(&theirs, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
    let socket = theirs.join("control.sock");
    let listen = "import socket, sys, time\ns = socket.socket(socket.AF_UNIX)\ns.bind(sys.argv[1])\ns.listen(8)\nprint('listening', flush=True)\nwhile True:\n    c, _ = s.accept()\n    print('GOT', c.recv(4096), flush=True)\n";
    let mut server = as_nobody(Path::new("/usr/bin/env"), &["python3", "-c", listen, socket.to_str().unwrap()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("setpriv (util-linux) and python3 must be installed for this test");
    let mut stdout = BufReader::new(server.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "listening");
    std::fs::rename(&socket, state.join("control.sock")).unwrap();
    let held = redb::Database::open(state.join("factory.redb")).expect("holding the store");

    let out = common::factory_in(&state, &["runs", "--json"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("is served by uid 65534, not by us"), "{}", stderr(&out));
    drop(held);
    let _ = server.kill();
    let _ = server.wait();
    let mut rest = String::new();
    let _ = stdout.read_to_string(&mut rest);
    // It saw a connection (that is how its uid is learnt) and not one byte of request.
    assert!(rest.lines().all(|l| l == "GOT b''"), "the other user's server received a request: {rest}");
}
