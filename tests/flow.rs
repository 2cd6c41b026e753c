//! Providers throttle, factories keep going (issue 50): a wide fan-out against a provider
//! that allows a few dozen requests a second completes at about that rate, with few 429s,
//! whether the provider speaks OpenAI's or Anthropic's rate-limit headers; runs of one
//! service share the provider's budget; and agent CLIs run at most `max_concurrent` at once.
//!
//! The provider is a real HTTP server on 127.0.0.1 (`common::throttling`) that admits a
//! token bucket's worth of requests and answers the rest 429 with the providers' headers;
//! everything runs through the real `factory` binary and service.

mod common;

use common::service::Service;
use common::throttling::{Limits, Style, Throttling};
use common::{config_file, factory_clean, fanout_args, probe_arg, stderr, stdout_json};
use serde_json::Value;
use std::path::Path;

/// `factory.toml` in `state` with backend `limited` of `kind` at `base_url` (model `m`, no
/// key, free), plus `extra` lines in its table.
fn write_config(state: &Path, kind: &str, base_url: &str, extra: &str) {
    let text = format!(
        "default = \"limited\"\n[backends.limited]\nkind = \"{kind}\"\nbase_url = \"{base_url}\"\nmodel = \"m\"\n\
         max_retries = 1\nretry_base_ms = 5\n{extra}\n[backends.limited.pricing]\ninput = 0\noutput = 0\n"
    );
    config_file(&state.join("factory.toml"), &text);
}

/// A fan-out of `n` agents at `concurrency`, in one process, its envelope.
async fn fan_out(state: &Path, n: usize, concurrency: usize) -> (Value, String) {
    let concurrency = concurrency.to_string();
    let args = [
        "run",
        &probe_arg(),
        "--yes",
        "--backend",
        "limited",
        "--args",
        &fanout_args(n),
        "--max-concurrent-subagents",
        &concurrency,
        "--max-total-subagents",
        "100000",
        "--json",
        "-q",
    ];
    let started = std::time::Instant::now();
    let out = factory_clean(state, &args, &[]).await;
    eprintln!("fan-out of {n} at {concurrency}: {:.1}s", started.elapsed().as_secs_f64());
    (stdout_json(&out), stderr(&out))
}

