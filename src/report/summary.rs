//! Runs -> tables, with polars: every log point of every run in one frame,
//! the first K points of each run skipped (warm-up, as the reference study
//! did), then per run the mean, median, std and 5th/95th percentiles of
//! throughput, MFU, TFLOPs and training-token share, the final loss and the
//! wall time; optionally grouped by axes; speedups against a baseline.

use super::ingest::RunLog;
use anyhow::{bail, Result};
use polars::prelude::*;

/// The metrics summarised per run.
pub const METRICS: &[&str] = &[
    "tokens_per_second",
    "mfu_pct",
    "tflops",
    "training_tokens_pct",
];
const STATS: &[&str] = &["mean", "median", "std", "p5", "p95"];

#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The sweep's axes, when known (else the varying parameters are used).
    pub axes: Option<Vec<String>>,
    pub skip_first: usize,
    /// A run name (or, with grouping, any run of the baseline group).
    pub baseline: Option<String>,
    pub group_by: Vec<String>,
}

pub struct Summary {
    /// One row per run (or per group): `run`, `state`, `runs`, `points`,
    /// `<metric>_<stat>`, `final_loss`, `wall_time_s`, `speedup`, then parameters.
    pub table: DataFrame,
    /// Every log point: `run`, `log_index`, `step`, `loss`, metrics, `step_time_s`, `elapsed_s`.
    pub points: DataFrame,
    /// Parameter columns of the table, in order.
    pub params: Vec<String>,
    /// The parameters that distinguish configurations (a sweep's axes; for
    /// imported logs, the parameters that vary): what charts group and label by.
    pub axes: Vec<String>,
    /// Runs without usable points, with the reason.
    pub problems: Vec<(String, String, String)>,
}

fn opt_col(name: &str, values: Vec<Option<f64>>) -> Column {
    Column::new(name.into(), values)
}

/// Every point of every run as one frame.
fn points_frame(runs: &[RunLog]) -> Result<DataFrame> {
    let n: usize = runs.iter().map(|r| r.points.len()).sum();
    let mut run = Vec::with_capacity(n);
    let mut index = Vec::with_capacity(n);
    let mut cols: Vec<Vec<Option<f64>>> = (0..9).map(|_| Vec::with_capacity(n)).collect();
    for r in runs {
        for (i, p) in r.points.iter().enumerate() {
            run.push(r.name.as_str());
            index.push(i as u32);
            for (c, v) in cols.iter_mut().zip([
                Some(p.step),
                p.loss,
                p.tokens_per_second,
                p.mfu_pct,
                p.tflops,
                p.training_tokens_pct,
                p.step_time_s,
                p.elapsed_s,
                p.global_tokens_per_second,
            ]) {
                c.push(v);
            }
        }
    }
    let names = [
        "step",
        "loss",
        "tokens_per_second",
        "mfu_pct",
        "tflops",
        "training_tokens_pct",
        "step_time_s",
        "elapsed_s",
        "global_tokens_per_second",
    ];
    let mut columns = vec![
        Column::new("run".into(), run),
        Column::new("log_index".into(), index),
    ];
    columns.extend(names.iter().zip(cols).map(|(name, v)| opt_col(name, v)));
    Ok(DataFrame::new_infer_height(columns)?)
}

