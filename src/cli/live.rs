//! The live view of a running sweep: how many runs are pending, running,
//! done and failed, and the latest step, loss and throughput of each running
//! run. Redrawn in place on a terminal; a line every 15 s in a log.

use crate::executor::State;
use crate::report::ingest::jsonl::last_point;
use crate::report::ingest::pattern::{self, Pattern};
use crate::report::ingest::Point;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub struct Tracked {
    pub name: String,
    pub dir: PathBuf,
    /// Training steps, when the run uses the built-in trainer.
    pub steps: Option<usize>,
    /// How a command's log says its progress (`[report] line_pattern`):
    /// read from its log, where the trainer's is read from `metrics.jsonl`.
    pub pattern: Option<std::sync::Arc<Pattern>>,
    /// Tokens a step of a command run trains (`[report] tokens_per_step`):
    /// its tokens/s from a logged step time, as the report computes them.
    pub tokens_per_step: Option<f64>,
}

impl Tracked {
    /// Its latest point, and whether the point's step is the run's own.
    fn latest(&self) -> Option<(Point, bool)> {
        match &self.pattern {
            Some(p) => pattern::last_point(p, &self.dir).map(|mut x| {
                if let Some(tokens) = self.tokens_per_step {
                    crate::report::flops::tokens_from_step_time(&mut x, tokens);
                }
                (x, p.has_step())
            }),
            None => last_point(&self.dir.join(crate::train::run::record::METRICS_FILE))
                .map(|x| (x, true)),
        }
    }
}

pub struct LiveView {
    runs: Vec<Tracked>,
    started: Instant,
    last_line: Instant,
    multi: Option<MultiProgress>,
    header: Option<ProgressBar>,
    bars: HashMap<usize, ProgressBar>,
    /// Why the pending runs wait, as the scheduler says (`Priority ×3`).
    waiting: String,
}

impl LiveView {
    pub fn new(runs: Vec<Tracked>) -> LiveView {
        let multi = std::io::stderr()
            .is_terminal()
            .then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr()));
        let header = multi.as_ref().map(|m| {
            let h = m.add(ProgressBar::new_spinner());
            h.set_style(ProgressStyle::with_template("{spinner} {msg}").expect("a valid template"));
            h.enable_steady_tick(Duration::from_millis(200));
            h
        });
        LiveView {
            runs,
            started: Instant::now(),
            last_line: Instant::now() - Duration::from_secs(60),
            multi,
            header,
            bars: HashMap::new(),
            waiting: String::new(),
        }
    }

    /// `states[i]` is the state of run i (same order as given to `new`).
    pub fn update(&mut self, states: &[State]) {
        let count = |f: &dyn Fn(State) -> bool| states.iter().filter(|s| f(**s)).count();
        let waiting = match self.waiting.is_empty() {
            true => String::new(),
            false => format!(" ({})", self.waiting),
        };
        let summary = format!(
            "{} pending{waiting}, {} running, {} done, {} failed or cancelled ({:.0} s)",
            // Interrupted runs are due again, like those never submitted.
            count(&|s| s == State::Pending || s.is_due()),
            count(&|s| s == State::Running),
            count(&|s| s == State::Completed),
            count(&|s| s.is_failed()),
            self.started.elapsed().as_secs_f64()
        );
        let mut lines = Vec::new();
        for (i, (run, state)) in self.runs.iter().zip(states).enumerate() {
            let latest = (*state == State::Running).then(|| run.latest()).flatten();
            let point = latest.as_ref().map(|(p, _)| p);
            let progress = match latest.as_ref() {
                Some((p, stepped)) => format!(
                    "{}loss {} | {} tokens/s",
                    match stepped {
                        true => format!(
                            "step {}{} | ",
                            p.step,
                            run.steps.map(|s| format!("/{s}")).unwrap_or_default()
                        ),
                        false => String::new(),
                    },
                    p.loss
                        .map(|l| format!("{l:.4}"))
                        .unwrap_or_else(|| "-".into()),
                    p.tokens_per_second
                        .map(|t| format!("{t:.0}"))
                        .unwrap_or_else(|| "-".into())
                ),
                None => "starting".into(),
            };
            match (&self.multi, *state == State::Running) {
                (Some(m), true) => {
                    let bar = self.bars.entry(i).or_insert_with(|| {
                        let b = m.add(ProgressBar::new(run.steps.unwrap_or(0) as u64));
                        b.set_style(
                            ProgressStyle::with_template("  {prefix:32} [{bar:20}] {msg}")
                                .expect("a valid template")
                                .progress_chars("=> "),
                        );
                        b.set_prefix(run.name.clone());
                        b
                    });
                    bar.set_position(point.map_or(0, |p| p.step as u64));
                    bar.set_message(progress);
                }
                (Some(_), false) => {
                    if let Some(b) = self.bars.remove(&i) {
                        b.finish_and_clear();
                    }
                }
                (None, true) => lines.push(format!("  {}: {progress}", run.name)),
                (None, false) => {}
            }
        }
        match &self.header {
            Some(h) => h.set_message(summary),
            None if self.last_line.elapsed() >= Duration::from_secs(15) => {
                self.last_line = Instant::now();
                eprintln!("sweep: {summary}");
                for l in lines {
                    eprintln!("{l}");
                }
            }
            None => {}
        }
    }

    /// A message above the live view (or a plain line in a log).
    pub fn log(&self, msg: &str) {
        // What it says may quote a job's log or a host's name.
        let msg = crate::util::text::printable(msg);
        match &self.multi {
            Some(m) => {
                let _ = m.println(&*msg);
            }
            None => eprintln!("{msg}"),
        }
    }

    pub fn finish(&mut self) {
        for b in self.bars.values() {
            b.finish_and_clear();
        }
        if let Some(h) = &self.header {
            h.finish_and_clear();
        }
    }
}

impl crate::study::watch::Follow for LiveView {
    fn done(&mut self) {
        self.finish();
    }

    fn states(&mut self, states: &[State]) {
        self.update(states);
    }

    fn line(&mut self, line: &str) {
        self.log(line);
    }

    fn waiting(&mut self, why: &str) {
        self.waiting = crate::util::text::note(why).into_owned();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command that logs a step's time (nanoGPT's `time 8.00ms`) shows
    /// tokens/s in the live view as in its report.
    #[test]
    fn a_commands_tokens_per_second_come_from_its_step_time() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join("job-1.out"),
            "iter 3: loss 4.5, time 8.00ms\n",
        )
        .unwrap();
        let roles = crate::manifest::Roles {
            step_time: Some("time_ms".into()),
            ..Default::default()
        };
        let re = r"iter (?P<step>\d+): loss (?P<loss>[\d.]+), time (?P<time_ms>[\d.]+)ms";
        let run = Tracked {
            name: "run".into(),
            dir: d.path().to_path_buf(),
            steps: None,
            pattern: Some(std::sync::Arc::new(Pattern::new(re, &roles).unwrap())),
            tokens_per_step: Some(256.0),
        };
        let (p, stepped) = run.latest().unwrap();
        assert_eq!(
            (p.step, p.tokens_per_second, stepped),
            (3.0, Some(32_000.0), true)
        );
    }
}
