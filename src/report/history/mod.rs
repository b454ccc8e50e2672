//! The performance history, `results/history.sqlite`: every report records its completed runs'
//! measurements once each, keyed by attempt id, in one transaction (a killed report changes
//! nothing; concurrent ones wait for SQLite's lock). Sweep writes only into a file with its own
//! application id and schema (docs/report.md, "The history"); anything else is left as it is.

use super::ingest::RunLog;
use super::stats::{mean_ci95_of, MeanCi};
use super::summary::Summary;
use crate::executor::fingerprint::Fingerprint;
use crate::executor::State;
use anyhow::Result;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use serde::Serialize;
use std::path::{Path, PathBuf};
mod failures;
mod file;

pub use failures::{failures, text as failures_text, Failure};
pub use file::SCHEMA_VERSION;
use file::*;

/// The file, in a project's `results/`.
pub const FILE: &str = crate::layout::HISTORY_SQLITE;
pub const APPLICATION_ID: i32 = crate::layout::HISTORY_APPLICATION_ID;
/// The system of runs whose jobs wrote no fingerprint.
pub const UNKNOWN_SYSTEM: &str = "unknown";
/// One run's measurements, as a row of `measurements`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Entry {
    /// The run's measurement ([`crate::plan::record::RunRecord::attempt_ids`]): recorded once by it.
    pub attempt_id: String,
    /// The study attempt it was measured in: the runs pooled as one attempt.
    pub study_attempt_id: String,
    pub study: String,
    /// The run's identity hash (its repeat included).
    pub run_id: String,
    /// The study's attempt count when it ran (`--again` counts on, afresh counts from 1).
    pub attempt: u32,
    pub run: String,
    /// The identity hash its repeats share: what the history compares by.
    pub configuration_id: String,
    pub configuration: String,
    pub system: String,
    /// When the job ran (its fingerprint's time; else when it was rendered).
    pub ran_at: String,
    pub recorded_at: String,
    pub git_commit: Option<String>,
    pub sweep_version: Option<String>,
    /// Steady-state log points its mean is over.
    pub points: usize,
    pub tokens_per_second_mean: f64,
    pub tokens_per_second_std: Option<f64>,
    pub mfu_pct_mean: Option<f64>,
    pub tflops_mean: Option<f64>,
    pub step_time_s_mean: Option<f64>,
    pub peak_memory_mb_mean: Option<f64>,
    /// `environment.json` as the job wrote it.
    #[serde(skip)]
    pub fingerprint: Option<Fingerprint>,
}

/// The history file beside a study directory (`results/<study>` -> `results/history.sqlite`).
pub fn path_for(study_dir: &Path) -> PathBuf {
    let dir = study_dir
        .canonicalize()
        .unwrap_or_else(|_| study_dir.to_path_buf());
    crate::util::fs::parent_dir(&dir).join(FILE)
}

/// What recording did: measurements new, and measurements whose derived figures were recomputed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    pub new: usize,
    pub recomputed: usize,
}

impl std::fmt::Display for Recorded {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "{} run(s) recorded", self.new)?;
        if self.recomputed > 0 {
            write!(
                f,
                ", {} recorded before recomputed (what the report derives from their points changed)",
                self.recomputed
            )?;
        }
        Ok(())
    }
}

