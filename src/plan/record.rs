//! `run.json` (and `stage.json`): who a run is, where it came from, and every
//! job that was submitted for it. The executors append job ids; rendering
//! never drops them.

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
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ManifestRef {
    pub path: String,
    pub sha256: String,
}

/// A training (or any-command) run, or a stage job that runs wait for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnitKind {
    Stage,
    Run,
}

impl UnitKind {
    pub fn as_str(self) -> &'static str {
        match self {
            UnitKind::Stage => "stage",
            UnitKind::Run => "run",
        }
    }

    /// The record file of a directory of this kind.
    pub fn record_file(self) -> &'static str {
        match self {
            UnitKind::Stage => super::render::STAGE_JSON,
            UnitKind::Run => RUN_JSON,
        }
    }
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
    /// The stage this run waits for (its directory name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depends_on: Option<String>,
    #[serde(default)]
    pub jobs: Vec<JobRecord>,
}

pub const RUN_JSON: &str = "run.json";

impl RunRecord {
    pub fn load(dir: &Path) -> Result<Option<RunRecord>> {
        let path = dir.join(RUN_JSON);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .with_context(|| format!("{} is not a valid run record", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).expect("a run record serialises");
        v.push(b'\n');
        v
    }

    pub fn save(&self, dir: &Path) -> Result<()> {
        crate::util::fs::write_if_changed(&dir.join(RUN_JSON), &self.to_bytes()).map(|_| ())
    }

    pub fn last_job(&self) -> Option<&JobRecord> {
        self.jobs.last()
    }
}
