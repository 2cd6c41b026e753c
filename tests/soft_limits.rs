//! Per-agent soft limits (issue 23), through the real `factory` binary, real child processes
//! and a real HTTP server: fake agent CLIs (bash scripts) that count turns and sleep. A
//! call's `maxTurns` reaches the CLI as its turn flag (the factory's `meta.agentLimits`
//! filling in what a call leaves out) and the turn limit it reports ends the call, not the
//! run; `maxDurationSeconds` sends the wrap-up prompt to a CLI that takes one and uses its
//! answer, and cuts off one that does not answer (or takes no wrap-up); an HTTP backend's
//! request is ended at the duration; the limits split the memo key; bad values are refused
//! with a typed error; a CLI without a turn flag refuses `maxTurns` rather than ignore it.
//! The same options come from JavaScript and Rust guests.

mod common;

use common::fake_openai::{base_url, FakeOpenAi, Mode};
use common::{stderr, stdout_json};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

/// Write an executable bash script.
fn script(path: &Path, body: &str) -> PathBuf {
    common::script_file(path, "/bin/bash", body)
}

use common::config_file;

/// Run the binary against `state` (no inherited backend variables).
async fn factory(state: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    common::factory_clean(state, args, env).await
}

/// `factory run FILE --args ARGS` on `backend` from `config`: the envelope, and the run's
/// detail (`factory show ID --json`).
async fn run(state: &Path, file: &Path, args: Value, config: &Path, backend: &str) -> (Value, Value, Output) {
    let args = args.to_string();
    let argv = [
        "run",
        file.to_str().unwrap(),
        "--yes",
        "--args",
        &args,
        "--backend",
        backend,
        "--config",
        config.to_str().unwrap(),
        "--json",
        "-q",
    ];
    let out = factory(state, &argv, &[]).await;
    let envelope = stdout_json(&out);
    let id = envelope["runId"].as_str().unwrap_or_else(|| panic!("no run: {envelope}\n{}", stderr(&out))).to_string();
    let detail = stdout_json(&factory(state, &["show", &id, "--json"], &[]).await);
    (envelope, detail, out)
}

/// The agent summaries of a run's detail with `label`.
fn agents<'a>(detail: &'a Value, label: &str) -> Vec<&'a Value> {
    detail["agents"]
        .as_array()
        .unwrap_or_else(|| panic!("no agents: {detail:#}"))
        .iter()
        .filter(|a| a["label"] == label)
        .collect()
}

/// A JS factory exercising the soft limits, by `args.case`. Its default for every call is
/// `maxTurns: 9`.
const FACTORY_JS: &str = r#"
import { defineFactory } from "@github/copilot-sdk/extension";

export default defineFactory({
    meta: { name: "soft", description: "Soft limits. args: { case }", agentLimits: { maxTurns: 9 } },
    async run(ctx) {
        const task = "a task of five turns";
        switch (ctx.args.case) {
            case "turns": {
                const capped = await ctx.agent(task, { label: "t", maxTurns: 3 });
                // The factory's default (9): other limits, another subagent.
                const fallback = await ctx.agent(task, { label: "t" });
                // The same effective limits as `fallback`: the same subagent, replayed.
                const same = await ctx.agent(task, { label: "t", maxTurns: 9 });
                return { capped, fallback, same };
            }
            case "duration": {
                const wrapped = await ctx.agent("a slow task", { label: "wrapped", maxDurationSeconds: 0.5, wrapUp: "Give the findings now." });
                const free = await ctx.agent("a slow task", { label: "free" });
                return { wrapped, free };
            }
            case "cut": {
                const reply = await ctx.agent("a slow task", { label: "cut", maxDurationSeconds: 0.5 });
                return { reply, after: await ctx.agent("a quick one", { label: "after" }) };
            }
            case "bad": {
                const errors = [];
                for (const options of [{ maxTurns: 0 }, { maxTurns: 1.5 }, { maxDurationSeconds: -1 }, { maxDurationSeconds: Infinity }, { wrapUp: "" }, { maxTurn: 3 }]) {
                    try {
                        await ctx.agent("x", options);
                        errors.push("accepted");
                    } catch (e) {
                        errors.push(`${e.name}: ${e.message}`);
                    }
                }
                return { errors };
            }
        }
    },
});
"#;

