//! Bubblewrap (`bwrap`), the OS sandbox the host starts native code in: the Rust build's
//! cargo, the Python build's componentize-py and the agent CLIs. This module owns its command
//! line ([`Args`]: each set-up option typed, in the order given, then `--` and the command),
//! where the program is found ([`BWRAP`], [`from_env`]), how a path is hidden inside it
//! ([`Args::mask`]) and how bubblewrap says that it could not set a sandbox up
//! ([`own_failure`]). What each sandbox mounts and unshares is its user's policy, not this
//! module's.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

/// The bubblewrap program when none is named: `bwrap`, looked up on `PATH`.
pub const BWRAP: &str = "bwrap";

/// The bubblewrap program a build uses: `$FACTORY_BWRAP`, else [`BWRAP`].
pub fn from_env() -> PathBuf {
    std::env::var_os("FACTORY_BWRAP").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(BWRAP))
}

/// A `bwrap` option that takes no value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flag {
    /// `--die-with-parent`: the sandbox ends when the process that started it does.
    DieWithParent,
    /// `--new-session`: a session of its own (no terminal to push input into).
    NewSession,
    /// `--unshare-all`: every namespace of its own, the network's included.
    UnshareAll,
    /// `--unshare-net`: a network namespace of its own (only a loopback of its own).
    UnshareNet,
    /// `--unshare-pid`: a PID namespace of its own.
    UnsharePid,
    /// `--unshare-ipc`: an IPC namespace of its own.
    UnshareIpc,
    /// `--unshare-uts`: a UTS namespace (host name) of its own.
    UnshareUts,
    /// `--unshare-cgroup-try`: a cgroup namespace of its own where the kernel allows it.
    UnshareCgroupTry,
}

impl Flag {
    /// The option as `bwrap` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Flag::DieWithParent => "--die-with-parent",
            Flag::NewSession => "--new-session",
            Flag::UnshareAll => "--unshare-all",
            Flag::UnshareNet => "--unshare-net",
            Flag::UnsharePid => "--unshare-pid",
            Flag::UnshareIpc => "--unshare-ipc",
            Flag::UnshareUts => "--unshare-uts",
            Flag::UnshareCgroupTry => "--unshare-cgroup-try",
        }
    }
}

/// The arguments of one `bwrap` command line, in the order they are added (bubblewrap mounts
/// in that order: a later mount covers an earlier one).
#[derive(Debug, Clone, Default)]
pub struct Args(Vec<OsString>);

impl Args {
    /// No option yet.
    pub fn new() -> Args {
        Args::default()
    }

    fn push(&mut self, items: &[&OsStr]) -> &mut Args {
        self.0.extend(items.iter().map(|s| s.to_os_string()));
        self
    }

    /// Options that take no value, in order.
    pub fn flags(&mut self, flags: &[Flag]) -> &mut Args {
        self.0.extend(flags.iter().map(|f| OsString::from(f.as_str())));
        self
    }

    /// `--cap-drop ALL`: no capability inside.
    pub fn cap_drop_all(&mut self) -> &mut Args {
        self.push(&["--cap-drop".as_ref(), "ALL".as_ref()])
    }

    /// `--ro-bind SRC DEST`: `src` shown read-only at `dest`.
    pub fn ro_bind(&mut self, src: impl AsRef<OsStr>, dest: impl AsRef<OsStr>) -> &mut Args {
        self.push(&["--ro-bind".as_ref(), src.as_ref(), dest.as_ref()])
    }

    /// `--ro-bind-try SRC DEST`: [`Args::ro_bind`], skipped when `src` does not exist.
    pub fn ro_bind_try(&mut self, src: impl AsRef<OsStr>, dest: impl AsRef<OsStr>) -> &mut Args {
        self.push(&["--ro-bind-try".as_ref(), src.as_ref(), dest.as_ref()])
    }

