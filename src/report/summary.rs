//! Runs -> tables, with polars: every log point of every run in one frame,
//! the first K points of each run skipped (warm-up, as the reference study
//! did), then per run the mean, median, std and 5th/95th percentiles of
//! throughput, MFU, TFLOPs and training-token share, the final loss and the
//! wall time; a configuration's repeats (or, on request, groups of runs) as
//! one row; intervals, speedups against a baseline and scaling.
//!
//! The result is the table as a frame (its columns are what CSV, Parquet and
//! JSON carry) and the same rows typed ([`Row`]): what the markdown table,
//! the charts and comparisons read. Runs are told apart by their position,
//! never by their names, which imported logs may repeat.

use super::columns::{self as c, Measure, Metric, Stat};
use super::ingest::{Field, RunLog};
use super::stats::{holm_judged, mean_ci95, paired_ratio_ci95, ratio_ci95, RatioCi};
use crate::executor::State;
use anyhow::{bail, Context as _, Result};
use indexmap::IndexMap;
use polars::prelude::*;

#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The sweep's axes, when known (else the varying parameters are used).
    pub axes: Option<Vec<String>>,
    pub skip_first: usize,
    /// A run name (or, with grouping, any run of the baseline group).
    pub baseline: Option<String>,
    pub group_by: Vec<String>,
    /// The extra fields of the runs' points (a line pattern's own groups).
    pub extras: Vec<String>,
}

pub struct Summary {
    /// One row per run, configuration or group: `run`, `state`, `runs`,
    /// `points`, `<metric>_<stat>`, intervals, `final_loss`, `wall_time_s`,
    /// `speedup`, scaling, then parameters.
    pub table: DataFrame,
    /// The table's rows, typed.
    pub rows: Vec<Row>,
    /// Every run read, with its log points (for curves).
    pub runs: Vec<RunLog>,
    /// Parameter columns of the table, in order.
    pub params: Vec<String>,
    /// The parameters that distinguish configurations (a sweep's axes; for
    /// imported logs, the parameters that vary): what charts group and label by.
    pub axes: Vec<String>,
    /// The axis that is the per-device batch size, if one is: the trainer's
    /// `batch_size`, or a command's parameter named `…batch_size` (not a
    /// global batch).
    pub batch_axis: Option<String>,
    /// Runs without usable points, that did not complete, or with something
    /// left out of their logs, with the reason.
    pub problems: Vec<Problem>,
    /// What would make the figures more useful (e.g. more repeats), for the
    /// lines after the table.
    pub hints: Vec<String>,
    /// The extra fields summarised (each row's [`Row::extra`]), in order.
    pub extras: Vec<String>,
    /// Each run's own steady-state figures, by position in `runs` (what
    /// the history records).
    pub figures: Vec<RunFigures>,
    /// Ranks of data-parallel runs slower than their peers, by run.
    pub stragglers: Vec<super::straggler::Straggler>,
    /// A blocked design's places and position check (none otherwise).
    pub design: Option<super::blocks::Design>,
}

impl Summary {
    /// How a blocked design's speedups were found, in a sentence (none for
    /// other designs): paired by block, or — one block — not paired.
    pub fn pairing(&self) -> Option<String> {
        Some(match self.blocks()? {
            1 => "Randomized blocks (1): one block cannot be paired — each speedup's interval is \
                  over its runs' own steps, which leaves out the spread between runs; measure two \
                  or more blocks (repeats ≥ 2)"
                .to_string(),
            n => format!(
                "Randomized blocks ({n}): each speedup is paired by block — a t-interval over the \
                 blocks' log-ratios, each block's runs measured in one place and hour"
            ),
        })
    }

    /// The number of blocks, where the runs come from a blocked design
    /// (with two or more, their speedups are paired by block).
    pub fn blocks(&self) -> Option<usize> {
        let blocks: std::collections::BTreeSet<u32> = self
            .runs
            .iter()
            .filter_map(|r| Some(r.block?.block))
            .collect();
        (!blocks.is_empty()).then_some(blocks.len())
    }
}

/// One run's figures over its steady state: the means its configuration's
/// row averages, and the spread and count its interval needs.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RunFigures {
    /// Steady-state log points with a throughput.
    pub points: usize,
    pub tokens_per_second: Option<f64>,
    /// Standard deviation of its steady-state tokens/s (n − 1).
    pub tokens_per_second_std: Option<f64>,
    pub mfu_pct: Option<f64>,
    pub tflops: Option<f64>,
    pub step_time_s: Option<f64>,
    pub peak_memory_mb: Option<f64>,
}

/// One row of the table: a run, a configuration's repeats, or a group.
#[derive(Debug, Clone)]
pub struct Row {
    pub name: String,
    /// The state of its runs (`COMPLETED`, `FAILED (exit 3)`, `2 of 3 COMPLETED`).
    pub state: String,
    /// The runs behind the row, by name.
    pub members: Vec<String>,
    /// The same runs, by position in [`Summary::runs`].
    pub runs: Vec<usize>,
    /// Steady-state log points over all its runs.
    pub points: usize,
    pub warmup_points: usize,
    /// Parameter values as the table prints them.
    pub params: IndexMap<String, String>,
    /// Statistics of each measure: [`Metric::ALL`]'s, then the extra fields'.
    metrics: Vec<MetricStats>,
    pub final_loss: Option<f64>,
    pub wall_time_s: Option<f64>,
    /// Ranks training together (1 when the logs do not say).
    pub world_size: f64,
    pub global_tokens_per_second: Option<f64>,
    pub scaling_efficiency_pct: Option<f64>,
    /// The same ratio as `sweep plan`'s scaling forecast has it.
    pub forecast_efficiency_pct: Option<f64>,
    /// The batch each run trained at, as its metrics say (the largest of
    /// its runs').
    pub trained_batch_size: Option<f64>,
    /// The smallest and largest batch its runs trained at, when they differ
    /// (a group over batch sizes).
    pub trained_batch_range: Option<(f64, f64)>,
    /// Against the baseline (none without one, or for rows without throughput).
    pub speedup: Option<Speedup>,
    /// What the row's tokens/s interval was computed from (its repeats'
    /// means, or its one run's steady-state points): for comparisons.
    pub tps_samples: Vec<f64>,
}

