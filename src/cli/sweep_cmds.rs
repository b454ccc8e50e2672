//! plan, render, submit, status, cancel: the commands that take a manifest.

use super::SubmitArgs;
use crate::config::RuntimeOptions;
use crate::executor::{self, local, Decision, Event, Executor, State, Status, SubmitOptions, Unit};
use crate::manifest::{ExecutorKind, Manifest};
use crate::plan::{render, Plan, PlanOptions};
use crate::util::lock::{Acquired, StudyLock};
use anyhow::Result;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use serde_json::json;
use std::path::Path;
use std::process::ExitCode;

/// `allow_oom`: runs estimated not to fit their GPU plan anyway (`--allow-oom`,
/// and commands that only look at runs); otherwise they are an error. The
/// plan's warnings go to stderr.
pub fn load_plan(root: &Path, manifest: &Path, allow_oom: bool) -> Result<Plan> {
    let m = Manifest::load(manifest, root)?;
    let plan = Plan::new(m, &PlanOptions::new(allow_oom, RuntimeOptions::current()))?;
    for w in &plan.warnings {
        eprintln!("warning: {w}");
    }
    Ok(plan)
}

fn table(header: Vec<String>) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED).set_header(header);
    t
}

/// A value in a table, cut to [`crate::util::text::CELL_CHARS`] (`--json`
/// holds it whole).
fn cell(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => crate::util::text::cell(s).into_owned(),
        other => crate::util::text::cell(&other.to_string()).into_owned(),
    }
}

pub fn plan(root: &Path, manifest: &Path, json: bool, allow_oom: bool) -> Result<ExitCode> {
    let plan = load_plan(root, manifest, allow_oom)?;
    check_packed_time(&plan)?;
    match json {
        true => println!("{}", serde_json::to_string_pretty(&plan_json(&plan))?),
        false => print_plan(&plan),
    }
    Ok(ExitCode::SUCCESS)
}

/// A packed study's blocks against its partition's time limit, as `sinfo`
/// gives it: an error where a block asks for more. Without `sinfo` (a plan
/// made off the cluster) it is said and left to `sweep submit`.
fn check_packed_time(plan: &Plan) -> Result<()> {
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
            eprintln!("note: the packed blocks' time is not checked against the partition's limit here ({e:#})");
            Ok(())
        }
    }
}

/// `sweep plan --json`: one object per run.
fn plan_json(plan: &Plan) -> Vec<serde_json::Value> {
    let hints = &plan.manifest.hints;
    plan.runs
        .iter()
        .map(|r| {
            let mut v = json!({ "id": r.id, "name": r.name, "params": r.params, "world_size": r.world_size() });
            if let Some(g) = r.global_batch() {
                v["global_batch"] = json!(g);
            }
            if let Some(b) = r.block {
                v["block"] = json!(b);
            }
            if let Some(mem) = r.memory(hints) {
                v["memory"] = json!(mem);
            }
            if let Some(f) = r.scaling(hints) {
                v["scaling"] = json!(f);
            }
            v
        })
        .collect()
}

