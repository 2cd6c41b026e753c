//! The JavaScript runner: a component of world `agent:factory/script-runner` that runs a
//! factory written in JavaScript on QuickJS (through `rquickjs`).
//!
//! The host gives it the source through the `script` import; `describe` and `run` evaluate
//! it as an ES module whose imports `"factory"` and `"@github/copilot-sdk/extension"`
//! resolve to the runtime in `prelude.js` (`defineFactory`, `joinSession`, the `ctx` API);
//! its other imports are modules of the factory's directory, which the host resolves and
//! reads (`modules.rs`).
//! Everything the script does goes through the same contract as a Rust factory: `agent`
//! Promises are the async `agents.agent` import (thousands may be in flight; `calls.rs`
//! runs them and hands their outcomes to JS in batches), steps, phases and logs are the
//! `ctx` imports. The runner imports nothing else (no WASI).
//!
//! Determinism under resume: `Date.now()` is a logical clock: the run's creation time (read
//! from the run id, a UUID v7) plus the time its timers and sleeps have waited (it does not
//! advance with computation or agent calls); `Math.random()` is a PRNG seeded from the run
//! id. Both are the same in every attempt that takes the same path, so prompts built from
//! them keep their memo keys.

use rquickjs::function::{Async, Func};
use rquickjs::{AsyncContext, AsyncRuntime, Ctx, Function, Object, Promise, Value};
use std::cell::Cell;
use std::future::Future;

mod calls;
mod modules;

mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "script-runner",
        generate_all,
    });
}

use bindings::agent::factory::types::{
    Abort, AgentLimits, AgentOptions, LimitKind, Limits, LogLevel, Meta, PhaseDecl, StepError,
};
use bindings::agent::factory::{agents, ctx as hooks, script};

/// The standard globals (`console`, timers, `AbortController`, `URL`, ...), evaluated first
/// (the parts below on demand): globals.js as QuickJS bytecode, compiled by `cargo xtask
/// js-runner` (reading it is cheaper than parsing the source at every run's start).
const GLOBALS: &[u8] = include_bytes!("globals.js.qbc");

/// The parts of the globals a run evaluates only when it first uses them (see globals.js):
/// parsing is most of a run's start-up. `URL`, `TextEncoder`, `structuredClone`, ...:
const GLOBALS_WEB: &str = include_str!("globals-web.js");
/// `inspect`/`format`, for `console` and error messages.
const GLOBALS_INSPECT: &str = include_str!("globals-inspect.js");

/// The runtime module the factory imports: prelude.js as bytecode, like [`GLOBALS`].
const PRELUDE: &[u8] = include_bytes!("prelude.js.qbc");

/// The JS stack limit, checked by QuickJS against the shadow stack in linear memory. Each
/// JS call also uses wasm's native stack (wasmtime's, 512 KiB by default) at a higher rate,
/// so the limit must be low enough for QuickJS to notice first: then deep recursion is a
/// catchable `InternalError: stack overflow`, as in a browser.
const MAX_STACK: usize = 128 * 1024;

/// How many bytes QuickJS's heap may hold before its first cycle collection (after each, it
/// collects again at 1.5x what it kept). With QuickJS's default, 256 KiB, a fan-out of a
/// thousand agents (a few promises and closures each, all live until they settle) collected
/// several times, each a walk of every live object: 12% of the runner's time in that run.
/// Reference counting frees all but cyclic garbage at once, so a run rarely gets near this.
const GC_THRESHOLD: usize = 8 << 20;

thread_local! {
    /// What `Date.now()` answers, in microseconds since the epoch.
    static CLOCK_US: Cell<f64> = const { Cell::new(0.0) };
}

/// QuickJS's only host import on this target: the clock.
#[unsafe(no_mangle)]
pub extern "C" fn __rquickjs_host_now_us() -> f64 {
    CLOCK_US.with(|c| c.get())
}

