//! `cargo bench -p factory-host --bench factory`: measures the host's own costs and prints
//! them as one Markdown table — the median of several runs per row — headed by the date, the
//! machine, the versions and the command. It builds the `bench` test guest
//! (`tests/guests/bench`) into `<target>/guests`, then measures (1) hook overhead inside the
//! guest (a loop of one hook minus an empty loop), (2) start-up: cold compile vs the on-disk
//! cache vs a warm `InstancePre`, and a whole `factory run --no-daemon` of an empty run as a
//! process of its own beside `factory --version`, (3) fan-out of 1,000 and 4,096 agents against a 0 ms and a
//! 1 ms backend with the durable journal on, (4) sequential agent calls and steps and the
//! resume of those runs, (5) 100 concurrent runs on one host, (6) each hostile-guest attack
//! against its bound, (7) the JS runner and a Python guest against the Rust one, (8) what the
//! local service adds to a `factory run` (a real `factory serve`'s control socket against an
//! in-process service: one request, and a tiny run started and followed to its envelope) and
//! (9) the dashboard drawing a 4,096-agent run in headless Chromium (`tests/browser/render.mjs`;
//! Node, `npm ci` in tests/browser and /usr/bin/chromium are required) and (10) the PostgreSQL
//! store against a server it starts (Debian's PostgreSQL 15 is required; a missing one fails
//! the bench with the install hint) and (11) flow control: a fan-out against a provider that
//! throttles (`tests/common/throttling.rs`) against its floor, and the flow controller's cost
//! per admitted call against the host's per agent, and (12) store size: a redb file after a
//! fan-out of 2,000 agents with 2 KiB English-like replies against the reply bytes, after
//! removing that run, and per call of a 1,000-agent fan-out replying `ok` against LangGraph's
//! SQLite checkpointer (`tests/compare/langgraph_size.py` by the workspace's
//! `.venv/bin/python3`; a missing one fails the row with the install hint). The backend is a small
//! in-process latency backend (a timer thread, so 1 ms means 1 ms, not a tokio tick): the
//! boundary, not the thing measured. Correctness checks (results complete, a resume makes no
//! backend call, a resume runs no step producer, a memo hit makes no backend call) fail the
//! bench; timing targets print PASS or MISS, and with `-- --check` a MISS fails it too.
//! `FACTORY_BENCH_RUNS=N` changes the number of runs per row (default 7; cold start, the
//! one-second sequential rows and memory per run use at most 5); `FACTORY_BENCH_SECTIONS=6,7`
//! measures only those sections (in section 7, `FACTORY_BENCH_LANGUAGES=js` skips Python and
//! `FACTORY_BENCH_FAN_OUT_ONLY=1` keeps the fan-out rows only; in section 1,
//! `FACTORY_BENCH_HOOKS=agent-hit,log` measures only those hooks, for profiling one). Without `--bench` (as under
//! `cargo test --all-targets`) it measures nothing.

use factory_host::backend::{AgentBackend, AgentReply, AgentRequest, BackendError, Usage};
use factory_host::component::CompileOrigin;
use factory_host::service::{Client, Consent, Followed, Follower, Local, Remote, Request, Scope, Target};
use factory_host::{Factory, Host, HostConfig, Limits, ResumeOptions, RunEnvelope, RunOptions, RunStatus};
use futures::future::BoxFuture;
use serde_json::json;
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::oneshot;

const COMMAND: &str = "cargo bench -p factory-host --bench factory";

/// The throttling provider of the tests (token buckets, 429s with the providers' headers).
#[path = "../../tests/common/throttling.rs"]
#[allow(dead_code)]
mod throttling;

/// Stop the bench: a correctness check failed (never used for a missed timing target).
fn fail(message: impl std::fmt::Display) -> ! {
    eprintln!("\nbench check failed: {message}");
    std::process::exit(1)
}

// ----------------------------------------------------------------------------------------
// The backend: answers "ok" after a fixed latency.

type Wake = (Instant, oneshot::Sender<()>);

struct LatencyInner {
    latency: Duration,
    calls: AtomicU64,
    /// Nanoseconds calls spent inside the backend, summed.
    busy_nanos: AtomicU64,
    in_flight: AtomicU64,
    /// The most calls in flight at once since it was last reset.
    max_in_flight: AtomicU64,
    /// When this many calls are in flight, record VmRSS in `rss_when_full` (0: never).
    full_at: AtomicU64,
    rss_when_full: AtomicU64,
    timer: Option<mpsc::Sender<Wake>>,
}

/// A backend that replies after `latency`, timed by one thread of its own: tokio's timer
/// rounds a 1 ms sleep up to the next millisecond tick, which would bill the host for the
/// timer's granularity.
#[derive(Clone)]
struct LatencyBackend(Arc<LatencyInner>);

impl LatencyBackend {
    fn new(latency: Duration) -> Self {
        let timer = (!latency.is_zero()).then(|| {
            let (tx, rx) = mpsc::channel();
            std::thread::Builder::new()
                .name("bench-backend-timer".into())
                .spawn(move || timer_thread(rx))
                .expect("starting the backend's timer thread");
            tx
        });
        LatencyBackend(Arc::new(LatencyInner {
            latency,
            calls: AtomicU64::new(0),
            busy_nanos: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            max_in_flight: AtomicU64::new(0),
            full_at: AtomicU64::new(0),
            rss_when_full: AtomicU64::new(0),
            timer,
        }))
    }

    fn calls(&self) -> u64 {
        self.0.calls.load(Ordering::SeqCst)
    }

    fn busy(&self) -> Duration {
        Duration::from_nanos(self.0.busy_nanos.load(Ordering::SeqCst))
    }
}

/// Fire each wake-up at its deadline (all calls share one latency, so deadlines arrive in
/// order and a FIFO is enough).
fn timer_thread(rx: mpsc::Receiver<Wake>) {
    sys::set_precise_timers();
    let mut queue: VecDeque<Wake> = VecDeque::new();
    loop {
        let next = match queue.front() {
            None => match rx.recv() {
                Ok(wake) => Some(wake),
                Err(_) => return,
            },
            Some((deadline, _)) => match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(wake) => Some(wake),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            },
        };
        queue.extend(next);
        queue.extend(rx.try_iter());
        let now = Instant::now();
        while queue.front().is_some_and(|(deadline, _)| *deadline <= now) {
            if let Some((_, wake)) = queue.pop_front() {
                let _ = wake.send(());
            }
        }
    }
}

impl AgentBackend for LatencyBackend {
    fn name(&self) -> String {
        format!("bench-latency-{}ms", self.0.latency.as_millis())
    }

    fn call(&self, _request: Arc<AgentRequest>) -> BoxFuture<'static, Result<AgentReply, BackendError>> {
        let me = self.0.clone();
        Box::pin(async move {
            let started = Instant::now();
            me.calls.fetch_add(1, Ordering::SeqCst);
            if let Some(timer) = &me.timer {
                let now = me.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                me.max_in_flight.fetch_max(now, Ordering::SeqCst);
                if now == me.full_at.load(Ordering::SeqCst) {
                    me.rss_when_full.store(vm("VmRSS"), Ordering::SeqCst);
                }
                let (tx, rx) = oneshot::channel();
                let waited = match timer.send((started + me.latency, tx)) {
                    Ok(()) => rx.await.is_ok(),
                    Err(_) => false,
                };
                me.in_flight.fetch_sub(1, Ordering::SeqCst);
                if !waited {
                    return Err(BackendError::ordinary("the bench backend's timer thread is gone"));
                }
            }
            me.busy_nanos.fetch_add(started.elapsed().as_nanos() as u64, Ordering::SeqCst);
            let usage = Usage::tokens(1, 1, Some(0));
            Ok(AgentReply::new("ok", Some(usage)))
        })
    }
}

// ----------------------------------------------------------------------------------------
// Process measurements.

/// The system calls /proc does not cover.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
mod sys {
    use std::time::Duration;

    /// `struct rusage` on 64-bit Linux: two `timeval`s, then 14 `long`s.
    #[repr(C)]
    struct Rusage {
        utime: [i64; 2],
        stime: [i64; 2],
        rest: [i64; 14],
    }

    extern "C" {
        fn getrusage(who: i32, usage: *mut Rusage) -> i32;
        fn prctl(option: i32, arg2: u64, arg3: u64, arg4: u64, arg5: u64) -> i32;
    }

    #[cfg(target_env = "gnu")]
    extern "C" {
        fn malloc_trim(pad: usize) -> i32;
    }

    /// Return free heap memory to the system (glibc), so RSS reflects what is in use.
    pub fn trim_heap() {
        #[cfg(target_env = "gnu")]
        // SAFETY: malloc_trim only releases free memory of the allocator Rust's `System`
        // allocator uses; it is safe to call at any time.
        unsafe {
            malloc_trim(0);
        }
    }

    /// User + system CPU time of the whole process (every thread, live or exited).
    pub fn process_cpu() -> Option<Duration> {
        let mut usage = Rusage { utime: [0; 2], stime: [0; 2], rest: [0; 14] };
        // SAFETY: `usage` is a writable `struct rusage` in the 64-bit Linux layout;
        // RUSAGE_SELF (0) is always valid.
        if unsafe { getrusage(0, &mut usage) } != 0 {
            return None;
        }
        let micros = (usage.utime[0] + usage.stime[0]) * 1_000_000 + usage.utime[1] + usage.stime[1];
        Some(Duration::from_micros(micros.max(0) as u64))
    }

    /// Shrink this thread's timer slack from the default 50 µs to 1 ns, so its timed waits
    /// end on time (best effort).
    pub fn set_precise_timers() {
        const PR_SET_TIMERSLACK: i32 = 29;
        // SAFETY: PR_SET_TIMERSLACK takes a plain integer and affects only this thread.
        unsafe { prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0) };
    }
}

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
mod sys {
    pub fn process_cpu() -> Option<std::time::Duration> {
        None
    }
    pub fn set_precise_timers() {}
    pub fn trim_heap() {}
}

