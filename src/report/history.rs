//! The performance history: `results/history.sqlite`, one SQLite file per
//! project (rusqlite's bundled SQLite, write-ahead log, no server). Every
//! report of a study records its completed runs' measurements in one
//! transaction, each once: a measurement is keyed by the run's attempt id
//! (`run.json`'s `attempt_id`, drawn when the run's directory is made), so a
//! study reported again, moved, copied or renamed adds nothing, and a study
//! run afresh (after `rm -rf` or `mv`) is recorded anew. A report killed while
//! recording leaves the history as it was, and reports recording at once
//! wait for each other (SQLite's lock) instead of losing a row. `sweep
//! history` reads it back per configuration and attempt; `sweep check
//! --history` takes its references from it.
//!
//! Sweep records only into a file it created: its application id (SQLite's
//! `PRAGMA application_id`) and its schema, exactly. Anything else — another
//! program's database, an earlier sweep's schema — is refused before SQLite
//! touches it, and left byte for byte as it was. Reading never writes: a
//! read-only file or folder is read as it is. The schema is a contract
//! (docs/report.md, "The history").

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
pub const FILE: &str = crate::layout::HISTORY_SQLITE;
/// The schema's version (`meta.schema_version`): a file of any other
/// version is refused, never converted.
pub const SCHEMA_VERSION: i64 = 3;
pub const APPLICATION_ID: i32 = crate::layout::HISTORY_APPLICATION_ID;
/// The system of runs whose jobs wrote no fingerprint.
pub const UNKNOWN_SYSTEM: &str = "unknown";
/// How long a writer waits for another one (a report of thousands of runs
/// records in well under a second).
const BUSY: Duration = Duration::from_secs(60);

// Rows are stored in the order the history is read in (a configuration's
// attempts together, WITHOUT ROWID): `sweep history` aggregates them in
// one pass without sorting, and a configuration's reference is one range.
// A measurement is unique by its attempt id. A fingerprint is stored once
// however many runs share it. `attempts` holds each attempt's runs summed
// (a million runs are ~200,000 attempts), kept by a trigger: whatever
// inserts a measurement adds it to its attempt, in the same transaction.
const SCHEMA: &str = "
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE fingerprints (
    id   INTEGER PRIMARY KEY,
    json TEXT NOT NULL UNIQUE
);
CREATE TABLE measurements (
    attempt_id             TEXT    NOT NULL,
    study_attempt_id       TEXT    NOT NULL,
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
    PRIMARY KEY (configuration_id, system, study_attempt_id, attempt_id)
) WITHOUT ROWID;
CREATE UNIQUE INDEX measurements_by_attempt ON measurements (attempt_id);
CREATE TABLE attempts (
    configuration_id TEXT    NOT NULL,
    system           TEXT    NOT NULL,
    study_attempt_id TEXT    NOT NULL,
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
    PRIMARY KEY (configuration_id, system, study_attempt_id)
) WITHOUT ROWID;
CREATE INDEX attempts_by_study ON attempts (study);
CREATE TRIGGER measurement_in_attempt AFTER INSERT ON measurements
BEGIN
    INSERT INTO attempts VALUES (
        NEW.configuration_id, NEW.system, NEW.study_attempt_id, NEW.study, NEW.attempt,
        NEW.configuration, NEW.ran_at, NEW.git_commit, 1, NEW.tokens_per_second_mean,
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

/// One run's measurements, as a row of `measurements`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Entry {
    /// The run's measurement ([`crate::plan::record::RunRecord::attempt_ids`]):
    /// what a measurement is recorded once by.
    pub attempt_id: String,
    /// The study attempt it was measured in: the runs pooled as one attempt.
    pub study_attempt_id: String,
    pub study: String,
    /// The run's identity hash (its repeat included).
    pub run_id: String,
    /// The study's attempt count when it ran (a label: `--again` counts
    /// on, a study run afresh counts from 1 again).
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
                system: fingerprint
                    .as_ref()
                    .map_or_else(|| UNKNOWN_SYSTEM.to_string(), |f| f.system.clone()),
                ran_at: fingerprint
                    .as_ref()
                    .map(|f| f.taken_at.clone())
                    .filter(|t| !t.is_empty())
                    .unwrap_or_else(|| built.created_at.clone()),
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

/// A run's fingerprint, where its job wrote a readable one.
pub fn fingerprint_of(r: &RunLog) -> Option<Fingerprint> {
    Fingerprint::load(r.dir.as_deref()?).ok().flatten()
}

/// The measurements a check is about (a study's latest attempt): left out
/// of their own reference, however the history recorded them.
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

/// SQLite's "busy" or "locked": another connection holds the lock.
fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// SQLite could not write (or create the files it writes beside) the file.
fn is_read_only(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(
            rusqlite::ErrorCode::ReadOnly
                | rusqlite::ErrorCode::CannotOpen
                | rusqlite::ErrorCode::PermissionDenied
        )
    )
}

