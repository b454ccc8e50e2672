//! Runs -> jobs. Two executors share one state model: SLURM and local. Submission is
//! idempotent: completed, pending or running runs are never submitted again; interrupted ones
//! are (they continue); failed ones only with `--retry-failed`.

pub mod doctor;
pub mod ended;
pub mod fingerprint;
pub mod local;
pub mod mpirun;
pub mod packed;
mod sbatch;
mod scripts;
pub mod slurm;
mod state;
pub mod watchdog;

pub use state::{State, Status};

use crate::manifest::ExecutorKind;
use crate::manifest::Launcher;
use crate::plan::launch::Launch;
pub use crate::plan::record::UnitKind;
use crate::plan::record::{JobRecord, RunRecord};
use crate::plan::render::{Rendered, RenderedDir};
use crate::plan::Plan;
use anyhow::Result;
use serde::Serialize;
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
    /// Its `[slurm]` settings: variables, array throttle, a packed block's allocation.
    pub slurm: crate::manifest::SlurmSpec,
    /// The block this run is packed into (`[slurm] pack`).
    pub pack: Option<u32>,
    /// How the local executor starts its processes, or why it cannot.
    pub local: Result<Launch, String>,
}

impl Unit {
    pub fn record_file(&self) -> PathBuf {
        self.dir.join(self.kind.record_file())
    }

    /// Appends a submitted job to the unit's record, on disk at once.
    pub fn record_job(&mut self, executor: ExecutorKind, job_id: String) -> Result<()> {
        self.record_job_in(executor, job_id, None)
    }

    /// [`Unit::record_job`] for a job running it as a step of a packed `block`, or alone.
    pub fn record_job_in(
        &mut self,
        executor: ExecutorKind,
        job_id: String,
        block: Option<u32>,
    ) -> Result<()> {
        // Re-read: another process (a job's own requeue, a parallel submit) may have written.
        let path = self.record_file();
        if let Ok(bytes) = crate::util::fs::read_regular(&path, 64 << 20, None) {
            if let Ok(r) = serde_json::from_slice::<RunRecord>(&bytes) {
                self.record = r;
            }
        }
        self.record.jobs.push(JobRecord {
            executor,
            job_id,
            submitted_at: crate::util::now_rfc3339(),
            block,
            stopped: None,
        });
        crate::util::fs::write_atomic(&path, &self.record.to_bytes())
    }
}

/// Stages first, then runs, in plan order.
pub fn units(plan: &Plan, rendered: &Rendered) -> Vec<Unit> {
    let bin = &plan.sweep_bin;
    let mut out = Vec::new();
    for (s, r) in plan.stages.iter().zip(&rendered.stages) {
        let command = s.command(bin);
        let line = crate::template::launch_line(&command);
        let local = Ok(Launch::new(Launcher::None, 1, 1, &line));
        out.push(unit(
            UnitKind::Stage,
            r,
            command,
            None,
            &s.slurm,
            None,
            local,
        ));
    }
    for (run, r) in plan.runs.iter().zip(&rendered.runs) {
        out.push(unit(
            UnitKind::Run,
            r,
            run.command(bin),
            run.stage,
            &run.slurm,
            run.block.filter(|_| run.slurm.pack).map(|b| b.block),
            run.launch_on(ExecutorKind::Local, bin),
        ));
    }
    out
}

fn unit(
    kind: UnitKind,
    r: &RenderedDir,
    command: String,
    stage: Option<usize>,
    slurm: &crate::manifest::SlurmSpec,
    pack: Option<u32>,
    local: Result<Launch, String>,
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
        slurm: slurm.clone(),
        pack,
        local,
    }
}

