//! Any program's log lines, matched by the manifest's `[report] line_pattern`
//! (or `--pattern`): a regex whose named groups name the fields. `step` and
//! the names of [`Field`] (`loss`, `tokens_per_second`, `mfu_pct`, `tflops`,
//! `peak_memory_mb`, ...) keep their meaning; every other named group
//! (`mem_gb`, `samples_per_s`) is a field of its own, summarised in columns
//! of its name. `[report] memory` and `throughput` say which foreign group is
//! the peak memory (converted from the unit its name ends in) and which the
//! tokens per second.

use super::{text_lines, Field, Omissions, Point};
use crate::manifest::{check_roles, memory_unit, step_unit, Roles, StepUnit, TIME_UNITS};
use regex::Regex;

/// A compiled `line_pattern` and what its groups mean, each group by its
/// index (a lookup by name hashes the name, on every line).
#[derive(Debug, Clone)]
pub struct Pattern {
    re: Regex,
    /// Named groups that are no [`Field`] (nor a role): `Point::extra`, in
    /// the order they appear in the pattern.
    pub extras: Vec<String>,
    extra_groups: Vec<usize>,
    step: Option<usize>,
    /// The known fields the pattern names.
    fields: Vec<(Field, usize)>,
    /// (group, MB per unit of it) for the peak memory.
    memory: Option<(usize, f64)>,
    throughput: Option<usize>,
    /// The group of a step's time, and how its figures become seconds.
    step_time: Option<(usize, StepUnit)>,
}

impl Pattern {
    /// The regex as written.
    pub fn as_str(&self) -> &str {
        self.re.as_str()
    }

    /// Whether its lines say their step (else steps are counted).
    pub fn has_step(&self) -> bool {
        self.step.is_some()
    }

    pub fn new(pattern: &str, roles: &Roles) -> Result<Pattern, String> {
        let re = crate::util::text::regex(pattern)?;
        check_roles(&re, roles).map_err(|(_, why)| why)?;
        let is_known = crate::manifest::is_known_group;
        let extras: Vec<String> = re
            .capture_names()
            .flatten()
            .filter(|g| !is_known(g) && !roles.names(g))
            .map(str::to_string)
            .collect();
        if let Some(why) = extras
            .iter()
            .find_map(|g| crate::manifest::group_collides(g, &[]))
        {
            return Err(why);
        }
        let group = |name: &str| re.capture_names().position(|g| g == Some(name));
        // `check_roles` found every role's group.
        let role = |name: &String| group(name).expect("a group of the pattern");
        Ok(Pattern {
            extra_groups: extras.iter().filter_map(|g| group(g)).collect(),
            step: group("step"),
            fields: <Field as strum::VariantArray>::VARIANTS
                .iter()
                .filter_map(|&f| Some((f, group(f.name())?)))
                .collect(),
            memory: roles
                .memory
                .as_ref()
                .map(|g| (role(g), memory_unit(g).unwrap_or(1.0))),
            throughput: roles.throughput.as_ref().map(role),
            step_time: roles.step_time.as_ref().map(|g| (role(g), step_unit(g))),
            extras,
            re,
        })
    }
}

/// The points of a log's bytes, and what was left out of them. Lines in a
/// row with the same step are one point, newer figures over older (the
/// last line only fills gaps: a closed progress bar repeats its last step);
/// a line with no step belongs to the last step said (docs/report.md).
pub fn parse(pattern: &Pattern, bytes: &[u8]) -> (Vec<Point>, Omissions) {
    let mut points: Vec<Point> = Vec::new();
    let mut omitted = Omissions::with_extras(&pattern.extras);
    let has_step = pattern.has_step();
    // The last step drawn again, applied once another line follows.
    let mut again: Option<Point> = None;
    for (n, line, valid) in text_lines(bytes) {
        let Some(c) = pattern.re.captures(&line) else {
            continue;
        };
        if !valid {
            omitted.bad_line(n, "a matching line with bytes that are not UTF-8");
            continue;
        }
        if let (Some(p), Some(last)) = (again.take(), points.last_mut()) {
            last.overlay(&p);
        }
        let mut p = figures(pattern, &c);
        let said = pattern
            .step
            .and_then(|g| c.get(g))
            .map(|m| number(m.as_str()));
        let count = points.len() as f64 + 1.0;
        match (said, points.last_mut()) {
            (None, _) if !has_step => p.step = count,
            (None, None) => {
                omitted.bad_line(n, "a line before the first that says its step");
                continue;
            }
            (None, Some(last)) => {
                omitted.screen_figures(n, &mut p);
                p.step = last.step;
                match last.agrees(&p) {
                    true => last.fill(&p),
                    false => points.push(p),
                }
                continue;
            }
            (Some(step), Some(last)) if step == last.step => {
                omitted.screen_figures(n, &mut p);
                again = Some(p);
                continue;
            }
            (Some(step), _) => p.step = step,
        }
        points.extend(omitted.screen(n, p));
    }
    if let (Some(p), Some(last)) = (again, points.last_mut()) {
        last.fill(&p);
    }
    (points, omitted)
}

