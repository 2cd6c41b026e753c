//! `probe`: a test factory that exercises one host behaviour per `args.case`, so the
//! integration tests can drive memoization, schemas, combinators and limits through a
//! real component.

use factory_sdk::prelude::*;

#[derive(Deserialize)]
struct Args {
    case: String,
    #[serde(default)]
    n: usize,
}

struct Probe;

/// The raw bindings' options of a call with `label` and nothing else.
fn raw_options(label: &str) -> factory_sdk::__bindings::agent::factory::types::AgentOptions {
    use factory_sdk::__bindings::agent::factory::types as wit;
    wit::AgentOptions {
        label: Some(label.to_string()),
        schema: None,
        model: None,
        limits: wit::AgentLimits { max_turns: None, max_duration_seconds: None, wrap_up: None },
        agent: None,
        reasoning_effort: None,
        context_tier: None,
    }
}

fn verdict_schema() -> Value {
    json!({ "type": "object", "properties": { "ok": { "type": "boolean" } }, "required": ["ok"] })
}

impl Factory for Probe {
    type Output = Value;

    fn meta() -> Meta {
        Meta::new("probe", "Host test probe. args: { case: string, n?: number }").phase("Probe")
    }

    async fn run(ctx: Ctx) -> Result<Value, Error> {
        let args: Args = ctx.args()?;
        ctx.phase("Probe");
        match args.case.as_str() {
            // Identical calls (sequential and concurrent) share one subagent; a different
            // label is a different subagent.
            "memo" => {
                let first = ctx.agent("find a bug").await?;
                let again = ctx.agent("find a bug").await?;
                let concurrent = ctx.parallel((0..5).map(|_| ctx.agent("find a bug in parallel").text())).await?;
                let labelled = ctx.agent("find a bug").label("finder:2").await?;
                Ok(json!({ "first": first, "again": again, "concurrent": concurrent, "labelled": labelled }))
            }
            // The synchronous `agent-ready` through the raw bindings: a call not answered
            // yet must wait (and is not started by asking), one answered is a memo hit, and
            // a call over a per-call cap (a label of `n` bytes) is refused as `agent` would
            // refuse it.
            "ready" => {
                use factory_sdk::__bindings::agent::factory::{agents, types as wit};
                let options = raw_options;
                let shown = |ready: Result<wit::ReadyReply, wit::Abort>| match ready {
                    Ok(wit::ReadyReply::MustWait) => json!("must-wait"),
                    Ok(wit::ReadyReply::Reply(reply)) => json!({ "reply": reply }),
                    Err(abort) => json!({ "abort": Abort::from(abort).to_string() }),
                };
                let before: Vec<Value> =
                    (0..3).map(|_| shown(agents::agent_ready("ask once", &options("r")))).collect();
                let answered = agents::agent("ask once".to_string(), options("r")).await.map_err(Abort::from)?;
                let after = shown(agents::agent_ready("ask once", &options("r")));
                let other = shown(agents::agent_ready("ask once", &options("r:2")));
                if args.n > 0 {
                    // Over `maxLabelBytes`: the attempt stops (the run's failure says so).
                    let refused = shown(agents::agent_ready("ask once", &options(&"l".repeat(args.n))));
                    ctx.log(format!("refused: {refused}"));
                }
                Ok(json!({ "before": before, "answered": answered, "after": after, "other": other }))
            }
            // `agent-start` and `agent-wait` through the raw bindings: nothing pending waits
            // for nothing; started calls (an identical one among them) come back from the
            // waits each once, by id; a finished call is then a memo hit of `agent-start`.
            "start" => {
                use factory_sdk::__bindings::agent::factory::{agents, types as wit};
                let options = raw_options;
                let idle = agents::agent_wait().await.len();
                let mut ids = Vec::new();
                for (prompt, label) in [("start a", "s:a"), ("start b", "s:b"), ("start a", "s:a")] {
                    match agents::agent_start(prompt, &options(label)).map_err(Abort::from)? {
                        wit::Started::Pending(id) => ids.push(id),
                        wit::Started::Reply(_) => return Err(Error::msg(format!("`{prompt}` was answered at once"))),
                    }
                }
                let mut replies = factory_sdk::serde_json::Map::new();
                let mut waits = 0;
                while replies.len() < ids.len() {
                    let finished = agents::agent_wait().await;
                    waits += 1;
                    if finished.is_empty() {
                        return Err(Error::msg(format!("the host reports nothing pending; got {replies:?}")));
                    }
                    for f in finished {
                        let reply = f.outcome.map_err(Abort::from)?;
                        if replies.insert(f.call.to_string(), json!(reply)).is_some() {
                            return Err(Error::msg(format!("call {} was reported twice", f.call)));
                        }
                    }
                }
                let by_id = |i: usize| replies[&ids[i].to_string()].clone();
                let again = match agents::agent_start("start a", &options("s:a")).map_err(Abort::from)? {
                    wit::Started::Reply(reply) => json!({ "reply": reply }),
                    wit::Started::Pending(id) => json!({ "pending": id }),
                };
                let after = agents::agent_wait().await.len();
                // Started and never waited for: the run still ends (the call ends with it).
                let orphan = matches!(agents::agent_start("start c", &options("s:c")), Ok(wit::Started::Pending(_)));
                Ok(json!({ "orphan-pending": orphan,
                    "idle": idle, "distinct": ids.iter().collect::<std::collections::HashSet<_>>().len(),
                    "a": by_id(0), "b": by_id(1), "a2": by_id(2), "again": again, "after": after, "waits": waits,
                }))
            }
            // An SDK agent call dropped while pending (the wait in flight is cancelled), then
            // another call made and awaited: the run goes on and ends normally.
            "abandon" => {
                use std::future::Future;
                let mut call = Box::pin(ctx.agent("abandoned").label("ab").text());
                let ready = std::future::poll_fn(|cx| std::task::Poll::Ready(call.as_mut().poll(cx).is_ready())).await;
                drop(call);
                let after = ctx.agent("after").label("after").await?;
                Ok(json!({ "first-ready": ready, "after": after }))
            }
            // A panic: the run traps, and the SDK logs the message first.
            "panic" => panic!("the probe panics on purpose"),
            // A schema call whose reply is checked (and retried once) by the host.
            "schema" => {
                let verdict = ctx.agent("judge it").label("judge").schema(verdict_schema()).value().await?;
                // The same call again (a memo hit), awaited: the checked reply's JSON text.
                let text = ctx.agent("judge it").label("judge").schema(verdict_schema()).await?;
                Ok(json!({ "verdict": verdict, "text": text }))
            }
            // Items whose agent fails ordinarily become null; the rest survive.
            "parallel" => {
                let labels = ["a", "fail", "c"];
                let out = ctx
                    .parallel(labels.iter().map(|l| {
                        let ctx = ctx.clone();
                        async move {
                            let reply = ctx.agent(format!("item {l}")).label(*l).await?;
                            reply.ok_or_else(|| Error::msg("no reply"))
                        }
                    }))
                    .await?;
                Ok(json!({ "items": out }))
            }
            // Each item flows through two stages; a failing item skips its second stage.
            "pipeline" => {
                let out = ctx
                    .pipeline(vec!["x", "fail", "z"])
                    .stage({
                        let ctx = ctx.clone();
                        move |item: &str, _original, _i| {
                            let ctx = ctx.clone();
                            async move {
                                let reply = ctx.agent(format!("stage one {item}")).label(item).await?;
                                reply.ok_or_else(|| Error::msg("no reply"))
                            }
                        }
                    })
                    .stage(|previous: String, item: &str, i: usize| async move {
                        Ok::<_, Error>(format!("{i}:{item}:{}", previous.len()))
                    })
                    .await?;
                Ok(json!({ "items": out }))
            }
            // `n` agents with distinct labels at once: used with the total cap to show that an
            // abort fails the whole parallel call and the run.
            "fanout" => {
                let out = ctx
                    .parallel((0..args.n).map(|i| {
                        let ctx = ctx.clone();
                        async move { ctx.agent(format!("task {i}")).label(format!("t:{i}")).await }
                    }))
                    .await?;
                let done = out.iter().filter(|v| v.is_some()).count();
                Ok(json!({ "done": done }))
            }
            // A checkpoint between two agent calls: the first attempt pays for the first
            // call and pauses at `approve`; a resume replays that call for free, gets the
            // answer the resume carried (or none) and pays for the second call.
            "checkpoint" => {
                let plan = ctx.agent("plan the work").label("plan").await?;
                // Inside a fan-out a checkpoint is refused (main flow only).
                let inner = ctx
                    .parallel([async {
                        Ok::<_, Error>(match ctx.pause::<Value>("inside") {
                            Ok(_) => "allowed".to_string(),
                            Err(e) => format!("refused: {e}"),
                        })
                    }])
                    .await?;
                let answer: Option<Value> = ctx.pause("approve")?;
                let done = ctx.agent(format!("do the work as answered: {answer:?}")).label("work").await?;
                Ok(json!({ "plan": plan, "answer": answer, "done": done, "inner": inner[0] }))
            }
            // More than 4096 items are refused before anything runs.
            "too-many" => {
                let out = ctx.parallel((0..args.n).map(|i| async move { Ok::<_, Error>(i) })).await?;
                Ok(json!({ "len": out.len() }))
            }
            // A journaled step runs its producer once; the second read replays it.
            "steps" => {
                let mut runs = 0;
                let a: u32 = ctx
                    .step("answer", || async {
                        runs += 1;
                        Ok(42)
                    })
                    .await?;
                let b: u32 = ctx.step("answer", || async { Ok(7) }).await?;
                Ok(json!({ "a": a, "b": b }))
            }
            // The JSON value `null` is a result (distinct from "no result", which is `()`).
            // Per-agent soft limits from a Rust guest: a turn cap, then the same call with
            // other limits (another memo key).
            "soft" => {
                let capped = ctx.agent("a task of five turns").label("rust").max_turns(3).await?;
                let wide = ctx
                    .agent("a task of five turns")
                    .label("rust")
                    .max_turns(9)
                    .max_duration_seconds(60.0)
                    .wrap_up("Finish now.")
                    .await?;
                Ok(json!({ "capped": capped, "wide": wide }))
            }
            // A soft limit the host refuses (`invalid_call`).
            "soft-bad" => Ok(json!(ctx.agent("x").max_turns(0).await?)),
            // The agent tuning options from a Rust guest.
            "tuned" => {
                let tuned = ctx
                    .agent("think")
                    .label("rust")
                    .agent("reviewer")
                    .reasoning_effort("low")
                    .context_tier("long_context")
                    .await?;
                Ok(json!({ "tuned": tuned }))
            }
            "null" => Ok(Value::Null),
            other => Err(Error::msg(format!("unknown case `{other}`"))),
        }
    }
}

factory_sdk::export!(Probe);
