//! The Python client (`clients/python`, standard library only): its `unittest` suite, run
//! with python3 against this build's `factory` binary (`FACTORY_BIN`), which the suite
//! starts as a real `factory serve --http 127.0.0.1:0` on a temporary state directory.
//! Without python3 the test fails with how to install it; it never passes without having run.

mod common;

use std::process::Command;

#[test]
fn the_python_client_passes_its_tests_against_a_real_service() {
    let python = Command::new("python3").arg("--version").output();
    assert!(
        python.as_ref().is_ok_and(|o| o.status.success()),
        "python3 (>= 3.9) is needed to test the Python client (clients/python): apt-get install python3"
    );
    let dir = common::root().join("clients").join("python");
    let out = Command::new("python3")
        .args(["-m", "unittest", "discover", "-v", "-s", "tests"])
        .current_dir(&dir)
        .env("FACTORY_BIN", common::factory_bin())
        .env("FACTORY_CACHE_DIR", common::guest_target_dir().join("cache"))
        .env_remove("FACTORY_URL")
        .env_remove("FACTORY_TOKEN")
        .env_remove("FACTORY_STATE_DIR")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("python3 starts");
    // unittest reports on stderr.
    let shown = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the Python client's tests failed ({}):\n{shown}", out.status);
    let ran: u32 = shown
        .lines()
        .find_map(|l| l.strip_prefix("Ran ").and_then(|r| r.split_whitespace().next()).and_then(|n| n.parse().ok()))
        .unwrap_or(0);
    assert!(ran >= 6, "the client's tests ran: {ran}\n{shown}");
    assert!(shown.lines().any(|l| l == "OK"), "{shown}");
}
