//! The authors' workflow through the real binary: `factory init --lang rust|python`
//! scaffolds into a temporary directory (outside this repository) that run at once with
//! `factory run DIR` on the dry-run backend (the Rust crate depends on this checkout's SDK by
//! path, the Python project is built by componentize-py), and `init` refuses to overwrite.
//! `factory test`: right after `init` it passes for every language (its JUnit report parsed
//! by python3's xml.etree); a changed prompt fails naming the label, with the prompt diff
//! and the replay-safety report of the changed memo keys; `--update` against an
//! OpenAI-compatible server on 127.0.0.1 records only the changed calls, after which the
//! test replays with no backend call; failed assertions exit 1, unusable files 2.
//! A hostile project cannot make `factory test --update` write outside it: a cassette or
//! factory named through `..`, an absolute path, a symlinked directory or a symlink planted
//! at the cassette's path is refused naming the path, and nothing appears outside; an
//! oversized cassette (file or line) is refused, and an entry whose request does not hash to
//! its key is never replayed.
//! Each scaffold's test in the language's own runner (`cargo test`, `python3 -m unittest`,
//! `npm test` = `node --test`) runs `factory test` and passes, and fails naming the label
//! once a prompt is edited.
//!
//! Needs `componentize-py` on PATH for the Python scaffold (`./test` installs it into
//! `.venv`), bubblewrap for both builds, and `node`/`npm` for the TS/JS runners.

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
    let out = factory_in(
        state.path(),
        &["run", path, "--yes", "--args", r#"{"topic":"release notes","ideas":2}"#, "--json", "-q"],
    );
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
    let phases: Vec<&str> =
        meta["phases"].as_array().expect("phases").iter().filter_map(|p| p["title"].as_str()).collect();
    assert_eq!(phases, ["Brainstorm", "Critique", "Report"], "{described:#}");
    assert_eq!(meta["limits"]["maxTotalSubagents"], 40, "{described:#}");
    let out = factory_in(state.path(), &["run", path, "--yes", "--args", r#"{"ideas":"many"}"#, "--json", "-q"]);
    assert_eq!(out.status.code(), Some(2), "wrong args never start a run: {}", text(&out));
    assert!(stderr(&out).contains("ideas"), "{}", text(&out));

    // `init` recorded the test's cassette: `factory test` passes at once, with no backend.
    assert!(dir.join(format!("{name}.test.json")).is_file(), "the test file");
    assert!(dir.join(format!("{name}.cassette.jsonl")).is_file(), "the cassette: {}", text(&out));
    let out = factory_in(state.path(), &["test", path]);
    assert_eq!(out.status.code(), Some(0), "factory test right after init: {}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok   two ideas on release notes"), "{}", text(&out));

    // A second init into the same directory is refused, and writes nothing.
    let before = std::fs::read_to_string(dir.join("README.md")).expect("README.md");
    let out = init(state.path(), &dir, lang);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(stderr(&out).contains("already exists and is not empty"), "{}", text(&out));
    assert_eq!(std::fs::read_to_string(dir.join("README.md")).expect("README.md"), before);
    own_runner_passes_then_fails_on_an_edit(lang, &dir, state.path());
    (state, work)
}

/// The scaffold's test in the language's own runner, in `dir`: `cargo test --offline`,
/// `python3 -m unittest` or `npm test` (`node --test`), with this `factory` first on PATH.
fn own_runner(lang: &str, dir: &Path, state: &Path) -> Output {
    let (program, args): (&str, &[&str]) = match lang {
        "rust" => ("cargo", &["test", "--offline"]),
        "python" => ("python3", &["-m", "unittest"]),
        _ => ("npm", &["test"]),
    };
    // factory_cmd's environment (state, no daemon, caches, the test home, the real cargo
    // and rustup homes), for another program.
    let template = common::factory_cmd(state, &[]);
    let mut cmd = std::process::Command::new(program);
    for (var, value) in template.get_envs() {
        match value {
            Some(value) => cmd.env(var, value),
            None => cmd.env_remove(var),
        };
    }
    let bin_dir = common::factory_bin().parent().unwrap().to_path_buf();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    cmd.args(args)
        .current_dir(dir)
        .env("PATH", path)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{program} runs ({e}; apt-get install cargo/python3/npm as needed)"))
}

/// The own runner passes right after `init` (its output shows the one test passing); after
/// an edit of the critique prompt it fails, and shows `factory test`'s miss with the label.
fn own_runner_passes_then_fails_on_an_edit(lang: &str, dir: &Path, state: &Path) {
    let out = own_runner(lang, dir, state);
    assert!(out.status.success(), "the {lang} scaffold's own test runner: {}", text(&out));
    let shown = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    let passed = match lang {
        "rust" => "test factory_test_passes ... ok",
        "python" => "Ran 1 test",
        _ => "# pass 1",
    };
    assert!(shown.contains(passed), "`{passed}` in: {shown}");

    let source = match lang {
        "rust" => dir.join("src/lib.rs"),
        "python" => dir.join("app.py"),
        _ => dir.join(format!("{}.{lang}", dir.file_name().unwrap().to_str().unwrap())),
    };
    let original = std::fs::read_to_string(&source).expect("the factory's source");
    let edited = original.replace("Critique this idea about", "Critique, harshly, this idea about");
    assert_ne!(edited, original, "{} holds the critique prompt", source.display());
    std::fs::write(&source, &edited).unwrap();
    let out = own_runner(lang, dir, state);
    assert!(!out.status.success(), "an edited prompt fails the {lang} runner: {}", text(&out));
    let shown = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(shown.contains("cassette miss: agent `critique:0`"), "the runner shows factory test's miss: {shown}");
    std::fs::write(&source, original).unwrap();
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
    let out = factory_in(
        state.path(),
        &["init", dir.to_str().unwrap(), "--lang", "rust", "--sdk", missing.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(stderr(&out).contains("the Rust SDK (factory-sdk) is not at"), "{}", text(&out));
    assert!(!dir.exists(), "nothing created without an SDK");
}

/// `factory test ARGS...` against `state`.
fn factory_test(state: &Path, args: &[&str]) -> Output {
    let mut argv = vec!["test"];
    argv.extend_from_slice(args);
    factory_in(state, &argv)
}

/// The JUnit report at `path`, parsed by python3's xml.etree: (tests, failures, errors, the
/// failure messages).
fn junit(path: &Path) -> (u64, u64, u64, Vec<String>) {
    let program = r#"
import json, sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
assert root.tag == "testsuites", root.tag
cases = root.findall("./testsuite/testcase")
print(json.dumps([int(root.get("tests")), int(root.get("failures")), int(root.get("errors")),
                  [f.get("message") + "\n" + (f.text or "") for f in root.iter("failure")], len(cases)]))
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", program])
        .arg(path)
        .output()
        .expect("python3 runs (apt-get install python3)");
    assert!(out.status.success(), "the JUnit report does not parse: {}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let failures = v[3].as_array().unwrap().iter().map(|f| f.as_str().unwrap().to_string()).collect();
    assert_eq!(v[0], v[4], "tests= counts the testcase elements");
    (v[0].as_u64().unwrap(), v[1].as_u64().unwrap(), v[2].as_u64().unwrap(), failures)
}

/// `factory init` then `factory test` passes, with a JUnit report of one passing case.
fn init_then_test_passes(lang: &str) {
    let state = tempfile::tempdir().expect("a state dir");
    let work = tempfile::tempdir().expect("a work dir");
    let name = format!("checked-{lang}");
    let dir = work.path().join(&name);
    let out = init(state.path(), &dir, lang);
    assert!(out.status.success(), "init --lang {lang}: {}", text(&out));
    assert!(
        dir.join(format!("{name}.test.json")).is_file() && dir.join(format!("{name}.cassette.jsonl")).is_file(),
        "{}",
        text(&out)
    );
    let report = work.path().join("junit.xml");
    let out = factory_test(state.path(), &[dir.to_str().unwrap(), "--junit", report.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "factory test right after init ({lang}): {}", text(&out));
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("ok   two ideas on release notes"), "{shown}");
    assert!(shown.contains("replay safety: every call matches the cassette"), "{shown}");
    assert_eq!(junit(&report), (1, 0, 0, vec![]), "{shown}");

    // The language's own runner: `npm test` is `node --test`, which runs NAME.test.mjs.
    let package: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("package.json")).unwrap()).unwrap();
    assert_eq!(package["scripts"]["test"], "node --test");
    assert!(dir.join(format!("{name}.test.mjs")).is_file());
    own_runner_passes_then_fails_on_an_edit(lang, &dir, state.path());
}

#[test]
fn init_ts_then_test_passes() {
    init_then_test_passes("ts");
}

#[test]
fn init_js_then_test_passes() {
    init_then_test_passes("js");
}

/// The recorded calls of a cassette: (label, key).
fn cassette_calls(path: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(path)
        .expect("the cassette")
        .lines()
        .skip(1)
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a cassette line"))
        .map(|e| {
            (e["request"]["label"].as_str().unwrap_or_default().to_string(), e["key"].as_str().unwrap().to_string())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_prompt_fails_naming_its_label_and_update_records_it() {
    use common::fake_openai::{write_config, FakeOpenAi, Mode};
    let state = tempfile::tempdir().expect("a state dir");
    let work = tempfile::tempdir().expect("a work dir");
    let dir = work.path().join("edited");
    let out = init(state.path(), &dir, "ts");
    assert!(out.status.success(), "{}", text(&out));
    let cassette = dir.join("edited.cassette.jsonl");
    let before = cassette_calls(&cassette);
    assert_eq!(before.iter().filter(|(l, _)| l.starts_with("critique:")).count(), 2, "{before:?}");

    // Edit the critique prompt: the critique calls' memo keys change.
    let source = dir.join("edited.ts");
    let original = std::fs::read_to_string(&source).unwrap();
    let edited = original.replace("Critique this idea about", "Critique, harshly, this idea about");
    assert_ne!(edited, original);
    std::fs::write(&source, edited).unwrap();

    let report = work.path().join("junit.xml");
    let out = factory_test(state.path(), &[dir.to_str().unwrap(), "--junit", report.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "a miss fails the test: {}", text(&out));
    let shown = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(shown.contains("FAIL two ideas on release notes"), "{shown}");
    assert!(shown.contains("cassette miss: agent `critique:0`"), "the miss names the label: {shown}");
    assert!(
        shown.contains("recorded: ") && shown.contains("Critique this idea") && shown.contains("Critique, harshly,"),
        "the hint shows both prompts: {shown}"
    );
    assert!(shown.contains("factory test --update"), "{shown}");
    // Replay safety: the old critique keys are no longer made, new ones are.
    for (label, key) in &before {
        let line = format!("- {label} key {}", &key[..12]);
        assert_eq!(shown.contains(&line), label.starts_with("critique:"), "`{line}` in the report: {shown}");
    }
    let new_lines = shown.lines().filter(|l| l.trim_start().starts_with("+ critique:")).count();
    assert_eq!(new_lines, 2, "two new calls: {shown}");
    let (tests, failures, errors, messages) = junit(&report);
    assert_eq!((tests, failures, errors), (1, 1, 0));
    assert!(messages[0].contains("critique:"), "{messages:?}");

    // --update against an OpenAI-compatible server on 127.0.0.1 records the new calls. Its
    // replies are text, not the critique's JSON, so the author expects less of them.
    let server = FakeOpenAi::start(Mode::Answer { latency: std::time::Duration::from_millis(1) }).await;
    write_config(state.path(), server.port(), true, "");
    let test_file = dir.join("edited.test.json");
    let mut expected: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&test_file).unwrap()).unwrap();
    let case = &mut expected["cases"][0];
    case["result"] =
        serde_json::json!([{ "pointer": "/topic", "equals": "release notes" }, { "pointer": "/dropped", "equals": 2 }]);
    case["accounting"] = serde_json::json!({ "maxAgentsSpawned": 6, "maxAiCredits": 1 });
    std::fs::write(&test_file, serde_json::to_string_pretty(&expected).unwrap()).unwrap();
    let state_path = state.path().to_path_buf();
    let dir_arg = dir.to_str().unwrap().to_string();
    let out =
        tokio::task::spawn_blocking(move || factory_test(&state_path, &[&dir_arg, "--update", "--backend", "local"]))
            .await
            .unwrap();
    assert_eq!(out.status.code(), Some(0), "--update: {}", text(&out));
    let asked = server.asked();
    assert!(
        !asked.is_empty() && asked.iter().all(|p| p.contains("Critique, harshly,")),
        "only the changed calls went live: {asked:?}"
    );
    let after = cassette_calls(&cassette);
    assert!(
        after.iter().all(|(l, k)| !l.starts_with("critique:") || !before.iter().any(|(_, old)| old == k)),
        "the old critique calls are gone: {after:?}"
    );
    assert_eq!(
        after.iter().filter(|(l, _)| l.starts_with("idea:")).collect::<Vec<_>>(),
        before.iter().filter(|(l, _)| l.starts_with("idea:")).collect::<Vec<_>>(),
        "the unchanged calls are kept"
    );
    // Now it replays with no backend call.
    let requests = server.requests();
    let state_path = state.path().to_path_buf();
    let dir_arg = dir.to_str().unwrap().to_string();
    let out = tokio::task::spawn_blocking(move || factory_test(&state_path, &[&dir_arg])).await.unwrap();
    assert_eq!(out.status.code(), Some(0), "after --update: {}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("every call matches the cassette"), "{}", text(&out));
    assert_eq!(server.requests(), requests, "a replay calls no backend");
}

#[test]
fn failed_assertions_and_unusable_files_have_their_exit_codes() {
    let state = tempfile::tempdir().expect("a state dir");
    let work = tempfile::tempdir().expect("a work dir");
    let dir = work.path().join("strict");
    assert!(init(state.path(), &dir, "js").status.success());
    let test_file = dir.join("strict.test.json");
    let mut expected: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&test_file).unwrap()).unwrap();
    let case = &mut expected["cases"][0];
    case["result"] = serde_json::json!([
        { "pointer": "/topic", "contains": "notes" },
        { "pointer": "/topic", "equals": "something else" },
        { "pointer": "/ideas/0", "schema": { "type": "object", "required": ["verdict"] } },
        { "pointer": "/missing", "equals": 1 }
    ]);
    case["accounting"] = serde_json::json!({ "agentsSpawned": 3 });
    case["journal"] = serde_json::json!({ "steps": ["report-v1", "report-v2"] });
    std::fs::write(&test_file, serde_json::to_string(&expected).unwrap()).unwrap();
    let out = factory_test(state.path(), &[test_file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let shown = String::from_utf8_lossy(&out.stdout);
    for expected in [
        "result at `/topic`: expected \"something else\", got \"release notes\"",
        "result at `/ideas/0`: does not match the schema",
        "result at `/missing`: nothing there",
        "accounting: expected 3 agents spawned, got 4",
        "journal: no step `report-v2`",
    ] {
        assert!(shown.contains(expected), "`{expected}` in: {shown}");
    }
    assert!(!shown.contains("`/topic`: \"release notes\" does not contain"), "contains held: {shown}");
    assert!(!shown.contains("no step `report-v1`"), "{shown}");

    std::fs::write(&test_file, r#"{"cases":[{"name":"x","status":"finished"}]}"#).unwrap();
    let out = factory_test(state.path(), &[test_file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "an unusable test file: {}", text(&out));
    assert!(stderr(&out).contains("unknown status `finished`"), "{}", text(&out));
    let out = factory_test(state.path(), &[work.path().join("nothing-here").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

/// Every file and directory under `dir` (symlinks not followed) with its contents.
fn snapshot(dir: &Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("a readable directory") {
            let path = entry.expect("an entry").path();
            let meta = std::fs::symlink_metadata(&path).expect("metadata");
            if meta.is_dir() {
                stack.push(path.clone());
                out.push((path, Vec::new()));
            } else if meta.is_symlink() {
                out.push((path.clone(), std::fs::read_link(&path).unwrap().into_os_string().into_encoded_bytes()));
            } else {
                out.push((path.clone(), std::fs::read(&path).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// A project directory holding the `probe` test guest as `probe.wasm` and `case.test.json`
/// naming `factory` and `cassette` (its `soft` case: two agent calls with soft limits).
fn probe_project(dir: &Path, factory: &str, cassette: &str) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    if !dir.join("probe.wasm").exists() {
        std::fs::copy(common::component("probe"), dir.join("probe.wasm")).unwrap();
    }
    let test = serde_json::json!({
        "factory": factory,
        "cassette": cassette,
        "cases": [{ "name": "soft limits", "args": { "case": "soft" }, "status": "completed" }]
    });
    let file = dir.join("case.test.json");
    std::fs::write(&file, test.to_string()).unwrap();
    file
}

#[test]
fn a_hostile_test_file_cannot_write_outside_its_project() {
    use std::os::unix::fs::symlink;
    let state = tempfile::tempdir().expect("a state dir");
    let work = tempfile::tempdir().expect("a work dir");
    let project = work.path().join("project");
    let outside = work.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join(".bash_aliases"), "alias ls='ls --color'\n").unwrap();
    std::fs::create_dir_all(&project).unwrap();
    symlink(&outside, project.join("linked")).unwrap();
    symlink(outside.join(".bash_aliases"), project.join("planted.cassette.jsonl")).unwrap();
    symlink(outside.join("not-yet"), project.join("dangling.cassette.jsonl")).unwrap();
    std::fs::copy(common::component("probe"), outside.join("probe.wasm")).unwrap();
    let before = snapshot(&outside);
    let absolute = outside.join("absolute.jsonl").display().to_string();
    let attacks: [(&str, &str, &str); 8] = [
        ("probe.wasm", "../outside/.bash_aliases", "outside the project directory"),
        ("probe.wasm", "../outside/new/dirs/evil.jsonl", "outside the project directory"),
        ("probe.wasm", "missing/../../outside/evil.jsonl", "goes up (`..`) through a missing directory"),
        ("probe.wasm", &absolute, "outside the project directory"),
        ("probe.wasm", "linked/evil.jsonl", "outside the project directory"),
        ("probe.wasm", "planted.cassette.jsonl", "outside the project directory"),
        ("probe.wasm", "dangling.cassette.jsonl", "a symlink to a missing file"),
        ("../outside/probe.wasm", "ok.cassette.jsonl", "outside the project directory"),
    ];
    for (factory, cassette, refusal) in attacks {
        let file = probe_project(&project, factory, cassette);
        let out = factory_test(state.path(), &[file.to_str().unwrap(), "--update", "--backend", "dry-run", "--yes"]);
        let field = if factory == "probe.wasm" { "cassette" } else { "factory" };
        assert_eq!(out.status.code(), Some(2), "`{field}` {cassette}: refused as unusable: {}", text(&out));
        let shown = stderr(&out);
        assert!(shown.contains(refusal) && shown.contains(&format!("`{field}` names `")), "{cassette}: {}", text(&out));
        assert_eq!(snapshot(&outside), before, "{cassette}: nothing created or changed outside the project");
        let scratch =
            snapshot(&project).into_iter().filter(|(p, _)| p.to_string_lossy().contains(".factory-test-")).count();
        assert_eq!(scratch, 0, "no scratch left behind");
    }
    assert_eq!(
        std::fs::read_link(project.join("planted.cassette.jsonl")).unwrap(),
        outside.join(".bash_aliases"),
        "the planted link is left"
    );

    // The same project with a cassette of its own in missing directories inside it: recorded
    // (the directories created inside), then replayed with no backend.
    let file = probe_project(&project, "probe.wasm", "cassettes/new/case.cassette.jsonl");
    let out = factory_test(state.path(), &[file.to_str().unwrap(), "--update", "--backend", "dry-run", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(project.join("cassettes/new/case.cassette.jsonl").is_file());
    let out = factory_test(state.path(), &[file.to_str().unwrap(), "--yes"]);
    assert_eq!(out.status.code(), Some(0), "replayed (each entry's request hashes to its key): {}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("every call matches the cassette"), "{}", text(&out));
    assert_eq!(snapshot(&outside), before, "nothing created or changed outside the project");
}

#[test]
fn a_tampered_or_oversized_cassette_is_refused() {
    let state = tempfile::tempdir().expect("a state dir");
    let work = tempfile::tempdir().expect("a work dir");
    let project = work.path().join("project");
    let file = probe_project(&project, "probe.wasm", "case.cassette.jsonl");
    let cassette = project.join("case.cassette.jsonl");
    let out = factory_test(state.path(), &[file.to_str().unwrap(), "--update", "--backend", "dry-run", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let recorded = std::fs::read_to_string(&cassette).unwrap();
    let run = |args: &[&str]| {
        let mut argv = vec![file.to_str().unwrap(), "--yes"];
        argv.extend_from_slice(args);
        factory_test(state.path(), &argv)
    };

    // Tampered: the first entry's recorded request no longer hashes to its key (its reply
    // would answer a call the file does not show). It is not replayed: the call misses.
    let mut lines: Vec<serde_json::Value> = recorded.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(lines.len() >= 3, "a header and two exchanges: {recorded}");
    assert!(lines[1]["request"]["limits"]["maxTurns"].is_u64(), "the soft limits are recorded: {recorded}");
    lines[1]["request"]["prompt"] = serde_json::json!("a prompt the reviewer is shown");
    let tampered: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&cassette, &tampered).unwrap();
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("line 2 (key") && shown.contains("is not replayed: its recorded request hashes to key"),
        "{}",
        text(&out)
    );
    assert!(shown.contains("cassette miss: agent `rust`"), "the call it claimed misses: {}", text(&out));

    // Oversized: a file past 128 MiB (sparse), a line past 32 MiB.
    let huge = std::fs::File::create(&cassette).unwrap();
    huge.set_len((128 << 20) + 1).unwrap();
    drop(huge);
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        stderr(&out).contains("is 134217729 bytes, over the limit of 134217728: refusing to read it"),
        "{}",
        text(&out)
    );
    let long = format!("{}\n{{\"pad\":\"{}\"}}\n", lines[0], "x".repeat(32 << 20));
    std::fs::write(&cassette, long).unwrap();
    let out = run(&["--update", "--backend", "dry-run"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let refusal = format!("line 2 is {} bytes, over the limit of 33554432 a line", (32 << 20) + 10);
    assert!(stderr(&out).contains(&refusal), "{}", text(&out));

    // The project is still usable: the recorded cassette replays.
    std::fs::write(&cassette, &recorded).unwrap();
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}
