//! The repository's task runner (`cargo xtask <task>`, an alias in `.cargo/config.toml`).
//! Its task `js-runner` rebuilds the JS runner component from source
//! (`guest-sdk/js-runner`: a Rust crate embedding QuickJS, which is C) and writes the
//! prebuilt that `host/build.rs` embeds, `guest-sdk/js-runner/js-runner.component.wasm`, with
//! the manifest of its inputs beside it; `js-runner --check` rebuilds it and fails unless
//! the bytes equal the committed ones.
//!
//! The build is reproducible: the Rust toolchain is the one `rust-toolchain.toml` pins, the
//! C compiler is clang of a pinned major version ([`inputs::CLANG_MAJOR`]), the dependency
//! versions are `Cargo.lock`'s (`--locked`), no flag from the environment reaches the
//! build, the release settings are pinned here rather than taken from the workspace's
//! profile (which is tuned for the host), and the paths of this checkout, of the cargo home
//! and of the target directory are remapped (`--remap-path-prefix`, `-ffile-prefix-map`) so
//! they do not enter the bytes.

use anyhow::{bail, Context, Result};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

#[allow(dead_code)]
mod inputs {
    include!("../../guest-sdk/js-runner/inputs.rs");
}

/// The runner's target: no WASI, so the component imports only the factory contract.
const TARGET: &str = "wasm32-unknown-unknown";

/// The release-profile settings the runner is built with, whatever the workspace's
/// `[profile.release]` says (as `CARGO_PROFILE_RELEASE_<SETTING>`).
const RUNNER_PROFILE: &[(&str, &str)] = &[("OPT_LEVEL", "3"), ("DEBUG", "false"), ("LTO", "false")];

const USAGE: &str = "usage: cargo xtask js-runner [--check] [--target-dir DIR]

  js-runner           rebuild guest-sdk/js-runner/js-runner.component.wasm (and
                      js-runner.inputs) from source; needs clang 19 and the pinned Rust
                      toolchain with the wasm32-unknown-unknown target
  js-runner --check   rebuild it and fail unless the bytes equal the committed file
  --target-dir DIR    where the runner is compiled (default: target/js-runner)

  FACTORY_JS_RUNNER_CC=/path/to/clang-19 picks the clang (default: clang-19 on PATH, then
  /usr/lib/llvm-19/bin/clang)";

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Vec<String>) -> Result<()> {
    let mut args = args.into_iter();
    match args.next().as_deref() {
        Some("js-runner") => {
            let workspace = workspace_root()?;
            let mut check = false;
            let mut target_dir = workspace.join("target").join("js-runner");
            while let Some(arg) = args.next() {
                match arg.as_str() {
                    "--check" => check = true,
                    "--target-dir" => {
                        let dir = args.next().context("--target-dir needs a directory")?;
                        target_dir = std::path::absolute(dir).context("--target-dir")?;
                    }
                    other => bail!("unknown option `{other}`\n{USAGE}"),
                }
            }
            js_runner(&workspace, &target_dir, check)
        }
        Some("help" | "--help" | "-h") | None => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => bail!("unknown task `{other}`\n{USAGE}"),
    }
}

/// The workspace root: `cargo xtask` runs this with `CARGO_MANIFEST_DIR` = `<root>/xtask`.
fn workspace_root() -> Result<PathBuf> {
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    let root = manifest_dir.parent().context("xtask/ has no parent directory")?.to_path_buf();
    if !root.join(inputs::INPUTS_PATH).parent().is_some_and(Path::is_dir) {
        bail!("{} is not the factory repository (no guest-sdk/js-runner)", root.display());
    }
    Ok(root)
}