/// A metric's statistics over a row's steady-state points.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MetricStats {
    pub mean: Option<f64>,
    pub median: Option<f64>,
    pub std: Option<f64>,
    pub p5: Option<f64>,
    pub p95: Option<f64>,
    /// The 95% interval of the mean.
    pub ci95: Option<(f64, f64)>,
}

impl MetricStats {
    pub fn stat(&self, s: Stat) -> Option<f64> {
        match s {
            Stat::Mean => self.mean,
            Stat::Median => self.median,
            Stat::Std => self.std,
            Stat::P5 => self.p5,
            Stat::P95 => self.p95,
        }
    }
}

/// Mean tokens/s over the baseline's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Speedup {
    pub ratio: f64,
    pub ci95: Option<(f64, f64)>,
    /// The p-value of "no difference", and Holm's adjustment of it over the
    /// study's comparisons with the baseline.
    pub p_value: Option<f64>,
    pub p_value_holm: Option<f64>,
    /// Whether the Holm-adjusted p-value is below 0.05; none for the
    /// baseline itself.
    pub significant: Option<bool>,
}

impl Speedup {
    /// As tables and charts print it: `1.07x [1.02, 1.12]`, with `≈` when
    /// its interval holds 1.
    pub fn text(&self) -> String {
        let interval = match self.ci95 {
            Some((lo, hi)) => format!(" [{lo:.2}, {hi:.2}]"),
            None => String::new(),
        };
        let same = if self.significant == Some(false) {
            "≈"
        } else {
            ""
        };
        format!("{same}{:.2}x{interval}", self.ratio)
    }
}

impl Row {
    pub fn metric(&self, m: Metric) -> &MetricStats {
        let i = Metric::ALL.iter().position(|&x| x == m).expect("in ALL");
        &self.metrics[i]
    }

    /// The statistics of extra field `i` ([`Summary::extras`]).
    pub fn extra(&self, i: usize) -> Option<&MetricStats> {
        self.metrics.get(Metric::ALL.len() + i)
    }

    /// The peak FLOP/s per device its MFU is measured against (TFLOP/s),
    /// as its figures imply: every row's own (a precision's, a device's).
    pub fn mfu_peak_tflops(&self) -> Option<f64> {
        let tflops = self.metric(Metric::Tflops).mean?;
        let mfu = self.metric(Metric::MfuPct).mean.filter(|m| *m > 0.0)?;
        Some(100.0 * tflops / mfu).filter(|p| p.is_finite())
    }

    /// A parameter's value as printed, empty when the row has none.
    pub fn param(&self, key: &str) -> &str {
        self.params.get(key).map_or("", String::as_str)
    }
}

/// A run the table cannot fully account for.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    pub run: String,
    /// As the executor or the log describes it: `FAILED (exit 3)`, `UNKNOWN`, ...
    pub state: String,
    pub reason: String,
}

impl Problem {
    /// `run: state, reason`, safe to print (names and reasons come from
    /// files) and bounded (a reason quoting a huge record is cut).
    pub fn describe(&self) -> String {
        use crate::util::text::{cell, note};
        format!(
            "{}: {}, {}",
            cell(&self.run),
            cell(&self.state),
            note(&self.reason)
        )
    }
}

pub fn summarize(runs: Vec<RunLog>, opts: &Options) -> Result<Summary> {
    let measures = Measure::all(&opts.extras);
    let points = points_frame(&runs, &opts.extras)?;
    let (info, params) = runs_frame(&runs, opts.skip_first)?;
    check_extras(&opts.extras, &params)?;
    for g in &opts.group_by {
        if !params.contains(g) {
            bail!(
                "cannot group by `{g}`: the runs' parameters are {}",
                params.join(", ")
            );
        }
    }
    let per_run = per_run(&points, info, &measures)?;
    // The repeats of a configuration are one row, named after it.
    let params: Vec<String> = params
        .into_iter()
        .filter(|p| p != crate::plan::REPEAT)
        .collect();
    let configurations = per_run.column(c::CONFIGURATION)?.n_unique()?;
    let mut table = if !opts.group_by.is_empty() {
        group(&per_run, &opts.group_by, &[], &measures)?
    } else if configurations < per_run.height() {
        let mut t = group(
            &per_run,
            &[c::CONFIGURATION.to_string()],
            &params,
            &measures,
        )?;
        let names = t
            .column(c::CONFIGURATION_NAME)?
            .clone()
            .with_name(c::RUN.into());
        t.with_column(names)?;
        t
    } else {
        per_run.clone()
    };
    let members = members(&table)?;
    let states: Vec<String> = members.iter().map(|m| state_of(m, &runs)).collect();
    table.with_column(Column::new(c::STATE.into(), states))?;
    let tps_samples: Vec<Vec<f64>> = members
        .iter()
        .map(|m| samples(&TPS, m, &per_run, &runs))
        .collect();
    add_comparisons(&mut table, &members, &per_run, &runs, opts, &measures)?;
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
    let rows = rows(&table, &params, &members, &runs, tps_samples, &measures)?;
    table.with_column(Column::new(
        c::MFU_PEAK_TFLOPS.into(),
        rows.iter().map(Row::mfu_peak_tflops).collect::<Vec<_>>(),
    ))?;
    let batch_axis = axes
        .iter()
        .find(|p| p.ends_with("batch_size") && !p.contains("global"))
        .cloned();
    let hints = repeats_hint(&rows).into_iter().collect();
    let figures = run_figures(&per_run, &runs)?;
    let stragglers = runs.iter().flat_map(super::straggler::find).collect();
    let tps: Vec<Option<f64>> = figures.iter().map(|f| f.tokens_per_second).collect();
    let design = super::blocks::design(&runs, &tps);
    Ok(Summary {
        design,
        hints,
        table,
        rows,
        problems: [problems(&runs), short_runs(&runs, opts.skip_first)].concat(),

        runs,
        params,
        axes,
        batch_axis,
        extras: opts.extras.clone(),
        figures,
        stragglers,
    })
}

