//! `report.html`, `comparison.html` and `sweep check --html`: a study on
//! one page, one file — styles inline, charts as inline SVG, no network, no
//! server — that opens from the disk or as an e-mail attachment. What was
//! run, the problems, the summary table (sortable by any column with a few
//! lines of script; the page reads fully without it), every chart with its
//! caption, and a section per configuration with its parameters, its runs
//! and links to their files.
//!
//! The pages are minijinja templates (`templates/page/`); this file gathers
//! what they show. Every value a template writes is escaped ([`esc`]): a
//! name holding `<script>`, quotes or control characters is text on the
//! page, never markup. Only the inline SVG charts are written as they are.

use super::check::{Check, Outcome, Trend};
use super::export::shown;
use super::ingest::RunLog;
use super::judge::{Comparison, Judged, Verdict, NOTHING_DIFFERS};
use super::plot::Chart;
use super::summary::{Row, Summary};
use crate::executor::State;
use minijinja::{AutoEscape, Environment};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The page's file name, beside summary.md.
pub const STUDY_PAGE: &str = "report.html";
/// A comparison's page, beside comparison.md.
pub const COMPARISON_PAGE: &str = "comparison.html";

/// What the page says about where the study comes from.
#[derive(Debug, Clone, Default)]
pub struct Provenance {
    pub study: String,
    pub description: String,
    /// The manifest's path and text, when the report came from one.
    pub manifest: Option<(PathBuf, String)>,
    /// The git commit of the project (`-dirty` when its tree has changes).
    pub git_commit: Option<String>,
    /// Where the runs trained: their devices as their configurations say.
    pub devices: Vec<String>,
}

/// How the page behaves.
#[derive(Debug, Clone, Copy, Default)]
pub struct Live {
    /// Runs are still going: the page reloads itself every few seconds.
    pub reload: bool,
}

const TEMPLATES: [(&str, &str); 7] = [
    ("base.html", include_str!("../../templates/page/base.html")),
    (
        "parts.html",
        include_str!("../../templates/page/parts.html"),
    ),
    (
        "study.html",
        include_str!("../../templates/page/study.html"),
    ),
    (
        "comparison.html",
        include_str!("../../templates/page/comparison.html"),
    ),
    (
        "check.html",
        include_str!("../../templates/page/check.html"),
    ),
    ("style.css", include_str!("../../templates/page/style.css")),
    ("sort.js", include_str!("../../templates/page/sort.js")),
];

/// The pages' templates, HTML-escaped through [`esc`].
fn pages() -> &'static Environment<'static> {
    static PAGES: OnceLock<Environment<'static>> = OnceLock::new();
    PAGES.get_or_init(|| {
        let mut env = Environment::new();
        env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .expect("default delimiters are valid"),
        );
        env.set_auto_escape_callback(|name| match name.ends_with(".html") {
            true => AutoEscape::Html,
            false => AutoEscape::None,
        });
        env.set_formatter(|out, state, value| {
            if matches!(state.auto_escape(), AutoEscape::Html) && !value.is_safe() {
                let text = match value.as_str() {
                    Some(s) => s.to_string(),
                    None if value.is_none() || value.is_undefined() => String::new(),
                    None => value.to_string(),
                };
                return out.write_str(&esc(&text)).map_err(minijinja::Error::from);
            }
            minijinja::escape_formatter(out, state, value)
        });
        for (name, text) in TEMPLATES {
            env.add_template(name, text)
                .unwrap_or_else(|e| panic!("the built-in template {name}: {e:#}"));
        }
        env
    })
}

/// A page from its template and what it shows. The templates are built in
/// and tested: a failure to render is a bug, said as one.
fn render(name: &str, ctx: impl Serialize) -> String {
    pages()
        .get_template(name)
        .and_then(|t| t.render(crate::template::context(&ctx)))
        .unwrap_or_else(|e| panic!("rendering the built-in {name}: {e:#}"))
}

/// A table cell: text, a number (shown as `text`, sorted by `value`), or
/// a verdict.
#[derive(Serialize, Default)]
struct Cell {
    text: String,
    num: bool,
    value: String,
    verdict: Option<&'static str>,
    title: Option<String>,
}

