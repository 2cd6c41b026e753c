//! The book (`docs/`, an mdBook) and the front page (README.md): every internal link of
//! `docs/src/**/*.md` and README.md resolves — a relative link names a file or directory of
//! the repository, an `#anchor` names a heading of the page it points to (GitHub's and
//! mdBook's slugs) — and every `{{#include}}` names a file; README stays a front page (at most
//! 250 lines, the two quick-start commands) whose example factory and command run as
//! written, as do the book's commands that run an example offline; the CLI reference chapter is what the real binary generates from its clap
//! definition; and the book's TOML examples are configs the host accepts. `./test` builds
//! the book itself with the pinned mdbook before these run.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::path::{Component, Path, PathBuf};

/// The Markdown files checked: README.md and every page of the book.
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|e| e == "md") {
                found.push(path);
            }
        }
    }
    let root = common::root();
    let mut found = vec![root.join("README.md")];
    walk(&root.join("docs/src"), &mut found);
    found.sort();
    found
}

/// The lines of `text` outside fenced code blocks, with their 1-based numbers.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(open), Some(m)) if open == m && trimmed.trim_end() == m => fence = None,
            (None, None) => lines.push((i + 1, line)),
            _ => {}
        }
    }
    lines
}

/// `line` without its inline code spans (a link inside backticks is no link).
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let ticks = rest[start..].chars().take_while(|&c| c == '`').count();
        let after = &rest[start + ticks..];
        match after.find(&"`".repeat(ticks)) {
            Some(end) => rest = &after[end + ticks..],
            None => {
                out.push_str(&rest[start..]);
                return out;
            }
        }
    }
    out.push_str(rest);
    out
}

/// A heading's anchor, as GitHub and mdBook make it: the text without markup, lower case,
/// letters, digits, `_` and `-` kept, each space a `-`, everything else dropped.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    // `[text](target)` reads as its text.
    while let Some(open) = rest.find('[') {
        text.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after.find("](").and_then(|close| after[close..].find(')').map(|end| (close, close + end))) {
            Some((close, end)) => {
                text.push_str(&after[..close]);
                rest = &after[end + 1..];
            }
            None => {
                text.push('[');
                rest = after;
            }
        }
    }
    text.push_str(rest);
    text.trim()
        .chars()
        .filter_map(|c| match c {
            c if c.is_alphanumeric() || c == '_' || c == '-' => Some(c.to_lowercase().next().unwrap_or(c)),
            c if c.is_whitespace() => Some('-'),
            _ => None,
        })
        .collect()
}

/// The anchors of a page's headings (a repeated one gets `-1`, `-2`, ... as on GitHub).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut found = BTreeSet::new();
    for (_, line) in prose(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(&line[hashes + 1..]);
        let n = seen.entry(base.clone()).or_insert(0);
        found.insert(if *n == 0 { base.clone() } else { format!("{base}-{n}") });
        *n += 1;
    }
    found
}

/// The targets of the inline links and images of one prose line: `[text](target)`.
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code_spans(line);
    let mut targets = Vec::new();
    let mut rest = line.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let end = after.find(')').unwrap_or(after.len());
        let target = after[..end].split_whitespace().next().unwrap_or("").trim_matches(['<', '>']);
        targets.push(target.to_string());
        rest = &after[end..];
    }
    targets
}

/// `dir.join(relative)` with `..` and `.` folded, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[test]
fn every_internal_link_of_the_book_and_the_readme_resolves() {
    let root = common::root().canonicalize().expect("the repository");
    let pages = pages();
    assert!(pages.len() > 20, "the book's pages are found: {pages:?}");
    let mut texts: HashMap<PathBuf, String> = HashMap::new();
    for page in &pages {
        let page = normalize(&page.canonicalize().expect("a page"));
        texts.insert(page.clone(), std::fs::read_to_string(&page).expect("a page"));
    }
    let mut broken = Vec::new();
    let mut checked = 0;
    for (page, text) in &texts {
        let dir = page.parent().expect("a page's directory");
        let name = page.strip_prefix(&root).unwrap_or(page).display().to_string();
        for (n, line) in prose(text) {
            // mdBook's include: `{{#include PATH}}` (possibly with a `:ANCHOR` or line range).
            if let Some(at) = line.find("{{#include ") {
                let arg = line[at + 11..].split("}}").next().unwrap_or("");
                let path = arg.split(':').next().unwrap_or("").trim();
                if !dir.join(path).is_file() {
                    broken.push(format!("{name}:{n}: {{{{#include {path}}}}} names no file"));
                }
            }
            for target in link_targets(line) {
                if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                let (path, anchor) = match target.split_once('#') {
                    Some((path, anchor)) => (path, Some(anchor)),
                    None => (target.as_str(), None),
                };
                let file = if path.is_empty() { page.clone() } else { normalize(&dir.join(path)) };
                if !file.starts_with(&root) {
                    broken.push(format!("{name}:{n}: `{target}` leaves the repository"));
                    continue;
                }
                if !file.exists() {
                    broken.push(format!("{name}:{n}: `{target}`: no such file ({})", file.display()));
                    continue;
                }
                let Some(anchor) = anchor else { continue };
                let Some(target_text) = texts.get(&file).cloned().or_else(|| {
                    file.extension()
                        .is_some_and(|e| e == "md")
                        .then(|| std::fs::read_to_string(&file).unwrap_or_default())
                }) else {
                    broken.push(format!("{name}:{n}: `{target}`: an anchor into a file that is no Markdown page"));
                    continue;
                };
                let known = anchors(&target_text);
                if !known.contains(anchor) {
                    broken.push(format!("{name}:{n}: `{target}`: no heading `#{anchor}` (headings: {known:?})"));
                }
            }
        }
    }
    broken.sort();
    assert!(broken.is_empty(), "{} broken internal links:\n{}", broken.len(), broken.join("\n"));
    assert!(checked > 150, "the links were found: {checked}");
}

