//! JavaScript factories: the built-in JS runner through the library (every `ctx` function,
//! failure rules, aborts, caps, steps, resume with an edited source, the authoring form,
//! hostile scripts) and through the real binary (describe, run, add, syntax errors, the
//! Copilot-SDK specifier, `file.js#name`, kill -9 and resume), and TypeScript factories
//! (type-stripped in place, recorded as written, errors at the `.ts` file's lines).

mod common;

use common::counting::{Counting, Shared};
use factory_host::backend::DryRun;
use factory_host::sandbox::SandboxLimits;
use factory_host::script::Script;
use factory_host::store::ProgressQuery;
use factory_host::{
    Error, Factory, Host, HostConfig, Limits, ProgressEvent, ResumeOptions, RunEnvelope, RunOptions, RunStatus,
};
use serde_json::{json, Value};
use std::path::Path;
use std::process::{Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn host_with(backend: Arc<dyn factory_host::backend::AgentBackend>, sandbox: SandboxLimits) -> Host {
    Host::new(HostConfig {
        backend,
        sandbox,
        cache_dir: Some(common::guest_target_dir().join("cache")),
        ..HostConfig::default()
    })
    .expect("host")
}

fn dry_host() -> Host {
    host_with(Arc::new(DryRun), SandboxLimits::default())
}

async fn js(host: &Host, text: &str) -> Factory {
    host.load_script(Script::new("t.js", text, None)).await.unwrap_or_else(|e| panic!("loading the script: {e}"))
}

async fn run(host: &Host, factory: &Factory, args: Value) -> RunEnvelope {
    host.run(factory, RunOptions { args: Some(args), ..Default::default() }).await.expect("run")
}

fn result(envelope: &RunEnvelope) -> Value {
    assert_eq!(envelope.status, RunStatus::Completed, "{envelope:#?}");
    envelope.result_value().expect("a result")
}

fn failure(envelope: &RunEnvelope, kind_type: factory_host::FailureType, kind: Option<&str>) -> String {
    assert_eq!(envelope.status, RunStatus::Error, "{envelope:#?}");
    let failure = envelope.failure.as_ref().expect("a failure");
    assert_eq!(failure.kind_type, kind_type, "{failure:#?}");
    assert_eq!(failure.kind.as_deref(), kind, "{failure:#?}");
    failure.message.clone()
}

async fn events(host: &Host, run_id: &str) -> Vec<ProgressEvent> {
    host.progress(
        factory_host::DEFAULT_SESSION,
        run_id,
        &ProgressQuery { after_seq: Some(0), limit: Some(1000), ..Default::default() },
    )
    .await
    .expect("progress")
    .into_iter()
    .map(|e| e.event)
    .collect()
}

async fn logs(host: &Host, run_id: &str) -> Vec<String> {
    events(host, run_id)
        .await
        .into_iter()
        .filter_map(|e| match e {
            ProgressEvent::Log { message, .. } => Some(message),
            _ => None,
        })
        .collect()
}

/// A factory module around a `run` body.
fn module(meta: &str, run: &str) -> String {
    format!(
        "import {{ defineFactory }} from \"factory\";\nexport default defineFactory({{ meta: {meta}, run: {run} }});\n"
    )
}

const META: &str = r#"{ name: "t", description: "test" }"#;

#[tokio::test]
async fn every_ctx_function_works() {
    let host = dry_host();
    let source = module(
        r#"{ name: "ctx-tour", description: "d", phases: [{ title: "One" }, { title: "Two", detail: "x" }],
             limits: { maxConcurrentSubagents: 2 },
             argsSchema: { type: "object", required: ["who"], properties: { who: { type: "string" } } } }"#,
        r#"async (ctx) => {
            ctx.phase("One");
            ctx.log(`hello ${ctx.args.who}`);
            const text = await ctx.agent("Say hi", { label: "greeter" });
            const value = await ctx.agent("Give n", { label: "n", schema: { type: "object", required: ["n"], properties: { n: { type: "number" } } } });
            const model = await ctx.agent("Say hi", { label: "m", model: "some-model" });
            ctx.phase("Two");
            const par = await ctx.parallel([1, 2, 3].map((i) => () => ctx.agent(`p${i}`, { label: `p:${i}` })));
            const pipe = await ctx.pipeline(["a", "b"], (item) => item.toUpperCase(), (prev, item, index) => `${prev}${item}${index}`);
            const step = await ctx.step("s", () => ({ k: [1, "two", null, true] }));
            const volatile = await ctx.step("v", () => 7, { volatile: true });
            let unknown = null;
            try { await ctx.agent("x", { lable: "typo" }); } catch (e) { unknown = e.message; }
            return { runId: ctx.runId, text, value, model: typeof model, par: par.length, pipe, step, volatile,
                     aborted: ctx.signal.aborted, unknown, nested: await ctx.factory().catch((e) => e.message) };
        }"#,
    );
    let factory = js(&host, &source).await;
    assert_eq!(factory.meta.name, "ctx-tour");
    assert_eq!(factory.meta.phases.len(), 2);
    assert_eq!(factory.meta.limits.max_concurrent_subagents, Some(2));
    assert!(factory.meta.args_schema.is_some());
    // The args schema declared in JS is checked before the run exists.
    let refused = host.run(&factory, RunOptions { args: Some(json!({"who": 3})), ..Default::default() }).await;
    assert!(matches!(refused, Err(Error::InvalidArgs(_))), "{refused:?}");

    let envelope = run(&host, &factory, json!({"who": "Ada"})).await;
    let r = result(&envelope);
    assert_eq!(r["runId"], envelope.run_id.as_str());
    assert_eq!(r["text"], "[dry-run greeter] reply to: Say hi");
    assert_eq!(r["value"], json!({"n": 0}));
    assert_eq!(r["model"], "string");
    assert_eq!(r["par"], 3);
    assert_eq!(r["pipe"], json!(["Aa0", "Bb1"]));
    assert_eq!(r["step"], json!({"k": [1, "two", null, true]}));
    assert_eq!(r["volatile"], 7);
    assert_eq!(r["aborted"], false);
    assert!(r["unknown"].as_str().unwrap().contains("unknown option `lable`"), "{r}");
    assert!(r["nested"].as_str().unwrap().contains("nested factories"), "{r}");
    assert_eq!(logs(&host, &envelope.run_id).await, vec!["hello Ada".to_string()]);
    let phases: Vec<_> = events(&host, &envelope.run_id)
        .await
        .into_iter()
        .filter_map(|e| if let ProgressEvent::Phase { title } = e { Some(title) } else { None })
        .collect();
    assert_eq!(phases, vec!["One", "Two"]);
    assert_eq!(envelope.accounting.agents_spawned, 6);
}