impl Cell {
    fn text(text: &str) -> Cell {
        Cell {
            text: text.to_string(),
            ..Cell::default()
        }
    }

    fn value(value: Option<f64>, text: &str) -> Cell {
        Cell {
            text: text.to_string(),
            num: true,
            value: value
                .filter(|v| v.is_finite())
                .map(|v| v.to_string())
                .unwrap_or_default(),
            ..Cell::default()
        }
    }

    fn verdict(v: Verdict, title: Option<&str>) -> Cell {
        Cell {
            verdict: Some(v.as_str()),
            title: title.map(str::to_string),
            ..Cell::default()
        }
    }
}

#[derive(Serialize)]
struct Figure {
    name: String,
    title: String,
    svg: String,
}

/// The charts as the pages inline them.
fn figures(charts: &[&Chart]) -> Vec<Figure> {
    charts
        .iter()
        .filter_map(|c| {
            // plotters escapes the text it writes; the SVG is inlined as
            // is, but for its namespace (see [`inline_svg`]).
            Some(Figure {
                name: c.name.clone(),
                title: c.title.clone(),
                svg: inline_svg(&c.svg)?,
            })
        })
        .collect()
}

/// A study's page. `dir` is where the page is written (links to run files
/// are relative to it).
#[allow(clippy::too_many_arguments)]
pub fn study(
    s: &Summary,
    charts: &[Chart],
    p: &Provenance,
    baseline: Option<&str>,
    skip_first: usize,
    dir: &Path,
    live: Live,
    history: Option<&Check>,
) -> String {
    let columns = shown::columns(s);
    let headers: Vec<&str> = std::iter::once("Configuration")
        .chain(columns.iter().map(|c| c.header.as_str()))
        .chain(["State"])
        .collect();
    let rows: Vec<serde_json::Value> = s
        .rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let is_base = baseline.is_some_and(|b| r.name == b || r.members.iter().any(|m| m == b));
            let mut cells: Vec<Cell> = columns
                .iter()
                .map(|c| Cell::value(c.cells[i].value, &c.cells[i].text))
                .collect();
            cells.push(Cell::text(&r.state));
            serde_json::json!({
                "name": r.name,
                "shown": if is_base { format!("{} (baseline)", r.name) } else { r.name.clone() },
                "baseline": is_base,
                "cells": cells,
            })
        })
        .collect();
    let mut design: Vec<String> = s.pairing().into_iter().collect();
    if let Some(d) = &s.design {
        design.push(format!("Where each block ran: {}", d.places_line()));
        design.extend(d.effects_line().map(|l| format!("Place in the block: {l}")));
    }
    let charts: Vec<&Chart> = charts.iter().collect();
    render(
        "study.html",
        serde_json::json!({
            "title": format!("{} — sweep report", p.study),
            "reload": live.reload,
            "study": p.study,
            "description": p.description.trim(),
            "provenance": provenance(p),
            "problems": s.problems.iter().map(|pr| pr.describe()).collect::<Vec<_>>(),
            "stragglers": s.stragglers.iter().map(|st| st.describe()).collect::<Vec<_>>(),
            "straggler_threshold_pct": format!("{:.0}", super::straggler::THRESHOLD_PCT),
            "skip_first": skip_first,
            "design": design,
            "baseline": baseline,
            "comparisons": s.rows.len().saturating_sub(1),
            "headers": headers,
            "rows": rows,
            "mfu_note": shown::mfu_note(s),
            "charts": figures(&charts),
            "history": history.filter(|c| !c.trends.is_empty()).map(history_section),
            "configurations": s.rows.iter().map(|row| configuration(row, &s.runs, dir)).collect::<Vec<_>>(),
            "manifest": p.manifest.as_ref().map(|(path, text)| serde_json::json!({
                "path": path.display().to_string(),
                "text": text,
            })),
        }),
    )
}

