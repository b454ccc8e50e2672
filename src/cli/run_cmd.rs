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
use std::time::Duration;

pub fn run(root: &Path, args: &SubmitArgs) -> Result<ExitCode> {
    if args.dry_run {
        return sweep_cmds::submit(root, args);
    }
    let mut sub = Submission::new(root, args)?;
    let mut view = LiveView::new(tracked(&sub));
    let interrupted = sub.todo() > 0 && watch(&mut sub, &mut view)?;
    view.finish();
    if interrupted {
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
fn watch(sub: &mut Submission, view: &mut LiveView) -> Result<bool> {
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
            }
            Event::Tick => view.update(&(0..dirs.len()).map(current).collect::<Vec<_>>()),
            Event::Started(_) | Event::WouldRun { .. } => {}
        },
    )?;
    if done.finished {
        return Ok(done.interrupted);
    }
    poll(sub, view)
}

/// Polls the whole sweep (one scheduler query per round) until nothing is
/// pending or running. Returns whether Ctrl-C stopped the watching.
fn poll(sub: &Submission, view: &mut LiveView) -> Result<bool> {
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&stop))?;
    loop {
        let states: Vec<State> = executor::statuses(&sub.units)?
            .iter()
            .map(|s| s.state)
            .collect();
        view.update(&states);
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
        &report::Options {
            skip_first: None,
            baseline: None,
            group_by: vec![],
            out: None,
            plots: true,
        },
    )?;
    println!("{}", report::export::markdown_table(&rep.summary));
    for p in &rep.summary.problems {
        println!("note: {}", p.describe());
    }
    let files: Vec<String> = rep.files.iter().map(|p| p.display().to_string()).collect();
    println!("tables: {}", files.join(", "));
    if let Some(dir) = rep.charts.first().and_then(|c| c.parent()) {
        println!("charts: {} (PNG and SVG)", dir.display());
    }
    Ok(())
}
