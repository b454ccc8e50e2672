//! `report.html` (and `comparison.html`): a study on one page, one file —
//! styles inline, charts as inline SVG, no network, no server — that opens
//! from the disk or as an e-mail attachment. What was run, the problems, the
//! summary table (sortable by any column with a few lines of script; the page
//! reads fully without it), every chart with its caption, and a section per
//! configuration with its parameters, its runs and links to their files.
//!
//! Everything that comes from a manifest, a log or a file name is escaped
//! ([`esc`]): a name holding `<script>`, quotes or control characters is text
//! on the page, never markup.

use super::check::{Check, Outcome, Trend};
use super::export::shown;
use super::ingest::RunLog;
use super::judge::{Comparison, Judged, Verdict, NOTHING_DIFFERS};
use super::plot::Chart;
use super::summary::{Row, Summary};
use crate::executor::State;
use std::fmt::Write;
use std::path::{Path, PathBuf};

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
    let mut out = head(&format!("{} — sweep report", p.study), live);
    let _ = writeln!(out, "<h1>{}</h1>", esc(&p.study));
    if !p.description.trim().is_empty() {
        let _ = writeln!(out, "<p class=\"lead\">{}</p>", esc(p.description.trim()));
    }
    if live.reload {
        out.push_str("<p class=\"live\">Runs are still going: this page reloads itself every 5 seconds.</p>\n");
    }
    provenance(&mut out, p);
    if !s.problems.is_empty() {
        out.push_str("<section id=\"problems\" class=\"problems\"><h2>Problems</h2><ul>\n");
        for pr in &s.problems {
            let _ = writeln!(out, "<li>{}</li>", esc(&pr.describe()));
        }
        out.push_str("</ul></section>\n");
    }
    if !s.stragglers.is_empty() {
        let _ = writeln!(
            out,
            "<section id=\"stragglers\" class=\"problems\"><h2>Stragglers</h2>\
             <p>A rank whose compute time per step (the step without waiting for the other ranks) \
             is over {:.0}% above its peers' median: every rank of its run waits for it.</p><ul>",
            super::straggler::THRESHOLD_PCT
        );
        for st in &s.stragglers {
            let _ = writeln!(out, "<li>{}</li>", esc(&st.describe()));
        }
        out.push_str("</ul></section>\n");
    }
    summary_table(&mut out, s, baseline, skip_first);
    charts_section(&mut out, charts);
    if let Some(c) = history.filter(|c| !c.trends.is_empty()) {
        history_section(&mut out, c);
    }
    configurations(&mut out, s, dir);
    if let Some((path, text)) = &p.manifest {
        let _ = writeln!(
            out,
            "<details id=\"manifest\"><summary>The manifest: {}</summary><pre>{}</pre></details>",
            esc(&path.display().to_string()),
            esc(text)
        );
    }
    tail(out)
}

