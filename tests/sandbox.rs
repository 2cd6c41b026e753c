//! Capabilities (issue 4, item 3): a guest built for `wasm32-wasip2` (`tests/guests/wasi-probe`)
//! uses std's env, args, files, sockets and stdio, and reports what it saw. By default it
//! sees no environment, no arguments, no files, no network (TCP, UDP, name lookups) and
//! nothing on stdin, and what it prints lands in the run's progress log as `[guest] ...`
//! lines. `--allow-read DIR` (library:
//! `RunOptions::grants`) mounts DIR read-only at `/grant/0`: the guest reads it but cannot
//! write there or reach outside it (`..`, symlinks, host paths), the run records the grant,
//! `factory show` displays it and a resume mounts it again. The instance, table and memory
//! counts and table sizes are enforced where a Rust guest meets them: at instantiation.

mod common;

use common::{factory_in, stdout_json};

use factory_host::sandbox::{GrantError, SandboxLimits};
use factory_host::store::ProgressQuery;
use factory_host::{
    Error, Factory, Host, HostConfig, ProgressEvent, ResumeOptions, RunEnvelope, RunOptions, RunStatus, DEFAULT_SESSION,
};
use serde_json::{json, Value};
use std::net::TcpListener;
use std::path::PathBuf;

fn host() -> Host {
    Host::new(HostConfig { cache_dir: Some(common::guest_target_dir().join("cache")), ..HostConfig::default() })
        .expect("host")
}

async fn probe(host: &Host) -> Factory {
    host.load_file(&common::wasi_component("wasi-probe")).await.expect("loading wasi-probe")
}

async fn run(host: &Host, factory: &Factory, args: Value, grants: Vec<PathBuf>) -> RunEnvelope {
    let options = RunOptions { args: Some(args), grants, ..Default::default() };
    host.run(factory, options).await.expect("the run starts")
}

fn completed(envelope: &RunEnvelope) -> Value {
    assert_eq!(envelope.status, RunStatus::Completed, "{envelope:#?}");
    envelope.result_value().expect("a result")
}

/// The error text of an `{"err": ...}` outcome; panics on `{"ok": ...}`.
fn denied<'a>(outcome: &'a Value, what: &str) -> &'a str {
    outcome["err"].as_str().unwrap_or_else(|| panic!("{what} should have been denied, got {outcome}"))
}

/// Every log line of a run.
async fn log_lines(host: &Host, run_id: &str) -> Vec<String> {
    let query = ProgressQuery { after_seq: Some(0), limit: Some(1000), ..Default::default() };
    host.progress(DEFAULT_SESSION, run_id, &query)
        .await
        .expect("progress")
        .into_iter()
        .filter_map(|e| match e.event {
            ProgressEvent::Log { message, .. } => Some(message),
            _ => None,
        })
        .collect()
}

/// A directory to grant (`granted/hello.txt`), a file beside it (`outside.txt`) and a
/// symlink inside the grant pointing at that file (`granted/escape`).
struct Tree {
    _root: tempfile::TempDir,
    granted: PathBuf,
    outside: PathBuf,
}

fn tree() -> Tree {
    let root = tempfile::tempdir().expect("temp dir");
    let granted = root.path().join("granted");
    std::fs::create_dir(&granted).expect("mkdir");
    std::fs::write(granted.join("hello.txt"), "granted text").expect("write");
    let outside = root.path().join("outside.txt");
    std::fs::write(&outside, "outside text").expect("write");
    std::os::unix::fs::symlink(&outside, granted.join("escape")).expect("symlink");
    Tree { granted, outside, _root: root }
}

