//! Building a crate runs its native code (issue 20), through the real binary: `describe`,
//! `trust` and `trust --revoke` never build a crate directory; without bubblewrap a build
//! (`run`, `build`, `add`, `resume --component`) needs consent (`--yes`, or "y" on a
//! terminal) and without it nothing is built; with bubblewrap the
//! build's `build.rs` can write nowhere but its target directory and reach no network (it
//! reports what it could do through the factory it builds); a `.cargo/config.toml` or
//! `rust-toolchain.toml` in the working directory is not honoured; a bare name runs the
//! registered factory, never a `./NAME` directory. The crates are written into temp dirs
//! here, each with a `build.rs` that leaves a marker file where it should not be able to.

mod common;

use common::{factory_cmd, stderr, stdout_json};

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Output;

/// A crate `dir/name` with no dependencies whose `build.rs` writes the file named by
/// `$BUILD_MARKER` (set by the test) and then builds an empty cdylib.
fn marker_crate(dir: &Path, name: &str) -> PathBuf {
    let krate = dir.join(name);
    std::fs::create_dir_all(krate.join("src")).unwrap();
    std::fs::write(
        krate.join("Cargo.toml"),
        format!("[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[lib]\ncrate-type = [\"cdylib\"]\n\n[workspace]\n"),
    )
    .unwrap();
    std::fs::write(
        krate.join("build.rs"),
        "fn main() {\n    if let Some(marker) = std::env::var_os(\"BUILD_MARKER\") {\n        std::fs::write(marker, \"build.rs ran\").expect(\"marker written\");\n    }\n}\n",
    )
    .unwrap();
    std::fs::write(krate.join("src/lib.rs"), "").unwrap();
    krate
}

/// `factory ARGS` in working directory `cwd` against state `state`, with `$BUILD_MARKER` set
/// to `marker` and a target directory of its own (so every build runs the build script).
fn factory_at(cwd: &Path, state: &Path, target_dir: &Path, marker: &Path, args: &[&str]) -> std::process::Command {
    let mut cmd = factory_cmd(state, args);
    cmd.current_dir(cwd).env("BUILD_MARKER", marker).env("CARGO_TARGET_DIR", target_dir);
    cmd
}

fn run(mut cmd: std::process::Command) -> Output {
    cmd.output().expect("the factory binary starts")
}

/// bubblewrap must be installed for the sandbox tests (never skipped).
fn require_bwrap() {
    let ok = std::process::Command::new("bwrap").arg("--version").output().is_ok_and(|o| o.status.success());
    assert!(ok, "these tests need bubblewrap: install it (Debian/Ubuntu: apt-get install bubblewrap)");
}

#[test]
fn describe_and_trust_never_build_a_crate_directory() {
    let work = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let targets = tempfile::tempdir().unwrap();
    marker_crate(work.path(), "hello");
    let marker = work.path().join("marker");
    for args in [
        vec!["describe", "hello"],
        vec!["describe", "./hello", "--json"],
        vec!["trust", "hello"],
        vec!["trust", "--revoke", "hello"],
    ] {
        let out = run(factory_at(work.path(), state.path(), targets.path(), &marker, &args));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("is a Rust crate directory") && err.contains("factory build"),
            "{args:?} says how to build it: {err}"
        );
        assert!(!marker.exists(), "{args:?} ran the crate's build.rs");
    }
    assert!(!targets.path().join("release").exists(), "nothing was built");
    let listed =
        stdout_json(&run(factory_at(work.path(), state.path(), targets.path(), &marker, &["trust", "--json"])));
    assert_eq!(listed, serde_json::json!([]));
}

