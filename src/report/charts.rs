//! The report's figures, in `plots/<study>/`, each as PNG and SVG:
//! throughput, MFU and TFLOPs per configuration; the batch-size comparison;
//! loss against step and wall time; throughput and MFU over time; scaling
//! with the number of GPUs when a sweep varies it.

use super::columns as c;
use super::ingest::{Field, Point};
use super::plot::{bars::Bars, lines::Lines, save, Chart};
use super::summary::{MetricStats, Summary};
use anyhow::Result;
use std::collections::BTreeMap;
use std::path::Path;

/// `extras`: the foreign log fields (of [`Summary::extras`]) the manifest
/// asks charts of (`[report] charts`), one bar chart each.
pub fn render(s: &Summary, dir: &Path, study: &str, extras: &[String]) -> Result<Vec<Chart>> {
    // Names come from files: printable in any label.
    let names: Vec<String> = s
        .rows
        .iter()
        .map(|r| crate::util::text::cell(&r.name).into_owned())
        .collect();
    let speedups: Vec<Option<String>> =
        s.rows.iter().map(|r| r.speedup.map(|x| x.text())).collect();
    let mut out = Vec::new();
    let known = [
        (
            "throughput",
            Field::TokensPerSecond,
            "Throughput per device",
            "tokens per second",
        ),
        ("mfu", Field::MfuPct, "Model FLOPs utilisation", "MFU (%)"),
        (
            "tflops",
            Field::Tflops,
            "Achieved TFLOPs per device",
            "TFLOP/s",
        ),
        (
            "peak-memory",
            Field::PeakMemoryMb,
            "Peak memory per device",
            "MB",
        ),
        (
            "energy",
            Field::JoulesPerToken,
            "Energy per token per device",
            "joules per token",
        ),
    ];
    // Each bar chart: its file, title and unit, and each row's statistics.
    let mut bars: Vec<(String, String, String, Vec<MetricStats>)> = known
        .iter()
        .map(|&(file, metric, title, unit)| {
            let stats = s.rows.iter().map(|r| *r.metric(metric)).collect();
            (file.into(), title.into(), unit.into(), stats)
        })
        .collect();
    for x in extras {
        let Some(i) = s.extras.iter().position(|e| e == x) else {
            continue;
        };
        let stats = s
            .rows
            .iter()
            .map(|r| r.extra(i).copied().unwrap_or_default())
            .collect();
        // Named as written in the log's pattern, units and all (`mem_gb`).
        let file = format!("field-{}", crate::util::name::sanitize(x));
        bars.push((file, x.clone(), x.clone(), stats));
    }
    for (file, title, unit, stats) in bars {
        let values: Vec<Option<f64>> = stats.iter().map(|m| m.mean).collect();
        if values.iter().all(Option::is_none) {
            continue;
        }
        let intervals = stats.iter().map(|m| m.ci95).collect();
        let fig = Bars {
            title: match file == "throughput" && speedups.iter().any(Option::is_some) {
                true => format!(
                    "{study}: {title} (mean, 95% interval; ≈: not significant after Holm's correction)"
                ),
                false => format!("{study}: {title} (mean, 95% interval)"),
            },
            y_label: unit.clone(),
            categories: names.clone(),
            series: vec![(unit, values)],
            intervals: vec![intervals],
            notes: if file == "throughput" {
                speedups.clone()
            } else {
                vec![None; names.len()]
            },
        };
        out.push(save(&fig, dir, &file)?);
    }
    if let Some(fig) = batch_size_bars(s, study) {
        out.push(save(&fig, dir, "batch-size")?);
    }
    let step = |p: &Point| Some(p.step);
    let elapsed = |p: &Point| p.elapsed_s;
    let of = |f: Field| move |p: &Point| f.of(p);
    type Coord<'a> = &'a dyn Fn(&Point) -> Option<f64>;
    let curves: [(&str, Coord, Coord, &str, &str, bool); 4] = [
        (
            "loss-step",
            &of(Field::Loss),
            &step,
            "loss (nats)",
            "step",
            false,
        ),
        (
            "loss-time",
            &of(Field::Loss),
            &elapsed,
            "loss (nats)",
            "wall time (s)",
            false,
        ),
        (
            "throughput-time",
            &of(Field::TokensPerSecond),
            &elapsed,
            "tokens per second",
            "wall time (s)",
            true,
        ),
        (
            "mfu-time",
            &of(Field::MfuPct),
            &elapsed,
            "MFU (%)",
            "wall time (s)",
            true,
        ),
    ];
    for (file, y, x, y_label, x_label, zero) in curves {
        let (series, bands) = lines(s, x, y);
        if series.iter().all(|(_, p)| p.is_empty()) {
            continue;
        }
        let fig = Lines {
            title: format!("{study}: {y_label} against {x_label}"),
            x_label: x_label.into(),
            y_label: y_label.into(),
            series,
            bands,
            points: false,
            y_from_zero: zero,
        };
        out.push(save(&fig, dir, file)?);
    }
    out.extend(scaling(s, dir, study)?);
    Ok(out)
}