#[tokio::test]
async fn a_wasi_guest_sees_no_env_args_files_or_network_and_its_output_is_logged() {
    let host = host();
    let probe = probe(&host).await;
    // Real things the guest would reach if the sandbox let it: a file, a listening socket.
    let secret = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(secret.path(), "host secret").expect("write");
    let listener = TcpListener::bind("127.0.0.1:0").expect("listen");
    listener.set_nonblocking(true).expect("nonblocking");
    let addr = listener.local_addr().expect("addr").to_string();
    let cwd = std::env::current_dir().expect("cwd");
    let written = std::env::temp_dir().join(format!("wasi-probe-{}.txt", std::process::id()));
    assert!(std::env::vars().next().is_some(), "the host process has an environment to leak");

    let args = json!({
        "read": [secret.path(), "/etc/passwd", cwd.join("Cargo.toml"), "Cargo.toml"],
        "list": [".", "/tmp", cwd],
        "write": [written],
        "connect": addr,
    });
    let envelope = run(&host, &probe, args, Vec::new()).await;
    let seen = completed(&envelope);
    assert_eq!(seen["env"], json!([]), "no environment variables");
    assert_eq!(seen["args"], json!([]), "no arguments");
    for (dir, outcome) in seen["list"].as_object().expect("listings") {
        denied(outcome, &format!("listing {dir}"));
    }
    assert_eq!(seen["list"].as_object().map(|m| m.len()), Some(4), "`/` and the three asked for");
    for (path, outcome) in seen["read"].as_object().expect("reads") {
        denied(outcome, &format!("reading {path}"));
    }
    for (path, outcome) in seen["write"].as_object().expect("writes") {
        denied(outcome, &format!("writing {path}"));
    }
    assert!(!written.exists(), "nothing was written on the host");
    denied(&seen["connect"]["outcome"], "connecting to a listening local port");
    assert!(listener.accept().is_err(), "no connection reached the listener");

    let lines = log_lines(&host, &envelope.run_id).await;
    assert!(lines.iter().any(|l| l == "[guest] wasi-probe: hello on stdout"), "{lines:?}");
    assert!(lines.iter().any(|l| l == "[guest] wasi-probe: hello on stderr"), "{lines:?}");
    assert_eq!(host.detail(DEFAULT_SESSION, &envelope.run_id).await.expect("detail").grants, Vec::<String>::new());
}

#[tokio::test]
async fn a_read_grant_is_read_only_and_confined_to_its_directory() {
    let host = host();
    let probe = probe(&host).await;
    let t = tree();
    let args = json!({
        "read": [
            "/grant/0/hello.txt",
            "/grant/0/../outside.txt",
            "/grant/0/escape",
            t.outside,
            t.granted.join("hello.txt"),
        ],
        "list": ["/grant/0", "/grant"],
        "write": ["/grant/0/new.txt", "/grant/0/hello.txt"],
    });
    let envelope = run(&host, &probe, args.clone(), vec![t.granted.clone()]).await;
    let seen = completed(&envelope);
    assert_eq!(seen["read"]["/grant/0/hello.txt"], json!({ "ok": "granted text" }));
    denied(&seen["read"]["/grant/0/../outside.txt"], "escaping the grant with `..`");
    denied(&seen["read"]["/grant/0/escape"], "escaping the grant through a symlink");
    denied(&seen["read"][t.outside.to_str().unwrap()], "reading a host path outside the grant");
    denied(&seen["read"][t.granted.join("hello.txt").to_str().unwrap()], "reading the grant by its host path");
    let listed = &seen["list"]["/grant/0"]["ok"];
    assert!(listed.as_array().is_some_and(|names| names.contains(&json!("hello.txt"))), "{seen:#}");
    denied(&seen["list"]["/"], "listing `/`");
    denied(&seen["write"]["/grant/0/new.txt"], "creating a file in the grant");
    denied(&seen["write"]["/grant/0/hello.txt"], "overwriting a file in the grant");
    assert!(!t.granted.join("new.txt").exists());
    assert_eq!(std::fs::read_to_string(t.granted.join("hello.txt")).unwrap(), "granted text");
    let canonical = std::fs::canonicalize(&t.granted).unwrap().to_str().unwrap().to_string();
    assert_eq!(host.detail(DEFAULT_SESSION, &envelope.run_id).await.expect("detail").grants, vec![canonical]);

    // The same run without the grant reads nothing.
    let envelope = run(&host, &probe, args, Vec::new()).await;
    let seen = completed(&envelope);
    denied(&seen["read"]["/grant/0/hello.txt"], "reading a grant that was not given");
    denied(&seen["list"]["/grant/0"], "listing a grant that was not given");
}

#[tokio::test]
async fn grants_must_be_existing_directories() {
    let host = host();
    let probe = probe(&host).await;
    let t = tree();
    let missing = t.granted.join("no-such-dir");
    let options = RunOptions { grants: vec![missing], ..Default::default() };
    let refused = host.run(&probe, options).await;
    assert!(matches!(refused, Err(Error::Grant(GrantError::Unavailable { .. }))), "{refused:?}");
    let options = RunOptions { grants: vec![t.outside.clone()], ..Default::default() };
    let refused = host.run(&probe, options).await;
    assert!(matches!(refused, Err(Error::Grant(GrantError::NotADirectory(_)))), "{refused:?}");
    assert!(host.runs(DEFAULT_SESSION).await.expect("runs").is_empty(), "a refused grant creates no run");
}