/// Every run's [`RunFigures`], from the per-run table (the same means the
/// summary's rows average) and its steady-state points.
fn run_figures(per_run: &DataFrame, runs: &[RunLog]) -> Result<Vec<RunFigures>> {
    let mean = |m: Metric| number_column(per_run, &m.col(Stat::Mean));
    let tps = mean(Metric::TokensPerSecond)?;
    let tps_std = number_column(per_run, &Metric::TokensPerSecond.col(Stat::Std))?;
    let (mfu, tflops, memory) = (
        mean(Metric::MfuPct)?,
        mean(Metric::Tflops)?,
        mean(Metric::PeakMemoryMb)?,
    );
    let first = number_column(per_run, c::FIRST_STEADY)?;
    Ok(runs
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let steady = || r.points.iter().skip(first[i].unwrap_or(0.0) as usize);
            let step_times: Vec<f64> = steady().filter_map(|p| p.step_time_s).collect();
            RunFigures {
                points: steady().filter(|p| p.tokens_per_second.is_some()).count(),
                tokens_per_second: tps[i],
                tokens_per_second_std: tps_std[i],
                mfu_pct: mfu[i],
                tflops: tflops[i],
                step_time_s: (!step_times.is_empty())
                    .then(|| step_times.iter().sum::<f64>() / step_times.len() as f64),
                peak_memory_mb: memory[i],
            }
        })
        .collect())
}

const TPS: Measure = Measure::Known(Metric::TokensPerSecond);

/// Extra fields become columns `<name>`, `<name>_mean`, ...: none may take
/// the name of a column the tables already have.
fn check_extras(extras: &[String], params: &[String]) -> Result<()> {
    let frame = [
        c::ORDER,
        c::LOG_INDEX,
        c::STEP,
        c::TRAINED_BATCH_SIZE,
        c::RUN,
        c::STATE,
    ];
    for x in extras {
        let m = Measure::Extra {
            index: 0,
            name: x.clone(),
        };
        let mut cols: Vec<String> = Stat::ALL.iter().map(|&s| m.col(s)).collect();
        cols.extend([m.ci_low(), m.ci_high(), x.clone()]);
        let clash = cols.iter().find(|col| {
            frame.contains(&col.as_str())
                || params.contains(col)
                || extras.iter().any(|y| y != x && &y == col)
        });
        if let Some(col) = clash {
            bail!(
                "the line pattern's group `{x}` would be summarised in a column `{col}`, a name the table already has: rename the group"
            );
        }
    }
    Ok(())
}

/// Every point of every run as one frame: `order` (the run's position),
/// `log_index`, `step`, then a column per [`Field`] (named as the field, but
/// for the batch size: [`c::TRAINED_BATCH_SIZE`]).
fn points_frame(runs: &[RunLog], extras: &[String]) -> Result<DataFrame> {
    let all = || runs.iter().flat_map(|r| r.points.iter());
    let mut columns = vec![
        Column::new(
            c::ORDER.into(),
            (0..runs.len() as u32)
                .flat_map(|i| std::iter::repeat_n(i, runs[i as usize].points.len()))
                .collect::<Vec<_>>(),
        ),
        Column::new(
            c::LOG_INDEX.into(),
            runs.iter()
                .flat_map(|r| 0..r.points.len() as u32)
                .collect::<Vec<_>>(),
        ),
        Column::new(c::STEP.into(), all().map(|p| p.step).collect::<Vec<_>>()),
    ];
    for f in Field::ALL {
        let name = match f {
            Field::BatchSize => c::TRAINED_BATCH_SIZE,
            f => f.name(),
        };
        let values: Vec<Option<f64>> = all().map(|p| f.of(p)).collect();
        columns.push(Column::new(name.into(), values));
    }
    for (i, x) in extras.iter().enumerate() {
        let values: Vec<Option<f64>> = all().map(|p| p.extra.get(i).copied().flatten()).collect();
        columns.push(Column::new(x.as_str().into(), values));
    }
    Ok(DataFrame::new_infer_height(columns)?)
}

/// The log points a run skips as warm-up: `skip_first`, unless that leaves
/// it no point with a throughput; then only its first point (the one that
/// pays for compilation and caches), and [`short_runs`] says so.
fn skip_of(run: &RunLog, skip_first: usize) -> usize {
    let measured = run
        .points
        .iter()
        .filter(|p| p.tokens_per_second.is_some())
        .count();
    match measured > skip_first || measured == 0 {
        true => skip_first,
        false => usize::from(run.points.len() > 1),
    }
}

