//! The servers hold up against a local user who only connects (issue 20): `factory serve
//! --http` and `factory mcp --http` close a connection that does not finish its request
//! headers in time (a slowloris client, silent or trickling byte by byte) or that idles after
//! an answer, while a normal client is answered; out of file descriptors (the daemon run with
//! `ulimit -n 64`), the HTTP and control-socket accept loops neither spin nor give up, and
//! both answer again once descriptors are free; and a backend that sends an endless reply
//! body fails that call as a backend failure, past a bounded read, while a run beside it on
//! another backend completes.
//!
//! Everything is real: the `factory` binary, TCP on 127.0.0.1, the Unix control socket, an
//! HTTP server of the test's own for the endless body, `common::fake_openai` for the other.

mod common;

use common::fake_openai::{base_url, FakeOpenAi, Mode};
use common::{factory_cmd, stderr, stdout_json};
use serde_json::json;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A hang guard: far longer than any timeout the servers apply (10 s for headers).
const GUARD: Duration = Duration::from_secs(60);

/// A `factory` server process, stopped (SIGTERM) when dropped.
struct Server {
    child: Child,
    /// `127.0.0.1:PORT` it serves HTTP on.
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

/// Start `factory ARGS` on `state` (through `sh -c 'ulimit -n N; exec ...'` when `nofile`
/// is given) and wait for the stderr line holding `marker` followed by the address.
fn start(state: &Path, args: &[&str], marker: &str, nofile: Option<u32>) -> Server {
    let base = factory_cmd(state, args);
    let mut cmd = match nofile {
        None => factory_cmd(state, args),
        Some(n) => {
            // The same environment, with the descriptor limit lowered before the exec (the
            // pid stays the server's).
            let mut cmd = Command::new("sh");
            cmd.arg("-c").arg(format!("ulimit -n {n} && exec \"$0\" \"$@\"")).arg(common::factory_bin()).args(args);
            for (key, value) in base.get_envs() {
                match value {
                    Some(value) => cmd.env(key, value),
                    None => cmd.env_remove(key),
                };
            }
            cmd.stdin(Stdio::null());
            cmd
        }
    };
    let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("the factory server starts");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let mut seen = String::new();
    let addr = loop {
        let Some(Ok(line)) = lines.next() else { panic!("the server ended before saying where it listens:\n{seen}") };
        seen.push_str(&line);
        seen.push('\n');
        if let Some(rest) = line.split(marker).nth(1) {
            break rest.split('/').next().expect("an address").to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    Server { child, addr }
}

/// `factory serve --http 127.0.0.1:0`.
fn serve(state: &Path, nofile: Option<u32>) -> Server {
    start(state, &["serve", "--http", "127.0.0.1:0"], "HTTP API on http://", nofile)
}

/// `factory mcp --http 127.0.0.1:0`.
fn mcp(state: &Path) -> Server {
    start(state, &["mcp", "--http", "127.0.0.1:0"], "streamable HTTP on http://", None)
}

/// One HTTP/1.1 request on a fresh connection; the status line of the answer.
fn status_line(addr: &str, path: &str, token: &str) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(GUARD)).expect("a read timeout");
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).expect("send");
    let mut answer = String::new();
    BufReader::new(stream).read_line(&mut answer).expect("an answer within the guard");
    answer.trim().to_string()
}

/// Does the server close `stream` (EOF or reset) within [`GUARD`]? Reads and drops whatever
/// comes before.
fn closed_by_server(stream: &mut TcpStream) -> bool {
    stream.set_read_timeout(Some(GUARD)).expect("a read timeout");
    let mut sink = Vec::new();
    match stream.read_to_end(&mut sink) {
        Ok(_) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    }
}

/// The CPU time (user + system, in clock ticks) `pid` has used, from `/proc/PID/stat`.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
    // Fields after the `(comm)`, which may hold spaces: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(") ").expect("a stat line").1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
}

