//! A manifest's text with a map from TOML key paths to byte spans, so that any
//! error found after parsing can still name its line and column.

use super::diagnostic::Diagnostic;
use std::ops::Range;
use std::path::{Path, PathBuf};
use toml::de::{DeTable, DeValue};
use toml::Spanned;

#[derive(Debug, Clone)]
struct Entry {
    path: String,
    key: Range<usize>,
    value: Range<usize>,
}

#[derive(Debug, Clone)]
pub struct ManifestText {
    pub path: PathBuf,
    pub text: String,
    line_starts: Vec<usize>,
    entries: Vec<Entry>,
}

impl ManifestText {
    pub fn new(path: &Path, text: String) -> ManifestText {
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        ManifestText {
            path: path.to_path_buf(),
            text,
            line_starts,
            entries: Vec::new(),
        }
    }

    /// Records the span of every key and value below `table`.
    pub fn index(&mut self, table: &DeTable<'_>) {
        let mut entries = Vec::new();
        walk_table(table, "", &mut entries);
        self.entries = entries;
    }

    /// 1-based line and column (in characters) of a byte offset.
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.text.len());
        let line = self.line_starts.partition_point(|&s| s <= offset);
        let start = self.line_starts[line - 1];
        let col = self.text[start..offset].chars().count() + 1;
        (line, col)
    }

    fn line_text(&self, line: usize) -> String {
        let start = self.line_starts[line - 1];
        let end = self
            .line_starts
            .get(line)
            .copied()
            .unwrap_or(self.text.len());
        self.text[start..end]
            .trim_end_matches(['\n', '\r'])
            .to_string()
    }

    /// A diagnostic at a byte offset, with the innermost key path around it.
    pub fn at_offset(&self, offset: usize, message: impl Into<String>) -> Diagnostic {
        let (line, column) = self.line_col(offset);
        Diagnostic {
            file: self.path.clone(),
            line,
            column,
            key: self.path_at(offset).map(str::to_string),
            message: message.into(),
            help: None,
            excerpt: Some(self.line_text(line)),
        }
    }

    /// A diagnostic at a key (`sweep.grid.batch_size`), pointing at the key
    /// itself; falls back to the nearest enclosing key that has a span.
    pub fn at_key(&self, path: &str, message: impl Into<String>) -> Diagnostic {
        self.at(path, message, false)
    }

    /// Like [`ManifestText::at_key`] but pointing at the value (`sweep.grid.batch_size[1]`).
    pub fn at_value(&self, path: &str, message: impl Into<String>) -> Diagnostic {
        self.at(path, message, true)
    }

    fn at(&self, path: &str, message: impl Into<String>, value: bool) -> Diagnostic {
        let mut p = path;
        loop {
            if let Some(e) = self.entries.iter().find(|e| e.path == p) {
                let span = if value { &e.value } else { &e.key };
                let mut d = self.at_offset(span.start, message);
                d.key = Some(path.to_string());
                return d;
            }
            match parent_path(p) {
                Some(parent) => p = parent,
                None => {
                    let mut d = Diagnostic::new(&self.path, message);
                    d.key = Some(path.to_string());
                    return d;
                }
            }
        }
    }

    /// Whether the file spells out this key path.
    pub fn has(&self, path: &str) -> bool {
        self.entries.iter().any(|e| e.path == path)
    }

    /// The innermost key path whose key or value span holds `offset`.
    pub fn path_at(&self, offset: usize) -> Option<&str> {
        self.entries
            .iter()
            .filter(|e| {
                e.key.contains(&offset) || e.value.contains(&offset) || e.key.start == offset
            })
            .min_by_key(|e| {
                if e.key.contains(&offset) {
                    e.key.len()
                } else {
                    e.value.len()
                }
            })
            .map(|e| e.path.as_str())
    }

    /// Turns a toml parse or deserialisation error into a diagnostic at its
    /// span. `hint` may explain the key at the span better (an unknown key
    /// or value: see `super::explain_key`).
    pub fn from_toml_error(
        &self,
        err: &toml::de::Error,
        hint: impl Fn(&ManifestText, &str) -> Option<(String, String)>,
    ) -> Diagnostic {
        let msg = plain_types(err.message().trim());
        let mut d = match err.span() {
            Some(span) => self.at_offset(span.start, msg.clone()),
            None => Diagnostic::new(&self.path, msg.clone()),
        };
        if let Some((message, help)) = d.key.as_deref().and_then(|k| hint(self, k)) {
            d.message = message;
            d.help = Some(help);
        }
        d
    }

    /// A string value as written (without its quotes), if the key has one.
    pub fn string_value(&self, path: &str) -> Option<&str> {
        let e = self.entries.iter().find(|e| e.path == path)?;
        let raw = self.text.get(e.value.clone())?;
        raw.strip_prefix('"')
            .and_then(|r| r.strip_suffix('"'))
            .or_else(|| raw.strip_prefix('\'').and_then(|r| r.strip_suffix('\'')))
    }
}