#[tokio::test]
async fn ordinary_failures_are_null_and_skip_later_pipeline_stages() {
    let counting = Arc::new(Counting::default());
    let host = host_with(Arc::new(Shared(counting.clone())), SandboxLimits::default());
    let source = module(
        META,
        r#"async (ctx) => {
            const direct = await ctx.agent("will fail", { label: "fail:direct" });
            const par = await ctx.parallel([
                () => ctx.agent("ok one", { label: "one" }),
                () => ctx.agent("fails", { label: "fail:two" }).then((v) => { if (v === null) throw new Error("no reply"); return v; }),
                () => { throw new TypeError("a thunk that throws"); },
            ]);
            const pipe = await ctx.pipeline(["good", "bad"],
                (item) => ctx.agent(`first ${item}`, { label: item === "bad" ? "fail:first" : "first" }),
                (prev, item) => { if (prev === null) throw new Error(`${item} failed`); return prev; },
                (prev, item) => ctx.agent(`second ${item}`, { label: `second:${item}` }));
            return { direct, par: par.map((v) => v === null ? null : "value"), pipe: pipe.map((v) => v === null ? null : "value") };
        }"#,
    );
    let factory = js(&host, &source).await;
    let envelope = run(&host, &factory, json!({})).await;
    let r = result(&envelope);
    assert_eq!(r["direct"], Value::Null);
    assert_eq!(r["par"], json!(["value", null, null]));
    assert_eq!(r["pipe"], json!(["value", null]));
    assert_eq!(counting.calls_for("second good"), 1);
    assert_eq!(counting.calls_for("second bad"), 0, "a failed item skips its later stages");
}

#[tokio::test]
async fn at_the_pending_call_cap_a_memo_hit_is_answered_and_a_call_that_must_wait_is_refused() {
    // A call the run already has the answer of holds nothing while it is answered: it is
    // never pending, so the cap of pending calls does not refuse it. A call that must wait
    // past the cap is refused as before.
    let counting = Counting::with_latency(Duration::from_millis(100));
    let sandbox = SandboxLimits { max_pending_agent_calls: 1, ..SandboxLimits::default() };
    let host = host_with(Arc::new(Shared(counting.clone())), sandbox);
    let source = module(
        META,
        r#"async (ctx) => {
            const first = await ctx.agent("known", { label: "k" });
            const waiting = ctx.agent("slow", { label: "s" });
            const again = await ctx.agent("known", { label: "k" });
            ctx.log(`answered again: ${again === first && first !== null}`);
            await ctx.agent("another", { label: "a" });
            return await waiting;
        }"#,
    );
    let factory = js(&host, &source).await;
    let envelope = run(&host, &factory, json!({})).await;
    assert_eq!(counting.calls_for("known"), 1, "the repeated call was answered from memory");
    assert!(logs(&host, &envelope.run_id).await.contains(&"answered again: true".to_string()), "{envelope:#?}");
    let message = failure(&envelope, factory_host::FailureType::SandboxLimit, Some("maxPendingAgentCalls"));
    assert!(message.contains("more than 1 agent calls pending"), "{message}");
    assert_eq!(counting.calls_for("another"), 0, "the call past the cap never reached the backend");
}

#[tokio::test]
async fn an_abort_rejects_through_parallel_and_pipeline_and_the_host_records_it() {
    let counting = Arc::new(Counting::default());
    let host = host_with(Arc::new(Shared(counting.clone())), SandboxLimits::default());
    let source = module(
        r#"{ name: "t", description: "d", limits: { maxTotalSubagents: 2 } }"#,
        r#"async (ctx) => {
            let seen = "none";
            try {
                await ctx.parallel([1, 2, 3, 4].map((i) => () => ctx.agent(`a${i}`, { label: `a:${i}` })));
            } catch (e) {
                seen = `${e.name}:${e.kind}`;
            }
            ctx.log(`parallel rejected with ${seen}`);
            try {
                await ctx.pipeline([1], (i) => ctx.agent(`b${i}`, { label: "b" }));
            } catch (e) {
                ctx.log(`pipeline rejected with ${e.name}`);
            }
            // The factory swallows the abort and returns: the recorded limit still wins.
            return "swallowed";
        }"#,
    );
    let factory = js(&host, &source).await;
    // The host stops the guest as soon as the limit is hit, so whether the script still
    // runs (and logs) after the rejection is a race: try until it does, and fail if it never
    // does. Every run must record the limit whatever the script did.
    let mut seen = Vec::new();
    for _ in 0..20 {
        let envelope = run(&host, &factory, json!({})).await;
        failure(&envelope, factory_host::FailureType::FactoryLimitReached, Some("maxTotalSubagents"));
        seen = logs(&host, &envelope.run_id).await;
        if !seen.is_empty() {
            break;
        }
    }
    assert!(seen.contains(&"parallel rejected with AbortError:factory_limit_reached".to_string()), "{seen:?}");
}

