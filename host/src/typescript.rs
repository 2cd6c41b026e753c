//! TypeScript: type-stripped to JavaScript before the runner sees it, by SWC's type stripper
//! (`swc_ts_fast_strip`, the one Node.js uses for `--strip-types`), never by a parser of ours.
//!
//! Stripping is done in place: type annotations, interfaces, type aliases, `declare`d things,
//! `import type`, generics, `as`/`satisfies`/`!` are replaced by whitespace, so every line and
//! column of the JavaScript is the TypeScript file's own and the runner's errors and stack
//! traces point at the `.ts` file. Types are not checked. TypeScript that has run-time
//! semantics and cannot be erased in place (`enum`, `namespace`, parameter properties,
//! `import x = require(..)`, `export =`, `<T>expr` assertions) is refused with
//! `file.ts:line:col` and the reason; it is not transformed (a transform would move lines).
//!
//! SWC parses and walks the module recursively, in the host process, so its input is bounded
//! before it starts: the source is at most [`crate::script::MAX_SOURCE_BYTES`], nested at
//! most [`MAX_NESTING`] deep by a linear pre-scan (brackets, template substitutions, and runs
//! of prefix operators), and it runs on a thread of its own with a [`STRIP_STACK_BYTES`]
//! stack, so no source can overflow the host's stack.

use std::sync::{Arc, Mutex};
use swc_common::errors::{DiagnosticBuilder, Emitter, Handler};
use swc_common::sync::Lrc;
use swc_common::{SourceMap, Span, GLOBALS};
use swc_ts_fast_strip::{ErrorCode, Mode, Options};

/// TypeScript that could not be type-stripped: one `file:line:col: kind: message` line per
/// problem the stripper reported.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.join("\n"))]
pub struct StripError(pub Vec<String>);

/// What the stripper reported: (where, message), in order.
type Reported = Arc<Mutex<Vec<(Option<Span>, String)>>>;

/// Collects diagnostics instead of printing them.
struct Collect(Reported);

impl Emitter for Collect {
    fn emit(&mut self, db: &mut DiagnosticBuilder<'_>) {
        let mut reported = self.0.lock().unwrap_or_else(|p| p.into_inner());
        reported.push((db.span.primary_span(), db.message()));
    }
}

/// The deepest nesting the pre-scan lets through to SWC: brackets, `${` substitutions,
/// `?` and `=>` chains and runs of prefix operators, counted together.
pub const MAX_NESTING: usize = 1000;

/// The stack of the thread SWC runs on (virtual: only what is touched is committed).
pub const STRIP_STACK_BYTES: usize = 256 << 20;

/// A conservative upper bound of how deeply `text` nests, without parsing: every opening
/// bracket, `${`, `?`, `=>` and prefix operator counts one level, closing brackets give one
/// back (strings and comments are not skipped, so this over-counts, never under-counts).
fn nesting_bound(text: &str) -> usize {
    let bytes = text.as_bytes();
    let (mut depth, mut deepest, mut chain) = (0usize, 0usize, 0usize);
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'(' | b'[' | b'{' => {
                depth += 1;
                chain = 0;
            }
            b')' | b']' | b'}' => {
                depth = depth.saturating_sub(1);
                chain = 0;
            }
            // Prefix operators, ternaries, arrows and assignments nest to the right.
            b'!' | b'~' | b'+' | b'-' | b'?' | b'=' | b':' => chain += 1,
            b if b.is_ascii_whitespace() => {}
            _ => {
                if b.is_ascii_alphanumeric() || b == b'_' || b == b'$' {
                    // A word resets a run of operators unless it is a prefix keyword.
                    let start = i;
                    while i + 1 < bytes.len() && (bytes[i + 1].is_ascii_alphanumeric() || bytes[i + 1] == b'_' || bytes[i + 1] == b'$') {
                        i += 1;
                    }
                    let word = &text[start..=i];
                    if matches!(word, "typeof" | "void" | "await" | "new" | "delete" | "yield" | "async") {
                        chain += 1;
                    }
                }
            }
        }
        deepest = deepest.max(depth + chain);
        i += 1;
    }
    deepest
}

