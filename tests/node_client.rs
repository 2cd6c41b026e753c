//! The Node client (`clients/node`, issue 21): its `node --test` suite, run against this
//! build's `factory` binary (`FACTORY_BIN`), which each test file starts as a real `factory
//! serve --http 127.0.0.1:0` on a temporary state directory. Without Node.js (>= 18) the test
//! fails with how to install it; it never passes without having run.

mod common;

use std::process::Command;

/// The oldest Node.js major version the client supports (global fetch, AbortSignal).
const NODE_MAJOR: u32 = 18;

#[test]
fn the_node_client_passes_its_node_tests_against_a_real_service() {
    let version = Command::new("node").arg("--version").output();
    let version = match version {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).trim().to_string(),
        _ => panic!(
            "Node.js >= {NODE_MAJOR} is needed to test the Node client (clients/node): install it \
             (Debian/Ubuntu: apt-get install nodejs; elsewhere https://nodejs.org), then run the tests again"
        ),
    };
    let major: u32 = version.trim_start_matches('v').split('.').next().and_then(|m| m.parse().ok()).unwrap_or(0);
    assert!(major >= NODE_MAJOR, "the Node client needs Node.js >= {NODE_MAJOR}, this machine has {version}");

    let dir = common::root().join("clients").join("node");
    let mut files: Vec<_> = std::fs::read_dir(dir.join("test"))
        .expect("clients/node/test")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_str().is_some_and(|p| p.ends_with(".test.mjs")))
        .collect();
    files.sort();
    assert!(files.len() >= 2, "the client's test files: {files:?}");

    let out = Command::new("node")
        .arg("--test")
        .arg("--test-reporter=tap")
        .args(&files)
        .current_dir(&dir)
        .env("FACTORY_BIN", common::factory_bin())
        .env("FACTORY_CACHE_DIR", common::guest_target_dir().join("cache"))
        .env_remove("FACTORY_URL")
        .env_remove("FACTORY_TOKEN")
        .env_remove("FACTORY_STATE_DIR")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("node starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let count = |key: &str| -> Option<u64> {
        stdout.lines().rev().find_map(|l| l.strip_prefix(&format!("# {key} ")).and_then(|n| n.trim().parse().ok()))
    };
    assert!(out.status.success(), "node --test failed ({}):\n{stdout}\n{stderr}", out.status);
    let (pass, fail) = (count("pass"), count("fail"));
    assert_eq!(fail, Some(0), "{stdout}");
    assert!(pass.is_some_and(|p| p >= 10), "the client's tests ran: {pass:?}\n{stdout}");
}
