//! The modules a script factory imports: resolution of a specifier to a file of the
//! factory's directory, reading it (bounded, type-stripped for TypeScript), and the record
//! of what a run loaded, so a resume runs the same code.
//!
//! A factory read from a file has a directory: the file's own (its *root*). Everything it
//! imports is a file under the root, opened through [`cap_std`] relative to it, so neither
//! `..`, an absolute path nor a symlink leads outside; a specifier that tries is refused
//! with [`ModuleError::Escapes`]. Relative specifiers (`./lib.js`, `../x.ts`) resolve
//! against the importing module; bare ones (`pkg`, `pkg/sub.js`, `@scope/pkg`) from a
//! `node_modules` directory beside the importing module or above it, never above the
//! root, with Node's rules for `package.json` (`exports`: a string, `"."`, subpaths, `*`
//! patterns and the `import`/`module`/`default` conditions; then `module`, then `main`).
//! Only ES modules load: a CommonJS package and a Node built-in (`fs`, `node:fs`, ...) are
//! refused by name. Module names are paths relative to the root (`lib/util.js`,
//! `node_modules/pkg/index.js`), which is also what stack traces show.
//!
//! A [`ModuleSet`] answers each (referrer, specifier) once and reads each file once: the
//! first answer is the module for the rest of the set's life. A run gets its own set
//! ([`ModuleSet::for_run`]) that writes every module it loads to the store as it loads it
//! (the text as a content-addressed blob, the [`Manifest`] under the run's id; bounded by
//! [`MAX_MODULES`], [`MAX_TOTAL_MODULE_BYTES`] and [`MAX_RESOLUTIONS`]), and a
//! resumed run starts from that record ([`ModuleSet::recorded`]): a recorded module is
//! served as recorded, never read again; one no attempt loaded yet is read then.

use crate::store::{Store, StoreError};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Modules one factory may load, the entry not counted.
pub const MAX_MODULES: usize = 256;
/// The largest module file (JavaScript; TypeScript is held to the type stripper's cap).
pub const MAX_MODULE_BYTES: u64 = 2 << 20;
/// All modules of one factory together, the entry not counted.
pub const MAX_TOTAL_MODULE_BYTES: u64 = 16 << 20;
/// The longest chain of imports from the entry (the entry is depth 0).
pub const MAX_IMPORT_DEPTH: u32 = 64;
/// Distinct (referrer, specifier) pairs one factory may resolve: `./a.js`, `././a.js`, ...
/// name one module in endless ways, and every answer is recorded.
pub const MAX_RESOLUTIONS: usize = 4096;
/// The longest specifier resolved.
pub const MAX_SPECIFIER_BYTES: usize = 1024;
/// The largest `package.json` read.
pub const MAX_PACKAGE_JSON_BYTES: u64 = 256 << 10;

/// The conditions of `package.json` `exports` this host matches, in Node's sense: an ES
/// module import (`import`), the bundlers' ES-module entry (`module`), and `default`.
const CONDITIONS: &[&str] = &["import", "module", "default"];

/// Node's built-in modules (a bare specifier whose first segment is one of these, or any
/// `node:` specifier, names a built-in, as in Node, where built-ins win over packages).
const NODE_BUILTINS: &[&str] = &[
    "assert",
    "async_hooks",
    "buffer",
    "child_process",
    "cluster",
    "console",
    "constants",
    "crypto",
    "dgram",
    "diagnostics_channel",
    "dns",
    "domain",
    "events",
    "fs",
    "http",
    "http2",
    "https",
    "inspector",
    "module",
    "net",
    "os",
    "path",
    "perf_hooks",
    "process",
    "punycode",
    "querystring",
    "readline",
    "repl",
    "stream",
    "string_decoder",
    "sys",
    "timers",
    "tls",
    "trace_events",
    "tty",
    "url",
    "util",
    "v8",
    "vm",
    "wasi",
    "worker_threads",
    "zlib",
];