/// The figures of one matching line (its step left to [`parse`]).
fn figures(pattern: &Pattern, c: &regex::Captures) -> Point {
    let num = |group: usize| c.get(group).map(|m| number(m.as_str()));
    let mut p = Point {
        extra: pattern.extra_groups.iter().map(|&g| num(g)).collect(),
        ..Point::default()
    };
    for &(f, g) in &pattern.fields {
        *f.slot(&mut p) = num(g);
    }
    if let Some((g, mb)) = pattern.memory {
        p.peak_memory_mb = num(g).map(|v| v * mb);
    }
    if let Some(g) = pattern.throughput {
        p.tokens_per_second = num(g);
    }
    if let Some((g, unit)) = pattern.step_time {
        p.step_time_s = c.get(g).map(|m| match unit {
            StepUnit::Time(s) => number(m.as_str()) * s,
            StepUnit::Rate(s) => s / number(m.as_str()),
            StepUnit::InFigure => seconds_per_step(m.as_str()),
        });
    }
    p
}

/// Seconds per step from a figure that says its unit: `5.33ms`, `2.1 s`, and
/// a progress bar's pace, tqdm's `4.98it/s` (steps per second) or
/// `1.23s/it`; NaN (left out, and counted) for another unit.
fn seconds_per_step(text: &str) -> f64 {
    let text = text.trim();
    let figure = text.trim_end_matches(|c: char| c.is_alphabetic() || c == '/' || c == ' ');
    let v = number(figure);
    match text[figure.len()..].trim() {
        "it/s" => 1.0 / v,
        "s/it" => v,
        "µs" => v * 1e-6,
        unit => TIME_UNITS
            .iter()
            .find(|(suffix, _)| &suffix[1..] == unit)
            .map_or(f64::NAN, |&(_, s)| v * s),
    }
}

/// A figure as a program printed it: `6543.2`, `1e-4`, or grouped in
/// thousands (`6,543`: Python's `{:,}`, torchtitan's tokens/s); NaN (left
/// out, and counted) for anything else. A comma is read only between groups
/// of three digits, so `3,25` (a decimal comma) is never read as 325.
fn number(text: &str) -> f64 {
    let text = text.trim();
    if let Ok(v) = text.parse::<f64>() {
        return v;
    }
    let (int, frac) = text
        .split_once('.')
        .map_or((text, None), |(i, f)| (i, Some(f)));
    let int = int.strip_prefix('-').unwrap_or(int);
    let mut groups = int.split(',');
    let first = groups.next().unwrap_or_default();
    let digits = |g: &str| g.bytes().all(|b| b.is_ascii_digit());
    let grouped = (1..=3).contains(&first.len())
        && digits(first)
        && int.contains(',')
        && groups.all(|g| g.len() == 3 && digits(g))
        && frac.is_none_or(|f| !f.is_empty() && digits(f));
    match grouped {
        true => text.replace(',', "").parse().unwrap_or(f64::NAN),
        false => f64::NAN,
    }
}

