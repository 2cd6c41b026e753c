//! Local access control: where the user's state and config live, files only their owner
//! can read, and the direnv-style allow list for config files the user did not put in a
//! user-level place themselves.
//!
//! - **State** lives in a user-level directory by default ([`default_state_dir`]:
//!   `$XDG_STATE_HOME/factory`, else `~/.local/state/factory`), never in the working
//!   directory: a cloned repository cannot choose the store, the trust store or the config.
//! - **Private files**: state directories are created `0700` ([`create_private_dir`]) and
//!   every file the host creates in them `0600` ([`create_private_file`]); a file we own that
//!   is looser is tightened when we open it ([`tighten`]).
//! - **Found as it is, refused if not ours**: an existing state directory must be ours and
//!   not writable by group or others ([`private_state_dir`]); the files in it are opened
//!   without following symlinks and must be ours ([`private_file_options`],
//!   [`tighten_open`], [`read_private_file`]), so files planted by someone else are
//!   refused, never reused.
//! - **Project-local files** ([`is_project_local`]: at or below the working directory, and
//!   not inside the user-level state or config directories) never decide what runs on their
//!   own: a `factory.toml` there is used only when its exact contents (sha256) were approved
//!   with `factory config allow`, recorded in the user-level [`AllowList`]. An edited file
//!   needs approving again.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Why a user-level location or the allow list cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    /// Neither `$XDG_STATE_HOME`/`$XDG_CONFIG_HOME` nor `$HOME` is set (to an absolute path).
    #[error("cannot find the user's {what} directory: set $HOME (or {var}, or pass --state-dir)")]
    NoHome { what: &'static str, var: &'static str },
    /// A file could not be read.
    #[error("cannot read `{path}`: {source}")]
    Read { path: String, source: std::io::Error },
    /// A file could not be written.
    #[error("cannot write `{path}`: {source}")]
    Write { path: String, source: std::io::Error },
    /// The allow list does not parse.
    #[error("the allow list `{path}` is unreadable ({message}); fix or delete it (every project config will then need allowing again)")]
    Corrupt { path: String, message: String },
    /// A file someone else could have written.
    #[error("`{path}` {problem}; refusing to use it")]
    Unsafe { path: String, problem: String },
}

/// The name of the state and config directories under the XDG roots.
const APP: &str = "factory";

/// An absolute directory from an environment variable (XDG says relative ones are ignored).
fn env_dir(var: &str) -> Option<PathBuf> {
    std::env::var_os(var).map(PathBuf::from).filter(|p| p.is_absolute())
}

/// The user-level state directory: `$XDG_STATE_HOME/factory`, else
/// `$HOME/.local/state/factory`.
pub fn default_state_dir() -> Result<PathBuf, AccessError> {
    if let Some(dir) = env_dir("XDG_STATE_HOME") {
        return Ok(dir.join(APP));
    }
    env_dir("HOME")
        .map(|home| home.join(".local").join("state").join(APP))
        .ok_or(AccessError::NoHome { what: "state", var: "$XDG_STATE_HOME" })
}

/// The user-level config directory: `$XDG_CONFIG_HOME/factory`, else `$HOME/.config/factory`.
pub fn user_config_dir() -> Result<PathBuf, AccessError> {
    if let Some(dir) = env_dir("XDG_CONFIG_HOME") {
        return Ok(dir.join(APP));
    }
    env_dir("HOME")
        .map(|home| home.join(".config").join(APP))
        .ok_or(AccessError::NoHome { what: "config", var: "$XDG_CONFIG_HOME" })
}

/// `path` made absolute and canonical as far as it exists (the missing tail is kept).
fn resolved(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut existing = absolute.as_path();
    let mut tail = Vec::new();
    loop {
        if let Ok(canonical) = existing.canonicalize() {
            return tail.iter().rev().fold(canonical, |p, c: &&std::ffi::OsStr| p.join(c));
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                tail.push(name);
                existing = parent;
            }
            _ => return absolute,
        }
    }
}

/// Is `path` a project-local location: at or below the current working directory, and not
/// inside the user-level state or config directory? Such files came with the directory the
/// user is working in (a cloned repository), not from the user.
pub fn is_project_local(path: &Path) -> bool {
    let Ok(cwd) = std::env::current_dir() else { return false };
    let path = resolved(path);
    let user_level = [default_state_dir(), user_config_dir()];
    if user_level.into_iter().flatten().any(|dir| path.starts_with(resolved(&dir))) {
        return false;
    }
    path.starts_with(resolved(&cwd))
}