#[tokio::test]
async fn more_than_4096_items_are_refused() {
    let host = dry_host();
    let source = module(
        META,
        r#"async (ctx) => {
            const many = Array.from({ length: 4097 }, (_, i) => () => i);
            const out = {};
            try { await ctx.parallel(many); } catch (e) { out.parallel = `${e.name}: ${e.message}`; }
            try { await ctx.pipeline(many, (x) => x); } catch (e) { out.pipeline = `${e.name}: ${e.message}`; }
            out.exactly = (await ctx.parallel(many.slice(0, 4096))).length;
            return out;
        }"#,
    );
    let factory = js(&host, &source).await;
    let r = result(&run(&host, &factory, json!({})).await).clone();
    assert!(r["parallel"].as_str().unwrap().starts_with("RangeError"), "{r}");
    assert!(r["pipeline"].as_str().unwrap().contains("4096"), "{r}");
    assert_eq!(r["exactly"], 4096);
}

#[tokio::test]
async fn a_pipeline_has_no_barrier_between_stages() {
    let host = dry_host();
    // Item 0's first stage waits until item 1 has finished its second stage: with a barrier
    // between stages that could never happen (the run would deadlock and time out).
    let source = module(
        r#"{ name: "t", description: "d", limits: { timeoutSeconds: 60 } }"#,
        r#"async (ctx) => {
            let open;
            const gate = new Promise((resolve) => { open = resolve; });
            const order = [];
            const out = await ctx.pipeline([0, 1],
                async (item) => { if (item === 0) await gate; order.push(`s1:${item}`); return ctx.agent(`p${item}`, { label: `p:${item}` }); },
                (prev, item) => { order.push(`s2:${item}`); if (item === 1) open(); return item; });
            return { out, order };
        }"#,
    );
    let factory = js(&host, &source).await;
    let r = result(&run(&host, &factory, json!({})).await).clone();
    assert_eq!(r["out"], json!([0, 1]));
    assert_eq!(r["order"], json!(["s1:1", "s2:1", "s1:0", "s2:0"]));
}

#[tokio::test]
async fn steps_replay_on_resume_and_volatile_steps_run_again() {
    let counting = Arc::new(Counting::default());
    let host = host_with(Arc::new(Shared(counting.clone())), SandboxLimits::default());
    let source = module(
        r#"{ name: "t", description: "d", limits: { maxTotalSubagents: 1 } }"#,
        r#"async (ctx) => {
            const s = await ctx.step("scan-v1", () => { ctx.log("producer ran"); return { at: Date.now(), r: Math.random() }; });
            await ctx.step("v", () => { ctx.log("volatile ran"); return 1; }, { volatile: true });
            const a = await ctx.agent("first", { label: "first" });
            const b = await ctx.agent(`second ${Math.random()}`, { label: "second" });
            return { s, a: a !== null, b: b !== null };
        }"#,
    );
    let factory = js(&host, &source).await;
    let first = run(&host, &factory, json!({})).await;
    failure(&first, factory_host::FailureType::FactoryLimitReached, Some("maxTotalSubagents"));
    let resumed = host
        .resume(
            &first.run_id,
            ResumeOptions {
                limits: Limits { max_total_subagents: Some(5), ..Limits::default() },
                ..Default::default()
            },
        )
        .await
        .expect("resume");
    let r = result(&resumed);
    assert_eq!(r["a"], true);
    assert_eq!(r["b"], true);
    // Date.now() is the run's creation time (from its UUID v7 id), in every attempt.
    let created_ms = i64::from_str_radix(&first.run_id.replace('-', "")[..12], 16).unwrap();
    assert_eq!(r["s"]["at"].as_i64(), Some(created_ms));
    let logs = logs(&host, &first.run_id).await;
    assert_eq!(logs.iter().filter(|l| *l == "producer ran").count(), 1, "{logs:?}");
    assert_eq!(logs.iter().filter(|l| *l == "volatile ran").count(), 2, "{logs:?}");
    assert_eq!(counting.calls_for("first"), 1, "the journaled call replayed");
    // Math.random() is seeded by the run id: the second attempt built the same prompt.
    assert_eq!(counting.total(), 2);
    assert_eq!(resumed.accounting.agent_cache_hits, 1);
}

