//! `sweep check`: did a study get slower? Every configuration's latest
//! attempt against a reference — another study, or the history (the same
//! configuration identity on the same system, its last N attempts pooled)
//! — judged from the throughput ratio's 95% interval, Holm-corrected over
//! the configurations, and a practical threshold; beside each regression,
//! what differs between the runs' environment fingerprints.

use super::history::{self, History};
use super::judge::{judge, pair, sides, Found, Judged, Side, Verdict};
use super::stats::RunSample;
use super::summary::Summary;
use super::Source;
use anyhow::{bail, Result};

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
