//! Aggregating a large sweep: `runs` run directories with `lines` log lines
//! each, read, summarised with polars and written as tables (charts left out:
//! a thousand loss curves on one figure is not a figure).

use crate::timed;
use anyhow::Result;
use sweep::report::{self, ReportOptions, Source};

pub struct ReportBench {
    pub runs: usize,
    pub lines: usize,
    pub setup_s: f64,
    pub report_s: f64,
}

pub fn run(runs: usize, lines: usize, dir: &std::path::Path) -> Result<ReportBench> {
    let root = sweep::util::fs::scratch_dir_in(dir)?;
    let study = root.path().join("results").join("bench-report");
    let (r, setup) = timed(|| -> Result<()> {
        sweep::util::fs::make_dir(&study)?;
        for i in 0..runs {
            // Made inside the study only: once a stop signal removed the
            // scratch folder, nothing makes it again.
            let d = study.join(format!("run-{i:05}"));
            std::fs::create_dir(&d)?;
            let record = serde_json::json!({
                "id": format!("{i:08x}"), "name": format!("run-{i:05}"), "study": "bench-report", "kind": "run",
                "manifest": { "path": "bench.toml", "sha256": "0" }, "git_commit": null, "sweep_version": "0",
                "created_at": "2026-01-01T00:00:00Z", "params": { "batch_size": 1 + i % 4, "seed": i }, "jobs": [],
            });
            std::fs::write(d.join("run.json"), serde_json::to_vec(&record)?)?;
            let mut log = sweep::train::run::record::MetricsLog::open(&d)?;
            for s in 1..=lines {
                log.write(sweep::train::run::record::StepMetrics {
                    step: s,
                    loss: 10.0 / (1.0 + s as f64 / 100.0),
                    lr: 0.001,
                    grad_norm: 0.9,
                    tokens_per_second: 1000.0 + (i * 7 + s * 13) as f64 % 50.0,
                    world_size: 1,
                    batch_size: 1 + i % 4,
                    global_tokens_per_second: 1000.0 + (i * 7 + s * 13) as f64 % 50.0,
                    training_tokens_pct: 41.2,
                    mfu_pct: 20.0 + (s % 10) as f64 / 10.0,
                    tflops: 0.031,
                    step_time_s: 0.3,
                    elapsed_s: s as f64 * 0.3,
                    peak_memory_mb: 800.0,
                    val_loss: None,
                    rank_compute_s: Vec::new(),
                    watts: None,
                    joules_per_token: None,
                })?;
            }
        }
        Ok(())
    });
    r?;
    let opts = ReportOptions {
        live: false,
        skip_first: None,
        baseline: Some("run-00000".into()),
        group_by: vec![],
        out: None,
        plots: false,
    };
    let (rep, took) = timed(|| report::run(root.path(), &Source::ResultsDir(study.clone()), &opts));
    let rep = rep?;
    anyhow::ensure!(
        rep.summary.table.height() == runs,
        "summarised {} runs",
        rep.summary.table.height()
    );
    Ok(ReportBench {
        runs,
        lines,
        setup_s: setup.as_secs_f64(),
        report_s: took.as_secs_f64(),
    })
}
