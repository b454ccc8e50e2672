//! A study's verbs, whatever prints them: plan, render under its lock, start a new attempt,
//! decide, submit or run ([`watch`]), state, cancel. `cli` parses, calls these and prints what
//! they return; what they say while working goes to `say`.

pub mod watch;

use crate::config::RuntimeOptions;
use crate::executor::{self, local, Decision, Executor, State, Status, Unit};
use crate::manifest::{ExecutorKind, Manifest};
use crate::plan::{render, Plan, PlanOptions};
use crate::util::lock::{Acquired, DirLock};
use anyhow::Result;
use std::path::{Path, PathBuf};

/// What `sweep submit` and `sweep run` are asked to do.
#[derive(Debug, Clone)]
pub struct Request {
    pub manifest: PathBuf,
    /// Where jobs run; the manifest's `executor`, else SLURM.
    pub executor: Option<ExecutorKind>,
    pub retry_failed: bool,
    pub dry_run: bool,
    /// Local runs at a time (else the manifest's).
    pub parallel: Option<usize>,
    pub allow_oom: bool,
    pub replace_changed: bool,
    /// A new attempt: the finished one recorded and moved aside.
    pub again: bool,
}

/// Where a command says what it does while it works.
pub type Say<'a> = &'a mut dyn FnMut(&str);

/// The manifest's plan, its warnings said; runs estimated not to fit their GPU are an error
/// unless `allow_oom`.
pub fn load_plan(
    root: &Path,
    manifest: &Path,
    allow_oom: bool,
    rt: &RuntimeOptions,
    say: Say,
) -> Result<Plan> {
    if let Ok(Some(study)) = crate::plan::record::StudyRecord::load(manifest) {
        // `sweep status results/x`: the results are not a manifest, but name the one that made them.
        anyhow::bail!(
            "{} holds a study's results; this command reads the study's manifest: {}",
            manifest.display(),
            study.manifest.path
        );
    }
    let m = Manifest::load(manifest, root)?;
    let plan = Plan::new(m, &PlanOptions::new(allow_oom, rt))?;
    for w in &plan.warnings {
        say(&format!("warning: {w}"));
    }
    Ok(plan)
}

/// A packed study's blocks against its partition's time limit (`sinfo`): an error where a block
/// asks more. Without `sinfo` it is said and left to `sweep submit`.
pub fn check_packed_time(plan: &Plan, say: Say) -> Result<()> {
    if !plan.manifest.slurm.pack {
        return Ok(());
    }
    let partition = plan.manifest.slurm.partition.as_deref();
    match executor::slurm::partition_limit(partition) {
        Ok(Some((name, limit))) => crate::plan::pack::check_limit(plan, &name, limit)
            .map_err(|e| anyhow::anyhow!("{}: {e}", plan.manifest.path.display())),
        Ok(None) => anyhow::bail!(
            "{}: the cluster has no partition {}",
            plan.manifest.path.display(),
            partition.map_or("marked default".into(), |p| format!("`{p}`"))
        ),
        Err(e) => {
            say(&format!("note: the packed blocks' time is not checked against the partition's limit here ({e:#})"));
            Ok(())
        }
    }
}

/// `sweep render`: the run directories written under the study's lock.
pub fn render(
    plan: &Plan,
    manifest: &Path,
    replace_changed: bool,
    say: Say,
) -> Result<render::WriteSummary> {
    let (_, written, _lock) =
        write_under_lock(plan, "render", manifest, replace_changed, false, say)?;
    Ok(written)
}

/// Plans, renders and reads every unit's state, writing nothing (for commands that look).
pub fn prepare(
    root: &Path,
    manifest: &Path,
    rt: &RuntimeOptions,
    say: Say,
) -> Result<(Plan, Vec<Unit>, Vec<Status>)> {
    // Looking at runs never refuses them for memory.
    let plan = load_plan(root, manifest, true, rt, say)?;
    let rendered = render::render(&plan)?;
    let (units, status) = units_of(&plan, &rendered)?;
    Ok((plan, units, status))
}

/// The rendered units with their current states.
fn units_of(plan: &Plan, rendered: &render::Rendered) -> Result<(Vec<Unit>, Vec<Status>)> {
    let units = executor::units(plan, rendered);
    let status = executor::statuses(&units)?;
    Ok((units, status))
}

