//! Builds the JS runner (`guest-sdk/js-runner`) for `wasm32-unknown-unknown`, componentizes
//! it with wit-component and leaves it in `OUT_DIR/js-runner.component.wasm`, which
//! `src/guests/script.rs` embeds with `include_bytes!` — the runner ships inside the `factory`
//! binary, built from source (as wasmtime builds its test programs), never committed.
//!
//! The inner cargo uses its own target directory (`<target-dir>/js-runner`): running cargo on
//! the outer build's directory would wait forever on its build lock. Cargo's own cache makes
//! a rebuild of an unchanged runner a no-op. QuickJS is C: the build needs a clang that
//! targets wasm32 (Debian: `apt-get install clang-19 lld-19`); `CC_wasm32_unknown_unknown`
//! overrides the search.

use std::path::{Path, PathBuf};
use std::process::Command;

const TARGET: &str = "wasm32-unknown-unknown";

fn main() {
    let manifest_dir = PathBuf::from(env("CARGO_MANIFEST_DIR"));
    let workspace = manifest_dir.parent().expect("host/ has a parent").to_path_buf();
    let runner = workspace.join("guest-sdk/js-runner");
    let out_dir = PathBuf::from(env("OUT_DIR"));
    println!("cargo:rerun-if-changed={}", runner.join("src").display());
    println!("cargo:rerun-if-changed={}", runner.join("Cargo.toml").display());
    println!("cargo:rerun-if-changed={}", workspace.join("wit").display());
    println!("cargo:rerun-if-env-changed=CC_wasm32_unknown_unknown");
    println!("cargo:rerun-if-env-changed=FACTORY_JS_RUNNER_CC");

    // <target-dir>/<profile>/build/factory-host-HASH/out -> <target-dir>
    let target_dir = out_dir.ancestors().nth(4).map(Path::to_path_buf).unwrap_or_else(|| out_dir.clone());
    let inner_target = target_dir.join("js-runner");

    let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cargo
        .args(["build", "--release", "--locked", "--target", TARGET, "-p", "factory-js-runner"])
        .arg("--manifest-path")
        .arg(workspace.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &inner_target)
        // The outer build's flags are for the host, not for wasm.
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .env_remove("CARGO_PROFILE_RELEASE_DEBUG")
        .env_remove("RUSTC_WORKSPACE_WRAPPER");
    match find_clang() {
        Some(clang) => {
            if let Some(bin) = clang.parent() {
                // llvm-ar and friends live beside it.
                let path = std::env::var_os("PATH").unwrap_or_default();
                let mut dirs = vec![bin.to_path_buf()];
                dirs.extend(std::env::split_paths(&path));
                cargo.env("PATH", std::env::join_paths(dirs).expect("PATH entries"));
            }
            cargo.env("CC_wasm32_unknown_unknown", &clang);
        }
        None => {
            return without_runner(
                &out_dir,
                "no clang that targets wasm32 was found (the JS runner embeds QuickJS, which is C): \
                 Debian/Ubuntu: apt-get install -y clang-19 lld-19; elsewhere: install clang (LLVM >= 16) \
                 and set CC_wasm32_unknown_unknown=/path/to/clang",
            )
        }
    }
    let status = cargo.status().unwrap_or_else(|e| fail(&format!("cannot run cargo: {e}")));
    if !status.success() {
        return without_runner(
            &out_dir,
            "cargo build of guest-sdk/js-runner for wasm32-unknown-unknown failed (is the target installed? \
             rustup target add wasm32-unknown-unknown)",
        );
    }
    let core = inner_target.join(TARGET).join("release").join("factory_js_runner.wasm");
    let bytes = std::fs::read(&core).unwrap_or_else(|e| fail(&format!("cannot read {}: {e}", core.display())));
    let component = wit_component::ComponentEncoder::default()
        .module(&bytes)
        .and_then(|encoder| encoder.validate(true).encode())
        .unwrap_or_else(|e| fail(&format!("componentizing the JS runner failed: {e:#}")));
    let out = out_dir.join("js-runner.component.wasm");
    // Rewrite only on change, so the host crate is not recompiled for nothing.
    if std::fs::read(&out).ok().as_deref() != Some(component.as_slice()) {
        std::fs::write(&out, &component).unwrap_or_else(|e| fail(&format!("cannot write {}: {e}", out.display())));
    }
}

/// Build the host without a JS runner (an empty one): everything but JavaScript factories
/// works, and those say how to get a runner. The README's first command must work on a
/// machine that has only Rust.
fn without_runner(out_dir: &Path, why: &str) {
    println!("cargo:warning=the factory binary is built WITHOUT the JS runner: {why}; then rebuild to run .js factories");
    let out = out_dir.join("js-runner.component.wasm");
    if std::fs::read(&out).map(|b| !b.is_empty()).unwrap_or(true) {
        std::fs::write(&out, b"").unwrap_or_else(|e| fail(&format!("cannot write {}: {e}", out.display())));
    }
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| fail(&format!("{name} is not set")))
}

fn fail(message: &str) -> ! {
    eprintln!("error: building the JS runner: {message}");
    println!("cargo:warning=building the JS runner: {message}");
    std::process::exit(1)
}

/// A clang for wasm32: `$FACTORY_JS_RUNNER_CC` / `$CC_wasm32_unknown_unknown`, else `clang`
/// on PATH, else a versioned Debian/Ubuntu one (`/usr/lib/llvm-N/bin/clang`).
fn find_clang() -> Option<PathBuf> {
    for var in ["FACTORY_JS_RUNNER_CC", "CC_wasm32_unknown_unknown"] {
        if let Some(cc) = std::env::var_os(var) {
            let cc = PathBuf::from(cc);
            return Some(which(&cc).unwrap_or(cc));
        }
    }
    let mut candidates = Vec::new();
    for version in (16..=22).rev() {
        candidates.push(PathBuf::from(format!("/usr/lib/llvm-{version}/bin/clang")));
    }
    candidates.push(PathBuf::from("clang"));
    candidates.into_iter().find_map(|c| which(&c).filter(|c| targets_wasm(c)))
}

fn which(program: &Path) -> Option<PathBuf> {
    if program.components().count() > 1 {
        return program.is_file().then(|| program.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(program)).find(|p| p.is_file())
}

/// Does `clang` know the wasm32 target?
fn targets_wasm(clang: &Path) -> bool {
    Command::new(clang)
        .args(["--print-targets"])
        .output()
        .map(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains("wasm32"))
        .unwrap_or(false)
}