#[test]
fn without_bubblewrap_a_crate_is_built_only_with_consent() {
    let work = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let targets = tempfile::tempdir().unwrap();
    marker_crate(work.path(), "hello");
    let marker = work.path().join("marker");
    let missing = work.path().join("no-such-bwrap");
    let without_bwrap = |args: &[&str]| {
        let mut cmd = factory_at(work.path(), state.path(), targets.path(), &marker, args);
        cmd.env("FACTORY_BWRAP", &missing);
        run(cmd)
    };
    // No terminal (stdin closed) and no --yes: nothing is built, and the message says why.
    let resume = vec!["resume", "no-such-run", "--component", "./hello"];
    for args in [vec!["run", "./hello"], vec!["build", "./hello"], vec!["add", "./hello"], resume] {
        let out = without_bwrap(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("bubblewrap") && err.contains("no-such-bwrap"),
            "{args:?} says the sandbox is missing: {err}"
        );
        assert!(err.contains("--yes") && err.contains("apt-get install bubblewrap"), "{args:?} says what to do: {err}");
        assert!(!marker.exists(), "{args:?} ran the crate's build.rs without consent");
    }
    // With --yes it builds natively (the build.rs runs as the user, as consented), and the
    // component counts as built here.
    let out = without_bwrap(&["build", "./hello", "--yes"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("natively"), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "build.rs ran");
    let listed = stdout_json(&without_bwrap(&["trust", "--json"]));
    assert_eq!(listed[0]["source"], "built", "{listed:#}");
}

/// A factory crate whose `build.rs` tries to write outside its target directory (into
/// `$HOME`, `/tmp`, a directory of the test's, its own source directory) and to connect to
/// the test's loopback listener, and records what happened in `OUT_DIR`, which the factory
/// returns as its result.
fn probing_crate(dir: &Path, sdk: &Path) -> PathBuf {
    let krate = dir.join("prober");
    std::fs::create_dir_all(krate.join("src")).unwrap();
    std::fs::write(
        krate.join("Cargo.toml"),
        format!(
            "[package]\nname = \"prober\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[lib]\ncrate-type = [\"cdylib\"]\n\n\
             [dependencies]\nfactory-sdk = {{ path = \"{}\" }}\n\n[workspace]\n",
            sdk.display()
        ),
    )
    .unwrap();
    std::fs::copy(common::root().join("Cargo.lock"), krate.join("Cargo.lock")).unwrap();
    std::fs::write(
        krate.join("build.rs"),
        r#"use std::fmt::Write as _;
fn main() {
    let mut report = String::new();
    let home = std::env::var("HOME").unwrap_or_default();
    let outside = std::env::var("PROBE_OUTSIDE").unwrap_or_default();
    let source = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    let out_dir = std::env::var("OUT_DIR").unwrap_or_default();
    for (what, path) in [
        ("home", format!("{home}/probe-marker")),
        ("tmp", std::env::var("PROBE_TMP").unwrap_or_default()),
        ("outside", format!("{outside}/probe-marker")),
        ("source", format!("{source}/probe-marker")),
        ("out_dir", format!("{out_dir}/probe-marker")),
    ] {
        let outcome = match std::fs::write(&path, "written by build.rs") {
            Ok(()) => "ok".to_string(),
            Err(e) => format!("{:?}", e.kind()),
        };
        let _ = writeln!(report, "{what}={outcome}");
    }
    let connect = std::env::var("PROBE_ADDR").ok().and_then(|a| a.parse().ok()).map(|addr| {
        match std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(5)) {
            Ok(_) => "ok".to_string(),
            Err(e) => format!("{:?}", e.kind()),
        }
    });
    let _ = writeln!(report, "connect={}", connect.unwrap_or_else(|| "no address".into()));
    std::fs::write(format!("{out_dir}/report.txt"), report).expect("OUT_DIR is writable");
}
"#,
    )
    .unwrap();
    std::fs::write(
        krate.join("src/lib.rs"),
        r#"use factory_sdk::prelude::*;
struct Prober;
impl Factory for Prober {
    type Output = Value;
    fn meta() -> Meta {
        Meta::new("prober", "Returns what its build.rs could do.")
    }
    async fn run(_ctx: Ctx) -> Result<Value, Error> {
        let report = include_str!(concat!(env!("OUT_DIR"), "/report.txt"));
        let mut out = factory_sdk::serde_json::Map::new();
        for line in report.lines() {
            if let Some((k, v)) = line.split_once('=') {
                out.insert(k.to_string(), Value::String(v.to_string()));
            }
        }
        Ok(Value::Object(out))
    }
}
factory_sdk::export!(Prober);
"#,
    )
    .unwrap();
    krate
}

