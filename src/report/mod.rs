//! Logs -> report: one table (markdown, CSV, Parquet) and a set of charts for
//! every run of a sweep, from its manifest or its results directory, or for
//! logs written by other programs (`--import`, e.g. the reference study's).

pub mod blocks;
pub mod charts;
pub mod check;
pub mod columns;
pub mod compare;
pub mod export;
pub mod flops;
pub mod history;
pub mod ingest;
pub mod judge;
mod load;
pub mod page;
pub mod plot;
pub mod stats;
pub mod straggler;
pub mod summary;

use anyhow::{bail, Result};
use load::{dir_study_name, load};
pub use load::{LogFormat, Source};
use std::path::{Path, PathBuf};

pub struct ReportOptions {
    pub skip_first: Option<usize>,
    pub baseline: Option<String>,
    pub group_by: Vec<String>,
    /// Where the report's files and its `plots/` go (default:
    /// `results/<study>`, charts in `plots/<study>`).
    pub out: Option<PathBuf>,
    pub plots: bool,
    /// Runs are still going: the page reloads itself.
    pub live: bool,
}

pub struct Report {
    /// Where its completed runs were recorded (`results/history.sqlite`)
    /// and how many were new, or why they could not be; none for imported
    /// logs and live pages.
    pub history: Option<Result<(PathBuf, history::Recorded), String>>,
    pub summary: summary::Summary,
    pub files: Vec<PathBuf>,
    pub charts: Vec<plot::Chart>,
    /// `report.html`.
    pub page: PathBuf,
}

pub fn run(root: &Path, source: &Source, opts: &ReportOptions) -> Result<Report> {
    let (study, runs, spec) = load(source)?;
    let study_dir = spec.dir.clone();
    let sopts = summary::SummaryOptions {
        skip_first: spec.skip_first(opts.skip_first),
        axes: spec.axes,
        baseline: opts.baseline.clone().or(spec.baseline),
        group_by: if opts.group_by.is_empty() {
            spec.group_by
        } else {
            opts.group_by.clone()
        },
        extras: spec.extras,
    };
    let mut s = summary::summarize(runs, &sopts)?;
    s.problems.extend(spec.stale);
    let (own, plots) = places(root, source, &study, &opts.group_by);
    let out = opts.out.clone().unwrap_or_else(|| own.clone());
    // With `--out` the whole report goes there, charts too (a read-only
    // study is reported into a folder of one's own).
    let plots = match &opts.out {
        Some(out) => out.join(PLOTS_DIR),
        None => plots,
    };
    let mut writes = vec![(out.as_path(), opts.out.is_some())];
    if opts.plots {
        writes.push((plots.as_path(), opts.out.is_some()));
    }
    for (dir, asked) in writes {
        writable(dir, asked)?;
    }
    let page = out.join(page::STUDY_PAGE);
    let inputs: Vec<&Path> = spec.inputs.iter().map(PathBuf::as_path).collect();
    let table_files = export::table_files(&out);
    let files: Vec<PathBuf> = table_files
        .iter()
        .map(|(_, f)| f.clone())
        .chain([page.clone()])
        .collect();
    check_outputs(source, &own, &out, &files, &inputs)?;
    let tables = export::Tables {
        summary: &s,
        study: &study,
        skip_first: sopts.skip_first,
        baseline: sopts.baseline.as_deref(),
    };
    export::write(&tables, &table_files)?;
    let charts = if opts.plots {
        charts::render(&s, &plots, &study, &spec.charts)?
    } else {
        vec![]
    };
    let provenance = page::Provenance {
        study: study.clone(),
        git_commit: crate::util::process::git_commit(root),
        ..spec.provenance
    };
    // A history that cannot be written costs no report file: its error is
    // the command's to report once the files are written.
    let recorded = match (source, opts.live) {
        (Source::Import { .. }, _) | (_, true) => None,
        _ => study_dir
            .as_ref()
            .map(|dir| history::record(dir, &study, &s).map_err(|e| format!("{e:#}"))),
    };
    let past = past(&study, &s, &recorded, study_dir.as_deref());
    let history = recorded.map(|r| r.map(|(path, added, _)| (path, added)));
    let study_page = page::StudyPage {
        tables,
        charts: &charts,
        provenance: &provenance,
        dir: &out,
        live: page::Live { reload: opts.live },
        history: past.as_ref(),
    };
    export::write(&study_page, &[(&page::Html, page.clone())])?;
    Ok(Report {
        history,
        summary: s,
        files,
        charts,
        page,
    })
}

/// The folder of a report's charts under `--out`.
pub const PLOTS_DIR: &str = "plots";

/// Whether a report's folder may be written, checked first so that a
/// read-only study is said as such (`asked`: the folder is `--out`'s).
fn writable(dir: &Path, asked: bool) -> Result<()> {
    let Err((existing, why)) = crate::util::fs::writable(dir) else {
        return Ok(());
    };
    if asked {
        bail!(
            "--out {}: {} cannot be written: {why}",
            dir.display(),
            existing.display()
        );
    }
    bail!(
        "{} cannot be written: {why}. Its report can go elsewhere: `--out DIR` writes the tables, \
         the page and the charts (DIR/{PLOTS_DIR}) there",
        existing.display()
    )
}