/// The last point of a running command's log (the newest `*.out` in its
/// directory, its last 64 KiB: a progress bar's updates are lines), for the
/// live view; `None` before its first matching line.
pub fn last_point(pattern: &Pattern, dir: &std::path::Path) -> Option<Point> {
    const TAIL: usize = 64 << 10;
    let log = super::attempt_log(&super::list_job_logs(dir).0, None)?;
    // One byte more than the tail says whether the tail was cut; a cut
    // first line is left out.
    let read = crate::util::fs::read_tail(&log, TAIL as u64 + 1).ok()?;
    let tail = match read.len() > TAIL {
        true => {
            let tail = &read[1..];
            let first = tail.iter().position(|&b| b == b'\n' || b == b'\r');
            &tail[first.map_or(tail.len(), |i| i + 1)..]
        }
        false => &read[..],
    };
    // Never an earlier attempt's step: only what the last start wrote.
    let mut points = parse(pattern, super::this_attempt(tail).0).0;
    let mut last = points.pop()?;
    // A loss logged on its own lines (Hugging Face's `{'loss': …}` every
    // `logging_steps`, between progress-bar updates): the latest one.
    if last.loss.is_none() {
        last.loss = points.iter().rev().find_map(|p| p.loss);
    }
    Some(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_commands_last_point_is_read_from_its_newest_log() {
        let d = tempfile::tempdir().unwrap();
        let re = pattern(r"it (?P<step>\d+): (?P<tokens_per_second>[\d.]+) tok/s");
        assert!(re.has_step() && !pattern(r"(?P<loss>[\d.]+)").has_step());
        assert_eq!(last_point(&re, d.path()), None, "no log yet");
        let old = d.path().join("old.out");
        std::fs::write(&old, "it 99: 1 tok/s\n").unwrap();
        let an_hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        std::fs::File::options()
            .write(true)
            .open(&old)
            .and_then(|f| f.set_modified(an_hour_ago))
            .unwrap();
        let long = "x".repeat(70 << 10);
        std::fs::write(
            d.path().join("job-7.out"),
            format!("{long}\rit 1: 10 tok/s\rit 2: 12.5 tok/s\rnoise"),
        )
        .unwrap();
        let p = last_point(&re, d.path()).unwrap();
        assert_eq!((p.step, p.tokens_per_second), (2.0, Some(12.5)));
        // A loss on lines of its own between progress updates (Hugging
        // Face's): the latest, not `-` until the next one; none from an
        // earlier attempt.
        let hf = pattern(r"(?P<step>\d+)/\d+ \[|\{'loss': (?P<loss>[\d.]+)");
        std::fs::write(
            d.path().join("job-7.out"),
            "sweep: run r (0abc) job 7 on n at t, restart 0\n{'loss': 9.0}\n3/10 [\r\
             sweep: run r (0abc) job 7 on n at t, restart 1\n1/10 [\r2/10 [\r{'loss': 4.5}\n3/10 [\r4/10 [\r",
        )
        .unwrap();
        let p = last_point(&hf, d.path()).unwrap();
        assert_eq!((p.step, p.loss), (4.0, Some(4.5)));
        std::fs::write(
            d.path().join("job-7.out"),
            "sweep: run r (0abc) job 7 on n at t, restart 0\n3/10 [\r{'loss': 9.0}\n4/10 [\r\
             sweep: run r (0abc) job 7 on n at t, restart 1\n1/10 [\r",
        )
        .unwrap();
        let p = last_point(&hf, d.path()).unwrap();
        assert_eq!(
            (p.step, p.loss),
            (1.0, None),
            "the killed attempt's loss is not this one's"
        );
    }

    fn pattern(re: &str) -> Pattern {
        Pattern::new(re, &Roles::default()).unwrap()
    }

    #[test]
    fn named_groups_become_fields() {
        let re = pattern(r"it (?P<step>\d+): (?P<tokens_per_second>[\d.]+) tok/s");
        let (p, omitted) = parse(&re, b"start\nit 1: 10.5 tok/s\nnoise\nit 2: 11 tok/s\n");
        assert_eq!(p.len(), 2);
        assert!(omitted.is_empty());
        assert_eq!(
            (p[1].step, p[1].tokens_per_second, p[1].loss),
            (2.0, Some(11.0), None)
        );
    }

    #[test]
    fn other_groups_are_fields_of_their_own_and_roles_map_them() {
        let re =
            r"it (?P<step>\d+): (?P<tok_s>[\d.]+) tok/s (?P<mem_gib>[\d.]+) GiB (?P<grad_norm>\S+)";
        let plain = pattern(re);
        assert_eq!(plain.extras, ["tok_s", "mem_gib", "grad_norm"]);
        let (p, _) = parse(&plain, b"it 1: 10 tok/s 2 GiB 0.5\n");
        assert_eq!(p[0].extra, [Some(10.0), Some(2.0), Some(0.5)]);
        let roles = Roles {
            memory: Some("mem_gib".into()),
            throughput: Some("tok_s".into()),
            step_time: None,
        };
        let mapped = Pattern::new(re, &roles).unwrap();
        assert_eq!(mapped.extras, ["grad_norm"]);
        let (p, omitted) = parse(&mapped, b"it 1: 10 tok/s 2 GiB inf\n");
        assert_eq!(
            (
                p[0].tokens_per_second,
                p[0].peak_memory_mb,
                p[0].extra.clone()
            ),
            (Some(10.0), Some(2048.0), vec![None])
        );
        let text = omitted.describe(std::path::Path::new("f")).join("\n");
        assert!(text.contains("`grad_norm` left out on 1 line(s)"), "{text}");
    }

    /// nanoGPT's own line: the step's time in ms becomes seconds; a group
    /// without a time unit is refused with the name to give it.
    #[test]
    fn a_step_time_group_is_read_in_the_unit_its_name_ends_in() {
        let re = r"iter (?P<step>\d+): loss (?P<loss>[\d.]+), time (?P<time_ms>[\d.]+)ms, mfu (?P<mfu_pct>[-\d.]+)%";
        let roles = Roles {
            step_time: Some("time_ms".into()),
            ..Roles::default()
        };
        let p = Pattern::new(re, &roles).unwrap();
        assert!(p.extras.is_empty());
        let (points, _) = parse(&p, b"iter 10: loss 4.5504, time 5.33ms, mfu 0.01%\n");
        assert!((points[0].step_time_s.unwrap() - 0.00533).abs() < 1e-15);
        assert_eq!(points[0].mfu_pct, Some(0.01));
        let bare = Roles {
            step_time: Some("dt".into()),
            ..Roles::default()
        };
        let err = check_roles(&Regex::new(r"(?P<dt>[\d.]+)").unwrap(), &bare).unwrap_err();
        assert_eq!(err.0, "step_time");
        assert!(err.1.contains("name the group `dt_ms`"), "{}", err.1);
        for (name, s) in [
            ("dt_us", 1e-6),
            ("step_s", 1.0),
            ("dt_sec", 1.0),
            ("iter_min", 60.0),
        ] {
            assert_eq!(step_unit(name), StepUnit::Time(s), "{name}");
        }
        // A rate is no time: `it_per_s` also ends in `_s`. Hugging Face's
        // summary line says the steps per second of the whole run.
        assert_eq!(step_unit("it_per_s"), StepUnit::Rate(1.0));
        assert_eq!(step_unit("steps_per_min"), StepUnit::Rate(60.0));
        let roles = Roles {
            step_time: Some("train_steps_per_s".into()),
            ..Roles::default()
        };
        let p = Pattern::new(
            r"'train_steps_per_second': (?P<train_steps_per_s>[\d.]+)",
            &roles,
        )
        .unwrap();
        let (points, _) = parse(
            &p,
            b"{'train_runtime': 21.6, 'train_steps_per_second': 1.85, 'epoch': 0.02}\n",
        );
        assert!((points[0].step_time_s.unwrap() - 1.0 / 1.85).abs() < 1e-12);
    }

    #[test]
    fn roles_must_name_foreign_groups_with_units() {
        let re = r"(?P<step>\d+) (?P<mem>\d+) (?P<loss>\S+)";
        let err = |memory: &str| {
            let roles = Roles {
                memory: Some(memory.into()),
                ..Roles::default()
            };
            check_roles(&Regex::new(re).unwrap(), &roles).unwrap_err().1
        };
        assert!(
            err("memory").contains("names no group"),
            "{}",
            err("memory")
        );
        assert!(
            err("loss").contains("already is a field"),
            "{}",
            err("loss")
        );
        assert!(
            err("mem").contains("name the group `mem_gb`"),
            "{}",
            err("mem")
        );
        assert_eq!(memory_unit("Mem_GB"), Some(1e9 / 1048576.0));
    }

    #[test]
    fn figures_grouped_in_thousands_are_read_and_decimal_commas_are_not() {
        for (text, want) in [
            ("6,543", 6543.0),
            (" 1,234,567.5 ", 1234567.5),
            ("-1,000", -1000.0),
            ("12.5", 12.5),
            ("1e-4", 1e-4),
        ] {
            assert_eq!(number(text), want, "{text}");
        }
        for bad in [
            "3,25", "1,2345", ",123", "1,,234", "12,34.5", "1,234.", "x,123", "",
        ] {
            assert!(number(bad).is_nan(), "{bad}");
        }
    }

    #[test]
    fn unparsable_numbers_and_invalid_bytes_are_omissions() {
        let re = pattern(r"it (?P<step>\S+): (?P<tokens_per_second>\S+) tok/s");
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

    /// Hugging Face's Trainer, as its log reads under SLURM (recorded from
    /// transformers 4.46): a tqdm bar redrawn with `\r` says the step and the
    /// pace, its `{'loss': …}` lines say no step, the bar is drawn again
    /// after each, and closed with its overall rate.
    #[test]
    fn a_progress_bars_pace_and_the_lines_beside_it_make_one_point_per_step() {
        let roles = Roles {
            step_time: Some("pace".into()),
            ..Roles::default()
        };
        let re = r"(?P<step>\d+)/\d+ \[[^\]]*, *(?P<pace>[\d.]+(?:it/s|s/it))\]|\{'loss': (?P<loss>[\d.]+)";
        let p = Pattern::new(re, &roles).unwrap();
        let bar = |n: u32, pace: &str| {
            format!(
                " {}%|███▌  | {n}/40 [00:0{}<00:30, {pace}]",
                n * 100 / 40,
                n / 10
            )
        };
        let log = [
            "max_steps is given, it will override any value given in num_train_epochs\n".to_string(),
            format!("\r{}", bar(0, "?it/s")),
            format!("\r{}", bar(4, "1.25s/it")),
            "\r                         \r{'loss': 6.2059, 'grad_norm': 0.58, 'learning_rate': 4.4e-05, 'epoch': 0.0}\n".into(),
            format!("\r{}", bar(4, "1.25s/it")),
            format!("\r{}", bar(5, " 1.02it/s")),
            "\r                         \r{'loss': 6.2016, 'grad_norm': 0.58, 'learning_rate': 3.8e-05, 'epoch': 0.0}\n".into(),
            "\r                         \r{'loss': 6.2000, 'grad_norm': 0.58, 'learning_rate': 3.7e-05, 'epoch': 0.0}\n".into(),
            format!("\r{}", bar(40, "2.00it/s")),
            "\r{'train_runtime': 21.6, 'train_samples_per_second': 7.4, 'train_loss': 6.19, 'epoch': 0.02}\n".into(),
            format!("\r{}", bar(40, "2.00it/s")),
            format!("\r{}\n", bar(40, "1.85it/s")),
        ]
        .concat();
        let (points, omitted) = parse(&p, log.as_bytes());
        let got: Vec<(f64, Option<f64>, Option<f64>)> = points
            .iter()
            .map(|p| (p.step, p.step_time_s, p.loss))
            .collect();
        let pace = |s: f64| Some(s);
        assert_eq!(
            got,
            [
                (4.0, pace(1.25), Some(6.2059)),
                (5.0, pace(1.0 / 1.02), Some(6.2016)),
                (5.0, None, Some(6.2)),
                (40.0, pace(0.5), None),
            ]
        );
        assert!(
            omitted.is_empty(),
            "{:?}",
            omitted.describe(std::path::Path::new("f"))
        );

        // A step that goes back is still a repeat: kept, and said.
        let (points, omitted) = parse(
            &p,
            format!(
                "{}\n{}\n{}\n",
                bar(7, "1.85it/s"),
                bar(8, "1.5it/s"),
                bar(7, "1.5it/s")
            )
            .as_bytes(),
        );
        assert_eq!(
            points.iter().map(|p| p.step).collect::<Vec<_>>(),
            [7.0, 8.0, 7.0]
        );
        let said = omitted.describe(std::path::Path::new("f")).join("\n");
        assert!(said.contains("repeats or goes back on 1 line(s)"), "{said}");

        // A line that says no step before any that does has no step to join.
        let (points, omitted) = parse(&p, b"{'loss': 6.1}\n");
        assert!(points.is_empty());
        let said = omitted.describe(std::path::Path::new("f")).join("\n");
        assert!(
            said.contains("line 1: a line before the first that says its step"),
            "{said}"
        );
    }

    /// PyTorch Lightning's bar (recorded from lightning 2.4): each step is
    /// drawn twice, first with the loss of the step before, then with its
    /// own; the newer drawing is the step's (but for the log's last line,
    /// which only adds what its step lacks: a bar's close, at its overall rate).
    #[test]
    fn a_step_drawn_twice_is_one_point_with_its_newer_figures() {
        let roles = Roles {
            step_time: Some("pace".into()),
            ..Roles::default()
        };
        let re = r"Epoch \d+: +\d+%\|[^|]*\| (?P<step>\d+)/\d+ \[[^,]*, *(?P<pace>[\d.]+(?:it/s|s/it))(?:, train_loss=(?P<loss>[\d.]+))?";
        let p = Pattern::new(re, &roles).unwrap();
        let log = "\rEpoch 0:   0%|          | 0/20 [00:00<?, ?it/s] \
                   \rEpoch 0:   5%|▌         | 1/20 [00:00<00:02,  8.90it/s]\
                   \rEpoch 0:   5%|▌         | 1/20 [00:00<00:02,  8.88it/s, train_loss=0.968]\
                   \rEpoch 0:  10%|█         | 2/20 [00:00<00:01, 11.35it/s, train_loss=0.968]\
                   \rEpoch 0:  10%|█         | 2/20 [00:00<00:01, 11.33it/s, train_loss=1.110]\
                   \rEpoch 0:  15%|█▌        | 3/20 [00:00<00:01, 12.50it/s, train_loss=1.110]\
                   \rEpoch 0:  15%|█▌        | 3/20 [00:00<00:01, 12.49it/s, train_loss=1.050]";
        let (points, omitted) = parse(&p, log.as_bytes());
        let got: Vec<(f64, f64, Option<f64>)> = points
            .iter()
            .map(|p| (p.step, 1.0 / p.step_time_s.unwrap(), p.loss))
            .collect();
        let want = [
            (1.0, 8.88, Some(0.968)),
            (2.0, 11.33, Some(1.11)),
            (3.0, 12.50, Some(1.11)),
        ];
        for (g, w) in got.iter().zip(&want) {
            assert!(
                g.0 == w.0 && (g.1 - w.1).abs() < 1e-9 && g.2 == w.2,
                "{got:?}"
            );
        }
        assert_eq!(got.len(), 3);
        assert!(omitted.is_empty());
    }

    #[test]
    fn a_step_time_figure_may_say_its_unit() {
        for (text, want) in [
            ("4.98it/s", 1.0 / 4.98),
            (" 1.23s/it", 1.23),
            ("5.33ms", 0.00533),
            ("2.1 s", 2.1),
            ("750us", 750e-6),
            ("750µs", 750e-6),
            ("1e-3s", 1e-3),
            ("2min", 120.0),
        ] {
            assert!((seconds_per_step(text) - want).abs() < 1e-12, "{text}");
        }
        for text in ["5", "5.33 parsecs", "?it/s", "1.2kit/s"] {
            assert!(seconds_per_step(text).is_nan(), "{text}");
        }
        let roles = Roles {
            step_time: Some("pace".into()),
            ..Roles::default()
        };
        let check = |re: &str| check_roles(&Regex::new(re).unwrap(), &roles);
        assert!(check(r"(?P<pace>[\d.]+(?:it/s|s/it))").is_ok());
        assert!(check(r"took (?P<pace>\d+(?:\.\d+)?\s*(?:ms|s))").is_ok());
        let err = check(r"(?P<pace>[\d.]+)(?:it/s|s/it)").unwrap_err();
        assert!(err.1.contains("take the unit into the group"), "{}", err.1);
        assert!(
            check(r"(?P<pace>[\d.]+(?:it/s)?)").is_err(),
            "a unit that may be left out"
        );
    }
}
