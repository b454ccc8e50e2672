//! Logs -> runs with their log points, whatever wrote them: our trainer's
//! `metrics.jsonl`, the reference study's log lines, or any program's lines
//! matched by a regex from the manifest. Nothing here is fatal to a report:
//! a run without metrics, a torn last line or a failed run is recorded with
//! what went wrong.

pub mod jsonl;
pub mod pattern;
pub mod reference;

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
}

/// A run as the report sees it.
#[derive(Debug, Clone, Default)]
pub struct RunLog {
    pub name: String,
    pub params: IndexMap<String, serde_json::Value>,
    /// COMPLETED, RUNNING, FAILED (exit 3), ... as the executor or log says.
    pub state: String,
    /// Why the run has no (or incomplete) results, when that is known.
    pub reason: Option<String>,
    pub points: Vec<Point>,
    /// Lines that could not be read (a torn last line while a run is still writing).
    pub skipped_lines: usize,
}