/// The creation time of a run, from its id (a UUID v7 starts with 48 bits of Unix ms).
fn run_clock_us(run_id: &str) -> f64 {
    let hex: String = run_id.chars().filter(|c| *c != '-').take(12).collect();
    match u64::from_str_radix(&hex, 16) {
        Ok(ms) if hex.len() == 12 => ms as f64 * 1000.0,
        _ => 0.0,
    }
}

struct Runner;

bindings::export!(Runner with_types_in bindings);

impl bindings::Guest for Runner {
    fn meta() -> Meta {
        match describe() {
            Ok(meta) => meta,
            // The host calls `describe` for script factories; `meta` cannot say why.
            Err(message) => panic!("{message}"),
        }
    }

    fn describe() -> Result<Meta, String> {
        describe()
    }

    fn factories() -> Result<Vec<String>, String> {
        let source = script::source();
        block_on(async {
            let (rt, context) = new_engine(&source).await.map_err(|e| format!("cannot start the JS engine: {e}"))?;
            let outcome = context
                .async_with(async |ctx| {
                    install_natives(&ctx, false)?;
                    let names: Function = ctx.globals().get("__factory_names")?;
                    let promise: Promise = names.call((source.file_name.clone(),))?;
                    promise.into_future::<String>().await
                })
                .await;
            drop(context);
            drop(rt);
            let encoded = outcome.map_err(|e| format!("the JS runner failed: {e}"))?;
            match encoded.split_at_checked(1) {
                Some(("m", json)) => {
                    serde_json::from_str(json).map_err(|e| format!("the JS runner failed: factory names: {e}"))
                }
                Some(("e", message)) => Err(message.to_string()),
                _ => Err("the JS runner failed: malformed factories outcome".into()),
            }
        })
    }

    async fn run(args: String) -> Result<Option<String>, String> {
        let source = script::source();
        let run_id = hooks::run_id();
        CLOCK_US.with(|c| c.set(run_clock_us(&run_id)));
        let (rt, context) = new_engine(&source).await.map_err(|e| format!("cannot start the JS engine: {e}"))?;
        let outcome = calls::Driven(
            Box::pin(context.async_with(async |ctx| {
                install_natives(&ctx, true)?;
                let main: Function = ctx.globals().get("__factory_run")?;
                let settle: Function = ctx.globals().get("__factory_settle")?;
                let poll_stop: Function = ctx.globals().get::<_, Object>("__factory_globals")?.get("pollStop")?;
                let promise: Promise = main.call((source.file_name.clone(), source.entry.clone(), args, run_id))?;
                let mut result = std::pin::pin!(promise.into_future::<String>());
                // Before each look at the run's promise, the agent calls that came back settle
                // (and a run parked on nothing learns that it is stopping: its signal fires).
                std::future::poll_fn(|cx| {
                    if calls::take_stop_check() {
                        if let Err(e) = poll_stop.call::<_, bool>(()) {
                            return std::task::Poll::Ready(Err(e));
                        }
                    }
                    if let Err(e) = settle_calls(&settle) {
                        return std::task::Poll::Ready(Err(e));
                    }
                    result.as_mut().poll(cx)
                })
                .await
            })),
            stuck,
        )
        .await;
        calls::clear();
        drop(context);
        drop(rt);
        match outcome {
            Ok(encoded) => decode_outcome(&encoded),
            Err(e) => Err(format!("the JS runner failed: {e}")),
        }
    }
}

/// The outcome of a run that was told it stopped and still waits on nothing (a promise that
/// never settles): an error, which the host replaces with the stop's cause.
fn stuck() -> String {
    let why = hooks::stop_reason().map(|abort| abort_message(&abort)).unwrap_or_default();
    format!("ethe run stopped ({why}) while its body waited on a promise that never settles")
}

