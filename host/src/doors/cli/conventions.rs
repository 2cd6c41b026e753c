//! The CLI's conventions: `factory completions SHELL` (shell completion scripts generated
//! from the clap definition by `clap_complete`), `factory man` (the man page, roff, generated
//! by `clap_mangen`), and colour: `--color auto|always|never`, where `auto` honours
//! `NO_COLOR`, `CLICOLOR`/`CLICOLOR_FORCE`, `TERM=dumb` and whether the stream is a
//! terminal (anstream's rules); `always` and `never` win over the environment. The choice is
//! made once, before the arguments are parsed (so clap's own help and errors follow it), and
//! everything that colours its output asks [`stderr_colored`].

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use std::ffi::OsString;
use std::process::ExitCode;

/// `--color`: when to colour output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Default)]
pub enum ColorWhen {
    /// Colour a terminal, unless `NO_COLOR` is set (or `TERM=dumb`); `CLICOLOR_FORCE` forces it.
    #[default]
    Auto,
    /// Always colour, whatever the stream and the environment.
    Always,
    /// Never colour.
    Never,
}

impl ColorWhen {
    fn choice(self) -> anstream::ColorChoice {
        match self {
            ColorWhen::Auto => anstream::ColorChoice::Auto,
            ColorWhen::Always => anstream::ColorChoice::Always,
            ColorWhen::Never => anstream::ColorChoice::Never,
        }
    }
}

/// The `--color` value among `args` (`--color X` or `--color=X`, before a `--`), read before
/// clap parses them so clap's own help and errors are coloured (or not) accordingly. An
/// invalid value is left for clap to report.
pub fn color_from_args(args: &[OsString]) -> ColorWhen {
    let mut found = ColorWhen::Auto;
    let mut iter = args.iter().skip(1);
    while let Some(arg) = iter.next() {
        let Some(arg) = arg.to_str() else { continue };
        if arg == "--" {
            break;
        }
        let value = if arg == "--color" { iter.next().and_then(|v| v.to_str()) } else { arg.strip_prefix("--color=") };
        if let Some(when) = value.and_then(|v| ColorWhen::from_str(v, false).ok()) {
            found = when;
        }
    }
    found
}

/// Make `when` the process-wide colour choice (read by clap and by [`stderr_colored`]).
pub fn apply_color(when: ColorWhen) {
    when.choice().write_global();
}

/// Whether output written to stderr is coloured, after `--color` and the environment.
pub fn stderr_colored() -> bool {
    anstream::AutoStream::choice(&std::io::stderr()) != anstream::ColorChoice::Never
}

/// `text` in `style` when `colored`, else as it is.
pub fn paint(colored: bool, style: anstyle::Style, text: &str) -> String {
    if colored {
        format!("{style}{text}{style:#}")
    } else {
        text.to_string()
    }
}

