//! `summary.md`: the table as the reference study's README shows it.

use super::{Exporter, TableContext};
use crate::report::columns::{self as c, Metric, Stat};
use crate::report::summary::{cell, num, Summary};
use anyhow::Result;
use std::io::Write;

pub struct Markdown;

fn f(v: Option<f64>, digits: usize) -> String {
    v.map(|v| format!("{v:.digits$}"))
        .unwrap_or_else(|| "-".into())
}

/// The README-ready table (also what `sweep report` prints). Studies whose
/// runs differ in world size also get ranks, whole-job tokens/s and scaling
/// efficiency.
pub fn table(s: &Summary) -> String {
    let t = &s.table;
    let scaling = (0..t.height()).any(|i| num(t, c::SCALING_EFFICIENCY_PCT, i).is_some());
    let mut out = String::from("| Configuration | Tokens/sec | MFU % | TFLOPs | Training tokens % | Final loss | Wall time (s) | Speedup |");
    out.push_str(if scaling {
        " Ranks | Global tokens/sec | Scaling efficiency % | State |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n"
    } else {
        " State |\n|---|---:|---:|---:|---:|---:|---:|---:|---|\n"
    });
    for i in 0..t.height() {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            cell(t, c::RUN, i),
            f(num(t, &Metric::TokensPerSecond.col(Stat::Mean), i), 2),
            f(num(t, &Metric::MfuPct.col(Stat::Mean), i), 2),
            f(num(t, &Metric::Tflops.col(Stat::Mean), i), 2),
            f(num(t, &Metric::TrainingTokensPct.col(Stat::Mean), i), 2),
            f(num(t, c::FINAL_LOSS, i), 3),
            f(num(t, c::WALL_TIME_S, i), 1),
            num(t, c::SPEEDUP, i)
                .map(|v| format!("{v:.2}x"))
                .unwrap_or_else(|| "-".into()),
        ));
        if scaling {
            out.push_str(&format!(
                " {} | {} | {} |",
                f(num(t, c::WORLD_SIZE, i), 0),
                f(num(t, c::GLOBAL_TOKENS_PER_SECOND, i), 2),
                f(num(t, c::SCALING_EFFICIENCY_PCT, i), 1),
            ));
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
            "Means over every logged step except the first {} of each run",
            ctx.skip_first
        )?;
        match &ctx.baseline {
            Some(b) => writeln!(out, "; speedup of tokens/sec against `{b}`.\n")?,
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
            "| Configuration | median | std | p5 | p95 | points |\n|---|---:|---:|---:|---:|---:|"
        )?;
        let tps = Metric::TokensPerSecond;
        for i in 0..t.height() {
            writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} |",
                cell(t, c::RUN, i),
                f(num(t, &tps.col(Stat::Median), i), 2),
                f(num(t, &tps.col(Stat::Std), i), 2),
                f(num(t, &tps.col(Stat::P5), i), 2),
                f(num(t, &tps.col(Stat::P95), i), 2),
                num(t, c::POINTS, i)
                    .map(|v| format!("{v:.0}"))
                    .unwrap_or_else(|| "0".into()),
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
