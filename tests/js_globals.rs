//! The standard globals of the JS run body, in real runs of `.js` factories through the real
//! `factory` binary: `console` lines in the progress log with their level and Node's
//! `util.format` formatting; timers on the host's sleep (a timer wait is active time, a
//! pending `setInterval` does not keep a finished run alive, `Date.now()` advances by what
//! timers waited); `ctx.signal` firing its `abort` listeners when the run is cancelled or
//! stopped by a limit; `AbortController`/`AbortSignal`/`EventTarget`, `TextEncoder`/
//! `TextDecoder`, `structuredClone`, `atob`/`btoa`, `URL`/`URLSearchParams` and
//! `queueMicrotask` compared with real Node on the same checks; and a backend outage reaching
//! JS as an `AbortError` of kind `backend`.

mod common;

use common::fake_openai::{write_config, FakeOpenAi};
use common::{factory_cmd, factory_in, js_factory_file, stderr, stdout_json};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// `factory run FILE --json -q` and the envelope.
fn run(state: &Path, file: &Path, more: &[&str]) -> Value {
    let mut args = vec!["run", file.to_str().unwrap(), "--json", "-q"];
    args.extend_from_slice(more);
    let out = factory_in(state, &args);
    stdout_json(&out)
}

/// The run's log lines as (level, message); `level` absent in the JSON is `info`.
fn logs(state: &Path, run_id: &str) -> Vec<(String, String)> {
    common::progress_entries(state, run_id)
        .into_iter()
        .filter(|e| e["event"] == "log")
        .map(|e| {
            let level = e.get("level").map(|l| l.as_str().expect("a level is a string").to_string());
            (level.unwrap_or_else(|| "info".into()), e["message"].as_str().unwrap().to_string())
        })
        .collect()
}

fn run_id(envelope: &Value) -> String {
    envelope["runId"].as_str().expect("a run id").to_string()
}

fn assert_completed(envelope: &Value) -> &Value {
    assert_eq!(envelope["status"], "completed", "{envelope:#}");
    &envelope["result"]
}

#[test]
fn console_lines_reach_the_progress_log_with_their_level_formatted_like_node() {
    let state = tempfile::tempdir().unwrap();
    let file = js_factory_file(
        state.path(),
        "console",
        r#"{ name: "console", description: "d" }"#,
        r#"async (ctx) => {
            console.log("%s has %d items (%i, %f) %j %% %o", "list", 42, "3.9", "2.5", { a: [1, 2] }, "s");
            console.info({ a: 1, b: "x", c: [1, 2, { d: 3 }], e: { f: { g: { h: 1 } } } });
            console.warn("careful:", [1, , 3], new Map([["k", { v: 1 }]]), new Set(["a"]), null, undefined, 5n);
            console.error(new TypeError("boom"));
            console.debug("%O and %s", { nested: { deep: { deeper: { deepest: 1 } } } }, { toString() { return "custom"; } });
            const cycle = { name: "o" };
            cycle.self = cycle;
            console.log(cycle, "extra %s");
            ctx.log("plain ctx.log");
            return "logged";
        }"#,
    );
    let envelope = run(state.path(), &file, &[]);
    assert_eq!(assert_completed(&envelope), "logged");
    let lines = logs(state.path(), &run_id(&envelope));
    let line = |level: &str, message: &str| (level.to_string(), message.to_string());
    // What Node 20's util.format prints for the same arguments.
    assert_eq!(lines[0], line("info", "list has 42 items (3, 2.5) {\"a\":[1,2]} % 's'"));
    assert_eq!(lines[1], line("info", "{ a: 1, b: 'x', c: [ 1, 2, { d: 3 } ], e: { f: { g: [Object] } } }"));
    assert_eq!(
        lines[2],
        line("warn", "careful: [ 1, <1 empty item>, 3 ] Map(1) { 'k' => { v: 1 } } Set(1) { 'a' } null undefined 5n")
    );
    assert_eq!(lines[3].0, "error");
    assert!(lines[3].1.starts_with("TypeError: boom\n    at "), "an error prints with its stack: {:?}", lines[3].1);
    assert_eq!(lines[4], line("debug", "{ nested: { deep: { deeper: [Object] } } } and custom"));
    assert_eq!(lines[5], line("info", "<ref *1> { name: 'o', self: [Circular *1] } extra %s"));
    assert_eq!(lines[6], line("info", "plain ctx.log"));
    assert_eq!(lines.len(), 7, "{lines:?}");

    // The JSON form says `"level"` only when it is not info; `factory show` prints it.
    let entries = common::progress_entries(state.path(), &run_id(&envelope));
    let plain = entries.iter().find(|e| e["message"] == "plain ctx.log").unwrap();
    assert!(plain.get("level").is_none(), "{plain:#}");
    let out = factory_in(state.path(), &["show", &run_id(&envelope)]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(r#""level":"warn""#),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn a_console_line_over_the_line_cap_is_truncated_like_ctx_log() {
    let state = tempfile::tempdir().unwrap();
    let file = js_factory_file(
        state.path(),
        "long",
        r#"{ name: "long", description: "d" }"#,
        r#"async () => { console.warn("x".repeat(100000)); }"#,
    );
    let envelope = run(state.path(), &file, &[]);
    assert_completed(&envelope);
    let lines = logs(state.path(), &run_id(&envelope));
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0].0, "warn");
    assert!(lines[0].1.len() < 9 * 1024 && lines[0].1.ends_with(" [truncated]"), "{} bytes", lines[0].1.len());
}

