//! `sweep run`: submit what is due, follow the sweep live until nothing is
//! pending or running, then write the report.

use super::live::{LiveView, Tracked};
use super::sweep_cmds::{self, Submission};
use super::SubmitArgs;
use crate::executor::{self, local, Event, State, UnitKind};
use crate::plan::Job;
use crate::report::{self, Source};
use anyhow::Result;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub fn run(root: &Path, args: &SubmitArgs) -> Result<ExitCode> {
    if args.dry_run {
        return sweep_cmds::submit(root, args);
    }
    let mut sub = Submission::new(root, args)?;
    let mut view = LiveView::new(tracked(&sub));
    let mut page = LivePage::new(root, &args.manifest);
    let interrupted = sub.todo() > 0 && watch(&mut sub, &mut view, &mut page)?;
    view.finish();
    if interrupted {
        page.settle();
        eprintln!("stopped watching; the jobs go on (`sweep status`, `sweep cancel`), and `sweep run` again picks up where they are");
        return Ok(ExitCode::from(130));
    }
    print_report(root, &args.manifest)?;
    let all_done = executor::statuses(&sub.units)?
        .iter()
        .zip(&sub.units)
        .all(|(s, u)| u.kind == UnitKind::Stage || s.state == State::Completed);
    Ok(if all_done {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
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

/// Submits the due units and follows them in the view until nothing is
/// pending or running. Returns whether Ctrl-C stopped it (local jobs are
/// stopped; scheduled jobs go on).
fn watch(sub: &mut Submission, view: &mut LiveView, page: &mut LivePage) -> Result<bool> {
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
    let done = sub.executor.submit(
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
    )?;
    if done.finished {
        return Ok(done.interrupted);
    }
    poll(sub, view, page)
}

/// Polls the whole sweep (one scheduler query per round) until nothing is
/// pending or running. Returns whether Ctrl-C stopped the watching.
fn poll(sub: &Submission, view: &mut LiveView, page: &mut LivePage) -> Result<bool> {
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&stop))?;
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
            return Ok(false);
        }
        if stop.load(Ordering::SeqCst) {
            return Ok(true);
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// The sweep's report with its plots, and where it went.
fn print_report(root: &Path, manifest: &Path) -> Result<()> {
    let rep = report::run(
        root,
        &Source::Manifest(manifest.to_path_buf()),
        &options(false),
    )?;
    println!("{}", report::export::markdown_table(&rep.summary));
    for p in &rep.summary.problems {
        println!("note: {}", p.describe());
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
    Ok(())
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
