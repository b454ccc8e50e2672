//! The polars frames a summary is computed from: every log point, every
//! run's information, each run's statistics, and their groups.

use super::*;
use strum::VariantArray;

/// Every point of every run as one frame: `order` (the run's position),
/// `log_index`, `step`, then a column per [`Field`] (named as the field, but
/// for the batch size: [`c::TRAINED_BATCH_SIZE`]).
pub(super) fn points_frame(runs: &[RunLog], extras: &[String]) -> Result<DataFrame> {
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
    for &f in <Field as strum::VariantArray>::VARIANTS {
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

/// Runs and their parameters: one row per run, parameter values as text,
/// with the run's configuration (the key its repeats share, and its name)
/// and where its steady state starts.
pub(super) fn runs_frame(runs: &[RunLog], skip_first: usize) -> Result<(DataFrame, Vec<String>)> {
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

pub(super) fn stat(metric: &Measure, s: Stat) -> Expr {
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
pub(super) fn stats(measures: &[Measure], f: impl Fn(&Measure, Stat) -> Expr) -> Vec<Expr> {
    measures
        .iter()
        .flat_map(|m| Stat::VARIANTS.iter().map(move |&s| (m, s)))
        .map(|(m, s)| f(m, s))
        .collect()
}

/// The points of each run from its steady state on (`runs` gives where it
/// starts, by the run's position).
fn steady(points: &DataFrame, runs: &DataFrame) -> LazyFrame {
    points
        .clone()
        .lazy()
        .join(
            runs.clone()
                .lazy()
                .select([col(c::ORDER), col(c::FIRST_STEADY)]),
            [col(c::ORDER)],
            [col(c::ORDER)],
            JoinArgs::new(JoinType::Inner),
        )
        .filter(col(c::LOG_INDEX).gt_eq(col(c::FIRST_STEADY)))
}

/// One row per run, in run order: its statistics over the points after the
/// first `skip_first`, its final loss and wall time, joined to its parameters.
pub(super) fn per_run(
    points: &DataFrame,
    info: DataFrame,
    measures: &[Measure],
) -> Result<DataFrame> {
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
    let measured = steady(points, &info).group_by([col(c::ORDER)]).agg(aggs);
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
pub(super) fn group(
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

/// A grouped row's spread — median, std, 5th and 95th percentiles of each
/// measure — over every steady-state point of its runs together, in place
/// of the means of its runs' own (three runs at 1386, 2850 and 1417
/// tokens/s have a spread of ~700, not their steps' ~140 each). Its mean
/// stays the mean of its runs' means: the run is the unit of its interval.
pub(super) fn pool_spread(
    table: &mut DataFrame,
    members: &[Vec<usize>],
    points: &DataFrame,
    per_run: &DataFrame,
    measures: &[Measure],
) -> Result<()> {
    let (orders, rows): (Vec<u32>, Vec<u32>) = members
        .iter()
        .enumerate()
        .flat_map(|(row, m)| m.iter().map(move |&o| (o as u32, row as u32)))
        .unzip();
    let row_of = df!(c::ORDER => orders, "__row" => rows)?;
    const SPREAD: [Stat; 4] = [Stat::Median, Stat::Std, Stat::P5, Stat::P95];
    let spread: Vec<Expr> = measures
        .iter()
        .flat_map(|m| SPREAD.map(|s| stat(m, s)))
        .collect();
    let pooled = steady(points, per_run)
        .join(
            row_of.lazy(),
            [col(c::ORDER)],
            [col(c::ORDER)],
            JoinArgs::new(JoinType::Inner),
        )
        .group_by([col("__row")])
        .agg(spread)
        .collect()?;
    let row_col = number_column(&pooled, "__row")?;
    for m in measures {
        for s in SPREAD {
            let name = m.col(s);
            let got = number_column(&pooled, &name)?;
            let mut values: Vec<Option<f64>> = vec![None; table.height()];
            for (row, v) in row_col.iter().zip(got) {
                if let Some(row) = row {
                    values[*row as usize] = v;
                }
            }
            table.with_column(Column::new(name.as_str().into(), values))?;
        }
    }
    Ok(())
}

/// The runs behind each row, by position: its members when grouped, else itself.
pub(super) fn members(table: &DataFrame) -> Result<Vec<Vec<usize>>> {
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