fn js_runner(workspace: &Path, target_dir: &Path, check: bool) -> Result<()> {
    // Canonical paths: the remapping flags name them, and cargo rebuilds everything when
    // its flags change (`host/../target` and `target` are one directory).
    std::fs::create_dir_all(target_dir).with_context(|| format!("creating {}", target_dir.display()))?;
    let target_dir =
        &std::fs::canonicalize(target_dir).with_context(|| format!("resolving {}", target_dir.display()))?;
    let workspace = &std::fs::canonicalize(workspace).with_context(|| format!("resolving {}", workspace.display()))?;
    let toolchain = pinned_toolchain(workspace)?;
    check_rust(workspace, &toolchain)?;
    let clang = find_clang()?;
    compile_scripts(workspace, check)?;
    let core = without_producers(&build_core(workspace, target_dir, &toolchain, &clang)?)?;
    let component = wit_component::ComponentEncoder::default()
        .module(&core)
        .and_then(|encoder| encoder.validate(true).encode())
        .context("componentizing the JS runner")?;
    let runner_path = workspace.join(inputs::RUNNER_PATH);
    let inputs_path = workspace.join(inputs::INPUTS_PATH);
    let manifest = inputs::inputs_manifest(workspace, &component).context("reading the runner's inputs")?;
    if check {
        let rebuilt = target_dir.join("js-runner.component.wasm");
        std::fs::write(&rebuilt, &component).with_context(|| format!("writing {}", rebuilt.display()))?;
        let committed = std::fs::read(&runner_path).with_context(|| format!("reading {}", runner_path.display()))?;
        if committed != component {
            bail!(
                "{} is not what its sources build: committed {} bytes (sha256 {}), rebuilt {} bytes (sha256 {}, left in {}); \
                 regenerate it with `{}` and commit it with {}",
                inputs::RUNNER_PATH,
                committed.len(),
                sha256(&committed),
                component.len(),
                sha256(&component),
                rebuilt.display(),
                inputs::REGENERATE,
                inputs::INPUTS_PATH,
            );
        }
        let recorded =
            std::fs::read_to_string(&inputs_path).with_context(|| format!("reading {}", inputs_path.display()))?;
        if recorded != manifest {
            bail!(
                "{} does not match the runner's inputs (the runner itself does): regenerate it with `{}`",
                inputs::INPUTS_PATH,
                inputs::REGENERATE
            );
        }
        println!(
            "{}: rebuilt from source, identical ({} bytes, sha256 {})",
            inputs::RUNNER_PATH,
            component.len(),
            sha256(&component)
        );
    } else {
        std::fs::write(&runner_path, &component).with_context(|| format!("writing {}", runner_path.display()))?;
        std::fs::write(&inputs_path, &manifest).with_context(|| format!("writing {}", inputs_path.display()))?;
        println!(
            "wrote {} ({} bytes, sha256 {}) and {}",
            inputs::RUNNER_PATH,
            component.len(),
            sha256(&component),
            inputs::INPUTS_PATH
        );
    }
    Ok(())
}

/// The scripts the runner evaluates at every run's start, compiled ahead of time: each
/// `guest-sdk/js-runner/src/NAME.js` to `NAME.js.qbc`, QuickJS bytecode the runner reads
/// instead of parsing the source (parsing them was a fifth of a short run's CPU). With
/// `check`, the committed bytecode must equal what the sources compile to.
fn compile_scripts(workspace: &Path, check: bool) -> Result<()> {
    for name in inputs::PRECOMPILED {
        let source_path = workspace.join("guest-sdk/js-runner/src").join(name);
        let source =
            std::fs::read_to_string(&source_path).with_context(|| format!("reading {}", source_path.display()))?;
        let bytecode = compile_script(&source).with_context(|| format!("compiling {}", source_path.display()))?;
        let out = source_path.with_file_name(format!("{name}.qbc"));
        if check {
            let committed = std::fs::read(&out).with_context(|| format!("reading {}", out.display()))?;
            if committed != bytecode {
                bail!("{} is not what {name} compiles to: regenerate it with `{}`", out.display(), inputs::REGENERATE);
            }
        } else {
            std::fs::write(&out, &bytecode).with_context(|| format!("writing {}", out.display()))?;
        }
    }
    Ok(())
}

