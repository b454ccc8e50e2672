//! Packed blocks on SLURM (`[slurm] pack = true`): a block's runs as job
//! steps of one allocation, one after another, each in its own run
//! directory; and each run's state from its block job's and what its
//! directory records (the scheduler knows the block, not its runs).

use super::ended::{self, EXIT_CODE};
use super::{State, Status};

use std::path::Path;
use std::time::SystemTime;

/// `<job id>`: the packed job that started the run (written by the block's
/// script before the run's step starts).
pub const STARTED: &str = "started";

/// When job `job_id` started the run in `dir` (its `started` record).
fn started(dir: &Path, job_id: &str) -> Option<SystemTime> {
    let path = dir.join(STARTED);
    let bytes = crate::util::fs::read_regular(&path, 4096, None).ok()?;
    let named = String::from_utf8(bytes).ok()?;
    (named.trim() == job_id)
        .then(|| path.metadata().and_then(|m| m.modified()).ok())
        .flatten()
}

/// The state of the run in `dir` that packed job `job_id` (block `block`)
/// runs as one of its steps, from the block job's state (`of_block`) and
/// the run's records: its own end once it has one; while the block runs,
/// running once started, else waiting its turn; a block that ended before
/// the run ended takes the run with it (cancelled, timed out, node lost).
pub fn run_status(of_block: &Status, dir: &Path, job_id: &str, block: u32) -> Status {
    let own = ended::recorded(dir, job_id);
    let start = started(dir, job_id);
    let status = match (of_block.state, own) {
        // A run that completed stays completed, whatever the block does next.
        (_, Some(s)) if s.state == State::Completed => s,
        // Requeued, or not started yet: its earlier try's end does not count.
        (State::Pending, _) => Status::new(State::Pending).with_reason(format!(
            "block {block}: {}",
            of_block
                .reason
                .as_deref()
                .unwrap_or("the block's job is pending")
        )),
        (State::Running, Some(s)) => s,
        (State::Running, None) if start.is_some() => Status::new(State::Running),
        (State::Running, None) => Status::new(State::Pending)
            .with_reason(format!("block {block}: waiting for its turn in the block")),
        // The block ended: how it ended explains a run killed with it.
        (end, Some(s)) if s.signal.is_some() && ends_runs(end) => Status { state: end, ..s },
        (_, Some(s)) => s,
        (end, None) if start.is_some() => {
            Status::new(if ends_runs(end) { end } else { State::Unknown }).with_reason(format!(
                "block {block} ended ({end}) while it ran, and it left no exit code"
            ))
        }
        (end, None) => Status::new(if ends_runs(end) { end } else { State::Unknown })
            .with_reason(format!("block {block} ended ({end}) before it started")),
    };
    let run_s = match (start, status.state.is_active()) {
        (Some(t0), false) => dir
            .join(EXIT_CODE)
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t1| t1.duration_since(t0).ok())
            .map(|d| d.as_secs()),
        _ => None,
    };
    Status { run_s, ..status }.with_job(job_id)
}

/// A block's end that ends the run it was running (or had yet to run).
fn ends_runs(state: State) -> bool {
    matches!(
        state,
        State::Cancelled | State::Timeout | State::NodeFail | State::Preempted | State::OutOfMemory
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(state: State) -> Status {
        Status::new(state).with_job("9")
    }

    #[test]
    fn a_packed_runs_state_comes_from_its_records_within_the_blocks() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        let st = |b: State| run_status(&block(b), d, "9", 2);
        // Not started: pending while the block waits or runs.
        assert_eq!(st(State::Pending).state, State::Pending);
        let waiting = st(State::Running);
        assert_eq!(waiting.state, State::Pending);
        assert!(
            waiting.describe().contains("its turn in the block"),
            "{}",
            waiting.describe()
        );
        // The block was cancelled before the run started.
        let c = st(State::Cancelled);
        assert_eq!(c.state, State::Cancelled);
        assert!(
            c.describe().contains("before it started"),
            "{}",
            c.describe()
        );
        // Started by this job (another job's record does not count).
        std::fs::write(d.join(STARTED), "8\n").unwrap();
        assert_eq!(st(State::Running).state, State::Pending);
        std::fs::write(d.join(STARTED), "9\n").unwrap();
        assert_eq!(st(State::Running).state, State::Running);
        assert_eq!(st(State::Timeout).state, State::Timeout);
        // Its own end decides; killed by the block's end, it takes the block's.
        std::fs::write(d.join(EXIT_CODE), "9 3\n").unwrap();
        assert_eq!(st(State::Running).describe(), "FAILED (exit 3)");
        assert_eq!(st(State::Completed).describe(), "FAILED (exit 3)");
        assert_eq!(
            st(State::Pending).state,
            State::Pending,
            "requeued: it runs again"
        );
        std::fs::write(d.join(EXIT_CODE), "9 143\n").unwrap();
        assert_eq!(st(State::Cancelled).describe(), "CANCELLED (signal 15)");
        std::fs::write(d.join(EXIT_CODE), "9 0\n").unwrap();
        for b in [
            State::Running,
            State::Pending,
            State::Failed,
            State::Cancelled,
        ] {
            let s = st(b);
            assert_eq!(s.state, State::Completed, "block {b}");
            assert_eq!(s.job_id.as_deref(), Some("9"));
        }
        assert!(
            st(State::Failed).run_s.is_some(),
            "from started to exit_code"
        );
    }
}
