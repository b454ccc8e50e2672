//! One vocabulary of job states for both executors, with SLURM's names.

use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, strum::IntoStaticStr)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[strum(serialize_all = "SCREAMING_SNAKE_CASE")]
pub enum State {
    /// Rendered, never submitted.
    Unsubmitted,
    Pending,
    Running,
    Completed,
    Failed,
    Cancelled,
    Timeout,
    OutOfMemory,
    Preempted,
    NodeFail,
    /// Stopped by its watchdog: it made no progress for `[watchdog] stall`
    /// (or none at all within `startup`). The reason names the ranks and
    /// nodes that stopped first; the job's record in `run.json` and `watchdog.log` in the
    /// run directory hold the evidence.
    Hung,
    /// Stopped (or never started) by an interrupt of the `sweep` that ran
    /// it. Not a failure: the next `sweep run`/`submit` runs it again.
    Interrupted,
    /// Submitted, but neither the scheduler nor the run directory knows how it ended.
    Unknown,
}

impl State {
    pub fn is_active(self) -> bool {
        matches!(self, State::Pending | State::Running)
    }

    /// Ended without completing, for a reason of its own: what
    /// `--retry-failed` resubmits. An interrupted run is not failed.
    pub fn is_failed(self) -> bool {
        !self.is_active()
            && !matches!(
                self,
                State::Completed | State::Unsubmitted | State::Interrupted
            )
    }

    /// Left to run again by a plain `sweep run`/`submit`: never submitted, or interrupted.
    pub fn is_due(self) -> bool {
        matches!(self, State::Unsubmitted | State::Interrupted)
    }

    /// SLURM's job state names (squeue, scontrol and sacct spellings).
    pub fn from_slurm(s: &str) -> State {
        // sacct writes "CANCELLED by 0".
        match s.split_whitespace().next().unwrap_or("") {
            "PENDING" | "CONFIGURING" | "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED"
            | "RESV_DEL_HOLD" | "SUSPENDED" | "STOPPED" => State::Pending,
            "RUNNING" | "COMPLETING" | "SIGNALING" | "STAGE_OUT" | "RESIZING" => State::Running,
            "COMPLETED" => State::Completed,
            "FAILED" | "BOOT_FAIL" | "DEADLINE" | "SPECIAL_EXIT" => State::Failed,
            "CANCELLED" | "REVOKED" => State::Cancelled,
            "TIMEOUT" => State::Timeout,
            "OUT_OF_MEMORY" => State::OutOfMemory,
            "PREEMPTED" => State::Preempted,
            "NODE_FAIL" => State::NodeFail,
            _ => State::Unknown,
        }
    }

    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A unit's state with what the scheduler said about it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub state: State,
    /// The program's exit code, when it exited.
    pub exit_code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    pub reason: Option<String>,
    pub job_id: Option<String>,
    /// How long the job ran, in whole seconds, where the executor knows
    /// (the report's wall time of a run whose log has no clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_s: Option<u64>,
}

impl Status {
    pub fn new(state: State) -> Status {
        Status {
            state,
            exit_code: None,
            signal: None,
            reason: None,
            job_id: None,
            run_s: None,
        }
    }

    /// A program that exited with `code`: the trainer's
    /// [`crate::config::OUT_OF_MEMORY_EXIT`] is out of memory, the
    /// watchdog's [`crate::config::HUNG_EXIT`] a run it stopped, any other
    /// nonzero code a failure.
    pub fn exited(code: i32) -> Status {
        Status {
            exit_code: Some(code),
            ..Status::new(match code {
                0 => State::Completed,
                crate::config::OUT_OF_MEMORY_EXIT => State::OutOfMemory,
                crate::config::HUNG_EXIT => State::Hung,
                _ => State::Failed,
            })
        }
    }

    /// The status a shell's `$?` records (what job scripts write into a run's
    /// `exit_code`): 128 + N is signal N; the trainer's
    /// [`crate::config::REQUEUE_EXIT`] is a run that wrote a checkpoint on a
    /// stop signal and waits to be started again.
    pub fn from_shell(rc: i32) -> Status {
        match rc {
            crate::config::REQUEUE_EXIT => Status {
                exit_code: Some(rc),
                ..Status::new(State::Interrupted)
            }
            .with_reason("checkpoint written on a stop signal; `sweep run` continues it"),
            129..=192 => Status {
                signal: Some(rc - 128),
                ..Status::new(State::Failed)
            },
            _ => Status::exited(rc),
        }
    }

    pub fn with_reason(mut self, reason: impl Into<String>) -> Status {
        self.reason = Some(reason.into());
        self
    }