/// `source` compiled as a global strict-mode script named `eval_script` (as rquickjs's
/// `eval` names it: stack traces read as they did from source), written as QuickJS bytecode
/// with its debug information and source text (`Function.prototype.toString`).
fn compile_script(source: &str) -> Result<Vec<u8>> {
    use rquickjs_sys as qjs;
    let text = std::ffi::CString::new(source).context("the source contains a NUL byte")?;
    let file = c"eval_script";
    // SAFETY: a runtime and context of our own, used on this thread only and freed below;
    // every value is freed once, the written buffer with the context's allocator.
    unsafe {
        let rt = qjs::JS_NewRuntime();
        if rt.is_null() {
            bail!("QuickJS could not create a runtime");
        }
        let ctx = qjs::JS_NewContext(rt);
        if ctx.is_null() {
            qjs::JS_FreeRuntime(rt);
            bail!("QuickJS could not create a context");
        }
        let flags = qjs::JS_EVAL_TYPE_GLOBAL | qjs::JS_EVAL_FLAG_STRICT | qjs::JS_EVAL_FLAG_COMPILE_ONLY;
        let function = qjs::JS_Eval(ctx, text.as_ptr(), source.len() as _, file.as_ptr(), flags as i32);
        let result = if qjs::JS_IsException(function) {
            let error = qjs::JS_GetException(ctx);
            let message = qjs::JS_ToCString(ctx, error);
            let text = if message.is_null() {
                "an exception".to_string()
            } else {
                let text = std::ffi::CStr::from_ptr(message).to_string_lossy().into_owned();
                qjs::JS_FreeCString(ctx, message);
                text
            };
            qjs::JS_FreeValue(ctx, error);
            Err(anyhow::anyhow!("{text}"))
        } else {
            let mut len = 0;
            let buf = qjs::JS_WriteObject(ctx, &mut len, function, qjs::JS_WRITE_OBJ_BYTECODE as i32);
            qjs::JS_FreeValue(ctx, function);
            if buf.is_null() {
                Err(anyhow::anyhow!("QuickJS could not write the bytecode"))
            } else {
                let bytes = std::slice::from_raw_parts(buf, len as usize).to_vec();
                qjs::js_free(ctx, buf.cast());
                Ok(bytes)
            }
        };
        qjs::JS_FreeContext(ctx);
        qjs::JS_FreeRuntime(rt);
        result
    }
}

/// The toolchain `rust-toolchain.toml` pins (its `channel`).
fn pinned_toolchain(workspace: &Path) -> Result<String> {
    let path = workspace.join("rust-toolchain.toml");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .filter_map(|line| line.trim().strip_prefix("channel"))
        .filter_map(|rest| rest.trim().strip_prefix('='))
        .map(|value| value.trim().trim_matches('"').to_string())
        .next()
        .with_context(|| format!("{} names no `channel`", path.display()))
}