/// Renders the plan and writes the run directories under the study's lock, returned held
/// (rendered first, so a template error writes nothing); `replace_changed` and `again` move
/// runs aside.
fn write_under_lock(
    plan: &Plan,
    verb: &str,
    manifest: &Path,
    replace_changed: bool,
    again: bool,
    say: Say,
) -> Result<(render::Rendered, render::WriteSummary, DirLock)> {
    let on_changed = match replace_changed || again {
        true => render::OnChanged::Replace,
        false => render::OnChanged::Refuse,
    };
    let before = render::render_with(plan, on_changed)?;
    let lock = lock_study(plan, verb, manifest, say)?;
    if again {
        start_again(plan, manifest, say)?;
    }
    if replace_changed {
        for (name, to) in render::move_changed_aside(plan)? {
            say(&format!(
                "sweep: {name} ran something else: its directory is now {}",
                to.display()
            ));
        }
    } else if !before.failed_empty.is_empty() {
        for (name, to) in render::move_failed_empty_aside(plan)? {
            say(&format!(
                "sweep: {name} failed before its first metric and now runs something else: it starts afresh (its directory is now {})",
                to.display()
            ));
        }
    }
    let rendered = render::render(plan)?;
    let written = render::write(&rendered)?;
    Ok((rendered, written, lock))
}

/// `--again`: refused while runs still go; records the finished attempt in the history, then
/// moves it aside (nothing moves when recording fails).
fn start_again(plan: &Plan, manifest: &Path, say: Say) -> Result<()> {
    let rendered = render::render_with(plan, render::OnChanged::Replace)?;
    let (units, status) = units_of(plan, &rendered)?;
    let going: Vec<&str> = units
        .iter()
        .zip(&status)
        .filter(|(u, s)| u.kind == executor::UnitKind::Run && s.state.is_active())
        .map(|(u, _)| u.name.as_str())
        .collect();
    if !going.is_empty() {
        anyhow::bail!(
            "{} run(s) of the study are still pending or running ({}): let them end, or `sweep cancel {}`, then measure again",
            going.len(),
            going.iter().take(5).copied().collect::<Vec<_>>().join(", "),
            manifest.display()
        );
    }
    if plan.study_dir.is_dir() {
        let source = crate::report::Source::Plan(Box::new(plan.clone()));
        let (path, added) = crate::report::record_history(&source)?;
        say(&format!(
            "sweep: the finished attempt's runs are in {} ({} recorded now)",
            path.display(),
            added.new
        ));
    }
    let (attempt, into) = render::start_next_attempt(plan)?;
    say(&format!(
        "sweep: attempt {attempt} moved to {}; measuring attempt {}",
        into.display(),
        attempt.saturating_add(1)
    ));
    Ok(())
}

/// The study's lock for a writing command: a second `sweep` waits, saying for whom, so nothing
/// is rendered or submitted twice at once.
pub fn lock_study(plan: &Plan, verb: &str, manifest: &Path, say: Say) -> Result<DirLock> {
    let what = format!("sweep {verb} {}", manifest.display());
    let (lock, how) = DirLock::study(&plan.study_dir, &what, |holder| {
        say(&format!(
            "sweep: {} is held by {}; waiting until it is done (Ctrl-C stops waiting)",
            plan.study_dir.display(),
            holder
        ))
    })
    .map_err(|e| {
        // A colleague's study, a read-only snapshot: say what reads it.
        let io = e.root_cause().downcast_ref::<std::io::Error>();
        match io.and_then(std::io::Error::raw_os_error) {
            Some(libc::EROFS | libc::EACCES | libc::EPERM) => anyhow::anyhow!(
                "{} cannot be written ({}): `sweep {verb}` writes the study's scripts and records there. \
                 A study one cannot write is still read by `sweep status`, `sweep report --out DIR` and `sweep check`",
                plan.study_dir.display(),
                e.root_cause()
            ),
            _ => e,
        }
    })?;
    if how == Acquired::Unsupported {
        say(&format!(
            "warning: the file system of {} does not support locks: make sure no other sweep submits this study at the same time",
            plan.study_dir.display()
        ));
    }
    Ok(lock)
}

/// What `submit` and `run` act on: the rendered sweep, the executor, and each unit's decision.
pub struct Submission {
    pub plan: Plan,
    pub units: Vec<Unit>,
    pub status: Vec<Status>,
    /// Chosen once: `--executor`, else the manifest's, else SLURM.
    pub executor: Box<dyn Executor>,
    pub kind: ExecutorKind,
    pub decisions: Vec<Decision>,
    /// The study's lock, held while this process submits or runs its jobs.
    pub lock: Option<DirLock>,
}