/// A comparison's page.
pub fn comparison(cmp: &Comparison, chart: Option<&Chart>, git_commit: Option<&str>) -> String {
    let title = format!("{} vs {}", cmp.a, cmp.b);
    let p = Provenance {
        study: title.clone(),
        git_commit: git_commit.map(str::to_string),
        ..Provenance::default()
    };
    let problems: Vec<(&String, String)> = cmp
        .problems_a
        .iter()
        .map(|pr| (&cmp.a, pr.describe()))
        .chain(cmp.problems_b.iter().map(|pr| (&cmp.b, pr.describe())))
        .collect();
    let (a, b) = (format!("A: {}", cmp.a), format!("B: {}", cmp.b));
    let rows: Vec<Vec<Cell>> = cmp
        .rows
        .iter()
        .map(|r| {
            let j = &r.judged;
            let mut cells = vec![Cell::text(&j.configuration)];
            for (mean, ci) in [(r.a_mean, &r.a), (r.b_mean, &r.b)] {
                let text = match ci {
                    Some(c) => format!("{:.2} ± {:.2}", c.mean, (c.high - c.low) / 2.0),
                    None => shown::number(mean, 2),
                };
                cells.push(Cell::value(mean, &text));
            }
            let text = match &j.ratio {
                Some(s) => format!(
                    "{}{:.2}x [{:.2}, {:.2}]",
                    if s.significant { "" } else { "≈" },
                    s.ratio,
                    s.low,
                    s.high
                ),
                None => "-".into(),
            };
            cells.push(Cell::value(j.ratio.map(|s| s.ratio), &text));
            cells.push(Cell::verdict(j.verdict, Some(&j.note)));
            cells
        })
        .collect();
    let only: Vec<(&String, String)> = [(&cmp.a, &cmp.only_a), (&cmp.b, &cmp.only_b)]
        .into_iter()
        .filter(|(_, only)| !only.is_empty())
        .map(|(side, only)| (side, only.join(", ")))
        .collect();
    let differences: Vec<Vec<Cell>> = cmp
        .differences
        .iter()
        .map(|d| {
            vec![
                Cell::text(&d.field),
                Cell::text(&d.a),
                Cell::text(&d.b),
                Cell::text(&d.which()),
            ]
        })
        .collect();
    let charts: Vec<&Chart> = chart.into_iter().collect();
    render(
        "comparison.html",
        serde_json::json!({
            "title": format!("{title} — sweep comparison"),
            "reload": false,
            "heading": title,
            "provenance": provenance(&p),
            "problems": problems,
            "threshold_pct": cmp.threshold_pct.to_string(),
            "headers": ["Configuration", a.as_str(), b.as_str(), "Speedup (B / A)", "Verdict"],
            "rows": rows,
            "only": only,
            "differences": differences,
            "nothing_differs": NOTHING_DIFFERS,
            "charts": figures(&charts),
        }),
    )
}

/// `sweep check --html`: the verdicts, what differs beside each
/// regression, and against the history each configuration's trend.
pub fn check(c: &Check) -> String {
    let title = format!("{}: sweep check", c.study);
    let meta = [
        ("written", crate::util::now_rfc3339()),
        ("sweep", env!("CARGO_PKG_VERSION").to_string()),
        ("against", c.reference.clone()),
        ("threshold", format!("{}%", c.threshold_pct)),
    ];
    let outcome = match c.outcome() {
        Outcome::Passed => ("unchanged", "Passed: nothing regressed or failed, and every configuration could be told."),
        Outcome::Failed => ("regressed", "Failed: a configuration regressed or failed."),
        Outcome::Inconclusive => ("inconclusive", "Inconclusive: nothing regressed or failed, but a configuration's interval is too wide to tell a change of the threshold's size from none (its note says how many runs would decide)."),
    };
    let rows: Vec<Vec<Cell>> = c
        .rows
        .iter()
        .map(|r| {
            let ratio = r.ratio.map_or_else(
                || "-".to_string(),
                |x| format!("{:.3}x [{:.3}, {:.3}]", x.ratio, x.low, x.high),
            );
            vec![
                Cell::text(&r.configuration),
                Cell::text(&r.system),
                Cell::verdict(r.verdict, None),
                Cell::value(r.now_mean, &shown::number(r.now_mean, 1)),
                Cell::value(Some(r.now_runs as f64), &r.now_runs.to_string()),
                Cell::value(r.reference_mean, &shown::number(r.reference_mean, 1)),
                Cell::value(
                    Some(r.reference_runs as f64),
                    &format!("{} ({} attempts)", r.reference_runs, r.reference_attempts),
                ),
                Cell::value(r.ratio.map(|x| x.ratio), &ratio),
                Cell::text(&r.note),
            ]
        })
        .collect();
    let failing: Vec<serde_json::Value> = c
        .rows
        .iter()
        .filter(|r| r.verdict.fails())
        .map(|r| {
            serde_json::json!({
                "configuration": r.configuration,
                "verdict": r.verdict.as_str(),
                "why": why(r),
            })
        })
        .collect();
    render(
        "check.html",
        serde_json::json!({
            "title": title,
            "reload": false,
            "meta": meta,
            "outcome": { "class": outcome.0, "text": outcome.1 },
            "headers": [
                "Configuration",
                "System",
                "Verdict",
                "Tokens/sec now",
                "Runs",
                "Reference",
                "Reference runs",
                "Now / reference",
                "Why",
            ],
            "rows": rows,
            "failing": failing,
            "history": (!c.trends.is_empty()).then(|| history_section(c)),
        }),
    )
}

