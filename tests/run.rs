//! Runs real components (the examples and `tests/guests/probe`) through the library: the
//! hooks' semantics (memoization, schema retry, parallel/pipeline failure rules, the 4096
//! cap, steps), the limits, and the loader's refusals.

mod common;

use common::counting::{Counting, Shared};
use factory_host::backend::{AgentBackend, Script};
use factory_host::component::{CompileOrigin, LoadError};
use factory_host::sandbox::SandboxLimits;
use factory_host::{Error, Factory, Host, HostConfig, Limits, RunEnvelope, RunOptions, RunStatus};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

fn host_with(backend: Arc<dyn AgentBackend>) -> Host {
    Host::new(HostConfig {
        backend,
        cache_dir: Some(common::guest_target_dir().join("cache")),
        ..HostConfig::default()
    })
    .expect("host")
}

async fn load(host: &Host, name: &str) -> Factory {
    host.load_file(&common::component(name)).await.unwrap_or_else(|e| panic!("loading {name}: {e}"))
}

async fn run_probe(backend: Arc<dyn AgentBackend>, args: Value, limits: Limits) -> RunEnvelope {
    let host = host_with(backend);
    let probe = load(&host, "probe").await;
    host.run(&probe, RunOptions { args: Some(args), limits, ..Default::default() }).await.expect("run")
}

fn result(envelope: &RunEnvelope) -> Value {
    assert_eq!(envelope.status, RunStatus::Completed, "{envelope:#?}");
    envelope.result_value().expect("a result")
}

#[tokio::test]
async fn every_example_runs_to_completion_on_dry_run() {
    let host = host_with(Arc::new(factory_host::backend::DryRun));
    let cases = [
        ("hello", json!({"name": "Ada"})),
        ("review-changed", json!({"files": ["a.rs", "b.rs"]})),
        ("multi-stage-review", json!({})),
        ("loop-until-dry", json!({})),
    ];
    for (name, args) in cases {
        let factory = load(&host, name).await;
        assert_eq!(factory.meta.name, name);
        let envelope = host.run(&factory, RunOptions { args: Some(args), ..Default::default() }).await.unwrap();
        let out = result(&envelope);
        match name {
            "hello" => assert!(out["greeting"].as_str().unwrap().contains("greeting for Ada"), "{out}"),
            "review-changed" => {
                let reviews = out["reviews"].as_array().unwrap();
                assert_eq!(reviews.len(), 2);
                assert!(reviews[0]["review"].as_str().unwrap().contains("review:a.rs"), "{out}");
                assert_eq!(envelope.accounting.agents_spawned, 2);
            }
            "multi-stage-review" => assert_eq!(out["dimensions"], 3),
            "loop-until-dry" => assert_eq!(out["rounds"], 2, "two dry rounds end the loop: {out}"),
            _ => unreachable!(),
        }
    }
}

#[tokio::test]
async fn identical_calls_share_one_subagent_and_labels_split_them() {
    let backend = Counting::with_latency(Duration::from_millis(20));
    let envelope = run_probe(Arc::new(Shared(backend.clone())), json!({"case": "memo"}), Limits::default()).await;
    let out = result(&envelope);
    // Sequential repeat, five concurrent identical calls, and a labelled call.
    assert_eq!(backend.calls_for("find a bug"), 2, "unlabelled + labelled");
    assert_eq!(backend.calls_for("find a bug in parallel"), 1, "concurrent identical calls share one");
    assert_eq!(backend.total(), 3);
    assert_eq!(out["first"], out["again"]);
    assert_ne!(out["first"], out["labelled"]);
    let concurrent = out["concurrent"].as_array().unwrap();
    assert_eq!(concurrent.len(), 5);
    assert!(concurrent.iter().all(|v| v == &concurrent[0] && v.is_string()));
    assert_eq!(envelope.accounting.agents_spawned, 3);
    assert_eq!(envelope.accounting.agent_cache_hits, 5);
}

