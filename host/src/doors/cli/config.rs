//! `factory config`: which `factory.toml` is in use, and the direnv-style approval of
//! project-local ones. A config found at or below the working directory (a repository's
//! `.factory/factory.toml`, or one in a state directory inside the project) came with the
//! directory, not from the user, and can define backends that run commands, so it is used
//! only after `factory config allow [FILE]` has recorded the sha256 of its contents in the
//! user-level allow list; an edited file is refused until it is allowed again.
//! `factory config deny [FILE]` forgets the approval.

use crate::doors::args::GlobalArgs;
use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use factory_host::access::{self, AllowList};
use factory_host::config::{Config, CONFIG_FILE, PROJECT_DIR};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// `factory config`.
#[derive(Args)]
pub struct ConfigArgs {
    #[command(subcommand)]
    command: Option<ConfigCommand>,
    /// Print JSON.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Approve a project-local config file's current contents (default: .factory/factory.toml).
    Allow {
        /// The file.
        file: Option<PathBuf>,
    },
    /// Forget the approval of a config file (default: .factory/factory.toml).
    Deny {
        /// The file.
        file: Option<PathBuf>,
    },
}

fn default_file() -> PathBuf {
    Path::new(PROJECT_DIR).join(CONFIG_FILE)
}

pub fn config(g: &GlobalArgs, a: ConfigArgs) -> Result<ExitCode> {
    let allow_list = AllowList::user()?;
    match a.command {
        Some(ConfigCommand::Allow { file }) => {
            let file = file.unwrap_or_else(default_file);
            // Check it is a config this host accepts before approving it.
            let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
            Config::parse(&text, &file.display().to_string())?;
            let entry = allow_list.allow(&file)?;
            outln!("allowed {} (sha256 {}); an edited file needs allowing again", entry.path, entry.sha256);
            Ok(ExitCode::SUCCESS)
        }
        Some(ConfigCommand::Deny { file }) => {
            let file = file.unwrap_or_else(default_file);
            if allow_list.revoke(&file)? {
                outln!("no longer allowed: {}", file.display());
            } else {
                outln!("was not allowed: {}", file.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        None => {
            let found = Config::discover_path(&g.state_dir);
            let local = found.as_deref().is_some_and(access::is_project_local);
            let allowed = allow_list.list()?;
            if a.json {
                let out = serde_json::json!({
                    "stateDir": g.state_dir,
                    "config": found,
                    "projectLocal": local,
                    "allowList": allow_list.path(),
                    "allowed": allowed,
                });
                outln!("{}", serde_json::to_string_pretty(&out)?);
                return Ok(ExitCode::SUCCESS);
            }
            outln!("state dir:  {}", g.state_dir.display());
            match &found {
                Some(path) if local => outln!("config:     {} (project-local: used only when allowed)", path.display()),
                Some(path) => outln!("config:     {}", path.display()),
                None => outln!("config:     none (built-in backends only)"),
            }
            outln!("allow list: {}", allow_list.path().display());
            for f in allowed {
                outln!("  {}  {}  {}", f.sha256, f.allowed_at, f.path);
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