/// `sweep plan`: the runs as a table, the stages, the totals.
fn print_plan(plan: &Plan) {
    let m = &plan.manifest;
    let keys: Vec<String> = m
        .axis_keys()
        .map(str::to_string)
        .chain(m.derived.iter().map(|d| d.key.clone()))
        .chain((m.repeats > 1).then(|| crate::plan::REPEAT.to_string()))
        .collect();
    // Built-in trainer studies also show how many ranks train together and
    // the global batch they make.
    let trains = plan
        .runs
        .iter()
        .any(|r| matches!(r.job, crate::plan::Job::Train(_)));
    let forecasts = plan
        .runs
        .iter()
        .any(|r| r.scaling(&plan.manifest.hints).is_some());
    let mut shape = if trains {
        vec!["ranks", "global batch", "memory / device"]
    } else {
        vec![]
    };
    if forecasts {
        shape.push("scaling forecast");
    }
    let blocked = m.design == crate::manifest::Design::Blocks;
    let mut t = table(
        ["id", "name"]
            .iter()
            .map(|s| s.to_string())
            .chain(blocked.then(|| "block".to_string()))
            .chain(keys.iter().cloned())
            .chain(shape.iter().map(|s| s.to_string()))
            .collect(),
    );
    for r in &plan.runs {
        let mut row = vec![r.id.clone(), r.name.clone()];
        if let Some(b) = r.block.filter(|_| blocked) {
            row.push(format!("{} #{}", b.block, b.position));
        }
        row.extend(
            keys.iter()
                .map(|k| r.params.get(k).map(cell).unwrap_or_default()),
        );
        if let crate::plan::Job::Train(cfg) = &r.job {
            // `batch_size = "max"` is found when the job starts; its memory
            // is the least it needs (batch 1).
            let global = r.global_batch().map_or("max".into(), |g| g.to_string());
            let memory = r
                .memory(&plan.manifest.hints)
                .map_or_else(String::new, |m| {
                    let flag = if m.fits == Some(false) { " ✗" } else { "" };
                    let least = if cfg.batch_size.fixed().is_none() {
                        "≥ "
                    } else {
                        ""
                    };
                    format!("{least}{}{flag}", m.describe())
                });
            row.extend([r.world_size().to_string(), global, memory]);
            if forecasts {
                // "91%: 0.040 s exposed / 0.400 s compute": efficiency, then why.
                row.push(
                    r.scaling(&plan.manifest.hints)
                        .map_or_else(String::new, |f| {
                            format!(
                                "{:.0}%: {:.3} s exposed / {:.3} s compute",
                                f.efficiency_pct, f.exposed_s, f.compute_s
                            )
                        }),
                );
            }
        }
        t.add_row(row);
    }
    println!("{}: {}", m.name, m.description.trim());
    println!("{t}");
    for s in &plan.stages {
        let users = plan
            .runs
            .iter()
            .filter(|r| r.stage.is_some_and(|i| plan.stages[i].id == s.id))
            .count();
        println!(
            "stage {} ({}): {} -> {} [{} runs depend on it]",
            s.name,
            s.format.as_str(),
            s.dataset.display(),
            s.output.display(),
            users
        );
    }
    if blocked {
        // Each block's order, by configuration: what the seed drew.
        println!(
            "randomized blocks (order_seed = {}): each block runs every configuration once, in its own order",
            m.order_seed
        );
        for b in crate::plan::pack::blocks(plan) {
            let names: Vec<&str> = b
                .runs
                .iter()
                .map(|&i| plan.runs[i].configuration.name.as_str())
                .collect();
            let size = match m.slurm.pack {
                true => format!(
                    "  [one job: {} node(s), {}]",
                    b.allocation.nodes,
                    crate::plan::pack::slurm_time(b.allocation.time_s)
                ),
                false => String::new(),
            };
            println!("  block {}: {}{size}", b.block, names.join(" → "));
        }
        // What packing saves the queue, and costs in reserved time.
        let (per_run, packed) = crate::plan::pack::costs(plan);
        let this = |yes: bool| if yes { "  ← this manifest" } else { "" };
        println!("on SLURM (each job waits in the queue and pays its start on its own):");
        for (what, c, yes) in [
            ("a job per run:              ", per_run, !m.slurm.pack),
            ("packed blocks (pack = true):", packed, m.slurm.pack),
        ] {
            println!(
                "  {what} {:>5} jobs from {:>5} sbatch submissions, at most {:.1} node-hours{}",
                c.load.jobs,
                c.submissions,
                c.load.node_hours,
                this(yes)
            );
        }
    }
    let tot = plan.totals();
    let repeats = match m.repeats {
        1 => String::new(),
        r => format!(" ({} configurations × {r} repeats)", tot.runs / r as usize),
    };
    println!(
        "{} runs{repeats}, {} jobs; at most {:.1} node-hours and {:.1} GPU-hours (every job to its time limit)",
        tot.runs, tot.jobs, tot.node_hours, tot.gpu_hours
    );
}

pub fn render(
    root: &Path,
    manifest: &Path,
    allow_oom: bool,
    replace_changed: bool,
) -> Result<ExitCode> {
    let plan = load_plan(root, manifest, allow_oom)?;
    let (_, s, _lock) = write_under_lock(&plan, "render", manifest, replace_changed, None)?;
    println!(
        "{} runs and {} stages under {} ({} files written, {} unchanged)",
        plan.runs.len(),
        plan.stages.len(),
        plan.study_dir.display(),
        s.files_written,
        s.files_unchanged
    );
    Ok(ExitCode::SUCCESS)
}