/// This process's effective user id.
pub fn our_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Is a file or directory with this metadata ours and not writable by anyone else?
/// `Err` says what is wrong with it.
pub fn check_owned_private(meta: &std::fs::Metadata) -> Result<(), String> {
    if meta.uid() != our_uid() {
        return Err(format!("is owned by uid {}, not by us (uid {})", meta.uid(), our_uid()));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!("is writable by group or others (mode {:o})", meta.mode() & 0o7777));
    }
    Ok(())
}

/// Create `dir` (and missing parents) with mode `0700`; an existing directory is left as it
/// is (it may be a directory the user chose on purpose, such as a shared one).
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// Use `dir` as a private state directory: created `0700` (with missing parents) when it
/// does not exist; an existing one must be a directory of ours that neither group nor others
/// can write, else [`AccessError::Unsafe`] (someone else could plant or swap its files).
pub fn private_state_dir(dir: &Path) -> Result<(), AccessError> {
    let shown = || dir.display().to_string();
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| AccessError::Write { path: shown(), source }),
        Err(source) => Err(AccessError::Read { path: shown(), source }),
        Ok(meta) if !meta.is_dir() => Err(AccessError::Unsafe { path: shown(), problem: "is not a directory".into() }),
        Ok(meta) => check_owned_private(&meta).map_err(|problem| AccessError::Unsafe { path: shown(), problem }),
    }
}

/// Open options that create a file with mode `0600` (write access; add what you need) and
/// never follow a symlink in the last component (opening one fails with `ELOOP`).
pub fn private_file_options() -> std::fs::OpenOptions {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).mode(0o600).custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits());
    options
}

/// Read a file of ours that nobody else can write, without following a symlink: `None`
/// when it does not exist; an error (`PermissionDenied`, saying why) when it is someone
/// else's, writable by group or others, or not a regular file.
pub fn read_private_file(path: &Path) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::Read;
    let opened = std::fs::OpenOptions::new().read(true).custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits()).open(path);
    let mut file = match opened {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "not a regular file; refusing to use it",
        ));
    }
    check_owned_private(&meta).map_err(|problem| {
        std::io::Error::new(std::io::ErrorKind::PermissionDenied, format!("{problem}; refusing to use it"))
    })?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(Some(bytes))
}

/// Create (truncate) `path` with mode `0600`; an existing file we own is tightened to `0600`.
pub fn create_private_file(path: &Path) -> std::io::Result<std::fs::File> {
    let file = private_file_options().truncate(true).open(path)?;
    tighten_open(&file)?;
    Ok(file)
}

/// Make an open file of ours `0600` if it is readable or writable by anyone else; a regular
/// file that is not ours is refused (`PermissionDenied`): someone else put it there. Devices
/// and pipes (`/dev/null`, a FIFO the user named) are left as they are.
pub fn tighten_open(file: &std::fs::File) -> std::io::Result<()> {
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Ok(());
    }
    if meta.uid() != our_uid() {
        let message = format!("is owned by uid {}, not by us (uid {}); refusing to use it", meta.uid(), our_uid());
        return Err(std::io::Error::new(std::io::ErrorKind::PermissionDenied, message));
    }
    if meta.mode() & 0o077 != 0 {
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

/// [`tighten_open`] for a path (a file created by a library that takes a path, e.g. redb),
/// opened without following a symlink.
pub fn tighten(path: &Path) -> std::io::Result<()> {
    tighten_open(&std::fs::OpenOptions::new().read(true).custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits()).open(path)?)
}

/// The sha256 (hex) of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// One approved project-local config file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllowedFile {
    /// The file's canonical path.
    pub path: String,
    /// The sha256 of the contents the user approved.
    pub sha256: String,
    /// When (RFC 3339).
    pub allowed_at: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct AllowFile {
    version: u32,
    files: Vec<AllowedFile>,
}

/// The allow list's file name in the user-level state directory.
pub const ALLOW_FILE: &str = "allowed-configs.json";

/// The approved project-local config files, in the user-level state directory (never in a
/// state directory given with `--state-dir`, which may be project-local itself).
#[derive(Debug, Clone)]
pub struct AllowList {
    path: PathBuf,
}

impl AllowList {
    /// The user's allow list.
    pub fn user() -> Result<Self, AccessError> {
        Ok(AllowList { path: default_state_dir()?.join(ALLOW_FILE) })
    }