/// What differs between a failing configuration's runs and the reference,
/// and its stragglers, in a sentence.
fn why(r: &Judged) -> String {
    let mut parts = match r.differences.is_empty() {
        true if r.verdict == Verdict::Regressed => {
            vec!["nothing its fingerprints record differs".to_string()]
        }
        true => Vec::new(),
        false => vec![r.differences.join("; ")],
    };
    parts.extend(r.stragglers.iter().map(|st| format!("straggler {st}")));
    match parts.is_empty() {
        true => r.note.clone(),
        false => parts.join("; "),
    }
}

/// Each configuration with earlier attempts: its tokens/s per attempt with
/// the intervals (a chart and a table, each attempt's date and commit) and
/// the verdict of the latest against the history.
fn history_section(c: &Check) -> serde_json::Value {
    let trends: Vec<serde_json::Value> = c
        .trends
        .iter()
        .map(|t| {
            let row = c
                .rows
                .iter()
                .find(|r| r.configuration == t.configuration && r.system == t.system);
            let attempts: Vec<Vec<Cell>> = t
                .attempts
                .iter()
                .map(|a| {
                    let text = match a.ci95 {
                        Some((lo, hi)) => format!("{:.1} [{lo:.1}, {hi:.1}]", a.tokens_per_second),
                        None => format!("{:.1}", a.tokens_per_second),
                    };
                    vec![
                        Cell::text(&a.study),
                        Cell::value(Some(a.attempt as f64), &a.attempt.to_string()),
                        Cell::text(&a.ran_at),
                        Cell::text(a.git_commit.as_deref().unwrap_or("-")),
                        Cell::value(Some(a.runs as f64), &a.runs.to_string()),
                        Cell::value(Some(a.tokens_per_second), &text),
                        Cell::value(a.mfu_pct, &shown::number(a.mfu_pct, 2)),
                    ]
                })
                .collect();
            serde_json::json!({
                "configuration": t.configuration,
                "system": t.system,
                "verdict": row.map(|r| r.verdict.as_str()),
                "why": row.map(why),
                "note": row
                    .filter(|r| r.verdict.fails() || r.verdict == Verdict::Improved)
                    .map(|r| r.note.clone()),
                "svg": trend_chart(t),
                "attempts": attempts,
            })
        })
        .collect();
    serde_json::json!({
        "reference": c.reference,
        "threshold_pct": c.threshold_pct.to_string(),
        "trends": trends,
    })
}

/// Where the page comes from: when and by what it was written, the
/// project's commit, the machine, the devices the runs trained on.
fn provenance(p: &Provenance) -> Vec<(&'static str, String)> {
    let features = crate::config::Features::BUILT.names();
    let host = crate::util::process::host_name();
    let cpu = crate::util::process::cpu_model().unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mut items = vec![
        ("written", crate::util::now_rfc3339()),
        (
            "sweep",
            format!(
                "{} (features: {})",
                env!("CARGO_PKG_VERSION"),
                if features.is_empty() {
                    "none".into()
                } else {
                    features.join(", ")
                }
            ),
        ),
        (
            "git commit",
            p.git_commit
                .clone()
                .unwrap_or_else(|| "not a git checkout".into()),
        ),
        (
            "report written on",
            format!("{host} ({cpu}, {cores} cores)"),
        ),
    ];
    if !p.devices.is_empty() {
        items.push(("runs trained on", p.devices.join("; ")));
    }
    items
}

