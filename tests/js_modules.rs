//! JavaScript modules: a factory's imports through the real JS runner and a real store, with
//! real factory directories in a temp dir. Relative static and dynamic imports (TypeScript
//! among them, import cycles), the refusal to leave the directory (`..`, a symlink, an
//! absolute path), bare specifiers from `node_modules` (package.json `exports`, `module`,
//! `main`, scoped names), a Node built-in named in the error, a CommonJS package refused,
//! caps as typed errors, resume after an imported file changed (the recorded code runs,
//! also after kill -9 mid-attempt, for a module imported dynamically),
//! and `factory run` of a factory that imports through the real binary.

mod common;

use common::counting::{Counting, Shared};
use factory_host::guests::modules::{ModuleError, MAX_MODULE_BYTES};
use factory_host::sandbox::SandboxLimits;
use factory_host::script::ScriptError;
use factory_host::{Error, Factory, Host, HostConfig, Limits, ResumeOptions, RunOptions, RunStatus};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;

fn host_at(state: Option<&Path>, backend: Arc<dyn factory_host::backend::AgentBackend>) -> Host {
    Host::new(HostConfig {
        backend,
        state_dir: state.map(Path::to_path_buf),
        sandbox: SandboxLimits::default(),
        cache_dir: Some(common::guest_target_dir().join("cache")),
        ..HostConfig::default()
    })
    .expect("host")
}

fn dry_host() -> Host {
    host_at(None, Arc::new(factory_host::backend::DryRun))
}

/// Write `files` (path relative to `dir`, text) under `dir`.
fn write(dir: &Path, files: &[(&str, &str)]) {
    for (path, text) in files {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
        std::fs::write(&path, text).expect("write");
    }
}

/// A factory module: `imports` at the top, then a factory around the `run` body.
fn factory(imports: &str, meta: &str, run: &str) -> String {
    format!("import {{ defineFactory }} from \"factory\";\n{imports}\nexport default defineFactory({{ meta: {meta}, run: {run} }});\n")
}

async fn load(host: &Host, path: &Path) -> Result<Factory, Error> {
    host.load_file(path).await
}

async fn run_ok(host: &Host, factory: &Factory) -> Value {
    let envelope = host.run(factory, RunOptions::default()).await.expect("run");
    assert_eq!(envelope.status, RunStatus::Completed, "{envelope:#?}");
    envelope.result_value().expect("a result")
}

/// The module error a load ended with (panics on success or another error).
async fn module_error(host: &Host, path: &Path) -> ModuleError {
    match load(host, path).await {
        Err(Error::Script(ScriptError::Module(e))) => e,
        Err(other) => panic!("expected a module error, got {other:?}: {other}"),
        Ok(_) => panic!("expected a module error, the factory loaded"),
    }
}

#[tokio::test]
async fn relative_static_and_dynamic_imports_resolve_inside_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        &[
            (
                "main.js",
                &factory(
                    "import { greet } from \"./lib/greet.js\";\nimport { even } from \"./cycle/a.js\";",
                    r#"{ name: "rel", description: "d" }"#,
                    r#"async (ctx) => {
                        const { late } = await import("./lib/late.js");
                        return { greet: greet("you"), late: late(), even: even(4), odd: even(3) };
                    }"#,
                ),
            ),
            (
                "lib/greet.js",
                "import { shout } from \"../shared/shout.ts\";\nexport const greet = (n) => shout(`hello ${n}`);\n",
            ),
            ("shared/shout.ts", "export const shout = (s: string): string => s.toUpperCase() + \"!\";\n"),
            ("lib/late.js", "export const late = () => \"loaded late\";\n"),
            // An import cycle: ES semantics (live bindings, each module evaluated once).
            (
                "cycle/a.js",
                "import { odd } from \"./b.js\";\nexport function even(n) { return n === 0 ? true : odd(n - 1); }\n",
            ),
            (
                "cycle/b.js",
                "import { even } from \"./a.js\";\nexport function odd(n) { return n === 0 ? false : even(n - 1); }\n",
            ),
        ],
    );
    let host = dry_host();
    let f = load(&host, &dir.path().join("main.js")).await.expect("load");
    let r = run_ok(&host, &f).await;
    assert_eq!(r, json!({ "greet": "HELLO YOU!", "late": "loaded late", "even": true, "odd": false }));
}

