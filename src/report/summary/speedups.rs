//! Each row against the baseline (its speedup, with its interval, paired
//! by block where the design has blocks) and the scaling columns of
//! data-parallel rows.

use super::*;

/// A configuration's and the baseline's run means paired by block, where
/// every run of both has one and they share two or more (`per_run`: a row a
/// run); none otherwise (the comparison is unpaired).
pub(super) fn blocked_pairs(
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

pub(super) fn samples(
    metric: &Measure,
    members: &[usize],
    per_run: &DataFrame,
    runs: &[RunLog],
) -> Vec<f64> {
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
pub(super) fn baseline_row(
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
pub(super) fn add_comparisons(
    table: &mut DataFrame,
    members: &[Vec<usize>],
    per_run: &DataFrame,
    runs: &[RunLog],
    opts: &SummaryOptions,
    measures: &[Measure],
) -> Result<()> {
    let h = table.height();
    let repeats: Vec<u32> = members.iter().map(|m| m.len() as u32).collect();
    for metric in measures.iter().filter(|m| m.has_interval()) {
        let cis: Vec<Option<crate::report::stats::MeanCi>> = members
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
    let tps = number_column(table, &Field::TokensPerSecond.col(Stat::Mean))?;
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
        let run_means = number_column(per_run, &Field::TokensPerSecond.col(Stat::Mean))?;
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

/// Whole-job throughput (logged, else per device × world size) and
/// weak-scaling efficiency against the smallest world size of the rows
/// that differ only in scale (null at one scale).
pub(super) fn add_scaling(table: &mut DataFrame, axes: &[String]) -> Result<()> {
    let h = table.height();
    let tps = number_column(table, &Field::TokensPerSecond.col(Stat::Mean))?;
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