/// Hand the agent calls that came back to `__factory_settle(ids, kinds, texts)` (prelude.js):
/// kind 0 a JSON reply, 1 no reply (`null`), 2 an abort (`kind:message`).
fn settle_calls(settle: &Function<'_>) -> rquickjs::Result<()> {
    let done = calls::take_done();
    if done.is_empty() {
        return Ok(());
    }
    let mut ids = Vec::with_capacity(done.len());
    let mut kinds = Vec::with_capacity(done.len());
    let mut texts = Vec::with_capacity(done.len());
    for (id, outcome) in done {
        ids.push(id);
        let (kind, text) = match outcome {
            Ok(Some(json)) => (0, json),
            Ok(None) => (1, String::new()),
            Err(abort) => (2, abort_message(&abort)),
        };
        kinds.push(kind);
        texts.push(text);
    }
    let settled = settle.call::<_, ()>((ids.clone(), kinds, texts));
    calls::release(ids);
    settled
}

/// `describe`: evaluate the module and read the chosen factory's meta.
fn describe() -> Result<Meta, String> {
    let source = script::source();
    block_on(async {
        let (rt, context) = new_engine(&source).await.map_err(|e| format!("cannot start the JS engine: {e}"))?;
        let outcome = context
            .async_with(async |ctx| {
                install_natives(&ctx, false)?;
                let main: Function = ctx.globals().get("__factory_describe")?;
                let promise: Promise = main.call((source.file_name.clone(), source.entry.clone()))?;
                promise.into_future::<String>().await
            })
            .await;
        drop(context);
        drop(rt);
        let encoded = outcome.map_err(|e| format!("the JS runner failed: {e}"))?;
        match encoded.split_at_checked(1) {
            Some(("m", json)) => meta_from_json(json),
            Some(("e", message)) => Err(message.to_string()),
            _ => Err("the JS runner failed: malformed describe outcome".into()),
        }
    })
}

/// Drive a future that waits on nothing outside the JS engine (describe never calls an
/// async import), polling until it is ready.
fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(value) = future.as_mut().poll(&mut cx) {
            return value;
        }
    }
}

/// How the runner's `run` error says that the result is not plain JSON (the host reads it
/// as failure type `invalid_result`; `host/src/guests/script.rs` has the same mark). No
/// other error of the runner starts with it.
const INVALID_RESULT_MARK: char = '\u{1}';

/// `"r" + json` (a result), `"n"` (no result), `"e" + message`, `"j" + message` (a result
/// that is not plain JSON).
fn decode_outcome(encoded: &str) -> Result<Option<String>, String> {
    match encoded.split_at_checked(1) {
        Some(("r", json)) => Ok(Some(json.to_string())),
        Some(("n", _)) => Ok(None),
        Some(("e", message)) => Err(message.trim_start_matches(INVALID_RESULT_MARK).to_string()),
        Some(("j", message)) => Err(format!("{INVALID_RESULT_MARK}{message}")),
        _ => Err("the JS runner failed: malformed run outcome".into()),
    }
}

/// A runtime and context with the loader for `source` and the prelude evaluated.
async fn new_engine(source: &script::ScriptSource) -> rquickjs::Result<(AsyncRuntime, AsyncContext)> {
    let rt = AsyncRuntime::new()?;
    rt.set_max_stack_size(MAX_STACK).await;
    rt.set_gc_threshold(GC_THRESHOLD).await;
    let modules = modules::Modules::new(source.file_name.clone(), source.text.clone());
    rt.set_loader(modules.clone(), modules).await;
    let context = AsyncContext::full(&rt).await?;
    context
        .with(|ctx| -> rquickjs::Result<()> {
            // What globals.js evaluates on demand (it takes this hidden global away).
            ctx.globals().set("__factory_parts", Func::from(globals_part))?;
            eval_bytecode(&ctx, GLOBALS)?;
            eval_bytecode(&ctx, PRELUDE)?;
            Ok(())
        })
        .await?;
    Ok((rt, context))
}