/// Why a module cannot be imported.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ModuleError {
    /// The factory has no directory (an authored factory, a source given as text).
    #[error("cannot import `{specifier}`: this factory has no directory to import from (an authored factory is one self-contained module)")]
    NoDirectory { specifier: String },
    /// The specifier leads outside the factory's directory (`..`, a symlink).
    #[error("cannot import `{specifier}` from `{referrer}`: it leads outside the factory's directory {how}")]
    Escapes { specifier: String, referrer: String, how: &'static str },
    /// An absolute path or a URL.
    #[error("cannot import `{specifier}` from `{referrer}`: only relative specifiers (`./x.js`) and package names resolve, not absolute paths or URLs")]
    Absolute { specifier: String, referrer: String },
    /// A Node.js built-in module.
    #[error(
        "cannot import `{specifier}` from `{referrer}`: `{name}` is a Node.js built-in module, and a factory runs in a \
         sandbox without Node's APIs (no files, network or processes); a package that needs `{name}` cannot be used"
    )]
    NodeBuiltin { name: String, specifier: String, referrer: String },
    /// A CommonJS package or file.
    #[error(
        "cannot import `{specifier}` from `{referrer}`: `{path}` is CommonJS ({why}); only ES-module packages load \
         (`\"type\": \"module\"`, `.mjs`, or an `import`/`module` entry in package.json)"
    )]
    CommonJs { specifier: String, referrer: String, path: String, why: &'static str },
    /// No such file or package.
    #[error("cannot import `{specifier}` from `{referrer}`: {what} not found")]
    NotFound { specifier: String, referrer: String, what: String },
    /// The package does not export that subpath for an ES-module import.
    #[error("cannot import `{specifier}` from `{referrer}`: package `{package}` exports no `{subpath}` for an ES-module import")]
    NotExported { specifier: String, referrer: String, package: String, subpath: String },
    /// A `package.json` that is too large, or not an object.
    #[error("cannot import `{specifier}`: `{path}`: {message}")]
    BadPackage { specifier: String, path: String, message: String },
    /// A package's `package.json` is not JSON.
    #[error("cannot import `{specifier}`: `{path}`: not JSON: {source}")]
    PackageJson {
        specifier: String,
        path: String,
        #[source]
        source: Arc<serde_json::Error>,
    },
    /// A file type that is not a module this runner loads.
    #[error("cannot import `{path}`: only .js, .mjs, .ts and .mts files are modules here")]
    Unsupported { path: String },
    /// The file is larger than [`MAX_MODULE_BYTES`].
    #[error("cannot import `{path}`: it is {bytes} bytes, over the {limit} byte limit of one module")]
    TooLarge { path: String, bytes: u64, limit: u64 },
    /// The factory's modules together exceed [`MAX_TOTAL_MODULE_BYTES`].
    #[error("cannot import `{path}`: the factory's modules would take {bytes} bytes, over the {limit} byte limit of all modules together")]
    TotalTooLarge { path: String, bytes: u64, limit: u64 },
    /// More than [`MAX_MODULES`] modules.
    #[error("cannot import `{path}`: a factory loads at most {limit} modules")]
    TooMany { path: String, limit: usize },
    /// An import chain deeper than [`MAX_IMPORT_DEPTH`].
    #[error("cannot import `{path}`: imports nest more than {limit} deep")]
    TooDeep { path: String, limit: u32 },
    /// The file is not UTF-8.
    #[error("cannot import `{path}`: it is not UTF-8 text")]
    NotText { path: String },
    /// TypeScript that could not be type-stripped.
    #[error(transparent)]
    TypeScript(crate::guests::typescript::StripError),
    /// The file could not be read.
    #[error("cannot read `{path}`: {kind}")]
    Read { path: String, kind: std::io::ErrorKind },
    /// More than [`MAX_RESOLUTIONS`] distinct imports, or a specifier over
    /// [`MAX_SPECIFIER_BYTES`].
    #[error("cannot import `{specifier}`: {why}")]
    TooManyImports { specifier: String, why: String },
    /// The referrer is not a module of this factory.
    #[error("cannot import `{specifier}`: `{referrer}` is not a module of this factory")]
    UnknownReferrer { specifier: String, referrer: String },
    /// A recorded module (or the record itself) is missing from the store or damaged.
    #[error("the recorded module `{name}` cannot be used: {problem}")]
    Record { name: String, problem: RecordProblem },
    /// The store failed while reading or writing the record of module `name`.
    #[error("the record of the module `{name}`: {source}")]
    Store {
        name: String,
        #[source]
        source: StoreError,
    },
}

/// What is wrong with a recorded module.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RecordProblem {
    /// Its text is not in the store.
    #[error("no stored text with sha256 {0}")]
    Missing(String),
    /// Its stored text is not UTF-8.
    #[error("its stored text is not UTF-8")]
    NotText,
    /// Its stored text does not have its recorded sha256.
    #[error("its stored text does not match its recorded sha256")]
    HashMismatch,
    /// The stored manifest is not one this build reads.
    #[error("the stored module record does not parse: {0}")]
    Manifest(Arc<serde_json::Error>),
}

impl ModuleError {
    /// The reason alone, short (QuickJS cuts an error message at 256 bytes, and the
    /// runner's message already names the specifier and the importing module): what the
    /// factory's code sees.
    pub fn brief(&self) -> String {
        match self {
            ModuleError::NoDirectory { .. } => "this factory has no directory to import from".into(),
            ModuleError::Escapes { how, .. } => format!("it leads outside the factory's directory {how}"),
            ModuleError::Absolute { .. } => "absolute paths and URLs do not resolve".into(),
            ModuleError::NodeBuiltin { name, .. } => {
                format!("`{name}` is a Node.js built-in module (no Node APIs in the sandbox)")
            }
            ModuleError::CommonJs { path, .. } => format!("`{path}` is CommonJS; only ES modules load"),
            ModuleError::NotFound { what, .. } => format!("{what} not found"),
            ModuleError::NotExported { package, subpath, .. } => format!("package `{package}` exports no `{subpath}`"),
            other => other.to_string(),
        }
    }
}