/// Runs whose log is too short for the warm-up skip, with what their
/// figures use instead: a short study never gives a blank table silently.
fn short_runs(runs: &[RunLog], skip_first: usize) -> Vec<Problem> {
    runs.iter()
        .filter(|r| skip_of(r, skip_first) != skip_first)
        .map(|r| Problem {
            run: r.name.clone(),
            state: r.status.describe(),
            reason: format!(
                "it logged {} points, not more than the {skip_first} the report skips as warm-up: \
                 its figures use every point after the first (log more steps, or lower \
                 `[report] skip_first` / --skip-first)",
                r.points.len()
            ),
        })
        .collect()
}

/// Two repeats give an interval from one degree of freedom, Student's t of
/// 12.7 at 95%: say what three or more give.
fn repeats_hint(rows: &[Row]) -> Option<String> {
    rows.iter().any(|r| r.members.len() == 2).then(|| {
        "rows of 2 repeats have wide 95% intervals (Student's t with 1 degree of freedom: \
         ±12.7 standard errors); 3 repeats make it ±4.3, 5 ±2.8 (`[sweep] repeats`)"
            .to_string()
    })
}

/// Where a run's steady state starts: after its skip ([`skip_of`]) and the
/// warm-up points detected after it (from tokens/s).
fn warmup(run: &RunLog, skip_first: usize) -> usize {
    let tps: Vec<f64> = run
        .points
        .iter()
        .skip(skip_of(run, skip_first))
        .filter_map(|p| p.tokens_per_second)
        .collect();
    super::stats::warmup_len(&tps)
}

/// Runs and their parameters: one row per run, parameter values as text,
/// with the run's configuration (the key its repeats share, and its name)
/// and where its steady state starts.
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
    let config = |r: &RunLog| {
        r.configuration
            .as_ref()
            .map(|c| (c.id.clone(), c.name.clone()))
    };
    let mut columns = vec![
        Column::new(
            c::RUN.into(),
            runs.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
        ),
        Column::new(c::ORDER.into(), (0..runs.len() as u32).collect::<Vec<_>>()),
        // A run without a configuration (imported logs) is one of its own.
        Column::new(
            c::CONFIGURATION.into(),
            runs.iter()
                .enumerate()
                .map(|(i, r)| config(r).map_or_else(|| format!("run #{i}"), |c| c.0))
                .collect::<Vec<_>>(),
        ),
        Column::new(
            c::CONFIGURATION_NAME.into(),
            runs.iter()
                .map(|r| config(r).map_or_else(|| r.name.clone(), |c| c.1))
                .collect::<Vec<_>>(),
        ),
        Column::new(
            c::FIRST_STEADY.into(),
            runs.iter()
                .zip(&warm)
                .map(|(r, w)| w + skip_of(r, skip_first) as u32)
                .collect::<Vec<_>>(),
        ),
        Column::new(c::WARMUP_POINTS.into(), warm),
        Column::new(
            c::FORECAST_VS_ONE_DEVICE.into(),
            runs.iter().map(|r| r.forecast_pct).collect::<Vec<_>>(),
        ),
        Column::new(
            c::JOB_RUN_S.into(),
            runs.iter()
                .map(|r| r.status.run_s.map(|s| s as f64))
                .collect::<Vec<_>>(),
        ),
    ];
    for k in &keys {
        let values: Vec<Option<String>> = runs
            .iter()
            .map(|r| r.params.get(k).map(param_text))
            .collect();
        columns.push(Column::new(k.as_str().into(), values));
    }
    Ok((DataFrame::new_infer_height(columns)?, keys))
}

/// A parameter's value as the table's text column holds it.
pub fn param_text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn stat(metric: &Measure, s: Stat) -> Expr {
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

/// Every measure × statistic aggregation.
fn stats(measures: &[Measure], f: impl Fn(&Measure, Stat) -> Expr) -> Vec<Expr> {
    measures
        .iter()
        .flat_map(|m| Stat::ALL.iter().map(move |&s| (m, s)))
        .map(|(m, s)| f(m, s))
        .collect()
}

/// One row per run, in run order: its statistics over the points after the
/// first `skip_first`, its final loss and wall time, joined to its parameters.
fn per_run(points: &DataFrame, info: DataFrame, measures: &[Measure]) -> Result<DataFrame> {
    let mut aggs = stats(measures, stat);
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
                .select([col(c::ORDER), col(c::FIRST_STEADY)]),
            [col(c::ORDER)],
            [col(c::ORDER)],
            JoinArgs::new(JoinType::Inner),
        )
        .filter(col(c::LOG_INDEX).gt_eq(col(c::FIRST_STEADY)))
        .group_by([col(c::ORDER)])
        .agg(aggs);
    let overall = points
        .clone()
        .lazy()
        .sort([c::ORDER, c::STEP], Default::default())
        .group_by([col(c::ORDER)])
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
            [col(c::ORDER)],
            [col(c::ORDER)],
            JoinArgs::new(JoinType::Left),
        )
        .join(
            overall,
            [col(c::ORDER)],
            [col(c::ORDER)],
            JoinArgs::new(JoinType::Left),
        )
        .sort([c::ORDER], Default::default())
        .with_column(lit(1u32).alias(c::RUNS))
        // A log without a clock: the job's run time as its executor saw it.
        .with_column(
            when(col(c::WALL_TIME_S).is_null())
                .then(col(c::JOB_RUN_S))
                .otherwise(col(c::WALL_TIME_S))
                .alias(c::WALL_TIME_S),
        )
        .collect()
        .map_err(|e| anyhow::anyhow!("summarising the runs: {e}"))?;
    table = table.drop(c::JOB_RUN_S)?;
    // A study that names a parameter `world_size` (ddp-scaling.toml derives
    // it) has the logged one twice: the parameter says the same, keep it.
    let duplicate = format!("{}_right", c::WORLD_SIZE);
    if table
        .get_column_names()
        .iter()
        .any(|n| n.as_str() == duplicate)
    {
        table = table.drop(&duplicate)?;
    }
    table.rechunk_mut();
    Ok(table)
}