#[tokio::test]
async fn imports_that_leave_the_directory_are_refused() {
    let outer = tempfile::tempdir().unwrap();
    write(outer.path(), &[("secret.js", "export const secret = \"outside\";\n")]);
    let dir = outer.path().join("factory");
    let meta = r#"{ name: "esc", description: "d" }"#;
    write(&dir, &[("dotdot.js", &factory("import { secret } from \"../secret.js\";", meta, "async () => secret"))]);
    let host = dry_host();
    let e = module_error(&host, &dir.join("dotdot.js")).await;
    assert!(matches!(&e, ModuleError::Escapes { specifier, .. } if specifier == "../secret.js"), "{e:?}");
    assert!(e.to_string().contains("outside the factory's directory"), "{e}");

    // Deeper `..` from a subdirectory that climbs out is refused the same way.
    write(&dir, &[("deep.js", &factory("import { x } from \"./sub/x.js\";", meta, "async () => x"))]);
    write(&dir, &[("sub/x.js", "export { secret as x } from \"../../secret.js\";\n")]);
    let e = module_error(&host, &dir.join("deep.js")).await;
    assert!(matches!(&e, ModuleError::Escapes { .. }), "{e:?}");

    // A symlink inside the directory that points outside it.
    std::os::unix::fs::symlink(outer.path().join("secret.js"), dir.join("link.js")).unwrap();
    write(&dir, &[("via-link.js", &factory("import { secret } from \"./link.js\";", meta, "async () => secret"))]);
    let e = module_error(&host, &dir.join("via-link.js")).await;
    assert!(matches!(&e, ModuleError::Escapes { how, .. } if how.contains("symlink")), "{e:?}");
    // A symlinked directory that leads outside is refused too.
    std::os::unix::fs::symlink(outer.path(), dir.join("up")).unwrap();
    write(&dir, &[("via-dir.js", &factory("import { secret } from \"./up/secret.js\";", meta, "async () => secret"))]);
    let e = module_error(&host, &dir.join("via-dir.js")).await;
    assert!(matches!(&e, ModuleError::Escapes { .. }), "{e:?}");

    // An absolute path and a URL.
    let absolute = outer.path().join("secret.js").display().to_string();
    write(
        &dir,
        &[("abs.js", &factory(&format!("import {{ secret }} from \"{absolute}\";"), meta, "async () => secret"))],
    );
    let e = module_error(&host, &dir.join("abs.js")).await;
    assert!(matches!(&e, ModuleError::Absolute { .. }), "{e:?}");
    write(&dir, &[("url.js", &factory("import { secret } from \"file:///etc/passwd\";", meta, "async () => secret"))]);
    let e = module_error(&host, &dir.join("url.js")).await;
    assert!(matches!(&e, ModuleError::Absolute { .. }), "{e:?}");

    // A dynamic import that tries to leave fails inside the run, catchable, with the reason.
    write(
        &dir,
        &[(
            "dyn.js",
            &factory(
                "",
                meta,
                r#"async () => { try { await import("../secret.js"); return "escaped"; } catch (e) { return String(e.message ?? e); } }"#,
            ),
        )],
    );
    let f = load(&host, &dir.join("dyn.js")).await.expect("load");
    let r = run_ok(&host, &f).await;
    assert!(r.as_str().is_some_and(|m| m.contains("outside the factory's directory")), "{r}");
}

