//! Large journal values stored once per store (store/shared.rs), through the real `factory`
//! binary on a real redb file: two runs of one factory whose step returns the same ~100 KiB
//! value keep it once (`factory stats --json`: one shared value, two references), `factory
//! rm` of both leaves none; on PostgreSQL, a second run of the same replies adds a
//! reference a call (its bytes and WAL per call printed); a halted run resumes replaying its
//! shared value; a reference to a value the store does not keep fails the resume
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
        ctx.log("computing the value");
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

/// Through redb directly, with no factory open: the run's record says `running` (the next
/// open repairs it to `halted`, as after a crash), and, when `drop_value`, the shared value
/// goes while its reference stays in the step row.
fn halt_in_place(state: &Path, id: &str, drop_value: bool) {
    let db = redb::Database::open(state.join(factory_host::store::STORE_FILE)).expect("the store file");
    let txn = db.begin_write().expect("a write");
    {
        let mut values = txn.open_table(TableDefinition::<&[u8], &[u8]>::new("journal_values")).expect("values");
        let hashes: Vec<Vec<u8>> =
            values.iter().expect("the values").map(|row| row.expect("a row").0.value().to_vec()).collect();
        assert_eq!(hashes.len(), 1, "the run's step value is shared");
        if drop_value {
            values.remove(hashes[0].as_slice()).expect("removed");
        }
        let mut runs = txn.open_table(TableDefinition::<&str, &[u8]>::new("runs")).expect("runs");
        let mut record: Value = {
            let bytes = runs.get(id).expect("a read").expect("the run's record");
            serde_json::from_slice(bytes.value()).expect("a record")
        };
        record["envelope"]["status"] = "running".into();
        let bytes = serde_json::to_vec(&record).expect("JSON");
        runs.insert(id, bytes.as_slice()).expect("written");
    }
    txn.commit().expect("a commit");
}

/// How many times the run's step computed its value (its log lines).
fn computed(state: &Path, id: &str) -> usize {
    let entries = common::progress_entries(state, id);
    entries.iter().filter(|e| e["event"] == "log" && e["message"] == "computing the value").count()
}

#[test]
fn a_resume_replays_a_shared_value_and_a_reference_to_one_not_stored_fails_it_as_a_corrupt_store() {
    let state = tempfile::tempdir().expect("a state dir");
    let file = factory(state.path());
    let id = run(state.path(), &file);
    assert_eq!(computed(state.path(), &id), 1);

    // Halted as by a crash, the run resumes: its step's value comes from the shared table,
    // not computed again.
    halt_in_place(state.path(), &id, false);
    let out = factory_in(state.path(), &["resume", &id, "--json", "-q"]);
    let envelope = stdout_json(&out);
    assert_eq!(envelope["status"], "completed", "{envelope:#}\n{}", stderr(&out));
    assert!(envelope["result"].as_u64().is_some_and(|n| n > 100_000), "{envelope:#}");
    assert_eq!(computed(state.path(), &id), 1, "replayed, not computed again");

    // The shared value gone, its reference left: the replay fails with a typed error.
    halt_in_place(state.path(), &id, true);
    let out = factory_in(state.path(), &["resume", &id, "--json", "-q"]);
    let said = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(!said.contains("panicked"), "{said}");
    assert_ne!(out.status.code(), Some(101), "{said}");
    // The attempt that replays the step ends in a storage failure naming the damage.
    let envelope = stdout_json(&out);
    assert_eq!((envelope["status"].as_str(), envelope["failure"]["type"].as_str()), (Some("error"), Some("storage")));
    assert!(said.contains("the store is corrupt") && said.contains("which is not stored"), "{said}");
    assert_eq!(computed(state.path(), &id), 1, "nothing computed again");
}