/// Evaluate a script the xtask compiled to bytecode with this QuickJS release.
fn eval_bytecode(ctx: &Ctx<'_>, bytecode: &[u8]) -> rquickjs::Result<()> {
    use rquickjs::qjs;
    let raw = ctx.as_raw().as_ptr();
    // SAFETY: the bytes are the runner's own (embedded at build time, written by the same
    // QuickJS release), `raw` is the live context of `ctx`, and each value is freed once
    // (`JS_EvalFunction` takes the function).
    unsafe {
        let function =
            qjs::JS_ReadObject(raw, bytecode.as_ptr(), bytecode.len() as _, qjs::JS_READ_OBJ_BYTECODE as i32);
        if qjs::JS_IsException(function) {
            return Err(rquickjs::Error::Exception);
        }
        let value = qjs::JS_EvalFunction(raw, function);
        if qjs::JS_IsException(value) {
            return Err(rquickjs::Error::Exception);
        }
        qjs::JS_FreeValue(raw, value);
    }
    Ok(())
}

/// `__factory_parts(name)`: evaluate a part of the globals (its value is a function).
fn globals_part<'js>(ctx: Ctx<'js>, name: String) -> rquickjs::Result<Value<'js>> {
    match name.as_str() {
        "web" => ctx.eval(GLOBALS_WEB),
        "inspect" => ctx.eval(GLOBALS_INSPECT),
        _ => Err(rquickjs::Exception::throw_internal(&ctx, "no such part of the globals")),
    }
}

/// The native hooks the prelude builds `ctx` from, on the hidden global `__factory_native`.
/// Outcomes are encoded as strings: `"o" + json` (a value), `"a" + message` (an abort),
/// `"i" + message` (an invalid step value), `null` (nothing).
fn install_natives(ctx: &Ctx<'_>, with_agents: bool) -> rquickjs::Result<()> {
    let native = Object::new(ctx.clone())?;
    native.set(
        "stepGet",
        Func::from(|key: String| -> Option<String> {
            match hooks::step_get(&key) {
                Ok(Some(json)) => Some(format!("o{json}")),
                Ok(None) => None,
                Err(abort) => Some(format!("a{}", abort_message(&abort))),
            }
        }),
    )?;
    native.set(
        "stepPut",
        Func::from(|key: String, json: String| -> Option<String> {
            match hooks::step_put(&key, &json) {
                Ok(()) => None,
                Err(StepError::InvalidJson(m)) => Some(format!("i{m}")),
                Err(StepError::Abort(abort)) => Some(format!("a{}", abort_message(&abort))),
            }
        }),
    )?;
    native.set("phase", Func::from(|title: String| hooks::phase(&title)))?;
    native.set("log", Func::from(|message: String| hooks::log(&message)))?;
    native.set(
        "logAt",
        Func::from(|level: String, message: String| {
            let level = match level.as_str() {
                "debug" => LogLevel::Debug,
                "warn" => LogLevel::Warn,
                "error" => LogLevel::Error,
                _ => LogLevel::Info,
            };
            hooks::log_at(level, &message)
        }),
    )?;
    native.set("cancelled", Func::from(hooks::cancelled))?;
    native.set("stopReason", Func::from(|| hooks::stop_reason().map(|abort| abort_message(&abort))))?;
    // `ctx.pause(key)`: `"o" + json` (the checkpoint's answer), `"n"` (passed without one),
    // or `"a" + message` (the abort that pauses the run at it, or a stop under way).
    native.set(
        "pause",
        Func::from(|key: String| -> String {
            match hooks::pause(&key) {
                Ok(Some(json)) => format!("o{json}"),
                Ok(None) => "n".into(),
                Err(abort) => format!("a{}", abort_message(&abort)),
            }
        }),
    )?;
    // The logical clock (see the module doc): the prelude advances it as timers fire.
    native.set("setClock", Func::from(|ms: f64| CLOCK_US.with(|c| c.set(ms * 1000.0))))?;
    native.set("clock", Func::from(|| CLOCK_US.with(|c| c.get()) / 1000.0))?;
    native.set("urlParse", Func::from(|input: String, base: Option<String>| url_parse(&input, base.as_deref())))?;
    native.set("urlSet", Func::from(|href: String, part: String, value: String| url_set(&href, &part, &value)))?;
    if with_agents {
        // `agents.sleep`: timers and `ctx.sleep`. It ends early once the run is stopping.
        native.set(
            "sleep",
            Func::from(Async(|ms: f64| async move {
                let ms = if ms.is_finite() && ms > 0.0 { ms.min(u64::MAX as f64) as u64 } else { 0 };
                let _sleeping = calls::sleeping();
                agents::sleep(ms).await;
                rquickjs::Result::Ok(())
            })),
        )?;
        // `agents.agent`, run by calls.rs: the id the JS side keeps the call's promise under
        // until `__factory_settle` hands it the outcome.
        native.set(
            "agentStart",
            Func::from(
                |prompt: String,
                 label: Option<String>,
                 schema: Option<String>,
                 model: Option<String>,
                 limits: Option<String>,
                 tuning: Option<String>| {
                    let limits = agent_limits(limits.as_deref().and_then(|l| serde_json::from_str(l).ok()).as_ref());
                    // `{agent?, reasoningEffort?, contextTier?}` (checked by the prelude; the
                    // host checks them again).
                    let tuning: Option<serde_json::Value> =
                        tuning.as_deref().and_then(|t| serde_json::from_str(t).ok());
                    let text = |key: &str| {
                        tuning.as_ref().and_then(|t| t.get(key)).and_then(|v| v.as_str()).map(str::to_string)
                    };
                    let (agent, reasoning_effort, context_tier) =
                        (text("agent"), text("reasoningEffort"), text("contextTier"));
                    calls::start(
                        prompt,
                        AgentOptions { label, schema, model, limits, agent, reasoning_effort, context_tier },
                    )
                },
            ),
        )?;
    }
    ctx.globals().set("__factory_native", native)?;
    let _: Value = ctx.globals().get("__factory_native")?;
    Ok(())
}