/// One row per group of runs with equal `keys`: the means of the runs'
/// statistics, named after the group's values (`dataset_type=padded
/// pretokenized=true`), with the positions of its runs.
fn group(
    per_run: &DataFrame,
    keys: &[String],
    carry: &[String],
    measures: &[Measure],
) -> Result<DataFrame> {
    let by: Vec<Expr> = keys.iter().map(|g| col(g.as_str())).collect();
    let mut aggs = stats(measures, |m, s| col(m.col(s)).mean());
    // Parameters shared by every member (a configuration's, for its repeats).
    aggs.extend(carry.iter().map(|p| col(p.as_str()).first()));
    aggs.extend([
        col(c::WARMUP_POINTS).sum(),
        col(c::FINAL_LOSS).mean(),
        col(c::WALL_TIME_S).mean(),
        col(c::GLOBAL_TOKENS_PER_SECOND).mean(),
        col(c::WORLD_SIZE).max(),
        col(c::FORECAST_VS_ONE_DEVICE).max(),
        col(c::TRAINED_BATCH_SIZE).max(),
        col(c::POINTS).sum(),
        col(c::RUNS).sum(),
        col(c::CONFIGURATION_NAME).first(),
        col(c::ORDER).min(),
        col(c::ORDER).alias(c::MEMBERS),
    ]);
    let mut grouped = per_run
        .clone()
        .lazy()
        .group_by_stable(by)
        .agg(aggs)
        .sort([c::ORDER], Default::default())
        .collect()?;
    let values: Vec<Vec<Option<String>>> = keys
        .iter()
        .map(|g| text_column(&grouped, g))
        .collect::<Result<_>>()?;
    let names: Vec<String> = (0..grouped.height())
        .map(|i| {
            keys.iter()
                .zip(&values)
                .map(|(g, v)| format!("{g}={}", v[i].as_deref().unwrap_or("")))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    grouped.with_column(Column::new(c::RUN.into(), names))?;
    Ok(grouped)
}

/// The runs behind each row, by position: its members when grouped, else itself.
fn members(table: &DataFrame) -> Result<Vec<Vec<usize>>> {
    if table.column(c::MEMBERS).is_err() {
        return Ok(number_column(table, c::ORDER)?
            .into_iter()
            .map(|o| vec![o.unwrap_or(0.0) as usize])
            .collect());
    }
    let list = table.column(c::MEMBERS)?.list()?.clone();
    (0..table.height())
        .map(|i| {
            let s = list.get_as_series(i).context("a group without members")?;
            Ok(s.u32()?.iter().flatten().map(|o| o as usize).collect())
        })
        .collect()
}

/// The state of a row's runs: theirs when they agree, else how many completed.
fn state_of(members: &[usize], runs: &[RunLog]) -> String {
    let mut states: Vec<String> = members.iter().map(|&m| runs[m].status.describe()).collect();
    let done = members
        .iter()
        .filter(|&&m| runs[m].status.state == State::Completed)
        .count();
    states.sort();
    states.dedup();
    match states.as_slice() {
        [one] => one.clone(),
        _ => format!("{done} of {} COMPLETED", members.len()),
    }
}

/// What a row's interval is computed over: its member runs' steady-state
/// means when it has several (repeats, groups), else its one run's
/// steady-state log points. `per_run` has one row per run, in run order.
/// A configuration's and the baseline's run means paired by block, where
/// every run of both has a block and they share two or more; none
/// otherwise (the comparison is then unpaired).
fn blocked_pairs(
    mine: &[usize],
    base: &[usize],
    runs: &[RunLog],
    means: &[Option<f64>],
) -> Option<Vec<(f64, f64)>> {
    let by_block = |members: &[usize]| -> Option<std::collections::BTreeMap<u32, f64>> {
        members
            .iter()
            .map(|&m| Some((runs[m].block?.block, means.get(m).copied().flatten()?)))
            .collect()
    };
    let (a, b) = (by_block(mine)?, by_block(base)?);
    let pairs: Vec<(f64, f64)> = a
        .iter()
        .filter_map(|(k, x)| Some((*x, *b.get(k)?)))
        .collect();
    (pairs.len() >= 2).then_some(pairs)
}

fn samples(metric: &Measure, members: &[usize], per_run: &DataFrame, runs: &[RunLog]) -> Vec<f64> {
    let means = number_column(per_run, &metric.col(Stat::Mean)).unwrap_or_default();
    if members.len() >= 2 {
        return members
            .iter()
            .filter_map(|&m| means.get(m).copied().flatten())
            .collect();
    }
    let Some(&m) = members.first() else {
        return Vec::new();
    };
    let first = number_column(per_run, c::FIRST_STEADY)
        .ok()
        .and_then(|f| f.get(m).copied().flatten())
        .unwrap_or(0.0) as usize;
    runs[m]
        .points
        .iter()
        .skip(first)
        .filter_map(|p| metric.of(p))
        .collect()
}

/// The row of the baseline: the run or configuration of that name, or the
/// group holding that run.
fn baseline_row(
    names: &[Option<String>],
    members: &[Vec<usize>],
    runs: &[RunLog],
    b: &str,
) -> Result<usize> {
    names
        .iter()
        .position(|n| n.as_deref() == Some(b))
        .or_else(|| {
            members.iter().position(|m| {
                m.iter().any(|&r| {
                    runs[r].name == b || runs[r].configuration.as_ref().is_some_and(|c| c.name == b)
                })
            })
        })
        .ok_or_else(|| {
            const SHOWN: usize = 20;
            let rows: Vec<&str> = names.iter().flatten().map(String::as_str).collect();
            let more = match rows.len() > SHOWN {
                true => format!(", and {} more", rows.len() - SHOWN),
                false => String::new(),
            };
            // Runs whose record is missing or unreadable name no
            // configuration: the baseline may be among them.
            let unrecorded: Vec<&str> = runs
                .iter()
                .filter(|r| r.configuration.is_none() && r.points.is_empty() && !r.issues.is_empty())
                .map(|r| r.name.as_str())
                .collect();
            let missing = match unrecorded.len() {
                0 => String::new(),
                n => format!(
                    "; {n} run(s) have no readable record (run.json) and are counted as missing, the baseline's perhaps among them: {}",
                    unrecorded.iter().take(5).map(|r| format!("`{}`", crate::util::text::cell(r))).collect::<Vec<_>>().join(", ")
                ),
            };
            anyhow::anyhow!(
                "no row, configuration or run named `{}` to measure speedups against; the rows are {}{more} \
                 (with grouping, a row is named by its group's values, e.g. `{}`, and any run or configuration in it names it too){missing}",
                crate::util::text::cell(b),
                rows.iter().take(SHOWN).map(|r| format!("`{}`", crate::util::text::cell(r))).collect::<Vec<_>>().join(", "),
                rows.first().map(|r| crate::util::text::cell(r)).unwrap_or_default()
            )
        })
}

/// How each row compares: the number of runs behind it (`repeats`), 95%
/// intervals of its mean throughput, MFU and TFLOPs, and against the
/// baseline the `speedup` (ratio of mean tokens/s) with its interval and
/// whether it is `significant` (the interval leaves out 1).
fn add_comparisons(
    table: &mut DataFrame,
    members: &[Vec<usize>],
    per_run: &DataFrame,
    runs: &[RunLog],
    opts: &Options,
    measures: &[Measure],
) -> Result<()> {
    let h = table.height();
    let repeats: Vec<u32> = members.iter().map(|m| m.len() as u32).collect();
    for metric in measures.iter().filter(|m| m.has_interval()) {
        let cis: Vec<Option<super::stats::MeanCi>> = members
            .iter()
            .map(|m| mean_ci95(&samples(metric, m, per_run, runs)))
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
    let tps = number_column(table, &Metric::TokensPerSecond.col(Stat::Mean))?;
    let base = match &opts.baseline {
        Some(b) => Some(baseline_row(
            &text_column(table, c::RUN)?,
            members,
            runs,
            b,
        )?),
        None => None,
    };
    let mut speedup = vec![None; h];
    let mut compared = vec![None; h];
    if let Some((b, base_tps)) = base.and_then(|b| Some((b, tps[b].filter(|v| *v > 0.0)?))) {
        let tps_of = |i: usize| samples(&TPS, &members[i], per_run, runs);
        let base_samples = tps_of(b);
        let mine: Vec<Vec<f64>> = (0..h).map(tps_of).collect();
        let pairs: Vec<_> = (0..h)
            .map(|i| (i != b).then(|| (mine[i].as_slice(), base_samples.as_slice())))
            .collect();
        for i in 0..h {
            speedup[i] = tps[i].map(|v| v / base_tps).filter(|s| s.is_finite());
        }
        // The rows' comparisons with the baseline are one family: the
        // verdicts are Holm's, the intervals each comparison's own. Runs of
        // a blocked design are compared block by block (paired).
        let run_means = number_column(per_run, &Metric::TokensPerSecond.col(Stat::Mean))?;
        let ratios = (0..h)
            .map(|i| {
                let (mine, base) = pairs[i]?;
                match blocked_pairs(&members[i], &members[b], runs, &run_means) {
                    Some(by_block) => paired_ratio_ci95(&by_block),
                    None => ratio_ci95(mine, base),
                }
            })
            .collect();
        compared = holm_judged(ratios);
    }
    let of = |f: fn(&(RatioCi, f64)) -> f64| -> Vec<Option<f64>> {
        compared.iter().map(|c| c.as_ref().map(f)).collect()
    };
    let (low, high) = (of(|c| c.0.low), of(|c| c.0.high));
    let (p_value, adjusted) = (of(|c| c.0.p_value), of(|c| c.1));
    let significant: Vec<Option<bool>> = compared
        .iter()
        .map(|c| c.as_ref().map(|c| c.0.significant))
        .collect();
    table.with_column(Column::new(c::SPEEDUP.into(), speedup))?;
    table.with_column(Column::new(c::SPEEDUP_CI95_LOW.into(), low))?;
    table.with_column(Column::new(c::SPEEDUP_CI95_HIGH.into(), high))?;
    table.with_column(Column::new(c::SPEEDUP_P_VALUE.into(), p_value))?;
    table.with_column(Column::new(c::SPEEDUP_P_VALUE_HOLM.into(), adjusted))?;
    table.with_column(Column::new(c::SIGNIFICANT.into(), significant))?;
    table.with_column(Column::new(c::REPEATS.into(), repeats))?;
    for helper in [
        c::MEMBERS,
        c::FIRST_STEADY,
        c::CONFIGURATION,
        c::CONFIGURATION_NAME,
    ] {
        if table
            .get_column_names()
            .iter()
            .any(|n| n.as_str() == helper)
        {
            *table = table.drop(helper)?;
        }
    }
    Ok(())
}

/// Whole-job throughput and weak-scaling efficiency. `global_tokens_per_second`
/// is the logged figure, else per-device tokens/s × world size;
/// `scaling_efficiency_pct` compares per-device tokens/s with the smallest
/// world size among the rows that differ only in scale (null where a
/// configuration was run at one scale only).
fn add_scaling(table: &mut DataFrame, axes: &[String]) -> Result<()> {
    let h = table.height();
    let tps = number_column(table, &Metric::TokensPerSecond.col(Stat::Mean))?;
    let world: Vec<f64> = number_column(table, c::WORLD_SIZE)?
        .into_iter()
        .map(|w| w.unwrap_or(1.0))
        .collect();
    let logged = number_column(table, c::GLOBAL_TOKENS_PER_SECOND)?;
    let global: Vec<Option<f64>> = (0..h)
        .map(|i| logged[i].or_else(|| tps[i].map(|t| t * world[i])))
        .collect();
    let config_values: Vec<Vec<Option<String>>> = axes
        .iter()
        .filter(|a| !c::SCALE_PARAMS.contains(&a.as_str()))
        .map(|a| text_column(table, a))
        .collect::<Result<_>>()?;
    let configs: Vec<Vec<Option<&str>>> = (0..h)
        .map(|i| config_values.iter().map(|v| v[i].as_deref()).collect())
        .collect();
    let forecast = number_column(table, c::FORECAST_VS_ONE_DEVICE)?;
    // Per row, the same ratio measured and forecast: against the smallest
    // world size among the rows of its configuration that have throughput.
    let (efficiency, forecast): (Vec<Option<f64>>, Vec<Option<f64>>) = (0..h)
        .map(|i| {
            let peers: Vec<usize> = (0..h)
                .filter(|&j| configs[j] == configs[i] && tps[j].is_some())
                .collect();
            let Some(smallest) = peers
                .iter()
                .copied()
                .min_by(|&a, &b| world[a].total_cmp(&world[b]))
            else {
                return (None, None);
            };
            if !peers.iter().any(|&j| world[j] != world[smallest]) {
                return (None, None);
            }
            let ratio = |x: Option<f64>, base: Option<f64>| {
                let base = base.filter(|b| *b > 0.0)?;
                Some(100.0 * x? / base).filter(|e| e.is_finite())
            };
            (
                ratio(tps[i], tps[smallest]),
                ratio(forecast[i], forecast[smallest]),
            )
        })
        .unzip();
    table.with_column(Column::new(c::GLOBAL_TOKENS_PER_SECOND.into(), global))?;
    table.with_column(Column::new(c::SCALING_EFFICIENCY_PCT.into(), efficiency))?;
    table.with_column(Column::new(c::FORECAST_EFFICIENCY_PCT.into(), forecast))?;
    *table = table.drop(c::FORECAST_VS_ONE_DEVICE)?;
    Ok(())
}

/// The parameters whose value differs between rows (for imported logs, whose
/// axes are not declared): what charts group and label by.
fn varying(table: &DataFrame, params: &[String]) -> Vec<String> {
    params
        .iter()
        .filter(|p| !p.starts_with("global_"))
        .filter(|p| {
            let mut seen: Vec<String> = text_column(table, p)
                .unwrap_or_default()
                .into_iter()
                .flatten()
                .filter(|v| !v.is_empty())
                .collect();
            seen.sort();
            seen.dedup();
            seen.len() > 1
        })
        .cloned()
        .collect()
}

/// The table's rows, typed, read once: a missing column is an error here,
/// not an empty cell in a chart.
fn rows(
    table: &DataFrame,
    params: &[String],
    members: &[Vec<usize>],
    runs: &[RunLog],
    tps_samples: Vec<Vec<f64>>,
    measures: &[Measure],
) -> Result<Vec<Row>> {
    let nums = |name: &str| number_column(table, name);
    let names = text_column(table, c::RUN)?;
    let states = text_column(table, c::STATE)?;
    let param_values: Vec<Vec<Option<String>>> = params
        .iter()
        .map(|p| text_column(table, p))
        .collect::<Result<_>>()?;
    let mut metrics: Vec<[Vec<Option<f64>>; 7]> = Vec::new();
    for m in measures {
        let (lo, hi) = if m.has_interval() {
            (nums(&m.ci_low())?, nums(&m.ci_high())?)
        } else {
            (vec![None; table.height()], vec![None; table.height()])
        };
        metrics.push([
            nums(&m.col(Stat::Mean))?,
            nums(&m.col(Stat::Median))?,
            nums(&m.col(Stat::Std))?,
            nums(&m.col(Stat::P5))?,
            nums(&m.col(Stat::P95))?,
            lo,
            hi,
        ]);
    }
    let (points, warmup) = (nums(c::POINTS)?, nums(c::WARMUP_POINTS)?);
    let (final_loss, wall) = (nums(c::FINAL_LOSS)?, nums(c::WALL_TIME_S)?);
    let (world, global) = (nums(c::WORLD_SIZE)?, nums(c::GLOBAL_TOKENS_PER_SECOND)?);
    let (efficiency, batch) = (
        nums(c::SCALING_EFFICIENCY_PCT)?,
        nums(c::TRAINED_BATCH_SIZE)?,
    );
    let forecast = nums(c::FORECAST_EFFICIENCY_PCT)?;
    let (speedup, sp_lo, sp_hi) = (
        nums(c::SPEEDUP)?,
        nums(c::SPEEDUP_CI95_LOW)?,
        nums(c::SPEEDUP_CI95_HIGH)?,
    );
    let (p_value, p_holm) = (nums(c::SPEEDUP_P_VALUE)?, nums(c::SPEEDUP_P_VALUE_HOLM)?);
    let significant: Vec<Option<bool>> = table.column(c::SIGNIFICANT)?.bool()?.iter().collect();
    Ok(tps_samples
        .into_iter()
        .enumerate()
        .map(|(i, tps_samples)| Row {
            name: names[i].clone().unwrap_or_default(),
            state: states[i].clone().unwrap_or_default(),
            members: members[i].iter().map(|&m| runs[m].name.clone()).collect(),
            runs: members[i].clone(),
            points: points[i].unwrap_or(0.0) as usize,
            warmup_points: warmup[i].unwrap_or(0.0) as usize,
            params: params
                .iter()
                .zip(&param_values)
                .filter_map(|(p, v)| Some((p.clone(), v[i].clone()?)))
                .collect(),
            metrics: metrics
                .iter()
                .map(|m| MetricStats {
                    mean: m[0][i],
                    median: m[1][i],
                    std: m[2][i],
                    p5: m[3][i],
                    p95: m[4][i],
                    ci95: m[5][i].zip(m[6][i]),
                })
                .collect(),
            final_loss: final_loss[i],
            wall_time_s: wall[i],
            world_size: world[i].unwrap_or(1.0),
            global_tokens_per_second: global[i],
            scaling_efficiency_pct: efficiency[i],
            forecast_efficiency_pct: forecast[i],
            trained_batch_size: batch[i],
            trained_batch_range: batch_range(&members[i], runs),
            speedup: speedup[i].map(|ratio| Speedup {
                ratio,
                ci95: sp_lo[i].zip(sp_hi[i]),
                p_value: p_value[i],
                p_value_holm: p_holm[i],
                significant: significant[i],
            }),
            tps_samples,
        })
        .collect())
}

/// The smallest and largest batch the runs trained at, where they differ.
fn batch_range(members: &[usize], runs: &[RunLog]) -> Option<(f64, f64)> {
    let each = members.iter().filter_map(|&m| {
        runs[m]
            .points
            .iter()
            .filter_map(|p| p.batch_size)
            .reduce(f64::max)
    });
    let (lo, hi) = each.fold((f64::MAX, f64::MIN), |(lo, hi), b| (lo.min(b), hi.max(b)));
    (lo < hi).then_some((lo, hi))
}

/// Runs without points, that did not complete, or with something left out
/// of their logs (a last line still torn once the run stopped included).
fn problems(runs: &[RunLog]) -> Vec<Problem> {
    runs.iter()
        .filter_map(|r| {
            let stopped = !matches!(r.status.state, State::Running | State::Pending);
            let torn = (r.torn && stopped)
                .then_some("the last line of metrics.jsonl is cut short (left out)");
            let completed = r.status.state == State::Completed;
            let complete = !r.points.is_empty() && completed;
            if complete && r.issues.is_empty() && torn.is_none() {
                return None;
            }
            // The state's own reason is said with the state already
            // (`PENDING (Priority)`).
            let said = r.status.describe();
            let known: Vec<&str> = r
                .reason
                .iter()
                .filter(|&why| {
                    !(r.status.reason.as_ref() == Some(why) && said.contains(why.as_str()))
                })
                .chain(&r.issues)
                .map(String::as_str)
                .chain(torn)
                .collect();
            let reason = match (known.is_empty(), r.points.is_empty()) {
                (false, _) => known.join("; "),
                (true, true) if r.status.state.is_active() => "no metrics yet".into(),
                (true, true) => "no metrics".into(),
                (true, false) => "not finished".into(),
            };
            Some(Problem {
                run: r.name.clone(),
                state: r.status.describe(),
                reason,
            })
        })
        .collect()
}

/// A column as finite numbers (null where missing or not finite).
fn number_column(df: &DataFrame, name: &str) -> Result<Vec<Option<f64>>> {
    let c = df
        .column(name)
        .map_err(|_| anyhow::anyhow!("the summary has no column `{name}`"))?
        .cast(&DataType::Float64)?;
    Ok(c.f64()?
        .iter()
        .map(|v| v.filter(|x| x.is_finite()))
        .collect())
}

/// A column as text.
fn text_column(df: &DataFrame, name: &str) -> Result<Vec<Option<String>>> {
    let c = df
        .column(name)
        .map_err(|_| anyhow::anyhow!("the summary has no column `{name}`"))?
        .cast(&DataType::String)?;
    Ok(c.str()?.iter().map(|v| v.map(str::to_string)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::Status;

    #[test]
    fn a_problem_says_the_states_reason_once_and_an_ended_run_is_not_yet_to_write() {
        let pending = Status {
            reason: Some("Priority".into()),
            ..Status::new(State::Pending)
        };
        let waiting = RunLog {
            reason: pending.reason.clone(),
            ..RunLog::new("w", pending)
        };
        let ended = RunLog::new("e", Status::exited(3));
        let said: Vec<String> = problems(&[waiting, ended])
            .iter()
            .map(Problem::describe)
            .collect();
        assert_eq!(
            said,
            [
                "w: PENDING (Priority), no metrics yet",
                "e: FAILED (exit 3), no metrics"
            ]
        );
    }
}
