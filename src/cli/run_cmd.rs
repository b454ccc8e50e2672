//! `sweep run`: submit what is due, follow the sweep live until nothing is
//! pending or running, then write the report.

use super::live::{LiveView, Tracked};
use super::sweep_cmds;
use super::SubmitArgs;
use crate::config::RuntimeOptions;
use crate::plan::Job;
use crate::report;
use crate::study::watch::{self, Ran};
use crate::study::Submission;
use crate::util::stdout::outln;
use anyhow::Result;
use std::collections::HashMap;
use std::path::Path;
use std::process::ExitCode;

pub fn run(root: &Path, args: &SubmitArgs, rt: &RuntimeOptions) -> Result<ExitCode> {
    if args.dry_run {
        return sweep_cmds::submit(root, args, rt);
    }
    let mut sub = sweep_cmds::submission(root, args, rt, "run")?;
    let mut view = LiveView::new(tracked(&sub));
    match watch::run(
        root,
        &mut sub,
        &mut view,
        &args.manifest,
        &mut sweep_cmds::say,
    )? {
        Ran::Stopped(stop) => {
            eprintln!("{}", stop.note(&args.manifest));
            Ok(ExitCode::from(130))
        }
        Ran::Superseded { followed, now } => {
            eprintln!(
                "sweep: another sweep began attempt {now} of the study (`sweep run --again`) once this \
                 one's runs had ended: the attempt followed here was recorded in the history and kept \
                 in {}; `sweep history {m}` shows it, and `sweep run {m}` follows the new one",
                sub.plan
                    .study_dir
                    .join(crate::layout::ATTEMPTS_DIR)
                    .join(followed.to_string())
                    .display(),
                m = args.manifest.display()
            );
            Ok(ExitCode::FAILURE)
        }
        Ran::Reported { report, all_done } => {
            let recorded = print_report(&report)?;
            Ok(match all_done && recorded == ExitCode::SUCCESS {
                true => ExitCode::SUCCESS,
                false => ExitCode::FAILURE,
            })
        }
    }
}

/// Every unit as the live view follows it (training runs with their step
/// count, command runs with the pattern their log is read by).
fn tracked(sub: &Submission) -> Vec<Tracked> {
    let runs: HashMap<&Path, &crate::plan::Run> =
        sub.plan.runs.iter().map(|r| (r.dir.as_path(), r)).collect();
    let pattern = report::progress_pattern(&sub.plan).map(std::sync::Arc::new);
    sub.units
        .iter()
        .map(|u| {
            let run = runs.get(u.dir.as_path());
            let job = run.map(|r| &r.job);
            Tracked {
                name: u.name.clone(),
                dir: u.dir.clone(),
                steps: match job {
                    Some(Job::Train(c)) => Some(c.training_steps),
                    _ => None,
                },
                pattern: pattern
                    .clone()
                    .filter(|_| matches!(job, Some(Job::Command(_)))),
                tokens_per_step: run.and_then(|r| report::flops::tokens_per_step(&r.params)),
            }
        })
        .collect()
}

/// The sweep's report and where it went; fails when its runs could not be
/// recorded in the history.
fn print_report(rep: &report::Report) -> Result<ExitCode> {
    outln!("{}", report::export::markdown_table(&rep.summary));
    for p in &rep.summary.problems {
        outln!("note: {}", p.describe());
    }
    for h in &rep.summary.hints {
        outln!("hint: {h}");
    }
    let files: Vec<String> = rep
        .files
        .iter()
        .filter(|p| **p != rep.page)
        .map(|p| p.display().to_string())
        .collect();
    outln!("tables: {}", files.join(", "));
    if let Some(dir) = rep.charts.first().and_then(|c| c.files[0].parent()) {
        outln!("charts: {} (PNG and SVG)", dir.display());
    }
    outln!("the report, one page: {}", rep.page.display());
    Ok(super::report_cmds::history_note(rep))
}