#[tokio::test]
async fn resume_with_an_edited_source_replays_unchanged_calls() {
    let counting = Arc::new(Counting::default());
    let host = host_with(Arc::new(Shared(counting.clone())), SandboxLimits::default());
    let v1 = module(
        r#"{ name: "edit", description: "d", limits: { maxTotalSubagents: 2 } }"#,
        r#"async (ctx) => {
            const a = await ctx.agent("unchanged", { label: "a" });
            const b = await ctx.agent("old prompt", { label: "b" });
            const c = await ctx.agent("third", { label: "c" });
            return "v1";
        }"#,
    );
    let v2 = v1.replace("old prompt", "new prompt").replace("\"v1\"", "\"v2\"");
    let f1 = js(&host, &v1).await;
    let first = run(&host, &f1, json!({})).await;
    failure(&first, factory_host::FailureType::FactoryLimitReached, Some("maxTotalSubagents"));
    let f2 = js(&host, &v2).await;
    assert_eq!(f1.component.hash, f2.component.hash, "one runner");
    let options = ResumeOptions {
        component: Some(f2),
        limits: Limits { max_total_subagents: Some(10), ..Limits::default() },
        ..Default::default()
    };
    let resumed = host.resume(&first.run_id, options).await.expect("resume");
    assert_eq!(result(&resumed), json!("v2"));
    assert_eq!(counting.calls_for("unchanged"), 1);
    assert_eq!(counting.calls_for("old prompt"), 1);
    assert_eq!(counting.calls_for("new prompt"), 1);
    let detail = host.detail(factory_host::DEFAULT_SESSION, &first.run_id).await.expect("detail");
    let scripts: Vec<_> = detail.scripts.iter().map(|s| s.as_ref().expect("a script").sha256.clone()).collect();
    assert_eq!(scripts.len(), 2);
    assert_ne!(scripts[0], scripts[1], "each attempt records the source it ran");
}

#[tokio::test]
async fn thrown_errors_and_non_json_results_end_the_attempt_with_the_js_message() {
    let host = dry_host();
    let thrower = "import { defineFactory } from \"factory\";\n\nfunction check(n) {\n  throw new Error(`bad input ${n}`);\n}\nexport default defineFactory({ meta: { name: \"t\", description: \"d\" }, run: async () => {\n  check(42);\n} });\n";
    let envelope = run(&host, &js(&host, thrower).await, json!({})).await;
    let message = failure(&envelope, factory_host::FailureType::GuestError, None);
    assert!(message.starts_with("Error: bad input 42"), "{message}");
    assert!(message.contains("t.js:4"), "{message}");
    assert!(message.contains("t.js:7"), "{message}");
    assert!(!message.contains("wasm"), "no wasm backtrace: {message}");

    // A result that is not plain JSON is `invalid_result`, naming the path; a thrown value
    // is `guest_error`.
    for (body, expected, kind) in [
        ("async () => ({ f: () => 1 })", "result.f is a function", factory_host::FailureType::InvalidResult),
        ("async () => NaN", "result is NaN", factory_host::FailureType::InvalidResult),
        ("async () => new Map()", "result is a Map", factory_host::FailureType::InvalidResult),
        ("async () => { throw \"plain\"; }", "uncaught plain", factory_host::FailureType::GuestError),
        // An error named like the runner's own mark stays a thrown error.
        (
            "async () => { const e = new Error(\"x\"); e.name = \"\\u0001y\"; throw e; }",
            "y: x",
            factory_host::FailureType::GuestError,
        ),
    ] {
        let envelope = run(&host, &js(&host, &module(META, body)).await, json!({})).await;
        let message = failure(&envelope, kind, None);
        assert!(message.contains(expected), "{body}: {message}");
    }
    // `undefined` completes with no result; `null` is a result.
    let none = run(&host, &js(&host, &module(META, "async () => undefined")).await, json!({})).await;
    assert_eq!(none.status, RunStatus::Completed);
    assert_eq!(none.result_value(), None);
    let null = run(&host, &js(&host, &module(META, "async () => null")).await, json!({})).await;
    assert_eq!(null.result_value(), Some(Value::Null));
}

#[tokio::test]
async fn bad_sources_are_refused_at_load_with_a_location() {
    let host = dry_host();
    let load = |text: &'static str| {
        let host = &host;
        async move { host.load_script(Script::new("bad.js", text, None)).await.expect_err("refused").to_string() }
    };
    let syntax = load("import { defineFactory } from \"factory\";\nexport default defineFactory({\n  meta: { name: \"x\", description: \"d\" },\n  run: async () => { let = ; },\n});\n").await;
    assert!(syntax.starts_with("bad.js:4:"), "{syntax}");
    assert!(syntax.contains("SyntaxError"), "{syntax}");
    let none = load("export const x = 1;\n").await;
    assert!(none.contains("defines no factory"), "{none}");
    let import = load("import fs from \"fs\";\n").await;
    // A Node built-in is refused by name (tests/js_modules.rs covers modules in full).
    assert!(import.contains("`fs` is a Node.js built-in module"), "{import}");
    let meta = load("import { defineFactory } from \"factory\";\nexport default defineFactory({ meta: { name: \"x\" }, run: async () => 1 });\n").await;
    assert!(meta.contains("meta.description"), "{meta}");
    let limits = load("import { defineFactory } from \"factory\";\nexport default defineFactory({ meta: { name: \"x\", description: \"d\", limits: { maxTotal: 3 } }, run: async () => 1 });\n").await;
    assert!(limits.contains("unknown limit `maxTotal`"), "{limits}");
}

#[tokio::test]
async fn a_file_with_several_factories_runs_one_by_name() {
    let host = dry_host();
    let text = "import { defineFactory, joinSession } from \"@github/copilot-sdk/extension\";\nconst a = defineFactory({ meta: { name: \"a\", description: \"d\" }, run: async () => \"A\" });\nconst b = defineFactory({ meta: { name: \"b\", description: \"d\" }, run: async () => \"B\" });\nawait joinSession({ factories: [a, b] });\n";
    let several = host.load_script(Script::new("two.js", text, None)).await.expect_err("ambiguous").to_string();
    assert!(several.contains("two.js#NAME") && several.contains("a, b"), "{several}");
    let b = host.load_script(Script::new("two.js", text, Some("b".into()))).await.expect("b");
    assert_eq!(b.meta.name, "b");
    assert_eq!(result(&run(&host, &b, json!({})).await), json!("B"));
    let missing = host.load_script(Script::new("two.js", text, Some("c".into()))).await.expect_err("no c").to_string();
    assert!(missing.contains("no factory named `c`"), "{missing}");
}

