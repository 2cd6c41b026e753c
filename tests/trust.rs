//! Trust is consent, not privilege (issue 4, item 4), through the real binary: a component
//! that was neither built on this machine nor approved does not run without a terminal to
//! ask on, unless `--yes` (this run only) or a prior `factory trust`; a crate built here runs
//! without asking; trusting a component does not widen its sandbox; a broken trust store
//! fails closed. The decline path is tested at the library level (`Host::decline`: the run
//! exists, ends `cancelled` with its run id, shows up in `factory runs`, cannot be resumed)
//! and, through util-linux `script` (a pseudo-terminal; the test fails without it), at the
//! real prompt. The same rules (and `--allow-read`) hold when the run is handed to a `factory serve`.

mod common;

use common::{factory_in, stderr, stdout_json};

use factory_host::{Error, Host, HostConfig, ResumeOptions, RunOptions, RunStatus, DEFAULT_SESSION};
use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Stdio};

fn sha256(path: &Path) -> String {
    factory_host::component::content_hash(&std::fs::read(path).expect("read component"))
}

/// The runs of the default session in `state`.
fn runs(state: &Path) -> Vec<Value> {
    let out = factory_in(state, &["runs", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    stdout_json(&out).as_array().cloned().unwrap_or_default()
}

#[test]
fn an_untrusted_component_needs_consent_when_no_terminal_can_ask() {
    let state = tempfile::tempdir().unwrap();
    let probe = common::wasi_component("wasi-probe");
    let out = factory_in(state.path(), &["run", probe.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("is not trusted on this machine"), "{err}");
    assert!(err.contains(&sha256(&probe)), "the message names the sha256: {err}");
    assert!(err.contains("--yes") && err.contains("factory trust"), "the message says what to do: {err}");
    assert!(out.stdout.is_empty(), "nothing ran");
    assert!(runs(state.path()).is_empty(), "no run was created");
}

#[test]
fn yes_runs_it_this_once_and_records_nothing() {
    let state = tempfile::tempdir().unwrap();
    let probe = common::wasi_component("wasi-probe");
    let out = factory_in(state.path(), &["run", probe.to_str().unwrap(), "--yes", "--json", "-q"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout_json(&out)["status"], "completed");
    // Consent given with --yes is for that run only.
    let out = factory_in(state.path(), &["run", probe.to_str().unwrap(), "-q"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let listed = stdout_json(&factory_in(state.path(), &["trust", "--json"]));
    assert_eq!(listed, json!([]));
}

#[test]
fn a_trusted_component_runs_without_asking_in_the_same_sandbox() {
    let state = tempfile::tempdir().unwrap();
    let probe = common::wasi_component("wasi-probe");
    let hash = sha256(&probe);
    let out = factory_in(state.path(), &["trust", probe.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!("trusted wasi-probe (sha256 {hash})"));
    let listed = stdout_json(&factory_in(state.path(), &["trust", "--json"]));
    assert_eq!(listed[0]["sha256"], hash.as_str());
    assert_eq!(listed[0]["source"], "approved");
    assert_eq!(listed[0]["name"], "wasi-probe");
    assert!(state.path().join("trusted.json").is_file());

    let args = r#"{"read":["/etc/passwd"]}"#;
    let out = factory_in(state.path(), &["run", probe.to_str().unwrap(), "--args", args, "--json", "-q"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let envelope = stdout_json(&out);
    assert_eq!(envelope["status"], "completed");
    // Trust widened nothing: still no environment, no files, no network.
    assert_eq!(envelope["result"]["env"], json!([]));
    assert!(envelope["result"]["read"]["/etc/passwd"]["err"].is_string(), "{envelope:#}");
    assert!(envelope["result"]["list"]["/"]["err"].is_string(), "{envelope:#}");
    assert!(envelope["result"]["connect"]["outcome"]["err"].is_string(), "{envelope:#}");

    // Revoked, it needs consent again.
    let out = factory_in(state.path(), &["trust", "--revoke", &hash]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = factory_in(state.path(), &["run", probe.to_str().unwrap(), "-q"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

#[test]
fn a_crate_built_here_runs_without_asking() {
    let state = tempfile::tempdir().unwrap();
    let dir = common::crate_dir("hello");
    let out = factory_in(state.path(), &["run", dir.to_str().unwrap(), "--json", "-q"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout_json(&out)["status"], "completed");
    let listed = stdout_json(&factory_in(state.path(), &["trust", "--json"]));
    assert_eq!(listed[0]["source"], "built", "{listed:#}");

    // `factory build` records what it built: the component file then runs without asking.
    let other = tempfile::tempdir().unwrap();
    let out = factory_in(other.path(), &["build", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let component = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(listed[0]["sha256"], sha256(Path::new(&component)).as_str());
    let out = factory_in(other.path(), &["run", &component, "--json", "-q"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout_json(&out)["status"], "completed");
}

#[test]
fn a_broken_trust_store_fails_closed() {
    let state = tempfile::tempdir().unwrap();
    std::fs::write(state.path().join("trusted.json"), "{ not json").unwrap();
    let probe = common::wasi_component("wasi-probe");
    let out = factory_in(state.path(), &["run", probe.to_str().unwrap(), "-q"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("trusted.json"), "{}", stderr(&out));
    assert!(runs(state.path()).is_empty());
}

#[tokio::test]
async fn a_declined_run_ends_cancelled_with_its_run_id() {
    let state = tempfile::tempdir().unwrap();
    let run_id = {
        let host = Host::new(HostConfig {
            state_dir: Some(state.path().to_path_buf()),
            cache_dir: Some(common::guest_target_dir().join("cache")),
            ..HostConfig::default()
        })
        .expect("host");
        let probe = host.load_file(&common::wasi_component("wasi-probe")).await.expect("load");
        let (tx, rx) = std::sync::mpsc::channel();
        let on_start: Box<dyn FnOnce(&str) + Send> = Box::new(move |id| {
            let _ = tx.send(id.to_string());
        });
        let options = RunOptions { args: Some(json!({})), on_start: Some(on_start), ..Default::default() };
        let envelope = host.decline(&probe, options).await.expect("decline");
        assert_eq!(envelope.status, RunStatus::Cancelled);
        assert!(!envelope.run_id.is_empty());
        assert_eq!(rx.try_recv().ok().as_deref(), Some(envelope.run_id.as_str()), "on_start saw the id");
        assert_eq!(envelope.attempts, 0, "nothing ran");
        let failure = envelope.failure.as_ref().expect("a failure");
        assert_eq!((failure.kind_type.as_str(), failure.kind.as_deref()), ("cancelled", Some("declined")));
        assert!(
            host.detail(DEFAULT_SESSION, &envelope.run_id).await.expect("detail").progress.is_empty(),
            "no progress"
        );
        let refused = host.resume(&envelope.run_id, ResumeOptions::default()).await;
        assert!(matches!(refused, Err(Error::NonResumable(_))), "{refused:?}");
        envelope.run_id
    };
    let listed = runs(state.path());
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["runId"], run_id.as_str());
    assert_eq!(listed[0]["status"], "cancelled");
    assert_eq!(listed[0]["failure"]["kind"], "declined");
}

/// Run `factory ARGS` against `state` on a pseudo-terminal typing `answer`.
fn on_a_terminal(state: &Path, args: &[&str], answer: &str) -> (Option<i32>, String) {
    let mut cmd = Command::new(common::factory_bin());
    cmd.args(args)
        .env("FACTORY_STATE_DIR", state)
        .env("FACTORY_NO_DAEMON", "1")
        .env("CARGO_TARGET_DIR", common::guest_target_dir())
        .env("FACTORY_CACHE_DIR", common::guest_target_dir().join("cache"));
    common::on_a_terminal(&cmd, answer)
}

#[test]
fn on_a_terminal_the_prompt_shows_the_component_and_a_no_declines_the_run() {
    let state = tempfile::tempdir().unwrap();
    let granted = tempfile::tempdir().unwrap();
    let probe = common::wasi_component("wasi-probe");
    let probe = probe.to_str().unwrap();
    let granted_dir = std::fs::canonicalize(granted.path()).unwrap();
    let args = ["run", probe, "--allow-read", granted_dir.to_str().unwrap(), "--max-total-subagents", "7", "-q"];
    let (code, shown) = on_a_terminal(state.path(), &args, "n\n");
    assert_eq!(code, Some(1), "{shown}");
    assert!(shown.contains("name:     wasi-probe"), "{shown}");
    assert!(shown.contains(&format!("sha256:   {}", sha256(Path::new(probe)))), "{shown}");
    assert!(shown.contains("limits:   maxTotalSubagents=7"), "{shown}");
    assert!(shown.contains(&format!("read-only {} (as /grant/0)", granted_dir.display())), "{shown}");
    assert!(shown.contains("Run it? [y/N]"), "{shown}");
    assert!(shown.contains("declined"), "{shown}");
    let listed = runs(state.path());
    assert_eq!(listed.len(), 1, "the declined run exists");
    assert_eq!(listed[0]["status"], "cancelled");
    assert_eq!(listed[0]["failure"]["kind"], "declined");
    assert!(shown.contains(listed[0]["runId"].as_str().unwrap()), "the run id is shown: {shown}");

    // "y" runs it and remembers the approval: the next run needs no terminal.
    let (code, shown) = on_a_terminal(state.path(), &["run", probe, "-q"], "y\n");
    assert_eq!(code, Some(0), "{shown}");
    let listed = stdout_json(&factory_in(state.path(), &["trust", "--json"]));
    assert_eq!(listed[0]["source"], "approved");
    let out = factory_in(state.path(), &["run", probe, "-q"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// Stops the `factory serve` this test started (SIGTERM, then waits) when dropped.
struct Daemon(std::process::Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.0.wait();
    }
}

#[test]
fn consent_and_grants_hold_when_another_process_holds_the_store() {
    let state = tempfile::tempdir().unwrap();
    let daemon = Command::new(common::factory_bin())
        .arg("serve")
        .env("FACTORY_STATE_DIR", state.path())
        .env("FACTORY_CACHE_DIR", common::guest_target_dir().join("cache"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("factory serve starts");
    let _daemon = Daemon(daemon);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !state.path().join("control.sock").exists() {
        assert!(std::time::Instant::now() < deadline, "factory serve never listened");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }

    let probe = common::wasi_component("wasi-probe");
    let out = factory_in(state.path(), &["run", probe.to_str().unwrap(), "-q"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("is not trusted on this machine"), "{}", stderr(&out));

    let granted = tempfile::tempdir().unwrap();
    std::fs::write(granted.path().join("note.txt"), "through the socket").unwrap();
    let args = r#"{"read":["/grant/0/note.txt"]}"#;
    let dir = granted.path().to_str().unwrap();
    let out = factory_in(
        state.path(),
        &["run", probe.to_str().unwrap(), "--yes", "--allow-read", dir, "--args", args, "--json"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("held by another factory process"), "it ran in the daemon: {}", stderr(&out));
    let envelope = stdout_json(&out);
    assert_eq!(envelope["result"]["read"]["/grant/0/note.txt"], json!({ "ok": "through the socket" }));
    let detail = stdout_json(&factory_in(state.path(), &["show", envelope["runId"].as_str().unwrap(), "--json"]));
    let canonical = std::fs::canonicalize(granted.path()).unwrap();
    assert_eq!(detail["grants"], json!([canonical]));
}

/// The sha256 of a text, as the trust store names a script source.
fn sha256_text(text: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn a_script_approved_at_the_prompt_is_trusted_for_that_script_only() {
    let state = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let source = |name: &str| {
        format!(
            "import {{ defineFactory }} from \"@github/copilot-sdk/extension\";\n\
             export default defineFactory({{ meta: {{ name: \"{name}\", description: \"d\" }}, run: async (ctx) => {{ ctx.log(\"{name}\"); return 1; }} }});\n"
        )
    };
    for name in ["first", "second"] {
        let file = dir.path().join(format!("{name}.js"));
        std::fs::write(&file, source(name)).unwrap();
        let out = factory_in(state.path(), &["add", file.to_str().unwrap()]);
        assert!(out.status.success(), "{}", stderr(&out));
        // Registered here it is trusted; take that back so the prompt decides.
        let out = factory_in(state.path(), &["trust", "--revoke", file.to_str().unwrap()]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let (code, shown) = on_a_terminal(state.path(), &["run", "first", "-q"], "y\n");
    assert_eq!(code, Some(0), "{shown}");
    assert!(shown.contains("Run it? [y/N]"), "{shown}");
    // The approval names the script's source, not the JS runner every script shares.
    let listed = stdout_json(&factory_in(state.path(), &["trust", "--json"]));
    let approved: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["source"] == "approved")
        .filter_map(|t| t["sha256"].as_str())
        .collect();
    assert_eq!(approved, vec![sha256_text(&source("first")).as_str()], "{listed:#}");
    let out = factory_in(state.path(), &["run", "first", "-q"]);
    assert!(out.status.success(), "the approved script runs without asking: {}", stderr(&out));
    // Another script through the same runner is not covered by that approval.
    let out = factory_in(state.path(), &["run", "second", "-q"]);
    assert!(!out.status.success(), "another script ran on the first one's approval");
    assert!(stderr(&out).contains("is not trusted on this machine"), "{}", stderr(&out));
}
