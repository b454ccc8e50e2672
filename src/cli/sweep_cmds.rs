//! plan, render, submit, status, cancel: the commands that take a manifest,
//! as the study's verbs ([`crate::study`]) do them, printed.

use super::SubmitArgs;
use crate::config::RuntimeOptions;
use crate::executor::{local, Event, State};
use crate::plan::Plan;
use crate::study::{self, Request, Submission};
use crate::util::stdout::outln;
use anyhow::Result;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use serde_json::json;
use std::path::Path;
use std::process::ExitCode;

/// What a verb says while it works, on stderr.
pub fn say(line: &str) {
    eprintln!("{line}");
}

/// What the command line asks of `submit` and `run`.
fn request(args: &SubmitArgs) -> Request {
    Request {
        manifest: args.manifest.clone(),
        executor: args.executor,
        retry_failed: args.retry_failed,
        dry_run: args.dry_run,
        parallel: args.parallel,
        allow_oom: args.allow_oom,
        replace_changed: args.replace_changed,
        again: args.again,
    }
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

pub fn plan(
    root: &Path,
    manifest: &Path,
    json: bool,
    allow_oom: bool,
    rt: &RuntimeOptions,
) -> Result<ExitCode> {
    let plan = study::load_plan(root, manifest, allow_oom, rt, &mut say)?;
    study::check_packed_time(&plan, &mut say)?;
    match json {
        true => outln!("{}", serde_json::to_string_pretty(&plan_json(&plan))?),
        false => print_plan(&plan)?,
    }
    Ok(ExitCode::SUCCESS)
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
fn print_plan(plan: &Plan) -> Result<()> {
    let m = &plan.manifest;
    let blocked = m.design == crate::manifest::Design::Blocks;
    outln!("{}: {}", m.name, m.description.trim());
    outln!("{}", runs_table(plan, blocked));
    for s in &plan.stages {
        let users = plan
            .runs
            .iter()
            .filter(|r| r.stage.is_some_and(|i| plan.stages[i].id == s.id))
            .count();
        outln!(
            "stage {} ({}): {} -> {} [{} runs depend on it]",
            s.name,
            s.format.as_str(),
            s.dataset.display(),
            s.output.display(),
            users
        );
    }
    if blocked {
        print_blocks(plan)?;
    }
    print_zero_fits(plan)?;
    let tot = plan.totals();
    let repeats = match m.repeats {
        1 => String::new(),
        r => format!(" ({} configurations × {r} repeats)", tot.runs / r as usize),
    };
    // Node-hours are what a SLURM allocation reserves; local runs reserve
    // nothing (their [slurm] time is no limit of theirs).
    match m.executor {
        Some(crate::manifest::ExecutorKind::Local) => outln!(
            "{} runs{repeats}, {} jobs, on this machine (the local executor: {} at a time)",
            tot.runs, tot.jobs, m.local.parallel
        ),
        _ => outln!(
            "{} runs{repeats}, {} jobs; at most {:.1} node-hours and {:.1} GPU-hours (every job to its time limit)",
            tot.runs, tot.jobs, tot.node_hours, tot.gpu_hours
        ),
    }
    Ok(())
}

/// Where a study shards the optimizer (`zero` set on some run): for each
/// model, world size and GPU, the largest batch per device that fits at
/// each `zero` value, with the estimate's states per rank.
fn print_zero_fits(plan: &Plan) -> Result<()> {
    let hints = &plan.manifest.hints;
    let sharded =
        |r: &&crate::plan::Run| matches!(&r.job, crate::plan::Job::Train(c) if c.zero > 0);
    if !plan.runs.iter().any(|r| sharded(&r)) {
        return Ok(());
    }
    let mut seen = std::collections::BTreeSet::new();
    for r in &plan.runs {
        let crate::plan::Job::Train(cfg) = &r.job else {
            continue;
        };
        let (Some(fits), Some(mem)) = (r.fits_by_zero(hints), r.memory(hints)) else {
            continue;
        };
        // The manifest's spelling ("bf16-mixed").
        let precision = serde_json::to_value(cfg.precision)?
            .as_str()
            .unwrap_or_default()
            .to_string();
        let device = mem.device_bytes.unwrap_or(0);
        let key = (
            cfg.model.clone(),
            r.world_size(),
            device,
            precision.clone(),
            cfg.sequence_length,
        );
        if !seen.insert(key) {
            continue;
        }
        let gb = |b: u64| b as f64 / 1e9;
        outln!(
            "{} ({precision}, sequence {}) on {} ranks of {:.0} GB, per rank: parameters + gradients + master values + moments (GB), largest batch",
            cfg.model,
            cfg.sequence_length,
            r.world_size(),
            gb(device),
        );
        for (z, (batch, k)) in fits.iter().enumerate() {
            let batch = batch.map_or("does not fit".into(), |b| format!("batch ≤ {b}"));
            outln!(
                "  zero {z}: {:.1} + {:.1} + {:.1} + {:.1}: {batch}",
                gb(k.parameters),
                gb(k.gradients),
                gb(k.master),
                gb(k.moments)
            );
        }
    }
    Ok(())
}

/// The runs as a table: id, name, block, each axis, the ranks (the
/// processes a command's launcher starts), and for the built-in trainer the
/// global batch, memory and scaling forecast.
fn runs_table(plan: &Plan, blocked: bool) -> Table {
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
        vec!["ranks"]
    };
    if forecasts {
        shape.push("scaling forecast");
    }
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
        if let crate::plan::Job::Command(_) = &r.job {
            // `launcher = "none"` starts the command once, whatever the tasks.
            let ranks = match r.launcher {
                Some(crate::manifest::Launcher::None) => 1,
                _ => r.world_size(),
            };
            row.push(ranks.to_string());
        }
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
    t
}

/// Each randomized block's order, and what packing saves the queue.
fn print_blocks(plan: &Plan) -> Result<()> {
    let m = &plan.manifest;
    // Each block's order, by configuration: what the seed drew.
    outln!(
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
        outln!("  block {}: {}{size}", b.block, names.join(" → "));
    }
    // What packing saves the queue, and costs in reserved time.
    let (per_run, packed) = crate::plan::pack::costs(plan);
    let this = |yes: bool| if yes { "  ← this manifest" } else { "" };
    outln!("on SLURM (each job waits in the queue and pays its start on its own):");
    for (what, c, yes) in [
        ("a job per run:              ", per_run, !m.slurm.pack),
        ("packed blocks (pack = true):", packed, m.slurm.pack),
    ] {
        outln!(
            "  {what} {:>5} jobs from {:>5} sbatch submissions, at most {:.1} node-hours{}",
            c.load.jobs,
            c.submissions,
            c.load.node_hours,
            this(yes)
        );
    }
    Ok(())
}

pub fn render(
    root: &Path,
    manifest: &Path,
    allow_oom: bool,
    replace_changed: bool,
    rt: &RuntimeOptions,
) -> Result<ExitCode> {
    let plan = study::load_plan(root, manifest, allow_oom, rt, &mut say)?;
    let s = study::render(&plan, manifest, replace_changed, &mut say)?;
    outln!(
        "{} runs and {} stages under {} ({} files written, {} unchanged)",
        plan.runs.len(),
        plan.stages.len(),
        plan.study_dir.display(),
        s.files_written,
        s.files_unchanged
    );
    Ok(ExitCode::SUCCESS)
}

/// A new submission of the study, its skipped units said.
pub fn submission(
    root: &Path,
    args: &SubmitArgs,
    rt: &RuntimeOptions,
    verb: &str,
) -> Result<Submission> {
    let sub = Submission::new(root, &request(args), rt, verb, &mut say)?;
    for line in sub.skipped() {
        outln!("{line}");
    }
    Ok(sub)
}

pub fn submit(root: &Path, args: &SubmitArgs, rt: &RuntimeOptions) -> Result<ExitCode> {
    let mut sub = submission(root, args, rt, "submit")?;
    if sub.todo() == 0 {
        outln!("nothing to submit");
        return Ok(ExitCode::SUCCESS);
    }
    // Submitting goes on where a line cannot be printed; the first such
    // error is the command's once it is done.
    let mut printed = Ok(());
    let done = sub.executor.submit(
        &sub.plan.study_dir,
        &mut sub.units,
        &sub.decisions,
        args.dry_run,
        &mut |e| {
            if printed.is_ok() {
                printed = print_event(e, args.dry_run);
            }
        },
    )?;
    printed?;
    if let Some(held) = &done.held {
        eprintln!("{}", held_note(&sub, held, &args.manifest));
        return Ok(ExitCode::from(HELD_EXIT));
    }
    if let Some(sig) = done.interrupted {
        eprintln!(
            "{}",
            study::interrupted_note(sig, &done.outcomes, "submit", &args.manifest)
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
    outln!(
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

/// `sweep submit`'s exit status where SLURM held runs back: EX_TEMPFAIL,
/// "try again later".
const HELD_EXIT: u8 = 75;

/// What SLURM held back, and the two ways to send it.
fn held_note(sub: &study::Submission, held: &crate::executor::Held, manifest: &Path) -> String {
    let names: Vec<&str> = held
        .units
        .iter()
        .map(|&i| sub.units[i].name.as_str())
        .collect();
    let shown = names.iter().take(3).copied().collect::<Vec<_>>().join(", ");
    let more = if names.len() > 3 { ", …" } else { "" };
    format!(
        "sweep: SLURM takes no more of your jobs for now ({}): {} run(s) not submitted ({shown}{more}). \
         `sweep run {m}` submits them as jobs end and follows the study; or `sweep submit {m}` again once jobs have ended",
        held.reason,
        names.len(),
        m = manifest.display()
    )
}

/// One line per submitted job, or per local job as it starts and ends.
fn print_event(e: Event<'_>, dry_run: bool) -> Result<()> {
    match e {
        Event::Submitted(job) => {
            let what = match (job.block, job.array) {
                (Some(b), _) => format!("block {b} of {} runs, packed", job.units.len()),
                (None, true) => format!("array of {} runs", job.units.len()),
                (None, false) => job.units[0].clone(),
            };
            // A dry run's stage jobs have no id yet: their stages' names.
            let after = match (dry_run, job.after_stages.is_empty()) {
                (true, true) => String::new(),
                (true, false) => format!(" after {}", job.after_stages.join(", ")),
                (false, _) if job.depends_on.is_empty() => String::new(),
                (false, _) => format!(" after job {}", job.depends_on.join(",")),
            };
            if dry_run {
                let written = if job.array || job.block.is_some() {
                    " (written when submitted)"
                } else {
                    ""
                };
                outln!(
                    "would submit {what}{after}: {}{written}",
                    job.script.display()
                );
            } else {
                outln!("submitted job {}: {what}{after}", job.job_id);
            }
        }
        Event::WouldRun { name, command } => outln!("would run {name}: {command}"),
        Event::Started(o) => eprintln!("started   {}", o.name),
        Event::Ended(o) => {
            eprintln!("{:<9} {} ({:.1} s)", o.status.describe(), o.name, o.seconds);
            if let Some(line) = &o.last_log_line {
                eprintln!("          {line}");
            }
        }
        Event::Tick => {}
    }
    Ok(())
}

pub fn status(root: &Path, manifest: &Path, json: bool, rt: &RuntimeOptions) -> Result<ExitCode> {
    let units = study::status(root, manifest, rt, &mut say)?;
    if json {
        let rows: Vec<_> = units
            .iter()
            .map(|x| {
                let (u, s) = (&x.unit, &x.status);
                json!({
                    "name": u.name, "id": u.id, "kind": u.kind, "state": s.state,
                    "exit_code": s.exit_code, "signal": s.signal, "reason": s.reason,
                    "job_id": s.job_id, "dir": u.dir, "packed_block": x.packed_block,
                })
            })
            .collect();
        outln!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(ExitCode::SUCCESS);
    }
    let mut t = table(vec![
        "name".into(),
        "kind".into(),
        "state".into(),
        "job".into(),
    ]);
    let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
    for x in &units {
        let mut job = x.status.job_id.clone().unwrap_or_default();
        if let Some(b) = x.packed_block {
            job.push_str(&format!(" (block {b})"));
        }
        t.add_row(vec![
            x.unit.name.clone(),
            x.unit.kind.as_str().into(),
            x.status.describe(),
            job,
        ]);
        *counts.entry(x.status.state.as_str()).or_default() += 1;
    }
    outln!("{t}");
    outln!(
        "{}",
        counts
            .iter()
            .map(|(k, v)| format!("{v} {k}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(ExitCode::SUCCESS)
}

pub fn cancel(root: &Path, manifest: &Path, rt: &RuntimeOptions) -> Result<ExitCode> {
    let cancelled = study::cancel(root, manifest, rt, &mut say)?;
    if cancelled.is_empty() {
        outln!("nothing pending or running");
    } else {
        outln!(
            "cancelled {} jobs: {}",
            cancelled.len(),
            cancelled.join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}