/// What is at a history's path, seen from its first bytes before SQLite
/// opens it (opening another program's database could already change it).
enum Found {
    Nothing,
    /// An empty file: a history another sweep is creating, or a file nobody
    /// wrote yet.
    Empty,
    /// A SQLite database carrying sweep's application id.
    Ours,
    /// A SQLite database without an application id, not in write-ahead
    /// mode: an empty one (a history being created: sweep sets its id in
    /// the transaction that creates its tables, and switches to write-ahead
    /// mode after), or another program's — told apart under SQLite's lock.
    Unmarked,
}

/// Reads the header of what is at `path`: nothing, an empty file, a sweep
/// history, or a database to look into; anything else is an error that
/// says what it is. A header another sweep is writing this moment reads
/// short or zero: it is read again, for up to a fifth of a second.
fn sniff(path: &Path) -> Result<Found> {
    use crate::util::fs::ReadError;
    use std::io::{Read, Seek};
    let mut file = match crate::util::fs::open_regular(path, 0) {
        Ok((file, _)) => file,
        Err(ReadError::NotFound) => return Ok(Found::Nothing),
        Err(e) => bail!("{} {e}: it cannot hold sweep's history", path.display()),
    };
    let mut header = Vec::with_capacity(100);
    for tries in 1.. {
        header.clear();
        file.rewind()
            .and_then(|_| (&mut file).take(100).read_to_end(&mut header))
            .with_context(|| format!("reading {}", path.display()))?;
        let settled = header.is_empty() || (header.len() == 100 && header.iter().any(|&b| b != 0));
        if settled || tries == 20 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if header.is_empty() {
        return Ok(Found::Empty);
    }
    if !header.starts_with(b"SQLite format 3\0") || header.len() < 100 {
        let start = String::from_utf8_lossy(&header[..header.len().min(24)]).into_owned();
        bail!(
            "{} is not a SQLite database (it begins with {:?}), so not sweep's history: sweep \
             leaves it as it is; move it elsewhere for sweep to start its history there",
            path.display(),
            crate::util::text::printable(&start)
        );
    }
    let id = i32::from_be_bytes(header[68..72].try_into().expect("four bytes"));
    let wal = header[18] == 2;
    match id {
        APPLICATION_ID => Ok(Found::Ours),
        0 if !wal => Ok(Found::Unmarked),
        _ => bail!("{}", foreign(path, id)),
    }
}

/// What a SQLite database without sweep's application id is, read without
/// a lock or a write (`immutable`): an earlier sweep's history, or another
/// program's database.
fn foreign(path: &Path, id: i32) -> String {
    let seen = (|| -> rusqlite::Result<(Vec<String>, Option<String>)> {
        let conn = Connection::open_with_flags(
            immutable_uri(path),
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI,
        )?;
        let mut stmt = conn.prepare(
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name LIMIT 20",
        )?;
        let tables = stmt
            .query_map([], |r| r.get::<_, String>(0))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        let version = match tables.iter().any(|t| t == "meta") {
            true => conn
                .query_row(
                    "SELECT value FROM meta WHERE key = 'schema_version'",
                    [],
                    |r| r.get::<_, String>(0),
                )
                .optional()
                .unwrap_or(None),
            false => None,
        };
        Ok((tables, version))
    })();
    let p = path.display();
    match seen {
        Ok((tables, Some(v))) if tables.iter().any(|t| t == "measurements") && id == 0 => format!(
            "{p} is a history of an earlier sweep (schema version {}), and this sweep reads \
             version {SCHEMA_VERSION} only: it keys each measurement by its run's attempt id, \
             which the earlier schema has not, and converts nothing. The file is left as it is: \
             keep it under another name (`mv {p} {}`) and this sweep starts a new history; \
             `sweep history --import results/<study>` records a study kept on disk again",
            crate::util::text::printable(&v),
            p.to_string().replace(FILE, "history-earlier.sqlite"),
        ),
        Ok((tables, _)) => format!(
            "{p} is a SQLite database that sweep did not create (application id {id:#010x}, \
             not sweep's {APPLICATION_ID:#010x}; tables: {}): sweep records only into a history \
             it created, and leaves this file as it is; move it elsewhere for sweep to start \
             its history there",
            match tables.is_empty() {
                true => "none".to_string(),
                false => crate::util::text::printable(&tables.join(", ")).into_owned(),
            }
        ),
        Err(e) => format!(
            "{p} is a SQLite database that sweep did not create (application id {id:#010x}), \
             and it cannot be read ({e}): sweep leaves it as it is; move it elsewhere for sweep \
             to start its history there"
        ),
    }
}

/// `file:` URI of a path, opened `immutable`: no lock, no side file, no
/// write — for a history on a read-only file system or folder, and for
/// looking at a file that is not sweep's.
fn immutable_uri(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut uri = String::from("file:");
    for &b in abs.as_os_str().as_bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'/' | b'-' | b'.' | b'_' | b'~' => {
                uri.push(b as char)
            }
            _ => uri.push_str(&format!("%{b:02X}")),
        }
    }
    uri.push_str("?immutable=1");
    uri
}

