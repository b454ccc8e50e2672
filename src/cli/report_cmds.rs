//! report, compare, check, history: the commands that read results, as
//! `crate::report` does them, printed.

use super::{CheckCli, HistoryCli, ReportCli};
use crate::config::RuntimeOptions;
use crate::report::export::{self, Exporter};
use crate::report::page::Html;
use crate::report::Source;
use crate::util::stdout::outln;
use std::path::Path;
use std::process::ExitCode;

pub(super) fn compare_cmd(
    root: &std::path::Path,
    a: &std::path::Path,
    b: &std::path::Path,
    skip_first: Option<usize>,
    threshold: f64,
    plots: bool,
    rt: &RuntimeOptions,
) -> anyhow::Result<ExitCode> {
    use crate::report::compare;
    let cmp = compare::run(
        root,
        &source_of(root, a, rt)?,
        &source_of(root, b, rt)?,
        skip_first,
        threshold,
        plots,
    )?;
    // The markdown lists each side's problems too.
    show(&cmp, &export::Markdown)?;
    for f in &cmp.files {
        outln!("wrote {}", f.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// What a command given a study takes: a directory is a study's results,
/// anything else its manifest, planned (its warnings are `sweep plan`'s to
/// say; reporting on runs never refuses them for memory).
fn source_of(root: &Path, p: &Path, rt: &RuntimeOptions) -> anyhow::Result<Source> {
    Ok(match p.is_dir() {
        true => Source::ResultsDir(p.to_path_buf()),
        false => Source::Plan(Box::new(crate::study::load_plan(
            root,
            p,
            true,
            rt,
            &mut |_| {},
        )?)),
    })
}

pub(super) fn check_cmd(
    root: &Path,
    c: &CheckCli,
    rt: &RuntimeOptions,
) -> anyhow::Result<ExitCode> {
    use crate::report::check::{self, Reference};
    let opts = check::CheckOptions {
        reference: match &c.against {
            Some(a) => Reference::Study(source_of(root, a, rt)?),
            None => Reference::History { last: c.last },
        },
        threshold_pct: c.threshold,
        skip_first: c.skip_first,
    };
    // Checked before the check runs (a check of a long history should not
    // end in "cannot write"): both outputs together, against the rule every
    // output follows and the studies read.
    use crate::util::outputs::{self, Output};
    let outputs: Vec<Output> = [("--junit", &c.junit), ("--html", &c.html)]
        .into_iter()
        .filter_map(|(flag, p)| Some(Output::new(flag, p.as_deref()?)))
        .collect();
    let mut inputs = vec![c.target.as_path()];
    inputs.extend(c.against.as_deref());
    outputs::check(&outputs, &inputs, outputs::Allow::default())?;
    let done = check::run(&source_of(root, &c.target, rt)?, &opts)?;
    let write = |path: &std::path::Path, bytes: &[u8]| -> anyhow::Result<()> {
        outputs::write_checked(path, bytes)?;
        eprintln!("wrote {}", path.display());
        Ok(())
    };
    let files: [(&dyn Exporter<_>, _); 2] = [(&export::JUnit, &c.junit), (&Html, &c.html)];
    for (format, path) in files {
        if let Some(path) = path {
            write(path, &format.export(&done)?)?;
        }
    }
    match c.json {
        true => show(&done, &export::Json)?,
        false => show(&done, &export::Text)?,
    }
    Ok(ExitCode::from(done.outcome().exit_status()))
}

pub(super) fn history_cmd(
    root: &Path,
    h: &HistoryCli,
    rt: &RuntimeOptions,
) -> anyhow::Result<ExitCode> {
    use crate::report::history::{self, Filter, History};
    if let Some(dir) = &h.import {
        if !dir.is_dir() {
            anyhow::bail!(
                "--import takes a results/<study> directory, not {}",
                dir.display()
            );
        }
        let (path, added) = crate::report::record_history(&source_of(root, dir, rt)?)?;
        outln!("{added} in {}", path.display());
        return Ok(ExitCode::SUCCESS);
    }
    let (path, study) = match &h.target {
        Some(t) => {
            let source = source_of(root, t, rt)?;
            let dir = crate::report::study_dir(&source).ok_or_else(|| {
                anyhow::anyhow!(
                    "{} is not a study (a manifest or a results/<study> directory)",
                    t.display()
                )
            })?;
            let name = crate::report::study_name(&source);
            (history::path_for(&dir), Some(name))
        }
        None => (root.join("results").join(history::FILE), None),
    };
    let Some(store) = History::open_existing(&path)? else {
        anyhow::bail!(
            "there is no history at {} yet: every `sweep report` and `sweep run` records one",
            path.display()
        );
    };
    let filter = Filter {
        study,
        configuration: h.configuration.clone(),
        system: h.system.clone(),
        since: h.since.clone(),
        ..Filter::default()
    };
    let attempts = store.attempts(&filter)?;
    match h.json {
        true => outln!("{}", serde_json::to_string_pretty(&attempts)?),
        false => {
            outln!("{}", crate::report::history::text(&attempts));
            let failures = store.failures(&filter)?;
            if !failures.is_empty() {
                outln!(
                    "\nruns that ended without a measurement:\n{}",
                    crate::report::history::failures_text(&failures)
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub(super) fn report_cmd(
    root: &Path,
    r: ReportCli,
    rt: &RuntimeOptions,
) -> anyhow::Result<ExitCode> {
    use crate::report;
    let source = match (&r.import, &r.target) {
        (Some(glob), _) => Source::Import {
            glob: glob.clone(),
            format: match (r.log_format, &r.pattern) {
                (Some(f), _) => f,
                (None, Some(_)) => crate::report::LogFormat::Pattern,
                (None, None) => crate::report::LogFormat::Reference,
            },
            report: Box::new(r.read.spec(r.pattern.clone())),
            name: r.name.clone(),
        },
        (None, Some(t)) => source_of(root, t, rt)?,
        (None, None) => {
            anyhow::bail!("give a manifest, a results/<study> directory, or --import GLOB")
        }
    };
    let opts = report::ReportOptions {
        live: false,
        skip_first: r.skip_first,
        baseline: r.baseline,
        group_by: r.group_by,
        out: r.out,
        plots: !r.no_plots,
    };
    let rep = report::run(root, &source, &opts)?;
    if r.json {
        show(&rep.summary, &export::Json)?;
        return Ok(history_note(&rep));
    }
    outln!("{}", report::export::markdown_table(&rep.summary));
    for p in &rep.summary.problems {
        outln!("note: {}", p.describe());
    }
    for st in &rep.summary.stragglers {
        outln!("straggler: {}", st.describe());
    }
    if let (Some(d), Some(pairing)) = (&rep.summary.design, rep.summary.pairing()) {
        outln!("{pairing}; where each block ran: {}", d.places_line());
        if let Some(line) = d.effects_line() {
            outln!("place in block: {line}");
        }
    }
    for h in &rep.summary.hints {
        outln!("hint: {h}");
    }
    outln!(
        "wrote {}",
        rep.files
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    if !rep.charts.is_empty() {
        let dir = rep.charts[0].files[0]
            .parent()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        outln!("{} charts (PNG and SVG) in {dir}", rep.charts.len());
    }
    Ok(history_note(&rep))
}

/// Says where a report's runs were recorded (stderr), or why they could
/// not be: then the command fails, its report files written all the same.
pub(super) fn history_note(rep: &crate::report::Report) -> ExitCode {
    match &rep.history {
        Some(Ok((path, added))) if *added != crate::report::history::Recorded::default() => {
            eprintln!("history: {added} in {}", path.display());
            ExitCode::SUCCESS
        }
        Some(Err(why)) => {
            eprintln!("error: the runs were not recorded in the history: {why}");
            ExitCode::FAILURE
        }
        _ => ExitCode::SUCCESS,
    }
}

/// A result in a format, on standard output.
fn show<R>(r: &R, format: &dyn Exporter<R>) -> anyhow::Result<()> {
    outln!("{}", String::from_utf8_lossy(&format.export(r)?));
    Ok(())
}