fn assert_all_answered(envelope: &Value, n: usize, log: &str) {
    assert_eq!(envelope["status"], "completed", "{envelope:#}\n{log}");
    assert_eq!(envelope["result"]["done"], n, "{envelope:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wide_fan_out_runs_at_the_providers_rate_with_few_429s() {
    let server = Throttling::start(Limits::rps(25.0)).await;
    let state = tempfile::tempdir().unwrap();
    write_config(state.path(), "openai", &server.base_url(), "");
    let (envelope, log) = fan_out(state.path(), 300, 64).await;
    assert_all_answered(&envelope, 300, &log);
    let counts = server.counts();
    eprintln!("provider saw: {counts:?}");
    assert_eq!(counts.answered, 300, "{counts:?}");
    assert!(counts.throttled_share() <= 0.10, "429s are backpressure, not a stampede: {counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_style_limits_are_learned_too() {
    let server = Throttling::start(Limits { style: Style::Anthropic, ..Limits::rps(20.0) }).await;
    let state = tempfile::tempdir().unwrap();
    write_config(state.path(), "anthropic", &server.root_url(), "");
    let (envelope, log) = fan_out(state.path(), 150, 64).await;
    assert_all_answered(&envelope, 150, &log);
    let counts = server.counts();
    eprintln!("provider saw: {counts:?}");
    assert!(counts.throttled_share() <= 0.10, "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_budget_is_kept_as_well_as_the_request_rate() {
    // Each call costs about 22 tokens: 3,000 tokens a minute (a bucket of 50) is 2 calls a
    // second, far below the request rate, so the token budget is what paces once the first
    // replies have said so (the first few calls go before any header is known).
    let limits = Limits { tokens_per_minute: Some(3000.0), ..Limits::rps(50.0) };
    let server = Throttling::start(limits).await;
    let state = tempfile::tempdir().unwrap();
    write_config(state.path(), "openai", &server.base_url(), "");
    let (envelope, log) = fan_out(state.path(), 40, 4).await;
    assert_all_answered(&envelope, 40, &log);
    let counts = server.counts();
    eprintln!("provider saw: {counts:?}");
    assert!(counts.throttled_share() <= 0.10, "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_rate_is_kept_from_the_first_request() {
    // requests_per_minute set to the server's rate: nothing is refused, not even at the start.
    let server = Throttling::start(Limits::rps(20.0)).await;
    let state = tempfile::tempdir().unwrap();
    write_config(state.path(), "openai", &server.base_url(), "requests_per_minute = 1200");
    let (envelope, log) = fan_out(state.path(), 100, 64).await;
    assert_all_answered(&envelope, 100, &log);
    let counts = server.counts();
    eprintln!("provider saw: {counts:?}");
    assert!(counts.throttled <= 2, "{counts:?}");
    assert!(counts.max_received_per_second <= 2 * 20 + 2, "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_runs_of_one_service_share_the_budget() {
    let server = Throttling::start(Limits::rps(20.0)).await;
    let state = tempfile::tempdir().unwrap();
    write_config(state.path(), "openai", &server.base_url(), "");
    common::register_trusted_probe(state.path());
    let service = Service::start(state.path(), &[]);
    let run = |state: std::path::PathBuf| async move {
        let args = [
            "run",
            "probe",
            "--backend",
            "limited",
            "--args",
            &fanout_args(80),
            "--max-concurrent-subagents",
            "64",
            "--json",
            "-q",
        ];
        let mut cmd = common::factory_cmd(&state, &args);
        cmd.env_remove("FACTORY_NO_DAEMON");
        tokio::task::spawn_blocking(move || cmd.output().unwrap()).await.unwrap()
    };
    let (a, b, c) = tokio::join!(run(state.path().into()), run(state.path().into()), run(state.path().into()));
    for out in [a, b, c] {
        let envelope = stdout_json(&out);
        assert_all_answered(&envelope, 80, &stderr(&out));
    }
    let counts = server.counts();
    eprintln!("provider saw: {counts:?}");
    assert_eq!(counts.answered, 240, "{counts:?}");
    assert!(counts.throttled_share() <= 0.10, "one budget for the three runs: {counts:?}\n{}", service.log());
    // A token bucket admits its burst and a second's refill in the first second; beyond that
    // the runs together never send more than the server's rate.
    assert!(counts.max_received_per_second <= 2 * 20 + 8, "{counts:?}");
    service.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_clis_run_at_most_max_concurrent_at_once() {
    let state = tempfile::tempdir().unwrap();
    let log = state.path().join("spawns.log");
    // A CLI that notes its start and end (with O_APPEND, lines do not interleave).
    let cli = common::script_file(
        &state.path().join("agent.sh"),
        "/bin/sh",
        &format!("echo start >> {log}\nsleep 0.2\necho end >> {log}\necho done", log = log.display()),
    );
    let config = format!(
        "default = \"agent\"\n[backends.agent]\nkind = \"cli\"\npreset = \"generic\"\ncommand = [\"{}\", \"{{prompt}}\"]\n\
         sandbox = \"none\"\nmax_concurrent = 3\n",
        cli.display()
    );
    config_file(&state.path().join("factory.toml"), &config);
    let args = ["run", &probe_arg(), "--yes", "--backend", "agent", "--args", &fanout_args(12), "--json", "-q"];
    let out = factory_clean(state.path(), &args, &[]).await;
    let envelope = stdout_json(&out);
    assert_all_answered(&envelope, 12, &stderr(&out));
    let text = std::fs::read_to_string(&log).unwrap();
    let (mut running, mut most) = (0i32, 0i32);
    for line in text.lines() {
        running += if line == "start" { 1 } else { -1 };
        most = most.max(running);
    }
    assert_eq!(text.lines().filter(|l| *l == "start").count(), 12);
    assert_eq!(most, 3, "at most max_concurrent agents at once, and that many: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calls_max_duration_counts_from_its_admission_not_its_wait_in_the_queue() {
    // One request a second: the sixth call waits about five seconds in the flow, far past its
    // maxDurationSeconds of 2, and is still answered: the queue is not the call's time.
    let server = Throttling::start(Limits::rps(50.0)).await;
    let state = tempfile::tempdir().unwrap();
    write_config(state.path(), "openai", &server.base_url(), "requests_per_minute = 60");
    let factory = state.path().join("paced.js");
    std::fs::write(
        &factory,
        r#"import { defineFactory } from "@github/copilot-sdk/extension";
export default defineFactory({
    meta: { name: "paced", description: "Six calls with a short maxDurationSeconds." },
    async run(ctx) {
        const replies = await ctx.parallel(
            [0, 1, 2, 3, 4, 5].map((i) => () => ctx.agent(`task ${i}`, { label: `t:${i}`, maxDurationSeconds: 2 })),
        );
        return { done: replies.filter((r) => r).length };
    },
});
"#,
    )
    .unwrap();
    let out = factory_clean(state.path(), &["run", factory.to_str().unwrap(), "--yes", "--json", "-q"], &[]).await;
    let envelope = stdout_json(&out);
    assert_all_answered(&envelope, 6, &stderr(&out));
    assert_eq!(server.counts().answered, 6);
}
