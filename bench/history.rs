//! The history at scale: a `results/history.sqlite` of `rows` measurements
//! (studies of 20 configurations × 5 repeats, 100 attempts each), then what
//! `sweep history` and `sweep check --history` read from it, timed.

use crate::timed;
use anyhow::Result;
use sweep::report::history::{self, Entry, Filter, History};

pub struct HistoryBench {
    pub rows: usize,
    pub studies: usize,
    pub setup_s: f64,
    /// `sweep history <study>`: its attempts per configuration, as a table.
    pub one_study_s: f64,
    pub one_study_lines: usize,
    /// `sweep history` of everything (the attempts, not printed).
    pub everything_s: f64,
    pub everything_lines: usize,
    /// `sweep check --history`'s reads: each configuration's last 5 attempts.
    pub check_s: f64,
}

const CONFIGURATIONS: usize = 20;
const REPEATS: usize = 5;
const ATTEMPTS: usize = 100;
/// Measurements of one synthetic study; the check reads study 0's.
pub const PER_STUDY: usize = CONFIGURATIONS * REPEATS * ATTEMPTS;

pub fn run(rows: usize, dir: &std::path::Path) -> Result<HistoryBench> {
    let tmp = sweep::util::fs::scratch_dir_in(dir)?;
    let path = tmp.path().join(history::FILE);
    let studies = rows.div_ceil(PER_STUDY).max(1);
    let (made, setup) = timed(|| -> Result<()> {
        let mut h = History::open(&path)?;
        let mut batch = Vec::with_capacity(PER_STUDY);
        let mut left = rows;
        for s in 0..studies {
            batch.clear();
            for a in 1..=ATTEMPTS {
                for c in 0..CONFIGURATIONS {
                    for r in 0..REPEATS {
                        if left == 0 {
                            break;
                        }
                        left -= 1;
                        batch.push(entry(s, a, c, r));
                    }
                }
            }
            h.record(&batch)?;
        }
        Ok(())
    });
    made?;
    let h = History::open_existing(&path)?.expect("just written");
    let (one, one_s) = timed(|| -> Result<usize> {
        let attempts = h.attempts(&Filter {
            study: Some("study-0000".into()),
            ..Filter::default()
        })?;
        Ok(history::text(&attempts).lines().count().min(attempts.len()))
    });
    let (all, all_s) = timed(|| h.attempts(&Filter::default()).map(|a| a.len()));
    let (checked, check_s) = timed(|| -> Result<usize> {
        let mut n = 0;
        for c in 0..CONFIGURATIONS {
            n += h
                .reference(
                    &format!("cfg-0000-{c:02}"),
                    "bench/gpu",
                    &history::Now {
                        study_attempts: vec![study_attempt(0, ATTEMPTS)],
                        runs: (0..REPEATS)
                            .map(|r| attempt_id(0, ATTEMPTS, c, r))
                            .collect(),
                    },
                    5,
                )?
                .len();
        }
        Ok(n)
    });
    anyhow::ensure!(
        checked? == CONFIGURATIONS * REPEATS * 5.min(ATTEMPTS - 1),
        "the reference reads"
    );
    Ok(HistoryBench {
        rows,
        studies,
        setup_s: setup.as_secs_f64(),
        one_study_s: one_s.as_secs_f64(),
        one_study_lines: one?,
        everything_s: all_s.as_secs_f64(),
        everything_lines: all?,
        check_s: check_s.as_secs_f64(),
    })
}

/// The id of attempt `a` of study `s`.
fn study_attempt(s: usize, a: usize) -> String {
    format!("{:032x}", (s << 16) | a)
}

/// The attempt id of repeat `r` of configuration `c` in attempt `a` of study `s`.
fn attempt_id(s: usize, a: usize, c: usize, r: usize) -> String {
    format!("{:032x}", (s << 40) | (a << 24) | (c << 8) | r)
}

/// Repeat `r` of configuration `c` of study `s`, attempt `a`.
fn entry(s: usize, a: usize, c: usize, r: usize) -> Entry {
    let tps = 10_000.0 + (c * 100) as f64 + ((s * 31 + a * 7 + r * 3) % 50) as f64;
    Entry {
        attempt_id: attempt_id(s, a, c, r),
        study_attempt_id: study_attempt(s, a),
        study: format!("study-{s:04}"),
        run_id: format!("run-{s:04}-{c:02}-{r}"),
        attempt: a as u32,
        run: format!("cfg-{c:02}-r{r}"),
        configuration_id: format!("cfg-{s:04}-{c:02}"),
        configuration: format!("cfg-{c:02}"),
        system: "bench/gpu".into(),
        ran_at: format!("2026-{:02}-{:02}T00:00:00Z", 1 + a / 28 % 12, 1 + a % 28),
        recorded_at: "2026-12-01T00:00:00Z".into(),
        git_commit: Some(format!("{a:040x}")),
        sweep_version: Some("0.1.0".into()),
        points: 95,
        tokens_per_second_mean: tps,
        tokens_per_second_std: Some(tps * 0.01),
        mfu_pct_mean: Some(40.0),
        tflops_mean: Some(400.0),
        step_time_s_mean: Some(0.5),
        peak_memory_mb_mean: Some(60_000.0),
        fingerprint: None,
    }
}