/// How an abort reads in JS: `kind:message` (`kind:limit:message` for a factory limit),
/// `kind` spelled as the envelope's `failure.type` the run will end with; every abort fires
/// `ctx.signal`.
fn abort_message(abort: &Abort) -> String {
    match abort {
        Abort::Cancelled => "cancelled:the run was cancelled".into(),
        Abort::LimitReached(kind) => {
            let kind = match kind {
                LimitKind::MaxTotalSubagents => "maxTotalSubagents",
                LimitKind::TimeoutSeconds => "timeoutSeconds",
                LimitKind::MaxAiCredits => "maxAiCredits",
            };
            format!("factory_limit_reached:{kind}:the factory limit `{kind}` was reached")
        }
        Abort::Storage(m) => format!("storage:the durable store failed: {m}"),
        Abort::InvalidCall(m) => format!("invalid_call:{m}"),
        Abort::SandboxLimit(m) => format!("sandbox_limit:{m}"),
        Abort::Backend(m) => format!("backend:the agent backend could not be used: {m}"),
        Abort::Halted => "halted:the host is shutting down; resume the run to continue".into(),
        Abort::Paused(None) => "paused:the run was paused; resume it to continue".into(),
        Abort::Paused(Some(key)) => format!("paused:the run is paused at checkpoint `{key}`; resume it to continue"),
    }
}

/// `new URL(input, base)` by the WHATWG URL Standard (the `url` crate): the parts as JSON,
/// or `null` when `input` is no valid URL.
fn url_parse(input: &str, base: Option<&str>) -> Option<String> {
    let parsed = match base {
        Some(base) => url::Url::parse(base).ok()?.join(input).ok()?,
        None => url::Url::parse(input).ok()?,
    };
    Some(url_parts(&parsed))
}

