//! `hostile`: a test factory that misbehaves on purpose, one way per `args.case` (spin
//! without calling a hook, exhaust memory, overflow the stack, flood the log, return or
//! journal oversized values, panic, over-fan-out, ignore cancellation and aborts), so
//! `tests/hostile.rs` can check that the host stops each with a typed failure. Where the
//! SDK would protect the host (it validates step values, caps `parallel`), the case calls
//! the raw bindings in `factory_sdk::__bindings` instead (`invalid-result` even exports
//! `run` itself, to return a result that is not JSON).

use factory_sdk::__bindings::agent::factory::{agents as raw_agents, ctx as raw_ctx, types as wit};
use factory_sdk::prelude::*;
use std::hint::black_box;

#[derive(Deserialize)]
struct Args {
    case: String,
    /// A count or a size, depending on the case.
    #[serde(default)]
    n: usize,
    /// Bytes per line (`long-logs`).
    #[serde(default)]
    bytes: usize,
    /// A second count (`huge-phase`: log lines after the phase; `many-steps`,
    /// `steps-roundtrip`, `grow-steps`: steps).
    #[serde(default)]
    count: usize,
    /// Fail at the end (`steps-roundtrip`, `grow-steps`), so the run can be resumed.
    #[serde(default)]
    fail: bool,
}

/// A JSON string value of `n` bytes (quotes included), distinct per `seed`.
fn step_value(seed: usize, n: usize) -> String {
    let head = format!("\"{seed}:");
    format!("{head}{}\"", "x".repeat(n.saturating_sub(head.len() + 1)))
}

/// A full binary tree of `anyOf`, `depth` levels deep, with `true` leaves, as JSON text.
fn any_of_tree(depth: usize) -> String {
    let mut text = "true".to_string();
    for _ in 0..depth {
        text = format!(r#"{{"anyOf":[{text},{text}]}}"#);
    }
    text
}

/// How many raw agent calls answered; the first abort among them fails the run.
fn answered(outcomes: Vec<Result<Option<String>, wit::Abort>>) -> Result<usize, Error> {
    let mut answered = 0usize;
    for outcome in outcomes {
        if outcome.map_err(Abort::from)?.is_some() {
            answered += 1;
        }
    }
    Ok(answered)
}

/// A raw agent call; an abort becomes the factory's error.
async fn raw_agent(
    prompt: &str,
    label: Option<String>,
    schema: Option<String>,
    model: Option<String>,
) -> Result<Option<String>, Error> {
    let options = wit::AgentOptions {
        label,
        schema,
        model,
        limits: wit::AgentLimits { max_turns: None, max_duration_seconds: None, wrap_up: None },
        agent: None,
        reasoning_effort: None,
        context_tier: None,
    };
    Ok(raw_agents::agent(prompt.to_string(), options).await.map_err(Abort::from)?)
}

#[cfg(target_arch = "wasm32")]
#[link(wasm_import_module = "agent:factory/agents@0.1.0")]
extern "C" {
    /// `agents.agent-start` as the canonical ABI calls it: its 18 flat parameters are more
    /// than 16, so they go in memory (a `(string, agent-options)` tuple) and the import takes
    /// that tuple's address and the address of its result. Declared here so a case can hand
    /// the host bytes the generated bindings never would.
    #[link_name = "agent-start"]
    fn agent_start_abi(params: *mut u8, result: *mut u8);
}

/// Outside wasm32 there is no host to import from (as in the generated bindings).
#[cfg(not(target_arch = "wasm32"))]
unsafe fn agent_start_abi(_params: *mut u8, _result: *mut u8) {
    unreachable!("agent-start is imported from the host: build for wasm32")
}

/// The tuple `agent_start_abi` reads: the prompt's pointer and length at 0 and 4, then
/// `agent-options` at 8 (label, schema and model as `option<string>` at 8, 20 and 32, the
/// soft limits at 48; all absent when zero).
#[repr(C, align(8))]
struct StartParams([u8; 88]);

/// What `agent_start_abi` writes: the `result`'s case at 0, `started`'s at 4 (0: `reply`,
/// 1: `pending`).
#[repr(C, align(8))]
struct StartResult([u8; 32]);

/// `agent-start` of a prompt at `prompt` (`len` bytes) with a label at `label` (`label_len`
/// bytes), both as raw addresses; which of `started`'s cases came back (`reply` or
/// `pending`), or the abort.
fn agent_start_raw(prompt: u32, len: u32, label: u32, label_len: u32) -> Result<&'static str, Error> {
    let mut params = StartParams([0; 88]);
    params.0[0..4].copy_from_slice(&prompt.to_le_bytes());
    params.0[4..8].copy_from_slice(&len.to_le_bytes());
    params.0[8] = 1;
    params.0[12..16].copy_from_slice(&label.to_le_bytes());
    params.0[16..20].copy_from_slice(&label_len.to_le_bytes());
    let mut result = StartResult([0; 32]);
    // SAFETY: both point at buffers of the sizes the canonical ABI reads and writes.
    unsafe { agent_start_abi(params.0.as_mut_ptr(), result.0.as_mut_ptr()) };
    match (result.0[0], result.0[4]) {
        (0, 0) => Ok("reply"),
        (0, 1) => Ok("pending"),
        _ => Err(Error::msg("agent-start answered with an abort")),
    }
}

