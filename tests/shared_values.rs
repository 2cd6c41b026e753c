//! Large journal values stored once per store (store/shared.rs), through the real `factory`
//! binary on a real redb file: two runs of one factory whose step returns the same ~100 KiB
//! value keep it once (`factory stats --json`: one shared value, two references), `factory
//! rm` of both leaves none; a reference to a value the store does not keep fails the resume
//! that replays it with a typed corrupt-store error, not a panic.

mod common;

use common::{factory_in, js_factory_file, stderr, stdout_json};
use redb::{ReadableTable, TableDefinition};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// A step whose value is about 110 KB of text that compresses like random words (base-36
/// numbers of a xorshift generator: the same in every run), and a result that is its length.
const BODY: &str = r#"async (ctx) => {
    const big = await ctx.step("big", () => {
        let x = 2463534242;
        const out = [];
        for (let i = 0; i < 16000; i++) {
            x ^= x << 13; x ^= x >>> 17; x ^= x << 5;
            out.push((x >>> 0).toString(36));
        }
        return out.join(" ");
    });
    return big.length;
}"#;

fn factory(state: &Path) -> PathBuf {
    js_factory_file(state, "big", r#"{ name: "big", description: "a large step value" }"#, BODY)
}

/// `factory run FILE --json -q`: the run's id, once it completed with the value's length.
fn run(state: &Path, file: &Path) -> String {
    let out = factory_in(state, &["run", file.to_str().expect("a UTF-8 path"), "--json", "-q"]);
    let envelope = stdout_json(&out);
    assert_eq!(envelope["status"], "completed", "{envelope:#}\n{}", stderr(&out));
    assert!(envelope["result"].as_u64().is_some_and(|n| n > 100_000), "{envelope:#}");
    envelope["runId"].as_str().expect("a run id").to_string()
}

fn stats(state: &Path) -> Value {
    let out = factory_in(state, &["stats", "--json"]);
    assert!(out.status.success(), "factory stats: {}", stderr(&out));
    stdout_json(&out)
}

fn table<'a>(stats: &'a Value, name: &str) -> &'a Value {
    let tables = stats["tables"].as_array().expect("tables");
    tables.iter().find(|t| t["name"] == name).unwrap_or_else(|| panic!("no table {name}: {stats:#}"))
}

fn part<'a>(stats: &'a Value, prefix: &str) -> &'a Value {
    let parts = stats["parts"].as_array().expect("parts");
    let found = parts.iter().find(|p| p["part"].as_str().is_some_and(|p| p.starts_with(prefix)));
    found.unwrap_or_else(|| panic!("no part {prefix}: {stats:#}"))
}

fn number(value: &Value) -> u64 {
    value.as_u64().unwrap_or_else(|| panic!("not a number: {value}"))
}

#[test]
fn two_runs_of_one_large_step_value_store_it_once_and_removing_both_leaves_none() {
    let state = tempfile::tempdir().expect("a state dir");
    let file = factory(state.path());
    let first = run(state.path(), &file);
    let one = stats(state.path());
    let second = run(state.path(), &file);
    let both = stats(state.path());

    // One value, referred to by the step row of each run.
    let shared = part(&both, "shared journal values");
    assert_eq!(number(&shared["rows"]), 1, "stored once: {both:#}");
    assert_eq!(number(&table(&both, "journal_values")["entries"]), 1, "{both:#}");
    assert_eq!(number(&table(&both, "journal_value_refs")["entries"]), 1, "{both:#}");
    assert_eq!(number(&table(&both, "step_rows")["entries"]), 2, "a step row each: {both:#}");
    // The second run added its step row's reference, not a second copy of the value.
    let (stored_one, stored_both) =
        (number(&table(&one, "journal_values")["storedBytes"]), number(&table(&both, "journal_values")["storedBytes"]));
    assert_eq!(stored_one, stored_both, "the shared table did not grow: {both:#}");
    assert!(stored_one > 20_000, "the value is there, compressed: {stored_one} B");
    let steps = number(&table(&both, "step_rows")["storedBytes"]);
    assert!(steps < 1_000, "two step rows of a reference each: {steps} B");
    println!(
        "one run: shared value {stored_one} B; two runs: shared value {stored_both} B, step rows {steps} B, file {} B -> {} B",
        number(&one["fileBytes"]),
        number(&both["fileBytes"])
    );

    // Removing one run keeps the value for the other; removing both leaves none.
    let out = factory_in(state.path(), &["rm", &first]);
    assert!(out.status.success(), "factory rm: {}", stderr(&out));
    let kept = stats(state.path());
    assert_eq!(number(&table(&kept, "journal_values")["entries"]), 1, "{kept:#}");
    let out = factory_in(state.path(), &["show", &second, "--json"]);
    assert!(out.status.success(), "factory show: {}", stderr(&out));
    let out = factory_in(state.path(), &["rm", &second]);
    assert!(out.status.success(), "factory rm: {}", stderr(&out));
    let none = stats(state.path());
    for name in ["journal_values", "journal_value_refs", "step_rows"] {
        assert_eq!(number(&table(&none, name)["entries"]), 0, "{name}: {none:#}");
    }
    assert_eq!(number(&part(&none, "shared journal values")["rows"]), 0, "{none:#}");
}

#[test]
fn a_reference_to_a_value_not_stored_fails_the_resume_with_a_corrupt_store_error() {
    let state = tempfile::tempdir().expect("a state dir");
    let file = factory(state.path());
    let id = run(state.path(), &file);
    // Through redb directly: the shared value goes (its reference stays in the step row), and
    // the run's record says `running`, which the next open repairs to `halted` (a crash).
    {
        let db = redb::Database::open(state.path().join(factory_host::store::STORE_FILE)).expect("the store file");
        let txn = db.begin_write().expect("a write");
        {
            let mut values = txn.open_table(TableDefinition::<&[u8], &[u8]>::new("journal_values")).expect("values");
            let hashes: Vec<Vec<u8>> =
                values.iter().expect("the values").map(|row| row.expect("a row").0.value().to_vec()).collect();
            assert_eq!(hashes.len(), 1, "the run's step value is shared");
            values.remove(hashes[0].as_slice()).expect("removed");
            let mut runs = txn.open_table(TableDefinition::<&str, &[u8]>::new("runs")).expect("runs");
            let mut record: Value = {
                let bytes = runs.get(id.as_str()).expect("a read").expect("the run's record");
                serde_json::from_slice(bytes.value()).expect("a record")
            };
            record["envelope"]["status"] = "running".into();
            let bytes = serde_json::to_vec(&record).expect("JSON");
            runs.insert(id.as_str(), bytes.as_slice()).expect("written");
        }
        txn.commit().expect("a commit");
    }
    let out = factory_in(state.path(), &["resume", &id, "--json", "-q"]);
    let said = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(!said.contains("panicked"), "{said}");
    assert_ne!(out.status.code(), Some(101), "{said}");
    // The attempt that replays the step ends in a storage failure naming the damage.
    let envelope = stdout_json(&out);
    assert_eq!((envelope["status"].as_str(), envelope["failure"]["type"].as_str()), (Some("error"), Some("storage")));
    assert!(said.contains("the store is corrupt") && said.contains("which is not stored"), "{said}");
}