/// Open descriptors of `pid`.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// Slow clients on `addr`: `silent` that send nothing and `trickling` that send a request
/// head one byte every 300 ms and never finish it. Returns them and a flag that stops the
/// trickling thread.
fn slowloris(addr: &str, silent: usize, trickling: usize) -> (Vec<TcpStream>, Arc<AtomicBool>) {
    let streams: Vec<TcpStream> = (0..silent + trickling).map(|_| TcpStream::connect(addr).expect("connect")).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers: Vec<TcpStream> = streams[silent..].iter().map(|s| s.try_clone().expect("clone")).collect();
    let head: Vec<u8> = format!("GET /api/session HTTP/1.1\r\nHost: {addr}\r\nX-Slow: ").into_bytes();
    let stopped = stop.clone();
    std::thread::spawn(move || {
        let mut at = 0usize;
        while !stopped.load(Ordering::SeqCst) && !writers.is_empty() {
            let byte = [head.get(at).copied().unwrap_or(b'a')];
            writers.retain_mut(|w| w.write_all(&byte).is_ok());
            at += 1;
            std::thread::sleep(Duration::from_millis(300));
        }
    });
    (streams, stop)
}

#[test]
fn slow_clients_are_closed_after_the_header_timeout_and_do_not_stop_a_normal_client() {
    let state = tempfile::tempdir().expect("a state dir");
    for which in ["serve", "mcp"] {
        let server = if which == "serve" { serve(state.path(), None) } else { mcp(state.path()) };
        let token_file = if which == "serve" { "http.token" } else { "mcp.token" };
        let token = std::fs::read_to_string(state.path().join(token_file)).expect("the token file");
        let (mut slow, stop) = slowloris(&server.addr, 60, 60);

        // A normal client is answered while 120 slow connections are open.
        let path = if which == "serve" { "/api/session" } else { "/nope" };
        let answer = status_line(&server.addr, path, &token);
        let expected = if which == "serve" { "HTTP/1.1 200 OK" } else { "HTTP/1.1 404 Not Found" };
        assert_eq!(answer, expected, "{which}");

        // A keep-alive connection that got its answer and then idles is closed too.
        let mut idle = TcpStream::connect(&server.addr).expect("connect");
        let request = format!("GET {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {token}\r\n\r\n", server.addr);
        idle.write_all(request.as_bytes()).expect("send");

        // Every slow connection is closed by the server (none sent a whole request head).
        for (i, stream) in slow.iter_mut().enumerate() {
            assert!(closed_by_server(stream), "{which}: slow connection {i} still open after {GUARD:?}");
        }
        assert!(closed_by_server(&mut idle), "{which}: an idle keep-alive connection still open after {GUARD:?}");
        stop.store(true, Ordering::SeqCst);
        // And the server still answers.
        assert_eq!(status_line(&server.addr, path, &token), expected, "{which}");
    }
}

