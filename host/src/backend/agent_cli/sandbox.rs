//! Where a sandboxed agent CLI runs: the mounts of its bubblewrap sandbox ([`Layout`]: the
//! system directories and home read-only, the secrets and the callers' directories hidden
//! unless granted, the grants read-only, its working directory writable, the sealed paths
//! hidden last), finding the programs, and the failure when bubblewrap is missing.

use super::{AgentCliConfig, DEFAULT_HIDDEN};
use crate::backend::{BackendError, OutageKind};
use crate::bwrap::{self, Flag};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The system directories a sandboxed CLI sees, read-only (those that exist).
const SYSTEM_DIRS: &[&str] = &[
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/opt",
    "/nix",
    "/snap",
    "/run/systemd/resolve",
    "/run/resolvconf",
];

/// `program` as an absolute path: as given when it holds a `/`, else found on `path`.
pub(super) fn resolve_program(program: &str, path: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    if program.contains('/') {
        return std::path::absolute(program).ok().filter(|p| p.is_file());
    }
    std::env::split_paths(path?).map(|dir| dir.join(program)).find(|candidate| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(candidate).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// What a sandboxed spawn's mounts depend on.
pub(super) struct Layout<'a> {
    pub(super) config: &'a AgentCliConfig,
    /// `$HOME`, when set.
    pub(super) home: Option<PathBuf>,
    /// The host's working directory (canonical), hidden unless granted.
    pub(super) host_cwd: Option<PathBuf>,
    /// The CLI itself, bound read-only when it lies outside what the sandbox shows.
    pub(super) program: &'a Path,
    pub(super) scratch: &'a Path,
}

impl Layout<'_> {
    /// Whether `path` lies in a tree the sandbox mounts (system directories, home).
    fn visible(&self, path: &Path) -> bool {
        SYSTEM_DIRS.iter().any(|d| path.starts_with(d)) || self.home.as_ref().is_some_and(|h| path.starts_with(h))
    }

    /// The paths hidden unless granted ([`DEFAULT_HIDDEN`], [`AgentCliConfig::hidden`], the
    /// host's working directory), canonical, those that exist.
    fn hidden(&self) -> Vec<PathBuf> {
        let mut hidden: Vec<PathBuf> = DEFAULT_HIDDEN.iter().filter_map(|p| self.in_home(Path::new(p))).collect();
        hidden.extend(self.config.hidden.iter().filter_map(|p| self.in_home(p)));
        hidden.extend(self.host_cwd.clone());
        canonical_set(&hidden)
    }

    /// Where `real` appears inside the sandbox once everything is mounted: at its own path
    /// when a mounted tree holds it (system directories, home, a grant, `cwd`), and below
    /// `/grant/<i>` when grant `i` holds it.
    fn appearances(&self, real: &Path) -> Vec<PathBuf> {
        let mut at = Vec::new();
        let own = self.visible(real)
            || self.config.grants.iter().any(|g| real.starts_with(g))
            || self.config.cwd.as_ref().is_some_and(|c| real.starts_with(c));
        if own {
            at.push(real.to_path_buf());
        }
        for (index, grant) in self.config.grants.iter().enumerate() {
            if let Ok(rest) = real.strip_prefix(grant) {
                at.push(PathBuf::from(crate::model::grant::mount_point(index)).join(rest));
            }
        }
        at
    }

    fn in_home(&self, path: &Path) -> Option<PathBuf> {
        if path.is_absolute() {
            Some(path.to_path_buf())
        } else {
            self.home.as_ref().map(|h| h.join(path))
        }
    }

    /// The `bwrap` arguments before the command, `--` last.
    pub(super) fn args(&self) -> Vec<OsString> {
        let mut args = bwrap::Args::new();
        args.flags(&[
            Flag::DieWithParent,
            Flag::NewSession,
            Flag::UnsharePid,
            Flag::UnshareIpc,
            Flag::UnshareUts,
            Flag::UnshareCgroupTry,
        ])
        .cap_drop_all();
        for &dir in SYSTEM_DIRS {
            args.ro_bind_try(dir, dir);
        }
        args.dev("/dev").proc("/proc").tmpfs("/tmp");
        if let Some(home) = &self.home {
            args.ro_bind_try(home, home);
        }
        // Hidden unless granted: other tools' keys, the factory's default state, the host's
        // (and the caller's) working directory.
        let hidden = self.hidden();
        for real in &hidden {
            if self.visible(real) {
                args.mask(real, real);
            }
        }
        for path in self.config.writable.iter().filter_map(|p| self.in_home(p)) {
            args.bind_try(&path, &path);
        }
        let masked = |p: &Path| hidden.iter().any(|h| p.starts_with(h));
        if !self.visible(self.program) || masked(self.program) {
            args.ro_bind(self.program, self.program);
        }
        for (index, grant) in self.config.grants.iter().enumerate() {
            let inside = OsString::from(crate::model::grant::mount_point(index));
            args.ro_bind(grant, grant).ro_bind(grant, inside);
        }
        if let Some(dir) = &self.config.cwd {
            args.bind(dir, dir);
        }
        // Sealed, last, so no grant, `cwd` or writable path shows them again: the serving
        // process's state directories, token files and control socket.
        for real in canonical_set(&self.config.sealed) {
            for at in self.appearances(&real) {
                args.mask(&real, &at);
            }
        }
        let workdir = self.config.cwd.as_deref().unwrap_or(self.scratch);
        args.bind(self.scratch, self.scratch).chdir(workdir);
        args.finish()
    }
}

