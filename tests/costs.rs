//! Honest costs (issue 23), through the real `factory` binary and real HTTP servers on
//! 127.0.0.1 (`common::fake_openai`, which answers both the OpenAI chat-completions and the
//! Anthropic Messages wire formats): usage keeps input, output, cache-read and cache-write
//! tokens apart in the envelope, the run detail and the agent summaries; the built-in
//! `openai` backend is priced by the built-in table, so `maxAiCredits` binds out of the box
//! on a priced model (and still refuses an unpriced one); `factory.toml`'s `[prices]`
//! overrides the table; a spend whose cost is a lower bound (an agent CLI that reports no
//! cost, unpriced cache tokens) is flagged `aiCreditsAtLeast`; hostile usage numbers neither
//! panic nor wrap the accounting.

mod common;

use common::fake_openai::{base_url, FakeOpenAi, Mode};
use common::{stderr, stdout_json};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Output;
use std::time::Duration;

/// Run the binary against `state` with `env` (no inherited backend variables).
async fn factory(state: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    common::factory_clean(state, args, env).await
}

use common::{fanout_args as fanout, probe_arg as probe};

/// `factory show RUN --json`.
async fn show(state: &Path, run_id: &str) -> Value {
    stdout_json(&factory(state, &["show", run_id, "--json"], &[]).await)
}

