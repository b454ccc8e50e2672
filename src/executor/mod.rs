//! Runs -> jobs. Two executors share one state model: SLURM (sbatch, job
//! arrays, afterok dependencies) and local (child processes on this machine).
//! Submission is idempotent: what is completed, pending or running is never
//! submitted again; failed runs only with `--retry-failed`.

pub mod local;
pub mod slurm;
mod state;

pub use state::{State, Status};

use crate::manifest::ExecutorKind;
use crate::plan::record::{JobRecord, RunRecord};
use crate::plan::render::{Rendered, RenderedDir, STAGE_JSON};
use crate::plan::Plan;
use anyhow::{Context, Result};
use serde::Serialize;
use std::collections::HashMap;
use std::path::PathBuf;

/// A run or a stage: anything that becomes one job.
#[derive(Debug, Clone)]
pub struct Unit {
    pub kind: UnitKind,
    pub name: String,
    pub id: String,
    pub dir: PathBuf,
    /// The program line the job script launches (shell syntax).
    pub command: String,
    /// Index into the plan's stages of the stage this unit waits for.
    pub stage: Option<usize>,
    pub record: RunRecord,
    pub script: String,
    pub env: Vec<(String, String)>,
    pub array_throttle: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum UnitKind {
    Stage,
    Run,
}

impl Unit {
    pub fn record_file(&self) -> PathBuf {
        match self.kind {
            UnitKind::Stage => self.dir.join(STAGE_JSON),
            UnitKind::Run => self.dir.join(crate::plan::record::RUN_JSON),
        }
    }

    /// Appends a submitted job to the unit's record, on disk at once.
    pub fn record_job(&mut self, executor: ExecutorKind, job_id: String) -> Result<()> {
        // Re-read: another process (a job's own requeue, a parallel submit) may have written.
        let path = self.record_file();
        if let Ok(bytes) = std::fs::read(&path) {
            if let Ok(r) = serde_json::from_slice::<RunRecord>(&bytes) {
                self.record = r;
            }
        }
        self.record.jobs.push(JobRecord {
            executor,
            job_id,
            submitted_at: crate::util::now_rfc3339(),
        });
        crate::util::fs::write_atomic(&path, &self.record.to_bytes())
    }
}

/// Stages first, then runs, in plan order.
pub fn units(plan: &Plan, rendered: &Rendered) -> Vec<Unit> {
    let bin = crate::plan::sweep_bin();
    let mut out = Vec::new();
    for (s, r) in plan.stages.iter().zip(&rendered.stages) {
        out.push(unit(
            UnitKind::Stage,
            r,
            s.command(&bin),
            None,
            plan.manifest.slurm.env.clone(),
            None,
        ));
    }
    for (run, r) in plan.runs.iter().zip(&rendered.runs) {
        out.push(unit(
            UnitKind::Run,
            r,
            run.command(&bin),
            run.stage,
            run.slurm.env.clone(),
            run.slurm.array_throttle,
        ));
    }
    out
}

fn unit(
    kind: UnitKind,
    r: &RenderedDir,
    command: String,
    stage: Option<usize>,
    env: indexmap::IndexMap<String, String>,
    array_throttle: Option<u32>,
) -> Unit {
    Unit {
        kind,
        name: r.record.name.clone(),
        id: r.record.id.clone(),
        dir: r.dir.clone(),
        command,
        stage,
        record: r.record.clone(),
        script: r.script.clone(),
        env: env.into_iter().collect(),
        array_throttle,
    }
}

/// The current state of every unit, with one scheduler query for the whole sweep.
pub fn statuses(units: &[Unit]) -> Result<Vec<Status>> {
    let records: Vec<(&RunRecord, &std::path::Path)> =
        units.iter().map(|u| (&u.record, u.dir.as_path())).collect();
    record_statuses(&records)
}

/// The same from run records and their directories alone.
pub fn record_statuses(records: &[(&RunRecord, &std::path::Path)]) -> Result<Vec<Status>> {
    let slurm_ids: Vec<&str> = records
        .iter()
        .filter_map(|(r, _)| r.last_job())
        .filter(|j| j.executor == ExecutorKind::Slurm)
        .map(|j| j.job_id.as_str())
        .collect();
    let slurm_states = if slurm_ids.is_empty() {
        HashMap::new()
    } else {
        slurm::query(&slurm_ids)?
    };
    Ok(records
        .iter()
        .map(|(r, dir)| match r.last_job() {
            None => Status::new(State::Unsubmitted),
            Some(j) => match j.executor {
                ExecutorKind::Local => local::status(dir, &j.job_id),
                ExecutorKind::Slurm => slurm_states
                    .get(j.job_id.as_str())
                    .cloned()
                    .unwrap_or_else(|| slurm::status_from_exit_file(dir, &j.job_id)),
            }
            .with_job(&j.job_id),
        })
        .collect())
}

#[derive(Debug, Clone, Copy, Default)]
pub struct SubmitOptions {
    pub retry_failed: bool,
    pub dry_run: bool,
}

/// What a submission decided for each unit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Decision {
    Submit,
    /// Completed, pending or running already.
    Skip(State),
    /// Failed earlier; `--retry-failed` would resubmit it.
    SkipFailed(State),
    /// Its stage failed and is not being retried.
    Blocked,
    /// A stage whose output already exists and is valid.
    Cached,
}