/// Recomputes the derived figures of a recorded measurement whose points are `e`'s and whose
/// figures differ (its attempt's sums follow); whether it changed.
fn rederive(tx: &rusqlite::Transaction, e: &Entry) -> rusqlite::Result<bool> {
    type Stored = (i64, f64, Option<f64>, Option<f64>, Option<f64>, Option<f64>);
    let stored: Option<Stored> = tx
        .query_row(
            "SELECT points, tokens_per_second_mean, tokens_per_second_std, mfu_pct_mean,
                    tflops_mean, step_time_s_mean
             FROM measurements WHERE attempt_id = ?1",
            params![e.attempt_id],
            |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ))
            },
        )
        .optional()?;
    let Some((points, tps, tps_std, mfu, tflops, step)) = stored else {
        return Ok(false);
    };
    let same = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => (a - b).abs() <= 1e-12 * a.abs().max(b.abs()),
        (a, b) => a.is_none() && b.is_none(),
    };
    let unchanged = same(Some(tps), Some(e.tokens_per_second_mean))
        && same(tps_std, e.tokens_per_second_std)
        && same(mfu, e.mfu_pct_mean)
        && same(tflops, e.tflops_mean)
        && same(step, e.step_time_s_mean);
    // Other points: another reading of the log, not another rule.
    if points != e.points as i64 || unchanged {
        return Ok(false);
    }
    tx.execute(
        "UPDATE measurements SET tokens_per_second_mean = ?2, tokens_per_second_std = ?3,
                mfu_pct_mean = ?4, tflops_mean = ?5, step_time_s_mean = ?6
         WHERE attempt_id = ?1",
        params![
            e.attempt_id,
            e.tokens_per_second_mean,
            e.tokens_per_second_std,
            e.mfu_pct_mean,
            e.tflops_mean,
            e.step_time_s_mean
        ],
    )?;
    let (new_tps, new_mfu, new_tflops) = (e.tokens_per_second_mean, e.mfu_pct_mean, e.tflops_mean);
    tx.execute(
        "UPDATE attempts SET
            tps_sum = tps_sum - ?4 + ?5,
            tps_sum_sq = tps_sum_sq - ?4 * ?4 + ?5 * ?5,
            one_std = CASE WHEN runs = 1 THEN ?6 ELSE one_std END,
            mfu_sum = mfu_sum - IFNULL(?7, 0) + IFNULL(?8, 0),
            mfu_n = mfu_n - (?7 IS NOT NULL) + (?8 IS NOT NULL),
            tflops_sum = tflops_sum - IFNULL(?9, 0) + IFNULL(?10, 0),
            tflops_n = tflops_n - (?9 IS NOT NULL) + (?10 IS NOT NULL)
         WHERE configuration_id = ?1 AND system = ?2 AND study_attempt_id = ?3",
        params![
            e.configuration_id,
            e.system,
            e.study_attempt_id,
            tps,
            new_tps,
            e.tokens_per_second_std,
            mfu,
            new_mfu,
            tflops,
            new_tflops
        ],
    )?;
    Ok(true)
}

/// The completed runs of a summary as entries (imported logs and runs without a throughput
/// are not measurements the history can key).
pub fn entries(study: &str, s: &Summary) -> Vec<Entry> {
    let now = crate::util::now_rfc3339();
    s.runs
        .iter()
        .zip(&s.figures)
        .filter(|(r, _)| r.status.state == State::Completed)
        .filter_map(|(r, f)| {
            let (id, configuration) = (r.id.as_ref()?, r.configuration.as_ref()?);
            let built = r.built.as_ref()?;
            let fingerprint = fingerprint_of(r);
            Some(Entry {
                attempt_id: built.attempt_id.clone(),
                study_attempt_id: built.study_attempt_id.clone(),
                study: study.to_string(),
                run_id: id.clone(),
                attempt: r.attempt,
                run: r.name.clone(),
                configuration_id: configuration.id.clone(),
                configuration: configuration.name.clone(),
                system: system_of(fingerprint.as_ref()),
                ran_at: ran_at(fingerprint.as_ref(), built),
                recorded_at: now.clone(),
                git_commit: built.git_commit.clone(),
                sweep_version: Some(built.sweep_version.clone()),
                points: f.points,
                tokens_per_second_mean: f.tokens_per_second?,
                tokens_per_second_std: f.tokens_per_second_std,
                mfu_pct_mean: f.mfu_pct,
                tflops_mean: f.tflops,
                step_time_s_mean: f.step_time_s,
                peak_memory_mb_mean: f.peak_memory_mb,
                fingerprint,
            })
        })
        .collect()
}

/// The system a run's fingerprint names; [`UNKNOWN_SYSTEM`] without one.
fn system_of(fingerprint: Option<&Fingerprint>) -> String {
    fingerprint.map_or_else(|| UNKNOWN_SYSTEM.to_string(), |f| f.system.clone())
}

/// When a run's job ran: its fingerprint's time, else when it was rendered.
fn ran_at(fingerprint: Option<&Fingerprint>, built: &super::ingest::Built) -> String {
    fingerprint
        .map(|f| f.taken_at.clone())
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| built.created_at.clone())
}

/// A run's fingerprint, where its job wrote a readable one.
pub fn fingerprint_of(r: &RunLog) -> Option<Fingerprint> {
    Fingerprint::load(r.dir.as_deref()?).ok().flatten()
}

/// The measurements a check is about: left out of their own reference.
#[derive(Debug, Clone, Default)]
pub struct Now {
    /// The study attempts its runs were rendered in.
    pub study_attempts: Vec<String>,
    /// Its runs' attempt ids.
    pub runs: Vec<String>,
}