/// CPU time (user + system) of the whole process, every thread included.
fn cpu_time() -> Duration {
    if let Some(cpu) = sys::process_cpu() {
        return cpu;
    }
    // Fallback: utime + stime from /proc/self/stat, in clock ticks (usually 10 ms).
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<u64> = after.split_whitespace().filter_map(|f| f.parse().ok()).collect();
    let ticks = fields.get(11).copied().unwrap_or(0) + fields.get(12).copied().unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// A `VmXXX:` line of /proc/self/status, in bytes.
fn vm(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Reset VmHWM to the current RSS, so the next reading is this measurement's peak.
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

struct Sample {
    wall: Duration,
    cpu: Duration,
    commits: u64,
    /// VmHWM after the measurement (process-wide).
    peak_rss: u64,
    /// VmRSS before it.
    rss_before: u64,
}

/// With `FACTORY_BENCH_PERF_CTL=FIFO` (and `FACTORY_BENCH_PERF_ACK=FIFO`), tell a
/// `perf record --control fifo:FIFO,ACK --delay=-1` to `enable` or `disable` sampling, so a
/// profile holds the measured work only (not the runs made to be resumed), and wait for its
/// acknowledgement.
fn perf_control(command: &str) {
    use std::io::{Read, Write};
    let Some(control) = std::env::var_os("FACTORY_BENCH_PERF_CTL") else { return };
    let written = std::fs::OpenOptions::new()
        .write(true)
        .open(&control)
        .and_then(|mut f| f.write_all(format!("{command}\n").as_bytes()));
    if let Err(e) = written {
        fail(format!("cannot tell perf to {command} through {}: {e}", control.to_string_lossy()));
    }
    if let Some(ack) = std::env::var_os("FACTORY_BENCH_PERF_ACK") {
        let mut answer = [0u8; 5];
        let _ = std::fs::File::open(ack).and_then(|mut f| f.read(&mut answer));
    }
}

/// An instant as seconds of CLOCK_MONOTONIC (what `perf record -k mono` stamps samples
/// with), read from its `Debug` form (std's `Instant` is a `timespec` of that clock on Linux
/// and has no accessor).
fn monotonic(at: Instant) -> String {
    let text = format!("{at:?}");
    let field = |name: &str| -> u64 {
        let digits = text.split(name).nth(1).unwrap_or("").trim_start_matches(|c: char| !c.is_ascii_digit());
        digits.split(|c: char| !c.is_ascii_digit()).next().and_then(|n| n.parse().ok()).unwrap_or(0)
    };
    format!("{}.{:09}", field("tv_sec"), field("tv_nsec"))
}

async fn measure<T>(host: &Host, work: impl Future<Output = T>) -> (T, Sample) {
    // Hand free heap pages back first, so "RSS before" is not padded with earlier peaks.
    sys::trim_heap();
    reset_peak_rss();
    let rss_before = vm("VmRSS");
    let commits = host.store().writer_stats().commits.load(Ordering::SeqCst);
    perf_control("enable");
    let cpu = cpu_time();
    let started = Instant::now();
    let out = work.await;
    let wall = started.elapsed();
    perf_control("disable");
    if std::env::var_os("FACTORY_BENCH_MARKS").is_some() {
        eprintln!("bench: mark {} {}", monotonic(started), monotonic(started + wall));
    }
    let sample = Sample {
        wall,
        cpu: cpu_time().saturating_sub(cpu),
        commits: host.store().writer_stats().commits.load(Ordering::SeqCst) - commits,
        peak_rss: vm("VmHWM"),
        rss_before,
    };
    (out, sample)
}

fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(|a, b| a.total_cmp(b));
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn fmt_ms(v: f64) -> String {
    if v >= 1000.0 {
        format!("{:.3} s", v / 1e3)
    } else if v >= 100.0 {
        format!("{v:.0} ms")
    } else if v >= 10.0 {
        format!("{v:.1} ms")
    } else {
        format!("{v:.2} ms")
    }
}

fn fmt_mib(bytes: f64) -> String {
    format!("{:.1} MiB", bytes / (1024.0 * 1024.0))
}

// ----------------------------------------------------------------------------------------
// Hosts and runs.

fn durable_host(state: &Path, cache: &Path, backend: &LatencyBackend) -> Host {
    Host::new(HostConfig {
        state_dir: Some(state.to_path_buf()),
        cache_dir: Some(cache.to_path_buf()),
        backend: Arc::new(backend.clone()),
        ..HostConfig::default()
    })
    .unwrap_or_else(|e| fail(format!("cannot open a durable host in {}: {e}", state.display())))
}

fn memory_host(cache: Option<&Path>) -> Host {
    Host::new(HostConfig {
        state_dir: None,
        cache_dir: cache.map(Path::to_path_buf),
        backend: Arc::new(LatencyBackend::new(Duration::ZERO)),
        ..HostConfig::default()
    })
    .unwrap_or_else(|e| fail(format!("cannot create a host: {e}")))
}

async fn load(host: &Host, component: &Path) -> Factory {
    host.load_file(component).await.unwrap_or_else(|e| fail(format!("cannot load {}: {e}", component.display())))
}

async fn run(host: &Host, factory: &Factory, workload: &str, n: usize, fail_at_end: bool) -> RunEnvelope {
    let args = json!({ "workload": workload, "n": n, "failAtEnd": fail_at_end });
    host.run(factory, RunOptions { args: Some(args), ..Default::default() })
        .await
        .unwrap_or_else(|e| fail(format!("the run of `{workload}` (n = {n}) was refused: {e}")))
}

/// The run did all its work: `done` units, completed, or (with `failAtEnd`) ended with the
/// guest's error naming the count.
fn check_done(envelope: &RunEnvelope, workload: &str, done: usize, fail_at_end: bool) {
    let ok = if fail_at_end {
        envelope.status == RunStatus::Error
            && envelope.error.as_deref().is_some_and(|e| e.contains(&format!("failAtEnd: done={done}")))
    } else {
        envelope.status == RunStatus::Completed
            && envelope.result_value().as_ref().and_then(|r| r["done"].as_u64()) == Some(done as u64)
    };
    if !ok {
        fail(format!(
            "`{workload}` did not finish its {done} units: status {:?}, result {:?}, error {:?}",
            envelope.status, envelope.result, envelope.error
        ));
    }
}

/// The run's step producers ran exactly `expected` times (a resume replays every journaled
/// step: its producers must not run again).
fn check_produced(envelope: &RunEnvelope, workload: &str, expected: usize) {
    let error = envelope.error.as_deref().unwrap_or_default();
    let produced =
        error.split("produced=").nth(1).and_then(|rest| rest.split_whitespace().next()?.parse::<usize>().ok());
    if produced != Some(expected) {
        fail(format!("`{workload}` ran {produced:?} step producers, expected {expected}: {error}"));
    }
}

// ----------------------------------------------------------------------------------------
// The table.

struct Row {
    section: &'static str,
    name: String,
    value: String,
    detail: String,
    target: String,
    pass: Option<bool>,
}

#[derive(Default)]
struct Table(Vec<Row>);

impl Table {
    fn row(
        &mut self,
        section: &'static str,
        name: impl Into<String>,
        value: impl Into<String>,
        detail: impl Into<String>,
    ) {
        self.0.push(Row {
            section,
            name: name.into(),
            value: value.into(),
            detail: detail.into(),
            target: String::new(),
            pass: None,
        });
    }

    fn judged(
        &mut self,
        section: &'static str,
        name: impl Into<String>,
        value: impl Into<String>,
        detail: impl Into<String>,
        target: impl Into<String>,
        pass: bool,
    ) {
        self.0.push(Row {
            section,
            name: name.into(),
            value: value.into(),
            detail: detail.into(),
            target: target.into(),
            pass: Some(pass),
        });
    }
}

/// The rows of sections 1-5 as measured on 2026-12-01 (README's Benchmarks table): each
/// row of a run is printed with its ratio to its figure here (a row named twice is matched
/// by its place among the rows of that name).
const FIGURES_2026_12_01: &[(&str, &str)] = &[
    ("`log` (a progress entry, journaled)", "3019 ns/call"),
    ("`step-get` hit", "793 ns/call"),
    ("`step-put` (journaled)", "2485 ns/call"),
    ("memoized `agent` hit (async call)", "2601 ns/call"),
    ("cold: new Host + compile + empty run", "325 ms"),
    ("cached: new Host + deserialize + empty run", "3.01 ms"),
    ("warm: same Host, `InstancePre` reuse, empty run", "0.72 ms"),
    ("fan-out 1000 agents x 0 ms, durable", "31.1 ms"),
    ("fan-out 4096 agents x 0 ms, durable", "111 ms"),
    ("fan-out 1000 agents x 1 ms, durable", "39.1 ms"),
    ("fan-out 4096 agents x 1 ms, durable", "154 ms"),
    ("1000 sequential agent calls of 1 ms", "1.139 s"),
    ("resume of that run (1000 entries replayed)", "9.49 ms"),
    ("1000 sequential journaled steps, no agent", "10.8 ms"),
    ("resume of that run (1000 entries replayed)", "7.37 ms"),
    ("`timeoutSeconds` 0.2 s on a guest spinning without hook calls: stopped after the budget by", "2.70 ms"),
    ("100 concurrent runs (3 agents x 0 ms, a step, a log line), durable", "2222 runs/s"),
    ("memory per live run", "98 KiB"),
];

/// A table value as one number in its unit's base (seconds, bytes, a plain count).
fn figure(value: &str) -> Option<f64> {
    let mut parts = value.split_whitespace();
    let number: f64 = parts.next()?.trim_end_matches('x').parse().ok()?;
    let scale = match parts.next().unwrap_or("") {
        "ns/call" | "ns" => 1e-9,
        "µs" => 1e-6,
        "ms" => 1e-3,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        _ => 1.0,
    };
    Some(number * scale)
}

/// Each row's ratio to its 2026-12-01 figure ("" for a row measured since).
fn ratios_to_2026_12_01(rows: &[Row]) -> Vec<String> {
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    rows.iter()
        .map(|row| {
            let nth = seen.entry(row.name.as_str()).or_insert(0);
            *nth += 1;
            let then = FIGURES_2026_12_01.iter().filter(|(name, _)| *name == row.name).nth(*nth - 1);
            match (then.and_then(|(_, v)| figure(v)), figure(&row.value)) {
                (Some(then), Some(now)) if then > 0.0 => format!("{:.2}x", now / then),
                _ => String::new(),
            }
        })
        .collect()
}

// ----------------------------------------------------------------------------------------
// Environment.

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| workspace_root().join("target"))
}

/// The version of `package` in the workspace's Cargo.lock.
fn locked_version(package: &str) -> String {
    let lock = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.lock"));
    let wanted = format!("name = \"{package}\"");
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line.trim() == wanted {
            if let Some(version) = lines.next().and_then(|l| l.trim().strip_prefix("version = ")) {
                return version.trim_matches('"').to_string();
            }
        }
    }
    "unknown".into()
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

fn today() -> String {
    let days = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() / 86_400) as i64;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

fn rustc_version() -> String {
    std::process::Command::new(std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()))
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "rustc (unknown)".into())
}

// ----------------------------------------------------------------------------------------
// The sections.

/// (1) ns per hook call: a loop of `n` calls minus an empty loop of `n`, inside the guest.
async fn hook_overhead(table: &mut Table, component: &Path, cache: &Path, runs: usize) {
    eprintln!("bench: (1) hook overhead");
    let state = tempfile::tempdir().expect("a temporary state directory");
    let backend = LatencyBackend::new(Duration::ZERO);
    let host = durable_host(state.path(), cache, &backend);
    let factory = load(&host, component).await;
    let only: Option<Vec<String>> =
        std::env::var("FACTORY_BENCH_HOOKS").ok().map(|v| v.split(',').map(|s| s.trim().to_string()).collect());
    let hooks: Vec<(&str, &str, usize)> = [
        ("log", "`log` (a progress entry, journaled)", 20_000),
        ("step-get", "`step-get` hit", 100_000),
        ("step-put", "`step-put` (journaled)", 20_000),
        ("agent-hit", "memoized `agent` hit (async call)", 20_000),
        (
            "agent-ready",
            "memoized `agent` hit (`agent-ready`, the path of components built before `agent-start`)",
            20_000,
        ),
        ("agent-start", "memoized `agent` hit (the SDKs' and the JS runner's path: `agent-start`)", 20_000),
    ]
    .into_iter()
    .filter(|(workload, ..)| only.as_ref().is_none_or(|o| o.iter().any(|w| w == workload)))
    .collect();
    let mut empty: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
    let mut loops: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    run(&host, &factory, "empty", 1, false).await; // warm-up
    let mut sizes: Vec<usize> = hooks.iter().map(|h| h.2).collect();
    sizes.sort_unstable();
    sizes.dedup();
    for _ in 0..runs {
        for &n in &sizes {
            let (envelope, sample) = measure(&host, run(&host, &factory, "empty", n, false)).await;
            check_done(&envelope, "empty", n, false);
            empty.entry(n).or_default().push(ms(sample.wall));
        }
        for &(workload, _, n) in &hooks {
            let calls = backend.calls();
            let (envelope, sample) = measure(&host, run(&host, &factory, workload, n, false)).await;
            check_done(&envelope, workload, n, false);
            // The first call of `agent-hit` (`agent-ready`) spawns; every other one is a memo hit.
            let expected = u64::from(matches!(workload, "agent-hit" | "agent-ready" | "agent-start"));
            if backend.calls() - calls != expected {
                fail(format!("`{workload}` made {} backend calls, expected {expected}", backend.calls() - calls));
            }
            loops.entry(workload).or_default().push(ms(sample.wall));
        }
    }
    for &(workload, name, n) in &hooks {
        let base = median(empty.get(&n).cloned().unwrap_or_default());
        let total = median(loops.get(workload).cloned().unwrap_or_default());
        let per_call = (total - base) * 1e6 / n as f64;
        let checked = if matches!(workload, "agent-hit" | "agent-ready" | "agent-start") {
            "; 1 backend call per run (checked)"
        } else {
            ""
        };
        table.row(
            "1 hooks",
            name,
            format!("{per_call:.0} ns/call"),
            format!("{n} calls {} − empty loop {}{checked}", fmt_ms(total), fmt_ms(base)),
        );
    }
}

/// (2) Start-up: cold (compile, no cache), cached (new Host, deserialize + instantiate),
/// warm (same Host, `InstancePre` reuse). Each is a whole start: host (cold and cached) +
/// load + an empty run, on an in-memory store.
async fn start_up(table: &mut Table, component: &Path, runs: usize) {
    eprintln!("bench: (2) start-up");
    let StartUp { cold, cached, cached_load, warm } = guest_start_up(&Guest::Rust(component.to_path_buf()), runs).await;
    table.row("2 start-up", "cold: new Host + compile + empty run", fmt_ms(cold), "no cache; in-memory store");
    table.row(
        "2 start-up",
        "cached: new Host + deserialize + empty run",
        fmt_ms(cached),
        format!("of which Host::new + load (read, sha256, deserialize, link, `meta`) {}", fmt_ms(cached_load)),
    );
    table.row(
        "2 start-up",
        "warm: same Host, `InstancePre` reuse, empty run",
        fmt_ms(warm),
        "instantiate + run + record writes",
    );
    let ratio = cold / cached;
    table.judged("2 start-up", "cold / cached", format!("{ratio:.0}x"), "", ">= 50x", ratio >= 50.0);
    table.row("2 start-up", "cold / warm", format!("{:.0}x", cold / warm), "");
}

