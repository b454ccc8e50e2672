//! `sweep check`: did a study get slower? Every configuration's latest
//! attempt against a reference — another study, or the history (the same
//! configuration identity on the same system, its last N attempts pooled)
//! — judged from the throughput ratio's 95% interval, Holm-corrected over
//! the configurations, and a practical threshold; beside each regression,
//! what differs between the runs' environment fingerprints.

use super::history::{self, History};
use super::judge::{judge, pair, sides, Found, Judged, Side, Verdict};
use super::stats::{Basis, RunSample};
use super::summary::Summary;
use super::Source;
use anyhow::{bail, Result};
use serde_json::json;

/// Attempts of the history pooled as the reference unless told (`--last`).
pub const DEFAULT_LAST: usize = 5;
/// A significant change smaller than this (percent) is `unchanged` unless
/// told (`--threshold`).
pub const DEFAULT_THRESHOLD_PCT: f64 = 3.0;

/// What a configuration is checked against.
pub enum Reference {
    /// The history's last `last` attempts of the same configuration on the
    /// same system.
    History { last: usize },
    /// Another study (a manifest or a results directory): its runs of the
    /// same configuration (by identity, else by name).
    Study(Source),
}

pub struct CheckOptions {
    pub reference: Reference,
    /// A significant change smaller than this (percent) is `unchanged`.
    pub threshold_pct: f64,
    pub skip_first: Option<usize>,
}

pub struct Check {
    pub study: String,
    /// What it was checked against, in words.
    pub reference: String,
    pub threshold_pct: f64,
    pub rows: Vec<Judged>,
    /// Against the history: the configurations' measurements over their
    /// attempts, in the rows' order, for those with earlier attempts.
    pub trends: Vec<Trend>,
}

/// A configuration's measurements on one system over its attempts (of any
/// study), oldest first, the one checked included.
#[derive(Debug, Clone)]
pub struct Trend {
    pub configuration: String,
    pub system: String,
    pub attempts: Vec<history::Attempt>,
}

/// What a check says as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing regressed, failed or could not be told (exit status 0).
    Passed,
    /// A configuration regressed or failed (exit status 1).
    Failed,
    /// Nothing regressed or failed, but a configuration is inconclusive: the
    /// check cannot pass it (exit status 3).
    Inconclusive,
}

impl Outcome {
    pub fn exit_status(self) -> u8 {
        match self {
            Outcome::Passed => 0,
            Outcome::Failed => 1,
            Outcome::Inconclusive => 3,
        }
    }
}

impl Check {
    pub fn outcome(&self) -> Outcome {
        if self.rows.iter().any(|r| r.verdict.fails()) {
            Outcome::Failed
        } else if self.count(Verdict::Inconclusive) > 0 {
            Outcome::Inconclusive
        } else {
            Outcome::Passed
        }
    }

    /// Nothing regressed, failed or could not be told.
    pub fn passed(&self) -> bool {
        self.outcome() == Outcome::Passed
    }

    pub fn count(&self, v: Verdict) -> usize {
        self.rows.iter().filter(|r| r.verdict == v).count()
    }
}

pub fn run(source: &Source, opts: &CheckOptions) -> Result<Check> {
    if !(0.0..100.0).contains(&opts.threshold_pct) {
        bail!(
            "--threshold is a percentage in [0, 100), not {}",
            opts.threshold_pct
        );
    }
    if matches!(source, Source::Import { .. }) {
        bail!("give a manifest or a results/<study> directory to check");
    }
    let (study, summary, dir) = super::configurations(source, opts.skip_first)?;
    match &opts.reference {
        Reference::History { last } => {
            let dir = dir.as_ref().ok_or_else(|| {
                anyhow::anyhow!("cannot find the study's directory to find its history")
            })?;
            let path = history::path_for(dir);
            let Some(h) = History::open_existing(&path)? else {
                bail!(
                    "there is no history at {} yet: a report of the study records it (`sweep report`, `sweep run`), \
                     or `sweep history --import results/<study>` records one reported before",
                    path.display()
                );
            };
            against_history(&study, &summary, &h, *last, opts.threshold_pct)
        }
        Reference::Study(other) => {
            let now = sides(&summary);
            let (name, theirs, their_dir) = super::configurations(other, opts.skip_first)?;
            if their_dir.is_some() && their_dir == dir {
                bail!("--against names the study checked: give another study, or --history");
            }
            let theirs = sides(&theirs);
            let found = pair(&now, &theirs)
                .into_iter()
                .map(|t| t.and_then(|t| Found::study(&theirs[t])))
                .collect();
            Ok(Check {
                study,
                reference: format!("study {name}"),
                threshold_pct: opts.threshold_pct,
                rows: judge(&now, found, opts.threshold_pct),
                trends: Vec::new(),
            })
        }
    }
}

/// A study's latest attempt (`summary`, summarised per configuration)
/// against its history: the check and each configuration's trend.
pub fn against_history(
    study: &str,
    summary: &Summary,
    h: &History,
    last: usize,
    threshold_pct: f64,
) -> Result<Check> {
    let now = sides(summary);
    let found = now
        .iter()
        .map(|s| {
            let entries = h.reference(&s.id, &s.system, &s.now, last)?;
            let mut attempts: Vec<&str> = entries
                .iter()
                .map(|e| e.study_attempt_id.as_str())
                .collect();
            attempts.sort();
            attempts.dedup();
            let attempts = attempts.len();
            Ok((!entries.is_empty()).then(|| Found {
                attempts,
                samples: entries
                    .iter()
                    .map(|e| RunSample {
                        mean: e.tokens_per_second_mean,
                        std: e.tokens_per_second_std,
                        points: e.points,
                    })
                    .collect(),
                fingerprints: entries.into_iter().filter_map(|e| e.fingerprint).collect(),
            }))
        })
        .collect::<Result<_>>()?;
    let rows = judge(&now, found, threshold_pct);
    let trends = trends(h, &now)?;
    Ok(Check {
        study: study.to_string(),
        reference: format!(
            "the history ({}), last {last} attempts on the same system",
            h.path().display()
        ),
        threshold_pct,
        rows,
        trends,
    })
}

