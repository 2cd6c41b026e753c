//! The PostgreSQL store against a real PostgreSQL 15 started by the test ([`common::postgres`]):
//! the store conformance suite, schema migrations (refusing a newer schema), fencing of a
//! worker whose lease was taken, group commit batching, and `factory serve --store` workers
//! (recovery after kill -9, by exactly one of two workers starting together; cancel through
//! another worker; pause through the worker that executes a run), and the flow budget two workers share (through the store, and for one
//! throttling provider through two `factory serve` workers).

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
        async move { Ok(Arc::new(PgStore::connect(&url, options("conformance-worker")).await?) as Arc<dyn Store>) }
            .boxed()
    };
    conformance::run_all(open).await;
}

#[tokio::test]
async fn a_run_another_live_worker_claimed_to_resume_is_not_removed() {
    let server = Postgres::start();
    let url = server.database("remove");
    let (a, b) = (
        PgStore::connect(&url, options("wa")).await.expect("a connects"),
        PgStore::connect(&url, options("wb")).await.expect("b connects"),
    );
    let run = "0190f0f0-0000-7000-8000-0000000000aa";
    let mut record = conformance::record(run, "default", RunStatus::Halted);
    a.put_run(&mut record, true).await.expect("put_run");
    // Worker b takes the halted run to resume it: worker a may not delete it under b.
    assert!(b.claim_resume(run).await.expect("claim_resume"), "b claims the run");
    assert_eq!(a.remove_run(run).await.expect("remove_run"), factory_host::store::Removed::Active);
    assert!(a.run(run).await.expect("run").is_some(), "the claimed run is kept");
    // Released (the resume did not start), it can go.
    b.release_claim(run).await.expect("release_claim");
    assert_eq!(a.remove_run(run).await.expect("remove_run"), factory_host::store::Removed::Removed);
    assert_eq!(server.psql("remove", &format!("SELECT count(*) FROM runs WHERE id = '{run}'")), "0");
}

/// A component whose last run one worker deletes while another starts a run of it is not
/// lost: the starting worker's record write checks it is still there (after any collection in
/// progress, which holds the blob lock alone) and stores it again.
#[tokio::test]
async fn a_blob_collected_while_another_worker_starts_a_run_of_it_is_stored_again() {
    let server = Postgres::start();
    let url = server.database("blobs");
    let (a, b) = (
        PgStore::connect(&url, options("wa")).await.expect("a connects"),
        PgStore::connect(&url, options("wb")).await.expect("b connects"),
    );
    let hash = "b10b".repeat(16);
    let bytes: Arc<[u8]> = Arc::from(&b"\0asm the component"[..]);
    let count = || server.psql("blobs", &format!("SELECT count(*) FROM blobs WHERE hash = '{hash}'"));
    // Worker a ran the component once; the run ended.
    let mut first = conformance::record("0190f0f0-0000-7000-8000-0000000000b1", "default", RunStatus::Completed);
    first.component_hashes = vec![hash.clone()];
    a.put_blob(&hash, &bytes).expect("a puts the component");
    a.put_run(&mut first, true).await.expect("a's run");
    // Worker b starts a run of it: the component is put (b finds it stored), its record not yet.
    b.put_blob(&hash, &bytes).expect("b puts the component");
    b.flush().await.expect("flush");
    // Worker a deletes its run, the component's last user by the records: collected.
    let blobs = factory_host::store::blobs::of_run(&a, &first).await.expect("the run's blobs");
    assert_eq!(a.remove_run(&first.envelope.run_id).await.expect("remove_run"), factory_host::store::Removed::Removed);
    assert_eq!(a.collect_blobs(&blobs).await.expect("collect_blobs"), 1);
    assert_eq!(count(), "0");
    // b writes its run's record: the component is stored again.
    let mut second = conformance::record("0190f0f0-0000-7000-8000-0000000000b2", "default", RunStatus::Running);
    second.component_hashes = vec![hash.clone()];
    b.put_run(&mut second, true).await.expect("b's run");
    assert_eq!(count(), "1", "stored again by the record's write");
    assert_eq!(b.blob(&hash).await.expect("blob").as_deref(), Some(&bytes[..]));

    // A collection in progress (the blob lock held alone, here by a session of the test's)
    // holds the check back until it ends: the check then finds what it deleted.
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("a session");
    tokio::spawn(connection);
    client.execute("SELECT pg_advisory_lock($1)", &[&0x6661_6374_6f72_7902_i64]).await.expect("the blob lock");
    let third_hash = "7b1d".repeat(16);
    b.put_blob(&third_hash, &bytes).expect("b puts another component");
    b.flush().await.expect("flush");
    let mut third = conformance::record("0190f0f0-0000-7000-8000-0000000000b3", "default", RunStatus::Running);
    third.component_hashes = vec![third_hash.clone()];
    let writing = tokio::spawn(async move { b.put_run(&mut third, true).await.map(|()| b) });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!writing.is_finished(), "the check waits for the collection");
    client.execute("DELETE FROM blobs WHERE hash = $1", &[&third_hash]).await.expect("the collection deletes");
    client.execute("SELECT pg_advisory_unlock($1)", &[&0x6661_6374_6f72_7902_i64]).await.expect("unlock");
    let b = tokio::time::timeout(Duration::from_secs(60), writing)
        .await
        .expect("the write ends")
        .expect("joined")
        .expect("b's run");
    assert_eq!(b.blob(&third_hash).await.expect("blob").as_deref(), Some(&bytes[..]), "stored again");
    drop((a, b));
}

#[tokio::test]
async fn a_newer_schema_is_refused_and_migrations_run_once() {
    let server = Postgres::start();
    let url = server.database("schema");
    // Two workers connecting at once: the advisory lock serializes the migration.
    let (a, b) = futures::join!(PgStore::connect(&url, options("w1")), PgStore::connect(&url, options("w2")));
    let (a, b) = (a.expect("worker 1 connects"), b.expect("worker 2 connects"));
    use factory_host::store::postgres::schema::SCHEMA_VERSION;
    let applied = (1..=SCHEMA_VERSION).map(|v| v.to_string()).collect::<Vec<_>>().join(",");
    assert_eq!(
        server.psql("schema", "SELECT string_agg(version::text, ',' ORDER BY version) FROM factory_schema"),
        applied,
        "each migration applied once"
    );
    assert_eq!(server.psql("schema", "SELECT count(*) FROM workers"), "2", "both registered");
    drop((a, b));
    server.psql("schema", &format!("INSERT INTO factory_schema (version) VALUES ({})", SCHEMA_VERSION + 1));
    match PgStore::connect(&url, options("w3")).await {
        Err(StoreError::Version { found, expected })
            if found == SCHEMA_VERSION as u64 + 1 && expected == SCHEMA_VERSION as u64 => {}
        other => panic!("a newer schema must be refused with a version error, got {other:?}"),
    }
    assert_eq!(
        server.psql("schema", "SELECT count(*) FROM workers WHERE id = 'w3'"),
        "0",
        "a refused worker registers nothing"
    );
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
    assert_eq!(
        server.psql("fencing", "SELECT string_agg(convert_from(key, 'UTF8'), ',') FROM steps"),
        "before",
        "nothing after the fence"
    );

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
    let opts = PgOptions {
        commit_window: Duration::from_secs(2),
        lease: Duration::from_millis(900),
        ..PgOptions::new("grouper")
    };
    let store = PgStore::connect(&url, opts).await.expect("connects");
    let commits = store.writer_stats().commits.load(std::sync::atomic::Ordering::SeqCst);
    // 200 writes: fewer than a batch that is committed without waiting out the window.
    for i in 0..100 {
        // The same key twice in one batch: deduplicated (an upsert cannot touch a row twice).
        store.put_step("r", &format!("k{}", i % 50), &i.to_string(), i).expect("put");
        store.put_agent("r", &format!("{i:08x}"), Some("\"ok\""), i).expect("put");
    }
    Journal::flush(&store).await.expect("flush");
    assert_eq!(
        store.writer_stats().commits.load(std::sync::atomic::Ordering::SeqCst) - commits,
        1,
        "one commit for the window"
    );
    assert_eq!(server.psql("group", "SELECT count(*) FROM steps"), "50");
    assert_eq!(
        server.psql("group", "SELECT convert_from(value, 'UTF8') FROM steps WHERE key = 'k7'::bytea"),
        "57",
        "the last put wins"
    );
    assert_eq!(server.psql("group", "SELECT count(*) FROM agents"), "100");
    assert_eq!(server.psql("group", "SELECT bytes FROM journal_usage WHERE run_id = 'r'"), "99");
    // Past several lease lengths, the renewal task kept the lease: commits still land.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut record = conformance::record("renewed", "default", RunStatus::Completed);
    store.put_run(&mut record, true).await.expect("a commit after several lease lengths");
    assert!(store.lease_held(), "the lease is held by the local clock too");
}

