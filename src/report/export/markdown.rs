//! `summary.md`: the table as the reference study's README shows it.

use super::{Exporter, TableContext};
use crate::report::columns::{self as c, Metric, Stat};
use crate::report::summary::{cell, num, speedup_text, Summary};
use anyhow::Result;
use polars::prelude::DataFrame;
use std::io::Write;

pub struct Markdown;

fn f(v: Option<f64>, digits: usize) -> String {
    v.map(|v| format!("{v:.digits$}"))
        .unwrap_or_else(|| "-".into())
}

/// `mean ± half-width` of a metric's 95% interval (the mean alone without one).
fn with_interval(t: &DataFrame, metric: Metric, i: usize, digits: usize) -> String {
    let mean = num(t, &metric.col(Stat::Mean), i);
    match (
        mean,
        num(t, &metric.ci_low(), i),
        num(t, &metric.ci_high(), i),
    ) {
        (Some(m), Some(lo), Some(hi)) => format!("{m:.digits$} ± {:.digits$}", (hi - lo) / 2.0),
        _ => f(mean, digits),
    }
}

/// The README-ready table (also what `sweep report` prints): means with the
/// half-width of their 95% interval, speedups with theirs. Studies whose
/// runs differ in world size also get ranks, whole-job tokens/s and scaling
/// efficiency; studies whose batch size is not an axis (`batch_size = "max"`,
/// say) the batch each run trained at.
pub fn table(s: &Summary) -> String {
    let t = &s.table;
    // The batch each run trained at, where no parameter column already says
    // it: `batch_size = "max"`, or a batch size that is not an axis.
    let batch_param = t.column("batch_size").is_ok();
    let max_batch = (0..t.height()).any(|i| {
        num(t, c::TRAINED_BATCH_SIZE, i).is_some()
            && (!batch_param || cell(t, "batch_size", i).trim_matches('"') == "max")
    });
    let scaling = (0..t.height()).any(|i| num(t, c::SCALING_EFFICIENCY_PCT, i).is_some());
    let repeats = (0..t.height()).any(|i| num(t, c::REPEATS, i).is_some_and(|n| n > 1.0));
    let mut out = String::from("| Configuration |");
    if repeats {
        out.push_str(" Runs |");
    }
    out.push_str(
        " Tokens/sec | MFU % | TFLOPs | Training tokens % | Final loss | Wall time (s) | Speedup |",
    );
    if scaling {
        out.push_str(" Ranks | Global tokens/sec | Scaling efficiency % |");
    }
    if max_batch {
        out.push_str(" Batch size |");
    }
    out.push_str(" State |\n|---|");
    let columns = 9 + usize::from(repeats) + if scaling { 3 } else { 0 } + usize::from(max_batch);
    out.push_str(&"---:|".repeat(columns - 2));
    out.push_str("---|\n");
    for i in 0..t.height() {
        out.push_str(&format!("| {} |", cell(t, c::RUN, i)));
        if repeats {
            out.push_str(&format!(" {} |", f(num(t, c::REPEATS, i), 0)));
        }
        out.push_str(&format!(
            " {} | {} | {} | {} | {} | {} | {} |",
            with_interval(t, Metric::TokensPerSecond, i, 2),
            with_interval(t, Metric::MfuPct, i, 2),
            with_interval(t, Metric::Tflops, i, 2),
            f(num(t, &Metric::TrainingTokensPct.col(Stat::Mean), i), 2),
            f(num(t, c::FINAL_LOSS, i), 3),
            f(num(t, c::WALL_TIME_S, i), 1),
            speedup_text(t, i).unwrap_or_else(|| "-".into()),
        ));
        if scaling {
            out.push_str(&format!(
                " {} | {} | {} |",
                f(num(t, c::WORLD_SIZE, i), 0),
                f(num(t, c::GLOBAL_TOKENS_PER_SECOND, i), 2),
                f(num(t, c::SCALING_EFFICIENCY_PCT, i), 1),
            ));
        }
        if max_batch {
            out.push_str(&format!(" {} |", f(num(t, c::TRAINED_BATCH_SIZE, i), 0)));
        }
        out.push_str(&format!(" {} |\n", cell(t, c::STATE, i)));
    }
    out
}

impl Exporter for Markdown {
    fn file_name(&self) -> &'static str {
        "summary.md"
    }

    fn write(&self, s: &Summary, ctx: &TableContext, out: &mut std::fs::File) -> Result<()> {
        writeln!(out, "# {}\n", ctx.study)?;
        write!(
            out,
            "Means over every logged step except the first {} of each run and any warm-up \
             detected after them, ± the half-width of their 95% confidence interval (over a \
             configuration's repeats, or over one run's steps)",
            ctx.skip_first
        )?;
        match &ctx.baseline {
            Some(b) => writeln!(
                out,
                "; speedup of tokens/sec against `{b}` with its 95% interval, \
                 `≈` where the interval holds 1 (no significant difference).\n"
            )?,
            None => writeln!(out, ".\n")?,
        }
        out.write_all(table(s).as_bytes())?;
        let t = &s.table;
        writeln!(
            out,
            "\nSpread of tokens/sec: median, standard deviation, 5th and 95th percentiles.\n"
        )?;
        writeln!(
            out,
            "| Configuration | median | std | p5 | p95 | points | warm-up points dropped |\n|---|---:|---:|---:|---:|---:|---:|"
        )?;
        let tps = Metric::TokensPerSecond;
        for i in 0..t.height() {
            writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} |",
                cell(t, c::RUN, i),
                f(num(t, &tps.col(Stat::Median), i), 2),
                f(num(t, &tps.col(Stat::Std), i), 2),
                f(num(t, &tps.col(Stat::P5), i), 2),
                f(num(t, &tps.col(Stat::P95), i), 2),
                num(t, c::POINTS, i)
                    .map(|v| format!("{v:.0}"))
                    .unwrap_or_else(|| "0".into()),
                f(num(t, c::WARMUP_POINTS, i), 0),
            )?;
        }
        if !s.problems.is_empty() {
            writeln!(out, "\nRuns without complete results:\n")?;
            for p in &s.problems {
                writeln!(out, "- `{}`: {}, {}", p.run, p.state, p.reason)?;
            }
        }
        Ok(())
    }
}
