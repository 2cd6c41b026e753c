//! The prebuilt JS runner (`guest-sdk/js-runner/js-runner.component.wasm`, which the host
//! embeds) is what its sources build: `cargo xtask js-runner --check` rebuilds it from
//! source (pinned Rust toolchain, clang 19, remapped paths) and must produce the committed
//! bytes. Fails naming the regenerate command when they differ, and with the install hint
//! when clang 19 or the wasm32 target is missing (never skipped).

mod common;

use std::path::PathBuf;

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| common::root().join("target"))
}

#[test]
fn the_committed_runner_is_what_its_sources_build() {
    let target = target_dir();
    // The xtask is built in a target dir of its own: the `cargo test` running us holds the
    // lock of ours. The runner compiles under target/js-runner (cargo's cache keeps a
    // rebuild of unchanged sources cheap; the bytes do not depend on where it is).
    let out = std::process::Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .args(["run", "--locked", "--quiet", "-p", "xtask", "--", "js-runner", "--check", "--target-dir"])
        .arg(target.join("js-runner"))
        .current_dir(common::root())
        .env("CARGO_TARGET_DIR", target.join("xtask"))
        .output()
        .expect("cargo runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "`cargo xtask js-runner --check` failed ({}): the committed runner must be rebuilt with `cargo xtask js-runner` \
         (which needs clang 19: see the error below)\n{stderr}",
        out.status
    );
    assert!(stdout.contains("rebuilt from source, identical"), "unexpected output: {stdout}\n{stderr}");
}
