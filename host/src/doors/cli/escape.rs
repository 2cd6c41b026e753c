//! Guest-controlled text on the terminal: a factory chooses its name, description, phases,
//! labels, log lines and error messages, and a terminal interprets control characters (ESC
//! sequences can move the cursor, rewrite earlier lines, retitle the window, or hide text;
//! bidirectional overrides reorder what is shown). Everything such a string contributes to
//! human output goes through [`esc`], which shows those characters as visible escapes
//! (`\x1b`, `\n`, `\u{202e}`) instead. JSON output needs none of this: serde escapes control
//! characters in strings.

use std::borrow::Cow;
use std::fmt::Write;

/// Is `c` a character a terminal might act on rather than print?
fn needs_escape(c: char) -> bool {
    // C0, DEL and C1 controls, and the Unicode bidirectional overrides and isolates.
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` with every control character (and bidi override) shown as an escape.
pub fn esc(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if needs_escape(c) && (c as u32) < 0x100 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if needs_escape(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// `text` with every control character but line breaks and tabs shown as an escape: for
/// messages of several lines (an error chain with a build's output) that may quote guest
/// or server text.
pub fn esc_lines(text: &str) -> String {
    text.split('\n')
        .map(|line| line.split('\t').map(|part| esc(part)).collect::<Vec<_>>().join("\t"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::{esc, esc_lines};

    #[test]
    fn lines_keep_their_breaks() {
        assert_eq!(esc_lines("a\x1b]0;title\x07\nb\tc\r"), "a\\x1b]0;title\\x07\nb\tc\\r");
    }

    #[test]
    fn control_characters_become_visible() {
        assert_eq!(esc("plain text, ünïcode ✓"), "plain text, ünïcode ✓");
        assert_eq!(esc("a\x1b[2Jb"), "a\\x1b[2Jb");
        assert_eq!(esc("line\nnext\r\t\x07\x7f\u{9b}"), "line\\nnext\\r\\t\\x07\\x7f\\x9b");
        assert_eq!(esc("abc\u{202e}def"), "abc\\u{202e}def");
    }
}
