//! Logs -> runs with their points, whatever wrote them: our `metrics.jsonl`, the reference
//! study's lines, or any program's lines matched by a manifest's regex. Nothing here is fatal
//! and nothing is dropped silently: what cannot be read is recorded with the run
//! ([`RunLog::issues`]) and listed among the report's problems, and the rest is used.

pub mod jsonl;
pub mod pattern;
pub mod reference;

use crate::executor::{State, Status};
use crate::plan::record::Configuration;
use crate::train::run::record::StepMetrics;
use crate::util::fs::ReadError;
use indexmap::IndexMap;
use std::path::{Path, PathBuf};

/// The largest log file read (a metrics file of a million steps is ~300 MB).
pub const MAX_LOG_BYTES: u64 = 1 << 30;

/// One logged step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Point {
    pub step: f64,
    pub loss: Option<f64>,
    pub tokens_per_second: Option<f64>,
    pub training_tokens_pct: Option<f64>,
    pub mfu_pct: Option<f64>,
    pub tflops: Option<f64>,
    pub step_time_s: Option<f64>,
    pub elapsed_s: Option<f64>,
    pub global_tokens_per_second: Option<f64>,
    /// Ranks training together (GPUs, CPU processes); unknown means one.
    pub world_size: Option<f64>,
    /// Sequences per device and micro-batch, when the log says.
    pub batch_size: Option<f64>,
    /// The most memory one device held so far, MB (2^20 bytes).
    pub peak_memory_mb: Option<f64>,
    /// A device's average power over the interval, and watts per token/s ([`crate::train::run::energy`]).
    pub watts: Option<f64>,
    pub joules_per_token: Option<f64>,
    /// A foreign log's fields that no [`Field`] is (a `line_pattern`'s other groups), in its order.
    pub extra: Vec<Option<f64>>,
}

impl Point {
    /// Calls `each` with every figure of this point, and `other`'s beside it.
    fn beside(&mut self, other: &Point, mut each: impl FnMut(&mut Option<f64>, Option<f64>)) {
        let mut theirs = other.clone();
        for &f in <Field as strum::VariantArray>::VARIANTS {
            each(f.slot(self), *f.slot(&mut theirs));
        }
        for (mine, theirs) in self.extra.iter_mut().zip(&other.extra) {
            each(mine, *theirs);
        }
    }

    /// Whether no figure of `other` differs from one this point has.
    pub fn agrees(&self, other: &Point) -> bool {
        let mut agree = true;
        self.clone().beside(other, |mine, theirs| {
            agree &= mine.zip(theirs).is_none_or(|(a, b)| a == b)
        });
        agree
    }

    /// Takes `other`'s figures where this point has none.
    pub fn fill(&mut self, other: &Point) {
        self.beside(other, |mine, theirs| *mine = mine.or(theirs));
    }

    /// Takes every figure `other` has, over this point's.
    pub fn overlay(&mut self, other: &Point) {
        self.beside(other, |mine, theirs| *mine = theirs.or(*mine));
    }
}

/// The largest magnitude a foreign field may log: beyond it, only a corrupt log writes numbers.
pub const MAX_EXTRA: f64 = 1e15;

pub use crate::manifest::Field;

/// A [`Point`]'s figure of each field.
impl Field {
    pub fn of(self, p: &Point) -> Option<f64> {
        match self {
            Field::Loss => p.loss,
            Field::TokensPerSecond => p.tokens_per_second,
            Field::TrainingTokensPct => p.training_tokens_pct,
            Field::MfuPct => p.mfu_pct,
            Field::Tflops => p.tflops,
            Field::StepTimeS => p.step_time_s,
            Field::ElapsedS => p.elapsed_s,
            Field::GlobalTokensPerSecond => p.global_tokens_per_second,
            Field::WorldSize => p.world_size,
            Field::BatchSize => p.batch_size,
            Field::PeakMemoryMb => p.peak_memory_mb,
            Field::Watts => p.watts,
            Field::JoulesPerToken => p.joules_per_token,
        }
    }