/// A fake Claude Code: `claude -p --output-format json`, the prompt on stdin. Its task takes
/// five turns; `--max-turns=N` below that ends it at N turns the way Claude Code does
/// (`subtype: error_max_turns`, `is_error`, no `result`, a cost). Every call appends its
/// turn flag to `log`.
fn fake_claude(path: &Path, log: &Path) -> PathBuf {
    let body = r#"
max=unlimited
for a in "$@"; do case "$a" in --max-turns=*) max="${a#--max-turns=}";; esac; done
cat > /dev/null
echo "max-turns=$max" >> "LOG"
turns=0
while [ $turns -lt 5 ]; do
  if [ "$max" != unlimited ] && [ $turns -ge "$max" ]; then
    printf '{"type":"result","subtype":"error_max_turns","is_error":true,"num_turns":%d,"total_cost_usd":0.001,"usage":{"input_tokens":10,"output_tokens":%d}}\n' $turns $turns
    exit 0
  fi
  turns=$((turns+1))
done
printf '{"type":"result","subtype":"success","is_error":false,"num_turns":5,"result":"done in 5 of %s turns","total_cost_usd":0.002,"usage":{"input_tokens":10,"output_tokens":5}}\n' "$max"
"#;
    script(path, &body.replace("LOG", log.to_str().unwrap()))
}

/// A fake agent CLI that takes a wrap-up on stdin (one JSON string per line): it works 20
/// turns of 0.1 s unless a wrap-up line arrives first, which it answers at once. A read that
/// times out mid-line keeps what it read (bash hands the partial line over on a timeout), so
/// a line that arrives across two turns is not cut.
const WRAPPING_CLI: &str = r#"
read -r prompt
turns=0
partial=
while [ $turns -lt 20 ]; do
  line=
  IFS= read -r -t 0.1 line; rc=$?
  if [ $rc -gt 128 ]; then partial="$partial$line"; fi
  if [ $rc -eq 0 ]; then echo "wrapped up after turn $turns on $partial$line"; exit 0; fi
  # End of input (no duration limit, so no wrap-up will come): keep working.
  if [ $rc -eq 1 ]; then sleep 0.1; fi
  turns=$((turns+1))
done
echo "finished all 20 turns of $prompt"
"#;

/// A fake agent CLI that never answers a wrap-up and works for a minute, or answers at once
/// when the prompt says `quick`.
const STUBBORN_CLI: &str = r#"
prompt=$(head -c 200)
case "$prompt" in *quick*) echo "quick answer"; exit 0;; esac
sleep 60
echo "too late"
"#;