#[tokio::test]
async fn a_resume_mounts_the_grants_of_the_run_again() {
    let host = host();
    let probe = probe(&host).await;
    let t = tree();
    let args = json!({ "require": "/grant/0/ready", "read": ["/grant/0/hello.txt"] });
    let first = run(&host, &probe, args, vec![t.granted.clone()]).await;
    assert_eq!(first.status, RunStatus::Error, "{first:#?}");
    assert!(first.failure.as_ref().is_some_and(|f| f.message.contains("/grant/0/ready")), "{first:#?}");

    std::fs::write(t.granted.join("ready"), "now").expect("write");
    let resumed = host.resume(&first.run_id, ResumeOptions::default()).await.expect("resume");
    let seen = completed(&resumed);
    assert_eq!(seen["read"]["/grant/0/hello.txt"], json!({ "ok": "granted text" }));
    assert_eq!(resumed.attempts, 2);

    // A grant that disappeared between attempts refuses the resume, typed.
    let second = run(&host, &probe, json!({ "require": "/grant/0/missing" }), vec![t.granted.clone()]).await;
    assert_eq!(second.status, RunStatus::Error);
    std::fs::remove_dir_all(&t.granted).expect("rm");
    let refused = host.resume(&second.run_id, ResumeOptions::default()).await;
    assert!(matches!(refused, Err(Error::Grant(_))), "{refused:?}");

    // A granted directory replaced by a symlink to somewhere else is not followed.
    let elsewhere = t.outside.parent().unwrap().join("elsewhere");
    std::fs::create_dir(&elsewhere).expect("mkdir");
    std::fs::write(elsewhere.join("ready"), "planted").expect("write");
    std::os::unix::fs::symlink(&elsewhere, &t.granted).expect("symlink");
    let refused = host.resume(&second.run_id, ResumeOptions::default()).await;
    assert!(matches!(refused, Err(Error::Grant(GrantError::Moved { .. }))), "{refused:?}");
    assert_eq!(host.envelope(DEFAULT_SESSION, &second.run_id).await.expect("envelope").attempts, 1, "no attempt ran");
}