    pub fn slot(self, p: &mut Point) -> &mut Option<f64> {
        match self {
            Field::Loss => &mut p.loss,
            Field::TokensPerSecond => &mut p.tokens_per_second,
            Field::TrainingTokensPct => &mut p.training_tokens_pct,
            Field::MfuPct => &mut p.mfu_pct,
            Field::Tflops => &mut p.tflops,
            Field::StepTimeS => &mut p.step_time_s,
            Field::ElapsedS => &mut p.elapsed_s,
            Field::GlobalTokensPerSecond => &mut p.global_tokens_per_second,
            Field::WorldSize => &mut p.world_size,
            Field::BatchSize => &mut p.batch_size,
            Field::PeakMemoryMb => &mut p.peak_memory_mb,
            Field::Watts => &mut p.watts,
            Field::JoulesPerToken => &mut p.joules_per_token,
        }
    }
}

impl From<&StepMetrics> for Point {
    fn from(m: &StepMetrics) -> Point {
        Point {
            step: m.step as f64,
            loss: Some(m.loss),
            tokens_per_second: Some(m.tokens_per_second),
            training_tokens_pct: Some(m.training_tokens_pct),
            mfu_pct: Some(m.mfu_pct),
            tflops: Some(m.tflops),
            step_time_s: Some(m.step_time_s),
            elapsed_s: Some(m.elapsed_s),
            global_tokens_per_second: Some(m.global_tokens_per_second),
            world_size: Some(m.world_size as f64),
            // Logs from before `batch_size` was recorded say 0.
            batch_size: Some(m.batch_size as f64).filter(|&b| b > 0.0),
            // 0: a device whose memory the trainer cannot read.
            peak_memory_mb: Some(m.peak_memory_mb).filter(|&mb| mb > 0.0),
            watts: m.watts,
            joules_per_token: m.joules_per_token,
            extra: Vec::new(),
        }
    }
}

/// What readers left out of one log file: unparsed lines, values outside [`Field::plausible`].
#[derive(Debug, Default)]
pub struct Omissions {
    lines: Vec<(usize, String)>,
    /// field -> (lines, first line, first value)
    values: IndexMap<String, (usize, usize, f64)>,
    /// The names of the points' extra fields.
    extras: Vec<String>,
    /// The step of the last point kept.
    last_step: Option<f64>,
    /// Points whose step repeats or goes back: (count, first line, its step, the step before).
    backward: Option<(usize, usize, f64, f64)>,
}

impl Omissions {
    /// For points that carry the extra fields `names`.
    pub fn with_extras(names: &[String]) -> Omissions {
        Omissions {
            extras: names.to_vec(),
            ..Omissions::default()
        }
    }

    fn implausible(&mut self, field: &str, line: usize, v: f64) {
        let e = self.values.entry(field.to_string()).or_insert((0, line, v));
        e.0 += 1;
    }

    pub fn bad_line(&mut self, line: usize, why: impl Into<String>) {
        self.lines.push((line, why.into()));
    }

    /// Keeps the point if its step is a step; clears (and counts) each value a run cannot log.
    pub fn screen(&mut self, line: usize, mut p: Point) -> Option<Point> {
        if !(p.step.is_finite() && p.step >= 0.0 && p.step <= 1e15) {
            self.bad_line(line, format!("step {} is not a step number", p.step));
            return None;
        }
        // Kept, and said: a log of two attempts appended, or of another program's restarts.
        if let Some(prev) = self.last_step.filter(|&prev| p.step <= prev) {
            let b = self.backward.get_or_insert((0, line, p.step, prev));
            b.0 += 1;
        }
        self.last_step = Some(p.step);
        self.screen_figures(line, &mut p);
        Some(p)
    }

