//! The real-model demo of the quick start (docs/src/guide/install.md): `examples/smollm2/triage.cassette.jsonl` holds
//! SmolLM2-135M-Instruct's replies to `examples/js/triage.ts` (recorded once by
//! `examples/smollm2/record.sh`, never in CI). Its replay runs with no network at all (the
//! real binary inside a bubblewrap network namespace of its own: a loopback with nothing
//! listening, no other interface) and prints exactly
//! the committed `examples/smollm2/triage.out.json`, which the quick start shows verbatim.

mod common;

use std::process::Command;

/// The args record.sh recorded with (the test checks it still does).
const ARGS: &str =
    r#"{"issues":["The app crashes on start when the config file is missing","Typo in the README: recieve"]}"#;

fn read(path: &str) -> String {
    std::fs::read_to_string(common::root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn the_smollm2_cassette_replays_offline_to_the_committed_output() {
    let found = Command::new("bwrap").arg("--version").output().is_ok_and(|o| o.status.success());
    assert!(
        found,
        "bubblewrap (`bwrap`) runs the replay without a network: apt-get install bubblewrap (./test installs it)"
    );
    assert!(
        read("examples/smollm2/record.sh").contains(&format!("args='{ARGS}'")),
        "record.sh records with these args"
    );

    // The cassette is a real model's: no dry-run placeholder, every call answered.
    let cassette = read("examples/smollm2/triage.cassette.jsonl");
    let mut lines = cassette.lines();
    let header: serde_json::Value = serde_json::from_str(lines.next().expect("a header")).expect("JSON");
    assert_eq!(header["cassette"], "factory");
    let exchanges: Vec<serde_json::Value> = lines.map(|l| serde_json::from_str(l).expect("an exchange")).collect();
    assert!(exchanges.len() >= 2, "{cassette}");
    for exchange in &exchanges {
        let reply = exchange["reply"]["text"].as_str().unwrap_or_else(|| panic!("every call answered: {exchange}"));
        assert!(!reply.contains("[dry-run"), "a real model's reply: {reply}");
        assert!(
            exchange["reply"]["usage"]["outputTokens"].as_u64().is_some_and(|n| n > 0),
            "the server counted tokens: {exchange}"
        );
    }

    // The replay, in a network namespace of its own (its loopback only, nothing listening).
    let state = tempfile::tempdir().expect("a state dir");
    let template = common::factory_cmd(state.path(), &[]);
    let mut cmd = Command::new("bwrap");
    for (var, value) in template.get_envs() {
        match value {
            Some(value) => cmd.env(var, value),
            None => cmd.env_remove(var),
        };
    }
    let out = cmd
        .args(["--dev-bind", "/", "/", "--unshare-net", "--die-with-parent", "--"])
        .arg(common::factory_bin())
        .args([
            "run",
            "examples/js/triage.ts",
            "--replay",
            "examples/smollm2/triage.cassette.jsonl",
            "--args",
            ARGS,
            "-q",
        ])
        .current_dir(common::root())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("bwrap starts");
    let shown = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "the replay: {}\nstdout: {shown}\nstderr: {}", out.status, common::stderr(&out));
    let expected = read("examples/smollm2/triage.out.json");
    assert_eq!(shown, expected, "the replay prints the committed output");

    // The book's quick start shows that output and the commands that replay and re-record it.
    let page = read("docs/src/guide/install.md");
    assert!(page.contains(expected.trim_end()), "the quick start shows examples/smollm2/triage.out.json verbatim");
    assert!(
        page.contains("--replay examples/smollm2/triage.cassette.jsonl"),
        "the quick start shows the replay command"
    );
    assert!(page.contains("sh examples/smollm2/record.sh"), "the quick start shows the command that re-records it");
}