#[derive(Serialize)]
struct FileLink {
    href: String,
    name: String,
}

#[derive(Serialize)]
struct LogTail {
    name: String,
    last: String,
}

#[derive(Serialize)]
struct RunShown {
    name: String,
    state: String,
    class: &'static str,
    notes: Vec<String>,
    files: Vec<FileLink>,
    log: Option<LogTail>,
}

/// A configuration's section: its parameters and its runs, each with its
/// state, notes, files and, for a failed run, the last lines of its log.
fn configuration(row: &Row, runs: &[RunLog], page_dir: &Path) -> serde_json::Value {
    let runs: Vec<RunShown> = row
        .runs
        .iter()
        .map(|&i| {
            let run = &runs[i];
            let ok = run.status.state == State::Completed && run.issues.is_empty();
            let files = run
                .dir
                .as_deref()
                .map(|dir| {
                    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
                        .into_iter()
                        .flatten()
                        .flatten()
                        .map(|e| e.path())
                        .filter(|p| p.is_file())
                        .collect();
                    names.sort();
                    names
                        .iter()
                        .filter_map(|f| {
                            Some(FileLink {
                                href: file_link(page_dir, f)?,
                                name: f.file_name()?.to_string_lossy().into_owned(),
                            })
                        })
                        .collect()
                })
                .unwrap_or_default();
            let failed = !matches!(
                run.status.state,
                State::Completed | State::Running | State::Pending
            );
            let log = match failed {
                true => run
                    .dir
                    .as_deref()
                    .and_then(|dir| log_tail(dir, run.status.job_id.as_deref()))
                    .map(|(name, last)| LogTail { name, last }),
                false => None,
            };
            RunShown {
                name: run.name.clone(),
                state: run.status.describe(),
                class: if ok { "state-ok" } else { "state-bad" },
                notes: run.reason.iter().chain(&run.issues).cloned().collect(),
                files,
                log,
            }
        })
        .collect();
    serde_json::json!({
        "name": row.name,
        "params": row.params.iter().collect::<Vec<_>>(),
        "runs": runs,
    })
}

/// The last lines of the log of `job`, the attempt whose end is reported:
/// `local.out` for a local job, `<name>-<job>.out` for a SLURM job (or
/// array task); else the log written last.
fn log_tail(dir: &Path, job: Option<&str>) -> Option<(String, String)> {
    let logs: Vec<(PathBuf, std::time::SystemTime)> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "out"))
        .filter_map(|e| Some((e.path(), e.metadata().ok()?.modified().ok()?)))
        .collect();
    let named = |p: &Path, job: &str| {
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        match job.starts_with("local-") {
            true => name == crate::executor::local::LOG_FILE,
            false => name.ends_with(&format!("-{job}.out")),
        }
    };
    let path = job
        .and_then(|j| logs.iter().find(|(p, _)| named(p, j)))
        .or_else(|| logs.iter().max_by_key(|(_, t)| *t))
        .map(|(p, _)| p.clone())?;
    let bytes = crate::util::fs::read_tail(&path, 4096).ok()?;
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    let last = lines[lines.len().saturating_sub(12)..].join("\n");
    let name = path.file_name()?.to_string_lossy().into_owned();
    Some((name, last))
}

/// A link to a file of a run's directory, relative to the page.
fn file_link(page_dir: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(page_dir).ok()?;
    let parts: Vec<String> = rel
        .components()
        .map(|c| percent_encode(&c.as_os_str().to_string_lossy()))
        .collect();
    Some(parts.join("/"))
}

/// Every byte but unreserved URL characters as %XX.
fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            b => format!("%{b:02X}"),
        })
        .collect()
}

