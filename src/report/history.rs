//! The performance history: `results/history.sqlite`, one SQLite file per
//! project (rusqlite's bundled SQLite, write-ahead log, no server). Every
//! report of a study records its completed runs' measurements — keyed by
//! study, run id and attempt, so recording a report twice adds nothing — in
//! one transaction: a report killed while recording leaves the history as
//! it was, and reports recording at once wait for each other (SQLite's
//! lock) instead of losing a row. `sweep history` reads it back per
//! configuration and attempt; `sweep check --history` takes its references
//! from it. The schema is a contract (docs/report.md, "The history").

use super::ingest::RunLog;
use super::stats::{mean_ci95_of, MeanCi};
use super::summary::Summary;
use crate::executor::fingerprint::Fingerprint;
use crate::executor::State;
use anyhow::{bail, Context, Result};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The file, in a project's `results/`.
pub const FILE: &str = "history.sqlite";
/// The schema's version (`meta.schema_version`): a file of a later version
/// is refused, never rewritten.
pub const SCHEMA_VERSION: i64 = 2;
/// The system of runs whose jobs wrote no fingerprint.
pub const UNKNOWN_SYSTEM: &str = "unknown";
/// How long a writer waits for another one (a report of thousands of runs
/// records in well under a second).
const BUSY: Duration = Duration::from_secs(60);

// Rows are stored in the order the history is read in (a configuration's
// attempts together, WITHOUT ROWID): `sweep history` aggregates them in
// one pass without sorting, and a configuration's reference is one range.
// A fingerprint is stored once however many runs share it.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS fingerprints (
    id   INTEGER PRIMARY KEY,
    json TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS measurements (
    study                  TEXT    NOT NULL,
    run_id                 TEXT    NOT NULL,
    attempt                INTEGER NOT NULL,
    run                    TEXT    NOT NULL,
    configuration_id       TEXT    NOT NULL,
    configuration          TEXT    NOT NULL,
    system                 TEXT    NOT NULL,
    ran_at                 TEXT    NOT NULL,
    recorded_at            TEXT    NOT NULL,
    git_commit             TEXT,
    sweep_version          TEXT,
    points                 INTEGER NOT NULL,
    tokens_per_second_mean REAL    NOT NULL,
    tokens_per_second_std  REAL,
    mfu_pct_mean           REAL,
    tflops_mean            REAL,
    step_time_s_mean       REAL,
    peak_memory_mb_mean    REAL,
    fingerprint_id         INTEGER REFERENCES fingerprints (id),
    PRIMARY KEY (configuration_id, system, study, attempt, run_id)
) WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS measurements_by_run
    ON measurements (study, run_id, attempt);
";

