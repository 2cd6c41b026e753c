//! The CLI's conventions through the real binary: `factory completions bash` sourced in a
//! real `bash` (the `complete` registration and the completion of a subcommand prefix),
//! zsh and fish scripts generated, `factory man` rendered by `man -l` (man-db), an
//! `Examples:` section in every command's `--help`, and colour: `--color always` puts ANSI
//! escapes in progress and help output, `--color never`, `NO_COLOR=1` and a non-terminal
//! stderr (auto) put none, and `--color always` wins over `NO_COLOR`. Output into a closed
//! pipe (`factory backends --prices | head -1`) ends the command quietly with exit code 0.

mod common;

use common::{factory_cmd, factory_in, root, stderr};
use std::process::{Command, Output};

/// Every subcommand of `factory` (its `--help` must have examples).
const COMMANDS: &[&str] = &[
    "run",
    "resume",
    "runs",
    "show",
    "progress",
    "wait",
    "cancel",
    "watch",
    "serve",
    "init",
    "test",
    "add",
    "list",
    "inspect",
    "describe",
    "backends",
    "build",
    "trust",
    "mcp",
    "ui",
    "config",
    "completions",
    "man",
];

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn ok(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}: {}\nstdout: {}\nstderr: {}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// A program needed by a test, or a failure saying how to install it.
fn need(program: &str, package: &str) {
    let found = Command::new("sh").args(["-c", &format!("command -v {program}")]).output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "`{program}` is needed by this test: apt-get install {package} (./test installs it)"
    );
}

