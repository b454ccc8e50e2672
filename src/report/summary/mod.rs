//! Runs -> tables, with polars: every log point of every run in one frame, the first K points
//! skipped as warm-up, then per run and per configuration (or group) the statistics, intervals,
//! speedups and scaling. The result is the frame (what CSV, Parquet and JSON carry) and the same
//! rows typed ([`Row`]). Runs are told apart by position, never by names, which logs may repeat.

mod frames;
mod speedups;

use super::columns::{self as c, Measure, Stat};
use super::ingest::{Field, RunLog};
use super::stats::{holm_judged, mean_ci95, paired_ratio_ci95, ratio_ci95, RatioCi};
use crate::executor::State;
use anyhow::{bail, Context as _, Result};
use frames::*;
use indexmap::IndexMap;
use polars::prelude::*;
use speedups::*;
use strum::VariantArray;

#[derive(Debug, Clone, Default)]
pub struct SummaryOptions {
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
    /// One row per run, configuration or group, its columns named in [`super::columns`].
    pub table: DataFrame,
    /// The table's rows, typed.
    pub rows: Vec<Row>,
    /// Every run read, with its log points (for curves).
    pub runs: Vec<RunLog>,
    /// Parameter columns of the table, in order.
    pub params: Vec<String>,
    /// The parameters that tell configurations apart (for imported logs, those that vary).
    pub axes: Vec<String>,
    /// The per-device batch-size axis, if any (`batch_size`, or a parameter named `…batch_size`).
    pub batch_axis: Option<String>,
    /// Runs without usable points, incomplete, or with something left out of their logs.
    pub problems: Vec<Problem>,
    /// What would make the figures more useful (e.g. more repeats).
    pub hints: Vec<String>,
    /// The extra fields summarised (each row's [`Row::extra`]), in order.
    pub extras: Vec<String>,
    /// Each run's own steady-state figures, by position in `runs` (what the history records).
    pub figures: Vec<RunFigures>,
    /// Ranks of data-parallel runs slower than their peers, by run.
    pub stragglers: Vec<super::straggler::Straggler>,
    /// A blocked design's places and position check (none otherwise).
    pub design: Option<super::blocks::Design>,
}

impl Summary {
    /// How a blocked design's speedups were found, in a sentence: paired by block or not.
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

    /// The number of blocks of a blocked design (with two or more, speedups are paired by block).
    pub fn blocks(&self) -> Option<usize> {
        let blocks: std::collections::BTreeSet<u32> = self
            .runs
            .iter()
            .filter_map(|r| Some(r.block?.block))
            .collect();
        (!blocks.is_empty()).then_some(blocks.len())
    }
}

/// One run's steady-state figures: the means its row averages, and its interval's spread and count.
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
    /// Statistics of each measure: [`Field::ALL`]'s, then the extra fields'.
    metrics: Vec<MetricStats>,
    pub final_loss: Option<f64>,
    pub wall_time_s: Option<f64>,
    /// Ranks training together (1 when the logs do not say).
    pub world_size: f64,
    pub global_tokens_per_second: Option<f64>,
    pub scaling_efficiency_pct: Option<f64>,
    /// The same ratio as `sweep plan`'s scaling forecast has it.
    pub forecast_efficiency_pct: Option<f64>,
    /// The batch each run trained at, as its metrics say (the largest of its runs').
    pub trained_batch_size: Option<f64>,
    /// The smallest and largest batch its runs trained at, when they differ.
    pub trained_batch_range: Option<(f64, f64)>,
    /// Against the baseline (none without one, or for rows without throughput).
    pub speedup: Option<Speedup>,
    /// What the row's tokens/s interval came from (repeats' means, or one run's points).
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
    /// The p-value of "no difference", Holm-adjusted over the study's comparisons.
    pub p_value: Option<f64>,
    pub p_value_holm: Option<f64>,
    /// Whether the Holm-adjusted p-value is below 0.05; none for the baseline.
    pub significant: Option<bool>,
}

impl Speedup {
    /// As tables print it: `1.07x [1.02, 1.12]`, with `≈` when its interval holds 1.
    pub fn text(&self) -> String {
        super::stats::ratio_text(self.ratio, self.ci95, self.significant != Some(false))
    }
}

impl Row {
    pub fn metric(&self, m: Field) -> &MetricStats {
        let i = Field::summarised()
            .position(|x| x == m)
            .expect("a summarised field");
        &self.metrics[i]
    }

