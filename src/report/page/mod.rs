//! `report.html`, `comparison.html` and `sweep check --html`: a study on
//! one page, one file — styles inline, charts as inline SVG, no network, no
//! server — that opens from the disk or as an e-mail attachment. What was
//! run, the problems, the summary table (sortable by any column with a few
//! lines of script; the page reads fully without it), every chart with its
//! caption, and a section per configuration with its parameters, its runs
//! and links to their files.
//!
//! The pages are minijinja templates (`templates/page/`), one [`Html`]
//! exporter for each page's result (a file each: `study`, `comparison`,
//! `check`) gathering what its template shows. Every value a template
//! writes is escaped ([`esc`]): a name holding `<script>`, quotes or
//! control characters is text on the page, never markup. Only the inline
//! SVG charts are written as they are.

mod check;
mod comparison;
mod study;

pub use study::StudyPage;

use super::judge::Verdict;
use super::plot::Chart;
use crate::template::Engine;
use serde::Serialize;
use std::path::PathBuf;
use std::sync::OnceLock;

/// The HTML format: a page, self-contained.
pub struct Html;

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
    (
        "base.html",
        include_str!("../../../templates/page/base.html"),
    ),
    (
        "parts.html",
        include_str!("../../../templates/page/parts.html"),
    ),
    (
        "study.html",
        include_str!("../../../templates/page/study.html"),
    ),
    (
        "comparison.html",
        include_str!("../../../templates/page/comparison.html"),
    ),
    (
        "check.html",
        include_str!("../../../templates/page/check.html"),
    ),
    (
        "style.css",
        include_str!("../../../templates/page/style.css"),
    ),
    ("sort.js", include_str!("../../../templates/page/sort.js")),
];

/// The pages' templates (HTML-escaped by the one engine, through [`esc`]).
fn pages() -> &'static Engine {
    static PAGES: OnceLock<Engine> = OnceLock::new();
    PAGES.get_or_init(|| {
        let mut engine = Engine::new();
        // A page is as long as its study: no bound on its steps.
        engine.set_fuel(None);
        for (name, text) in TEMPLATES {
            engine
                .add(name, text)
                .unwrap_or_else(|e| panic!("the built-in template {name}: {e:#}"));
        }
        engine
    })
}

/// A page from its template and what it shows. The templates are built in
/// and tested: a failure to render is a bug, said as one.
fn render(name: &str, ctx: impl Serialize) -> String {
    pages()
        .render(name, &crate::template::context(&ctx))
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

/// An SVG as a page inlines it: from its `<svg` on, without the namespace
/// HTML implies (so that the page holds no URL to check for requests).
fn inline_svg(svg: &str) -> Option<String> {
    let i = svg.find("<svg")?;
    Some(svg[i..].replacen(" xmlns=\"http://www.w3.org/2000/svg\"", "", 1))
}

pub use crate::template::esc;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_never_markup() {
        assert_eq!(
            esc("<script>alert('x')</script> & \"q\"\u{1b}[31m"),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;\\u{1b}[31m"
        );
    }
}
