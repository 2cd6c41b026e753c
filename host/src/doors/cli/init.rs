//! `factory init NAME --lang ts|js|rust|python`: scaffolds a new factory in the directory
//! NAME — a factory that runs as it is (meta with phases, limits and an args schema; a
//! `parallel`, `pipeline` and `step` body) and a README, in the language's own layout:
//! - TypeScript / JavaScript: `NAME.ts` or `NAME.js`, the runtime's type declarations
//!   (`guest-sdk/js`, embedded in the binary and written to `types/`), a strict
//!   `tsconfig.json` that maps the runtime's module names to them (so type-checking needs no
//!   network and no package of ours on npm), a `package.json` with a `typecheck` script,
//!   and `NAME.test.mjs` (`npm test`: `node --test`);
//! - Rust: a crate (`Cargo.toml`, `src/lib.rs`, a workspace of its own) whose `factory-sdk`
//!   is a path dependency on the SDK of the checkout this binary was built from (or `--sdk
//!   DIR`), and `tests/factory.rs` (`cargo test`);
//! - Python: a project directory with an `app.py` (the SDK ships inside the binary) and
//!   `test_factory.py` (`python3 -m unittest`).
//!
//! Every scaffold has a test, `NAME.test.json`, whose cassette `init` records on the
//! dry-run backend, and that test in the language's own runner: it runs `factory test` on
//! the directory.
//!
//! It never overwrites: an existing non-empty directory or file is refused.

use crate::doors::args::GlobalArgs;
use crate::doors::cli::testing;
use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The TypeScript compiler a scaffold's `package.json` pins: the one `tests/js_types.rs`
/// type-checks the scaffolds and examples with (`tests/ts/package.json`).
pub const TYPESCRIPT_VERSION: &str = "7.0.2";

/// The runtime's declarations (`import ... from "factory"` and its aliases).
const INDEX_D_TS: &str = include_str!("../../../../guest-sdk/js/index.d.ts");
/// The runner's global scope (console, timers, AbortController, ...), referenced by it.
const GLOBALS_D_TS: &str = include_str!("../../../../guest-sdk/js/globals.d.ts");

/// The longest factory name `init` takes (meta names may be up to 128 bytes).
const MAX_NAME_BYTES: usize = 64;

/// The Rust SDK of the checkout this binary was built from: a Rust scaffold's default
/// `factory-sdk` path dependency.
const BUILT_SDK_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../guest-sdk/rust");

/// A Rust factory's source (`src/lib.rs`).
const RUST_TEMPLATE: &str = include_str!("../../../templates/init/lib.rs.tmpl");
/// A Python factory's source (`app.py`).
const PYTHON_TEMPLATE: &str = include_str!("../../../templates/init/app.py.tmpl");
/// The scaffold's test file (`NAME.test.json`, run by `factory test`).
const TEST_TEMPLATE: &str = include_str!("../../../templates/init/test.json.tmpl");
/// The test in Node's own runner (`NAME.test.mjs`, `node --test`) that runs `factory test`.
const NODE_TEST_TEMPLATE: &str = include_str!("../../../templates/init/node.test.mjs.tmpl");
/// The test in Python's own runner (`test_factory.py`, `python3 -m unittest`).
const PYTHON_TEST_TEMPLATE: &str = include_str!("../../../templates/init/test_factory.py.tmpl");
/// The test in Cargo's own runner (`tests/factory.rs`, `cargo test`).
const RUST_TEST_TEMPLATE: &str = include_str!("../../../templates/init/factory_test.rs.tmpl");
/// A TypeScript factory's head (comment, imports, schemas), before [`SCRIPT_BODY_TEMPLATE`].
const TS_TEMPLATE: &str = include_str!("../../../templates/init/factory.ts.tmpl");
/// A JavaScript factory's head (JSDoc types), before [`SCRIPT_BODY_TEMPLATE`].
const JS_TEMPLATE: &str = include_str!("../../../templates/init/factory.js.tmpl");
/// What a TypeScript and a JavaScript factory share: `meta` and `run` (`{{generic}}` and
/// `{{run_doc}}` are the two places their typing differs).
const SCRIPT_BODY_TEMPLATE: &str = include_str!("../../../templates/init/factory-body.js.tmpl");
/// The JSDoc that types a JavaScript factory's `run` parameter.
const JS_RUN_DOC: &str = "    /** @param {import(\"@github/copilot-sdk/extension\").FactoryContext<Args>} ctx */\n";