/// Plans, renders and collects the current state of every unit (for the
/// commands that look: nothing is written).
pub fn prepare(root: &Path, manifest: &Path) -> Result<(Plan, Vec<Unit>, Vec<Status>)> {
    // Looking at runs never refuses them for memory.
    let plan = load_plan(root, manifest, true)?;
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

/// Renders the plan and writes the run directories under the study's lock,
/// which it returns held (what was rendered is then what is on disk). Rendering merges each run's record on disk (every job submitted so
/// far), so it happens under the lock too — and once before it, so that an
/// error in the plan's templates writes nothing, not even the lock (0.1 s
/// for 10,000 runs).
///
/// With `replace_changed`, the directories of runs that would now run
/// something else (they hold another run's jobs or outputs) are moved aside
/// first, and those runs start afresh. With `again` (the project root),
/// the study's finished attempt is recorded and moved aside, and every run
/// starts afresh as the next one.
fn write_under_lock(
    plan: &Plan,
    verb: &str,
    manifest: &Path,
    replace_changed: bool,
    again: Option<&Path>,
) -> Result<(render::Rendered, render::WriteSummary, StudyLock)> {
    let on_changed = match replace_changed || again.is_some() {
        true => render::OnChanged::Replace,
        false => render::OnChanged::Refuse,
    };
    render::render_with(plan, on_changed)?;
    let lock = lock_study(plan, verb, manifest)?;
    if let Some(root) = again {
        start_again(root, plan, manifest)?;
    }
    if replace_changed {
        for (name, to) in render::move_changed_aside(plan)? {
            eprintln!(
                "sweep: {name} ran something else: its directory is now {}",
                to.display()
            );
        }
    }
    let rendered = render::render(plan)?;
    let written = render::write(&rendered)?;
    Ok((rendered, written, lock))
}

/// `--again`: refuses while runs of the study are still going; records the
/// finished attempt's runs in the history (nothing is moved when that
/// fails); moves the attempt aside.
fn start_again(root: &Path, plan: &Plan, manifest: &Path) -> Result<()> {
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
        let source = crate::report::Source::Manifest(manifest.to_path_buf());
        let (path, added) = crate::report::record_history(root, &source)?;
        eprintln!(
            "sweep: the finished attempt's runs are in {} ({added} recorded now)",
            path.display()
        );
    }
    let (attempt, into) = render::start_next_attempt(plan)?;
    eprintln!(
        "sweep: attempt {attempt} moved to {}; measuring attempt {}",
        into.display(),
        attempt.saturating_add(1)
    );
    Ok(())
}

/// The study's lock for a command that writes it (`sweep <verb> <manifest>`):
/// a second `sweep` writing the same study waits, saying for whom, so that no
/// run is rendered or submitted twice at once.
pub fn lock_study(plan: &Plan, verb: &str, manifest: &Path) -> Result<StudyLock> {
    let what = format!("sweep {verb} {}", manifest.display());
    let (lock, how) = StudyLock::acquire(&plan.study_dir, &what, |holder| {
        eprintln!(
            "sweep: {} is held by {}; waiting until it is done (Ctrl-C stops waiting)",
            plan.study_dir.display(),
            holder
        )
    })?;
    if how == Acquired::Unsupported {
        eprintln!(
            "warning: the file system of {} does not support locks: make sure no other sweep submits this study at the same time",
            plan.study_dir.display()
        );
    }
    Ok(lock)
}

/// What `submit` and `run` act on: the rendered sweep, the executor, and
/// what to do with each unit given its current state.
pub(super) struct Submission {
    pub plan: Plan,
    pub units: Vec<Unit>,
    pub status: Vec<Status>,
    /// Chosen once: `--executor`, else the manifest's, else SLURM.
    pub executor: Box<dyn Executor>,
    pub kind: ExecutorKind,
    pub decisions: Vec<Decision>,
    /// The study's lock, held while this process submits (on the local
    /// executor: runs) its jobs.
    pub lock: Option<StudyLock>,
}

