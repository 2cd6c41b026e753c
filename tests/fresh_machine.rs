//! A fresh machine (only rustup: no clang, no wasm32 target) builds a `factory` that runs
//! JavaScript factories.
//!
//! How this is checked, and why so: the one part of the host's build that ever needed clang
//! or the wasm32 target is its build script (`host/build.rs`, which compiled the QuickJS
//! runner; every other crate is Rust, or C for the host's own target, which rustup's linker
//! requirement already covers). A real `cargo build` into an empty target directory with
//! PATH stripped would rebuild all ~400 dependencies — tens of minutes on a 2-core machine,
//! on every test run — so instead these tests run the very build script cargo compiled for
//! this test run, with an empty environment and an empty PATH (no clang, no cargo, no
//! rustc, hence no wasm32 target either: it can run no program at all), and check it leaves
//! the committed runner; then the `factory` binary built from it runs a `.js` factory with an
//! empty PATH. The same script refuses runner sources changed without regenerating.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The build script cargo compiled from `host/build.rs` for this run's profile: the newest
/// `build/factory-host-*/build-script-build` beside this test binary's `deps/` (older
/// ones belong to other dependency sets).
fn build_script() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe.parent().and_then(Path::parent).expect("<target>/<profile>/deps/<test>");
    let mut scripts: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(profile_dir.join("build"))
        .expect("<target>/<profile>/build")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("factory-host-"))
        .map(|e| e.path().join("build-script-build"))
        .filter(|p| p.is_file())
        .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
        .collect();
    scripts.sort();
    scripts.pop().map(|(_, p)| p).expect("cargo compiled host/build.rs (build/factory-host-*/build-script-build)")
}

/// A copy of what the build script reads: the runner, its manifest and sources, the WIT
/// contract, the toolchain pin. `host/` is empty: the script reads nothing of it.
fn workspace_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = common::root();
    for rel in ["guest-sdk/js-runner", "wit"] {
        copy_tree(&root.join(rel), &dir.path().join(rel));
    }
    std::fs::copy(root.join("rust-toolchain.toml"), dir.path().join("rust-toolchain.toml"))
        .expect("copy rust-toolchain.toml");
    std::fs::create_dir_all(dir.path().join("host")).expect("host/");
    dir
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// Run the build script as cargo would on a machine with nothing installed: only the
/// variables cargo sets for it, and PATH an empty directory.
fn run_build_script(workspace: &Path, out_dir: &Path, empty_path: &Path) -> Output {
    std::fs::create_dir_all(out_dir).expect("OUT_DIR");
    Command::new(build_script())
        .env_clear()
        .env("PATH", empty_path)
        .env("CARGO_MANIFEST_DIR", workspace.join("host"))
        .env("CARGO_PKG_NAME", "factory-host")
        .env("OUT_DIR", out_dir)
        .env("TARGET", "x86_64-unknown-linux-gnu")
        .env("HOST", "x86_64-unknown-linux-gnu")
        .env("PROFILE", "debug")
        .current_dir(workspace.join("host"))
        .output()
        .expect("the build script starts")
}

#[test]
fn the_host_build_runs_no_compiler_and_embeds_the_committed_runner() {
    let workspace = workspace_copy();
    let empty = tempfile::tempdir().expect("empty PATH dir");
    let out_dir = workspace.path().join("out");
    let out = run_build_script(workspace.path(), &out_dir, empty.path());
    assert!(
        out.status.success(),
        "the build script failed with nothing on PATH ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let embedded =
        std::fs::read(out_dir.join("js-runner.component.wasm")).expect("the build script leaves the runner in OUT_DIR");
    let committed = std::fs::read(common::root().join("guest-sdk/js-runner/js-runner.component.wasm"))
        .expect("the committed runner");
    assert!(
        embedded == committed,
        "OUT_DIR's runner ({} bytes) is not the committed one ({} bytes)",
        embedded.len(),
        committed.len()
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("cargo:warning"),
        "warnings: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn a_runner_source_changed_without_regenerating_fails_the_build_naming_the_command() {
    let workspace = workspace_copy();
    let empty = tempfile::tempdir().expect("empty PATH dir");
    let prelude = workspace.path().join("guest-sdk/js-runner/src/prelude.js");
    let mut text = std::fs::read_to_string(&prelude).expect("prelude.js");
    text.push_str("\n// an edit\n");
    std::fs::write(&prelude, text).expect("edit prelude.js");
    let out = run_build_script(workspace.path(), &workspace.path().join("out"), empty.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a stale runner was accepted: {stderr}");
    assert!(stderr.contains("changed: guest-sdk/js-runner/src/prelude.js"), "the changed file is not named: {stderr}");
    assert!(stderr.contains("`cargo xtask js-runner`"), "the regenerate command is not named: {stderr}");
    assert!(!workspace.path().join("out/js-runner.component.wasm").exists(), "a stale runner was embedded");

    // A file added to the runner's sources counts too.
    std::fs::write(&prelude, std::fs::read(common::root().join("guest-sdk/js-runner/src/prelude.js")).unwrap())
        .unwrap();
    std::fs::write(workspace.path().join("guest-sdk/js-runner/src/extra.js"), "export const x = 1;\n").unwrap();
    let out = run_build_script(workspace.path(), &workspace.path().join("out"), empty.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a new source file went unnoticed: {stderr}");
    assert!(stderr.contains("guest-sdk/js-runner/src/extra.js"), "the new file is not named: {stderr}");
}

#[test]
fn the_built_factory_runs_a_js_factory_with_nothing_on_path() {
    let state = tempfile::tempdir().expect("state dir");
    let empty = tempfile::tempdir().expect("empty PATH dir");
    let example = common::root().join("examples/js/review-changed.js");
    let out = common::factory_cmd(
        state.path(),
        &["run", example.to_str().expect("UTF-8 path"), "--args", r#"{"files":["src/a.rs"]}"#],
    )
    .env("PATH", empty.path())
    .env_remove("CC_wasm32_unknown_unknown")
    .env_remove("RUSTUP_TOOLCHAIN")
    .output()
    .expect("factory starts");
    let result = common::stdout_json(&out);
    assert!(out.status.success(), "{}: {}", out.status, String::from_utf8_lossy(&out.stderr));
    assert_eq!(result["reviews"][0], "[dry-run Review src/a.rs] reply to: Review src/a.rs", "{result}");
}
