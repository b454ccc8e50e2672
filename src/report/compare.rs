//! `sweep compare A B`: two studies (before and after a change, two
//! machines, two clusters) configuration by configuration — each side's mean
//! tokens/s with its 95% interval, B's speedup over A with its interval, and
//! a verdict — as a table (markdown and CSV) and a chart.

use super::columns as c;
use super::export::markdown_cell as cell;
use super::judge::{compare, Comparison, Row, NOTHING_DIFFERS};
use super::plot::{bars::Bars, save};
use super::stats::{MeanCi, RatioCi};
use super::summary::Summary;
use super::Source;
use anyhow::{bail, Result};
use polars::prelude::*;
use std::path::Path;

fn side(source: &Source, skip_first: Option<usize>) -> Result<(String, Summary)> {
    let (study, runs, spec) = super::load(source)?;
    let opts = super::summary::SummaryOptions {
        skip_first: spec.skip_first(skip_first),
        axes: spec.axes,
        baseline: None,
        group_by: spec.group_by,
        extras: spec.extras,
    };
    Ok((study, super::summary::summarize(runs, &opts)?))
}

/// Compares the configurations of `a` and `b` and writes the table and chart
/// under `results/compare/<a>-vs-<b>/` and `plots/compare/<a>-vs-<b>/`.
pub fn run(
    root: &Path,
    a: &Source,
    b: &Source,
    skip_first: Option<usize>,
    threshold_pct: f64,
    plots: bool,
) -> Result<Comparison> {
    if !(0.0..100.0).contains(&threshold_pct) {
        bail!("--threshold is a percentage in [0, 100), not {threshold_pct}");
    }
    if let (Some(da), Some(db)) = (super::study_dir(a), super::study_dir(b)) {
        if da == db {
            bail!(
                "A and B are the same study ({}): every ratio would be 1.00x. Compare two studies, \
                 e.g. a copy kept before a change (`cp -r {} {}-before`) with the study after it",
                da.display(),
                da.display(),
                da.display()
            );
        }
    }
    let (name_a, sa) = side(a, skip_first)?;
    let (name_b, sb) = side(b, skip_first)?;
    let mut cmp = compare(&name_a, &sa, &name_b, &sb, threshold_pct)?;
    // Study names from directories may be anything a file name can be.
    let dir_name = crate::util::name::sanitize(&format!("{name_a}-vs-{name_b}"));
    write(root, &dir_name, &mut cmp, plots)?;
    Ok(cmp)
}

/// The differences as markdown: a table, or the sentence that says none is
/// recorded.
fn differences_markdown(cmp: &Comparison) -> String {
    if cmp.differences.is_empty() {
        return format!("\n{NOTHING_DIFFERS}\n");
    }
    let mut out = format!(
        "\n## What differs\n\n| Field | A: {} | B: {} | Configurations |\n|---|---|---|---|\n",
        cell(&cmp.a),
        cell(&cmp.b)
    );
    for d in &cmp.differences {
        out.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            cell(&d.field),
            cell(&d.a),
            cell(&d.b),
            cell(&d.which())
        ));
    }
    out
}

/// Writes the comparison's table (markdown, CSV), chart and page.
fn write(root: &Path, dir_name: &str, cmp: &mut Comparison, plots: bool) -> Result<()> {
    let out = root.join("results").join("compare").join(dir_name);
    let md = out.join("comparison.md");
    let files = [
        md.clone(),
        out.join("comparison.csv"),
        out.join(super::page::COMPARISON_PAGE),
    ];
    // results/compare/ is the comparisons' own (a study called `compare`
    // would own it: then nothing is written).
    let compare = root.join("results/compare");
    if compare.join(crate::layout::STUDY_JSON).exists() {
        anyhow::bail!(
            "{} is a rendered study's directory: comparisons are written to results/compare/, \
             and a study of that name owns it; rename the study",
            compare.display()
        );
    }
    for f in &files {
        crate::util::outputs::check_own(f, &[])?;
    }
    std::fs::create_dir_all(&out)?;
    crate::util::fs::write_atomic(&md, markdown(cmp).as_bytes())?;
    let csv = out.join("comparison.csv");
    let mut frame = frame(cmp)?;
    let mut bytes = Vec::new();
    CsvWriter::new(&mut bytes).finish(&mut frame)?;
    crate::util::fs::write_atomic(&csv, &bytes)?;
    cmp.files.extend([md, csv]);
    let drawn = if plots {
        let fig = chart(cmp);
        let c = save(
            &fig,
            &root.join("plots").join("compare").join(dir_name),
            "comparison",
        )?;
        cmp.files.extend(c.files.iter().cloned());
        Some(c)
    } else {
        None
    };
    let page = out.join(super::page::COMPARISON_PAGE);
    let html = super::page::comparison(
        cmp,
        drawn.as_ref(),
        crate::util::process::git_commit(root).as_deref(),
    );
    crate::util::fs::write_atomic(&page, html.as_bytes())?;
    cmp.files.push(page);
    Ok(())
}

