//! Python factories: `factory build x.py` (or a directory with an `app.py` or a
//! `pyproject.toml`). The binary carries the Python SDK (`guest-sdk/python`) and the WIT; it
//! writes them with the user's sources into a private temporary directory (`0700`, files
//! `0600`) and runs `componentize-py` (the one extra tool, installed by the user:
//! `pip install componentize-py`), so nothing else is needed. The component is cached by a
//! hash of everything that goes into it (the sources, the SDK, the WIT, the entry module):
//! a second build of an unchanged factory is a file lookup, and only of a cache directory
//! and file owned by us and writable by nobody else.
//!
//! Running `componentize-py` runs a local tool the user installed (found on `PATH`); it
//! imports the factory's module at build time, inside its own WebAssembly interpreter, to
//! snapshot it, with the Python path's directories (ours and the host's `site-packages`)
//! opened read-write to that code. So it runs inside an OS sandbox, bubblewrap (`bwrap`):
//! the whole filesystem read-only, only the build's output directory and a scratch
//! directory (its `TMPDIR`) writable, no network, its own pid/ipc/uts namespaces, a new
//! session (no terminal), ended with us. Without `bwrap` a build that needs componentize-py
//! is refused ([`PyBuildError::NoSandbox`]), never run unsandboxed. No repository file
//! chooses what is run.
//!
//! Inside the component the SDK and the entry module live on the Python path at `/0/` and
//! the user's sources at `/1/`; the SDK shows the latter by their path in the project in
//! tracebacks.

use sha2::{Digest, Sha256};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::access::{check_owned_private, create_private_dir};
use crate::guests::rust::Built;

/// The tool that builds Python components.
pub const COMPONENTIZE_PY: &str = "componentize-py";

/// The OS sandbox componentize-py runs in (bubblewrap).
pub use crate::bwrap::BWRAP;
use crate::bwrap::{self, Flag};

/// The version of componentize-py the SDK is tested with (what `./test` installs into `.venv`).
pub const COMPONENTIZE_PY_VERSION: &str = "0.25.1";

/// The WIT world, as this binary knows it.
const WIT: &str = include_str!("../../../wit/factory.wit");

/// The SDK package `factory_sdk`, embedded: (path under the Python path, contents).
const SDK: &[(&str, &str)] = &[
    ("factory_sdk/__init__.py", include_str!("../../../guest-sdk/python/factory_sdk/__init__.py")),
    ("factory_sdk/_schema.py", include_str!("../../../guest-sdk/python/factory_sdk/_schema.py")),
    ("factory_sdk/_export.py", include_str!("../../../guest-sdk/python/factory_sdk/_export.py")),
    ("factory_sdk/py.typed", include_str!("../../../guest-sdk/python/factory_sdk/py.typed")),
];

/// The module componentize-py wraps: imports the user's module (which registers its
/// `@factory`), checks there is exactly one, and exports it.
const ENTRY_MODULE: &str = "_factory_component_entry";

/// Directories never copied from a project (environments, caches, VCS, build output).
const SKIPPED_DIRS: &[&str] = &["__pycache__", "venv", "env", "node_modules", "target", "build", "dist"];