type Band = Option<Vec<(f64, f64, f64)>>;
type Series = (String, Vec<(f64, f64)>);

/// One line per row of the table: a run's (x, y) points, or for a
/// configuration with repeats the mean of its runs at each log point with
/// a band from the lowest to the highest of them.
fn lines(
    s: &Summary,
    x: &dyn Fn(&Point) -> Option<f64>,
    y: &dyn Fn(&Point) -> Option<f64>,
) -> (Vec<Series>, Vec<Band>) {
    let curve = |run: usize| -> Vec<(f64, f64)> {
        s.runs[run]
            .points
            .iter()
            .filter_map(|p| Some((x(p)?, y(p)?)))
            .collect()
    };
    let mut series = Vec::new();
    let mut bands = Vec::new();
    for row in &s.rows {
        let name = crate::util::text::cell(&row.name).into_owned();
        let curves: Vec<Vec<(f64, f64)>> = row.runs.iter().map(|&m| curve(m)).collect();
        let runs: Vec<&Vec<(f64, f64)>> = curves.iter().collect();
        if runs.len() < 2 {
            series.push((name, runs.first().map(|r| r.to_vec()).unwrap_or_default()));
            bands.push(None);
            continue;
        }
        let len = runs.iter().map(|r| r.len()).min().unwrap_or(0);
        let (mut mean, mut band) = (Vec::with_capacity(len), Vec::with_capacity(len));
        for k in 0..len {
            let n = runs.len() as f64;
            let mx = runs.iter().map(|r| r[k].0).sum::<f64>() / n;
            let ys = runs.iter().map(|r| r[k].1);
            let (lo, hi) = ys
                .clone()
                .fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
            mean.push((mx, ys.sum::<f64>() / n));
            band.push((mx, lo, hi));
        }
        series.push((name, mean));
        bands.push(Some(band));
    }
    (series, bands)
}