#[tokio::test]
async fn agent_ready_answers_a_memo_hit_and_starts_nothing_for_a_call_that_must_wait() {
    let backend = Counting::with_latency(Duration::ZERO);
    // One subagent in all: asking `agent-ready` about a call spends none of the cap.
    let capped = Limits { max_total_subagents: Some(1), ..Default::default() };
    let envelope = run_probe(Arc::new(Shared(backend.clone())), json!({"case": "ready"}), capped).await;
    let out = result(&envelope);
    assert_eq!(out["before"], json!(["must-wait", "must-wait", "must-wait"]), "{out}");
    assert!(out["answered"].is_string(), "{out}");
    assert_eq!(out["after"], json!({ "reply": out["answered"] }), "the answered call is a memo hit");
    assert_eq!(out["other"], json!("must-wait"), "another label is another call: {out}");
    assert_eq!(backend.total(), 1, "asking made no backend call");
    assert_eq!((envelope.accounting.agents_spawned, envelope.accounting.agent_cache_hits), (1, 1));

    // A label over maxLabelBytes is refused by `agent-ready` as by `agent`: the attempt stops.
    let n = SandboxLimits::default().max_label_bytes + 1;
    let envelope =
        run_probe(Arc::new(Shared(backend.clone())), json!({"case": "ready", "n": n}), Limits::default()).await;
    assert_eq!(envelope.status, RunStatus::Error, "{envelope:#?}");
    let failure = envelope.failure.as_ref().expect("a failure");
    assert_eq!(
        (failure.kind_type, failure.kind.as_deref()),
        (factory_host::FailureType::SandboxLimit, Some("maxLabelBytes")),
        "{failure:#?}"
    );
    assert_eq!(backend.total(), 2, "only the one call that had to wait reached the backend");
}

#[tokio::test]
async fn agent_start_answers_at_once_or_by_id_from_agent_wait() {
    // A backend that waits: every new call is pending, and comes back from `agent-wait`.
    let backend = Counting::with_latency(Duration::from_millis(20));
    let envelope = run_probe(Arc::new(Shared(backend.clone())), json!({"case": "start"}), Limits::default()).await;
    let out = result(&envelope);
    assert_eq!(out["idle"], 0, "nothing pending: an empty list at once: {out}");
    assert_eq!(out["distinct"], 3, "each pending call has an id of its own: {out}");
    assert!(out["a"].as_str().is_some_and(|r| r.contains("start a")), "{out}");
    assert!(out["b"].as_str().is_some_and(|r| r.contains("start b")), "{out}");
    assert_eq!(out["a2"], out["a"], "the identical call shares the first one's answer: {out}");
    assert_eq!(out["again"], json!({ "reply": out["a"] }), "a finished call is a memo hit at once: {out}");
    assert_eq!(out["after"], 0, "{out}");
    assert_eq!(out["orphan-pending"], true, "a call the run ends without waiting for: {out}");
    assert_eq!((backend.calls_for("start a"), backend.calls_for("start b"), backend.calls_for("start c")), (1, 1, 1));
    assert_eq!((envelope.accounting.agents_spawned, envelope.accounting.agent_cache_hits), (3, 2));

    // A backend that answers at once: `agent-start` replies in the call itself.
    let instant = Counting::with_latency(Duration::ZERO);
    let envelope = run_probe(Arc::new(Shared(instant.clone())), json!({"case": "start"}), Limits::default()).await;
    assert_eq!(envelope.status, RunStatus::Error, "{envelope:#?}");
    assert!(format!("{envelope:?}").contains("was answered at once"), "{envelope:#?}");
}

#[tokio::test]
async fn an_agent_call_dropped_while_pending_runs_to_its_end_and_the_run_goes_on() {
    let backend = Counting::with_latency(Duration::from_millis(20));
    let envelope = run_probe(Arc::new(Shared(backend.clone())), json!({"case": "abandon"}), Limits::default()).await;
    let out = result(&envelope);
    assert_eq!(out["first-ready"], false, "{out}");
    assert!(out["after"].as_str().is_some_and(|r| r.contains("after")), "{out}");
    assert_eq!((backend.calls_for("abandoned"), backend.calls_for("after")), (1, 1));
    // The dropped call was not cancelled: it reached the backend and counts as a spawn.
    assert_eq!(envelope.accounting.agents_spawned, 2, "{envelope:#?}");
}