impl Now {
    fn json(&self) -> (String, String) {
        let j = |v: &Vec<String>| serde_json::to_string(v).expect("strings serialise");
        (j(&self.study_attempts), j(&self.runs))
    }
}

pub struct History {
    conn: Connection,
    path: PathBuf,
}

impl History {
    /// Opens the history for recording, creating it where there is none; a file that is not a
    /// sweep history of this version is refused, untouched.
    pub fn open(path: &Path) -> Result<History> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if let Err(e) = std::fs::create_dir_all(dir) {
                return Err(match e.kind() {
                    std::io::ErrorKind::PermissionDenied
                    | std::io::ErrorKind::ReadOnlyFilesystem => read_only(path, &e),
                    _ => anyhow::Error::new(e).context(format!("creating {}", dir.display())),
                });
            }
        }
        sniff(path)?;
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn =
            Connection::open_with_flags(path, flags).map_err(|e| match is_read_only(&e) {
                true => read_only(path, &e),
                false => not_readable(path, &e),
            })?;
        // SQLite opens a file it may not write read-only, without a word.
        if conn.is_readonly(rusqlite::MAIN_DB).unwrap_or(false) {
            return Err(read_only(path, &"SQLite opened it read-only"));
        }
        conn.busy_timeout(BUSY)
            .map_err(|e| not_readable(path, &e))?;
        // What the file is, decided under SQLite's write lock; nothing is written (not even the
        // switch to WAL) until it is known to be sweep's history.
        let setup = || -> rusqlite::Result<Contents> {
            conn.execute_batch("BEGIN IMMEDIATE")?;
            let mut verdict = verify(&conn)?;
            if verdict == Contents::Empty {
                conn.execute_batch(SCHEMA)?;
                conn.pragma_update(None, "application_id", APPLICATION_ID)?;
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', ?1)",
                    params![SCHEMA_VERSION.to_string()],
                )?;
                verdict = verify(&conn)?;
            }
            if verdict != Contents::Ours {
                conn.execute_batch("ROLLBACK")?;
                return Ok(verdict);
            }
            conn.execute_batch("COMMIT")?;
            conn.pragma_update(None, "journal_mode", "WAL")?;
            conn.pragma_update(None, "synchronous", "NORMAL")?;
            // Read straight from the mapped file: a million runs' history is ~300 MB.
            conn.pragma_update(None, "mmap_size", 1i64 << 30)?;
            Ok(verdict)
        };
        // Two sweeps creating one history: the switch to WAL answers "locked" without the busy handler.
        let deadline = std::time::Instant::now() + BUSY;
        let outcome = loop {
            match setup() {
                Err(e) if is_busy(&e) && std::time::Instant::now() < deadline => {
                    if !conn.is_autocommit() {
                        let _ = conn.execute_batch("ROLLBACK");
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                outcome => break outcome,
            }
        };
        if !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        match outcome {
            Ok(Contents::Ours) => Ok(History {
                conn,
                path: path.to_path_buf(),
            }),
            Ok(verdict) => Err(refused(path, verdict)),
            Err(e) if is_read_only(&e) => Err(read_only(path, &e)),
            Err(e) => Err(not_readable(path, &e)),
        }
    }

    /// The history for reading; `None` where there is none. Nothing is written.
    pub fn open_existing(path: &Path) -> Result<Option<History>> {
        match sniff(path)? {
            Found::Nothing => return Ok(None),
            // A history being created has its first pages in its WAL; a bare empty file holds nothing.
            Found::Empty if !wal_of(path).exists() => return Ok(None),
            Found::Empty | Found::Ours | Found::Unmarked => {}
        }
        let open = |target: &str, flags: OpenFlags| -> rusqlite::Result<(Connection, Contents)> {
            let conn = Connection::open_with_flags(target, flags)?;
            conn.busy_timeout(BUSY)?;
            let verdict = verify(&conn)?;
            if verdict == Contents::Ours {
                conn.pragma_update(None, "mmap_size", 1i64 << 30)?;
            }
            Ok((conn, verdict))
        };
        let read = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let plain = open(&path.to_string_lossy(), read);
        // Where SQLite cannot make its shared-memory file (a read-only folder), read as immutable.
        let opened = match plain {
            Err(e) if is_read_only(&e) => {
                open(&immutable_uri(path), read | OpenFlags::SQLITE_OPEN_URI).map_err(|_| e)
            }
            other => other,
        };
        match opened {
            Ok((conn, Contents::Ours)) => Ok(Some(History {
                conn,
                path: path.to_path_buf(),
            })),
            Ok((_, Contents::Empty)) => Ok(None),
            Ok((_, verdict)) => Err(refused(path, verdict)),
            Err(e) => Err(not_readable(path, &e)),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records entries in one transaction ([`History::record_all`]).
    pub fn record(&mut self, entries: &[Entry]) -> Result<Recorded> {
        self.record_all(entries, &[])
    }

    /// [`History::record`], and the failures in the same transaction. A recorded measurement keeps
    /// its points; only what the report derives from them is recomputed.
    pub fn record_all(&mut self, entries: &[Entry], failures: &[Failure]) -> Result<Recorded> {
        let path = self.path.clone();
        let fail = |e: rusqlite::Error| match is_read_only(&e) {
            true => read_only(&path, &e),
            false => anyhow::anyhow!("recording into {}: {e}", path.display()),
        };
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(fail)?;
        let mut added = Recorded::default();
        {
            let mut fingerprints: std::collections::HashMap<String, i64> = Default::default();
            let mut store_fp = tx
                .prepare_cached("INSERT OR IGNORE INTO fingerprints (json) VALUES (?1)")
                .map_err(fail)?;
            let mut find_fp = tx
                .prepare_cached("SELECT id FROM fingerprints WHERE json = ?1")
                .map_err(fail)?;
            let mut insert = tx
                .prepare_cached(
                    "INSERT OR IGNORE INTO measurements (attempt_id, study_attempt_id, study,
                     run_id, attempt, run, configuration_id, configuration, system, ran_at,
                     recorded_at, git_commit, sweep_version, points, tokens_per_second_mean,
                     tokens_per_second_std, mfu_pct_mean, tflops_mean, step_time_s_mean,
                     peak_memory_mb_mean, fingerprint_id)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15,
                             ?16, ?17, ?18, ?19, ?20, ?21)",
                )
                .map_err(fail)?;
            for e in entries {
                let fingerprint = match &e.fingerprint {
                    None => None,
                    Some(f) => {
                        let json = serde_json::to_string(f).expect("a fingerprint serialises");
                        match fingerprints.get(&json) {
                            Some(id) => Some(*id),
                            None => {
                                store_fp.execute(params![json]).map_err(fail)?;
                                let id: i64 = find_fp
                                    .query_row(params![json], |r| r.get(0))
                                    .map_err(fail)?;
                                fingerprints.insert(json, id);
                                Some(id)
                            }
                        }
                    }
                };
                let new = insert
                    .execute(params![
                        e.attempt_id,
                        e.study_attempt_id,
                        e.study,
                        e.run_id,
                        e.attempt,
                        e.run,
                        e.configuration_id,
                        e.configuration,
                        e.system,
                        e.ran_at,
                        e.recorded_at,
                        e.git_commit,
                        e.sweep_version,
                        e.points as i64,
                        e.tokens_per_second_mean,
                        e.tokens_per_second_std,
                        e.mfu_pct_mean,
                        e.tflops_mean,
                        e.step_time_s_mean,
                        e.peak_memory_mb_mean,
                        fingerprint,
                    ])
                    .map_err(fail)?;
                added.new += new;
                if new == 0 && rederive(&tx, e).map_err(fail)? {
                    added.recomputed += 1;
                }
            }
            failures::insert(&tx, failures).map_err(fail)?;
        }
        tx.commit().map_err(fail)?;
        Ok(added)
    }

    /// Each configuration's attempts per system, oldest first, runs pooled: `sweep history`.
    pub fn attempts(&self, filter: &Filter) -> Result<Vec<Attempt>> {
        let fail = |e: rusqlite::Error| anyhow::anyhow!("reading {}: {e}", self.path.display());
        let (filter_sql, values) = filter.sql();
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT configuration_id, system, study_attempt_id, study, attempt, configuration,
                        ran_at, git_commit, runs, tps_sum, tps_sum_sq, one_std, one_points,
                        mfu_sum, mfu_n, tflops_sum, tflops_n
                 FROM attempts {filter_sql}"
            ))
            .map_err(fail)?;
        let rows = stmt
            .query_map(rusqlite::params_from_iter(values), |r| {
                let runs: i64 = r.get(8)?;
                let (sum, sum_sq): (f64, f64) = (r.get(9)?, r.get(10)?);
                let mean = sum / runs.max(1) as f64;
                let avg = |s: f64, n: i64| (n > 0).then(|| s / n as f64);
                Ok(Attempt {
                    configuration_id: r.get(0)?,
                    system: r.get(1)?,
                    study_attempt_id: r.get(2)?,
                    study: r.get(3)?,
                    attempt: r.get(4)?,
                    configuration: r.get(5)?,
                    ran_at: r.get(6)?,
                    git_commit: r.get(7)?,
                    runs: runs.max(0) as usize,
                    tokens_per_second: mean,
                    ci95: interval(runs, mean, sum_sq, r.get(11)?, r.get(12)?)
                        .map(|c| (c.low, c.high)),
                    mfu_pct: avg(r.get(13)?, r.get(14)?),
                    tflops: avg(r.get(15)?, r.get(16)?),
                })
            })
            .map_err(fail)?;
        let mut out = rows.collect::<rusqlite::Result<Vec<_>>>().map_err(fail)?;
        // Each configuration's attempts in the order they ran.
        out.sort_unstable_by(|a, b| {
            (
                &a.configuration_id,
                &a.system,
                &a.ran_at,
                &a.study,
                a.attempt,
                &a.study_attempt_id,
            )
                .cmp(&(
                    &b.configuration_id,
                    &b.system,
                    &b.ran_at,
                    &b.study,
                    b.attempt,
                    &b.study_attempt_id,
                ))
        });
        Ok(out)
    }

    /// The runs of a configuration's last `last` attempts on `system`, newest first, other than
    /// those `now` names: the reference `sweep check --history` pools.
    pub fn reference(
        &self,
        configuration_id: &str,
        system: &str,
        now: &Now,
        last: usize,
    ) -> Result<Vec<Entry>> {
        let fail = |e: rusqlite::Error| anyhow::anyhow!("reading {}: {e}", self.path.display());
        let (study_attempts, runs) = now.json();
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT m.attempt_id, m.study_attempt_id, m.study, m.run_id, m.attempt, m.run,
                        m.configuration_id, m.configuration, m.system, m.ran_at, m.recorded_at,
                        m.git_commit, m.sweep_version, m.points, m.tokens_per_second_mean,
                        m.tokens_per_second_std, m.mfu_pct_mean, m.tflops_mean,
                        m.step_time_s_mean, m.peak_memory_mb_mean, f.json
                 FROM measurements m
                 JOIN (SELECT study_attempt_id, MAX(ran_at) AS at FROM measurements
                       WHERE configuration_id = ?1 AND system = ?2
                         AND study_attempt_id NOT IN (SELECT value FROM json_each(?3))
                         AND attempt_id NOT IN (SELECT value FROM json_each(?4))
                       GROUP BY study_attempt_id ORDER BY at DESC LIMIT ?5) a
                   ON m.study_attempt_id = a.study_attempt_id
                 LEFT JOIN fingerprints f ON f.id = m.fingerprint_id
                 WHERE m.configuration_id = ?1 AND m.system = ?2
                   AND m.attempt_id NOT IN (SELECT value FROM json_each(?4))
                 ORDER BY a.at DESC, m.run",
            )
            .map_err(fail)?;
        let rows = stmt
            .query_map(
                params![configuration_id, system, study_attempts, runs, last as i64],
                |r| {
                    let fingerprint: Option<String> = r.get(20)?;
                    Ok(Entry {
                        attempt_id: r.get(0)?,
                        study_attempt_id: r.get(1)?,
                        study: r.get(2)?,
                        run_id: r.get(3)?,
                        attempt: r.get(4)?,
                        run: r.get(5)?,
                        configuration_id: r.get(6)?,
                        configuration: r.get(7)?,
                        system: r.get(8)?,
                        ran_at: r.get(9)?,
                        recorded_at: r.get(10)?,
                        git_commit: r.get(11)?,
                        sweep_version: r.get(12)?,
                        points: r.get::<_, i64>(13)?.max(0) as usize,
                        tokens_per_second_mean: r.get(14)?,
                        tokens_per_second_std: r.get(15)?,
                        mfu_pct_mean: r.get(16)?,
                        tflops_mean: r.get(17)?,
                        step_time_s_mean: r.get(18)?,
                        peak_memory_mb_mean: r.get(19)?,
                        // A fingerprint that no longer parses is only a comparison less.
                        fingerprint: fingerprint.and_then(|f| serde_json::from_str(&f).ok()),
                    })
                },
            )
            .map_err(fail)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(fail)
    }
}

