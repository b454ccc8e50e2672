//! `run.json` (and `stage.json`): who a run is, where it came from, every job submitted for it.
//! The executors append job ids; rendering never drops them.

use crate::layout::{RUN_JSON, STAGE_JSON};
use crate::manifest::ExecutorKind;
use anyhow::{Context, Result};
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    pub executor: ExecutorKind,
    /// SLURM job id (`123` or `123_4` for an array task) or `local-<pid>`.
    pub job_id: String,
    pub submitted_at: String,
    /// The block whose packed job (`[slurm] pack`) runs this run as one of its steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<u32>,
    /// Written by the job itself when sweep's watchdog or launch doctor ended it: why, and where.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<Stop>,
}

/// How sweep's watchdog (HUNG) or launch doctor (FAILED) ended a job (docs/running.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stop {
    pub by: StoppedBy,
    /// One line: what ran out or failed, which ranks on which nodes.
    pub reason: String,
    /// The ranks that stopped first (the watchdog's).
    #[serde(default)]
    pub ranks: Vec<usize>,
    /// The nodes named: where those ranks ran, or the node that could not take part.
    #[serde(default)]
    pub nodes: Vec<String>,
    /// When (RFC 3339, milliseconds).
    pub at: String,
    /// The watchdog's: seconds without progress when its limit ran out, and that limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quiet_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_s: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoppedBy {
    Watchdog,
    LaunchDoctor,
}

/// Records in `run.json` that job `job_id` was stopped; `sweep` re-reads the record before
/// adding a job, so neither loses the other's.
pub fn record_stop(dir: &Path, job_id: &str, stop: Stop) -> Result<()> {
    let mut record = RunRecord::read(&dir.join(RUN_JSON), None)?
        .with_context(|| format!("{} has no run.json", dir.display()))?;
    let job = record
        .jobs
        .iter_mut()
        .rev()
        .find(|j| j.job_id == job_id)
        .with_context(|| format!("{}: run.json records no job {job_id}", dir.display()))?;
    job.stopped = Some(stop);
    crate::util::fs::write_atomic(&dir.join(RUN_JSON), &record.to_bytes())
}

/// Why job `job_id` was stopped, where its record says it was.
pub fn stop_of(dir: &Path, job_id: &str) -> Option<Stop> {
    let record = RunRecord::read(&dir.join(RUN_JSON), None).ok()??;
    record
        .jobs
        .into_iter()
        .rev()
        .find(|j| j.job_id == job_id)?
        .stopped
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ManifestRef {
    pub path: String,
    pub sha256: String,
}

/// What a study directory records of the manifest that last rendered it
/// ([`crate::layout::STUDY_JSON`]): its report settings and its own runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StudyRecord {
    /// The study directory it is written in (not written).
    #[serde(skip)]
    pub dir: std::path::PathBuf,
    /// The manifest (its path made absolute) and its version.
    pub manifest: ManifestRef,
    /// The manifest's `[report]` settings and axes.
    pub skip_first: usize,
    pub baseline: Option<String>,
    #[serde(default)]
    pub group_by: Vec<String>,
    #[serde(default)]
    pub axes: Vec<String>,
    /// The ids of the runs it plans.
    pub runs: Vec<String>,
    /// A `command` study's whole `[report]`: how its logs are read and its FLOPs computed.
    #[serde(default)]
    pub command_report: Option<crate::manifest::ReportSpec>,
    /// The study's current attempt (`sweep run --again` counts them).
    #[serde(default = "first_attempt")]
    pub attempt: u32,
    /// The current attempt's id: its runs carry it, and the history pools them by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_id: Option<String>,
    /// A blocked design's seed (`[sweep] order_seed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order_seed: Option<u64>,
}

impl StudyRecord {
    pub fn of(plan: &super::Plan, attempt: u32, attempt_id: String) -> StudyRecord {
        let m = &plan.manifest;
        let path = crate::util::fs::absolute(&std::env::current_dir().unwrap_or_default(), &m.path);
        StudyRecord {
            dir: plan.study_dir.clone(),
            manifest: ManifestRef {
                path: path.display().to_string(),
                sha256: m.sha256.clone(),
            },
            skip_first: m.report.skip_first,
            baseline: m.report.baseline.clone(),
            group_by: m.report.group_by.clone(),
            axes: m.axis_keys().map(str::to_string).collect(),
            runs: plan.runs.iter().map(|r| r.id.clone()).collect(),
            command_report: matches!(m.mode, crate::manifest::Mode::Command(_))
                .then(|| m.report.clone()),
            attempt,
            attempt_id: Some(attempt_id),
            order_seed: (m.design == crate::manifest::Design::Blocks).then_some(m.order_seed),
        }
    }

    /// A study directory's `study.json`; `None` where it has none.
    pub fn load(study_dir: &Path) -> Result<Option<StudyRecord>> {
        use crate::util::fs::{read_regular, ReadError};
        let path = study_dir.join(crate::layout::STUDY_JSON);
        match read_regular(&path, MAX_RECORD_BYTES, Some(study_dir)) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(|r| {
                    Some(StudyRecord {
                        dir: study_dir.to_path_buf(),
                        ..r
                    })
                })
                .with_context(|| format!("{} is not a valid study record", path.display())),
            Err(ReadError::NotFound) => Ok(None),
            Err(e) => Err(anyhow::anyhow!("{} {e}", path.display())),
        }
    }
}