#[test]
fn allow_read_through_the_binary_is_recorded_and_shown() {
    let state = tempfile::tempdir().expect("temp dir");
    let t = tree();
    let probe = common::wasi_component("wasi-probe");
    let granted = t.granted.to_str().unwrap();
    let args = r#"{"read":["/grant/0/hello.txt","/grant/1/hello.txt"]}"#;
    let out = factory_in(
        state.path(),
        &["run", probe.to_str().unwrap(), "--yes", "--allow-read", granted, "--args", args, "--json", "-q"],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let envelope = stdout_json(&out);
    assert_eq!(envelope["result"]["read"]["/grant/0/hello.txt"], json!({ "ok": "granted text" }));
    denied(&envelope["result"]["read"]["/grant/1/hello.txt"], "reading a second grant that was not given");
    let run_id = envelope["runId"].as_str().expect("run id");

    let canonical = std::fs::canonicalize(&t.granted).unwrap().to_str().unwrap().to_string();
    let detail = stdout_json(&factory_in(state.path(), &["show", run_id, "--json"]));
    assert_eq!(detail["grants"], json!([canonical]));
    let shown = factory_in(state.path(), &["show", run_id]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(text.contains(&format!("grants:    {canonical} (read-only, as /grant/0)")), "{text}");

    let out = factory_in(state.path(), &["run", probe.to_str().unwrap(), "--yes", "--allow-read", "/no/such/dir"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot grant read access to `/no/such/dir`"), "{err}");
    let out = factory_in(
        state.path(),
        &["run", probe.to_str().unwrap(), "--yes", "--allow-read", t.outside.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a directory"));
}

#[tokio::test]
async fn a_wasi_guest_cannot_resolve_names_send_udp_or_read_stdin() {
    let host = host();
    let probe = probe(&host).await;
    // A real UDP socket the guest would reach if the sandbox let it.
    let listener = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind udp");
    listener.set_nonblocking(true).expect("nonblocking");
    let addr = listener.local_addr().expect("addr").to_string();
    // `localhost` resolves on any host without a network: only the sandbox can refuse it.
    let args = json!({ "resolve": "localhost:80", "udp": addr, "stdin": true });
    let envelope = run(&host, &probe, args, Vec::new()).await;
    let seen = completed(&envelope);
    eprintln!("resolve: {}, udp: {}", seen["resolve"], seen["udp"]);
    denied(&seen["resolve"], "resolving localhost");
    denied(&seen["udp"], "sending a UDP datagram");
    let mut buf = [0u8; 64];
    assert!(listener.recv_from(&mut buf).is_err(), "no datagram reached the listener");
    // Stdin is closed: the guest reads nothing (end of input at once).
    assert_eq!(seen["stdin"], json!({ "ok": "" }), "{seen:#}");
}

#[test]
fn through_the_cli_the_guest_does_not_see_the_stdin_factory_was_given() {
    use std::io::Write;
    let state = tempfile::tempdir().expect("temp dir");
    let probe = common::wasi_component("wasi-probe");
    let mut child = common::factory_cmd(
        state.path(),
        &["run", probe.to_str().unwrap(), "--yes", "--args", r#"{"stdin":true}"#, "--json", "-q"],
    )
    .stdin(std::process::Stdio::piped())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .expect("factory starts");
    let mut input = child.stdin.take().expect("stdin");
    // Whether or not factory reads it, the text must not reach the guest.
    let _ = input.write_all(b"host secret on stdin\n");
    drop(input);
    let out = child.wait_with_output().expect("factory ends");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let envelope = stdout_json(&out);
    assert_eq!(envelope["result"]["stdin"], json!({ "ok": "" }), "{envelope:#}");
}

/// The smallest value of a monotonic limit in `1..=max` under which `hello` loads.
async fn smallest_that_loads(max: usize, set: fn(&mut SandboxLimits, usize)) -> usize {
    let (mut lo, mut hi) = (1usize, max);
    assert!(loads(max, set).await.is_ok(), "the default must load");
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if loads(mid, set).await.is_ok() {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

async fn loads(value: usize, set: fn(&mut SandboxLimits, usize)) -> Result<(Host, Factory), Error> {
    let mut sandbox = SandboxLimits::default();
    set(&mut sandbox, value);
    let host = Host::new(HostConfig {
        sandbox,
        cache_dir: Some(common::guest_target_dir().join("cache")),
        ..HostConfig::default()
    })
    .expect("host");
    let factory = host.load_file(&common::component("hello")).await?;
    Ok((host, factory))
}

#[tokio::test]
async fn instance_table_and_memory_counts_and_table_elements_are_enforced() {
    // A Rust guest cannot create instances, tables or memories once instantiated, nor grow a
    // table (stable Rust has no `table.grow`): its counts are fixed when it is instantiated,
    // and `meta` instantiates it first. So each limit is checked at that boundary: the
    // smallest value the real component needs loads and runs; one less is refused with a
    // typed error naming the resource; the default is above it.
    let defaults = SandboxLimits::default();
    type Case = (&'static str, usize, fn(&mut SandboxLimits, usize), &'static str);
    let cases: [Case; 4] = [
        ("instances", defaults.instances, |s, v| s.instances = v, "instance count too high"),
        ("tables", defaults.tables, |s, v| s.tables = v, "table count too high"),
        ("memories", defaults.memories, |s, v| s.memories = v, "memory count too high"),
        ("table elements", defaults.table_elements, |s, v| s.table_elements = v, "exceeded its table limit"),
    ];
    for (name, default, set, refusal) in cases {
        let needed = smallest_that_loads(default, set).await;
        eprintln!("hello needs {name} = {needed} (default {default})");
        let (host, hello) = loads(needed, set).await.expect("loads at the bound");
        let envelope = host.run(&hello, RunOptions::default()).await.expect("run");
        completed(&envelope);
        match loads(needed - 1, set).await {
            Err(Error::MetaCall(message)) => assert!(message.contains(refusal), "{name}: {message}"),
            Err(other) => panic!("{name}: expected a MetaCall error, got {other:?}"),
            Ok(_) => panic!("{name}: loaded under {} though it needs {needed}", needed - 1),
        }
    }
}