/// `factory completions`: which shell.
#[derive(Args)]
pub struct CompletionsArgs {
    /// The shell to print a completion script for.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

/// `factory completions SHELL`: print the completion script for the whole command line.
pub fn completions(mut command: clap::Command, a: CompletionsArgs) -> Result<ExitCode> {
    // Generated into memory first: clap_complete panics when its writer fails (a closed pipe).
    let mut script = Vec::new();
    clap_complete::generate(a.shell, &mut command, "factory", &mut script);
    crate::doors::cli::out::write_all(&script);
    Ok(ExitCode::SUCCESS)
}

/// `factory man`: print the man page (roff) of the whole command line.
pub fn man(command: clap::Command) -> Result<ExitCode> {
    let mut page = Vec::new();
    clap_mangen::Man::new(command).render(&mut page).context("rendering the man page")?;
    crate::doors::cli::out::write_all(&page);
    Ok(ExitCode::SUCCESS)
}

/// `factory cli-reference` (hidden): print the CLI reference chapter of the book
/// (`docs/src/reference/cli.md`) as Markdown: every command's long help, as `--help` prints
/// it, at a fixed width and without environment values, so the text depends on the
/// definition only. `tests/docs.rs` checks the committed chapter equals it.
pub fn cli_reference(command: clap::Command) -> Result<ExitCode> {
    let mut page = String::from(concat!(
        "# CLI reference\n\n",
        "<!-- Generated from the clap definition by `factory cli-reference`; do not edit. Regenerate:\n",
        "     cargo run --bin factory -- cli-reference > docs/src/reference/cli.md -->\n\n",
        "Every command's `--help`, as the binary prints it (the global options once, under `factory`).\n",
        "[Running and resuming: the CLI](../guide/running.md) explains what the commands do; `factory man` prints\n",
        "the same as a man page.\n",
    ));
    let mut command = command.term_width(100).max_term_width(100);
    command.build();
    reference_section(&mut page, &mut command, "factory", 2);
    crate::doors::cli::out::write_all(page.as_bytes());
    Ok(ExitCode::SUCCESS)
}

/// One command's section of [`cli_reference`], then its visible subcommands'.
fn reference_section(page: &mut String, command: &mut clap::Command, path: &str, depth: usize) {
    // The global options are shown once, under `factory`.
    let top = depth == 2;
    let mut shown = command
        .clone()
        .mut_args(|a| {
            let global = !top && a.is_global_set();
            let a = a.hide_env_values(true);
            if global {
                a.hide(true)
            } else {
                a
            }
        })
        .bin_name(path);
    let help = shown.render_long_help().to_string();
    let help: Vec<&str> = help.lines().map(str::trim_end).collect();
    page.push_str(&format!("\n{} `{path}`\n\n```text\n{}\n```\n", "#".repeat(depth), help.join("\n").trim_end()));
    let names: Vec<String> =
        command.get_subcommands().filter(|c| !c.is_hide_set()).map(|c| c.get_name().to_string()).collect();
    for name in names {
        if name == "help" {
            continue;
        }
        if let Some(sub) = command.find_subcommand_mut(&name) {
            reference_section(page, sub, &format!("{path} {name}"), (depth + 1).min(4));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    #[test]
    fn color_is_read_before_parsing() {
        assert_eq!(color_from_args(&args(&["factory", "run", "x"])), ColorWhen::Auto);
        assert_eq!(color_from_args(&args(&["factory", "--color", "never", "run"])), ColorWhen::Never);
        assert_eq!(color_from_args(&args(&["factory", "run", "--color=always"])), ColorWhen::Always);
        // After `--` it is an argument, not the option; an invalid value is clap's to report.
        assert_eq!(color_from_args(&args(&["factory", "run", "--", "--color=always"])), ColorWhen::Auto);
        assert_eq!(color_from_args(&args(&["factory", "--color", "pink"])), ColorWhen::Auto);
    }

    #[test]
    fn paint_only_when_colored() {
        let red = anstyle::AnsiColor::Red.on_default();
        assert_eq!(paint(false, red, "x"), "x");
        assert_eq!(paint(true, red, "x"), "\x1b[31mx\x1b[0m");
    }
}

/// An error and its causes on one line, `: `-separated, each cause said once: a cause whose
/// text an earlier part of the line already holds (many errors repeat their source in their
/// own message) is left out, and once the root cause's text is on the line nothing more is
/// added.
pub fn error_chain(error: &anyhow::Error) -> String {
    let root = error.root_cause().to_string();
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
        if line.contains(&root) {
            break;
        }
    }
    line
}

#[cfg(test)]
mod chain_tests {
    #[test]
    fn each_cause_is_said_once() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        #[derive(Debug)]
        struct Wraps(std::io::Error);
        impl std::fmt::Display for Wraps {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "error connecting to server: {}", self.0)
            }
        }
        impl std::error::Error for Wraps {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let error = anyhow::Error::new(Wraps(io)).context("opening the shared store");
        assert_eq!(
            super::error_chain(&error),
            "opening the shared store: error connecting to server: Connection refused"
        );
        let plain = anyhow::anyhow!("root").context("middle").context("top");
        assert_eq!(super::error_chain(&plain), "top: middle: root");
    }
}