#[test]
fn out_of_descriptors_the_accept_loops_neither_spin_nor_stop() {
    let state = tempfile::tempdir().expect("a state dir");
    let limit = 64;
    let server = serve(state.path(), Some(limit));
    let pid = server.child.id();
    let token = std::fs::read_to_string(state.path().join("http.token")).expect("the token file");
    assert_eq!(status_line(&server.addr, "/api/session", &token), "HTTP/1.1 200 OK");

    // More connections than the server has descriptors: it accepts until EMFILE; the rest
    // wait in the listen queue, so its accept keeps failing.
    let tcp: Vec<TcpStream> = (0..2 * limit).map(|_| TcpStream::connect(&server.addr).expect("connect")).collect();
    let deadline = Instant::now() + GUARD;
    while open_fds(pid) < limit as usize {
        assert!(Instant::now() < deadline, "the server never ran out of descriptors ({} open)", open_fds(pid));
        std::thread::sleep(Duration::from_millis(20));
    }
    // The control socket's accept fails too (a connection waits for it).
    let socket = state.path().join("control.sock");
    let unix: Vec<std::os::unix::net::UnixStream> =
        (0..4).map(|_| std::os::unix::net::UnixStream::connect(&socket).expect("connect the control socket")).collect();

    // Out of descriptors, the server backs off instead of spinning: a bound on spin (a busy
    // accept loop burns a whole core, 2 s of CPU in 2 s), not a speed target.
    let before = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu_ticks(pid) - before;
    let ticks = Command::new("getconf").arg("CLK_TCK").output().expect("getconf runs");
    let ticks_per_second: u64 = String::from_utf8_lossy(&ticks.stdout).trim().parse().expect("CLK_TCK");
    assert!(used * 2 < ticks_per_second, "the exhausted server used {used} ticks of CPU in 2 s (spinning)");

    // Descriptors free again: both front doors answer.
    drop(tcp);
    drop(unix);
    let deadline = Instant::now() + GUARD;
    loop {
        let answer = status_line(&server.addr, "/api/session", &token);
        if answer == "HTTP/1.1 200 OK" {
            break;
        }
        assert!(Instant::now() < deadline, "the HTTP API never answered again: {answer}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = factory_cmd(state.path(), &["runs", "--json"]).output().expect("factory runs");
    assert!(out.status.success(), "the control socket no longer answers: {}", stderr(&out));
    assert_eq!(stdout_json(&out), json!([]));
}

/// An OpenAI-compatible endpoint whose every reply is `200` with a chunked body that never
/// ends (up to `limit` bytes, a guard on the test machine); counts the bytes it sent.
async fn endless_server(limit: u64) -> (u16, Arc<AtomicU64>) {
    use http_body_util::{BodyExt, StreamBody};
    use hyper::body::{Bytes, Frame};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1");
    let port = listener.local_addr().expect("local addr").port();
    let sent = Arc::new(AtomicU64::new(0));
    let counter = sent.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let counter = counter.clone();
            let service = hyper::service::service_fn(move |_req: hyper::Request<hyper::body::Incoming>| {
                let counter = counter.clone();
                async move {
                    let chunk = Bytes::from(vec![b'x'; 64 << 10]);
                    let frames = futures::stream::unfold(0u64, move |at| {
                        let (chunk, counter) = (chunk.clone(), counter.clone());
                        async move {
                            (at < limit).then(|| {
                                counter.fetch_add(chunk.len() as u64, Ordering::SeqCst);
                                (Ok::<_, std::convert::Infallible>(Frame::data(chunk)), at + (64 << 10))
                            })
                        }
                    });
                    let body = StreamBody::new(frames).boxed();
                    Ok::<_, std::convert::Infallible>(
                        hyper::Response::builder()
                            .header("content-type", "application/json")
                            .body(body)
                            .expect("a response"),
                    )
                }
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (port, sent)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_backend_reply_fails_that_call_and_not_the_run_beside_it() {
    let guard: u64 = 512 << 20;
    let (endless_port, sent) = endless_server(guard).await;
    let fine = FakeOpenAi::start(Mode::Answer { latency: Duration::from_millis(20) }).await;
    let state = tempfile::tempdir().expect("a state dir");
    let backend = |name: &str, port: u16| {
        format!(
            "[backends.{name}]\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"\nmax_retries = 0\n",
            base_url(port)
        )
    };
    let config = format!("{}{}", backend("endless", endless_port), backend("fine", fine.port()));
    std::fs::write(state.path().join("factory.toml"), config).expect("the config");
    common::register_trusted_probe(state.path());
    let daemon = serve(state.path(), None);
    let pid = daemon.child.id();

    // Two runs at once in the daemon: one on the endless backend, one on a normal one.
    let run = |backend: &'static str, n: usize| {
        let args = json!({"case": "fanout", "n": n}).to_string();
        let mut cmd =
            factory_cmd(state.path(), &["run", "probe", "--backend", backend, "--args", &args, "--json", "-q"]);
        tokio::task::spawn_blocking(move || cmd.output().expect("factory run"))
    };
    let (endless, beside) = (run("endless", 1), run("fine", 6));
    let endless = tokio::time::timeout(GUARD, endless).await.expect("the endless reply ends its run").expect("joined");
    let beside = tokio::time::timeout(GUARD, beside).await.expect("the run beside ends").expect("joined");

    let envelope = stdout_json(&endless);
    assert_eq!(envelope["status"], "error", "{envelope:#}");
    assert_eq!(envelope["failure"]["type"], "backend", "{envelope:#}");
    assert_eq!(envelope["failure"]["kind"], "invalid_reply", "{envelope:#}");
    assert!(envelope["failure"]["message"].as_str().unwrap_or_default().contains("larger than 16 MiB"), "{envelope:#}");
    // The host stopped reading: the server could not send its whole body.
    let sent = sent.load(Ordering::SeqCst);
    assert!(sent < guard, "the host read the whole {sent}-byte body");
    // And its memory did not hold it (the peak resident size stays far below the body).
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/PID/status");
    let peak_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    assert!(peak_kib * 1024 < guard / 2, "the daemon's peak RSS is {peak_kib} KiB");

    let done = stdout_json(&beside);
    assert_eq!(done["status"], "completed", "{done:#}\n{}", stderr(&beside));
    assert_eq!(done["result"]["done"], 6, "{done:#}");
    assert_eq!(fine.answered().len(), 6);
}