    /// The statistics of extra field `i` ([`Summary::extras`]).
    pub fn extra(&self, i: usize) -> Option<&MetricStats> {
        self.metrics.get(Field::summarised().count() + i)
    }

    /// The peak per device its MFU is measured against (TFLOP/s), as its own figures imply.
    pub fn mfu_peak_tflops(&self) -> Option<f64> {
        let tflops = self.metric(Field::Tflops).mean?;
        let mfu = self.metric(Field::MfuPct).mean.filter(|m| *m > 0.0)?;
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
    /// `run: state, reason`, safe to print and bounded as a note (a state may carry a reason).
    pub fn describe(&self) -> String {
        use crate::util::text::{cell, note};
        format!(
            "{}: {}, {}",
            cell(&self.run),
            note(&self.state),
            note(&self.reason)
        )
    }
}

pub fn summarize(runs: Vec<RunLog>, opts: &SummaryOptions) -> Result<Summary> {
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
    if table.column(c::MEMBERS).is_ok() {
        pool_spread(&mut table, &members, &points, &per_run, &measures)?;
    }
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
    let figures = run_figures(&per_run, &runs)?;
    let mut hints: Vec<String> = repeats_hint(&rows).into_iter().collect();
    let tps_of: Vec<Option<f64>> = figures.iter().map(|f| f.tokens_per_second).collect();
    hints.extend(
        rows.iter()
            .zip(&members)
            .filter_map(|(row, m)| repeats_differ(&row.name, m, &tps_of, &runs)),
    );
    let stragglers = runs.iter().flat_map(super::straggler::find).collect();
    let design = super::blocks::design(&runs, &tps_of);
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

/// Every run's [`RunFigures`], from the per-run table and its steady-state points.
fn run_figures(per_run: &DataFrame, runs: &[RunLog]) -> Result<Vec<RunFigures>> {
    let mean = |m: Field| number_column(per_run, &m.col(Stat::Mean));
    let tps = mean(Field::TokensPerSecond)?;
    let tps_std = number_column(per_run, &Field::TokensPerSecond.col(Stat::Std))?;
    let (mfu, tflops, memory) = (
        mean(Field::MfuPct)?,
        mean(Field::Tflops)?,
        mean(Field::PeakMemoryMb)?,
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

const TPS: Measure = Measure::Known(Field::TokensPerSecond);

/// Extra fields become columns `<name>`, `<name>_mean`, ...: none may take a table's name.
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
        let mut cols: Vec<String> = Stat::VARIANTS.iter().map(|&s| m.col(s)).collect();
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

/// The points a run skips as warm-up: `skip_first`, unless that leaves none with a throughput;
/// then only its first ([`short_runs`] says so).
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

/// Runs too short for the warm-up skip: a short study never gives a blank table silently.
fn short_runs(runs: &[RunLog], skip_first: usize) -> Vec<Problem> {
    runs.iter()
        .filter(|r| skip_of(r, skip_first) != skip_first)
        .map(|r| Problem {
            run: r.name.clone(),
            state: r.status.describe(),
            reason: format!(
                "it logged {}, not more than the {skip_first} the report skips as warm-up: \
                 its figures use {} (log more steps, or lower `[report] skip_first` / \
                 --skip-first)",
                match r.points.len() {
                    1 => "1 point".to_string(),
                    n => format!("{n} points"),
                },
                match skip_of(r, skip_first) {
                    0 => "that point",
                    _ => "every point after the first",
                }
            ),
        })
        .collect()
}

/// Two repeats give Student's t of 12.7 at 95%: say what three or more give.
fn repeats_hint(rows: &[Row]) -> Option<String> {
    rows.iter().any(|r| r.members.len() == 2).then(|| {
        "rows of 2 repeats have wide 95% intervals (Student's t with 1 degree of freedom: \
         ±12.7 standard errors); 3 repeats make it ±4.3, 5 ±2.8 (`[sweep] repeats`)"
            .to_string()
    })
}

/// Repeats whose throughputs differ by more than this ratio are said.
const REPEATS_DIFFER: f64 = 1.3;

/// Where a row's repeats differ by over 30% in tokens/s: by how much, and the likely cause
/// their environments recorded (other load, different hosts), or that they recorded none.
fn repeats_differ(
    name: &str,
    members: &[usize],
    tps: &[Option<f64>],
    runs: &[RunLog],
) -> Option<String> {
    let measured: Vec<(usize, f64)> = members
        .iter()
        .filter_map(|&m| Some((m, tps.get(m).copied().flatten()?)))
        .collect();
    let (slow, low) = measured
        .iter()
        .copied()
        .min_by(|a, b| a.1.total_cmp(&b.1))?;
    let (fast, high) = measured
        .iter()
        .copied()
        .max_by(|a, b| a.1.total_cmp(&b.1))?;
    if !(low > 0.0 && high / low > REPEATS_DIFFER) {
        return None;
    }
    let mut hosts: Vec<&str> = members
        .iter()
        .filter_map(|&m| runs[m].host.as_deref())
        .collect();
    hosts.sort_unstable();
    hosts.dedup();
    // Each measured repeat's other load, the most its samples show.
    let loads: Vec<(usize, f64, usize)> = measured
        .iter()
        .filter_map(|&(m, _)| {
            let cores = runs[m].load.first()?.cores;
            Some((m, other_load(&runs[m].load)?, cores))
        })
        .collect();
    let busy = |m: usize| loads.iter().find(|l| l.0 == m).map(|l| l.1);
    let cause = match (busy(slow), busy(fast)) {
        _ if loads.len() == measured.len()
            && loads.iter().all(|l| l.1 >= BUSY_CORES) =>
        {
            let (lo, hi) = loads.iter().fold((f64::MAX, 0f64), |(lo, hi), l| (lo.min(l.1), hi.max(l.1)));
            format!(
                "the machine was busy throughout: other processes kept {lo:.1}–{hi:.1} of {} cores busy beside every repeat",
                loads[0].2
            )
        }
        (Some(s), f) if s >= BUSY_CORES && f.is_none_or(|f| f < s) => {
            let cores = loads.iter().find(|l| l.0 == slow).map_or(0, |l| l.2);
            let beside_fast = f.map_or_else(String::new, |f| format!(", {f:.1} beside {}", runs[fast].name));
            match s <= cores as f64 {
                true => format!(
                    "other processes kept {s:.1} of {cores} cores busy beside {}{beside_fast}: the machine was shared",
                    runs[slow].name
                ),
                false => format!(
                    "the host was overloaded beside {} (a load average {s:.1} above its {cores} cores){beside_fast}: the machine was shared",
                    runs[slow].name
                ),
            }
        }
        _ if hosts.len() > 1 => format!("they ran on different hosts ({})", hosts.join(", ")),
        _ if !loads.is_empty() => "their environments record no other load that explains it (the slower ran no busier): look for frequency scaling, thermal throttling, or a shared file system or network".to_string(),
        _ => "their environments record no load (runs of an earlier build, or imported logs)".to_string(),
    };
    Some(format!(
        "the repeats of {name} differ by {:.2}× ({} at {low:.0}, {} at {high:.0} tokens/s): {cause}",
        high / low,
        runs[slow].name,
        runs[fast].name
    ))
}

/// Cores other processes kept busy that a repeat's load says, at least.
const BUSY_CORES: f64 = 0.5;

/// The most other load a run's samples show: cores busy outside its program, and load beyond cores.
fn other_load(samples: &[crate::executor::fingerprint::Load]) -> Option<f64> {
    samples
        .iter()
        .map(|l| l.busy_cores.max(l.load_average[0] - l.cores as f64))
        .max_by(f64::total_cmp)
}

/// Where a run's steady state starts: after its skip and the warm-up points detected after it.
fn warmup(run: &RunLog, skip_first: usize) -> usize {
    let tps: Vec<f64> = run
        .points
        .iter()
        .skip(skip_of(run, skip_first))
        .filter_map(|p| p.tokens_per_second)
        .collect();
    super::stats::warmup_len(&tps)
}

/// A parameter's value as the table's text column holds it.
pub fn param_text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
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

/// The parameters whose value differs between rows (imported logs declare no axes).
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

/// The table's rows, typed: a missing column is an error here, not an empty cell in a chart.
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

/// Runs without points, incomplete, or with something left out of their logs.
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
            // The state says its own reason already (`PENDING (Priority)`).
            let said = r.status.describe();
            // What the program said last: the reason a scheduler's state does not give.
            let log_end = r.log_tail.as_ref().and_then(|t| {
                Some(format!(
                    "{} ends: {}",
                    t.name,
                    crate::util::text::note(t.last_line()?)
                ))
            });
            let known: Vec<&str> = r
                .reason
                .iter()
                .filter(|&why| {
                    !(r.status.reason.as_ref() == Some(why) && said.contains(why.as_str()))
                })
                .chain(&r.issues)
                .map(String::as_str)
                .chain(torn)
                .chain(log_end.as_deref())
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
mod tests;