/// The schema sweep creates, as SQLite lists it (`sqlite_master`): what a
/// history must hold exactly.
fn expected_schema() -> &'static [SchemaRow] {
    static EXPECTED: std::sync::OnceLock<Vec<SchemaRow>> = std::sync::OnceLock::new();
    EXPECTED.get_or_init(|| {
        let conn = Connection::open_in_memory().expect("an in-memory database opens");
        conn.execute_batch(SCHEMA)
            .expect("sweep's schema is valid SQL");
        schema_of(&conn).expect("an in-memory schema reads")
    })
}

type SchemaRow = (String, String, String, Option<String>);

fn schema_of(conn: &Connection) -> rusqlite::Result<Vec<SchemaRow>> {
    let mut stmt =
        conn.prepare("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name")?;
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?;
    rows.collect()
}

/// What an open database turned out to be.
#[derive(Debug, PartialEq)]
enum Verdict {
    /// A sweep history of this version.
    Ours,
    /// No table, no application id: nothing anybody wrote yet.
    Empty,
    /// Another application id (0: none).
    Foreign(i32),
    /// Sweep's application id over another schema or version: what differs.
    Wrong(String),
}

/// Whether an open database is a sweep history of this version: its
/// application id, its schema exactly, its version; else what it is.
fn verify(conn: &Connection) -> rusqlite::Result<Verdict> {
    let id: i32 = conn.query_row("PRAGMA application_id", [], |r| r.get(0))?;
    if id != APPLICATION_ID {
        let objects: i64 =
            conn.query_row("SELECT COUNT(*) FROM sqlite_master", [], |r| r.get(0))?;
        let user_version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        return Ok(match id == 0 && objects == 0 && user_version == 0 {
            true => Verdict::Empty,
            false => Verdict::Foreign(id),
        });
    }
    let have = schema_of(conn)?;
    let want = expected_schema();
    if have != want {
        let names = |rows: &[SchemaRow]| rows.iter().map(|r| r.1.clone()).collect::<Vec<_>>();
        let (have_names, want_names) = (names(&have), names(want));
        let missing: Vec<&String> = want_names
            .iter()
            .filter(|n| !have_names.contains(n))
            .collect();
        let extra: Vec<&String> = have_names
            .iter()
            .filter(|n| !want_names.contains(n))
            .collect();
        let changed: Vec<&String> = want
            .iter()
            .filter(|w| have.iter().any(|h| h.1 == w.1 && h != *w))
            .map(|w| &w.1)
            .collect();
        let list = |v: &[&String]| {
            crate::util::text::cell(&v.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "))
                .into_owned()
        };
        let mut what = Vec::new();
        for (label, v) in [
            ("missing", missing),
            ("not sweep's", extra),
            ("changed", changed),
        ] {
            if !v.is_empty() {
                what.push(format!("{label}: {}", list(&v)));
            }
        }
        return Ok(Verdict::Wrong(format!(
            "its schema is not sweep's version {SCHEMA_VERSION} ({})",
            what.join("; ")
        )));
    }
    let version: Option<String> = conn
        .query_row(
            "SELECT value FROM meta WHERE key = 'schema_version'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    Ok(match version.as_deref() {
        Some(v) if v == SCHEMA_VERSION.to_string() => Verdict::Ours,
        Some(v) => Verdict::Wrong(format!(
            "it says schema version {}, and this sweep reads version {SCHEMA_VERSION}: use the sweep that wrote it",
            crate::util::text::cell(v)
        )),
        None => Verdict::Wrong("it has no schema version".to_string()),
    })
}

