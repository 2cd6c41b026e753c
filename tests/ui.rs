//! The web dashboard (issue 14, its UI half), in headless Chromium: `factory serve --http
//! 127.0.0.1:0` serves the page; `tests/browser/ui.mjs` (playwright-core driving Debian's
//! `/usr/bin/chromium`) opens it with the one-time code from `factory ui` (exchanged once for
//! the token), watches a run with a slow
//! backend appear and update live, counts its timeline bars, cancels it and resumes it with
//! the buttons, lists a run of another session with its session and narrows the list with
//! the session filter, starts a run from the form, draws every bar of a 4,096-agent run (its
//! render time is the bench's, section 9) and
//! writes screenshots (to `docs/screenshots/` with `FACTORY_UPDATE_SCREENSHOTS=1`). Missing node, chromium or
//! `tests/browser/node_modules` (`npm ci` there) fail the test: they are not optional.

mod common;

use common::{factory_cmd, factory_in, stderr, stdout_json};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};

/// A daemon serving HTTP on a free loopback port; stopped (SIGTERM) when dropped.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.0.id() as i32), nix::sys::signal::Signal::SIGTERM);
        let _ = self.0.wait();
    }
}

/// `factory serve --http 127.0.0.1:0` on `state`, once it says where it listens.
fn serve_http(state: &std::path::Path) -> Daemon {
    let mut child = factory_cmd(state, &["serve", "--http", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("factory serve starts");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let daemon = Daemon(child);
    loop {
        let line = lines.next().expect("serve says where it listens").unwrap();
        if line.contains("HTTP API on http://") {
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    daemon
}

const HOSTILE_JS: &str = r#"import { defineFactory } from "factory";
export default defineFactory({
    meta: {
        name: "hostile-ui",
        description: "<img src=x onerror=window.__pwned=1> writes about a topic",
        phases: [{ title: "<b>Write</b>" }, { title: "Later" }],
        argsSchema: {
            type: "object",
            required: ["topic"],
            properties: {
                topic: { type: "string", description: "what to write about" },
                count: { type: "integer" },
                loud: { type: "boolean" },
                tags: { type: "array", items: { type: "string" } },
            },
        },
    },
    run: async (ctx) => {
        ctx.phase("<b>Write</b>");
        ctx.log("<img src=x onerror=window.__pwned=1>");
        await ctx.agent("write it", { label: "<script>window.__pwned=1</script>" });
        return { topic: ctx.args.topic, count: ctx.args.count, loud: ctx.args.loud, tags: ctx.args.tags };
    },
});
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_in_a_real_browser() {
    let root = common::root();
    let browser_dir = root.join("tests").join("browser");
    assert!(
        browser_dir.join("node_modules").join("playwright-core").is_dir(),
        "tests/browser/node_modules is missing: run `npm ci` in tests/browser (./test does)"
    );
    assert!(std::path::Path::new("/usr/bin/chromium").exists(), "/usr/bin/chromium is missing: apt-get install chromium (./test does as root or with sudo)");

    // `probe` registered and trusted; a script backend whose agents take 150 ms each.
    let state = tempfile::tempdir().unwrap();
    let script = state.path().join("slow.json");
    std::fs::write(
        &script,
        r#"{"rules":[{"labelPrefix":"t:","reply":{"text":"ok"},"latencyMs":150},{"labelPrefix":"<","reply":{"text":"ok"}}]}"#,
    )
    .unwrap();
    let config = format!("default = \"slow\"\n[backends.slow]\nkind = \"script\"\npath = \"{}\"\n", script.display());
    std::fs::write(state.path().join("factory.toml"), config).unwrap();
    let probe = common::component("probe");
    for args in [["add", probe.to_str().unwrap()], ["trust", probe.to_str().unwrap()]] {
        let out = factory_in(state.path(), &args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    }

    // A JS factory with an args schema (the start form builds inputs from it) whose name-free
    // text is hostile: markup in its description, phase, log line and agent label must show
    // as text.
    let hostile = state.path().join("hostile-ui.js");
    std::fs::write(&hostile, HOSTILE_JS).unwrap();
    let out = factory_in(state.path(), &["add", hostile.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));

    // A finished 4,096-agent run (dry-run backend) for the timeline's timing check.
    let out = factory_in(
        state.path(),
        &["run", "probe", "--args", r#"{"case":"fanout","n":4096}"#, "--backend", "dry-run", "--max-total-subagents", "5000", "--json", "-q"],
    );
    let big = stdout_json(&out);
    assert_eq!(big["status"], "completed", "{big:#}");
    let big_id = big["runId"].as_str().unwrap().to_string();

    // A finished run of another session than the daemon's: the dashboard (the owner's view)
    // lists it with its session.
    let out = factory_in(
        state.path(),
        &["--session", "other", "run", "probe", "--args", r#"{"case":"fanout","n":2}"#, "--backend", "dry-run", "--json", "-q"],
    );
    let other = stdout_json(&out);
    assert_eq!((other["status"].as_str(), other["session"].as_str()), (Some("completed"), Some("other")), "{other:#}");
    let other_id = other["runId"].as_str().unwrap().to_string();

    // No daemon yet: `factory ui` says so.
    let out = factory_in(state.path(), &["ui", "--no-open"]);
    assert!(!out.status.success() && stderr(&out).contains("factory serve --http"), "{}", stderr(&out));

    let daemon = serve_http(state.path());
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(state.path().join("http.addr")).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);

    // `factory ui` prints the page's URL with a one-time code (never the token) in the fragment.
    let out = factory_in(state.path(), &["ui"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let url = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let token = std::fs::read_to_string(state.path().join("http.token")).unwrap();
    assert!(url.starts_with("http://127.0.0.1:") && url.contains("/#code=") && !url.contains(&token), "{url}");

    // The page's assets need no token, carry a CSP, and the Host check covers them too.
    let base = url.split("/#").next().unwrap().to_string();
    let page = reqwest::get(format!("{base}/")).await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.headers()["content-security-policy"].to_str().unwrap().contains("script-src 'self'"));
    let script_asset = reqwest::get(format!("{base}/ui/app.js")).await.unwrap();
    assert_eq!(script_asset.headers()["content-type"], "text/javascript; charset=utf-8");
    let rebound = reqwest::Client::new().get(format!("{base}/")).header("host", "evil.example").send().await.unwrap();
    assert_eq!(rebound.status(), 403);
    assert_eq!(reqwest::get(format!("{base}/ui/nope.js")).await.unwrap().status(), 404);

    // Screenshots go under the target dir; `FACTORY_UPDATE_SCREENSHOTS=1` refreshes the
    // committed ones the README shows (docs/screenshots/), so a test run changes no tracked file.
    let shots = if std::env::var_os("FACTORY_UPDATE_SCREENSHOTS").is_some() {
        root.join("docs").join("screenshots")
    } else {
        common::guest_target_dir().join("ui-screenshots")
    };
    std::fs::create_dir_all(&shots).unwrap();
    let out = std::process::Command::new("node")
        .arg(browser_dir.join("ui.mjs"))
        .env("FACTORY_UI_URL", &url)
        .env("FACTORY_UI_TOKEN", &token)
        .env("FACTORY_UI_BIG_RUN", &big_id)
        .env("FACTORY_UI_OTHER_RUN", &other_id)
        .env("FACTORY_UI_SCREENSHOTS", &shots)
        .stdin(Stdio::null())
        .output()
        .expect("node runs (install Node.js)");
    drop(daemon);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("the browser test printed no JSON report ({e}): {}\n{}", String::from_utf8_lossy(&out.stdout), stderr(&out))
    });
    eprintln!("browser report: {report:#}");
    assert_eq!(report["ok"], true, "{report:#}\n{}", stderr(&out));
    assert_eq!(report["bigRun"]["bars"], 4096, "{report:#}");
    for shot in ["runs.png", "run.png"] {
        assert!(std::fs::metadata(shots.join(shot)).map(|m| m.len() > 1000).unwrap_or(false), "{shot} written");
    }
}

/// `factory ui --open` hands the browser (`$BROWSER`, here a script that records its argv) a
/// one-time code and never the bearer token, which every local user could read in `ps`; the
/// code is exchanged once for a session token that drives the API, a second exchange fails
/// and ends that session (someone else saw the code).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_browser_gets_a_one_time_code_never_the_token() {
    let state = tempfile::tempdir().unwrap();
    let _daemon = serve_http(state.path());
    let argv_file = state.path().join("browser-argv");
    let browser = state.path().join("fake-browser");
    std::fs::write(&browser, format!("#!/bin/sh\nprintf '%s\\n' \"$0\" \"$@\" > {}.tmp && mv {0}.tmp {0}\n", argv_file.display()))
        .unwrap();
    std::fs::set_permissions(&browser, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = factory_cmd(state.path(), &["ui", "--open"]).env("BROWSER", &browser).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let printed = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !argv_file.exists() {
        assert!(std::time::Instant::now() < deadline, "the browser command never ran");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let argv = std::fs::read_to_string(&argv_file).unwrap();
    let token = std::fs::read_to_string(state.path().join("http.token")).unwrap();
    assert_eq!(token.trim().len(), 64);
    assert!(!argv.contains(token.trim()), "the browser's argv holds the token: {argv}");
    let args: Vec<&str> = argv.lines().collect();
    assert_eq!(args, [browser.to_str().unwrap(), printed.as_str()], "the browser gets the URL printed");
    let (base, code) = printed.split_once("/#code=").expect("a code in the fragment");
    assert!(!code.is_empty() && !printed.contains("token"), "{printed}");

    // The code is exchanged once for a session token; never twice, and no guess works.
    let client = reqwest::Client::new();
    let exchange = |code: String| {
        let request = client.post(format!("{base}/api/ui/exchange")).json(&serde_json::json!({ "code": code }));
        async move {
            let response = request.send().await.expect("the daemon answers");
            (response.status().as_u16(), response.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (status, first) = exchange(code.to_string()).await;
    assert_eq!(status, 200, "{first}");
    let session = first["token"].as_str().expect("a session token").to_string();
    assert!(session.len() == 64 && session != token.trim(), "{first}");
    let runs = |bearer: String| {
        let request = client.get(format!("{base}/api/runs")).bearer_auth(bearer);
        async move { request.send().await.expect("the daemon answers").status().as_u16() }
    };
    assert_eq!(runs(session.clone()).await, 200, "the session token drives the API");
    let (status, _) = exchange("0".repeat(32)).await;
    assert_eq!(status, 401);
    let (status, second) = exchange(code.to_string()).await;
    assert_eq!((status, second["code"].as_str()), (401, Some("invalid_code")), "{second}");
    assert_eq!(runs(session).await, 401, "a code presented twice ends the session it gave");
    assert_eq!(runs(token.trim().to_string()).await, 200, "the daemon's own token still works");
}