/// (2b) What a user's command costs: `factory run --no-daemon` of an empty run as a process
/// of its own (the store opened, the component's compile cached, progress on stderr, the
/// group-commit window left at its default), beside the process alone (`factory --version`),
/// interleaved.
fn command_start_up(table: &mut Table, component: &Path, cache: &Path, runs: usize) {
    eprintln!("bench: (2b) `factory run` as a command");
    let state = tempfile::tempdir().expect("a temporary state directory");
    let path = component.to_string_lossy().into_owned();
    let args = json!({ "workload": "empty", "n": 0, "failAtEnd": false }).to_string();
    let timed = |argv: &[&str]| {
        let mut cmd = factory_cmd(state.path(), cache, argv);
        cmd.env_remove("FACTORY_COMMIT_WINDOW_MS")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        ms(time_command(cmd, &format!("factory {}", argv.join(" "))))
    };
    let run = ["run", path.as_str(), "--yes", "--no-daemon", "--backend", "dry-run", "--args", args.as_str()];
    timed(&run); // fills the compile cache and makes the store
    let commands = 10 * runs;
    let (mut alone, mut runs_ms) = (Vec::with_capacity(commands), Vec::with_capacity(commands));
    for _ in 0..commands {
        alone.push(timed(&["--version"]));
        runs_ms.push(timed(&run));
    }
    let (alone, run_ms) = (median(alone), median(runs_ms));
    table.row(
        "2 start-up",
        "`factory run --no-daemon` of an empty run (a process of its own)",
        fmt_ms(run_ms),
        format!(
            "whole process, wall, median of {commands}: the process alone (`factory --version`) {}; the store, the cached \
             component, the run's commits and its progress on stderr {}; dry-run backend, default group-commit window",
            fmt_ms(alone),
            fmt_ms(run_ms - alone)
        ),
    );
}

