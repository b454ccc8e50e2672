//! Text for a terminal: `sweep check`'s table and its closing count.

use super::Exporter;
use crate::report::check::Check;
use crate::report::judge::Verdict;
use crate::report::stats::Basis;
use crate::util::text::{cell, note};
use anyhow::Result;
use strum::VariantArray;

pub struct Text;

/// A figure as the check's text and JUnit write it: one decimal, `–` for none.
pub(super) fn number(x: Option<f64>) -> String {
    x.map_or_else(|| "–".to_string(), |v| format!("{v:.1}"))
}

/// The check as a table with a line per regression's differences, and a
/// closing count.
impl Exporter<Check> for Text {
    fn export(&self, c: &Check) -> Result<Vec<u8>> {
        Ok(text(c).into_bytes())
    }
}

fn text(c: &Check) -> String {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_FULL_CONDENSED)
        .set_header([
            "configuration",
            "verdict",
            "tokens/s now (runs)",
            "reference (runs, attempts)",
            "now / reference [95% CI]",
            "why",
        ]);
    for r in &c.rows {
        t.add_row([
            cell(&r.configuration).into_owned(),
            r.verdict.as_str().to_string(),
            format!("{} ({})", number(r.now_mean), r.now_runs),
            format!(
                "{} ({}, {})",
                number(r.reference_mean),
                r.reference_runs,
                r.reference_attempts
            ),
            r.ratio.map_or_else(
                || "–".to_string(),
                |x| format!("{:.3}x [{:.3}, {:.3}]", x.ratio, x.low, x.high),
            ),
            note(&r.note).into_owned(),
        ]);
    }
    let mut out = format!(
        "{} against {} (threshold {}%):\n{t}\n",
        cell(&c.study),
        note(&c.reference),
        c.threshold_pct
    );
    for r in c.rows.iter().filter(|r| r.verdict == Verdict::Regressed) {
        let what = match r.differences.is_empty() {
            true => "nothing its fingerprints record (system, software, nodes): look at the load on its nodes".to_string(),
            false => r.differences.join("; "),
        };
        out.push_str(&format!(
            "{} regressed; what differs from the reference: {}\n",
            cell(&r.configuration),
            note(&what)
        ));
    }
    for r in c.rows.iter().filter(|r| r.verdict.fails()) {
        for st in &r.stragglers {
            out.push_str(&format!(
                "{} {}; straggler {}\n",
                cell(&r.configuration),
                r.verdict.as_str(),
                note(st)
            ));
        }
    }
    for r in c.rows.iter().filter(|r| r.basis == Some(Basis::WithinRuns)) {
        out.push_str(&format!(
            "note: {}: {}\n",
            cell(&r.configuration),
            Basis::WithinRuns.describe()
        ));
    }
    let counts: Vec<String> = Verdict::VARIANTS
        .iter()
        .map(|&v| format!("{} {}", c.count(v), v.as_str()))
        .collect();
    out.push_str(&format!(
        "{} configurations: {}",
        c.rows.len(),
        counts.join(", ")
    ));
    out
}
