//! The columns a reader sees in `summary.md` and `report.html`, in one list
//! (the CSV, Parquet and JSON keep every column): the measured figures with
//! their intervals, each foreign log field the line pattern names, and the
//! scaling and batch columns where a study has them. A figure no row can
//! have (MFU of a program that logs no FLOPs, peak memory of a CPU run) is
//! left out rather than shown as a column of dashes.

use crate::report::columns::Field;
use crate::report::stats::{ratio_text, MeanCi, RatioCi};
use crate::report::summary::{MetricStats, Row, Summary};

/// One shown column: its header and each row's cell.
pub struct Shown {
    pub header: String,
    pub cells: Vec<Cell>,
}

/// A cell's value (what the page sorts by) and its text.
pub struct Cell {
    pub value: Option<f64>,
    pub text: String,
}

pub fn number(v: Option<f64>, digits: usize) -> String {
    v.filter(|v| v.is_finite())
        .map(|v| format!("{v:.prec$}", prec = decimals(v, digits)))
        .unwrap_or_else(|| "-".into())
}

/// `digits` decimals, or more for a value below 1 in size: enough for
/// three significant figures (a CPU's 0.0123 TFLOPs, not `0.01`; never
/// `0.00` for what is not zero).
pub fn decimals(v: f64, digits: usize) -> usize {
    let a = v.abs();
    match a > 0.0 && a < 1.0 {
        true => digits.max((-a.log10()).ceil() as usize + 2).min(9),
        false => digits,
    }
}

/// B's speedup over A as tables, charts and pages print it: `1.07x [1.02,
/// 1.12]`, `≈` first where it is not significant; the ratio of the means
/// alone where there is no interval.
pub fn speedup(r: &Option<RatioCi>, a: Option<f64>, b: Option<f64>) -> String {
    match r {
        Some(r) if r.ratio.is_finite() && r.low.is_finite() && r.high.is_finite() => {
            ratio_text(r.ratio, Some((r.low, r.high)), r.significant)
        }
        _ => match (a, b) {
            (Some(a), Some(b)) if a > 0.0 && (b / a).is_finite() => ratio_text(b / a, None, true),
            _ => "-".into(),
        },
    }
}

/// `mean ± half-width` of a metric's 95% interval (the mean alone without one).
pub fn with_interval(m: &MetricStats, digits: usize) -> String {
    mean_interval(m.mean, m.ci95, digits)
}

/// A comparison side's mean tokens/s: its interval's `mean ± half-width`,
/// else `mean` alone.
pub fn with_mean_ci(mean: Option<f64>, ci: &Option<MeanCi>, digits: usize) -> String {
    match ci {
        Some(c) => mean_interval(Some(c.mean), Some((c.low, c.high)), digits),
        None => number(mean, digits),
    }
}

/// `mean ± half-width` of the interval (low, high); the mean alone without
/// a finite one.
fn mean_interval(mean: Option<f64>, ci: Option<(f64, f64)>, digits: usize) -> String {
    match (mean, ci) {
        (Some(mean), Some((lo, hi))) if mean.is_finite() && (hi - lo).is_finite() => {
            let digits = decimals(mean, digits);
            format!("{mean:.digits$} ± {:.digits$}", (hi - lo) / 2.0)
        }
        _ => number(mean, digits),
    }
}

/// The columns between the configuration's name and its state.
pub fn columns(s: &Summary) -> Vec<Shown> {
    let rows = &s.rows;
    let any = |f: &dyn Fn(&Row) -> bool| rows.iter().any(f);
    let mut out = Vec::new();
    let mut push = |header: &str, cell: &dyn Fn(&Row) -> Cell| {
        out.push(Shown {
            header: header.to_string(),
            cells: rows.iter().map(cell).collect(),
        })
    };
    let stats = |m: &MetricStats, digits: usize| Cell {
        value: m.mean,
        text: with_interval(m, digits),
    };
    let plain = |v: Option<f64>, digits: usize| Cell {
        value: v,
        text: number(v, digits),
    };
    if any(&|r| r.members.len() > 1) {
        push("Runs", &|r| plain(Some(r.members.len() as f64), 0));
    }
    for f in Field::summarised() {
        let (header, digits) = f.shown().unwrap_or_default();
        // Tokens/sec is the comparison every study makes: always shown.
        if f != Field::TokensPerSecond && !any(&|r| r.metric(f).mean.is_some()) {
            continue;
        }
        match f {
            Field::TrainingTokensPct => push(header, &|r| plain(r.metric(f).mean, digits)),
            _ => push(header, &|r| stats(r.metric(f), digits)),
        }
    }
    for (i, name) in s.extras.iter().enumerate() {
        if any(&|r| r.extra(i).is_some_and(|m| m.mean.is_some())) {
            push(name, &|r| {
                stats(&r.extra(i).copied().unwrap_or_default(), 2)
            });
        }
    }
    push("Final loss", &|r| plain(r.final_loss, 3));
    push("Wall time (s)", &|r| plain(r.wall_time_s, 1));
    push("Speedup", &|r| Cell {
        value: r.speedup.map(|x| x.ratio),
        text: r.speedup.map_or_else(|| "-".into(), |x| x.text()),
    });
    if any(&|r| r.scaling_efficiency_pct.is_some()) {
        push("Ranks", &|r| plain(Some(r.world_size), 0));
        push("Global tokens/sec", &|r| {
            plain(r.global_tokens_per_second, 2)
        });
        push("Scaling efficiency %", &|r| {
            plain(r.scaling_efficiency_pct, 1)
        });
        if any(&|r| r.forecast_efficiency_pct.is_some()) {
            push("Forecast efficiency %", &|r| {
                plain(r.forecast_efficiency_pct, 1)
            });
        }
    }
    // The batch each run trained at, where no parameter column already says
    // it: `batch_size = "max"`, or a batch size that is not an axis.
    let batch_param = s.params.iter().any(|p| p == "batch_size");
    if any(&|r| r.trained_batch_size.is_some() && (!batch_param || r.param("batch_size") == "max"))
    {
        // A group over several batch sizes shows them all, not its largest.
        push("Batch size", &|r| match r.trained_batch_range {
            Some((lo, hi)) => Cell {
                value: r.trained_batch_size,
                text: format!("{lo:.0}–{hi:.0}"),
            },
            None => plain(r.trained_batch_size, 0),
        });
    }
    out
}