/// Why a Python build failed.
#[derive(Debug, thiserror::Error)]
pub enum PyBuildError {
    /// componentize-py is not installed (or not on `PATH`).
    #[error("`componentize-py` is not installed (or not on PATH): install it with `pip install componentize-py=={COMPONENTIZE_PY_VERSION}`")]
    Missing,
    /// bubblewrap, the sandbox a build runs componentize-py in, is not installed.
    #[error("`bwrap` (bubblewrap) is not installed (or not on PATH): a Python build runs the factory's import-time code, and `factory` runs it only inside that sandbox; install the package `bubblewrap` (Debian/Ubuntu: `sudo apt-get install bubblewrap`, Fedora: `sudo dnf install bubblewrap`)")]
    NoSandbox,
    /// bubblewrap is installed but could not set up the sandbox (e.g. user namespaces are
    /// disabled on this machine).
    #[error("bubblewrap could not set up the build sandbox (are unprivileged user namespaces enabled?):\n{0}")]
    Sandbox(String),
    /// The build cache directory is not ours alone: a component found there could be
    /// anyone's, so it is neither used nor written.
    #[error(
        "the Python build cache `{path}` {problem}: refusing to use it (remove it, or make it yours with mode 0700)"
    )]
    UntrustedCache { path: String, problem: String },
    /// The file or directory is not a Python factory.
    #[error("`{0}` is not a Python factory (a `.py` file, or a directory with an `app.py` or a `pyproject.toml`)")]
    NotPython(String),
    /// The module to import cannot be named.
    #[error("{0}")]
    BadModule(String),
    /// The project's `pyproject.toml` is not valid TOML.
    #[error("{path}: not valid TOML: {source}")]
    Pyproject {
        path: String,
        #[source]
        source: toml::de::Error,
    },
    /// The factory's Python failed while being built (a syntax error, an exception at import
    /// time, no `@factory`): `headline` is `file:line: Error` when the line is known,
    /// `detail` the traceback with the user's files shown by their real path.
    #[error("{headline}\n{detail}")]
    Python { headline: String, detail: String },
    /// componentize-py failed for another reason.
    #[error("componentize-py failed for `{path}`:\n{output}")]
    Tool { path: String, output: String },
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
}

/// A Python factory found at a path.
#[derive(Debug, Clone)]
pub struct PyProject {
    /// The directory whose sources are bundled (a single file's own directory).
    pub root: PathBuf,
    /// The sources to bundle, relative to `root`.
    pub files: Vec<PathBuf>,
    /// The module to import.
    pub module: String,
}