/// The error for a database that is not sweep's history of this version.
fn refused(path: &Path, verdict: Verdict) -> anyhow::Error {
    match verdict {
        Verdict::Foreign(id) => anyhow::anyhow!("{}", foreign(path, id)),
        Verdict::Wrong(what) => anyhow::anyhow!(
            "{} is not sweep's history ({what}): sweep leaves it as it is; move it elsewhere \
             for sweep to start its history there",
            path.display()
        ),
        Verdict::Ours | Verdict::Empty => unreachable!("only refusals are errors"),
    }
}

/// Why recording into `path` failed where it is read-only: which of the
/// file and its folder this user cannot write, and that nothing is lost.
fn read_only(path: &Path, why: &dyn std::fmt::Display) -> anyhow::Error {
    let writable = |p: &Path| {
        use std::os::unix::ffi::OsStrExt;
        let Ok(c) = std::ffi::CString::new(p.as_os_str().as_bytes()) else {
            return false;
        };
        // SAFETY: a valid NUL-terminated path.
        unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
    };
    let dir = crate::util::fs::parent_dir(path);
    let file_ok = !path.exists() || writable(path);
    let dir_ok = writable(dir);
    let what = match (file_ok, dir_ok) {
        (false, false) => "the file and its folder are",
        (false, true) => "the file is",
        (true, false) => "its folder is",
        (true, true) => "it is",
    };
    anyhow::anyhow!(
        "cannot record into {}: {what} read-only for this user ({why}). The history is intact \
         and is read as it is (`sweep history`, `sweep check`); recording needs write access to \
         the file and to its folder {} (SQLite writes {FILE}-wal and {FILE}-shm beside it)",
        path.display(),
        dir.display()
    )
}

