//! `sweep check --html`, and the history section of a study's page.

use super::{inline_svg, render, Cell, Html};
use crate::report::check::{Check, Outcome, Trend};
use crate::report::export::{shown, Exporter};
use crate::report::judge::{Judged, Verdict};
use anyhow::Result;

/// The verdicts, what differs beside each regression, and against the
/// history each configuration's trend.
impl Exporter<Check> for Html {
    fn export(&self, c: &Check) -> Result<Vec<u8>> {
        Ok(check(c).into_bytes())
    }
}

fn check(c: &Check) -> String {
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
pub(super) fn history_section(c: &Check) -> serde_json::Value {
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

/// A configuration's tokens/s over its attempts as bars with their
/// intervals, each named by its date, commit and attempt.
fn trend_chart(t: &Trend) -> Option<String> {
    let bars = crate::report::plot::bars::Bars {
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
    let svg = crate::report::plot::svg(&crate::report::plot::Resized(&bars, (1000, 420))).ok()?;
    inline_svg(&svg)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