/// An attempt's tokens/s interval: over its runs' means with two or more, else one run's points.
fn interval(n: i64, mean: f64, sum_sq: f64, one_std: Option<f64>, points: i64) -> Option<MeanCi> {
    if n >= 2 {
        let nf = n as f64;
        let var = ((sum_sq - nf * mean * mean) / (nf - 1.0)).max(0.0);
        mean_ci95_of(mean, var, n as usize)
    } else {
        mean_ci95_of(mean, one_std? * one_std?, points.max(0) as usize)
    }
}

/// Which attempts `sweep history` shows.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub study: Option<String>,
    /// A configuration by name (as `sweep history --config` takes it).
    pub configuration: Option<String>,
    /// A configuration by identity (what the page and the check use).
    pub configuration_id: Option<String>,
    pub system: Option<String>,
    /// RFC 3339 or a date (`2026-11-01`): runs that ran on or after it.
    pub since: Option<String>,
}

impl Filter {
    /// The `WHERE` clause of the filters given (only those, so SQLite can use an index).
    fn sql(&self) -> (String, Vec<&str>) {
        let mut conditions: Vec<&str> = Vec::new();
        let mut values: Vec<&str> = Vec::new();
        for (sql, value) in [
            ("study = ?", &self.study),
            ("configuration = ?", &self.configuration),
            ("configuration_id = ?", &self.configuration_id),
            ("system = ?", &self.system),
            ("ran_at >= ?", &self.since),
        ] {
            if let Some(v) = value {
                conditions.push(sql);
                values.push(v);
            }
        }
        let sql = match conditions.is_empty() {
            true => String::new(),
            false => format!("WHERE {}", conditions.join(" AND ")),
        };
        (sql, values)
    }
}

