//! `bench`: the factory the host benchmark (`host/benches/factory.rs`) drives. Its `args`
//! select one workload — a loop of `n` calls to one hook (`log`, `step-get`, `step-put`,
//! `agent-hit` through the async call, `agent-start` as the Rust SDK makes a call and
//! `agent-ready` as the Python SDK does: the synchronous
//! hook first) or an `empty` loop to subtract, a `fanout` of `n` agents, `n`
//! `sequential-agents`, `n` `sequential-steps` (counting the step producers that ran), a
//! `small` factory for many concurrent runs, a `spin` that only a deadline stops —
//! and `failAtEnd: true` makes the run end with an error once the work is done, so the
//! benchmark can resume it (a completed run is final). The hook loops call the raw bindings
//! so SDK overhead does not blur the per-call number.

use factory_sdk::__bindings::agent::factory::{agents, ctx as hooks, types as wit};
use factory_sdk::prelude::*;
use std::hint::black_box;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Args {
    workload: String,
    #[serde(default)]
    n: usize,
    #[serde(default)]
    fail_at_end: bool,
}

struct Bench;

fn step_error(e: wit::StepError) -> Error {
    match e {
        wit::StepError::Abort(a) => Error::Abort(a.into()),
        wit::StepError::InvalidJson(m) => Error::msg(m),
    }
}

fn options(label: &str) -> wit::AgentOptions {
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

impl Factory for Bench {
    type Output = Value;

    fn meta() -> Meta {
        Meta::new("bench", "Host benchmark workloads. args: { workload: string, n?: number, failAtEnd?: boolean }")
            .phase("Bench")
    }

    async fn run(ctx: Ctx) -> Result<Value, Error> {
        let args: Args = ctx.args()?;
        let n = args.n;
        // Step producers that ran (a resume must run none of the journaled ones).
        let produced = std::cell::Cell::new(0usize);
        // How many units of work completed (checked by the benchmark).
        let done: usize = match args.workload.as_str() {
            "empty" => {
                for i in 0..n {
                    black_box(i);
                }
                n
            }
            "log" => {
                for _ in 0..n {
                    hooks::log(black_box("x"));
                }
                n
            }
            "step-get" => {
                hooks::step_put("k", "1").map_err(step_error)?;
                let mut hits = 0;
                for _ in 0..n {
                    if black_box(hooks::step_get(black_box("k")).map_err(Abort::from)?).is_some() {
                        hits += 1;
                    }
                }
                hits
            }
            "step-put" => {
                for _ in 0..n {
                    hooks::step_put(black_box("k"), black_box("1")).map_err(step_error)?;
                }
                n
            }
            "agent-hit" => {
                // The first call spawns; every later identical call is a memo hit.
                agents::agent("memoized question".to_string(), options("memo")).await.map_err(Abort::from)?;
                let mut hits = 0;
                for _ in 0..n {
                    let reply = agents::agent(black_box("memoized question".to_string()), options("memo"))
                        .await
                        .map_err(Abort::from)?;
                    if black_box(reply).is_some() {
                        hits += 1;
                    }
                }
                hits
            }
            "agent-ready" => {
                // The older path (components built before `agent-start`): the synchronous
                // `agent-ready` answers a memo hit; `agent` is called only when it says the
                // call must wait (the first one here).
                let mut hits: usize = 0;
                for _ in 0..=n {
                    let prompt = black_box("memoized question");
                    let options = options("memo");
                    let reply = match agents::agent_ready(prompt, &options).map_err(Abort::from)? {
                        wit::ReadyReply::Reply(reply) => reply,
                        wit::ReadyReply::MustWait => {
                            agents::agent(prompt.to_string(), options).await.map_err(Abort::from)?
                        }
                    };
                    if black_box(reply).is_some() {
                        hits += 1;
                    }
                }
                hits.saturating_sub(1)
            }
            "agent-start" => {
                // The SDKs' and the JS runner's path: the synchronous `agent-start`
                // answers a memo hit; a pending call (the first one here) comes back from
                // `agent-wait`.
                let mut hits: usize = 0;
                for _ in 0..=n {
                    let prompt = black_box("memoized question");
                    let reply = match agents::agent_start(prompt, &options("memo")).map_err(Abort::from)? {
                        wit::Started::Reply(reply) => reply,
                        wit::Started::Pending(id) => loop {
                            let finished = agents::agent_wait().await;
                            if finished.is_empty() {
                                return Err(Error::msg("agent-wait reported nothing pending"));
                            }
                            if let Some(f) = finished.into_iter().find(|f| f.call == id) {
                                break f.outcome.map_err(Abort::from)?;
                            }
                        },
                    };
                    if black_box(reply).is_some() {
                        hits += 1;
                    }
                }
                hits.saturating_sub(1)
            }
            "fanout" => {
                let replies = ctx
                    .parallel((0..n).map(|i| ctx.agent(format!("fan-out task {i}")).label(format!("f:{i}")).text()))
                    .await?;
                replies.iter().filter(|r| r.as_ref().is_some_and(|r| r.is_some())).count()
            }
            "sequential-agents" => {
                let mut ok = 0;
                for i in 0..n {
                    if ctx.agent(format!("sequential task {i}")).label(format!("s:{i}")).await?.is_some() {
                        ok += 1;
                    }
                }
                ok
            }
            "sequential-steps" => {
                let mut sum = 0usize;
                for i in 0..n {
                    let produced = &produced;
                    let v: usize = ctx
                        .step(&format!("step-{i}"), || async move {
                            produced.set(produced.get() + 1);
                            Ok(i)
                        })
                        .await?;
                    sum += usize::from(v == i);
                }
                sum
            }
            // A step and an agent call per unit: a journal of 2n entries (the large resume).
            "mixed" => {
                let mut ok = 0;
                for i in 0..n {
                    let produced = &produced;
                    let v: usize = ctx
                        .step(&format!("step-{i}"), || async move {
                            produced.set(produced.get() + 1);
                            Ok(i)
                        })
                        .await?;
                    let reply = ctx.agent(format!("mixed task {i}")).label(format!("x:{i}")).await?;
                    ok += usize::from(v == i && reply.is_some());
                }
                ok
            }
            // Spin without calling the host: only a deadline stops it (timeout enforcement).
            "spin" => {
                let mut x: u64 = 0;
                loop {
                    x = black_box(x.wrapping_add(1));
                }
            }
            "small" => {
                ctx.phase("Bench");
                let replies = ctx
                    .parallel((0..3).map(|i| ctx.agent(format!("small task {i}")).label(format!("m:{i}")).text()))
                    .await?;
                let ok = replies.iter().filter(|r| r.as_ref().is_some_and(|r| r.is_some())).count();
                let kept: usize = ctx.step("count", || async move { Ok(ok) }).await?;
                ctx.log(format!("small run: {kept} replies"));
                kept
            }
            other => return Err(Error::msg(format!("unknown workload `{other}`"))),
        };
        let produced = produced.get();
        if args.fail_at_end {
            return Err(Error::msg(format!("failAtEnd: done={done} produced={produced}")));
        }
        Ok(json!({ "workload": args.workload, "n": n, "done": done, "produced": produced }))
    }
}

factory_sdk::export!(Bench);