/// An agent key as the host makes them (the hex of a hash: its first bytes differ).
fn agent_key(i: usize) -> String {
    format!("{:016x}{i:048x}", (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// The project's book (docs/src, its chapters in path order): English text.
fn book_text() -> String {
    fn chapters(dir: &Path, into: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> =
            std::fs::read_dir(dir).expect("docs/src").map(|e| e.expect("an entry").path()).collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                chapters(&path, into);
            } else if path.extension().is_some_and(|e| e == "md") {
                into.push(path);
            }
        }
    }
    let mut files = Vec::new();
    chapters(&common::root().join("docs").join("src"), &mut files);
    files.iter().map(|f| std::fs::read_to_string(f).expect("a chapter")).collect::<Vec<_>>().join("\n")
}

/// On PostgreSQL: two runs journal the same 200 replies of 10 KB (windows of the book, each
/// different; a run of a factory again, asking the same): the second run's rows refer to
/// the first's values, so it adds a reference a call, not a reply. Prints the tables' bytes
/// and the WAL per call of each run; removing one run keeps the values, removing both
/// leaves none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgresql_a_second_run_of_the_same_replies_adds_references_only() {
    use factory_host::model::envelope::RunStatus;
    use factory_host::store::journal::Journal;
    use factory_host::store::{conformance, PgOptions, PgStore, Removed, Store};

    let server = common::postgres::Postgres::start();
    let url = server.database("shared");
    let store = PgStore::connect(&url, PgOptions::new("shared-worker")).await.expect("the store connects");
    let text = book_text();
    let (n, bytes) = (200usize, 10_000usize);
    let reply = |i: usize| {
        let mut start = (i * 7919) % (text.len() - bytes - 8);
        while !text.is_char_boundary(start) {
            start += 1;
        }
        let mut end = start + bytes;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        serde_json::to_string(&text[start..end]).expect("JSON text")
    };
    let sql = |query: &str| -> u64 { server.psql("shared", query).parse().expect("a number") };
    let tables = || sql("SELECT pg_total_relation_size('agents') + pg_total_relation_size('journal_values')");
    let wal = || server.psql("shared", "SELECT pg_current_wal_insert_lsn()");
    let ids = ["0190f0f0-0000-7000-8000-00000000c0a1", "0190f0f0-0000-7000-8000-00000000c0a2"];
    let mut added = Vec::new();
    for id in ids {
        let (size_before, wal_before) = (tables(), wal());
        let mut record = conformance::record(id, "default", RunStatus::Completed);
        store.put_run(&mut record, true).await.expect("put_run");
        for i in 0..n {
            let key = agent_key(i);
            store.put_agent(id, &key, Some(&reply(i)), (i as u64 + 1) * 9000).expect("put_agent");
        }
        store.flush().await.expect("flush");
        let wal_bytes = sql(&format!("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '{wal_before}')::bigint"));
        added.push((tables() - size_before, wal_bytes));
    }
    let replies: usize = (0..n).map(|i| reply(i).len()).sum();
    for (id, (size, wal_bytes)) in ids.iter().zip(&added) {
        println!(
            "PostgreSQL, {n} calls of 10 KB replies ({replies} B), run {id}: agents + journal_values +{size} B ({} B per \
             call), WAL {wal_bytes} B ({} B per call)",
            size / n as u64,
            wal_bytes / n as u64
        );
    }
    assert_eq!(sql("SELECT count(*) FROM journal_values"), n as u64, "each reply stored once");
    // `factory stats` on the database: the shared values are their own part, a row a value.
    let usage = store.usage_report().await.expect("usage").expect("a PostgreSQL store measures itself");
    let parts = usage.parts();
    let shared = parts.iter().find(|p| p.part.starts_with("shared journal values")).expect("the part");
    assert_eq!(shared.rows, n as u64, "{parts:#?}");
    assert!(shared.bytes > 0, "{parts:#?}");
    assert_eq!(sql("SELECT min(refs) FROM journal_values"), 2, "referred to by both runs");
    assert_eq!(sql("SELECT count(*) FROM agents WHERE octet_length(outcome) = 42"), 2 * n as u64, "references");
    // The second run keeps a reference a call: far less than the replies, and than the first.
    let ((first, _), (second, _)) = (added[0], added[1]);
    assert!(second * 4 < first, "the second run added {second} B, the first {first} B");
    for id in ids {
        assert_eq!(store.get_agent(id, &agent_key(7)).await.expect("get_agent"), Some(Some(reply(7))));
        let mut snapshot = store.load(id, 1 << 30).await.expect("load");
        assert_eq!((snapshot.agents.len(), snapshot.agents.values()), (n, n), "a resume loads every reply");
    }

    assert_eq!(store.remove_run(ids[0]).await.expect("remove_run"), Removed::Removed);
    assert_eq!(sql("SELECT count(*) FROM journal_values WHERE refs = 1"), n as u64, "kept for the other run");
    assert_eq!(store.get_agent(ids[1], &agent_key(7)).await.expect("get_agent"), Some(Some(reply(7))));
    assert_eq!(store.remove_run(ids[1]).await.expect("remove_run"), Removed::Removed);
    assert_eq!(sql("SELECT count(*) FROM journal_values"), 0, "deleted with their last run");
    assert_eq!(sql("SELECT count(*) FROM agents"), 0);
}

