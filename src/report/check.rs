//! `sweep check`: did a study get slower? Every configuration's latest
//! attempt against a reference — another study, or the history (the same
//! configuration identity on the same system, its last N attempts pooled)
//! — judged from the throughput ratio's 95% interval, Holm-corrected over
//! the configurations, and a practical threshold; beside each regression,
//! what differs between the runs' environment fingerprints.

use super::history::{self, History, UNKNOWN_SYSTEM};
use super::ingest::RunLog;
use super::stats::{holm, ratio_of_runs, Basis, RatioCi, RunSample, ALPHA};
use super::summary::{RunFigures, Summary};
use super::Source;
use crate::executor::fingerprint::{self, Fingerprint};
use crate::executor::State;
use anyhow::{bail, Result};
use serde::Serialize;
use serde_json::json;
use std::path::Path;

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

pub struct Options {
    pub reference: Reference,
    /// A significant change smaller than this (percent) is `unchanged`.
    pub threshold_pct: f64,
    pub skip_first: Option<usize>,
}

/// The verdict on one configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Regressed,
    Improved,
    Unchanged,
    /// A run of its latest attempt did not complete (or measured nothing).
    Failed,
    /// Nothing to compare with: no reference measurements (or no interval).
    New,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Regressed => "regressed",
            Verdict::Improved => "improved",
            Verdict::Unchanged => "unchanged",
            Verdict::Failed => "failed",
            Verdict::New => "new",
        }
    }

    /// Whether it fails the check (exit status 1, a JUnit failure).
    pub fn fails(self) -> bool {
        matches!(self, Verdict::Regressed | Verdict::Failed)
    }
}

/// One configuration checked.
#[derive(Debug, Clone)]
pub struct Checked {
    pub configuration: String,
    pub configuration_id: String,
    pub system: String,
    pub verdict: Verdict,
    /// Why, in a sentence: the figures behind the verdict.
    pub note: String,
    pub now_mean: Option<f64>,
    pub now_runs: usize,
    pub reference_mean: Option<f64>,
    pub reference_runs: usize,
    pub reference_attempts: usize,
    /// Now over the reference, with its interval (`significant` after Holm).
    pub ratio: Option<RatioCi>,
    pub basis: Option<Basis>,
    pub p_value_holm: Option<f64>,
    /// For a regression: what differs between its runs' fingerprints and
    /// the reference's.
    pub differences: Vec<String>,
    /// For a regression or a failure: the stragglers among its runs' ranks
    /// (a slow node slows every rank of a data-parallel run), described.
    pub stragglers: Vec<String>,
}

pub struct Check {
    pub study: String,
    /// What it was checked against, in words.
    pub reference: String,
    pub threshold_pct: f64,
    pub rows: Vec<Checked>,
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

impl Check {
    /// No configuration regressed or failed.
    pub fn passed(&self) -> bool {
        !self.rows.iter().any(|r| r.verdict.fails())
    }

