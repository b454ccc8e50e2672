//! `comparison.html`: two studies side by side (`sweep compare`).

use super::{figures, provenance, render, Cell, Html, Provenance};
use crate::report::export::{shown, Exporter};
use crate::report::judge::{Comparison, NOTHING_DIFFERS};
use crate::report::plot::Chart;
use anyhow::Result;

/// A comparison's page: the table, the chart, what differs and what one
/// side alone has.
impl Exporter<Comparison> for Html {
    fn export(&self, cmp: &Comparison) -> Result<Vec<u8>> {
        Ok(comparison(cmp).into_bytes())
    }
}

fn comparison(cmp: &Comparison) -> String {
    let title = format!("{} vs {}", cmp.a, cmp.b);
    let p = Provenance {
        study: title.clone(),
        git_commit: cmp.git_commit.clone(),
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
                cells.push(Cell::value(mean, &shown::with_mean_ci(mean, ci, 2)));
            }
            let text = shown::speedup(&j.ratio, r.a_mean, r.b_mean);
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
    let charts: Vec<&Chart> = cmp.chart.iter().collect();
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