fn f(v: Option<f64>) -> String {
    v.filter(|v| v.is_finite())
        .map(|v| format!("{v:.2}"))
        .unwrap_or_else(|| "-".into())
}

fn with_ci(mean: Option<f64>, ci: &Option<MeanCi>) -> String {
    match ci {
        Some(ci) if (ci.high - ci.low).is_finite() => {
            format!("{:.2} ± {:.2}", ci.mean, (ci.high - ci.low) / 2.0)
        }
        _ => f(mean),
    }
}

fn speedup_text(r: &Option<RatioCi>, a: Option<f64>, b: Option<f64>) -> String {
    match r {
        Some(r) if r.ratio.is_finite() && r.low.is_finite() && r.high.is_finite() => format!(
            "{}{:.2}x [{:.2}, {:.2}]",
            if r.significant { "" } else { "≈" },
            r.ratio,
            r.low,
            r.high
        ),
        _ => match (a, b) {
            (Some(a), Some(b)) if a > 0.0 && (b / a).is_finite() => format!("{:.2}x", b / a),
            _ => "-".into(),
        },
    }
}

/// The table: tokens/s of A and B (mean ± half-width of the 95% interval),
/// B's speedup over A with its interval, and the verdict.
pub fn markdown(cmp: &Comparison) -> String {
    let mut out = format!(
        "# {} vs {}\n\nTokens/sec per configuration (mean ± half-width of its 95% interval); speedup of B over A with its 95% interval, `≈` where the difference is not significant at 5% after Holm's correction for the configurations compared (an interval may leave out 1 and still be `≈`: it is each comparison's own). Verdicts of B against A at a {}% threshold: `regressed`/`improved` when significant and at least the threshold, `unchanged` when the whole interval is within it, `inconclusive` when neither.\n\n| Configuration | A: {} | B: {} | Speedup (B / A) | Verdict |\n|---|---:|---:|---:|---|\n",
        cell(&cmp.a),
        cell(&cmp.b),
        cmp.threshold_pct,
        cell(&cmp.a),
        cell(&cmp.b)
    );
    for r in &cmp.rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            cell(&r.judged.configuration),
            with_ci(r.a_mean, &r.a),
            with_ci(r.b_mean, &r.b),
            speedup_text(&r.judged.ratio, r.a_mean, r.b_mean),
            r.judged.verdict.as_str(),
        ));
    }
    let notes: Vec<String> = cmp
        .rows
        .iter()
        .map(|r| &r.judged)
        .filter(|j| j.ratio.is_some() || j.verdict == super::judge::Verdict::Failed)
        .map(|j| {
            format!(
                "- {}: {}: {}\n",
                cell(&j.configuration),
                j.verdict.as_str(),
                cell(&j.note)
            )
        })
        .collect();
    if !notes.is_empty() {
        out.push('\n');
        out.push_str(&notes.concat());
    }
    out.push_str(&differences_markdown(cmp));
    out.push_str(&designs_markdown(cmp));
    for (side, only) in [(&cmp.a, &cmp.only_a), (&cmp.b, &cmp.only_b)] {
        if !only.is_empty() {
            let only: Vec<String> = only.iter().map(|o| cell(o)).collect();
            out.push_str(&format!("\nOnly in {}: {}\n", cell(side), only.join(", ")));
        }
    }
    for (side, problems) in [(&cmp.a, &cmp.problems_a), (&cmp.b, &cmp.problems_b)] {
        if !problems.is_empty() {
            out.push_str(&format!("\n## Problems in {}\n\n", cell(side)));
            for p in problems {
                out.push_str(&format!("- {}\n", cell(&p.describe())));
            }
        }
    }
    out
}