/// `paths` canonical (those that exist), sorted, without `/` and without those inside another
/// (a mask over a path inside a masked directory would create it there again, empty).
fn canonical_set(paths: &[PathBuf]) -> Vec<PathBuf> {
    let mut real: Vec<PathBuf> =
        paths.iter().filter_map(|p| std::fs::canonicalize(p).ok()).filter(|p| p != Path::new("/")).collect();
    real.sort();
    let mut kept: Vec<PathBuf> = Vec::with_capacity(real.len());
    for path in real {
        if !kept.iter().any(|outer| path.starts_with(outer)) {
            kept.push(path);
        }
    }
    kept
}

/// A bubblewrap that is not there: a backend failure naming what to install.
pub(super) fn no_bubblewrap(who: &str, bwrap: &Path, why: &str) -> BackendError {
    BackendError::outage(
        OutageKind::NotInstalled,
        format!(
            "{who}: bubblewrap (`{}`), which sandboxes agent CLIs, {why}: install it (Debian/Ubuntu: \
             `apt install bubblewrap`), or run this backend unsandboxed with `sandbox = \"none\"` in its \
             factory.toml entry (see README, \"Security model\")",
            bwrap.display()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Hidden;

    #[test]
    fn sealed_paths_are_masked_last_wherever_they_appear_and_the_callers_dir_unless_granted() {
        let root = std::env::temp_dir().join(format!("factory-layout-{}", uuid::Uuid::new_v4().simple()));
        let grant = root.join("granted");
        let state = grant.join("state");
        let caller = root.join("project");
        for dir in [&state, &caller, &root.join("scratch")] {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(grant.join("cluster.token"), "t").unwrap();
        let root = root.canonicalize().unwrap();
        let (grant, state, caller) = (root.join("granted"), root.join("granted/state"), root.join("project"));
        let token = grant.join("cluster.token");
        let config =
            AgentCliConfig { grants: vec![grant.clone()], ..AgentCliConfig::generic("cli:t", vec!["true".into()]) };
        std::fs::write(state.join("control.sock"), "").unwrap();
        let sealed = vec![state.join("control.sock"), state.clone(), token.clone(), root.join("missing")];
        let config = config.hiding(&Hidden { sealed, unless_granted: vec![caller.clone()] });
        let scratch = root.join("scratch");
        let program = Path::new("/usr/bin/true");
        let layout = Layout { config: &config, home: Some(root.clone()), host_cwd: None, program, scratch: &scratch };
        let args: Vec<String> = layout.args().iter().map(|a| a.to_string_lossy().into_owned()).collect();
        let at = |window: &[&str]| {
            args.windows(window.len()).position(|w| w == window).unwrap_or_else(|| panic!("no {window:?} in {args:?}"))
        };
        let path = |p: &Path| p.display().to_string();
        let granted = at(&["--ro-bind", &path(&grant), "/grant/0"]);
        // The caller's directory is hidden before the grants (a grant of it shows it again)...
        assert!(at(&["--tmpfs", &path(&caller)]) < granted);
        // ...the service's files after them, at their own path and at the grant's alias.
        assert!(at(&["--tmpfs", &path(&state)]) > granted);
        assert!(at(&["--tmpfs", "/grant/0/state"]) > granted);
        assert!(at(&["--ro-bind", "/dev/null", &path(&token)]) > granted);
        assert!(at(&["--ro-bind", "/dev/null", "/grant/0/cluster.token"]) > granted);
        assert!(!args.iter().any(|a| a.contains("missing")), "a path that does not exist is skipped: {args:?}");
        // A path inside a masked directory is not masked again (that would create it there).
        assert!(!args.iter().any(|a| a.contains("control.sock")), "{args:?}");
        let _ = std::fs::remove_dir_all(root);
    }
}