#[tokio::test]
async fn a_panic_traps_the_run_and_its_message_is_in_the_log() {
    let host = host_with(Arc::new(factory_host::backend::DryRun));
    let probe = load(&host, "probe").await;
    let envelope =
        host.run(&probe, RunOptions { args: Some(json!({"case": "panic"})), ..Default::default() }).await.expect("run");
    assert_eq!(envelope.status, RunStatus::Error, "{envelope:#?}");
    assert_eq!(envelope.failure.as_ref().map(|f| f.kind_type), Some(factory_host::FailureType::Trap), "{envelope:#?}");
    let entries = host.store().progress(&envelope.run_id, &Default::default()).await.expect("the run's progress");
    let logged: Vec<String> = entries
        .iter()
        .filter_map(|e| match &e.event {
            factory_host::ProgressEvent::Log { message, level } => Some(format!("{level:?}: {message}")),
            _ => None,
        })
        .collect();
    assert!(
        logged.iter().any(|l| l.starts_with("Error: the factory panicked")
            && l.contains("the probe panics on purpose")
            && l.contains("lib.rs")),
        "{logged:#?}"
    );
}

#[tokio::test]
async fn a_schema_reply_is_retried_once_and_both_spawns_count() {
    let retry_then_ok = Script::from_json(
        r#"{"rules":[{"label":"judge","replies":[{"json":{"ok":"yes"}},{"text":"```json\n{\"ok\": true}\n```"}]}]}"#,
    )
    .unwrap();
    let envelope = run_probe(Arc::new(retry_then_ok), json!({"case": "schema"}), Limits::default()).await;
    assert_eq!(result(&envelope)["verdict"], json!({"ok": true}));
    let text = result(&envelope)["text"].as_str().map(serde_json::from_str::<Value>);
    assert_eq!(text.and_then(Result::ok), Some(json!({"ok": true})), "an awaited schema call is its reply's JSON text");
    assert_eq!(envelope.accounting.agents_spawned, 2);

    let never_ok = Script::from_json(r#"{"rules":[{"label":"judge","reply":{"text":"not json at all"}}]}"#).unwrap();
    let envelope = run_probe(Arc::new(never_ok), json!({"case": "schema"}), Limits::default()).await;
    assert_eq!(result(&envelope)["verdict"], Value::Null, "two failed matches are an ordinary failure");
    assert_eq!(result(&envelope)["text"], Value::Null);
    assert_eq!(envelope.accounting.agents_spawned, 2);

    // Both spawns count toward the total cap: with a cap of 1 the retry is refused.
    let never_ok = Script::from_json(r#"{"rules":[{"label":"judge","reply":{"text":"nope"}}]}"#).unwrap();
    let capped = Limits { max_total_subagents: Some(1), ..Default::default() };
    let envelope = run_probe(Arc::new(never_ok), json!({"case": "schema"}), capped).await;
    assert_eq!(envelope.status, RunStatus::Error);
    assert_eq!(envelope.failure.as_ref().unwrap().kind.as_deref(), Some("maxTotalSubagents"));
}

#[tokio::test]
async fn parallel_turns_ordinary_failures_into_null() {
    let backend = Counting::with_latency(Duration::ZERO);
    let envelope = run_probe(Arc::new(Shared(backend)), json!({"case": "parallel"}), Limits::default()).await;
    let items = result(&envelope)["items"].as_array().unwrap().clone();
    assert_eq!(items.len(), 3);
    assert!(items[0].as_str().unwrap().contains("item a"));
    assert_eq!(items[1], Value::Null);
    assert!(items[2].as_str().unwrap().contains("item c"));
}

#[tokio::test]
async fn pipeline_drops_a_failed_item_and_skips_its_later_stages() {
    let backend = Counting::with_latency(Duration::ZERO);
    let envelope = run_probe(Arc::new(Shared(backend.clone())), json!({"case": "pipeline"}), Limits::default()).await;
    let items = result(&envelope)["items"].as_array().unwrap().clone();
    assert!(items[0].as_str().unwrap().starts_with("0:x:"), "{items:?}");
    assert_eq!(items[1], Value::Null);
    assert!(items[2].as_str().unwrap().starts_with("2:z:"), "{items:?}");
    assert_eq!(backend.total(), 3);
}

#[tokio::test]
async fn an_abort_fails_the_whole_parallel_call_and_ends_the_attempt() {
    let backend = Counting::with_latency(Duration::from_millis(5));
    let limits = Limits { max_total_subagents: Some(2), ..Default::default() };
    let envelope = run_probe(Arc::new(Shared(backend.clone())), json!({"case": "fanout", "n": 5}), limits).await;
    assert_eq!(envelope.status, RunStatus::Error);
    let failure = envelope.failure.as_ref().unwrap();
    assert_eq!(failure.kind_type, factory_host::FailureType::FactoryLimitReached);
    assert_eq!(failure.kind.as_deref(), Some("maxTotalSubagents"));
    assert!(envelope.result.is_none());
    assert_eq!(envelope.accounting.agents_spawned, 2);
    assert!(backend.total() <= 2, "no spawn past the cap reached the backend");
}

#[tokio::test]
async fn more_than_4096_items_are_refused_before_anything_runs() {
    let backend: Arc<dyn AgentBackend> = Arc::new(factory_host::backend::DryRun);
    let envelope = run_probe(backend.clone(), json!({"case": "too-many", "n": 4097}), Limits::default()).await;
    assert_eq!(envelope.status, RunStatus::Error);
    let failure = envelope.failure.unwrap();
    assert_eq!(failure.kind_type, factory_host::FailureType::GuestError);
    assert!(failure.message.contains("too many items: 4097"), "{}", failure.message);

    let envelope = run_probe(backend, json!({"case": "too-many", "n": 4096}), Limits::default()).await;
    assert_eq!(result(&envelope)["len"], 4096);
}

#[tokio::test]
async fn the_concurrency_cap_holds_exactly() {
    // The backend holds its first calls until 8 are in flight at once: the cap is reached
    // (not merely never exceeded because the calls happened not to overlap), and with 400
    // calls behind them never more than 8 run at once.
    let backend = Counting::gated(Duration::from_millis(2), 8);
    let limits = Limits { max_concurrent_subagents: Some(8), ..Default::default() };
    let envelope = run_probe(Arc::new(Shared(backend.clone())), json!({"case": "fanout", "n": 400}), limits).await;
    assert_eq!(result(&envelope)["done"], 400);
    assert_eq!(backend.total(), 400);
    assert_eq!(backend.max_in_flight(), 8, "queued, never more than 8 at once, and 8 reached");

    // Without a concurrency cap, the total cap is the concurrency: all 50 run at once
    // (the backend holds them until they do), and no 51st.
    let backend = Counting::gated(Duration::from_millis(2), 50);
    let limits = Limits { max_total_subagents: Some(50), ..Default::default() };
    let envelope = run_probe(Arc::new(Shared(backend.clone())), json!({"case": "fanout", "n": 50}), limits).await;
    assert_eq!(result(&envelope)["done"], 50);
    assert_eq!(backend.max_in_flight(), 50, "the total cap admits all 50 at once");

    // And a concurrency cap below the total cap wins: 50 agents, total 50, 5 at a time.
    let backend = Counting::gated(Duration::from_millis(2), 5);
    let limits = Limits { max_total_subagents: Some(50), max_concurrent_subagents: Some(5), ..Default::default() };
    let envelope = run_probe(Arc::new(Shared(backend.clone())), json!({"case": "fanout", "n": 50}), limits).await;
    assert_eq!(result(&envelope)["done"], 50);
    assert_eq!(backend.max_in_flight(), 5);
}

#[tokio::test]
async fn a_step_runs_its_producer_once() {
    let envelope =
        run_probe(Arc::new(factory_host::backend::DryRun), json!({"case": "steps"}), Limits::default()).await;
    assert_eq!(result(&envelope), json!({"a": 42, "b": 42}));
}

#[tokio::test]
async fn the_loader_refuses_what_is_not_a_factory_with_typed_errors() {
    let host = host_with(Arc::new(factory_host::backend::DryRun));
    let core = std::fs::read(common::core_module("hello")).unwrap();
    assert!(matches!(host.load_bytes(&core).await, Err(Error::Load(LoadError::CoreModule))));

    let other = std::fs::read(common::component("wrong-world")).unwrap();
    match host.load_bytes(&other).await {
        Err(Error::Load(LoadError::WrongWorld(detail))) => assert!(!detail.is_empty()),
        other => panic!("expected WrongWorld, got {other:?}"),
    }

    assert!(matches!(host.load_bytes(b"definitely not wasm").await, Err(Error::Load(LoadError::NotWasm))));
    let mut broken = b"\0asm\x0d\0\x01\0".to_vec();
    broken.extend_from_slice(&[0xff; 32]);
    assert!(matches!(host.load_bytes(&broken).await, Err(Error::Load(LoadError::Invalid(_)))));
}

#[tokio::test]
async fn a_second_start_deserializes_the_cached_artifact() {
    let cache = tempfile::tempdir().unwrap();
    let path = common::component("hello");
    let config = || HostConfig { cache_dir: Some(cache.path().to_path_buf()), ..HostConfig::default() };
    let first = Host::new(config()).unwrap().load_file(&path).await.unwrap();
    assert_eq!(first.component.origin, CompileOrigin::Compiled);
    let second = Host::new(config()).unwrap().load_file(&path).await.unwrap();
    assert_eq!(second.component.origin, CompileOrigin::Cached);
    assert_eq!(first.component.hash, second.component.hash);
    // And the cached artifact runs.
    let host = Host::new(config()).unwrap();
    let hello = host.load_file(&path).await.unwrap();
    let envelope = host.run(&hello, RunOptions::default()).await.unwrap();
    assert_eq!(result(&envelope)["name"], "world");
}

#[tokio::test]
async fn bad_args_and_bad_limits_are_refused_before_a_run_exists() {
    let host = host_with(Arc::new(factory_host::backend::DryRun));
    let review = load(&host, "review-changed").await;
    let bad_args = RunOptions { args: Some(json!({"files": 3})), ..Default::default() };
    match host.run(&review, bad_args).await {
        Err(Error::InvalidArgs(message)) => assert!(message.contains("files"), "{message}"),
        other => panic!("expected InvalidArgs, got {other:?}"),
    }
    let bad_limit =
        RunOptions { limits: Limits { timeout_seconds: Some(0.0), ..Default::default() }, ..Default::default() };
    match host.run(&review, bad_limit).await {
        Err(Error::Limits(e)) => assert_eq!(e.field, "timeoutSeconds"),
        other => panic!("expected Limits, got {other:?}"),
    }
    assert!(host.runs(factory_host::DEFAULT_SESSION).await.unwrap().is_empty(), "no run was created");
}

#[tokio::test]
async fn a_component_importing_what_the_host_lacks_is_refused_naming_the_import() {
    let host = host_with(Arc::new(factory_host::backend::DryRun));
    let bytes = std::fs::read(common::component("unknown-import")).unwrap();
    match host.load_bytes(&bytes).await {
        Err(Error::Load(e @ LoadError::UnknownImport { .. })) => {
            let LoadError::UnknownImport { import } = &e else { unreachable!() };
            assert_eq!(import, "test:unknown/outside");
            assert!(e.to_string().contains("`test:unknown/outside`"), "the message names the import: {e}");
        }
        other => panic!("expected UnknownImport, got {other:?}"),
    }
}

#[tokio::test]
async fn a_meta_that_never_returns_traps_on_fuel_or_times_out_and_the_host_goes_on() {
    let spin = common::component("meta-spin");
    let host_under = |sandbox: SandboxLimits| {
        Host::new(HostConfig {
            sandbox,
            cache_dir: Some(common::guest_target_dir().join("cache")),
            ..HostConfig::default()
        })
        .expect("host")
    };
    // A small fuel budget: `meta` traps.
    let host = host_under(SandboxLimits { fuel: 20_000_000, ..Default::default() });
    match host.load_file(&spin).await {
        Err(Error::MetaCall(message)) => assert!(message.contains("fuel"), "{message}"),
        other => panic!("expected MetaCall (fuel), got {other:?}"),
    }
    // Fuel to spare, a short bound on `meta`: it times out.
    let host = host_under(SandboxLimits { meta_timeout_ms: 200, ..Default::default() });
    match host.load_file(&spin).await {
        Err(Error::MetaCall(message)) => assert!(message.contains("did not return within 200ms"), "{message}"),
        other => panic!("expected MetaCall (timeout), got {other:?}"),
    }
    // The same host loads and runs a well-behaved factory afterwards.
    let hello = load(&host, "hello").await;
    let envelope = host.run(&hello, RunOptions::default()).await.unwrap();
    assert_eq!(result(&envelope)["name"], "world");
    assert_eq!(SandboxLimits::default().meta_timeout_ms, 10_000, "the documented default");
}