/// Is `path` a Python factory: a `.py` file, or a directory without a `Cargo.toml` that has
/// an `app.py` or a `pyproject.toml`?
pub fn is_python(path: &Path) -> bool {
    if path.is_file() {
        return path.extension().is_some_and(|e| e == "py");
    }
    path.is_dir()
        && !path.join("Cargo.toml").exists()
        && (path.join("app.py").is_file() || path.join("pyproject.toml").is_file())
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> PyBuildError {
    let path = path.display().to_string();
    move |source| PyBuildError::Io { path, source }
}

fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// What `path` builds: its sources and the module to import.
pub fn project(path: &Path) -> Result<PyProject, PyBuildError> {
    if path.is_file() {
        if path.extension().is_none_or(|e| e != "py") {
            return Err(PyBuildError::NotPython(path.display().to_string()));
        }
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
        if !is_identifier(stem) || stem == ENTRY_MODULE || stem == "factory_sdk" {
            return Err(PyBuildError::BadModule(format!(
                "`{}`: a Python factory's file name must be a module name other than `factory_sdk` (letters, digits, `_`): rename it, e.g. to `{}.py`",
                path.display(),
                stem.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
            )));
        }
        let root = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let name = PathBuf::from(path.file_name().unwrap_or_default());
        return Ok(PyProject { root, files: vec![name], module: stem.to_string() });
    }
    if !is_python(path) {
        return Err(PyBuildError::NotPython(path.display().to_string()));
    }
    let module = if path.join("app.py").is_file() { "app".to_string() } else { pyproject_module(path)? };
    let mut files = Vec::new();
    collect_sources(path, Path::new(""), &mut files)?;
    files.sort();
    Ok(PyProject { root: path.to_path_buf(), files, module })
}

/// The module a `pyproject.toml` names: `[tool.factory] module`, else the project's name
/// (`my-factory` → `my_factory`).
fn pyproject_module(dir: &Path) -> Result<String, PyBuildError> {
    let file = dir.join("pyproject.toml");
    let text = std::fs::read_to_string(&file).map_err(io(&file))?;
    let doc: toml::Table =
        text.parse().map_err(|source| PyBuildError::Pyproject { path: file.display().to_string(), source })?;
    let named = doc
        .get("tool")
        .and_then(|t| t.get("factory"))
        .and_then(|f| f.get("module"))
        .and_then(|m| m.as_str())
        .map(str::to_string);
    let module = named.or_else(|| {
        doc.get("project")
            .and_then(|p| p.get("name"))
            .and_then(|n| n.as_str())
            .map(|n| n.replace(['-', '.'], "_").to_lowercase())
    });
    match module {
        Some(m) if m.split('.').all(is_identifier) => Ok(m),
        Some(m) => Err(PyBuildError::BadModule(format!("{}: `{m}` is not a Python module name", file.display()))),
        None => Err(PyBuildError::BadModule(format!(
            "{}: name the factory's module with `[tool.factory] module = \"...\"` (or add an `app.py`)",
            file.display()
        ))),
    }
}

/// The `.py` files under `dir` (relative to the project root), skipping hidden directories,
/// environments and caches.
fn collect_sources(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) -> Result<(), PyBuildError> {
    let dir = root.join(rel);
    let entries = std::fs::read_dir(&dir).map_err(io(&dir))?;
    for entry in entries {
        let entry = entry.map_err(io(&dir))?;
        let name = entry.file_name();
        let Some(name_str) = name.to_str() else { continue };
        let kind = entry.file_type().map_err(io(&entry.path()))?;
        if kind.is_dir() {
            if name_str.starts_with('.') || SKIPPED_DIRS.contains(&name_str) {
                continue;
            }
            collect_sources(root, &rel.join(&name), out)?;
        } else if kind.is_file() && name_str.ends_with(".py") {
            out.push(rel.join(&name));
        }
    }
    Ok(())
}

/// The installed componentize-py's version line (`componentize-py 0.25.1`).
pub fn tool_version() -> Result<String, PyBuildError> {
    let out =
        Command::new(COMPONENTIZE_PY).arg("--version").stdin(Stdio::null()).output().map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => PyBuildError::Missing,
            _ => PyBuildError::Tool { path: COMPONENTIZE_PY.into(), output: e.to_string() },
        })?;
    if !out.status.success() {
        return Err(PyBuildError::Tool {
            path: COMPONENTIZE_PY.into(),
            output: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn entry_source(module: &str) -> String {
    format!(
        "# Generated by `factory build`: the component's entry module.\n\
         import {module}  # registers the factory (@factory)\n\
         from factory_sdk import _registered\n\
         from factory_sdk._export import WitWorld, prime_linecache\n\
         _registered()  # exactly one @factory, checked at build time\n\
         prime_linecache()\n"
    )
}

/// The cache key: everything of ours that goes into the component (the tool's version is
/// not part of it, so a cache hit runs no Python at all; it is recorded beside the component).
fn cache_key(project: &PyProject) -> Result<String, PyBuildError> {
    let mut hash = Sha256::new();
    let mut part = |label: &str, bytes: &[u8]| {
        hash.update((label.len() as u64).to_le_bytes());
        hash.update(label.as_bytes());
        hash.update((bytes.len() as u64).to_le_bytes());
        hash.update(bytes);
    };
    part("factory-python-build", b"2");
    part("wit", WIT.as_bytes());
    for (name, text) in SDK {
        part(name, text.as_bytes());
    }
    part("entry", entry_source(&project.module).as_bytes());
    for file in &project.files {
        let path = project.root.join(file);
        let bytes = std::fs::read(&path).map_err(io(&path))?;
        part(&format!("src:{}", file.display()), &bytes);
    }
    Ok(hex::encode(hash.finalize()))
}

/// A private temporary directory (`0700`, a fresh name, never an existing one), removed
/// when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<Self, PyBuildError> {
        let dir = std::env::temp_dir().join(format!("factory-pybuild-{}", uuid::Uuid::new_v4()));
        std::fs::DirBuilder::new().mode(0o700).create(&dir).map_err(io(&dir))?;
        Ok(TempDir(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Write a new file `path` with mode `0600` (its missing parent directories `0700`); an
/// existing file (or a symlink planted there) is an error, never written through.
fn write_new(path: &Path, contents: &[u8]) -> Result<(), PyBuildError> {
    if let Some(parent) = path.parent() {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(parent).map_err(io(parent))?;
    }
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).map_err(io(path))?;
    file.write_all(contents).map_err(io(path))
}

/// The build cache directory `dir` (created `0700` if missing): refused unless it is a
/// directory owned by us that nobody else can write.
fn private_cache_dir(dir: &Path) -> Result<(), PyBuildError> {
    create_private_dir(dir).map_err(io(dir))?;
    let untrusted = |problem: String| PyBuildError::UntrustedCache { path: dir.display().to_string(), problem };
    let meta = std::fs::symlink_metadata(dir).map_err(io(dir))?;
    if !meta.file_type().is_dir() {
        return Err(untrusted("is not a directory (a symlink?)".into()));
    }
    check_owned_private(&meta).map_err(untrusted)
}

/// What the build cache holds for a key.
enum Cached {
    /// Nothing.
    Missing,
    /// A regular file (not a symlink) owned by us that nobody else can write.
    Trusted,
    /// Something else, and what is wrong with it.
    Untrusted(String),
}

/// May the cached component at `path` be used (its directory was checked by
/// [`private_cache_dir`])?
fn cached(path: &Path) -> Result<Cached, PyBuildError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Cached::Missing),
        Err(e) => return Err(io(path)(e)),
    };
    if !meta.file_type().is_file() {
        return Ok(Cached::Untrusted("is not a regular file".into()));
    }
    Ok(match check_owned_private(&meta) {
        Ok(()) => Cached::Trusted,
        Err(problem) => Cached::Untrusted(problem),
    })
}

/// Put `bytes` at `path` in the cache: a `0600` file written beside it, then renamed over it
/// (a concurrent build of the same key never sees half a file; an untrusted file there is
/// replaced, not written through).
fn install(path: &Path, bytes: &[u8]) -> Result<(), PyBuildError> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("component");
    let partial = path.with_file_name(format!("{name}.{}.partial", uuid::Uuid::new_v4()));
    if let Err(e) = write_new(&partial, bytes) {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    std::fs::rename(&partial, path).map_err(|e| {
        let _ = std::fs::remove_file(&partial);
        io(path)(e)
    })
}

/// The arguments that run a command in the build sandbox: everything read-only (`root`, the
/// build's directory, bound again after `/dev` and `/proc` so a `TMPDIR` there still shows),
/// `writable` (the output and scratch directories) read-write, `TMPDIR` the scratch
/// directory, `root` the working directory; no network; its own pid, ipc and uts
/// namespaces; a new session (no terminal to push input into); ended when we end.
fn sandbox_args(root: &Path, writable: &[&Path], scratch: &Path) -> Vec<std::ffi::OsString> {
    let mut args = bwrap::Args::new();
    args.ro_bind("/", "/").dev("/dev").proc("/proc").ro_bind(root, root);
    for dir in writable {
        args.bind(dir, dir);
    }
    args.setenv("TMPDIR", scratch).chdir(root).flags(&[Flag::UnshareAll, Flag::DieWithParent, Flag::NewSession]);
    args.finish()
}

/// Build the Python factory at `path` (a `.py` file or a project directory) into
/// `cache_dir/python/<key>.wasm` (the componentize-py version used in `<key>.version`),
/// running componentize-py in the build sandbox, or return the cached component without
/// running anything. The cache directories must be ours and writable by nobody else (else
/// [`PyBuildError::UntrustedCache`]); a cached file that is not (a symlink, another owner,
/// group- or world-writable) is built again and replaced. `say` receives one-line notes
/// for the user.
pub fn build(path: &Path, cache_dir: &Path, say: &mut dyn FnMut(&str)) -> Result<Built, PyBuildError> {
    let project = project(path)?;
    let key = cache_key(&project)?;
    private_cache_dir(cache_dir)?;
    let out_dir = cache_dir.join("python");
    private_cache_dir(&out_dir)?;
    let component = out_dir.join(format!("{key}.wasm"));
    match cached(&component)? {
        Cached::Trusted => return Ok(Built { component, encoded: false }),
        Cached::Missing => {}
        Cached::Untrusted(problem) => {
            say(&format!("not using the cached {} ({problem}): building it again", component.display()))
        }
    }
    let version = tool_version()?;
    say(&format!("building {} with {version} in a sandbox (about 20 s; cached afterwards)", path.display()));
    let tmp = TempDir::new()?;
    let wit_dir = tmp.0.join("wit");
    write_new(&wit_dir.join("factory.wit"), WIT.as_bytes())?;
    let sdk_dir = tmp.0.join("sdk");
    for (name, text) in SDK {
        write_new(&sdk_dir.join(name), text.as_bytes())?;
    }
    write_new(&sdk_dir.join(format!("{ENTRY_MODULE}.py")), entry_source(&project.module).as_bytes())?;
    let src_dir = tmp.0.join("src");
    std::fs::DirBuilder::new().mode(0o700).create(&src_dir).map_err(io(&src_dir))?;
    for file in &project.files {
        let from = project.root.join(file);
        let bytes = std::fs::read(&from).map_err(io(&from))?;
        write_new(&src_dir.join(file), &bytes)?;
    }
    // The only directories the build may write: its output and a scratch `TMPDIR`
    // (componentize-py unpacks the standard library there). The sources, the SDK and the
    // WIT beside them are read-only like everything else.
    let built_dir = tmp.0.join("out");
    let scratch = tmp.0.join("scratch");
    for dir in [&built_dir, &scratch] {
        std::fs::DirBuilder::new().mode(0o700).create(dir).map_err(io(dir))?;
    }
    let built = built_dir.join("factory.wasm");
    let output = Command::new(BWRAP)
        .args(sandbox_args(&tmp.0, &[&built_dir, &scratch], &scratch))
        .arg(COMPONENTIZE_PY)
        .arg("--quiet")
        .arg("-d")
        .arg(&wit_dir)
        .args(["-w", "factory", "componentize", ENTRY_MODULE])
        // Index 0 and 1 of the Python path: `/0/` (SDK, entry) and `/1/` (the sources).
        .arg("-p")
        .arg(&sdk_dir)
        .arg("-p")
        .arg(&src_dir)
        .arg("-o")
        .arg(&built)
        .current_dir(&tmp.0)
        .env("RUST_BACKTRACE", "0")
        .env("RUST_LIB_BACKTRACE", "0")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => PyBuildError::NoSandbox,
            _ => PyBuildError::Tool { path: path.display().to_string(), output: e.to_string() },
        })?;
    if !output.status.success() || !built.is_file() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        // bubblewrap's own failures (before componentize-py starts) are `bwrap: ...` lines.
        if output.stdout.is_empty() && bwrap::own_failure(&stderr).is_some() {
            return Err(PyBuildError::Sandbox(tail(&stderr, 10)));
        }
        let text = format!("{}{stderr}", String::from_utf8_lossy(&output.stdout));
        return Err(diagnose(&text, &display_root(path))
            .unwrap_or_else(|| PyBuildError::Tool { path: path.display().to_string(), output: tail(&text, 40) }));
    }
    let bytes = std::fs::read(&built).map_err(io(&built))?;
    // The version first: a component is never found without the version that built it.
    install(&out_dir.join(format!("{key}.version")), version.as_bytes())?;
    install(&component, &bytes)?;
    say(&format!("built {}; its first compile takes several seconds (cached afterwards)", component.display()));
    Ok(Built { component, encoded: true })
}

