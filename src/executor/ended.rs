//! How a job ended, as its run directory tells it when nobody watched it end
//! (the `sweep` that ran it was killed, SLURM forgot the job): `exit_code`,
//! written by the job's own shell as it exits (`<job id> <$?>`, by both
//! executors), and `cancelled`, written by `sweep cancel` for the job it
//! cancelled. Each names its job, so a record left by an earlier attempt is
//! never taken for the current one.

use super::{State, Status};
use crate::plan::record::{exit_status, job_record, StoppedBy};
use crate::util::fs::write_atomic;
use anyhow::Result;
use std::path::Path;

/// The job shell's exit status: `<job id> <$?>`.
pub use crate::layout::EXIT_CODE;
/// The job `sweep cancel` cancelled: `<job id>`.
pub const CANCELLED: &str = "cancelled";

/// How job `job_id` ended, from its directory alone; `None` when it left no
/// record (it has not ended, or was killed with its shell).
pub fn recorded(dir: &Path, job_id: &str) -> Option<Status> {
    let cancelled = job_record(dir, CANCELLED, job_id).is_some();
    let exited = exit_status(dir, job_id).map(Status::from_shell);
    let status = match exited {
        // A job that ended anyway after the cancel (or completed before it
        // took effect) keeps what it did.
        Some(s) if !cancelled || s.state == State::Completed => s,
        Some(s) => Status {
            state: State::Cancelled,
            ..s
        },
        None if cancelled => Status::new(State::Cancelled)
            .with_reason("cancelled by `sweep cancel` before it started"),
        None => return None,
    };
    Some(explain(dir, job_id, status.with_job(job_id)))
}

/// Whether `sweep cancel` cancelled a job of the run in `dir` at or after
/// `since`.
pub fn cancelled_since(dir: &Path, since: std::time::SystemTime) -> bool {
    std::fs::metadata(dir.join(CANCELLED))
        .and_then(|m| m.modified())
        .is_ok_and(|t| t >= since)
}

/// A job the watchdog or the launch doctor ended, with their reason (and
/// state) from its record in `run.json`; any other status as it is.
pub fn explain(dir: &Path, job_id: &str, status: Status) -> Status {
    use crate::config::{HUNG_EXIT, LAUNCH_EXIT};
    let ours = matches!(status.exit_code, Some(HUNG_EXIT | LAUNCH_EXIT));
    if !ours && status.state != State::Hung {
        return status;
    }
    match crate::plan::record::stop_of(dir, job_id) {
        Some(s) => Status {
            state: match s.by {
                StoppedBy::Watchdog => State::Hung,
                StoppedBy::LaunchDoctor => State::Failed,
            },
            reason: Some(s.reason),
            ..status
        },
        None => status,
    }
}

/// Records that `sweep cancel` cancelled job `job_id` of the run in `dir`.
pub fn mark_cancelled(dir: &Path, job_id: &str) -> Result<()> {
    write_atomic(&dir.join(CANCELLED), format!("{job_id}\n").as_bytes())
}

/// Removes the exit record of an earlier job before a new one starts.
pub fn clear(dir: &Path) -> Result<()> {
    match std::fs::remove_file(dir.join(EXIT_CODE)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(anyhow::anyhow!(
            "removing {}: {e}",
            dir.join(EXIT_CODE).display()
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_counts_only_for_the_job_it_names() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert_eq!(recorded(d, "7"), None);
        std::fs::write(d.join(EXIT_CODE), "7 3\n").unwrap();
        assert_eq!(recorded(d, "7").unwrap().describe(), "FAILED (exit 3)");
        assert_eq!(recorded(d, "8"), None, "an earlier job's record");
        std::fs::write(d.join(EXIT_CODE), "7 0\n").unwrap();
        mark_cancelled(d, "7").unwrap();
        assert_eq!(recorded(d, "7").unwrap().state, State::Completed);
        std::fs::write(d.join(EXIT_CODE), "7 143\n").unwrap();
        assert_eq!(
            recorded(d, "7").unwrap().describe(),
            "CANCELLED (signal 15)"
        );
        clear(d).unwrap();
        clear(d).unwrap();
        let s = recorded(d, "7").unwrap();
        assert_eq!(s.state, State::Cancelled);
        assert!(
            s.describe().contains("before it started"),
            "{}",
            s.describe()
        );
        // Garbage is no record.
        std::fs::write(d.join(CANCELLED), "x".repeat(10_000)).unwrap();
        std::fs::write(d.join(EXIT_CODE), "7 three\n").unwrap();
        assert_eq!(recorded(d, "7"), None);
    }
}