/// The wall of `cmd` (`what` names it), run to its exit; a command that fails, fails the bench.
fn time_command(mut cmd: std::process::Command, what: &str) -> Duration {
    let started = Instant::now();
    let out = cmd.output().unwrap_or_else(|e| fail(format!("cannot run `{what}`: {e}")));
    let took = started.elapsed();
    if !out.status.success() {
        fail(format!("`{what}` failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    took
}

/// (3) Fan-out of `n` agents with the durable journal on.
async fn fan_out(table: &mut Table, component: &Path, cache: &Path, runs: usize) {
    eprintln!("bench: (3) fan-out");
    for latency_ms in [0u64, 1] {
        let latency = Duration::from_millis(latency_ms);
        let state = tempfile::tempdir().expect("a temporary state directory");
        let backend = LatencyBackend::new(latency);
        let host = durable_host(state.path(), cache, &backend);
        let factory = load(&host, component).await;
        run(&host, &factory, "fanout", 10, false).await; // warm-up
        for n in [1000usize, 4096] {
            let mut samples = Vec::new();
            for _ in 0..runs {
                let calls = backend.calls();
                let (envelope, sample) = measure(&host, run(&host, &factory, "fanout", n, false)).await;
                check_done(&envelope, "fanout", n, false);
                if backend.calls() - calls != n as u64 {
                    fail(format!("fan-out of {n} made {} backend calls", backend.calls() - calls));
                }
                samples.push(sample);
            }
            let wall = median(samples.iter().map(|s| ms(s.wall)).collect());
            let cpu = median(samples.iter().map(|s| ms(s.cpu)).collect());
            let peak = median(samples.iter().map(|s| s.peak_rss as f64).collect());
            let grew = median(samples.iter().map(|s| s.peak_rss.saturating_sub(s.rss_before) as f64).collect());
            let commits = median(samples.iter().map(|s| s.commits as f64 * 1000.0 / n as f64).collect());
            let overhead = wall - latency_ms as f64;
            let detail = format!(
                "host overhead {}; host CPU {}; peak RSS {} (+{}); {commits:.1} commits per 1,000 results",
                fmt_ms(overhead),
                fmt_ms(cpu),
                fmt_mib(peak),
                fmt_mib(grew)
            );
            let name = format!("fan-out {n} agents x {latency_ms} ms, durable");
            match (n, latency_ms) {
                (4096, 0) => {
                    table.judged("3 fan-out", name, fmt_ms(wall), detail, "overhead < 100 ms", overhead < 100.0)
                }
                (1000, 1) => table.judged("3 fan-out", name, fmt_ms(wall), detail, "wall < 30 ms", wall < 30.0),
                _ => table.row("3 fan-out", name, fmt_ms(wall), detail),
            }
        }
    }
}

/// (11) Flow control: a fan-out against a provider that allows 25 requests a second (a real
/// HTTP server on 127.0.0.1 answering 429 with OpenAI's headers past its token bucket)
/// against its floor, N / rate; and what the flow controller costs per admitted call, against
/// the host's own cost per agent of a 1,000-agent fan-out measured in the same run.
async fn flow_control(table: &mut Table, component: &Path, cache: &Path, runs: usize) {
    use factory_host::backend::flow::{Flow, FlowLimits};
    use factory_host::backend::{OpenAi, OpenAiConfig};
    eprintln!("bench: (11) flow control");
    const N: usize = 300;
    const RATE: f64 = 25.0;
    let (mut makespans, mut shares) = (Vec::new(), Vec::new());
    for _ in 0..runs.min(3) {
        let server = throttling::Throttling::start(throttling::Limits::rps(RATE)).await;
        let config = OpenAiConfig { model: Some("m".into()), ..OpenAiConfig::new("limited", server.base_url()) };
        let backend: Arc<dyn AgentBackend> =
            Arc::new(OpenAi::new(config).unwrap_or_else(|e| fail(format!("the OpenAI backend: {e}"))));
        let state = tempfile::tempdir().expect("a temporary state directory");
        let host = Host::new(HostConfig {
            state_dir: Some(state.path().to_path_buf()),
            cache_dir: Some(cache.to_path_buf()),
            backend,
            ..HostConfig::default()
        })
        .unwrap_or_else(|e| fail(format!("a durable host: {e}")));
        let factory = load(&host, component).await;
        let args = json!({ "workload": "fanout", "n": N, "failAtEnd": false });
        let limits = Limits { max_concurrent_subagents: Some(64), ..Limits::default() };
        let started = Instant::now();
        let envelope = host
            .run(&factory, RunOptions { args: Some(args), limits, ..Default::default() })
            .await
            .unwrap_or_else(|e| fail(format!("the rate-limited fan-out was refused: {e}")));
        makespans.push(started.elapsed().as_secs_f64());
        check_done(&envelope, "rate-limited fanout", N, false);
        let counts = server.counts();
        if counts.answered != N {
            fail(format!("the rate-limited fan-out: the server answered {} of {N}", counts.answered));
        }
        shares.push(counts.throttled_share());
    }
    let makespan = median(makespans);
    let share = median(shares);
    let floor = N as f64 / RATE;
    let ratio = makespan / floor;
    table.judged(
        "11 flow",
        format!("fan-out {N} agents x 64 at once against {RATE} req/s"),
        format!("{makespan:.2} s"),
        format!("floor N / rate {floor:.1} s: {ratio:.2}x; 429s {:.1}% of requests", share * 100.0),
        "<= 1.15x floor, 429s <= 10%",
        ratio <= 1.15 && share <= 0.10,
    );

    // The controller's own cost: admit and answer on an unlimited flow, one task at a time.
    let flow = Arc::new(Flow::new("bench", "bench", FlowLimits::default()));
    // A reply's ordinary headers, none of them a rate limit (what an unlimited backend sends).
    let mut headers = reqwest::header::HeaderMap::new();
    for (name, value) in [
        ("content-type", "application/json"),
        ("content-length", "512"),
        ("date", "Sun, 06 Dec 2026 06:00:00 GMT"),
        ("x-request-id", "req_0123456789abcdef"),
    ] {
        headers.insert(name, reqwest::header::HeaderValue::from_static(value));
    }
    const CALLS: u32 = 200_000;
    let mut per_call = Vec::new();
    for _ in 0..runs {
        let started = Instant::now();
        for _ in 0..CALLS {
            flow.admit(100).await.answered(&headers);
        }
        per_call.push(started.elapsed().as_nanos() as f64 / f64::from(CALLS));
    }
    let controller = median(per_call);
    // The host's cost per agent of a 1,000-agent fan-out against a 0 ms backend.
    let state = tempfile::tempdir().expect("a temporary state directory");
    let backend = LatencyBackend::new(Duration::ZERO);
    let host = durable_host(state.path(), cache, &backend);
    let factory = load(&host, component).await;
    run(&host, &factory, "fanout", 10, false).await; // warm-up
    let mut per_agent = Vec::new();
    for _ in 0..runs {
        let (envelope, sample) = measure(&host, run(&host, &factory, "fanout", 1000, false)).await;
        check_done(&envelope, "fanout", 1000, false);
        per_agent.push(sample.cpu.as_nanos() as f64 / 1000.0);
    }
    let agent = median(per_agent);
    let share = controller / agent;
    table.judged(
        "11 flow",
        "flow controller per admitted call, unlimited backend",
        format!("{controller:.0} ns/call"),
        format!("host CPU per agent of a 1,000-agent fan-out {:.1} us: {:.1}%", agent / 1000.0, share * 100.0),
        "<= 5% of the host's cost per agent",
        share <= 0.05,
    );
}

/// (4) Sequential agent calls and steps, each journaled, then the resume of each run.
/// Returns the median resume of the 1,000 agent calls (ms), which the large resume is judged
/// against.
async fn sequential(table: &mut Table, component: &Path, cache: &Path, runs: usize) -> f64 {
    eprintln!("bench: (4) sequential");
    const N: usize = 1000;
    let state = tempfile::tempdir().expect("a temporary state directory");
    let backend = LatencyBackend::new(Duration::from_millis(1));
    let host = durable_host(state.path(), cache, &backend);
    let factory = load(&host, component).await;
    run(&host, &factory, "sequential-agents", 10, false).await; // warm-up
    let mut agents_replay = f64::NAN;
    for (workload, what) in
        [("sequential-agents", "agent calls of 1 ms"), ("sequential-steps", "journaled steps, no agent")]
    {
        let (mut samples, mut floors) = (Vec::new(), Vec::new());
        let (mut resumes, mut resumes_cpu, mut resumes_given) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..runs.min(5) {
            let (calls, busy) = (backend.calls(), backend.busy());
            let (envelope, sample) = measure(&host, run(&host, &factory, workload, N, true)).await;
            check_done(&envelope, workload, N, true);
            let expected = if workload == "sequential-agents" { N as u64 } else { 0 };
            if backend.calls() - calls != expected {
                fail(format!("{workload}: {} backend calls, expected {expected}", backend.calls() - calls));
            }
            floors.push(ms(backend.busy() - busy));
            samples.push(sample);
            check_produced(&envelope, workload, if workload == "sequential-steps" { N } else { 0 });

            let calls = backend.calls();
            let (resumed, sample) = measure(&host, host.resume(&envelope.run_id, ResumeOptions::default())).await;
            let resumed = resumed.unwrap_or_else(|e| fail(format!("resuming the {workload} run: {e}")));
            if backend.calls() != calls {
                fail(format!(
                    "the resume of a finished {workload} run made {} backend calls; it must make 0",
                    backend.calls() - calls
                ));
            }
            check_done(&resumed, workload, N, true);
            check_produced(&resumed, workload, 0);
            if resumed.attempts != 2 || resumed.run_id != envelope.run_id {
                fail(format!("the resume of {} is not its second attempt: {resumed:?}", envelope.run_id));
            }
            resumes.push(ms(sample.wall));
            resumes_cpu.push(ms(sample.cpu));

            // Again, with the loaded component handed in (what a long-lived server can do).
            let options = ResumeOptions { component: Some(factory.clone()), ..Default::default() };
            let (resumed, sample) = measure(&host, host.resume(&envelope.run_id, options)).await;
            let resumed = resumed.unwrap_or_else(|e| fail(format!("resuming the {workload} run again: {e}")));
            if backend.calls() != calls {
                fail(format!("the second resume of a {workload} run made {} backend calls", backend.calls() - calls));
            }
            check_done(&resumed, workload, N, true);
            check_produced(&resumed, workload, 0);
            if resumed.attempts != 3 {
                fail(format!("the second resume of {} is not its third attempt: {resumed:?}", envelope.run_id));
            }
            resumes_given.push(ms(sample.wall));
        }
        let wall = median(samples.iter().map(|s| ms(s.wall)).collect());
        let cpu = median(samples.iter().map(|s| ms(s.cpu)).collect());
        let commits = median(samples.iter().map(|s| s.commits as f64).collect());
        let floor = median(floors);
        let per_call = (wall - floor) * 1e3 / N as f64;
        let name = format!("{N} sequential {what}");
        if workload == "sequential-agents" {
            let detail = format!(
                "backend floor {}; host {per_call:.0} µs per call; host CPU {}; {commits:.0} commits per 1,000 results",
                fmt_ms(floor),
                fmt_ms(cpu)
            );
            table.judged("4 sequential", name, fmt_ms(wall), detail, "< 1.3 s", wall < 1300.0);
        } else {
            let detail =
                format!("{per_call:.1} µs per step; host CPU {}; {commits:.0} commits per 1,000 steps", fmt_ms(cpu));
            table.row("4 sequential", name, fmt_ms(wall), detail);
        }
        let resume = median(resumes);
        if workload == "sequential-agents" {
            agents_replay = resume;
        }
        table.judged(
            "4 sequential",
            format!("resume of that run ({N} entries replayed)"),
            fmt_ms(resume),
            format!(
                "0 backend calls{} (checked); host CPU {}; the stored component is the one this host \
                 loaded (kept by hash, as a service resuming a run it ran); with it handed in: {}",
                if workload == "sequential-steps" { ", no step producer re-ran" } else { "" },
                fmt_ms(median(resumes_cpu)),
                fmt_ms(median(resumes_given))
            ),
            "< 10 ms",
            resume < 10.0,
        );
    }
    agents_replay
}

/// (4c) The resume of a finished run whose journal holds 100,000 entries (50,000 steps and
/// 50,000 agent calls, besides their progress entries), by a host that opened the store after
/// the run was made: judged against the resume of 1,000 agent calls (`replay_1000`, ms) of
/// the same bench, and the peak RSS of `factory resume` of it in a process of its own (this
/// process's peak, which holds what earlier rows left, is shown beside it).
async fn large_resume(table: &mut Table, component: &Path, cache: &Path, runs: usize, replay_1000: f64) {
    eprintln!("bench: (4c) resume of a 100,000-entry journal");
    const UNITS: usize = 50_000;
    const PEAK_MIB: f64 = 64.0;
    let state = tempfile::tempdir().expect("a temporary state directory");
    let backend = LatencyBackend::new(Duration::ZERO);
    let host = durable_host(state.path(), cache, &backend);
    let factory = load(&host, component).await;
    let started = Instant::now();
    let envelope = run(&host, &factory, "mixed", UNITS, true).await;
    check_done(&envelope, "mixed", UNITS, true);
    check_produced(&envelope, "mixed", UNITS);
    let made = started.elapsed();
    // Resumed as after a stop or a crash: by a host that opens the store afresh (the one that
    // made the run holds its component, its instance pool and the store's page cache full
    // of the pages it has just written).
    drop(factory);
    drop(host);
    let host = durable_host(state.path(), cache, &backend);
    let (mut walls, mut cpus, mut peaks, mut grew) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for attempt in 0..runs.min(5) {
        let calls = backend.calls();
        let (resumed, sample) = measure(&host, host.resume(&envelope.run_id, ResumeOptions::default())).await;
        let resumed = resumed.unwrap_or_else(|e| fail(format!("resuming the 100,000-entry run: {e}")));
        if backend.calls() != calls {
            fail(format!(
                "the resume of the 100,000-entry run made {} backend calls; it must make 0",
                backend.calls() - calls
            ));
        }
        check_done(&resumed, "mixed", UNITS, true);
        check_produced(&resumed, "mixed", 0);
        if resumed.attempts != attempt as u32 + 2 {
            fail(format!("the resume of {} is not attempt {}: {resumed:?}", envelope.run_id, attempt + 2));
        }
        walls.push(ms(sample.wall));
        cpus.push(ms(sample.cpu));
        peaks.push(sample.peak_rss as f64);
        grew.push(sample.peak_rss.saturating_sub(sample.rss_before) as f64);
    }
    let wall = median(walls);
    let peak = median(peaks);
    let ratio = wall / replay_1000;
    let peak_mib = peak / (1024.0 * 1024.0);
    // What a user's `factory resume` of it holds at most: the CLI as its own process, on the
    // store this host had open (closed first), with nothing of this bench's other rows in it.
    drop(host);
    let (cli_peak, cli_wall) = {
        let stderr = state.path().join("resume.stderr");
        let file = std::fs::File::create(&stderr).expect("a file for the resume's stderr");
        let cli_started = Instant::now();
        let child = factory_cmd(
            state.path(),
            cache,
            &["resume", &envelope.run_id, "--yes", "--no-daemon", "--backend", "dry-run"],
        )
        .stdout(std::process::Stdio::null())
        .stderr(file)
        .spawn()
        .unwrap_or_else(|e| fail(format!("cannot start `factory resume` ({}): {e}", env!("CARGO_BIN_EXE_factory"))));
        let (status, peak) = wait_with_peak_rss(child);
        let wall = cli_started.elapsed();
        let said = std::fs::read_to_string(&stderr).unwrap_or_default();
        // The guest fails at its end on purpose (`failAtEnd`), naming what it did: all 50,000
        // units replayed, none produced again.
        if status.code() != Some(1) || !said.contains(&format!("failAtEnd: done={UNITS} produced=0")) {
            fail(format!(
                "`factory resume` of the 100,000-entry run ended {status} without replaying it: {}",
                said.lines().rev().take(5).collect::<Vec<_>>().join(" | ")
            ));
        }
        // Its progress (stderr, a file here) is the replayed calls' one line.
        if said.lines().filter(|l| l.contains(" replayed") && !l.contains("queued")).count() > UNITS / 1000 {
            fail(format!(
                "`factory resume` of the 100,000-entry run showed its replayed calls a line each: {}",
                said.lines().take(5).collect::<Vec<_>>().join(" | ")
            ));
        }
        (peak.map(|bytes| bytes as f64 / (1024.0 * 1024.0)), ms(wall))
    };
    table.judged(
        "4 sequential",
        "resume of a run with 100,000 journaled entries (50,000 steps, 50,000 agent calls)",
        fmt_ms(wall),
        format!(
            "{ratio:.1}x the 1,000-entry replay ({}); peak RSS of `factory resume` of it (a process of its own) {}, \
             its wall {} (start, store, component and progress included); in this process {} (+{}, with what \
             earlier rows left); host CPU {}; 0 backend calls, no step producer re-ran (checked); the run itself took {}",
            fmt_ms(replay_1000),
            cli_peak.map_or("not measured (no /proc here)".to_string(), |mib| format!("{mib:.1} MiB")),
            fmt_ms(cli_wall),
            fmt_mib(peak),
            fmt_mib(median(grew)),
            fmt_ms(median(cpus)),
            fmt_ms(ms(made))
        ),
        format!("< 40x the 1,000-entry replay, peak RSS <= {PEAK_MIB:.0} MiB"),
        ratio < 40.0 && cli_peak.unwrap_or(peak_mib) <= PEAK_MIB,
    );
}

/// (4b) How soon after its `timeoutSeconds` a guest that spins without calling the host is
/// stopped (the README promises within 100 ms): wall time of the run minus the budget.
async fn timeout_enforcement(table: &mut Table, component: &Path, cache: &Path, runs: usize) {
    eprintln!("bench: (4b) timeout enforcement");
    const BUDGET: f64 = 0.2;
    let host = memory_host(Some(cache));
    let factory = load(&host, component).await;
    let mut late = Vec::new();
    for _ in 0..runs {
        let options = RunOptions {
            args: Some(json!({ "workload": "spin" })),
            limits: Limits { timeout_seconds: Some(BUDGET), ..Default::default() },
            ..Default::default()
        };
        let (envelope, sample) = measure(&host, host.run(&factory, options)).await;
        let envelope = envelope.unwrap_or_else(|e| fail(format!("the spin run was refused: {e}")));
        let kind = envelope.failure.as_ref().and_then(|f| f.kind.as_deref());
        if envelope.status != RunStatus::Error || kind != Some("timeoutSeconds") {
            fail(format!("a spinning guest was not stopped by its timeout: {envelope:?}"));
        }
        late.push(ms(sample.wall) - BUDGET * 1e3);
    }
    let late = median(late);
    table.judged(
        "4 sequential",
        format!("`timeoutSeconds` {BUDGET} s on a guest spinning without hook calls: stopped after the budget by"),
        fmt_ms(late),
        "wall of the run minus the budget (includes instantiation and the record writes); in-memory store",
        "< 100 ms",
        late < 100.0,
    );
}

/// `count` runs of the `small` workload at once, each on its own task.
async fn concurrent_runs(host: &Arc<Host>, factory: &Factory, count: usize) -> Vec<RunEnvelope> {
    spread_runs(&[(host.clone(), factory.clone())], count).await
}

/// `count` concurrent small runs started on the hosts of `hosts` in turn.
async fn spread_runs(hosts: &[(Arc<Host>, Factory)], count: usize) -> Vec<RunEnvelope> {
    let tasks: Vec<_> = (0..count)
        .map(|i| {
            let (host, factory) = hosts[i % hosts.len()].clone();
            tokio::spawn(async move { run(&host, &factory, "small", 0, false).await })
        })
        .collect();
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.unwrap_or_else(|e| fail(format!("a concurrent run panicked: {e}"))));
    }
    out
}

/// (5) 100 concurrent runs of a small factory (3 agents, a step, a log line) on one host:
/// throughput against a 0 ms backend; memory against a 50 ms backend, so that all of them
/// are alive at once.
async fn many_runs(table: &mut Table, component: &Path, cache: &Path, runs: usize) {
    eprintln!("bench: (5) many runs");
    const RUNS: usize = 100;
    let state = tempfile::tempdir().expect("a temporary state directory");
    let backend = LatencyBackend::new(Duration::ZERO);
    let host = Arc::new(durable_host(state.path(), cache, &backend));
    let factory = load(&host, component).await;
    concurrent_runs(&host, &factory, RUNS).await; // warm-up
    let mut samples = Vec::new();
    for _ in 0..runs {
        let (envelopes, sample) = measure(&host, concurrent_runs(&host, &factory, RUNS)).await;
        for envelope in &envelopes {
            check_done(envelope, "small", 3, false);
        }
        samples.push(sample);
    }
    let wall = median(samples.iter().map(|s| ms(s.wall)).collect());
    let cpu = median(samples.iter().map(|s| ms(s.cpu)).collect());
    let commits = median(samples.iter().map(|s| s.commits as f64).collect());
    table.row(
        "5 many runs",
        format!("{RUNS} concurrent runs (3 agents x 0 ms, a step, a log line), durable"),
        format!("{:.0} runs/s", RUNS as f64 / (wall / 1e3)),
        format!("{} for all {RUNS}; host CPU {}; {commits:.0} commits", fmt_ms(wall), fmt_ms(cpu)),
    );
    drop(host);

    let state = tempfile::tempdir().expect("a temporary state directory");
    let slow = LatencyBackend::new(Duration::from_millis(50));
    let host = Arc::new(durable_host(state.path(), cache, &slow));
    let factory = load(&host, component).await;
    let live = live_memory(&host, &factory, &slow, runs).await;
    table.row("5 many runs", "memory per live run", live.steady(), live.detail());
}

/// What [`live_memory`] measured: KiB per run with every run alive, and at the peak.
struct LiveMemory {
    latency: Duration,
    steady: Option<f64>,
    peak: f64,
    in_flight: f64,
}

impl LiveMemory {
    fn steady(&self) -> String {
        self.steady.map_or_else(|| "n/a".to_string(), |kib| format!("{kib:.0} KiB"))
    }

    fn detail(&self) -> String {
        format!(
            "(RSS with all {LIVE_RUNS} runs alive and their {} agents in flight − RSS before) / {LIVE_RUNS}, {} ms backend; \
             at the peak: {:.0} KiB per run ({:.0} agents in flight at most)",
            LIVE_RUNS * 3,
            self.latency.as_millis(),
            self.peak,
            self.in_flight,
        )
    }
}

const LIVE_RUNS: usize = 100;

/// Memory per live run: `LIVE_RUNS` runs of the `small` workload at once against `slow` (a
/// backend slow enough that all of them are alive together), RSS read when all their agents
/// are in flight.
async fn live_memory(host: &Arc<Host>, factory: &Factory, slow: &LatencyBackend, runs: usize) -> LiveMemory {
    concurrent_runs(host, factory, LIVE_RUNS).await; // warm-up
    let (mut peak, mut steady, mut in_flight) = (Vec::new(), Vec::new(), Vec::new());
    slow.0.full_at.store(LIVE_RUNS as u64 * 3, Ordering::SeqCst);
    for _ in 0..runs.min(5) {
        slow.0.max_in_flight.store(0, Ordering::SeqCst);
        slow.0.rss_when_full.store(0, Ordering::SeqCst);
        let (envelopes, sample) = measure(host, concurrent_runs(host, factory, LIVE_RUNS)).await;
        for envelope in &envelopes {
            check_done(envelope, "small", 3, false);
        }
        let per_run = |rss: u64| rss.saturating_sub(sample.rss_before) as f64 / LIVE_RUNS as f64 / 1024.0;
        peak.push(per_run(sample.peak_rss));
        let full = slow.0.rss_when_full.load(Ordering::SeqCst);
        if full > 0 {
            steady.push(per_run(full));
        }
        in_flight.push(slow.0.max_in_flight.load(Ordering::SeqCst) as f64);
    }
    slow.0.full_at.store(0, Ordering::SeqCst);
    LiveMemory {
        latency: slow.0.latency,
        steady: (!steady.is_empty()).then(|| median(steady)),
        peak: median(peak),
        in_flight: median(in_flight),
    }
}

// ----------------------------------------------------------------------------------------
// (6) Hostile guests: each attack of issue 10 against its bound.

/// One attack of the hostile guest (`tests/guests/hostile`): its args and the sandbox-limit
/// kind it must end with (`None`: an `invalid_call`).
struct Attack {
    name: &'static str,
    args: serde_json::Value,
    kind: Option<&'static str>,
}

fn attacks() -> Vec<Attack> {
    vec![
        Attack {
            name: "8 MiB phase title, then 200 log lines",
            args: json!({ "case": "huge-phase", "n": 8 << 20, "count": 200 }),
            kind: Some("maxPhaseBytes"),
        },
        Attack {
            name: "4 MiB agent label",
            args: json!({ "case": "huge-label", "n": 4 << 20 }),
            kind: Some("maxLabelBytes"),
        },
        Attack {
            name: "16 MiB model name",
            args: json!({ "case": "huge-model", "n": 16 << 20 }),
            kind: Some("maxModelBytes"),
        },
        Attack {
            name: "16 MiB step key",
            args: json!({ "case": "huge-key", "n": 16 << 20 }),
            kind: Some("maxStepKeyBytes"),
        },
        Attack {
            name: "100 distinct steps of 15 MiB",
            args: json!({ "case": "many-steps", "n": 15 << 20, "count": 100 }),
            kind: Some("maxJournalBytes"),
        },
        Attack {
            name: "~30 MB schema: nested anyOf, 20 levels",
            args: json!({ "case": "nested-schema", "n": 20 }),
            kind: Some("maxSchemaBytes"),
        },
        Attack {
            name: "140 KiB schema: nested anyOf, 16,383 sub-schemas",
            args: json!({ "case": "nested-schema", "n": 13 }),
            kind: None,
        },
        Attack {
            name: "result nested 126 deep (made stores unreadable before)",
            args: json!({ "case": "deep-result", "n": 126 }),
            kind: Some("maxJsonDepth"),
        },
        Attack {
            name: "10,000 pending calls of 1 MiB behind maxConcurrentSubagents 1",
            args: json!({ "case": "pending-prompts", "n": 10_000, "bytes": (1 << 20) - 64, "concurrency": 1 }),
            kind: Some("maxPendingAgentBytes"),
        },
    ]
}

/// (6) Each attack on a fresh durable host beside a well-behaved run (the bench guest's
/// `small` workload), which must complete. Judged: peak host RSS growth under 2x the guest
/// memory limit, and the disk space of the store file growing by at most the journal budget
/// (`maxJournalBytes` charges what each entry occupies in the store).
async fn hostile(table: &mut Table, guests: &Path, bench: &Path, cache: &Path) {
    eprintln!("bench: (6) hostile guests");
    let built =
        factory_host::builder::build_crate(&workspace_root().join("tests/guests/hostile"), Some(guests), &mut |m| {
            eprintln!("bench: {m}")
        })
        .unwrap_or_else(|e| fail(format!("building the hostile guest: {e}")));
    let limits = factory_host::sandbox::SandboxLimits::default();
    let rss_bound = 2 * limits.memory_bytes as u64;
    let store_bound = limits.max_journal_bytes;
    for attack in attacks() {
        let state = tempfile::tempdir().expect("a temporary state directory");
        let backend = LatencyBackend::new(Duration::from_millis(1));
        let host = durable_host(state.path(), cache, &backend);
        let hostile = load(&host, &built.component).await;
        let companion = load(&host, bench).await;
        let store_file = host.store().path().map(Path::to_path_buf).unwrap_or_else(|| fail("no store file"));
        // Disk space taken (redb extends its file sparsely, by doubling: the length runs
        // ahead of the space used).
        let size = || std::fs::metadata(&store_file).map_or(0, |m| std::os::unix::fs::MetadataExt::blocks(&m) * 512);
        let before = size();
        let concurrency = attack.args["concurrency"].as_u64().map(|n| n as u32);
        let limits = factory_host::Limits { max_concurrent_subagents: concurrency, ..Default::default() };
        let options = RunOptions { args: Some(attack.args.clone()), limits, ..Default::default() };
        let ((envelope, companion), sample) = measure(&host, async {
            tokio::join!(host.run(&hostile, options), run(&host, &companion, "small", 0, false))
        })
        .await;
        let envelope = envelope.unwrap_or_else(|e| fail(format!("the `{}` run was refused: {e}", attack.name)));
        check_done(&companion, "small", 3, false);
        let failure =
            envelope.failure.as_ref().unwrap_or_else(|| fail(format!("`{}` did not fail: {envelope:?}", attack.name)));
        let typed = match attack.kind {
            Some(kind) => {
                failure.kind_type == factory_host::FailureType::SandboxLimit && failure.kind.as_deref() == Some(kind)
            }
            None => failure.kind_type == factory_host::FailureType::InvalidCall,
        };
        if !typed {
            fail(format!(
                "`{}` ended with {failure:?}, expected {:?}",
                attack.name,
                attack.kind.unwrap_or("invalid_call")
            ));
        }
        let rss = sample.peak_rss.saturating_sub(sample.rss_before);
        let grown = size().saturating_sub(before);
        let shown = attack.kind.unwrap_or("invalid_call");
        table.judged(
            "6 hostile",
            attack.name,
            format!("RSS +{}, store +{}", fmt_mib(rss as f64), fmt_mib(grown as f64)),
            format!("ended `{shown}` in {}; the run beside it completed", fmt_ms(ms(sample.wall))),
            format!("RSS < {}, store <= {}", fmt_mib(rss_bound as f64), fmt_mib(store_bound as f64)),
            rss < rss_bound && grown <= store_bound,
        );
    }
}

// ----------------------------------------------------------------------------------------
// (7) Languages: the JS runner and a componentize-py guest against the Rust guest.

/// A factory in another language, loaded on a host: the JS runner takes the source file,
/// a Python factory is built first (`pybuild`, cached by source hash).
enum Guest {
    Rust(PathBuf),
    Js(PathBuf),
    Python(PathBuf),
}

impl Guest {
    fn name(&self) -> &'static str {
        match self {
            Guest::Rust(_) => "Rust",
            Guest::Js(_) => "JS",
            Guest::Python(_) => "Python",
        }
    }

    /// The file a host loads: the component, or the JS source itself.
    fn file(&self) -> &Path {
        match self {
            Guest::Rust(path) | Guest::Js(path) | Guest::Python(path) => path,
        }
    }
}

