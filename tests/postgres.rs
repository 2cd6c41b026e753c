//! The PostgreSQL store against a real PostgreSQL 15 started by the test ([`common::postgres`]):
//! the store conformance suite, schema migrations (refusing a newer schema), fencing of a
//! worker whose lease was taken, and group commit batching.

mod common;

use common::postgres::Postgres;
use factory_host::model::envelope::RunStatus;
use factory_host::store::conformance;
use factory_host::store::journal::Journal;
use factory_host::store::{PgOptions, PgStore, Store, StoreError};
use futures::FutureExt;
use std::sync::Arc;
use std::time::Duration;

fn options(worker: &str) -> PgOptions {
    PgOptions { commit_window: Duration::from_millis(5), ..PgOptions::new(worker) }
}

#[tokio::test]
async fn the_postgres_store_conforms() {
    let server = Postgres::start();
    let url = server.database("conformance");
    let open = move || {
        let url = url.clone();
        async move { Ok(Arc::new(PgStore::connect(&url, options("conformance-worker")).await?) as Arc<dyn Store>) }.boxed()
    };
    conformance::run_all(open).await;
}

#[tokio::test]
async fn a_newer_schema_is_refused_and_migrations_run_once() {
    let server = Postgres::start();
    let url = server.database("schema");
    // Two workers connecting at once: the advisory lock serializes the migration.
    let (a, b) = futures::join!(PgStore::connect(&url, options("w1")), PgStore::connect(&url, options("w2")));
    let (a, b) = (a.expect("worker 1 connects"), b.expect("worker 2 connects"));
    assert_eq!(server.psql("schema", "SELECT string_agg(version::text, ',') FROM factory_schema"), "1", "migration 1 applied once");
    assert_eq!(server.psql("schema", "SELECT count(*) FROM workers"), "2", "both registered");
    drop((a, b));
    server.psql("schema", "INSERT INTO factory_schema (version) VALUES (2)");
    match PgStore::connect(&url, options("w3")).await {
        Err(StoreError::Version { found: 2, expected: 1 }) => {}
        other => panic!("a newer schema must be refused with a version error, got {other:?}"),
    }
    assert_eq!(server.psql("schema", "SELECT count(*) FROM workers WHERE id = 'w3'"), "0", "a refused worker registers nothing");
}

#[tokio::test]
async fn a_fenced_worker_commits_nothing() {
    let server = Postgres::start();
    let url = server.database("fencing");
    let store = PgStore::connect(&url, options("zombie")).await.expect("connects");
    let run = "run-of-the-zombie";
    store.put_step(run, "before", "1", 1).expect("put");
    Journal::flush(&store).await.expect("a commit while the lease is held");
    // Another worker takes over: the generation moves (as the reaper does).
    server.psql("fencing", "UPDATE workers SET generation = generation + 1 WHERE id = 'zombie'");
    store.put_step(run, "after", "2", 2).expect("a put is queued");
    let error = Journal::flush(&store).await.expect_err("the commit of a fenced worker is refused");
    let cause = std::error::Error::source(&error).and_then(|e| e.downcast_ref::<StoreError>()).expect("a store error");
    assert!(matches!(cause, StoreError::Fenced { worker, .. } if worker == "zombie"), "{cause:?}");
    assert!(store.put_step(run, "later", "3", 3).is_err(), "once fenced, writes are refused at once");
    assert_eq!(server.psql("fencing", "SELECT string_agg(convert_from(key, 'UTF8'), ',') FROM steps"), "before", "nothing after the fence");

    // An expired lease fences too, even before anyone raises the generation.
    let url = server.database("expiry");
    let store = PgStore::connect(&url, options("late")).await.expect("connects");
    server.psql("expiry", "UPDATE workers SET lease_until = now() - interval '1 second'");
    store.put_step(run, "s", "1", 1).expect("queued");
    assert!(Journal::flush(&store).await.is_err(), "an expired lease commits nothing");
    assert_eq!(server.psql("expiry", "SELECT count(*) FROM steps"), "0");
}

#[tokio::test]
async fn a_window_of_puts_is_one_transaction_and_the_worker_renews_its_lease() {
    let server = Postgres::start();
    let url = server.database("group");
    let opts = PgOptions { commit_window: Duration::from_secs(2), lease: Duration::from_millis(900), ..PgOptions::new("grouper") };
    let store = PgStore::connect(&url, opts).await.expect("connects");
    let commits = store.writer_stats().commits.load(std::sync::atomic::Ordering::SeqCst);
    for i in 0..500 {
        // The same key twice in one batch: deduplicated (an upsert cannot touch a row twice).
        store.put_step("r", &format!("k{}", i % 250), &i.to_string(), i).expect("put");
        store.put_agent("r", &format!("{i:08x}"), Some("\"ok\""), i).expect("put");
    }
    Journal::flush(&store).await.expect("flush");
    assert_eq!(store.writer_stats().commits.load(std::sync::atomic::Ordering::SeqCst) - commits, 1, "one commit for the window");
    assert_eq!(server.psql("group", "SELECT count(*) FROM steps"), "250");
    assert_eq!(server.psql("group", "SELECT convert_from(value, 'UTF8') FROM steps WHERE key = 'k7'::bytea"), "257", "the last put wins");
    assert_eq!(server.psql("group", "SELECT count(*) FROM agents"), "500");
    assert_eq!(server.psql("group", "SELECT bytes FROM journal_usage WHERE run_id = 'r'"), "499");
    // Past several lease lengths, the renewal task kept the lease: commits still land.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut record = conformance::record("renewed", "default", RunStatus::Completed);
    store.put_run(&mut record, true).await.expect("a commit after several lease lengths");
    assert!(store.lease_held(), "the lease is held by the local clock too");
}