/// Runs' states and parameters: one row per run, parameter values as text.
fn runs_frame(runs: &[RunLog]) -> Result<(DataFrame, Vec<String>)> {
    let mut keys: Vec<String> = Vec::new();
    for r in runs {
        for k in r.params.keys() {
            if !keys.contains(k) {
                keys.push(k.clone());
            }
        }
    }
    let mut columns = vec![
        Column::new(
            "run".into(),
            runs.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
        ),
        Column::new("order".into(), (0..runs.len() as u32).collect::<Vec<_>>()),
        Column::new(
            "state".into(),
            runs.iter().map(|r| r.state.as_str()).collect::<Vec<_>>(),
        ),
    ];
    for k in &keys {
        let values: Vec<Option<String>> = runs
            .iter()
            .map(|r| {
                r.params.get(k).map(|v| match v {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
            })
            .collect();
        columns.push(Column::new(k.as_str().into(), values));
    }
    Ok((DataFrame::new_infer_height(columns)?, keys))
}

fn stat(metric: &str, s: &str) -> Expr {
    let c = col(metric);
    let e = match s {
        "mean" => c.mean(),
        "median" => c.median(),
        "std" => c.std(1),
        "p5" => c.quantile(lit(0.05), QuantileMethod::Linear),
        _ => c.quantile(lit(0.95), QuantileMethod::Linear),
    };
    e.alias(format!("{metric}_{s}"))
}

pub fn summarize(runs: &[RunLog], opts: &Options) -> Result<Summary> {
    let points = points_frame(runs)?;
    let (info, params) = runs_frame(runs)?;
    for g in &opts.group_by {
        if !params.contains(g) {
            bail!(
                "cannot group by `{g}`: the runs' parameters are {}",
                params.join(", ")
            );
        }
    }
    let mut aggs: Vec<Expr> = METRICS
        .iter()
        .flat_map(|m| STATS.iter().map(move |s| stat(m, s)))
        .collect();
    aggs.push(col("step").count().alias("points"));
    aggs.push(
        col("global_tokens_per_second")
            .mean()
            .alias("global_tokens_per_second"),
    );
    let measured = points
        .clone()
        .lazy()
        .filter(col("log_index").gt_eq(lit(opts.skip_first as u32)))
        .group_by([col("run")])
        .agg(aggs);
    let overall = points
        .clone()
        .lazy()
        .sort(["run", "step"], Default::default())
        .group_by([col("run")])
        .agg([
            col("loss").drop_nulls().last().alias("final_loss"),
            col("elapsed_s").max().alias("wall_time_s"),
            col("step").max().alias("last_step"),
        ]);
    let mut per_run = info
        .lazy()
        .join(
            measured,
            [col("run")],
            [col("run")],
            JoinArgs::new(JoinType::Left),
        )
        .join(
            overall,
            [col("run")],
            [col("run")],
            JoinArgs::new(JoinType::Left),
        )
        .sort(["order"], Default::default())
        .with_column(lit(1u32).alias("runs"))
        .collect()
        .map_err(|e| anyhow::anyhow!("summarising the runs: {e}"))?;

    let table = if opts.group_by.is_empty() {
        per_run.clone()
    } else {
        let keys: Vec<Expr> = opts.group_by.iter().map(|g| col(g.as_str())).collect();
        let mut aggs: Vec<Expr> = METRICS
            .iter()
            .flat_map(|m| STATS.iter().map(move |s| col(format!("{m}_{s}")).mean()))
            .collect();
        aggs.extend([
            col("final_loss").mean(),
            col("wall_time_s").mean(),
            col("global_tokens_per_second").mean(),
            col("points").sum(),
            col("runs").sum(),
            col("run").first().alias("first_run"),
            col("order").min(),
            col("run").alias("members"),
        ]);
        let grouped = per_run
            .clone()
            .lazy()
            .group_by_stable(keys)
            .agg(aggs)
            .sort(["order"], Default::default())
            .collect()?;
        // A group is named after its parameters, e.g. `dataset_type=padded pretokenized=true`.
        let names: Vec<String> = (0..grouped.height())
            .map(|i| {
                opts.group_by
                    .iter()
                    .map(|g| format!("{g}={}", cell(&grouped, g, i)))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        let mut grouped = grouped;
        grouped.with_column(Column::new("run".into(), names))?;
        grouped.with_column(Column::new("state".into(), vec!["-"; grouped.height()]))?;
        grouped
    };

    // Speedup against the baseline row (the baseline run, or its group).
    let baseline_row = match &opts.baseline {
        None => None,
        Some(b) if opts.group_by.is_empty() => Some(
            row_of(&table, "run", b)
                .ok_or_else(|| anyhow::anyhow!("no run named `{b}` to measure speedups against"))?,
        ),
        Some(b) => {
            let members = table.column("members")?.list()?;
            let found = (0..table.height()).find(|&i| {
                members.get_as_series(i).is_some_and(|s| {
                    s.str()
                        .is_ok_and(|s| s.iter().any(|v| v == Some(b.as_str())))
                })
            });
            Some(
                found.ok_or_else(|| {
                    anyhow::anyhow!("no run named `{b}` to measure speedups against")
                })?,
            )
        }
    };
    let mut table = table;
    let tps = table.column("tokens_per_second_mean")?.f64()?.clone();
    let speedup: Vec<Option<f64>> = match baseline_row.and_then(|r| tps.get(r)) {
        Some(base) if base > 0.0 => tps.iter().map(|v| v.map(|v| v / base)).collect(),
        _ => vec![None; table.height()],
    };
    table.with_column(Column::new("speedup".into(), speedup))?;
    if table
        .get_column_names()
        .iter()
        .any(|c| c.as_str() == "members")
    {
        table = table.drop("members")?;
    }
    per_run.rechunk_mut();

    let problems = runs
        .iter()
        .filter(|r| r.points.is_empty() || r.state != "COMPLETED")
        .map(|r| {
            let reason = r.reason.clone().unwrap_or_else(|| {
                if r.points.is_empty() {
                    "no metrics".into()
                } else {
                    "not finished".into()
                }
            });
            (r.name.clone(), r.state.clone(), reason)
        })
        .collect();
    let params = if opts.group_by.is_empty() {
        params
    } else {
        opts.group_by.clone()
    };
    let axes = match &opts.axes {
        _ if !opts.group_by.is_empty() => opts.group_by.clone(),
        Some(a) => a.clone(),
        None => params
            .iter()
            .filter(|p| !p.starts_with("global_"))
            .filter(|p| {
                let mut seen: Vec<String> = (0..table.height())
                    .map(|i| cell(&table, p, i))
                    .filter(|v| !v.is_empty())
                    .collect();
                seen.sort();
                seen.dedup();
                seen.len() > 1
            })
            .cloned()
            .collect(),
    };
    Ok(Summary {
        table,
        points,
        params,
        axes,
        problems,
    })
}

fn row_of(df: &DataFrame, column: &str, value: &str) -> Option<usize> {
    let c = df.column(column).ok()?.str().ok()?;
    c.iter().position(|v| v == Some(value))
}

/// A cell as text (for names and tables).
pub fn cell(df: &DataFrame, column: &str, row: usize) -> String {
    match df.column(column).and_then(|c| c.get(row)) {
        Ok(AnyValue::String(s)) => s.to_string(),
        Ok(AnyValue::StringOwned(s)) => s.to_string(),
        Ok(AnyValue::Null) | Err(_) => String::new(),
        Ok(v) => v.to_string(),
    }
}

/// A numeric cell.
pub fn num(df: &DataFrame, column: &str, row: usize) -> Option<f64> {
    df.column(column)
        .ok()?
        .cast(&DataType::Float64)
        .ok()?
        .f64()
        .ok()?
        .get(row)
}
