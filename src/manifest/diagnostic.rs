//! Errors that point into a file: `file:line:col`, the key path, the source
//! line with a caret, and a hint. Used for manifests and for templates.

use std::fmt;
use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq)]
pub struct Diagnostic {
    pub file: PathBuf,
    /// 1-based; 0 when the error has no position (e.g. a file that cannot be read).
    pub line: usize,
    pub column: usize,
    /// The TOML key path, e.g. `sweep.grid.batch_size`.
    pub key: Option<String>,
    pub message: String,
    pub help: Option<String>,
    /// The offending source line, for the excerpt.
    pub excerpt: Option<String>,
}

impl Diagnostic {
    pub fn new(file: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Diagnostic {
            file: file.into(),
            line: 0,
            column: 0,
            key: None,
            message: message.into(),
            help: None,
            excerpt: None,
        }
    }

    pub fn with_message(mut self, message: impl Into<String>) -> Self {
        self.message = message.into();
        self
    }

    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    /// `file:line:col`, or just the file when there is no position.
    pub fn location(&self) -> String {
        if self.line == 0 {
            self.file.display().to_string()
        } else {
            format!("{}:{}:{}", self.file.display(), self.line, self.column)
        }
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "error: {}", self.message)?;
        write!(f, "  --> {}", self.location())?;
        if let Some(key) = &self.key {
            write!(f, " (key `{key}`)")?;
        }
        if let Some(line) = &self.excerpt {
            let (shown, caret) = excerpt_window(line, self.column);
            let num = self.line.to_string();
            let pad = " ".repeat(num.len());
            write!(f, "\n{pad} |\n{num} | {shown}\n{pad} | ")?;
            write!(f, "{}^", " ".repeat(caret.saturating_sub(1)))?;
        }
        if let Some(help) = &self.help {
            write!(f, "\n  = help: {help}")?;
        }
        Ok(())
    }
}

/// Characters of a source line shown on each side of the caret.
const EXCERPT_HALF_WIDTH: usize = 60;

/// The part of `line` around 1-based `column` that an excerpt shows (all of
/// it when short; else a window with `…` where it was cut), control
/// characters made visible, and the caret's column within it.
fn excerpt_window(line: &str, column: usize) -> (String, usize) {
    let chars: Vec<char> = line.chars().collect();
    let at = column.saturating_sub(1).min(chars.len());
    let start = at.saturating_sub(EXCERPT_HALF_WIDTH);
    let end = (at + EXCERPT_HALF_WIDTH).min(chars.len());
    let mut shown = String::new();
    if start > 0 {
        shown.push('…');
    }
    for &c in &chars[start..end] {
        shown.push(if c.is_control() { '\u{fffd}' } else { c });
    }
    if end < chars.len() {
        shown.push('…');
    }
    (shown, at - start + 1 + usize::from(start > 0))
}

/// One or more diagnostics; the error type of manifest loading and planning.
#[derive(Debug, Clone, PartialEq)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            writeln!(f, "{d}")?;
        }
        match self.0.len() {
            0 | 1 => Ok(()),
            n => write!(f, "{n} errors; nothing was written"),
        }
    }
}

impl std::error::Error for Diagnostics {}

impl From<Diagnostic> for Diagnostics {
    fn from(d: Diagnostic) -> Self {
        Diagnostics(vec![d])
    }
}

/// The closest candidate to `word`, if it is close enough to be a likely typo.
pub fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(word, c), c))
        .filter(|(score, _)| *score >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_names_only() {
        let keys = ["partition", "account", "nodes"];
        assert_eq!(did_you_mean("partiton", keys), Some("partition"));
        assert_eq!(did_you_mean("acount", keys), Some("account"));
        assert_eq!(did_you_mean("zzz", keys), None);
    }

    #[test]
    fn a_long_line_shows_a_window_around_the_column() {
        let line = format!("{}x = 1{}", "a".repeat(40_000), "b".repeat(40_000));
        let d = Diagnostic {
            line: 1,
            column: 40_001,
            excerpt: Some(line),
            ..Diagnostic::new("m.toml", "bad")
        };
        let s = d.to_string();
        assert!(s.len() < 500, "{} bytes", s.len());
        let lines: Vec<&str> = s.lines().collect();
        let text = lines.iter().find(|l| l.starts_with("1 | ")).unwrap();
        let caret = lines.iter().find(|l| l.trim_end().ends_with('^')).unwrap();
        let under: char = text.chars().nth(caret.chars().count() - 1).unwrap();
        assert_eq!(under, 'x', "{s}");
        assert!(text.starts_with("1 | …") && text.ends_with('…'), "{text}");
    }

    #[test]
    fn renders_location_excerpt_and_help() {
        let d = Diagnostic {
            file: "x.toml".into(),
            line: 3,
            column: 5,
            key: Some("slurm.partiton".into()),
            message: "unknown key `partiton`".into(),
            help: Some("did you mean `partition`?".into()),
            excerpt: Some("    partiton = 1".into()),
        };
        let s = d.to_string();
        assert!(s.contains("--> x.toml:3:5 (key `slurm.partiton`)"), "{s}");
        assert!(s.contains("3 |     partiton = 1"), "{s}");
        assert!(s.contains("  |     ^"), "{s}");
        assert!(s.contains("help: did you mean `partition`?"), "{s}");
    }
}
