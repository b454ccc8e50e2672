//! The one judge of throughput: a study's configurations against a
//! reference — another study (`sweep compare`, `sweep check --against`) or
//! the history (`sweep check --history`, the page's history section) — by
//! one pairing rule, one statistic and one verdict.
//!
//! Each configuration's runs are samples (a run's steady-state mean is one,
//! [`ratio_of_runs`]); the ratio now / reference and its 95% interval are
//! corrected with Holm's method over the configurations judged; then:
//! - `regressed` / `improved`: significant after Holm and at least the
//!   threshold;
//! - `unchanged`: the whole interval within ± the threshold (an equivalence
//!   test: a wide interval around 1.00x is not evidence of no change);
//! - `inconclusive`: neither — the spread is too wide to tell; the note
//!   says about how many runs a side would decide at that spread;
//! - `failed`: a run did not complete; `new`: nothing to compare with.

use super::columns::Field;
use super::history::{self, UNKNOWN_SYSTEM};
use super::ingest::RunLog;
use super::stats::{holm, mean_ci95, ratio_of_runs, Basis, MeanCi, RatioCi, RunSample, ALPHA};
use super::summary::{self, Problem, RunFigures, Summary};
use crate::executor::fingerprint::{self, Fingerprint};
use crate::executor::State;
use anyhow::Result;
use serde::Serialize;
use std::path::PathBuf;

/// The verdict on one configuration.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, strum::IntoStaticStr, strum::VariantArray,
)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum Verdict {
    Regressed,
    Improved,
    Unchanged,
    /// The interval is too wide to tell a change of the threshold's size from none.
    Inconclusive,
    /// A run of its latest attempt did not complete (or measured nothing).
    Failed,
    /// Nothing to compare with: no reference measurements (or no interval).
    New,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Whether it fails a check (exit status 1, a JUnit failure).
    pub fn fails(self) -> bool {
        matches!(self, Verdict::Regressed | Verdict::Failed)
    }
}

/// One configuration judged.
#[derive(Debug, Clone)]
pub struct Judged {
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
    /// For an inconclusive verdict: about how many runs a side would decide at this spread.
    pub runs_to_decide: Option<usize>,
    /// For a regression: what differs between its runs' fingerprints and the reference's.
    pub differences: Vec<String>,
    /// For a regression or a failure: the stragglers among its runs' ranks.
    pub stragglers: Vec<String>,
}

/// A configuration's runs on one side, as a row of its summary holds them.
#[derive(Debug, Clone)]
pub struct Side {
    /// Its identity: the configuration id its runs share, else its name.
    pub id: String,
    pub name: String,
    /// The measurements it holds (none of them its own reference).
    pub now: history::Now,
    pub system: String,
    pub samples: Vec<RunSample>,
    /// Runs that did not complete with a throughput: `name: STATE`.
    pub failed: Vec<String>,
    pub fingerprints: Vec<Fingerprint>,
    stragglers: Vec<super::straggler::Straggler>,
}