/// `factory init`: where to scaffold, and in which language.
#[derive(Args)]
pub struct InitArgs {
    /// The directory to create (its last component is the factory's name: letters, digits,
    /// `-`, `_`, `.`, starting with a letter or digit; for Rust, a letter first and no `.`).
    path: PathBuf,
    /// The factory's language.
    #[arg(long, value_enum, default_value_t = Lang::Ts)]
    lang: Lang,
    /// Rust only: the `factory-sdk` crate directory the scaffold depends on (default: the
    /// `guest-sdk/rust` of the checkout this binary was built from).
    #[arg(long, value_name = "DIR")]
    sdk: Option<PathBuf>,
}

/// The languages `init` scaffolds.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Lang {
    /// TypeScript (`NAME.ts`, type-stripped when it runs).
    Ts,
    /// JavaScript (`NAME.js`, type-checked through `// @ts-check` and JSDoc).
    Js,
    /// Rust (a crate: `Cargo.toml` and `src/lib.rs`, built by `factory run DIR`).
    Rust,
    /// Python (a project directory with an `app.py`, built with componentize-py).
    Python,
}

impl Lang {
    fn title(self) -> &'static str {
        match self {
            Lang::Ts => "TypeScript",
            Lang::Js => "JavaScript",
            Lang::Rust => "Rust",
            Lang::Python => "Python",
        }
    }
}

/// Why `init` refuses.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// The name does not make a factory name, a file name and a package name.
    #[error(
        "invalid factory name `{0}`: use at most {max} letters, digits, `-`, `_` and `.`, starting with a letter or digit",
        max = MAX_NAME_BYTES
    )]
    Name(String),
    /// The target exists and holds something: `init` never overwrites.
    #[error("{0} already exists and is not empty: choose a new directory (init never overwrites)")]
    NotEmpty(PathBuf),
    /// The target exists and is not a directory.
    #[error("{0} already exists and is not a directory")]
    NotADirectory(PathBuf),
    /// The name is not a Cargo package name.
    #[error("invalid Rust factory name `{0}`: a Cargo package name starts with a letter and has no `.`")]
    RustName(String),
    /// The Rust SDK is not where the scaffold would point.
    #[error("the Rust SDK (factory-sdk) is not at {0}: pass --sdk DIR (a checkout's guest-sdk/rust)")]
    NoSdk(PathBuf, #[source] std::io::Error),
}

/// Check `name` as `init` needs it: a valid meta name, file name and npm package name.
pub fn check_name(name: &str) -> Result<(), InitError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(InitError::Name(name.to_string()))
    }
}

/// The files of a new factory `name` in `lang`: (relative path, contents). `sdk` is the
/// `factory-sdk` directory a Rust scaffold depends on.
pub fn scaffold(name: &str, lang: Lang, sdk: &Path) -> Vec<(String, String)> {
    let mut files = language_files(name, lang, sdk);
    let factory = match lang {
        Lang::Ts | Lang::Js => files[0].0.clone(),
        Lang::Rust | Lang::Python => ".".to_string(),
    };
    let test = TEST_TEMPLATE.replace("{{name}}", name).replace("{{factory}}", &factory);
    files.push((test_file_name(name), test));
    files
}

/// The scaffold's test file.
fn test_file_name(name: &str) -> String {
    format!("{name}.test.json")
}

