//! The authors' workflow through the real binary: `factory init --lang rust|python`
//! scaffolds into a temporary directory (outside this repository) that run at once with
//! `factory run DIR` on the dry-run backend (the Rust crate depends on this checkout's SDK by
//! path, the Python project is built by componentize-py), and `init` refuses to overwrite.
//!
//! Needs `componentize-py` on PATH for the Python scaffold (`./test` installs it into
//! `.venv`) and bubblewrap for both builds.

mod common;

use common::{factory_in, stderr, stdout_json};
use std::path::Path;
use std::process::Output;

fn text(out: &Output) -> String {
    format!("{}\nstdout: {}\nstderr: {}", out.status, String::from_utf8_lossy(&out.stdout), stderr(out))
}

/// `factory init DIR --lang LANG`.
fn init(state: &Path, dir: &Path, lang: &str) -> Output {
    factory_in(state, &["init", dir.to_str().expect("a UTF-8 path"), "--lang", lang])
}

/// Scaffold `name` in `lang` into a new temporary directory, check its files, run it on the
/// dry-run backend with `{"topic":"release notes","ideas":2}` and check the envelope.
fn scaffold_runs(lang: &str, name: &str, files: &[&str]) -> (tempfile::TempDir, tempfile::TempDir) {
    let state = tempfile::tempdir().expect("a state dir");
    let work = tempfile::tempdir().expect("a work dir");
    let dir = work.path().join(name);
    let out = init(state.path(), &dir, lang);
    assert!(out.status.success(), "init --lang {lang}: {}", text(&out));
    for file in files {
        assert!(dir.join(file).is_file(), "init --lang {lang} wrote {file}");
    }
    let readme = std::fs::read_to_string(dir.join("README.md")).expect("README.md");
    assert!(readme.contains(&format!("factory run ./{name}")), "the README says how to run it: {readme}");
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("factory run {}", dir.display())), "{}", text(&out));

    let path = dir.to_str().expect("a UTF-8 path");
    let out = factory_in(state.path(), &["run", path, "--yes", "--args", r#"{"topic":"release notes","ideas":2}"#, "--json", "-q"]);
    let envelope = stdout_json(&out);
    assert_eq!(envelope["status"], "completed", "{envelope:#}\n{}", stderr(&out));
    assert_eq!(envelope["factory"], name, "the meta name is the directory's");
    let result = &envelope["result"];
    assert_eq!(result["topic"], "release notes", "{result:#}");
    let ideas = result["ideas"].as_array().expect("ideas");
    assert_eq!(ideas.len(), 2, "two ideas, both critiqued on the dry-run backend: {result:#}");
    assert_eq!(result["dropped"], 0, "{result:#}");
    for idea in ideas {
        assert!(idea["title"].is_string() && idea["score"].is_i64(), "a ranked idea: {idea}");
    }
    // Two ideas, each critiqued: four subagents.
    assert_eq!(envelope["accounting"]["agentsSpawned"], 4, "{envelope:#}");

    // The declared meta: phases, limits and an args schema the host enforces.
    let out = factory_in(state.path(), &["describe", &component_of(state.path(), path), "--json"]);
    let described = stdout_json(&out);
    let meta = &described["meta"];
    let phases: Vec<&str> = meta["phases"].as_array().expect("phases").iter().filter_map(|p| p["title"].as_str()).collect();
    assert_eq!(phases, ["Brainstorm", "Critique", "Report"], "{described:#}");
    assert_eq!(meta["limits"]["maxTotalSubagents"], 40, "{described:#}");
    let out = factory_in(state.path(), &["run", path, "--yes", "--args", r#"{"ideas":"many"}"#, "--json", "-q"]);
    assert_eq!(out.status.code(), Some(2), "wrong args never start a run: {}", text(&out));
    assert!(stderr(&out).contains("ideas"), "{}", text(&out));

    // A second init into the same directory is refused, and writes nothing.
    let before = std::fs::read_to_string(dir.join("README.md")).expect("README.md");
    let out = init(state.path(), &dir, lang);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(stderr(&out).contains("already exists and is not empty"), "{}", text(&out));
    assert_eq!(std::fs::read_to_string(dir.join("README.md")).expect("README.md"), before);
    (state, work)
}

/// The component `factory build DIR` makes of a scaffold (the run built it already: a cache hit).
fn component_of(state: &Path, dir: &str) -> String {
    let out = factory_in(state, &["build", dir, "--yes"]);
    assert!(out.status.success(), "factory build {dir}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn init_rust_runs_at_once() {
    let (_state, work) = scaffold_runs("rust", "ideas-rs", &["Cargo.toml", "src/lib.rs", "README.md", ".gitignore"]);
    let manifest = std::fs::read_to_string(work.path().join("ideas-rs/Cargo.toml")).expect("Cargo.toml");
    let sdk = std::fs::canonicalize(common::root().join("guest-sdk/rust")).expect("the SDK");
    let parsed: toml::Table = manifest.parse().expect("Cargo.toml is TOML");
    let dependency = &parsed["dependencies"]["factory-sdk"]["path"];
    assert_eq!(dependency.as_str(), sdk.to_str(), "the SDK this binary was built from, by absolute path");
    assert!(parsed.contains_key("workspace"), "a workspace of its own");
}

#[test]
fn init_python_runs_at_once() {
    scaffold_runs("python", "ideas-py", &["app.py", "README.md"]);
}

#[test]
fn init_rust_refuses_names_cargo_refuses_and_a_missing_sdk() {
    let state = tempfile::tempdir().expect("a state dir");
    let work = tempfile::tempdir().expect("a work dir");
    for name in ["1ideas", "my.ideas"] {
        let dir = work.path().join(name);
        let out = init(state.path(), &dir, "rust");
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(stderr(&out).contains("Cargo package name"), "{}", text(&out));
        assert!(!dir.exists(), "nothing created for {name}");
    }
    let dir = work.path().join("ideas");
    let missing = work.path().join("no-sdk");
    let out = factory_in(state.path(), &["init", dir.to_str().unwrap(), "--lang", "rust", "--sdk", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(stderr(&out).contains("the Rust SDK (factory-sdk) is not at"), "{}", text(&out));
    assert!(!dir.exists(), "nothing created without an SDK");
}