/// Median wall time (and host CPU, peak RSS growth) of a fan-out of `n` agents against a
/// 1 ms backend with the durable journal on.
async fn fan_out_1ms(guest: &Guest, cache: &Path, n: usize, runs: usize) -> (f64, f64, f64) {
    let state = tempfile::tempdir().expect("a temporary state directory");
    let backend = LatencyBackend::new(Duration::from_millis(1));
    let host = durable_host(state.path(), cache, &backend);
    let factory = load(&host, guest.file()).await;
    run(&host, &factory, "fanout", 10, false).await; // warm-up
    let mut samples = Vec::new();
    for _ in 0..runs {
        let calls = backend.calls();
        let (envelope, sample) = measure(&host, run(&host, &factory, "fanout", n, false)).await;
        check_done(&envelope, &format!("{} fanout", guest.name()), n, false);
        if backend.calls() - calls != n as u64 {
            fail(format!("{} fan-out of {n} made {} backend calls", guest.name(), backend.calls() - calls));
        }
        samples.push(sample);
    }
    (
        median(samples.iter().map(|s| ms(s.wall)).collect()),
        median(samples.iter().map(|s| ms(s.cpu)).collect()),
        median(samples.iter().map(|s| s.peak_rss.saturating_sub(s.rss_before) as f64).collect()),
    )
}

/// Start-up of an empty run, medians in ms.
struct StartUp {
    /// A new host without a compile cache: compile, then run.
    cold: f64,
    /// A new host with the compile cache filled: deserialize, then run.
    cached: f64,
    /// Of `cached`: `Host::new` and the load (read, sha256, deserialize, link, `meta`).
    cached_load: f64,
    /// The same host again (`InstancePre` reused).
    warm: f64,
}

/// Cold (no compile cache; at most 5 runs, 3 for a JS or Python guest, whose compile takes
/// seconds), cached and warm start-up of `guest`.
async fn guest_start_up(guest: &Guest, runs: usize) -> StartUp {
    let cache = tempfile::tempdir().expect("a temporary cache directory");
    {
        let host = memory_host(Some(cache.path()));
        load(&host, guest.file()).await; // fills the cache
    }
    let mut cold = Vec::new();
    let cold_runs = if matches!(guest, Guest::Rust(_)) { runs.min(5) } else { runs.min(3) };
    for _ in 0..cold_runs {
        let started = Instant::now();
        let host = memory_host(None);
        let factory = load(&host, guest.file()).await;
        let envelope = run(&host, &factory, "empty", 0, false).await;
        cold.push(ms(started.elapsed()));
        check_done(&envelope, "empty", 0, false);
        if factory.component.origin != CompileOrigin::Compiled {
            fail(format!("a {} load without a cache did not compile", guest.name()));
        }
    }
    let (mut cached, mut cached_load) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let started = Instant::now();
        let host = memory_host(Some(cache.path()));
        let factory = load(&host, guest.file()).await;
        let loaded = started.elapsed();
        let envelope = run(&host, &factory, "empty", 0, false).await;
        cached.push(ms(started.elapsed()));
        cached_load.push(ms(loaded));
        check_done(&envelope, "empty", 0, false);
        if factory.component.origin != CompileOrigin::Cached {
            fail(format!("a {} load with a filled cache compiled instead of deserializing", guest.name()));
        }
    }
    let host = memory_host(Some(cache.path()));
    let factory = load(&host, guest.file()).await;
    run(&host, &factory, "empty", 0, false).await; // warm-up
    let mut warm = Vec::new();
    for _ in 0..runs * 3 {
        let started = Instant::now();
        let envelope = run(&host, &factory, "empty", 0, false).await;
        warm.push(ms(started.elapsed()));
        check_done(&envelope, "empty", 0, false);
    }
    StartUp { cold: median(cold), cached: median(cached), cached_load: median(cached_load), warm: median(warm) }
}

/// (7) Start-up, a 1,000 x 1 ms fan-out (against the Rust guest, measured in the same run)
/// and memory per live run of the JS runner and of a Python (componentize-py) guest. The
/// Python rows need `componentize-py` (as `factory run x.py` does); without it they say so.
async fn languages(table: &mut Table, rust: &Path, cache: &Path, runs: usize) {
    eprintln!("bench: (7) languages");
    const SECTION: &str = "7 languages";
    const N: usize = 1000;
    // While iterating: `FACTORY_BENCH_LANGUAGES=js` measures the JS guest (and the Rust one
    // it is judged against) only; `FACTORY_BENCH_FAN_OUT_ONLY=1` measures the fan-out rows only.
    let languages: Option<Vec<String>> = std::env::var("FACTORY_BENCH_LANGUAGES")
        .ok()
        .map(|v| v.split(',').map(|s| s.trim().to_ascii_lowercase()).collect());
    let wanted = |name: &str| languages.as_ref().is_none_or(|l| l.iter().any(|w| w == name));
    let fan_out_only = std::env::var("FACTORY_BENCH_FAN_OUT_ONLY").is_ok_and(|v| v == "1");
    let mut guests = vec![Guest::Rust(rust.to_path_buf())];
    if wanted("js") {
        guests.push(Guest::Js(workspace_root().join("tests/guests/bench-js/bench.js")));
    }
    let python = workspace_root().join("tests/guests/bench-py/bench.py");
    match factory_host::pybuild::tool_version() {
        _ if !wanted("python") => {}
        Ok(version) => {
            let started = Instant::now();
            let built = factory_host::pybuild::build(&python, cache, &mut |m| eprintln!("bench: {m}"))
                .unwrap_or_else(|e| fail(format!("building {}: {e}", python.display())));
            table.row(
                SECTION,
                "Python: `factory build` (componentize-py, no build cache)",
                fmt_ms(ms(started.elapsed())),
                format!(
                    "{version}; {:.1} MiB component; once per source hash",
                    std::fs::metadata(&built.component).map_or(0.0, |m| m.len() as f64 / 1048576.0)
                ),
            );
            guests.push(Guest::Python(built.component));
        }
        Err(e) => table.row(SECTION, "Python rows", "skipped", format!("{e}")),
    }
    let mut rust_fan_out = f64::NAN;
    for guest in &guests {
        let name = guest.name();
        if !matches!(guest, Guest::Rust(_)) && !fan_out_only {
            let StartUp { cold, cached, warm, .. } = guest_start_up(guest, runs).await;
            table.row(
                SECTION,
                format!("{name}: cold start-up (new Host + compile + empty run)"),
                fmt_ms(cold),
                "no compile cache; in-memory store; median of 3",
            );
            table.row(
                SECTION,
                format!("{name}: cached start-up (new Host + deserialize + empty run)"),
                fmt_ms(cached),
                "the compile cache filled",
            );
            table.row(
                SECTION,
                format!("{name}: warm empty run (same Host)"),
                fmt_ms(warm),
                "instantiate + run + record writes",
            );
        }
        let (wall, cpu, grew) = fan_out_1ms(guest, cache, N, runs).await;
        let fan_name = format!("{name}: fan-out {N} agents x 1 ms, durable");
        let detail = format!("host CPU {}; peak RSS +{}", fmt_ms(cpu), fmt_mib(grew));
        match guest {
            Guest::Rust(_) => {
                rust_fan_out = wall;
                table.row(SECTION, fan_name, fmt_ms(wall), detail);
            }
            Guest::Js(_) => {
                let ratio = wall / rust_fan_out;
                table.judged(
                    SECTION,
                    fan_name,
                    fmt_ms(wall),
                    format!("{ratio:.2}x Rust; {detail}"),
                    "<= 1.5x Rust",
                    ratio <= 1.5,
                );
            }
            Guest::Python(_) => {
                table.row(SECTION, fan_name, fmt_ms(wall), format!("{:.2}x Rust; {detail}", wall / rust_fan_out))
            }
        }
        if fan_out_only {
            continue;
        }
        // Slow enough that the last of the runs starts before the first one's agents answer
        // (a JS or Python run takes milliseconds to instantiate).
        let state = tempfile::tempdir().expect("a temporary state directory");
        let latency = if matches!(guest, Guest::Rust(_)) { 50 } else { 2000 };
        let slow = LatencyBackend::new(Duration::from_millis(latency));
        let host = Arc::new(durable_host(state.path(), cache, &slow));
        let factory = load(&host, guest.file()).await;
        let live = live_memory(&host, &factory, &slow, runs).await;
        table.row(SECTION, format!("{name}: memory per live run"), live.steady(), live.detail());
    }
}