#[test]
fn a_timer_wait_is_active_time_and_the_limit_fires_the_run_signal() {
    let state = tempfile::tempdir().unwrap();
    let file = js_factory_file(
        state.path(),
        "slow-timer",
        r#"{ name: "slow-timer", description: "d", limits: { timeoutSeconds: 1 } }"#,
        r#"async (ctx) => {
            ctx.signal.addEventListener("abort", () => {
                const r = ctx.signal.reason;
                console.warn(`signal aborted: ${r.name} ${r.kind} ${r.limit}`);
            });
            console.log("waiting");
            await new Promise((resolve) => setTimeout(resolve, 600000));
            return "the timer fired";
        }"#,
    );
    let envelope = run(state.path(), &file, &[]);
    assert_eq!(envelope["status"], "error", "{envelope:#}");
    assert_eq!(envelope["failure"]["type"], "factory_limit_reached", "{envelope:#}");
    assert_eq!(envelope["failure"]["kind"], "timeoutSeconds", "{envelope:#}");
    let lines = logs(state.path(), &run_id(&envelope));
    assert!(
        lines.contains(&("warn".into(), "signal aborted: AbortError factory_limit_reached timeoutSeconds".into())),
        "the abort listener ran before the hard stop: {lines:?}"
    );
}

#[test]
fn short_timers_complete_and_date_now_advances_by_what_they_waited() {
    let state = tempfile::tempdir().unwrap();
    let file = js_factory_file(
        state.path(),
        "timers",
        r#"{ name: "timers", description: "d" }"#,
        r#"async (ctx) => {
            const t0 = Date.now();
            await new Promise((resolve) => setTimeout(resolve, 30));
            const t1 = Date.now();
            await ctx.sleep(20);
            const t2 = Date.now();
            await Promise.all([ctx.sleep(5), ctx.sleep(10)]);
            return { first: t1 - t0, second: t2 - t1, third: Date.now() - t2, created: t0 };
        }"#,
    );
    let envelope = run(state.path(), &file, &[]);
    let r = assert_completed(&envelope).clone();
    assert_eq!(
        (r["first"].as_f64(), r["second"].as_f64(), r["third"].as_f64()),
        (Some(30.0), Some(20.0), Some(10.0)),
        "{r:#}"
    );
    // The clock starts at the run's creation time (a UUID v7 holds it in its first 48 bits).
    let id = run_id(&envelope).replace('-', "");
    let created = u64::from_str_radix(&id[..12], 16).unwrap();
    assert_eq!(r["created"].as_u64(), Some(created), "{r:#}");
}