/// A comparison's page.
pub fn comparison(cmp: &Comparison, chart: Option<&Chart>, git_commit: Option<&str>) -> String {
    let title = format!("{} vs {}", cmp.a, cmp.b);
    let mut out = head(&format!("{title} — sweep comparison"), Live::default());
    let _ = writeln!(out, "<h1>{}</h1>", esc(&title));
    let p = Provenance {
        study: title.clone(),
        git_commit: git_commit.map(str::to_string),
        ..Provenance::default()
    };
    provenance(&mut out, &p);
    let problems = cmp
        .problems_a
        .iter()
        .map(|pr| (&cmp.a, pr))
        .chain(cmp.problems_b.iter().map(|pr| (&cmp.b, pr)))
        .collect::<Vec<_>>();
    if !problems.is_empty() {
        out.push_str("<section id=\"problems\" class=\"problems\"><h2>Problems</h2><ul>\n");
        for (side, pr) in problems {
            let _ = writeln!(out, "<li>{}: {}</li>", esc(side), esc(&pr.describe()));
        }
        out.push_str("</ul></section>\n");
    }
    out.push_str(
        "<section><h2>Configurations</h2><p class=\"note\">Tokens/sec (mean ± half-width of \
         its 95% interval); B's speedup over A with its 95% interval; the verdicts are \
         corrected for the configurations compared with Holm's method (≈: no significant \
         difference).</p>\n<table id=\"summary\" class=\"sortable\"><thead><tr>",
    );
    let (a, b) = (format!("A: {}", cmp.a), format!("B: {}", cmp.b));
    for h in ["Configuration", &a, &b, "Speedup (B / A)", "Verdict"] {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr></thead><tbody>\n");
    for r in &cmp.rows {
        let j = &r.judged;
        out.push_str("<tr>");
        cell_text(&mut out, &j.configuration);
        for (mean, ci) in [(r.a_mean, &r.a), (r.b_mean, &r.b)] {
            let text = match ci {
                Some(c) => format!("{:.2} ± {:.2}", c.mean, (c.high - c.low) / 2.0),
                None => shown::number(mean, 2),
            };
            cell_value(&mut out, mean, &text);
        }
        let ratio = j.ratio.map(|s| s.ratio);
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
        cell_value(&mut out, ratio, &text);
        let v = j.verdict.as_str();
        let _ = write!(
            out,
            "<td data-value=\"{v}\" class=\"verdict-{v}\" title=\"{}\">{v}</td>",
            esc(&j.note)
        );
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody></table></section>\n");
    for (side, only) in [(&cmp.a, &cmp.only_a), (&cmp.b, &cmp.only_b)] {
        if !only.is_empty() {
            let names: Vec<String> = only.iter().map(|o| esc(o)).collect();
            let _ = writeln!(out, "<p>Only in {}: {}</p>", esc(side), names.join(", "));
        }
    }
    out.push_str("<section id=\"differences\"><h2>What differs</h2>");
    if cmp.differences.is_empty() {
        let _ = write!(out, "<p>{}</p>", esc(NOTHING_DIFFERS));
    } else {
        let _ = write!(
            out,
            "<table><thead><tr><th>Field</th><th>{}</th><th>{}</th><th>Configurations</th></tr></thead><tbody>",
            esc(&a),
            esc(&b)
        );
        for d in &cmp.differences {
            out.push_str("<tr>");
            for text in [&d.field, &d.a, &d.b] {
                cell_text(&mut out, text);
            }
            cell_text(&mut out, &d.which());
            out.push_str("</tr>");
        }
        out.push_str("</tbody></table>");
    }
    out.push_str("</section>\n");
    if let Some(c) = chart {
        charts_section(&mut out, std::slice::from_ref(c));
    }
    tail(out)
}

/// `sweep check --html`: the verdicts, what differs beside each
/// regression, and against the history each configuration's trend.
pub fn check(c: &Check) -> String {
    let title = format!("{}: sweep check", c.study);
    let mut out = head(&title, Live::default());
    let _ = writeln!(out, "<h1>{}</h1>", esc(&title));
    out.push_str("<section id=\"provenance\"><dl class=\"meta\">\n");
    for (k, v) in [
        ("written", crate::util::now_rfc3339()),
        ("sweep", env!("CARGO_PKG_VERSION").to_string()),
        ("against", c.reference.clone()),
        ("threshold", format!("{}%", c.threshold_pct)),
    ] {
        let _ = writeln!(out, "<dt>{}</dt><dd>{}</dd>", esc(k), esc(&v));
    }
    out.push_str("</dl></section>\n");
    let verdict = match c.outcome() {
        Outcome::Passed => "<p class=\"verdict-unchanged\" id=\"outcome\">Passed: nothing regressed or failed, and every configuration could be told.</p>",
        Outcome::Failed => "<p class=\"verdict-regressed\" id=\"outcome\">Failed: a configuration regressed or failed.</p>",
        Outcome::Inconclusive => "<p class=\"verdict-inconclusive\" id=\"outcome\">Inconclusive: nothing regressed or failed, but a configuration's interval is too wide to tell a change of the threshold's size from none (its note says how many runs would decide).</p>",
    };
    out.push_str(verdict);
    out.push_str(
        "<section><h2>Verdicts</h2><p class=\"note\">Per configuration, its latest attempt's mean \
         tokens/s over the reference's, with the 95% interval of the ratio; significant after Holm's \
         correction over the configurations and beyond the threshold is <code>regressed</code> or \
         <code>improved</code>.</p>\n<table id=\"verdicts\" class=\"sortable\"><thead><tr>",
    );
    for h in [
        "Configuration",
        "System",
        "Verdict",
        "Tokens/sec now",
        "Runs",
        "Reference",
        "Reference runs",
        "Now / reference",
        "Why",
    ] {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr></thead><tbody>\n");
    for r in &c.rows {
        out.push_str("<tr>");
        cell_text(&mut out, &r.configuration);
        cell_text(&mut out, &r.system);
        let v = r.verdict.as_str();
        let _ = write!(out, "<td data-value=\"{v}\" class=\"verdict-{v}\">{v}</td>");
        cell_value(&mut out, r.now_mean, &shown::number(r.now_mean, 1));
        cell_value(&mut out, Some(r.now_runs as f64), &r.now_runs.to_string());
        cell_value(
            &mut out,
            r.reference_mean,
            &shown::number(r.reference_mean, 1),
        );
        cell_value(
            &mut out,
            Some(r.reference_runs as f64),
            &format!("{} ({} attempts)", r.reference_runs, r.reference_attempts),
        );
        let ratio = r.ratio.map_or_else(
            || "-".to_string(),
            |x| format!("{:.3}x [{:.3}, {:.3}]", x.ratio, x.low, x.high),
        );
        cell_value(&mut out, r.ratio.map(|x| x.ratio), &ratio);
        cell_text(&mut out, &r.note);
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody></table></section>\n");
    let failing: Vec<&Judged> = c.rows.iter().filter(|r| r.verdict.fails()).collect();
    if !failing.is_empty() {
        out.push_str("<section id=\"why\" class=\"problems\"><h2>What differs</h2><ul>\n");
        for r in failing {
            let _ = writeln!(
                out,
                "<li><b>{}</b> {}: {}</li>",
                esc(&r.configuration),
                r.verdict.as_str(),
                esc(&why(r))
            );
        }
        out.push_str("</ul></section>\n");
    }
    if !c.trends.is_empty() {
        history_section(&mut out, c);
    }
    tail(out)
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
fn history_section(out: &mut String, c: &Check) {
    out.push_str(
        "<section id=\"history\"><h2>History</h2><p class=\"note\">Each configuration's mean \
         tokens/s per attempt on its system, oldest first, with the 95% interval, from the \
         history (<code>results/history.sqlite</code>); the verdict is the latest attempt's \
         against ",
    );
    let _ = writeln!(
        out,
        "{} (threshold {}%), as <code>sweep check</code> gives it.</p>",
        esc(&c.reference),
        c.threshold_pct
    );
    for (i, t) in c.trends.iter().enumerate() {
        let row = c
            .rows
            .iter()
            .find(|r| r.configuration == t.configuration && r.system == t.system);
        let _ = write!(
            out,
            "<div class=\"trend\" id=\"history-{i}\"><h3>{} <small>on {}</small>",
            esc(&t.configuration),
            esc(&t.system)
        );
        if let Some(r) = row {
            let v = r.verdict.as_str();
            let _ = write!(
                out,
                " <span class=\"verdict verdict-{v}\">{v}</span></h3><p>{}</p>",
                esc(&why(r))
            );
            if r.verdict.fails() || r.verdict == Verdict::Improved {
                let _ = write!(out, "<p class=\"note\">{}</p>", esc(&r.note));
            }
        } else {
            out.push_str("</h3>");
        }
        if let Some(svg) = trend_chart(t) {
            let _ = write!(out, "<figure>{svg}</figure>");
        }
        out.push_str(
            "<table class=\"attempts\"><thead><tr><th>Study</th><th>Attempt</th><th>Ran</th>\
             <th>Commit</th><th>Runs</th><th>Tokens/sec [95% CI]</th><th>MFU %</th></tr></thead><tbody>\n",
        );
        for a in &t.attempts {
            out.push_str("<tr>");
            cell_text(out, &a.study);
            cell_value(out, Some(a.attempt as f64), &a.attempt.to_string());
            cell_text(out, &a.ran_at);
            cell_text(out, a.git_commit.as_deref().unwrap_or("-"));
            cell_value(out, Some(a.runs as f64), &a.runs.to_string());
            let text = match a.ci95 {
                Some((lo, hi)) => format!("{:.1} [{lo:.1}, {hi:.1}]", a.tokens_per_second),
                None => format!("{:.1}", a.tokens_per_second),
            };
            cell_value(out, Some(a.tokens_per_second), &text);
            cell_value(out, a.mfu_pct, &shown::number(a.mfu_pct, 2));
            out.push_str("</tr>\n");
        }
        out.push_str("</tbody></table></div>\n");
    }
    out.push_str("</section>\n");
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

fn cell_text(out: &mut String, text: &str) {
    let t = esc(text);
    let _ = write!(out, "<td data-value=\"{t}\">{t}</td>");
}

/// A number: shown as `text`, sorted (and checked) by its value.
fn cell_value(out: &mut String, value: Option<f64>, text: &str) {
    let v = value
        .filter(|v| v.is_finite())
        .map(|v| v.to_string())
        .unwrap_or_default();
    let _ = write!(
        out,
        "<td class=\"num\" data-value=\"{}\">{}</td>",
        esc(&v),
        esc(text)
    );
}

fn head(title: &str, live: Live) -> String {
    let reload = if live.reload {
        "<meta http-equiv=\"refresh\" content=\"5\">\n"
    } else {
        ""
    };
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n{reload}\
         <title>{}</title>\n<style>{STYLE}</style></head>\n<body><main>\n",
        esc(title)
    )
}

fn tail(mut out: String) -> String {
    let _ = write!(
        out,
        "</main>\n<script>{SORT_SCRIPT}</script>\n</body></html>\n"
    );
    out
}

/// Plain, readable, printable: no web fonts, nothing fetched.
const STYLE: &str = "body{font:15px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:0;color:#1d1d1f;background:#fff}\
main{max-width:1200px;margin:0 auto;padding:1.5rem}\
h1{margin:.2rem 0 .4rem}h2{margin-top:2rem;border-bottom:1px solid #ddd}\
.lead{font-size:1.1rem;color:#444}.note{color:#555}.live{background:#fff6d6;padding:.4rem .6rem}\
table{border-collapse:collapse;margin:.6rem 0;font-variant-numeric:tabular-nums}\
th,td{border-bottom:1px solid #e3e3e3;padding:.3rem .6rem;text-align:left;vertical-align:top}\
td.num{text-align:right;white-space:nowrap}#summary td:first-child{white-space:nowrap}th{background:#f4f5f7;position:sticky;top:0}\
table.sortable th{cursor:pointer}tr.baseline{background:#eef4ff}\
.problems{background:#fff1f0;border:1px solid #f3c1bd;padding:.2rem 1rem}\
dl.meta{display:grid;grid-template-columns:max-content auto;gap:.1rem 1rem}dl.meta dt{color:#666}\
figure{margin:1.2rem 0}figure svg{max-width:100%;height:auto;border:1px solid #eee}\
figcaption{color:#444;margin-top:.3rem}pre{background:#f7f7f8;padding:.6rem;overflow:auto}\
.state-ok{color:#1a7f37}.state-bad{color:#b42318}code{background:#f3f3f3;padding:0 .2rem}\
.verdict-regressed,.verdict-failed{color:#b42318;font-weight:600}.verdict-improved,.verdict-unchanged{color:#1a7f37}\
.verdict-new{color:#555}.verdict-inconclusive{color:#9a6700;font-weight:600}span.verdict{font-size:.9rem;border:1px solid currentColor;border-radius:3px;padding:0 .3rem}";

/// Sorting a table by a clicked header: numbers by value, text by text,
/// empty cells (a failed configuration's figures) last either way; a second
/// click reverses. Without it the page is the same, unsorted.
const SORT_SCRIPT: &str = "document.querySelectorAll('table.sortable').forEach(function(t){\
var hs=t.tHead.rows[0].cells;for(var i=0;i<hs.length;i++){(function(c){var asc=true;\
hs[c].addEventListener('click',function(){var b=t.tBodies[0],rows=Array.prototype.slice.call(b.rows);\
rows.sort(function(x,y){var p=x.cells[c].getAttribute('data-value')||'',q=y.cells[c].getAttribute('data-value')||'';\
if(p===''||q==='')return (p==='')-(q==='');var a=Number(p),d=Number(q);\
var r=(isNaN(a)||isNaN(d))?p.localeCompare(q):a-d;return asc?r:-r;});\
asc=!asc;rows.forEach(function(r){b.appendChild(r);});});})(i);}});";

fn provenance(out: &mut String, p: &Provenance) {
    let features = crate::config::Features::BUILT.names();
    let host = crate::util::process::host_name();
    let cpu = crate::util::process::cpu_model().unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    out.push_str("<section id=\"provenance\"><dl class=\"meta\">\n");
    let mut item = |k: &str, v: &str| {
        let _ = writeln!(out, "<dt>{}</dt><dd>{}</dd>", esc(k), esc(v));
    };
    item("written", &crate::util::now_rfc3339());
    item(
        "sweep",
        &format!(
            "{} (features: {})",
            env!("CARGO_PKG_VERSION"),
            if features.is_empty() {
                "none".into()
            } else {
                features.join(", ")
            }
        ),
    );
    item(
        "git commit",
        p.git_commit.as_deref().unwrap_or("not a git checkout"),
    );
    item(
        "report written on",
        &format!("{host} ({cpu}, {cores} cores)"),
    );
    if !p.devices.is_empty() {
        item("runs trained on", &p.devices.join("; "));
    }
    out.push_str("</dl></section>\n");
}

fn summary_table(out: &mut String, s: &Summary, baseline: Option<&str>, skip_first: usize) {
    out.push_str("<section><h2>Summary</h2>\n");
    let _ = write!(
        out,
        "<p class=\"note\">Means over every logged step except the first {skip_first} of each run \
         and any warm-up detected after them, ± the half-width of their 95% confidence interval \
         (over a configuration's repeats, or over one run's steps)."
    );
    if let Some(line) = s.pairing() {
        let _ = write!(out, " {}.", esc(&line));
    }
    if let Some(d) = &s.design {
        let _ = write!(out, " Where each block ran: {}.", esc(&d.places_line()));
        if let Some(line) = d.effects_line() {
            let _ = write!(out, " Place in the block: {}.", esc(&line));
        }
    }
    if let Some(b) = baseline {
        let _ = write!(
            out,
            " Speedups of tokens/sec against <code>{}</code> with their 95% intervals; \
             <code>≈</code> where the difference is not significant at 5% after Holm's \
             correction for the {} comparisons with it (the verdicts are adjusted, the \
             intervals are each comparison's own).",
            esc(b),
            s.rows.len().saturating_sub(1)
        );
    }
    out.push_str(
        " Click a column to sort by it.</p>\n<table id=\"summary\" class=\"sortable\"><thead><tr>",
    );
    let columns = shown::columns(s);
    let headers = std::iter::once("Configuration")
        .chain(columns.iter().map(|c| c.header.as_str()))
        .chain(["State"]);
    for h in headers {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr></thead><tbody>\n");
    for (i, r) in s.rows.iter().enumerate() {
        let is_base = baseline.is_some_and(|b| r.name == b || r.members.iter().any(|m| m == b));
        let _ = write!(
            out,
            "<tr{}>",
            if is_base { " class=\"baseline\"" } else { "" }
        );
        let name = if is_base {
            format!("{} (baseline)", r.name)
        } else {
            r.name.clone()
        };
        let _ = write!(
            out,
            "<td data-value=\"{}\">{}</td>",
            esc(&r.name),
            esc(&name)
        );
        for c in &columns {
            cell_value(out, c.cells[i].value, &c.cells[i].text);
        }
        cell_text(out, &r.state);
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody></table>");
    if let Some(note) = shown::mfu_note(s) {
        let _ = write!(out, "<p class=\"note\">{}</p>", esc(&note));
    }
    out.push_str("</section>\n");
}

fn charts_section(out: &mut String, charts: &[Chart]) {
    if charts.is_empty() {
        return;
    }
    out.push_str("<section id=\"charts\"><h2>Charts</h2>\n");
    for c in charts {
        // plotters escapes the text it writes; the SVG is inlined as is, but
        // for its namespace, which HTML implies (and a page with no URL in
        // it is easy to check for requests).
        let Some(svg) = inline_svg(&c.svg) else {
            continue;
        };
        let _ = writeln!(
            out,
            "<figure id=\"chart-{}\">{}<figcaption>{} (<code>{}.png</code>, <code>{}.svg</code>)</figcaption></figure>",
            esc(&c.name),
            svg,
            esc(&c.title),
            esc(&c.name),
            esc(&c.name)
        );
    }
    out.push_str("</section>\n");
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

fn configurations(out: &mut String, s: &Summary, page_dir: &Path) {
    out.push_str("<section id=\"configurations\"><h2>Configurations</h2>\n");
    for row in &s.rows {
        configuration(out, row, &s.runs, page_dir);
    }
    out.push_str("</section>\n");
}

fn configuration(out: &mut String, row: &Row, runs: &[RunLog], page_dir: &Path) {
    let _ = writeln!(
        out,
        "<section class=\"configuration\"><h3>{}</h3>",
        esc(&row.name)
    );
    if !row.params.is_empty() {
        out.push_str("<table class=\"params\"><tbody>");
        for (k, v) in &row.params {
            let _ = write!(out, "<tr><th>{}</th><td>{}</td></tr>", esc(k), esc(v));
        }
        out.push_str("</tbody></table>\n");
    }
    out.push_str("<table class=\"runs\"><thead><tr><th>Run</th><th>State</th><th>Notes</th><th>Files</th></tr></thead><tbody>\n");
    for &i in &row.runs {
        let run = &runs[i];
        let ok = run.status.state == State::Completed && run.issues.is_empty();
        let class = if ok { "state-ok" } else { "state-bad" };
        let notes: Vec<String> = run
            .reason
            .iter()
            .chain(&run.issues)
            .map(|n| esc(n))
            .collect();
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
                        let href = file_link(page_dir, f)?;
                        let name = f.file_name()?.to_string_lossy().into_owned();
                        Some(format!("<a href=\"{}\">{}</a>", esc(&href), esc(&name)))
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td class=\"{class}\">{}</td><td>{}</td><td>{files}</td></tr>",
            esc(&run.name),
            esc(&run.status.describe()),
            notes.join("<br>")
        );
        let failed = !matches!(
            run.status.state,
            State::Completed | State::Running | State::Pending
        );
        let tail = |dir: &Path| log_tail(dir, run.status.job_id.as_deref());
        if let (true, Some((log, last))) = (failed, run.dir.as_deref().and_then(tail)) {
            let _ = writeln!(
                out,
                "<tr><td colspan=\"4\"><details open><summary>The last lines of {}</summary><pre>{}</pre></details></td></tr>",
                esc(&log),
                esc(&last)
            );
        }
    }
    out.push_str("</tbody></table></section>\n");
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
