//! Runs -> tables, with polars: every log point of every run in one frame,
//! the first K points of each run skipped (warm-up, as the reference study
//! did), then per run the mean, median, std and 5th/95th percentiles of
//! throughput, MFU, TFLOPs and training-token share, the final loss and the
//! wall time; optionally grouped by axes; speedups against a baseline.

use super::columns::{self as c, Metric, Stat};
use super::ingest::RunLog;
use crate::executor::State;
use anyhow::{bail, Result};
use polars::prelude::*;

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
    /// Runs without usable points or that did not complete, with the reason.
    pub problems: Vec<Problem>,
    /// The runs behind each row of `table` (a configuration's repeats, a group).
    pub members: Vec<Vec<String>>,
    /// What each row's tokens/s interval was computed from (its repeats'
    /// means, or its one run's steady-state points): for comparisons.
    pub tps_samples: Vec<Vec<f64>>,
}

/// A run the table cannot fully account for.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    pub run: String,
    /// As the executor or the log describes it: `FAILED (exit 3)`, `UNKNOWN`, ...
    pub state: String,
    pub reason: String,
}

fn opt_col(name: &str, values: Vec<Option<f64>>) -> Column {
    Column::new(name.into(), values)
}

/// Every point of every run as one frame.
fn points_frame(runs: &[RunLog]) -> Result<DataFrame> {
    let n: usize = runs.iter().map(|r| r.points.len()).sum();
    let mut run = Vec::with_capacity(n);
    let mut index = Vec::with_capacity(n);
    let mut cols: Vec<Vec<Option<f64>>> = (0..11).map(|_| Vec::with_capacity(n)).collect();
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
                p.world_size,
                p.batch_size,
            ]) {
                c.push(v);
            }
        }
    }
    let names = [
        c::STEP,
        c::LOSS,
        Metric::TokensPerSecond.name(),
        Metric::MfuPct.name(),
        Metric::Tflops.name(),
        Metric::TrainingTokensPct.name(),
        c::STEP_TIME_S,
        c::ELAPSED_S,
        c::GLOBAL_TOKENS_PER_SECOND,
        c::WORLD_SIZE,
        c::TRAINED_BATCH_SIZE,
    ];
    let mut columns = vec![
        Column::new(c::RUN.into(), run),
        Column::new(c::LOG_INDEX.into(), index),
    ];
    columns.extend(names.iter().zip(cols).map(|(name, v)| opt_col(name, v)));
    Ok(DataFrame::new_infer_height(columns)?)
}

/// Where a run's steady state starts: after the fixed skip and the warm-up
/// points detected after it (from tokens/s).
fn warmup(run: &RunLog, skip_first: usize) -> usize {
    let tps: Vec<f64> = run
        .points
        .iter()
        .skip(skip_first)
        .filter_map(|p| p.tokens_per_second)
        .collect();
    super::stats::warmup_len(&tps)
}

/// The configuration a run belongs to: its name without the `-r<k>` that
/// the planner adds to repeats.
fn configuration(run: &RunLog) -> String {
    let repeat = run.params.get(crate::plan::REPEAT).and_then(|v| v.as_u64());
    match repeat.and_then(|k| run.name.strip_suffix(&format!("-r{k}"))) {
        Some(base) => base.to_string(),
        None => run.name.clone(),
    }
}