#[tokio::test]
async fn bare_specifiers_resolve_from_node_modules_beside_the_factory() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        &[
            (
                "main.js",
                &factory(
                    "import tiny, { version } from \"tiny\";\nimport { sub } from \"tiny/sub\";\nimport { scoped } from \"@acme/util\";\nimport legacy from \"legacy-esm\";",
                    r#"{ name: "bare", description: "d" }"#,
                    r#"async () => ({ tiny: tiny(), version, sub, scoped, legacy, dynamic: (await import("tiny/sub")).sub })"#,
                ),
            ),
            // `exports` with conditions: the `import` entry wins over `require`.
            (
                "node_modules/tiny/package.json",
                r#"{ "name": "tiny", "version": "1.2.3", "exports": { ".": { "require": "./cjs/index.cjs", "import": "./esm/index.js" }, "./sub": "./esm/sub.js" } }"#,
            ),
            ("node_modules/tiny/esm/index.js", "import { helper } from \"./helper.js\";\nexport const version = \"1.2.3\";\nexport default () => helper();\n"),
            ("node_modules/tiny/esm/helper.js", "export const helper = () => \"tiny!\";\n"),
            ("node_modules/tiny/esm/sub.js", "export const sub = \"sub-path\";\n"),
            ("node_modules/tiny/cjs/index.cjs", "module.exports = () => \"cjs\";\n"),
            // A scoped package with `"type": "module"` and `main`, which imports another package.
            ("node_modules/@acme/util/package.json", r#"{ "name": "@acme/util", "type": "module", "main": "lib/main.js" }"#),
            ("node_modules/@acme/util/lib/main.js", "import { sub } from \"tiny/sub\";\nexport const scoped = `scoped+${sub}`;\n"),
            // A package with a `module` entry (and a CommonJS `main` that must not be used).
            ("node_modules/legacy-esm/package.json", r#"{ "name": "legacy-esm", "main": "index.cjs", "module": "index.mjs" }"#),
            ("node_modules/legacy-esm/index.mjs", "export default \"module-field\";\n"),
        ],
    );
    let host = dry_host();
    let f = load(&host, &dir.path().join("main.js")).await.expect("load");
    let r = run_ok(&host, &f).await;
    assert_eq!(
        r,
        json!({ "tiny": "tiny!", "version": "1.2.3", "sub": "sub-path", "scoped": "scoped+sub-path", "legacy": "module-field", "dynamic": "sub-path" })
    );
    let names: Vec<String> = f.component.script.as_ref().unwrap().modules.manifest().modules.into_keys().collect();
    assert!(names.contains(&"node_modules/tiny/esm/index.js".to_string()), "{names:?}");
    assert!(names.contains(&"node_modules/@acme/util/lib/main.js".to_string()), "{names:?}");

    // A subpath the package does not export, and a package that is not there.
    write(
        dir.path(),
        &[(
            "hidden.js",
            &factory("import h from \"tiny/esm/helper.js\";", r#"{ name: "h", description: "d" }"#, "async () => h"),
        )],
    );
    let e = module_error(&host, &dir.path().join("hidden.js")).await;
    assert!(matches!(&e, ModuleError::NotExported { package, .. } if package == "tiny"), "{e:?}");
    write(
        dir.path(),
        &[(
            "missing.js",
            &factory("import m from \"nowhere\";", r#"{ name: "m", description: "d" }"#, "async () => m"),
        )],
    );
    let e = module_error(&host, &dir.path().join("missing.js")).await;
    assert!(matches!(&e, ModuleError::NotFound { .. }), "{e:?}");
    assert!(e.to_string().contains("package `nowhere`"), "{e}");
}

#[tokio::test]
async fn node_builtins_and_commonjs_packages_fail_at_load_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let meta = r#"{ name: "n", description: "d" }"#;
    write(
        dir.path(),
        &[
            ("uses-fs.js", &factory("import { readIt } from \"reads-files\";", meta, "async () => readIt()")),
            ("node_modules/reads-files/package.json", r#"{ "name": "reads-files", "type": "module", "exports": "./index.js" }"#),
            ("node_modules/reads-files/index.js", "import { readFileSync } from \"node:fs\";\nexport const readIt = () => readFileSync(\"/etc/passwd\", \"utf8\");\n"),
            ("direct.js", &factory("import { exec } from \"child_process\";", meta, "async () => exec")),
            ("sub.js", &factory("import { readFile } from \"fs/promises\";", meta, "async () => readFile")),
            ("cjs.js", &factory("import old from \"old-cjs\";", meta, "async () => old")),
            ("node_modules/old-cjs/package.json", r#"{ "name": "old-cjs", "main": "index.js" }"#),
            ("node_modules/old-cjs/index.js", "module.exports = 1;\n"),
            ("cjs-only.js", &factory("import r from \"require-only\";", meta, "async () => r")),
            ("node_modules/require-only/package.json", r#"{ "name": "require-only", "exports": { "require": "./i.cjs" } }"#),
            ("node_modules/require-only/i.cjs", "module.exports = 1;\n"),
        ],
    );
    let host = dry_host();
    let e = module_error(&host, &dir.path().join("uses-fs.js")).await;
    assert!(
        matches!(&e, ModuleError::NodeBuiltin { name, referrer, .. } if name == "fs" && referrer == "node_modules/reads-files/index.js"),
        "{e:?}"
    );
    assert!(e.to_string().contains("`fs` is a Node.js built-in module"), "{e}");
    let e = module_error(&host, &dir.path().join("direct.js")).await;
    assert!(matches!(&e, ModuleError::NodeBuiltin { name, .. } if name == "child_process"), "{e:?}");
    let e = module_error(&host, &dir.path().join("sub.js")).await;
    assert!(matches!(&e, ModuleError::NodeBuiltin { name, .. } if name == "fs"), "{e:?}");
    let e = module_error(&host, &dir.path().join("cjs.js")).await;
    assert!(matches!(&e, ModuleError::CommonJs { path, .. } if path == "node_modules/old-cjs/index.js"), "{e:?}");
    assert!(e.to_string().contains("only ES-module packages load"), "{e}");
    let e = module_error(&host, &dir.path().join("cjs-only.js")).await;
    assert!(matches!(&e, ModuleError::CommonJs { .. }), "{e:?}");
}

#[tokio::test]
async fn caps_and_sources_without_a_directory_give_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let meta = r#"{ name: "cap", description: "d" }"#;
    let big = format!("export const big = \"{}\";\n", "x".repeat(MAX_MODULE_BYTES as usize));
    write(
        dir.path(),
        &[("main.js", &factory("import { big } from \"./big.js\";", meta, "async () => big.length")), ("big.js", &big)],
    );
    let host = dry_host();
    let e = module_error(&host, &dir.path().join("main.js")).await;
    assert!(
        matches!(&e, ModuleError::TooLarge { path, limit, .. } if path == "big.js" && *limit == MAX_MODULE_BYTES),
        "{e:?}"
    );

    // An imported TypeScript module that cannot be stripped in place names its own lines.
    write(
        dir.path(),
        &[
            ("ts.js", &factory("import { E } from \"./enum.ts\";", meta, "async () => E")),
            ("enum.ts", "\nexport enum E { A }\n"),
        ],
    );
    let e = module_error(&host, &dir.path().join("ts.js")).await;
    assert!(matches!(&e, ModuleError::TypeScript(_)), "{e:?}");
    assert!(e.to_string().starts_with("enum.ts:2:"), "{e}");

    // A chain of imports deeper than the cap.
    let depth = factory_host::guests::modules::MAX_IMPORT_DEPTH as usize + 1;
    let mut files = vec![("chain.js".to_string(), factory("import { v } from \"./c/0.js\";", meta, "async () => v"))];
    for i in 0..depth {
        files.push((format!("c/{i}.js"), format!("export {{ v }} from \"./{}.js\";\n", i + 1)));
    }
    files.push((format!("c/{depth}.js"), "export const v = 1;\n".into()));
    let refs: Vec<(&str, &str)> = files.iter().map(|(p, t)| (p.as_str(), t.as_str())).collect();
    write(dir.path(), &refs);
    let e = module_error(&host, &dir.path().join("chain.js")).await;
    assert!(matches!(&e, ModuleError::TooDeep { .. }), "{e:?}");

    // One module named in endless ways: the answers are capped (each is recorded).
    let resolutions = factory_host::guests::modules::MAX_RESOLUTIONS;
    write(
        dir.path(),
        &[
            ("x.js", "export const x = 1;\n"),
            (
                "many.js",
                &factory(
                    "",
                    meta,
                    &format!(
                        r#"async () => {{
                            let loaded = 0;
                            for (let i = 0; i <= {resolutions}; i++) {{
                                try {{ await import(`./s${{i}}/../x.js`); loaded++; }}
                                catch (e) {{ return {{ loaded, error: String(e.message) }}; }}
                            }}
                            return {{ loaded }};
                        }}"#
                    ),
                ),
            ),
        ],
    );
    let f = load(&host, &dir.path().join("many.js")).await.expect("load");
    let r = run_ok(&host, &f).await;
    assert_eq!(r["loaded"], resolutions, "{r}");
    assert!(r["error"].as_str().is_some_and(|e| e.contains("at most 4096 distinct imports")), "{r}");

    // A source given as text has no directory to import from.
    let text = factory("import { x } from \"./x.js\";", meta, "async () => x");
    match host.load_script(factory_host::script::Script::new("t.js", text, None)).await {
        Err(Error::Script(ScriptError::Module(ModuleError::NoDirectory { .. }))) => {}
        other => panic!("expected NoDirectory, got {:?}", other.map(|f| f.meta.name)),
    }
}

#[tokio::test]
async fn resume_after_an_imported_file_changed_runs_the_recorded_code() {
    let state = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        &[
            (
                "main.js",
                &factory(
                    "import { tag, prompt } from \"./lib.js\";",
                    r#"{ name: "resume-mod", description: "d", limits: { maxTotalSubagents: 1 } }"#,
                    r#"async (ctx) => {
                        const first = await ctx.agent(prompt("first"), { label: "first" });
                        const second = await ctx.agent(prompt("second"), { label: "second" });
                        const { late } = await import("./late.js");
                        return { tag, late, first, second };
                    }"#,
                ),
            ),
            ("lib.js", "export const tag = \"old\";\nexport const prompt = (what) => `${what} (old code)`;\n"),
            ("late.js", "export const late = \"late-v1\";\n"),
        ],
    );
    let counting = Arc::new(Counting::default());
    let run_id = {
        let host = host_at(Some(state.path()), Arc::new(Shared(counting.clone())));
        let f = load(&host, &dir.path().join("main.js")).await.expect("load");
        let first = host.run(&f, RunOptions::default()).await.expect("run");
        assert_eq!(first.status, RunStatus::Error, "{first:#?}");
        assert_eq!(first.failure.as_ref().and_then(|f| f.kind.as_deref()), Some("maxTotalSubagents"), "{first:#?}");
        first.run_id
    };
    // The imported file changes between the attempts; so does one not imported yet.
    write(
        dir.path(),
        &[
            ("lib.js", "export const tag = \"NEW\";\nexport const prompt = (what) => `${what} (NEW code)`;\n"),
            ("late.js", "export const late = \"late-v2\";\n"),
        ],
    );
    // A new host process on the same store file.
    let host = host_at(Some(state.path()), Arc::new(Shared(counting.clone())));
    let options =
        ResumeOptions { limits: Limits { max_total_subagents: Some(10), ..Limits::default() }, ..Default::default() };
    let resumed = host.resume(&run_id, options).await.expect("resume");
    assert_eq!(resumed.status, RunStatus::Completed, "{resumed:#?}");
    let r = resumed.result_value().expect("a result");
    assert_eq!(r["tag"], "old", "the recorded lib.js ran: {r}");
    // First loaded in this attempt: read now (and recorded from now on).
    assert_eq!(r["late"], "late-v2", "{r}");
    assert_eq!(counting.calls_for("first (old code)"), 1, "replayed, not called again");
    assert_eq!(counting.calls_for("second (old code)"), 1);
    assert_eq!(counting.calls_for("second (NEW code)"), 0);
    let manifest = host.store().run_modules(&run_id).await.expect("store").expect("a module record");
    assert_eq!(manifest.modules.keys().collect::<Vec<_>>(), ["late.js", "lib.js"]);
    // The run's detail shows it, and it survives the detail's JSON round trip.
    let detail = host.detail(factory_host::DEFAULT_SESSION, &run_id).await.expect("detail");
    assert_eq!(detail.modules.as_ref(), Some(&manifest));
    let wire: factory_host::RunDetail =
        serde_json::from_value(serde_json::to_value(&detail).unwrap()).expect("round trip");
    assert_eq!(wire.modules, Some(manifest.clone()));
    let old_lib = manifest.modules["lib.js"].clone();
    let stored = host.store().blob(&old_lib).await.expect("store").expect("the recorded text");
    assert!(String::from_utf8(stored).unwrap().contains("(old code)"));

    // A fresh run of the changed directory runs the new code.
    let f = load(&host, &dir.path().join("main.js")).await.expect("load");
    let fresh = host
        .run(
            &f,
            RunOptions { limits: Limits { max_total_subagents: Some(10), ..Limits::default() }, ..Default::default() },
        )
        .await
        .expect("run");
    assert_eq!(fresh.result_value().expect("a result")["tag"], "NEW");
}