pub use crate::model::script::{Manifest, Resolution};

/// One loaded module.
#[derive(Debug, Clone)]
struct Loaded {
    /// The text as written (what the store records).
    text: Arc<str>,
    /// The JavaScript the runner evaluates (`text`, or `text` type-stripped).
    js: Arc<str>,
    /// sha256 of `text`.
    hash: String,
    /// Imports from the entry to it.
    depth: u32,
}

/// The factory's directory.
#[derive(Debug)]
struct Root {
    path: PathBuf,
    dir: cap_std::fs::Dir,
}

/// Where a set writes what it loads.
#[derive(Clone)]
struct Sink {
    store: Arc<dyn Store>,
    run_id: String,
}

#[derive(Default)]
struct State {
    modules: BTreeMap<String, Loaded>,
    resolved: BTreeMap<(String, String), String>,
    total_bytes: u64,
    sink: Option<Sink>,
    /// The first refusal, so a load that fails can say what it was as a typed error.
    first_error: Option<ModuleError>,
}

/// The modules of one script factory (see the module docs).
pub struct ModuleSet {
    /// The entry module's name (its file name, at the root).
    entry: String,
    root: Option<Arc<Root>>,
    state: Mutex<State>,
}

impl std::fmt::Debug for ModuleSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModuleSet")
            .field("entry", &self.entry)
            .field("root", &self.root.as_ref().map(|r| &r.path))
            .finish()
    }
}

impl PartialEq for ModuleSet {
    fn eq(&self, other: &Self) -> bool {
        self.entry == other.entry && self.manifest() == other.manifest()
    }
}
impl Eq for ModuleSet {}

