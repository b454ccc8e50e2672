//! Markdown: `summary.md` (the table as the reference study's README shows
//! it) and `comparison.md`. Names and values come from files and
//! manifests: every cell is escaped, so that neither a `|` nor a line break
//! nor a control character can break the table or reach a terminal raw.

use super::shown::{self, number as f};
use super::{Exporter, Tables};
use crate::report::columns::{Field, Stat};
use crate::report::judge::{Comparison, Verdict, NOTHING_DIFFERS};
use crate::report::summary::Summary;
use anyhow::Result;
use std::io::Write;

pub struct Markdown;

/// Text as one markdown table cell or list item: control characters as
/// escapes, `|` escaped, cut to [`crate::util::text::NOTE_CHARS`] (the CSV
/// and Parquet files hold it whole).
pub fn cell(s: &str) -> String {
    crate::util::text::note(s).replace('|', "\\|")
}

/// The README-ready table (also what `sweep report` prints): the
/// configuration, the columns [`shown::columns`] chooses, its state.
pub fn table(s: &Summary) -> String {
    let columns = shown::columns(s);
    let mut out = String::from("| Configuration |");
    for c in &columns {
        out.push_str(&format!(" {} |", cell(&c.header)));
    }
    out.push_str(" State |\n|---|");
    out.push_str(&"---:|".repeat(columns.len()));
    out.push_str("---|\n");
    for (i, r) in s.rows.iter().enumerate() {
        out.push_str(&format!("| {} |", cell(&r.name)));
        for c in &columns {
            out.push_str(&format!(" {} |", cell(&c.cells[i].text)));
        }
        out.push_str(&format!(" {} |\n", cell(&r.state)));
    }
    out
}

impl Exporter<Tables<'_>> for Markdown {
    fn export(&self, t: &Tables<'_>) -> Result<Vec<u8>> {
        let (s, mut out) = (t.summary, Vec::new());
        writeln!(out, "# {}\n", cell(t.study))?;
        write!(
            out,
            "Means over every logged step except the first {} of each run and any warm-up \
             detected after them, ± the half-width of their 95% confidence interval (over a \
             configuration's repeats, or over one run's steps)",
            t.skip_first
        )?;
        match t.baseline {
            Some(b) => writeln!(
                out,
                "; speedup of tokens/sec against {} with its 95% interval, \
                 `≈` where the difference is not significant at 5% after Holm's correction \
                 for the {} comparisons with it (the verdicts are adjusted, the intervals \
                 are each comparison's own).\n",
                cell(b),
                s.rows.len().saturating_sub(1)
            )?,
            None => writeln!(out, ".\n")?,
        }
        if let Some(line) = s.pairing() {
            writeln!(out, "{line}.\n")?;
        }
        if let Some(d) = &s.design {
            writeln!(out, "Where each block ran: {}.\n", cell(&d.places_line()))?;
            if let Some(line) = d.effects_line() {
                writeln!(out, "Place in the block: {}.\n", cell(&line))?;
            }
        }
        out.write_all(table(s).as_bytes())?;
        if let Some(note) = shown::mfu_note(s) {
            writeln!(out, "\n{note}")?;
        }
        for h in &s.hints {
            writeln!(out, "\nNote: {}", cell(h))?;
        }
        writeln!(
            out,
            "\nSpread of tokens/sec over every steady-state point of a row's runs together (warm-up left out): median, standard deviation, 5th and 95th percentiles.\n"
        )?;
        writeln!(
            out,
            "| Configuration | median | std | p5 | p95 | points | warm-up points dropped |\n|---|---:|---:|---:|---:|---:|---:|"
        )?;
        for r in &s.rows {
            let tps = r.metric(Field::TokensPerSecond);
            writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} |",
                cell(&r.name),
                f(tps.stat(Stat::Median), 2),
                f(tps.stat(Stat::Std), 2),
                f(tps.stat(Stat::P5), 2),
                f(tps.stat(Stat::P95), 2),
                r.points,
                r.warmup_points,
            )?;
        }
        if !s.stragglers.is_empty() {
            writeln!(
                out,
                "\nStragglers (a rank's compute time per step, the step without waiting for the \
                 other ranks, over {:.0}% above its peers' median; every rank of the run waits \
                 for it):\n",
                crate::report::straggler::THRESHOLD_PCT
            )?;
            for st in &s.stragglers {
                writeln!(out, "- {}", cell(&st.describe()))?;
            }
        }
        if !s.problems.is_empty() {
            writeln!(out, "\nRuns without complete results:\n")?;
            for p in &s.problems {
                writeln!(out, "- {}", cell(&p.describe()))?;
            }
        }
        Ok(out)
    }
}