    /// Clears (and counts) each value of `p` a run cannot log.
    pub fn screen_figures(&mut self, line: usize, p: &mut Point) {
        for &f in <Field as strum::VariantArray>::VARIANTS {
            let slot = f.slot(p);
            if let Some(v) = *slot {
                if !f.plausible().contains(&v) {
                    *slot = None;
                    self.implausible(f.name(), line, v);
                }
            }
        }
        for i in 0..p.extra.len() {
            if let Some(v) = p.extra[i].filter(|v| !v.is_finite() || v.abs() > MAX_EXTRA) {
                p.extra[i] = None;
                let name = self.extras.get(i).cloned().unwrap_or_default();
                self.implausible(&name, line, v);
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.lines.is_empty() && self.values.is_empty() && self.backward.is_none()
    }

    /// One sentence per kind of omission, naming the file.
    pub fn describe(&self, file: &Path) -> Vec<String> {
        const SHOWN: usize = 3;
        let name = file.display();
        let mut out = Vec::new();
        if !self.lines.is_empty() {
            let shown: Vec<String> = self
                .lines
                .iter()
                .take(SHOWN)
                .map(|(n, why)| format!("line {n}: {}", crate::util::text::note(why)))
                .collect();
            let more = match self.lines.len() {
                n if n > SHOWN => format!("; and {} more", n - SHOWN),
                _ => String::new(),
            };
            out.push(format!(
                "{name}: {} line(s) left out ({}{more})",
                self.lines.len(),
                shown.join("; ")
            ));
        }
        if let Some((count, line, step, prev)) = self.backward {
            out.push(format!(
                "{name}: the step number repeats or goes back on {count} line(s) (line {line}: step {step} after step {prev}): \
                 the log holds more than one attempt or restart, or several processes print each step (every rank of a \
                 `launcher` run: print from rank 0 only), and all of its lines are averaged together"
            ));
        }
        for (field, (count, first, value)) in &self.values {
            // 1e308, not its 309 digits.
            let value = match value.abs() {
                a if a.is_finite() && (a >= 1e9 || (a > 0.0 && a < 1e-6)) => format!("{value:e}"),
                _ => format!("{value}"),
            };
            out.push(format!(
                "{name}: `{field}` left out on {count} line(s), not a value a run can log (line {first}: {value})"
            ));
        }
        out
    }
}

/// A run as the report sees it.
#[derive(Debug, Clone)]
pub struct RunLog {
    pub name: String,
    pub params: IndexMap<String, serde_json::Value>,
    /// What the run repeats, when the planner recorded it (imported logs: none).
    pub configuration: Option<Configuration>,
    /// The run's directory, when it has one (imported logs: none).
    pub dir: Option<PathBuf>,
    /// COMPLETED, RUNNING, FAILED (exit 3), ... as the executor or the log says.
    pub status: Status,
    /// Why the run has no (or incomplete) results, when that is known.
    pub reason: Option<String>,
    pub points: Vec<Point>,
    /// A last line still being written: normal while running, a problem once stopped.
    pub torn: bool,
    /// What was left out of the run's logs and why, and how it ran otherwise than asked.
    pub issues: Vec<String>,
    /// `sweep plan`'s forecast efficiency against one device (100 for one rank).
    pub forecast_pct: Option<f64>,
    /// What the run's id hashes (its whole configuration): what tells studies apart.
    pub identity: Option<serde_json::Value>,
    /// The sweep that rendered it, where its record says.
    pub built: Option<Built>,
    /// The run's id (`run.json`): the hash of its identity, repeat included.
    pub id: Option<String>,
    /// Which measurement of its study it is (`sweep run --again`).
    pub attempt: u32,
    /// Data-parallel runs: each rank's compute time per interval and its host (stragglers).
    pub ranks: Vec<jsonl::RankInterval>,
    /// Its block and place in a blocked design: a block's runs are compared with each other.
    pub block: Option<crate::plan::record::DesignSlot>,
    /// The nodes it ran on, as its job recorded them.
    pub nodes: Vec<String>,
    /// The host its job started on, and how busy it was without the run (`environment.json`).
    pub host: Option<String>,
    pub load: Vec<crate::executor::fingerprint::Load>,
    /// The end of its log, where it stopped without completing.
    pub log_tail: Option<LogTail>,
}

/// A run directory's job logs, sorted, and what kept them from being listed.
pub(crate) fn list_job_logs(dir: &Path) -> (Vec<PathBuf>, Vec<String>) {
    let (mut logs, mut faults) = (Vec::new(), Vec::new());
    let listing = |e: std::io::Error| format!("listing {}: {e}", dir.display());
    match std::fs::read_dir(dir) {
        Ok(entries) => {
            for e in entries {
                match e {
                    Ok(e) if crate::layout::is_job_log(&e.path()) => logs.push(e.path()),
                    Ok(_) => {}
                    Err(e) => faults.push(listing(e)),
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => faults.push(listing(e)),
    }
    logs.sort();
    (logs, faults)
}

/// Of a run directory's job logs, the one the attempt of `job` writes: `local.out`, or
/// `<name>-<job>.out` for a SLURM job; else the log written last.
pub(crate) fn attempt_log(logs: &[PathBuf], job: Option<&str>) -> Option<PathBuf> {
    let name = |p: &Path| {
        p.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let named = |p: &Path, job: &str| match job.starts_with("local-") {
        true => name(p) == crate::executor::local::LOG_FILE,
        false => name(p).ends_with(&format!("-{job}.out")),
    };
    // Else the newest regular file among them.
    let written = |p: &Path| {
        p.symlink_metadata()
            .ok()
            .filter(|m| m.is_file())?
            .modified()
            .ok()
    };
    job.and_then(|j| logs.iter().find(|p| named(p, j)))
        .or_else(|| {
            logs.iter()
                .filter_map(|p| Some((written(p)?, p)))
                .max()
                .map(|(_, p)| p)
        })
        .cloned()
}

/// The line a job's shell writes as each start of a run begins.
fn is_start_line(line: &[u8]) -> bool {
    static START: std::sync::OnceLock<regex::bytes::Regex> = std::sync::OnceLock::new();
    START
        .get_or_init(|| {
            regex::bytes::Regex::new(
                r"^sweep: (?:local job for|run) \S+ \([0-9a-f]+\) .*, restart \d+\r?$",
            )
            .expect("a valid pattern")
        })
        .is_match(line)
}

/// What a job log's last start wrote, and how many starts came before (no figure averages two).
pub fn this_attempt(log: &[u8]) -> (&[u8], usize) {
    let mut starts = 0usize;
    let mut from = 0;
    let mut at = 0;
    // A carriage return ends a line too: a progress bar killed mid-line leaves no newline.
    for line in log.split_inclusive(|&b| b == b'\n' || b == b'\r') {
        at += line.len();
        if is_start_line(line.strip_suffix(b"\n").unwrap_or(line)) {
            starts += 1;
            from = at;
        }
    }
    (&log[from..], starts.saturating_sub(1))
}

/// The last lines of a run's log.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LogTail {
    /// The log's file name.
    pub name: String,
    /// Its last lines: at most 12 from its last 4 KiB, uncoloured, a progress bar's updates each a line.
    pub last: String,
}

impl LogTail {
    /// The last lines of the log of `job` ([`attempt_log`]).
    pub fn read(dir: &Path, job: Option<&str>) -> Option<LogTail> {
        let path = attempt_log(&list_job_logs(dir).0, job)?;
        let bytes = crate::util::fs::read_tail(&path, 4096).ok()?;
        let mut lines: Vec<String> = text_lines(&bytes).map(|(_, l, _)| l.into_owned()).collect();
        while lines.last().is_some_and(|l| l.trim().is_empty()) {
            lines.pop();
        }
        Some(LogTail {
            name: path.file_name()?.to_string_lossy().into_owned(),
            last: lines[lines.len().saturating_sub(12)..].join("\n"),
        })
    }

    /// Its last line with any text in it: what a note quotes.
    pub fn last_line(&self) -> Option<&str> {
        self.last
            .lines()
            .rev()
            .map(str::trim)
            .find(|l| !l.is_empty())
    }
}

/// The sweep that rendered a run: its version and the project's commit.
#[derive(Debug, Clone, PartialEq)]
pub struct Built {
    pub sweep_version: String,
    pub git_commit: Option<String>,
    /// When it was rendered.
    pub created_at: String,
    /// The run's measurement and study attempt, as the history keys them.
    pub attempt_id: String,
    pub study_attempt_id: String,
    /// Why its last job was stopped, where sweep's watchdog or launch doctor stopped it.
    pub last_stop: Option<crate::plan::record::Stop>,
}

impl Built {
    pub fn of(r: &crate::plan::record::RunRecord) -> Built {
        let (attempt_id, study_attempt_id) = r.attempt_ids();
        Built {
            sweep_version: r.sweep_version.clone(),
            git_commit: r.git_commit.clone(),
            created_at: r.created_at.clone(),
            attempt_id,
            study_attempt_id,
            last_stop: r.last_job().and_then(|j| j.stopped.clone()),
        }
    }
}

impl RunLog {
    pub fn new(name: impl Into<String>, status: Status) -> RunLog {
        RunLog {
            name: name.into(),
            params: IndexMap::new(),
            configuration: None,
            dir: None,
            status,
            reason: None,
            points: Vec::new(),
            torn: false,
            issues: Vec::new(),
            forecast_pct: None,
            identity: None,
            built: None,
            id: None,
            attempt: 1,
            ranks: Vec::new(),
            block: None,
            nodes: Vec::new(),
            host: None,
            load: Vec::new(),
            log_tail: None,
        }
    }

    /// A log that could not be read: listed in the report with the reason.
    pub fn unreadable(name: impl Into<String>, why: String) -> RunLog {
        RunLog {
            issues: vec![why],
            ..RunLog::new(name, Status::new(State::Unknown))
        }
    }
}

/// A log file's bytes ([`crate::util::fs::read_regular`], at most [`MAX_LOG_BYTES`]), or the
/// reason, naming the file.
pub fn read_log(path: &Path, within: Option<&Path>) -> Result<Vec<u8>, String> {
    crate::util::fs::read_regular(path, MAX_LOG_BYTES, within).map_err(|e| match e {
        ReadError::NotFound => format!("{} does not exist", path.display()),
        e => format!("{} {e}", path.display()),
    })
}

/// A text log's lines with their numbers, flagged where not UTF-8. A carriage return ends a
/// line too; a line is read up to [`MAX_LINE`] bytes.
pub fn text_lines(bytes: &[u8]) -> impl Iterator<Item = (usize, std::borrow::Cow<'_, str>, bool)> {
    bytes
        .split(|&b| b == b'\n')
        .enumerate()
        .flat_map(|(i, line)| {
            line.split(|&b| b == b'\r').map(move |part| {
                let valid = std::str::from_utf8(part).is_ok();
                let head = &part[..part.len().min(MAX_LINE)];
                let text = crate::util::text::without_escapes(String::from_utf8_lossy(head));
                (i + 1, text, valid)
            })
        })
}

/// The most of one line read as text: a longer one (a dumped tensor) is read by its start.
pub const MAX_LINE: usize = 64 << 10;

#[cfg(test)]
mod tests {
    use super::*;

    /// A run started again appends to its log: only what its last start
    /// wrote is this attempt's (a requeue's start line is the SLURM
    /// prologue's, a re-run's the local executor's).
    #[test]
    fn only_the_last_start_of_a_log_is_this_attempt() {
        let log = b"sweep: local job for x-1 (0a1b2c3d) started at 2026-12-06T10:00:00Z, restart 0
step 1
step 2
sweep: local job for x-1 (0a1b2c3d) started at 2026-12-06T10:05:00Z, restart 1
step 1
";
        assert_eq!(this_attempt(log), (&b"step 1\n"[..], 1));
        let slurm = b"sweep: run big (ff00aa11) job 41 on node1 at 2026-12-06T10:00:00+00:00, restart 0\nit 1\nsweep: run big (ff00aa11) job 41 on node2 at 2026-12-06T11:00:00+00:00, restart 1\nit 7\n";
        assert_eq!(this_attempt(slurm), (&b"it 7\n"[..], 1));
        // After a progress bar killed mid-line.
        let bar = b"sweep: run big (ff00aa11) job 4 on n at t, restart 0\n3/10 [\rsweep: run big (ff00aa11) job 4 on n at t, restart 1\n1/10 [\r";
        assert_eq!(this_attempt(bar), (&b"1/10 [\r"[..], 1));
        // No start line (an imported log), or a program's line that only
        // looks alike: all one attempt.
        let plain = b"step 1\nsweep: run it again, restart 2\nstep 2\n";
        assert_eq!(this_attempt(plain), (&plain[..], 0));
    }

    #[test]
    fn a_huge_line_is_read_by_its_start() {
        let mut log = b"step 1\n".to_vec();
        log.extend(std::iter::repeat_n(0xff, 3 * MAX_LINE));
        log.extend(b"\nstep 2\n");
        let lines: Vec<(usize, String, bool)> = text_lines(&log)
            .map(|(n, l, v)| (n, l.into_owned(), v))
            .collect();
        assert_eq!(lines[0], (1, "step 1".to_string(), true));
        assert_eq!(
            (lines[1].0, lines[1].1.chars().count(), lines[1].2),
            (2, MAX_LINE, false)
        );
        assert_eq!(lines[2], (3, "step 2".to_string(), true));
    }

    #[test]
    fn the_log_shown_is_the_one_of_the_attempt_reported() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // An earlier attempt's log, written last, and the reported job's.
        let failed = "attempt of 12_3\n\x1b[31mfailed here\x1b[0m\n\n";
        std::fs::write(d.join("sweep-r-12_3.out"), failed).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(d.join("sweep-r-9.out"), "an earlier attempt\n").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(d.join("local.out"), "local attempt\n").unwrap();
        let tail = LogTail::read(d, Some("12_3")).unwrap();
        assert_eq!(
            (tail.name.as_str(), tail.last.as_str()),
            ("sweep-r-12_3.out", "attempt of 12_3\nfailed here")
        );
        assert_eq!(tail.last_line(), Some("failed here"));
        assert_eq!(
            LogTail::read(d, Some("local-77-0")).unwrap().name,
            "local.out"
        );
        // An unknown job: the log written last.
        assert_eq!(LogTail::read(d, Some("4")).unwrap().name, "local.out");
        // Twelve lines at the most; an empty log has no last line.
        let many: String = (1..=20).map(|i| format!("line {i}\n")).collect();
        std::fs::write(d.join("local.out"), many).unwrap();
        let tail = LogTail::read(d, None).unwrap();
        assert_eq!(tail.last.lines().count(), 12);
        assert_eq!(tail.last_line(), Some("line 20"));
        std::fs::write(d.join("local.out"), "").unwrap();
        assert_eq!(LogTail::read(d, Some("local-1")).unwrap().last_line(), None);
    }

    #[test]
    fn a_progress_bars_redraws_are_lines_of_their_own() {
        let log = b"start\r\nit 1 loss=3.5\rit 2 loss=3.4\rit 3 loss=3.3\nbad \xff\rit \x1b[1;36m4\x1b[0m\n";
        let lines: Vec<(usize, String, bool)> = text_lines(log)
            .map(|(n, l, valid)| (n, l.into_owned(), valid))
            .collect();
        let want = [
            (1, "start", true),
            (1, "", true),
            (2, "it 1 loss=3.5", true),
            (2, "it 2 loss=3.4", true),
            (2, "it 3 loss=3.3", true),
            (3, "bad \u{fffd}", false),
            (3, "it 4", true), // its colour left out
            (4, "", true),
        ];
        let want: Vec<(usize, String, bool)> = want
            .iter()
            .map(|&(n, l, v)| (n, l.to_string(), v))
            .collect();
        assert_eq!(lines, want);
    }

    #[test]
    fn implausible_values_are_cleared_and_counted_per_field() {
        let mut o = Omissions::default();
        let p = Point {
            step: 3.0,
            loss: Some(f64::INFINITY),
            tokens_per_second: Some(1e308),
            mfu_pct: Some(40.0),
            ..Point::default()
        };
        let kept = o.screen(7, p).unwrap();
        assert_eq!(
            (kept.loss, kept.tokens_per_second, kept.mfu_pct),
            (None, None, Some(40.0))
        );
        assert!(o
            .screen(
                8,
                Point {
                    step: f64::NAN,
                    ..Point::default()
                }
            )
            .is_none());
        for (line, step) in [(9, 5.0), (10, 4.0), (11, 4.0), (12, 6.0)] {
            o.screen(
                line,
                Point {
                    step,
                    ..Point::default()
                },
            )
            .unwrap();
        }
        let text = o.describe(Path::new("m.jsonl")).join("\n");
        assert!(
            text.contains(
                "the step number repeats or goes back on 2 line(s) (line 10: step 4 after step 5)"
            ) && text.contains("several processes print each step"),
            "{text}"
        );
        assert!(
            text.contains("m.jsonl: 1 line(s) left out (line 8: step NaN"),
            "{text}"
        );
        assert!(text.contains("`loss` left out on 1 line(s)"), "{text}");
        assert!(
            text.contains(
                "`tokens_per_second` left out on 1 line(s), not a value a run can log (line 7: 1"
            ),
            "{text}"
        );
    }
}
