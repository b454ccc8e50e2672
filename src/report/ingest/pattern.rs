//! Any program's log lines, matched by the manifest's `[report] line_pattern`:
//! a regex whose named groups name the fields — `step` and the names of
//! [`Field`] (`loss`, `tokens_per_second`, `training_tokens_pct`, `mfu_pct`,
//! `tflops`, `step_time_s`, `elapsed_s`, ...). Unnamed fields are left empty.

use super::{text_lines, Field, Omissions, Point};
use regex::Regex;

/// The points of a log's bytes, and what was left out of them.
pub fn parse(re: &Regex, bytes: &[u8]) -> (Vec<Point>, Omissions) {
    let mut points = Vec::new();
    let mut omitted = Omissions::default();
    for (n, line, valid) in text_lines(bytes) {
        let Some(c) = re.captures(&line) else {
            continue;
        };
        if !valid {
            omitted.bad_line(n, "a matching line with bytes that are not UTF-8");
            continue;
        }
        let num = |k: &str| {
            c.name(k)
                .map(|m| m.as_str().trim().parse::<f64>().unwrap_or(f64::NAN))
        };
        let mut p = Point {
            step: num("step").unwrap_or(points.len() as f64 + 1.0),
            ..Point::default()
        };
        for f in Field::ALL {
            *f.slot(&mut p) = num(f.name());
        }
        points.extend(omitted.screen(n, p));
    }
    (points, omitted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_groups_become_fields() {
        let re = Regex::new(r"it (?P<step>\d+): (?P<tokens_per_second>[\d.]+) tok/s").unwrap();
        let (p, omitted) = parse(&re, b"start\nit 1: 10.5 tok/s\nnoise\nit 2: 11 tok/s\n");
        assert_eq!(p.len(), 2);
        assert!(omitted.is_empty());
        assert_eq!(
            (p[1].step, p[1].tokens_per_second, p[1].loss),
            (2.0, Some(11.0), None)
        );
    }

    #[test]
    fn unparsable_numbers_and_invalid_bytes_are_omissions() {
        let re = Regex::new(r"it (?P<step>\S+): (?P<tokens_per_second>\S+) tok/s").unwrap();
        let (p, omitted) = parse(&re, b"it 1: inf tok/s\nit \xff: 3 tok/s\nit x: 4 tok/s\n");
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].tokens_per_second, None);
        let text = omitted.describe(std::path::Path::new("f")).join("\n");
        assert!(text.contains("2 line(s) left out"), "{text}");
        assert!(
            text.contains("`tokens_per_second` left out on 1 line(s)"),
            "{text}"
        );
    }
}