fn hash_of(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

impl ModuleSet {
    /// A factory without a directory: every import other than the runtime's is refused.
    pub fn none(entry: impl Into<String>) -> Self {
        ModuleSet { entry: entry.into(), root: None, state: Mutex::default() }
    }

    /// A factory whose entry `entry` sits in `dir`. A directory that cannot be opened
    /// gives a set without one (its imports are refused, saying so).
    pub fn in_dir(dir: &Path, entry: impl Into<String>) -> Self {
        let root = std::fs::canonicalize(dir).ok().and_then(|path| {
            cap_std::fs::Dir::open_ambient_dir(&path, cap_std::ambient_authority())
                .ok()
                .map(|dir| Arc::new(Root { path, dir }))
        });
        ModuleSet { entry: entry.into(), root, state: Mutex::default() }
    }

    /// A set that starts from what a run recorded: `manifest` and the texts `text_of` gives
    /// for its hashes. A module it lists is served as recorded; one it does not is read
    /// from the recorded directory, if that still exists.
    pub fn recorded(
        entry: impl Into<String>,
        manifest: &Manifest,
        mut text_of: impl FnMut(&str) -> Result<Option<Vec<u8>>, StoreError>,
    ) -> Result<Self, ModuleError> {
        let set = match &manifest.root {
            Some(root) => ModuleSet::in_dir(Path::new(root), entry),
            None => ModuleSet::none(entry),
        };
        {
            let mut state = set.lock();
            for (name, hash) in &manifest.modules {
                let record = |problem| ModuleError::Record { name: name.clone(), problem };
                let bytes = text_of(hash)
                    .map_err(|source| ModuleError::Store { name: name.clone(), source })?
                    .ok_or_else(|| record(RecordProblem::Missing(hash.clone())))?;
                let text: Arc<str> = String::from_utf8(bytes).map_err(|_| record(RecordProblem::NotText))?.into();
                if &hash_of(&text) != hash {
                    return Err(record(RecordProblem::HashMismatch));
                }
                let js = js_of(name, &text)?;
                state.total_bytes += text.len() as u64;
                state.modules.insert(name.clone(), Loaded { text, js, hash: hash.clone(), depth: 0 });
            }
            for r in &manifest.resolved {
                state.resolved.insert((r.referrer.clone(), r.specifier.clone()), r.name.clone());
            }
            // Depths of recorded modules: along the recorded answers, from the entry.
            let mut frontier = vec![(set.entry.clone(), 0u32)];
            let mut seen = HashMap::new();
            while let Some((name, depth)) = frontier.pop() {
                if seen.insert(name.clone(), depth).is_some() {
                    continue;
                }
                for ((referrer, _), target) in &state.resolved {
                    if referrer == &name {
                        frontier.push((target.clone(), depth + 1));
                    }
                }
            }
            for (name, loaded) in state.modules.iter_mut() {
                loaded.depth = seen.get(name).copied().unwrap_or(0);
            }
        }
        Ok(set)
    }

    /// A set for one attempt of run `run_id`: what this set has loaded so far, writing it
    /// and everything it loads later to `store` under the run.
    pub fn for_run(&self, store: Arc<dyn Store>, run_id: &str) -> Result<Self, ModuleError> {
        let state = self.lock();
        let copy = ModuleSet {
            entry: self.entry.clone(),
            root: self.root.clone(),
            state: Mutex::new(State {
                modules: state.modules.clone(),
                resolved: state.resolved.clone(),
                total_bytes: state.total_bytes,
                sink: Some(Sink { store, run_id: run_id.to_string() }),
                first_error: None,
            }),
        };
        drop(state);
        {
            let state = copy.lock();
            let names: Vec<String> = state.modules.keys().cloned().collect();
            for name in names {
                record_module(&state, &name)?;
            }
            record_manifest(&copy, &state, &copy.entry)?;
        }
        Ok(copy)
    }

    /// Write the set's record to its store now (the end of an attempt): the answers given
    /// since the last module loaded.
    pub fn record_now(&self) -> Result<(), ModuleError> {
        let state = self.lock();
        record_manifest(self, &state, &self.entry)
    }

    /// What the set has loaded and answered.
    pub fn manifest(&self) -> Manifest {
        manifest_of(self, &self.lock())
    }

    /// Whether the set has loaded any module.
    pub fn is_empty(&self) -> bool {
        self.lock().modules.is_empty()
    }

    /// Names and texts (as written) of the loaded modules.
    pub fn texts(&self) -> Vec<(String, String, Arc<str>)> {
        self.lock().modules.iter().map(|(n, l)| (n.clone(), l.hash.clone(), l.text.clone())).collect()
    }

    /// The first refusal since the set was made (and forget it).
    pub fn take_error(&self) -> Option<ModuleError> {
        self.lock().first_error.take()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The module `specifier` imported by `referrer` names: the recorded answer, or one
    /// found now (its file read, checked and recorded at once).
    pub fn resolve(&self, specifier: &str, referrer: &str) -> Result<String, ModuleError> {
        let mut state = self.lock();
        let key = (referrer.to_string(), specifier.to_string());
        if let Some(name) = state.resolved.get(&key) {
            return Ok(name.clone());
        }
        let outcome = if specifier.len() > MAX_SPECIFIER_BYTES {
            let shown: String = specifier.chars().take(64).collect();
            Err(ModuleError::TooManyImports {
                specifier: shown,
                why: format!("a specifier is at most {MAX_SPECIFIER_BYTES} bytes"),
            })
        } else if state.resolved.len() >= MAX_RESOLUTIONS {
            Err(ModuleError::TooManyImports {
                specifier: specifier.into(),
                why: format!("a factory resolves at most {MAX_RESOLUTIONS} distinct imports"),
            })
        } else {
            let modules = state.modules.len();
            self.resolve_new(&mut state, specifier, referrer).map(|name| (name, state.modules.len() > modules))
        };
        let outcome = match outcome {
            Ok((name, loaded)) => {
                state.resolved.insert(key, name.clone());
                // The record is rewritten when a module joins it (at most MAX_MODULES
                // times) and at the end of the attempt ([`ModuleSet::record_now`]); an
                // answer naming a module already recorded is cheap to find again.
                if loaded {
                    if let Err(e) = record_manifest(self, &state, &name) {
                        state.first_error.get_or_insert(e.clone());
                        return Err(e);
                    }
                }
                Ok(name)
            }
            Err(e) => Err(e),
        };
        match &outcome {
            Ok(_) => {}
            Err(e) => {
                state.first_error.get_or_insert(e.clone());
            }
        }
        outcome
    }

    /// The JavaScript of module `name` (a name [`ModuleSet::resolve`] returned).
    pub fn load(&self, name: &str) -> Result<Arc<str>, ModuleError> {
        let state = self.lock();
        state
            .modules
            .get(name)
            .map(|l| l.js.clone())
            .ok_or_else(|| ModuleError::UnknownReferrer { specifier: name.to_string(), referrer: self.entry.clone() })
    }

    fn resolve_new(&self, state: &mut State, specifier: &str, referrer: &str) -> Result<String, ModuleError> {
        let depth = if referrer == self.entry {
            0
        } else {
            match state.modules.get(referrer) {
                Some(l) => l.depth,
                None => {
                    return Err(ModuleError::UnknownReferrer { specifier: specifier.into(), referrer: referrer.into() })
                }
            }
        };
        let bare_name = specifier.strip_prefix("node:").unwrap_or(specifier);
        let first = bare_name.split('/').next().unwrap_or_default();
        if specifier.starts_with("node:") || NODE_BUILTINS.contains(&first) && !is_relative(specifier) {
            return Err(ModuleError::NodeBuiltin {
                name: first.into(),
                specifier: specifier.into(),
                referrer: referrer.into(),
            });
        }
        let Some(root) = self.root.clone() else {
            return Err(ModuleError::NoDirectory { specifier: specifier.into() });
        };
        let absolute = specifier.starts_with('/')
            || specifier.contains('\\')
            || specifier.split_once(':').is_some_and(|(scheme, _)| !scheme.contains('/'));
        if absolute {
            return Err(ModuleError::Absolute { specifier: specifier.into(), referrer: referrer.into() });
        }
        let ctx = Ctx { root: &root, specifier, referrer };
        let (name, esm) = if is_relative(specifier) {
            let base = parent_of(referrer);
            let name = join(&base, specifier).ok_or_else(|| ModuleError::Escapes {
                specifier: specifier.into(),
                referrer: referrer.into(),
                how: "(through `..`)",
            })?;
            (name, None)
        } else {
            ctx.package(referrer)?
        };
        if state.modules.contains_key(&name) {
            return Ok(name);
        }
        if name == self.entry {
            return Ok(name);
        }
        let extension = Path::new(&name).extension().and_then(|e| e.to_str()).unwrap_or_default().to_string();
        match extension.as_str() {
            "js" | "mjs" | "ts" | "mts" => {}
            "cjs" | "cts" => {
                return Err(ModuleError::CommonJs {
                    specifier: specifier.into(),
                    referrer: referrer.into(),
                    path: name,
                    why: "a .cjs file",
                })
            }
            _ => return Err(ModuleError::Unsupported { path: name }),
        }
        if extension == "js" {
            if let Some(package) = package_root_of(&name) {
                let is_esm = match esm {
                    Some(true) => true,
                    _ => ctx.package_is_esm(&package)?,
                };
                if !is_esm {
                    return Err(ModuleError::CommonJs {
                        specifier: specifier.into(),
                        referrer: referrer.into(),
                        path: name,
                        why: "a .js file of a package that is not `\"type\": \"module\"`",
                    });
                }
            }
        }
        if state.modules.len() >= MAX_MODULES {
            return Err(ModuleError::TooMany { path: name, limit: MAX_MODULES });
        }
        if depth + 1 > MAX_IMPORT_DEPTH {
            return Err(ModuleError::TooDeep { path: name, limit: MAX_IMPORT_DEPTH });
        }
        let text = ctx.read_module(&name)?;
        let total = state.total_bytes + text.len() as u64;
        if total > MAX_TOTAL_MODULE_BYTES {
            return Err(ModuleError::TotalTooLarge { path: name, bytes: total, limit: MAX_TOTAL_MODULE_BYTES });
        }
        let text: Arc<str> = text.into();
        let js = js_of(&name, &text)?;
        let hash = hash_of(&text);
        state.total_bytes = total;
        state.modules.insert(name.clone(), Loaded { text, js, hash, depth: depth + 1 });
        record_module(state, &name)?;
        Ok(name)
    }
}

fn manifest_of(set: &ModuleSet, state: &State) -> Manifest {
    Manifest {
        root: set.root.as_ref().map(|r| r.path.to_string_lossy().into_owned()),
        modules: state.modules.iter().map(|(n, l)| (n.clone(), l.hash.clone())).collect(),
        resolved: state
            .resolved
            .iter()
            .map(|((referrer, specifier), name)| Resolution {
                referrer: referrer.clone(),
                specifier: specifier.clone(),
                name: name.clone(),
            })
            .collect(),
    }
}

/// Write module `name`'s text to the set's store, if it has one.
fn record_module(state: &State, name: &str) -> Result<(), ModuleError> {
    let (Some(sink), Some(loaded)) = (&state.sink, state.modules.get(name)) else { return Ok(()) };
    let bytes: Arc<[u8]> = Arc::from(loaded.text.as_bytes());
    sink.store.put_blob(&loaded.hash, &bytes).map_err(|source| ModuleError::Store { name: name.into(), source })
}

/// Write the set's manifest to its store, if it has one.
fn record_manifest(set: &ModuleSet, state: &State, name: &str) -> Result<(), ModuleError> {
    let Some(sink) = &state.sink else { return Ok(()) };
    sink.store
        .put_run_modules(&sink.run_id, &manifest_of(set, state))
        .map_err(|source| ModuleError::Store { name: name.into(), source })
}

/// The JavaScript of a module's text: type-stripped for TypeScript.
fn js_of(name: &str, text: &Arc<str>) -> Result<Arc<str>, ModuleError> {
    if matches!(Path::new(name).extension().and_then(|e| e.to_str()), Some("ts" | "mts")) {
        let js = crate::guests::typescript::strip(name, text).map_err(ModuleError::TypeScript)?;
        Ok(js.into())
    } else {
        Ok(text.clone())
    }
}

fn is_relative(specifier: &str) -> bool {
    specifier == "." || specifier == ".." || specifier.starts_with("./") || specifier.starts_with("../")
}

/// The directory part of a module name (`a/b.js` -> `a`, `b.js` -> ``).
fn parent_of(name: &str) -> String {
    name.rsplit_once('/').map(|(dir, _)| dir.to_string()).unwrap_or_default()
}

/// `base` joined with the relative path `rel`, normalized; `None` when `..` leaves the root.
fn join(base: &str, rel: &str) -> Option<String> {
    let mut parts: Vec<&str> = base.split('/').filter(|p| !p.is_empty()).collect();
    for part in rel.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            other => parts.push(other),
        }
    }
    Some(parts.join("/"))
}

