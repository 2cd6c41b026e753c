//! `factory serve` as the tests drive it: started in the foreground with its stderr in a log
//! file, up once it logs its banner, stopped with SIGTERM or killed with SIGKILL; and the
//! signals and waits for a daemon found by the pid it logged.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The pid a `factory serve` logged in `<state>/serve.log` when it started.
pub fn daemon_pid(state: &Path) -> u32 {
    let log = std::fs::read_to_string(state.join("serve.log")).unwrap_or_default();
    pid_in(&log).unwrap_or_else(|| panic!("no pid in serve.log: {log}"))
}

fn pid_in(log: &str) -> Option<u32> {
    log_messages(log).iter().find_map(|l| l.strip_prefix("factory serve: pid ")?.split(',').next()?.parse().ok())
}

/// The messages of a `serve.log`: one JSON record a line, its `fields.message` (a line that
/// is not a record, such as an error printed before logging started, as it is).
pub fn log_messages(log: &str) -> Vec<String> {
    log.lines()
        .map(|l| match serde_json::from_str::<serde_json::Value>(l) {
            Ok(record) => record["fields"]["message"].as_str().unwrap_or_default().to_string(),
            Err(_) => l.to_string(),
        })
        .collect()
}

/// Whether `pid` is a live process (a zombie, exited but not yet reaped, is not).
pub fn alive(pid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    !stat.is_empty() && !stat.split(") ").nth(1).is_some_and(|rest| rest.starts_with('Z'))
}

/// The pids of every service that took the store of `state` (from `<state>/serve.log`).
pub fn logged_services(state: &Path) -> Vec<i32> {
    let log = std::fs::read_to_string(state.join("serve.log")).unwrap_or_default();
    log_messages(&log)
        .iter()
        .filter(|l| l.contains(", holds the store of "))
        .filter_map(|l| l.split("pid ").nth(1)?.split(',').next()?.trim().parse().ok())
        .collect()
}

/// Those of [`logged_services`] still alive.
pub fn live_services(state: &Path) -> Vec<i32> {
    logged_services(state).into_iter().filter(|pid| alive(*pid)).collect()
}

/// Send `sig` (`-TERM`, `-KILL`, ...) to `pid` with kill(1).
pub fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill").args([sig, &pid.to_string()]).status().unwrap();
    assert!(status.success(), "kill {sig} {pid}");
}

/// Wait until `pid` has exited (a zombie counts: it holds nothing any more).
pub fn wait_gone(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Path::new(&format!("/proc/{pid}")).exists() {
        let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "));
        if zombie {
            return;
        }
        assert!(Instant::now() < deadline, "process {pid} did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A `factory serve` this test started (killed when dropped).
pub struct Service {
    child: Option<Child>,
    log: PathBuf,
}

impl Service {
    /// Start `factory serve ARGS` on `state`, its stderr in a fresh log file in `state`, and
    /// wait until it serves (its banner names the socket). Fails with the log if it exits first.
    pub fn start(state: &Path, args: &[&str]) -> Service {
        static STARTS: AtomicUsize = AtomicUsize::new(0);
        let log = state.join(format!("serve-{}.log", STARTS.fetch_add(1, Ordering::SeqCst)));
        let file = std::fs::File::create(&log).unwrap();
        let mut argv = vec!["serve"];
        argv.extend_from_slice(args);
        let child =
            super::factory_cmd(state, &argv).stdout(Stdio::null()).stderr(file).spawn().expect("factory serve starts");
        let mut service = Service { child: Some(child), log };
        let deadline = Instant::now() + Duration::from_secs(120);
        while !service.log().lines().any(|l| l.starts_with("factory serve: pid ") && l.contains("serving")) {
            if let Some(status) = service.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("factory serve {args:?} exited with {status} before serving: {}", service.log());
            }
            assert!(Instant::now() < deadline, "factory serve did not come up: {}", service.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        service
    }

    /// What it wrote to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kill it with SIGKILL and wait for it; returns its log.
    pub fn kill(mut self) -> String {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("SIGKILL"); // std's kill is SIGKILL on Unix
            child.wait().unwrap();
        }
        self.log()
    }

    /// Stop it with SIGTERM and wait for it to exit; returns its log.
    pub fn stop(mut self) -> String {
        if let Some(mut child) = self.child.take() {
            signal(child.id(), "-TERM");
            let status = child.wait().unwrap();
            assert!(status.success(), "factory serve exits 0 on SIGTERM ({status}): {}", self.log());
        }
        self.log()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