/// A training (or any-command) run, or a stage job that runs wait for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum UnitKind {
    Stage,
    Run,
}

impl UnitKind {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// The record file of a directory of this kind.
    pub fn record_file(self) -> &'static str {
        match self {
            UnitKind::Stage => STAGE_JSON,
            UnitKind::Run => RUN_JSON,
        }
    }
}

/// What a run is a repeat of: its repeats' shared configuration id and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Configuration {
    pub id: String,
    pub name: String,
}

/// Where a run stands in a blocked design: its block (the repeat) and its place in the block's
/// order, both from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DesignSlot {
    pub block: u32,
    pub position: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub id: String,
    pub name: String,
    pub study: String,
    pub kind: UnitKind,
    pub manifest: ManifestRef,
    pub git_commit: Option<String>,
    pub sweep_version: String,
    pub created_at: String,
    pub params: IndexMap<String, serde_json::Value>,
    /// Runs only; records written before it was recorded have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration: Option<Configuration>,
    /// The stage this run waits for (its directory name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depends_on: Option<String>,
    /// What the run's id hashes ([`super::identity`]; runs only, identity version 2 on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<serde_json::Value>,
    #[serde(default)]
    pub jobs: Vec<JobRecord>,
    /// Which measurement of the study this is: 1, then one more each `sweep run --again`.
    #[serde(default = "first_attempt")]
    pub attempt: u32,
    /// The manifest's `[environment]`, for the job's `sweep fingerprint`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<crate::manifest::EnvironmentSpec>,
    /// Its block and place in a blocked design (runs only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<DesignSlot>,
    /// This run's measurement id, drawn when its directory is made afresh: the history records
    /// each once (a copied study records nothing twice).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_id: Option<String>,
    /// The study attempt it was rendered in: the runs the history pools as one attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub study_attempt_id: Option<String>,
}

fn first_attempt() -> u32 {
    1
}

/// The largest `run.json` read (a record of thousands of requeues is ~1 MB).
const MAX_RECORD_BYTES: u64 = 64 << 20;

impl RunRecord {
    /// The `run.json` of a directory inside `study`: `None` where it has none; an error where it
    /// is not a regular file inside `study` or not a record.
    pub fn load_within(dir: &Path, study: &Path) -> Result<Option<RunRecord>> {
        Self::read(&dir.join(RUN_JSON), Some(study))
    }

    /// A record file (`run.json`, `stage.json`); `None` where there is none.
    pub fn read(path: &Path, within: Option<&Path>) -> Result<Option<RunRecord>> {
        use crate::util::fs::{read_regular, ReadError};
        match read_regular(path, MAX_RECORD_BYTES, within) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .with_context(|| format!("{} is not a valid run record", path.display())),
            Err(ReadError::NotFound) => Ok(None),
            Err(e) => Err(anyhow::anyhow!("{} {e}", path.display())),
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).expect("a run record serialises");
        v.push(b'\n');
        v
    }

    pub fn last_job(&self) -> Option<&JobRecord> {
        self.jobs.last()
    }

    /// The run's measurement id and its attempt's, as the history keys them.
    pub fn attempt_ids(&self) -> (String, String) {
        let derived = |text: String| {
            format!(
                "derived-{}",
                &crate::util::hash::sha256_bytes(text.as_bytes())[..24]
            )
        };
        let run = self.attempt_id.clone().unwrap_or_else(|| {
            let job = self.jobs.first();
            derived(format!(
                "{}\n{}\n{}\n{}",
                self.id,
                self.created_at,
                job.map_or("", |j| j.job_id.as_str()),
                job.map_or("", |j| j.submitted_at.as_str())
            ))
        });
        let study = self
            .study_attempt_id
            .clone()
            .unwrap_or_else(|| derived(format!("{}\n{}", self.study, self.attempt)));
        (run, study)
    }
}

/// The words of a job's record file (`exit_code`, `cancelled`) when it names `job_id`.
pub fn job_record(dir: &Path, file: &str, job_id: &str) -> Option<Vec<String>> {
    // A record is a line; anything longer is not one of ours.
    let bytes = crate::util::fs::read_regular(&dir.join(file), 4096, None).ok()?;
    let text = String::from_utf8(bytes).ok()?;
    let words: Vec<String> = text.split_whitespace().map(str::to_string).collect();
    (words.first()? == job_id).then_some(words)
}

/// The exit status job `job_id`'s shell recorded (`exit_code`), if it did.
pub fn exit_status(dir: &Path, job_id: &str) -> Option<i32> {
    job_record(dir, crate::layout::EXIT_CODE, job_id)?
        .get(1)?
        .parse()
        .ok()
}

/// A new attempt id: 128 random bits in hex.
pub fn new_attempt_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}