    /// `--bind SRC DEST`: `src` shown writable at `dest`.
    pub fn bind(&mut self, src: impl AsRef<OsStr>, dest: impl AsRef<OsStr>) -> &mut Args {
        self.push(&["--bind".as_ref(), src.as_ref(), dest.as_ref()])
    }

    /// `--bind-try SRC DEST`: [`Args::bind`], skipped when `src` does not exist.
    pub fn bind_try(&mut self, src: impl AsRef<OsStr>, dest: impl AsRef<OsStr>) -> &mut Args {
        self.push(&["--bind-try".as_ref(), src.as_ref(), dest.as_ref()])
    }

    /// `--dev DEST`: a minimal `/dev` at `dest`.
    pub fn dev(&mut self, dest: impl AsRef<OsStr>) -> &mut Args {
        self.push(&["--dev".as_ref(), dest.as_ref()])
    }

    /// `--proc DEST`: the sandbox's own `/proc` at `dest`.
    pub fn proc(&mut self, dest: impl AsRef<OsStr>) -> &mut Args {
        self.push(&["--proc".as_ref(), dest.as_ref()])
    }

    /// `--tmpfs DEST`: an empty private directory at `dest`.
    pub fn tmpfs(&mut self, dest: impl AsRef<OsStr>) -> &mut Args {
        self.push(&["--tmpfs".as_ref(), dest.as_ref()])
    }

    /// `--setenv VAR VALUE` inside.
    pub fn setenv(&mut self, var: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> &mut Args {
        self.push(&["--setenv".as_ref(), var.as_ref(), value.as_ref()])
    }

    /// `--chdir DIR`: the command's working directory inside.
    pub fn chdir(&mut self, dir: impl AsRef<OsStr>) -> &mut Args {
        self.push(&["--chdir".as_ref(), dir.as_ref()])
    }

    /// Hide `real` (an existing path) where it appears inside as `at`: an empty directory
    /// nobody inside can write (mode 0555; with no capabilities) over a directory,
    /// `/dev/null` over anything else (a file, a socket).
    pub fn mask(&mut self, real: &Path, at: &Path) -> &mut Args {
        match std::fs::metadata(real) {
            Ok(m) if m.is_dir() => self.push(&["--perms".as_ref(), "0555".as_ref(), "--tmpfs".as_ref(), at.as_ref()]),
            _ => self.ro_bind("/dev/null", at),
        }
    }

    /// The options, then `--`: what goes before the command and its arguments.
    pub fn finish(mut self) -> Vec<OsString> {
        self.0.push("--".into());
        self.0
    }
}

/// Bubblewrap's own failure (no user namespaces, a mount it cannot make), said on `stderr`
/// as a first line `bwrap: ...` before any command started: that line.
pub fn own_failure(stderr: &str) -> Option<&str> {
    stderr.trim_start().lines().next().filter(|l| l.starts_with("bwrap:"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_kept_in_order_and_end_with_the_separator() {
        let mut args = Args::new();
        args.flags(&[Flag::DieWithParent, Flag::UnshareNet]).ro_bind("/", "/").tmpfs("/tmp").chdir("/");
        let text: Vec<String> = args.finish().iter().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(text.join(" "), "--die-with-parent --unshare-net --ro-bind / / --tmpfs /tmp --chdir / --");
    }

    #[test]
    fn a_directory_is_masked_by_an_empty_one_and_a_file_by_dev_null() {
        let dir = std::env::temp_dir();
        let mut args = Args::new();
        args.mask(&dir, Path::new("/x"));
        args.mask(Path::new("/no/such/file"), Path::new("/y"));
        let text: Vec<String> = args.finish().iter().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(text.join(" "), "--perms 0555 --tmpfs /x --ro-bind /dev/null /y --");
    }

    #[test]
    fn bubblewraps_own_failure_is_its_first_line() {
        assert_eq!(
            own_failure("\nbwrap: No permissions to creating new namespace\nmore"),
            Some("bwrap: No permissions to creating new namespace")
        );
        assert_eq!(own_failure("error: the command failed\nbwrap: late"), None);
    }
}
