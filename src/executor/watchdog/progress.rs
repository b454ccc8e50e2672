//! What counts as progress, read as it comes: a command's log lines matching its `line_pattern`
//! (the job's log is the watchdog's own stdout), or the trainer's ranks' steps in
//! `progress/rank-<r>`; the run has progressed when its slowest rank has.

use crate::util::heartbeat::{self, Beat};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The intervals kept for `auto`'s median (the latest ones).
const KEEP: usize = 1000;
/// The most of the log read in one look (a faster-growing log is read over several).
const READ_MAX: u64 = 16 << 20;

pub struct Progress {
    source: Feed,
    /// Records so far.
    pub records: u64,
    /// When the last new record was seen.
    last: Option<Instant>,
    /// Seconds between records, as seen.
    intervals: Vec<f64>,
}

enum Feed {
    Lines(Lines),
    Ranks {
        dir: PathBuf,
        /// The world's size, where the job says it: until every rank reported, the run has not started.
        world: Option<usize>,
        /// The slowest rank's step, last seen.
        step: u64,
    },
}

struct Lines {
    /// The job's log, where it is a file.
    log: Option<PathBuf>,
    offset: u64,
    /// A line not yet ended.
    partial: Vec<u8>,
    pattern: regex::Regex,
    /// The last line that matched.
    last_match: Option<String>,
}

impl Progress {
    pub fn new(run_dir: &Path, pattern: Option<regex::Regex>) -> Progress {
        let source = match pattern {
            Some(pattern) => {
                let log = own_log();
                let offset = log
                    .as_deref()
                    .and_then(|l| std::fs::metadata(l).ok())
                    .map_or(0, |m| m.len());
                if log.is_none() {
                    eprintln!("sweep watchdog: this job's output is not a file: its progress lines cannot be read, so only the startup limit can stop it");
                }
                Feed::Lines(Lines {
                    log,
                    offset,
                    partial: Vec::new(),
                    pattern,
                    last_match: None,
                })
            }
            None => Feed::Ranks {
                dir: run_dir.to_path_buf(),
                world: std::env::var("WORLD_SIZE")
                    .ok()
                    .and_then(|w| w.parse().ok())
                    .filter(|&w| w > 0),
                step: 0,
            },
        };
        Progress {
            source,
            records: 0,
            last: None,
            intervals: Vec::new(),
        }
    }

    /// Reads what came since the last look.
    pub fn poll(&mut self) {
        let new = match &mut self.source {
            Feed::Lines(lines) => lines.read(),
            Feed::Ranks { dir, world, step } => {
                let beats = heartbeat::read_all(dir);
                let slowest = slowest(&beats, *world);
                let new = slowest.saturating_sub(*step);
                *step = (*step).max(slowest);
                new
            }
        };
        if new > 0 {
            self.seen(new, Instant::now());
        }
    }

    /// `n` records seen at `now`, sharing the time since the last.
    fn seen(&mut self, n: u64, now: Instant) {
        if let Some(last) = self.last {
            let each = (now - last).as_secs_f64() / n as f64;
            self.intervals
                .extend(std::iter::repeat_n(each, n.min(KEEP as u64) as usize));
            if self.intervals.len() > KEEP {
                self.intervals.drain(..self.intervals.len() - KEEP);
            }
        }
        self.records += n;
        self.last = Some(now);
    }

    /// How long since the last record; `None` before the first.
    pub fn quiet(&self) -> Option<Duration> {
        self.last.map(|l| l.elapsed())
    }

    pub fn intervals(&self) -> Vec<f64> {
        self.intervals.clone()
    }

    /// The progress so far in words ("step 12"), never a log line (it would read as progress).
    pub fn so_far(&self) -> Option<String> {
        match &self.source {
            Feed::Lines(_) if self.records == 1 => Some("1 progress line".into()),
            Feed::Lines(_) => {
                (self.records > 1).then(|| format!("{} progress lines", self.records))
            }
            Feed::Ranks { step, .. } => (*step > 0).then(|| format!("step {step}")),
        }
    }

    /// The last line that matched the pattern.
    pub fn last_line(&self) -> Option<&str> {
        match &self.source {
            Feed::Lines(l) => l.last_match.as_deref(),
            Feed::Ranks { .. } => None,
        }
    }

    /// The ranks' reports, for a trainer run.
    pub fn beats(&self) -> Option<(Vec<Beat>, Option<usize>)> {
        match &self.source {
            Feed::Ranks { dir, world, .. } => Some((heartbeat::read_all(dir), *world)),
            Feed::Lines(_) => None,
        }
    }

    /// The job's log, where the watchdog reads it.
    pub fn log(&self) -> Option<&Path> {
        match &self.source {
            Feed::Lines(l) => l.log.as_deref(),
            Feed::Ranks { .. } => own_log_cached(),
        }
    }
}

/// The slowest rank's last step: 0 until every rank (known, or reported) finished one.
fn slowest(beats: &[Beat], world: Option<usize>) -> u64 {
    let expected = world.unwrap_or(beats.len()).max(1);
    if beats.len() < expected {
        return 0;
    }
    beats.iter().map(|b| b.step).min().unwrap_or(0)
}