impl Submission {
    /// `verb`: the command (`submit`, `run`), for a second `sweep` to name.
    pub fn new(root: &Path, args: &SubmitArgs, verb: &str) -> Result<Submission> {
        let plan = load_plan(root, &args.manifest, args.allow_oom)?;
        let kind = args
            .executor
            .or(plan.manifest.executor)
            .unwrap_or(ExecutorKind::Slurm);
        if kind == ExecutorKind::Slurm {
            check_packed_time(&plan)?;
        }
        // Decided under the lock: what another sweep submitted is seen.
        let (rendered, _, lock) = write_under_lock(
            &plan,
            verb,
            &args.manifest,
            args.replace_changed,
            args.again.then_some(root),
        )?;
        let (units, status) = units_of(&plan, &rendered)?;
        let local = local::LocalOptions {
            parallel: args.parallel.unwrap_or(plan.manifest.local.parallel).max(1),
            threads: plan.manifest.local.threads,
        };
        let opts = SubmitOptions {
            retry_failed: args.retry_failed,
            dry_run: args.dry_run,
        };
        let decisions = executor::decide(&units, &status, opts, |u| stage_ready(&plan, u));
        report_decisions(&units, &decisions);
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

    pub fn todo(&self) -> usize {
        self.decisions
            .iter()
            .filter(|d| **d == Decision::Submit)
            .count()
    }
}

pub fn submit(root: &Path, args: &SubmitArgs) -> Result<ExitCode> {
    let mut sub = Submission::new(root, args, "submit")?;
    if sub.todo() == 0 {
        println!("nothing to submit");
        return Ok(ExitCode::SUCCESS);
    }
    let done = sub.executor.submit(
        &sub.plan.study_dir,
        &mut sub.units,
        &sub.decisions,
        args.dry_run,
        &mut |e| print_event(e, args.dry_run),
    )?;
    if let Some(sig) = done.interrupted {
        eprintln!(
            "{}",
            interrupted_note(sig, &done.outcomes, "submit", &args.manifest)
        );
        return Ok(ExitCode::from(130));
    }
    if done.outcomes.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    let failed = done
        .outcomes
        .iter()
        .filter(|o| o.status.state != State::Completed)
        .count();
    println!(
        "{} jobs finished, {} failed or cancelled; logs in each run directory's {}",
        done.outcomes.len(),
        failed,
        local::LOG_FILE
    );
    Ok(if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
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

/// One line per submitted job, or per local job as it starts and ends.
fn print_event(e: Event<'_>, dry_run: bool) {
    match e {
        Event::Submitted(job) => {
            let what = match (job.block, job.array) {
                (Some(b), _) => format!("block {b} of {} runs, packed", job.units.len()),
                (None, true) => format!("array of {} runs", job.units.len()),
                (None, false) => job.units[0].clone(),
            };
            // A dry run's stage jobs have no id yet: their stages' names.
            let after = match (dry_run, job.after_stages.is_empty()) {
                (_, true) => String::new(),
                (true, false) => format!(" after {}", job.after_stages.join(", ")),
                (false, false) => format!(" after job {}", job.depends_on.join(",")),
            };
            if dry_run {
                let written = if job.array || job.block.is_some() {
                    " (written when submitted)"
                } else {
                    ""
                };
                println!(
                    "would submit {what}{after}: {}{written}",
                    job.script.display()
                );
            } else {
                println!("submitted job {}: {what}{after}", job.job_id);
            }
        }
        Event::WouldRun { name, command } => println!("would run {name}: {command}"),
        Event::Started(o) => eprintln!("started   {}", o.name),
        Event::Ended(o) => {
            eprintln!("{:<9} {} ({:.1} s)", o.status.describe(), o.name, o.seconds);
            if let Some(line) = &o.last_log_line {
                eprintln!("          {line}");
            }
        }
        Event::Tick => {}
    }
}

/// Whether a stage's output exists and its metadata matches the stage's
/// inputs (the pretokenize stage's cache key); anything else runs it again.
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

fn report_decisions(units: &[Unit], decisions: &[Decision]) {
    for (u, d) in units.iter().zip(decisions) {
        match d {
            Decision::Skip(s) if *s != State::Unsubmitted => println!("skip {} ({s})", u.name),
            Decision::SkipFailed(s) => {
                println!("skip {} ({s}; --retry-failed resubmits it)", u.name)
            }
            Decision::Blocked => println!(
                "skip {} (its stage failed; --retry-failed resubmits both)",
                u.name
            ),
            Decision::Cached => println!("skip {} (output already present)", u.name),
            _ => {}
        }
    }
}

pub fn status(root: &Path, manifest: &Path, json: bool) -> Result<ExitCode> {
    let (_plan, units, status) = prepare(root, manifest)?;
    if json {
        let rows: Vec<_> = units
            .iter()
            .zip(&status)
            .map(|(u, s)| {
                json!({
                    "name": u.name, "id": u.id, "kind": u.kind, "state": s.state,
                    "exit_code": s.exit_code, "signal": s.signal, "reason": s.reason,
                    "job_id": s.job_id, "dir": u.dir, "packed_block": packed_block(u),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(ExitCode::SUCCESS);
    }
    let mut t = table(vec![
        "name".into(),
        "kind".into(),
        "state".into(),
        "job".into(),
    ]);
    let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
    for (u, s) in units.iter().zip(&status) {
        let mut job = s.job_id.clone().unwrap_or_default();
        if let Some(b) = packed_block(u) {
            job.push_str(&format!(" (block {b})"));
        }
        t.add_row(vec![
            u.name.clone(),
            u.kind.as_str().into(),
            s.describe(),
            job,
        ]);
        *counts.entry(s.state.as_str()).or_default() += 1;
    }
    println!("{t}");
    println!(
        "{}",
        counts
            .iter()
            .map(|(k, v)| format!("{v} {k}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(ExitCode::SUCCESS)
}

/// The packed block whose job ran (or runs) the unit last.
fn packed_block(u: &Unit) -> Option<u32> {
    u.record.last_job().and_then(|j| j.block)
}

pub fn cancel(root: &Path, manifest: &Path) -> Result<ExitCode> {
    let (_plan, units, status) = prepare(root, manifest)?;
    let cancelled = executor::cancel(&units, &status)?;
    if cancelled.is_empty() {
        println!("nothing pending or running");
    } else {
        println!(
            "cancelled {} jobs: {}",
            cancelled.len(),
            cancelled.join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}