/// Grouped bars of throughput, one colour per batch size, when the sweep varies it.
fn batch_size_bars(s: &Summary, study: &str) -> Option<Bars> {
    let bs_key = s.batch_axis.as_ref()?;
    let others: Vec<&String> = s.axes.iter().filter(|p| *p != bs_key).collect();
    let mut sizes: Vec<String> = s.rows.iter().map(|r| r.param(bs_key).to_string()).collect();
    sizes.sort_by(|a, b| {
        a.parse::<f64>()
            .unwrap_or(f64::MAX)
            .total_cmp(&b.parse::<f64>().unwrap_or(f64::MAX))
    });
    sizes.dedup();
    if sizes.len() < 2 {
        return None;
    }
    type Bar = (f64, Option<(f64, f64)>);
    let mut groups: BTreeMap<usize, (String, BTreeMap<String, Bar>)> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    for r in &s.rows {
        let label = others
            .iter()
            .map(|k| format!("{}={}", k.rsplit('.').next().unwrap_or(k), r.param(k)))
            .collect::<Vec<_>>()
            .join(" ");
        let idx = match order.iter().position(|o| *o == label) {
            Some(k) => k,
            None => {
                order.push(label.clone());
                order.len() - 1
            }
        };
        let tps = r.metric(Field::TokensPerSecond);
        if let Some(v) = tps.mean {
            groups
                .entry(idx)
                .or_insert_with(|| (label, BTreeMap::new()))
                .1
                .insert(r.param(bs_key).to_string(), (v, tps.ci95));
        }
    }
    Some(Bars {
        title: format!("{study}: throughput by batch size (mean, 95% interval)"),
        y_label: "tokens per second".into(),
        categories: order
            .iter()
            .map(|o| {
                if o.is_empty() {
                    "all".into()
                } else {
                    o.clone()
                }
            })
            .collect(),
        series: sizes
            .iter()
            .map(|b| {
                (
                    format!("batch size {b}"),
                    (0..order.len())
                        .map(|g| groups.get(&g).and_then(|(_, m)| m.get(b)).map(|x| x.0))
                        .collect(),
                )
            })
            .collect(),
        intervals: sizes
            .iter()
            .map(|b| {
                (0..order.len())
                    .map(|g| groups.get(&g).and_then(|(_, m)| m.get(b)).and_then(|x| x.1))
                    .collect()
            })
            .collect(),
        notes: vec![None; order.len()],
    })
}

/// Whole-job throughput and weak-scaling efficiency against the world size
/// (GPUs or CPU ranks), one line per configuration, when the world size varies.
fn scaling(s: &Summary, dir: &Path, study: &str) -> Result<Vec<Chart>> {
    // One line per configuration of the other axes that vary among the runs.
    let series_keys: Vec<&String> = s
        .axes
        .iter()
        .filter(|p| !c::SCALE_PARAMS.contains(&p.as_str()))
        .filter(|p| {
            let mut v: Vec<&str> = s.rows.iter().map(|r| r.param(p)).collect();
            v.sort();
            v.dedup();
            v.len() > 1
        })
        .collect();
    let mut series: BTreeMap<String, Vec<(f64, f64, Option<f64>)>> = BTreeMap::new();
    for r in &s.rows {
        let Some(y) = r.global_tokens_per_second else {
            continue;
        };
        let label = series_keys
            .iter()
            .map(|k| {
                format!(
                    "{}={}",
                    k.rsplit('.').next().unwrap_or(k),
                    short(r.param(k))
                )
            })
            .collect::<Vec<_>>()
            .join(" ");
        series
            .entry(if label.is_empty() {
                "throughput".into()
            } else {
                label
            })
            .or_default()
            .push((r.world_size, y, r.scaling_efficiency_pct));
    }
    let scales = |pts: &Vec<(f64, f64, Option<f64>)>| pts.iter().any(|p| p.0 != pts[0].0);
    if !series.values().any(scales) {
        return Ok(vec![]);
    }
    let mut throughput = Vec::new();
    let mut efficiency = Vec::new();
    for (name, mut pts) in series {
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        efficiency.push((
            name.clone(),
            pts.iter().filter_map(|p| Some((p.0, p.2?))).collect(),
        ));
        throughput.push((name, pts.iter().map(|p| (p.0, p.1)).collect()));
    }
    let unit = "ranks (GPUs or CPU processes)";
    let mut out = Vec::new();
    let fig = Lines {
        title: format!("{study}: throughput against world size"),
        x_label: unit.into(),
        y_label: "tokens per second (whole job)".into(),
        series: throughput,
        bands: vec![],
        points: true,
        y_from_zero: true,
    };
    out.push(save(&fig, dir, "scaling-throughput")?);
    let fig = Lines {
        title: format!("{study}: scaling efficiency against world size"),
        x_label: unit.into(),
        y_label: "per-device tokens/s vs the smallest world size (%)".into(),
        series: efficiency,
        bands: vec![],
        points: true,
        y_from_zero: true,
    };
    out.push(save(&fig, dir, "scaling-efficiency")?);
    Ok(out)
}

/// A value short enough for a legend: paths become their file name.
fn short(v: &str) -> String {
    v.rsplit('/').next().unwrap_or(v).to_string()
}