impl Lines {
    /// Matching lines ended since the last look. A carriage return ends a line too: a progress bar
    /// redraws with `\r` and ends its line only at an epoch's end.
    fn read(&mut self) -> u64 {
        let Some(log) = &self.log else { return 0 };
        // A file only: whatever replaced the log (a FIFO would block for ever) is not opened.
        let Ok((mut f, meta)) = crate::util::fs::open_regular(log, 0) else {
            return 0;
        };
        let len = meta.len();
        if len < self.offset {
            // Truncated: read it again from its start.
            self.offset = 0;
            self.partial.clear();
        }
        if len == self.offset || f.seek(SeekFrom::Start(self.offset)).is_err() {
            return 0;
        }
        let mut reader = f.take(READ_MAX);
        let mut chunk = vec![0u8; 64 << 10];
        let mut n = 0;
        let mut line = std::mem::take(&mut self.partial);
        loop {
            let got = match reader.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(got) => got,
            };
            self.offset += got as u64;
            let mut rest = &chunk[..got];
            while let Some(end) = rest.iter().position(|&b| b == b'\n' || b == b'\r') {
                line.extend_from_slice(&rest[..end]);
                n += u64::from(self.matched(&line));
                line.clear();
                rest = &rest[end + 1..];
            }
            line.extend_from_slice(rest);
        }
        // A line that long is no progress line: its start is dropped.
        if line.len() > 1 << 20 {
            line.clear();
        }
        self.partial = line;
        n
    }

    /// Whether an ended line is a progress line (kept as the last one).
    fn matched(&mut self, line: &[u8]) -> bool {
        let text = crate::util::text::without_escapes(String::from_utf8_lossy(line));
        let text = text.trim_end();
        let hit = !text.is_empty() && self.pattern.is_match(text);
        if hit {
            self.last_match = Some(text.chars().take(300).collect());
        }
        hit
    }
}

/// The file this process's stdout goes to, where it is one (the job's log).
fn own_log() -> Option<PathBuf> {
    let path = std::fs::read_link("/proc/self/fd/1").ok()?;
    std::fs::metadata(&path)
        .ok()
        .filter(|m| m.is_file())
        .map(|_| path)
}

fn own_log_cached() -> Option<&'static Path> {
    static LOG: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    LOG.get_or_init(own_log).as_deref()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn beat(rank: usize, step: u64) -> Beat {
        Beat {
            rank,
            step,
            at_ms: 0,
            host: "h".into(),
            pid: 1,
        }
    }

    #[test]
    fn the_run_progresses_with_its_slowest_rank_once_all_reported() {
        assert_eq!(slowest(&[beat(0, 5)], Some(2)), 0, "rank 1 never reported");
        assert_eq!(slowest(&[beat(0, 5), beat(1, 3)], Some(2)), 3);
        assert_eq!(slowest(&[beat(0, 5), beat(1, 3)], None), 3);
        assert_eq!(slowest(&[], None), 0);
    }

    #[test]
    fn matching_lines_count_once_each_even_when_torn_across_looks() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("job.out");
        std::fs::write(&log, "iter 0 old\n").unwrap();
        let mut lines = Lines {
            log: Some(log.clone()),
            offset: 11,
            partial: Vec::new(),
            pattern: regex::Regex::new(r"^iter (?P<step>\d+)").unwrap(),
            last_match: None,
        };
        let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        write!(f, "iter 1: loss 3\nnoise\niter 2: lo").unwrap();
        assert_eq!(lines.read(), 1);
        writeln!(f, "ss 2").unwrap();
        assert_eq!(lines.read(), 1);
        assert_eq!(lines.last_match.as_deref(), Some("iter 2: loss 2"));
        assert_eq!(lines.read(), 0);
        // Truncated and written again: read from the start.
        std::fs::write(&log, "iter 3\n").unwrap();
        assert_eq!(lines.read(), 1);
        // A progress bar: each update redrawn with a carriage return, the
        // file's line ended only at the epoch's end.
        let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        write!(f, "\riter 4: 1%\riter 5: 2%\rit").unwrap();
        assert_eq!(lines.read(), 2);
        assert_eq!(lines.last_match.as_deref(), Some("iter 5: 2%"));
        write!(f, "er 6: 3%\r\n").unwrap();
        assert_eq!(lines.read(), 1);
        assert_eq!(lines.last_match.as_deref(), Some("iter 6: 3%"));
    }

    #[test]
    fn records_seen_together_share_the_interval() {
        let mut p = Progress::new(Path::new("/nonexistent"), None);
        let t0 = Instant::now();
        p.seen(1, t0);
        assert!(
            p.intervals().is_empty(),
            "no interval before a second record"
        );
        p.seen(4, t0 + Duration::from_secs(8));
        assert_eq!(p.intervals(), vec![2.0; 4]);
        assert_eq!(p.records, 5);
    }
}