/// For a module under `node_modules`, the package directory it belongs to
/// (`node_modules/@s/p/x.js` -> `node_modules/@s/p`).
fn package_root_of(name: &str) -> Option<String> {
    let at = name.rfind("node_modules/")?;
    let rest = &name[at + "node_modules/".len()..];
    let mut segments = rest.split('/');
    let first = segments.next()?;
    let package = if first.starts_with('@') { format!("{first}/{}", segments.next()?) } else { first.to_string() };
    Some(format!("{}node_modules/{package}", &name[..at]))
}

/// One resolution in progress.
struct Ctx<'a> {
    root: &'a Root,
    specifier: &'a str,
    referrer: &'a str,
}

impl Ctx<'_> {
    fn not_found(&self, what: impl Into<String>) -> ModuleError {
        ModuleError::NotFound { specifier: self.specifier.into(), referrer: self.referrer.into(), what: what.into() }
    }

    /// Map an open failure: a path that exists but leads outside the root is an escape.
    fn open_error(&self, name: &str, e: std::io::Error) -> ModuleError {
        let outside = std::fs::canonicalize(self.root.path.join(name)).is_ok_and(|p| !p.starts_with(&self.root.path));
        if outside {
            ModuleError::Escapes {
                specifier: self.specifier.into(),
                referrer: self.referrer.into(),
                how: "(through a symlink)",
            }
        } else if e.kind() == std::io::ErrorKind::NotFound {
            self.not_found(format!("`{name}`"))
        } else {
            ModuleError::Read { path: name.into(), kind: e.kind() }
        }
    }

    /// Read file `name` (relative to the root) of at most `limit` bytes.
    fn read(&self, name: &str, limit: u64) -> Result<Result<Vec<u8>, u64>, ModuleError> {
        let file = self.root.dir.open(name).map_err(|e| self.open_error(name, e))?;
        let metadata = file.metadata().map_err(|e| ModuleError::Read { path: name.into(), kind: e.kind() })?;
        if !metadata.is_file() {
            return Err(self.not_found(format!("`{name}` (not a file)")));
        }
        if metadata.len() > limit {
            return Ok(Err(metadata.len()));
        }
        let mut bytes = Vec::new();
        file.into_std()
            .take(limit + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| ModuleError::Read { path: name.into(), kind: e.kind() })?;
        if bytes.len() as u64 > limit {
            return Ok(Err(bytes.len() as u64));
        }
        Ok(Ok(bytes))
    }

    fn read_module(&self, name: &str) -> Result<String, ModuleError> {
        let bytes = self.read(name, MAX_MODULE_BYTES)?.map_err(|bytes| ModuleError::TooLarge {
            path: name.into(),
            bytes,
            limit: MAX_MODULE_BYTES,
        })?;
        String::from_utf8(bytes).map_err(|_| ModuleError::NotText { path: name.into() })
    }

    fn is_file(&self, name: &str) -> bool {
        self.root.dir.metadata(name).is_ok_and(|m| m.is_file())
    }

    fn package_json(&self, package: &str) -> Result<Option<serde_json::Value>, ModuleError> {
        let path = format!("{package}/package.json");
        if !self.is_file(&path) {
            return Ok(None);
        }
        let bad =
            |message: String| ModuleError::BadPackage { specifier: self.specifier.into(), path: path.clone(), message };
        let bytes = self
            .read(&path, MAX_PACKAGE_JSON_BYTES)?
            .map_err(|bytes| bad(format!("{bytes} bytes, over the {MAX_PACKAGE_JSON_BYTES} byte limit")))?;
        let value: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| ModuleError::PackageJson {
            specifier: self.specifier.into(),
            path: path.clone(),
            source: Arc::new(e),
        })?;
        if !value.is_object() {
            return Err(bad("not a JSON object".into()));
        }
        Ok(Some(value))
    }

    /// Whether the package at `package` is an ES-module package: `"type": "module"`, a
    /// `module` entry, or an `import` condition in its `exports`.
    fn package_is_esm(&self, package: &str) -> Result<bool, ModuleError> {
        let Some(json) = self.package_json(package)? else { return Ok(false) };
        Ok(json.get("type").and_then(|t| t.as_str()) == Some("module")
            || json.get("module").is_some_and(|m| m.is_string())
            || json.get("exports").is_some_and(|e| mentions_import(e, 0)))
    }

    /// Resolve the bare specifier: the package directory in the nearest `node_modules` at
    /// or above the referrer's directory (never above the root), then its entry. Returns
    /// the module name and, when the entry was chosen as an ES module by the package
    /// (`module`, an `import` condition), `Some(true)`.
    fn package(&self, referrer: &str) -> Result<(String, Option<bool>), ModuleError> {
        let specifier = self.specifier;
        let mut segments = specifier.split('/');
        let first = segments.next().unwrap_or_default();
        let package_name = if first.starts_with('@') {
            match segments.next() {
                Some(second) if !second.is_empty() && first.len() > 1 => format!("{first}/{second}"),
                _ => return Err(self.not_found(format!("package `{specifier}` (a scoped name is `@scope/name`)"))),
            }
        } else {
            first.to_string()
        };
        if package_name.is_empty() || package_name.split('/').any(|p| p == "." || p == ".." || p.is_empty()) {
            return Err(self.not_found(format!("package `{specifier}`")));
        }
        let subpath = match &specifier[package_name.len()..] {
            "" => ".".to_string(),
            rest => format!(".{rest}"),
        };
        if join("", &subpath[1..]).is_none() || subpath.split('/').any(|p| p == "..") {
            return Err(ModuleError::Escapes {
                specifier: specifier.into(),
                referrer: self.referrer.into(),
                how: "(through `..`)",
            });
        }
        let mut dir = parent_of(referrer);
        let package = loop {
            let in_node_modules = dir.rsplit('/').next() == Some("node_modules");
            if !in_node_modules {
                let prefix = if dir.is_empty() { String::new() } else { format!("{dir}/") };
                let candidate = format!("{prefix}node_modules/{package_name}");
                if self.root.dir.metadata(&candidate).is_ok_and(|m| m.is_dir()) {
                    break candidate;
                }
            }
            if dir.is_empty() {
                return Err(self.not_found(format!(
                    "package `{package_name}` (looked in node_modules beside `{referrer}` and above it, within the factory's directory)"
                )));
            }
            dir = parent_of(&dir);
        };
        let json = self.package_json(&package)?.unwrap_or_else(|| serde_json::json!({}));
        if let Some(exports) = json.get("exports").filter(|e| !e.is_null()) {
            let Some((entry, star)) = exports_entry(exports, &subpath) else {
                return Err(ModuleError::NotExported {
                    specifier: specifier.into(),
                    referrer: self.referrer.into(),
                    package: package_name,
                    subpath,
                });
            };
            return match conditional(entry, star, 0) {
                Some((target, esm)) => {
                    let rel = target.strip_prefix("./").ok_or_else(|| ModuleError::BadPackage {
                        specifier: specifier.into(),
                        path: format!("{package}/package.json"),
                        message: format!("the export target `{target}` does not start with `./`"),
                    })?;
                    let name =
                        join(&package, rel).filter(|n| n.starts_with(&format!("{package}/"))).ok_or_else(|| {
                            ModuleError::Escapes {
                                specifier: specifier.into(),
                                referrer: self.referrer.into(),
                                how: "(through its package's exports)",
                            }
                        })?;
                    Ok((name, esm.then_some(true)))
                }
                None if mentions_require(entry, 0) => Err(ModuleError::CommonJs {
                    specifier: specifier.into(),
                    referrer: self.referrer.into(),
                    path: format!("{package}/package.json"),
                    why: "its exports offer `require` only",
                }),
                None => Err(ModuleError::NotExported {
                    specifier: specifier.into(),
                    referrer: self.referrer.into(),
                    package: package_name,
                    subpath,
                }),
            };
        }
        if subpath != "." {
            let name = join(&package, &subpath[2..]).unwrap_or_default();
            return Ok((name, None));
        }
        if let Some(module) = json.get("module").and_then(|m| m.as_str()) {
            if let Some(name) = join(&package, module).filter(|n| n.starts_with(&format!("{package}/"))) {
                return Ok((name, Some(true)));
            }
        }
        let main = json.get("main").and_then(|m| m.as_str()).unwrap_or("index.js");
        let base = join(&package, main).filter(|n| n.starts_with(&format!("{package}/"))).ok_or_else(|| {
            ModuleError::Escapes {
                specifier: specifier.into(),
                referrer: self.referrer.into(),
                how: "(through its package's `main`)",
            }
        })?;
        for candidate in [base.clone(), format!("{base}.js"), format!("{base}/index.js")] {
            if self.is_file(&candidate) {
                return Ok((candidate, None));
            }
        }
        Err(self.not_found(format!("the entry `{main}` of package `{package_name}`")))
    }
}