#[test]
fn a_pending_interval_or_timeout_does_not_keep_a_completed_run_alive() {
    let state = tempfile::tempdir().unwrap();
    let file = js_factory_file(
        state.path(),
        "interval",
        r#"{ name: "interval", description: "d", limits: { timeoutSeconds: 60 } }"#,
        r#"async (ctx) => {
            let ticks = 0;
            await new Promise((resolve) => {
                setInterval(() => {
                    ticks++;
                    if (ticks === 3) resolve();
                }, 5);
            });
            setTimeout(() => ctx.log("never"), 3600000);
            return { ticks };
        }"#,
    );
    let envelope = run(state.path(), &file, &[]);
    // Were the run kept alive by its timers, it would end with `timeoutSeconds` instead.
    assert_eq!(assert_completed(&envelope), &json!({ "ticks": 3 }));
    let lines = logs(state.path(), &run_id(&envelope));
    assert!(!lines.iter().any(|(_, m)| m == "never"), "{lines:?}");
}

#[test]
fn an_error_thrown_in_a_timer_callback_ends_the_run_like_an_uncaught_exception() {
    let state = tempfile::tempdir().unwrap();
    let file = js_factory_file(
        state.path(),
        "uncaught",
        r#"{ name: "uncaught", description: "d" }"#,
        r#"async (ctx) => {
            setTimeout(() => { throw new RangeError("from a timer"); }, 1);
            await ctx.sleep(600000);
        }"#,
    );
    let envelope = run(state.path(), &file, &["--timeout-seconds", "60"]);
    assert_eq!(envelope["status"], "error", "{envelope:#}");
    assert_eq!(envelope["failure"]["type"], "guest_error", "{envelope:#}");
    assert!(envelope["failure"]["message"].as_str().unwrap().starts_with("RangeError: from a timer"), "{envelope:#}");
}