/// One attempt of one configuration, its runs pooled.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Attempt {
    pub configuration_id: String,
    pub configuration: String,
    pub system: String,
    /// The study attempt its runs were measured in (`study.json`).
    pub study_attempt_id: String,
    pub study: String,
    pub attempt: u32,
    pub ran_at: String,
    pub git_commit: Option<String>,
    pub runs: usize,
    /// Mean tokens/s of its runs, and the 95% interval of that mean.
    pub tokens_per_second: f64,
    pub ci95: Option<(f64, f64)>,
    pub mfu_pct: Option<f64>,
    pub tflops: Option<f64>,
}

/// `sweep history` as a table: a line per configuration and attempt.
pub fn text(attempts: &[Attempt]) -> String {
    use crate::util::text::{cell, printable};
    if attempts.is_empty() {
        return "no measurements match".to_string();
    }
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_FULL_CONDENSED)
        .set_header([
            "configuration",
            "system",
            "study",
            "attempt",
            "ran",
            "commit",
            "runs",
            "tokens/s [95% CI]",
            "MFU %",
        ]);
    for a in attempts {
        let tps = match a.ci95 {
            Some((low, high)) => format!("{:.1} [{low:.1}, {high:.1}]", a.tokens_per_second),
            None => format!("{:.1}", a.tokens_per_second),
        };
        t.add_row([
            cell(&a.configuration).into_owned(),
            cell(&a.system).into_owned(),
            cell(&a.study).into_owned(),
            a.attempt.to_string(),
            printable(a.ran_at.get(..16).unwrap_or(&a.ran_at)).replace('T', " "),
            printable(
                a.git_commit
                    .as_deref()
                    .map_or("", |c| c.get(..10).unwrap_or(c)),
            )
            .into_owned(),
            a.runs.to_string(),
            tps,
            a.mfu_pct
                .map_or_else(|| "–".to_string(), |m| format!("{m:.1}")),
        ]);
    }
    t.to_string()
}

/// Records a summary's completed runs beside its study: the file, the counts, and the history
/// still open (none where nothing was measured yet).
pub fn record(
    study_dir: &Path,
    study: &str,
    s: &Summary,
) -> Result<(PathBuf, Recorded, Option<History>)> {
    let path = path_for(study_dir);
    let entries = entries(study, s);
    let failures = failures(study, s);
    if entries.is_empty() && failures.is_empty() && path.symlink_metadata().is_err() {
        // Nothing measured yet: no file for nothing.
        return Ok((path, Recorded::default(), None));
    }
    let mut h = History::open(&path)?;
    let recorded = h.record_all(&entries, &failures)?;
    Ok((path, recorded, Some(h)))
}

#[cfg(test)]
mod tests;
