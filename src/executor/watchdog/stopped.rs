//! `stopped.json`: a run that sweep's own job-side tools ended, and why —
//! the watchdog (HUNG: which ranks and nodes stopped first) or the launch
//! doctor (FAILED: which node could not do what). It names its job, as
//! `exit_code` does, so that a record of an earlier attempt never explains
//! a later one; its nodes are what `--retry-failed` leaves out on SLURM.

use crate::executor::State;
use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stopped {
    /// The job, as `exit_code` names it.
    pub job: String,
    /// "watchdog" or "launch doctor".
    pub by: String,
    pub state: State,
    /// One line: what ran out, which ranks on which nodes.
    pub reason: String,
    #[serde(default)]
    pub ranks: Vec<usize>,
    /// The nodes named: where the ranks that stopped first ran, or the node
    /// that could not take part.
    #[serde(default)]
    pub nodes: Vec<String>,
    /// When it stopped the run (RFC 3339, milliseconds).
    pub at: String,
    /// The watchdog's: seconds without progress when it stopped the run
    /// (since the start, for the startup limit), and the limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quiet_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_s: Option<u64>,
}

pub fn write(run_dir: &Path, s: &Stopped) -> Result<()> {
    let mut bytes = serde_json::to_vec_pretty(s)?;
    bytes.push(b'\n');
    crate::util::fs::write_atomic(&run_dir.join(crate::layout::STOPPED_JSON), &bytes)
}

/// The record of job `job`, if that job left one; `None` for any other
/// job's, and for a file that is not a record (the job's state then stands
/// without this reason).
pub fn read(run_dir: &Path, job: &str) -> Option<Stopped> {
    read_any(run_dir).filter(|s| s.job == job)
}

/// The last record in the directory, whichever job wrote it.
pub fn read_any(run_dir: &Path) -> Option<Stopped> {
    let path = run_dir.join(crate::layout::STOPPED_JSON);
    let bytes = crate::util::fs::read_regular(&path, 1 << 20, None).ok()?;
    serde_json::from_slice(&bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_explains_only_its_own_job() {
        let d = tempfile::tempdir().unwrap();
        let s = Stopped {
            job: "12".into(),
            by: "watchdog".into(),
            state: State::Hung,
            reason: "no progress".into(),
            ranks: vec![1],
            nodes: vec!["node2".into()],
            at: "now".into(),
            quiet_s: Some(3.5),
            limit_s: Some(3),
        };
        write(d.path(), &s).unwrap();
        assert_eq!(read(d.path(), "12"), Some(s));
        assert_eq!(read(d.path(), "13"), None);
        std::fs::write(d.path().join(crate::layout::STOPPED_JSON), "{").unwrap();
        assert_eq!(read_any(d.path()), None);
    }
}
