//! Script factories: a factory written in JavaScript (or TypeScript, type-stripped here) is
//! run by the built-in JS runner component ([`RUNNER`], world `agent:factory/script-runner`,
//! the prebuilt `guest-sdk/js-runner/js-runner.component.wasm` that this crate's build script
//! embeds; `cargo xtask js-runner` rebuilds it from source) with the factory's source
//! given to it through the `script` import. A loaded script factory is the runner's
//! loaded component plus a [`Script`].
//!
//! The source is part of a run's identity: every attempt records the runner's sha256 and a
//! [`ScriptRef`] (the source's sha256, its file name and entry); the source text is stored
//! content-addressed like component bytes, so `resume` runs exactly the recorded source.
//! The modules it imports are [`crate::guests::modules`]'s: recorded with each run too.

use crate::guests::modules::{Manifest, ModuleError, ModuleSet};
use sha2::{Digest, Sha256};
use std::path::Path;
use std::sync::Arc;

/// The JS runner component (the committed prebuilt, checked against its sources at build time).
pub static RUNNER: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/js-runner.component.wasm"));

/// How the JS runner's `run` error says that the factory's result is not plain JSON (an
/// accessor, a hidden property, an extra key on an array, a class instance...): the message
/// after this mark (the runner's `INVALID_RESULT_MARK`; none of its other errors start
/// with it).
const INVALID_RESULT_MARK: char = '\u{1}';

/// What the JS runner's `run` error means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RunnerError {
    /// The factory's result is not plain JSON (failure type `invalid_result`).
    InvalidResult(String),
    /// The body threw, or the runner failed (failure type `guest_error`).
    Thrown(String),
}

/// Decode the JS runner's `run` error.
pub(crate) fn runner_error(message: String) -> RunnerError {
    match message.strip_prefix(INVALID_RESULT_MARK) {
        Some(rest) => RunnerError::InvalidResult(rest.to_string()),
        None => RunnerError::Thrown(message),
    }
}

/// File extensions run as JavaScript modules.
pub const JS_EXTENSIONS: &[&str] = &["js", "mjs"];
/// File extensions type-stripped to JavaScript first.
pub const TS_EXTENSIONS: &[&str] = &["ts", "mts"];

/// The largest script source the host reads (a file, an authored body): 8 MiB. A factory
/// is one module of source, not a bundle of data.
pub const MAX_SOURCE_BYTES: u64 = 8 << 20;

/// A script factory's source, as the runner gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Script {
    /// The name stack traces and errors show (`review-changed.js`).
    pub file_name: String,
    /// The source text as written (TypeScript for a `.ts`/`.mts` file): what a run records.
    pub text: Arc<str>,
    /// sha256 of `text` (hex): the source's identity and its blob key in the store.
    pub hash: String,
    /// The JavaScript module the runner runs: `text` itself, or `text` type-stripped in
    /// place (same lines and columns) for TypeScript.
    pub js: Arc<str>,
    /// Which factory of the file (`file.js#name`); `None`: its default export or only one.
    pub entry: Option<String>,
    /// The modules it imports: resolved in its file's directory (none for a source given
    /// as text), loaded once, and recorded with each run.
    pub modules: Arc<ModuleSet>,
}

pub use crate::model::script::ScriptRef;