#[test]
fn the_link_checker_reads_anchors_and_links_as_github_does() {
    // The checker above must be able to fail: these are the rules it relies on.
    assert_eq!(slug("Testing a factory: `factory test`"), "testing-a-factory-factory-test");
    assert_eq!(slug("HTTP API: `factory serve --http 127.0.0.1:8080`"), "http-api-factory-serve---http-1270018080");
    assert_eq!(slug("Flow control: providers that throttle"), "flow-control-providers-that-throttle");
    assert_eq!(slug("See [the CLI](x.md) here"), "see-the-cli-here");
    let page = "# Title\n\n## Twice\n\n```md\n## Not a heading\n```\n\n## Twice\n";
    assert_eq!(anchors(page), ["title", "twice", "twice-1"].into_iter().map(String::from).collect());
    assert_eq!(link_targets("a [b](c.md#d) `[e](f)` ![g](h.png \"t\")"), vec!["c.md#d", "h.png"]);
    let lines: Vec<usize> = prose("a\n```\n[x](y)\n```\nb").into_iter().map(|(n, _)| n).collect();
    assert_eq!(lines, vec![1, 5]);
}

/// The quick start's two commands, exactly as a newcomer types them.
const QUICK_START: &str = "```sh
# Build the review-changed example factory and run it on the built-in offline backend:
cargo run --bin factory -- run examples/review-changed

# Set up what the tests need (pinned), then run them all (`./test --test js` passes
# its arguments to `cargo test`):
./test
```";

#[test]
fn the_readme_is_a_front_page_with_the_two_commands_near_the_top() {
    let readme = std::fs::read_to_string(common::root().join("README.md")).expect("README.md");
    let lines = readme.lines().count();
    assert!(lines <= 250, "README.md is a front page of at most 250 lines, not {lines}: the rest goes in docs/src");
    let at = readme.find(QUICK_START).expect("README shows the two quick-start commands exactly");
    let line = readme[..at].lines().count();
    assert!(line <= 30, "the commands are near the top (line {line})");
    let install = std::fs::read_to_string(common::root().join("docs/src/guide/install.md")).expect("install.md");
    assert!(install.contains(QUICK_START), "the guide's quick start shows the same commands");
}

#[test]
fn the_cli_reference_chapter_is_generated_from_the_cli() {
    let out = std::process::Command::new(common::factory_bin())
        .arg("cli-reference")
        .env_remove("FACTORY_STATE_DIR")
        .env_remove("FACTORY_SESSION")
        .output()
        .expect("factory starts");
    assert!(out.status.success(), "factory cli-reference: {}", common::stderr(&out));
    let generated = String::from_utf8(out.stdout).expect("UTF-8");
    for command in ["## `factory`", "### `factory run`", "### `factory serve`", "#### `factory backends check`"] {
        assert!(generated.contains(&format!("\n{command}\n")), "the reference has a section `{command}`");
    }
    assert!(generated.contains("--max-ai-credits"), "a run's flags are in it");
    let path = common::root().join("docs/src/reference/cli.md");
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/src/reference/cli.md is not what the CLI generates; regenerate it:\n  \
         cargo run --bin factory -- cli-reference > docs/src/reference/cli.md"
    );
}

#[test]
fn the_books_toml_examples_are_configs_the_host_accepts() {
    let mut parsed = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("a page");
        let mut block: Option<String> = None;
        for line in text.lines() {
            let trimmed = line.trim_start();
            match &mut block {
                None if trimmed.starts_with("```toml") => block = Some(String::new()),
                Some(body) if trimmed.starts_with("```") => {
                    let name = page.display().to_string();
                    if let Err(e) = factory_host::backend::config::Config::parse(body, &name) {
                        panic!("a TOML example of {name} is refused: {e}\n{body}");
                    }
                    parsed += 1;
                    block = None;
                }
                Some(body) => {
                    body.push_str(trimmed);
                    body.push('\n');
                }
                None => {}
            }
        }
    }
    assert!(parsed >= 3, "the book's TOML examples were found: {parsed}");
}

