//! `sweep compare A B`: two studies (before and after a change, two
//! machines, two clusters) configuration by configuration — each side's mean
//! tokens/s with its 95% interval, B's speedup over A with its interval, and
//! a verdict — as a table (markdown and CSV) and a chart.

use super::columns::{self as c, Metric};
use super::export::markdown_cell as cell;
use super::plot::{bars::Bars, save};
use super::stats::{mean_ci95, speedups, MeanCi, RatioCi};
use super::summary::{self, Problem, Summary};
use super::Source;
use anyhow::{bail, Result};
use polars::prelude::*;
use std::path::{Path, PathBuf};

/// Faster, slower, or no significant difference (after Holm's correction
/// over the compared configurations).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Faster,
    Slower,
    Same,
}

impl Verdict {
    fn of(r: &RatioCi) -> Verdict {
        match (r.significant, r.ratio > 1.0) {
            (false, _) => Verdict::Same,
            (true, true) => Verdict::Faster,
            (true, false) => Verdict::Slower,
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Verdict::Faster => "faster",
            Verdict::Slower => "slower",
            Verdict::Same => "no significant difference",
        }
    }
}

/// One configuration present on both sides.
#[derive(Debug, Clone)]
pub struct Row {
    pub configuration: String,
    pub a: Option<MeanCi>,
    pub b: Option<MeanCi>,
    pub a_mean: Option<f64>,
    pub b_mean: Option<f64>,
    /// B's mean tokens/s over A's, with its interval; its `significant` is
    /// the verdict after Holm's correction.
    pub speedup: Option<RatioCi>,
    /// The p-value of "no difference", adjusted with Holm's method over
    /// every configuration compared.
    pub p_value_holm: Option<f64>,
    pub verdict: Option<Verdict>,
}

/// A field in which the runs compared differ between A and B: a
/// configuration field of their identity (`learning_rate`, `slurm.nodes`),
/// or what rendered them (`sweep version`, `git commit`).
#[derive(Debug, Clone, PartialEq)]
pub struct Difference {
    pub field: String,
    pub a: String,
    pub b: String,
    /// The configurations whose runs differ in it; empty: every one compared.
    pub configurations: Vec<String>,
}

impl Difference {
    /// The configurations it concerns, as tables show them.
    pub fn which(&self) -> String {
        match self.configurations.is_empty() {
            true => "all".to_string(),
            false => self.configurations.join(", "),
        }
    }
}

pub struct Comparison {
    pub a: String,
    pub b: String,
    pub rows: Vec<Row>,
    /// What differs between the two sides' runs of a configuration, as their
    /// records say (none known for imported logs).
    pub differences: Vec<Difference>,
    /// Configurations found on one side only.
    pub only_a: Vec<String>,
    pub only_b: Vec<String>,
    /// Each side's report problems (runs that failed, logs left out in part
    /// or whole), as `sweep report` lists them.
    pub problems_a: Vec<Problem>,
    pub problems_b: Vec<Problem>,
    /// Each side's blocked design, where it has one: its blocks' nodes and
    /// position check.
    pub design_a: Option<super::blocks::Design>,
    pub design_b: Option<super::blocks::Design>,
    pub files: Vec<PathBuf>,
}