#[test]
fn cli_runs_a_factory_that_imports_and_names_a_builtin_in_its_error() {
    let state = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        &[
            (
                "main.js",
                &factory(
                    "import { twice } from \"./lib.js\";\nimport pad from \"pad\";",
                    r#"{ name: "cli-mod", description: "d" }"#,
                    "async () => pad(twice(21))",
                ),
            ),
            ("lib.js", "export const twice = (n) => n * 2;\n"),
            (
                "node_modules/pad/package.json",
                r#"{ "name": "pad", "type": "module", "exports": { "default": "./pad.js" } }"#,
            ),
            ("node_modules/pad/pad.js", "export default (n) => `[${n}]`;\n"),
            (
                "net.js",
                &factory("import net from \"node:net\";", r#"{ name: "cli-net", description: "d" }"#, "async () => 1"),
            ),
        ],
    );
    let main = dir.path().join("main.js");
    let out = common::factory_in(state.path(), &["run", main.to_str().unwrap(), "--json", "-q"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert_eq!(common::stdout_json(&out)["result"], "[42]");

    let runs = common::stdout_json(&common::factory_in(state.path(), &["runs", "--json"]));
    assert_eq!(runs.as_array().map(Vec::len), Some(1), "{runs}");
    let net = dir.path().join("net.js");
    let out = common::factory_in(state.path(), &["run", net.to_str().unwrap(), "--json", "-q"]);
    assert_eq!(out.status.code(), Some(2), "{}", common::stderr(&out));
    let err = common::stderr(&out);
    assert!(err.contains("`net` is a Node.js built-in module"), "{err}");
    let runs = common::stdout_json(&common::factory_in(state.path(), &["runs", "--json"]));
    assert_eq!(runs.as_array().map(Vec::len), Some(1), "refused before a run exists: {runs}");
}

/// Removing a script run deletes the blobs it alone used (the JS runner, the source, the
/// module texts, static and dynamic, and the manifest naming them); the next run of the same
/// file stores them again and runs.
#[tokio::test]
async fn removing_a_script_run_deletes_its_runner_source_and_modules_and_a_new_run_stores_them_again() {
    use factory_host::model::scope::Scope;
    let state = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        &[
            (
                "main.js",
                &factory(
                    "import { twice } from \"./lib.js\";",
                    r#"{ name: "gone", description: "d" }"#,
                    r#"async () => { const { late } = await import("./late.js"); return twice(late()); }"#,
                ),
            ),
            ("lib.js", "export const twice = (n) => n * 2;\n"),
            ("late.js", "export const late = () => 21;\n"),
        ],
    );
    let host = host_at(Some(state.path()), Arc::new(factory_host::backend::DryRun));
    let blobs = |usage: Option<factory_host::store::StoreUsage>| {
        usage.expect("a redb store measures itself").table("blobs").map_or(0, |t| t.entries)
    };
    let f = load(&host, &dir.path().join("main.js")).await.expect("load");
    let envelope = host.run(&f, RunOptions::default()).await.expect("run");
    assert_eq!(envelope.result_value().expect("a result"), json!(42));
    // The runner, the source, lib.js, late.js and the manifest of the static import.
    let stored = blobs(host.usage(Scope::Owner).await.expect("usage"));
    assert_eq!(stored, 5, "{stored} blobs");
    host.remove(Scope::Owner, &envelope.run_id).await.expect("remove");
    assert_eq!(blobs(host.usage(Scope::Owner).await.expect("usage")), 0, "every blob went with its one run");

    let f = load(&host, &dir.path().join("main.js")).await.expect("load again");
    let again = host.run(&f, RunOptions::default()).await.expect("run again");
    assert_eq!(again.result_value().expect("a result"), json!(42));
    assert_eq!(blobs(host.usage(Scope::Owner).await.expect("usage")), stored, "stored again");
}

#[tokio::test]
async fn a_registration_serves_the_modules_it_recorded() {
    let state = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        &[
            (
                "main.js",
                &factory(
                    "import { tag } from \"./lib.js\";",
                    r#"{ name: "registered-mod", description: "d" }"#,
                    "async () => tag",
                ),
            ),
            ("lib.js", "export const tag = \"registered\";\n"),
        ],
    );
    let host = host_at(Some(state.path()), Arc::new(factory_host::backend::DryRun));
    let f = load(&host, &dir.path().join("main.js")).await.expect("load");
    let registration = host.register(&f).await.expect("register");
    assert!(registration.script.as_ref().and_then(|s| s.modules.as_ref()).is_some(), "{registration:?}");
    write(dir.path(), &[("lib.js", "export const tag = \"edited later\";\n")]);
    let again = host.load_registered("registered-mod").await.expect("load the registration");
    assert_eq!(run_ok(&host, &again).await, json!("registered"));
}

