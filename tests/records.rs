//! Guest JSON inside host records, through the real binary: no value a factory returns or
//! declares can make the store unreadable, and a record that cannot be read fails only its
//! own run (listed with an error), never the store.

mod common;

use serde_json::{json, Value};
use std::path::Path;

/// A JS factory returning an array nested `depth` deep.
fn deep_result_factory(dir: &Path, name: &str, depth: usize) -> String {
    let file = dir.join(format!("{name}.js"));
    std::fs::write(
        &file,
        format!(
            "import {{ defineFactory }} from \"factory\";\n\
             export default defineFactory({{ meta: {{ name: \"{name}\", description: \"d\" }},\n\
             run: async () => {{ let v = 1; for (let i = 0; i < {depth}; i++) v = [v]; return v; }} }});\n"
        ),
    )
    .unwrap();
    file.display().to_string()
}

fn runs(state: &Path) -> Value {
    let out = common::factory_in(state, &["runs", "--json"]);
    assert!(out.status.success(), "factory runs failed: {}", common::stderr(&out));
    common::stdout_json(&out)
}

fn nesting(mut value: &Value) -> usize {
    let mut depth = 0;
    while let Some(inner) = value.as_array().and_then(|a| a.first()) {
        depth += 1;
        value = inner;
    }
    depth + usize::from(value.is_array())
}

