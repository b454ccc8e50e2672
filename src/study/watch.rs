//! `sweep run` ([`run`]): follows a study's jobs until nothing is pending or running (submitting
//! what is due, polling, rewriting the live page), then reports it.

use super::Submission;
use crate::executor::{self, local, Event, State, UnitKind};
use crate::report::{self, Source};
use crate::util::signals::{self, StopSignals};
use anyhow::Result;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What follows a sweep as it goes.
pub trait Follow {
    /// Every unit's state, in the submission's order.
    fn states(&mut self, states: &[State]);
    /// A line about a job (submitted, ended).
    fn line(&mut self, line: &str);
    /// Why the pending runs wait (`Priority ×3, JobHeldAdmin`), or nothing.
    fn waiting(&mut self, _why: &str) {}
    /// Watching ended: what comes next is said plainly.
    fn done(&mut self) {}
}

/// The study's attempt (count and id) as its `study.json` says now.
fn current_attempt(sub: &Submission) -> Result<(u32, Option<String>)> {
    let record = crate::plan::record::StudyRecord::load(&sub.plan.study_dir)?;
    Ok(record.map_or((1, None), |r| (r.attempt, r.attempt_id)))
}

/// How `sweep run` ended.
pub enum Ran {
    /// A stop signal ended it before the sweep did.
    Stopped(Stopped),
    /// Another sweep began attempt `now` once `followed` had ended: recorded, not reported here.
    Superseded { followed: u32, now: u32 },
    /// Every run ended and the study was reported; `all_done`: every run completed.
    Reported {
        report: Box<report::Report>,
        all_done: bool,
    },
}

/// `sweep run`: submits what is due, follows it until nothing is pending or running, reports.
pub fn run(
    root: &Path,
    sub: &mut Submission,
    view: &mut dyn Follow,
    manifest: &Path,
    say: super::Say,
) -> Result<Ran> {
    let attempt = current_attempt(sub)?;
    let mut page = LivePage::new(root, &sub.plan);
    let stopped = watch(sub, view, &mut page);
    view.done();
    if let Some(stop) = stopped? {
        page.settle();
        return Ok(Ran::Stopped(stop));
    }
    if let Some(now) = hold_for_report(sub, &attempt, manifest, say)? {
        return Ok(Ran::Superseded {
            followed: attempt.0,
            now,
        });
    }
    let source = report::Source::Plan(Box::new(sub.plan.clone()));
    let report = report::run(root, &source, &report_options(false))?;
    Ok(Ran::Reported {
        report: Box::new(report),
        all_done: all_done(sub)?,
    })
}

/// Why watching ended before the sweep did.
pub enum Stopped {
    /// A stop signal ended the local jobs (INTERRUPTED now).
    LocalJobs(i32, Vec<crate::executor::local::Outcome>),
    /// A stop signal ended the watching (the jobs go on), with the runs SLURM held back.
    Watching(i32, usize),
}

impl Stopped {
    /// What happened, and what to type to go on.
    pub fn note(&self, manifest: &Path) -> String {
        match self {
            Stopped::LocalJobs(sig, outcomes) => {
                super::interrupted_note(*sig, outcomes, "run", manifest)
            }
            Stopped::Watching(sig, 0) => format!(
                "sweep: {} stopped the watching; the jobs go on (`sweep status {m}`, `sweep cancel {m}`), and `sweep run {m}` again follows them until they end, then reports",
                crate::util::signals::name(*sig),
                m = manifest.display()
            ),
            Stopped::Watching(sig, held) => format!(
                "sweep: {} stopped the watching; the jobs go on (`sweep status {m}`, `sweep cancel {m}`), and {held} run(s) SLURM held back are not submitted: `sweep run {m}` again submits them as jobs end, follows them, then reports",
                crate::util::signals::name(*sig),
                m = manifest.display()
            ),
        }
    }
}

