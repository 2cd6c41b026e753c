//! The web dashboard (issue 14, its UI half), in headless Chromium: `factory serve --http
//! 127.0.0.1:0` serves the page; `tests/browser/ui.mjs` (playwright-core driving Debian's
//! `/usr/bin/chromium`) opens the private sign-in file `factory ui` writes, which leads it to
//! the page with a one-time code (exchanged once for a dashboard session), watches a run with a slow
//! backend appear and update live, counts its timeline bars, cancels it and resumes it with
//! the buttons, lists a run of another session with its session and narrows the list with
//! the session filter, starts a run from the form (its approval checkbox naming the sha256),
//! signs a second page out (its session then refused), draws every bar of a 4,096-agent run (its
//! render time is the bench's, section 9), pauses a run and answers a checkpoint with the
//! buttons (`tests/browser/checkpoint.mjs`), charts a run's cost by phase and by model
//! (`tests/browser/costs.mjs`), shows the store's size by part and by table and collects
//! garbage from the Storage view (`tests/browser/storage.mjs`) and
//! writes screenshots (to `docs/screenshots/` with `FACTORY_UPDATE_SCREENSHOTS=1`). Missing node, chromium or
//! `tests/browser/node_modules` (`npm ci` there) fail the test: they are not optional.

mod common;

use common::{factory_cmd, factory_in, stderr, stdout_json};
use serde_json::Value;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};

/// A daemon serving HTTP on a free loopback port; stopped (SIGTERM) when dropped.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ =
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.0.id() as i32), nix::sys::signal::Signal::SIGTERM);
        let _ = self.0.wait();
    }
}

/// `factory serve --http 127.0.0.1:0` on `state`, once it says where it listens.
fn serve_http(state: &std::path::Path) -> Daemon {
    serve_http_with(state, &[])
}

/// [`serve_http`] with more arguments.
fn serve_http_with(state: &std::path::Path, more: &[&str]) -> Daemon {
    let mut child = factory_cmd(state, &[&["serve", "--http", "127.0.0.1:0"][..], more].concat())
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

/// The dashboard's sign-in URL `factory ui --url` prints for the service over `state`, and
/// the owner's token.
fn dashboard_url(state: &std::path::Path) -> (String, String) {
    let out = factory_in(state, &["ui", "--url"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let url = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let token = std::fs::read_to_string(state.join("http.token")).unwrap();
    (url, token.trim().to_string())
}

/// Run the browser script `script` (under tests/browser) in headless Chromium against the
/// dashboard at `url`, signed in with `token`, with `env` more: its JSON report, checked `ok`.
async fn browser_report(script: std::path::PathBuf, url: &str, token: &str, env: &[(&str, &std::ffi::OsStr)]) -> Value {
    let mut command = std::process::Command::new("node");
    command.arg(script).env("FACTORY_UI_URL", url).env("FACTORY_UI_TOKEN", token).stdin(Stdio::null());
    for (name, value) in env {
        command.env(name, value);
    }
    let out =
        tokio::task::spawn_blocking(move || command.output().expect("node runs (install Node.js)")).await.unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "the browser test printed no JSON report ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            stderr(&out)
        )
    });
    eprintln!("browser report: {report:#}");
    assert_eq!(report["ok"], true, "{report:#}\n{}", stderr(&out));
    report
}