/// The last segment of a key path, unquoted: `a."x.y"` -> `x.y`.
pub fn last_segment(path: &str) -> &str {
    let last = match parent_path(path) {
        Some(parent) => &path[parent.len() + 1..],
        None => path,
    };
    last.strip_prefix('"')
        .and_then(|l| l.strip_suffix('"'))
        .unwrap_or(last)
}

/// The parent of a key path: `a.b[2]` -> `a.b`, `a.b` -> `a`, `a` -> None.
pub fn parent_path(path: &str) -> Option<&str> {
    if path.ends_with(']') {
        return path.rfind('[').map(|i| &path[..i]);
    }
    // Quoted segments may hold dots: find the last dot outside quotes.
    let mut in_quotes = false;
    let mut last = None;
    for (i, c) in path.char_indices() {
        match c {
            '"' => in_quotes = !in_quotes,
            '.' if !in_quotes => last = Some(i),
            _ => {}
        }
    }
    last.map(|i| &path[..i])
}

/// Joins a key onto a path, quoting keys that are not bare TOML keys.
pub fn join_key(prefix: &str, key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    // Quoted like a TOML basic string; control characters escaped so a path
    // always prints on one line.
    let key = if bare {
        key.to_string()
    } else {
        format!("\"{}\"", key.escape_debug())
    };
    if prefix.is_empty() {
        key
    } else {
        format!("{prefix}.{key}")
    }
}

fn walk_table(table: &DeTable<'_>, prefix: &str, out: &mut Vec<Entry>) {
    for (k, v) in table.iter() {
        let path = join_key(prefix, k.get_ref());
        out.push(Entry {
            path: path.clone(),
            key: k.span(),
            value: v.span(),
        });
        walk_value(v, &path, out);
    }
}

fn walk_value(v: &Spanned<DeValue<'_>>, path: &str, out: &mut Vec<Entry>) {
    match v.get_ref() {
        DeValue::Table(t) => walk_table(t, path, out),
        DeValue::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let p = format!("{path}[{i}]");
                out.push(Entry {
                    path: p.clone(),
                    key: item.span(),
                    value: item.span(),
                });
                walk_value(item, &p, out);
            }
        }
        _ => {}
    }
}