#[test]
fn a_sandboxed_build_writes_only_its_target_dir_and_reaches_no_network() {
    require_bwrap();
    let work = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let krate = probing_crate(work.path(), &common::root().join("guest-sdk/rust"));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let tmp_marker = PathBuf::from(format!("/tmp/factory-probe-marker-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp_marker);

    // The shared guest target dir: the SDK's dependencies are built there already.
    let mut cmd = factory_cmd(state.path(), &["run", krate.to_str().unwrap(), "--json", "-q"]);
    cmd.current_dir(work.path())
        .env("PROBE_OUTSIDE", outside.path())
        .env("PROBE_TMP", &tmp_marker)
        .env("PROBE_ADDR", &addr);
    let out = run(cmd);
    assert!(out.status.success(), "{}", stderr(&out));
    let envelope = stdout_json(&out);
    assert_eq!(envelope["status"], "completed", "{envelope:#}");
    let report = &envelope["result"];
    // The build ran (its report is in the component) and could write only into OUT_DIR.
    assert_eq!(report["out_dir"], "ok", "{report:#}");
    // Its own source is read-only; $HOME and the test's directory (both under /tmp here)
    // are not even there, as the sandbox's /tmp is a private, empty one: what is written
    // there vanishes with the sandbox.
    assert_eq!(report["source"], "ReadOnlyFilesystem", "{report:#}");
    for what in ["home", "outside"] {
        assert!(report[what].is_string() && report[what] != "ok", "{what}: {report:#}");
    }
    assert!(!tmp_marker.exists(), "{report:#}");
    assert!(!common::test_home().join("probe-marker").exists());
    assert!(!outside.path().join("probe-marker").exists());
    assert!(!krate.join("probe-marker").exists());
    // No network: the loopback listener was never reached.
    assert_ne!(report["connect"], "ok", "{report:#}");
    assert_ne!(report["connect"], "no address", "{report:#}");
    assert!(listener.accept().is_err(), "the build connected to the test's listener");
    // What the sandbox built counts as built here.
    let mut cmd = factory_cmd(state.path(), &["trust", "--json"]);
    cmd.current_dir(work.path());
    let listed = stdout_json(&run(cmd));
    assert_eq!(listed[0]["source"], "built", "{listed:#}");
}

#[test]
fn the_working_directorys_cargo_config_and_toolchain_file_are_not_honoured() {
    require_bwrap();
    let state = tempfile::tempdir().unwrap();
    let targets = tempfile::tempdir().unwrap();
    let crates = tempfile::tempdir().unwrap();
    let krate = marker_crate(crates.path(), "plain");
    let not_here = crates.path().join("unused-marker");

    // A working directory whose cargo config starts a program of its own for every rustc
    // call, and a working directory naming a toolchain that does not exist.
    let configured = tempfile::tempdir().unwrap();
    let wrapper_marker = configured.path().join("wrapper-ran");
    let wrapper = configured.path().join("wrapper.sh");
    std::fs::write(&wrapper, format!("#!/bin/sh\necho ran > '{}'\nexec \"$@\"\n", wrapper_marker.display())).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::create_dir_all(configured.path().join(".cargo")).unwrap();
    std::fs::write(
        configured.path().join(".cargo/config.toml"),
        format!(
            "[build]\nrustc-wrapper = \"{}\"\nrustflags = [\"--cfg\", \"from_the_working_directory\"]\n",
            wrapper.display()
        ),
    )
    .unwrap();
    let toolchain = tempfile::tempdir().unwrap();
    std::fs::write(toolchain.path().join("rust-toolchain.toml"), "[toolchain]\nchannel = \"no-such-toolchain\"\n")
        .unwrap();

    for cwd in [configured.path(), toolchain.path()] {
        let mut cmd = factory_at(cwd, state.path(), targets.path(), &not_here, &["build", krate.to_str().unwrap()]);
        // What rustup set for the test process itself would hide the toolchain file.
        cmd.env_remove("RUSTUP_TOOLCHAIN");
        let out = run(cmd);
        assert!(out.status.success(), "in {}: {}", cwd.display(), stderr(&out));
        let component = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        assert!(component.is_file(), "{}", component.display());
        assert!(!wrapper_marker.exists(), "the working directory's rustc-wrapper ran");
    }
}

#[test]
fn a_bare_name_runs_the_registered_factory_never_a_directory() {
    let work = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let targets = tempfile::tempdir().unwrap();
    let marker = work.path().join("marker");
    let at = |args: &[&str]| run(factory_at(work.path(), state.path(), targets.path(), &marker, args));
    let hello = common::component("hello");
    let out = at(&["add", hello.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    // A crate directory named like the registered factory is in the working directory.
    marker_crate(work.path(), "hello");

    let out = at(&["run", "hello", "--yes", "--json", "-q"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let envelope: Value = stdout_json(&out);
    assert_eq!(envelope["status"], "completed", "{envelope:#}");
    assert_eq!(envelope["factory"], "hello");
    assert!(!marker.exists(), "`run hello` built ./hello");

    // A bare name that is not registered is not taken as the directory either: the error
    // points at the path.
    std::fs::create_dir(work.path().join("ghost")).unwrap();
    let out = at(&["run", "ghost", "--yes"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("no factory named `ghost`") && err.contains("did you mean ./ghost?"), "{err}");
    assert!(!marker.exists());
}

/// `factory ARGS` on a pseudo-terminal in `cwd` without bubblewrap, typing `answer`: its
/// exit code and what the terminal showed.
fn on_a_terminal_without_bwrap(
    cwd: &Path,
    state: &Path,
    target_dir: &Path,
    marker: &Path,
    args: &[&str],
    answer: &str,
) -> (Option<i32>, String) {
    let mut cmd = factory_at(cwd, state, target_dir, marker, args);
    cmd.env("FACTORY_BWRAP", cwd.join("no-such-bwrap")).current_dir(cwd);
    common::on_a_terminal(&cmd, answer)
}

#[test]
fn on_a_terminal_a_native_build_is_asked_for_and_no_builds_nothing() {
    let work = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let targets = tempfile::tempdir().unwrap();
    marker_crate(work.path(), "hello");
    let marker = work.path().join("marker");
    let build = ["build", "./hello"];
    let (code, shown) = on_a_terminal_without_bwrap(work.path(), state.path(), targets.path(), &marker, &build, "n\n");
    assert_eq!(code, Some(2), "{shown}");
    assert!(
        shown.contains("runs its build.rs and proc macros") && shown.contains("Build it natively? [y/N]"),
        "{shown}"
    );
    assert!(shown.contains("declined"), "{shown}");
    assert!(!marker.exists(), "a declined build ran the crate's build.rs");

    let (code, shown) = on_a_terminal_without_bwrap(work.path(), state.path(), targets.path(), &marker, &build, "y\n");
    assert_eq!(code, Some(0), "{shown}");
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "build.rs ran");
}

#[test]
fn a_component_file_left_in_the_target_dir_is_never_reused() {
    // A `.component.wasm` newer than the module (as a build.rs could leave one) was reused
    // and trusted as built here; every build now encodes its own.
    require_bwrap();
    let work = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let targets = tempfile::tempdir().unwrap();
    marker_crate(work.path(), "hello");
    let marker = work.path().join("marker");
    let build = || run(factory_at(work.path(), state.path(), targets.path(), &marker, &["build", "./hello"]));
    let out = build();
    assert!(out.status.success(), "{}", stderr(&out));
    let component = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let good = std::fs::read(&component).unwrap();
    std::fs::write(&component, b"planted, not a component").unwrap();
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(3600);
    std::fs::File::options().write(true).open(&component).unwrap().set_modified(later).unwrap();
    let out = build();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(&component).unwrap(), good, "the planted file was replaced by the build's own component");
}
