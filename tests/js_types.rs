//! The JS runtime's TypeScript declarations (`guest-sdk/js`) and `factory init`, checked with
//! the real TypeScript compiler (npm `typescript`, pinned in `tests/ts/package-lock.json`;
//! `npm ci` in `tests/ts` installs it): every example under `examples/js` type-checks against
//! the declarations; wrong usages fail (a type-level suite of `@ts-expect-error` lines and
//! separate wrong programs), so the types are precise, not `any`; the envelope's strings in
//! the declarations are the host's own; `factory init --lang ts|js` scaffolds that type-check
//! and run on the dry-run backend; `init` refuses to overwrite.

mod common;

use factory_host::backend::OutageKind;
use factory_host::{FailureType, RunStatus};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The runtime's declarations.
fn index_d_ts() -> PathBuf {
    common::root().join("guest-sdk/js/index.d.ts")
}

/// The pinned `typescript` version (tests/ts/package.json).
fn pinned_typescript() -> String {
    let text = std::fs::read_to_string(common::root().join("tests/ts/package.json")).expect("tests/ts/package.json");
    let package: Value = serde_json::from_str(&text).expect("tests/ts/package.json is JSON");
    package["devDependencies"]["typescript"].as_str().expect("a pinned typescript").to_string()
}

/// The pinned `tsc` as a command; a missing Node.js or `npm ci` fails with how to install it.
fn tsc() -> Command {
    let bin = common::root().join("tests/ts/node_modules/typescript/bin/tsc");
    assert!(
        bin.is_file(),
        "the TypeScript compiler is not installed: run `npm ci` in tests/ts (needs Node.js and npm; \
         Debian/Ubuntu: apt-get install nodejs npm; `.ci/run` does both), then rerun"
    );
    let node = Command::new("node").arg("--version").output();
    assert!(
        node.as_ref().is_ok_and(|o| o.status.success()),
        "`node` is not on PATH ({node:?}): install Node.js >= 16 (Debian/Ubuntu: apt-get install nodejs), then rerun"
    );
    let mut cmd = Command::new("node");
    cmd.arg(bin);
    cmd
}

/// Run the pinned `tsc -p <project>`.
fn typecheck(project: &Path) -> Output {
    tsc().arg("-p").arg(project).arg("--pretty").arg("false").output().expect("tsc starts")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// A project in `dir` checking `files` with tests/ts/tsconfig.json's options (a scaffold's:
/// strict, ES2022, no DOM, `checkJs`, the runtime's module names mapped to guest-sdk/js).
fn project(dir: &Path, files: &[PathBuf]) -> PathBuf {
    let config = json!({
        "extends": common::root().join("tests/ts/tsconfig.json").display().to_string(),
        "files": files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>(),
        "include": [],
    });
    let path = dir.join("tsconfig.json");
    std::fs::write(&path, serde_json::to_string_pretty(&config).expect("config")).expect("writing tsconfig.json");
    path
}

#[test]
fn the_pinned_compiler_is_the_one_that_runs() {
    let out = tsc().arg("--version").output().expect("tsc starts");
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!("Version {}", pinned_typescript()));
}

#[test]
fn every_example_type_checks_against_the_declarations() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(common::root().join("examples/js"))
        .expect("examples/js")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().and_then(|e| e.to_str()).is_some_and(|e| matches!(e, "js" | "mjs" | "ts" | "mts")))
        .collect();
    files.sort();
    assert!(files.len() >= 4, "examples/js has the JS and TS examples: {files:?}");
    for js in files.iter().filter(|p| p.extension().is_some_and(|e| e == "js")) {
        let source = std::fs::read_to_string(js).expect("an example");
        assert!(source.contains("// @ts-check"), "{} is checked in editors too: it says `// @ts-check`", js.display());
    }
    let dir = tempfile::tempdir().expect("a temp dir");
    let out = typecheck(&project(dir.path(), &files));
    assert!(out.status.success(), "the examples do not type-check:\n{}", text(&out));
}

#[test]
fn the_type_level_suite_holds() {
    // Each `Equal` there must hold and each `@ts-expect-error` line must be an error: a
    // loosened type (an `any`, a wider union) leaves a directive unused, which tsc reports.
    let suite = common::root().join("tests/ts/types/precise.ts");
    let source = std::fs::read_to_string(&suite).expect("the suite");
    assert!(source.matches("@ts-expect-error").count() >= 20, "the suite checks many wrong usages");
    let dir = tempfile::tempdir().expect("a temp dir");
    let out = typecheck(&project(dir.path(), &[suite]));
    assert!(out.status.success(), "the type-level suite fails:\n{}", text(&out));
}