struct Hostile;

/// Recurse without end. The combination after the call keeps it from being a tail call
/// (or an accumulator loop), and nothing lives in linear memory, so it is the wasm call
/// stack, not the shadow stack in linear memory, that overflows.
#[inline(never)]
fn recurse(n: u64) -> u64 {
    if n == 0 {
        return 0;
    }
    let below = recurse(n - 1);
    below.rotate_left(7) ^ n
}

/// Burn CPU forever without calling the host.
fn spin() -> ! {
    let mut x: u64 = 0;
    loop {
        x = black_box(x.wrapping_add(1));
    }
}

impl Factory for Hostile {
    type Output = Value;

    fn meta() -> Meta {
        Meta::new("hostile", "Misbehaves on purpose (host tests). args: { case: string, n?: number, bytes?: number }")
            .phase("Attack")
    }

    async fn run(ctx: Ctx) -> Result<Value, Error> {
        let args: Args = ctx.args()?;
        ctx.phase("Attack");
        match args.case.as_str() {
            // An infinite loop that never calls a hook: only fuel, epochs and deadlines stop it.
            "spin" => spin(),
            // Allocate and touch `n` bytes (default 1 GiB) in 16 MiB steps.
            "memory" => {
                let total = if args.n == 0 { 1 << 30 } else { args.n };
                let step = 16 << 20;
                let mut held: Vec<Vec<u8>> = Vec::new();
                let mut allocated = 0usize;
                while allocated < total {
                    let mut block = vec![0u8; step];
                    for page in block.chunks_mut(64 << 10) {
                        page[0] = 1;
                    }
                    held.push(black_box(block));
                    allocated += step;
                }
                Ok(json!({ "allocated": allocated, "blocks": black_box(&held).len() }))
            }
            // Unbounded recursion.
            "recursion" => Ok(json!({ "value": recurse(black_box(u64::MAX)) })),
            // `n` short log lines.
            "log-flood" => {
                for i in 0..args.n {
                    ctx.log(format!("flood {i}"));
                }
                Ok(json!({ "logged": args.n }))
            }
            // `n` log lines of `bytes` bytes each.
            "long-logs" => {
                let line = "x".repeat(args.bytes);
                for _ in 0..args.n {
                    ctx.log(&line);
                }
                Ok(json!({ "logged": args.n }))
            }
            // A result of `n` bytes.
            "huge-result" => Ok(Value::String("x".repeat(args.n))),
            // An error whose message is `n` bytes (a two-byte character last, so a cut at a
            // byte bound could split it).
            "huge-error" => Err(Error::msg(format!("{}é", "e".repeat(args.n.saturating_sub(2))))),
            // A result nested `n` arrays deep (over the host's JSON depth limit).
            "deep-result" => Ok((0..args.n).fold(Value::Null, |inner, _| Value::Array(vec![inner]))),
            // Raw `step-put` of text that is not JSON: refused with `invalid-json`, and the run
            // goes on (a later step, a step read and an agent call still work).
            "bad-step" => {
                let refused = match raw_ctx::step_put("bad", "{not json") {
                    Err(wit::StepError::InvalidJson(message)) => message,
                    other => {
                        return Err(Error::msg(format!(
                            "step-put of `{{not json` returned {other:?}, expected invalid-json"
                        )))
                    }
                };
                let journaled = raw_ctx::step_get("bad").map_err(Abort::from)?;
                let good: u32 = ctx.step("good", || async { Ok(7) }).await?;
                let reply = ctx.agent("after a bad step").label("h:after-bad-step").await?;
                Ok(json!({ "refused": refused, "badJournaled": journaled, "good": good, "reply": reply }))
            }
            // Raw `step-put` of a valid JSON string of `n` bytes; the refusal is ignored and the
            // guest claims success.
            "big-step" => {
                let value = format!("\"{}\"", "x".repeat(args.n));
                let outcome = raw_ctx::step_put("big", &value);
                drop(value);
                Ok(json!({ "ignored": format!("{outcome:?}") }))
            }
            // An agent prompt of `n` bytes.
            "huge-prompt" => {
                let reply = ctx.agent("x".repeat(args.n)).label("h:huge-prompt").await?;
                Ok(json!({ "reply": reply }))
            }
            "panic" => panic!("the hostile guest panics on purpose"),
            // `agent-start` called through the canonical ABI with hand-made parameters:
            // `n` = 0 a well-formed call (the layout is right), 1 a prompt that runs past
            // the end of memory, 2 a prompt that is not UTF-8, 3 a label that is not UTF-8.
            "abi-agent-start" => {
                let text = "a prompt made by hand";
                let (label, label_len) = ("h:abi".as_ptr() as u32, "h:abi".len() as u32);
                let bad: &[u8] = &[0x66, 0x6f, 0xff, 0xfe];
                let (prompt, len, label, label_len) = match args.n {
                    0 => (text.as_ptr() as u32, text.len() as u32, label, label_len),
                    1 => (u32::MAX - 8, 64, label, label_len),
                    2 => (bad.as_ptr() as u32, bad.len() as u32, label, label_len),
                    _ => (text.as_ptr() as u32, text.len() as u32, bad.as_ptr() as u32, bad.len() as u32),
                };
                Ok(json!({ "started": agent_start_raw(prompt, len, label, label_len)? }))
            }
            // `n` items through the SDK's `parallel` (it refuses more than 4096).
            "too-many" => {
                let out = ctx
                    .parallel((0..args.n).map(|i| {
                        let ctx = ctx.clone();
                        async move { ctx.agent(format!("item {i}")).label(format!("h:item:{i}")).await }
                    }))
                    .await?;
                Ok(json!({ "len": out.len() }))
            }
            // `n` concurrent raw agent calls with a prompt of `bytes` bytes each, all at once:
            // the guest builds each prompt from one buffer and frees it once the host has
            // it, so its own memory stays small while the host would hold every copy.
            "pending-prompts" => {
                let filler = "p".repeat(args.bytes);
                let filler = &filler;
                let calls = (0..args.n).map(|i| async move {
                    let options = wit::AgentOptions {
                        label: Some(format!("h:pending:{i}")),
                        schema: None,
                        model: None,
                        limits: wit::AgentLimits { max_turns: None, max_duration_seconds: None, wrap_up: None },
                        agent: None,
                        reasoning_effort: None,
                        context_tier: None,
                    };
                    let mut prompt = String::with_capacity(filler.len() + 16);
                    prompt.push_str(&format!("{i} "));
                    prompt.push_str(filler);
                    raw_agents::agent(prompt, options).await
                });
                Ok(json!({ "done": answered(futures::future::join_all(calls).await)? }))
            }
            // The same through `agent-start`, never waiting: each started call stays
            // pending in the host (a prompt of `bytes` bytes), none is ever reported.
            "started-prompts" => {
                let filler = "p".repeat(args.bytes);
                let mut started = 0;
                for i in 0..args.n {
                    let options = wit::AgentOptions {
                        label: Some(format!("h:started:{i}")),
                        schema: None,
                        model: None,
                        limits: wit::AgentLimits { max_turns: None, max_duration_seconds: None, wrap_up: None },
                        agent: None,
                        reasoning_effort: None,
                        context_tier: None,
                    };
                    let mut prompt = String::with_capacity(filler.len() + 16);
                    prompt.push_str(&format!("{i} "));
                    prompt.push_str(&filler);
                    match raw_agents::agent_start(&prompt, &options) {
                        Ok(wit::Started::Pending(_)) => started += 1,
                        Ok(wit::Started::Reply(_)) => {}
                        Err(abort) => return Err(Abort::from(abort).into()),
                    }
                }
                Ok(json!({ "started": started }))
            }
            // `n` concurrent raw agent calls: no SDK cap in the way.
            "raw-fanout" => {
                let calls = (0..args.n).map(|i| {
                    let options = wit::AgentOptions {
                        label: Some(format!("h:raw:{i}")),
                        schema: None,
                        model: None,
                        limits: wit::AgentLimits { max_turns: None, max_duration_seconds: None, wrap_up: None },
                        agent: None,
                        reasoning_effort: None,
                        context_tier: None,
                    };
                    raw_agents::agent(format!("raw {i}"), options)
                });
                Ok(json!({ "done": answered(futures::future::join_all(calls).await)? }))
            }
            // `n` agents at once through `parallel`, distinct labels.
            "fanout" => {
                let out = ctx
                    .parallel((0..args.n).map(|i| {
                        let ctx = ctx.clone();
                        async move { ctx.agent(format!("task {i}")).label(format!("h:fan:{i}")).await }
                    }))
                    .await?;
                Ok(json!({ "done": out.iter().filter(|v| v.is_some()).count() }))
            }
            // `n` agents one after another, propagating the abort like a good citizen.
            "spawn-past-cap" => {
                for i in 0..args.n {
                    ctx.agent(format!("spawn {i}")).label(format!("h:spawn:{i}")).await?;
                }
                Ok(json!({ "spawned": args.n }))
            }
            // `n` agents one after another, swallowing every abort, then claiming success.
            "ignore-abort" => {
                let (mut answered, mut refused) = (0usize, 0usize);
                for i in 0..args.n {
                    match ctx.agent(format!("greedy {i}")).label(format!("h:greedy:{i}")).await {
                        Ok(_) => answered += 1,
                        Err(_) => refused += 1,
                    }
                }
                Ok(json!({ "answered": answered, "refused": refused }))
            }
            // A raw agent call whose schema is not JSON: the host refuses the call and ends
            // the attempt with `invalid_call`; the guest ignores the abort and claims success.
            "bad-schema" => {
                let options = wit::AgentOptions {
                    label: Some("h:bad-schema".into()),
                    schema: Some("{not json".into()),
                    model: None,
                    limits: wit::AgentLimits { max_turns: None, max_duration_seconds: None, wrap_up: None },
                    agent: None,
                    reasoning_effort: None,
                    context_tier: None,
                };
                let outcome = raw_agents::agent("judge this".into(), options).await;
                Ok(json!({ "ignored": format!("{outcome:?}") }))
            }
            // One agent, then busy-wait on `cancelled()`; once cancelled, keep calling hooks
            // (agents, logs) as if nothing happened. Only the host can end this.
            "cancel-loop" => {
                ctx.agent("before the loop").label("h:before").await?;
                ctx.log("looping");
                while !ctx.cancelled() {}
                ctx.log("saw cancellation; carrying on");
                for i in 0..100 {
                    let outcome = ctx.agent(format!("after cancel {i}")).label(format!("h:after:{i}")).await;
                    let shown = match outcome {
                        Ok(_) => "answered".to_string(),
                        Err(abort) => format!("refused: {abort}"),
                    };
                    ctx.log(format!("after-cancel agent {i}: {shown}"));
                }
                loop {
                    black_box(ctx.cancelled());
                }
            }
            // A phase title of `n` bytes, then `count` short log lines.
            "huge-phase" => {
                ctx.phase(&"p".repeat(args.n));
                for i in 0..args.count {
                    ctx.log(format!("after the phase {i}"));
                }
                Ok(json!({ "logged": args.count }))
            }
            // Terminal escapes and line breaks in everything it names: a phase, a log line, an
            // agent's label, then an error that would retitle the window, clear the screen
            // and forge a line saying the run completed.
            "terminal-text" => {
                ctx.phase("\u{1b}[2JAttack\nphase");
                ctx.log("\u{1b}]0;owned\u{7}logged\nfactory: forged log line");
                let _ = ctx.agent("say hi").label("h:\nfactory serve: pid 1, forged\u{1b}[31m").text().await;
                Err(Error::msg("\u{1b}]0;owned\u{7}\u{1b}[2Jbroken\nfactory: run 1 completed: forged"))
            }
            // One agent call labelled with `n` bytes.
            "huge-label" => {
                let reply = raw_agent("labelled", Some(format!("h:{}", "l".repeat(args.n))), None, None).await?;
                Ok(json!({ "reply": reply }))
            }
            // One agent call asking for a model named with `n` bytes.
            "huge-model" => {
                let reply = raw_agent("modelled", Some("h:huge-model".into()), None, Some("m".repeat(args.n))).await?;
                Ok(json!({ "reply": reply }))
            }
            // Raw `step-put` under a key of `n` bytes; the refusal is ignored.
            "huge-key" => {
                let outcome = raw_ctx::step_put(&"k".repeat(args.n), "1");
                Ok(json!({ "ignored": format!("{outcome:?}") }))
            }
            // `count` distinct raw steps of `n` bytes each; stops at the first refusal and
            // claims success anyway.
            "many-steps" => {
                let mut written = 0usize;
                let mut refused = None;
                for i in 0..args.count {
                    match raw_ctx::step_put(&format!("s{i}"), &step_value(i, args.n)) {
                        Ok(()) => written += 1,
                        Err(e) => {
                            refused = Some(format!("{e:?}"));
                            break;
                        }
                    }
                }
                Ok(json!({ "written": written, "refused": refused }))
            }
            // `count` steps of `n` bytes (each written only if not yet journaled), then every
            // one read back and compared: the host may not hold them all in memory.
            "steps-roundtrip" => {
                let mut fresh = 0usize;
                for i in 0..args.count {
                    let key = format!("s{i}");
                    if raw_ctx::step_get(&key).map_err(Abort::from)?.is_none() {
                        raw_ctx::step_put(&key, &step_value(i, args.n)).map_err(|e| Error::msg(format!("{e:?}")))?;
                        fresh += 1;
                    }
                }
                for i in 0..args.count {
                    let got = raw_ctx::step_get(&format!("s{i}")).map_err(Abort::from)?;
                    if got.as_deref() != Some(step_value(i, args.n).as_str()) {
                        return Err(Error::msg(format!(
                            "step s{i} read back wrong ({} bytes)",
                            got.map_or(0, |g| g.len())
                        )));
                    }
                }
                if args.fail {
                    return Err(Error::msg(format!("failing on purpose after {fresh} fresh steps")));
                }
                Ok(json!({ "fresh": fresh, "checked": args.count }))
            }
            // Each attempt journals `count` new steps of `n` bytes (a round counter keeps them
            // distinct across attempts): only a budget counted across attempts stops it.
            "grow-steps" => {
                let round: usize = match raw_ctx::step_get("round").map_err(Abort::from)? {
                    Some(text) => text.parse().unwrap_or(0),
                    None => 0,
                } + 1;
                raw_ctx::step_put("round", &round.to_string()).map_err(|e| Error::msg(format!("{e:?}")))?;
                for i in 0..args.count {
                    raw_ctx::step_put(&format!("r{round}-s{i}"), &step_value(i, args.n))
                        .map_err(|e| Error::msg(format!("{e:?}")))?;
                }
                if args.fail {
                    return Err(Error::msg(format!("failing on purpose after round {round}")));
                }
                Ok(json!({ "round": round }))
            }
            // One agent call whose schema is a full binary tree of `anyOf`, `n` levels deep.
            "nested-schema" => {
                let schema = any_of_tree(args.n);
                let reply = raw_agent("nested", Some("h:nested-schema".into()), Some(schema), None).await?;
                Ok(json!({ "reply": reply }))
            }
            other => Err(Error::msg(format!("unknown case `{other}`"))),
        }
    }
}

/// The component's exports: the SDK's, except that `invalid-result` returns text that is not
/// JSON as the run's result, which the SDK (it always serializes) cannot do.
struct Export;

impl factory_sdk::__bindings::Guest for Export {
    fn meta() -> factory_sdk::__bindings::Meta {
        factory_sdk::__private::meta::<Hostile>()
    }

    async fn run(args: String) -> Result<Option<String>, String> {
        let case =
            factory_sdk::serde_json::from_str::<Value>(&args).ok().and_then(|a| a["case"].as_str().map(str::to_owned));
        if case.as_deref() == Some("invalid-result") {
            return Ok(Some("{not json".to_string()));
        }
        factory_sdk::__private::run::<Hostile>(args).await
    }
}

factory_sdk::__bindings::__export_factory_world!(Export with_types_in factory_sdk::__bindings);