/// An OpenAI usage object: `prompt` prompt tokens of which `cached` were cached.
fn openai_usage(prompt: u64, cached: u64, completion: u64) -> Value {
    json!({
        "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_builtin_openai_backend_splits_cached_tokens_and_max_ai_credits_binds_at_the_budget() {
    let state = tempfile::tempdir().unwrap();
    // 1000 prompt tokens of which 800 cached, 5 completion tokens.
    let server = FakeOpenAi::start(Mode::Usage(openai_usage(1000, 800, 5))).await;
    let base = base_url(server.port());
    let env = [("OPENAI_BASE_URL", base.as_str())];
    // gpt-4o's built-in price: $2.50 / $10 / $1.25 cached per million tokens; one credit is
    // $0.01, so per token 250_000 / 1_000_000 / 125_000 nano-credits. A call:
    // 200 uncached x 250_000 + 800 cached x 125_000 + 5 x 1_000_000 = 155_000_000 (0.155 credits).
    let per_call: u64 = 200 * 250_000 + 800 * 125_000 + 5 * 1_000_000;
    assert_eq!(per_call, 155_000_000);
    let run = [
        "run",
        &probe(),
        "--yes",
        "--backend",
        "openai",
        "--model",
        "gpt-4o",
        "--args",
        &fanout(6),
        "--max-ai-credits",
        "0.4",
        "--max-concurrent-subagents",
        "1",
        "--json",
        "-q",
    ];
    let out = factory(state.path(), &run, &env).await;
    let envelope = stdout_json(&out);
    assert_eq!(envelope["failure"]["type"], "factory_limit_reached", "{envelope:#}\n{}", stderr(&out));
    assert_eq!(envelope["failure"]["kind"], "maxAiCredits", "{envelope:#}");
    // Sequential calls: 0.155, 0.31, 0.465 >= 0.4: the fourth spawn is refused.
    assert_eq!(server.answered().len(), 3, "{envelope:#}");
    let accounting = &envelope["accounting"];
    assert_eq!(accounting["aiCreditsNano"], 3 * per_call, "{envelope:#}");
    assert_eq!(accounting["aiCreditsAtLeast"], false, "every call was priced: {envelope:#}");
    assert_eq!(accounting["inputTokens"], 3 * 200, "cached tokens are not input: {envelope:#}");
    assert_eq!(accounting["cacheReadTokens"], 3 * 800, "{envelope:#}");
    assert_eq!(accounting["cacheWriteTokens"], 0, "{envelope:#}");
    assert_eq!(accounting["outputTokens"], 3 * 5, "{envelope:#}");

    // The run detail: the same accounting, and each agent's own breakdown.
    let detail = show(state.path(), envelope["runId"].as_str().unwrap()).await;
    assert_eq!(detail["accounting"], *accounting, "{detail:#}");
    let agents = detail["agents"].as_array().unwrap();
    assert_eq!(agents.len(), 3, "{detail:#}");
    for agent in agents {
        assert_eq!(agent["creditsNano"], per_call, "{agent}");
        assert_eq!(
            (agent["inputTokens"].clone(), agent["cacheReadTokens"].clone()),
            (json!(200), json!(800)),
            "{agent}"
        );
        assert_eq!(agent["outputTokens"], 5, "{agent}");
        assert!(agent.get("creditsAtLeast").is_none() && agent.get("cacheWriteTokens").is_none(), "{agent}");
    }
    // The human `show` says it too.
    let text = factory(state.path(), &["show", envelope["runId"].as_str().unwrap()], &[]).await;
    let text = String::from_utf8_lossy(&text.stdout).to_string();
    assert!(text.contains("0.465 AI credits") && !text.contains("at least"), "{text}");
    assert!(text.contains("600 input, 15 output, 2400 cache read, 0 cache write"), "{text}");

    // An unpriced model on the same built-in backend at a remote server is still refused
    // before any spawn (TEST-NET-1: nothing would answer there, and nothing is asked).
    let before = server.requests();
    let unpriced = [
        "run",
        &probe(),
        "--yes",
        "--backend",
        "openai",
        "--model",
        "my-finetune",
        "--args",
        &fanout(2),
        "--max-ai-credits",
        "5",
        "--json",
        "-q",
    ];
    let remote = [("OPENAI_BASE_URL", "http://192.0.2.1:9/v1")];
    let out = factory(state.path(), &unpriced, &remote).await;
    let envelope = stdout_json(&out);
    assert_eq!(envelope["failure"]["kind"], "maxAiCredits", "{envelope:#}\n{}", stderr(&out));
    let message = envelope["failure"]["message"].as_str().unwrap();
    assert!(message.contains("[prices.openai]") && message.contains("--max-ai-credits none"), "{envelope:#}");
    assert_eq!(envelope["accounting"]["agentsSpawned"], 0, "{envelope:#}");
    assert_eq!(server.requests(), before, "nothing was spawned");

    // On this machine's server (127.0.0.1) the same model costs 0 credits, cache reads
    // included: the budgeted run completes, exactly accounted.
    let out = factory(state.path(), &unpriced, &env).await;
    let envelope = stdout_json(&out);
    assert_eq!(envelope["status"], "completed", "{envelope:#}\n{}", stderr(&out));
    assert_eq!(envelope["accounting"]["aiCreditsNano"], 0, "{envelope:#}");
    assert_eq!(envelope["accounting"]["aiCreditsAtLeast"], false, "{envelope:#}");
    assert_eq!(server.requests(), before + 2);

    // factory.toml's [prices.openai] prices it (and overrides nothing else): 1 credit per
    // 1000 input tokens, so 200 uncached tokens are 0.2 credits; its cache prices are not
    // given, so the 800 cached tokens make each call's cost a lower bound.
    std::fs::write(state.path().join("factory.toml"), "[prices.openai]\n\"my-finetune\" = { input = 1, output = 0 }\n")
        .unwrap();
    let out = factory(state.path(), &unpriced, &env).await;
    let envelope = stdout_json(&out);
    assert_eq!(envelope["status"], "completed", "{envelope:#}\n{}", stderr(&out));
    assert_eq!(envelope["accounting"]["aiCreditsNano"], 2 * 200_000_000u64, "{envelope:#}");
    assert_eq!(envelope["accounting"]["aiCreditsAtLeast"], true, "unpriced cache reads: {envelope:#}");
    let runs = factory(state.path(), &["runs"], &[]).await;
    assert!(String::from_utf8_lossy(&runs.stdout).contains(">=0.4"), "{}", String::from_utf8_lossy(&runs.stdout));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_builtin_anthropic_backend_keeps_cache_reads_and_writes_apart() {
    let state = tempfile::tempdir().unwrap();
    let usage = json!({"input_tokens": 100, "output_tokens": 50, "cache_read_input_tokens": 10_000,
                       "cache_creation_input_tokens": 2000});
    let server = FakeOpenAi::start(Mode::Usage(usage)).await;
    let base = format!("http://127.0.0.1:{}", server.port());
    let run = [
        "run",
        &probe(),
        "--yes",
        "--backend",
        "anthropic",
        "--model",
        "claude-sonnet-4-5",
        "--args",
        &fanout(2),
        "--max-ai-credits",
        "100",
        "--json",
        "-q",
    ];
    let out = factory(state.path(), &run, &[("ANTHROPIC_BASE_URL", &base), ("ANTHROPIC_API_KEY", "ak-test")]).await;
    let envelope = stdout_json(&out);
    assert_eq!(envelope["status"], "completed", "{envelope:#}\n{}", stderr(&out));
    // claude-sonnet-4-5: $3 in, $15 out, $0.30 cache read, $3.75 cache write per million:
    // 100 x 300_000 + 50 x 1_500_000 + 10_000 x 30_000 + 2000 x 375_000 nano-credits per call
    // = 30_000_000 + 75_000_000 + 300_000_000 + 750_000_000 = 1_155_000_000 (US$0.01155).
    let per_call: u64 = 1_155_000_000;
    let accounting = &envelope["accounting"];
    assert_eq!(accounting["aiCreditsNano"], 2 * per_call, "{envelope:#}");
    assert_eq!(accounting["aiCreditsAtLeast"], false, "{envelope:#}");
    assert_eq!(
        [
            &accounting["inputTokens"],
            &accounting["outputTokens"],
            &accounting["cacheReadTokens"],
            &accounting["cacheWriteTokens"]
        ],
        [&json!(200), &json!(100), &json!(20_000), &json!(4000)],
        "cache tokens are not part of input: {envelope:#}"
    );
    let detail = show(state.path(), envelope["runId"].as_str().unwrap()).await;
    for agent in detail["agents"].as_array().unwrap() {
        assert_eq!(
            (agent["cacheReadTokens"].as_u64(), agent["cacheWriteTokens"].as_u64()),
            (Some(10_000), Some(2000)),
            "{agent}"
        );
        assert_eq!(agent["creditsNano"], per_call, "{agent}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_usage_numbers_neither_panic_nor_wrap_the_accounting() {
    let state = tempfile::tempdir().unwrap();
    let server = FakeOpenAi::start(Mode::Usage(Value::Null)).await;
    let base = base_url(server.port());
    let env = [("OPENAI_BASE_URL", base.as_str())];
    let run = |budget: &'static str| {
        let mut args = vec!["run".to_string(), probe(), "--yes".into(), "--backend".into(), "openai".into()];
        args.extend(["--model".into(), "gpt-4o".into(), "--args".into(), fanout(2)]);
        args.extend(["--max-concurrent-subagents".into(), "1".into(), "--json".into(), "-q".into()]);
        if !budget.is_empty() {
            args.extend(["--max-ai-credits".into(), budget.into()]);
        }
        args
    };
    let go = |args: Vec<String>| {
        let state = state.path().to_path_buf();
        let env = env.map(|(k, v)| (k, v.to_string()));
        async move {
            let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            factory(&state, &args, &env).await
        }
    };

    // Values that are no counts (negative, strings, objects, fractions): never a failed
    // reply or a panic; unreadable counts read as 0 and make the spend "at least".
    server.set(Mode::Usage(json!({"prompt_tokens": -5, "completion_tokens": "12",
                                  "prompt_tokens_details": {"cached_tokens": {"x": 1}}})));
    let out = go(run("")).await;
    let envelope = stdout_json(&out);
    assert_eq!(envelope["status"], "completed", "{envelope:#}\n{}", stderr(&out));
    assert_eq!(envelope["accounting"]["inputTokens"], 0, "{envelope:#}");
    assert_eq!(envelope["accounting"]["aiCreditsAtLeast"], true, "{envelope:#}");

    // More cached than prompt tokens: no underflow; huge floats and u64::MAX saturate.
    server.set(Mode::Usage(json!({"prompt_tokens": 3, "completion_tokens": 1e300,
                                  "prompt_tokens_details": {"cached_tokens": u64::MAX}})));
    let out = go(run("")).await;
    let envelope = stdout_json(&out);
    assert_eq!(envelope["status"], "completed", "{envelope:#}\n{}", stderr(&out));
    let accounting = &envelope["accounting"];
    assert_eq!(accounting["inputTokens"], 0, "{envelope:#}");
    assert_eq!(accounting["cacheReadTokens"], u64::MAX, "saturated, not wrapped: {envelope:#}");
    assert_eq!(accounting["outputTokens"], u64::MAX, "{envelope:#}");
    assert_eq!(accounting["aiCreditsNano"], u64::MAX, "{envelope:#}");

    // Numbers beyond u64 (JSON allows them): saturated, and a saturated spend exhausts a budget.
    server.set(Mode::Usage(
        serde_json::from_str(r#"{"prompt_tokens": 1e30, "completion_tokens": 99999999999999999999999}"#).unwrap(),
    ));
    let out = go(run("5")).await;
    let envelope = stdout_json(&out);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(envelope["failure"]["kind"], "maxAiCredits", "{envelope:#}");
    assert_eq!(envelope["accounting"]["aiCreditsNano"], u64::MAX, "{envelope:#}");
    assert_eq!(envelope["accounting"]["inputTokens"], u64::MAX, "{envelope:#}");
    assert_eq!(envelope["accounting"]["agentsSpawned"], 1, "{envelope:#}");
}

/// Write an executable shell script.
fn script(path: &Path, body: &str) -> std::path::PathBuf {
    common::script_file(path, "/bin/sh", body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_cli_that_reports_no_cost_makes_the_spend_at_least() {
    let state = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    // A text agent CLI: it answers, and reports neither usage nor cost.
    let cli = script(&dir.path().join("agent.sh"), "cat > /dev/null\necho 'an answer'");
    // A claude-like JSON CLI that reports its cost in US dollars: exact.
    let paid = script(
        &dir.path().join("paid.sh"),
        r#"cat > /dev/null
echo '{"type":"result","is_error":false,"result":"paid","total_cost_usd":0.0123,"usage":{"input_tokens":10,"output_tokens":5,"cache_read_input_tokens":7,"cache_creation_input_tokens":3}}'"#,
    );
    let config = format!(
        "[backends.free]\nkind = \"cli\"\ncommand = [\"{}\"]\nsandbox = \"none\"\n\
         [backends.paid]\nkind = \"cli\"\npreset = \"claude\"\ncommand = [\"{}\"]\nsandbox = \"none\"\n",
        cli.display(),
        paid.display()
    );
    std::fs::write(state.path().join("factory.toml"), config).unwrap();

    let run = |backend: &'static str| {
        let probe = probe();
        let state = state.path().to_path_buf();
        async move {
            let args = ["run", &probe, "--yes", "--backend", backend, "--args", &fanout(2), "--json", "-q"];
            factory(&state, &args, &[]).await
        }
    };
    let out = run("free").await;
    let envelope = stdout_json(&out);
    assert_eq!(envelope["status"], "completed", "{envelope:#}\n{}", stderr(&out));
    assert_eq!(envelope["accounting"]["aiCreditsNano"], 0, "{envelope:#}");
    assert_eq!(envelope["accounting"]["aiCreditsAtLeast"], true, "no cost reported: at least 0: {envelope:#}");
    let id = envelope["runId"].as_str().unwrap().to_string();
    let detail = show(state.path(), &id).await;
    for agent in detail["agents"].as_array().unwrap() {
        assert_eq!(agent["creditsAtLeast"], true, "{agent}");
    }
    let text = String::from_utf8_lossy(&factory(state.path(), &["show", &id], &[]).await.stdout).to_string();
    assert!(text.contains("at least 0 AI credits"), "{text}");
    let runs = String::from_utf8_lossy(&factory(state.path(), &["runs"], &[]).await.stdout).to_string();
    assert!(runs.lines().any(|l| l.starts_with(&id) && l.contains(">=0")), "{runs}");

    // The claude preset's reported US$0.0123 is 1.23 credits (100 per dollar), exact.
    let out = run("paid").await;
    let envelope = stdout_json(&out);
    assert_eq!(envelope["status"], "completed", "{envelope:#}\n{}", stderr(&out));
    assert_eq!(envelope["accounting"]["aiCreditsNano"], 2 * 1_230_000_000u64, "{envelope:#}");
    assert_eq!(envelope["accounting"]["aiCreditsAtLeast"], false, "{envelope:#}");
    assert_eq!(envelope["accounting"]["cacheReadTokens"], 14, "{envelope:#}");
    assert_eq!(envelope["accounting"]["cacheWriteTokens"], 6, "{envelope:#}");

    // A budgeted run on the CLI that reports nothing and has no price is refused before
    // any spawn (fail-closed): nothing was spent, so nothing is "at least".
    let probe = probe();
    let args =
        ["run", &probe, "--yes", "--backend", "free", "--args", &fanout(2), "--max-ai-credits", "1", "--json", "-q"];
    let envelope = stdout_json(&factory(state.path(), &args, &[]).await);
    assert_eq!(envelope["failure"]["kind"], "maxAiCredits", "{envelope:#}");
    assert_eq!(envelope["accounting"]["agentsSpawned"], 0, "{envelope:#}");
    assert_eq!(envelope["accounting"]["aiCreditsAtLeast"], false, "{envelope:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_prices_prints_the_dated_table_with_config_overrides() {
    let state = tempfile::tempdir().unwrap();
    let out = factory(state.path(), &["backends", "--prices", "--json"], &[]).await;
    let table = stdout_json(&out);
    assert_eq!(table["creditsPerUsd"], 100, "{table:#}");
    assert!(table["taken"].as_str().is_some_and(|d| d.len() == 10), "{table:#}");
    let row = |table: &Value, provider: &str, model: &str| {
        table["prices"].as_array().unwrap().iter().find(|r| r["provider"] == provider && r["model"] == model).cloned()
    };
    let gpt4o = row(&table, "openai", "gpt-4o").expect("gpt-4o is listed");
    assert_eq!(gpt4o["inputNanoPer1k"], 250_000_000, "{gpt4o}");
    assert_eq!(gpt4o["cacheReadNanoPer1k"], 125_000_000, "{gpt4o}");
    assert_eq!(gpt4o["source"], "built-in");
    let haiku = row(&table, "anthropic", "claude-3-5-haiku-20241022").expect("haiku is listed");
    assert_eq!(haiku["cacheWriteNanoPer1k"], 100_000_000, "$1 per million: {haiku}");

    std::fs::write(
        state.path().join("factory.toml"),
        "[prices.openai]\n\"gpt-4o\" = { input = \"0.2\", output = 1 }\n[prices.anthropic]\n\"claude-next\" = { input = 0.3, output = 1.5 }\n",
    )
    .unwrap();
    let table = stdout_json(&factory(state.path(), &["backends", "--prices", "--json"], &[]).await);
    let gpt4o = row(&table, "openai", "gpt-4o").unwrap();
    assert_eq!(
        (gpt4o["inputNanoPer1k"].as_u64(), gpt4o["cacheReadNanoPer1k"].is_null()),
        (Some(200_000_000), true),
        "{gpt4o}"
    );
    assert_eq!(gpt4o["source"], "config (overrides built-in)");
    assert_eq!(row(&table, "anthropic", "claude-next").unwrap()["source"], "config");
    let text = String::from_utf8_lossy(&factory(state.path(), &["backends", "--prices"], &[]).await.stdout).to_string();
    assert!(text.contains("1 credit = US$0.01") && text.contains("claude-next"), "{text}");
    assert!(
        text.lines().any(|l| l.starts_with("openai") && l.contains("gpt-4.1-mini") && l.contains("0.04")),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_cut_off_mid_way_makes_the_spend_at_least() {
    let state = tempfile::tempdir().unwrap();
    // The server takes 5 s to answer; the run's time limit stops it after 1 s, with both
    // calls in flight: whatever they had cost is unknown.
    let server = FakeOpenAi::start(Mode::Answer { latency: std::time::Duration::from_secs(5) }).await;
    let base = base_url(server.port());
    let run = [
        "run",
        &probe(),
        "--yes",
        "--backend",
        "openai",
        "--model",
        "gpt-4o",
        "--args",
        &fanout(2),
        "--timeout-seconds",
        "1",
        "--json",
        "-q",
    ];
    let out = factory(state.path(), &run, &[("OPENAI_BASE_URL", base.as_str())]).await;
    let envelope = stdout_json(&out);
    assert_eq!(envelope["failure"]["kind"], "timeoutSeconds", "{envelope:#}\n{}", stderr(&out));
    assert_eq!(server.requests(), 2, "both calls were sent: {envelope:#}");
    assert_eq!(envelope["accounting"]["aiCreditsNano"], 0, "{envelope:#}");
    assert_eq!(envelope["accounting"]["aiCreditsAtLeast"], true, "cut off mid-way: {envelope:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cassette_records_and_replays_the_cache_breakdown() {
    let state = tempfile::tempdir().unwrap();
    let usage = json!({"input_tokens": 100, "output_tokens": 50, "cache_read_input_tokens": 10_000,
                       "cache_creation_input_tokens": 2000});
    let server = FakeOpenAi::start(Mode::Usage(usage)).await;
    let base = format!("http://127.0.0.1:{}", server.port());
    let cassette = state.path().join("run.cassette");
    let cassette = cassette.to_str().unwrap();
    let run = |extra: &[&'static str]| {
        let mut args: Vec<String> =
            ["run", &probe(), "--yes", "--args", &fanout(2), "--json", "-q"].map(String::from).to_vec();
        args.extend(extra.iter().map(|a| a.to_string()));
        args
    };
    let mut record = run(&["--backend", "anthropic", "--model", "claude-sonnet-4-5", "--record"]);
    record.push(cassette.to_string());
    let args: Vec<&str> = record.iter().map(String::as_str).collect();
    let out = factory(state.path(), &args, &[("ANTHROPIC_BASE_URL", &base), ("ANTHROPIC_API_KEY", "ak-test")]).await;
    let recorded = stdout_json(&out);
    assert_eq!(recorded["status"], "completed", "{recorded:#}\n{}", stderr(&out));
    let text = std::fs::read_to_string(cassette).unwrap();
    assert!(text.contains("\"cacheReadTokens\":10000") && text.contains("\"cacheWriteTokens\":2000"), "{text}");

    // Replayed in a fresh state with no server: the same breakdown and credits.
    let other = tempfile::tempdir().unwrap();
    let requests = server.requests();
    let mut replay = run(&["--replay"]);
    replay.push(cassette.to_string());
    let args: Vec<&str> = replay.iter().map(String::as_str).collect();
    let out = factory(other.path(), &args, &[]).await;
    let replayed = stdout_json(&out);
    assert_eq!(replayed["status"], "completed", "{replayed:#}\n{}", stderr(&out));
    assert_eq!(server.requests(), requests, "the replay sent nothing");
    let mut expected = recorded["accounting"].clone();
    let mut got = replayed["accounting"].clone();
    for a in [&mut expected, &mut got] {
        a.as_object_mut().unwrap().remove("activeSeconds");
    }
    assert_eq!(got, expected, "{replayed:#}");
    assert_eq!(got["cacheReadTokens"], 20_000);
    assert_eq!(got["aiCreditsNano"], 2 * 1_155_000_000u64);
}

/// The commands of the book's "Against a local model" (docs/src/operating/backends.md) that run
/// against an OpenAI-compatible server: `(OPENAI_BASE_URL, the arguments after "factory")`, as written.
fn readme_local_model_commands() -> Vec<(String, Vec<String>)> {
    let page = std::fs::read_to_string(common::root().join("docs/src/operating/backends.md")).expect("backends.md");
    let section = page.split_once("Against a local model").expect("backends.md has \"Against a local model\"").1;
    let block = section.split_once("```sh").expect("a sh block").1.split_once("```").expect("its end").0;
    let commands: Vec<(String, Vec<String>)> = block
        .lines()
        .filter_map(|line| line.trim().strip_prefix("OPENAI_BASE_URL="))
        .map(|line| {
            let mut words = line.split_whitespace().map(str::to_string);
            let url = words.next().expect("a base URL");
            assert_eq!(words.next().as_deref(), Some("factory"), "{line}");
            (url, words.collect())
        })
        .collect();
    assert_eq!(commands.len(), 2, "llama.cpp and Ollama: {block}");
    commands
}

/// `url` (`http://127.0.0.1:PORT/v1`) with the fake server's port instead of its own.
fn on_port(url: &str, port: u16) -> String {
    let rest = url.strip_prefix("http://127.0.0.1:").unwrap_or_else(|| panic!("{url} is on 127.0.0.1"));
    let path = &rest[rest.find('/').expect("a path")..];
    format!("http://127.0.0.1:{port}{path}")
}

/// Kills the services a test's front doors started in a state directory, however it ends.
struct Services(std::path::PathBuf);

impl Drop for Services {
    fn drop(&mut self) {
        for pid in common::service::live_services(&self.0) {
            common::service::signal(pid as u32, "-KILL");
        }
    }
}

/// Check the run a documented command printed (no `--json`: the report on stdout, progress on
/// stderr): it completed with every file reviewed by the server, for 0 credits, and said so
/// once on stderr.
async fn check_readme_run(state: &Path, out: &Output, server: &FakeOpenAi, url: &str, model: &str) {
    let err = stderr(out);
    assert!(out.status.success(), "{}\n{err}", String::from_utf8_lossy(&out.stdout));
    let report: Value = stdout_json(out);
    let reviews = report["reviews"].as_array().unwrap_or_else(|| panic!("{report:#}"));
    assert_eq!(reviews.len(), 3, "the default files: {report:#}");
    for review in reviews {
        assert!(review["review"].as_str().is_some_and(|r| r.starts_with("real answer to: Review")), "{review}");
    }
    let notice = format!("backend `openai` at {url} is on this machine: calls of model `{model}` cost 0 credits");
    assert_eq!(err.matches(&notice).count(), 1, "one line says the calls are free: {err}");
    assert_eq!(err.matches("is on this machine").count(), 1, "{err}");
    assert!(server.asked().len() >= 3, "the reviews came from the server");
    let runs = stdout_json(&factory(state, &["runs", "--json"], &[]).await);
    let run = &runs.as_array().expect("a list")[0];
    let detail = show(state, run["runId"].as_str().expect("an id")).await;
    assert_eq!(detail["status"], "completed", "{detail:#}");
    assert_eq!(detail["accounting"]["aiCreditsNano"], 0, "{detail:#}");
    assert_eq!(detail["accounting"]["aiCreditsAtLeast"], false, "{detail:#}");
    assert_eq!(detail["limits"]["maxAiCredits"], 5.0, "the declared budget held: {detail:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_local_model_commands_complete_as_written() {
    let server = FakeOpenAi::start(Mode::Answer { latency: Duration::ZERO }).await;
    let commands = readme_local_model_commands();
    for (i, (url, args)) in commands.iter().enumerate() {
        let state = tempfile::tempdir().unwrap();
        let _services = Services(state.path().to_path_buf());
        let url = on_port(url, server.port());
        let model = &args[args.iter().position(|a| a == "--model").expect("--model") + 1];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut cmd = common::factory_cmd(state.path(), &args);
        for var in ["FACTORY_CONFIG", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"] {
            cmd.env_remove(var);
        }
        cmd.env("OPENAI_BASE_URL", &url).current_dir(common::root());
        // The first through the state directory's service (started by the command, with its
        // environment), the second in this process (`FACTORY_NO_DAEMON=1`).
        if i == 0 {
            cmd.env_remove("FACTORY_NO_DAEMON").env("FACTORY_IDLE_SECONDS", "30");
        }
        let out = tokio::task::spawn_blocking(move || cmd.output().expect("factory runs")).await.unwrap();
        check_readme_run(state.path(), &out, &server, &url, model).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_ai_credits_none_lifts_the_budget_a_factory_declares() {
    // 10 credits a call (10 input tokens at 1000 credits per 1000): review-changed declares
    // `maxAiCredits: 5`, so its second review is refused.
    let server = FakeOpenAi::start(Mode::Answer { latency: Duration::ZERO }).await;
    let config = format!(
        "[backends.paid]\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"\n[backends.paid.pricing]\ninput = 1000\noutput = 0\n",
        base_url(server.port())
    );
    let example = common::crate_dir("review-changed");
    let example = example.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["run", example, "--backend", "paid", "--max-concurrent-subagents", "1", "--json", "-q"];
        args.extend_from_slice(extra);
        args.into_iter().map(str::to_string).collect::<Vec<_>>()
    };
    let go = |state: &Path, args: Vec<String>, service: bool| {
        let mut cmd = common::factory_cmd(state, &args.iter().map(String::as_str).collect::<Vec<_>>());
        cmd.env_remove("OPENAI_BASE_URL").env_remove("OPENAI_API_KEY").env_remove("FACTORY_CONFIG");
        if service {
            cmd.env_remove("FACTORY_NO_DAEMON").env("FACTORY_IDLE_SECONDS", "30");
        }
        tokio::task::spawn_blocking(move || cmd.output().expect("factory runs"))
    };

    let state = tempfile::tempdir().unwrap();
    std::fs::write(state.path().join("factory.toml"), &config).unwrap();
    let out = go(state.path(), run(&[]), false).await.unwrap();
    let refused = stdout_json(&out);
    assert_eq!(refused["failure"]["kind"], "maxAiCredits", "{refused:#}\n{}", stderr(&out));
    assert_eq!(refused["accounting"]["agentsSpawned"], 1, "{refused:#}");

    // Lifted for one run: every review is paid, past the declared budget.
    let out = go(state.path(), run(&["--max-ai-credits", "none"]), false).await.unwrap();
    let lifted = stdout_json(&out);
    assert_eq!(lifted["status"], "completed", "{lifted:#}\n{}", stderr(&out));
    assert_eq!(lifted["accounting"]["aiCreditsNano"], 3 * 10_000_000_000u64, "{lifted:#}");
    let detail = show(state.path(), lifted["runId"].as_str().unwrap()).await;
    assert!(detail["limits"].get("maxAiCredits").is_none(), "no budget: {detail:#}");
    assert_eq!(detail["limits"]["maxTotalSubagents"], 10, "the other declared limits hold: {detail:#}");

    // A resume of the refused run lifts it the same way, and the lift is kept for later
    // resumes (a resume that says nothing of the budget).
    let resume = |extra: &[&str]| {
        let mut args = vec!["resume", refused["runId"].as_str().unwrap(), "--json", "-q"];
        args.extend_from_slice(extra);
        args.into_iter().map(str::to_string).collect::<Vec<_>>()
    };
    let out = go(state.path(), resume(&["--max-ai-credits", "none"]), false).await.unwrap();
    let resumed = stdout_json(&out);
    assert_eq!(resumed["status"], "completed", "{resumed:#}\n{}", stderr(&out));
    assert_eq!(resumed["accounting"]["aiCreditsNano"], 3 * 10_000_000_000u64, "{resumed:#}");

    // Through the state directory's service: the same.
    let served = tempfile::tempdir().unwrap();
    let _services = Services(served.path().to_path_buf());
    std::fs::write(served.path().join("factory.toml"), &config).unwrap();
    let out = go(served.path(), run(&["--max-ai-credits", "none"]), true).await.unwrap();
    let lifted = stdout_json(&out);
    assert_eq!(lifted["status"], "completed", "{lifted:#}\n{}", stderr(&out));
    assert_eq!(lifted["accounting"]["aiCreditsNano"], 3 * 10_000_000_000u64, "{lifted:#}");
    let out = go(served.path(), run(&[]), true).await.unwrap();
    assert_eq!(stdout_json(&out)["failure"]["kind"], "maxAiCredits", "a lift is for one run: {}", stderr(&out));

    // The consent prompt shows the budget as lifted, next to what the factory declares.
    let component = common::component("review-changed");
    let fresh = tempfile::tempdir().unwrap();
    let cmd = common::factory_cmd(fresh.path(), &["run", component.to_str().unwrap(), "--max-ai-credits", "none"]);
    let (_, shown) = common::on_a_terminal(&cmd, "n\n");
    assert!(shown.contains("maxAiCredits=none (lifted)"), "{shown}");
    assert!(
        shown.contains("(declared: maxConcurrentSubagents=3 maxTotalSubagents=10 timeoutSeconds=90.5 maxAiCredits=5)"),
        "{shown}"
    );
}