/// A wrong program fails type-checking with `code` at `file(line,`.
fn assert_rejected(name: &str, source: &str, line: usize, code: &str) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let file = dir.path().join(name);
    std::fs::write(&file, source).expect("writing the program");
    let out = typecheck(&project(dir.path(), &[file]));
    let output = text(&out);
    assert!(!out.status.success(), "{name} type-checks, but it is wrong:\n{source}");
    let at = format!("{name}({line},");
    assert!(output.lines().any(|l| l.contains(&at) && l.contains(code)), "expected {code} at {at} in:\n{output}");
}

#[test]
fn wrong_usages_fail_type_checking() {
    // The same program with a string prompt passes: only the wrong line makes it fail.
    let good = r#"import { defineFactory } from "factory";
export default defineFactory({
    meta: { name: "wrong", description: "" },
    run: async (ctx) => {
        const reply = await ctx.agent("a prompt", { label: "x" });
        return { reply };
    },
});
"#;
    let dir = tempfile::tempdir().expect("a temp dir");
    std::fs::write(dir.path().join("good.ts"), good).expect("writing");
    let out = typecheck(&project(dir.path(), &[dir.path().join("good.ts")]));
    assert!(out.status.success(), "{}", text(&out));

    assert_rejected("agent.ts", &good.replace(r#"ctx.agent("a prompt""#, "ctx.agent(123"), 5, "error TS2769");
    assert_rejected("option.ts", &good.replace(r#"{ label: "x" }"#, r#"{ lable: "x" }"#), 5, "error TS2769");
    // JavaScript is checked too (`// @ts-check`, JSDoc).
    let kind = r#"// @ts-check
/** @type {import("@github/copilot-sdk/extension").FactoryFailure} */
const failure = { type: "factory_limit_reached", kind: "maxAgents", message: "over" };
export { failure };
"#;
    assert_rejected("kind.js", kind, 3, "error TS2322");
    let result = r#"// @ts-check
import { defineFactory } from "@github/copilot-sdk/extension";
export default defineFactory({
    meta: { name: "result", description: "" },
    run: async (ctx) => ctx.step("k", () => new Map()),
});
"#;
    assert_rejected("step.js", result, 5, "error TS");
    let status = r#"import type { FactoryRunResult } from "@github/copilot-sdk";
export const done = (run: FactoryRunResult) => run.status === "failed";
"#;
    assert_rejected("status.ts", status, 2, "error TS2367");
}

/// The string literals of a union the declarations spell as `"a" | "b" | ...` after `head`.
fn literals_after(d_ts: &str, head: &str) -> BTreeSet<String> {
    let start = d_ts.find(head).unwrap_or_else(|| panic!("`{head}` in index.d.ts"));
    let rest = &d_ts[start + head.len()..];
    let end = rest.find(';').expect("the union ends");
    rest[..end].split('"').skip(1).step_by(2).map(str::to_string).collect()
}

#[test]
fn the_envelope_strings_are_the_hosts() {
    let d_ts = std::fs::read_to_string(index_d_ts()).expect("index.d.ts");
    // Every failure type: listed exhaustively here, so a new variant fails to compile.
    let all_types = [
        FailureType::FactoryLimitReached,
        FailureType::SandboxLimit,
        FailureType::Sandbox,
        FailureType::Trap,
        FailureType::GuestError,
        FailureType::InvalidResult,
        FailureType::InvalidCall,
        FailureType::Storage,
        FailureType::Backend,
        FailureType::Internal,
        FailureType::Cancelled,
        FailureType::Halted,
        FailureType::Paused,
    ];
    for t in all_types {
        match t {
            FailureType::FactoryLimitReached
            | FailureType::SandboxLimit
            | FailureType::Sandbox
            | FailureType::Trap
            | FailureType::GuestError
            | FailureType::InvalidResult
            | FailureType::InvalidCall
            | FailureType::Storage
            | FailureType::Backend
            | FailureType::Internal
            | FailureType::Cancelled
            | FailureType::Halted
            | FailureType::Paused => {}
        }
    }
    let declared: BTreeSet<String> = d_ts
        .split("readonly type: ")
        .skip(1)
        .flat_map(|s| {
            let union = &s[..s.find(';').expect("a member ends")];
            union.split('"').skip(1).step_by(2).map(str::to_string).collect::<Vec<_>>()
        })
        .collect();
    let host: BTreeSet<String> = all_types.iter().map(|t| t.as_str().to_string()).collect();
    assert_eq!(declared, host, "FactoryFailure's `type`s are FailureType's");

    let statuses = literals_after(&d_ts, "export type FactoryRunStatus =");
    let all_statuses = [
        RunStatus::Pending,
        RunStatus::Running,
        RunStatus::Completed,
        RunStatus::Error,
        RunStatus::Halted,
        RunStatus::Cancelled,
        RunStatus::Paused,
    ];
    let host: BTreeSet<String> = all_statuses.iter().map(|s| s.as_str().to_string()).collect();
    assert_eq!(statuses, host, "FactoryRunStatus is RunStatus");
    for s in all_statuses {
        assert_eq!(s.is_terminal(), !matches!(s.as_str(), "pending" | "running"), "FactoryTerminalStatus");
    }

    let outages = literals_after(&d_ts, "export type FactoryBackendFailureKind =");
    for kind in &outages {
        let parsed: OutageKind =
            serde_json::from_value(json!(kind)).unwrap_or_else(|e| panic!("`{kind}` is no OutageKind: {e}"));
        assert_eq!(parsed.as_str(), kind);
    }
    assert_eq!(outages.len(), 10, "every OutageKind is declared: {outages:?}");

    // Every field (a struct literal: a new limit fails to compile here).
    let every = factory_host::Limits {
        max_concurrent_subagents: Some(1),
        max_total_subagents: Some(1),
        timeout_seconds: Some(1.0),
        max_ai_credits: Some(1.0),
        lifted: Default::default(),
    };
    let host_limits: BTreeSet<String> =
        serde_json::to_value(every).expect("limits").as_object().expect("an object").keys().cloned().collect();
    let start = d_ts.find("export interface FactoryLimits {").expect("FactoryLimits");
    let body = &d_ts[start..start + d_ts[start..].find("\n}").expect("its end")];
    let declared: BTreeSet<String> = body
        .lines()
        .filter_map(|l| l.trim().strip_prefix("readonly ")?.split_once("?: number;").map(|(k, _)| k.to_string()))
        .collect();
    assert_eq!(declared, host_limits, "FactoryLimits is Limits");
    // Each limit but the concurrency cap (which queues, never fails) is a failure kind.
    let kinds = literals_after(&d_ts, "export type FactoryLimitKind =");
    let failing: BTreeSet<String> = host_limits.into_iter().filter(|k| k != "maxConcurrentSubagents").collect();
    assert_eq!(kinds, failing, "FactoryLimitKind");
}

/// `factory init` into `dir` with `lang`.
fn init(state: &Path, dir: &Path, lang: &str) -> Output {
    common::factory_in(state, &["init", dir.to_str().expect("a UTF-8 path"), "--lang", lang])
}

fn scaffold_checks_and_runs(lang: &str) {
    let state = tempfile::tempdir().expect("a state dir");
    let work = tempfile::tempdir().expect("a work dir");
    let name = format!("ideas-{lang}");
    let dir = work.path().join(&name);
    let out = init(state.path(), &dir, lang);
    assert!(out.status.success(), "init failed: {}", text(&out));
    let file = dir.join(format!("{name}.{lang}"));
    for f in [
        &file,
        &dir.join("tsconfig.json"),
        &dir.join("package.json"),
        &dir.join("README.md"),
        &dir.join("types/factory.d.ts"),
    ] {
        assert!(f.is_file(), "init wrote {}", f.display());
    }
    assert_eq!(
        std::fs::read_to_string(dir.join("types/factory.d.ts")).expect("the copy"),
        std::fs::read_to_string(index_d_ts()).expect("the declarations"),
        "the scaffold's declarations are guest-sdk/js's"
    );
    let package: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("package.json")).expect("package.json")).expect("JSON");
    assert_eq!(package["type"], "module");
    assert_eq!(package["scripts"]["typecheck"], "tsc -p .");
    assert_eq!(
        package["devDependencies"]["typescript"].as_str(),
        Some(pinned_typescript().as_str()),
        "the same pin as tests/ts"
    );

    // The scaffold's own tsconfig.json, as `npm run typecheck` uses it (offline: `paths`).
    let out = typecheck(&dir);
    assert!(out.status.success(), "the {lang} scaffold does not type-check:\n{}", text(&out));

    // It runs as it is on the dry-run backend.
    let path = file.to_str().expect("a UTF-8 path");
    let out = common::factory_in(
        state.path(),
        &["run", path, "--args", r#"{"topic":"release notes","ideas":2}"#, "--json", "-q"],
    );
    let envelope = common::stdout_json(&out);
    assert_eq!(envelope["status"], "completed", "{envelope:#}\n{}", common::stderr(&out));
    assert_eq!(envelope["factory"], name.as_str());
    let result = &envelope["result"];
    assert_eq!(result["topic"], "release notes", "{result:#}");
    let ideas = result["ideas"].as_array().expect("ideas");
    assert_eq!(ideas.len() + result["dropped"].as_u64().expect("dropped") as usize, 2, "{result:#}");
    // Two ideas, each critiqued: four subagents.
    assert_eq!(envelope["accounting"]["agentsSpawned"], 4, "{envelope:#}");

    // Its args schema is enforced by the host: wrong args never start a run.
    let out = common::factory_in(state.path(), &["run", path, "--args", r#"{"ideas":"many"}"#, "--json", "-q"]);
    assert!(!out.status.success(), "wrong args ran: {}", text(&out));
    assert!(common::stderr(&out).contains("ideas"), "{}", common::stderr(&out));

    // A wrong edit of the scaffold fails its own type-check.
    let source = std::fs::read_to_string(&file).expect("the factory");
    let broken = source.replacen("label: `idea:${i}`", "label: i", 1);
    assert_ne!(broken, source);
    std::fs::write(&file, broken).expect("editing");
    let out = typecheck(&dir);
    assert!(!out.status.success(), "a numeric label type-checks in the {lang} scaffold");
}

#[test]
fn init_ts_type_checks_and_runs() {
    scaffold_checks_and_runs("ts");
}

#[test]
fn init_js_type_checks_and_runs() {
    scaffold_checks_and_runs("js");
}

#[test]
fn init_never_overwrites() {
    let state = tempfile::tempdir().expect("a state dir");
    let work = tempfile::tempdir().expect("a work dir");

    let taken = work.path().join("taken");
    std::fs::create_dir(&taken).expect("a dir");
    std::fs::write(taken.join("notes.txt"), "mine").expect("a file");
    let out = init(state.path(), &taken, "ts");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(common::stderr(&out).contains("already exists and is not empty"), "{}", common::stderr(&out));
    let entries: Vec<_> =
        std::fs::read_dir(&taken).expect("the dir").map(|e| e.expect("an entry").file_name()).collect();
    assert_eq!(entries, vec![std::ffi::OsString::from("notes.txt")], "nothing was written");
    assert_eq!(std::fs::read_to_string(taken.join("notes.txt")).expect("the file"), "mine");

    let file = work.path().join("file");
    std::fs::write(&file, "x").expect("a file");
    let out = init(state.path(), &file, "js");
    assert_eq!(out.status.code(), Some(2));
    assert!(common::stderr(&out).contains("is not a directory"), "{}", common::stderr(&out));

    for bad in ["bad name", "-dash", ".hidden", "ünïcode"] {
        let out = init(state.path(), &work.path().join(bad), "ts");
        assert_eq!(out.status.code(), Some(2), "{bad}: {}", text(&out));
        assert!(common::stderr(&out).contains("invalid factory name"), "{bad}: {}", common::stderr(&out));
        assert!(!work.path().join(bad).exists(), "{bad}: nothing was created");
    }

    // An empty directory is taken.
    let empty = work.path().join("empty");
    std::fs::create_dir(&empty).expect("a dir");
    let out = init(state.path(), &empty, "js");
    assert!(out.status.success(), "{}", text(&out));
    assert!(empty.join("empty.js").is_file());
}

/// The fields of the `interface NAME {` block of `d_ts` (`readonly x: T;` or `x: T;` lines).
fn interface_fields(d_ts: &str, head: &str) -> BTreeSet<String> {
    let start = d_ts.find(head).unwrap_or_else(|| panic!("`{head}` in the declarations"));
    let body = &d_ts[start + head.len()..];
    // The block ends at the first closing brace at the start of a line (any indentation).
    let end = body.lines().take_while(|l| !l.trim_start().starts_with('}')).map(|l| l.len() + 1).sum::<usize>();
    let body = &body[..end.min(body.len())];
    body.lines()
        .map(|l| l.trim().trim_start_matches("readonly "))
        .filter_map(|l| l.split_once(':').map(|(name, _)| name.trim_end_matches('?').to_string()))
        .filter(|name| name.chars().all(|c| c.is_ascii_alphanumeric()))
        .collect()
}

#[test]
fn the_accounting_fields_are_the_hosts() {
    // Every field the host writes in an envelope's accounting is declared, in the runtime's
    // declarations and in the Node client's.
    let host: BTreeSet<String> = match serde_json::to_value(factory_host::Accounting::default()).unwrap() {
        Value::Object(fields) => fields.keys().cloned().collect(),
        other => panic!("accounting is an object: {other}"),
    };
    assert!(host.contains("cacheReadTokens") && host.contains("aiCreditsAtLeast"), "{host:?}");
    let sdk = std::fs::read_to_string(index_d_ts()).expect("index.d.ts");
    assert_eq!(interface_fields(&sdk, "export interface FactoryAccounting {"), host);
    let node =
        std::fs::read_to_string(common::root().join("clients/node/index.d.ts")).expect("clients/node/index.d.ts");
    assert_eq!(interface_fields(&node, "    accounting: {"), host);
}

/// A project in `dir` checking `files` as a Node program using the Node client
/// (`clients/node`): the scaffold's options, plus the disposable lib its session uses.
fn client_project(dir: &Path, files: &[PathBuf]) -> PathBuf {
    let config = json!({
        "extends": common::root().join("tests/ts/tsconfig.json").display().to_string(),
        "compilerOptions": { "lib": ["ES2022", "ESNext.Disposable"] },
        "files": files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>(),
        "include": [],
    });
    let path = dir.join("tsconfig.json");
    std::fs::write(&path, serde_json::to_string_pretty(&config).expect("config")).expect("writing tsconfig.json");
    path
}

#[test]
fn the_node_clients_define_factory_types_run_args_and_ctx() {
    // `defineFactory<TArgs>` types `ctx.args` (ctx is the runner's FactoryContext) and the
    // `args` of `session.factory.run(handle, ...)`; a run by name takes any JSON.
    let client = common::root().join("clients/node/index.js");
    let good = r#"import { defineFactory, joinSession } from "CLIENT";
const review = defineFactory<{ files: string[] }>({
    meta: { name: "typed", description: "args: { files: string[] }" },
    run: async (ctx) => {
        const files: string[] = ctx.args.files;
        const replies = await ctx.parallel(files.map((file) => () => ctx.agent(`Review ${file}`, { label: file })));
        return { replies };
    },
});
const session = await joinSession({ factories: [review] });
const run = await session.factory.run(review, { args: { files: ["a.ts"] } });
const byName = await session.factory.run("typed", { args: { anything: [1, "json"] } });
export const statuses: string[] = [run.status, byName.status];
"#
    .replace("CLIENT", &client.display().to_string());
    let check = |name: &str, source: &str| {
        let dir = tempfile::tempdir().expect("a temp dir");
        let file = dir.path().join(name);
        std::fs::write(&file, source).expect("writing the program");
        let out = typecheck(&client_project(dir.path(), &[file]));
        (out.status.success(), text(&out))
    };
    let (ok, output) = check("good.ts", &good);
    assert!(ok, "the typed program does not type-check:\n{output}");
    // Only the wrong line makes each of these fail, at that line.
    for (name, from, to, line, code) in [
        ("args.ts", r#"{ files: ["a.ts"] }"#, r#"{ files: "a.ts" }"#, 11, "error TS2769"),
        ("missing.ts", r#"{ args: { files: ["a.ts"] } }"#, r#"{ args: { paths: ["a.ts"] } }"#, 11, "error TS2769"),
        ("field.ts", "ctx.args.files;", "ctx.args.file;", 5, "error TS2551"),
        ("agent.ts", "ctx.agent(`Review ${file}`", "ctx.agent(42", 6, "error TS2769"),
    ] {
        let wrong = good.replace(from, to);
        assert_ne!(wrong, good, "{name}: the replacement applies");
        let (ok, output) = check(name, &wrong);
        assert!(!ok, "{name} type-checks, but it is wrong:\n{wrong}");
        let at = format!("{name}({line},");
        assert!(output.lines().any(|l| l.contains(&at) && l.contains(code)), "expected {code} at {at} in:\n{output}");
    }
}