/// What an executor reports while it submits or runs jobs.
#[derive(Debug)]
pub enum Event<'a> {
    /// A job went to the scheduler (or would have, on a dry run).
    Submitted(&'a slurm::Sbatch),
    /// On a dry run of the local executor: the program a unit would run.
    WouldRun { name: &'a str, command: &'a str },
    /// A local job started.
    Started(&'a local::Outcome),
    /// A local job ended.
    Ended(&'a local::Outcome),
    /// About once a second while local jobs run (for a live view).
    Tick,
}

/// How a submission ended.
#[derive(Debug, Default)]
pub struct Submitted {
    /// The jobs that ran here, as they ended (local executor).
    pub outcomes: Vec<local::Outcome>,
    /// The stop signal (Ctrl-C, SIGTERM, SIGHUP) that ended the local jobs early.
    pub interrupted: Option<i32>,
    /// The units SLURM would not take yet, if it refused some.
    pub held: Option<Held>,
}

/// Units held back: SLURM refused more jobs for a `MaxSubmitJobs` limit (each array task
/// counts). They stay unsubmitted until jobs have ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Held {
    /// The limit SLURM named (`QOSMaxSubmitJobPerUserLimit`).
    pub reason: String,
    /// The units not submitted, by index.
    pub units: Vec<usize>,
}

/// Where jobs run: `submit` sends or runs the units `decisions` marks; `statuses` and `cancel`
/// act on jobs by id and run directory.
pub trait Executor {
    fn submit(
        &self,
        study_dir: &std::path::Path,
        units: &mut [Unit],
        decisions: &[Decision],
        dry_run: bool,
        on: &mut dyn FnMut(Event<'_>),
    ) -> Result<Submitted>;

    /// The state of each job (job id, run directory), with one scheduler query for all.
    fn statuses(&self, jobs: &[(&str, &std::path::Path)]) -> Result<Vec<Status>>;

    fn cancel(&self, jobs: &[(&str, &std::path::Path)]) -> Result<()>;
}

/// The executor of a kind; `local` runs jobs with these options.
pub fn for_kind(kind: ExecutorKind, local: local::LocalOptions) -> Box<dyn Executor> {
    match kind {
        ExecutorKind::Slurm => Box::new(slurm::SlurmExecutor),
        ExecutorKind::Local => Box::new(local::LocalExecutor(local)),
    }
}

/// Groups `records` by the executor of their last job and calls `f` once per executor.
fn by_executor<T>(
    records: &[(&RunRecord, &std::path::Path)],
    mut f: impl FnMut(&dyn Executor, &[usize], &[(&str, &std::path::Path)]) -> Result<T>,
) -> Result<Vec<T>> {
    let mut out = Vec::new();
    for kind in [ExecutorKind::Slurm, ExecutorKind::Local] {
        let (idx, jobs): (Vec<usize>, Vec<(&str, &std::path::Path)>) = records
            .iter()
            .enumerate()
            .filter_map(|(i, (r, dir))| {
                let j = r.last_job()?;
                (j.executor == kind).then_some((i, (j.job_id.as_str(), *dir)))
            })
            .unzip();
        if !idx.is_empty() {
            let exec = for_kind(kind, local::LocalOptions::default());
            out.push(f(exec.as_ref(), &idx, &jobs)?);
        }
    }
    Ok(out)
}

/// The current state of every unit, with one scheduler query for the whole sweep.
pub fn statuses(units: &[Unit]) -> Result<Vec<Status>> {
    let records: Vec<(&RunRecord, &std::path::Path)> =
        units.iter().map(|u| (&u.record, u.dir.as_path())).collect();
    record_statuses(&records)
}

/// The same from run records and their directories alone.
pub fn record_statuses(records: &[(&RunRecord, &std::path::Path)]) -> Result<Vec<Status>> {
    let mut out = vec![Status::new(State::Unsubmitted); records.len()];
    by_executor(records, |exec, idx, jobs| {
        for ((&i, s), (job, dir)) in idx.iter().zip(exec.statuses(jobs)?).zip(jobs) {
            // The scheduler knows a packed block's job; the run's directory says where the block is.
            out[i] = match records[i].0.last_job().and_then(|j| j.block) {
                Some(b) => packed::run_status(&s, dir, job, b),
                None => s.with_job(job),
            };
        }
        Ok(())
    })?;
    Ok(out)
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

/// Decides what to submit: the idempotency rules in one place (stage `s` is unit `s`).
pub fn decide(
    units: &[Unit],
    status: &[Status],
    retry_failed: bool,
    stage_ready: impl Fn(&Unit) -> bool,
) -> Vec<Decision> {
    let mut d: Vec<Decision> = units
        .iter()
        .zip(status)
        .map(|(u, s)| match s.state {
            st if u.kind == UnitKind::Stage && !st.is_active() && stage_ready(u) => {
                Decision::Cached
            }
            // A stage that completed but whose output is gone or stale runs again.
            State::Completed if u.kind == UnitKind::Stage => Decision::Submit,
            // Never submitted, or stopped by an interrupt (not a failure).
            st if st.is_due() => Decision::Submit,
            st if st.is_active() || st == State::Completed => Decision::Skip(st),
            _ if retry_failed => Decision::Submit,
            st => Decision::SkipFailed(st),
        })
        .collect();
    block_runs_of_failed_stages(units, &mut d);
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

/// A run whose stage failed (and is not retried) cannot run.
fn block_runs_of_failed_stages(units: &[Unit], d: &mut [Decision]) {
    for i in 0..units.len() {
        if let Some(s) = units[i].stage {
            if d[i] == Decision::Submit && matches!(d[s], Decision::SkipFailed(_)) {
                d[i] = Decision::Blocked;
            }
        }
    }
}

/// Once jobs have ended: the held units are submitted (a run whose stage failed is blocked);
/// every other unit is left as it is.
pub fn decide_held(units: &[Unit], status: &[Status], held: &Held) -> Vec<Decision> {
    let mut d: Vec<Decision> = status
        .iter()
        .map(|s| match s.state {
            st if st.is_active() || st.is_due() || st == State::Completed => Decision::Skip(st),
            st => Decision::SkipFailed(st),
        })
        .collect();
    for &i in &held.units {
        d[i] = Decision::Submit;
    }
    block_runs_of_failed_stages(units, &mut d);
    d
}

/// The environment every local job gets before the manifest's variables (which win).
pub fn job_env(unit: &Unit) -> Vec<(String, String)> {
    let mut env = vec![("SWEEP_RUN_DIR".to_string(), unit.dir.display().to_string())];
    // Python block-buffers output into a file: progress would reach the log minutes apart and
    // the watchdog would call the run hung. Unbuffered, unless the environment says otherwise.
    if std::env::var_os("PYTHONUNBUFFERED").is_none() {
        env.push(("PYTHONUNBUFFERED".to_string(), "1".to_string()));
    }
    env.extend(unit.slurm.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}

/// Cancels every pending or running job of the sweep; returns their units' names.
pub fn cancel(units: &[Unit], status: &[Status]) -> Result<Vec<String>> {
    let active: Vec<&Unit> = units
        .iter()
        .zip(status)
        .filter(|(_, s)| s.state.is_active())
        .map(|(u, _)| u)
        .collect();
    let records: Vec<(&RunRecord, &std::path::Path)> = active
        .iter()
        .map(|u| (&u.record, u.dir.as_path()))
        .collect();
    let names = by_executor(&records, |exec, idx, jobs| {
        exec.cancel(jobs)?;
        Ok(idx
            .iter()
            .map(|&i| active[i].name.clone())
            .collect::<Vec<_>>())
    })?;
    Ok(names.into_iter().flatten().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::record::ManifestRef;

    fn unit(kind: UnitKind, name: &str, stage: Option<usize>) -> Unit {
        Unit {
            kind,
            name: name.into(),
            id: name.into(),
            dir: PathBuf::from("/nonexistent").join(name),
            command: "true".into(),
            stage,
            record: RunRecord {
                id: name.into(),
                name: name.into(),
                study: "s".into(),
                kind,
                manifest: ManifestRef {
                    path: "m.toml".into(),
                    sha256: "0".into(),
                },
                git_commit: None,
                sweep_version: "0".into(),
                created_at: "2026-01-01T00:00:00Z".into(),
                params: Default::default(),
                attempt: 1,
                environment: None,
                block: None,
                configuration: None,
                depends_on: None,
                identity: None,
                jobs: Vec::new(),
                attempt_id: None,
                study_attempt_id: None,
            },
            script: String::new(),
            slurm: Default::default(),
            pack: None,
            local: Ok(Launch::new(Launcher::None, 1, 1, "true")),
        }
    }

    const ALL_STATES: [State; 13] = [
        State::Unsubmitted,
        State::Pending,
        State::Running,
        State::Completed,
        State::Failed,
        State::Cancelled,
        State::Timeout,
        State::OutOfMemory,
        State::Preempted,
        State::NodeFail,
        State::Hung,
        State::Interrupted,
        State::Unknown,
    ];

    /// A run on its own, for every state, with and without `--retry-failed`.
    #[test]
    fn a_run_is_submitted_skipped_or_retried_by_its_state() {
        use Decision::*;
        // (state, decision, decision with --retry-failed)
        let table = [
            (State::Unsubmitted, Submit, Submit),
            (State::Pending, Skip(State::Pending), Skip(State::Pending)),
            (State::Running, Skip(State::Running), Skip(State::Running)),
            (
                State::Completed,
                Skip(State::Completed),
                Skip(State::Completed),
            ),
            (State::Failed, SkipFailed(State::Failed), Submit),
            (State::Cancelled, SkipFailed(State::Cancelled), Submit),
            (State::Timeout, SkipFailed(State::Timeout), Submit),
            (State::OutOfMemory, SkipFailed(State::OutOfMemory), Submit),
            (State::Preempted, SkipFailed(State::Preempted), Submit),
            (State::NodeFail, SkipFailed(State::NodeFail), Submit),
            (State::Hung, SkipFailed(State::Hung), Submit),
            (State::Interrupted, Submit, Submit),
            (State::Unknown, SkipFailed(State::Unknown), Submit),
        ];
        assert_eq!(table.len(), ALL_STATES.len(), "every state has a row");
        let units = [unit(UnitKind::Run, "r", None)];
        for (state, plain, retry) in table {
            let status = [Status::new(state)];
            for (retry_failed, want) in [(false, plain.clone()), (true, retry)] {
                let got = decide(&units, &status, retry_failed, |_| false);
                assert_eq!(got, vec![want], "{state} retry_failed={retry_failed}");
            }
        }
    }

    /// Once jobs have ended, only what SLURM held back goes out: a run that
    /// failed meanwhile is not retried, one whose stage failed is blocked,
    /// one whose stage is cached, going or held too goes.
    #[test]
    fn only_the_held_units_go_out_when_room_frees() {
        use Decision::*;
        let units = [
            unit(UnitKind::Stage, "stage", None),
            unit(UnitKind::Run, "a", Some(0)),
            unit(UnitKind::Run, "b", Some(0)),
            unit(UnitKind::Run, "c", None),
            unit(UnitKind::Run, "d", None),
        ];
        let held = Held {
            reason: "QOSMaxSubmitJobPerUserLimit".into(),
            units: vec![2, 4],
        };
        let at = |stage: State| {
            let states = [
                stage,
                State::Running,
                State::Unsubmitted,
                State::Failed,
                State::Unsubmitted,
            ];
            let status: Vec<Status> = states.into_iter().map(Status::new).collect();
            decide_held(&units, &status, &held)
        };
        for stage in [State::Running, State::Completed, State::Unsubmitted] {
            assert_eq!(
                at(stage),
                [
                    Skip(stage),
                    Skip(State::Running),
                    Submit,
                    SkipFailed(State::Failed),
                    Submit
                ],
                "stage {stage}"
            );
        }
        assert_eq!(at(State::Failed)[2], Blocked);
        let both = Held {
            units: vec![0, 2],
            ..held.clone()
        };
        let status: Vec<Status> = [State::Unsubmitted; 5]
            .into_iter()
            .map(Status::new)
            .collect();
        assert_eq!(
            decide_held(&units, &status, &both)[..3],
            [Submit, Skip(State::Unsubmitted), Submit]
        );
    }

    /// A stage and the run that waits for it: a valid cached output is never
    /// rerun; a stage is only submitted for runs that will run; a run whose
    /// stage failed is blocked unless the stage is retried.
    #[test]
    fn a_stage_runs_only_for_runs_that_need_it() {
        use Decision::*;
        let units = [
            unit(UnitKind::Stage, "stage", None),
            unit(UnitKind::Run, "run", Some(0)),
        ];
        let (plain, retry) = (false, true);
        // (stage state, run state, stage output valid, retry failed, decisions)
        let table = [
            (
                State::Unsubmitted,
                State::Unsubmitted,
                false,
                plain,
                [Submit, Submit],
            ),
            (
                State::Unsubmitted,
                State::Unsubmitted,
                true,
                plain,
                [Cached, Submit],
            ),
            (
                State::Completed,
                State::Unsubmitted,
                true,
                plain,
                [Cached, Submit],
            ),
            // The output is gone: the stage runs again for the run.
            (
                State::Completed,
                State::Unsubmitted,
                false,
                plain,
                [Submit, Submit],
            ),
            (
                State::Completed,
                State::Completed,
                false,
                plain,
                [Skip(State::Completed), Skip(State::Completed)],
            ),
            (
                State::Unsubmitted,
                State::Completed,
                false,
                plain,
                [Skip(State::Unsubmitted), Skip(State::Completed)],
            ),
            (
                State::Running,
                State::Pending,
                false,
                plain,
                [Skip(State::Running), Skip(State::Pending)],
            ),
            (
                State::Failed,
                State::Unsubmitted,
                false,
                plain,
                [SkipFailed(State::Failed), Blocked],
            ),
            (
                State::Failed,
                State::Cancelled,
                false,
                retry,
                [Submit, Submit],
            ),
            (
                State::Failed,
                State::Completed,
                false,
                retry,
                [Skip(State::Failed), Skip(State::Completed)],
            ),
        ];
        for (stage, run, ready, retry_failed, want) in table {
            let status = [Status::new(stage), Status::new(run)];
            let got = decide(&units, &status, retry_failed, |_| ready);
            assert_eq!(
                got,
                want.to_vec(),
                "stage {stage}, run {run}, output valid {ready}, retry failed {retry_failed}"
            );
        }
    }
}