/// The files of the language's own layout.
fn language_files(name: &str, lang: Lang, sdk: &Path) -> Vec<(String, String)> {
    let readme = |template: &str, file: &str| template.replace("{{name}}", name).replace("{{file}}", file);
    match lang {
        Lang::Ts | Lang::Js => script_scaffold(name, lang),
        Lang::Rust => {
            let package = name.to_ascii_lowercase();
            let sdk = toml::Value::String(sdk.display().to_string());
            let manifest = RUST_MANIFEST.replace("{{package}}", &package).replace("{{sdk}}", &sdk.to_string());
            vec![
                ("src/lib.rs".into(), RUST_TEMPLATE.replace("{{name}}", name)),
                ("Cargo.toml".into(), manifest),
                ("tests/factory.rs".into(), RUST_TEST_TEMPLATE.replace("{{name}}", name)),
                ("README.md".into(), readme(RUST_README, "src/lib.rs")),
                (".gitignore".into(), "target/\n".into()),
            ]
        }
        Lang::Python => vec![
            ("app.py".into(), PYTHON_TEMPLATE.replace("{{name}}", name)),
            ("test_factory.py".into(), PYTHON_TEST_TEMPLATE.replace("{{name}}", name)),
            ("README.md".into(), readme(PYTHON_README, "app.py")),
        ],
    }
}

/// A JavaScript or TypeScript scaffold.
fn script_scaffold(name: &str, lang: Lang) -> Vec<(String, String)> {
    let ext = if lang == Lang::Ts { "ts" } else { "js" };
    let file = format!("{name}.{ext}");
    let (head, generic, run_doc) = match lang {
        Lang::Ts => (TS_TEMPLATE, "<Args>", ""),
        _ => (JS_TEMPLATE, "", JS_RUN_DOC),
    };
    let body = SCRIPT_BODY_TEMPLATE.replace("{{generic}}", generic).replace("{{run_doc}}", run_doc);
    let source = format!("{head}{body}").replace("{{name}}", name).replace("{{file}}", &file);
    let package = serde_json::json!({
        "name": name.to_ascii_lowercase(),
        "private": true,
        "type": "module",
        "description": format!("The factory `{name}` (run it with `factory run {file}`)"),
        "scripts": {
            "typecheck": "tsc -p .",
            "start": format!("factory run {file}"),
            "test": "node --test",
        },
        "devDependencies": { "typescript": TYPESCRIPT_VERSION },
    });
    let readme = README_TEMPLATE.replace("{{name}}", name).replace("{{file}}", &file);
    vec![
        (file, source),
        ("types/factory.d.ts".into(), INDEX_D_TS.to_string()),
        ("types/globals.d.ts".into(), GLOBALS_D_TS.to_string()),
        ("tsconfig.json".into(), TSCONFIG.to_string()),
        (format!("{name}.test.mjs"), NODE_TEST_TEMPLATE.replace("{{name}}", name)),
        ("package.json".into(), format!("{}\n", serde_json::to_string_pretty(&package).unwrap_or_default())),
        ("README.md".into(), readme),
        (".gitignore".into(), "node_modules/\n".into()),
    ]
}

/// The SDK directory a Rust scaffold depends on: `--sdk`, else the built-in checkout's,
/// made absolute (the scaffold may live anywhere).
fn sdk_dir(chosen: Option<&Path>) -> Result<PathBuf, InitError> {
    let dir = chosen.map_or_else(|| PathBuf::from(BUILT_SDK_DIR), Path::to_path_buf);
    let dir = std::fs::canonicalize(&dir).map_err(|e| InitError::NoSdk(dir.clone(), e))?;
    match std::fs::metadata(dir.join("Cargo.toml")) {
        Ok(_) => Ok(dir),
        Err(e) => Err(InitError::NoSdk(dir, e)),
    }
}

