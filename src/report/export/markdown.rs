//! `summary.md`: the table as the reference study's README shows it. Names
//! and values come from files and manifests: every cell is escaped, so that
//! neither a `|` nor a line break nor a control character can break the
//! table or reach a terminal raw.

use super::shown::{self, number as f};
use super::{Exporter, TableContext};
use crate::report::columns::{Metric, Stat};
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

impl Exporter for Markdown {
    fn file_name(&self) -> &'static str {
        "summary.md"
    }

    fn write(&self, s: &Summary, ctx: &TableContext, out: &mut std::fs::File) -> Result<()> {
        writeln!(out, "# {}\n", cell(&ctx.study))?;
        write!(
            out,
            "Means over every logged step except the first {} of each run and any warm-up \
             detected after them, ± the half-width of their 95% confidence interval (over a \
             configuration's repeats, or over one run's steps)",
            ctx.skip_first
        )?;
        match &ctx.baseline {
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
            let tps = r.metric(Metric::TokensPerSecond);
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
        Ok(())
    }
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