/// The entry `exports` has for `subpath` (`.` or `./x`), with the text a `*` pattern
/// matched; `None`: the package does not export the subpath at all.
fn exports_entry<'a>(
    exports: &'a serde_json::Value,
    subpath: &'a str,
) -> Option<(&'a serde_json::Value, Option<&'a str>)> {
    let map = match exports {
        serde_json::Value::Object(map) if map.keys().any(|k| k.starts_with('.')) => map,
        // A string, an array or a conditions object: the export of ".".
        other => return (subpath == ".").then_some((other, None)),
    };
    if let Some(target) = map.get(subpath) {
        return Some((target, None));
    }
    // Patterns: the longest prefix before `*` wins.
    let mut best: Option<(&str, &str, &serde_json::Value)> = None;
    for (key, target) in map {
        if let Some((prefix, suffix)) = key.split_once('*') {
            let matches = subpath.len() >= prefix.len() + suffix.len()
                && subpath.starts_with(prefix)
                && subpath.ends_with(suffix);
            if matches && best.is_none_or(|(p, _, _)| prefix.len() > p.len()) {
                best = Some((prefix, suffix, target));
            }
        }
    }
    let (prefix, suffix, target) = best?;
    Some((target, Some(&subpath[prefix.len()..subpath.len() - suffix.len()])))
}