#[test]
fn bash_completions_register_and_complete_subcommands() {
    need("bash", "bash");
    let state = tempfile::tempdir().unwrap();
    let out = factory_in(state.path(), &["completions", "bash"]);
    ok(&out, "factory completions bash");
    let script = state.path().join("factory.bash");
    std::fs::write(&script, &out.stdout).unwrap();
    // Source it in a real bash, then complete `factory ru` and `factory run --max-c` the
    // way bash does (COMP_WORDS/COMP_CWORD, then the registered function).
    let program = format!(
        r#"source '{}' || exit 9
complete -p factory || exit 8
fn=$(complete -p factory | sed -n 's/.*-F \([^ ]*\).*/\1/p')
COMP_WORDS=(factory ru); COMP_CWORD=1; COMP_LINE='factory ru'; COMP_POINT=${{#COMP_LINE}}
"$fn" factory ru factory
echo "subcommands: ${{COMPREPLY[*]}}"
COMP_WORDS=(factory run --max-c); COMP_CWORD=2; COMP_LINE='factory run --max-c'; COMP_POINT=${{#COMP_LINE}}
"$fn" factory --max-c run
echo "options: ${{COMPREPLY[*]}}"
compgen -W "${{COMPREPLY[*]}}" -- --max-concurrent
"#,
        script.display()
    );
    let out = Command::new("bash").args(["--norc", "--noprofile", "-c", &program]).output().expect("bash runs");
    ok(&out, "sourcing the completion script");
    let shown = text(&out.stdout);
    assert!(shown.contains("-F _factory factory"), "`complete -p factory` shows the registration: {shown}");
    let subcommands: Vec<&str> =
        shown.lines().find_map(|l| l.strip_prefix("subcommands: ")).unwrap_or_default().split_whitespace().collect();
    let mut sorted = subcommands.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, ["run", "runs"], "`factory ru<TAB>`: {shown}");
    let options = shown.lines().find_map(|l| l.strip_prefix("options: ")).unwrap_or_default();
    assert!(
        options.split_whitespace().any(|o| o == "--max-concurrent-subagents"),
        "`factory run --max-c<TAB>`: {shown}"
    );
    assert!(shown.lines().any(|l| l == "--max-concurrent-subagents"), "compgen of the completions: {shown}");
}

#[test]
fn zsh_and_fish_completions_name_every_subcommand() {
    let state = tempfile::tempdir().unwrap();
    for shell in ["zsh", "fish"] {
        let out = factory_in(state.path(), &["completions", shell]);
        ok(&out, shell);
        let script = text(&out.stdout);
        for command in COMMANDS {
            assert!(script.contains(command), "{shell} completions lack `{command}`");
        }
    }
    let zsh = text(&factory_in(state.path(), &["completions", "zsh"]).stdout);
    assert!(zsh.starts_with("#compdef factory"), "a zsh completion function file: {}", &zsh[..zsh.len().min(80)]);
    let wrong = factory_in(state.path(), &["completions", "tcsh"]);
    assert_eq!(wrong.status.code(), Some(2), "an unknown shell is a usage error: {}", stderr(&wrong));
}

#[test]
fn the_man_page_renders_with_man() {
    need("man", "man-db");
    let state = tempfile::tempdir().unwrap();
    let out = factory_in(state.path(), &["man"]);
    ok(&out, "factory man");
    let page = state.path().join("factory.1");
    std::fs::write(&page, &out.stdout).unwrap();
    assert!(text(&out.stdout).starts_with(".ie"), "roff: {}", &text(&out.stdout)[..40.min(out.stdout.len())]);
    let rendered = Command::new("man")
        .arg("-l")
        .arg(&page)
        .env("MANPAGER", "cat")
        .env("PAGER", "cat")
        .env("MANWIDTH", "100")
        .env("LC_ALL", "C.UTF-8")
        .output()
        .expect("man runs");
    ok(&rendered, "man -l factory.1");
    let shown = text(&rendered.stdout);
    assert!(shown.contains("NAME") && shown.contains("SYNOPSIS"), "a man page's sections: {shown}");
    let name = shown.split("NAME").nth(1).unwrap_or_default();
    assert!(
        name.trim_start().starts_with("factory") && name.contains("- Runs agent factories"),
        "the NAME line: {shown}"
    );
    for command in ["run", "resume", "completions", "init"] {
        assert!(shown.contains(&format!("factory-{command}(1)")), "the page lists `{command}`: {shown}");
    }
    assert!(shown.contains("--color"), "the global options: {shown}");
    assert!(!text(&rendered.stderr).contains("warning"), "groff warnings: {}", text(&rendered.stderr));
}

#[test]
fn every_command_help_has_examples() {
    let state = tempfile::tempdir().unwrap();
    for command in COMMANDS {
        let out = factory_in(state.path(), &[command, "--help"]);
        ok(&out, command);
        let help = text(&out.stdout);
        let examples = help
            .split("Examples:")
            .nth(1)
            .unwrap_or_else(|| panic!("`factory {command} --help` has no examples: {help}"));
        assert!(examples.contains(&format!("factory {command}")), "`{command}`'s examples use it: {examples}");
        assert!(!help.contains('\x1b'), "help to a pipe is not coloured: {help:?}");
    }
}

/// `factory run` of a JS example on the dry-run backend with `extra` flags and `env`: stderr.
fn run_stderr(extra: &[&str], env: &[(&str, &str)]) -> String {
    let state = tempfile::tempdir().unwrap();
    let example = root().join("examples/js/review-changed.js");
    let mut argv = vec!["run", example.to_str().unwrap(), "--yes", "--args", r#"{"files":["a.rs","b.rs"]}"#];
    argv.extend_from_slice(extra);
    let mut cmd = factory_cmd(state.path(), &argv);
    cmd.env_remove("NO_COLOR").env_remove("CLICOLOR_FORCE").env_remove("CLICOLOR");
    for (key, value) in env {
        cmd.env(key, value);
    }
    let out = cmd.output().expect("factory runs");
    ok(&out, &format!("factory run {extra:?} {env:?}"));
    assert!(text(&out.stdout).contains('{'), "the result is printed: {}", text(&out.stdout));
    assert!(!text(&out.stdout).contains('\x1b'), "the result (stdout) is never coloured");
    text(&out.stderr)
}

#[test]
fn color_follows_the_flag_and_no_color() {
    let always = run_stderr(&["--color", "always"], &[]);
    assert!(always.contains("\x1b[32mdone\x1b[0m"), "--color always colours agent outcomes: {always:?}");
    assert!(always.contains("\x1b[1m"), "--color always: the phase is bold: {always:?}");
    let forced = run_stderr(&["--color=always"], &[("NO_COLOR", "1")]);
    assert!(forced.contains('\x1b'), "--color always wins over NO_COLOR: {forced:?}");
    for (flags, env) in [(&["--color", "never"][..], &[][..]), (&[][..], &[("NO_COLOR", "1")][..]), (&[][..], &[][..])]
    {
        let plain = run_stderr(flags, env);
        assert!(!plain.contains('\x1b'), "{flags:?} {env:?}: no escapes: {plain:?}");
        assert!(plain.contains("agent ") && plain.contains(": done"), "{flags:?} {env:?}: the same text: {plain}");
    }
    // clap's own help follows the flag too.
    let state = tempfile::tempdir().unwrap();
    let mut help = factory_cmd(state.path(), &["run", "--help", "--color", "always"]);
    help.env("NO_COLOR", "1");
    let out = help.output().unwrap();
    ok(&out, "run --help --color always");
    assert!(text(&out.stdout).contains('\x1b'), "coloured help: {}", text(&out.stdout));
    let mut help = factory_cmd(state.path(), &["run", "--help", "--color", "never"]);
    help.env("CLICOLOR_FORCE", "1");
    let out = help.output().unwrap();
    assert!(!text(&out.stdout).contains('\x1b'), "--color never wins over CLICOLOR_FORCE");
    let bad = factory_in(state.path(), &["runs", "--color", "pink"]);
    assert_eq!(bad.status.code(), Some(2), "an invalid --color is a usage error: {}", stderr(&bad));
}

/// Output into a pipe whose reader has gone (`factory backends --prices | head -1`, once
/// `head` exited) ends the command quietly, as other Unix tools do: exit code 0 and no panic
/// message (`println!` would panic on the closed pipe). The reader is closed before the
/// command starts, so every write fails (no race with a real `head`).
#[test]
fn output_into_a_closed_pipe_exits_quietly() {
    let state = tempfile::tempdir().unwrap();
    for args in [&["backends", "--prices"][..], &["backends"], &["completions", "bash"], &["man"], &["list", "--json"]]
    {
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader);
        let out = factory_cmd(state.path(), args)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .expect("the factory binary starts");
        assert_eq!(
            out.status.code(),
            Some(0),
            "factory {args:?} into a closed pipe: {}\nstderr: {}",
            out.status,
            text(&out.stderr)
        );
        assert_eq!(text(&out.stderr), "", "factory {args:?} into a closed pipe says nothing");
    }
}