// Version 2: each attempt's runs summed as they are recorded, so that
// `sweep history` reads one row per attempt, not per run (a million runs
// are ~200,000 attempts). A trigger keeps it: whatever inserts a
// measurement adds it to its attempt, in the same transaction.
const ATTEMPTS: &str = "
CREATE TABLE IF NOT EXISTS attempts (
    configuration_id TEXT    NOT NULL,
    system           TEXT    NOT NULL,
    study            TEXT    NOT NULL,
    attempt          INTEGER NOT NULL,
    configuration    TEXT    NOT NULL,
    ran_at           TEXT    NOT NULL,
    git_commit       TEXT,
    runs             INTEGER NOT NULL,
    tps_sum          REAL    NOT NULL,
    tps_sum_sq       REAL    NOT NULL,
    one_std          REAL,
    one_points       INTEGER NOT NULL,
    mfu_sum          REAL    NOT NULL,
    mfu_n            INTEGER NOT NULL,
    tflops_sum       REAL    NOT NULL,
    tflops_n         INTEGER NOT NULL,
    PRIMARY KEY (configuration_id, system, study, attempt)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS attempts_by_study ON attempts (study);
CREATE TRIGGER IF NOT EXISTS measurement_in_attempt AFTER INSERT ON measurements
BEGIN
    INSERT INTO attempts VALUES (
        NEW.configuration_id, NEW.system, NEW.study, NEW.attempt, NEW.configuration,
        NEW.ran_at, NEW.git_commit, 1, NEW.tokens_per_second_mean,
        NEW.tokens_per_second_mean * NEW.tokens_per_second_mean,
        NEW.tokens_per_second_std, NEW.points,
        IFNULL(NEW.mfu_pct_mean, 0), NEW.mfu_pct_mean IS NOT NULL,
        IFNULL(NEW.tflops_mean, 0), NEW.tflops_mean IS NOT NULL)
    ON CONFLICT DO UPDATE SET
        ran_at = MIN(ran_at, excluded.ran_at),
        runs = runs + 1,
        tps_sum = tps_sum + excluded.tps_sum,
        tps_sum_sq = tps_sum_sq + excluded.tps_sum_sq,
        one_std = excluded.one_std,
        one_points = excluded.one_points,
        mfu_sum = mfu_sum + excluded.mfu_sum,
        mfu_n = mfu_n + excluded.mfu_n,
        tflops_sum = tflops_sum + excluded.tflops_sum,
        tflops_n = tflops_n + excluded.tflops_n;
END;
";

/// A version 1 history's attempts, summed from its runs (the upgrade to
/// version 2; the trigger adds every run recorded afterwards).
const FILL_ATTEMPTS: &str = "
INSERT INTO attempts
SELECT configuration_id, system, study, attempt, MIN(configuration), MIN(ran_at),
       MIN(git_commit), COUNT(*), SUM(tokens_per_second_mean),
       SUM(tokens_per_second_mean * tokens_per_second_mean),
       MAX(tokens_per_second_std), MAX(points),
       TOTAL(mfu_pct_mean), COUNT(mfu_pct_mean), TOTAL(tflops_mean), COUNT(tflops_mean)
FROM measurements GROUP BY configuration_id, system, study, attempt;
";

/// One run's measurements, as a row of `measurements`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Entry {
    pub study: String,
    /// The run's identity hash (its repeat included).
    pub run_id: String,
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

/// The history file beside a study directory (`results/<study>` ->
/// `results/history.sqlite`).
pub fn path_for(study_dir: &Path) -> PathBuf {
    let dir = study_dir
        .canonicalize()
        .unwrap_or_else(|_| study_dir.to_path_buf());
    crate::util::fs::parent_dir(&dir).join(FILE)
}

/// The completed runs of a summary as history entries (runs without a
/// record — imported logs — or without a throughput are not measurements
/// the history can key).
pub fn entries(study: &str, s: &Summary) -> Vec<Entry> {
    let now = crate::util::now_rfc3339();
    s.runs
        .iter()
        .zip(&s.figures)
        .filter(|(r, _)| r.status.state == State::Completed)
        .filter_map(|(r, f)| {
            let (id, configuration) = (r.id.as_ref()?, r.configuration.as_ref()?);
            let fingerprint = fingerprint_of(r);
            Some(Entry {
                study: study.to_string(),
                run_id: id.clone(),
                attempt: r.attempt,
                run: r.name.clone(),
                configuration_id: configuration.id.clone(),
                configuration: configuration.name.clone(),
                system: fingerprint
                    .as_ref()
                    .map_or_else(|| UNKNOWN_SYSTEM.to_string(), |f| f.system.clone()),
                ran_at: fingerprint
                    .as_ref()
                    .map(|f| f.taken_at.clone())
                    .filter(|t| !t.is_empty())
                    .or_else(|| r.built.as_ref().map(|b| b.created_at.clone()))
                    .unwrap_or_else(|| now.clone()),
                recorded_at: now.clone(),
                git_commit: r.built.as_ref().and_then(|b| b.git_commit.clone()),
                sweep_version: r.built.as_ref().map(|b| b.sweep_version.clone()),
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

/// A run's fingerprint, where its job wrote a readable one.
pub fn fingerprint_of(r: &RunLog) -> Option<Fingerprint> {
    Fingerprint::load(r.dir.as_deref()?).ok().flatten()
}

pub struct History {
    conn: Connection,
    path: PathBuf,
}

/// SQLite's "busy" or "locked": another connection holds the lock.
fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

impl History {
    /// Opens (creating it where there is none) the history for recording.
    pub fn open(path: &Path) -> Result<History> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        Self::with(path, flags, true)
    }

    /// The history for reading; `None` where there is none yet.
    pub fn open_existing(path: &Path) -> Result<Option<History>> {
        if path.symlink_metadata().is_err() {
            return Ok(None);
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        Self::with(path, flags, false).map(Some)
    }

    fn with(path: &Path, flags: OpenFlags, create: bool) -> Result<History> {
        let broken = |e: &dyn std::fmt::Display| {
            anyhow::anyhow!(
                "{} is not a readable sweep history ({e}): move it away to start a new one \
                 (`sweep history --import results/<study>` records a study again)",
                path.display()
            )
        };
        // Only a regular file (or none): never a device, pipe or directory.
        if let Ok(m) = path.metadata() {
            if !m.is_file() {
                bail!("{} is not a regular file", path.display());
            }
        }
        let conn = Connection::open_with_flags(path, flags).map_err(|e| broken(&e))?;
        conn.busy_timeout(BUSY).map_err(|e| broken(&e))?;
        let setup = || -> rusqlite::Result<Option<i64>> {
            conn.pragma_update(None, "journal_mode", "WAL")?;
            conn.pragma_update(None, "synchronous", "NORMAL")?;
            // Reads straight from the mapped file (a history of a million
            // runs is ~300 MB): `sweep history` of everything scans it.
            conn.pragma_update(None, "mmap_size", 1i64 << 30)?;
            let version = || {
                conn.query_row(
                    "SELECT value FROM meta WHERE key = 'schema_version'",
                    [],
                    |r| r.get::<_, String>(0),
                )
                .optional()
                .map(|v| v.and_then(|v| v.parse::<i64>().ok()))
            };
            if create {
                // A new file gets the whole schema at once; a version 1
                // file is upgraded below, with its attempts filled.
                conn.execute_batch(&format!("BEGIN IMMEDIATE; {SCHEMA}"))?;
                conn.execute(
                    "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?1)",
                    params![SCHEMA_VERSION.to_string()],
                )?;
                if version()? == Some(SCHEMA_VERSION) {
                    conn.execute_batch(ATTEMPTS)?;
                }
                conn.execute_batch("COMMIT")?;
            }
            if version()? == Some(1) {
                upgrade_from_1(&conn)?;
            }
            version()
        };
        // Two sweeps opening a new history at once: switching it to WAL (and
        // creating its schema) takes the file's exclusive lock, and SQLite
        // answers "locked" at once, without its busy handler, where waiting
        // could deadlock. Retried, from a clean state, for as long as a
        // busy recording is waited for.
        let deadline = std::time::Instant::now() + BUSY;
        let outcome = loop {
            match setup() {
                Err(e) if is_busy(&e) && std::time::Instant::now() < deadline => {
                    if !conn.is_autocommit() {
                        let _ = conn.execute_batch("ROLLBACK");
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                outcome => break outcome,
            }
        };
        match outcome {
            Ok(Some(v)) if v == SCHEMA_VERSION => Ok(History {
                conn,
                path: path.to_path_buf(),
            }),
            Ok(Some(v)) => bail!(
                "{} has schema version {v}, and this sweep reads version {SCHEMA_VERSION}: use the sweep that wrote it",
                path.display()
            ),
            Ok(None) => Err(broken(&"it has no schema version")),
            Err(e) => Err(broken(&e)),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records entries in one transaction; returns how many were new (an
    /// entry already recorded, by study, run and attempt, is left as it was).
    pub fn record(&mut self, entries: &[Entry]) -> Result<usize> {
        let path = self.path.clone();
        let fail = |e: rusqlite::Error| anyhow::anyhow!("recording into {}: {e}", path.display());
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(fail)?;
        let mut added = 0;
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
                    "INSERT OR IGNORE INTO measurements (study, run_id, attempt, run,
                     configuration_id, configuration, system, ran_at, recorded_at, git_commit,
                     sweep_version, points, tokens_per_second_mean, tokens_per_second_std,
                     mfu_pct_mean, tflops_mean, step_time_s_mean, peak_memory_mb_mean, fingerprint_id)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19)",
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
                added += insert
                    .execute(params![
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
            }
        }
        tx.commit().map_err(fail)?;
        Ok(added)
    }

    /// Each configuration's attempts (per study and system), oldest first,
    /// with their runs pooled: what `sweep history` shows. One row read per
    /// attempt (the `attempts` table the trigger keeps).
    pub fn attempts(&self, filter: &Filter) -> Result<Vec<Attempt>> {
        let fail = |e: rusqlite::Error| anyhow::anyhow!("reading {}: {e}", self.path.display());
        // Only the filters given, so that SQLite can use an index.
        let mut conditions: Vec<&str> = Vec::new();
        let mut values: Vec<&str> = Vec::new();
        for (sql, value) in [
            ("study = ?", &filter.study),
            ("configuration = ?", &filter.configuration),
            ("configuration_id = ?", &filter.configuration_id),
            ("system = ?", &filter.system),
            ("ran_at >= ?", &filter.since),
        ] {
            if let Some(v) = value {
                conditions.push(sql);
                values.push(v);
            }
        }
        let filter_sql = match conditions.is_empty() {
            true => String::new(),
            false => format!("WHERE {}", conditions.join(" AND ")),
        };
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT configuration_id, system, study, attempt, configuration, ran_at, git_commit,
                        runs, tps_sum, tps_sum_sq, one_std, one_points, mfu_sum, mfu_n,
                        tflops_sum, tflops_n
                 FROM attempts {filter_sql}"
            ))
            .map_err(fail)?;
        let rows = stmt
            .query_map(rusqlite::params_from_iter(values), |r| {
                let runs: i64 = r.get(7)?;
                let (sum, sum_sq): (f64, f64) = (r.get(8)?, r.get(9)?);
                let mean = sum / runs.max(1) as f64;
                let avg = |s: f64, n: i64| (n > 0).then(|| s / n as f64);
                Ok(Attempt {
                    configuration_id: r.get(0)?,
                    system: r.get(1)?,
                    study: r.get(2)?,
                    attempt: r.get(3)?,
                    configuration: r.get(4)?,
                    ran_at: r.get(5)?,
                    git_commit: r.get(6)?,
                    runs: runs.max(0) as usize,
                    tokens_per_second: mean,
                    ci95: interval(runs, mean, sum_sq, r.get(10)?, r.get(11)?)
                        .map(|c| (c.low, c.high)),
                    mfu_pct: avg(r.get(12)?, r.get(13)?),
                    tflops: avg(r.get(14)?, r.get(15)?),
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
            )
                .cmp(&(
                    &b.configuration_id,
                    &b.system,
                    &b.ran_at,
                    &b.study,
                    b.attempt,
                ))
        });
        Ok(out)
    }

    /// The runs of a configuration's last `last` attempts on `system`
    /// (newest first), other than the one `now` names (its study and
    /// attempt): the reference `sweep check --history` pools.
    pub fn reference(
        &self,
        configuration_id: &str,
        system: &str,
        now: (&str, u32),
        last: usize,
    ) -> Result<Vec<Entry>> {
        let fail = |e: rusqlite::Error| anyhow::anyhow!("reading {}: {e}", self.path.display());
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT m.study, m.run_id, m.attempt, m.run, m.configuration_id, m.configuration,
                        m.system, m.ran_at, m.recorded_at, m.git_commit, m.sweep_version, m.points,
                        m.tokens_per_second_mean, m.tokens_per_second_std, m.mfu_pct_mean,
                        m.tflops_mean, m.step_time_s_mean, m.peak_memory_mb_mean, f.json
                 FROM measurements m
                 JOIN (SELECT study, attempt, MAX(ran_at) AS at FROM measurements
                       WHERE configuration_id = ?1 AND system = ?2
                         AND NOT (study = ?3 AND attempt = ?4)
                       GROUP BY study, attempt ORDER BY at DESC LIMIT ?5) a
                   ON m.study = a.study AND m.attempt = a.attempt
                 LEFT JOIN fingerprints f ON f.id = m.fingerprint_id
                 WHERE m.configuration_id = ?1 AND m.system = ?2
                 ORDER BY a.at DESC, m.run",
            )
            .map_err(fail)?;
        let rows = stmt
            .query_map(
                params![configuration_id, system, now.0, now.1, last as i64],
                |r| {
                    let fingerprint: Option<String> = r.get(18)?;
                    Ok(Entry {
                        study: r.get(0)?,
                        run_id: r.get(1)?,
                        attempt: r.get(2)?,
                        run: r.get(3)?,
                        configuration_id: r.get(4)?,
                        configuration: r.get(5)?,
                        system: r.get(6)?,
                        ran_at: r.get(7)?,
                        recorded_at: r.get(8)?,
                        git_commit: r.get(9)?,
                        sweep_version: r.get(10)?,
                        points: r.get::<_, i64>(11)?.max(0) as usize,
                        tokens_per_second_mean: r.get(12)?,
                        tokens_per_second_std: r.get(13)?,
                        mfu_pct_mean: r.get(14)?,
                        tflops_mean: r.get(15)?,
                        step_time_s_mean: r.get(16)?,
                        peak_memory_mb_mean: r.get(17)?,
                        // A fingerprint that no longer parses is only a
                        // comparison less.
                        fingerprint: fingerprint.and_then(|f| serde_json::from_str(&f).ok()),
                    })
                },
            )
            .map_err(fail)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(fail)
    }
}

/// The interval of an attempt's tokens/s: over its runs' means when it has
/// two or more, else over its one run's steady-state points (as the
/// report's table has it).
fn interval(n: i64, mean: f64, sum_sq: f64, one_std: Option<f64>, points: i64) -> Option<MeanCi> {
    if n >= 2 {
        let nf = n as f64;
        let var = ((sum_sq - nf * mean * mean) / (nf - 1.0)).max(0.0);
        mean_ci95_of(mean, var, n as usize)
    } else {
        mean_ci95_of(mean, one_std? * one_std?, points.max(0) as usize)
    }
}

/// Version 1 -> 2: the `attempts` table, filled from the runs, in one
/// transaction (a history another sweep upgrades at the same time waits,
/// then finds it done).
fn upgrade_from_1(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let done = (|| {
        let version: String = conn.query_row(
            "SELECT value FROM meta WHERE key = 'schema_version'",
            [],
            |r| r.get(0),
        )?;
        if version == "1" {
            conn.execute_batch(&format!("{ATTEMPTS} {FILL_ATTEMPTS}"))?;
            conn.execute(
                "UPDATE meta SET value = ?1 WHERE key = 'schema_version'",
                params![SCHEMA_VERSION.to_string()],
            )?;
        }
        conn.execute_batch("COMMIT")
    })();
    if done.is_err() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    done
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

/// One attempt of one configuration, its runs pooled.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Attempt {
    pub configuration_id: String,
    pub configuration: String,
    pub system: String,
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
    use crate::util::text::printable;
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
            printable(&a.configuration).into_owned(),
            printable(&a.system).into_owned(),
            printable(&a.study).into_owned(),
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

/// Records a summary's completed runs in the history beside its study;
/// returns the file, how many runs were new, and the history still open
/// (none where there is no file: nothing was measured yet).
pub fn record(
    study_dir: &Path,
    study: &str,
    s: &Summary,
) -> Result<(PathBuf, usize, Option<History>)> {
    let path = path_for(study_dir);
    let entries = entries(study, s);
    if entries.is_empty() && path.symlink_metadata().is_err() {
        // Nothing measured yet: no file for nothing.
        return Ok((path, 0, None));
    }
    let mut h = History::open(&path)?;
    let added = h.record(&entries)?;
    Ok((path, added, Some(h)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(study: &str, attempt: u32, run: &str, tps: f64) -> Entry {
        Entry {
            study: study.into(),
            run_id: format!("id-{run}"),
            attempt,
            run: run.into(),
            configuration_id: "c1".into(),
            configuration: "base".into(),
            system: "local/x".into(),
            ran_at: format!("2026-11-{:02}T00:00:00Z", attempt),
            recorded_at: "2026-11-30T00:00:00Z".into(),
            git_commit: Some("abc".into()),
            sweep_version: Some("0.1.0".into()),
            points: 10,
            tokens_per_second_mean: tps,
            tokens_per_second_std: Some(5.0),
            mfu_pct_mean: None,
            tflops_mean: None,
            step_time_s_mean: Some(0.5),
            peak_memory_mb_mean: None,
            fingerprint: None,
        }
    }

    #[test]
    fn recording_twice_adds_nothing_and_references_skip_the_attempt_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        let mut h = History::open(&path).unwrap();
        let first = [entry("s", 1, "r0", 100.0), entry("s", 1, "r1", 110.0)];
        assert_eq!(h.record(&first).unwrap(), 2);
        assert_eq!(h.record(&first).unwrap(), 0);
        h.record(&[entry("s", 2, "r0", 90.0)]).unwrap();
        h.record(&[entry("s", 3, "r0", 95.0)]).unwrap();
        let all = h.attempts(&Filter::default()).unwrap();
        assert_eq!(all.iter().map(|a| a.attempt).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!((all[0].runs, all[0].tokens_per_second), (2, 105.0));
        // Two runs, 100 and 110: 105 ± t(1)·5.
        let (low, high) = all[0].ci95.unwrap();
        assert!(
            (high - 105.0 - 12.706 * 5.0).abs() < 0.01 && (105.0 - low - 12.706 * 5.0).abs() < 0.01
        );
        // One run: its points' interval (std 5 over 10 points).
        let (low, high) = all[1].ci95.unwrap();
        assert!((high - low - 2.0 * 2.262 * 5.0 / 10f64.sqrt()).abs() < 0.01);
        let refs = h.reference("c1", "local/x", ("s", 3), 2).unwrap();
        assert_eq!(
            refs.iter().map(|e| e.attempt).collect::<Vec<_>>(),
            [2, 1, 1],
            "the two attempts before the third, newest first"
        );
        assert!(h.reference("c1", "other", ("s", 3), 5).unwrap().is_empty());
    }

    /// Connections (here threads; in use, sweeps) opening a new history at
    /// once all get it, each recording its own runs: none is told "locked".
    #[test]
    fn histories_opened_at_once_all_record() {
        for _ in 0..20 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join(FILE);
            let threads: Vec<_> = (0..6)
                .map(|i| {
                    let path = path.clone();
                    std::thread::spawn(move || {
                        let mut h = History::open(&path)?;
                        h.record(&[entry(&format!("s{i}"), 1, "r0", 100.0)])
                    })
                })
                .collect();
            for t in threads {
                assert_eq!(t.join().unwrap().unwrap(), 1);
            }
            let h = History::open_existing(&path).unwrap().unwrap();
            assert_eq!(h.attempts(&Filter::default()).unwrap().len(), 6);
        }
    }

    #[test]
    fn a_file_that_is_not_a_history_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        std::fs::write(&path, vec![0x42u8; 10_000]).unwrap();
        let e = History::open(&path).err().unwrap().to_string();
        assert!(
            e.contains(&path.display().to_string()) && e.contains("move it away"),
            "{e}"
        );
        // Never written over.
        assert_eq!(std::fs::read(&path).unwrap(), vec![0x42u8; 10_000]);
    }

    #[test]
    fn a_version_1_history_is_upgraded_with_its_attempts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        {
            // A history as version 1 wrote it: runs only.
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(SCHEMA).unwrap();
            conn.execute_batch("INSERT INTO meta VALUES ('schema_version', '1')")
                .unwrap();
            for (i, (attempt, tps)) in [(1, 100.0), (1, 110.0), (2, 90.0)].iter().enumerate() {
                conn.execute(
                    "INSERT INTO measurements (study, run_id, attempt, run, configuration_id,
                     configuration, system, ran_at, recorded_at, points, tokens_per_second_mean,
                     tokens_per_second_std, mfu_pct_mean)
                     VALUES ('s', ?1, ?2, 'r', 'c1', 'base', 'local/x', ?3, 'now', 10, ?4, 5.0, 20.0)",
                    params![format!("id{i}"), attempt, format!("2026-11-0{attempt}"), tps],
                )
                .unwrap();
            }
        }
        let mut h = History::open_existing(&path).unwrap().unwrap();
        let version: String = h
            .conn
            .query_row(
                "SELECT value FROM meta WHERE key = 'schema_version'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(version, "2");
        let seen = |h: &History| -> Vec<(u32, usize, f64, Option<f64>)> {
            h.attempts(&Filter::default())
                .unwrap()
                .iter()
                .map(|a| (a.attempt, a.runs, a.tokens_per_second, a.mfu_pct))
                .collect()
        };
        assert_eq!(
            seen(&h),
            [(1, 2, 105.0, Some(20.0)), (2, 1, 90.0, Some(20.0))]
        );
        // Runs recorded afterwards join their attempts.
        h.record(&[entry("s", 2, "r9", 100.0)]).unwrap();
        assert_eq!(seen(&h)[1], (2, 2, 95.0, Some(20.0)));
        drop(h);
        // Opened again (and for recording): nothing counted twice.
        let h = History::open(&path).unwrap();
        assert_eq!(seen(&h).len(), 2);
        assert_eq!(seen(&h)[0], (1, 2, 105.0, Some(20.0)));
    }
}