/// A summary's rows as sides, in the order of its table.
pub fn sides(s: &Summary) -> Vec<Side> {
    s.rows
        .iter()
        .map(|row| {
            let runs: Vec<(&RunLog, &RunFigures)> = row
                .runs
                .iter()
                .map(|&i| (&s.runs[i], &s.figures[i]))
                .collect();
            let ids: Vec<&str> = runs
                .iter()
                .filter_map(|(r, _)| r.configuration.as_ref().map(|c| c.id.as_str()))
                .collect();
            let shared = ids.len() == runs.len() && ids.windows(2).all(|w| w[0] == w[1]);
            let mut side = Side {
                id: match (shared, ids.first()) {
                    (true, Some(id)) => id.to_string(),
                    _ => row.name.clone(),
                },
                name: row.name.clone(),
                now: history::Now::default(),
                system: String::new(),
                samples: Vec::new(),
                failed: Vec::new(),
                fingerprints: Vec::new(),
                stragglers: Vec::new(),
            };
            for (r, f) in runs {
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
            if side.system.is_empty() {
                side.system = UNKNOWN_SYSTEM.to_string();
            }
            side
        })
        .collect()
}

/// A completed run's sample; none for a run that measured nothing.
fn sample(r: &RunLog, f: &RunFigures) -> Option<RunSample> {
    (r.status.state == State::Completed).then_some(())?;
    Some(RunSample {
        mean: f.tokens_per_second?,
        std: f.tokens_per_second_std,
        points: f.points,
    })
}

/// Each side's counterpart among `theirs`: the same identity, else the same name.
pub fn pair(now: &[Side], theirs: &[Side]) -> Vec<Option<usize>> {
    now.iter()
        .map(|s| {
            theirs
                .iter()
                .position(|t| t.id == s.id)
                .or_else(|| theirs.iter().position(|t| t.name == s.name))
        })
        .collect()
}

/// One configuration's reference: its runs' samples, their attempts and fingerprints.
pub struct Found {
    pub samples: Vec<RunSample>,
    pub attempts: usize,
    pub fingerprints: Vec<Fingerprint>,
}

impl Found {
    /// Another study's side as a reference; none without a measurement.
    pub fn study(side: &Side) -> Option<Found> {
        (!side.samples.is_empty()).then(|| Found {
            samples: side.samples.clone(),
            attempts: 1,
            fingerprints: side.fingerprints.clone(),
        })
    }
}

/// The verdicts: ratios and intervals, Holm's correction, the threshold, and what differs.
pub fn judge(now: &[Side], found: Vec<Option<Found>>, threshold_pct: f64) -> Vec<Judged> {
    let ratios: Vec<Option<(RatioCi, Basis)>> = now
        .iter()
        .zip(&found)
        .map(|(s, f)| match (s.failed.is_empty(), f) {
            (true, Some(f)) => ratio_of_runs(&s.samples, &f.samples),
            _ => None,
        })
        .collect();
    let decided = verdicts(
        &ratios.iter().map(|r| r.map(|r| r.0)).collect::<Vec<_>>(),
        threshold_pct,
    );
    now.iter()
        .zip(found)
        .zip(ratios.into_iter().zip(decided))
        .map(|((s, f), (compared, decided))| {
            let mean = |xs: &[RunSample]| {
                (!xs.is_empty()).then(|| xs.iter().map(|x| x.mean).sum::<f64>() / xs.len() as f64)
            };
            let (verdict, p_value_holm, ratio) = match (s.failed.is_empty(), decided) {
                (false, _) => (Verdict::Failed, None, None),
                (true, Some((v, p, r))) => (v, Some(p), Some(r)),
                (true, None) => (Verdict::New, None, None),
            };
            let reference_runs = f.as_ref().map_or(0, |f| f.samples.len());
            let runs_to_decide = match (verdict, ratio) {
                (Verdict::Inconclusive, Some(r)) => {
                    runs_to_decide(&r, s.samples.len().min(reference_runs), threshold_pct)
                }
                _ => None,
            };
            let note = note(
                verdict,
                f.is_some(),
                s,
                ratio,
                p_value_holm,
                threshold_pct,
                runs_to_decide,
            );
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
            Judged {
                stragglers,
                configuration: s.name.clone(),
                configuration_id: s.id.clone(),
                system: s.system.clone(),
                verdict,
                note,
                now_mean: mean(&s.samples),
                now_runs: s.samples.len(),
                reference_mean: f.as_ref().and_then(|f| mean(&f.samples)),
                reference_runs,
                reference_attempts: f.as_ref().map_or(0, |f| f.attempts),
                basis: ratio.and(compared.map(|c| c.1)),
                ratio,
                p_value_holm,
                runs_to_decide,
                differences,
            }
        })
        .collect()
}

/// Why, in a sentence.
fn note(
    verdict: Verdict,
    found: bool,
    s: &Side,
    ratio: Option<RatioCi>,
    p_value_holm: Option<f64>,
    threshold_pct: f64,
    runs_to_decide: Option<usize>,
) -> String {
    let Some(r) = ratio else {
        return match verdict {
            Verdict::Failed => format!("did not complete: {}", s.failed.join("; ")),
            _ if !found => "no reference measurements".to_string(),
            _ => "no interval: too few runs or points".to_string(),
        };
    };
    let mut n = format!(
        "{:+.1}% [{:+.1}%, {:+.1}%], Holm p = {:.3}",
        (r.ratio - 1.0) * 100.0,
        (r.low - 1.0) * 100.0,
        (r.high - 1.0) * 100.0,
        p_value_holm.unwrap_or(1.0)
    );
    match verdict {
        Verdict::Unchanged if r.significant => n.push_str(&format!(
            "; significant but the interval is within the {threshold_pct}% threshold"
        )),
        Verdict::Unchanged => n.push_str(&format!(
            "; the interval is within the {threshold_pct}% threshold"
        )),
        Verdict::Inconclusive => {
            n.push_str(&format!(
                "; the interval reaches past the {threshold_pct}% threshold without a significant change: cannot tell"
            ));
            match runs_to_decide {
                Some(k) => n.push_str(&format!(
                    "; about {k} runs a side would decide at this spread"
                )),
                None => n.push_str("; more runs a side, or a quieter machine, would decide"),
            }
        }
        _ => {}
    }
    n
}

/// The verdict of each ratio, Holm-corrected over those given (the module's rules), with the
/// adjusted p and the ratio's `significant` as decided.
pub fn verdicts(
    ratios: &[Option<RatioCi>],
    threshold_pct: f64,
) -> Vec<Option<(Verdict, f64, RatioCi)>> {
    let p: Vec<Option<f64>> = ratios.iter().map(|r| r.map(|r| r.p_value)).collect();
    let t = threshold_pct / 100.0;
    ratios
        .iter()
        .zip(holm(&p))
        .map(|(r, adjusted)| {
            let (mut r, adjusted) = ((*r)?, adjusted?);
            r.significant = adjusted < ALPHA;
            let beyond = (r.ratio - 1.0).abs() >= t;
            let v = if r.significant && beyond {
                match r.ratio < 1.0 {
                    true => Verdict::Regressed,
                    false => Verdict::Improved,
                }
            } else if r.low >= 1.0 - t && r.high <= 1.0 + t {
                Verdict::Unchanged
            } else {
                Verdict::Inconclusive
            };
            Some((v, adjusted, r))
        })
        .collect()
}

/// About how many runs a side would decide an inconclusive ratio (the half-width shrinks as
/// 1/√n); None if unreachable or beyond 1000.
fn runs_to_decide(r: &RatioCi, runs: usize, threshold_pct: f64) -> Option<usize> {
    let half = (r.high / r.low).ln() / 2.0;
    let d = r.ratio.ln().abs();
    let edge = (1.0 + threshold_pct / 100.0).ln();
    let room = match d >= edge {
        true => d,
        false => edge - d,
    };
    if !(half > 0.0 && room > 0.0 && half.is_finite()) {
        return None;
    }
    let n = (runs.max(1) as f64 * (half / room).powi(2)).ceil();
    (n <= 1000.0).then_some((n as usize).max(runs + 1).max(2))
}

// Two studies side by side (`sweep compare A B`).

/// One configuration on both sides: each side's tokens/s with its interval, B judged against A.
#[derive(Debug, Clone)]
pub struct Row {
    pub a: Option<MeanCi>,
    pub b: Option<MeanCi>,
    pub a_mean: Option<f64>,
    pub b_mean: Option<f64>,
    pub judged: Judged,
}

/// A field in which the compared runs differ: of their identity (`learning_rate`), or what
/// rendered them (`sweep version`, `git commit`).
#[derive(Debug, Clone, PartialEq)]
pub struct Difference {
    pub field: String,
    pub a: String,
    pub b: String,
    /// The configurations whose runs differ in it; empty: every one compared.
    pub configurations: Vec<String>,
}

impl Difference {
    /// The configurations it concerns, as tables show them.
    pub fn which(&self) -> String {
        match self.configurations.is_empty() {
            true => "all".to_string(),
            false => self.configurations.join(", "),
        }
    }
}

pub struct Comparison {
    pub a: String,
    pub b: String,
    pub threshold_pct: f64,
    pub rows: Vec<Row>,
    /// What differs between the sides' runs, as their records say (none for imported logs).
    pub differences: Vec<Difference>,
    /// Configurations found on one side only.
    pub only_a: Vec<String>,
    pub only_b: Vec<String>,
    /// Each side's report problems, as `sweep report` lists them.
    pub problems_a: Vec<Problem>,
    pub problems_b: Vec<Problem>,
    /// Each side's blocked design, where it has one.
    pub design_a: Option<super::blocks::Design>,
    pub design_b: Option<super::blocks::Design>,
    /// The files written, once written ([`super::compare`]).
    pub files: Vec<PathBuf>,
    pub chart: Option<super::plot::Chart>,
    pub git_commit: Option<String>,
}

/// Two summaries compared configuration by configuration ([`pair`]): B's speedup over A,
/// judged as a check of B against A is.
pub fn compare(
    name_a: &str,
    sa: &Summary,
    name_b: &str,
    sb: &Summary,
    threshold_pct: f64,
) -> Result<Comparison> {
    let (label_a, label_b) = if name_a == name_b {
        (format!("{name_a} (A)"), format!("{name_b} (B)"))
    } else {
        (name_a.to_string(), name_b.to_string())
    };
    let (side_a, side_b) = (sides(sa), sides(sb));
    // B judged against A: A's configurations in A's order, each with B's.
    let both: Vec<(usize, usize)> = pair(&side_a, &side_b)
        .into_iter()
        .enumerate()
        .filter_map(|(i, b)| Some((i, b?)))
        .collect();
    if both.is_empty() {
        let names = |s: &[Side]| {
            s.iter()
                .map(|x| x.name.clone())
                .collect::<Vec<_>>()
                .join(", ")
        };
        anyhow::bail!(
            "`{name_a}` and `{name_b}` have no configuration in common (A: {}; B: {})",
            names(&side_a),
            names(&side_b)
        );
    }
    let now: Vec<Side> = both.iter().map(|&(_, j)| side_b[j].clone()).collect();
    let found = both
        .iter()
        .map(|&(i, _)| Found::study(&side_a[i]))
        .collect();
    let rows = both
        .iter()
        .zip(judge(&now, found, threshold_pct))
        .map(|(&(i, j), judged)| {
            let (ra, rb) = (&sa.rows[i], &sb.rows[j]);
            Row {
                a: mean_ci95(&ra.tps_samples),
                b: mean_ci95(&rb.tps_samples),
                a_mean: ra.metric(Field::TokensPerSecond).mean,
                b_mean: rb.metric(Field::TokensPerSecond).mean,
                judged: Judged {
                    configuration: ra.name.clone(),
                    ..judged
                },
            }
        })
        .collect();
    let pairs: Vec<(&summary::Row, &summary::Row)> = both
        .iter()
        .map(|&(i, j)| (&sa.rows[i], &sb.rows[j]))
        .collect();
    let differences = differences(&pairs, sa, sb);
    let (in_a, in_b): (Vec<usize>, Vec<usize>) = both.iter().copied().unzip();
    let only = |s: &[Side], kept: &[usize]| {
        (0..s.len())
            .filter(|k| !kept.contains(k))
            .map(|k| s[k].name.clone())
            .collect()
    };
    Ok(Comparison {
        a: label_a,
        b: label_b,
        threshold_pct,
        differences,
        only_a: only(&side_a, &in_a),
        only_b: only(&side_b, &in_b),
        problems_a: sa.problems.clone(),
        problems_b: sb.problems.clone(),
        design_a: sa.design.clone(),
        design_b: sb.design.clone(),
        rows,
        files: Vec::new(),
        chart: None,
        git_commit: None,
    })
}

/// The fields in which each configuration's runs differ between the sides, merged where alike.
fn differences(
    both: &[(&summary::Row, &summary::Row)],
    sa: &Summary,
    sb: &Summary,
) -> Vec<Difference> {
    let mut out: Vec<Difference> = Vec::new();
    for (ra, rb) in both {
        let (Some(a), Some(b)) = (ra.runs.first(), rb.runs.first()) else {
            continue;
        };
        let (a, b) = (&sa.runs[*a], &sb.runs[*b]);
        let mut found = match (&a.identity, &b.identity) {
            (Some(x), Some(y)) => crate::plan::identity::differences(x, y),
            _ => Vec::new(),
        };
        // Repeats are numbered within a study: no difference between two.
        found.retain(|(k, _, _)| k != crate::plan::REPEAT);
        if let (Some(x), Some(y)) = (&a.built, &b.built) {
            let commit = |c: &Option<String>| c.clone().unwrap_or_else(|| "(unknown)".into());
            for (field, u, v) in [
                (
                    "sweep version",
                    x.sweep_version.clone(),
                    y.sweep_version.clone(),
                ),
                ("git commit", commit(&x.git_commit), commit(&y.git_commit)),
            ] {
                if u != v {
                    found.push((field.to_string(), u, v));
                }
            }
        }
        for (field, a, b) in found {
            match out
                .iter_mut()
                .find(|d| d.field == field && d.a == a && d.b == b)
            {
                Some(d) => d.configurations.push(ra.name.clone()),
                None => out.push(Difference {
                    field,
                    a,
                    b,
                    configurations: vec![ra.name.clone()],
                }),
            }
        }
    }
    for d in &mut out {
        if d.configurations.len() == both.len() {
            d.configurations.clear();
        }
    }
    out
}

/// What the table and the page say when no [`Difference`] is recorded.
pub const NOTHING_DIFFERS: &str = "The runs compared have the same configuration and were \
    rendered by the same sweep and commit: what differs is outside sweep's records (the \
    machine, the node, the hour).";

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
    /// the threshold fewer still); a real 10% slowdown is found; a
    /// configuration is `unchanged` only when its interval says so.
    #[test]
    fn unchanged_studies_rarely_regress_and_real_slowdowns_are_found() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(28);
        let study = |rng: &mut rand::rngs::StdRng, now_mean: f64, threshold: f64| {
            let ratios: Vec<Option<RatioCi>> = (0..8)
                .map(|_| {
                    let history: Vec<RunSample> =
                        (0..5).map(|_| run(rng, 1000.0, 20.0, 40.0)).collect();
                    let now = [run(rng, now_mean, 20.0, 40.0)];
                    ratio_of_runs(&now, &history).map(|r| r.0)
                })
                .collect();
            verdicts(&ratios, threshold)
        };
        let count = |v: &[Option<(Verdict, f64, RatioCi)>], of: Verdict| {
            v.iter().flatten().filter(|x| x.0 == of).count()
        };
        let studies: Vec<_> = (0..1000).map(|_| study(&mut rng, 1000.0, 3.0)).collect();
        let false_alarms = studies
            .iter()
            .filter(|s| count(s, Verdict::Regressed) > 0)
            .count();
        eprintln!("unchanged studies with a false `regressed`: {false_alarms} of 1000");
        assert!(false_alarms <= 50, "{false_alarms} of 1000");
        // Every `unchanged` has its interval within ±3%.
        for (_, _, r) in studies
            .iter()
            .flatten()
            .flatten()
            .filter(|x| x.0 == Verdict::Unchanged)
        {
            assert!(r.low >= 0.97 && r.high <= 1.03, "{r:?}");
        }
        // One run against five at 2% run-to-run noise has a prediction
        // interval of about ±6%: it cannot show a change within 5% is none.
        // Five runs against five (about ±3%) mostly can.
        let fives = |rng: &mut rand::rngs::StdRng, runs: usize| {
            let ratios: Vec<Option<RatioCi>> = (0..8)
                .map(|_| {
                    let mut draw = |n| {
                        (0..n)
                            .map(|_| run(rng, 1000.0, 20.0, 40.0))
                            .collect::<Vec<_>>()
                    };
                    let history = draw(5);
                    ratio_of_runs(&draw(runs), &history).map(|r| r.0)
                })
                .collect();
            count(&verdicts(&ratios, 5.0), Verdict::Unchanged)
        };
        let one: usize = (0..100).map(|_| fives(&mut rng, 1)).sum();
        let five: usize = (0..100).map(|_| fives(&mut rng, 5)).sum();
        eprintln!("unchanged at 5%: {one} of 800 with one run, {five} of 800 with five");
        assert!(one < 400 && five >= 600, "{one}, {five} of 800");
        // Without the threshold, Holm alone: at most 5% (binomial noise: 65).
        let any = (0..1000)
            .filter(|_| {
                let s = study(&mut rng, 1000.0, 0.0);
                count(&s, Verdict::Regressed) + count(&s, Verdict::Improved) > 0
            })
            .count();
        assert!(any <= 65, "{any} of 1000 with any significant change");
        let found: usize = (0..100)
            .map(|_| count(&study(&mut rng, 900.0, 3.0), Verdict::Regressed))
            .sum();
        eprintln!("a 10% slowdown found in {found} of 800 configurations");
        // One run against five, Holm over eight: about 70%.
        assert!(
            found >= 480,
            "a 10% slowdown found in {found} of 800 configurations"
        );
    }

    fn ratio(ratio: f64, low: f64, high: f64, p_value: f64) -> RatioCi {
        RatioCi {
            ratio,
            low,
            high,
            significant: p_value < ALPHA,
            p_value,
        }
    }

    #[test]
    fn a_verdict_is_unchanged_only_when_the_interval_is_within_the_threshold() {
        // Significant, small, and its interval within ±3%: unchanged.
        let small = ratio(0.985, 0.98, 0.99, 1e-6);
        assert_eq!(
            verdicts(&[Some(small)], 3.0)[0].unwrap().0,
            Verdict::Unchanged
        );
        assert_eq!(
            verdicts(&[Some(small)], 1.0)[0].unwrap().0,
            Verdict::Regressed
        );
        assert_eq!(verdicts(&[None], 1.0)[0], None);
        // The busy machine's 0.937x [0.331, 2.653] cannot tell.
        let wide = ratio(0.937, 0.331, 2.653, 0.9);
        assert_eq!(
            verdicts(&[Some(wide)], 3.0)[0].unwrap().0,
            Verdict::Inconclusive
        );
        // 2.441x [1.253, 4.754] leaves out 1 (unadjusted p 0.01; alone, Holm
        // changes nothing): improved, never unchanged.
        let faster = ratio(2.441, 1.253, 4.754, 0.01);
        assert_eq!(
            verdicts(&[Some(faster)], 3.0)[0].unwrap().0,
            Verdict::Improved
        );
        // Not significant and within nothing: inconclusive whatever the
        // point estimate.
        let near = ratio(1.0, 0.96, 1.04, 1.0);
        assert_eq!(
            verdicts(&[Some(near)], 3.0)[0].unwrap().0,
            Verdict::Inconclusive
        );
        assert_eq!(
            verdicts(&[Some(near)], 5.0)[0].unwrap().0,
            Verdict::Unchanged
        );
    }

    #[test]
    fn runs_to_decide_follow_the_spread() {
        // ±4% around 1.00 with 3 runs, threshold 3%: the half-width must
        // fall below 3% → 3 × (ln1.04 / ln1.03)² ≈ 5.3 → 6 runs.
        let near = ratio(1.0, 1.0 / 1.04, 1.04, 1.0);
        assert_eq!(runs_to_decide(&near, 3, 3.0), Some(6));
        // A 10% slowdown ± 15%: significant once the half-width is below
        // the 10%: 3 × (ln1.15 / ln(1/0.9))² ≈ 5.3 → 6.
        let slow = ratio(0.9, 0.9 / 1.15, 0.9 * 1.15, 0.3);
        assert_eq!(runs_to_decide(&slow, 3, 3.0), Some(6));
        // The busy machine's interval: hundreds of runs (2 × (ln 8.02 / 2 /
        // ln(1/0.937))² ≈ 511); none where no width would do (no change at
        // a zero threshold).
        let wide = ratio(0.937, 0.331, 2.653, 0.9);
        assert_eq!(runs_to_decide(&wide, 2, 3.0), Some(512));
        let none = ratio(1.0, 0.99, 1.01, 1.0);
        assert_eq!(runs_to_decide(&none, 2, 0.0), None);
    }
}
