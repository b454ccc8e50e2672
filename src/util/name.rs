//! Names that become directory names: a study's (`results/<study>`,
//! `plots/<study>`) and a run's (`results/<study>/<run>`). One rule for all
//! of them, so that no name given on the command line or in a manifest can
//! reach outside the directory it belongs to.

/// The longest name: well under the file systems' 255 bytes, with room for
/// what is appended to it (`<a>-vs-<b>`, job names, temporary files).
pub const MAX_LEN: usize = 100;

/// Why `name` cannot name a directory, if it cannot: empty, too long,
/// starting with `.` (`.`, `..`, hidden), or holding anything but ASCII
/// letters, digits, `.`, `_` and `-` (no `/`, no spaces, no control characters).
pub fn check(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("a name cannot be empty".into());
    }
    if name.len() > MAX_LEN {
        return Err(format!(
            "this name is {} characters long; names are limited to {MAX_LEN} (they become directory and job names)",
            name.chars().count()
        ));
    }
    if name.starts_with('.') {
        return Err(format!("`{}` starts with `.`", name.escape_debug()));
    }
    if let Some(c) = name
        .chars()
        .find(|&c| !(c.is_ascii_alphanumeric() || "._-".contains(c)))
    {
        return Err(format!(
            "`{}` holds `{}`: use letters, digits, `.`, `_` and `-`",
            name.escape_debug(),
            c.escape_debug()
        ));
    }
    Ok(())
}

/// `name` with every character a name cannot hold replaced by `-`: what a
/// run name a template writes becomes. Its other faults (empty, too long, a
/// leading `.`) stay, for [`check`] to refuse: a name a user chose is
/// never shortened or renamed behind their back.
pub fn replace_unsafe(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            c if c.is_ascii_alphanumeric() || "._-".contains(c) => c,
            _ => '-',
        })
        .collect()
}

/// `name` if it can name a directory, else the same with every other
/// character replaced by `-`, a leading `.` by `_`, and shortened to
/// [`MAX_LEN`] with a hash of the whole (so that two long names stay
/// distinct). For names read from disk, never for names a user chose.
pub fn sanitize(name: &str) -> String {
    if check(name).is_ok() {
        return name.to_string();
    }
    let mut s = replace_unsafe(name);
    if s.starts_with('.') {
        s.replace_range(..1, "_");
    }
    if s.is_empty() {
        s.push('_');
    }
    if s.len() > MAX_LEN {
        let hash = crate::util::hash::sha256_bytes(name.as_bytes());
        s.truncate(MAX_LEN - 9);
        s = format!("{s}-{}", &hash[..8]);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_leave_their_directory_are_refused() {
        for bad in [
            "", ".", "..", "../x", "/etc", "a/b", ".hidden", "a b", "a\nb", "é",
        ] {
            assert!(check(bad).is_err(), "{bad:?} passed");
        }
        assert!(check(&"x".repeat(MAX_LEN + 1))
            .unwrap_err()
            .contains("limited to 100"));
        for good in ["quickstart", "ref-1b_bs8.v2", &"x".repeat(MAX_LEN)] {
            assert_eq!(check(good), Ok(()), "{good}");
        }
    }

    #[test]
    fn sanitized_names_always_pass_and_stay_distinct() {
        for raw in ["..", "../../etc", "a b\u{1b}[31m", "", &"y".repeat(300)] {
            let s = sanitize(raw);
            assert_eq!(check(&s), Ok(()), "{raw:?} -> {s:?}");
        }
        assert_eq!(sanitize("fine-name"), "fine-name");
        let (a, b) = ("z".repeat(200) + "a", "z".repeat(200) + "b");
        assert_ne!(sanitize(&a), sanitize(&b));
    }
}