/// Each configuration's attempts on its system, oldest first, where it has
/// any besides the one checked.
fn trends(h: &History, now: &[Side]) -> Result<Vec<Trend>> {
    let mut out = Vec::new();
    for s in now {
        let attempts = h.attempts(&history::Filter {
            configuration_id: Some(s.id.clone()),
            system: Some(s.system.clone()),
            ..history::Filter::default()
        })?;
        let earlier = attempts
            .iter()
            .filter(|a| !s.now.study_attempts.contains(&a.study_attempt_id))
            .count();
        if earlier > 0 {
            out.push(Trend {
                configuration: s.name.clone(),
                system: s.system.clone(),
                attempts,
            });
        }
    }
    Ok(out)
}

fn number(x: Option<f64>) -> String {
    x.map_or_else(|| "–".to_string(), |v| format!("{v:.1}"))
}

/// The check as a table with a line per regression's differences, and a
/// closing count.
pub fn text(c: &Check) -> String {
    use crate::util::text::{cell, note};
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
    let counts: Vec<String> = Verdict::ALL
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

/// `sweep check --json`.
pub fn to_json(c: &Check) -> serde_json::Value {
    json!({
        "study": c.study,
        "reference": c.reference,
        "threshold_pct": c.threshold_pct,
        "passed": c.passed(),
        "outcome": match c.outcome() {
            Outcome::Passed => "passed",
            Outcome::Failed => "failed",
            Outcome::Inconclusive => "inconclusive",
        },
        "configurations": c.rows.iter().map(|r| json!({
            "configuration": r.configuration,
            "configuration_id": r.configuration_id,
            "system": r.system,
            "verdict": r.verdict,
            "note": r.note,
            "tokens_per_second": r.now_mean,
            "runs": r.now_runs,
            "reference_tokens_per_second": r.reference_mean,
            "reference_runs": r.reference_runs,
            "reference_attempts": r.reference_attempts,
            "ratio": r.ratio.map(|x| x.ratio),
            "ratio_ci95_low": r.ratio.map(|x| x.low),
            "ratio_ci95_high": r.ratio.map(|x| x.high),
            "p_value_holm": r.p_value_holm,
            "runs_to_decide": r.runs_to_decide,
            "differences": r.differences,
            "stragglers": r.stragglers,
        })).collect::<Vec<_>>(),
    })
}

/// Text as XML 1.0 holds it: escaped, and without the control characters
/// it cannot hold at all.
fn xml(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(ch),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// JUnit XML (as GitLab and Jenkins read it): one test case per
/// configuration; a regression or a failed run is a failure with the
/// figures in its message, a configuration without a reference or that
/// cannot be told is skipped.
pub fn junit(c: &Check) -> String {
    let failures = c.rows.iter().filter(|r| r.verdict.fails()).count();
    let skipped = c.count(Verdict::New) + c.count(Verdict::Inconclusive);
    let suite = xml(&c.study);
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    out.push_str(&format!(
        "<testsuites name=\"sweep check\" tests=\"{n}\" failures=\"{failures}\" errors=\"0\" skipped=\"{skipped}\">\n\
         <testsuite name=\"{suite}\" tests=\"{n}\" failures=\"{failures}\" errors=\"0\" skipped=\"{skipped}\" timestamp=\"{at}\">\n",
        n = c.rows.len(),
        at = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S"),
    ));
    out.push_str(&format!(
        "<properties><property name=\"reference\" value=\"{}\"/><property name=\"threshold_pct\" value=\"{}\"/></properties>\n",
        xml(&c.reference),
        c.threshold_pct
    ));
    for r in &c.rows {
        let figures = format!(
            "{}: {} tokens/s now ({} runs) against {} ({} runs); {}",
            r.verdict.as_str(),
            number(r.now_mean),
            r.now_runs,
            number(r.reference_mean),
            r.reference_runs,
            r.note
        );
        out.push_str(&format!(
            "<testcase classname=\"sweep.{suite}\" name=\"{}\" time=\"0\">",
            xml(&r.configuration)
        ));
        match r.verdict {
            v if v.fails() => {
                let mut body = figures.clone();
                if !r.differences.is_empty() {
                    body.push_str(&format!("\nwhat differs: {}", r.differences.join("; ")));
                }
                for st in &r.stragglers {
                    body.push_str(&format!("\nstraggler {st}"));
                }
                out.push_str(&format!(
                    "<failure type=\"{}\" message=\"{}\">{}</failure>",
                    v.as_str(),
                    xml(&figures),
                    xml(&body)
                ));
            }
            Verdict::New | Verdict::Inconclusive => {
                out.push_str(&format!("<skipped message=\"{}\"/>", xml(&figures)));
            }
            _ => out.push_str(&format!("<system-out>{}</system-out>", xml(&figures))),
        }
        out.push_str("</testcase>\n");
    }
    out.push_str("</testsuite>\n</testsuites>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn junit_text_is_escaped() {
        assert_eq!(
            xml("a<b>&\"c'\u{1}"),
            "a&lt;b&gt;&amp;&quot;c&apos;\u{FFFD}"
        );
    }
}