#[test]
fn a_deeply_nested_result_never_makes_the_store_unreadable() {
    let state = tempfile::tempdir().unwrap();
    // The value that bricked the store: 126 deep, over the boundary's depth rule now.
    let file = deep_result_factory(state.path(), "deep126", 126);
    let out = common::factory_in(state.path(), &["run", &file, "--json", "-q"]);
    let envelope = common::stdout_json(&out);
    assert_eq!(envelope["status"], "error", "{envelope}");
    assert_eq!(envelope["failure"]["type"], "sandbox_limit");
    assert_eq!(envelope["failure"]["kind"], "maxJsonDepth");

    // At the limit: completes, and every command on the state dir still works.
    let file = deep_result_factory(state.path(), "deep64", factory_host::json::MAX_DEPTH);
    let out = common::factory_in(state.path(), &["run", &file, "--json", "-q"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let envelope = common::stdout_json(&out);
    assert_eq!(envelope["status"], "completed");
    assert_eq!(nesting(&envelope["result"]), factory_host::json::MAX_DEPTH);
    let id = envelope["runId"].as_str().unwrap().to_string();

    let listed = runs(state.path());
    assert_eq!(listed.as_array().unwrap().len(), 2, "{listed}");
    let out = common::factory_in(state.path(), &["show", &id, "--json"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert_eq!(nesting(&common::stdout_json(&out)["result"]), factory_host::json::MAX_DEPTH);
    let file = deep_result_factory(state.path(), "shallow", 1);
    let out = common::factory_in(state.path(), &["run", &file, "--json", "-q"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
}

/// An args schema nested `depth` deep (`{"type":"array","items":{...}}`).
fn deep_schema(depth: usize) -> Value {
    let mut schema = json!({ "type": "string" });
    for _ in 0..depth {
        schema = json!({ "type": "array", "items": schema });
    }
    schema
}

#[test]
fn a_deeply_nested_args_schema_never_makes_the_registry_unreadable() {
    let state = tempfile::tempdir().unwrap();
    let body = state.path().join("body.js");
    std::fs::write(&body, "async () => 1\n").unwrap();
    let meta = state.path().join("meta.json");
    // A schema nested 126 deep: the meta file itself parses, but inside a registration
    // record it was past serde_json's recursion limit, and the registry could not be read.
    let mut text = String::from(r#"{"type":"string"}"#);
    for _ in 0..125 {
        text = format!(r#"{{"type":"array","items":{text}}}"#);
    }
    let too_deep = format!(r#"{{"name":"deep-schema","description":"d","argsSchema":{text}}}"#);
    std::fs::write(&meta, &too_deep).unwrap();
    let out =
        common::factory_in(state.path(), &["add", "--meta", meta.to_str().unwrap(), "--run", body.to_str().unwrap()]);
    assert!(!out.status.success(), "a schema over the depth rule is refused");
    assert!(common::stderr(&out).contains("nested 126 deep"), "{}", common::stderr(&out));
    let out = common::factory_in(state.path(), &["list", "--json"]);
    assert!(out.status.success(), "{}", common::stderr(&out));

    // Just within the rule: registered, listed, run.
    let ok = json!({ "name": "ok-schema", "description": "d", "argsSchema": { "type": "object", "properties": { "x": deep_schema(20) } } });
    std::fs::write(&meta, ok.to_string()).unwrap();
    let out =
        common::factory_in(state.path(), &["add", "--meta", meta.to_str().unwrap(), "--run", body.to_str().unwrap()]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let out = common::factory_in(state.path(), &["list", "--json"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let listed = common::stdout_json(&out);
    assert!(listed.to_string().contains("ok-schema"), "{listed}");
    let out = common::factory_in(state.path(), &["run", "ok-schema", "--json", "-q"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
}

const RUNS: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("runs");
const RUN_ORDER: redb::TableDefinition<u64, &str> = redb::TableDefinition::new("run_order");

/// Write `bytes` as the record of run `id` (listed at creation seq `seq`), as a damaged
/// disk or an older build could have left it. No factory process may hold the store.
fn plant_record(state: &Path, id: &str, seq: u64, bytes: &[u8]) {
    let db = redb::Database::open(state.join("factory.redb")).unwrap();
    let txn = db.begin_write().unwrap();
    {
        txn.open_table(RUNS).unwrap().insert(id, bytes).unwrap();
        txn.open_table(RUN_ORDER).unwrap().insert(seq, id).unwrap();
    }
    txn.commit().unwrap();
}

fn stored_record(state: &Path, id: &str) -> Value {
    use redb::ReadableDatabase;
    let db = redb::Database::open(state.join("factory.redb")).unwrap();
    let txn = db.begin_read().unwrap();
    let table = txn.open_table(RUNS).unwrap();
    let bytes = table.get(id).unwrap().unwrap().value().to_vec();
    serde_json::from_slice(&bytes).unwrap()
}

#[test]
fn an_unreadable_record_fails_only_its_own_run() {
    let state = tempfile::tempdir().unwrap();
    let file = deep_result_factory(state.path(), "good", 2);
    let out = common::factory_in(state.path(), &["run", &file, "--json", "-q"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let good = common::stdout_json(&out)["runId"].as_str().unwrap().to_string();

    // A record of garbage, and one an older build wrote with its result as a tree nested past
    // serde_json's recursion limit inside the record (what bricked stores before).
    let garbage = "0190f0f0-0000-7000-8000-000000000001";
    plant_record(state.path(), garbage, 1000, b"{\"envelope\": not json");
    let legacy = "0190f0f0-0000-7000-8000-000000000002";
    let mut record = stored_record(state.path(), &good);
    record["envelope"]["runId"] = json!(legacy);
    record["envelope"]["result"] = json!("DEEP-RESULT");
    let deep = format!("{}1{}", "[".repeat(126), "]".repeat(126));
    let text = serde_json::to_string(&record).unwrap().replace("\"DEEP-RESULT\"", &deep);
    plant_record(state.path(), legacy, 1001, text.as_bytes());

    // The store opens; every run is listed, the garbage one with its error. (The listing is
    // read as text: the legacy result inside an array of envelopes is deeper than the
    // test's own JSON reader allows.)
    let out = common::factory_in(state.path(), &["runs", "--json"]);
    assert!(out.status.success(), "factory runs failed: {}", common::stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(text.matches("\"runId\"").count(), 3, "{text}");
    assert!(text.contains(garbage) && text.contains("\"unreadable_record\""), "{text}");
    let out = common::factory_in(state.path(), &["show", legacy, "--json"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let old = common::stdout_json(&out);
    assert_eq!(old["status"], "completed");
    assert_eq!(nesting(&old["result"]), 126);
    let out = common::factory_in(state.path(), &["runs"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains(garbage));

    // Only that run fails, with a message naming it; the others read, and new runs work.
    let out = common::factory_in(state.path(), &["show", garbage]);
    assert!(!out.status.success());
    assert!(common::stderr(&out).contains(garbage), "{}", common::stderr(&out));
    let out = common::factory_in(state.path(), &["show", &good, "--json"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let out = common::factory_in(state.path(), &["run", &file, "--json", "-q"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let out = common::factory_in(state.path(), &["runs", "--json"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).matches("\"runId\"").count(), 4);

    // A record an older build stored with a guest's 33 MiB error (twice: the failure's message
    // and the error), which bricked the session's answers: read, it is cut to 64 KiB; the
    // owner removes it, and the unreadable one too.
    let bricked = "0190f0f0-0000-7000-8000-000000000003";
    let mut record = stored_record(state.path(), &good);
    let huge = "e".repeat(33 << 20);
    record["envelope"]["runId"] = json!(bricked);
    record["envelope"]["status"] = json!("error");
    record["envelope"]["result"] = Value::Null;
    record["envelope"]["failure"] = json!({ "type": "guest_error", "message": huge });
    record["envelope"]["error"] = json!(huge);
    plant_record(state.path(), bricked, 1002, serde_json::to_string(&record).unwrap().as_bytes());
    let out = common::factory_in(state.path(), &["show", bricked, "--json"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let shown = common::stdout_json(&out);
    let message = shown["failure"]["message"].as_str().expect("a message");
    assert!(message.len() <= 64 << 10 && message.ends_with(" [truncated]"), "{}", message.len());
    let out = common::factory_in(state.path(), &["rm", bricked, garbage]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let out = common::factory_in(state.path(), &["runs", "--json"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(text.matches("\"runId\"").count(), 3, "{text}");
    assert!(!text.contains(bricked) && !text.contains(garbage), "{text}");
}

/// `factory runs --json --limit/--before/--after`: one page by creation sequence.
fn page(state: &Path, args: &[&str]) -> Value {
    let mut all = vec!["runs", "--json"];
    all.extend_from_slice(args);
    let out = common::factory_in(state, &all);
    assert!(out.status.success(), "factory {all:?} failed: {}", common::stderr(&out));
    common::stdout_json(&out)
}

fn ids(page: &Value) -> Vec<String> {
    page["runs"].as_array().expect("runs").iter().map(|r| r["runId"].as_str().expect("runId").to_string()).collect()
}

#[test]
fn runs_page_by_creation_sequence_newest_first_then_older_and_newer() {
    let state = tempfile::tempdir().unwrap();
    let file = deep_result_factory(state.path(), "shallow", 1);
    let mut created = Vec::new();
    for _ in 0..3 {
        let out = common::factory_in(state.path(), &["run", &file, "--json", "-q"]);
        assert!(out.status.success(), "{}", common::stderr(&out));
        created.push(common::stdout_json(&out)["runId"].as_str().unwrap().to_string());
    }
    // Without paging options: the whole array, as before.
    let listed = runs(state.path());
    assert_eq!(listed.as_array().map(Vec::len), Some(3), "{listed}");

    let newest = page(state.path(), &["--limit", "1"]);
    assert_eq!(ids(&newest), [created[2].clone()], "{newest}");
    assert_eq!(newest["oldestSeq"], newest["runs"][0]["seq"]);
    assert_eq!(newest["newestSeq"], newest["runs"][0]["seq"]);
    assert_eq!((newest["hasMoreNewer"].clone(), newest["omittedOlder"].clone()), (json!(false), json!(true)));

    let before = newest["oldestSeq"].as_u64().expect("a seq").to_string();
    let middle = page(state.path(), &["--before", &before, "--limit", "1"]);
    assert_eq!(ids(&middle), [created[1].clone()], "{middle}");
    assert_eq!((middle["hasMoreNewer"].clone(), middle["omittedOlder"].clone()), (json!(true), json!(true)));
    let before = middle["oldestSeq"].as_u64().expect("a seq").to_string();
    let oldest = page(state.path(), &["--before", &before, "--limit", "1"]);
    assert_eq!(ids(&oldest), [created[0].clone()], "{oldest}");
    assert_eq!((oldest["hasMoreNewer"].clone(), oldest["omittedOlder"].clone()), (json!(true), json!(false)));

    let after = oldest["newestSeq"].as_u64().expect("a seq").to_string();
    let newer = page(state.path(), &["--after", &after, "--limit", "1"]);
    assert_eq!(ids(&newer), [created[1].clone()], "{newer}");
    let after = newer["newestSeq"].as_u64().expect("a seq").to_string();
    let newer = page(state.path(), &["--after", &after, "--limit", "1"]);
    assert_eq!(ids(&newer), [created[2].clone()], "{newer}");
    assert_eq!((newer["hasMoreNewer"].clone(), newer["omittedOlder"].clone()), (json!(false), json!(true)));
    let after = newer["newestSeq"].as_u64().expect("a seq").to_string();
    let past = page(state.path(), &["--after", &after]);
    assert_eq!(
        (ids(&past).len(), past["oldestSeq"].clone(), past["hasMoreNewer"].clone()),
        (0, Value::Null, json!(false))
    );

    // The default page holds all three, oldest first; the table names the cursors.
    let whole = page(state.path(), &["--limit", "200"]);
    assert_eq!(ids(&whole), created);
    let out = common::factory_in(state.path(), &["runs", "--limit", "1"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains(&created[2]) && !table.contains(&created[1]), "{table}");
    assert!(table.contains(&format!("older runs: factory runs --before {}", newest["oldestSeq"])), "{table}");
}