/// A burst of writes is committed in pieces while it goes on: a batch of 256 writes is
/// committed without waiting out the window (here a minute long, and nobody flushes); a
/// batch one write short waits for its window.
#[tokio::test]
async fn a_batch_of_256_writes_is_committed_without_waiting_out_the_window() {
    let server = Postgres::start();
    let url = server.database("burst");
    let opts = PgOptions { commit_window: Duration::from_secs(60), ..PgOptions::new("burster") };
    let store = PgStore::connect(&url, opts).await.expect("connects");
    let commits = || store.writer_stats().commits.load(std::sync::atomic::Ordering::SeqCst);
    let before = commits();
    for i in 0..255 {
        store.put_step("r", &format!("k{i}"), "1", i).expect("put");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(commits(), before, "255 writes wait for their window");
    store.put_step("r", "k255", "1", 255).expect("the 256th put");
    let waited = std::time::Instant::now();
    while commits() == before && waited.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(commits() - before, 1, "the batch was committed in one transaction, the window still open");
    assert_eq!(server.psql("burst", "SELECT count(*) FROM steps"), "256");
}

/// The flow budget two workers share (`flow_budgets`): takes by either worker draw from one
/// pair of buckets, refilled on the database's clock, starting from what the first caller's
/// own buckets held, never holding more than the server said remains; a worker's close stops
/// both until then; a call's tokens trued up by one worker are there for the other.
#[tokio::test]
async fn two_workers_take_from_one_flow_budget() {
    use factory_host::store::queue::FlowRates;
    let server = Postgres::start();
    let url = server.database("budget");
    let (a, b) = (
        PgStore::connect(&url, options("wa")).await.expect("a connects"),
        PgStore::connect(&url, options("wb")).await.expect("b connects"),
    );
    let (qa, qb) = (a.run_queue().expect("a queue"), b.run_queue().expect("b queue"));
    let key = "openai http://127.0.0.1:1/v1 nokey".to_string();
    // One request a minute, a bucket of 4: the refill is too slow to matter in this test.
    let rates = FlowRates {
        requests: Some(1.0 / 60.0),
        request_burst: 4.0,
        tokens: None,
        token_burst: 1.0,
        requests_left: 4.0,
        tokens_left: 1.0,
    };
    let mut taken = 0;
    for i in 0..8 {
        let queue = if i % 2 == 0 { qa } else { qb };
        if queue.take_flow_budget(key.clone(), rates, 100.0).await.expect("a take").is_none() {
            taken += 1;
        }
    }
    assert_eq!(taken, 4, "one bucket of 4 for both workers");
    let wait = qb.take_flow_budget(key.clone(), rates, 100.0).await.expect("a take").expect("a wait");
    assert!(
        wait > Duration::from_secs(1) && wait <= Duration::from_secs(60),
        "about a minute for the next request: {wait:?}"
    );
    assert_eq!(server.psql("budget", "SELECT count(*) FROM flow_budgets"), "1", "one row per flow");

    // Another flow, closed by worker a for a minute: worker b waits about that long.
    let other = "openai http://127.0.0.1:2/v1 nokey".to_string();
    let fast = FlowRates {
        requests: Some(1000.0),
        request_burst: 1000.0,
        tokens: Some(1000.0),
        token_burst: 1000.0,
        requests_left: 1e9,
        tokens_left: 1e9,
    };
    assert_eq!(qb.take_flow_budget(other.clone(), fast, 10.0).await.expect("a take"), None, "a new budget is full");
    qa.close_flow_budget(other.clone(), Duration::from_secs(60)).await.expect("a close");
    qa.close_flow_budget(other.clone(), Duration::from_secs(1)).await.expect("a shorter close");
    let wait = qb.take_flow_budget(other.clone(), fast, 10.0).await.expect("a take").expect("closed");
    assert!(wait > Duration::from_secs(30) && wait <= Duration::from_secs(60), "the later close stands: {wait:?}");
    // Reopened (as if the minute had passed), it is paced by its own buckets again.
    server.psql("budget", "UPDATE flow_budgets SET closed_until = now() - interval '1 second'");
    assert_eq!(qb.take_flow_budget(other.clone(), fast, 10.0).await.expect("a take"), None, "open again");
    // The server says nothing remains: neither worker takes until the refill (a request a
    // minute, so no refill comes between the two calls however slow the machine is).
    let bounded = "openai http://127.0.0.1:5/v1 nokey".to_string();
    let slow = FlowRates { requests: Some(1.0 / 60.0), request_burst: 1000.0, requests_left: 1000.0, ..fast };
    assert_eq!(qb.take_flow_budget(bounded.clone(), slow, 10.0).await.expect("a take"), None, "a new budget is full");
    qa.bound_flow_budget(bounded.clone(), Some(0.0), None).await.expect("a bound");
    assert!(qb.take_flow_budget(bounded.clone(), slow, 10.0).await.expect("a take").is_some(), "nothing remains");
    // A new budget starts from what the first caller's own buckets hold.
    let empty = FlowRates { requests_left: 0.0, ..rates };
    let wait = qa.take_flow_budget("openai http://127.0.0.1:4/v1 nokey".into(), empty, 10.0).await.expect("a take");
    assert!(wait.is_some_and(|w| w > Duration::from_secs(1)), "started empty: {wait:?}");
    // A call of more tokens than the bucket holds waits for a full bucket, then goes.
    let small = FlowRates {
        requests: Some(1000.0),
        request_burst: 1000.0,
        tokens: Some(1.0 / 60.0),
        token_burst: 50.0,
        requests_left: 1000.0,
        tokens_left: 50.0,
    };
    let third = "anthropic http://127.0.0.1:3 nokey".to_string();
    assert_eq!(
        qa.take_flow_budget(third.clone(), small, 500.0).await.expect("a take"),
        None,
        "a full bucket admits a big call"
    );
    let wait = qb.take_flow_budget(third.clone(), small, 10.0).await.expect("a take").expect("no tokens left");
    assert!(wait > Duration::from_secs(600), "the bucket owes 450 tokens at one a minute: {wait:?}");
    // The call used 40 tokens, not 500: trued up, the bucket holds 10 again, and no more than
    // its size however much is put back.
    qb.true_up_flow_budget(third.clone(), 460.0).await.expect("a true-up");
    assert_eq!(qa.take_flow_budget(third.clone(), small, 10.0).await.expect("a take"), None, "10 tokens there again");
    qa.true_up_flow_budget(third.clone(), 1e9).await.expect("a true-up");
    assert_eq!(
        server.psql("budget", &format!("SELECT tokens FROM flow_budgets WHERE key = '{third}'")),
        "50",
        "capped at the size"
    );
}

/// Two `factory serve --store` workers (`--max-runs 1`: each executes one of the two runs)
/// run a fan-out each against one throttling provider (`common::throttling`: 20 requests a
/// second, 429 past it), their backend configured with `requests_per_minute` at that rate:
/// the workers share one budget through the database (`flow_budgets`), so together they send
/// no more than the provider's rate (its bucket and a second's refill in the first second, as
/// a single worker would), both runs complete, and fewer than 10% of the requests are
/// refused. Paced each on its own, the two would send twice the rate.
#[test]
fn two_workers_share_one_flow_budget_for_one_backend() {
    use common::throttling::Limits;
    const RATE: usize = 20;
    let counts = fan_outs_on_two_workers(
        "flowshare",
        Limits::rps(RATE as f64),
        &format!("requests_per_minute = {}", RATE * 60),
        60,
    );
    assert!(counts.throttled_share() <= 0.10, "one budget for both workers, few 429s: {counts:?}");
    // A full bucket and a second's refill in the first second; never more after.
    assert!(
        counts.max_received_per_second <= 2 * RATE + 8,
        "the workers together kept the provider's rate: {counts:?}"
    );
}

/// The same with nothing configured: each worker learns the provider's rate from its
/// rate-limit headers, and the two then pace on the one budget they share (made with what
/// the first worker's own bucket held, bounded by what the server says remains). Before any
/// reply has taught a rate, each worker sends its first window of calls unpaced (16, the
/// adaptive limit's start): the first second may see one such window more than a single
/// service would send.
#[test]
fn two_workers_share_a_budget_learned_from_the_providers_headers() {
    use common::throttling::Limits;
    const RATE: usize = 20;
    let counts = fan_outs_on_two_workers("learnshare", Limits::rps(RATE as f64), "", 100);
    assert!(counts.throttled_share() <= 0.10, "one budget for both workers, few 429s: {counts:?}");
    assert!(counts.max_received_per_second <= 3 * RATE, "the workers together kept the provider's rate: {counts:?}");
}

/// The same with a token budget: the provider allows 3,000 tokens a minute (each call costs
/// about 25, so 2 calls a second, far below its request rate), both workers are configured
/// with that `tokens_per_minute`: each call's tokens are taken from the shared bucket at its
/// admission (an estimate) and trued up from its reply's usage, so the two workers together
/// keep the provider's token budget and both runs complete with few 429s.
#[test]
fn two_workers_share_one_token_budget() {
    use common::throttling::Limits;
    let limits = Limits { tokens_per_minute: Some(3000.0), ..Limits::rps(50.0) };
    let counts = fan_outs_on_two_workers("tokenshare", limits, "tokens_per_minute = 3000", 20);
    assert!(counts.throttled_share() <= 0.10, "one token budget for both workers, few 429s: {counts:?}");
}

/// Two workers (`--max-runs 1`) on database `db`, backend `limited` on a throttling provider
/// with `limits` and `extra` lines in its config: a fan-out of `n` agents (64 at once)
/// started through each, checked to execute on both workers at once and to complete with
/// every agent answered once; what the provider counted.
fn fan_outs_on_two_workers(
    db: &str,
    limits: common::throttling::Limits,
    extra: &str,
    n: u32,
) -> common::throttling::Counts {
    use common::service::Service;
    use common::throttling::Throttling;

    let server = Postgres::start();
    let url = server.database(db);
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let provider = runtime.block_on(async { Throttling::start(limits).await });
    let states: Vec<tempfile::TempDir> = (0..2)
        .map(|_| {
            let state = tempfile::tempdir().expect("a state dir");
            let config = format!(
                "default = \"limited\"\n[backends.limited]\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"\n\
                 max_retries = 1\nretry_base_ms = 5\n{extra}\n[backends.limited.pricing]\ninput = 0\noutput = 0\n",
                provider.base_url(),
            );
            std::fs::write(state.path().join("factory.toml"), config).expect("the config");
            state
        })
        .collect();
    let args = ["--store", url.as_str(), "--http", "127.0.0.1:0", "--max-runs", "1"];
    let one = Service::start(states[0].path(), &args);
    let two = Service::start(states[1].path(), &args);
    let (api1, api2) = (Api::of(states[0].path(), &one.log()), Api::of(states[1].path(), &two.log()));

    let mut runs = start_fanouts(&runtime, &api1, 1, n, 64);
    runs.extend(start_fanouts(&runtime, &api2, 1, n, 64));
    // Both workers execute a run at once (each may own one).
    let mut owners = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while owners < 2 && std::time::Instant::now() < deadline {
        owners = owners.max(
            server.psql(db, "SELECT count(DISTINCT owner) FROM runs WHERE owner IS NOT NULL").parse().unwrap_or(0),
        );
        if server.psql(db, "SELECT count(*) FROM runs WHERE status = 'completed'") == "2" {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for run_id in &runs {
        let done = wait_until_completed(&runtime, &api1, run_id, Duration::from_secs(300));
        assert_eq!(done["status"], "completed", "{done:#}\n{}\n{}", one.log(), two.log());
        assert_eq!(done["result"]["done"], n, "{done:#}");
    }
    assert_eq!(owners, 2, "the two runs executed on two workers at once\n{}\n{}", one.log(), two.log());
    let counts = provider.counts();
    assert_eq!(counts.answered, 2 * n as usize, "every agent answered once: {counts:?}");
    let key = server.psql(db, "SELECT string_agg(key, ',') FROM flow_budgets");
    assert_eq!(key, format!("openai {} nokey", provider.base_url()), "one budget row, for the endpoint and key");
    one.stop();
    two.stop();
    // The flows (one per endpoint and key in a process) hold no store open: each worker
    // stopped cleanly gave its lease up.
    assert_eq!(server.psql(db, "SELECT bool_and(lease_until <= now()) FROM workers"), "t", "both leases given up");
    counts
}

/// `factory serve --store postgres://...` with `--http`: a run of the probe's fan-out on a
/// real OpenAI-compatible server on 127.0.0.1 (answers 4 calls, then holds every request), the
/// service killed with -9 mid-run and started again: the run is recovered from the database
/// and completes, and no call whose answer was journaled is asked again. The URL's password
/// never shows in the service's log.
#[test]
fn serve_on_postgres_recovers_a_run_after_kill_9_paying_no_journaled_call_twice() {
    use common::fake_openai::{write_config, FakeOpenAi, Mode};
    use common::service::Service;
    use serde_json::{json, Value};
    use std::collections::BTreeSet;

    let server = Postgres::start();
    server.database("serve");
    // Trust authentication ignores the password: it is here to be kept out of every log.
    let url = format!("postgres://postgres:s3cret-pw@127.0.0.1:{}/serve", server.port());
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let fake = runtime.block_on(FakeOpenAi::start(Mode::AnswerThen {
        ok: 4,
        then: Box::new(Mode::Answer { latency: Duration::from_secs(3600) }),
    }));
    let state = tempfile::tempdir().expect("a state dir");
    write_config(state.path(), fake.port(), false, "");
    let config = std::fs::read_to_string(state.path().join("factory.toml")).expect("the config");
    std::fs::write(state.path().join("factory.toml"), format!("default = \"local\"\n{config}")).expect("the config");

    let args = ["--store", url.as_str(), "--http", "127.0.0.1:0"];
    let service = Service::start(state.path(), &args);
    let api = Api::of(state.path(), &service.log());
    let probe = common::component("probe");
    let (status, registered) =
        runtime.block_on(api.call(reqwest::Method::POST, "/api/factories", Some(json!({"path": probe}))));
    assert!(status == 200 || status == 201, "{status} {registered:#}");
    assert_eq!(server.psql("serve", "SELECT count(*) FROM factories"), "1", "registered in the database");
    let start = json!({"name": "probe", "args": {"case": "fanout", "n": 10}, "limits": {"maxConcurrentSubagents": 2}, "approved": true});
    let (status, started) = runtime.block_on(api.call(reqwest::Method::POST, "/api/runs", Some(start)));
    assert_eq!(status, 202, "{started:#}");
    let run_id = started["runId"].as_str().expect("a run id").to_string();

    // Four answers journaled, two calls held open: kill the service there.
    let labels = |entries: &[Value], pred: &dyn Fn(&Value) -> bool| -> BTreeSet<String> {
        entries
            .iter()
            .filter(|e| pred(e))
            .filter_map(|e| e["label"].as_str())
            .map(|l| format!("task {}", l.trim_start_matches("t:")))
            .collect()
    };
    let progress = |api: &Api| -> Vec<Value> {
        let (status, page) = runtime.block_on(api.call(
            reqwest::Method::GET,
            &format!("/api/runs/{run_id}/progress?afterSeq=0&limit=1000"),
            None,
        ));
        assert_eq!(status, 200, "{page:#}");
        page.as_array().cloned().expect("a page of progress")
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let entries = progress(&api);
        let started = labels(&entries, &|e| e["event"] == "agentStarted");
        let answered = labels(&entries, &|e| e["event"] == "agentFinished" && e["status"] == "ok");
        if started.len() >= 6 && answered.len() >= 4 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the fan-out did not get going: {entries:#?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = service.kill();
    assert_eq!(
        server.psql("serve", &format!("SELECT status FROM runs WHERE id = '{run_id}'")),
        "running",
        "killed mid-run"
    );
    let journaled = server.psql("serve", &format!("SELECT count(*) FROM agents WHERE run_id = '{run_id}'"));
    assert_eq!(journaled, "4", "the four answers are in the database");

    // Started again on the same state directory: the same worker, which takes its run back.
    fake.set(Mode::Answer { latency: Duration::ZERO });
    let service = Service::start(state.path(), &args);
    let api = Api::of(state.path(), &service.log());
    let (status, done) = runtime.block_on(api.call(reqwest::Method::GET, &format!("/api/runs/{run_id}/wait"), None));
    assert_eq!(status, 200, "{done:#}");
    assert_eq!(done["status"], "completed", "{done:#}\n{}", service.log());
    assert_eq!(done["result"]["done"], 10, "{done:#}");
    assert_eq!(done["attempts"], 2, "{done:#}");
    assert!(service.log().contains(&format!("recovering run {run_id}")), "{}", service.log());
    let entries = progress(&api);
    let ended: Vec<&Value> = entries.iter().filter(|e| e["event"] == "attemptEnded").collect();
    assert_eq!(ended.last().map(|e| e["replayed"].clone()), Some(Value::from(4)), "{ended:#?}");
    let log = log + &service.stop();

    // Only the two calls in flight at the kill were asked twice.
    let asked = fake.asked();
    let twice: Vec<String> =
        (0..10).map(|i| format!("task {i}")).filter(|p| asked.iter().filter(|a| *a == p).count() == 2).collect();
    assert_eq!(twice.len(), 2, "asked: {asked:?}");
    for i in 0..10 {
        let prompt = format!("task {i}");
        let times = asked.iter().filter(|a| **a == prompt).count();
        assert!(times == 1 || twice.contains(&prompt), "`{prompt}` asked {times} times: {asked:?}");
    }
    assert_eq!(asked.len(), 12, "ten calls and the two in flight at the kill: {asked:?}");
    assert!(log.contains("postgres://postgres:***@127.0.0.1"), "the URL is shown redacted: {log}");
    assert!(!log.contains("s3cret-pw"), "the password never shows: {log}");
}

/// A run of the probe's fan-out on worker 1 (a fake OpenAI server on 127.0.0.1 answers 4
/// calls, then holds every request), worker 1 killed with -9 mid-run, and once its lease has
/// run out two `factory serve --store` workers (their own state directories, so two worker
/// ids) started at the same moment: each claims the interrupted run in the database before
/// resuming it, so exactly one resumes it; the run completes once (two attempts in all), and
/// no prompt whose answer was journaled before the kill reaches the backend again.
#[test]
fn two_workers_starting_together_recover_an_interrupted_run_once() {
    use common::fake_openai::{write_config, FakeOpenAi, Mode};
    use common::service::Service;
    use serde_json::{json, Value};
    use std::collections::BTreeSet;

    let server = Postgres::start();
    let url = server.database("race");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let fake = runtime.block_on(FakeOpenAi::start(Mode::AnswerThen {
        ok: 4,
        then: Box::new(Mode::Answer { latency: Duration::from_secs(3600) }),
    }));
    let states = [
        tempfile::tempdir().expect("a state dir"),
        tempfile::tempdir().expect("a state dir"),
        tempfile::tempdir().expect("a state dir"),
    ];
    for state in &states {
        write_config(state.path(), fake.port(), false, "");
        let config = std::fs::read_to_string(state.path().join("factory.toml")).expect("the config");
        std::fs::write(state.path().join("factory.toml"), format!("default = \"local\"\n{config}"))
            .expect("the config");
    }
    let args = ["--store", url.as_str(), "--http", "127.0.0.1:0"];
    let one = Service::start(states[0].path(), &args);
    let api1 = Api::of(states[0].path(), &one.log());
    let probe = common::component("probe");
    let (status, registered) =
        runtime.block_on(api1.call(reqwest::Method::POST, "/api/factories", Some(json!({"path": probe}))));
    assert!(status == 200 || status == 201, "{status} {registered:#}");
    let start = json!({"name": "probe", "args": {"case": "fanout", "n": 10}, "limits": {"maxConcurrentSubagents": 2}, "approved": true});
    let (status, started) = runtime.block_on(api1.call(reqwest::Method::POST, "/api/runs", Some(start)));
    assert_eq!(status, 202, "{started:#}");
    let run_id = started["runId"].as_str().expect("a run id").to_string();

    // Four answers journaled, two calls held open: kill worker 1 there.
    let progress = |api: &Api| -> Vec<Value> {
        let (status, page) = runtime.block_on(api.call(
            reqwest::Method::GET,
            &format!("/api/runs/{run_id}/progress?afterSeq=0&limit=1000"),
            None,
        ));
        assert_eq!(status, 200, "{page:#}");
        page.as_array().cloned().expect("a page of progress")
    };
    let count = |entries: &[Value], event: &str| {
        entries.iter().filter(|e| e["event"] == event && (event != "agentFinished" || e["status"] == "ok")).count()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let entries = progress(&api1);
        if count(&entries, "agentStarted") >= 6 && count(&entries, "agentFinished") >= 4 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the fan-out did not get going: {entries:#?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    one.kill();
    assert_eq!(
        server.psql("race", &format!("SELECT status FROM runs WHERE id = '{run_id}'")),
        "running",
        "killed mid-run"
    );
    assert_eq!(
        server.psql("race", &format!("SELECT count(*) FROM agents WHERE run_id = '{run_id}'")),
        "4",
        "four answers journaled"
    );
    let journaled: BTreeSet<String> = fake.answered().into_iter().collect();
    assert_eq!(journaled.len(), 4, "the answered prompts are the journaled ones: {journaled:?}");

    // Worker 1's lease runs out (it renews no more), then two workers start together.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while server.psql("race", "SELECT bool_and(lease_until < now()) FROM workers") != "t" {
        assert!(std::time::Instant::now() < deadline, "the lease of the killed worker never ran out");
        std::thread::sleep(Duration::from_millis(100));
    }
    fake.set(Mode::Answer { latency: Duration::ZERO });
    let (two, three) = std::thread::scope(|s| {
        let two = s.spawn(|| Service::start(states[1].path(), &args));
        let three = s.spawn(|| Service::start(states[2].path(), &args));
        (two.join().expect("worker 2 starts"), three.join().expect("worker 3 starts"))
    });
    let api2 = Api::of(states[1].path(), &two.log());
    // Until the worker that claimed it writes its new attempt's start, the run reads as the
    // repair left it (`halted`, interrupted): waited again past that.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let done = loop {
        let (status, done) =
            runtime.block_on(api2.call(reqwest::Method::GET, &format!("/api/runs/{run_id}/wait"), None));
        assert_eq!(status, 200, "{done:#}");
        if done["status"] != "halted" || std::time::Instant::now() >= deadline {
            break done;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(done["status"], "completed", "{done:#}\n{}\n{}", two.log(), three.log());
    assert_eq!(done["result"]["done"], 10, "{done:#}");
    assert_eq!(done["attempts"], 2, "resumed once: {done:#}\n{}\n{}", two.log(), three.log());
    let logs = [two.stop(), three.stop()];
    let resumed = format!("factory serve: recovering run {run_id}");
    assert_eq!(
        logs.iter().filter(|log| log.contains(&resumed)).count(),
        1,
        "exactly one worker resumes the run: {logs:#?}"
    );
    assert_eq!(
        server.psql("race", &format!("SELECT status || ' ' || coalesce(owner, '-') FROM runs WHERE id = '{run_id}'")),
        "completed -",
        "ended, owned by no worker"
    );

    // Every prompt reached the backend; only the two in flight at the kill twice, and no
    // journaled one again.
    let asked = fake.asked();
    for i in 0..10 {
        let prompt = format!("task {i}");
        let times = asked.iter().filter(|a| **a == prompt).count();
        let most = if journaled.contains(&prompt) { 1 } else { 2 };
        assert!(
            (1..=most).contains(&times),
            "`{prompt}` asked {times} times (journaled: {}): {asked:?}",
            journaled.contains(&prompt)
        );
    }
    assert_eq!(asked.len(), 12, "ten calls and the two in flight at the kill: {asked:?}");
}

/// The HTTP API of a service, found in its log, with the token from the state directory.
struct Api {
    base: String,
    token: String,
}

impl Api {
    fn of(state: &std::path::Path, log: &str) -> Api {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut log = log.to_string();
        let base = loop {
            if let Some(rest) = log.lines().find_map(|l| l.split("HTTP API on http://").nth(1)) {
                break format!("http://{}", rest.split("/api/").next().unwrap_or_default());
            }
            assert!(std::time::Instant::now() < deadline, "the service does not serve HTTP: {log}");
            std::thread::sleep(Duration::from_millis(20));
            log = std::fs::read_dir(state)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("serve-"))
                .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
                .and_then(|e| std::fs::read_to_string(e.path()).ok())
                .unwrap_or_default();
        };
        let token = std::fs::read_to_string(state.join("http.token")).expect("the token file").trim().to_string();
        Api { base, token }
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        // Bounded: a call that never answers (a `wait` that never ends) fails the test.
        let mut request = reqwest::Client::new()
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .timeout(Duration::from_secs(300));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("the API answers");
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(serde_json::Value::Null))
    }
}

/// `factory stats` on a PostgreSQL store: its tables as the server measures them, each row's
/// bytes as stored (`pg_column_size`), indexes and the rest of `pg_total_relation_size`; the
/// parts add up to the tables' total, read by the real binary through `factory serve --store`
/// (its control socket) and over HTTP (`GET /api/stats`, the owner's only).
#[test]
fn factory_stats_on_postgres_says_where_the_bytes_go() {
    use common::service::Service;
    use serde_json::Value;

    let server = Postgres::start();
    let url = server.database("stats");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let n = 40;
    runtime.block_on(async {
        let store = PgStore::connect(&url, options("stats-writer")).await.expect("the store connects");
        let mut record = conformance::record("0190f0f0-0000-7000-8000-0000000005a1", "default", RunStatus::Completed);
        record.component_hashes = vec!["5a7".repeat(21) + "5"];
        store.put_blob(&record.component_hashes[0], &Arc::from(vec![7u8; 50_000])).expect("put_blob");
        store.put_run(&mut record, true).await.expect("put_run");
        for i in 0..n {
            let reply = format!("\"reply {i}: {}\"", "words of a reply ".repeat(20));
            store.put_agent(&record.envelope.run_id, &format!("a{i}"), Some(&reply), 100 * i).expect("put_agent");
        }
        store.flush().await.expect("flush");
    });
    let state = tempfile::tempdir().expect("a state dir");
    let service = Service::start(state.path(), &["--store", url.as_str(), "--http", "127.0.0.1:0"]);
    let api = Api::of(state.path(), &service.log());

    // Through the service holding the database (its control socket), not a store opened here.
    let out = common::factory_cmd(state.path(), &["stats", "--json"])
        .env_remove("FACTORY_NO_DAEMON")
        .output()
        .expect("the factory binary starts");
    assert!(out.status.success(), "{}\n{}", common::stderr(&out), service.log());
    let stats = common::stdout_json(&out);
    let table = |name: &str| -> &Value {
        stats["tables"].as_array().expect("tables").iter().find(|t| t["name"] == name).expect(name)
    };
    let sql = |query: &str| -> u64 { server.psql("stats", query).parse().expect("a number") };
    assert_eq!(table("agents")["entries"].as_u64(), Some(n), "{stats:#}");
    assert_eq!(
        table("agents")["storedBytes"].as_u64(),
        Some(sql("SELECT sum(pg_column_size(a.*)) FROM agents a")),
        "rows as stored: {stats:#}"
    );
    assert_eq!(table("agents")["metadataBytes"].as_u64(), Some(sql("SELECT pg_indexes_size('agents')")));
    let total =
        sql("SELECT sum(pg_total_relation_size(c.oid))::bigint FROM pg_class c JOIN pg_namespace ns ON ns.oid = \
         c.relnamespace WHERE c.relkind = 'r' AND ns.nspname = current_schema()");
    assert_eq!(stats["fileBytes"].as_u64(), Some(total), "the store is its tables: {stats:#}");
    let parts = stats["parts"].as_array().expect("parts");
    let sum: u64 = parts.iter().map(|p| p["bytes"].as_u64().expect("bytes")).sum();
    assert_eq!(sum, total, "the parts add up: {stats:#}");
    let part = |name: &str| parts.iter().find(|p| p["part"].as_str().is_some_and(|p| p.starts_with(name))).expect(name);
    assert_eq!(part("journal values")["rows"].as_u64(), Some(n), "{stats:#}");
    assert_eq!(part("components")["rows"].as_u64(), Some(1), "{stats:#}");
    assert!(part("components")["bytes"].as_u64().unwrap_or(0) > 0, "{stats:#}");

    // The same over HTTP, for the owner; a session is refused.
    let (status, over_http) = runtime.block_on(api.call(reqwest::Method::GET, "/api/stats", None));
    assert_eq!(status, 200, "{over_http}");
    assert_eq!(over_http["fileBytes"], stats["fileBytes"], "{over_http:#}");
    assert_eq!(over_http["parts"].as_array().map(Vec::len), Some(parts.len()), "{over_http:#}");
    let as_session = runtime.block_on(async {
        let response = reqwest::Client::new()
            .get(format!("{}/api/stats", api.base))
            .bearer_auth(&api.token)
            .header("factory-session", "someone")
            .send()
            .await
            .expect("the API answers");
        (response.status().as_u16(), response.json::<Value>().await.unwrap_or(Value::Null))
    });
    assert_eq!((as_session.0, as_session.1["code"].as_str()), (400, Some("bad_request")), "{as_session:?}");
    service.stop();
}

/// A database that cannot be reached stops `factory serve --store` at start with an error
/// naming the URL redacted; a `--store` that is not a postgres:// URL is a usage error.
#[test]
fn serve_refuses_an_unreachable_store_without_printing_its_password() {
    // A port nothing listens on (bound, then released).
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a port").port();
    let state = tempfile::tempdir().expect("a state dir");
    let url = format!("postgres://ann:pw-never-shown@127.0.0.1:{port}/db");
    let out = common::factory_in(state.path(), &["serve", "--store", &url]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("postgres://ann:***@127.0.0.1:{port}/db")), "{stderr}");
    assert!(!stderr.contains("pw-never-shown"), "{stderr}");
    // Each cause said once: the pool's and the driver's messages repeat their cause.
    assert_eq!(stderr.matches("Connection refused").count(), 1, "{stderr}");
    // And a warning: a password in a URL on the command line is readable by other users.
    let (warning, error) = stderr.trim().split_once('\n').expect("a warning, then the error");
    assert!(
        warning.contains("warning: the --store URL holds a password") && warning.contains("--store-password-file"),
        "{stderr}"
    );
    assert_eq!(error.lines().count(), 1, "{stderr}");
    let out = common::factory_in(state.path(), &["serve", "--store", "/var/lib/not-a-url"]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Two `factory serve --store` workers (each with its own state directory, so its own worker
/// id) on one database: a run started through worker 1 is listed, detailed and followed
/// through worker 2, and cancelled through worker 2 (a flag on the run and a notify to
/// worker 1, which stops it); both then see it `cancelled`.
#[test]
fn a_run_started_through_one_worker_is_seen_and_cancelled_through_another() {
    use common::fake_openai::{FakeOpenAi, Mode};
    use serde_json::json;

    let server = Postgres::start();
    let url = server.database("two");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    // Every request held open: the run stays running until it is cancelled.
    let fake = runtime.block_on(FakeOpenAi::start(Mode::Answer { latency: Duration::from_secs(3600) }));
    let (states, [one, two], [api1, api2]) = workers::<2>(&server, "two", fake.port(), &[]);
    assert_eq!(server.psql("two", "SELECT count(DISTINCT id) FROM workers"), "2", "two workers");

    let probe = common::component("probe");
    let (status, _) =
        runtime.block_on(api1.call(reqwest::Method::POST, "/api/factories", Some(json!({"path": probe}))));
    assert!(status == 200 || status == 201);
    let start = json!({"name": "probe", "args": {"case": "fanout", "n": 4}, "limits": {"maxConcurrentSubagents": 2}, "approved": true});
    let (status, started) = runtime.block_on(api1.call(reqwest::Method::POST, "/api/runs", Some(start)));
    assert_eq!(status, 202, "{started:#}");
    let run_id = started["runId"].as_str().expect("a run id").to_string();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while fake.asked().len() < 2 {
        assert!(std::time::Instant::now() < deadline, "the run never called its backend");
        std::thread::sleep(Duration::from_millis(20));
    }

    // `factory workers`: both workers, live, worker 1 executing the run.
    let pid_of = |log: String| -> i64 {
        log.lines()
            .find_map(|l| l.strip_prefix("factory serve: pid ")?.split(',').next()?.parse().ok())
            .expect("the pid in the log")
    };
    let out = common::factory_in(states[1].path(), &["workers", "--store", &url, "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let workers: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let workers = workers.as_array().expect("a list").clone();
    assert_eq!(workers.len(), 2, "{workers:#?}");
    assert!(
        workers.iter().all(|w| w["live"] == true && w["leaseSeconds"].as_f64().is_some_and(|s| s > 0.0)),
        "{workers:#?}"
    );
    let by_pid = |pid: i64| {
        workers
            .iter()
            .find(|w| w["pid"] == pid)
            .cloned()
            .unwrap_or_else(|| panic!("no worker with pid {pid}: {workers:#?}"))
    };
    assert_eq!(by_pid(pid_of(one.log()))["runs"], 1, "worker 1 executes the run: {workers:#?}");
    assert_eq!(by_pid(pid_of(one.log()))["runIds"], json!([run_id]), "{workers:#?}");
    assert_eq!(by_pid(pid_of(two.log()))["runs"], 0, "{workers:#?}");
    let table = common::factory_in(states[1].path(), &["workers", "--store", &url]);
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    assert!(table.starts_with("WORKER") && table.lines().count() == 3, "{table}");

    // Worker 2 lists it and shows its detail, from the shared store.
    let (status, runs) = runtime.block_on(api2.call(reqwest::Method::GET, "/api/runs", None));
    assert_eq!(status, 200, "{runs:#}");
    let listed = runs
        .as_array()
        .expect("a list")
        .iter()
        .find(|r| r["runId"] == run_id.as_str())
        .cloned()
        .expect("worker 2 lists the run");
    assert_eq!(listed["status"], "running", "{listed:#}");
    let (status, detail) = runtime.block_on(api2.call(reqwest::Method::GET, &format!("/api/runs/{run_id}"), None));
    assert_eq!(status, 200, "{detail:#}");
    assert_eq!(detail["factory"], "probe", "{detail:#}");

    // Cancelled through worker 2: worker 1 stops it; the cancel answers with the end.
    let (status, cancelled) =
        runtime.block_on(api2.call(reqwest::Method::POST, &format!("/api/runs/{run_id}/cancel"), Some(json!({}))));
    assert_eq!(status, 200, "{cancelled:#}");
    assert_eq!(cancelled["status"], "cancelled", "{cancelled:#}\n{}\n{}", one.log(), two.log());
    let (_, seen) = runtime.block_on(api1.call(reqwest::Method::GET, &format!("/api/runs/{run_id}/wait"), None));
    assert_eq!(seen["status"], "cancelled", "worker 1 sees it ended: {seen:#}");
    let (_, waited) = runtime.block_on(api2.call(reqwest::Method::GET, &format!("/api/runs/{run_id}/wait"), None));
    assert_eq!(waited["status"], "cancelled", "{waited:#}");
    assert_eq!(
        server.psql("two", &format!("SELECT status || ' ' || cancel_requested FROM runs WHERE id = '{run_id}'")),
        "cancelled false",
        "the flag is cleared once the run ended"
    );
    assert_eq!(fake.asked().len(), 2, "no call after the cancel: {:?}", fake.asked());
    two.stop();
    one.stop();
    // Stopped cleanly: both gave their lease up.
    let out = common::factory_in(states[0].path(), &["workers", "--store", &url, "--json"]);
    let workers: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(
        workers.as_array().is_some_and(|w| w.len() == 2 && w.iter().all(|w| w["live"] == false && w["runs"] == 0)),
        "{workers:#}"
    );
}

/// Pause on a cluster (issue 51): a run is paused through either worker (the one that does
/// not execute it asks the other through the database: a flag on the run's row and a
/// `pg_notify`), stays `paused` in the database (a settled run no worker recovers; a second
/// pause is `not_running`), and is resumed to its end through either worker; a run paused at
/// a checkpoint on one worker is answered through the other (the answer kept in the run's
/// record).
#[test]
fn a_run_is_paused_and_resumed_through_either_worker() {
    use common::fake_openai::{FakeOpenAi, Mode};
    use serde_json::json;

    let server = Postgres::start();
    server.database("paused");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    // Two calls answered, then every request held open: the run is running when paused.
    let held = Box::new(Mode::Answer { latency: Duration::from_secs(3600) });
    let fake = runtime.block_on(FakeOpenAi::start(Mode::AnswerThen { ok: 2, then: held }));
    let (_states, [one, two], apis) = workers::<2>(&server, "paused", fake.port(), &[]);
    let run_id = start_fanouts(&runtime, &apis[0], 1, 6, 2).remove(0);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while fake.asked().len() < 4 {
        assert!(std::time::Instant::now() < deadline, "the run never got to its held calls: {:?}", fake.asked());
        std::thread::sleep(Duration::from_millis(20));
    }
    // Which worker executes it: each pauses it, the other through the database.
    let out = common::factory_in(_states[0].path(), &["workers", "--store", &server.url("paused"), "--json"]);
    let workers: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let executes = |log: String| -> bool {
        let pid: i64 = log
            .lines()
            .find_map(|l| l.strip_prefix("factory serve: pid ")?.split(',').next()?.parse().ok())
            .expect("a pid");
        workers.as_array().expect("a list").iter().any(|w| w["pid"] == pid && w["runIds"] == json!([run_id]))
    };
    let (on_one, on_two) = (executes(one.log()), executes(two.log()));
    assert!(on_one != on_two, "one worker executes it: {workers:#}");
    let other = if on_one { &apis[1] } else { &apis[0] };
    let (status, paused) =
        runtime.block_on(other.call(reqwest::Method::POST, &format!("/api/runs/{run_id}/pause"), None));
    assert_eq!((status, paused["status"].as_str()), (200, Some("paused")), "{paused:#}\n{}\n{}", one.log(), two.log());
    assert_eq!(paused["failure"]["kind"], "caller", "{paused:#}");
    for api in &apis {
        let (status, again) =
            runtime.block_on(api.call(reqwest::Method::POST, &format!("/api/runs/{run_id}/pause"), None));
        assert_eq!((status, again["code"].as_str()), (409, Some("not_running")), "{again:#}");
    }
    assert_eq!(
        server.psql("paused", &format!("SELECT status || ' ' || pause_requested FROM runs WHERE id = '{run_id}'")),
        "paused false",
        "the flag is cleared once the run is paused"
    );
    let answered: Vec<String> = fake.answered();
    assert_eq!(answered.len(), 2, "{answered:?}");

    fake.set(Mode::Answer { latency: Duration::ZERO });
    for api in &apis {
        let (status, seen) =
            runtime.block_on(api.call(reqwest::Method::GET, &format!("/api/runs/{run_id}/envelope"), None));
        assert_eq!((status, seen["status"].as_str()), (200, Some("paused")), "{seen:#}");
    }
    let (status, started) = runtime.block_on(apis[1].call(
        reqwest::Method::POST,
        &format!("/api/runs/{run_id}/resume"),
        Some(json!({"approved": true})),
    ));
    assert_eq!(status, 202, "{started:#}");
    let done = wait_until_completed(&runtime, &apis[1], &run_id, Duration::from_secs(120));
    assert_eq!((done["status"].as_str(), done["result"]["done"].as_u64()), (Some("completed"), Some(6)), "{done:#}");
    for prompt in &answered {
        assert_eq!(
            fake.asked().iter().filter(|p| *p == prompt).count(),
            1,
            "`{prompt}` was answered before the pause: never asked again"
        );
    }

    // A checkpoint reached on one worker, answered through the other.
    let start = json!({"name": "probe", "args": {"case": "checkpoint"}, "approved": true});
    let (status, started) = runtime.block_on(apis[0].call(reqwest::Method::POST, "/api/runs", Some(start)));
    assert_eq!(status, 202, "{started:#}");
    let waiting = started["runId"].as_str().expect("a run id").to_string();
    let (_, at) = runtime.block_on(apis[0].call(reqwest::Method::GET, &format!("/api/runs/{waiting}/wait"), None));
    assert_eq!((at["status"].as_str(), at["checkpoint"].as_str()), (Some("paused"), Some("approve")), "{at:#}");
    let answer = json!({"approved": true, "input": {"via": "worker 2"}});
    let (status, _) =
        runtime.block_on(apis[1].call(reqwest::Method::POST, &format!("/api/runs/{waiting}/resume"), Some(answer)));
    assert_eq!(status, 202);
    let done = wait_until_completed(&runtime, &apis[1], &waiting, Duration::from_secs(120));
    assert_eq!(done["result"]["answer"], json!({"via": "worker 2"}), "{done:#}");
    two.stop();
    one.stop();
}

/// A run parked for its backend's quota on a cluster (issue 50): every worker arms a timer
/// for it (the one that parked it, and one started while it waits), and at its `resumeAt`
/// exactly one of them resumes it (the claim in the database): it completes in two
/// attempts, and no call journaled before the quota ran out is paid again. A second parked
/// run is cancelled through the worker that did not park it, and is not resumed.
#[test]
fn a_run_parked_for_its_quota_is_resumed_by_exactly_one_worker_and_cancelled_through_another() {
    use common::fake_openai::{FakeOpenAi, Mode};
    use serde_json::json;

    let server = Postgres::start();
    server.database("parked");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let spent = Mode::QuotaSpent { for_: Some(Duration::from_secs(15)) };
    let fake = runtime.block_on(FakeOpenAi::start(Mode::AnswerThen { ok: 2, then: Box::new(spent) }));
    let (_states, [one], [api1]) = workers::<1>(&server, "parked", fake.port(), &[]);
    let run_id = start_fanouts(&runtime, &api1, 1, 6, 2).remove(0);
    let shown = |api: &Api, run_id: &str| {
        runtime.block_on(api.call(reqwest::Method::GET, &format!("/api/runs/{run_id}"), None)).1
    };
    let parked = |api: &Api, run_id: &str| {
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            let detail = shown(api, run_id);
            if detail["status"] == "halted" {
                assert_eq!(detail["failure"]["kind"], "quota", "{detail:#}");
                return detail;
            }
            assert!(std::time::Instant::now() < deadline, "the run never parked: {detail:#}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let detail = parked(&api1, &run_id);
    assert!(detail["resumeAt"].is_string(), "{detail:#}");
    let journaled: usize = server
        .psql("parked", &format!("SELECT count(*) FROM agents WHERE run_id = '{run_id}'"))
        .parse()
        .expect("a count");
    let answered_then = fake.answered().len();

    // A second worker starts while the run waits: it arms its own timer for it.
    let url = server.url("parked");
    let state2 = worker_states(1, fake.port()).remove(0);
    let two = common::service::Service::start(state2.path(), &["--store", url.as_str(), "--http", "127.0.0.1:0"]);
    assert!(two.log().contains(&format!("run {run_id} (factory probe, session default) is parked")), "{}", two.log());
    let api2 = Api::of(state2.path(), &two.log());
    let done = wait_until_completed(&runtime, &api2, &run_id, Duration::from_secs(120));
    assert_eq!(
        done["status"],
        "completed",
        "{done:#}
{}
{}",
        one.log(),
        two.log()
    );
    assert_eq!(done["result"]["done"], 6, "{done:#}");
    assert_eq!(
        done["attempts"],
        2,
        "resumed once: {done:#}
{}
{}",
        one.log(),
        two.log()
    );
    let resuming = |log: &str| log.matches("resuming a run parked for its backend's quota").count();
    // Both timers have fired once the run completed well past its reset; one resumed it.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        resuming(&one.log()) + resuming(&two.log()),
        1,
        "exactly one worker resumes it:
{}
{}",
        one.log(),
        two.log()
    );
    // The calls answered before the quota ran out and journaled were not asked again.
    assert_eq!(fake.answered().len(), 6 + (answered_then - journaled), "{:?}", fake.answered());

    // Parked again (the quota spent anew, for an hour): cancelled through worker 2.
    fake.set(Mode::QuotaSpent { for_: Some(Duration::from_secs(3600)) });
    let second = start_fanouts(&runtime, &api1, 1, 2, 2).remove(0);
    parked(&api1, &second);
    let (status, cancelled) =
        runtime.block_on(api2.call(reqwest::Method::POST, &format!("/api/runs/{second}/cancel"), Some(json!({}))));
    assert_eq!(status, 200, "{cancelled:#}");
    assert_eq!(
        cancelled["status"],
        "cancelled",
        "{cancelled:#}
{}
{}",
        one.log(),
        two.log()
    );
    assert_eq!(
        server.psql("parked", &format!("SELECT status || ' ' || coalesce(owner, '-') FROM runs WHERE id = '{second}'")),
        "cancelled -"
    );
    assert_eq!(shown(&api1, &second)["status"], "cancelled");
    two.stop();
    one.stop();
}

/// PostgreSQL restarted under a connected worker: the connections the restart closed are
/// replaced (a commit that meets one is retried: every batch is idempotent), nothing
/// committed is lost, later commits and reads work, and the worker keeps its lease.
#[tokio::test]
async fn a_postgres_restart_loses_nothing_and_the_worker_goes_on() {
    let server = Postgres::start();
    let url = server.database("restart");
    let store = PgStore::connect(&url, options("survivor")).await.expect("connects");
    store.put_step("r", "before", "1", 1).expect("put");
    Journal::flush(&store).await.expect("a commit before the restart");
    server.restart();
    store.put_step("r", "after", "2", 2).expect("put");
    let mut record = conformance::record("after-restart", "default", RunStatus::Completed);
    store.put_run(&mut record, true).await.expect("a commit after the restart, on a new connection");
    Journal::flush(&store).await.expect("flush");
    assert_eq!(
        server.psql("restart", "SELECT string_agg(convert_from(key, 'UTF8'), ',' ORDER BY key) FROM steps"),
        "after,before"
    );
    assert_eq!(store.run("after-restart").await.expect("a read after the restart"), Some(record));
    assert!(store.lease_held(), "the lease survived");
}

/// With the database away, a worker's lease runs out by its own monotonic clock (renewals
/// failing): from then on its journal says it is not writable, so the run engine starts no
/// further paid call (the engine checks before every spawn), before any other worker could
/// have fenced it through the database.
#[tokio::test]
async fn a_worker_whose_lease_ran_out_by_its_own_clock_refuses_new_work() {
    let server = Postgres::start();
    let url = server.database("clock");
    let store = PgStore::connect(&url, PgOptions { lease: Duration::from_millis(600), ..options("clock") })
        .await
        .expect("connects");
    assert!(store.writable("r").is_ok() && store.lease_held(), "a fresh lease");
    server.stop();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while store.lease_held() {
        assert!(std::time::Instant::now() < deadline, "the lease never ran out with the database away");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let error = store.writable("r").expect_err("no new work once the lease ran out");
    let cause = std::error::Error::source(&error).and_then(|e| e.downcast_ref::<StoreError>()).expect("a store error");
    assert!(matches!(cause, StoreError::Fenced { worker, .. } if worker == "clock"), "{cause:?}");
}

/// A front door that finds no service starts one with its own environment: with
/// `FACTORY_STORE` set, that service is a worker of the database (no redb file is made).
#[test]
fn a_service_a_front_door_starts_with_factory_store_set_uses_the_database() {
    struct Stop(Option<u32>);
    impl Drop for Stop {
        fn drop(&mut self) {
            if let Some(pid) = self.0 {
                let _ =
                    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM);
                common::service::wait_gone(pid);
            }
        }
    }
    let server = Postgres::start();
    let url = server.database("auto");
    let state = tempfile::tempdir().expect("a state dir");
    let out = common::factory_cmd(state.path(), &["runs", "--json"])
        .env_remove("FACTORY_NO_DAEMON")
        .env("FACTORY_IDLE_SECONDS", "30")
        .env("FACTORY_STORE", &url)
        .output()
        .expect("factory runs");
    let _stop = Stop(Some(common::service::daemon_pid(state.path())));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]", "no runs yet");
    assert_eq!(
        server.psql("auto", "SELECT count(*) FROM workers WHERE lease_until > now()"),
        "1",
        "the service is a worker of the database"
    );
    assert!(!state.path().join(factory_host::store::STORE_FILE).exists(), "no redb store was made");
}

/// `count` state directories, each with a `factory.toml` whose default backend `local` is the
/// fake OpenAI server on `port`.
fn worker_states(count: usize, port: u16) -> Vec<tempfile::TempDir> {
    (0..count)
        .map(|_| {
            let state = tempfile::tempdir().expect("a state dir");
            common::fake_openai::write_config(state.path(), port, false, "");
            let config = std::fs::read_to_string(state.path().join("factory.toml")).expect("the config");
            std::fs::write(state.path().join("factory.toml"), format!("default = \"local\"\n{config}"))
                .expect("the config");
            state
        })
        .collect()
}

/// `N` `factory serve --store URL --http 127.0.0.1:0 EXTRA...` workers on database `db` of
/// `server`, started one after the other, each with its own state directory (so its own
/// worker id) whose default backend `local` is the fake OpenAI server on `port`: their state
/// directories, the services and their HTTP APIs.
fn workers<const N: usize>(
    server: &Postgres,
    db: &str,
    port: u16,
    extra: &[&str],
) -> ([tempfile::TempDir; N], [common::service::Service; N], [Api; N]) {
    let url = server.url(db);
    let states: [tempfile::TempDir; N] = std::array::from_fn(|_| worker_states(1, port).remove(0));
    let mut args = vec!["--store", url.as_str(), "--http", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let services: [common::service::Service; N] =
        std::array::from_fn(|i| common::service::Service::start(states[i].path(), &args));
    let apis = std::array::from_fn(|i| Api::of(states[i].path(), &services[i].log()));
    (states, services, apis)
}

/// Register the probe through `api` and start `runs` fan-outs of `n` calls through it; the
/// run ids.
fn start_fanouts(runtime: &tokio::runtime::Runtime, api: &Api, runs: usize, n: u32, concurrent: u32) -> Vec<String> {
    use serde_json::json;
    let probe = common::component("probe");
    let (status, registered) =
        runtime.block_on(api.call(reqwest::Method::POST, "/api/factories", Some(json!({"path": probe}))));
    assert!(status == 200 || status == 201, "{status} {registered:#}");
    (0..runs)
        .map(|_| {
            let start = json!({"name": "probe", "args": {"case": "fanout", "n": n}, "limits": {"maxConcurrentSubagents": concurrent}, "approved": true});
            let (status, started) = runtime.block_on(api.call(reqwest::Method::POST, "/api/runs", Some(start)));
            assert_eq!(status, 202, "{started:#}");
            started["runId"].as_str().expect("a run id").to_string()
        })
        .collect()
}

/// Wait (at most `limit`) through `api` until run `run_id` is no longer running nor halted
/// (a requeued run is halted until a worker resumes it); its envelope.
fn wait_until_completed(
    runtime: &tokio::runtime::Runtime,
    api: &Api,
    run_id: &str,
    limit: Duration,
) -> serde_json::Value {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let (status, done) =
            runtime.block_on(api.call(reqwest::Method::GET, &format!("/api/runs/{run_id}/wait"), None));
        assert_eq!(status, 200, "{done:#}");
        if done["status"] != "halted" || std::time::Instant::now() >= deadline {
            return done;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Wait (at most `limit`) until `sql` on `db` answers `want`.
fn wait_for_sql(server: &Postgres, db: &str, sql: &str, want: &str, limit: Duration, context: &dyn Fn() -> String) {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let got = server.psql(db, sql);
        if got == want {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "`{sql}` answers {got:?}, not {want:?}\n{}", context());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Three `factory serve --store` workers; worker A (`--max-runs 0`) executes nothing, so the
/// runs started through it wait in the queue and workers B and C claim them (`FOR UPDATE
/// SKIP LOCKED`, woken by one notification per enqueue). Each run is claimed and started
/// once, by B or C, every run completes, and every call reached the backend once.
#[test]
fn runs_started_through_one_worker_are_claimed_once_by_the_others() {
    use common::fake_openai::{FakeOpenAi, Mode};
    use common::service::Service;

    let server = Postgres::start();
    let url = server.database("queue");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let fake = runtime.block_on(FakeOpenAi::start(Mode::Answer { latency: Duration::from_millis(100) }));
    let states = worker_states(3, fake.port());
    let a = Service::start(states[0].path(), &["--store", &url, "--http", "127.0.0.1:0", "--max-runs", "0"]);
    let api = Api::of(states[0].path(), &a.log());
    let b = Service::start(states[1].path(), &["--store", &url]);
    let c = Service::start(states[2].path(), &["--store", &url]);
    let runs = start_fanouts(&runtime, &api, 6, 2, 2);
    for run_id in &runs {
        let (status, done) =
            runtime.block_on(api.call(reqwest::Method::GET, &format!("/api/runs/{run_id}/wait"), None));
        assert_eq!(status, 200, "{done:#}");
        assert_eq!(done["status"], "completed", "{done:#}\n{}\n{}\n{}", a.log(), b.log(), c.log());
        assert_eq!(done["result"]["done"], 2, "{done:#}");
        assert_eq!(done["attempts"], 1, "{done:#}");
    }
    let logs = [a.stop(), b.stop(), c.stop()];
    for run_id in &runs {
        let started: Vec<usize> = (0..3)
            .filter(|&i| {
                logs[i].contains(&format!("run={run_id}"))
                    && logs[i].lines().any(|l| l.contains("starting a queued run") && l.contains(run_id.as_str()))
            })
            .collect();
        assert_eq!(started.len(), 1, "run {run_id} started by exactly one worker: {logs:#?}");
        assert_ne!(started[0], 0, "worker A (--max-runs 0) executes nothing: {logs:#?}");
    }
    assert_eq!(fake.asked().len(), 12, "each call once: {:?}", fake.asked());
    assert_eq!(server.psql("queue", "SELECT count(*) FROM run_queue"), "0", "every entry dropped once its run ended");
    assert_eq!(server.psql("queue", "SELECT count(*) FROM runs WHERE owner IS NOT NULL"), "0");
}

/// Three workers; a run's fan-out executes on B or C (A takes none). Once four answers are
/// journaled and two calls are in flight, the executing worker is stopped with SIGSTOP. Past
/// its lease the reaper on a live worker fences it (generation + 1) and requeues the run; the
/// other worker claims it and resumes it from the journal: it completes, no journaled prompt
/// is asked again. The stopped worker, continued afterwards, gets the answers to its two
/// held calls but sends no further request and writes nothing (its commits are refused).
#[test]
fn the_reaper_fences_a_stopped_worker_and_its_run_finishes_elsewhere() {
    use common::fake_openai::{FakeOpenAi, Mode};
    use common::service::{signal, Service};

    let server = Postgres::start();
    let url = server.database("reap");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    // Four answers at once, then the next requests are held 40 s (the stopped worker's).
    let fake = runtime.block_on(FakeOpenAi::start(Mode::AnswerThen {
        ok: 4,
        then: Box::new(Mode::Answer { latency: Duration::from_secs(40) }),
    }));
    let states = worker_states(3, fake.port());
    let a = Service::start(states[0].path(), &["--store", &url, "--http", "127.0.0.1:0", "--max-runs", "0"]);
    let api = Api::of(states[0].path(), &a.log());
    let b = Service::start(states[1].path(), &["--store", &url]);
    let c = Service::start(states[2].path(), &["--store", &url]);
    let run_id = start_fanouts(&runtime, &api, 1, 10, 2).remove(0);
    let context = || format!("{}\n{}\n{}", a.log(), b.log(), c.log());
    wait_for_sql(
        &server,
        "reap",
        &format!("SELECT count(*) FROM agents WHERE run_id = '{run_id}'"),
        "4",
        Duration::from_secs(120),
        &context,
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while fake.asked().len() < 6 {
        assert!(std::time::Instant::now() < deadline, "two calls never got in flight: {:?}", fake.asked());
        std::thread::sleep(Duration::from_millis(20));
    }
    let owner = server.psql("reap", &format!("SELECT w.id || ' ' || w.pid || ' ' || w.generation FROM runs r JOIN workers w ON w.id = r.owner WHERE r.id = '{run_id}'"));
    let parts: Vec<&str> = owner.split(' ').collect();
    assert_eq!(parts.len(), 3, "the run is owned by a worker: {owner:?}");
    let (worker, pid, generation) =
        (parts[0].to_string(), parts[1].parse::<u32>().expect("a pid"), parts[2].parse::<i64>().expect("a generation"));
    let logs = context();
    let (stopped, live) = if b.log().contains(&format!("pid {pid},")) { (b, c) } else { (c, b) };
    assert!(stopped.log().contains(&format!("pid {pid},")), "the owner is B or C: {owner}\n{logs}");
    // The first four prompts were answered and journaled before the stop.
    let mut journaled: Vec<String> = fake.asked()[..4].to_vec();
    let mut answered = fake.answered();
    journaled.sort();
    answered.sort();
    assert_eq!(answered, journaled, "the first four asked were the four answered");
    signal(pid, "-STOP");
    fake.set(Mode::Answer { latency: Duration::ZERO });

    // The reaper on A or the live worker fences it and requeues the run (halted, until the
    // live worker, as A takes nothing, resumes it).
    let done = wait_until_completed(&runtime, &api, &run_id, Duration::from_secs(120));
    assert_eq!(done["status"], "completed", "{done:#}\n{}\n{}", a.log(), live.log());
    assert_eq!(done["result"]["done"], 10, "{done:#}");
    assert_eq!(done["attempts"], 2, "{done:#}");
    assert_eq!(
        server.psql("reap", &format!("SELECT generation FROM workers WHERE id = '{worker}'")),
        (generation + 1).to_string(),
        "fenced once"
    );
    assert!(
        a.log().contains("fenced workers") || live.log().contains("fenced workers"),
        "a reaper says so:\n{}\n{}",
        a.log(),
        live.log()
    );
    let asked = fake.asked();
    assert_eq!(asked.len(), 12, "ten calls and the two in flight at the stop: {asked:?}");
    for prompt in &journaled {
        assert_eq!(
            asked.iter().filter(|p| *p == prompt).count(),
            1,
            "journaled `{prompt}` was not asked again: {asked:?}"
        );
    }
    let once = asked.iter().filter(|p| asked.iter().filter(|q| q == p).count() == 1).count();
    assert_eq!(once, 8, "only the two calls in flight at the stop were asked twice: {asked:?}");
    let record = server.psql("reap", &format!("SELECT md5(record) || ' ' || status FROM runs WHERE id = '{run_id}'"));
    let steps = server.psql(
        "reap",
        &format!("SELECT md5(string_agg(outcome, '' ORDER BY key)) FROM agents WHERE run_id = '{run_id}'"),
    );

    // Continued: its held calls are answered (40 s after they were asked; the first answer
    // it cannot journal ends its attempt, dropping the other), and it writes nothing and asks
    // nothing more.
    signal(pid, "-CONT");
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while fake.answered().len() < 11 {
        assert!(std::time::Instant::now() < deadline, "the held calls were never answered: {:?}", fake.answered());
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(fake.asked().len(), 12, "the continued worker sends no further request: {:?}", fake.asked());
    assert_eq!(
        server.psql("reap", &format!("SELECT md5(record) || ' ' || status FROM runs WHERE id = '{run_id}'")),
        record,
        "the run's record is untouched"
    );
    assert_eq!(
        server.psql(
            "reap",
            &format!("SELECT md5(string_agg(outcome, '' ORDER BY key)) FROM agents WHERE run_id = '{run_id}'")
        ),
        steps,
        "the journal is untouched"
    );
    assert!(stopped.log().contains("lost its lease"), "the continued worker knows it was fenced: {}", stopped.log());
    stopped.kill();
    live.stop();
    a.stop();
}

/// Three workers, each `--max-runs 2 --cluster-max-runs 4 --backend-max-calls local=3`, and
/// 20 fan-outs (2 calls each, both at once) started through worker A: while they run, a
/// sampler reads the runs each worker owns; at most 2 per worker and 4 in all, and the fake
/// server never has more than 3 calls in flight (without the backend cap, 4 runs would make
/// 8). Every run completes, each call asked once.
#[test]
fn cluster_caps_hold_under_twenty_runs() {
    use common::fake_openai::{FakeOpenAi, Mode};
    use common::service::Service;

    let server = Postgres::start();
    let url = server.database("caps");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let fake = runtime.block_on(FakeOpenAi::start(Mode::Answer { latency: Duration::from_millis(300) }));
    let states = worker_states(3, fake.port());
    let caps = ["--max-runs", "2", "--cluster-max-runs", "4", "--backend-max-calls", "local=3"];
    let mut args = vec!["--store", url.as_str(), "--http", "127.0.0.1:0"];
    args.extend(caps);
    let a = Service::start(states[0].path(), &args);
    let api = Api::of(states[0].path(), &a.log());
    let mut args = vec!["--store", url.as_str()];
    args.extend(caps);
    let b = Service::start(states[1].path(), &args);
    let c = Service::start(states[2].path(), &args);

    let sampling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let (sampling, port) = (sampling.clone(), server.port());
        std::thread::spawn(move || {
            let (mut most_one, mut most_all) = (0i64, 0i64);
            while sampling.load(std::sync::atomic::Ordering::SeqCst) {
                let out = std::process::Command::new(std::path::Path::new(common::postgres::PG_BIN).join("psql"))
                    .args(["-X", "-q", "-A", "-t", "-h", "127.0.0.1", "-p", &port.to_string(), "-U", "postgres", "-d", "caps", "-c"])
                    .arg("SELECT coalesce(max(n), 0) || ' ' || coalesce(sum(n), 0) FROM (SELECT count(*) AS n FROM runs WHERE owner IS NOT NULL GROUP BY owner) o")
                    .output()
                    .expect("psql");
                let text = String::from_utf8_lossy(&out.stdout);
                let mut parts = text.split_whitespace().map(|n| n.parse::<i64>().unwrap_or(0));
                most_one = most_one.max(parts.next().unwrap_or(0));
                most_all = most_all.max(parts.next().unwrap_or(0));
                std::thread::sleep(Duration::from_millis(30));
            }
            (most_one, most_all)
        })
    };
    let runs = start_fanouts(&runtime, &api, 20, 2, 2);
    for run_id in &runs {
        let (status, done) =
            runtime.block_on(api.call(reqwest::Method::GET, &format!("/api/runs/{run_id}/wait"), None));
        assert_eq!(status, 200, "{done:#}");
        assert_eq!(done["status"], "completed", "{done:#}\n{}\n{}\n{}", a.log(), b.log(), c.log());
    }
    sampling.store(false, std::sync::atomic::Ordering::SeqCst);
    let (most_one, most_all) = sampler.join().expect("the sampler");
    assert!(most_one <= 2, "a worker owned {most_one} runs at once (cap 2)");
    assert!((1..=4).contains(&most_all), "the workers owned {most_all} runs at once (cluster cap 4)");
    let calls = fake.max_in_flight();
    assert!((1..=3).contains(&calls), "{calls} calls in flight at once (backend cap 3)");
    assert_eq!(fake.asked().len(), 40, "each call once");
    assert_eq!(
        server.psql("caps", "SELECT count(*) FROM call_slots WHERE holder IS NOT NULL"),
        "0",
        "every slot given back"
    );
    a.stop();
    b.stop();
    c.stop();
}

/// Two workers; a run executes on worker A (it accepted it and had room) with its calls held
/// by the backend. SIGTERM to A (`--drain-seconds 1`): A stops claiming, waits 1 s, halts the
/// run and hands it back to the queue, gives its lease up and exits 0; worker B claims the
/// run and resumes it from its journal, and no answered call is asked again. A `wait`
/// through B open across the drain answers with that end, not A's `halted`.
#[test]
fn sigterm_drains_a_worker_and_hands_its_runs_back() {
    use common::fake_openai::{FakeOpenAi, Mode};
    use common::service::Service;

    let server = Postgres::start();
    let url = server.database("drain");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let fake = runtime.block_on(FakeOpenAi::start(Mode::AnswerThen {
        ok: 2,
        then: Box::new(Mode::Answer { latency: Duration::from_secs(3600) }),
    }));
    let states = worker_states(2, fake.port());
    let a = Service::start(states[0].path(), &["--store", &url, "--http", "127.0.0.1:0", "--drain-seconds", "1"]);
    let api = Api::of(states[0].path(), &a.log());
    let b = Service::start(states[1].path(), &["--store", &url, "--http", "127.0.0.1:0"]);
    let api_b = Api::of(states[1].path(), &b.log());
    let run_id = start_fanouts(&runtime, &api, 1, 6, 2).remove(0);
    let context = || format!("{}\n{}", a.log(), b.log());
    wait_for_sql(
        &server,
        "drain",
        &format!("SELECT count(*) FROM agents WHERE run_id = '{run_id}'"),
        "2",
        Duration::from_secs(120),
        &context,
    );
    let a_id = server.psql("drain", &format!("SELECT owner FROM runs WHERE id = '{run_id}'"));
    assert_eq!(
        server.psql("drain", &format!("SELECT pid FROM workers WHERE id = '{a_id}'")),
        a.log()
            .lines()
            .find_map(|l| l.strip_prefix("factory serve: pid ")?.split(',').next().map(str::to_string))
            .unwrap_or_default(),
        "A executes it"
    );
    let mut answered = fake.answered();
    answered.sort();
    fake.set(Mode::Answer { latency: Duration::ZERO });

    // A `wait` through B, open across the drain: the attempt A halts is not its answer.
    let (log, (status, done)) = std::thread::scope(|s| {
        let waiter =
            s.spawn(|| runtime.block_on(api_b.call(reqwest::Method::GET, &format!("/api/runs/{run_id}/wait"), None)));
        std::thread::sleep(Duration::from_millis(500));
        (a.stop(), waiter.join().expect("the waiter"))
    });
    assert_eq!(status, 200, "{done:#}");
    assert!(log.contains("factory serve: draining: claiming no more runs"), "{log}");
    assert!(log.contains(&format!("handed 1 run back to the queue: {run_id}")), "{log}");
    assert_eq!(
        server.psql("drain", &format!("SELECT lease_until <= now() FROM workers WHERE id = '{a_id}'")),
        "t",
        "A gave its lease up"
    );
    assert_eq!(done["status"], "completed", "{done:#}\n{log}\n{}", b.log());
    assert_eq!(done["result"]["done"], 6, "{done:#}");
    assert_eq!(done["attempts"], 2, "{done:#}");
    let asked = fake.asked();
    for prompt in &answered {
        assert_eq!(
            asked.iter().filter(|p| *p == prompt).count(),
            1,
            "answered `{prompt}` was not asked again: {asked:?}"
        );
    }
    assert_eq!(asked.len(), 8, "six calls and the two in flight at the drain's end: {asked:?}");
    b.stop();
}

/// A run waits in the queue while no worker can serve it: worker A accepts runs only
/// (`--max-runs 0`); a run cancelled while queued ends `cancelled` at once, having called
/// nothing. Worker B has no backend `local` in its `factory.toml`: it claims the next run,
/// finds it cannot build its backend, and puts it back (the run stays `pending`, unowned,
/// and its `error` names B and why); B tries it again on its slow poll rather than
/// skipping it for good. Worker C, which has `local`, claims it and completes it.
#[test]
fn a_queued_run_waits_for_a_worker_that_can_serve_it_and_can_be_cancelled_while_queued() {
    use common::fake_openai::{FakeOpenAi, Mode};
    use common::service::Service;

    let server = Postgres::start();
    let url = server.database("serveable");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let fake = runtime.block_on(FakeOpenAi::start(Mode::Answer { latency: Duration::ZERO }));
    let states = worker_states(3, fake.port());
    let a = Service::start(states[0].path(), &["--store", &url, "--http", "127.0.0.1:0", "--max-runs", "0"]);
    let api = Api::of(states[0].path(), &a.log());

    let first = start_fanouts(&runtime, &api, 1, 2, 2).remove(0);
    assert_eq!(
        server
            .psql("serveable", &format!("SELECT status || ' ' || coalesce(owner, '-') FROM runs WHERE id = '{first}'")),
        "pending -",
        "queued, owned by nobody"
    );
    let (status, cancelled) = runtime.block_on(api.call(
        reqwest::Method::POST,
        &format!("/api/runs/{first}/cancel"),
        Some(serde_json::json!({})),
    ));
    assert_eq!(status, 200, "{cancelled:#}");
    assert_eq!(cancelled["status"], "cancelled", "{cancelled:#}\n{}", a.log());
    assert_eq!(cancelled["attempts"], 0, "{cancelled:#}");
    assert_eq!(server.psql("serveable", "SELECT count(*) FROM run_queue"), "0", "taken out of the queue");

    // B's config has no backend `local`.
    std::fs::write(states[1].path().join("factory.toml"), "").expect("an empty config");
    let b = Service::start(states[1].path(), &["--store", &url]);
    let second = start_fanouts(&runtime, &api, 1, 2, 2).remove(0);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !b.log().contains("a queued run this worker cannot serve goes back to the queue") {
        assert!(std::time::Instant::now() < deadline, "B never tried the run: {}", b.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        server.psql("serveable", &format!("SELECT r.status || ' ' || coalesce(r.owner, '-') || ' ' || coalesce(q.claimed_by, '-') FROM runs r JOIN run_queue q ON q.run_id = r.id WHERE r.id = '{second}'")),
        "pending - -",
        "put back: {}",
        b.log()
    );
    assert!(fake.asked().is_empty(), "nothing called yet: {:?}", fake.asked());
    let (status, waiting) = runtime.block_on(api.call(reqwest::Method::GET, &format!("/api/runs/{second}"), None));
    assert_eq!(status, 200, "{waiting:#}");
    let b_id = server.psql(
        "serveable",
        &format!(
            "SELECT id FROM workers WHERE pid = {}",
            b.log()
                .lines()
                .find_map(|l| l.strip_prefix("factory serve: pid ")?.split(',').next().map(str::to_string))
                .expect("B's pid")
        ),
    );
    let error = waiting["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("waiting in the queue") && error.contains(&format!("worker {b_id}")) && error.contains("local"),
        "the run says why it waits: {waiting:#}"
    );
    // Tried again on B's slow poll (every 5 s), not skipped until B restarts.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while b.log().matches("a queued run this worker cannot serve goes back to the queue").count() < 2 {
        assert!(std::time::Instant::now() < deadline, "B never tried the run again: {}", b.log());
        std::thread::sleep(Duration::from_millis(100));
    }

    let c = Service::start(states[2].path(), &["--store", &url]);
    let done = wait_until_completed(&runtime, &api, &second, Duration::from_secs(60));
    assert_eq!(done["status"], "completed", "{done:#}\n{}\n{}", b.log(), c.log());
    let logs = [a.stop(), b.stop(), c.stop()];
    assert!(logs[2].contains("starting a queued run"), "C ran it: {logs:#?}");
    assert!(!logs[1].contains("starting a queued run"), "B did not: {logs:#?}");
    assert_eq!(fake.asked().len(), 2, "{:?}", fake.asked());
}

/// The prompts answered (`agentFinished` ok, not replayed) in each attempt of a run, read
/// through `api`: index 0 is attempt 1. An answer journaled in attempt `k` was committed
/// before that attempt ended.
fn answered_per_attempt(
    runtime: &tokio::runtime::Runtime,
    api: &Api,
    run_id: &str,
) -> Vec<std::collections::BTreeSet<String>> {
    let (status, page) = runtime.block_on(api.call(
        reqwest::Method::GET,
        &format!("/api/runs/{run_id}/progress?afterSeq=0&limit=1000"),
        None,
    ));
    assert_eq!(status, 200, "{page:#}");
    let mut attempts: Vec<std::collections::BTreeSet<String>> = Vec::new();
    for entry in page.as_array().expect("a page of progress") {
        if entry["event"] == "attemptStarted" {
            attempts.push(Default::default());
        } else if entry["event"] == "agentFinished" && entry["status"] == "ok" && entry["cached"] != true {
            if let (Some(label), Some(current)) = (entry["label"].as_str(), attempts.last_mut()) {
                current.insert(format!("task {}", label.trim_start_matches("t:")));
            }
        }
    }
    attempts
}

/// A field of run `run_id`'s record in database `db` (a `#>>` path such as `envelope,status`).
fn record_field(server: &Postgres, db: &str, run_id: &str, path: &str) -> String {
    server.psql(
        db,
        &format!("SELECT convert_from(record, 'UTF8')::jsonb #>> '{{{path}}}' FROM runs WHERE id = '{run_id}'"),
    )
}

/// PostgreSQL stopped under a worker mid-run for longer than the worker's lease (the bound on
/// how long its writes wait and retry): the attempt stops; once PostgreSQL is back the worker
/// rejoins the store with a new generation, writes the run `halted` with a storage failure
/// and puts it back in the queue, and claims it again: the run is resumed from its journal
/// with no caller (automatic recovery 1 of `--max-recoveries 1`), and no prompt committed
/// before the outage reaches the backend again. A second outage finds the bound reached: the
/// run stays `halted`, naming `factory resume`, which completes it.
#[test]
fn a_postgres_outage_past_the_lease_requeues_the_run_and_a_second_one_needs_resume() {
    use common::fake_openai::{FakeOpenAi, Mode};
    use common::service::Service;
    use serde_json::Value;

    let server = Postgres::start();
    let url = server.database("outage");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let fake = runtime.block_on(FakeOpenAi::start(Mode::Answer { latency: Duration::from_millis(400) }));
    let state = worker_states(1, fake.port()).remove(0);
    let service =
        Service::start(state.path(), &["--store", url.as_str(), "--http", "127.0.0.1:0", "--max-recoveries", "1"]);
    let api = Api::of(state.path(), &service.log());
    let n = 120;
    let run_id = start_fanouts(&runtime, &api, 1, n, 2).remove(0);
    let journaled = |least: usize| {
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while record_field(&server, "outage", &run_id, "envelope,status") != "running"
            || server
                .psql("outage", &format!("SELECT count(*) FROM agents WHERE run_id = '{run_id}'"))
                .parse::<usize>()
                .unwrap_or(0)
                < least
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the fan-out did not get to {least} answers: {}",
                service.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let outage = || {
        // Away for longer than the worker's lease (10 s): its writes wait, then give up.
        server.stop();
        std::thread::sleep(Duration::from_secs(14));
        server.start_again();
    };
    journaled(4);
    outage();

    // Rejoined, requeued, claimed again and resumed from the journal by the worker itself.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !(record_field(&server, "outage", &run_id, "envelope,attempts") == "2"
        && record_field(&server, "outage", &run_id, "envelope,status") == "running")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the run was not resumed after the outage: {}\n{}",
            record_field(&server, "outage", &run_id, "envelope"),
            service.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(record_field(&server, "outage", &run_id, "recoveries"), "1", "an automatic recovery, counted");
    assert!(
        service.log().contains("rejoined the store") && service.log().contains("back in the queue"),
        "{}",
        service.log()
    );

    // The second outage: the bound is reached, the run waits for a caller.
    let before_second = server
        .psql("outage", &format!("SELECT count(*) FROM agents WHERE run_id = '{run_id}'"))
        .parse::<usize>()
        .unwrap_or(0);
    journaled(before_second + 4);
    outage();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !(record_field(&server, "outage", &run_id, "envelope,status") == "halted"
        && server.psql("outage", "SELECT count(*) FROM run_queue") == "0")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the run did not end halted: {}\n{}",
            record_field(&server, "outage", &run_id, "envelope"),
            service.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (status, halted) = runtime.block_on(api.call(reqwest::Method::GET, &format!("/api/runs/{run_id}/wait"), None));
    assert_eq!(status, 200, "{halted:#}");
    assert_eq!(halted["status"], "halted", "{halted:#}");
    assert_eq!(halted["attempts"], 2, "no third attempt past the bound: {halted:#}");
    let message = halted["failure"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("recovered automatically 1 time") && message.contains(&format!("factory resume {run_id}")),
        "{halted:#}"
    );
    let attempts = answered_per_attempt(&runtime, &api, &run_id);
    let asked_before = fake.asked().len();

    let out = common::factory_cmd(state.path(), &["resume", &run_id, "--yes", "--json"])
        .env_remove("FACTORY_NO_DAEMON")
        .output()
        .expect("factory resume");
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stderr), service.log());
    let done: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(done["status"], "completed", "{done:#}\n{}", service.log());
    assert_eq!(done["result"]["done"], n, "{done:#}");
    assert_eq!(done["attempts"], 3, "{done:#}");
    // No prompt committed before an outage was asked again after it.
    let asked = fake.asked();
    let committed: std::collections::BTreeSet<String> = attempts.iter().flatten().cloned().collect();
    let again: Vec<&String> = asked[asked_before..].iter().filter(|p| committed.contains(*p)).collect();
    assert!(again.is_empty(), "prompts committed before the second outage asked again: {again:?}");
    for prompt in &attempts[0] {
        assert_eq!(
            asked.iter().filter(|p| *p == prompt).count(),
            1,
            "`{prompt}`, committed before the first outage, asked again: {asked:?}"
        );
    }
    for i in 0..n {
        assert!(asked.contains(&format!("task {i}")), "task {i} never asked");
    }
    assert_eq!(server.psql("outage", &format!("SELECT status FROM runs WHERE id = '{run_id}'")), "completed");
    service.stop();
}

/// Two workers, each executing a run of its own, lose their leases together: PostgreSQL is
/// stopped for longer than the lease and started again. Neither worker, rejoining, takes the
/// other's run for a crashed one: each run goes back to the queue once (by its own worker's
/// rejoin, or by a reaper that fenced a worker not yet rejoined) and is resumed once, from
/// its journal. Both complete with two attempts, none is left `halted`, and no prompt a run
/// committed before the outage reaches the backend again for that run.
#[test]
fn two_workers_losing_their_leases_in_one_outage_each_run_is_resumed_once() {
    use common::fake_openai::{FakeOpenAi, Mode};
    use common::service::Service;

    let server = Postgres::start();
    server.database("outage2");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let fake = runtime.block_on(FakeOpenAi::start(Mode::Answer { latency: Duration::from_millis(400) }));
    let (states, services, apis) = workers::<2>(&server, "outage2", fake.port(), &[]);
    let n = 40;
    let runs: Vec<String> = apis.iter().map(|api| start_fanouts(&runtime, api, 1, n, 2).remove(0)).collect();
    let context = || services.iter().map(Service::log).collect::<Vec<_>>().join("\n");
    let owners: Vec<String> = runs
        .iter()
        .map(|run| server.psql("outage2", &format!("SELECT coalesce(owner, '-') FROM runs WHERE id = '{run}'")))
        .collect();
    assert_ne!(owners[0], owners[1], "each worker executes the run started through it: {owners:?}");
    for run in &runs {
        wait_for_sql(
            &server,
            "outage2",
            &format!("SELECT count(*) >= 4 FROM agents WHERE run_id = '{run}'"),
            "t",
            Duration::from_secs(120),
            &context,
        );
    }
    server.stop();
    std::thread::sleep(Duration::from_secs(14));
    server.start_again();

    for (run, api) in runs.iter().zip(&apis) {
        let (status, done) = runtime.block_on(api.call(reqwest::Method::GET, &format!("/api/runs/{run}/wait"), None));
        assert_eq!(status, 200, "{done:#}");
        assert_eq!(done["status"], "completed", "{done:#}\n{}", context());
        assert_eq!(done["result"]["done"], n, "{done:#}");
        assert_eq!(done["attempts"], 2, "resumed once: {done:#}\n{}", context());
        assert_eq!(record_field(&server, "outage2", run, "recoveries"), "1", "{}", context());
    }
    // Each prompt: once for a run that committed it before the outage, at most twice for one
    // that did not (asked during the outage, its answer never committed).
    let asked = fake.asked();
    let committed: Vec<std::collections::BTreeSet<String>> =
        runs.iter().map(|run| answered_per_attempt(&runtime, &apis[0], run).remove(0)).collect();
    for i in 0..n {
        let prompt = format!("task {i}");
        let most: usize = committed.iter().map(|c| if c.contains(&prompt) { 1 } else { 2 }).sum();
        let times = asked.iter().filter(|p| **p == prompt).count();
        assert!(
            (2..=most).contains(&times),
            "`{prompt}` asked {times} times (at most {most}): {committed:?}\n{asked:?}"
        );
    }
    assert_eq!(
        server.psql("outage2", "SELECT count(*) FROM runs WHERE status <> 'completed' OR owner IS NOT NULL"),
        "0"
    );
    assert_eq!(server.psql("outage2", "SELECT count(*) FROM run_queue"), "0");
    for service in services {
        service.stop();
    }
    drop(states);
}

/// A poison run (one that keeps killing its worker) ends `halted` after a bounded number of
/// automatic recoveries, counted in the run's record in the database, so across workers: the
/// run's worker is killed with -9 mid-run three times; worker A recovers it once (restarted
/// on its own state directory), worker B (another id, once A's lease ran out) a second time,
/// and B's next start leaves it `halted` (`--max-recoveries 2`), saying how to resume it.
#[test]
fn a_run_that_keeps_killing_its_worker_ends_halted_after_bounded_recoveries_across_workers() {
    use common::fake_openai::{write_config, FakeOpenAi, Mode};
    use common::service::Service;
    use serde_json::json;

    let server = Postgres::start();
    let url = server.database("poison");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    // Every request held open: each attempt stays running until its worker is killed.
    let fake = runtime.block_on(FakeOpenAi::start(Mode::Answer { latency: Duration::from_secs(3600) }));
    let states = [tempfile::tempdir().expect("a state dir"), tempfile::tempdir().expect("a state dir")];
    for state in &states {
        write_config(state.path(), fake.port(), false, "");
        let config = std::fs::read_to_string(state.path().join("factory.toml")).expect("the config");
        std::fs::write(state.path().join("factory.toml"), format!("default = \"local\"\n{config}"))
            .expect("the config");
    }
    let args = ["--store", url.as_str(), "--http", "127.0.0.1:0", "--max-recoveries", "2"];
    let field = |run_id: &str, path: &str| {
        server.psql(
            "poison",
            &format!("SELECT convert_from(record, 'UTF8')::jsonb #>> '{{{path}}}' FROM runs WHERE id = '{run_id}'"),
        )
    };
    // Wait until attempt `n` of the run is running (and has asked its backend).
    let running = |run_id: &str, n: u32, log: &dyn Fn() -> String| {
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while !(field(run_id, "envelope,status") == "running"
            && field(run_id, "envelope,attempts") == n.to_string()
            && fake.requests() >= n as usize)
        {
            assert!(std::time::Instant::now() < deadline, "attempt {n} did not start: {}", log());
            std::thread::sleep(Duration::from_millis(50));
        }
    };

    let a = Service::start(states[0].path(), &args);
    let api = Api::of(states[0].path(), &a.log());
    let probe = common::component("probe");
    let (status, _) = runtime.block_on(api.call(reqwest::Method::POST, "/api/factories", Some(json!({"path": probe}))));
    assert!(status == 200 || status == 201);
    let start = json!({"name": "probe", "args": {"case": "fanout", "n": 2}, "limits": {"maxConcurrentSubagents": 1}, "approved": true});
    let (status, started) = runtime.block_on(api.call(reqwest::Method::POST, "/api/runs", Some(start)));
    assert_eq!(status, 202, "{started:#}");
    let run_id = started["runId"].as_str().expect("a run id").to_string();
    running(&run_id, 1, &|| a.log());
    a.kill();

    // Worker A again (its own id: it takes its run back at once): recovery 1 of 2.
    let a = Service::start(states[0].path(), &args);
    running(&run_id, 2, &|| a.log());
    assert_eq!(field(&run_id, "recoveries"), "1");
    a.kill();

    // Worker B, once A's lease has run out: recovery 2 of 2, counted from the database.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while server.psql("poison", "SELECT count(*) FROM workers WHERE lease_until > now()") != "0" {
        assert!(std::time::Instant::now() < deadline, "worker A's lease never ran out");
        std::thread::sleep(Duration::from_millis(200));
    }
    let b = Service::start(states[1].path(), &args);
    running(&run_id, 3, &|| b.log());
    assert_eq!(field(&run_id, "recoveries"), "2");
    let log_b = b.kill();
    assert!(log_b.contains(&format!("recovering run {run_id}")), "{log_b}");

    // B's next start: the bound is reached, the run stays halted and says how to resume it.
    let b = Service::start(states[1].path(), &args);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !b.log().contains(&format!("not recovering run {run_id}")) {
        assert!(std::time::Instant::now() < deadline, "{}", b.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(field(&run_id, "envelope,status"), "halted");
    assert_eq!(field(&run_id, "envelope,attempts"), "3", "no fourth attempt");
    let message = field(&run_id, "envelope,failure,message");
    assert!(
        message.contains("recovered automatically 2 times") && message.contains(&format!("factory resume {run_id}")),
        "{message}"
    );
    assert_eq!(fake.requests(), 3, "one call per attempt, none after the bound");
    b.stop();
}

/// The cluster's bearer token: two `factory serve --store ... --http` workers given the same
/// `--token-file` (and a `factory mcp --http` given it through `FACTORY_TOKEN_FILE`) each
/// accept that token, not a random one of their own, and refuse any other; a token file
/// others can read is refused at start, naming the file and never the token.
#[test]
fn workers_given_one_token_file_accept_the_cluster_token() {
    use common::service::Service;
    use std::io::BufRead;
    use std::os::unix::fs::PermissionsExt;

    let server = Postgres::start();
    let url = server.database("token");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let secrets = tempfile::tempdir().expect("a directory");
    let token_file = secrets.path().join("cluster.token");
    let token = "c1uster-t0ken-0123456789abcdef0123456789abcdef";
    std::fs::write(&token_file, format!("{token}\n")).expect("the token file");
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).expect("chmod 600");
    let states = [tempfile::tempdir().expect("a state dir"), tempfile::tempdir().expect("a state dir")];
    let file_arg = token_file.to_string_lossy().into_owned();
    let args = ["--store", url.as_str(), "--http", "127.0.0.1:0", "--token-file", file_arg.as_str()];
    let one = Service::start(states[0].path(), &args);
    let two = Service::start(states[1].path(), &args);
    for (state, service) in [(&states[0], &one), (&states[1], &two)] {
        let mut api = Api::of(state.path(), &service.log());
        assert_eq!(api.token, token, "the state directory's token file holds the cluster's");
        let (status, runs) = runtime.block_on(api.call(reqwest::Method::GET, "/api/runs", None));
        assert_eq!(status, 200, "{runs:#}");
        api.token = "not-the-cluster-token-0123456789abcdef".into();
        let (status, _) = runtime.block_on(api.call(reqwest::Method::GET, "/api/runs", None));
        assert_eq!(status, 401, "another token is refused");
    }

    // MCP over HTTP takes the same token (here from the environment).
    let mcp_state = tempfile::tempdir().expect("a state dir");
    let mut mcp = common::factory_cmd(mcp_state.path(), &["mcp", "--http", "127.0.0.1:0"])
        .env("FACTORY_TOKEN_FILE", &token_file)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("factory mcp --http starts");
    let mut lines = std::io::BufReader::new(mcp.stderr.take().expect("its stderr")).lines();
    let mcp_url = loop {
        let line = lines.next().expect("it says where it listens").expect("a line");
        if let Some(rest) = line.split("streamable HTTP on ").nth(1) {
            break rest.split_whitespace().next().expect("a URL").to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    let initialize = |bearer: &str| {
        runtime.block_on(
            reqwest::Client::new()
                .post(&mcp_url)
                .bearer_auth(bearer)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .body(r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#)
                .send(),
        )
        .expect("MCP answers")
        .status()
        .as_u16()
    };
    assert_eq!(initialize(token), 200, "the cluster token opens an MCP session");
    assert_eq!(initialize("not-the-cluster-token-0123456789abcdef"), 401);
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(mcp.id() as i32), nix::sys::signal::Signal::SIGTERM);
    let _ = mcp.wait();
    two.stop();
    one.stop();

    // A token file others can read is refused at start.
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o644)).expect("chmod 644");
    let out = common::factory_cmd(
        states[0].path(),
        &["serve", "--store", &url, "--http", "127.0.0.1:0", "--token-file", &file_arg],
    )
    .output()
    .expect("factory serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("readable by others") && stderr.contains("cluster.token"),
        "{stderr}"
    );
    assert!(!stderr.contains(token), "{stderr}");
}

/// Where a worker finds its store: `--store`, else `FACTORY_STORE`, else the config file's
/// `store` key. `factory workers` names the database it could not reach (each source points
/// to a database that does not exist, so the error tells which was used), once, with the
/// password redacted; `factory serve` with only the config key is a worker of that database.
#[test]
fn the_store_comes_from_the_flag_then_the_environment_then_the_config_file() {
    use common::service::Service;
    use std::os::unix::fs::PermissionsExt;

    let server = Postgres::start();
    let url = server.database("configured");
    let state = tempfile::tempdir().expect("a state dir");
    let db = |name: &str| format!("postgres://postgres:pw-{name}@127.0.0.1:{}/{name}", server.port());
    let config = state.path().join("factory.toml");
    let write_config = |store: &str| {
        std::fs::write(&config, format!("store = \"{store}\"\n")).expect("the config");
        std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).expect("chmod 600");
    };
    write_config(&db("from-config"));
    let used = |cmd: &mut std::process::Command| -> String {
        let out = cmd.output().expect("factory workers");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{stderr}");
        assert!(!stderr.contains("pw-"), "the password never shows: {stderr}");
        assert_eq!(stderr.matches("does not exist").count(), 1, "the cause once: {stderr}");
        ["from-flag", "from-env", "from-config"]
            .into_iter()
            .find(|name| stderr.contains(&format!("postgres://postgres:***@127.0.0.1:{}/{name}", server.port())))
            .unwrap_or_else(|| panic!("{stderr}"))
            .to_string()
    };
    let workers = |extra: &[&str]| {
        let mut args = vec!["workers", "--json"];
        args.extend_from_slice(extra);
        let mut cmd = common::factory_cmd(state.path(), &args);
        cmd.env_remove("FACTORY_STORE");
        cmd
    };
    assert_eq!(used(&mut workers(&[])), "from-config");
    assert_eq!(used(workers(&[]).env("FACTORY_STORE", db("from-env"))), "from-env");
    let flag = db("from-flag");
    assert_eq!(used(workers(&["--store", &flag]).env("FACTORY_STORE", db("from-env"))), "from-flag");

    // `store` in the config file: `factory serve` alone is a worker of that database.
    write_config(&url);
    let service = Service::start(state.path(), &[]);
    assert!(service.log().contains("worker of the store postgres://postgres@127.0.0.1"), "{}", service.log());
    assert_eq!(server.psql("configured", "SELECT count(*) FROM workers WHERE lease_until > now()"), "1");
    assert!(!state.path().join(factory_host::store::STORE_FILE).exists(), "no redb store was made");
    let out = common::factory_cmd(state.path(), &["workers", "--json"])
        .env_remove("FACTORY_STORE")
        .output()
        .expect("factory workers");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed:#}");
    service.stop();
    // A config `store` that is not a postgres:// URL is refused, shown redacted.
    write_config("mysql://ann:pw-x@db/x");
    let out =
        common::factory_cmd(state.path(), &["workers"]).env_remove("FACTORY_STORE").output().expect("factory workers");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("postgres://") && !stderr.contains("pw-x"), "{stderr}");
}

/// Two callers resuming one run at the same moment through two workers: the resume claims
/// the run in the database first, so exactly one resumes it and the other is refused with
/// `already_active` (409) — three rounds, the run cancelled between them.
#[test]
fn two_resumes_at_once_through_two_workers_start_one_attempt() {
    use common::fake_openai::{FakeOpenAi, Mode};
    use serde_json::json;

    let server = Postgres::start();
    server.database("resumes");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    // Every request held open: a resumed attempt stays running until it is cancelled.
    let fake = runtime.block_on(FakeOpenAi::start(Mode::Answer { latency: Duration::from_secs(3600) }));
    let (_states, [one, two], [api1, api2]) = workers::<2>(&server, "resumes", fake.port(), &[]);
    let probe = common::component("probe");
    let (status, _) =
        runtime.block_on(api1.call(reqwest::Method::POST, "/api/factories", Some(json!({"path": probe}))));
    assert!(status == 200 || status == 201);
    let start = json!({"name": "probe", "args": {"case": "fanout", "n": 2}, "limits": {"maxConcurrentSubagents": 1}, "approved": true});
    let (status, started) = runtime.block_on(api1.call(reqwest::Method::POST, "/api/runs", Some(start)));
    assert_eq!(status, 202, "{started:#}");
    let run_id = started["runId"].as_str().expect("a run id").to_string();
    let attempts = || {
        server.psql("resumes", &format!("SELECT convert_from(record, 'UTF8')::jsonb #>> '{{envelope,attempts}}' FROM runs WHERE id = '{run_id}'"))
    };
    let status_of = || server.psql("resumes", &format!("SELECT status FROM runs WHERE id = '{run_id}'"));
    let cancel = |expected_attempts: u32| {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !(status_of() == "running"
            && attempts() == expected_attempts.to_string()
            && fake.requests() >= expected_attempts as usize)
        {
            assert!(
                std::time::Instant::now() < deadline,
                "attempt {expected_attempts} did not start\n{}\n{}",
                one.log(),
                two.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let (status, cancelled) =
            runtime.block_on(api2.call(reqwest::Method::POST, &format!("/api/runs/{run_id}/cancel"), Some(json!({}))));
        assert_eq!((status, cancelled["status"].as_str()), (200, Some("cancelled")), "{cancelled:#}");
    };
    cancel(1);
    for round in 0..3u32 {
        let path = format!("/api/runs/{run_id}/resume");
        let ((s1, b1), (s2, b2)) = runtime.block_on(async {
            futures::join!(
                api1.call(reqwest::Method::POST, &path, Some(json!({"approved": true}))),
                api2.call(reqwest::Method::POST, &path, Some(json!({"approved": true})))
            )
        });
        let won = [s1, s2].iter().filter(|s| (200..300).contains(*s)).count();
        assert_eq!(won, 1, "round {round}: exactly one resume starts: {s1} {b1:#} / {s2} {b2:#}");
        let lost = if (200..300).contains(&s1) { &b2 } else { &b1 };
        assert_eq!([s1, s2].iter().filter(|s| **s == 409).count(), 1, "{s1} {s2}");
        assert_eq!(lost["code"], "already_active", "{lost:#}");
        cancel(round + 2);
    }
    assert_eq!(attempts(), "4", "one attempt per round, and the first");
    two.stop();
    one.stop();
}

/// A worker's commits are announced with ONE `pg_notify` per commit window (after the
/// commit), naming the runs the window touched, never one per entry: 60 puts for two runs in
/// one window make one notification (heard on a LISTEN connection of the test's own); a
/// flush with nothing written makes none.
#[tokio::test]
async fn one_notification_per_commit_window_names_its_runs() {
    use futures::StreamExt;
    let server = Postgres::start();
    let url = server.database("notify");
    let store = PgStore::connect(&url, PgOptions { commit_window: Duration::from_millis(200), ..options("notifier") })
        .await
        .expect("connects");
    let (client, mut connection) =
        tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("a listening connection");
    let (tx, mut notes) = futures::channel::mpsc::unbounded();
    tokio::spawn(futures::stream::poll_fn(move |cx| connection.poll_message(cx)).map(Ok).forward(tx));
    client.batch_execute("LISTEN factory_runs").await.expect("LISTEN");

    for i in 0..50 {
        store.put_step("run-a", &format!("k{i}"), "1", i).expect("put");
    }
    for i in 0..10 {
        store.put_step("run-b", &format!("k{i}"), "1", i).expect("put");
    }
    Journal::flush(&store).await.expect("one commit");
    Journal::flush(&store).await.expect("nothing to commit");
    store.put_step("run-b", "late", "2", 11).expect("put");
    Journal::flush(&store).await.expect("a second commit");
    let mut heard = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while let Ok(Some(message)) = tokio::time::timeout_at(deadline, notes.next()).await {
        if let Ok(tokio_postgres::AsyncMessage::Notification(note)) = message {
            heard.push(serde_json::from_str::<serde_json::Value>(note.payload()).expect("a JSON payload"));
        }
    }
    assert_eq!(heard.len(), 2, "one notification per commit: {heard:#?}");
    assert_eq!(heard[0], serde_json::json!({"worker": "notifier", "runs": ["run-a", "run-b"], "many": false}));
    assert_eq!(heard[1]["runs"], serde_json::json!(["run-b"]));
    assert_eq!(store.writer_stats().notifies.load(std::sync::atomic::Ordering::Relaxed), 2);
    assert_eq!(store.writer_stats().commits.load(std::sync::atomic::Ordering::Relaxed), 2);
}

/// A run executing on worker 1 is live on worker 2: worker 2's event stream (`/api/events`)
/// gets a `run_updated` for each of worker 1's commits of the run as it runs (driven by the
/// commit notifications; a poll every 2 s is only the fallback) with the progress entries,
/// and `wait` on worker 2 answers with the end.
#[test]
fn a_run_executing_on_one_worker_is_followed_live_on_another() {
    use common::fake_openai::{FakeOpenAi, Mode};
    use serde_json::{json, Value};

    let server = Postgres::start();
    server.database("live");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let fake = runtime.block_on(FakeOpenAi::start(Mode::Answer { latency: Duration::from_millis(500) }));
    let (_states, [one, two], [api1, api2]) = workers::<2>(&server, "live", fake.port(), &[]);
    let probe = common::component("probe");
    let (status, _) =
        runtime.block_on(api1.call(reqwest::Method::POST, "/api/factories", Some(json!({"path": probe}))));
    assert!(status == 200 || status == 201);

    // Worker 2's event stream, open before the run starts.
    let mut events = runtime
        .block_on(reqwest::Client::new().get(format!("{}/api/events", api2.base)).bearer_auth(&api2.token).send())
        .expect("the event stream");
    assert_eq!(events.status(), 200);
    let start = json!({"name": "probe", "args": {"case": "fanout", "n": 6}, "limits": {"maxConcurrentSubagents": 1}, "approved": true});
    let (status, started) = runtime.block_on(api1.call(reqwest::Method::POST, "/api/runs", Some(start)));
    assert_eq!(status, 202, "{started:#}");
    let run_id = started["runId"].as_str().expect("a run id").to_string();

    let (mut updates, mut finished, mut text) = (Vec::new(), 0, String::new());
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    'read: while std::time::Instant::now() < deadline {
        let chunk = runtime.block_on(async { tokio::time::timeout(Duration::from_secs(5), events.chunk()).await });
        let Ok(Ok(Some(chunk))) = chunk else { break };
        text.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = text.find("\n\n") {
            let event: String = text.drain(..end + 2).collect();
            let (Some(kind), Some(data)) = (
                event.lines().find_map(|l| l.strip_prefix("event: ")),
                event.lines().find_map(|l| l.strip_prefix("data: ")),
            ) else {
                continue;
            };
            let data: Value = serde_json::from_str(data).expect("JSON data");
            if data["runId"] != run_id.as_str() {
                continue;
            }
            match kind {
                "run_updated" => updates.push(data["revision"].as_u64().expect("a revision")),
                "progress" if data["entry"]["event"] == "agentFinished" => finished += 1,
                "progress" if data["entry"]["event"] == "attemptEnded" => break 'read,
                _ => {}
            }
        }
    }
    assert_eq!(finished, 6, "every call's end reached worker 2's stream: {updates:?}\n{}", two.log());
    assert!(updates.windows(2).all(|w| w[0] < w[1]), "revisions only grow: {updates:?}");
    // Six calls 500 ms apart over about 3 s: a 2 s poll alone would announce it two or three
    // times; the commit notifications announce each commit.
    assert!(updates.len() >= 6, "announced live, commit by commit: {updates:?}");
    let (status, done) = runtime.block_on(api2.call(reqwest::Method::GET, &format!("/api/runs/{run_id}/wait"), None));
    assert_eq!((status, done["status"].as_str()), (200, Some("completed")), "{done:#}");
    drop(events);
    two.stop();
    one.stop();
}

/// `wait` answers with a run's real end, not with an attempt the cluster continues: a run
/// executes on worker B, which is stopped (SIGSTOP) with calls in flight; a `wait` through
/// worker A (`--max-runs 0`: it executes nothing) is under way. Past B's lease the reaper
/// fences B and requeues the run: it reads `halted`, back in the queue, and nobody can take
/// it yet, and the `wait` does not answer. Once worker C starts, it claims the run and
/// resumes it from its journal, and the same `wait` answers `completed` (two attempts).
#[test]
fn wait_follows_a_requeued_run_to_its_real_end() {
    use common::fake_openai::{FakeOpenAi, Mode};
    use common::service::{signal, Service};

    let server = Postgres::start();
    let url = server.database("follow");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    // Two answers at once, then every request held (B's, once it is stopped).
    let fake = runtime.block_on(FakeOpenAi::start(Mode::AnswerThen {
        ok: 2,
        then: Box::new(Mode::Answer { latency: Duration::from_secs(3600) }),
    }));
    let states = worker_states(3, fake.port());
    let a = Service::start(states[0].path(), &["--store", &url, "--http", "127.0.0.1:0", "--max-runs", "0"]);
    let api = Api::of(states[0].path(), &a.log());
    let b = Service::start(states[1].path(), &["--store", &url]);
    let run_id = start_fanouts(&runtime, &api, 1, 6, 2).remove(0);
    let context = || format!("{}\n{}", a.log(), b.log());
    wait_for_sql(
        &server,
        "follow",
        &format!("SELECT count(*) FROM agents WHERE run_id = '{run_id}'"),
        "2",
        Duration::from_secs(120),
        &context,
    );
    let pid = b
        .log()
        .lines()
        .find_map(|l| l.strip_prefix("factory serve: pid ")?.split(',').next()?.parse::<u32>().ok())
        .expect("B's pid");
    signal(pid, "-STOP");
    fake.set(Mode::Answer { latency: Duration::ZERO });

    let waiting = std::thread::scope(|s| {
        let waiter =
            s.spawn(|| runtime.block_on(api.call(reqwest::Method::GET, &format!("/api/runs/{run_id}/wait"), None)));
        // Requeued by the reaper: `halted`, in the queue, owned by nobody.
        wait_for_sql(
            &server,
            "follow",
            &format!("SELECT r.status || ' ' || coalesce(r.owner, '-') || ' ' || coalesce(q.claimed_by, '-') FROM runs r JOIN run_queue q ON q.run_id = r.id WHERE r.id = '{run_id}'"),
            "halted - -",
            Duration::from_secs(60),
            &context,
        );
        std::thread::sleep(Duration::from_secs(3));
        assert!(!waiter.is_finished(), "`wait` answered while the run waits in the queue for its next attempt");
        let c = Service::start(states[2].path(), &["--store", &url]);
        let answer = waiter.join().expect("the waiter");
        (answer, c)
    });
    let ((status, done), c) = waiting;
    assert_eq!(status, 200, "{done:#}");
    assert_eq!(done["status"], "completed", "{done:#}\n{}\n{}", context(), c.log());
    assert_eq!(done["result"]["done"], 6, "{done:#}");
    assert_eq!(done["attempts"], 2, "{done:#}");
    assert!(c.log().contains(&format!("recovering run {run_id}")), "C resumed it: {}", c.log());
    b.kill();
    c.stop();
    a.stop();
}

/// The caps and the other settings of `factory serve` as config-file keys: `max_runs = 0` in
/// `factory.toml` makes a worker only accept runs (one started through it waits in the
/// queue), and `--max-runs 1` on the command line wins over the file (the same worker
/// restarted with it executes the run). A bad value of each key stops `factory serve` with
/// an error naming the file and the key.
#[test]
fn serve_takes_its_caps_from_the_config_file_and_the_flag_wins() {
    use common::fake_openai::{FakeOpenAi, Mode};
    use common::service::Service;

    let server = Postgres::start();
    let url = server.database("settings");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let fake = runtime.block_on(FakeOpenAi::start(Mode::Answer { latency: Duration::ZERO }));
    let state = worker_states(1, fake.port()).remove(0);
    let config = state.path().join("factory.toml");
    let backends = std::fs::read_to_string(&config).expect("the config");
    let with = |keys: &str| std::fs::write(&config, format!("{keys}\n{backends}")).expect("the config");

    for (keys, key, expected) in [
        ("max_runs = -1", "`max_runs`", "0 or more"),
        ("cluster_max_runs = \"four\"", "`cluster_max_runs`", "whole number"),
        ("backend_max_calls = { local = 0 }", "`backend_max_calls.local`", "positive whole number"),
        ("backend_max_calls = 3", "`backend_max_calls`", "table of backend names"),
        ("drain_seconds = \"soon\"", "`drain_seconds`", "number of seconds"),
        ("max_recoveries = 0", "`max_recoveries`", "1 or more"),
        ("allow_grant_roots = \"/srv\"", "`allow_grant_roots`", "list of absolute directory paths"),
        ("allow_grant_roots = [\"data\"]", "`allow_grant_roots`", "list of absolute directory paths"),
    ] {
        with(keys);
        let out = common::factory_cmd(state.path(), &["serve", "--store", &url]).output().expect("factory serve");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{keys}: {stderr}");
        assert!(
            stderr.contains(key) && stderr.contains(expected) && stderr.contains("factory.toml"),
            "{keys}: {stderr}"
        );
    }

    with(
        "max_runs = 0\ncluster_max_runs = 4\nbackend_max_calls = { local = 2 }\ndrain_seconds = 1\nmax_recoveries = 2",
    );
    let service = Service::start(state.path(), &["--store", &url, "--http", "127.0.0.1:0"]);
    let api = Api::of(state.path(), &service.log());
    let run_id = start_fanouts(&runtime, &api, 1, 2, 2).remove(0);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        server
            .psql("settings", &format!("SELECT status || ' ' || coalesce(owner, '-') FROM runs WHERE id = '{run_id}'")),
        "pending -",
        "`max_runs = 0`: queued, not executed here: {}",
        service.log()
    );
    assert!(fake.asked().is_empty());
    service.stop();

    let service = Service::start(state.path(), &["--store", &url, "--http", "127.0.0.1:0", "--max-runs", "1"]);
    let api = Api::of(state.path(), &service.log());
    let (status, done) = runtime.block_on(api.call(reqwest::Method::GET, &format!("/api/runs/{run_id}/wait"), None));
    assert_eq!(
        (status, done["status"].as_str()),
        (200, Some("completed")),
        "--max-runs 1 wins over the file: {done:#}\n{}",
        service.log()
    );
    assert_eq!(fake.asked().len(), 2);
    assert_eq!(
        server.psql("settings", "SELECT count(*) FROM call_slots WHERE backend = 'local'"),
        "2",
        "`backend_max_calls` from the file: two slots"
    );
    service.stop();
}

/// A cluster token file (0600) in a directory of its own: the directory (kept alive) and the
/// file's path.
fn token_file() -> (tempfile::TempDir, String) {
    use std::os::unix::fs::PermissionsExt;
    let secrets = tempfile::tempdir().expect("a directory");
    let file = secrets.path().join("cluster.token");
    std::fs::write(&file, "7a3f0c9e1b2d4c5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6\n")
        .expect("the token file");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod 600");
    let path = file.to_string_lossy().into_owned();
    (secrets, path)
}

/// Wait through `api` for run `run_id` to end; its envelope.
fn wait_run(runtime: &tokio::runtime::Runtime, api: &Api, run_id: &str) -> serde_json::Value {
    let (status, done) = runtime.block_on(api.call(reqwest::Method::GET, &format!("/api/runs/{run_id}/wait"), None));
    assert_eq!(status, 200, "{done:#}");
    done
}

/// Someone who can write the database (and not the workers' token file) edits the rows of
/// runs queued through worker A (`--max-runs 0`) before worker B claims them: the probe's
/// stored component bytes swapped for another component's, and, run by run, the record's
/// grants, its limits, the queued start's backend and component, the record's consent seal
/// removed. B refuses each with a typed failure (`failure.type` `sandbox`, kind
/// `component_mismatch` or `consent_mismatch`), no attempt starts and nothing reaches the
/// backend; the untouched runs complete, and the store lists every run.
#[test]
fn a_worker_refuses_queued_runs_whose_rows_were_tampered_with() {
    use common::fake_openai::{FakeOpenAi, Mode};
    use common::service::Service;
    use sha2::Digest;

    let server = Postgres::start();
    let db = "tamper";
    let url = server.database(db);
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let fake = runtime.block_on(FakeOpenAi::start(Mode::Answer { latency: Duration::ZERO }));
    let states = worker_states(2, fake.port());
    let (_secrets, token) = token_file();
    let a = Service::start(
        states[0].path(),
        &["--store", &url, "--http", "127.0.0.1:0", "--max-runs", "0", "--token-file", &token],
    );
    let api = Api::of(states[0].path(), &a.log());
    let b_args = ["--store", url.as_str(), "--token-file", token.as_str()];
    let sha256 =
        |path: &std::path::Path| hex::encode(sha2::Sha256::digest(std::fs::read(path).expect("the component")));
    let (probe, hello) = (sha256(&common::component("probe")), sha256(&common::component("hello")));
    let (status, registered) = runtime.block_on(api.call(
        reqwest::Method::POST,
        "/api/factories",
        Some(serde_json::json!({"path": common::component("hello")})),
    ));
    assert!(status == 200 || status == 201, "{status} {registered:#}");

    // The stored bytes of the probe swapped for hello's (a valid component, the wrong hash).
    let swapped = start_fanouts(&runtime, &api, 1, 1, 1).remove(0);
    server.psql(db, &format!("CREATE TABLE kept AS SELECT bytes FROM blobs WHERE hash = '{probe}'"));
    server.psql(
        db,
        &format!("UPDATE blobs SET bytes = (SELECT bytes FROM blobs WHERE hash = '{hello}') WHERE hash = '{probe}'"),
    );
    let b = Service::start(states[1].path(), &b_args);
    let done = wait_run(&runtime, &api, &swapped);
    assert_eq!(done["status"], "error", "{done:#}\n{}", b.log());
    assert_eq!(
        (done["failure"]["type"].as_str(), done["failure"]["kind"].as_str()),
        (Some("sandbox"), Some("component_mismatch")),
        "{done:#}"
    );
    assert!(done["error"].as_str().unwrap_or_default().contains(&probe), "names the hash asked for: {done:#}");
    assert_eq!(done["attempts"], 0, "nothing of it ran: {done:#}");
    assert!(fake.asked().is_empty(), "{:?}", fake.asked());
    // Put back, the store serves the next run of the probe.
    server.psql(db, &format!("UPDATE blobs SET bytes = (SELECT bytes FROM kept) WHERE hash = '{probe}'"));
    let restored = start_fanouts(&runtime, &api, 1, 1, 1).remove(0);
    let done = wait_run(&runtime, &api, &restored);
    assert_eq!(done["status"], "completed", "{done:#}\n{}", b.log());
    b.stop();

    // Each field of a queued run's rows edited by hand, one run each; the last is untouched.
    let runs = start_fanouts(&runtime, &api, 6, 1, 1);
    let edit_record = |run: &str, path: &str, value: &str| {
        server.psql(db, &format!("UPDATE runs SET record = convert_to(jsonb_set(convert_from(record, 'UTF8')::jsonb, '{{{path}}}', '{value}')::text, 'UTF8') WHERE id = '{run}'"));
    };
    let edit_start = |run: &str, path: &str, value: &str| {
        server.psql(db, &format!("UPDATE run_queue SET start = convert_to(jsonb_set(convert_from(start, 'UTF8')::jsonb, '{{{path}}}', '{value}')::text, 'UTF8') WHERE run_id = '{run}'"));
    };
    edit_record(&runs[0], "grants", r#"["/tmp"]"#);
    edit_record(&runs[1], "limits,maxTotalSubagents", "1000000");
    edit_start(&runs[2], "backend,name", r#""dry-run""#);
    edit_start(&runs[3], "component", &format!(r#""{hello}""#));
    server.psql(db, &format!("UPDATE runs SET record = convert_to((convert_from(record, 'UTF8')::jsonb - 'seal')::text, 'UTF8') WHERE id = '{}'", runs[4]));
    let b = Service::start(states[1].path(), &b_args);
    for (run_id, what) in runs[..5].iter().zip(["grants", "limits", "backend", "component", "seal removed"]) {
        let done = wait_run(&runtime, &api, run_id);
        assert_eq!(done["status"], "error", "{what}: {done:#}\n{}", b.log());
        assert_eq!(
            (done["failure"]["type"].as_str(), done["failure"]["kind"].as_str()),
            (Some("sandbox"), Some("consent_mismatch")),
            "{what}: {done:#}"
        );
        assert!(done["error"].as_str().unwrap_or_default().contains("consent"), "{what}: {done:#}");
        assert_eq!(done["attempts"], 0, "{what}: nothing of it ran: {done:#}");
    }
    let done = wait_run(&runtime, &api, &runs[5]);
    assert_eq!(done["status"], "completed", "the untouched run: {done:#}\n{}", b.log());
    assert_eq!(fake.asked().len(), 2, "only the untouched runs called the backend: {:?}", fake.asked());
    let (status, listed) = runtime.block_on(api.call(reqwest::Method::GET, "/api/runs", None));
    assert_eq!(status, 200, "{listed:#}");
    let listed = listed.as_array().map_or(0, Vec::len);
    assert_eq!(listed, 8, "every run is listed");
    b.stop();
    a.stop();
}

/// Runs started with a grant (`factory run --allow-read DIR` through worker A, which only
/// queues) are mounted by no worker that does not allow them: worker B, started without
/// roots, puts the first back in the queue with the typed reason (`grant_not_allowed`, which
/// the waiting run reads) and calls nothing. Restarted with `--allow-grant-root R1` and
/// `allow_grant_roots = ["R2"]` in its config file, B runs the runs granted under R1 and R2
/// to completion; the one granted under R3 keeps waiting, saying why.
#[test]
fn a_worker_mounts_only_grants_under_the_roots_it_allows() {
    use common::fake_openai::{FakeOpenAi, Mode};
    use common::service::Service;

    let server = Postgres::start();
    let db = "roots";
    let url = server.database(db);
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let fake = runtime.block_on(FakeOpenAi::start(Mode::Answer { latency: Duration::ZERO }));
    let states = worker_states(2, fake.port());
    let a = Service::start(states[0].path(), &["--store", &url, "--http", "127.0.0.1:0", "--max-runs", "0"]);
    let api = Api::of(states[0].path(), &a.log());
    let roots: [tempfile::TempDir; 3] = std::array::from_fn(|_| tempfile::tempdir().expect("a directory"));
    let probe = common::component("probe");
    let runs: Vec<String> = roots
        .iter()
        .map(|root| {
            let granted = root.path().join("data");
            std::fs::create_dir(&granted).expect("the granted directory");
            let out = common::factory_cmd(
                states[0].path(),
                &[
                    "run",
                    probe.to_str().expect("a UTF-8 path"),
                    "--yes",
                    "--args",
                    r#"{"case":"fanout","n":1}"#,
                    "--allow-read",
                    granted.to_str().expect("a UTF-8 path"),
                    "--detach",
                    "-q",
                ],
            )
            .env_remove("FACTORY_NO_DAEMON")
            .env("FACTORY_STORE", &url)
            .output()
            .expect("factory run");
            assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stderr), a.log());
            let run_id = String::from_utf8_lossy(&out.stdout).trim().to_string();
            assert_eq!(run_id.len(), 36, "the run id is printed: {run_id:?}");
            run_id
        })
        .collect();
    // Until the run reads `pending` with the reason (the refusal is written just after B logs it).
    let says_why = |run_id: &str| {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let (status, waiting) =
                runtime.block_on(api.call(reqwest::Method::GET, &format!("/api/runs/{run_id}"), None));
            assert_eq!(status, 200, "{waiting:#}");
            assert_eq!(waiting["status"], "pending", "{waiting:#}");
            let error = waiting["error"].as_str().unwrap_or_default();
            if error.contains("grant_not_allowed") && error.contains("--allow-grant-root") {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "the run says why it waits: {waiting:#}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };

    let b = Service::start(states[1].path(), &["--store", &url]);
    for run_id in &runs {
        says_why(run_id);
    }
    assert!(fake.asked().is_empty(), "nothing called: {:?}", fake.asked());
    b.stop();

    let config = states[1].path().join("factory.toml");
    let backends = std::fs::read_to_string(&config).expect("the config");
    let second = roots[1].path().to_str().expect("a UTF-8 path");
    std::fs::write(&config, format!("allow_grant_roots = [\"{second}\"]\n{backends}")).expect("the config");
    let b = Service::start(
        states[1].path(),
        &["--store", &url, "--allow-grant-root", roots[0].path().to_str().expect("a UTF-8 path")],
    );
    for run_id in &runs[..2] {
        let done = wait_until_completed(&runtime, &api, run_id, Duration::from_secs(60));
        assert_eq!(done["status"], "completed", "{done:#}\n{}", b.log());
    }
    assert_eq!(fake.asked().len(), 2, "{:?}", fake.asked());
    says_why(&runs[2]);
    b.stop();
    a.stop();
}

/// The store's password kept out of argv: a role that must give a password
/// (`scram-sha-256`), reached by `factory workers` and `factory serve` with a URL without
/// one, the password taken from `--store-password-file` (owner-only; one others can read is
/// refused), `PGPASSWORD`, or `~/.pgpass` (ignored when others can read it, as libpq does);
/// without any the connection is refused. A password in a `--store` URL on the command line
/// works and is warned about; no output shows it.
#[test]
fn the_store_password_comes_from_a_file_the_environment_or_pgpass() {
    use common::service::Service;
    use std::os::unix::fs::PermissionsExt;

    let server = Postgres::start();
    server.database("secret");
    let password = "s3cret-pw-0f9e8d";
    server.psql("postgres", &format!("CREATE ROLE ann LOGIN PASSWORD '{password}'"));
    let hba = server.data_dir().join("pg_hba.conf");
    let rules = std::fs::read_to_string(&hba).expect("pg_hba.conf");
    std::fs::write(&hba, format!("host all ann 127.0.0.1/32 scram-sha-256\n{rules}")).expect("pg_hba.conf");
    server.psql("postgres", "SELECT pg_reload_conf()");
    server.psql("secret", "GRANT ALL ON SCHEMA public TO ann");
    let url = format!("postgres://ann@127.0.0.1:{}/secret", server.port());
    let state = tempfile::tempdir().expect("a state dir");
    let home = tempfile::tempdir().expect("a home");
    let private = |path: &std::path::Path, text: &str, mode: u32| {
        std::fs::write(path, text).expect("a file");
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    };
    let workers = |extra: &[&str], env: &[(&str, &str)]| {
        let mut args = vec!["workers"];
        args.extend_from_slice(extra);
        let mut cmd = common::factory_cmd(state.path(), &args);
        cmd.env_remove("FACTORY_STORE").env_remove("PGPASSWORD").env_remove("PGPASSFILE").env("HOME", home.path());
        for (key, value) in env {
            cmd.env(key, value);
        }
        let out = cmd.output().expect("factory workers");
        let (stdout, stderr) =
            (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
        assert!(!stdout.contains(password) && !stderr.contains(password), "the password never shows: {stdout}{stderr}");
        (out.status.success(), stdout, stderr)
    };

    let (ok, _, stderr) = workers(&["--store", &url], &[]);
    assert!(!ok && stderr.contains("password"), "no password, refused: {stderr}");
    let file = home.path().join("store.password");
    private(&file, &format!("{password}\n"), 0o600);
    let file_arg = file.to_str().expect("a UTF-8 path");
    let (ok, stdout, stderr) = workers(&["--store", &url, "--store-password-file", file_arg], &[]);
    assert!(ok && stdout.contains("no workers on postgres://ann@127.0.0.1"), "{stdout}{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod 644");
    let (ok, _, stderr) = workers(&["--store", &url, "--store-password-file", file_arg], &[]);
    assert!(!ok && stderr.contains("readable by others"), "{stderr}");
    let (ok, _, stderr) = workers(&["--store", &url], &[("PGPASSWORD", password)]);
    assert!(ok, "PGPASSWORD: {stderr}");
    let pgpass = home.path().join(".pgpass");
    private(
        &pgpass,
        &format!("# the cluster\nother:5432:*:ann:wrong\n127.0.0.1:{}:*:ann:{password}\n", server.port()),
        0o644,
    );
    let (ok, _, stderr) = workers(&["--store", &url], &[]);
    assert!(!ok, "a ~/.pgpass others can read is ignored: {stderr}");
    std::fs::set_permissions(&pgpass, std::fs::Permissions::from_mode(0o600)).expect("chmod 600");
    let (ok, _, stderr) = workers(&["--store", &url], &[]);
    assert!(ok, "~/.pgpass: {stderr}");
    std::fs::remove_file(&pgpass).expect("rm ~/.pgpass");
    let in_argv = format!("postgres://ann:{password}@127.0.0.1:{}/secret", server.port());
    let (ok, _, stderr) = workers(&["--store", &in_argv], &[]);
    assert!(ok && stderr.contains("warning: the --store URL holds a password"), "{stderr}");
    let (ok, _, stderr) = workers(&[], &[("FACTORY_STORE", &in_argv)]);
    assert!(ok && !stderr.contains("warning"), "from the environment, not argv: {stderr}");

    // A worker too: its password from the file, the database written as ann.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod 600");
    let service = Service::start(state.path(), &["--store", &url, "--store-password-file", file_arg]);
    assert!(service.log().contains("worker of the store postgres://ann@127.0.0.1"), "{}", service.log());
    assert_eq!(server.psql("secret", "SELECT count(*) FROM workers WHERE lease_until > now()"), "1");
    assert!(!service.stop().contains(password));
}

/// A run worker A halted and handed back to the queue (a drain), its record then edited by
/// hand (its grants): worker B, which claims it, does not recover it: the run stays `halted`
/// with the typed reason (`consent_mismatch`) and no new attempt, nothing more reaches the
/// backend, and B goes on serving other runs.
#[test]
fn a_worker_does_not_recover_a_run_whose_record_was_tampered_with() {
    use common::fake_openai::{FakeOpenAi, Mode};
    use common::service::Service;

    let server = Postgres::start();
    let db = "recovery";
    let url = server.database(db);
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let fake = runtime.block_on(FakeOpenAi::start(Mode::AnswerThen {
        ok: 1,
        then: Box::new(Mode::Answer { latency: Duration::from_secs(3600) }),
    }));
    let states = worker_states(2, fake.port());
    let (_secrets, token) = token_file();
    let a = Service::start(
        states[0].path(),
        &["--store", &url, "--http", "127.0.0.1:0", "--drain-seconds", "0", "--token-file", &token],
    );
    let api = Api::of(states[0].path(), &a.log());
    let run_id = start_fanouts(&runtime, &api, 1, 4, 1).remove(0);
    wait_for_sql(
        &server,
        db,
        &format!("SELECT count(*) FROM agents WHERE run_id = '{run_id}'"),
        "1",
        Duration::from_secs(120),
        &|| a.log(),
    );
    fake.set(Mode::Answer { latency: Duration::ZERO });
    let log = a.stop();
    assert!(log.contains(&format!("handed 1 run back to the queue: {run_id}")), "{log}");
    let asked = fake.asked().len();
    server.psql(db, &format!("UPDATE runs SET record = convert_to(jsonb_set(convert_from(record, 'UTF8')::jsonb, '{{grants}}', '[\"/tmp\"]')::text, 'UTF8') WHERE id = '{run_id}'"));

    let b = Service::start(states[1].path(), &["--store", &url, "--http", "127.0.0.1:0", "--token-file", &token]);
    let api_b = Api::of(states[1].path(), &b.log());
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let refused = loop {
        let (status, run) = runtime.block_on(api_b.call(reqwest::Method::GET, &format!("/api/runs/{run_id}"), None));
        assert_eq!(status, 200, "{run:#}");
        if run["error"].as_str().unwrap_or_default().contains("consent_mismatch") {
            break run;
        }
        assert!(std::time::Instant::now() < deadline, "B never refused the run: {run:#}\n{}", b.log());
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(refused["status"], "halted", "{refused:#}");
    assert_eq!(refused["attempts"], 1, "no new attempt: {refused:#}");
    assert_eq!(fake.asked().len(), asked, "nothing more reached the backend: {:?}", fake.asked());
    let other = start_fanouts(&runtime, &api_b, 1, 1, 1).remove(0);
    let done = wait_run(&runtime, &api_b, &other);
    assert_eq!(done["status"], "completed", "{done:#}\n{}", b.log());
    b.stop();
}

/// Pages by creation sequence on a shared store: runs started through two workers are
/// paged in the order the database's sequence gave them, the same through either worker,
/// newest first, then older and newer with the page's cursors.
#[test]
fn runs_started_through_two_workers_page_by_the_databases_sequence() {
    use common::fake_openai::{FakeOpenAi, Mode};
    use serde_json::{json, Value};

    let server = Postgres::start();
    server.database("pages");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let fake = runtime.block_on(FakeOpenAi::start(Mode::Answer { latency: Duration::from_millis(1) }));
    let (_states, [one, two], [api1, api2]) = workers::<2>(&server, "pages", fake.port(), &[]);
    let mut ids = Vec::new();
    for api in [&api1, &api2, &api1] {
        let id = start_fanouts(&runtime, api, 1, 1, 1).remove(0);
        let (_, done) = runtime.block_on(api.call(reqwest::Method::GET, &format!("/api/runs/{id}/wait"), None));
        assert_eq!(done["status"], "completed", "{done:#}");
        ids.push(id);
    }
    let get = |api: &Api, path: &str| -> Value {
        let (status, page) = runtime.block_on(api.call(reqwest::Method::GET, path, None));
        assert_eq!(status, 200, "{path}: {page:#}");
        page
    };
    let of = |page: &Value| -> Vec<String> {
        page["runs"].as_array().expect("runs").iter().map(|r| r["runId"].as_str().expect("an id").to_string()).collect()
    };
    for api in [&api1, &api2] {
        let all = get(api, "/api/runs/page");
        assert_eq!(of(&all), ids, "creation order, the same through either worker: {all:#}");
        let newest = get(api, "/api/runs/page?limit=1");
        assert_eq!(of(&newest), [ids[2].clone()], "{newest:#}");
        let older = get(api, &format!("/api/runs/page?beforeSeq={}&limit=1", newest["oldestSeq"]));
        assert_eq!(of(&older), [ids[1].clone()], "{older:#}");
        assert_eq!(
            (older["hasMoreNewer"].clone(), older["omittedOlder"].clone()),
            (json!(true), json!(true)),
            "{older:#}"
        );
        let newer = get(api, &format!("/api/runs/page?afterSeq={}&limit=1", older["newestSeq"]));
        assert_eq!(of(&newer), [ids[2].clone()], "{newer:#}");
        assert_eq!(newer["hasMoreNewer"], false, "{newer:#}");
    }
    two.stop();
    one.stop();
}