/// The target `exports` gives `subpath`, with whether an ES-module-only condition
/// (`import`, `module`) chose it.
#[cfg(test)]
fn exports_target(exports: &serde_json::Value, subpath: &str) -> Option<(String, bool)> {
    let (entry, star) = exports_entry(exports, subpath)?;
    conditional(entry, star, 0)
}

/// A target after conditions: a string (with `*` replaced), the first usable entry of an
/// array, or the first matching condition of an object, in its order.
fn conditional(target: &serde_json::Value, star: Option<&str>, depth: u32) -> Option<(String, bool)> {
    if depth > 16 {
        return None;
    }
    match target {
        serde_json::Value::String(s) => Some((star.map_or_else(|| s.clone(), |star| s.replace('*', star)), false)),
        serde_json::Value::Array(items) => items.iter().find_map(|t| conditional(t, star, depth + 1)),
        serde_json::Value::Object(map) => map.iter().find_map(|(key, t)| {
            CONDITIONS
                .contains(&key.as_str())
                .then(|| conditional(t, star, depth + 1))
                .flatten()
                .map(|(target, esm)| (target, esm || key == "import" || key == "module"))
        }),
        _ => None,
    }
}

fn mentions_key(value: &serde_json::Value, key: &str, depth: u32) -> bool {
    depth <= 16
        && match value {
            serde_json::Value::Object(map) => map.iter().any(|(k, v)| k == key || mentions_key(v, key, depth + 1)),
            serde_json::Value::Array(items) => items.iter().any(|v| mentions_key(v, key, depth + 1)),
            _ => false,
        }
}