/// Poll `factory progress` until `n` agents have finished durably (progress pages come from
/// the store, so every write queued before them is committed too).
fn wait_for_durable_agents(state: &Path, run_id: &str, n: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let out = common::factory_in(state, &["progress", run_id, "--after-seq", "0", "--limit", "1000", "--json"]);
        let finished = if out.status.success() {
            common::stdout_json(&out)
                .as_array()
                .map_or(0, |e| e.iter().filter(|e| e["event"] == "agentFinished").count())
        } else {
            0
        };
        if finished >= n {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "no agent finished durably: {}", common::stderr(&out));
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn cli_kill_9_after_a_dynamic_import_then_resume_runs_the_recorded_module() {
    let state = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let rules = state.path().join("slow.json");
    std::fs::write(&rules, r#"{"rules":[{"labelPrefix":"t:","reply":{"text":"ok"},"latencyMs":40}]}"#).unwrap();
    let backend = format!("script:{}", rules.display());
    write(
        dir.path(),
        &[
            (
                "main.js",
                &factory(
                    "",
                    r#"{ name: "kill-mod", description: "d", limits: { maxConcurrentSubagents: 4 } }"#,
                    r#"async (ctx) => {
                        const { tag } = await import("./lib.js");
                        const r = await ctx.parallel(Array.from({ length: 120 }, (_, i) => () => ctx.agent(`item ${i}`, { label: `t:${i}` })));
                        return { done: r.filter((v) => v !== null).length, tag };
                    }"#,
                ),
            ),
            ("lib.js", "export const tag = \"before the kill\";\n"),
        ],
    );
    let main = dir.path().join("main.js");
    let mut child =
        common::factory_cmd(state.path(), &["run", main.to_str().unwrap(), "--backend", &backend, "--json", "-q"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("factory run starts");
    let run_id = loop {
        let out = common::factory_in(state.path(), &["runs", "--json"]);
        let first = out
            .status
            .success()
            .then(|| common::stdout_json(&out))
            .and_then(|r| r.as_array().and_then(|r| r.first()).cloned());
        if let Some(run) = first {
            break run["runId"].as_str().expect("a run id").to_string();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    // The module was imported before any agent started: once agents finished durably, its
    // record is committed too.
    wait_for_durable_agents(state.path(), &run_id, 8);
    child.kill().expect("SIGKILL");
    child.wait().unwrap();

    write(dir.path(), &[("lib.js", "export const tag = \"edited after the kill\";\n")]);
    let out = common::factory_in(state.path(), &["resume", &run_id, "--backend", &backend, "--json", "-q"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert_eq!(common::stdout_json(&out)["result"], json!({ "done": 120, "tag": "before the kill" }));
}
