//! Progress for long jobs: a live bar on a terminal, a line every few seconds
//! in a log file (SLURM's output is not a terminal).

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

pub struct Progress {
    bar: Option<ProgressBar>,
    what: String,
    total: u64,
    done: u64,
    started: Instant,
    last_line: Instant,
    every: Duration,
}

impl Progress {
    /// `what` names the task; `total` counts items (documents, steps).
    pub fn new(what: &str, total: u64, enabled: bool) -> Progress {
        let bar = (enabled && std::io::stderr().is_terminal()).then(|| {
            let b = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            b.set_style(
                ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg} (ETA {eta})")
                    .expect("a valid template")
                    .progress_chars("=> "),
            );
            b.set_prefix(what.to_string());
            b
        });
        Progress {
            bar,
            what: what.to_string(),
            total,
            done: 0,
            started: Instant::now(),
            last_line: Instant::now(),
            every: if enabled {
                Duration::from_secs(10)
            } else {
                Duration::MAX
            },
        }
    }

    /// Adds `n` items; `msg` describes the rates so far.
    pub fn advance(&mut self, n: u64, msg: impl FnOnce(f64) -> String) {
        self.done += n;
        let secs = self.started.elapsed().as_secs_f64().max(1e-9);
        match &self.bar {
            Some(b) => {
                b.set_message(msg(secs));
                b.inc(n);
            }
            None if self.last_line.elapsed() >= self.every => {
                self.last_line = Instant::now();
                let pct = 100.0 * self.done as f64 / self.total.max(1) as f64;
                let eta =
                    secs / self.done.max(1) as f64 * (self.total.saturating_sub(self.done)) as f64;
                eprintln!(
                    "{}: {}/{} ({pct:.0}%) {} ETA {eta:.0} s",
                    self.what,
                    self.done,
                    self.total,
                    msg(secs)
                );
            }
            None => {}
        }
    }

    pub fn finish(self) {
        if let Some(b) = self.bar {
            b.finish_and_clear();
        }
    }
}