/// `factory init`: write the files, then record the test's cassette on the dry-run backend
/// (building a Rust or Python factory first), so `factory test DIR` passes at once.
pub async fn init(g: &GlobalArgs, a: InitArgs) -> Result<ExitCode> {
    let name = a.path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
    check_name(&name)?;
    let sdk = if a.lang == Lang::Rust {
        if !name.starts_with(|c: char| c.is_ascii_alphabetic()) || name.contains('.') {
            return Err(InitError::RustName(name).into());
        }
        sdk_dir(a.sdk.as_deref())?
    } else {
        PathBuf::new()
    };
    prepare_dir(&a.path)?;
    let files = scaffold(&name, a.lang, &sdk);
    for (relative, contents) in &files {
        let path = a.path.join(relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        // `create_new`: a file that appeared meanwhile is never overwritten.
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        out.write_all(contents.as_bytes()).with_context(|| format!("writing {}", path.display()))?;
    }
    let dir = a.path.display();
    outln!("created {dir}/ ({} factory `{name}`):", a.lang.title());
    for (relative, _) in &files {
        outln!("  {relative}");
    }
    let cassette = format!("{name}.cassette.jsonl");
    outln!("recording {dir}/{cassette} for {dir}/{} on the dry-run backend:", test_file_name(&name));
    if let Err(e) = testing::record_scaffold(g, &a.path.join(test_file_name(&name))).await {
        eprintln!(
            "factory: no cassette recorded ({e:#}); once the factory builds, record it with: factory test --update --backend dry-run {dir}"
        );
    }
    outln!();
    let target = match a.lang {
        Lang::Ts | Lang::Js => format!("{dir}/{}", files[0].0),
        Lang::Rust | Lang::Python => dir.to_string(),
    };
    // A bare name is a registered factory: a relative path needs `./`.
    let target = if target.starts_with('/') || target.starts_with('.') { target } else { format!("./{target}") };
    outln!("  factory run {target} --args '{{\"topic\":\"release notes\"}}'");
    match a.lang {
        Lang::Ts | Lang::Js => {
            outln!("  cd {dir} && npm install && npm run typecheck   # TypeScript {TYPESCRIPT_VERSION}, types offline")
        }
        Lang::Rust => outln!("  # factory-sdk: {}", sdk.display()),
        Lang::Python => outln!(
            "  # needs componentize-py {} and bwrap to build",
            factory_host::guests::python::COMPONENTIZE_PY_VERSION
        ),
    }
    let test_dir = if dir.to_string().starts_with(['/', '.']) { dir.to_string() } else { format!("./{dir}") };
    outln!("  factory test {test_dir}                  # replays {cassette}; --update re-records what changed");
    Ok(ExitCode::SUCCESS)
}

/// Create `dir`, or accept it when it is an empty directory.
fn prepare_dir(dir: &Path) -> Result<()> {
    match std::fs::symlink_metadata(dir) {
        Ok(meta) if meta.is_dir() => {
            let mut entries = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
            if entries.next().is_some() {
                return Err(InitError::NotEmpty(dir.to_path_buf()).into());
            }
            Ok(())
        }
        Ok(_) => Err(InitError::NotADirectory(dir.to_path_buf()).into()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
        }
        Err(e) => Err(e).with_context(|| format!("reading {}", dir.display())),
    }
}

/// Strict, no emit, the runner's language level, and the runtime's module names mapped to
/// the declarations in `types/` (`paths`: no package needed). `verbatimModuleSyntax` and
/// `erasableSyntaxOnly` reject what the type stripper cannot erase in place (a type imported
/// without `import type`, `enum`, `namespace`, parameter properties).
const TSCONFIG: &str = r#"{
  "compilerOptions": {
    "strict": true,
    "noEmit": true,
    "target": "ES2022",
    "module": "ES2022",
    "moduleResolution": "bundler",
    "lib": ["ES2022"],
    "types": [],
    "allowJs": true,
    "checkJs": true,
    "verbatimModuleSyntax": true,
    "erasableSyntaxOnly": true,
    "skipLibCheck": false,
    "paths": {
      "factory": ["./types/factory.d.ts"],
      "@github/copilot-sdk/extension": ["./types/factory.d.ts"],
      "@github/copilot-sdk": ["./types/factory.d.ts"]
    }
  },
  "include": ["**/*.ts", "**/*.js"],
  "exclude": ["node_modules"]
}
"#;

const README_TEMPLATE: &str = r#"# {{name}}

A factory for `factory` (scaffolded by `factory init`).