#[test]
fn cancelling_a_run_fires_its_abort_listeners_before_the_hard_stop() {
    let state = tempfile::tempdir().unwrap();
    let file = js_factory_file(
        state.path(),
        "cancel-me",
        r#"{ name: "cancel-me", description: "d" }"#,
        r#"async (ctx) => {
            ctx.signal.onabort = () => console.error(`onabort: ${ctx.signal.reason.kind}`);
            ctx.signal.addEventListener("abort", (e) => ctx.log(`listener: ${e.type} ${ctx.signal.aborted}`));
            const timer = new Promise((resolve) => setTimeout(() => resolve("timer fired"), 600000));
            console.log("waiting");
            try {
                await ctx.sleep(600000);
            } catch (e) {
                console.warn(`sleep rejected: ${e.name} ${e.kind}`);
                throw e;
            }
            return await timer;
        }"#,
    );
    let child = factory_cmd(state.path(), &["run", file.to_str().unwrap(), "--json", "-q"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("factory run starts");
    // Wait (from this second process) until the run logged that it is waiting.
    let deadline = Instant::now() + Duration::from_secs(120);
    let id = loop {
        let out = factory_in(state.path(), &["runs", "--json"]);
        let id = out
            .status
            .success()
            .then(|| stdout_json(&out))
            .and_then(|runs| runs[0]["runId"].as_str().map(str::to_string));
        if let Some(id) = id {
            if logs(state.path(), &id).iter().any(|(_, m)| m == "waiting") {
                break id;
            }
        }
        assert!(Instant::now() < deadline, "the run never started waiting");
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = factory_in(state.path(), &["cancel", &id, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout_json(&out)["status"], "cancelled");
    let foreground = child.wait_with_output().unwrap();
    assert_eq!(foreground.status.code(), Some(130), "{}", String::from_utf8_lossy(&foreground.stderr));

    let lines = logs(state.path(), &id);
    for expected in [
        ("error", "onabort: cancelled"),
        ("info", "listener: abort true"),
        ("warn", "sleep rejected: AbortError cancelled"),
    ] {
        assert!(lines.contains(&(expected.0.into(), expected.1.into())), "missing {expected:?} in {lines:?}");
    }
    assert!(!lines.iter().any(|(_, m)| m.contains("timer fired")), "a stopped run's timers do not fire: {lines:?}");
}

/// `node` on PATH, or a failure that says how to get it.
fn node() -> std::process::Command {
    let probe = std::process::Command::new("node").arg("--version").output();
    match probe {
        Ok(out) if out.status.success() => {}
        _ => panic!("these tests compare with real Node: install Node.js >= 20 (e.g. apt-get install nodejs) and put `node` on PATH"),
    }
    std::process::Command::new("node")
}

#[test]
fn the_standard_globals_compute_what_node_computes() {
    let dir = common::root().join("tests/guests/js-globals");
    let checks = std::fs::read_to_string(dir.join("checks.js")).unwrap();
    let out = node().arg(dir.join("run-node.mjs")).arg(dir.join("checks.js")).output().expect("node runs");
    assert!(out.status.success(), "node: {}", String::from_utf8_lossy(&out.stderr));
    let in_node: Value = serde_json::from_slice(&out.stdout).expect("node printed JSON");

    let state = tempfile::tempdir().unwrap();
    let path = state.path().join("checks.js");
    std::fs::write(
        &path,
        format!("import {{ defineFactory }} from \"factory\";\n{checks}\nexport default defineFactory({{ meta: {{ name: \"checks\", description: \"d\" }}, run: async () => checks() }});\n"),
    )
    .unwrap();
    let envelope = run(state.path(), &path, &[]);
    let in_factory = assert_completed(&envelope);
    let differing: Vec<String> = in_node
        .as_object()
        .unwrap()
        .iter()
        .filter(|(key, value)| in_factory.get(key.as_str()) != Some(*value))
        .map(|(key, value)| format!("{key}: node {value}, factory {}", in_factory[key]))
        .collect();
    assert!(differing.is_empty(), "differs from Node:\n{}", differing.join("\n"));
    assert_eq!(in_factory, &in_node);

    // A few of the values spelled out, so that this test cannot pass on a broken Node.
    assert_eq!(in_factory["clone"]["cycle"], true);
    assert_eq!(in_factory["cloneFunction"], json!(["DataCloneError", true, 25]));
    assert_eq!(in_factory["roundTrip"], true);
    assert_eq!(in_factory["btoa"][0], "aGVsbG8=");
    assert_eq!(in_factory["url"]["href"], "https://user:pw@example.com:8080/a/c/d?x=1&y=two+words#frag");
    assert_eq!(in_factory["timeout"]["name"], "TimeoutError");
    assert_eq!(in_factory["any"]["reason"], "b-reason");
}

#[test]
fn what_the_runner_does_not_do_is_refused_plainly() {
    let state = tempfile::tempdir().unwrap();
    let file = js_factory_file(
        state.path(),
        "refusals",
        r#"{ name: "refusals", description: "d" }"#,
        r#"async () => {
            const name = (f) => { try { f(); return "no error"; } catch (e) { return e.constructor.name; } };
            return {
                latin1: name(() => new TextDecoder("latin1")),
                transfer: name(() => structuredClone(new ArrayBuffer(1), { transfer: [new ArrayBuffer(1)] })),
                parse: URL.parse("nope") === null && URL.parse("https://x/y").pathname === "/y",
                timerIds: typeof setTimeout(() => {}, 1),
                badDelay: name(() => AbortSignal.timeout(-1)),
            };
        }"#,
    );
    let envelope = run(state.path(), &file, &[]);
    assert_eq!(
        assert_completed(&envelope),
        &json!({ "latin1": "RangeError", "transfer": "DOMException", "parse": true, "timerIds": "number", "badDelay": "TypeError" })
    );
}

/// The globals parsed on first use (`TextEncoder` .. `URLSearchParams`, and the formatting
/// behind `console`) behave as plain globals: present before any use, not enumerable, one
/// identity, a plain writable property once read, and an assignment before any read wins
/// (the others still load).
#[test]
fn the_globals_parsed_on_first_use_behave_as_plain_globals() {
    let state = tempfile::tempdir().unwrap();
    let file = js_factory_file(
        state.path(),
        "lazy",
        r#"{ name: "lazy", description: "d" }"#,
        r#"async () => {
            const names = ["TextEncoder", "TextDecoder", "structuredClone", "atob", "btoa", "URL", "URLSearchParams"];
            const present = names.every((n) => n in globalThis);
            const enumerable = Object.keys(globalThis).filter((k) => names.includes(k));
            TextEncoder = "replaced";
            const replaced = TextEncoder;
            const same = URL === URL && URLSearchParams === globalThis.URLSearchParams;
            const d = Object.getOwnPropertyDescriptor(globalThis, "URL");
            const shape = [typeof d.value, d.writable, d.enumerable, d.configurable, "get" in d];
            const decoded = new TextDecoder().decode(new Uint8Array([104, 105]));
            const text = `${new URL("https://example.com/a?b=1").searchParams.get("b")} ${btoa("hi")} ${atob("aGk=")}`;
            console.log("%s %o", "url", new URL("https://example.com/x"));
            return { present, enumerable, replaced, same, shape, decoded, text, clone: structuredClone({ a: [1] }) };
        }"#,
    );
    let envelope = run(state.path(), &file, &[]);
    assert_eq!(
        assert_completed(&envelope),
        &json!({
            "present": true,
            "enumerable": [],
            "replaced": "replaced",
            "same": true,
            "shape": ["function", true, false, true, false],
            "decoded": "hi",
            "text": "1 aGk= hi",
            "clone": { "a": [1] },
        })
    );
    let lines = logs(state.path(), &run_id(&envelope));
    assert!(
        lines.iter().any(|(level, m)| level == "info"
            && m.starts_with("url URL {")
            && m.contains("href: 'https://example.com/x'")),
        "{lines:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_outage_reaches_js_as_an_abort_error_of_kind_backend() {
    let state = tempfile::tempdir().unwrap();
    // Nothing listens on the port: the backend is down.
    write_config(state.path(), FakeOpenAi::free_port(), false, "");
    let file = js_factory_file(
        state.path(),
        "outage",
        r#"{ name: "outage", description: "d" }"#,
        r#"async (ctx) => {
            try {
                await ctx.agent("hello", { label: "first" });
            } catch (e) {
                console.error(`${e.name} kind=${e.kind} domexception=${e instanceof DOMException} aborted=${ctx.signal.aborted} ${e.message}`);
                throw e;
            }
            return "answered";
        }"#,
    );
    let path = file.clone();
    let state_dir = state.path().to_path_buf();
    let out = tokio::task::spawn_blocking(move || {
        factory_cmd(&state_dir, &["run", path.to_str().unwrap(), "--backend", "local", "--json", "-q"])
            .env_remove("OPENAI_API_KEY")
            .env_remove("OPENAI_BASE_URL")
            .output()
            .expect("factory runs")
    })
    .await
    .unwrap();
    let envelope = stdout_json(&out);
    assert_eq!(envelope["failure"]["type"], "backend", "{envelope:#}");
    assert_eq!(envelope["failure"]["kind"], "unavailable", "{envelope:#}");
    let lines = logs(state.path(), &run_id(&envelope));
    let line = lines.iter().find(|(level, _)| level == "error").map(|(_, m)| m.clone()).unwrap_or_default();
    assert!(
        line.starts_with(
            "AbortError kind=backend domexception=true aborted=true the agent backend could not be used: unavailable: "
        ),
        "{lines:?}"
    );
}