/// Strip the types of the TypeScript module `text` (from `file_name`): JavaScript with the
/// same lines and columns. A syntax error or TypeScript that cannot be erased in place is
/// [`StripError`] with `file_name:line:col: message` (1-based, like the runner's own
/// errors); so is a source nested deeper than [`MAX_NESTING`].
pub fn strip(file_name: &str, text: &str) -> Result<String, StripError> {
    let nesting = nesting_bound(text);
    if nesting > MAX_NESTING {
        return Err(StripError(vec![format!(
            "{file_name}: TypeScript: the source nests about {nesting} levels deep (brackets, operators), over the \
             limit of {MAX_NESTING}"
        )]));
    }
    let (file, source) = (file_name.to_string(), text.to_string());
    let worker = std::thread::Builder::new()
        .name("typescript-strip".into())
        .stack_size(STRIP_STACK_BYTES)
        .spawn(move || strip_here(&file, &source));
    match worker.map(|handle| handle.join()) {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(_)) => Err(StripError(vec![format!("{file_name}: TypeScript: the type stripper failed on this source")])),
        Err(e) => Err(StripError(vec![format!("{file_name}: TypeScript: cannot start the type stripper: {e}")])),
    }
}

fn strip_here(file_name: &str, text: &str) -> Result<String, StripError> {
    let reported: Reported = Arc::default();
    let cm: Lrc<SourceMap> = Lrc::default();
    let handler = Handler::with_emitter(true, false, Box::new(Collect(reported.clone())));
    let options = Options {
        module: Some(true),
        filename: Some(file_name.to_string()),
        mode: Mode::StripOnly,
        ..Options::default()
    };
    let outcome = GLOBALS.set(&Default::default(), || swc_ts_fast_strip::operate(&cm, &handler, text.to_string(), options));
    match outcome {
        Ok(output) => Ok(output.code),
        Err(error) => {
            let kind = match error.code {
                ErrorCode::InvalidSyntax => "SyntaxError",
                _ => "TypeScript",
            };
            let reported = std::mem::take(&mut *reported.lock().unwrap_or_else(|p| p.into_inner()));
            let mut lines = Vec::new();
            for (span, message) in reported {
                let at = span
                    .and_then(|span| cm.try_lookup_char_pos(span.lo).ok())
                    .map(|loc| format!("{file_name}:{}:{}", loc.line, loc.col_display + 1))
                    .unwrap_or_else(|| file_name.to_string());
                let hint = if matches!(error.code, ErrorCode::UnsupportedSyntax) {
                    " (only type annotations are stripped: write it as JavaScript)"
                } else {
                    ""
                };
                lines.push(format!("{at}: {kind}: {message}{hint}"));
            }
            if lines.is_empty() {
                lines.push(format!("{file_name}: {kind}: {}", error.message));
            }
            Err(StripError(lines))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::strip;

    #[test]
    fn types_are_erased_in_place() {
        let ts = "interface A { x: number }\nconst f = (a: A, b?: string): number => a.x as number;\nexport default f<string>;\n";
        let js = strip("t.ts", ts).expect("stripped");
        assert_eq!(js.len(), ts.len(), "{js}");
        assert_eq!(js.lines().count(), ts.lines().count());
        assert!(!js.contains("interface") && !js.contains(": number"), "{js}");
        assert!(js.lines().nth(1).is_some_and(|l| l.starts_with("const f = (a")), "{js}");
    }

    #[test]
    fn errors_point_at_the_ts_file() {
        let syntax = strip("bad.ts", "const a: number = 1;\nconst b = (;\n").expect_err("syntax error").to_string();
        assert!(syntax.starts_with("bad.ts:2:"), "{syntax}");
        assert!(syntax.contains("SyntaxError"), "{syntax}");
        let e = strip("e.ts", "const x = 1;\n\n  enum Color { Red }\n").expect_err("enum").to_string();
        assert!(e.starts_with("e.ts:3:3: TypeScript: TypeScript enum is not supported"), "{e}");
        let p = strip("p.ts", "class A {\n  constructor(private x: number) {}\n}\n").expect_err("parameter property").to_string();
        assert!(p.starts_with("p.ts:2:"), "{p}");
    }
}
