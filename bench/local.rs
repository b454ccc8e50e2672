//! The local executor with many short runs: a study of N command runs that
//! each sleep S seconds, P at a time, submitted through this binary's
//! `sweep submit --executor local` and timed whole, beside the floor that
//! the runs' own seconds set (⌈N / P⌉ × S).

use anyhow::{ensure, Context, Result};
use std::time::Instant;

pub struct LocalBench {
    pub runs: usize,
    pub parallel: usize,
    pub seconds: f64,
    /// The submit, from start to end (plan, render, every run).
    pub total_s: f64,
    /// ⌈runs / parallel⌉ × seconds: what the runs alone take.
    pub floor_s: f64,
}

/// The study's manifest: `runs` command runs of `sleep seconds`.
pub fn manifest_text(runs: usize, parallel: usize, seconds: f64) -> String {
    format!(
        "name = \"bench-local\"\ncommand = \"sleep {seconds}\"\n[sweep]\nmax_runs = {runs}\n[sweep.grid]\nx = [{}]\n[local]\nparallel = {parallel}\n",
        (0..runs).map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
    )
}

/// Runs the study in a temporary project under `dir`.
pub fn run(
    runs: usize,
    parallel: usize,
    seconds: f64,
    dir: &std::path::Path,
) -> Result<LocalBench> {
    ensure!(
        seconds.is_finite() && (0.0..=600.0).contains(&seconds),
        "--seconds must be from 0 to 600"
    );
    let project = sweep::util::fs::scratch_dir_in(dir)?;
    let manifest = project.path().join("bench-local.toml");
    std::fs::write(&manifest, manifest_text(runs, parallel, seconds))?;
    let sweep = crate::sweep_binary()?;
    let start = Instant::now();
    // A stop signal to the benchmark stops the submit, and its runs, too.
    let out = sweep::util::process::output_stoppable(
        std::process::Command::new(sweep)
            .arg("-C")
            .arg(project.path())
            .args(["submit", "bench-local.toml", "--executor", "local"])
            .stdin(std::process::Stdio::null()),
    )
    .context("starting sweep submit")?;
    let total_s = start.elapsed().as_secs_f64();
    ensure!(
        out.status.success(),
        "sweep submit failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(LocalBench {
        runs,
        parallel,
        seconds,
        total_s,
        floor_s: runs.div_ceil(parallel) as f64 * seconds,
    })
}
