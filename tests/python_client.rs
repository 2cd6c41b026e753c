//! The Python client (`clients/python`, issue 24): its `unittest` suite, run against a real
//! `factory serve --http 127.0.0.1:0` this test starts on a temporary state directory (the
//! Node client's script backend rules and test factory), given to the suite as FACTORY_URL,
//! FACTORY_TOKEN and FACTORY_TEST_FANOUT (and `hello`, registered and not trusted, named by
//! FACTORY_TEST_UNTRUSTED). The interpreter is the worktree's `.venv/bin/python3`,
//! else `python3` on PATH (>= 3.11); without one the test fails with how to install it.

mod common;

use common::factory_cmd;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// The oldest Python the client supports (`typing.NotRequired`, `TimeoutError` as socket's).
const PYTHON_MINOR: u32 = 11;

/// The Node client's test backend: fast `t:` agents, slow `slow:` ones, `hang:` ones that take
/// minutes; anything else dry-run.
const RULES: &str = r#"{"rules": [
    {"labelPrefix": "t:", "reply": {"text": "ok"}, "latencyMs": 1},
    {"labelPrefix": "slow:", "reply": {"text": "ok"}, "latencyMs": 1500},
    {"labelPrefix": "hang:", "reply": {"text": "late"}, "latencyMs": 600000}
], "fallback": "dry-run"}"#;

/// The service, stopped (SIGTERM) when dropped.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ =
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.0.id() as i32), nix::sys::signal::Signal::SIGTERM);
        let _ = self.0.wait();
    }
}

/// The interpreter to test with: the worktree's `.venv`, else `python3` on PATH.
fn python() -> PathBuf {
    let venv = common::root().join(".venv").join("bin").join("python3");
    if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    }
}

#[test]
fn the_python_client_passes_its_unittest_suite_against_a_real_service() {
    let python = python();
    let version =
        Command::new(&python).args(["-c", "import sys; print(sys.version_info[0], sys.version_info[1])"]).output();
    let version = match version {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).trim().to_string(),
        _ => panic!(
            "Python >= 3.{PYTHON_MINOR} is needed to test the Python client (clients/python): install it \
             (Debian/Ubuntu: apt-get install python3; elsewhere https://www.python.org/downloads/), then run the tests again"
        ),
    };
    let parts: Vec<u32> = version.split(' ').filter_map(|p| p.parse().ok()).collect();
    assert!(
        parts.len() == 2 && parts[0] == 3 && parts[1] >= PYTHON_MINOR,
        "the Python client needs Python >= 3.{PYTHON_MINOR}, {} is {version}",
        python.display()
    );

    let state = tempfile::tempdir().unwrap();
    let rules = state.path().join("rules.json");
    std::fs::write(&rules, RULES).unwrap();
    std::fs::write(
        state.path().join("factory.toml"),
        format!("default = \"test\"\n[backends.test]\nkind = \"script\"\npath = {:?}\n", rules.to_str().unwrap()),
    )
    .unwrap();
    // `hello`, registered for everyone and never trusted: its runs are asked about.
    let hello = common::component("hello");
    let out = common::factory_in(state.path(), &["add", hello.to_str().unwrap()]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let mut child = factory_cmd(state.path(), &["serve", "--http", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("factory serve starts");
    let mut lines = BufReader::new(child.stderr.take().expect("piped stderr")).lines();
    let daemon = Daemon(child);
    let url = loop {
        let line = lines.next().expect("serve says where it listens").expect("its stderr reads");
        if let Some(rest) = line.split("HTTP API on http://").nth(1) {
            break format!("http://{}", rest.split("/api/").next().unwrap_or(rest));
        }
    };
    // Keep reading stderr so the daemon never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    let token = std::fs::read_to_string(state.path().join("http.token")).expect("the token file");

    let dir = common::root().join("clients").join("python");
    let fanout = common::root().join("clients/node/test/factories/fanout.js");
    let out = Command::new(&python)
        .args(["-m", "unittest", "discover", "-v", "-s", "tests", "-t", "."])
        .current_dir(&dir)
        .env("PYTHONPATH", &dir)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("FACTORY_URL", &url)
        .env("FACTORY_TOKEN", token.trim())
        .env("FACTORY_TEST_FANOUT", &fanout)
        .env("FACTORY_TEST_UNTRUSTED", "hello")
        .env_remove("FACTORY_STATE_DIR")
        .stdin(Stdio::null())
        .output()
        .expect("python starts");
    drop(daemon);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stderr}");
    assert!(out.status.success(), "the Python client's tests failed ({}):\n{stderr}", out.status);
    let ran: Option<u32> = stderr.lines().find_map(|l| l.strip_prefix("Ran ")?.split(' ').next()?.parse().ok());
    assert!(ran.is_some_and(|n| n >= 10), "the client's tests ran: {ran:?}\n{stderr}");
    assert!(stderr.lines().any(|l| l == "OK"), "no test skipped or failed:\n{stderr}");
}