/// Submits the due units, then follows everything pending or running until nothing is;
/// why it stopped early, if it did.
fn watch(
    sub: &mut Submission,
    view: &mut dyn Follow,
    page: &mut LivePage,
) -> Result<Option<Stopped>> {
    let began = std::time::SystemTime::now();
    let mut held = None;
    if sub.todo() > 0 {
        let done = submit(sub, view, page)?;
        if let Some(sig) = done.interrupted {
            return Ok(Some(Stopped::LocalJobs(sig, done.outcomes)));
        }
        held = done.held.map(|h| {
            view.line(&held_line(&h));
            Waiting::new(h, began)
        });
    }
    // SLURM jobs submitted: another sweep may submit this study while they run. Local runs have
    // ended here (the lock is kept until the report); runs SLURM holds back are still to submit.
    if sub.kind == crate::manifest::ExecutorKind::Slurm && held.is_none() {
        sub.lock = None;
    }
    poll(sub, view, page, held)
}

/// What is said of runs SLURM held back.
fn held_line(held: &executor::Held) -> String {
    format!(
        "sweep: SLURM takes no more of your jobs for now ({}): {} run(s) wait, and go out as jobs end",
        held.reason,
        held.units.len()
    )
}

/// Runs SLURM held back, offered again once one of the study's jobs ended, else every few minutes.
struct Waiting {
    held: executor::Held,
    offered: Instant,
    /// The study's units that had ended at the first look after the offer.
    ended: Option<usize>,
    /// When this sweep began submitting.
    began: std::time::SystemTime,
}

impl Waiting {
    const AGAIN: Duration = Duration::from_secs(300);

    fn new(held: executor::Held, began: std::time::SystemTime) -> Waiting {
        Waiting {
            held,
            offered: Instant::now(),
            ended: None,
            began,
        }
    }

    /// Whether to offer the runs again, `ended` units having ended now.
    fn due(&mut self, ended: usize) -> bool {
        ended > *self.ended.get_or_insert(ended) || self.offered.elapsed() >= Self::AGAIN
    }

    /// Whether `sweep cancel` cancelled the study's jobs since this sweep began: held runs are dropped.
    fn cancelled(&self, units: &[executor::Unit]) -> bool {
        units
            .iter()
            .any(|u| executor::ended::cancelled_since(&u.dir, self.began))
    }
}

/// Says why the pending runs wait, and names (once) each job held.
fn say_waiting(
    view: &mut dyn Follow,
    statuses: &[executor::Status],
    said: &mut std::collections::HashSet<String>,
) {
    view.waiting(&waiting_for(statuses));
    for (job, why) in held_jobs(statuses) {
        if said.insert(job.clone()) {
            view.line(&format!(
                "sweep: job {job} is held ({why}): it starts only once released (`scontrol release {job}`, or by an administrator)"
            ));
        }
    }
}

/// The runs SLURM `held` back: dropped if the study was cancelled, offered again once due;
/// whether they were offered.
fn offered_held(
    sub: &mut Submission,
    held: &mut Option<Waiting>,
    statuses: &[executor::Status],
    view: &mut dyn Follow,
) -> Result<bool> {
    if let Some(w) = held.take_if(|w| w.cancelled(&sub.units)) {
        view.line(&format!(
            "sweep: `sweep cancel` cancelled the study's jobs: the {} run(s) SLURM held back are not submitted",
            w.held.units.len()
        ));
        sub.lock = None;
    }
    let ended = statuses
        .iter()
        .filter(|s| !s.state.is_active() && !s.state.is_due())
        .count();
    let Some(w) = held.take_if(|w| w.due(ended)) else {
        return Ok(false);
    };
    *held = offer_held(sub, &w.held, statuses, view)?.map(|h| Waiting::new(h, w.began));
    match held {
        None => {
            view.line("sweep: every run is submitted");
            sub.lock = None;
        }
        Some(now) if now.held.units.len() != w.held.units.len() => view.line(&held_line(&now.held)),
        Some(_) => {}
    }
    Ok(true)
}