/// A configuration's tokens/s over its attempts as bars with their
/// intervals, each named by its date, commit and attempt.
fn trend_chart(t: &Trend) -> Option<String> {
    let bars = super::plot::bars::Bars {
        title: format!("{} on {}: tokens/s per attempt", t.configuration, t.system),
        y_label: "Tokens/sec".into(),
        categories: t
            .attempts
            .iter()
            .map(|a| {
                let date = a.ran_at.get(..10).unwrap_or(&a.ran_at);
                let commit = a
                    .git_commit
                    .as_deref()
                    .map_or("", |c| c.get(..7).unwrap_or(c));
                format!("{date} {commit} #{}", a.attempt)
            })
            .collect(),
        series: vec![(
            "tokens/s".into(),
            t.attempts
                .iter()
                .map(|a| Some(a.tokens_per_second))
                .collect(),
        )],
        intervals: vec![t.attempts.iter().map(|a| a.ci95).collect()],
        notes: t
            .attempts
            .iter()
            .map(|a| Some(format!("{} run(s)", a.runs)))
            .collect(),
    };
    let svg = super::plot::svg(&super::plot::Resized(&bars, (1000, 420))).ok()?;
    inline_svg(&svg)
}

/// An SVG as a page inlines it: from its `<svg` on, without the namespace
/// HTML implies (so that the page holds no URL to check for requests).
fn inline_svg(svg: &str) -> Option<String> {
    let i = svg.find("<svg")?;
    Some(svg[i..].replacen(" xmlns=\"http://www.w3.org/2000/svg\"", "", 1))
}

/// Text as HTML: `<`, `>`, `&` and quotes escaped, control characters
/// written as escapes (they have no place in a page and some none in XML).
pub fn esc(s: &str) -> String {
    let printable = crate::util::text::printable(s);
    let mut out = String::with_capacity(printable.len());
    for c in printable.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_never_markup() {
        assert_eq!(
            esc("<script>alert('x')</script> & \"q\"\u{1b}[31m"),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;\\u{1b}[31m"
        );
        assert_eq!(percent_encode("a b/é"), "a%20b%2F%C3%A9");
    }

    #[test]
    fn a_check_page_shows_hostile_names_as_text() {
        let evil = "<script>alert('x')</script>\u{1b}[31m";
        let row = Judged {
            configuration: evil.into(),
            configuration_id: "id".into(),
            system: "sys".into(),
            verdict: Verdict::Inconclusive,
            note: "a & b".into(),
            now_mean: Some(1.5),
            now_runs: 2,
            reference_mean: None,
            reference_runs: 0,
            reference_attempts: 0,
            ratio: None,
            basis: None,
            p_value_holm: None,
            runs_to_decide: None,
            differences: Vec::new(),
            stragglers: Vec::new(),
        };
        let c = Check {
            study: evil.into(),
            reference: "the history".into(),
            threshold_pct: 3.0,
            rows: vec![row],
            trends: Vec::new(),
        };
        let html = check(&c);
        assert!(!html.contains("<script>alert"), "{html}");
        assert!(html.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;\\u{1b}[31m"));
        assert!(html.contains("id=\"outcome\">Inconclusive:"), "{html}");
        assert!(
            html.contains("<td class=\"num\" data-value=\"1.5\">1.5</td>"),
            "{html}"
        );
        assert!(
            html.contains(
                "<td data-value=\"inconclusive\" class=\"verdict-inconclusive\">inconclusive</td>"
            ),
            "{html}"
        );
        assert!(
            html.contains("<td data-value=\"a &amp; b\">a &amp; b</td>"),
            "{html}"
        );
        assert!(html.contains("threshold</dt><dd>3%</dd>"), "{html}");
        assert_eq!(
            html.matches("<script>").count(),
            1,
            "the sorting script alone"
        );
    }

    #[test]
    fn the_log_shown_is_the_one_of_the_attempt_reported() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // An earlier attempt's log, written last, and the reported job's.
        std::fs::write(d.join("sweep-r-12_3.out"), "attempt of 12_3\nfailed here\n").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(d.join("sweep-r-9.out"), "an earlier attempt\n").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(d.join("local.out"), "local attempt\n").unwrap();
        let (name, tail) = log_tail(d, Some("12_3")).unwrap();
        assert_eq!(
            (name.as_str(), tail.as_str()),
            ("sweep-r-12_3.out", "attempt of 12_3\nfailed here")
        );
        assert_eq!(log_tail(d, Some("local-77-0")).unwrap().0, "local.out");
        // An unknown job: the log written last.
        assert_eq!(log_tail(d, Some("4")).unwrap().0, "local.out");
    }
}
