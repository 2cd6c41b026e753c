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
                let concurrent = ctx
                    .parallel((0..5).map(|_| ctx.agent("find a bug in parallel").text()))
                    .await?;
                let labelled = ctx.agent("find a bug").label("finder:2").await?;
                Ok(json!({ "first": first, "again": again, "concurrent": concurrent, "labelled": labelled }))
            }
            // The synchronous `agent-ready` through the raw bindings: a call not answered
            // yet must wait (and is not started by asking), one answered is a memo hit, and
            // a call over a per-call cap (a label of `n` bytes) is refused as `agent` would
            // refuse it.
            "ready" => {
                use factory_sdk::__bindings::agent::factory::{agents, types as wit};
                let options = |label: &str| wit::AgentOptions {
                    label: Some(label.to_string()),
                    schema: None,
                    model: None,
                    limits: wit::AgentLimits { max_turns: None, max_duration_seconds: None, wrap_up: None },
                };
                let shown = |ready: Result<wit::ReadyReply, wit::Abort>| match ready {
                    Ok(wit::ReadyReply::MustWait) => json!("must-wait"),
                    Ok(wit::ReadyReply::Reply(reply)) => json!({ "reply": reply }),
                    Err(abort) => json!({ "abort": Abort::from(abort).to_string() }),
                };
                let before: Vec<Value> = (0..3).map(|_| shown(agents::agent_ready("ask once", &options("r")))).collect();
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
            // A schema call whose reply is checked (and retried once) by the host.
            "schema" => {
                let verdict = ctx.agent("judge it").label("judge").schema(verdict_schema()).value().await?;
                Ok(json!({ "verdict": verdict }))
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
                        move |item: &str, _item, _i| {
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
            // More than 4096 items are refused before anything runs.
            "too-many" => {
                let out = ctx.parallel((0..args.n).map(|i| async move { Ok::<_, Error>(i) })).await?;
                Ok(json!({ "len": out.len() }))
            }
            // A journaled step runs its producer once; the second read replays it.
            "steps" => {
                let mut runs = 0;
                let a: u32 = ctx.step("answer", || async { runs += 1; Ok(42) }).await?;
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
            "null" => Ok(Value::Null),
            other => Err(Error::msg(format!("unknown case `{other}`"))),
        }
    }
}

factory_sdk::export!(Probe);