/// `comparison.md`: tokens/s of A and B (mean ± half-width of the 95%
/// interval), B's speedup over A with its interval, the verdict; the notes,
/// what differs, the blocked designs, what one side alone has, and each
/// side's problems.
impl Exporter<Comparison> for Markdown {
    fn export(&self, cmp: &Comparison) -> Result<Vec<u8>> {
        let mut out = format!(
            "# {} vs {}\n\nTokens/sec per configuration (mean ± half-width of its 95% interval); speedup of B over A with its 95% interval, `≈` where the difference is not significant at 5% after Holm's correction for the configurations compared (an interval may leave out 1 and still be `≈`: it is each comparison's own). Verdicts of B against A at a {}% threshold: `regressed`/`improved` when significant and at least the threshold, `unchanged` when the whole interval is within it, `inconclusive` when neither.\n\n| Configuration | A: {} | B: {} | Speedup (B / A) | Verdict |\n|---|---:|---:|---:|---|\n",
            cell(&cmp.a),
            cell(&cmp.b),
            cmp.threshold_pct,
            cell(&cmp.a),
            cell(&cmp.b)
        );
        for r in &cmp.rows {
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} |\n",
                cell(&r.judged.configuration),
                shown::with_mean_ci(r.a_mean, &r.a, 2),
                shown::with_mean_ci(r.b_mean, &r.b, 2),
                shown::speedup(&r.judged.ratio, r.a_mean, r.b_mean),
                r.judged.verdict.as_str(),
            ));
        }
        let notes: Vec<String> = cmp
            .rows
            .iter()
            .map(|r| &r.judged)
            .filter(|j| j.ratio.is_some() || j.verdict == Verdict::Failed)
            .map(|j| {
                format!(
                    "- {}: {}: {}\n",
                    cell(&j.configuration),
                    j.verdict.as_str(),
                    cell(&j.note)
                )
            })
            .collect();
        if !notes.is_empty() {
            out.push('\n');
            out.push_str(&notes.concat());
        }
        out.push_str(&differences(cmp));
        out.push_str(&designs(cmp));
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
        Ok(out.into_bytes())
    }
}

/// The differences as a table, or the sentence that says none is recorded.
fn differences(cmp: &Comparison) -> String {
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

/// Each blocked side: its blocks and where they ran, its position check,
/// and what the pairing covers (within a study, not between A and B).
fn designs(cmp: &Comparison) -> String {
    let mut out = String::new();
    for (side, design) in [(&cmp.a, &cmp.design_a), (&cmp.b, &cmp.design_b)] {
        let Some(d) = design else { continue };
        if out.is_empty() {
            out.push_str("\n## Blocked designs\n\n");
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_value_is_cut_in_a_cell() {
        let huge = "x".repeat(8 << 20);
        let c = cell(&huge);
        assert!(
            c.len() < 500 && c.ends_with("more characters)"),
            "{}",
            c.len()
        );
    }

    #[test]
    fn cells_cannot_break_the_table() {
        assert_eq!(cell("a|b\nc\u{1b}[2J"), "a\\|b\\nc\\u{1b}[2J");
    }
}