/// What a shared value costs beside the same value inline, on a real redb file: 1,000 step
/// values of English text (windows of the book) just over the threshold, stored shared,
/// against the same values cut one byte under it, stored inline; and what a second run of
/// the same values adds. Prints the figures the book's "Shared values" paragraph quotes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_shared_value_costs_beside_one_inline() {
    use factory_host::model::envelope::RunStatus;
    use factory_host::store::journal::Journal;
    use factory_host::store::shared::SHARED_FROM;
    use factory_host::store::{conformance, RedbStore, Store, StoreOptions};

    let n = 1000usize;
    // JSON text of exactly `bytes` bytes, each value different: hex digits of SHA-256 digests.
    // They compress alike alone and with the store's dictionary (which learns nothing from
    // them), so inline and shared are compared as stored, the dictionary aside.
    let value = |i: usize, bytes: usize| {
        use sha2::{Digest, Sha256};
        let mut text = String::with_capacity(bytes + 64);
        let mut k = 0u64;
        while text.len() < bytes - 2 {
            text += &hex::encode(Sha256::digest(format!("{i}-{k}").as_bytes()));
            k += 1;
        }
        text.truncate(bytes - 2);
        format!("\"{text}\"")
    };
    let mut figures = Vec::new();
    for (bytes, runs) in [(SHARED_FROM - 1, 1), (SHARED_FROM, 1), (SHARED_FROM - 1, 2), (SHARED_FROM, 2)] {
        let state = tempfile::tempdir().expect("a state dir");
        {
            let store = RedbStore::open(state.path(), StoreOptions::default()).expect("the store");
            for r in 0..runs {
                let id = format!("0190f0f0-0000-7000-8000-0000000000{r:02}");
                let mut record = conformance::record(&id, "default", RunStatus::Completed);
                store.put_run(&mut record, true).await.expect("put_run");
                for i in 0..n {
                    store.put_step(&id, &format!("step-{i}"), &value(i, bytes), (i as u64 + 1) * 5000).expect("put");
                }
                store.flush().await.expect("flush");
            }
        }
        let usage = RedbStore::open(state.path(), StoreOptions::default()).expect("the store").usage().expect("usage");
        let journal: u64 = ["step_rows", "journal_values", "journal_value_refs"]
            .iter()
            .filter_map(|t| usage.table(t))
            .map(|t| t.stored_bytes + t.fragmented_bytes + t.metadata_bytes)
            .sum();
        let stored: u64 = ["step_rows", "journal_values", "journal_value_refs"]
            .iter()
            .filter_map(|t| usage.table(t))
            .map(|t| t.stored_bytes)
            .sum();
        println!(
            "{runs} run(s) of {n} step values of {bytes} B: rows stored {stored} B ({} B a value), with their pages {journal} B",
            stored / (n * runs) as u64
        );
        figures.push(stored);
    }
    // A value shared costs a little more than inline once, and nothing but its reference
    // for each further run.
    let (inline_one, shared_one, inline_two, shared_two) = (figures[0], figures[1], figures[2], figures[3]);
    assert!(shared_one < inline_one * 11 / 10, "shared once: {shared_one} B, inline {inline_one} B");
    assert!(shared_two - shared_one < (inline_two - inline_one) / 10, "{figures:?}");
}