/// How the user's sources are shown: the project directory (a file's own directory), with a
/// trailing `/`, or nothing for the working directory.
fn display_root(path: &Path) -> String {
    let root = if path.is_file() { path.parent().unwrap_or(Path::new("")) } else { path };
    let shown = root.display().to_string();
    if shown.is_empty() || shown == "." {
        String::new()
    } else if shown.ends_with('/') {
        shown
    } else {
        format!("{shown}/")
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.trim().lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The Python error in componentize-py's output (a traceback from importing the factory),
/// with the user's files shown by their real path and a `file:line: Error` headline.
fn diagnose(output: &str, root: &str) -> Option<PyBuildError> {
    const START: &str = "Traceback (most recent call last):";
    let start = output.rfind(START)?;
    let rest = &output[start..];
    let end = rest.find("\n\nCaused by:").unwrap_or(rest.len());
    let traceback = rest[..end].trim_end().replace("\"/1/", &format!("\"{root}")).replace("\"/0/", "\"<factory-sdk>/");
    let last = traceback.lines().rev().find(|l| !l.trim().is_empty())?.trim().to_string();
    let location = traceback.lines().rev().find_map(|line| {
        let line = line.trim();
        let file = line.strip_prefix("File \"")?;
        let (file, after) = file.split_once('"')?;
        let lineno = after.strip_prefix(", line ")?;
        let lineno: String = lineno.chars().take_while(char::is_ascii_digit).collect();
        Some(format!("{file}:{lineno}"))
    });
    let headline = match location {
        Some(location) => format!("{location}: {last}"),
        None => last,
    };
    Some(PyBuildError::Python { headline, detail: traceback })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_syntax_error_is_shown_at_its_file_and_line() {
        let output = "Traceback (most recent call last):\n  File \"/x/componentize-py\", line 8, in <module>\nAssertionError: Traceback (most recent call last):\n  File \"/0/_factory_component_entry.py\", line 2, in <module>\n    import bad\n  File \"/1/bad.py\", line 3\n    def f(:\n          ^\nSyntaxError: invalid syntax\n\n\nCaused by:\n    SyntaxError: invalid syntax (bad.py, line 3)\n";
        let Some(PyBuildError::Python { headline, detail }) = diagnose(output, "examples/") else {
            panic!("not diagnosed")
        };
        assert_eq!(headline, "examples/bad.py:3: SyntaxError: invalid syntax");
        assert!(detail.contains("File \"examples/bad.py\", line 3"), "{detail}");
        assert!(!detail.contains("Caused by"), "{detail}");
    }

    #[test]
    fn the_sandbox_is_read_only_but_for_the_given_directories() {
        let args =
            sandbox_args(Path::new("/t"), &[Path::new("/t/out"), Path::new("/t/scratch")], Path::new("/t/scratch"));
        let args: Vec<String> = args.iter().map(|a| a.to_string_lossy().into_owned()).collect();
        let text = args.join(" ");
        // `/` read-only first; the later binds are mounted over it, the writable ones last.
        assert!(
            text.starts_with("--ro-bind / / --dev /dev --proc /proc --ro-bind /t /t --bind /t/out /t/out --bind /t/scratch /t/scratch "),
            "{text}"
        );
        assert_eq!(args.iter().filter(|a| *a == "--bind").count(), 2, "{text}");
        assert!(text.contains("--setenv TMPDIR /t/scratch --chdir /t"), "{text}");
        assert!(text.ends_with("--unshare-all --die-with-parent --new-session --"), "{text}");
    }

    #[test]
    fn a_pyproject_that_is_not_toml_keeps_the_parser_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pyproject.toml"), "[project\nname = ").unwrap();
        let Err(e) = project(dir.path()) else { panic!("a broken pyproject.toml was read") };
        assert!(matches!(&e, PyBuildError::Pyproject { .. }), "{e:?}");
        let source = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<toml::de::Error>());
        assert!(source.is_some(), "{e:?}");
        assert!(e.to_string().contains("pyproject.toml: not valid TOML: "), "{e}");
    }

    #[test]
    fn module_names_are_checked() {
        assert!(is_identifier("review_changed"));
        assert!(!is_identifier("review-changed"));
        assert!(!is_identifier("1x"));
        assert!(!is_identifier(""));
    }
}
