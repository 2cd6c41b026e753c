//! Embeds the prebuilt JS runner: `guest-sdk/js-runner/js-runner.component.wasm`, committed
//! in the repository, copied to `OUT_DIR/js-runner.component.wasm`, which
//! `src/guests/script.rs` embeds with `include_bytes!`. Building `factory` therefore needs
//! no C compiler and no wasm32 target: this script runs no program at all.
//!
//! The runner is built from its sources (`guest-sdk/js-runner`: QuickJS, which is C, in a
//! Rust component) by `cargo xtask js-runner`, reproducibly (pinned toolchain and clang,
//! remapped paths); `cargo xtask js-runner --check` (run by `tests/js_runner.rs`) proves
//! the committed bytes are what the sources build. Here, cheaply, the manifest beside it
//! (`js-runner.inputs`: the sha256 of the runner and of every source file it is built from)
//! must match the files as they are: a source change without regenerating fails the build
//! naming the changed files and the command, instead of running a stale runner.

use std::path::{Path, PathBuf};

// `RUNNER_PATH`, `INPUTS_PATH`, `REGENERATE`, `INPUT_ROOTS`, `inputs_manifest`: shared with xtask.
#[allow(dead_code)]
mod inputs {
    include!("../guest-sdk/js-runner/inputs.rs");
}

fn main() {
    let manifest_dir =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| fail("CARGO_MANIFEST_DIR is not set")));
    let workspace = manifest_dir.parent().unwrap_or_else(|| fail("host/ has no parent directory")).to_path_buf();
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_else(|| fail("OUT_DIR is not set")));
    let runner_path = workspace.join(inputs::RUNNER_PATH);
    let inputs_path = workspace.join(inputs::INPUTS_PATH);
    println!("cargo:rerun-if-changed={}", runner_path.display());
    println!("cargo:rerun-if-changed={}", inputs_path.display());
    for root in inputs::INPUT_ROOTS {
        println!("cargo:rerun-if-changed={}", workspace.join(root).display());
    }

    let runner = std::fs::read(&runner_path).unwrap_or_else(|e| {
        fail(&format!(
            "cannot read the prebuilt JS runner {}: {e} (it is committed in the repository; regenerate it with `{}`)",
            runner_path.display(),
            inputs::REGENERATE
        ))
    });
    // A component (layer 1), not a core module, an empty file or a Git LFS pointer.
    if !runner.starts_with(b"\0asm\x0d\x00\x01\x00") {
        fail(&format!(
            "{} is not a WebAssembly component ({} bytes): regenerate it with `{}`",
            inputs::RUNNER_PATH,
            runner.len(),
            inputs::REGENERATE
        ));
    }
    check_inputs(&workspace, &inputs_path, &runner);

    let out = out_dir.join("js-runner.component.wasm");
    // Rewrite only on change, so the host crate is not recompiled for nothing.
    if std::fs::read(&out).ok().as_deref() != Some(runner.as_slice()) {
        std::fs::write(&out, &runner).unwrap_or_else(|e| fail(&format!("cannot write {}: {e}", out.display())));
    }
}

/// The recorded manifest equals the one of the files as they are now, else the build fails
/// naming what changed.
fn check_inputs(workspace: &Path, inputs_path: &Path, runner: &[u8]) {
    let current = inputs::inputs_manifest(workspace, runner)
        .unwrap_or_else(|e| fail(&format!("cannot read the JS runner's sources: {e}")));
    let recorded = std::fs::read_to_string(inputs_path).unwrap_or_else(|e| {
        fail(&format!(
            "cannot read {}: {e}; regenerate the runner with `{}`",
            inputs_path.display(),
            inputs::REGENERATE
        ))
    });
    if current == recorded {
        return;
    }
    // `<sha256>  <path>` lines: name each path whose hash differs or that one side lacks.
    let entries = |text: &str| -> Vec<(String, String)> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split_once("  ").map(|(h, p)| (p.to_string(), h.to_string())))
            .collect()
    };
    let (now, then) = (entries(&current), entries(&recorded));
    let mut changed: Vec<String> = now.iter().filter(|e| !then.contains(e)).map(|(p, _)| p.clone()).collect();
    for (path, _) in &then {
        if !now.iter().any(|(p, _)| p == path) {
            changed.push(format!("{path} (removed)"));
        }
    }
    changed.dedup();
    let what = if changed.is_empty() { "the manifest's form".to_string() } else { changed.join(", ") };
    fail(&format!(
        "the prebuilt JS runner ({}) was not regenerated after its inputs changed (changed: {what}): run `{}` \
         (needs clang 19: Debian/Ubuntu apt-get install -y clang-19 lld-19) and commit {} with {}",
        inputs::RUNNER_PATH,
        inputs::REGENERATE,
        inputs::RUNNER_PATH,
        inputs::INPUTS_PATH
    ))
}

fn fail(message: &str) -> ! {
    eprintln!("error: the JS runner: {message}");
    println!("cargo:warning=the JS runner: {message}");
    std::process::exit(1)
}