/// Decides what to submit: the idempotency rules in one place. `units` holds
/// the stages first, so stage `s` of the plan is unit `s`.
pub fn decide(
    units: &[Unit],
    status: &[Status],
    opts: SubmitOptions,
    stage_ready: impl Fn(&Unit) -> bool,
) -> Vec<Decision> {
    let mut d: Vec<Decision> = units
        .iter()
        .zip(status)
        .map(|(u, s)| match s.state {
            st if u.kind == UnitKind::Stage && !st.is_active() && stage_ready(u) => {
                Decision::Cached
            }
            State::Unsubmitted => Decision::Submit,
            st if st.is_active() || st == State::Completed => Decision::Skip(st),
            _ if opts.retry_failed => Decision::Submit,
            st => Decision::SkipFailed(st),
        })
        .collect();
    // A run whose stage failed (and is not retried) cannot run.
    for i in 0..units.len() {
        if let Some(s) = units[i].stage {
            if d[i] == Decision::Submit && matches!(d[s], Decision::SkipFailed(_)) {
                d[i] = Decision::Blocked;
            }
        }
    }
    // A stage is only worth running for runs that will run.
    for s in (0..units.len()).filter(|&i| units[i].kind == UnitKind::Stage) {
        let needed =
            (0..units.len()).any(|i| units[i].stage == Some(s) && d[i] == Decision::Submit);
        if d[s] == Decision::Submit && !needed {
            d[s] = Decision::Skip(status[s].state);
        }
    }
    d
}

/// The environment every job gets besides the manifest's variables.
pub fn job_env(unit: &Unit) -> Vec<(String, String)> {
    let mut env = vec![("SWEEP_RUN_DIR".to_string(), unit.dir.display().to_string())];
    env.extend(unit.env.iter().cloned());
    env
}

/// Cancels every pending or running job of the sweep.
pub fn cancel(units: &[Unit], status: &[Status]) -> Result<Vec<String>> {
    let mut slurm_ids = Vec::new();
    let mut cancelled = Vec::new();
    for (u, s) in units.iter().zip(status) {
        if !s.state.is_active() {
            continue;
        }
        let Some(job) = u.record.last_job() else {
            continue;
        };
        match job.executor {
            ExecutorKind::Slurm => slurm_ids.push(job.job_id.clone()),
            ExecutorKind::Local => {
                local::cancel(&u.dir).with_context(|| format!("cancelling {}", u.name))?
            }
        }
        cancelled.push(u.name.clone());
    }
    if !slurm_ids.is_empty() {
        slurm::cancel(&slurm_ids)?;
    }
    Ok(cancelled)
}