    pub fn with_job(mut self, job: &str) -> Status {
        self.job_id = Some(job.to_string());
        self
    }

    /// `FAILED (exit 3)`, `CANCELLED (signal 15)`, `PENDING (Dependency)`.
    pub fn describe(&self) -> String {
        let mut s = self.state.to_string();
        // An interrupted run says why, and how it goes on, rather than a
        // code; so does a run its watchdog or launch doctor stopped.
        use crate::config::{HUNG_EXIT, LAUNCH_EXIT};
        let stopped_by_sweep = matches!(self.exit_code, Some(HUNG_EXIT | LAUNCH_EXIT));
        let interrupted =
            (self.state == State::Interrupted || stopped_by_sweep) && self.reason.is_some();
        match (self.exit_code, self.signal) {
            (_, Some(sig)) if sig != 0 && self.state != State::Completed && !interrupted => {
                s.push_str(&format!(" (signal {sig})"))
            }
            (Some(code), _) if code != 0 && !interrupted => {
                s.push_str(&format!(" (exit {code}{})", killed_by(code)))
            }
            _ => {
                if let Some(r) = self
                    .reason
                    .as_deref()
                    .filter(|r| !r.is_empty() && *r != "None")
                {
                    // A reason may quote a job, a log or a host name: never
                    // a terminal's escape or a line of its own.
                    s.push_str(&format!(" ({})", crate::util::text::note(r)));
                }
            }
        }
        s
    }
}

/// The signal a shell's exit status 128 + N says killed its program
/// (`: SIGKILL` for 137, the kernel's out-of-memory killer's), else nothing.
fn killed_by(code: i32) -> String {
    (129..=128 + 64)
        .contains(&code)
        .then(|| nix::sys::signal::Signal::try_from(code - 128).ok())
        .flatten()
        .map_or(String::new(), |sig| format!(": {}", sig.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exit_status_over_128_names_its_signal() {
        let failed = |code| Status::exited(code).describe();
        assert_eq!(failed(138), "FAILED (exit 138: SIGUSR1)");
        assert_eq!(failed(137), "FAILED (exit 137: SIGKILL)");
        assert_eq!(failed(3), "FAILED (exit 3)");
        assert_eq!(failed(128), "FAILED (exit 128)");
        assert_eq!(failed(255), "FAILED (exit 255)");
    }

    #[test]
    fn slurm_names_map() {
        assert_eq!(State::from_slurm("CANCELLED by 0"), State::Cancelled);
        assert_eq!(State::from_slurm("OUT_OF_MEMORY"), State::OutOfMemory);
        assert_eq!(State::from_slurm("COMPLETING"), State::Running);
        assert_eq!(State::from_slurm("REQUEUED"), State::Pending);
        assert!(
            State::Timeout.is_failed()
                && !State::Completed.is_failed()
                && !State::Running.is_failed()
                && !State::Interrupted.is_failed()
        );
        assert!(State::Interrupted.is_due() && State::Unsubmitted.is_due());
        assert!(!State::Cancelled.is_due() && !State::Running.is_due());
    }

    #[test]
    fn describes_exit_and_signal() {
        assert_eq!(Status::exited(3).describe(), "FAILED (exit 3)");
        assert_eq!(
            Status::exited(crate::config::OUT_OF_MEMORY_EXIT).describe(),
            "OUT_OF_MEMORY (exit 98)"
        );
        let s = Status {
            signal: Some(15),
            ..Status::new(State::Cancelled)
        };
        assert_eq!(s.describe(), "CANCELLED (signal 15)");
        assert_eq!(Status::from_shell(137).describe(), "FAILED (signal 9)");
        assert_eq!(Status::from_shell(3).describe(), "FAILED (exit 3)");
        assert_eq!(Status::from_shell(0).state, State::Completed);
        assert_eq!(Status::from_shell(99).state, State::Interrupted);
        assert_eq!(
            Status::new(State::Pending)
                .with_reason("Dependency")
                .describe(),
            "PENDING (Dependency)"
        );
        // A reason quoting a hostile host name: no escape, no row of its own.
        let hung = Status {
            exit_code: Some(crate::config::HUNG_EXIT),
            ..Status::new(State::Hung)
        }
        .with_reason("no progress on node\u{1b}]0;pwned\u{7}\n| x | COMPLETED |");
        let said = hung.describe();
        assert!(!said.contains(['\u{1b}', '\u{7}', '\n']), "{said:?}");
        assert!(said.contains("| x | COMPLETED |"), "{said}");
    }
}
