//! Plan + render of a large sweep: the cost of `sweep render` on 10,000 runs.

use crate::timed;
use anyhow::{ensure, Result};
use std::fmt::Write;
use sweep::manifest::Manifest;
use sweep::plan::{render, Plan};

pub struct PlanBench {
    pub runs: usize,
    pub load_s: f64,
    pub plan_s: f64,
    pub render_s: f64,
    pub write_s: f64,
    pub rerender_s: f64,
    /// CPU seconds of the write phase in user space and in the kernel.
    pub write_user_s: f64,
    pub write_kernel_s: f64,
}

/// A trainer manifest with `runs` runs (a multiple of 100): four grid axes, a
/// derived value and a run-name template, as a real study would have.
pub fn manifest_text(runs: usize) -> String {
    let seeds = runs / 100;
    let mut s = String::from(
        "name = \"bench-plan\"\n[defaults]\ndataset = \"d.parquet\"\nmodel = \"tiny\"\n[sweep]\nname = \"s{{ seed }}-bs{{ batch_size }}-lr{{ learning_rate }}-{{ dataset_type }}\"\n",
    );
    let _ = writeln!(s, "max_runs = {}\n[sweep.grid]", runs.max(1));
    let _ = writeln!(
        s,
        "seed = [{}]",
        (0..seeds)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    s.push_str("batch_size = [1, 2, 4, 8, 16]\n");
    s.push_str("learning_rate = [1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 1e-1]\n");
    s.push_str("dataset_type = [\"padded\", \"padding-free\"]\n");
    s.push_str("[sweep.derived]\ntokens_per_step = \"batch_size * sequence_length\"\n");
    s
}

/// Plans and renders `runs` runs into a temporary project under `dir`.
pub fn run(
    runs: usize,
    dir: &std::path::Path,
    opts: &sweep::plan::PlanOptions,
) -> Result<PlanBench> {
    ensure!(
        runs >= 100 && runs.is_multiple_of(100),
        "--runs must be a multiple of 100"
    );
    let dir = sweep::util::fs::scratch_dir_in(dir)?;
    let path = dir.path().join("bench.toml");
    std::fs::write(&path, manifest_text(runs))?;
    let (m, load) = timed(|| Manifest::load(&path, dir.path()));
    let (plan, plan_t) = timed(|| Plan::new(m?, opts));
    let plan = plan?;
    ensure!(plan.runs.len() == runs, "planned {} runs", plan.runs.len());
    let (rendered, render_t) = timed(|| render::render(&plan));
    let rendered = rendered?;
    let before = crate::cpu_times();
    let (w, write_t) = timed(|| render::write(&rendered));
    let after = crate::cpu_times();
    w?;
    // The second render finds every file unchanged.
    let (again, rerender_t) = timed(|| -> Result<()> {
        let r = render::render(&plan)?;
        let s = render::write(&r)?;
        ensure!(
            s.files_written == 0,
            "re-render wrote {} files",
            s.files_written
        );
        Ok(())
    });
    again?;
    Ok(PlanBench {
        runs,
        load_s: load.as_secs_f64(),
        plan_s: plan_t.as_secs_f64(),
        render_s: render_t.as_secs_f64(),
        write_s: write_t.as_secs_f64(),
        rerender_s: rerender_t.as_secs_f64(),
        write_user_s: after.0 - before.0,
        write_kernel_s: after.1 - before.1,
    })
}
