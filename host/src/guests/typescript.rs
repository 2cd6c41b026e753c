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
//! before it starts: the source is at most [`MAX_TS_BYTES`], its brackets nest at most
//! [`MAX_NESTING`] deep (a linear pre-scan), and SWC runs on a thread of its own with a
//! [`STRIP_STACK_BYTES`] stack, enough for the worst source within those bounds, so no
//! source can overflow the host's stack.

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

/// The deepest bracket nesting (`(`, `[`, `{`, `${`) the pre-scan lets through to SWC.
pub const MAX_NESTING: usize = 10_000;

/// The largest TypeScript source stripped: 256 KiB (a JavaScript factory may be larger:
/// the runner parses JavaScript inside the sandbox, SWC parses TypeScript in the host).
pub const MAX_TS_BYTES: usize = 256 << 10;

/// The stack of the thread SWC runs on (virtual: only what is touched is committed).
/// Measured (2026-12-01): SWC takes at most ~3.3 KiB of stack per bracket level and ~0.9 KiB
/// per source byte of unbracketed right-nesting chains (`x=>x=>...`, `-+-+...`, `a=a=...`);
/// at the bounds above that is under 270 MiB, half of this.
pub const STRIP_STACK_BYTES: usize = 512 << 20;

/// The deepest bracket nesting of `text`, without parsing (strings and comments are not
/// skipped, so this over-counts an unbalanced bracket inside a string, never under-counts).
fn bracket_depth(text: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    for b in text.bytes() {
        match b {
            b'(' | b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Strip the types of the TypeScript module `text` (from `file_name`): JavaScript with the
/// same lines and columns. A syntax error or TypeScript that cannot be erased in place is
/// [`StripError`] with `file_name:line:col: message` (1-based, like the runner's own
/// errors); so is a source over [`MAX_TS_BYTES`] or nested deeper than [`MAX_NESTING`].
pub fn strip(file_name: &str, text: &str) -> Result<String, StripError> {
    if text.len() > MAX_TS_BYTES {
        return Err(StripError(vec![format!(
            "{file_name}: TypeScript: the source is {} bytes, over the {MAX_TS_BYTES} byte limit of a TypeScript \
             factory (JavaScript may be larger)",
            text.len()
        )]));
    }
    let nesting = bracket_depth(text);
    if nesting > MAX_NESTING {
        return Err(StripError(vec![format!(
            "{file_name}: TypeScript: brackets nest {nesting} deep, over the limit of {MAX_NESTING}"
        )]));
    }
    let (file, source) = (file_name.to_string(), text.to_string());
    let worker = std::thread::Builder::new()
        .name("typescript-strip".into())
        .stack_size(STRIP_STACK_BYTES)
        .spawn(move || strip_here(&file, &source));
    match worker.map(|handle| handle.join()) {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(_)) => {
            Err(StripError(vec![format!("{file_name}: TypeScript: the type stripper failed on this source")]))
        }
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
    let outcome =
        GLOBALS.set(&Default::default(), || swc_ts_fast_strip::operate(&cm, &handler, text.to_string(), options));
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
    fn no_source_within_the_bounds_overflows_the_stack_and_the_rest_is_refused() {
        use super::{MAX_NESTING, MAX_TS_BYTES};
        // The worst shapes measured, filling the whole size budget: each must come back
        // (stripped or refused), never crash the process.
        let fill = |unit: &str| unit.repeat((MAX_TS_BYTES - 64) / unit.len());
        for unit in ["x=>", "-+", "a=", "!", "a?b:"] {
            let ts = format!("let a, b;\nexport default {}1;\n", fill(unit));
            let _ = strip("chain.ts", &ts);
        }
        let deepest = |open: &str, close: &str| {
            format!("export default {}1{};\n", open.repeat(MAX_NESTING - 1), close.repeat(MAX_NESTING - 1))
        };
        for (open, close) in [("(", ")"), ("[", "]"), ("{a:", "}"), ("`${", "}`")] {
            let _ = strip("deep.ts", &deepest(open, close));
        }
        let too_deep = format!("export default {}1{};\n", "(".repeat(MAX_NESTING + 1), ")".repeat(MAX_NESTING + 1));
        let e = strip("deep.ts", &too_deep).expect_err("too deep").to_string();
        assert!(e.starts_with("deep.ts: TypeScript: brackets nest 10001 deep"), "{e}");
        let e = strip("big.ts", &" ".repeat(MAX_TS_BYTES + 1)).expect_err("too big").to_string();
        assert!(e.contains("over the 262144 byte limit"), "{e}");
    }

    #[test]
    fn errors_point_at_the_ts_file() {
        let syntax = strip("bad.ts", "const a: number = 1;\nconst b = (;\n").expect_err("syntax error").to_string();
        assert!(syntax.starts_with("bad.ts:2:"), "{syntax}");
        assert!(syntax.contains("SyntaxError"), "{syntax}");
        let e = strip("e.ts", "const x = 1;\n\n  enum Color { Red }\n").expect_err("enum").to_string();
        assert!(e.starts_with("e.ts:3:3: TypeScript: TypeScript enum is not supported"), "{e}");
        let p = strip("p.ts", "class A {\n  constructor(private x: number) {}\n}\n")
            .expect_err("parameter property")
            .to_string();
        assert!(p.starts_with("p.ts:2:"), "{p}");
    }
}