impl Submission {
    /// Plans, renders under the lock and decides; `verb` names the command to a second `sweep`.
    pub fn new(
        root: &Path,
        req: &Request,
        rt: &RuntimeOptions,
        verb: &str,
        say: Say,
    ) -> Result<Submission> {
        let plan = load_plan(root, &req.manifest, req.allow_oom, rt, say)?;
        let kind = req
            .executor
            .or(plan.manifest.executor)
            .unwrap_or(ExecutorKind::Slurm);
        if kind == ExecutorKind::Slurm {
            check_packed_time(&plan, say)?;
        }
        // Decided under the lock: what another sweep submitted is seen.
        let (rendered, _, lock) = write_under_lock(
            &plan,
            verb,
            &req.manifest,
            req.replace_changed,
            req.again,
            say,
        )?;
        let (units, status) = units_of(&plan, &rendered)?;
        let local = local::LocalOptions {
            parallel: req.parallel.unwrap_or(plan.manifest.local.parallel).max(1),
            threads: plan.manifest.local.threads,
        };
        let decisions =
            executor::decide(&units, &status, req.retry_failed, |u| stage_ready(&plan, u));
        Ok(Submission {
            plan,
            units,
            status,
            executor: executor::for_kind(kind, local),
            kind,
            decisions,
            lock: Some(lock),
        })
    }

    /// Units to submit.
    pub fn todo(&self) -> usize {
        self.decisions
            .iter()
            .filter(|d| **d == Decision::Submit)
            .count()
    }

    /// A line for each unit left alone, and why.
    pub fn skipped(&self) -> Vec<String> {
        self.units
            .iter()
            .zip(&self.decisions)
            .filter_map(|(u, d)| match d {
                Decision::Skip(s) if *s != State::Unsubmitted => {
                    Some(format!("skip {} ({s})", u.name))
                }
                Decision::SkipFailed(s) => Some(format!(
                    "skip {} ({s}; --retry-failed resubmits it)",
                    u.name
                )),
                Decision::Blocked => Some(format!(
                    "skip {} (its stage failed; --retry-failed resubmits both)",
                    u.name
                )),
                Decision::Cached => Some(format!("skip {} (output already present)", u.name)),
                _ => None,
            })
            .collect()
    }
}

/// What a stop signal did to the local jobs, and what to type to go on.
pub fn interrupted_note(
    sig: i32,
    outcomes: &[local::Outcome],
    verb: &str,
    manifest: &Path,
) -> String {
    let interrupted: Vec<&local::Outcome> = outcomes
        .iter()
        .filter(|o| o.status.state == State::Interrupted)
        .collect();
    let started = interrupted.iter().filter(|o| o.seconds > 0.0).count();
    let checkpointed = interrupted
        .iter()
        .filter(|o| o.status.exit_code == Some(crate::config::REQUEUE_EXIT))
        .count();
    let mut what = format!(
        "sweep: {} stopped the local jobs: {started} running (stopped; {checkpointed} wrote a checkpoint) and {} not started",
        crate::util::signals::name(sig),
        interrupted.len() - started
    );
    what.push_str(&format!(
        ". They are INTERRUPTED, not failed: `sweep {verb} {}` continues them (completed runs are kept, checkpointed ones resume)",
        manifest.display()
    ));
    what
}

/// Whether a stage's output exists and its metadata matches the stage's inputs.
fn stage_ready(plan: &Plan, u: &Unit) -> bool {
    let Some(s) = plan.stages.iter().find(|s| s.dir == u.dir) else {
        return false;
    };
    let Ok(tok) = crate::data::TextTokenizer::load(&s.tokenizer, &s.specials) else {
        return false;
    };
    crate::data::pretokenize::expected_meta(
        &s.dataset,
        &s.text_column,
        &tok,
        s.sequence_length,
        s.format,
    )
    .is_ok_and(|want| crate::data::pretokenize::stale_reason(&s.output, &want).is_none())
}

/// A unit and its state, as `sweep status` shows it.
pub struct UnitState {
    pub unit: Unit,
    pub status: Status,
    /// The packed block whose job ran (or runs) the unit last.
    pub packed_block: Option<u32>,
}

/// Every unit of the study with its current state.
pub fn status(
    root: &Path,
    manifest: &Path,
    rt: &RuntimeOptions,
    say: Say,
) -> Result<Vec<UnitState>> {
    let (_plan, units, status) = prepare(root, manifest, rt, say)?;
    Ok(units
        .into_iter()
        .zip(status)
        .map(|(unit, status)| UnitState {
            packed_block: unit.record.last_job().and_then(|j| j.block),
            unit,
            status,
        })
        .collect())
}

/// Cancels every job of the study that is pending or running; their ids.
pub fn cancel(root: &Path, manifest: &Path, rt: &RuntimeOptions, say: Say) -> Result<Vec<String>> {
    let (_plan, units, status) = prepare(root, manifest, rt, say)?;
    executor::cancel(&units, &status)
}
