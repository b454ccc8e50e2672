//! Logs -> runs with their log points, whatever wrote them: our trainer's
//! `metrics.jsonl`, the reference study's log lines, or any program's lines
//! matched by a regex from the manifest. Nothing here is fatal to a report:
//! a run without metrics, a torn last line or a failed run is recorded with
//! what went wrong.

pub mod jsonl;
pub mod pattern;
pub mod reference;

use crate::executor::{State, Status};
use indexmap::IndexMap;

/// One logged step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Point {
    pub step: f64,
    pub loss: Option<f64>,
    pub tokens_per_second: Option<f64>,
    pub training_tokens_pct: Option<f64>,
    pub mfu_pct: Option<f64>,
    pub tflops: Option<f64>,
    pub step_time_s: Option<f64>,
    pub elapsed_s: Option<f64>,
    pub global_tokens_per_second: Option<f64>,
    /// Ranks training together (GPUs, CPU processes); unknown means one.
    pub world_size: Option<f64>,
    /// Sequences per device and micro-batch, when the log says.
    pub batch_size: Option<f64>,
}

/// A run as the report sees it.
#[derive(Debug, Clone)]
pub struct RunLog {
    pub name: String,
    pub params: IndexMap<String, serde_json::Value>,
    /// COMPLETED, RUNNING, FAILED (exit 3), ... as the executor or the log says.
    pub status: Status,
    /// Why the run has no (or incomplete) results, when that is known.
    pub reason: Option<String>,
    pub points: Vec<Point>,
    /// Lines that could not be read (a torn last line while a run is still writing).
    pub skipped_lines: usize,
    /// Log files of the run that exist but could not be read, with why.
    pub read_errors: Vec<String>,
}

impl RunLog {
    pub fn new(name: impl Into<String>, status: Status) -> RunLog {
        RunLog {
            name: name.into(),
            params: IndexMap::new(),
            status,
            reason: None,
            points: Vec::new(),
            skipped_lines: 0,
            read_errors: Vec::new(),
        }
    }

    /// A log that could not be read: listed in the report with the reason.
    pub fn unreadable(name: impl Into<String>, why: String) -> RunLog {
        RunLog {
            read_errors: vec![why],
            ..RunLog::new(name, Status::new(State::Unknown))
        }
    }
}

/// A log file's text; a file that cannot be read or is not UTF-8 gives the
/// reason instead, for the report's list of problems.
pub fn read_text(path: &std::path::Path) -> Result<String, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    String::from_utf8(bytes).map_err(|e| {
        format!(
            "{} is not UTF-8 text (invalid byte at offset {})",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}