// ----------------------------------------------------------------------------------------
// 8. The service hop; 9. the dashboard.

/// A `factory serve` of the real binary on a state directory of its own, killed on drop.
struct Service {
    child: std::process::Child,
    state: tempfile::TempDir,
    /// Its control socket.
    remote: Remote,
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Wait for `child` to exit: its status, and its peak RSS in bytes, read from its
/// `/proc/PID/status` (`VmHWM`, which only grows) every 2 ms while it runs. Not `ru_maxrss`:
/// a child spawned with `CLONE_VM` carries this process's peak into its own at `exec`.
fn wait_with_peak_rss(mut child: std::process::Child) -> (std::process::ExitStatus, Option<u64>) {
    let path = format!("/proc/{}/status", child.id());
    let mut peak: Option<u64> = None;
    loop {
        if let Ok(status) = std::fs::read_to_string(&path) {
            let hwm = status
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:")?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok());
            if let Some(kib) = hwm {
                peak = Some(peak.unwrap_or(0).max(kib * 1024));
            }
        }
        match child.try_wait() {
            Ok(Some(status)) => return (status, peak),
            Ok(None) => std::thread::sleep(Duration::from_millis(2)),
            Err(e) => fail(format!("waiting for a child: {e}")),
        }
    }
}

/// `factory ARGS` against `state`, through the state dir's service (no `--no-daemon`), with
/// the bench's cache dir.
fn factory_cmd(state: &Path, cache: &Path, args: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_factory"));
    cmd.args(args)
        .env_remove("FACTORY_NO_DAEMON")
        .env_remove("FACTORY_CONFIG")
        .env("FACTORY_STATE_DIR", state)
        .env("FACTORY_CACHE_DIR", cache)
        .env("FACTORY_COMMIT_WINDOW_MS", "0")
        .stdin(std::process::Stdio::null());
    cmd
}

/// Start `factory serve EXTRA` on a fresh state dir and wait until its control socket
/// answers.
async fn serve(cache: &Path, extra: &[&str]) -> Service {
    let state = tempfile::tempdir().expect("a temporary state directory");
    let mut args = vec!["serve", "--backend", "dry-run"];
    args.extend_from_slice(extra);
    let child = factory_cmd(state.path(), cache, &args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| fail(format!("cannot start `factory serve` ({}): {e}", env!("CARGO_BIN_EXE_factory"))));
    let remote = Remote::new(state.path().join("control.sock"));
    let service = Service { child, state, remote };
    let client = Client::Remote(service.remote.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    while client.runs(Scope::Owner).await.is_err() {
        if Instant::now() > deadline {
            fail(format!("`factory serve` did not answer on {} within 60 s", service.remote.socket().display()));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    service
}

/// A start request for the bench guest (`workload`, `n`), consenting to exactly `key`.
fn start_request(component: &Path, key: &str, workload: &str, n: usize) -> Request {
    Request::Run {
        session: "bench".into(),
        component: Target::File(component.to_path_buf()),
        args: Some(json!({ "workload": workload, "n": n, "failAtEnd": false })),
        limits: Limits { max_total_subagents: Some(5000), ..Default::default() },
        backend: Default::default(),
        grants: Vec::new(),
        declined: false,
        consent: Consent::Sha256(key.to_string()),
        trace_parent: None,
        caller_cwd: None,
        replay: None,
        record: false,
    }
}

/// What `factory run` does through `client`: start the run, follow it to its terminal
/// envelope. The envelope and how many progress entries were handed out.
async fn start_and_follow(client: &Client, request: Request) -> (RunEnvelope, usize) {
    // As a foreground `factory run` does: started and followed on one connection.
    let mut follower = Follower::start(client.clone(), "bench", request)
        .await
        .unwrap_or_else(|e| fail(format!("a start was refused: {e}")));
    let run_id = follower.run_id().to_string();
    let mut entries = 0;
    while let Some(next) = follower.next().await {
        match next.unwrap_or_else(|e| fail(format!("following {run_id} failed: {e}"))) {
            Followed::Progress(_) => entries += 1,
            Followed::Ended(envelope) => return (envelope, entries),
        }
    }
    fail(format!("following {run_id} ended without its envelope"))
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn fmt_us(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0} µs")
    } else {
        format!("{v:.1} µs")
    }
}

/// A Unix socket in front of `service`'s control socket that counts the connections made to
/// it (each request of a [`Remote`] is one; a subscription is one for its whole life).
async fn counting_proxy(dir: &Path, service: &Remote) -> (Remote, Arc<AtomicU64>) {
    let path = dir.join("proxy.sock");
    let listener =
        tokio::net::UnixListener::bind(&path).unwrap_or_else(|e| fail(format!("binding {}: {e}", path.display())));
    let count = Arc::new(AtomicU64::new(0));
    let (counted, upstream) = (count.clone(), service.socket().to_path_buf());
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            let upstream = upstream.clone();
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::UnixStream::connect(&upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    (Remote::new(path), count)
}

/// What the service adds to a `factory run`: the same requests and the same followed runs
/// over the control socket of a real `factory serve` and through an in-process service,
/// interleaved (both durable, dry-run backend, no group-commit window).
async fn service_hop(table: &mut Table, component: &Path, cache: &Path, runs: usize) {
    const SECTION: &str = "8 service";
    let service = serve(cache, &[]).await;
    let remote = Client::Remote(service.remote.clone());
    let local_state = tempfile::tempdir().expect("a temporary state directory");
    let host = Arc::new(
        Host::new(HostConfig {
            state_dir: Some(local_state.path().to_path_buf()),
            cache_dir: Some(cache.to_path_buf()),
            commit_window: Duration::ZERO,
            backend: Arc::new(factory_host::backend::DryRun),
            ..HostConfig::default()
        })
        .unwrap_or_else(|e| fail(format!("cannot open a durable host: {e}"))),
    );
    let key = factory_host::service::trust_key(&load(&host, component).await).to_string();
    let local = Client::Local(Local::new(host, Arc::new(|_: &str| false)));
    let clients = [("in-process", &local), ("socket", &remote)];

    // Warm both (the service compiles the component once), then check a followed run ends
    // completed with every entry handed out.
    let mut finished = Vec::new();
    for (name, client) in clients {
        let (envelope, entries) = start_and_follow(client, start_request(component, &key, "fanout", 1)).await;
        check_done(&envelope, "fanout", 1, false);
        if entries == 0 {
            fail(format!("following a run {name} handed out no progress"));
        }
        finished.push(envelope.run_id.clone());
    }

    // (a) One request round trip: `envelope` of a finished run, interleaved.
    let rounds = 200 * runs;
    let (mut local_us, mut remote_us) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
    for _ in 0..rounds {
        for ((_, client), (run_id, samples)) in
            clients.iter().zip([(&finished[0], &mut local_us), (&finished[1], &mut remote_us)])
        {
            let started = Instant::now();
            client.envelope("bench", run_id).await.unwrap_or_else(|e| fail(format!("envelope of {run_id}: {e}")));
            samples.push(us(started.elapsed()));
        }
    }
    let (local_rt, remote_rt) = (median(local_us), median(remote_us));
    table.row(
        SECTION,
        "one request (`envelope` of a finished run)",
        fmt_us(remote_rt - local_rt),
        format!("socket {} vs in-process {} (median of {rounds})", fmt_us(remote_rt), fmt_us(local_rt)),
    );

    // (b) A whole tiny run started and followed to its envelope, interleaved.
    let followed_runs = 30 * runs;
    let (mut local_us, mut remote_us) = (Vec::with_capacity(followed_runs), Vec::with_capacity(followed_runs));
    for _ in 0..followed_runs {
        for ((_, client), samples) in clients.iter().zip([&mut local_us, &mut remote_us]) {
            let started = Instant::now();
            let (envelope, _) = start_and_follow(client, start_request(component, &key, "fanout", 1)).await;
            samples.push(us(started.elapsed()));
            check_done(&envelope, "fanout", 1, false);
        }
    }
    let (local_run, remote_run) = (median(local_us), median(remote_us));
    let hop = remote_run - local_run;
    // Where the hop goes: the requests one followed run makes over the socket.
    let (proxy, connections) = counting_proxy(service.state.path(), &service.remote).await;
    let proxied = Client::Remote(proxy);
    let counted_runs = 20;
    for _ in 0..counted_runs {
        let (envelope, _) = start_and_follow(&proxied, start_request(component, &key, "fanout", 1)).await;
        check_done(&envelope, "fanout", 1, false);
    }
    let per_run = connections.load(Ordering::SeqCst) as f64 / counted_runs as f64;
    table.row(
        SECTION,
        "socket vs a warm in-process `Host` (1 agent, started + followed)",
        fmt_us(hop),
        format!(
            "socket {} vs in-process {} (median of {followed_runs}; dry-run backend); {per_run:.1} connections per run \
             (one `startFollowing` stream); the in-process host has its store open and the component loaded, \
             which a `factory run` without the service must do first",
            fmt_us(remote_run),
            fmt_us(local_run)
        ),
    );

    // (c) What a user pays: the whole `factory run` command through the service against
    // the same command with `--no-daemon` (it opens the store and loads the component
    // itself), interleaved; the binary, the component and the arguments are the same.
    let alone = tempfile::tempdir().expect("a temporary state directory");
    let path = component.to_string_lossy().into_owned();
    let args = json!({ "workload": "fanout", "n": 1, "failAtEnd": false }).to_string();
    let command = |state: &Path, extra: &[&str]| {
        let mut argv = vec!["run", path.as_str(), "-q", "--yes", "--backend", "dry-run", "--args", args.as_str()];
        argv.extend_from_slice(extra);
        let mut cmd = factory_cmd(state, cache, &argv);
        cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped());
        cmd
    };
    let timed = |cmd: std::process::Command, what: &str| us(time_command(cmd, &format!("factory run ({what})")));
    // Warm both: the service has the component compiled; the `--no-daemon` one fills the cache.
    timed(command(service.state.path(), &[]), "through the service");
    timed(command(alone.path(), &["--no-daemon"]), "--no-daemon");
    let commands = 30 * runs;
    let (mut served_us, mut alone_us) = (Vec::with_capacity(commands), Vec::with_capacity(commands));
    for _ in 0..commands {
        served_us.push(timed(command(service.state.path(), &[]), "through the service"));
        alone_us.push(timed(command(alone.path(), &["--no-daemon"]), "--no-daemon"));
    }
    let (served, alone_median) = (median(served_us), median(alone_us));
    let command_hop = served - alone_median;
    table.judged(
        SECTION,
        "hop per `factory run` command (1 agent, through the service vs `--no-daemon`)",
        fmt_us(command_hop),
        format!(
            "whole process, wall: through `factory serve` {} vs `--no-daemon` {} (median of {commands}, interleaved; \
             dry-run backend, durable, no group-commit window)",
            fmt_us(served),
            fmt_us(alone_median)
        ),
        "≤ 100 µs",
        command_hop <= 100.0,
    );
    drop(service);
}

/// A real PostgreSQL 15 for section (10), started as the tests start theirs.
#[allow(dead_code)]
#[path = "../../tests/common/postgres.rs"]
mod postgres;

/// A host on worker `worker` of the PostgreSQL store at `url` (10 ms commit window).
async fn pg_host(url: &str, worker: &str, state: &Path, cache: &Path, backend: &LatencyBackend) -> Host {
    let store = factory_host::store::PgStore::connect(url, factory_host::store::PgOptions::new(worker))
        .await
        .unwrap_or_else(|e| fail(format!("cannot connect to PostgreSQL at {url}: {e}")));
    let config = HostConfig {
        state_dir: Some(state.to_path_buf()),
        cache_dir: Some(cache.to_path_buf()),
        backend: Arc::new(backend.clone()),
        ..HostConfig::default()
    };
    Host::with_store(config, Arc::new(store)).unwrap_or_else(|e| fail(format!("cannot open a host on PostgreSQL: {e}")))
}

/// The value at `percent` of sorted `values`.
fn percentile(values: &[f64], percent: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let at = ((values.len() - 1) as f64 * percent / 100.0).round() as usize;
    values[at.min(values.len() - 1)]
}

/// `writers` tasks per store of `stores` putting a step and waiting until it is durable, for
/// 3 s: every write's latency in ms (sorted), and the commits the stores made.
async fn put_to_durable(stores: Vec<Arc<dyn factory_host::store::Store>>, writers: usize) -> (Vec<f64>, u64) {
    use factory_host::store::journal::Journal;
    let commits_before: u64 = stores.iter().map(|s| s.writer_stats().commits.load(Ordering::SeqCst)).sum();
    let until = Instant::now() + Duration::from_secs(3);
    let mut tasks = Vec::new();
    for (w, store) in stores.iter().enumerate() {
        for writer in 0..writers {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut i = 0u64;
                while Instant::now() < until {
                    let started = Instant::now();
                    store
                        .put_step(&format!("latency-{w}-{writer}"), &format!("k{i}"), "{\"v\":1}", i)
                        .unwrap_or_else(|e| fail(format!("put: {e}")));
                    Journal::flush(&*store).await.unwrap_or_else(|e| fail(format!("flush: {e}")));
                    latencies.push(ms(started.elapsed()));
                    i += 1;
                }
                latencies
            }));
        }
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.unwrap_or_else(|e| fail(format!("a writer panicked: {e}"))));
    }
    latencies.sort_by(|a, b| a.total_cmp(b));
    let commits: u64 = stores.iter().map(|s| s.writer_stats().commits.load(Ordering::SeqCst)).sum();
    (latencies, commits - commits_before)
}