/// Where a report and its plots go: the study's directory (or the one
/// given), a command-line grouping beside it (`grouped/<keys>`), never over it.
fn places(root: &Path, source: &Source, study: &str, group_by: &[String]) -> (PathBuf, PathBuf) {
    let grouped = (!group_by.is_empty()).then(|| crate::util::name::sanitize(&group_by.join("+")));
    let main = match source {
        Source::ResultsDir(d) => d.canonicalize().unwrap_or_else(|_| d.clone()),
        _ => root.join("results").join(study),
    };
    let plots = root.join("plots").join(study);
    match &grouped {
        Some(keys) => (
            main.join(crate::layout::GROUPED_DIR).join(keys),
            plots.join(crate::layout::GROUPED_DIR).join(keys),
        ),
        None => (main, plots),
    }
}

/// What recording into the history did (file, measurements added, the
/// history open) or why it could not; none for imports and live pages.
type Recorded = Option<Result<(PathBuf, history::Recorded, Option<history::History>), String>>;

/// Each configuration's past in the history, and how the latest attempt
/// compares (as `sweep check --history`), for the page.
fn past(
    study: &str,
    s: &summary::Summary,
    recorded: &Recorded,
    study_dir: Option<&Path>,
) -> Option<check::Check> {
    let read_only = match (recorded, study_dir) {
        (Some(Err(_)), Some(dir)) => history::History::open_existing(&history::path_for(dir))
            .ok()
            .flatten(),
        _ => None,
    };
    let open = match recorded {
        Some(Ok((_, _, Some(h)))) => Some(h),
        _ => read_only.as_ref(),
    };
    open.and_then(|h| {
        check::against_history(
            study,
            s,
            h,
            check::DEFAULT_LAST,
            check::DEFAULT_THRESHOLD_PCT,
        )
        .map_err(|e| eprintln!("warning: the page shows no history: {e:#}"))
        .ok()
    })
}

/// A report's files may be written: in the study's own directory, none is
/// special or an input, and an imported study's directory is no rendered
/// study's; elsewhere (`--out`), the rule every output follows.
fn check_outputs(
    source: &Source,
    own: &Path,
    out: &Path,
    files: &[PathBuf],
    inputs: &[&Path],
) -> Result<()> {
    use crate::util::outputs::{self, resolve, Output};
    if resolve(out) != resolve(own) {
        let outputs: Vec<Output> = files.iter().map(|f| Output::new("--out", f)).collect();
        return Ok(outputs::check(&outputs, inputs, outputs::Allow::default())?);
    }
    if let Source::Import { name, .. } = source {
        if own.join(crate::layout::STUDY_JSON).exists() {
            bail!(
                "{} is the directory of the study {name}, which a manifest rendered: an imported \
                 report never writes over it; give --name another name",
                own.display()
            );
        }
    }
    for f in files {
        outputs::check_own(f, inputs)?;
    }
    Ok(())
}

/// A command study's `[report] line_pattern`, for the live view (none for
/// the trainer's studies: they write `metrics.jsonl`).
pub fn progress_pattern(plan: &crate::plan::Plan) -> Option<ingest::pattern::Pattern> {
    match &plan.manifest.mode {
        crate::manifest::Mode::Command(_) => load::command_pattern(&plan.manifest.report).ok()?,
        crate::manifest::Mode::Train(_) => None,
    }
}

/// The directory a study's runs live in (None for imported logs, or when it
/// cannot be found: the loading that follows says why).
pub fn study_dir(source: &Source) -> Option<PathBuf> {
    let dir = match source {
        Source::ResultsDir(d) => d,
        Source::Plan(plan) => &plan.study_dir,
        Source::Import { .. } => return None,
    };
    dir.canonicalize().ok()
}

/// The study's name, as its report and the history call it.
pub fn study_name(source: &Source) -> String {
    match source {
        Source::Plan(plan) => plan.manifest.name.clone(),
        Source::ResultsDir(d) => dir_study_name(d),
        Source::Import { name, .. } => name.clone(),
    }
}

/// Records a study's completed runs in its history without writing a
/// report (`sweep history --import`, and `sweep run --again` before it
/// moves an attempt aside); returns the file and how many runs were new.
pub fn record_history(source: &Source) -> Result<(PathBuf, history::Recorded)> {
    let (study, s, dir) = configurations(source, None)?;
    let dir = dir.ok_or_else(|| anyhow::anyhow!("the study has no results directory yet"))?;
    let (path, added, _) = history::record(&dir, &study, &s)?;
    Ok((path, added))
}

/// A study summarised a row per configuration with its own settings and no
/// baseline — what the history records and `sweep check` judges — with its
/// directory where it has one.
fn configurations(
    source: &Source,
    skip_first: Option<usize>,
) -> Result<(String, summary::Summary, Option<PathBuf>)> {
    let (study, runs, spec) = load(source)?;
    let opts = summary::SummaryOptions {
        skip_first: spec.skip_first(skip_first),
        axes: spec.axes,
        baseline: None,
        group_by: Vec::new(),
        extras: spec.extras,
    };
    Ok((study, summary::summarize(runs, &opts)?, spec.dir))
}