/// The first fenced block of `lang` in `text`.
fn fenced(text: &str, lang: &str) -> Option<String> {
    let start = text.find(&format!("```{lang}\n"))? + lang.len() + 4;
    let end = text[start..].find("\n```")?;
    Some(text[start..start + end + 1].to_string())
}

#[test]
fn the_readmes_example_factory_and_its_command_run_as_written() {
    let root = common::root();
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let source = fenced(&readme, "js").expect("README shows a JavaScript factory");
    let command = readme
        .lines()
        .find(|l| l.starts_with("cargo run --bin factory -- run examples/js/"))
        .expect("README shows the command that runs the example");
    let (target, args) = command["cargo run --bin factory -- run ".len()..].split_once(" --args '").expect("--args");
    let args = args.strip_suffix('\'').expect("quoted args");
    let files: serde_json::Value = serde_json::from_str(args).expect("the args are JSON");

    let state = tempfile::tempdir().expect("a state dir");
    let shown = state.path().join("review-changed.js");
    std::fs::write(&shown, &source).expect("the README's factory written out");
    // The factory README shows, and the example its command names, on the dry-run backend.
    for file in [shown.clone(), root.join(target)] {
        let out = common::factory_cmd(state.path(), &["run", "--json", "--args", args])
            .arg(&file)
            .current_dir(&root)
            .output()
            .expect("factory starts");
        assert!(out.status.success(), "{}: {}", file.display(), common::stderr(&out));
        let envelope: serde_json::Value = serde_json::from_slice(&out.stdout).expect("an envelope");
        assert_eq!(envelope["status"], "completed", "{envelope:#}");
        assert_eq!(envelope["factory"], "review-changed", "{envelope:#}");
        let reviews = envelope["result"]["reviews"].as_array().expect("the reviews");
        assert_eq!(reviews.len(), files["files"].as_array().map_or(0, Vec::len), "{envelope:#}");
        assert!(reviews.iter().all(|r| r.as_str().is_some_and(|t| t.contains("Review src/a.rs"))), "{envelope:#}");
    }
}

/// The book's shell commands that run an example offline, as written: `factory run`,
/// `describe`, `add` or `build` of a file under `examples/`, with no `--backend` (so the
/// dry-run backend answers), each with the comment after it cut off.
fn offline_example_commands() -> Vec<(String, String)> {
    let mut found = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("a page");
        let name = page.strip_prefix(common::root()).unwrap_or(&page).display().to_string();
        let mut in_sh = false;
        for line in text.lines() {
            let trimmed = line.trim();
            if trimmed.starts_with("```") {
                in_sh = !in_sh && (trimmed == "```sh" || trimmed == "```bash");
                continue;
            }
            let offline = ["run", "describe", "add", "build"]
                .iter()
                .any(|verb| trimmed.starts_with(&format!("factory {verb} examples/")))
                && !trimmed.contains("--backend");
            if in_sh && offline {
                let command = match trimmed.find(" # ") {
                    Some(comment) => trimmed[..comment].trim_end(),
                    None => trimmed,
                };
                found.push((name.clone(), command.to_string()));
            }
        }
    }
    found
}

#[test]
fn the_books_offline_example_commands_run_as_written() {
    let commands = offline_example_commands();
    assert!(commands.len() >= 4, "the book's example commands are found: {commands:?}");
    // `factory` on PATH is the binary under test.
    let bin = tempfile::tempdir().expect("a bin dir");
    std::os::unix::fs::symlink(common::factory_bin(), bin.path().join("factory")).expect("a symlink");
    let path = std::env::join_paths(
        std::iter::once(bin.path().to_path_buf())
            .chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
    )
    .expect("a PATH");
    for (page, command) in &commands {
        let state = tempfile::tempdir().expect("a state dir");
        // The environment the tests give `factory` (a state dir of its own, no daemon, the
        // user's config cut off), for the `factory` the shell runs.
        let template = common::factory_cmd(state.path(), &[]);
        let mut sh = std::process::Command::new("sh");
        for (var, value) in template.get_envs() {
            match value {
                Some(value) => sh.env(var, value),
                None => sh.env_remove(var),
            };
        }
        let out = sh
            .args(["-c", command])
            .env("PATH", &path)
            .current_dir(common::root())
            .stdin(std::process::Stdio::null())
            .output()
            .expect("sh starts");
        assert!(
            out.status.success(),
            "{page}: `{command}` fails: {}\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            common::stderr(&out)
        );
    }
}