/// (10) The PostgreSQL store (a server this bench starts, fsync on): a 1,000-agent fan-out
/// on one worker against the same on redb; runs and agent calls per second with 1, 2 and 4
/// workers (100 concurrent small runs) and CPU per agent call; journal write latency from
/// put to durable on redb (16 writers) and with 4 PostgreSQL workers (each with 4 writers
/// putting and flushing); WAL bytes and dead tuples per agent call (from
/// `pg_current_wal_lsn` and `pg_stat_user_tables` around the fan-outs).
async fn postgres_store(table: &mut Table, component: &Path, cache: &Path, runs: usize) {
    eprintln!("bench: (10) PostgreSQL");
    let server = postgres::Postgres::start_durable();
    let url = server.database("bench");
    let backend = LatencyBackend::new(Duration::ZERO);
    const N: usize = 1000;

    // The same fan-out on redb, for the ratio.
    let redb_state = tempfile::tempdir().expect("a temporary state directory");
    let redb = durable_host(redb_state.path(), cache, &backend);
    let factory = load(&redb, component).await;
    run(&redb, &factory, "fanout", 10, false).await;
    let mut redb_walls = Vec::new();
    for _ in 0..runs {
        let (envelope, sample) = measure(&redb, run(&redb, &factory, "fanout", N, false)).await;
        check_done(&envelope, "fanout", N, false);
        redb_walls.push(ms(sample.wall));
    }
    drop(redb);
    let redb_wall = median(redb_walls);

    let state = tempfile::tempdir().expect("a temporary state directory");
    let host = Arc::new(pg_host(&url, "bench-1", state.path(), cache, &backend).await);
    let factory = load(&host, component).await;
    run(&host, &factory, "fanout", 10, false).await; // warm-up
    let stats = |sql: &str| server.psql("bench", sql);
    let wal = || stats("SELECT pg_current_wal_lsn()");
    let dead = || {
        // Other backends report their counts at most once a second.
        std::thread::sleep(Duration::from_millis(1200));
        stats("SELECT pg_stat_clear_snapshot(); SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables")
            .lines()
            .last()
            .unwrap_or("0")
            .trim()
            .parse::<f64>()
            .unwrap_or(f64::NAN)
    };
    let (mut walls, mut cpus, mut wal_bytes) = (Vec::new(), Vec::new(), Vec::new());
    let dead_before = dead();
    for _ in 0..runs {
        let lsn = wal();
        let calls = backend.calls();
        let (envelope, sample) = measure(&host, run(&host, &factory, "fanout", N, false)).await;
        check_done(&envelope, "fanout", N, false);
        if backend.calls() - calls != N as u64 {
            fail(format!("fan-out of {N} on PostgreSQL made {} backend calls", backend.calls() - calls));
        }
        let bytes =
            stats(&format!("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '{lsn}')")).parse::<f64>().unwrap_or(f64::NAN);
        wal_bytes.push(bytes / N as f64);
        walls.push(ms(sample.wall));
        cpus.push(ms(sample.cpu) * 1000.0 / N as f64);
    }
    let dead_per_call = (dead() - dead_before) / (runs * N) as f64;
    let wall = median(walls);
    let ratio = wall / redb_wall;
    table.judged(
        "10 PostgreSQL",
        "fan-out 1000 agents x 0 ms, one PostgreSQL worker",
        fmt_ms(wall),
        format!("redb {}; {ratio:.1}x redb; host CPU {:.0} us per call", fmt_ms(redb_wall), median(cpus)),
        "<= 3x redb",
        ratio <= 3.0,
    );
    table.row(
        "10 PostgreSQL",
        "WAL and dead tuples per agent call",
        format!("{:.0} B WAL", median(wal_bytes)),
        format!("{dead_per_call:.2} dead tuples per call (pg_stat_user_tables, autovacuum on)"),
    );

    // Runs and agent calls per second: 100 concurrent small runs (3 agents, a step, a log
    // line) through 1, 2 and 4 workers of the one database, each started on a worker in turn
    // (claimed there at once: each worker has room). On 2 cores this shows the cost per call
    // of more workers, not their scaling.
    const RUNS: usize = 100;
    drop(host);
    let mut workers = Vec::new();
    let mut states = Vec::new();
    for count in [1usize, 2, 4] {
        while workers.len() < count {
            let state = tempfile::tempdir().expect("a temporary state directory");
            let worker =
                Arc::new(pg_host(&url, &format!("bench-{}", workers.len() + 1), state.path(), cache, &backend).await);
            let factory = load(&worker, component).await;
            concurrent_runs(&worker, &factory, 10).await; // warm-up
            workers.push((worker, factory));
            states.push(state);
        }
        let (mut per_second, mut calls_per_second, mut cpu_per_call) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..runs {
            let calls = backend.calls();
            let (envelopes, sample) = measure(&workers[0].0, spread_runs(&workers[..count], RUNS)).await;
            for envelope in &envelopes {
                check_done(envelope, "small", 3, false);
            }
            let made = (backend.calls() - calls).max(1);
            per_second.push(RUNS as f64 / sample.wall.as_secs_f64());
            calls_per_second.push(made as f64 / sample.wall.as_secs_f64());
            cpu_per_call.push(ms(sample.cpu) * 1000.0 / made as f64);
        }
        table.row(
            "10 PostgreSQL",
            format!("runs per second, {count} PostgreSQL worker{} (100 concurrent small runs)", if count == 1 { "" } else { "s" }),
            format!("{:.0} runs/s", median(per_second)),
            format!(
                "{:.0} agent calls/s; host CPU {:.0} us per agent call, all workers (2 cores: CPU per call, not scaling)",
                median(calls_per_second),
                median(cpu_per_call)
            ),
        );
    }
    drop(workers);
    drop(states);

    // Journal write latency, put to durable: the same 4 x 4 writers on one redb store first.
    {
        let state = tempfile::tempdir().expect("a temporary state directory");
        let redb = durable_host(state.path(), cache, &backend);
        let store = redb.store().clone();
        let (latencies, commits) = put_to_durable(vec![store; 1], 16).await;
        table.row(
            "10 PostgreSQL",
            "journal write put -> durable, redb, 16 writers in one process",
            format!("p50 {}", fmt_ms(percentile(&latencies, 50.0))),
            format!(
                "p99 {}; {} writes, {commits} commits in 3 s (fsync on)",
                fmt_ms(percentile(&latencies, 99.0)),
                latencies.len()
            ),
        );
    }

    // Journal write latency, put to durable, 4 workers x 4 writers.
    const WORKERS: usize = 4;
    let mut stores: Vec<Arc<dyn factory_host::store::Store>> = Vec::new();
    for w in 0..WORKERS {
        let store =
            factory_host::store::PgStore::connect(&url, factory_host::store::PgOptions::new(format!("latency-{w}")))
                .await
                .unwrap_or_else(|e| fail(format!("cannot connect worker {w}: {e}")));
        stores.push(Arc::new(store));
    }
    let (latencies, commits) = put_to_durable(stores, 4).await;
    let p99 = percentile(&latencies, 99.0);
    table.judged(
        "10 PostgreSQL",
        "journal write put -> durable, 4 workers x 4 writers",
        format!("p50 {}", fmt_ms(percentile(&latencies, 50.0))),
        format!("p99 {}; {} writes, {commits} commits in 3 s (fsync on)", fmt_ms(p99), latencies.len()),
        "p99 < 20 ms",
        p99 < 20.0,
    );
}