/// Set one part of a URL (`href` is valid: it came from [`url_parse`]) by the Standard's
/// setter rules, which ignore a value they cannot take (`href` alone fails: `null`).
fn url_set(href: &str, part: &str, value: &str) -> Option<String> {
    let mut parsed = url::Url::parse(href).ok()?;
    match part {
        "href" => parsed = url::Url::parse(value).ok()?,
        "protocol" => url::quirks::set_protocol(&mut parsed, value).unwrap_or(()),
        "username" => url::quirks::set_username(&mut parsed, value).unwrap_or(()),
        "password" => url::quirks::set_password(&mut parsed, value).unwrap_or(()),
        "host" => url::quirks::set_host(&mut parsed, value).unwrap_or(()),
        "hostname" => url::quirks::set_hostname(&mut parsed, value).unwrap_or(()),
        "port" => url::quirks::set_port(&mut parsed, value).unwrap_or(()),
        "pathname" => url::quirks::set_pathname(&mut parsed, value),
        "search" => url::quirks::set_search(&mut parsed, value),
        "hash" => url::quirks::set_hash(&mut parsed, value),
        _ => {}
    }
    Some(url_parts(&parsed))
}

fn url_parts(u: &url::Url) -> String {
    use url::quirks as q;
    serde_json::json!({
        "href": q::href(u),
        "origin": q::origin(u),
        "protocol": q::protocol(u),
        "username": q::username(u),
        "password": q::password(u),
        "host": q::host(u),
        "hostname": q::hostname(u),
        "port": q::port(u),
        "pathname": q::pathname(u),
        "search": q::search(u),
        "hash": q::hash(u),
    })
    .to_string()
}

/// Soft limits from the JSON the prelude produced (`{maxTurns?, maxDurationSeconds?,
/// wrapUp?}`, checked there; the host checks them again).
fn agent_limits(value: Option<&serde_json::Value>) -> AgentLimits {
    let get = |key: &str| value.and_then(|v| v.get(key));
    AgentLimits {
        max_turns: get("maxTurns").and_then(|n| n.as_u64()).and_then(|n| u32::try_from(n).ok()),
        max_duration_seconds: get("maxDurationSeconds").and_then(|d| d.as_f64()),
        wrap_up: get("wrapUp").and_then(|w| w.as_str()).map(str::to_string),
    }
}

/// The wit `meta` from the JSON the prelude produced (its shape checked there).
fn meta_from_json(json: &str) -> Result<Meta, String> {
    use serde_json::Value as Json;
    let value: Json = serde_json::from_str(json).map_err(|e| format!("meta: {e}"))?;
    let text = |v: Option<&Json>| v.and_then(|v| v.as_str()).map(str::to_string);
    let name = text(value.get("name")).ok_or("meta.name must be a string")?;
    let description = text(value.get("description")).ok_or("meta.description must be a string")?;
    let mut phases = Vec::new();
    for item in value.get("phases").and_then(|p| p.as_array()).map(Vec::as_slice).unwrap_or_default() {
        let title = text(item.get("title")).ok_or("meta.phases[].title must be a string")?;
        phases.push(PhaseDecl { title, detail: text(item.get("detail")) });
    }
    let mut limits = Limits {
        max_concurrent_subagents: None,
        max_total_subagents: None,
        timeout_seconds: None,
        max_ai_credits: None,
    };
    if let Some(declared) = value.get("limits").and_then(|l| l.as_object()) {
        for (key, v) in declared {
            let n = v.as_f64().ok_or_else(|| format!("meta.limits.{key} must be a number"))?;
            let int = || -> Result<u32, String> {
                v.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| format!("meta.limits.{key} must be a positive integer"))
            };
            match key.as_str() {
                "maxConcurrentSubagents" => limits.max_concurrent_subagents = Some(int()?),
                "maxTotalSubagents" => limits.max_total_subagents = Some(int()?),
                "timeoutSeconds" => limits.timeout_seconds = Some(n),
                "maxAiCredits" => limits.max_ai_credits = Some(n),
                other => return Err(format!("meta.limits has an unknown limit `{other}`")),
            }
        }
    }
    let args_schema = value.get("argsSchema").filter(|s| !s.is_null()).map(|s| s.to_string());
    let agent_limits = agent_limits(value.get("agentLimits"));
    Ok(Meta { name, description, phases, limits, args_schema, agent_limits })
}
