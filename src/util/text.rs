//! Which characters a value may hold where it reaches a job script, and
//! text from files made safe to print.

use std::borrow::Cow;

/// The first character a value that may reach a job script may not hold: any control character
/// (Unicode category Cc: NUL, CR, ESC, DEL, ...) and the line and paragraph
/// separators; `multiline` values may hold newlines and tabs.
pub fn forbidden_char(s: &str, multiline: bool) -> Option<char> {
    s.chars().find(|&c| {
        let allowed = multiline && (c == '\n' || c == '\t');
        !allowed && (c.is_control() || c == '\u{2028}' || c == '\u{2029}')
    })
}

/// `a newline (U+000A)`, `NUL (U+0000)`, ...
pub fn describe_char(c: char) -> String {
    let name = match c {
        '\n' => "a newline",
        '\r' => "a carriage return",
        '\t' => "a tab",
        '\0' => "NUL",
        '\u{1b}' => "an escape character",
        '\u{2028}' | '\u{2029}' => "a line separator",
        _ => "a control character",
    };
    format!("{name} (U+{:04X})", c as u32)
}

/// A regular expression from a user (a manifest's `line_pattern`,
/// `--pattern`), or why not in one line: the regex crate's message draws the
/// pattern with a caret over several lines, which reads as more errors.
pub fn regex(pattern: &str) -> Result<regex::Regex, String> {
    regex::Regex::new(pattern).map_err(|e| match e {
        regex::Error::Syntax(text) => {
            let why = text
                .lines()
                .rev()
                .find_map(|l| l.strip_prefix("error: "))
                .unwrap_or(text.trim());
            format!("{why} (in `{pattern}`)")
        }
        other => other.to_string(),
    })
}

/// `s` with every character [`forbidden_char`] finds written as its escape
/// (`\n`, `\u{1b}`): text read from files, printed on a terminal or in a
/// table, can neither start a line of its own nor move the cursor or change
/// colours.
pub fn printable(s: &str) -> Cow<'_, str> {
    if forbidden_char(s, false).is_none() {
        return Cow::Borrowed(s);
    }
    Cow::Owned(
        s.chars()
            .map(
                |c| match forbidden_char(c.encode_utf8(&mut [0; 4]), false) {
                    Some(_) => c.escape_default().to_string(),
                    None => c.to_string(),
                },
            )
            .collect(),
    )
}

/// A line of a log without the terminal's escape sequences in it (colours,
/// cursor moves, titles, links), which would stop a pattern matching.
pub fn without_escapes(s: Cow<'_, str>) -> Cow<'_, str> {
    if !s.contains('\x1b') {
        return s;
    }
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\x1b' {
            out.push(c);
            continue;
        }
        match chars.next_if(|c| (' '..='~').contains(c)) {
            // Control sequence: parameters and intermediates, then one
            // final character; it ends early at anything else.
            Some('[') => {
                while let Some(c) = chars.next_if(|c| (' '..='~').contains(c)) {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
            // Operating-system command: up to BEL or ESC \.
            Some(']') => {
                while let Some(c) = chars.next() {
                    if c == '\x07' {
                        break;
                    }
                    if c == '\x1b' {
                        chars.next_if_eq(&'\\');
                        break;
                    }
                }
            }
            // A character set (`ESC ( B`); else a two-character escape.
            Some('(' | ')') => {
                chars.next_if(|c| (' '..='~').contains(c));
            }
            _ => {}
        }
    }
    Cow::Owned(out)
}

/// The most characters of one value a table cell or a quoted value in a
/// sentence shows (the full value is in the JSON, CSV and Parquet outputs):
/// one huge name must not pad every row of a table to its width.
pub const CELL_CHARS: usize = 80;

/// [`printable`], cut to [`CELL_CHARS`] characters with a note of how many
/// more there are: text from files (names, notes, records) shown in a table
/// or a sentence.
pub fn cell(s: &str) -> Cow<'_, str> {
    cut(s, CELL_CHARS)
}

/// The most characters of a sentence quoted from a file or made of what
/// files hold (a note, a reason, what differs, a markdown cell): room for
/// paths and messages, none for a record of megabytes.
pub const NOTE_CHARS: usize = 400;

/// [`printable`], cut to [`NOTE_CHARS`] characters (see [`cell`]).
pub fn note(s: &str) -> Cow<'_, str> {
    cut(s, NOTE_CHARS)
}

/// [`printable`], cut to `most` characters (see [`cell`]).
pub fn cut(s: &str, most: usize) -> Cow<'_, str> {
    // Only the first characters are looked at: a value of megabytes costs
    // no more than a short one.
    let mut chars = s.char_indices();
    let end = match chars.nth(most) {
        None => return printable(s),
        Some((at, _)) => at,
    };
    let more = s[end..].chars().count();
    Cow::Owned(format!(
        "{}… ({more} more characters)",
        printable(&s[..end])
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_values_are_cut_with_a_count_of_the_rest() {
        assert_eq!(cell("short"), "short");
        let long = "x".repeat(CELL_CHARS) + "yyy";
        assert_eq!(
            cell(&long),
            "x".repeat(CELL_CHARS) + "… (3 more characters)"
        );
        assert_eq!(cut("ééé\n", 2), "éé… (2 more characters)");
        assert_eq!(cut("a\nb", 3), "a\\nb");
    }

    #[test]
    fn a_coloured_log_line_reads_as_its_plain_text() {
        let plain = |s: &str| without_escapes(Cow::Borrowed(s)).into_owned();
        // rich's logging handler: time dimmed, level coloured, each number
        // highlighted; a link (OSC 8) and a character set (`ESC ( B`).
        let line = "\x1b[2m12:00:01\x1b[0m \x1b[34mINFO\x1b[0m Step: \x1b[1;36m5\x1b[0m | Loss: \x1b[1;36m3.25\x1b[0m \x1b]8;;file:///x\x1b\\x\x1b]8;;\x07\x1b(B";
        assert_eq!(plain(line), "12:00:01 INFO Step: 5 | Loss: 3.25 x");
        assert!(matches!(
            without_escapes(Cow::Borrowed("as is")),
            Cow::Borrowed(_)
        ));
        // Cut short, or not an escape at all: nothing else is lost.
        assert_eq!(plain("a\x1b[1;3"), "a");
        assert_eq!(plain("a\x1b[1;3\nb"), "a\nb");
        assert_eq!(plain("\x1b]unended"), "");
        assert_eq!(plain("é\x1bé"), "éé");
    }

    #[test]
    fn control_characters_print_as_escapes() {
        assert_eq!(printable("plain é"), "plain é");
        assert_eq!(printable("a\nb\u{1b}[31m"), "a\\nb\\u{1b}[31m");
    }

    #[test]
    fn control_characters_are_found() {
        assert_eq!(forbidden_char("gpu-partition_1 é", false), None);
        assert_eq!(forbidden_char("x\n#SBATCH", false), Some('\n'));
        assert_eq!(forbidden_char("a\nb\tc", true), None);
        assert_eq!(forbidden_char("a\r\nb", true), Some('\r'));
        assert_eq!(forbidden_char("a\u{7f}", true), Some('\u{7f}'));
        assert_eq!(describe_char('\0'), "NUL (U+0000)");
    }
}
