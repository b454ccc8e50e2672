//! `summary.md`: the table as the reference study's README shows it. Names
//! and values come from files and manifests: every cell is escaped, so that
//! neither a `|` nor a line break nor a control character can break the
//! table or reach a terminal raw.

use super::{Exporter, TableContext};
use crate::report::columns::{Metric, Stat};
use crate::report::summary::{MetricStats, Row, Summary};
use anyhow::Result;
use std::io::Write;

pub struct Markdown;

fn f(v: Option<f64>, digits: usize) -> String {
    v.filter(|v| v.is_finite())
        .map(|v| format!("{v:.digits$}"))
        .unwrap_or_else(|| "-".into())
}

/// Text as one markdown table cell: control characters as escapes, `|`
/// escaped.
pub fn cell(s: &str) -> String {
    crate::util::text::printable(s).replace('|', "\\|")
}

/// `mean ± half-width` of a metric's 95% interval (the mean alone without one).
pub(crate) fn with_interval(m: &MetricStats, digits: usize) -> String {
    match (m.mean, m.ci95) {
        (Some(mean), Some((lo, hi))) if mean.is_finite() && (hi - lo).is_finite() => {
            format!("{mean:.digits$} ± {:.digits$}", (hi - lo) / 2.0)
        }
        _ => f(m.mean, digits),
    }
}

/// The README-ready table (also what `sweep report` prints): means with the
/// half-width of their 95% interval, speedups with theirs. Studies whose
/// runs differ in world size also get ranks, whole-job tokens/s and scaling
/// efficiency; studies whose batch size is not an axis (`batch_size = "max"`,
/// say) the batch each run trained at.
pub fn table(s: &Summary) -> String {
    let rows = &s.rows;
    // The batch each run trained at, where no parameter column already says
    // it: `batch_size = "max"`, or a batch size that is not an axis.
    let batch_param = s.params.iter().any(|p| p == "batch_size");
    let max_batch = rows.iter().any(|r| {
        r.trained_batch_size.is_some() && (!batch_param || r.param("batch_size") == "max")
    });
    let scaling = rows.iter().any(|r| r.scaling_efficiency_pct.is_some());
    let forecast = scaling && rows.iter().any(|r| r.forecast_efficiency_pct.is_some());
    let repeats = rows.iter().any(|r| r.members.len() > 1);
    let memory = rows
        .iter()
        .any(|r| r.metric(Metric::PeakMemoryMb).mean.is_some());
    let mut out = String::from("| Configuration |");
    if repeats {
        out.push_str(" Runs |");
    }
    out.push_str(" Tokens/sec | MFU % | TFLOPs | Training tokens % |");
    if memory {
        out.push_str(" Peak memory (MB) |");
    }
    out.push_str(" Final loss | Wall time (s) | Speedup |");
    if scaling {
        out.push_str(" Ranks | Global tokens/sec | Scaling efficiency % |");
    }
    if forecast {
        out.push_str(" Forecast efficiency % |");
    }
    if max_batch {
        out.push_str(" Batch size |");
    }
    out.push_str(" State |\n|---|");
    let columns = 9
        + usize::from(repeats)
        + usize::from(memory)
        + if scaling { 3 } else { 0 }
        + usize::from(forecast)
        + usize::from(max_batch);
    out.push_str(&"---:|".repeat(columns - 2));
    out.push_str("---|\n");
    for r in rows {
        out.push_str(&row(r, repeats, memory, scaling, forecast, max_batch));
    }
    out
}

fn row(
    r: &Row,
    repeats: bool,
    memory: bool,
    scaling: bool,
    forecast: bool,
    max_batch: bool,
) -> String {
    let mut out = format!("| {} |", cell(&r.name));
    if repeats {
        out.push_str(&format!(" {} |", r.members.len()));
    }
    out.push_str(&format!(
        " {} | {} | {} | {} |",
        with_interval(r.metric(Metric::TokensPerSecond), 2),
        with_interval(r.metric(Metric::MfuPct), 2),
        with_interval(r.metric(Metric::Tflops), 2),
        f(r.metric(Metric::TrainingTokensPct).mean, 2),
    ));
    if memory {
        out.push_str(&format!(
            " {} |",
            with_interval(r.metric(Metric::PeakMemoryMb), 0)
        ));
    }
    out.push_str(&format!(
        " {} | {} | {} |",
        f(r.final_loss, 3),
        f(r.wall_time_s, 1),
        r.speedup.map_or_else(|| "-".into(), |s| s.text()),
    ));
    if scaling {
        out.push_str(&format!(
            " {} | {} | {} |",
            f(Some(r.world_size), 0),
            f(r.global_tokens_per_second, 2),
            f(r.scaling_efficiency_pct, 1),
        ));
    }
    if forecast {
        out.push_str(&format!(" {} |", f(r.forecast_efficiency_pct, 1)));
    }
    if max_batch {
        out.push_str(&format!(" {} |", f(r.trained_batch_size, 0)));
    }
    out.push_str(&format!(" {} |\n", cell(&r.state)));
    out
}

impl Exporter for Markdown {
    fn file_name(&self) -> &'static str {
        "summary.md"
    }

    fn write(&self, s: &Summary, ctx: &TableContext, out: &mut std::fs::File) -> Result<()> {
        writeln!(out, "# {}\n", cell(&ctx.study))?;
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
                "; speedup of tokens/sec against {} with its 95% interval, \
                 `≈` where the difference is not significant at 5% after Holm's correction \
                 for the {} comparisons with it (the verdicts are adjusted, the intervals \
                 are each comparison's own).\n",
                cell(b),
                s.rows.len().saturating_sub(1)
            )?,
            None => writeln!(out, ".\n")?,
        }
        out.write_all(table(s).as_bytes())?;
        writeln!(
            out,
            "\nSpread of tokens/sec: median, standard deviation, 5th and 95th percentiles.\n"
        )?;
        writeln!(
            out,
            "| Configuration | median | std | p5 | p95 | points | warm-up points dropped |\n|---|---:|---:|---:|---:|---:|---:|"
        )?;
        for r in &s.rows {
            let tps = r.metric(Metric::TokensPerSecond);
            writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} |",
                cell(&r.name),
                f(tps.stat(Stat::Median), 2),
                f(tps.stat(Stat::Std), 2),
                f(tps.stat(Stat::P5), 2),
                f(tps.stat(Stat::P95), 2),
                r.points,
                r.warmup_points,
            )?;
        }
        if !s.problems.is_empty() {
            writeln!(out, "\nRuns without complete results:\n")?;
            for p in &s.problems {
                writeln!(out, "- {}", cell(&p.describe()))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_cannot_break_the_table() {
        assert_eq!(cell("a|b\nc\u{1b}[2J"), "a\\|b\\nc\\u{1b}[2J");
    }
}