fn mentions_import(value: &serde_json::Value, depth: u32) -> bool {
    mentions_key(value, "import", depth) || mentions_key(value, "module", depth)
}

fn mentions_require(value: &serde_json::Value, depth: u32) -> bool {
    mentions_key(value, "require", depth)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn joins_stay_inside_the_root() {
        assert_eq!(join("a/b", "../c.js").as_deref(), Some("a/c.js"));
        assert_eq!(join("", "./x/./y.js").as_deref(), Some("x/y.js"));
        assert_eq!(join("a", "../../x.js"), None);
        assert_eq!(join("", "../x.js"), None);
    }

    #[test]
    fn package_roots_of_module_names() {
        assert_eq!(package_root_of("node_modules/p/x/y.js").as_deref(), Some("node_modules/p"));
        assert_eq!(package_root_of("node_modules/@s/p/x.js").as_deref(), Some("node_modules/@s/p"));
        assert_eq!(
            package_root_of("node_modules/a/node_modules/b/i.js").as_deref(),
            Some("node_modules/a/node_modules/b")
        );
        assert_eq!(package_root_of("lib/x.js"), None);
    }

    #[test]
    fn exports_follow_nodes_rules_for_an_esm_import() {
        assert_eq!(exports_target(&json!("./i.js"), "."), Some(("./i.js".into(), false)));
        assert_eq!(exports_target(&json!("./i.js"), "./x"), None);
        let e = json!({ ".": { "require": "./c.cjs", "import": "./m.js" }, "./sub/*": "./lib/*.js", "./sub/deep/*": { "default": "./d/*.js" } });
        assert_eq!(exports_target(&e, "."), Some(("./m.js".into(), true)));
        assert_eq!(exports_target(&e, "./sub/a"), Some(("./lib/a.js".into(), false)));
        assert_eq!(exports_target(&e, "./sub/deep/b"), Some(("./d/b.js".into(), false)));
        assert_eq!(exports_target(&e, "./other"), None);
        let cjs = json!({ "require": "./c.cjs" });
        assert_eq!(exports_target(&cjs, "."), None);
        assert!(mentions_require(&cjs, 0));
        assert_eq!(exports_target(&json!([{ "node": "./n.js" }, "./f.js"]), "."), Some(("./f.js".into(), false)));
    }
}
