//! `sweep run`: submit what is due, follow the sweep live until nothing is
//! pending or running, then write the report.

use super::live::{LiveView, Tracked};
use super::sweep_cmds::{self, Submission};
use super::SubmitArgs;
use crate::executor::{self, local, Event, State, UnitKind};
use crate::plan::Job;
use crate::report::{self, Source};
use crate::util::signals::{self, StopSignals};
use anyhow::Result;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

pub fn run(root: &Path, args: &SubmitArgs) -> Result<ExitCode> {
    if args.dry_run {
        return sweep_cmds::submit(root, args);
    }
    let mut sub = Submission::new(root, args, "run")?;
    let attempt = current_attempt(&sub)?;
    let mut view = LiveView::new(tracked(&sub));
    let mut page = LivePage::new(root, &args.manifest);
    let stopped = watch(&mut sub, &mut view, &mut page)?;
    view.finish();
    if let Some(stop) = stopped {
        page.settle();
        eprintln!("{}", stop.note(&args.manifest));
        return Ok(ExitCode::from(130));
    }
    // The report is written under the study's lock, and of the attempt this
    // run followed: a `sweep run --again` that began the next one while the
    // lock was free (SLURM jobs, once they had all ended) has recorded and
    // kept this one.
    if sub.lock.is_none() {
        sub.lock = Some(sweep_cmds::lock_study(&sub.plan, "run", &args.manifest)?);
    }
    let now = current_attempt(&sub)?;
    if now != attempt {
        eprintln!(
            "sweep: another sweep began attempt {} of the study (`sweep run --again`) once this \
             one's runs had ended: the attempt followed here was recorded in the history and kept \
             in {}; `sweep history {m}` shows it, and `sweep run {m}` follows the new one",
            now.0,
            sub.plan
                .study_dir
                .join(crate::layout::ATTEMPTS_DIR)
                .join(attempt.0.to_string())
                .display(),
            m = args.manifest.display()
        );
        return Ok(ExitCode::FAILURE);
    }
    let recorded = print_report(root, &args.manifest)?;
    let all_done = executor::statuses(&sub.units)?
        .iter()
        .zip(&sub.units)
        .all(|(s, u)| u.kind == UnitKind::Stage || s.state == State::Completed);
    Ok(if all_done && recorded == ExitCode::SUCCESS {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The study's attempt (count and id) as its `study.json` says now.
fn current_attempt(sub: &Submission) -> Result<(u32, Option<String>)> {
    let record = crate::plan::record::StudyRecord::load(&sub.plan.study_dir)?;
    Ok(record.map_or((1, None), |r| (r.attempt, r.attempt_id)))
}

/// Why watching ended before the sweep did.
enum Stopped {
    /// A stop signal ended the local jobs (INTERRUPTED now).
    LocalJobs(i32, Vec<crate::executor::local::Outcome>),
    /// A stop signal ended the watching; the jobs go on without it.
    Watching(i32),
}

impl Stopped {
    /// What happened, and what to type to go on.
    fn note(&self, manifest: &Path) -> String {
        match self {
            Stopped::LocalJobs(sig, outcomes) => {
                sweep_cmds::interrupted_note(*sig, outcomes, "run", manifest)
            }
            Stopped::Watching(sig) => format!(
                "sweep: {} stopped the watching; the jobs go on (`sweep status {m}`, `sweep cancel {m}`), and `sweep run {m}` again follows them until they end, then reports",
                crate::util::signals::name(*sig),
                m = manifest.display()
            ),
        }
    }
}

/// Every unit as the live view follows it (training runs with their step count).
fn tracked(sub: &Submission) -> Vec<Tracked> {
    let steps: HashMap<&Path, usize> = sub
        .plan
        .runs
        .iter()
        .filter_map(|r| match &r.job {
            Job::Train(c) => Some((r.dir.as_path(), c.training_steps)),
            _ => None,
        })
        .collect();
    sub.units
        .iter()
        .map(|u| Tracked {
            name: u.name.clone(),
            dir: u.dir.clone(),
            steps: steps.get(u.dir.as_path()).copied(),
        })
        .collect()
}

/// Submits the due units, then follows everything pending or running — what
/// this submitted, and jobs an earlier `sweep` left going — until nothing
/// is. Returns why it stopped early, if it did.
fn watch(
    sub: &mut Submission,
    view: &mut LiveView,
    page: &mut LivePage,
) -> Result<Option<Stopped>> {
    if sub.todo() > 0 {
        let done = submit(sub, view, page)?;
        if let Some(sig) = done.interrupted {
            return Ok(Some(Stopped::LocalJobs(sig, done.outcomes)));
        }
    }
    // Submitting SLURM jobs is over: another sweep may submit this study
    // while their jobs run (for hours). Local runs have ended here: the
    // lock is kept until the report is written.
    if sub.kind == crate::manifest::ExecutorKind::Slurm {
        sub.lock = None;
    }
    poll(sub, view, page)
}

/// Submits (SLURM) or runs (local) the due units, following them in the view.
fn submit(
    sub: &mut Submission,
    view: &mut LiveView,
    page: &mut LivePage,
) -> Result<executor::Submitted> {
    let dirs: Vec<PathBuf> = sub.units.iter().map(|u| u.dir.clone()).collect();
    let before: Vec<State> = sub.status.iter().map(|s| s.state).collect();
    let submitted: Vec<bool> = sub
        .decisions
        .iter()
        .map(|d| *d == executor::Decision::Submit)
        .collect();
    // Units left alone keep the state they had; the others are read back
    // from their directories (many times a second: no process checks).
    let current = |i: usize| {
        if submitted[i] {
            local::peek_state(&dirs[i]).unwrap_or(State::Pending)
        } else {
            before[i]
        }
    };
    sub.executor.submit(
        &sub.plan.study_dir,
        &mut sub.units,
        &sub.decisions,
        false,
        &mut |e| match e {
            Event::Submitted(job) => view.log(&format!(
                "submitted job {} ({} units)",
                job.job_id,
                job.units.len()
            )),
            Event::Ended(o) => {
                view.log(&format!(
                    "{:<9} {} ({:.1} s)",
                    o.status.describe(),
                    o.name,
                    o.seconds
                ));
                if let Some(line) = &o.last_log_line {
                    view.log(&format!("          {line}"));
                }
                page.changed();
            }
            Event::Tick => {
                view.update(&(0..dirs.len()).map(current).collect::<Vec<_>>());
                page.tick();
            }
            Event::Started(_) | Event::WouldRun { .. } => {}
        },
    )
}

/// Polls the whole sweep (one scheduler query per round) until nothing is
/// pending or running. Returns the signal that stopped the watching, if one did.
fn poll(sub: &Submission, view: &mut LiveView, page: &mut LivePage) -> Result<Option<Stopped>> {
    let stop = StopSignals::install_interactive(&signals::INTERRUPTS)?;
    let mut before: Vec<State> = Vec::new();
    loop {
        let states: Vec<State> = executor::statuses(&sub.units)?
            .iter()
            .map(|s| s.state)
            .collect();
        view.update(&states);
        if states != before {
            page.changed();
            before = states.clone();
        } else {
            page.tick();
        }
        if states.iter().all(|s| !s.is_active()) {
            return Ok(None);
        }
        // Checked often, waited on rarely: a signal is answered at once.
        for _ in 0..20 {
            if let Some(sig) = stop.received() {
                if sig == signals::SIGHUP {
                    signals::detach_from_terminal();
                }
                return Ok(Some(Stopped::Watching(sig)));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The sweep's report with its plots, and where it went; fails when its
/// runs could not be recorded in the history.
fn print_report(root: &Path, manifest: &Path) -> Result<ExitCode> {
    let rep = report::run(
        root,
        &Source::Manifest(manifest.to_path_buf()),
        &options(false),
    )?;
    println!("{}", report::export::markdown_table(&rep.summary));
    for p in &rep.summary.problems {
        println!("note: {}", p.describe());
    }
    for h in &rep.summary.hints {
        println!("hint: {h}");
    }
    let files: Vec<String> = rep
        .files
        .iter()
        .filter(|p| **p != rep.page)
        .map(|p| p.display().to_string())
        .collect();
    println!("tables: {}", files.join(", "));
    if let Some(dir) = rep.charts.first().and_then(|c| c.files[0].parent()) {
        println!("charts: {} (PNG and SVG)", dir.display());
    }
    println!("the report, one page: {}", rep.page.display());
    Ok(super::history_note(&rep))
}

fn options(live: bool) -> report::Options {
    report::Options {
        skip_first: None,
        baseline: None,
        group_by: vec![],
        out: None,
        plots: true,
        live,
    }
}

/// `report.html` rewritten as runs end while the sweep is watched (it
/// reloads itself meanwhile), at most every few seconds. A report that
/// cannot be written yet (no run has metrics) is no reason to stop watching.
struct LivePage {
    root: PathBuf,
    manifest: PathBuf,
    last: Option<Instant>,
    pending: bool,
}

impl LivePage {
    const EVERY: Duration = Duration::from_secs(5);

    fn new(root: &Path, manifest: &Path) -> LivePage {
        LivePage {
            root: root.to_path_buf(),
            manifest: manifest.to_path_buf(),
            last: None,
            pending: false,
        }
    }

    /// A run ended: the page is due.
    fn changed(&mut self) {
        self.pending = true;
        self.tick();
    }

    /// Writes the page when it is due and the last one is old enough.
    fn tick(&mut self) {
        if !self.pending || self.last.is_some_and(|t| t.elapsed() < Self::EVERY) {
            return;
        }
        let source = Source::Manifest(self.manifest.clone());
        // Errors are for the final report to show.
        let _ = report::run(&self.root, &source, &options(true));
        (self.last, self.pending) = (Some(Instant::now()), false);
    }

    /// Watching stopped before the sweep ended: a page written live stops
    /// reloading (it is a snapshot now; `sweep report` renders it again).
    fn settle(&mut self) {
        if self.last.is_some() {
            let source = Source::Manifest(self.manifest.clone());
            let _ = report::run(&self.root, &source, &options(false));
        }
    }
}