/// Each blocked side: its blocks and where they ran, its position check,
/// and what the pairing covers (within a study, not between A and B).
fn designs_markdown(cmp: &Comparison) -> String {
    let mut out = String::new();
    for (side, design) in [(&cmp.a, &cmp.design_a), (&cmp.b, &cmp.design_b)] {
        let Some(d) = design else { continue };
        if out.is_empty() {
            out.push_str(
                "
## Blocked designs

",
            );
        }
        let paired = match d.places.len() {
            1 => "one block, its own speedups not paired",
            _ => "its own speedups paired by block",
        };
        out.push_str(&format!(
            "- {}: randomized blocks ({}), {paired}; {}.",
            cell(side),
            d.places.len(),
            cell(&d.places_line())
        ));
        if let Some(line) = d.effects_line() {
            out.push_str(&format!(" Place in the block: {}.", cell(&line)));
        }
        out.push('\n');
    }
    if !out.is_empty() {
        out.push_str(
            "\nB's speedups over A above compare runs of different allocations (unpaired): \
             for a paired comparison, run both in one blocked study.\n",
        );
    }
    out
}

fn frame(cmp: &Comparison) -> Result<DataFrame> {
    let col = |name: &str, f: &dyn Fn(&Row) -> Option<f64>| {
        Column::new(name.into(), cmp.rows.iter().map(f).collect::<Vec<_>>())
    };
    Ok(DataFrame::new_infer_height(vec![
        Column::new(
            "configuration".into(),
            cmp.rows
                .iter()
                .map(|r| r.judged.configuration.clone())
                .collect::<Vec<_>>(),
        ),
        col("a_tokens_per_second_mean", &|r| r.a_mean),
        col("a_tokens_per_second_ci95_low", &|r| r.a.map(|c| c.low)),
        col("a_tokens_per_second_ci95_high", &|r| r.a.map(|c| c.high)),
        col("b_tokens_per_second_mean", &|r| r.b_mean),
        col("b_tokens_per_second_ci95_low", &|r| r.b.map(|c| c.low)),
        col("b_tokens_per_second_ci95_high", &|r| r.b.map(|c| c.high)),
        col(c::SPEEDUP, &|r| r.judged.ratio.map(|s| s.ratio)),
        col(c::SPEEDUP_CI95_LOW, &|r| r.judged.ratio.map(|s| s.low)),
        col(c::SPEEDUP_CI95_HIGH, &|r| r.judged.ratio.map(|s| s.high)),
        col(c::SPEEDUP_P_VALUE, &|r| r.judged.ratio.map(|s| s.p_value)),
        col(c::SPEEDUP_P_VALUE_HOLM, &|r| r.judged.p_value_holm),
        Column::new(
            c::SIGNIFICANT.into(),
            cmp.rows
                .iter()
                .map(|r| r.judged.ratio.map(|s| s.significant))
                .collect::<Vec<_>>(),
        ),
        Column::new(
            "verdict".into(),
            cmp.rows
                .iter()
                .map(|r| r.judged.verdict.as_str())
                .collect::<Vec<_>>(),
        ),
    ])?)
}

/// A and B side by side per configuration, with error bars and the speedup.
fn chart(cmp: &Comparison) -> Bars {
    let interval = |ci: &Option<MeanCi>| ci.map(|c| (c.low, c.high));
    Bars {
        title: format!(
            "{} vs {}: tokens per second (mean, 95% interval)",
            cmp.a, cmp.b
        ),
        y_label: "tokens per second".into(),
        categories: cmp
            .rows
            .iter()
            .map(|r| r.judged.configuration.clone())
            .collect(),
        series: vec![
            (cmp.a.clone(), cmp.rows.iter().map(|r| r.a_mean).collect()),
            (cmp.b.clone(), cmp.rows.iter().map(|r| r.b_mean).collect()),
        ],
        intervals: vec![
            cmp.rows.iter().map(|r| interval(&r.a)).collect(),
            cmp.rows.iter().map(|r| interval(&r.b)).collect(),
        ],
        notes: cmp
            .rows
            .iter()
            .map(|r| Some(speedup_text(&r.judged.ratio, r.a_mean, r.b_mean)))
            .collect(),
    }
}
