//! `sweep compare A B`: two studies (before and after a change, two
//! machines, two clusters) configuration by configuration — each side's mean
//! tokens/s with its 95% interval, B's speedup over A with its interval, and
//! a verdict — as a table (markdown and CSV) and a chart.

use super::export::{self, shown, Csv, Markdown, Output};
use super::judge::{compare, Comparison};
use super::page::Html;
use super::plot::{bars::Bars, save};
use super::stats::MeanCi;
use super::summary::Summary;
use super::Source;
use anyhow::{bail, Result};
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

/// Writes the comparison's table (markdown, CSV), chart and page.
fn write(root: &Path, dir_name: &str, cmp: &mut Comparison, plots: bool) -> Result<()> {
    let out = root.join("results").join("compare").join(dir_name);
    let plots_dir = root.join("plots").join("compare").join(dir_name);
    // Said before anything is written (a read-only project: a colleague's,
    // a snapshot), with the way round it.
    for dir in [Some(&out), plots.then_some(&plots_dir)]
        .into_iter()
        .flatten()
    {
        if let Err((existing, why)) = crate::util::fs::writable(dir) {
            bail!(
                "{} cannot be written: {why}. Comparisons are written into the project's results/ \
                 and plots/: run it from a project you may write, `sweep -C DIR compare A B` \
                 (A and B as absolute paths)",
                existing.display()
            );
        }
    }
    let outputs: [Output<Comparison>; 3] = [
        (&Markdown, out.join("comparison.md")),
        (&Csv, out.join("comparison.csv")),
        (&Html, out.join(super::page::COMPARISON_PAGE)),
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
    for (_, f) in &outputs {
        crate::util::outputs::check_own(f, &[])?;
    }
    // The tables first, the page last: it shows the chart.
    let (tables, page) = outputs.split_at(2);
    cmp.git_commit = crate::util::process::git_commit(root);
    export::write(cmp, tables)?;
    cmp.files.extend(tables.iter().map(|(_, f)| f.clone()));
    if plots {
        let fig = chart(cmp);
        let c = save(&fig, &plots_dir, "comparison")?;
        cmp.files.extend(c.files.iter().cloned());
        cmp.chart = Some(c);
    }
    export::write(cmp, page)?;
    cmp.files.extend(page.iter().map(|(_, f)| f.clone()));
    Ok(())
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
            .map(|r| Some(shown::speedup(&r.judged.ratio, r.a_mean, r.b_mean)))
            .collect(),
    }
}