#[tokio::test]
async fn the_authoring_form_registers_without_running() {
    let counting = Arc::new(Counting::default());
    let host = host_with(Arc::new(Shared(counting.clone())), SandboxLimits::default());
    let meta =
        json!({ "name": "authored", "description": "args: { file?: string }", "phases": [{ "title": "Inspect" }] });
    let body = "async ({ args, agent, phase }) => {\n    phase(\"Inspect\");\n    const finding = await agent(`Name one bug in ${args.file ?? \"the code\"}.`, { label: \"inspector\" });\n    return { finding };\n};\n";
    let registration = host.author(&meta, body).await.expect("authored");
    assert_eq!(registration.meta.name, "authored");
    assert!(registration.script.is_some());
    assert_eq!(counting.total(), 0, "authoring runs nothing");
    let factory = host.load_registered("authored").await.expect("registered");
    let envelope = run(&host, &factory, json!({"file": "a.rs"})).await;
    assert!(result(&envelope)["finding"].as_str().unwrap().contains("Name one bug in a.rs"));
    // A body with a syntax error is refused, pointing at its own line.
    let bad = host.author(&meta, "async (ctx) => {\n  return ];\n}").await.expect_err("refused").to_string();
    assert!(bad.starts_with("authored.js:2:"), "{bad}");
}