/// Why a script cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    /// The file could not be read.
    #[error("cannot read `{path}`: {source}")]
    Read { path: String, source: std::io::Error },
    /// The file is not UTF-8 text.
    #[error("`{0}` is not UTF-8 text")]
    NotText(String),
    /// The source is larger than [`MAX_SOURCE_BYTES`].
    #[error("`{path}` is {bytes} bytes, over the {limit} byte limit of a script source")]
    TooLarge { path: String, bytes: u64, limit: u64 },
    /// TypeScript that could not be type-stripped (`file:line:col: message`).
    #[error(transparent)]
    TypeScript(#[from] crate::guests::typescript::StripError),
    /// The runner refused the source: a syntax error (`file:line:col`), no factory in the
    /// file, an unknown `#name`, a bad meta.
    #[error("{0}")]
    Invalid(String),
    /// A module it imports cannot be loaded (outside its directory, a Node built-in, a
    /// CommonJS package, a cap reached, ...).
    #[error(transparent)]
    Module(#[from] ModuleError),
    /// The authoring form is malformed.
    #[error("authoring: {0}")]
    Authoring(String),
    /// An authored factory's document is not JSON.
    #[error("authoring: not JSON: {0}")]
    AuthoringJson(#[source] serde_json::Error),
}

impl Script {
    /// A script from its JavaScript text (whatever the file name says; see
    /// [`Script::from_source`] for TypeScript).
    pub fn new(file_name: impl Into<String>, text: impl Into<Arc<str>>, entry: Option<String>) -> Self {
        let text = text.into();
        let hash = hex::encode(Sha256::digest(text.as_bytes()));
        let file_name = file_name.into();
        let modules = Arc::new(ModuleSet::none(file_name.clone()));
        Script { js: text.clone(), file_name, text, hash, entry, modules }
    }

    /// A script from its source text, by its file name: a `.ts`/`.mts` name is TypeScript,
    /// type-stripped here ([`ScriptError::TypeScript`] with `file:line:col` when it cannot
    /// be); anything else is JavaScript. The source as written is what a run records (its
    /// sha256 is the script's identity), so `resume` and stack traces see the `.ts` file.
    pub fn from_source(
        file_name: impl Into<String>,
        text: impl Into<Arc<str>>,
        entry: Option<String>,
    ) -> Result<Self, ScriptError> {
        let file_name = file_name.into();
        let text = text.into();
        if text.len() as u64 > MAX_SOURCE_BYTES {
            return Err(ScriptError::TooLarge { path: file_name, bytes: text.len() as u64, limit: MAX_SOURCE_BYTES });
        }
        let mut script = Script::new(file_name, text, entry);
        if is_typescript(Path::new(&script.file_name)) {
            script.js = crate::guests::typescript::strip(&script.file_name, &script.text)?.into();
        }
        Ok(script)
    }

    /// What a run records of it.
    pub fn reference(&self) -> ScriptRef {
        let modules = (!self.modules.is_empty()).then(|| manifest_hash(&self.modules.manifest()));
        ScriptRef { sha256: self.hash.clone(), file_name: self.file_name.clone(), entry: self.entry.clone(), modules }
    }

    /// The same script with `modules` as its module set.
    pub fn with_modules(&self, modules: ModuleSet) -> Self {
        Script { modules: Arc::new(modules), ..self.clone() }
    }

    /// Read a `.js`/`.mjs` file (or a `.ts`/`.mts` file, type-stripped).
    pub fn read(path: &Path, entry: Option<String>) -> Result<Self, ScriptError> {
        let shown = path.display().to_string();
        let read = |source| ScriptError::Read { path: shown.clone(), source };
        let file = std::fs::File::open(path).map_err(read)?;
        let size = file.metadata().map_err(read)?.len();
        if size > MAX_SOURCE_BYTES {
            return Err(ScriptError::TooLarge { path: shown, bytes: size, limit: MAX_SOURCE_BYTES });
        }
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::Read::take(file, MAX_SOURCE_BYTES + 1), &mut bytes).map_err(read)?;
        if bytes.len() as u64 > MAX_SOURCE_BYTES {
            return Err(ScriptError::TooLarge { path: shown, bytes: bytes.len() as u64, limit: MAX_SOURCE_BYTES });
        }
        let text = String::from_utf8(bytes).map_err(|_| ScriptError::NotText(shown.clone()))?;
        let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or(shown);
        let mut script = Script::from_source(file_name, text, entry)?;
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        script.modules = Arc::new(ModuleSet::in_dir(dir, script.file_name.clone()));
        Ok(script)
    }
}

/// The blob key of a module manifest: the sha256 of its JSON.
pub fn manifest_hash(manifest: &Manifest) -> String {
    hex::encode(Sha256::digest(manifest_json(manifest)))
}

/// A module manifest as stored (JSON).
pub fn manifest_json(manifest: &Manifest) -> Vec<u8> {
    serde_json::to_vec(manifest).unwrap_or_default()
}

/// Is `path` a script factory (by extension)?
pub fn is_script(path: &Path) -> bool {
    extension_in(path, JS_EXTENSIONS) || is_typescript(path)
}

fn is_typescript(path: &Path) -> bool {
    extension_in(path, TS_EXTENSIONS)
}

fn extension_in(path: &Path, set: &[&str]) -> bool {
    path.extension().and_then(|e| e.to_str()).is_some_and(|e| set.contains(&e))
}

/// Split `file.js#name` into the file and the factory name (`None` without a `#` or when
/// the part before it is not a script file name).
pub fn split_entry(target: &str) -> (&str, Option<&str>) {
    match target.rsplit_once('#') {
        Some((file, name)) if !name.is_empty() && is_script(Path::new(file)) => (file, Some(name)),
        _ => (target, None),
    }
}

/// The authoring form: `meta` (JSON) and a `run` body that is one self-contained async
/// function expression (`async (ctx) => { ... }` or `async ({ args, agent }) => ...`).
/// Returns the module that defines it: `run` keeps its line numbers (the generated prefix
/// sits on the body's first line), the file name is `<name>.js`.
pub fn author(meta: &serde_json::Value, run: &str) -> Result<Script, ScriptError> {
    let name = meta
        .get("name")
        .and_then(|n| n.as_str())
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ScriptError::Authoring("meta.name must be a non-empty string".into()))?;
    let body = run.trim_end().trim_end_matches(';').trim_end();
    if body.trim().is_empty() {
        return Err(ScriptError::Authoring("the run body is empty".into()));
    }
    let file_name = format!("{}.js", name.replace(['/', '\\', '#'], "_"));
    let text = format!(
        "import {{ defineFactory }} from \"factory\"; export default defineFactory({{ meta: {meta}, run: ({body}\n) }});\n"
    );
    Ok(Script::new(file_name, text, None))
}

/// The authoring form as one JSON document: `{ "meta": {...}, "run": "async (ctx) => ..." }`.
pub fn author_document(document: &str) -> Result<Script, ScriptError> {
    let value: serde_json::Value = serde_json::from_str(document).map_err(ScriptError::AuthoringJson)?;
    let meta = value.get("meta").ok_or_else(|| ScriptError::Authoring("the document has no `meta`".into()))?;
    let run = value
        .get("run")
        .and_then(|r| r.as_str())
        .ok_or_else(|| ScriptError::Authoring("the document has no `run` string".into()))?;
    author(meta, run)
}