/// Offers SLURM the runs it held back (a run whose stage failed is left out, and said).
fn offer_held(
    sub: &mut Submission,
    held: &executor::Held,
    statuses: &[executor::Status],
    view: &mut dyn Follow,
) -> Result<Option<executor::Held>> {
    let decisions = executor::decide_held(&sub.units, statuses, held);
    for (u, d) in sub.units.iter().zip(&decisions) {
        if *d == executor::Decision::Blocked {
            view.line(&format!("skip {} (its stage failed)", u.name));
        }
    }
    let done = sub.executor.submit(
        &sub.plan.study_dir,
        &mut sub.units,
        &decisions,
        false,
        &mut |e| {
            if let Event::Submitted(job) = e {
                view.line(&submitted_line(job));
            }
        },
    )?;
    Ok(done.held)
}

fn submitted_line(job: &executor::slurm::Sbatch) -> String {
    format!("submitted job {} ({} units)", job.job_id, job.units.len())
}

/// Submits (SLURM) or runs (local) the due units, following them in the view.
fn submit(
    sub: &mut Submission,
    view: &mut dyn Follow,
    page: &mut LivePage,
) -> Result<executor::Submitted> {
    let dirs: Vec<PathBuf> = sub.units.iter().map(|u| u.dir.clone()).collect();
    let before: Vec<State> = sub.status.iter().map(|s| s.state).collect();
    let submitted: Vec<bool> = sub
        .decisions
        .iter()
        .map(|d| *d == executor::Decision::Submit)
        .collect();
    // Units left alone keep their state; the others are read back from their directories.
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
            Event::Submitted(job) => view.line(&submitted_line(job)),
            Event::Ended(o) => {
                view.line(&format!(
                    "{:<9} {} ({:.1} s)",
                    o.status.describe(),
                    o.name,
                    o.seconds
                ));
                if let Some(line) = &o.last_log_line {
                    view.line(&format!("          {line}"));
                }
                page.changed();
            }
            Event::Tick => {
                view.states(&(0..dirs.len()).map(current).collect::<Vec<_>>());
                page.tick();
            }
            Event::Started(_) | Event::WouldRun { .. } => {}
        },
    )
}