fn config(root: &Path) -> PathBuf {
    let log = root.join("turns.log");
    let claude = fake_claude(&root.join("claude"), &log);
    let wrapping = script(&root.join("wrapping"), WRAPPING_CLI);
    let stubborn = script(&root.join("stubborn"), STUBBORN_CLI);
    let text = format!(
        r#"
[backends.claude]
kind = "cli"
preset = "claude"
command = ["{claude}", "-p", "--output-format", "json"]
sandbox = "none"

[backends.wrapping]
kind = "cli"
command = ["{wrapping}"]
sandbox = "none"
turns_flag = "--max-turns"
wrap_up = "stdin"

[backends.stubborn-wrap]
kind = "cli"
command = ["{stubborn}"]
sandbox = "none"
turns_flag = "--max-turns"
wrap_up = "stdin"
wrap_up_seconds = 0.3
grace_seconds = 0.3
timeout_seconds = 120

[backends.stubborn]
kind = "cli"
command = ["{stubborn}"]
sandbox = "none"
turns_flag = "--max-turns"
grace_seconds = 0.3
timeout_seconds = 120

[backends.no-turns]
kind = "cli"
preset = "codex"
command = ["{claude}"]
sandbox = "none"
"#,
        claude = claude.display(),
        wrapping = wrapping.display(),
        stubborn = stubborn.display(),
    );
    config_file(&root.join("factory.toml"), &text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_turns_reaches_the_cli_as_its_turn_flag_and_the_turn_limit_ends_only_that_call() {
    let root = tempfile::tempdir().unwrap();
    let config = config(root.path());
    let file = root.path().join("soft.js");
    std::fs::write(&file, FACTORY_JS).unwrap();
    let state = root.path().join("state");
    let (envelope, detail, out) = run(&state, &file, json!({"case": "turns"}), &config, "claude").await;
    assert_eq!(envelope["status"], "completed", "{envelope:#}\n{}", stderr(&out));
    let result = &envelope["result"];
    assert_eq!(result["capped"], Value::Null, "the turn limit ended the call without an answer: {result}");
    assert_eq!(result["fallback"], "done in 5 of 9 turns", "meta.agentLimits filled in maxTurns: {result}");
    assert_eq!(result["same"], result["fallback"]);
    // The flags the CLI got: the call's own, then the factory's default; the third call was
    // the second's subagent (same effective limits), the first's limits split the key.
    let log = std::fs::read_to_string(root.path().join("turns.log")).unwrap();
    assert_eq!(log.lines().collect::<Vec<_>>(), ["max-turns=3", "max-turns=9"]);
    let accounting = &envelope["accounting"];
    assert_eq!(
        (accounting["agentsSpawned"].as_u64(), accounting["agentCacheHits"].as_u64()),
        (Some(2), Some(1)),
        "{accounting}"
    );
    // The cut-off call's reported cost still counts: $0.001 + $0.002 = 0.3 credits.
    assert_eq!(accounting["aiCreditsNano"], 300_000_000u64, "{accounting}");
    // The run detail says which soft limit ended which call.
    let calls = agents(&detail, "t");
    assert_eq!(calls.len(), 2, "{detail:#}");
    assert_eq!(calls[0]["endedBy"], "maxTurns", "{detail:#}");
    assert_eq!(calls[0]["status"], "failed", "{detail:#}");
    assert!(calls[1].get("endedBy").is_none(), "{detail:#}");

    // The same options from a Rust guest.
    let probe = common::component("probe");
    let (envelope, detail, out) = run(&state, &probe, json!({"case": "soft"}), &config, "claude").await;
    assert_eq!(envelope["status"], "completed", "{envelope:#}\n{}", stderr(&out));
    assert_eq!(envelope["result"], json!({"capped": null, "wide": "done in 5 of 9 turns"}));
    let log = std::fs::read_to_string(root.path().join("turns.log")).unwrap();
    assert_eq!(log.lines().skip(2).collect::<Vec<_>>(), ["max-turns=3", "max-turns=9"]);
    assert_eq!(agents(&detail, "rust")[0]["endedBy"], "maxTurns", "{detail:#}");

    // A CLI with no turn flag refuses maxTurns (a backend failure naming the fix) rather
    // than run the agent unbounded.
    let (envelope, _, _) = run(&state, &file, json!({"case": "turns"}), &config, "no-turns").await;
    assert_eq!(envelope["failure"]["type"], "backend", "{envelope:#}");
    assert_eq!(envelope["failure"]["kind"], "misconfigured", "{envelope:#}");
    assert!(envelope["failure"]["message"].as_str().unwrap_or("").contains("turns_flag"), "{envelope:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_duration_sends_the_wrap_up_and_cuts_off_a_call_that_does_not_answer() {
    let root = tempfile::tempdir().unwrap();
    let config = config(root.path());
    let file = root.path().join("soft.js");
    std::fs::write(&file, FACTORY_JS).unwrap();
    let state = root.path().join("state");

    // A CLI that takes a wrap-up: it answers the wrap-up prompt (the call's own text) early;
    // without a duration limit it works all its turns.
    let (envelope, detail, out) = run(&state, &file, json!({"case": "duration"}), &config, "wrapping").await;
    assert_eq!(envelope["status"], "completed", "{envelope:#}\n{}", stderr(&out));
    let wrapped = envelope["result"]["wrapped"].as_str().unwrap_or_else(|| panic!("{envelope:#}"));
    assert!(wrapped.starts_with("wrapped up after turn "), "{wrapped}");
    assert!(wrapped.ends_with(r#" on "Give the findings now.""#), "the wrap-up prompt, as a JSON line: {wrapped}");
    assert_eq!(envelope["result"]["free"], r#"finished all 20 turns of "a slow task""#, "{envelope:#}");
    assert_eq!(agents(&detail, "wrapped")[0]["endedBy"], "maxDurationSeconds", "{detail:#}");
    assert_eq!(agents(&detail, "wrapped")[0]["status"], "ok", "{detail:#}");
    assert!(agents(&detail, "free")[0].get("endedBy").is_none(), "{detail:#}");

    // A CLI that ignores the wrap-up, and one that takes none: cut off (null), the run goes
    // on. Each would work a minute: the test finishing at all shows the stop.
    for backend in ["stubborn-wrap", "stubborn"] {
        let started = std::time::Instant::now();
        let (envelope, detail, out) = run(&state, &file, json!({"case": "cut"}), &config, backend).await;
        assert_eq!(envelope["status"], "completed", "{backend}: {envelope:#}\n{}", stderr(&out));
        assert_eq!(envelope["result"], json!({"reply": null, "after": "quick answer"}), "{backend}");
        assert_eq!(agents(&detail, "cut")[0]["endedBy"], "maxDurationSeconds", "{backend}: {detail:#}");
        // A killed CLI reported nothing: the spend is a lower bound.
        assert_eq!(envelope["accounting"]["aiCreditsAtLeast"], true, "{backend}: {envelope:#}");
        assert!(started.elapsed() < Duration::from_secs(50), "{backend}: the call was not stopped");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_backend_ends_its_request_at_the_duration() {
    let root = tempfile::tempdir().unwrap();
    let server = FakeOpenAi::start(Mode::Answer { latency: Duration::from_secs(4) }).await;
    let config = config_file(
        &root.path().join("factory.toml"),
        &format!("[backends.slow]\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"\n", base_url(server.port())),
    );
    let file = root.path().join("soft.js");
    std::fs::write(&file, FACTORY_JS.replace(", agentLimits: { maxTurns: 9 }", "")).unwrap();
    let (envelope, detail, out) = run(&root.path().join("state"), &file, json!({"case": "cut"}), &config, "slow").await;
    assert_eq!(envelope["status"], "completed", "{envelope:#}\n{}", stderr(&out));
    assert_eq!(envelope["result"]["reply"], Value::Null, "{envelope:#}");
    assert_eq!(agents(&detail, "cut")[0]["endedBy"], "maxDurationSeconds", "{detail:#}");
    // The next call ran (and waited for its full answer): the run went on.
    let after = envelope["result"]["after"].as_str().unwrap_or_else(|| panic!("{envelope:#}"));
    assert!(after.starts_with("real answer to:") && after.contains("a quick one"), "{after}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_soft_limits_are_refused_with_a_typed_error() {
    let root = tempfile::tempdir().unwrap();
    let config = config(root.path());
    let file = root.path().join("soft.js");
    std::fs::write(&file, FACTORY_JS).unwrap();
    let state = root.path().join("state");
    // JavaScript: each bad value (and an unknown option) throws before any call.
    let (envelope, _, out) = run(&state, &file, json!({"case": "bad"}), &config, "claude").await;
    assert_eq!(envelope["status"], "completed", "{envelope:#}\n{}", stderr(&out));
    let errors: Vec<&str> =
        envelope["result"]["errors"].as_array().unwrap().iter().map(|e| e.as_str().unwrap()).collect();
    assert_eq!(errors.len(), 6);
    for (error, expected) in
        errors.iter().zip(["maxTurns", "maxTurns", "maxDurationSeconds", "maxDurationSeconds", "wrapUp", "maxTurn"])
    {
        assert!(error.contains(expected) && !error.starts_with("accepted"), "{errors:?}");
    }
    assert!(errors[0].starts_with("RangeError") && errors[5].starts_with("TypeError"), "{errors:?}");
    assert_eq!(envelope["accounting"]["agentsSpawned"], 0);
    // Rust: the host checks them: the attempt ends with `invalid_call` naming the limit.
    let probe = common::component("probe");
    let (envelope, _, _) = run(&state, &probe, json!({"case": "soft-bad"}), &config, "claude").await;
    assert_eq!(envelope["failure"]["type"], "invalid_call", "{envelope:#}");
    assert!(envelope["failure"]["message"].as_str().unwrap_or("").contains("maxTurns"), "{envelope:#}");
    // A factory declaring a bad default is refused before it runs.
    let bad_meta = root.path().join("bad-meta.js");
    std::fs::write(
        &bad_meta,
        FACTORY_JS.replace("agentLimits: { maxTurns: 9 }", "agentLimits: { maxDurationSeconds: 0 }"),
    )
    .unwrap();
    let args = json!({"case": "turns"}).to_string();
    let argv = [
        "run",
        bad_meta.to_str().unwrap(),
        "--yes",
        "--args",
        &args,
        "--backend",
        "claude",
        "--config",
        config.to_str().unwrap(),
        "--json",
        "-q",
    ];
    let out = factory(&state, &argv, &[]).await;
    assert!(!out.status.success());
    let shown = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(shown.contains("maxDurationSeconds"), "{shown}");
}