/// Runs' states and parameters: one row per run, parameter values as text,
/// with the run's configuration and where its steady state starts.
fn runs_frame(runs: &[RunLog], skip_first: usize) -> Result<(DataFrame, Vec<String>)> {
    let mut keys: Vec<String> = Vec::new();
    for r in runs {
        for k in r.params.keys() {
            if !keys.contains(k) {
                keys.push(k.clone());
            }
        }
    }
    let warm: Vec<u32> = runs.iter().map(|r| warmup(r, skip_first) as u32).collect();
    let mut columns = vec![
        Column::new(
            c::RUN.into(),
            runs.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
        ),
        Column::new(c::ORDER.into(), (0..runs.len() as u32).collect::<Vec<_>>()),
        Column::new(
            c::STATE.into(),
            runs.iter().map(|r| r.status.describe()).collect::<Vec<_>>(),
        ),
        Column::new(
            c::CONFIGURATION.into(),
            runs.iter().map(configuration).collect::<Vec<_>>(),
        ),
        Column::new(
            c::FIRST_STEADY.into(),
            warm.iter()
                .map(|w| w + skip_first as u32)
                .collect::<Vec<_>>(),
        ),
        Column::new(c::WARMUP_POINTS.into(), warm),
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

fn stat(metric: Metric, s: Stat) -> Expr {
    let x = col(metric.name());
    let e = match s {
        Stat::Mean => x.mean(),
        Stat::Median => x.median(),
        Stat::Std => x.std(1),
        Stat::P5 => x.quantile(lit(0.05), QuantileMethod::Linear),
        Stat::P95 => x.quantile(lit(0.95), QuantileMethod::Linear),
    };
    e.alias(metric.col(s))
}

/// Every metric × statistic aggregation.
fn stats(f: impl Fn(Metric, Stat) -> Expr) -> Vec<Expr> {
    Metric::ALL
        .iter()
        .flat_map(|&m| Stat::ALL.iter().map(move |&s| (m, s)))
        .map(|(m, s)| f(m, s))
        .collect()
}

pub fn summarize(runs: &[RunLog], opts: &Options) -> Result<Summary> {
    let points = points_frame(runs)?;
    let (info, params) = runs_frame(runs, opts.skip_first)?;
    for g in &opts.group_by {
        if !params.contains(g) {
            bail!(
                "cannot group by `{g}`: the runs' parameters are {}",
                params.join(", ")
            );
        }
    }
    let per_run = per_run(&points, info)?;
    // The repeats of a configuration are one row, named after it.
    let params: Vec<String> = params
        .into_iter()
        .filter(|p| p != crate::plan::REPEAT)
        .collect();
    let repeated = {
        let configs = per_run.column(c::CONFIGURATION)?.n_unique()?;
        configs < per_run.height()
    };
    let mut table = if !opts.group_by.is_empty() {
        group(&per_run, &opts.group_by, &[])?
    } else if repeated {
        let mut t = group(&per_run, &[c::CONFIGURATION.to_string()], &params)?;
        let names = t.column(c::CONFIGURATION)?.clone().with_name(c::RUN.into());
        t.with_column(names)?;
        let states: Vec<String> = (0..t.height())
            .map(|i| {
                let config = cell(&t, c::CONFIGURATION, i);
                let mut s: Vec<String> = (0..per_run.height())
                    .filter(|&j| cell(&per_run, c::CONFIGURATION, j) == config)
                    .map(|j| cell(&per_run, c::STATE, j))
                    .collect();
                let (n, done) = (s.len(), s.iter().filter(|x| *x == "COMPLETED").count());
                s.sort();
                s.dedup();
                match s.as_slice() {
                    [one] => one.clone(),
                    _ => format!("{done} of {n} COMPLETED"),
                }
            })
            .collect();
        t.with_column(Column::new(c::STATE.into(), states))?;
        t
    } else {
        per_run.clone()
    };
    let members = add_comparisons(&mut table, &per_run, runs, opts)?;
    let tps_samples = members
        .iter()
        .map(|m| samples(Metric::TokensPerSecond, m, &per_run, runs))
        .collect();
    let params = if opts.group_by.is_empty() {
        params
    } else {
        opts.group_by.clone()
    };
    let axes = match &opts.axes {
        _ if !opts.group_by.is_empty() => opts.group_by.clone(),
        Some(a) => a
            .iter()
            .filter(|p| *p != crate::plan::REPEAT)
            .cloned()
            .collect(),
        None => varying(&table, &params),
    };
    add_scaling(&mut table, &axes)?;
    Ok(Summary {
        table,
        points,
        params,
        axes,
        problems: problems(runs),
        members,
        tps_samples,
    })
}

/// One row per run: its statistics over the points after the first
/// `skip_first`, its final loss and wall time, joined to its state and parameters.
fn per_run(points: &DataFrame, info: DataFrame) -> Result<DataFrame> {
    let mut aggs = stats(stat);
    aggs.push(col(c::STEP).count().alias(c::POINTS));
    aggs.push(
        col(c::GLOBAL_TOKENS_PER_SECOND)
            .mean()
            .alias(c::GLOBAL_TOKENS_PER_SECOND),
    );
    aggs.push(
        col(c::WORLD_SIZE)
            .max()
            .fill_null(lit(1.0))
            .alias(c::WORLD_SIZE),
    );
    let measured = points
        .clone()
        .lazy()
        .join(
            info.clone()
                .lazy()
                .select([col(c::RUN), col(c::FIRST_STEADY)]),
            [col(c::RUN)],
            [col(c::RUN)],
            JoinArgs::new(JoinType::Inner),
        )
        .filter(col(c::LOG_INDEX).gt_eq(col(c::FIRST_STEADY)))
        .group_by([col(c::RUN)])
        .agg(aggs);
    let overall = points
        .clone()
        .lazy()
        .sort([c::RUN, c::STEP], Default::default())
        .group_by([col(c::RUN)])
        .agg([
            col(c::LOSS).drop_nulls().last().alias(c::FINAL_LOSS),
            col(c::ELAPSED_S).max().alias(c::WALL_TIME_S),
            col(c::STEP).max().alias(c::LAST_STEP),
            // A property of the run, not of its steady state.
            col(c::TRAINED_BATCH_SIZE)
                .max()
                .alias(c::TRAINED_BATCH_SIZE),
        ]);
    let mut table = info
        .lazy()
        .join(
            measured,
            [col(c::RUN)],
            [col(c::RUN)],
            JoinArgs::new(JoinType::Left),
        )
        .join(
            overall,
            [col(c::RUN)],
            [col(c::RUN)],
            JoinArgs::new(JoinType::Left),
        )
        .sort([c::ORDER], Default::default())
        .with_column(lit(1u32).alias(c::RUNS))
        .collect()
        .map_err(|e| anyhow::anyhow!("summarising the runs: {e}"))?;
    table.rechunk_mut();
    Ok(table)
}

/// One row per group of runs with equal `keys`: the means of the runs'
/// statistics, named after the group's values (`dataset_type=padded
/// pretokenized=true`), with the member runs kept for the baseline lookup.
fn group(per_run: &DataFrame, keys: &[String], carry: &[String]) -> Result<DataFrame> {
    let by: Vec<Expr> = keys.iter().map(|g| col(g.as_str())).collect();
    let mut aggs = stats(|m, s| col(m.col(s)).mean());
    // Parameters shared by every member (a configuration's, for its repeats).
    aggs.extend(carry.iter().map(|p| col(p.as_str()).first()));
    aggs.extend([
        col(c::WARMUP_POINTS).sum(),
        col(c::FINAL_LOSS).mean(),
        col(c::WALL_TIME_S).mean(),
        col(c::GLOBAL_TOKENS_PER_SECOND).mean(),
        col(c::WORLD_SIZE).max(),
        col(c::TRAINED_BATCH_SIZE).max(),
        col(c::POINTS).sum(),
        col(c::RUNS).sum(),
        col(c::RUN).first().alias(c::FIRST_RUN),
        col(c::ORDER).min(),
        col(c::RUN).alias(c::MEMBERS),
    ]);
    let mut grouped = per_run
        .clone()
        .lazy()
        .group_by_stable(by)
        .agg(aggs)
        .sort([c::ORDER], Default::default())
        .collect()?;
    let names: Vec<String> = (0..grouped.height())
        .map(|i| {
            keys.iter()
                .map(|g| format!("{g}={}", cell(&grouped, g, i)))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    grouped.with_column(Column::new(c::RUN.into(), names))?;
    grouped.with_column(Column::new(c::STATE.into(), vec!["-"; grouped.height()]))?;
    Ok(grouped)
}

/// The runs behind each row: its members when grouped, else itself.
fn members(table: &DataFrame) -> Result<Vec<Vec<String>>> {
    let names = |i: usize| vec![cell(table, c::RUN, i)];
    let Ok(list) = table.column(c::MEMBERS).and_then(|m| m.list().cloned()) else {
        return Ok((0..table.height()).map(names).collect());
    };
    Ok((0..table.height())
        .map(|i| match list.get_as_series(i) {
            Some(s) => s
                .str()
                .map(|s| s.iter().flatten().map(str::to_string).collect())
                .unwrap_or_else(|_| names(i)),
            None => names(i),
        })
        .collect())
}

/// What a row's interval is computed over: its member runs' steady-state
/// means when it has several (repeats, groups), else its one run's
/// steady-state log points.
fn samples(metric: Metric, members: &[String], per_run: &DataFrame, runs: &[RunLog]) -> Vec<f64> {
    if members.len() >= 2 {
        return members
            .iter()
            .filter_map(|m| row_of(per_run, c::RUN, m))
            .filter_map(|i| num(per_run, &metric.col(Stat::Mean), i))
            .collect();
    }
    let Some(run) = members
        .first()
        .and_then(|m| runs.iter().find(|r| &r.name == m))
    else {
        return Vec::new();
    };
    let first = row_of(per_run, c::RUN, &run.name)
        .and_then(|i| num(per_run, c::FIRST_STEADY, i))
        .unwrap_or(0.0) as usize;
    run.points
        .iter()
        .skip(first)
        .filter_map(|p| match metric {
            Metric::TokensPerSecond => p.tokens_per_second,
            Metric::MfuPct => p.mfu_pct,
            Metric::Tflops => p.tflops,
            Metric::TrainingTokensPct => p.training_tokens_pct,
        })
        .collect()
}

/// The row of the baseline: the run or configuration of that name, or the
/// group holding that run.
fn baseline_row(table: &DataFrame, members: &[Vec<String>], b: &str) -> Result<usize> {
    row_of(table, c::RUN, b)
        .or_else(|| members.iter().position(|m| m.iter().any(|r| r == b)))
        .ok_or_else(|| {
            anyhow::anyhow!("no run or configuration named `{b}` to measure speedups against")
        })
}

/// How each row compares: the number of runs behind it (`repeats`), 95%
/// intervals of its mean throughput, MFU and TFLOPs, and against the
/// baseline the `speedup` (ratio of mean tokens/s) with its interval and
/// whether it is `significant` (the interval leaves out 1).
fn add_comparisons(
    table: &mut DataFrame,
    per_run: &DataFrame,
    runs: &[RunLog],
    opts: &Options,
) -> Result<Vec<Vec<String>>> {
    let members = members(table)?;
    let h = table.height();
    let repeats: Vec<u32> = members.iter().map(|m| m.len() as u32).collect();
    for metric in c::WITH_INTERVALS {
        let cis: Vec<Option<super::stats::MeanCi>> = members
            .iter()
            .map(|m| super::stats::mean_ci95(&samples(metric, m, per_run, runs)))
            .collect();
        table.with_column(Column::new(
            metric.ci_low().into(),
            cis.iter().map(|ci| ci.map(|c| c.low)).collect::<Vec<_>>(),
        ))?;
        table.with_column(Column::new(
            metric.ci_high().into(),
            cis.iter().map(|ci| ci.map(|c| c.high)).collect::<Vec<_>>(),
        ))?;
    }
    let tps = table
        .column(&Metric::TokensPerSecond.col(Stat::Mean))?
        .f64()?
        .clone();
    let base = match &opts.baseline {
        Some(b) => Some(baseline_row(table, &members, b)?),
        None => None,
    };
    let mut speedup = vec![None; h];
    let (mut low, mut high, mut significant) = (vec![None; h], vec![None; h], vec![None; h]);
    if let Some(b) = base.filter(|&b| tps.get(b).is_some_and(|v| v > 0.0)) {
        let base_tps = tps.get(b).expect("checked");
        let base_samples = samples(Metric::TokensPerSecond, &members[b], per_run, runs);
        for i in 0..h {
            speedup[i] = tps.get(i).map(|v| v / base_tps);
            if i == b {
                continue;
            }
            let mine = samples(Metric::TokensPerSecond, &members[i], per_run, runs);
            if let Some(r) = super::stats::ratio_ci95(&mine, &base_samples) {
                (low[i], high[i], significant[i]) =
                    (Some(r.low), Some(r.high), Some(r.significant));
            }
        }
    }
    table.with_column(Column::new(c::SPEEDUP.into(), speedup))?;
    table.with_column(Column::new(c::SPEEDUP_CI95_LOW.into(), low))?;
    table.with_column(Column::new(c::SPEEDUP_CI95_HIGH.into(), high))?;
    table.with_column(Column::new(c::SIGNIFICANT.into(), significant))?;
    table.with_column(Column::new(c::REPEATS.into(), repeats))?;
    for helper in [c::MEMBERS, c::FIRST_STEADY, c::CONFIGURATION, c::FIRST_RUN] {
        if table
            .get_column_names()
            .iter()
            .any(|n| n.as_str() == helper)
        {
            *table = table.drop(helper)?;
        }
    }
    Ok(members)
}

/// Whole-job throughput and weak-scaling efficiency. `global_tokens_per_second`
/// is the logged figure, else per-device tokens/s × world size;
/// `scaling_efficiency_pct` compares per-device tokens/s with the smallest
/// world size among the rows that differ only in scale (null where a
/// configuration was run at one scale only).
fn add_scaling(table: &mut DataFrame, axes: &[String]) -> Result<()> {
    let tps = table
        .column(&Metric::TokensPerSecond.col(Stat::Mean))?
        .f64()?
        .clone();
    let world: Vec<f64> = (0..table.height())
        .map(|i| num(table, c::WORLD_SIZE, i).unwrap_or(1.0))
        .collect();
    let global: Vec<Option<f64>> = (0..table.height())
        .map(|i| {
            num(table, c::GLOBAL_TOKENS_PER_SECOND, i).or_else(|| tps.get(i).map(|t| t * world[i]))
        })
        .collect();
    let config_of = |i: usize| -> Vec<String> {
        axes.iter()
            .filter(|a| !c::SCALE_PARAMS.contains(&a.as_str()))
            .map(|a| cell(table, a, i))
            .collect()
    };
    let configs: Vec<Vec<String>> = (0..table.height()).map(config_of).collect();
    let efficiency: Vec<Option<f64>> = (0..table.height())
        .map(|i| {
            let peers: Vec<usize> = (0..table.height())
                .filter(|&j| configs[j] == configs[i] && tps.get(j).is_some())
                .collect();
            let smallest = peers
                .iter()
                .copied()
                .min_by(|&a, &b| world[a].total_cmp(&world[b]))?;
            let scales_differ = peers.iter().any(|&j| world[j] != world[smallest]);
            let base = tps.get(smallest).filter(|b| *b > 0.0)?;
            if !scales_differ {
                return None;
            }
            Some(100.0 * tps.get(i)? / base)
        })
        .collect();
    table.with_column(Column::new(c::GLOBAL_TOKENS_PER_SECOND.into(), global))?;
    table.with_column(Column::new(c::SCALING_EFFICIENCY_PCT.into(), efficiency))?;
    Ok(())
}

/// The parameters whose value differs between rows (for imported logs, whose
/// axes are not declared): what charts group and label by.
fn varying(table: &DataFrame, params: &[String]) -> Vec<String> {
    params
        .iter()
        .filter(|p| !p.starts_with("global_"))
        .filter(|p| {
            let mut seen: Vec<String> = (0..table.height())
                .map(|i| cell(table, p, i))
                .filter(|v| !v.is_empty())
                .collect();
            seen.sort();
            seen.dedup();
            seen.len() > 1
        })
        .cloned()
        .collect()
}

/// Runs without points, that did not complete, or with unreadable logs.
fn problems(runs: &[RunLog]) -> Vec<Problem> {
    runs.iter()
        .filter(|r| {
            r.points.is_empty() || r.status.state != State::Completed || !r.read_errors.is_empty()
        })
        .map(|r| {
            let known: Vec<&str> = r
                .reason
                .iter()
                .chain(&r.read_errors)
                .map(String::as_str)
                .collect();
            let reason = match (known.is_empty(), r.points.is_empty()) {
                (false, _) => known.join("; "),
                (true, true) => "no metrics".into(),
                (true, false) => "not finished".into(),
            };
            Problem {
                run: r.name.clone(),
                state: r.status.describe(),
                reason,
            }
        })
        .collect()
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

/// The speedup of row `i` as tables and charts print it: `1.07x [1.02, 1.12]`,
/// with `≈` when its interval holds 1.
pub fn speedup_text(t: &DataFrame, i: usize) -> Option<String> {
    let v = num(t, c::SPEEDUP, i)?;
    let interval = match (
        num(t, c::SPEEDUP_CI95_LOW, i),
        num(t, c::SPEEDUP_CI95_HIGH, i),
    ) {
        (Some(lo), Some(hi)) => format!(" [{lo:.2}, {hi:.2}]"),
        _ => String::new(),
    };
    let same = matches!(
        t.column(c::SIGNIFICANT).and_then(|s| s.get(i)),
        Ok(AnyValue::Boolean(false))
    );
    Some(format!("{}{v:.2}x{interval}", if same { "≈" } else { "" }))
}
