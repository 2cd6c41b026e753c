//! How values, kinds and paths are said in messages: JSON quoted within a few hundred
//! bytes, a schema path and a value path.

use super::*;

pub(super) fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

pub(super) fn join_kinds(kinds: &[Kind]) -> String {
    match kinds {
        [] => String::new(),
        [only] => only.name().to_owned(),
        [init @ .., last] => {
            let init: Vec<&str> = init.iter().map(|kind| kind.name()).collect();
            format!("{} or {}", init.join(", "), last.name())
        }
    }
}

/// Compact JSON, cut short so a huge reply does not flood an error message. Serializes no
/// more than it shows: a huge value costs no more than a small one.
pub(super) fn render(value: &Value) -> String {
    render_with(|w| serde_json::to_writer(w, value))
}

/// [`render`] for an array held as a slice (no copy of it is made).
pub(super) fn render_slice(values: &[Value]) -> String {
    render_with(|w| serde_json::to_writer(w, values))
}

pub(super) fn render_with(write: impl FnOnce(&mut Capped) -> serde_json::Result<()>) -> String {
    let mut out = Capped(Vec::with_capacity(QUOTE_LIMIT + 8));
    // Stopping early is the point: the error only says the text was cut.
    let cut = write(&mut out).is_err();
    let mut text = String::from_utf8_lossy(&out.0).into_owned();
    let chars = text.char_indices().nth(QUOTE_LIMIT);
    match chars {
        Some((at, _)) => {
            text.truncate(at);
            text.push('…');
        }
        None if cut => text.push('…'),
        None => {}
    }
    text
}

/// A writer that takes a little more than [`QUOTE_LIMIT`] characters' worth, then refuses.
pub(super) struct Capped(Vec<u8>);

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // Four bytes per char at most, plus one more char to know there was more.
        let room = (QUOTE_LIMIT + 1) * 4 - self.0.len().min((QUOTE_LIMIT + 1) * 4);
        if room == 0 {
            return Err(std::io::Error::other("quote limit"));
        }
        let n = buf.len().min(room);
        self.0.extend_from_slice(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub(super) fn quote(text: &str) -> String {
    Value::String(text.to_owned()).to_string()
}

/// A location in a schema, e.g. `properties.findings.items.type`.
pub(super) fn schema_path(path: &[Seg<'_>]) -> String {
    let rendered = render_path(String::new(), path);
    if rendered.is_empty() {
        "(root)".to_owned()
    } else {
        rendered
    }
}

/// A location in a value, e.g. `$.findings[2].title`.
pub(super) fn value_path(path: &[Seg<'_>]) -> String {
    render_path("$".to_owned(), path)
}

pub(super) fn render_path(mut out: String, path: &[Seg<'_>]) -> String {
    for seg in path {
        match seg {
            Seg::Key(key) if is_identifier(key) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            // Keys with dots, spaces or quotes stay unambiguous in bracket form.
            Seg::Key(key) => out.push_str(&format!("[{}]", quote(key))),
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

pub(super) fn is_identifier(key: &str) -> bool {
    let mut chars = key.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == '$')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
}