#[tokio::test]
async fn hostile_scripts_end_with_typed_failures() {
    let small = SandboxLimits { fuel: 2_000_000_000, memory_bytes: 64 << 20, ..SandboxLimits::default() };
    let host = host_with(Arc::new(DryRun), small);
    let spin = run(&host, &js(&host, &module(META, "async () => { for (;;) {} }")).await, json!({})).await;
    failure(&spin, factory_host::FailureType::SandboxLimit, Some("fuel"));
    let bomb = module(META, "async () => { const keep = []; for (;;) keep.push(new Array(1 << 20).fill(1.5)); }");
    let bomb = run(&host, &js(&host, &bomb).await, json!({})).await;
    failure(&bomb, factory_host::FailureType::SandboxLimit, Some("memory"));
    let deep = module(META, "async () => { const f = (n) => f(n + 1) + 1; return f(0); }");
    let deep = run(&host, &js(&host, &deep).await, json!({})).await;
    // QuickJS's own stack check (a catchable RangeError) or wasm's stack guard: typed either way.
    let typed = deep.failure.as_ref().expect("a failure");
    let js_error = typed.kind_type == factory_host::FailureType::GuestError && typed.message.contains("RangeError");
    let wasm_stack =
        typed.kind_type == factory_host::FailureType::SandboxLimit && typed.kind.as_deref() == Some("stack");
    assert!(js_error || wasm_stack, "{typed:#?}");
    // A loop in `meta`'s module code hits the fuel limit at load, not forever.
    let at_load = host.load_script(Script::new("t.js", "for (;;) {}\n", None)).await.expect_err("refused");
    assert!(matches!(at_load, Error::MetaCall(_)), "{at_load:?}");
    // A timeout declared in meta stops a spinning script too (with the default fuel).
    let host = host_with(Arc::new(DryRun), SandboxLimits::default());
    let timed =
        module(r#"{ name: "t", description: "d", limits: { timeoutSeconds: 0.5 } }"#, "async () => { for (;;) {} }");
    let timed = run(&host, &js(&host, &timed).await, json!({})).await;
    failure(&timed, factory_host::FailureType::FactoryLimitReached, Some("timeoutSeconds"));
}

#[tokio::test]
async fn thousands_of_agents_are_in_flight_at_once() {
    let counting = Counting::with_latency(Duration::from_millis(1000));
    let host = host_with(Arc::new(Shared(counting.clone())), SandboxLimits::default());
    let source = module(
        META,
        "async (ctx) => (await ctx.parallel(Array.from({ length: 2000 }, (_, i) => () => ctx.agent(`q${i}`, { label: `q:${i}` })))).filter((v) => v !== null).length",
    );
    let envelope = run(&host, &js(&host, &source).await, json!({})).await;
    assert_eq!(result(&envelope), json!(2000));
    // Not one at a time: the Promises are concurrent `agent` calls (a 1 s reply each).
    assert!(counting.max_in_flight.load(std::sync::atomic::Ordering::SeqCst) >= 1000);
}

// ---- through the binary ----

fn example(name: &str) -> String {
    common::root().join("examples/js").join(name).display().to_string()
}

fn out_json(out: &Output) -> Value {
    common::stdout_json(out)
}

#[test]
fn cli_describe_run_add_and_run_by_name() {
    let state = tempfile::tempdir().unwrap();
    let file = example("review-changed.js");
    let out = common::factory_in(state.path(), &["describe", &file, "--json"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let described = out_json(&out);
    assert_eq!(described["meta"]["name"], "review-changed");
    assert_eq!(described["meta"]["limits"]["maxTotalSubagents"], 10);
    assert_eq!(described["script"]["fileName"], "review-changed.js");
    assert_eq!(described["script"]["sha256"].as_str().unwrap().len(), 64);

    // A local source file is the user's own, like a crate built here: no consent needed.
    let args = r#"{"files":["src/a.rs","src/b.rs"]}"#;
    let out = common::factory_in(state.path(), &["run", &file, "--args", args, "--json", "-q"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let envelope = out_json(&out);
    assert_eq!(envelope["status"], "completed");
    assert_eq!(envelope["result"]["reviews"][0], "[dry-run Review src/a.rs] reply to: Review src/a.rs");

    let out = common::factory_in(state.path(), &["add", &file]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let out = common::factory_in(state.path(), &["run", "review-changed", "--args", args, "--json", "-q"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert_eq!(out_json(&out)["status"], "completed");
}

#[test]
fn cli_syntax_errors_exit_2_before_a_run_exists() {
    let state = tempfile::tempdir().unwrap();
    let file = state.path().join("broken.js");
    std::fs::write(&file, "import { defineFactory } from \"factory\";\nexport default defineFactory({\n  meta: { name: \"b\", description: \"d\" },\n  run: async () => { return ) },\n});\n").unwrap();
    let out = common::factory_in(state.path(), &["run", file.to_str().unwrap(), "-q"]);
    assert_eq!(out.status.code(), Some(2), "{}", common::stderr(&out));
    assert!(common::stderr(&out).contains("broken.js:4:"), "{}", common::stderr(&out));
    let runs = out_json(&common::factory_in(state.path(), &["runs", "--json"]));
    assert_eq!(runs, json!([]));
}

#[test]
fn cli_runs_one_factory_of_a_file_by_name_and_authors_factories() {
    let state = tempfile::tempdir().unwrap();
    let file = state.path().join("two.js");
    std::fs::write(&file, "import { defineFactory } from \"factory\";\nexport const a = defineFactory({ meta: { name: \"a\", description: \"d\" }, run: async () => \"A\" });\nexport const b = defineFactory({ meta: { name: \"b\", description: \"d\" }, run: async () => \"B\" });\n").unwrap();
    let target = format!("{}#b", file.display());
    let out = common::factory_in(state.path(), &["run", &target, "--json", "-q"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert_eq!(out_json(&out)["result"], "B");

    let meta = state.path().join("meta.json");
    let body = state.path().join("body.js");
    std::fs::write(&meta, r#"{"name":"authored-cli","description":"d"}"#).unwrap();
    std::fs::write(&body, "async ({ agent }) => ({ said: await agent(\"hi\", { label: \"x\" }) })\n").unwrap();
    let out =
        common::factory_in(state.path(), &["add", "--meta", meta.to_str().unwrap(), "--run", body.to_str().unwrap()]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let out = common::factory_in(state.path(), &["run", "authored-cli", "--json", "-q"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert_eq!(out_json(&out)["result"]["said"], "[dry-run x] reply to: hi");

    let doc = state.path().join("doc.json");
    std::fs::write(&doc, r#"{"meta":{"name":"authored-doc","description":"d"},"run":"async () => 5;"}"#).unwrap();
    let out = common::factory_in(state.path(), &["add", doc.to_str().unwrap()]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let out = common::factory_in(state.path(), &["run", "authored-doc", "--json", "-q"]);
    assert_eq!(out_json(&out)["result"], 5);
}

/// Poll `factory runs` until the run has spawned `spawned` agents.
fn wait_for_spawns(state: &Path, spawned: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let out = common::factory_in(state, &["runs", "--json"]);
        if out.status.success() {
            if let Some(run) = out_json(&out).as_array().and_then(|r| r.first()).cloned() {
                if run["accounting"]["agentsSpawned"].as_u64().unwrap_or(0) >= spawned {
                    return run["runId"].as_str().unwrap().to_string();
                }
            }
        }
        assert!(Instant::now() < deadline, "the run never got going: {}", common::stderr(&out));
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn cli_kill_9_then_resume_repeats_no_backend_call_and_resume_uses_the_recorded_source() {
    let state = tempfile::tempdir().unwrap();
    let rules = state.path().join("slow.json");
    std::fs::write(&rules, r#"{"rules":[{"labelPrefix":"t:","reply":{"text":"ok"},"latencyMs":40}]}"#).unwrap();
    let backend = format!("script:{}", rules.display());
    let file = state.path().join("fanout.js");
    let source = |tag: &str| {
        format!(
            "import {{ defineFactory }} from \"factory\";\nexport default defineFactory({{ meta: {{ name: \"fanout\", description: \"d\", limits: {{ maxConcurrentSubagents: 4 }} }}, run: async (ctx) => {{\n  const r = await ctx.parallel(Array.from({{ length: 120 }}, (_, i) => () => ctx.agent(`item ${{i}}`, {{ label: `t:${{i}}` }})));\n  return {{ done: r.filter((v) => v !== null).length, tag: \"{tag}\" }};\n}} }});\n"
        )
    };
    std::fs::write(&file, source("v1")).unwrap();
    let mut child =
        common::factory_cmd(state.path(), &["run", file.to_str().unwrap(), "--backend", &backend, "--json", "-q"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("factory run starts");
    let run_id = wait_for_spawns(state.path(), 24);
    // Progress pages come from the store: once 12 `agentFinished` entries are readable they
    // are committed, and so is every journal write queued before them.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let out =
            common::factory_in(state.path(), &["progress", &run_id, "--after-seq", "0", "--limit", "1000", "--json"]);
        let finished =
            out_json(&out).as_array().map_or(0, |e| e.iter().filter(|e| e["event"] == "agentFinished").count());
        if finished >= 12 {
            break;
        }
        assert!(Instant::now() < deadline, "no agent finished durably");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().expect("SIGKILL");
    child.wait().unwrap();

    // The file changes on disk; a resume without --component runs the recorded source.
    std::fs::write(&file, source("edited")).unwrap();
    let out = common::factory_in(state.path(), &["resume", &run_id, "--backend", &backend, "--json", "-q"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let envelope = out_json(&out);
    assert_eq!(envelope["result"], json!({"done": 120, "tag": "v1"}));

    let progress = out_json(&common::factory_in(
        state.path(),
        &["progress", &run_id, "--after-seq", "0", "--limit", "1000", "--json"],
    ));
    let entries = progress.as_array().unwrap();
    let second = entries.iter().position(|e| e["event"] == "attemptStarted" && e["attempt"] == 2).expect("attempt 2");
    let finished_before: std::collections::HashSet<_> = entries[..second]
        .iter()
        .filter(|e| e["event"] == "agentFinished")
        .map(|e| e["label"].as_str().unwrap().to_string())
        .collect();
    let started_after: Vec<_> = entries[second..]
        .iter()
        .filter(|e| e["event"] == "agentStarted")
        .map(|e| e["label"].as_str().unwrap().to_string())
        .collect();
    let replayed = entries[second..].iter().find(|e| e["event"] == "attemptEnded").expect("attempt 2 ended")["replayed"]
        .as_u64()
        .unwrap() as usize;
    assert!(replayed >= 12, "work was journaled before the kill ({replayed} replayed)");
    assert!(
        started_after.iter().all(|l| !finished_before.contains(l)),
        "no call that finished before the kill ran again"
    );
    assert_eq!(replayed + started_after.len(), 120, "each call replayed or spawned exactly once");
}

#[tokio::test]
async fn every_js_example_runs_on_dry_run() {
    let host = dry_host();
    for (name, args) in [
        ("review-changed.js", json!({"files": ["src/a.rs"]})),
        ("multi-stage-review.js", json!({"diff": "-a\n+b"})),
        ("loop-until-dry.js", json!({"maxRounds": 3})),
        ("triage.ts", json!({"issues": ["Crash on start", "Typo in README"], "escalate": ["critical"]})),
    ] {
        let factory = host.load_file(Path::new(&example(name))).await.unwrap_or_else(|e| panic!("{name}: {e}"));
        let envelope = run(&host, &factory, args).await;
        assert_eq!(envelope.status, RunStatus::Completed, "{name}: {envelope:#?}");
        if name == "triage.ts" {
            // The dry run answers a schema call with the schema's first enum value: both are
            // critical, so each gets a first step.
            let result = envelope.result_value().expect("a result");
            assert_eq!(result["counts"], json!({"critical": 2, "major": 0, "minor": 0}), "{result}");
            assert_eq!(result["triaged"][1]["issue"], "Typo in README");
            assert!(
                result["triaged"][1]["firstStep"].as_str().is_some_and(|s| s.starts_with("[dry-run escalate:1]")),
                "{result}"
            );
        }
    }
}

// ---- TypeScript ----

/// A TypeScript factory whose types span lines: line 9 throws when `args.fail` is set.
const TS_FACTORY: &str = "import { defineFactory } from \"factory\";
interface Args {
    name?: string;
    fail?: boolean;
}
type Greeting = { text: string | null; length: number };
function check(args: Args): void {
    if (args.fail) {
        throw new Error(`asked to fail`);
    }
}
const wrong: number = \"not a number\"; // a type error: not checked, the value runs as it is
export default defineFactory({
    meta: { name: \"greet-ts\", description: \"d\" },
    run: async ({ args, agent }) => {
        const a = args as Args;
        check(a);
        const text = await agent<string>(`Greet ${a.name ?? \"you\"}`, { label: \"greet\" });
        const g: Greeting = { text, length: text!.length };
        return { ...g, wrong };
    },
});
";

#[tokio::test]
async fn typescript_is_stripped_in_place_and_runs_recorded_as_written() {
    let host = dry_host();
    let script = Script::from_source("greet.ts", TS_FACTORY, None).expect("stripped");
    assert_eq!(script.text.as_ref(), TS_FACTORY, "the source as written is the script's text");
    assert_eq!(script.js.lines().count(), TS_FACTORY.lines().count(), "same lines");
    let factory = host.load_script(script.clone()).await.expect("loads");
    assert_eq!(factory.meta.name, "greet-ts");

    let envelope = run(&host, &factory, json!({"name": "Ada"})).await;
    let value = result(&envelope);
    assert_eq!(value["text"], "[dry-run greet] reply to: Greet Ada");
    assert_eq!(value["wrong"], "not a number", "types are not checked");
    let detail = host.detail(factory_host::DEFAULT_SESSION, &envelope.run_id).await.expect("detail");
    let recorded = detail.scripts[0].as_ref().expect("a script");
    assert_eq!((recorded.file_name.as_str(), recorded.sha256.as_str()), ("greet.ts", script.hash.as_str()));

    // A runtime throw points at the `.ts` file's own lines (9: the throw, 17: the call).
    let envelope = run(&host, &factory, json!({"fail": true})).await;
    let message = failure(&envelope, factory_host::FailureType::GuestError, None);
    assert!(message.starts_with("Error: asked to fail"), "{message}");
    assert!(message.contains("greet.ts:9:"), "{message}");
    assert!(message.contains("greet.ts:17:"), "{message}");

    // Resume runs the recorded TypeScript (stripped again), not some stored JavaScript.
    let resumed = host.resume(&envelope.run_id, ResumeOptions::default()).await.expect("resume");
    assert!(failure(&resumed, factory_host::FailureType::GuestError, None).contains("greet.ts:9:"));
}

#[tokio::test]
async fn typescript_that_cannot_be_stripped_in_place_is_refused_with_a_location() {
    let refused = |name: &str, text: &str| Script::from_source(name, text, None).expect_err("refused").to_string();
    let syntax = refused("s.ts", "const a: number = 1;\nconst b: = 2;\n");
    assert!(syntax.starts_with("s.ts:2:"), "{syntax}");
    assert!(syntax.contains("SyntaxError"), "{syntax}");
    for (name, text, at) in [
        ("e.ts", "const a = 1;\n\nenum Color { Red, Green }\n", "e.ts:3:1:"),
        ("n.ts", "namespace N {\n  export const x = 1;\n}\n", "n.ts:1:1:"),
        ("p.ts", "class A {\n  constructor(private x: number) {}\n}\n", "p.ts:2:23:"),
    ] {
        let message = refused(name, text);
        assert!(message.starts_with(at), "{name}: {message}");
        assert!(message.contains("not supported in strip-only mode"), "{name}: {message}");
    }
    // `.mts` is TypeScript too; `.js` is never stripped.
    assert!(Script::from_source("m.mts", "export const x: number = 1;\n", None).is_ok());
    let js = Script::from_source("m.js", "export const x: number = 1;\n", None).expect("not examined");
    assert_eq!(js.js, js.text);
}

#[test]
fn cli_typescript_factories_run_describe_add_and_report_ts_locations() {
    let state = tempfile::tempdir().unwrap();
    let file = state.path().join("greet.ts");
    std::fs::write(&file, TS_FACTORY).unwrap();
    let file = file.to_str().unwrap();

    let out = common::factory_in(state.path(), &["describe", file, "--json"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let described = out_json(&out);
    assert_eq!(described["meta"]["name"], "greet-ts");
    assert_eq!(described["script"]["fileName"], "greet.ts");

    let out = common::factory_in(state.path(), &["run", file, "--args", r#"{"name":"Ada"}"#, "--json", "-q"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert_eq!(out_json(&out)["result"]["text"], "[dry-run greet] reply to: Greet Ada");

    let out = common::factory_in(state.path(), &["run", file, "--args", r#"{"fail":true}"#, "--json", "-q"]);
    let envelope = out_json(&out);
    assert_eq!(envelope["status"], "error", "{envelope}");
    let message = envelope["failure"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("greet.ts:9:"), "{message}");

    let out = common::factory_in(state.path(), &["add", file]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let out = common::factory_in(state.path(), &["run", "greet-ts", "--json", "-q"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert_eq!(out_json(&out)["result"]["text"], "[dry-run greet] reply to: Greet you");

    // A syntax error in the `.ts` file: exit 2 with its location, before a run exists.
    let broken = state.path().join("broken.ts");
    std::fs::write(&broken, "import { defineFactory } from \"factory\";\ninterface A { x: number }\nexport default defineFactory({\n  meta: { name: \"b\", description: \"d\" },\n  run: async (): Promise<A> => { return ) },\n});\n").unwrap();
    let out = common::factory_in(state.path(), &["run", broken.to_str().unwrap(), "-q"]);
    assert_eq!(out.status.code(), Some(2), "{}", common::stderr(&out));
    assert!(common::stderr(&out).contains("broken.ts:5:"), "{}", common::stderr(&out));
    // An enum cannot be stripped in place: refused the same way.
    let with_enum = state.path().join("enum.ts");
    std::fs::write(&with_enum, "import { defineFactory } from \"factory\";\nenum Mode { Fast }\nexport default defineFactory({ meta: { name: \"e\", description: \"d\" }, run: async () => Mode.Fast });\n").unwrap();
    let out = common::factory_in(state.path(), &["describe", with_enum.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", common::stderr(&out));
    assert!(
        common::stderr(&out).contains("enum.ts:2:1: TypeScript: TypeScript enum is not supported"),
        "{}",
        common::stderr(&out)
    );
    let runs = out_json(&common::factory_in(state.path(), &["runs", "--json"]));
    assert_eq!(runs.as_array().map(Vec::len), Some(3), "the refused files created no run: {runs}");
}

#[test]
fn cli_a_pathological_typescript_file_is_refused_not_a_crash() {
    // 100,000 nested parentheses overflowed the host's stack inside SWC (the process died
    // with SIGABRT); now the pre-scan refuses them, exit code 2, before SWC starts.
    let state = tempfile::tempdir().unwrap();
    let file = state.path().join("deep.ts");
    std::fs::write(&file, format!("export default {}1{};\n", "(".repeat(100_000), ")".repeat(100_000))).unwrap();
    let out = common::factory_in(state.path(), &["describe", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", common::stderr(&out));
    assert!(
        common::stderr(&out).contains("deep.ts: TypeScript: brackets nest 100000 deep"),
        "{}",
        common::stderr(&out)
    );
    let big = state.path().join("big.ts");
    std::fs::write(&big, format!("export default 1;\n{}", "//\n".repeat(200_000))).unwrap();
    let out = common::factory_in(state.path(), &["describe", big.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", common::stderr(&out));
    assert!(common::stderr(&out).contains("byte limit of a TypeScript factory"), "{}", common::stderr(&out));
}