```sh
factory run {{file}} --args '{"topic":"release notes"}'   # the dry-run backend by default
factory run {{file}} --backend openai --args '{"topic":"release notes"}'
factory add {{file}} && factory run {{name}}
npm install && npm run typecheck                          # the pinned TypeScript compiler
factory test .                                            # {{name}}.test.json against {{name}}.cassette.jsonl
factory test . --update --backend openai                  # after an edit: record the calls that changed
npm test                                                  # {{name}}.test.mjs: `factory test .` in node --test
```

`{{name}}.test.json` is the factory's test: args, the expected status, assertions on the
result, accounting and journal; `factory test` runs it with every agent call replayed from
`{{name}}.cassette.jsonl` (recorded by `factory init` on the dry-run backend: delete it and
run `factory test --update --backend SPEC` to record it against a real model).

`types/` holds the declarations of the runtime the factory imports (`"factory"`,
`"@github/copilot-sdk/extension"`, `"@github/copilot-sdk"`): `tsconfig.json` maps those names
to it, so type-checking works offline. The factory's globals are the runner's (console,
timers, `AbortController`, `TextEncoder`, `URL`, ...): no DOM, no Node built-ins.
"#;

/// A Rust scaffold's manifest: a `cdylib` with a workspace of its own (so a scaffold inside
/// another workspace's tree is not taken for a member of it).
const RUST_MANIFEST: &str = r#"[package]
name = "{{package}}"
version = "0.1.0"
edition = "2021"
publish = false

[lib]
crate-type = ["cdylib"]
# `cargo test` runs tests/factory.rs (`factory test` on this crate), not the guest's code natively.
test = false

[dependencies]
# The Rust guest SDK, from the checkout `factory` was built from (`factory init --sdk DIR`
# chooses another; a git dependency on the repository works too).
factory-sdk = { path = {{sdk}} }
serde = { version = "1", features = ["derive"] }

# A workspace of its own: never a member of an enclosing one.
[workspace]
"#;

const RUST_README: &str = r#"# {{name}}

A Rust factory for `factory` (scaffolded by `factory init --lang rust`): `{{file}}`.

```sh
factory run ./{{name}} --args '{"topic":"release notes"}'   # builds the crate, then runs it (dry-run backend)
factory run ./{{name}} --backend openai --args '{"topic":"release notes"}'
factory build ./{{name}}                                    # just the component
factory add ./{{name}} && factory run {{name}}
factory test ./{{name}}                                     # {{name}}.test.json against {{name}}.cassette.jsonl
cd {{name}} && cargo test                                   # tests/factory.rs: `factory test` in Cargo's runner
```

`{{name}}.test.json` is the factory's test (see `factory test --help`); its cassette was
recorded by `factory init` on the dry-run backend (`factory test --update --backend SPEC`
records what an edit changed).

`Cargo.toml` depends on `factory-sdk` by path (the SDK of the checkout `factory` was built
from, or the one given to `factory init --sdk DIR`). The crate is built for
`wasm32-unknown-unknown` (`rustup target add wasm32-unknown-unknown`).
"#;

const PYTHON_README: &str = r#"# {{name}}

A Python factory for `factory` (scaffolded by `factory init --lang python`): `{{file}}`.

```sh
factory run ./{{name}} --args '{"topic":"release notes"}'   # builds with componentize-py, then runs it (dry-run backend)
factory run ./{{name}} --backend openai --args '{"topic":"release notes"}'
factory add ./{{name}} && factory run {{name}}
factory test ./{{name}}                                     # {{name}}.test.json against {{name}}.cassette.jsonl
cd {{name}} && python3 -m unittest                          # test_factory.py: `factory test` in unittest
```

`{{name}}.test.json` is the factory's test (see `factory test --help`); its cassette was
recorded by `factory init` on the dry-run backend (`factory test --update --backend SPEC`
records what an edit changed).

The `factory_sdk` module ships inside `factory`; building needs `componentize-py` on PATH
(`pip install componentize-py`) and bubblewrap (`bwrap`).
"#;