    pub fn count(&self, v: Verdict) -> usize {
        self.rows.iter().filter(|r| r.verdict == v).count()
    }
}

/// A configuration's runs on one side.
struct Side {
    id: String,
    name: String,
    /// The measurements it holds (none of them its own reference).
    now: history::Now,
    system: String,
    samples: Vec<RunSample>,
    /// Runs that did not complete with a throughput: `name: STATE`.
    failed: Vec<String>,
    fingerprints: Vec<Fingerprint>,
    stragglers: Vec<super::straggler::Straggler>,
}

/// A study's runs per configuration, in the order of its table.
fn sides(s: &Summary) -> Vec<Side> {
    let mut out: Vec<Side> = Vec::new();
    for (i, (r, f)) in s.runs.iter().zip(&s.figures).enumerate() {
        let (id, name) = match &r.configuration {
            Some(c) => (c.id.clone(), c.name.clone()),
            None => (format!("run #{i}"), r.name.clone()),
        };
        let at = match out.iter().position(|x| x.id == id) {
            Some(at) => at,
            None => {
                out.push(Side {
                    id,
                    name,
                    now: history::Now::default(),
                    system: String::new(),
                    samples: Vec::new(),
                    failed: Vec::new(),
                    fingerprints: Vec::new(),
                    stragglers: Vec::new(),
                });
                out.len() - 1
            }
        };
        let side = &mut out[at];
        if let Some(b) = &r.built {
            if !side.now.study_attempts.contains(&b.study_attempt_id) {
                side.now.study_attempts.push(b.study_attempt_id.clone());
            }
            side.now.runs.push(b.attempt_id.clone());
        }
        side.stragglers
            .extend(s.stragglers.iter().filter(|x| x.run == r.name).cloned());
        match sample(r, f) {
            Some(x) => side.samples.push(x),
            None => side
                .failed
                .push(format!("{}: {}", r.name, r.status.describe())),
        }
        if let Some(fp) = history::fingerprint_of(r) {
            if side.system.is_empty() {
                side.system = fp.system.clone();
            }
            side.fingerprints.push(fp);
        }
    }
    for s in &mut out {
        if s.system.is_empty() {
            s.system = UNKNOWN_SYSTEM.to_string();
        }
    }
    out
}

/// A completed run's sample; none for a run that did not complete or
/// measured nothing.
fn sample(r: &RunLog, f: &RunFigures) -> Option<RunSample> {
    (r.status.state == State::Completed).then_some(())?;
    Some(RunSample {
        mean: f.tokens_per_second?,
        std: f.tokens_per_second_std,
        points: f.points,
    })
}

/// The reference of one configuration: its runs' samples, how many
/// attempts they come from, and their fingerprints.
struct Found {
    samples: Vec<RunSample>,
    attempts: usize,
    fingerprints: Vec<Fingerprint>,
}

pub fn run(root: &Path, source: &Source, opts: &Options) -> Result<Check> {
    if !(0.0..100.0).contains(&opts.threshold_pct) {
        bail!(
            "--threshold is a percentage in [0, 100), not {}",
            opts.threshold_pct
        );
    }
    if matches!(source, Source::Import { .. }) {
        bail!("give a manifest or a results/<study> directory to check");
    }
    let (study, summary, dir) = super::configurations(root, source, opts.skip_first)?;
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
            let (name, theirs, their_dir) = super::configurations(root, other, opts.skip_first)?;
            if their_dir.is_some() && their_dir == dir {
                bail!("--against names the study checked: give another study, or --history");
            }
            let theirs = sides(&theirs);
            let found = now
                .iter()
                .map(|s| {
                    let t = theirs
                        .iter()
                        .find(|t| t.id == s.id)
                        .or_else(|| theirs.iter().find(|t| t.name == s.name))?;
                    (!t.samples.is_empty()).then(|| Found {
                        samples: t.samples.clone(),
                        attempts: 1,
                        fingerprints: t.fingerprints.clone(),
                    })
                })
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

/// The verdicts: ratios and intervals per configuration, Holm's correction
/// over those compared, the threshold, and what differs where one regressed.
fn judge(now: &[Side], found: Vec<Option<Found>>, threshold_pct: f64) -> Vec<Checked> {
    let ratios: Vec<Option<(RatioCi, Basis)>> = now
        .iter()
        .zip(&found)
        .map(|(s, f)| match (s.failed.is_empty(), f) {
            (true, Some(f)) => ratio_of_runs(&s.samples, &f.samples),
            _ => None,
        })
        .collect();
    let verdicts = verdicts(
        &ratios.iter().map(|r| r.map(|r| r.0)).collect::<Vec<_>>(),
        threshold_pct,
    );
    now.iter()
        .zip(found)
        .zip(ratios.into_iter().zip(verdicts))
        .map(|((s, f), (compared, decided))| {
            let mean = |xs: &[RunSample]| {
                (!xs.is_empty()).then(|| xs.iter().map(|x| x.mean).sum::<f64>() / xs.len() as f64)
            };
            let (verdict, p_value_holm, ratio) = match (s.failed.is_empty(), decided) {
                (false, _) => (Verdict::Failed, None, None),
                (true, Some((v, p, r))) => (v, Some(p), Some(r)),
                (true, None) => (Verdict::New, None, None),
            };
            let note = match verdict {
                Verdict::Failed => format!("did not complete: {}", s.failed.join("; ")),
                Verdict::New if f.is_none() => "no reference measurements".to_string(),
                Verdict::New => "no interval: too few runs or points".to_string(),
                _ => {
                    let r = ratio.expect("decided");
                    let change = (r.ratio - 1.0) * 100.0;
                    let small = verdict == Verdict::Unchanged
                        && r.significant
                        && change.abs() < threshold_pct;
                    let mut n = format!(
                        "{:+.1}% [{:+.1}%, {:+.1}%], Holm p = {:.3}",
                        change,
                        (r.low - 1.0) * 100.0,
                        (r.high - 1.0) * 100.0,
                        p_value_holm.unwrap_or(1.0)
                    );
                    if small {
                        n.push_str(&format!(
                            "; significant but within the {threshold_pct}% threshold"
                        ));
                    }
                    n
                }
            };
            let differences = match (&f, verdict) {
                (Some(f), Verdict::Regressed) => fingerprint::differences(
                    &s.fingerprints.iter().collect::<Vec<_>>(),
                    &f.fingerprints.iter().collect::<Vec<_>>(),
                ),
                _ => Vec::new(),
            };
            let stragglers = match verdict.fails() {
                true => s.stragglers.iter().map(|x| x.describe()).collect(),
                false => Vec::new(),
            };
            Checked {
                stragglers,
                configuration: s.name.clone(),
                configuration_id: s.id.clone(),
                system: s.system.clone(),
                verdict,
                note,
                now_mean: mean(&s.samples),
                now_runs: s.samples.len(),
                reference_mean: f.as_ref().and_then(|f| mean(&f.samples)),
                reference_runs: f.as_ref().map_or(0, |f| f.samples.len()),
                reference_attempts: f.as_ref().map_or(0, |f| f.attempts),
                basis: ratio.and(compared.map(|c| c.1)),
                ratio,
                p_value_holm,
                differences,
            }
        })
        .collect()
}

/// The verdict of each ratio (none: no comparison), Holm-corrected over the
/// ratios given: significant at 5% and beyond the threshold is `regressed`
/// or `improved`; anything else `unchanged`. Returns (verdict, adjusted p,
/// the ratio with `significant` as decided).
pub fn verdicts(
    ratios: &[Option<RatioCi>],
    threshold_pct: f64,
) -> Vec<Option<(Verdict, f64, RatioCi)>> {
    let p: Vec<Option<f64>> = ratios.iter().map(|r| r.map(|r| r.p_value)).collect();
    ratios
        .iter()
        .zip(holm(&p))
        .map(|(r, adjusted)| {
            let (mut r, adjusted) = ((*r)?, adjusted?);
            r.significant = adjusted < ALPHA;
            let beyond = (r.ratio - 1.0).abs() * 100.0 >= threshold_pct;
            let v = match (r.significant && beyond, r.ratio < 1.0) {
                (false, _) => Verdict::Unchanged,
                (true, true) => Verdict::Regressed,
                (true, false) => Verdict::Improved,
            };
            Some((v, adjusted, r))
        })
        .collect()
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
    out.push_str(&format!(
        "{} configurations: {} regressed, {} improved, {} unchanged, {} failed, {} new",
        c.rows.len(),
        c.count(Verdict::Regressed),
        c.count(Verdict::Improved),
        c.count(Verdict::Unchanged),
        c.count(Verdict::Failed),
        c.count(Verdict::New)
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
/// figures in its message, a configuration without a reference is skipped.
pub fn junit(c: &Check) -> String {
    let failures = c.rows.iter().filter(|r| r.verdict.fails()).count();
    let skipped = c.count(Verdict::New);
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
            Verdict::New => {
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
    use rand::SeedableRng;
    use rand_distr::{Distribution, Normal};

    /// A run: its mean drawn around `mean` with run-to-run spread `between`,
    /// its 50 steady points with spread `within`.
    fn run(rng: &mut rand::rngs::StdRng, mean: f64, between: f64, within: f64) -> RunSample {
        RunSample {
            mean: Normal::new(mean, between).unwrap().sample(rng),
            std: Some(within),
            points: 50,
        }
    }

    /// Studies of 8 configurations, the history 5 attempts of one run
    /// each, the check one new run each: with nothing changed, a study with
    /// any `regressed` verdict is rare (Holm keeps "any significant" at 5%,
    /// the threshold fewer still); a real 10% slowdown is found.
    #[test]
    fn unchanged_studies_rarely_regress_and_real_slowdowns_are_found() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(28);
        let study = |rng: &mut rand::rngs::StdRng, now_mean: f64| {
            let ratios: Vec<Option<RatioCi>> = (0..8)
                .map(|_| {
                    let history: Vec<RunSample> =
                        (0..5).map(|_| run(rng, 1000.0, 20.0, 40.0)).collect();
                    let now = [run(rng, now_mean, 20.0, 40.0)];
                    ratio_of_runs(&now, &history).map(|r| r.0)
                })
                .collect();
            verdicts(&ratios, 3.0)
        };
        let regressed = |v: &[Option<(Verdict, f64, RatioCi)>]| {
            v.iter()
                .flatten()
                .filter(|x| x.0 == Verdict::Regressed)
                .count()
        };
        let false_alarms = (0..1000)
            .filter(|_| regressed(&study(&mut rng, 1000.0)) > 0)
            .count();
        eprintln!("unchanged studies with a false `regressed`: {false_alarms} of 1000");
        assert!(false_alarms <= 50, "{false_alarms} of 1000");
        // Without the threshold, Holm alone: at most 5% (binomial noise: 65).
        let any = (0..1000)
            .filter(|_| {
                let ratios: Vec<Option<RatioCi>> = (0..8)
                    .map(|_| {
                        let h: Vec<RunSample> =
                            (0..5).map(|_| run(&mut rng, 1000.0, 20.0, 40.0)).collect();
                        ratio_of_runs(&[run(&mut rng, 1000.0, 20.0, 40.0)], &h).map(|r| r.0)
                    })
                    .collect();
                verdicts(&ratios, 0.0)
                    .iter()
                    .flatten()
                    .any(|x| x.0 != Verdict::Unchanged)
            })
            .count();
        assert!(any <= 65, "{any} of 1000 with any significant change");
        let found: usize = (0..100).map(|_| regressed(&study(&mut rng, 900.0))).sum();
        eprintln!("a 10% slowdown found in {found} of 800 configurations");
        // One run against five, Holm over eight: about 70% (577 with this seed).
        assert!(
            found >= 480,
            "a 10% slowdown found in {found} of 800 configurations"
        );
    }

    #[test]
    fn a_significant_change_within_the_threshold_is_unchanged() {
        let r = RatioCi {
            ratio: 0.985,
            low: 0.98,
            high: 0.99,
            significant: true,
            p_value: 1e-6,
        };
        let v = verdicts(&[Some(r)], 3.0);
        assert_eq!(v[0].unwrap().0, Verdict::Unchanged);
        assert_eq!(verdicts(&[Some(r)], 1.0)[0].unwrap().0, Verdict::Regressed);
        assert_eq!(verdicts(&[None], 1.0)[0], None);
    }

    #[test]
    fn junit_text_is_escaped() {
        assert_eq!(
            xml("a<b>&\"c'\u{1}"),
            "a&lt;b&gt;&amp;&quot;c&apos;\u{FFFD}"
        );
    }
}