fn side(root: &Path, source: &Source, skip_first: Option<usize>) -> Result<(String, Summary)> {
    let (study, runs, spec) = super::load(root, source)?;
    let opts = super::summary::Options {
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
    plots: bool,
) -> Result<Comparison> {
    if let (Some(da), Some(db)) = (super::study_dir(root, a), super::study_dir(root, b)) {
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
    let (name_a, sa) = side(root, a, skip_first)?;
    let (name_b, sb) = side(root, b, skip_first)?;
    let mut cmp = compare(&name_a, &sa, &name_b, &sb)?;
    // Study names from directories may be anything a file name can be.
    let dir_name = crate::util::name::sanitize(&format!("{name_a}-vs-{name_b}"));
    write(root, &dir_name, &mut cmp, plots)?;
    Ok(cmp)
}

/// The comparison of two summaries, configuration by configuration: B's
/// speedup over A with its interval, the verdicts decided over every
/// configuration compared (Holm).
pub fn compare(name_a: &str, sa: &Summary, name_b: &str, sb: &Summary) -> Result<Comparison> {
    let (label_a, label_b) = if name_a == name_b {
        (format!("{name_a} (A)"), format!("{name_b} (B)"))
    } else {
        (name_a.to_string(), name_b.to_string())
    };
    let configs = |s: &Summary| s.rows.iter().map(|r| r.name.clone()).collect::<Vec<_>>();
    let (ca, cb) = (configs(sa), configs(sb));
    let both: Vec<(&summary::Row, &summary::Row)> = sa
        .rows
        .iter()
        .filter_map(|ra| Some((ra, sb.rows.iter().find(|r| r.name == ra.name)?)))
        .collect();
    if both.is_empty() {
        bail!(
            "`{name_a}` and `{name_b}` have no configuration in common (A: {}; B: {})",
            ca.join(", "),
            cb.join(", ")
        );
    }
    let pairs: Vec<_> = both
        .iter()
        .map(|(ra, rb)| Some((rb.tps_samples.as_slice(), ra.tps_samples.as_slice())))
        .collect();
    let rows = both
        .iter()
        .zip(speedups(&pairs))
        .map(|((ra, rb), compared)| Row {
            configuration: ra.name.clone(),
            a: mean_ci95(&ra.tps_samples),
            b: mean_ci95(&rb.tps_samples),
            a_mean: ra.metric(Metric::TokensPerSecond).mean,
            b_mean: rb.metric(Metric::TokensPerSecond).mean,
            verdict: compared.as_ref().map(|(r, _)| Verdict::of(r)),
            p_value_holm: compared.as_ref().map(|c| c.1),
            speedup: compared.map(|c| c.0),
        })
        .collect();
    let differences = differences(&both, sa, sb);
    Ok(Comparison {
        a: label_a,
        b: label_b,
        differences,
        only_a: ca.iter().filter(|x| !cb.contains(x)).cloned().collect(),
        only_b: cb.iter().filter(|x| !ca.contains(x)).cloned().collect(),
        problems_a: sa.problems.clone(),
        problems_b: sb.problems.clone(),
        design_a: sa.design.clone(),
        design_b: sb.design.clone(),
        rows,
        files: Vec::new(),
    })
}

/// The fields in which each configuration's runs differ between the sides
/// (its first run on each side stands for it: repeats share their
/// configuration), merged where several configurations differ alike.
fn differences(
    both: &[(&summary::Row, &summary::Row)],
    sa: &Summary,
    sb: &Summary,
) -> Vec<Difference> {
    let mut out: Vec<Difference> = Vec::new();
    for (ra, rb) in both {
        let (Some(a), Some(b)) = (ra.runs.first(), rb.runs.first()) else {
            continue;
        };
        let (a, b) = (&sa.runs[*a], &sb.runs[*b]);
        let mut found = match (&a.identity, &b.identity) {
            (Some(x), Some(y)) => crate::plan::identity::differences(x, y),
            _ => Vec::new(),
        };
        // Repeats are numbered within a study: no difference between two.
        found.retain(|(k, _, _)| k != crate::plan::REPEAT);
        if let (Some(x), Some(y)) = (&a.built, &b.built) {
            let commit = |c: &Option<String>| c.clone().unwrap_or_else(|| "(unknown)".into());
            for (field, u, v) in [
                (
                    "sweep version",
                    x.sweep_version.clone(),
                    y.sweep_version.clone(),
                ),
                ("git commit", commit(&x.git_commit), commit(&y.git_commit)),
            ] {
                if u != v {
                    found.push((field.to_string(), u, v));
                }
            }
        }
        for (field, a, b) in found {
            match out
                .iter_mut()
                .find(|d| d.field == field && d.a == a && d.b == b)
            {
                Some(d) => d.configurations.push(ra.name.clone()),
                None => out.push(Difference {
                    field,
                    a,
                    b,
                    configurations: vec![ra.name.clone()],
                }),
            }
        }
    }
    for d in &mut out {
        if d.configurations.len() == both.len() {
            d.configurations.clear();
        }
    }
    out
}

/// What the table and the page say when no [`Difference`] is recorded.
pub const NOTHING_DIFFERS: &str = "The runs compared have the same configuration and were \
    rendered by the same sweep and commit: what differs is outside sweep's records (the \
    machine, the node, the hour).";

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
        "# {} vs {}\n\nTokens/sec per configuration (mean ± half-width of its 95% interval); speedup of B over A with its 95% interval, `≈` where the difference is not significant at 5% after Holm's correction for the configurations compared (an interval may leave out 1 and still be `≈`: it is each comparison's own).\n\n| Configuration | A: {} | B: {} | Speedup (B / A) | Verdict |\n|---|---:|---:|---:|---|\n",
        cell(&cmp.a),
        cell(&cmp.b),
        cell(&cmp.a),
        cell(&cmp.b)
    );
    for r in &cmp.rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            cell(&r.configuration),
            with_ci(r.a_mean, &r.a),
            with_ci(r.b_mean, &r.b),
            speedup_text(&r.speedup, r.a_mean, r.b_mean),
            r.verdict.map_or("- (too few samples)", |v| v.describe()),
        ));
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
                .map(|r| r.configuration.clone())
                .collect::<Vec<_>>(),
        ),
        col("a_tokens_per_second_mean", &|r| r.a_mean),
        col("a_tokens_per_second_ci95_low", &|r| r.a.map(|c| c.low)),
        col("a_tokens_per_second_ci95_high", &|r| r.a.map(|c| c.high)),
        col("b_tokens_per_second_mean", &|r| r.b_mean),
        col("b_tokens_per_second_ci95_low", &|r| r.b.map(|c| c.low)),
        col("b_tokens_per_second_ci95_high", &|r| r.b.map(|c| c.high)),
        col(c::SPEEDUP, &|r| r.speedup.map(|s| s.ratio)),
        col(c::SPEEDUP_CI95_LOW, &|r| r.speedup.map(|s| s.low)),
        col(c::SPEEDUP_CI95_HIGH, &|r| r.speedup.map(|s| s.high)),
        col(c::SPEEDUP_P_VALUE, &|r| r.speedup.map(|s| s.p_value)),
        col(c::SPEEDUP_P_VALUE_HOLM, &|r| r.p_value_holm),
        Column::new(
            c::SIGNIFICANT.into(),
            cmp.rows
                .iter()
                .map(|r| r.speedup.map(|s| s.significant))
                .collect::<Vec<_>>(),
        ),
        Column::new(
            "verdict".into(),
            cmp.rows
                .iter()
                .map(|r| r.verdict.map(|v| v.describe()))
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
        categories: cmp.rows.iter().map(|r| r.configuration.clone()).collect(),
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
            .map(|r| Some(speedup_text(&r.speedup, r.a_mean, r.b_mean)))
            .collect(),
    }
}