/// A deserialiser's message in a reader's words: the types Rust names
/// (`usize`, `f64`, `a nonzero u32`) as the numbers they hold, and "invalid
/// type: X, expected Y" as "expected Y, not X".
pub fn plain_types(msg: &str) -> String {
    // The whole numbers a type holds: (least, most).
    let range = |t: &str| -> Option<(u64, u64)> {
        Some(match t {
            "usize" | "u64" => (0, u64::MAX),
            "u32" => (0, u32::MAX.into()),
            "u16" => (0, u16::MAX.into()),
            "u8" => (0, u8::MAX.into()),
            "a nonzero usize" | "a nonzero u64" => (1, u64::MAX),
            "a nonzero u32" => (1, u32::MAX.into()),
            "a nonzero u16" => (1, u16::MAX.into()),
            _ => return None,
        })
    };
    // `got` is the value refused: one too large for the type is told the
    // type's range (it is a whole number ≥ 0 all the same).
    let words = |t: &str, got: &str| -> String {
        let t = t.trim();
        if let Some((least, most)) = range(t) {
            let too_large = got
                .trim_matches('`')
                .rsplit(' ')
                .next()
                .and_then(|n| n.trim_matches('`').parse::<u128>().ok())
                .is_some_and(|n| n > u128::from(most));
            return match too_large {
                true => format!("a whole number in {least}..={most}"),
                false => format!("a whole number ≥ {least}"),
            };
        }
        match t {
            "isize" | "i64" | "i32" | "i16" | "i8" => "a whole number".into(),
            "f64" | "f32" => "a number".into(),
            "a sequence" => "a list".into(),
            "a map" => "a table".into(),
            t => match t.strip_prefix("struct ") {
                Some(_) => "a table".into(),
                None => t.to_string(),
            },
        }
    };
    let shape = |msg: &str, prefix: &str| -> Option<(String, String)> {
        let rest = msg.strip_prefix(prefix)?;
        let (got, want) = rest.rsplit_once(", expected ")?;
        Some((got.trim().to_string(), words(want, got)))
    };
    // `integer `-3`` is -3; `string "ten"` the string "ten".
    let what = |got: &str| -> String {
        let got = got.replace("sequence", "list").replace("map", "table");
        match got.split_once(' ') {
            Some(("integer" | "floating point", n)) => n.trim_matches('`').to_string(),
            Some(("string", s)) => format!("the string {s}"),
            _ => got,
        }
    };
    if let Some((got, want)) =
        shape(msg, "invalid type: ").or_else(|| shape(msg, "invalid value: "))
    {
        return format!("expected {want}, not {}", what(&got));
    }
    match msg.rsplit_once("expected ") {
        Some((head, want)) if !want.contains(' ') || want.starts_with("a nonzero") => {
            format!("{head}expected {}", words(want, ""))
        }
        _ => msg.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_names_become_the_numbers_they_hold() {
        use super::plain_types;
        assert_eq!(
            plain_types(r#"invalid type: string "ten", expected usize"#),
            r#"expected a whole number ≥ 0, not the string "ten""#
        );
        assert_eq!(
            plain_types("invalid value: integer `-3`, expected u64"),
            "expected a whole number ≥ 0, not -3"
        );
        assert_eq!(
            plain_types("invalid value: integer `4294967296`, expected u32"),
            "expected a whole number in 0..=4294967295, not 4294967296"
        );
        assert_eq!(
            plain_types(r#"invalid type: string "2", expected a nonzero u32"#),
            r#"expected a whole number ≥ 1, not the string "2""#
        );
        assert_eq!(
            plain_types("invalid type: sequence, expected f64"),
            "expected a number, not list"
        );
        assert_eq!(plain_types("unknown field `x`"), "unknown field `x`");
    }

    #[test]
    fn paths_and_parents() {
        assert_eq!(parent_path("a.b[2]"), Some("a.b"));
        assert_eq!(parent_path("a.b"), Some("a"));
        assert_eq!(parent_path("a.\"x.y\""), Some("a"));
        assert_eq!(parent_path("a"), None);
        assert_eq!(
            join_key("sweep.grid", "slurm.nodes"),
            "sweep.grid.\"slurm.nodes\""
        );
    }

    #[test]
    fn last_segments_are_unquoted() {
        assert_eq!(last_segment("slurm.nodez"), "nodez");
        assert_eq!(last_segment("sweep.grid.\"slurm.nodes\""), "slurm.nodes");
        assert_eq!(last_segment("name"), "name");
    }

    #[test]
    fn line_and_column_of_offsets() {
        let s = ManifestText::new(Path::new("m.toml"), "a = 1\nbé = 2\n".into());
        assert_eq!(s.line_col(0), (1, 1));
        assert_eq!(s.line_col(6), (2, 1));
        assert_eq!(s.line_col(10), (2, 4)); // é is two bytes, one column
    }
}