impl History {
    /// Opens the history for recording, creating it where there is none
    /// (or an empty file). A file that is not a sweep history of this
    /// version is refused, untouched.
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
        // What the file is, decided under SQLite's write lock; a new (or
        // empty) file gets the whole schema and sweep's application id in
        // one transaction. Nothing else is written until it is known to be
        // sweep's history: not even the switch to write-ahead mode.
        let setup = || -> rusqlite::Result<Verdict> {
            conn.execute_batch("BEGIN IMMEDIATE")?;
            let mut verdict = verify(&conn)?;
            if verdict == Verdict::Empty {
                conn.execute_batch(SCHEMA)?;
                conn.pragma_update(None, "application_id", APPLICATION_ID)?;
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', ?1)",
                    params![SCHEMA_VERSION.to_string()],
                )?;
                verdict = verify(&conn)?;
            }
            if verdict != Verdict::Ours {
                conn.execute_batch("ROLLBACK")?;
                return Ok(verdict);
            }
            conn.execute_batch("COMMIT")?;
            conn.pragma_update(None, "journal_mode", "WAL")?;
            conn.pragma_update(None, "synchronous", "NORMAL")?;
            // Reads straight from the mapped file (a history of a million
            // runs is ~300 MB): `sweep history` of everything scans it.
            conn.pragma_update(None, "mmap_size", 1i64 << 30)?;
            Ok(verdict)
        };
        // Two sweeps opening a new history at once: switching it to WAL
        // takes the file's exclusive lock, and SQLite answers "locked" at
        // once, without its busy handler, where waiting could deadlock.
        // Retried, from a clean state, for as long as a busy recording is
        // waited for.
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
        if !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        match outcome {
            Ok(Verdict::Ours) => Ok(History {
                conn,
                path: path.to_path_buf(),
            }),
            Ok(verdict) => Err(refused(path, verdict)),
            Err(e) if is_read_only(&e) => Err(read_only(path, &e)),
            Err(e) => Err(not_readable(path, &e)),
        }
    }

    /// The history for reading; `None` where there is none yet. Nothing is
    /// written: a read-only file, folder or file system is read as it is.
    pub fn open_existing(path: &Path) -> Result<Option<History>> {
        match sniff(path)? {
            Found::Nothing => return Ok(None),
            // A history another sweep is creating has its first pages in
            // its write-ahead log; a bare empty file holds nothing.
            Found::Empty if !wal_of(path).exists() => return Ok(None),
            Found::Empty | Found::Ours | Found::Unmarked => {}
        }
        let open = |target: &str, flags: OpenFlags| -> rusqlite::Result<(Connection, Verdict)> {
            let conn = Connection::open_with_flags(target, flags)?;
            conn.busy_timeout(BUSY)?;
            let verdict = verify(&conn)?;
            if verdict == Verdict::Ours {
                conn.pragma_update(None, "mmap_size", 1i64 << 30)?;
            }
            Ok((conn, verdict))
        };
        let read = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let plain = open(&path.to_string_lossy(), read);
        // Where SQLite cannot make its shared-memory file (a read-only
        // folder), the file is read as immutable: no lock, no side file.
        let opened = match plain {
            Err(e) if is_read_only(&e) => {
                open(&immutable_uri(path), read | OpenFlags::SQLITE_OPEN_URI).map_err(|_| e)
            }
            other => other,
        };
        match opened {
            Ok((conn, Verdict::Ours)) => Ok(Some(History {
                conn,
                path: path.to_path_buf(),
            })),
            Ok((_, Verdict::Empty)) => Ok(None),
            Ok((_, verdict)) => Err(refused(path, verdict)),
            Err(e) => Err(not_readable(path, &e)),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records entries in one transaction; returns how many were new (a
    /// measurement already recorded, by its attempt id, is left as it was).
    pub fn record(&mut self, entries: &[Entry]) -> Result<usize> {
        let path = self.path.clone();
        let fail = |e: rusqlite::Error| match is_read_only(&e) {
            true => read_only(&path, &e),
            false => anyhow::anyhow!("recording into {}: {e}", path.display()),
        };
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
                added += insert
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
            }
        }
        tx.commit().map_err(fail)?;
        Ok(added)
    }

    /// Each configuration's attempts (per system), oldest first, with
    /// their runs pooled: what `sweep history` shows. One row read per
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

    /// The runs of a configuration's last `last` attempts on `system`
    /// (newest first), other than the measurements `now` names: the
    /// reference `sweep check --history` pools, each measurement once.
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

/// Where SQLite keeps a history's write-ahead log.
fn wal_of(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push("-wal");
    PathBuf::from(name)
}

/// A history SQLite could not open or read, and that was not refused for
/// what it is.
fn not_readable(path: &Path, e: &dyn std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("{} cannot be read as sweep's history ({e})", path.display())
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
            attempt_id: format!("{study}-{attempt}-{run}"),
            study_attempt_id: format!("{study}-{attempt}"),
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

    fn now(study_attempts: &[&str], runs: &[&str]) -> Now {
        Now {
            study_attempts: study_attempts.iter().map(|s| s.to_string()).collect(),
            runs: runs.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn a_measurement_is_recorded_once_and_never_its_own_reference() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        let mut h = History::open(&path).unwrap();
        let first = [entry("s", 1, "r0", 100.0), entry("s", 1, "r1", 110.0)];
        assert_eq!(h.record(&first).unwrap(), 2);
        assert_eq!(h.record(&first).unwrap(), 0);
        // The same measurements under another study's name (a copied or
        // renamed study reported): nothing new.
        let copied: Vec<Entry> = first
            .iter()
            .map(|e| Entry {
                study: "s-copy".into(),
                ..e.clone()
            })
            .collect();
        assert_eq!(h.record(&copied).unwrap(), 0);
        // The same study name, attempt count and run ids measured afresh
        // (the study moved away and run again): new measurements.
        let afresh = Entry {
            attempt_id: "new-r0".into(),
            study_attempt_id: "s-1-again".into(),
            ran_at: "2026-11-02T12:00:00Z".into(),
            ..entry("s", 1, "r0", 90.0)
        };
        assert_eq!(h.record(std::slice::from_ref(&afresh)).unwrap(), 1);
        h.record(&[entry("s", 3, "r0", 95.0)]).unwrap();
        let all = h.attempts(&Filter::default()).unwrap();
        assert_eq!(
            all.iter()
                .map(|a| (a.attempt, a.study_attempt_id.as_str()))
                .collect::<Vec<_>>(),
            [(1, "s-1"), (1, "s-1-again"), (3, "s-3")]
        );
        assert_eq!((all[0].runs, all[0].tokens_per_second), (2, 105.0));
        // Two runs, 100 and 110: 105 ± t(1)·5.
        let (low, high) = all[0].ci95.unwrap();
        assert!(
            (high - 105.0 - 12.706 * 5.0).abs() < 0.01 && (105.0 - low - 12.706 * 5.0).abs() < 0.01
        );
        // One run: its points' interval (std 5 over 10 points).
        let (low, high) = all[1].ci95.unwrap();
        assert!((high - low - 2.0 * 2.262 * 5.0 / 10f64.sqrt()).abs() < 0.01);
        let refs = h
            .reference("c1", "local/x", &now(&["s-3"], &["s-3-r0"]), 2)
            .unwrap();
        assert_eq!(
            refs.iter()
                .map(|e| e.attempt_id.as_str())
                .collect::<Vec<_>>(),
            ["new-r0", "s-1-r0", "s-1-r1"],
            "the two attempts before the third, newest first"
        );
        // A copy being checked: its runs are the first attempt's, so that
        // attempt is no reference of its own.
        let refs = h
            .reference("c1", "local/x", &now(&["copy"], &["s-1-r0", "s-1-r1"]), 5)
            .unwrap();
        assert_eq!(
            refs.iter()
                .map(|e| e.attempt_id.as_str())
                .collect::<Vec<_>>(),
            ["s-3-r0", "new-r0"]
        );
        assert!(h
            .reference("c1", "other", &now(&[], &[]), 5)
            .unwrap()
            .is_empty());
    }

    /// A name of megabytes is listed cut: the table's size is bounded by
    /// its rows, not by its widest cell.
    #[test]
    fn a_huge_name_is_listed_cut() {
        let attempt = |system: String| Attempt {
            configuration_id: "c".into(),
            configuration: "base".into(),
            system,
            study_attempt_id: "a".into(),
            study: "s".into(),
            attempt: 1,
            ran_at: "2026-11-01T00:00:00Z".into(),
            git_commit: None,
            runs: 1,
            tokens_per_second: 1.0,
            ci95: None,
            mfu_pct: None,
            tflops: None,
        };
        let rows: Vec<Attempt> = (0..100).map(|_| attempt("short".into())).collect();
        let short = text(&rows).len();
        let mut rows = rows;
        rows.push(attempt("x".repeat(8 << 20)));
        let long = text(&rows).len();
        assert!(long < short * 3, "{short} -> {long} bytes");
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

    /// The files beside a database, which SQLite would create on opening it.
    fn side_files(path: &Path) -> Vec<PathBuf> {
        ["-wal", "-shm", "-journal"]
            .iter()
            .map(|s| PathBuf::from(format!("{}{s}", path.display())))
            .filter(|p| p.exists())
            .collect()
    }

    /// What is not sweep's history — not SQLite, another program's
    /// database, an earlier sweep's schema, sweep's id over another schema
    /// — is named for what it is, for recording and for reading, and left
    /// byte for byte as it was, with no file made beside it.
    #[test]
    fn what_is_not_sweeps_history_is_named_and_left_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        type Make = Box<dyn Fn(&Path)>;
        let cases: Vec<(&str, Make, &str)> = vec![
            (
                "notes",
                Box::new(|p: &Path| std::fs::write(p, vec![0x42u8; 10_000]).unwrap()),
                "is not a SQLite database",
            ),
            (
                "another program's",
                Box::new(|p: &Path| {
                    let c = Connection::open(p).unwrap();
                    c.execute_batch(
                        "PRAGMA journal_mode = DELETE; CREATE TABLE todo (item TEXT);
                         INSERT INTO todo VALUES ('buy milk');",
                    )
                    .unwrap();
                }),
                "that sweep did not create (application id 0x00000000, not sweep's 0x73776570; tables: todo)",
            ),
            (
                "an earlier sweep's",
                Box::new(|p: &Path| {
                    let c = Connection::open(p).unwrap();
                    c.execute_batch(
                        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
                         INSERT INTO meta VALUES ('schema_version', '2');
                         CREATE TABLE measurements (study TEXT, run_id TEXT, attempt INTEGER);
                         INSERT INTO measurements VALUES ('s', 'r', 1);",
                    )
                    .unwrap();
                }),
                "is a history of an earlier sweep (schema version 2)",
            ),
            (
                "a version 1 file without its version row",
                Box::new(|p: &Path| {
                    let c = Connection::open(p).unwrap();
                    c.execute_batch(
                        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
                         CREATE TABLE measurements (study TEXT, run_id TEXT, attempt INTEGER);",
                    )
                    .unwrap();
                }),
                "that sweep did not create",
            ),
            (
                "sweep's id over another schema",
                Box::new(|p: &Path| {
                    let c = Connection::open(p).unwrap();
                    c.execute_batch(&SCHEMA.replace(
                        "CREATE INDEX attempts_by_study ON attempts (study);",
                        "",
                    ))
                    .unwrap();
                    c.pragma_update(None, "application_id", APPLICATION_ID)
                        .unwrap();
                    c.execute_batch("INSERT INTO meta VALUES ('schema_version', '3')")
                        .unwrap();
                }),
                "is not sweep's history (its schema is not sweep's version 3 (missing: attempts_by_study))",
            ),
        ];
        for (what, make, says) in cases {
            let path = dir
                .path()
                .join(format!("{}.sqlite", what.replace(' ', "-")));
            make(&path);
            let before = crate::util::hash::sha256_file(&path).unwrap();
            for e in [
                History::open(&path).err().map(|e| e.to_string()),
                History::open_existing(&path).err().map(|e| e.to_string()),
            ] {
                let e = e.unwrap_or_else(|| panic!("{what} was opened"));
                assert!(
                    e.contains(&path.display().to_string()) && e.contains(says),
                    "{what}: {e}"
                );
                assert!(!e.contains("discard") && !e.contains("delete"), "{e}");
            }
            assert_eq!(
                crate::util::hash::sha256_file(&path).unwrap(),
                before,
                "{what} changed"
            );
            assert_eq!(side_files(&path), Vec::<PathBuf>::new(), "{what}");
        }
    }

    /// A history sweep created carries its application id and exactly its
    /// schema; an empty file is adopted as a new history.
    #[test]
    fn a_new_history_carries_sweeps_id_and_an_empty_file_becomes_one() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join(FILE);
        std::fs::write(&empty, b"").unwrap();
        assert!(History::open_existing(&empty).unwrap().is_none());
        let mut h = History::open(&empty).unwrap();
        h.record(&[entry("s", 1, "r0", 100.0)]).unwrap();
        let id: i32 = h
            .conn
            .query_row("PRAGMA application_id", [], |r| r.get(0))
            .unwrap();
        assert_eq!(id, APPLICATION_ID);
        assert_eq!(verify(&h.conn).unwrap(), Verdict::Ours);
        drop(h);
        let h = History::open_existing(&empty).unwrap().unwrap();
        assert_eq!(h.attempts(&Filter::default()).unwrap().len(), 1);
        assert!(
            immutable_uri(Path::new("/a b/h%.sqlite")).ends_with("/a%20b/h%25.sqlite?immutable=1")
        );
    }
}