/// The dashboard drawing a finished 4,096-agent run, in headless Chromium.
async fn dashboard(table: &mut Table, component: &Path, cache: &Path, runs: usize) {
    const SECTION: &str = "9 dashboard";
    let browser = workspace_root().join("tests/browser");
    if !browser.join("node_modules/playwright-core").is_dir() {
        fail(format!("{}/node_modules is missing: run `npm ci` in tests/browser", browser.display()));
    }
    if !Path::new("/usr/bin/chromium").exists() {
        fail("/usr/bin/chromium is missing: apt-get install chromium");
    }
    let service = serve(cache, &["--http", "127.0.0.1:0"]).await;
    let client = Client::Remote(service.remote.clone());
    let key = {
        let host = memory_host(Some(cache));
        factory_host::service::trust_key(&load(&host, component).await).to_string()
    };
    let run_id = client
        .start(start_request(component, &key, "fanout", 4096))
        .await
        .unwrap_or_else(|e| fail(format!("the 4,096-agent run was refused: {e}")));
    let envelope = client.wait("bench", &run_id).await.unwrap_or_else(|e| fail(format!("waiting for {run_id}: {e}")));
    check_done(&envelope, "fanout", 4096, false);
    // The HTTP API writes its address once it listens; `factory ui` prints the page's URL.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !service.state.path().join("http.addr").exists() {
        if Instant::now() > deadline {
            fail("`factory serve --http` wrote no http.addr within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let out = factory_cmd(service.state.path(), cache, &["ui", "--url"])
        .output()
        .unwrap_or_else(|e| fail(format!("`factory ui`: {e}")));
    if !out.status.success() {
        fail(format!("`factory ui` failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let url = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let out = std::process::Command::new("node")
        .arg(browser.join("render.mjs"))
        .env("FACTORY_UI_URL", &url)
        .env("FACTORY_UI_RUN", &run_id)
        .env("FACTORY_UI_TIMES", runs.to_string())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| fail(format!("node does not start ({e}): install Node.js")));
    drop(service);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        fail(format!(
            "tests/browser/render.mjs printed no report ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    });
    if report["bars"] != 4096 {
        fail(format!("the dashboard drew {} bars of 4,096 agents", report["bars"]));
    }
    let series = |field: &str| -> Vec<f64> {
        report[field].as_array().into_iter().flatten().filter_map(|v| v.as_f64()).collect()
    };
    let (render, load) = (median(series("renderMs")), median(series("loadMs")));
    table.judged(
        SECTION,
        "4,096 agents drawn (timeline of a finished run)",
        fmt_ms(render),
        format!("render only, as the page measures it; {} with loading its progress; headless Chromium", fmt_ms(load)),
        "< 1000 ms",
        render < 1000.0,
    );
}

// ----------------------------------------------------------------------------------------
// (12) Store size.

/// The replies' text: the generator `tests/store_size.rs` uses, so both measure the same
/// replies.
#[path = "../../tests/common/prose.rs"]
mod prose;

/// The seed of the replies' text generator: `tests/store_size.rs`'s, the same replies every
/// bench run.
const MARKOV_SEED: u64 = 0;

/// A backend answering call `i` of the bench's fan-out (`fan-out task {i}`) with reply `i`
/// of the given list, counting the bytes it answered.
#[derive(Clone)]
struct ProseBackend {
    replies: Arc<Vec<String>>,
    answered: Arc<AtomicU64>,
    calls: Arc<AtomicU64>,
}

impl AgentBackend for ProseBackend {
    fn name(&self) -> String {
        "bench-prose".into()
    }

    fn call(&self, request: Arc<AgentRequest>) -> BoxFuture<'static, Result<AgentReply, BackendError>> {
        let me = self.clone();
        Box::pin(async move {
            let i: Option<usize> = request.prompt.strip_prefix("fan-out task ").and_then(|i| i.parse().ok());
            let Some(reply) = i.and_then(|i| me.replies.get(i)) else {
                return Err(BackendError::ordinary(format!("no reply for the prompt {:?}", request.prompt)));
            };
            me.answered.fetch_add(reply.len() as u64, Ordering::SeqCst);
            me.calls.fetch_add(1, Ordering::SeqCst);
            Ok(AgentReply::new(reply.clone(), Some(Usage::tokens(10, 500, Some(0)))))
        })
    }
}

/// The usage of the redb store in `state`, opened again (the host that wrote it gone: the
/// store settled, its runs' rows packed and the file compacted when worthwhile).
fn settled_usage(state: &Path) -> factory_host::store::StoreUsage {
    let store = factory_host::store::RedbStore::open(state, factory_host::store::StoreOptions::default())
        .unwrap_or_else(|e| fail(format!("the store in {} does not open again: {e}", state.display())));
    store.usage().unwrap_or_else(|e| fail(format!("the store's usage: {e}")))
}

/// A fan-out of `n` agents on a durable host over `state` answered by `backend`, the host
/// dropped after it; the run's id.
async fn fan_out_run(state: &Path, cache: &Path, component: &Path, backend: Arc<dyn AgentBackend>, n: usize) -> String {
    let host = Host::new(HostConfig {
        state_dir: Some(state.to_path_buf()),
        cache_dir: Some(cache.to_path_buf()),
        backend,
        ..HostConfig::default()
    })
    .unwrap_or_else(|e| fail(format!("cannot open a durable host in {}: {e}", state.display())));
    let factory = load(&host, component).await;
    let envelope = run(&host, &factory, "fanout", n, false).await;
    check_done(&envelope, "fanout", n, false);
    envelope.run_id
}

/// LangGraph's SQLite checkpointer keeping the same fan-out of `n` calls answering `ok`
/// (`tests/compare/langgraph_size.py`, run by the workspace's `.venv/bin/python3`, where
/// `./test` installs LangGraph): its database's bytes, or why it could not be measured.
fn langgraph_bytes(n: usize) -> Result<u64, String> {
    const HINT: &str = "./test installs langgraph==1.2.24 and langgraph-checkpoint-sqlite==3.1.2 into .venv";
    let python = workspace_root().join(".venv").join("bin").join("python3");
    if !python.exists() {
        return Err(format!("{} is missing: {HINT}", python.display()));
    }
    let script = workspace_root().join("tests").join("compare").join("langgraph_size.py");
    let out = std::process::Command::new(&python)
        .arg(&script)
        .args([n.to_string(), "0".into()])
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("{} does not start ({e}): {HINT}", python.display()))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(format!("{} failed: {} ({HINT})", script.display(), stderr.trim()));
    }
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("{} printed no JSON ({e}): {}", script.display(), String::from_utf8_lossy(&out.stdout)))?;
    match (answer["calls"].as_u64(), answer["fileBytes"].as_u64()) {
        (Some(calls), Some(bytes)) if calls == n as u64 && bytes > 0 => Ok(bytes),
        _ => Err(format!("{} answered {answer}", script.display())),
    }
}

/// (12) Where a run's bytes go in a redb store (issue 54): a fan-out of 2,000 agents whose
/// replies are 2 KiB of English-like text, each different (a word-level Markov chain of
/// order 2 over the book, fixed seed), against the reply bytes once the store settled; the
/// file after removing that run; a fan-out of 1,000 agents replying `ok`, bytes per call
/// beside LangGraph's SQLite checkpointer measured here and now. Sizes, not times: one run
/// each.
async fn store_size(table: &mut Table, component: &Path, cache: &Path) {
    const SECTION: &str = "12 store size";
    const N: usize = 2000;
    const REPLY_BYTES: usize = 2048;
    const TINY: usize = 1000;
    eprintln!("bench: (12) store size");
    let markov = prose::Markov::of_book(&workspace_root()).unwrap_or_else(|e| fail(e));
    let replies: Vec<String> = (0..N as u64).map(|i| markov.reply(i, MARKOV_SEED, REPLY_BYTES)).collect();
    let distinct: std::collections::HashSet<&String> = replies.iter().collect();
    if distinct.len() != N || replies.iter().any(|r| r.len() + 4 <= REPLY_BYTES) {
        fail(format!(
            "the replies are not {N} different texts of about {REPLY_BYTES} B: {} distinct, shortest {} B",
            distinct.len(),
            replies.iter().map(String::len).min().unwrap_or(0)
        ));
    }
    let prose = ProseBackend {
        replies: Arc::new(replies),
        answered: Arc::new(AtomicU64::new(0)),
        calls: Arc::new(AtomicU64::new(0)),
    };

    // 2,000 replies of 2 KiB.
    let state = tempfile::tempdir().expect("a temporary state directory");
    let run_id = fan_out_run(state.path(), cache, component, Arc::new(prose.clone()), N).await;
    if prose.calls.load(Ordering::SeqCst) != N as u64 {
        fail(format!("the fan-out of {N} asked {} calls", prose.calls.load(Ordering::SeqCst)));
    }
    let reply_bytes = prose.answered.load(Ordering::SeqCst);
    let usage = settled_usage(state.path());
    let part = |usage: &factory_host::store::StoreUsage, prefix: &str| -> u64 {
        usage.parts().iter().filter(|p| p.part.starts_with(prefix)).map(|p| p.bytes).sum()
    };
    let ratio = usage.file_bytes as f64 / reply_bytes.max(1) as f64;
    table.judged(
        SECTION,
        format!("{N} agent calls x 2 KiB English-like replies: store file / reply bytes"),
        format!("{ratio:.2}x"),
        format!(
            "file {} B once the store settled, replies {reply_bytes} B (Markov order 2 over the book, seed \
             {MARKOV_SEED}, each different); journal values {} B, components {} B, progress {} B, free {} B",
            usage.file_bytes,
            part(&usage, "journal values"),
            part(&usage, "components"),
            part(&usage, "progress"),
            usage.free_bytes()
        ),
        "<= 0.6x",
        ratio <= 0.6,
    );

    // That run removed (as `factory rm`, the owner): its journal and its component go, the
    // file is compacted.
    let host = durable_host(state.path(), cache, &LatencyBackend::new(Duration::ZERO));
    host.remove(factory_host::Scope::Owner, &run_id)
        .await
        .unwrap_or_else(|e| fail(format!("removing the run {run_id}: {e}")));
    drop(host);
    let after = settled_usage(state.path());
    if after.table("agents").is_some_and(|t| t.entries > 0) {
        fail(format!("the removed run left agent rows: {after:?}"));
    }
    let share = after.file_bytes as f64 / usage.file_bytes.max(1) as f64;
    table.judged(
        SECTION,
        "the file after removing that run",
        format!("{:.1}%", share * 100.0),
        format!("{} B of {} B", after.file_bytes, usage.file_bytes),
        "< 10%",
        share < 0.10,
    );

    // 1,000 replies of `ok`, beside LangGraph's SQLite checkpointer.
    let state = tempfile::tempdir().expect("a temporary state directory");
    let backend = LatencyBackend::new(Duration::ZERO);
    fan_out_run(state.path(), cache, component, Arc::new(backend.clone()), TINY).await;
    if backend.calls() != TINY as u64 {
        fail(format!("the fan-out of {TINY} asked {} calls", backend.calls()));
    }
    let tiny = settled_usage(state.path());
    let ours = tiny.file_bytes as f64 / TINY as f64;
    let name = format!("{TINY} agent calls replying `ok`: bytes per call, ours / LangGraph's SQLite checkpointer");
    match langgraph_bytes(TINY) {
        Ok(theirs) => {
            let theirs = theirs as f64 / TINY as f64;
            table.judged(
                SECTION,
                name,
                format!("{:.2}x", ours / theirs),
                format!(
                    "ours {ours:.0} B a call (file {} B, components {} B), LangGraph's {theirs:.0} B a call \
                     (tests/compare/langgraph_size.py, this machine)",
                    tiny.file_bytes,
                    part(&tiny, "components")
                ),
                "<= 1.5x",
                ours / theirs <= 1.5,
            );
        }
        Err(why) => {
            eprintln!("bench: (12) LangGraph's side was not measured: {why}");
            table.judged(
                SECTION,
                name,
                "FAIL",
                format!("ours {ours:.0} B a call; LangGraph's not measured: {why}"),
                "<= 1.5x",
                false,
            );
        }
    }
}

fn main() {
    // `cargo test --all-targets` runs bench binaries too, without `--bench`: the measurements
    // are for `cargo bench` only.
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("factory bench: skipped (measure with `{COMMAND}`)");
        return;
    }
    let runs: usize = std::env::var("FACTORY_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(7).max(1);
    // `FACTORY_BENCH_SECTIONS=6,7`: only those sections.
    let sections: Option<Vec<String>> =
        std::env::var("FACTORY_BENCH_SECTIONS").ok().map(|v| v.split(',').map(|s| s.trim().to_string()).collect());
    let guests = target_dir().join("guests");
    eprintln!("bench: building tests/guests/bench into {}", guests.display());
    let built =
        factory_host::builder::build_crate(&workspace_root().join("tests/guests/bench"), Some(&guests), &mut |m| {
            eprintln!("bench: {m}")
        })
        .unwrap_or_else(|e| fail(format!("building the bench guest: {e}")));
    let component = built.component;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a tokio runtime");
    let peak_resets = reset_peak_rss();

    let mut table = Table::default();
    runtime.block_on(async {
        let cache = tempfile::tempdir().expect("a temporary cache directory");
        let wanted = |section: &str| sections.as_ref().is_none_or(|s| s.iter().any(|w| w == section));
        if wanted("1") {
            hook_overhead(&mut table, &component, cache.path(), runs).await;
        }
        if wanted("2") {
            start_up(&mut table, &component, runs).await;
            command_start_up(&mut table, &component, cache.path(), runs);
        }
        if wanted("3") {
            fan_out(&mut table, &component, cache.path(), runs).await;
        }
        if wanted("4") {
            let replay_1000 = sequential(&mut table, &component, cache.path(), runs).await;
            large_resume(&mut table, &component, cache.path(), runs, replay_1000).await;
            timeout_enforcement(&mut table, &component, cache.path(), runs).await;
        }
        if wanted("5") {
            many_runs(&mut table, &component, cache.path(), runs).await;
        }
        if wanted("6") {
            hostile(&mut table, &guests, &component, cache.path()).await;
        }
        if wanted("7") {
            languages(&mut table, &component, cache.path(), runs).await;
        }
        if wanted("8") {
            service_hop(&mut table, &component, cache.path(), runs).await;
        }
        if wanted("9") {
            dashboard(&mut table, &component, cache.path(), runs).await;
        }
        if wanted("10") {
            postgres_store(&mut table, &component, cache.path(), runs).await;
        }
        if wanted("11") {
            flow_control(&mut table, &component, cache.path(), runs).await;
        }
        if wanted("12") {
            store_size(&mut table, &component, cache.path()).await;
        }
    });

    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!();
    println!("factory benchmarks, {}", today());
    println!();
    println!("- command: `{COMMAND}`");
    println!(
        "- machine: {cores} cores ({}), Linux {}",
        cpu_model(),
        std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim()
    );
    println!(
        "- versions: factory-host {}, wasmtime {}, {}",
        env!("CARGO_PKG_VERSION"),
        locked_version("wasmtime"),
        rustc_version()
    );
    println!(
        "- method: median of {runs} runs per row (cold start, the sequential rows and memory per run: {}); durable journal \
         (redb in a temp dir, 10 ms group-commit window) except the start-up rows (in-memory store); \
         backend in-process with exact latency; free heap returned (malloc_trim) before each measured run; \
         peak RSS is the process-wide VmHWM{}",
        runs.min(5),
        if peak_resets { ", reset before each run" } else { " (not resettable here: peak since start)" }
    );
    println!();
    println!("| section | measurement | value | detail | target | result | vs 2026-12-01 |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for (row, ratio) in table.0.iter().zip(ratios_to_2026_12_01(&table.0)) {
        let verdict = match row.pass {
            Some(true) => "PASS",
            Some(false) => "MISS",
            None => "",
        };
        println!(
            "| {} | {} | {} | {} | {} | {verdict} | {ratio} |",
            row.section, row.name, row.value, row.detail, row.target
        );
    }
    let missed = table.0.iter().filter(|r| r.pass == Some(false)).count();
    let judged = table.0.iter().filter(|r| r.pass.is_some()).count();
    println!();
    println!("{} of {judged} targets met", judged - missed);
    // `-- --check`: a missed target fails the bench (for CI on a quiet machine).
    if missed > 0 && std::env::args().any(|a| a == "--check") {
        eprintln!("bench: --check: {missed} of {judged} targets missed");
        std::process::exit(1);
    }
}