/// The pinned toolchain runs, and it has the wasm32 target: each missing piece named.
fn check_rust(workspace: &Path, toolchain: &str) -> Result<()> {
    let rustc = |args: &[&str]| -> Result<String> {
        let out = Command::new("rustc")
            .args(args)
            .current_dir(workspace)
            .env("RUSTUP_TOOLCHAIN", toolchain)
            .env_remove("RUSTC")
            .output()
            .context("cannot run rustc (install Rust with rustup: https://rustup.rs)")?;
        if !out.status.success() {
            bail!(
                "`rustc {}` with the pinned toolchain {toolchain} failed: {} (install it: rustup toolchain install {toolchain})",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let version = rustc(&["--version"])?;
    // A version channel (`1.95.0`) must be what runs; a named one (`stable`) is not a pin.
    let is_version = toolchain.split('.').count() == 3 && toolchain.split('.').all(|p| p.parse::<u32>().is_ok());
    if is_version && !version.starts_with(&format!("rustc {toolchain} ")) {
        bail!(
            "rustc is `{version}`, not the pinned {toolchain} of rust-toolchain.toml (the runner's bytes depend on it): \
             rustup toolchain install {toolchain}"
        );
    }
    let sysroot = rustc(&["--print", "sysroot"])?;
    if !Path::new(&sysroot).join("lib/rustlib").join(TARGET).join("lib").is_dir() {
        bail!(
            "the Rust target {TARGET} is not installed for toolchain {toolchain} (the runner is built for it): \
             rustup target add --toolchain {toolchain} {TARGET}"
        );
    }
    Ok(())
}

/// The pinned clang and the `llvm-ar` beside it.
struct Clang {
    clang: PathBuf,
    ar: PathBuf,
}

const CLANG_HINT: &str =
    "Debian/Ubuntu: apt-get install -y clang-19 lld-19 (or run ./test, which installs what the tests need); \
                          elsewhere install LLVM 19 and set FACTORY_JS_RUNNER_CC=/path/to/clang-19";

/// `$FACTORY_JS_RUNNER_CC`, else `clang-19` on PATH, else `/usr/lib/llvm-19/bin/clang`
/// (Debian's layout) or Homebrew's `llvm@19`; it must be clang [`inputs::CLANG_MAJOR`] with
/// the wasm32 target.
fn find_clang() -> Result<Clang> {
    let major = inputs::CLANG_MAJOR;
    let clang = match std::env::var_os("FACTORY_JS_RUNNER_CC") {
        Some(cc) => {
            let cc = PathBuf::from(cc);
            which(&cc).with_context(|| format!("FACTORY_JS_RUNNER_CC={} is not an executable file", cc.display()))?
        }
        None => [
            PathBuf::from(format!("clang-{major}")),
            PathBuf::from(format!("/usr/lib/llvm-{major}/bin/clang")),
            PathBuf::from(format!("/opt/homebrew/opt/llvm@{major}/bin/clang")),
            PathBuf::from(format!("/usr/local/opt/llvm@{major}/bin/clang")),
        ]
        .iter()
        .find_map(|c| which(c))
        .with_context(|| {
            format!("no clang {major} found (the JS runner embeds QuickJS, which is C, compiled for wasm32 by clang {major}): {CLANG_HINT}")
        })?,
    };
    let version =
        Command::new(&clang).arg("--version").output().with_context(|| format!("cannot run {}", clang.display()))?;
    let version = String::from_utf8_lossy(&version.stdout).to_string();
    let found = version
        .split("clang version ")
        .nth(1)
        .and_then(|v| v.split('.').next())
        .and_then(|v| v.trim().parse::<u32>().ok());
    if found != Some(major) {
        bail!(
            "{} is not clang {major} (it says: {}); the runner's bytes are pinned to clang {major}: {CLANG_HINT}",
            clang.display(),
            version.lines().next().unwrap_or("nothing")
        );
    }
    let targets = Command::new(&clang)
        .arg("--print-targets")
        .output()
        .with_context(|| format!("cannot run {}", clang.display()))?;
    if !String::from_utf8_lossy(&targets.stdout).contains("wasm32") {
        bail!("{} was built without the WebAssembly (wasm32) target: {CLANG_HINT}", clang.display());
    }
    // Debian's /usr/bin/clang-19 links to /usr/lib/llvm-19/bin/clang, where llvm-ar lives.
    let real = std::fs::canonicalize(&clang).unwrap_or_else(|_| clang.clone());
    let ar =
        [clang.with_file_name("llvm-ar"), real.with_file_name("llvm-ar"), PathBuf::from(format!("llvm-ar-{major}"))]
            .iter()
            .find_map(|c| which(c))
            .with_context(|| {
                format!("no llvm-ar beside {} nor llvm-ar-{major} on PATH: {CLANG_HINT}", clang.display())
            })?;
    Ok(Clang { clang, ar })
}

/// `program` itself if it is a path, else the first match on PATH.
fn which(program: &Path) -> Option<PathBuf> {
    if program.components().count() > 1 {
        return program.is_file().then(|| program.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(program)).find(|p| p.is_file())
}

/// Environment variables that would change what the inner build produces: removed.
fn affects_build(name: &str) -> bool {
    const EXACT: &[&str] = &[
        "RUSTFLAGS",
        "RUSTC",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTC_BOOTSTRAP",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_INCREMENTAL",
        "CRATE_CC_NO_DEFAULTS",
    ];
    const PREFIXES: &[&str] = &["CARGO_PROFILE_", "CARGO_TARGET_", "CARGO_BUILD_", "TARGET_", "HOST_", "WASI_SDK"];
    const TOOL_VARS: &[&str] = &["CC", "CXX", "AR", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "ARFLAGS", "LDFLAGS"];
    EXACT.contains(&name)
        || PREFIXES.iter().any(|p| name.starts_with(p))
        || TOOL_VARS.iter().any(|v| name == *v || name.strip_prefix(v).is_some_and(|rest| rest.starts_with('_')))
}

/// Build the runner's core module for [`TARGET`] and return its bytes.
fn build_core(workspace: &Path, target_dir: &Path, toolchain: &str, clang: &Clang) -> Result<Vec<u8>> {
    let cargo_home = match std::env::var_os("CARGO_HOME") {
        Some(home) => PathBuf::from(home),
        None => PathBuf::from(std::env::var_os("HOME").context("neither CARGO_HOME nor HOME is set")?).join(".cargo"),
    };
    // Each path as given and as the kernel resolves it (cargo names registry sources under
    // CARGO_HOME as given), more specific (longer) ones last: for rustc and clang alike the
    // last matching mapping wins.
    let mut remaps: Vec<(PathBuf, &str)> = Vec::new();
    for (path, to) in [(workspace, "/factory"), (cargo_home.as_path(), "/cargo"), (target_dir, "/target")] {
        remaps.push((path.to_path_buf(), to));
        if let Ok(real) = std::fs::canonicalize(path) {
            if real != path {
                remaps.push((real, to));
            }
        }
    }
    remaps.sort_by_key(|(path, _)| path.as_os_str().len());
    let mut rustflags = OsString::new();
    let mut cflags = OsString::new();
    for (i, (from, to)) in remaps.iter().enumerate() {
        if i > 0 {
            rustflags.push("\x1f");
            cflags.push(" ");
        }
        if from.to_str().is_none_or(|s| s.contains(' ') || s.contains('\x1f')) {
            bail!("{} contains a space or is not UTF-8: the C flags that remap it cannot name it", from.display());
        }
        rustflags.push(format!("--remap-path-prefix={}={to}", from.display()));
        cflags.push(format!("-ffile-prefix-map={}={to}", from.display()));
    }

    let triple = TARGET.replace('-', "_");
    let mut cargo = Command::new("cargo");
    cargo
        .args(["build", "--release", "--locked", "--target", TARGET, "-p", "factory-js-runner", "--manifest-path"])
        .arg(workspace.join("Cargo.toml"))
        .current_dir(workspace);
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(affects_build) {
            cargo.env_remove(&name);
        }
    }
    if let Some(jobs) = std::env::var_os("CARGO_BUILD_JOBS") {
        cargo.env("CARGO_BUILD_JOBS", jobs);
    }
    // The workspace's `[profile.release]` is tuned for the host (cross-crate ThinLTO); the
    // runner's bytes are committed and checked, so its settings are pinned here and a change
    // made for the host does not reach them. These are the values the committed runner was
    // built with (cargo's release defaults, and `debug = false`).
    for (setting, value) in RUNNER_PROFILE {
        cargo.env(format!("CARGO_PROFILE_RELEASE_{setting}"), value);
    }
    cargo
        .env("RUSTUP_TOOLCHAIN", toolchain)
        .env("CARGO_TARGET_DIR", target_dir)
        .env("CARGO_ENCODED_RUSTFLAGS", &rustflags)
        .env(format!("CC_{triple}"), &clang.clang)
        .env(format!("AR_{triple}"), &clang.ar)
        .env(format!("CFLAGS_{triple}"), &cflags);
    eprintln!("building the JS runner with {} (rust {toolchain}) into {}", clang.clang.display(), target_dir.display());
    let status = cargo.status().context("cannot run cargo")?;
    if !status.success() {
        bail!("cargo build of guest-sdk/js-runner for {TARGET} failed ({status}); its output is above");
    }
    let core = target_dir.join(TARGET).join("release").join("factory_js_runner.wasm");
    std::fs::read(&core).with_context(|| format!("reading {}", core.display()))
}

/// The core module without its `producers` custom section: it names the exact clang build
/// (`Debian clang 19.1.7 (3~deb12u1)`), which would make the bytes differ between
/// distributions' builds of the same clang 19 for metadata alone. wit-component adds the
/// component's own `producers` section.
fn without_producers(core: &[u8]) -> Result<Vec<u8>> {
    let mut module = wasm_encoder::Module::new();
    for payload in wasmparser::Parser::new(0).parse_all(core) {
        let payload = payload.context("parsing the runner's core module")?;
        if let wasmparser::Payload::CustomSection(section) = &payload {
            if section.name() == "producers" {
                continue;
            }
        }
        if let Some((id, range)) = payload.as_section() {
            let (start, end) = (usize::try_from(range.start)?, usize::try_from(range.end)?);
            let data = core.get(start..end).context("a section outside the module")?;
            module.section(&wasm_encoder::RawSection { id, data });
        }
    }
    Ok(module.finish())
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}