/// Polls the sweep (one scheduler query a round) until nothing is pending or running; the
/// signal that stopped it, if one did.
fn poll(
    sub: &mut Submission,
    view: &mut dyn Follow,
    page: &mut LivePage,
    mut held: Option<Waiting>,
) -> Result<Option<Stopped>> {
    let stop = StopSignals::install_interactive(&signals::INTERRUPTS)?;
    // Checked often, waited on rarely: a signal is answered at once.
    let wait = |d: Duration| -> Option<i32> {
        let end = Instant::now() + d;
        while Instant::now() < end {
            if let Some(sig) = stop.received() {
                if sig == signals::SIGHUP {
                    signals::detach_from_terminal();
                }
                return Some(sig);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    };
    let mut before: Vec<State> = Vec::new();
    let mut failing: Option<(Instant, u32)> = None;
    let (began, mut asked) = (Instant::now(), None::<Instant>);
    let mut said_held = std::collections::HashSet::new();
    loop {
        // Between two scheduler queries the view is redrawn with the states known.
        if asked.is_some_and(|t| t.elapsed() < ask_every(sub.kind, began.elapsed())) {
            view.states(&before);
            page.tick();
            if let Some(sig) = wait(Duration::from_secs(2)) {
                return Ok(Some(Stopped::Watching(sig, waiting(&held))));
            }
            continue;
        }
        asked = Some(Instant::now());
        let statuses = match executor::statuses(&sub.units) {
            Ok(statuses) => statuses,
            Err(e) => {
                let (since, failures) = failing.get_or_insert((Instant::now(), 0));
                *failures += 1;
                let Some(again) = retry_after(*failures, since.elapsed()) else {
                    return Err(e.context(format!(
                        "the scheduler could not be asked for {} min ({failures} tries); the jobs go on: `sweep run` again follows them",
                        since.elapsed().as_secs() / 60
                    )));
                };
                asked = None;
                view.line(&format!(
                    "sweep: asking the scheduler failed ({}); asking again in {} s",
                    crate::util::text::note(&e.root_cause().to_string()),
                    again.as_secs()
                ));
                match wait(again) {
                    Some(sig) => return Ok(Some(Stopped::Watching(sig, waiting(&held)))),
                    None => continue,
                }
            }
        };
        if failing.take().is_some() {
            view.line("sweep: the scheduler answers again");
        }
        let states: Vec<State> = statuses.iter().map(|s| s.state).collect();
        say_waiting(view, &statuses, &mut said_held);
        view.states(&states);
        if states != before {
            page.changed();
            before = states.clone();
        } else {
            page.tick();
        }
        if offered_held(sub, &mut held, &statuses, view)? {
            // What went out is asked about at once.
            asked = None;
            continue;
        }
        if held.is_none() && states.iter().all(|s| !s.is_active()) {
            return Ok(None);
        }
        if let Some(sig) = wait(Duration::from_secs(2)) {
            return Ok(Some(Stopped::Watching(sig, waiting(&held))));
        }
    }
}

/// How often the scheduler is asked: local jobs every 2 s; SLURM every 5 s for two minutes
/// (a failing start shows at once), then every 30 s (`squeue` loads a shared controller).
fn ask_every(kind: crate::manifest::ExecutorKind, watched_for: Duration) -> Duration {
    match kind {
        crate::manifest::ExecutorKind::Local => Duration::from_secs(2),
        crate::manifest::ExecutorKind::Slurm if watched_for < Duration::from_secs(120) => {
            Duration::from_secs(5)
        }
        crate::manifest::ExecutorKind::Slurm => Duration::from_secs(30),
    }
}

/// Why the pending runs wait, most common first: `Priority ×3, Resources`.
fn waiting_for(statuses: &[executor::Status]) -> String {
    let mut reasons: Vec<(&str, usize)> = Vec::new();
    for s in statuses.iter().filter(|s| s.state == State::Pending) {
        let Some(why) = s.reason.as_deref() else {
            continue;
        };
        match reasons.iter_mut().find(|(r, _)| *r == why) {
            Some((_, n)) => *n += 1,
            None => reasons.push((why, 1)),
        }
    }
    reasons.sort_by_key(|r| std::cmp::Reverse(r.1));
    reasons
        .iter()
        .map(|(r, n)| match n {
            1 => r.to_string(),
            n => format!("{r} ×{n}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Pending jobs that never start by themselves (held), with the reason.
fn held_jobs(statuses: &[executor::Status]) -> Vec<(String, String)> {
    statuses
        .iter()
        .filter(|s| s.state == State::Pending)
        .filter_map(|s| {
            let why = s.reason.as_deref()?;
            let held = why.starts_with("JobHeld") || why.contains("requeued held");
            Some((s.job_id.clone()?, why.to_string())).filter(|_| held)
        })
        .collect()
}

/// The runs held back, not submitted yet.
fn waiting(held: &Option<Waiting>) -> usize {
    held.as_ref().map_or(0, |w| w.held.units.len())
}

/// The wait before asking the scheduler again after `failures` failed queries; `None` after
/// ten minutes of failing (a busy `slurmctld` times out now and then).
fn retry_after(failures: u32, failing_for: Duration) -> Option<Duration> {
    const GIVE_UP: Duration = Duration::from_secs(600);
    (failing_for < GIVE_UP).then(|| Duration::from_secs((2u64 << failures.min(5)).min(60)))
}

/// Takes the study's lock again for the report; the attempt a `--again` began meanwhile, if any.
fn hold_for_report(
    sub: &mut Submission,
    followed: &(u32, Option<String>),
    manifest: &Path,
    say: super::Say,
) -> Result<Option<u32>> {
    if sub.lock.is_none() {
        sub.lock = Some(super::lock_study(&sub.plan, "run", manifest, say)?);
    }
    let now = current_attempt(sub)?;
    Ok((now != *followed).then_some(now.0))
}

/// Whether every run of the study completed (stages aside).
fn all_done(sub: &Submission) -> Result<bool> {
    Ok(executor::statuses(&sub.units)?
        .iter()
        .zip(&sub.units)
        .all(|(s, u)| u.kind == UnitKind::Stage || s.state == State::Completed))
}

/// The report `sweep run` writes: the manifest's settings, with plots; `live` while runs go on.
pub fn report_options(live: bool) -> report::ReportOptions {
    report::ReportOptions {
        skip_first: None,
        baseline: None,
        group_by: vec![],
        out: None,
        plots: true,
        live,
    }
}

/// `report.html` rewritten as runs end, at most every few seconds; a report that cannot be
/// written yet is no reason to stop watching.
pub struct LivePage {
    root: PathBuf,
    /// The plan followed (the manifest may change on disk meanwhile).
    source: Source,
    last: Option<Instant>,
    pending: bool,
}

impl LivePage {
    const EVERY: Duration = Duration::from_secs(5);

    pub fn new(root: &Path, plan: &crate::plan::Plan) -> LivePage {
        LivePage {
            root: root.to_path_buf(),
            source: Source::Plan(Box::new(plan.clone())),
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
        // Errors are for the final report to show.
        let _ = report::run(&self.root, &self.source, &report_options(true));
        (self.last, self.pending) = (Some(Instant::now()), false);
    }

    /// Watching stopped early: the live page stops reloading (a snapshot now).
    pub fn settle(&mut self) {
        if self.last.is_some() {
            let _ = report::run(&self.root, &self.source, &report_options(false));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_scheduler_is_asked_less_often_then_given_up_on() {
        let waits: Vec<u64> = (1..=8)
            .map(|n| retry_after(n, Duration::from_secs(60)).unwrap().as_secs())
            .collect();
        assert_eq!(waits, [4, 8, 16, 32, 60, 60, 60, 60]);
        assert_eq!(
            retry_after(u32::MAX, Duration::ZERO),
            Some(Duration::from_secs(60))
        );
        assert!(retry_after(3, Duration::from_secs(599)).is_some());
        assert_eq!(retry_after(3, Duration::from_secs(600)), None);
    }

    #[test]
    fn pending_runs_say_why_they_wait_and_held_jobs_are_named() {
        let pending = |job: &str, why: Option<&str>| executor::Status {
            reason: why.map(str::to_string),
            job_id: Some(job.into()),
            ..executor::Status::new(State::Pending)
        };
        let statuses = [
            pending("1_0", Some("Priority")),
            pending("1_1", Some("JobHeldAdmin")),
            pending("1_2", Some("Priority")),
            pending("2", Some("launch failed requeued held")),
            pending("3", None),
            executor::Status::new(State::Running),
        ];
        assert_eq!(
            waiting_for(&statuses),
            "Priority ×2, JobHeldAdmin, launch failed requeued held"
        );
        assert_eq!(
            held_jobs(&statuses),
            [
                ("1_1".to_string(), "JobHeldAdmin".to_string()),
                ("2".to_string(), "launch failed requeued held".to_string())
            ]
        );
        assert_eq!(waiting_for(&statuses[4..]), "");
    }

    #[test]
    fn slurm_is_asked_every_5_s_for_two_minutes_then_every_30() {
        use crate::manifest::ExecutorKind::{Local, Slurm};
        let every = |kind, s| ask_every(kind, Duration::from_secs(s)).as_secs();
        assert_eq!(
            [
                every(Slurm, 0),
                every(Slurm, 119),
                every(Slurm, 120),
                every(Slurm, 86_400)
            ],
            [5, 5, 30, 30]
        );
        assert_eq!([every(Local, 0), every(Local, 86_400)], [2, 2]);
    }
}