    /// The allow list file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn shown(&self) -> String {
        self.path.display().to_string()
    }

    /// Every approved file.
    pub fn list(&self) -> Result<Vec<AllowedFile>, AccessError> {
        let text = match read_private_file(&self.path) {
            Ok(Some(text)) => text,
            Ok(None) => return Ok(Vec::new()),
            Err(source) => return Err(AccessError::Read { path: self.shown(), source }),
        };
        let file: AllowFile = serde_json::from_slice(&text)
            .map_err(|e| AccessError::Corrupt { path: self.shown(), message: e.to_string() })?;
        Ok(file.files)
    }

    /// Were these exact contents of `file` approved?
    pub fn is_allowed(&self, file: &Path, sha256: &str) -> Result<bool, AccessError> {
        let path = resolved(file).display().to_string();
        Ok(self.list()?.iter().any(|f| f.path == path && f.sha256 == sha256))
    }

    /// Approve `file`'s current contents (replacing an earlier approval of that path);
    /// returns the approved entry.
    pub fn allow(&self, file: &Path) -> Result<AllowedFile, AccessError> {
        let bytes =
            std::fs::read(file).map_err(|source| AccessError::Read { path: file.display().to_string(), source })?;
        let entry = AllowedFile {
            path: resolved(file).display().to_string(),
            sha256: sha256_hex(&bytes),
            allowed_at: humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
        };
        let mut files = self.list()?;
        files.retain(|f| f.path != entry.path);
        files.push(entry.clone());
        self.write(files)?;
        Ok(entry)
    }

    /// Forget the approval of `file`; false when there was none.
    pub fn revoke(&self, file: &Path) -> Result<bool, AccessError> {
        let path = resolved(file).display().to_string();
        let mut files = self.list()?;
        let before = files.len();
        files.retain(|f| f.path != path);
        if files.len() == before {
            return Ok(false);
        }
        self.write(files)?;
        Ok(true)
    }

    fn write(&self, files: Vec<AllowedFile>) -> Result<(), AccessError> {
        let err = |source| AccessError::Write { path: self.shown(), source };
        if let Some(dir) = self.path.parent() {
            create_private_dir(dir).map_err(err)?;
        }
        let mut text = serde_json::to_vec_pretty(&AllowFile { version: 1, files })
            .map_err(|e| AccessError::Corrupt { path: self.shown(), message: e.to_string() })?;
        text.push(b'\n');
        let tmp = self.path.with_extension(format!("json.tmp{}", std::process::id()));
        let written = (|| {
            let mut out = create_private_file(&tmp)?;
            out.write_all(&text)?;
            out.sync_all()?;
            std::fs::rename(&tmp, &self.path)
        })();
        if let Err(source) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(err(source));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_files_and_dirs_have_owner_only_modes() {
        let root = std::env::temp_dir().join(format!("factory-access-{}", uuid::Uuid::new_v4()));
        let dir = root.join("a").join("b");
        create_private_dir(&dir).expect("create");
        assert_eq!(std::fs::metadata(&dir).expect("meta").mode() & 0o777, 0o700);
        let file = dir.join("f");
        std::fs::write(&file, b"x").expect("write");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        drop(create_private_file(&file).expect("create file"));
        assert_eq!(std::fs::metadata(&file).expect("meta").mode() & 0o777, 0o600);
        let meta = std::fs::metadata(&file).expect("meta");
        assert!(check_owned_private(&meta).is_ok());
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        let meta = std::fs::metadata(&file).expect("meta");
        assert!(check_owned_private(&meta).unwrap_err().contains("writable by group or others"));
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn devices_are_left_as_they_are_and_symlinks_are_not_followed() {
        // `--events /dev/null` keeps working whoever owns the device.
        let null = private_file_options().truncate(false).open("/dev/null").expect("open /dev/null");
        tighten_open(&null).expect("a device is not tightened or refused");
        let root = std::env::temp_dir().join(format!("factory-access-link-{}", uuid::Uuid::new_v4()));
        create_private_dir(&root).expect("create");
        std::fs::write(root.join("target"), b"x").expect("write");
        std::os::unix::fs::symlink(root.join("target"), root.join("link")).expect("symlink");
        assert!(private_file_options().open(root.join("link")).is_err(), "a symlink is not followed");
        assert!(read_private_file(&root.join("link")).is_err(), "a symlink is not read through");
        assert_eq!(read_private_file(&root.join("target")).expect("read").as_deref(), Some(&b"x"[..]));
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn resolved_keeps_the_missing_tail() {
        let tmp = std::env::temp_dir().canonicalize().expect("tmp");
        let missing = tmp.join("factory-no-such-dir").join("x");
        assert_eq!(resolved(&missing), missing);
    }
}