/// `tests/browser`, once what its scripts need is there: its npm packages and Chromium
/// (missing ones fail the test with the install hint).
fn browser_dir() -> std::path::PathBuf {
    let browser_dir = common::root().join("tests").join("browser");
    assert!(
        browser_dir.join("node_modules").join("playwright-core").is_dir(),
        "tests/browser/node_modules is missing: run `npm ci` in tests/browser (./test does)"
    );
    assert!(
        std::path::Path::new("/usr/bin/chromium").exists(),
        "/usr/bin/chromium is missing: apt-get install chromium (./test does as root or with sudo)"
    );
    browser_dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_in_a_real_browser() {
    let root = common::root();
    let browser_dir = browser_dir();

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
        &[
            "run",
            "probe",
            "--args",
            r#"{"case":"fanout","n":4096}"#,
            "--backend",
            "dry-run",
            "--max-total-subagents",
            "5000",
            "--json",
            "-q",
        ],
    );
    let big = stdout_json(&out);
    assert_eq!(big["status"], "completed", "{big:#}");
    let big_id = big["runId"].as_str().unwrap().to_string();

    // A finished run of another session than the daemon's: the dashboard (the owner's view)
    // lists it with its session.
    let out = factory_in(
        state.path(),
        &[
            "--session",
            "other",
            "run",
            "probe",
            "--args",
            r#"{"case":"fanout","n":2}"#,
            "--backend",
            "dry-run",
            "--json",
            "-q",
        ],
    );
    let other = stdout_json(&out);
    assert_eq!((other["status"].as_str(), other["session"].as_str()), (Some("completed"), Some("other")), "{other:#}");
    let other_id = other["runId"].as_str().unwrap().to_string();

    // No daemon yet: `factory ui` says so.
    let out = factory_in(state.path(), &["ui", "--no-open"]);
    assert!(!out.status.success() && stderr(&out).contains("factory serve --http"), "{}", stderr(&out));

    let daemon = serve_http(state.path());
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(state.path().join("http.addr")).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);

    // `factory ui` writes a private sign-in file that sends the browser to the page's URL
    // with a one-time code (never the token) in the fragment, and prints the file's path.
    let out = factory_in(state.path(), &["ui"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let file = std::path::PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    assert!(file.is_absolute() && file.ends_with("dashboard.html"), "{}", file.display());
    let url = sign_in_url(&file);
    let token = std::fs::read_to_string(state.path().join("http.token")).unwrap();
    assert!(url.starts_with("http://127.0.0.1:") && url.contains("/#code=") && !url.contains(&token), "{url}");
    // `--url` prints a URL of its own (another code), for a browser elsewhere.
    let out = factory_in(state.path(), &["ui", "--url"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let url2 = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let code2 = url2.split_once("/#code=").map(|(_, c)| c.to_string()).unwrap_or_else(|| panic!("{url2}"));

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
    // committed ones the book shows (docs/screenshots/), so a test run changes no tracked file.
    let shots = if std::env::var_os("FACTORY_UPDATE_SCREENSHOTS").is_some() {
        root.join("docs").join("screenshots")
    } else {
        common::guest_target_dir().join("ui-screenshots")
    };
    std::fs::create_dir_all(&shots).unwrap();
    let report = browser_report(
        browser_dir.join("ui.mjs"),
        &url,
        &token,
        &[
            ("FACTORY_UI_FILE", OsStr::new(&file)),
            ("FACTORY_UI_CODE2", OsStr::new(&code2)),
            ("FACTORY_UI_BIG_RUN", OsStr::new(&big_id)),
            ("FACTORY_UI_OTHER_RUN", OsStr::new(&other_id)),
            ("FACTORY_UI_SCREENSHOTS", OsStr::new(&shots)),
        ],
    )
    .await;
    drop(daemon);
    assert_eq!(report["bigRun"]["bars"], 4096, "{report:#}");
    for shot in ["runs.png", "run.png"] {
        assert!(std::fs::metadata(shots.join(shot)).map(|m| m.len() > 1000).unwrap_or(false), "{shot} written");
    }
}

/// The URL the sign-in file `factory ui` wrote sends the browser to (its meta refresh),
/// after checking the file is the owner's alone.
fn sign_in_url(file: &std::path::Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    assert_eq!(
        (meta.mode() & 0o777, meta.uid()),
        (0o600, nix::unistd::geteuid().as_raw()),
        "the sign-in file is private"
    );
    let page = std::fs::read_to_string(file).unwrap();
    let url = page
        .split("content=\"0;url=")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("{page}"));
    url.to_string()
}

/// What an event stream sends until it holds `until` (`false`) or ends (`true`); 60 s at most.
async fn read_events(mut response: reqwest::Response, until: &str) -> (String, bool) {
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        match tokio::time::timeout_at(deadline, response.chunk()).await {
            Ok(Ok(Some(chunk))) => {
                text.push_str(&String::from_utf8_lossy(&chunk));
                if text.contains(until) {
                    return (text, false);
                }
            }
            Ok(Ok(None)) | Ok(Err(_)) => return (text, true),
            Err(_) => panic!("the event stream neither sent `{until}` nor ended in 60 s: {text}"),
        }
    }
}

/// `cmd` run as uid/gid 65534 (`nobody`) with no supplementary groups, as another local
/// user. setpriv must exist: a missing tool fails the test rather than skipping it.
fn as_nobody(program: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", program])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("setpriv (util-linux) must be installed for this test")
}

/// Issue 49, item 4: another local user cannot take the dashboard sign-in. `factory ui
/// --open` starts the browser (`$BROWSER`, here a script that records its argv and stays
/// running) on the private sign-in file, so neither the token nor the one-time code is in
/// any command line: `nobody` reads the browser's `/proc/PID/cmdline` and finds only the
/// file's path, and cannot read the file. A code that is stolen anyway (here: exchanged by
/// the test as the thief) opens a dashboard session that cannot mint codes or list or revoke
/// sessions; the owner lists it (`factory ui --sessions`) and revokes it (`--revoke ID`,
/// `--revoke all`), after which it is refused and its open event stream ends without telling
/// of a new run (the live session's stream does), while the owner's token keeps working. A code
/// is 64 hex characters (244 random bits) and works once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_user_cannot_take_the_dashboard_sign_in_and_a_stolen_session_is_revocable() {
    assert!(nix::unistd::geteuid().is_root(), "this test switches to another user and needs root (as in CI)");
    let works = as_nobody("/bin/true", &[]);
    assert!(works.status.success(), "setpriv cannot switch users: {}", stderr(&works));
    let dir = tempfile::tempdir().unwrap();
    // Only the state dir itself may stand in the other user's way; here even it is opened up
    // (by mistake): the sign-in file must stay private on its own.
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let state = dir.path().join("state");
    let _daemon = serve_http(&state);
    std::fs::set_permissions(&state, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let token = std::fs::read_to_string(state.join("http.token")).unwrap().trim().to_string();

    let argv_file = dir.path().join("browser-argv");
    let stop = dir.path().join("browser-stop");
    let browser = dir.path().join("fake-browser");
    std::fs::write(
        &browser,
        format!(
            "#!/bin/sh\n{{ echo $$; printf '%s\\n' \"$0\" \"$@\"; }} > {argv}.tmp && mv {argv}.tmp {argv}\n\
             while [ ! -e {stop} ]; do sleep 0.05; done\n",
            argv = argv_file.display(),
            stop = stop.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&browser, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = factory_cmd(&state, &["ui", "--open"]).env("BROWSER", &browser).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let file = std::path::PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !argv_file.exists() {
        assert!(std::time::Instant::now() < deadline, "the browser command never ran");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let recorded = std::fs::read_to_string(&argv_file).unwrap();
    let mut lines = recorded.lines();
    let browser_pid = lines.next().unwrap().to_string();
    let args: Vec<&str> = lines.collect();
    let file_url = format!("file://{}", file.display());
    assert_eq!(args, [browser.to_str().unwrap(), file_url.as_str()], "the browser gets the sign-in file");
    let url = sign_in_url(&file);
    let (base, code) = url.split_once("/#code=").expect("a code in the fragment");
    assert!(code.len() == 64 && code.bytes().all(|b| b.is_ascii_hexdigit()), "{code}");

    // What another user sees: the running browser's command line (the file's path only),
    // and no way into the file.
    let cmdline = as_nobody("/bin/cat", &[&format!("/proc/{browser_pid}/cmdline")]);
    assert!(cmdline.status.success(), "{}", stderr(&cmdline));
    let seen = String::from_utf8_lossy(&cmdline.stdout).replace('\0', " ");
    assert!(seen.contains("dashboard.html"), "the browser's argv as another user sees it: {seen}");
    assert!(!seen.contains(code) && !seen.contains(&token), "another user reads the code in argv: {seen}");
    let read = as_nobody("/bin/cat", &[file.to_str().unwrap()]);
    assert!(
        !read.status.success() && stderr(&read).contains("Permission denied"),
        "another user read the sign-in file"
    );
    std::fs::write(&stop, b"").unwrap();

    // A stolen code: its session drives the API but mints nothing and manages nothing.
    let client = reqwest::Client::new();
    let exchange = |code: String| {
        let request = client.post(format!("{base}/api/ui/exchange")).json(&serde_json::json!({ "code": code }));
        async move {
            let response = request.send().await.expect("the daemon answers");
            (response.status().as_u16(), response.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let call = |method: reqwest::Method, path: &str, bearer: &str| {
        let request = client.request(method, format!("{base}{path}")).bearer_auth(bearer);
        async move {
            let response = request.send().await.expect("the daemon answers");
            (response.status().as_u16(), response.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (status, first) = exchange(code.to_string()).await;
    assert_eq!(status, 200, "{first}");
    let stolen = first["token"].as_str().expect("a session token").to_string();
    assert!(stolen.len() == 64 && stolen != token, "{first}");
    assert_eq!(call(reqwest::Method::GET, "/api/runs", &stolen).await.0, 200, "the session drives the API");
    for (method, path) in [
        (reqwest::Method::POST, "/api/ui/code"),
        (reqwest::Method::GET, "/api/ui/sessions"),
        (reqwest::Method::DELETE, "/api/ui/sessions/all"),
    ] {
        let (status, refused) = call(method.clone(), path, &stolen).await;
        assert_eq!((status, refused["code"].as_str()), (403, Some("forbidden")), "{method} {path}: {refused}");
    }
    let (status, _) = exchange("0".repeat(64)).await;
    assert_eq!(status, 401, "no guess works");

    // A second session (the owner's own page, from `--url`), then the owner lists both and
    // revokes the stolen one by its id.
    let out = factory_in(&state, &["ui", "--url"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let printed = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let (_, code2) = printed.split_once("/#code=").expect("a code in the URL");
    let (status, second) = exchange(code2.to_string()).await;
    assert_eq!(status, 200, "{second}");
    let own = second["token"].as_str().expect("a session token").to_string();
    let (status, listed) = call(reqwest::Method::GET, "/api/ui/sessions", &token).await;
    assert_eq!(status, 200, "{listed}");
    let ids: Vec<String> =
        listed["sessions"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap().to_string()).collect();
    assert_eq!(ids.len(), 2, "{listed}");
    let out = factory_in(&state, &["ui", "--sessions"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let shown = String::from_utf8(out.stdout).unwrap();
    assert!(ids.iter().all(|id| shown.contains(id.as_str())) && shown.lines().count() == 2, "{shown}");
    // Both sessions follow the event stream; the stolen one is revoked (by the id listed
    // first: sessions are listed oldest first).
    let events = |bearer: &str| client.get(format!("{base}/api/events")).bearer_auth(bearer).send();
    let stolen_events = events(&stolen).await.expect("the daemon answers");
    let own_events = events(&own).await.expect("the daemon answers");
    assert_eq!((stolen_events.status().as_u16(), own_events.status().as_u16()), (200, 200));
    let out = factory_in(&state, &["ui", "--revoke", &ids[0]]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8(out.stdout).unwrap().trim(), "revoked 1 dashboard session");
    let (status, refused) = call(reqwest::Method::GET, "/api/runs", &stolen).await;
    assert_eq!(
        (status, refused["code"].as_str()),
        (401, Some("unauthorized")),
        "a revoked session is refused: {refused}"
    );
    // A run starts: the live session's stream tells of it, the revoked one's ends untold.
    let registered = client
        .post(format!("{base}/api/factories"))
        .bearer_auth(&token)
        .json(&serde_json::json!({ "meta": { "name": "tiny", "description": "returns 1" }, "run": "async (ctx) => 1" }))
        .send()
        .await
        .unwrap();
    assert_eq!(registered.status(), 200);
    let started =
        client.post(format!("{base}/api/runs")).bearer_auth(&token).json(&serde_json::json!({ "name": "tiny" })).send();
    assert_eq!(started.await.unwrap().status(), 202);
    let (own_text, _) = read_events(own_events, "run_updated").await;
    assert!(own_text.contains("run_updated"), "{own_text}");
    let (stolen_text, ended) = read_events(stolen_events, "run_updated").await;
    assert!(ended && !stolen_text.contains("run_updated"), "a revoked session's stream goes on: {stolen_text}");
    assert_eq!(call(reqwest::Method::GET, "/api/runs", &own).await.0, 200, "the other session lives on");
    let out = factory_in(&state, &["ui", "--revoke", &ids[0]]);
    assert!(!out.status.success() && stderr(&out).contains("no dashboard session"), "{}", stderr(&out));
    let out = factory_in(&state, &["ui", "--revoke", "all"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(call(reqwest::Method::GET, "/api/runs", &own).await.0, 401, "`--revoke all` ends every session");
    assert_eq!(call(reqwest::Method::GET, "/api/runs", &token).await.0, 200, "the owner's token still works");

    // Signing out ends a session; the owner's token is none.
    let out = factory_in(&state, &["ui", "--url"]);
    let printed = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let (_, code3) = printed.split_once("/#code=").expect("a code in the URL");
    let third = exchange(code3.to_string()).await.1["token"].as_str().expect("a session token").to_string();
    assert_eq!(call(reqwest::Method::POST, "/api/ui/signout", &third).await.0, 200);
    assert_eq!(call(reqwest::Method::GET, "/api/runs", &third).await.0, 401, "signed out");
    assert_eq!(call(reqwest::Method::POST, "/api/ui/signout", &token).await.0, 400);
    let (status, again) = exchange(code.to_string()).await;
    assert_eq!((status, again["code"].as_str()), (401, Some("invalid_code")), "a code works once: {again}");
}

/// A dashboard session ends by itself after `--ui-session-ttl` (12 h by default): here 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dashboard_session_expires() {
    let state = tempfile::tempdir().unwrap();
    let _daemon = serve_http_with(state.path(), &["--ui-session-ttl", "2s"]);
    let out = factory_in(state.path(), &["ui", "--url"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let printed = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let (base, code) = printed.split_once("/#code=").expect("a code in the URL");
    let client = reqwest::Client::new();
    let answer =
        client.post(format!("{base}/api/ui/exchange")).json(&serde_json::json!({ "code": code })).send().await.unwrap();
    let session = answer.json::<Value>().await.unwrap()["token"].as_str().expect("a session token").to_string();
    let runs = |bearer: String| {
        let request = client.get(format!("{base}/api/runs")).bearer_auth(bearer);
        async move { request.send().await.expect("the daemon answers").status().as_u16() }
    };
    assert_eq!(runs(session.clone()).await, 200);
    std::thread::sleep(std::time::Duration::from_secs(3));
    assert_eq!(runs(session).await, 401, "an expired session is refused");
    let out = factory_in(state.path(), &["ui", "--sessions"]);
    assert!(out.status.success() && out.stdout.is_empty(), "{}", String::from_utf8_lossy(&out.stdout));
    let token = std::fs::read_to_string(state.path().join("http.token")).unwrap();
    assert_eq!(runs(token.trim().to_string()).await, 200, "the owner's token still works");
}

/// Run `tests/browser/SCRIPT` in headless Chromium against a dashboard whose backend is a
/// fake OpenAI server paced at 2 requests a second (`probe` registered and trusted); the
/// server, and the script's report once it says `ok`.
async fn browser_against_a_paced_backend(script: &str) -> (common::fake_openai::FakeOpenAi, Value) {
    use common::fake_openai::{base_url, FakeOpenAi, Mode};
    let browser_dir = browser_dir();
    let server = FakeOpenAi::start(Mode::Answer { latency: std::time::Duration::ZERO }).await;
    let state = tempfile::tempdir().unwrap();
    let config = format!(
        "default = \"local\"\n[backends.local]\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"m-test\"\n\
         requests_per_minute = 120\n",
        base_url(server.port())
    );
    std::fs::write(state.path().join("factory.toml"), config).unwrap();
    common::register_trusted_probe(state.path());
    let daemon = serve_http(state.path());
    let (url, token) = dashboard_url(state.path());
    let script = browser_dir.join(script);
    let report = browser_report(script, &url, &token, &[]).await;
    drop(daemon);
    (server, report)
}

/// Issue 50, "visible everywhere": while a run's calls wait in its backend's flow (a backend
/// paced at 2 requests a second), its run view shows a line per flow (calls queued and in
/// flight, the limit, the rate, why they wait, 429s), read again as the queue moves, and
/// none once the run has ended (`tests/browser/flows.mjs` in headless Chromium).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_run_view_shows_how_the_runs_backend_flow_stands_while_calls_wait() {
    let (server, _) = browser_against_a_paced_backend("flows.mjs").await;
    assert_eq!(server.answered().len(), 60, "every call answered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_paused_resumed_and_its_checkpoint_answered_with_the_dashboards_buttons() {
    let (server, _) = browser_against_a_paced_backend("checkpoint.mjs").await;
    let tasks: Vec<String> = server.answered().into_iter().filter(|p| p.starts_with("task ")).collect();
    let distinct: std::collections::BTreeSet<&String> = tasks.iter().collect();
    // (A call in flight at the pause may be asked again: tests/pause.rs holds the backend to
    // prove that no call whose answer was journaled is.)
    assert_eq!(distinct.len(), 12, "every call of the paused fan-out answered: {tasks:?}");
    assert_eq!(server.answered().iter().filter(|p| *p == "plan the work").count(), 1);
}

const COSTLY_JS: &str = r#"import { defineFactory } from "factory";
export default defineFactory({
    meta: { name: "costly", description: "two phases, two models", phases: [{ title: "Plan" }, { title: "Build" }] },
    run: async (ctx) => {
        ctx.phase("Plan");
        await ctx.agent("plan it", { label: "plan", model: "big" });
        ctx.phase("Build");
        await ctx.parallel([
            () => ctx.agent("part 1", { label: "part:1", model: "small" }),
            () => ctx.agent("part 2", { label: "part:2", model: "small" }),
            () => ctx.agent("check it", { label: "check", model: "big" }),
        ]);
        return { built: true };
    },
});
"#;

/// Issue 52: a run's cost per phase and per model at a glance. A run whose agents ask for two
/// models (3 and 1 AI credits a call on a script backend) across two phases; its run view's
/// chart (`tests/browser/costs.mjs` in headless Chromium) shows the sums, largest first, adding
/// up to the run's accounting, and writes `costs.png` with the other screenshots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_run_view_charts_the_runs_cost_by_phase_and_by_model() {
    let browser_dir = browser_dir();
    let state = tempfile::tempdir().unwrap();
    let rules = state.path().join("costs.json");
    std::fs::write(
        &rules,
        r#"{"rules":[
            {"model":"big","reply":{"text":"ok"},"usage":{"inputTokens":100,"outputTokens":20,"credits":3}},
            {"model":"small","reply":{"text":"ok"},"usage":{"inputTokens":10,"outputTokens":2,"credits":1}}
        ],"fallback":"error"}"#,
    )
    .unwrap();
    let config = format!("default = \"costs\"\n[backends.costs]\nkind = \"script\"\npath = \"{}\"\n", rules.display());
    std::fs::write(state.path().join("factory.toml"), config).unwrap();
    let costly = state.path().join("costly.js");
    std::fs::write(&costly, COSTLY_JS).unwrap();
    let out = factory_in(state.path(), &["run", costly.to_str().unwrap(), "--json", "-q"]);
    let run = stdout_json(&out);
    assert_eq!(run["status"], "completed", "{run:#}");
    assert_eq!(run["accounting"]["aiCreditsNano"], 8_000_000_000u64, "{run:#}");
    let run_id = run["runId"].as_str().unwrap().to_string();

    let daemon = serve_http(state.path());
    let (url, token) = dashboard_url(state.path());
    let shots = if std::env::var_os("FACTORY_UPDATE_SCREENSHOTS").is_some() {
        common::root().join("docs").join("screenshots")
    } else {
        common::guest_target_dir().join("ui-screenshots")
    };
    std::fs::create_dir_all(&shots).unwrap();
    let script = browser_dir.join("costs.mjs");
    browser_report(
        script,
        &url,
        &token,
        &[("FACTORY_UI_COST_RUN", OsStr::new(&run_id)), ("FACTORY_UI_SCREENSHOTS", OsStr::new(&shots))],
    )
    .await;
    drop(daemon);
    assert!(std::fs::metadata(shots.join("costs.png")).map(|m| m.len() > 1000).unwrap_or(false), "costs.png written");
}

/// Issue 52: an untrusted start over the API waits for the owner's approval, and the owner
/// answers it from the dashboard (`tests/browser/approvals.mjs` in headless Chromium): the
/// pending approval shows the question's facts (the sha256 among them), Approve once starts
/// the run, which completes; Decline leaves no run and the waiting caller is told
/// `declined`. Screenshots go to the target dir's `ui-screenshots/`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_approval_is_answered_from_the_dashboard() {
    let browser_dir = browser_dir();
    // `hello` registered, never trusted.
    let state = tempfile::tempdir().unwrap();
    let hello = common::component("hello");
    let out = factory_in(state.path(), &["add", hello.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = factory_in(state.path(), &["inspect", "hello", "--json"]);
    let sha256 = stdout_json(&out)["hash"].as_str().expect("hello's sha256").to_string();
    let daemon = serve_http(state.path());
    let (url, token) = dashboard_url(state.path());
    let shots = common::guest_target_dir().join("ui-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let script = browser_dir.join("approvals.mjs");
    let report = browser_report(
        script,
        &url,
        &token,
        &[("FACTORY_UI_SHA256", OsStr::new(&sha256)), ("FACTORY_UI_SCREENSHOTS", OsStr::new(&shots))],
    )
    .await;
    // The store agrees: one run (the approved one), completed.
    let out = factory_in(state.path(), &["runs", "--all", "--json"]);
    let runs = stdout_json(&out);
    let runs = runs.as_array().cloned().unwrap_or_default();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(
        (runs[0]["runId"].as_str(), runs[0]["status"].as_str()),
        (report["approvedRun"].as_str(), Some("completed"))
    );
    drop(daemon);
    for shot in ["approval.png", "approval-declined.png"] {
        assert!(std::fs::metadata(shots.join(shot)).map(|m| m.len() > 1000).unwrap_or(false), "{shot} written");
    }
}

/// Issue 54: the store's size report in the dashboard. Three runs of `costly` in a redb
/// store; the Storage view (`tests/browser/storage.mjs` in headless Chromium) shows the file,
/// every part and every table with the figures `GET /api/stats` gives (the parts adding up to
/// the file), writes `storage.png`; its "Collect garbage" lists what a policy keeping the
/// newest run would delete (a dry run, nothing deleted), deletes exactly those on confirm,
/// and shows the store's new figures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_storage_view_shows_where_the_stores_bytes_go_and_collects_garbage() {
    let browser_dir = browser_dir();
    let state = tempfile::tempdir().unwrap();
    let rules = state.path().join("rules.json");
    std::fs::write(&rules, r#"{"rules":[],"fallback":"dry-run"}"#).unwrap();
    let config = format!("default = \"test\"\n[backends.test]\nkind = \"script\"\npath = \"{}\"\n", rules.display());
    std::fs::write(state.path().join("factory.toml"), config).unwrap();
    let costly = state.path().join("costly.js");
    std::fs::write(&costly, COSTLY_JS).unwrap();
    let mut runs = Vec::new();
    for _ in 0..3 {
        let out = factory_in(state.path(), &["run", costly.to_str().unwrap(), "--json", "-q"]);
        let run = stdout_json(&out);
        assert_eq!(run["status"], "completed", "{run:#}");
        runs.push(run["runId"].as_str().unwrap().to_string());
    }

    let daemon = serve_http(state.path());
    let (url, token) = dashboard_url(state.path());
    let shots = common::guest_target_dir().join("ui-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let script = browser_dir.join("storage.mjs");
    let runs_env = runs.join(" ");
    browser_report(
        script,
        &url,
        &token,
        &[("FACTORY_UI_RUNS", OsStr::new(&runs_env)), ("FACTORY_UI_SCREENSHOTS", OsStr::new(&shots))],
    )
    .await;
    drop(daemon);
    // The store agrees: the newest run only is left.
    let out = factory_in(state.path(), &["runs", "--all", "--json"]);
    let left: Vec<String> = stdout_json(&out)
        .as_array()
        .map(|a| a.iter().filter_map(|r| r["runId"].as_str().map(String::from)).collect())
        .unwrap_or_default();
    assert_eq!(left, runs[2..].to_vec());
    for shot in ["storage.png", "storage-gc.png"] {
        assert!(std::fs::metadata(shots.join(shot)).map(|m| m.len() > 1000).unwrap_or(false), "{shot} written");
    }
}