/// Which peak each row's MFU is measured against, when rows differ (a
/// bf16 row's peak is another than an f32 row's): MFU then does not compare
/// across rows, tokens/s does. One sentence, or none without MFU.
pub fn mfu_note(s: &Summary) -> Option<String> {
    // Peaks to three significant figures (at least 0.1 TFLOP/s above 1),
    // with the rows that use each.
    let mut peaks: Vec<(f64, Vec<&Row>)> = Vec::new();
    for r in &s.rows {
        let Some(p) = r.mfu_peak_tflops() else {
            continue;
        };
        let scale = 10f64.powi(decimals(p, 1) as i32);
        let p = (p * scale).round() / scale;
        match peaks.iter_mut().find(|(q, _)| *q == p) {
            Some((_, rows)) => rows.push(r),
            None => peaks.push((p, vec![r])),
        }
    }
    match peaks.as_slice() {
        [] => None,
        [(p, _)] => Some(format!(
            "MFU is measured against a peak of {} TFLOP/s per device.",
            number(Some(*p), 1)
        )),
        _ => {
            let each: Vec<String> = peaks
                .iter()
                .map(|(p, rows)| format!("{} TFLOP/s ({})", number(Some(*p), 1), which(rows)))
                .collect();
            Some(format!(
                "MFU is measured against each row's own peak (its device and precision): {}. \
                 MFU does not compare across those rows; tokens/sec does.",
                each.join("; ")
            ))
        }
    }
}

/// Rows named by their precision when they share one, else by name.
fn which(rows: &[&Row]) -> String {
    let precision = rows[0].param("precision");
    if !precision.is_empty() && rows.iter().all(|r| r.param("precision") == precision) {
        return format!("precision {precision}");
    }
    let mut names: Vec<&str> = rows.iter().take(3).map(|r| r.name.as_str()).collect();
    if rows.len() > 3 {
        names.push("…");
    }
    names.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CPU study's figures below 1 keep three significant figures: no
    /// `0.00 ± 0.00` TFLOPs, no peak of `0.2` for 0.15.
    #[test]
    fn small_figures_keep_their_significant_digits() {
        assert_eq!(number(Some(0.0123), 2), "0.0123");
        assert_eq!(number(Some(0.15), 1), "0.150");
        assert_eq!(number(Some(6544.4), 2), "6544.40");
        assert_eq!(number(Some(0.0), 2), "0.00");
        assert_eq!(
            mean_interval(Some(0.0042), Some((0.0040, 0.0044)), 2),
            "0.00420 ± 0.00020"
        );
        assert_eq!(
            mean_interval(Some(395.67), Some((-197.64, 988.98)), 2),
            "395.67 ± 593.31"
        );
    }
    use crate::executor::{State, Status};
    use crate::report::ingest::{Point, RunLog};
    use crate::report::summary::{summarize, SummaryOptions};

    fn run(name: &str, precision: &str, peak_tflops: f64) -> RunLog {
        let mut r = RunLog::new(name, Status::new(State::Completed));
        r.params.insert("precision".into(), precision.into());
        r.points = (1..=3)
            .map(|step| Point {
                step: step as f64,
                tokens_per_second: Some(100.0),
                tflops: Some(10.0),
                mfu_pct: Some(100.0 * 10.0 / peak_tflops),
                ..Point::default()
            })
            .collect();
        r
    }

    #[test]
    fn rows_of_different_peaks_are_told_apart_and_a_shared_peak_is_said_once() {
        let s = summarize(
            vec![
                run("a", "f32", 66.9),
                run("b", "bf16-mixed", 989.0),
                run("c", "f32", 66.9),
            ],
            &SummaryOptions::default(),
        )
        .unwrap();
        let note = mfu_note(&s).unwrap();
        assert!(
            note.contains("66.9 TFLOP/s (precision f32); 989.0 TFLOP/s (precision bf16-mixed)"),
            "{note}"
        );
        assert!(note.contains("tokens/sec does"), "{note}");
        let one = summarize(vec![run("a", "f32", 66.9)], &SummaryOptions::default()).unwrap();
        assert_eq!(
            mfu_note(&one).as_deref(),
            Some("MFU is measured against a peak of 66.9 TFLOP/s per device.")
        );
        let headers: Vec<String> = columns(&one).into_iter().map(|c| c.header).collect();
        assert!(!headers.iter().any(|h| h.contains("memory")), "{headers:?}");
    }
}
