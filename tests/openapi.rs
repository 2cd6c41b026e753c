//! The HTTP API's OpenAPI document (issue 53): `factory serve --http 127.0.0.1:0` serves it
//! at `GET /api/openapi.json`; every route it lists answers (called for real, with the
//! token where one is needed: never 404 or 405), every other method on those paths is
//! refused with 405 and other paths with 404, so what the router serves and what the
//! document lists are the same; and the book's command that fetches it works as written.

mod common;

use common::factory_cmd;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};

/// A daemon serving HTTP on a free loopback port; stopped (SIGTERM) when dropped.
struct Daemon {
    child: Child,
    base: String,
    token: String,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

fn start(state: &Path) -> Daemon {
    let mut child = factory_cmd(state, &["serve", "--http", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("factory serve starts");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let base = loop {
        let line = lines.next().expect("serve says where it listens").expect("a line");
        if let Some(rest) = line.split("HTTP API on http://").nth(1) {
            break format!("http://{}", rest.split("/api/").next().unwrap_or_default());
        }
    };
    std::thread::spawn(move || for _ in lines {});
    let token = std::fs::read_to_string(state.join("http.token")).expect("the token file");
    Daemon { child, base, token }
}

/// Whether `path` is an instance of the document's path `template` (`{name}`: one segment).
fn matches_template(template: &str, path: &str) -> bool {
    let (want, have): (Vec<&str>, Vec<&str>) = (template.split('/').collect(), path.split('/').collect());
    want.len() == have.len()
        && want.iter().zip(&have).all(|(w, h)| w == h || (w.starts_with('{') && w.ends_with('}') && !h.is_empty()))
}

/// `tests/openapi/validate.py`'s verdict on `cases` (`{where, schema, instance}`) against
/// the document `doc`.
fn validate(doc: &Value, cases: &[Value]) -> std::process::Output {
    let file = tempfile::NamedTempFile::new().expect("a scratch file");
    serde_json::to_writer(&file, &json!({ "document": doc, "cases": cases })).expect("the cases written");
    std::process::Command::new("python3")
        .arg(common::root().join("tests/openapi/validate.py"))
        .arg(file.path())
        .output()
        .expect("python3 runs")
}

/// The methods probed on every path.
const METHODS: [&str; 5] = ["GET", "POST", "PUT", "PATCH", "DELETE"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_lists_exactly_the_routes_served_and_each_answers() {
    let state = common::slow_probe_state(30);
    let daemon = start(state.path());
    let client = reqwest::Client::new();
    let url = format!("{}/api/openapi.json", daemon.base);

    // Like every `/api` call, the document needs the token.
    assert_eq!(client.get(&url).send().await.expect("an answer").status(), 401);
    let response = client.get(&url).bearer_auth(&daemon.token).send().await.expect("an answer");
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/json");
    let doc: Value = response.json().await.expect("the document is JSON");
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().expect("paths");
    assert!(paths.len() >= 20, "{paths:#?}");

    // A run to read and control: started over the API, then cancelled so that waiting on it
    // answers at once.
    let started: Value = client
        .post(format!("{}/api/runs", daemon.base))
        .bearer_auth(&daemon.token)
        .json(&json!({ "name": "probe", "args": { "case": "fanout", "n": 200 }, "limits": { "maxConcurrentSubagents": 1 } }))
        .send()
        .await
        .expect("an answer")
        .json()
        .await
        .expect("JSON");
    let run_id = started["runId"].as_str().unwrap_or_else(|| panic!("a run id: {started}")).to_string();
    let cancelled = client
        .post(format!("{}/api/runs/{run_id}/cancel", daemon.base))
        .bearer_auth(&daemon.token)
        .send()
        .await
        .expect("an answer");
    assert_eq!(cancelled.status(), 200);

    // Two pending approvals to read and answer: `hello` registered over the API is not
    // trusted, so starting it with consent `ask` (the default) and no wait holds it.
    let hello = common::component("hello");
    let registered = client
        .post(format!("{}/api/factories", daemon.base))
        .bearer_auth(&daemon.token)
        .json(&json!({ "path": hello }))
        .send()
        .await
        .expect("an answer");
    assert_eq!(registered.status(), 200, "{}", registered.text().await.unwrap_or_default());
    let mut pending = Vec::new();
    for _ in 0..2 {
        let held: Value = client
            .post(format!("{}/api/runs", daemon.base))
            .bearer_auth(&daemon.token)
            .json(&json!({ "name": "hello", "approvalWaitSeconds": 0 }))
            .send()
            .await
            .expect("an answer")
            .json()
            .await
            .expect("JSON");
        assert_eq!(held["status"], "pending_approval", "{held}");
        pending.push(held["approvalId"].as_str().unwrap_or_else(|| panic!("an approval id: {held}")).to_string());
    }

    // Every operation listed, called for real; what changes a run comes last (resume, then
    // delete), so the reads see it.
    let mut operations: Vec<(String, String, Value)> = paths
        .iter()
        .flat_map(|(path, item)| {
            let item = item.as_object().expect("a path item");
            item.iter().map(move |(method, op)| (path.clone(), method.to_uppercase(), op.clone()))
        })
        .collect();
    let rank = |(path, method, _): &(String, String, Value)| match (path.as_str(), method.as_str()) {
        ("/api/runs/{id}/resume", _) => 1,
        ("/api/runs/{id}", "DELETE") => 2,
        _ => 0,
    };
    operations.sort_by_key(rank);
    let probe = common::component("probe");
    let mut answers = Vec::new();
    for (path, method, operation) in &operations {
        let id = match path.as_str() {
            p if p.starts_with("/api/ui/") => "all",
            "/api/approvals/{id}/decline" => &pending[1],
            p if p.starts_with("/api/approvals/") => &pending[0],
            _ => &run_id,
        };
        let concrete = path.replace("{id}", id).replace("{name}", "probe");
        let body = match operation["operationId"].as_str() {
            Some("start") => Some(json!({ "name": "probe", "args": { "case": "fanout", "n": 1 } })),
            Some("resume") => Some(json!({})),
            Some("register") => Some(json!({ "path": probe })),
            Some("uiexchange") => Some(json!({ "code": "0".repeat(64) })),
            Some("gc") => Some(json!({ "keepLast": 0, "dryRun": true })),
            _ => None,
        };
        let public = operation["security"] == json!([]);
        let mut request = client.request(method.parse().expect("a method"), format!("{}{concrete}", daemon.base));
        if !public {
            request = request.bearer_auth(&daemon.token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap_or_else(|e| panic!("{method} {concrete}: {e}"));
        let status = response.status().as_u16();
        assert!(status != 404 && status != 405, "{method} {concrete} is listed but answers {status}");
        // A success is the one the document promises, in its media type.
        if (200..300).contains(&status) {
            let documented = &operation["responses"][status.to_string()]["content"];
            let media = documented.as_object().and_then(|m| m.keys().next().cloned());
            let media = media.unwrap_or_else(|| panic!("{method} {path}: {status} is not documented: {operation:#}"));
            let got = response.headers()["content-type"].to_str().expect("a content type").to_string();
            assert_eq!(got, media, "{method} {concrete}");
            if got == "application/json" {
                let schema = documented[&got]["schema"].clone();
                let text = response.text().await.expect("the answer");
                let instance: Value =
                    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{method} {concrete}: {e}"));
                answers.push(
                    json!({ "where": format!("{method} {path} ({status})"), "schema": schema, "instance": instance }),
                );
            }
        }
        if !public {
            // Without the token, no listed API route answers.
            let bare = client.request(method.parse().expect("a method"), format!("{}{concrete}", daemon.base));
            let status = bare.send().await.expect("an answer").status().as_u16();
            assert_eq!(status, 401, "{method} {concrete} without a token");
        }
    }

    // Nothing else is served: every other method on a listed path is 405, other paths 404.
    for path in paths.keys() {
        let concrete = path.replace("{id}", &run_id).replace("{name}", "probe");
        for method in METHODS {
            // Listed here, or under a template this path also matches (`DELETE
            // /api/runs/page` is `DELETE /api/runs/{id}` of a run named `page`).
            let listed_elsewhere = paths
                .iter()
                .any(|(other, item)| item.get(method.to_lowercase()).is_some() && matches_template(other, &concrete));
            if listed_elsewhere {
                continue;
            }
            let response = client
                .request(method.parse().expect("a method"), format!("{}{concrete}", daemon.base))
                .bearer_auth(&daemon.token)
                .send()
                .await
                .expect("an answer");
            assert_eq!(response.status(), 405, "{method} {concrete} is served but not listed");
        }
    }
    for path in ["/api/nope", "/api/runs/x/nope", "/api/ui/nope", "/nope", "/ui/nope.js", "/api/runs/x/cancel/x"] {
        for method in METHODS {
            let response = client
                .request(method.parse().expect("a method"), format!("{}{path}", daemon.base))
                .bearer_auth(&daemon.token)
                .send()
                .await
                .expect("an answer");
            assert_eq!(response.status(), 404, "{method} {path} is served but not listed");
        }
    }

    // Each JSON answer is what the document says it is, field for field: checked by the
    // `jsonschema` package's Draft 2020-12 validator, no undocumented property allowed.
    assert!(answers.len() >= 20, "{} JSON answers", answers.len());
    let out = validate(&doc, &answers);
    assert!(
        out.status.success(),
        "answers that are not what the document says (is `jsonschema` installed? ./test installs mcp, which brings \
         it, into .venv):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        common::stderr(&out)
    );

    // The check can fail: the run's detail with one field the document does not list, and
    // with a progress entry's field of the wrong type, are refused.
    let detail = answers
        .iter()
        .find(|a| a["where"].as_str().is_some_and(|w| w.starts_with("GET /api/runs/{id} ")))
        .expect("the detail was checked")
        .clone();
    let mut unlisted = detail.clone();
    unlisted["instance"]["bogus"] = json!(1);
    let mut mistyped = detail;
    mistyped["instance"]["progress"][0]["seq"] = json!("one");
    for (case, expected) in [(unlisted, "bogus"), (mistyped, "'one' is not of type 'integer'")] {
        let out = validate(&doc, &[case]);
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success() && said.contains(expected), "{said}{}", common::stderr(&out));
    }

    // The bodies' schemas are in the document, derived from the types (the limits' fields).
    let schemas = &doc["components"]["schemas"];
    assert!(schemas["StartBody"]["properties"]["limits"].is_object(), "{schemas:#}");
    assert!(schemas["Limits"]["properties"]["timeoutSeconds"].is_object(), "{schemas:#}");
    assert!(schemas["RunEnvelope"]["properties"]["runId"].is_object(), "{schemas:#}");
}

/// The command the book's reference page gives fetches the document from a running daemon.
#[test]
fn the_books_command_fetches_the_document() {
    let page = std::fs::read_to_string(common::root().join("docs/src/reference/openapi.md")).expect("the page");
    let command = page
        .split("```sh\n")
        .skip(1)
        .filter_map(|block| block.split("```").next())
        .find(|block| block.contains("/api/openapi.json"))
        .expect("a command fetching the document")
        .replace("\\\n", " ");
    let state = tempfile::tempdir().expect("a state dir");
    let daemon = start(state.path());
    let mut sh = std::process::Command::new("sh");
    for (var, value) in factory_cmd(state.path(), &[]).get_envs() {
        match value {
            Some(value) => sh.env(var, value),
            None => sh.env_remove(var),
        };
    }
    let out = sh.args(["-c", &command]).output().expect("sh starts");
    assert!(out.status.success(), "`{command}`: {}", common::stderr(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("the document");
    assert_eq!(doc["openapi"], "3.1.0", "{doc}");
    assert!(doc["paths"]["/api/runs"]["post"].is_object());
    drop(daemon);
}
