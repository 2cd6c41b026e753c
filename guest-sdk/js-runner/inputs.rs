// The inputs of the prebuilt JS runner and the manifest that records them, shared by
// `host/build.rs` (which refuses a runner whose inputs changed since it was built) and
// `xtask` (which rebuilds it and writes the manifest): both `include!` this file, so the two
// agree on what the runner is made of. Needs `sha2` in the including crate.

/// The prebuilt runner component, relative to the workspace root.
pub const RUNNER_PATH: &str = "guest-sdk/js-runner/js-runner.component.wasm";

/// The manifest of its inputs (sha256sum format, so `sha256sum -c` reads it too).
pub const INPUTS_PATH: &str = "guest-sdk/js-runner/js-runner.inputs";

/// The one command that rebuilds both.
pub const REGENERATE: &str = "cargo xtask js-runner";

/// The clang major version the runner's C (QuickJS) is compiled with: part of the pin, so
/// changing it means regenerating.
pub const CLANG_MAJOR: u32 = 19;

/// The scripts of `guest-sdk/js-runner/src` the runner evaluates at every run's start: the
/// xtask compiles each `NAME` to QuickJS bytecode beside it (`NAME.qbc`, an input too), which
/// the runner embeds instead of the source.
pub const PRECOMPILED: &[&str] = &["globals.js", "prelude.js"];

/// What the runner is built from: its crate's manifest and sources, the contract it
/// implements, and the pinned Rust toolchain. (`Cargo.lock` and the workspace's profile
/// also reach it; the full rebuild check, `cargo xtask js-runner --check`, covers those.)
pub const INPUT_ROOTS: &[&str] =
    &["guest-sdk/js-runner/Cargo.toml", "guest-sdk/js-runner/src", "wit", "rust-toolchain.toml"];

/// Every input file, as sorted workspace-relative paths with `/` separators.
pub fn input_files(workspace: &std::path::Path) -> std::io::Result<Vec<String>> {
    fn walk(workspace: &std::path::Path, rel: &str, out: &mut Vec<String>) -> std::io::Result<()> {
        let path = workspace.join(rel);
        if std::fs::metadata(&path)?.is_dir() {
            for entry in std::fs::read_dir(&path)? {
                let name = entry?.file_name();
                let name = name.to_str().ok_or_else(|| {
                    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("a file name under {rel} is not UTF-8"))
                })?;
                walk(workspace, &format!("{rel}/{name}"), out)?;
            }
        } else {
            out.push(rel.to_string());
        }
        Ok(())
    }
    let mut files = Vec::new();
    for root in INPUT_ROOTS {
        walk(workspace, root, &mut files)?;
    }
    files.sort();
    Ok(files)
}

/// The manifest text for the inputs as they are now and the given runner bytes.
pub fn inputs_manifest(workspace: &std::path::Path, runner: &[u8]) -> std::io::Result<String> {
    use sha2::Digest;
    let hex = |bytes: &[u8]| sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect::<String>();
    let mut text = format!(
        "# What {RUNNER_PATH} was built from (clang {CLANG_MAJOR}), written by `{REGENERATE}`;\n\
         # host/build.rs refuses to build when these files no longer match. Do not edit.\n"
    );
    text.push_str(&format!("{}  {RUNNER_PATH}\n", hex(runner)));
    for file in input_files(workspace)? {
        let bytes = std::fs::read(workspace.join(&file))?;
        text.push_str(&format!("{}  {file}\n", hex(&bytes)));
    }
    Ok(text)
}
