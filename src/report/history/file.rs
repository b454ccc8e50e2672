//! The history's file: its schema, and whether a file is sweep's history of this version
//! (checked before anything is written: another database is refused, never changed).

use crate::layout::{HISTORY_APPLICATION_ID as APPLICATION_ID, HISTORY_SQLITE as FILE};
use anyhow::{bail, Context, Result};
use rusqlite::{Connection, OpenFlags, OptionalExtension};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The schema's version: a file of any other is refused, never converted.
pub const SCHEMA_VERSION: i64 = 4;
/// How long a writer waits for another (a thousand-run report records in under a second).
pub(super) const BUSY: Duration = Duration::from_secs(60);

// Rows are stored in reading order (WITHOUT ROWID): `sweep history` aggregates in one pass and
// a reference is one range. `attempts` holds each attempt's sums, kept by a trigger in the
// inserting transaction (a million runs are ~200,000 attempts).
pub(super) const SCHEMA: &str = "
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
CREATE TABLE failures (
    attempt_id       TEXT NOT NULL,
    job_id           TEXT NOT NULL,
    study_attempt_id TEXT NOT NULL,
    study            TEXT NOT NULL,
    run              TEXT NOT NULL,
    configuration_id TEXT NOT NULL,
    configuration    TEXT NOT NULL,
    system           TEXT NOT NULL,
    state            TEXT NOT NULL,
    reason           TEXT,
    nodes            TEXT NOT NULL,
    ran_at           TEXT NOT NULL,
    recorded_at      TEXT NOT NULL,
    PRIMARY KEY (attempt_id, job_id)
) WITHOUT ROWID;
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

/// SQLite's "busy" or "locked": another connection holds the lock.
pub(super) fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// SQLite could not write (or create the files it writes beside) the file.
pub(super) fn is_read_only(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(
            rusqlite::ErrorCode::ReadOnly
                | rusqlite::ErrorCode::CannotOpen
                | rusqlite::ErrorCode::PermissionDenied
        )
    )
}

/// What is at a history's path, from its first bytes before SQLite opens it.
pub(super) enum Found {
    Nothing,
    /// An empty file: a history being created, or a file nobody wrote yet.
    Empty,
    /// A SQLite database carrying sweep's application id.
    Ours,
    /// A SQLite database without an application id, not in WAL mode: a history being created, or
    /// another program's (told apart under SQLite's lock).
    Unmarked,
}

/// Reads the header at `path` (again for up to 0.2 s if short).
pub(super) fn sniff(path: &Path) -> Result<Found> {
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

/// What a database without sweep's id is, read without lock or write: an earlier sweep's
/// history, or another program's.
pub(super) fn foreign(path: &Path, id: i32) -> String {
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

/// A path's `file:` URI opened `immutable`: no lock, side file or write.
pub(super) fn immutable_uri(path: &Path) -> String {
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

/// The schema sweep creates, as `sqlite_master` lists it: what a history must hold exactly.
pub(super) fn expected_schema() -> &'static [SchemaRow] {
    static EXPECTED: std::sync::OnceLock<Vec<SchemaRow>> = std::sync::OnceLock::new();
    EXPECTED.get_or_init(|| {
        let conn = Connection::open_in_memory().expect("an in-memory database opens");
        conn.execute_batch(SCHEMA)
            .expect("sweep's schema is valid SQL");
        schema_of(&conn).expect("an in-memory schema reads")
    })
}

type SchemaRow = (String, String, String, Option<String>);

pub(super) fn schema_of(conn: &Connection) -> rusqlite::Result<Vec<SchemaRow>> {
    let mut stmt =
        conn.prepare("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name")?;
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?;
    rows.collect()
}

/// What an open database turned out to be.
#[derive(Debug, PartialEq)]
pub(super) enum Contents {
    /// A sweep history of this version.
    Ours,
    /// No table, no application id: nothing anybody wrote yet.
    Empty,
    /// Another application id (0: none).
    Foreign(i32),
    /// Sweep's application id over another schema or version: what differs.
    Wrong(String),
}

/// Whether an open database is this version's sweep history; else what it is.
pub(super) fn verify(conn: &Connection) -> rusqlite::Result<Contents> {
    let id: i32 = conn.query_row("PRAGMA application_id", [], |r| r.get(0))?;
    if id != APPLICATION_ID {
        let objects: i64 =
            conn.query_row("SELECT COUNT(*) FROM sqlite_master", [], |r| r.get(0))?;
        let user_version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        return Ok(match id == 0 && objects == 0 && user_version == 0 {
            true => Contents::Empty,
            false => Contents::Foreign(id),
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
        return Ok(Contents::Wrong(format!(
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
        Some(v) if v == SCHEMA_VERSION.to_string() => Contents::Ours,
        Some(v) => Contents::Wrong(format!(
            "it says schema version {}, and this sweep reads version {SCHEMA_VERSION}: use the sweep that wrote it",
            crate::util::text::cell(v)
        )),
        None => Contents::Wrong("it has no schema version".to_string()),
    })
}

/// The error for a database that is not sweep's history of this version.
pub(super) fn refused(path: &Path, contents: Contents) -> anyhow::Error {
    match contents {
        Contents::Foreign(id) => anyhow::anyhow!("{}", foreign(path, id)),
        Contents::Wrong(what) => anyhow::anyhow!(
            "{} is not sweep's history ({what}): sweep leaves it as it is; move it elsewhere \
             for sweep to start its history there",
            path.display()
        ),
        Contents::Ours | Contents::Empty => unreachable!("only refusals are errors"),
    }
}

/// Why recording into a read-only `path` failed, and that nothing is lost.
pub(super) fn read_only(path: &Path, why: &dyn std::fmt::Display) -> anyhow::Error {
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

/// Where SQLite keeps a history's write-ahead log.
pub(super) fn wal_of(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push("-wal");
    PathBuf::from(name)
}

/// A history SQLite could not open or read, not refused for what it is.
pub(super) fn not_readable(path: &Path, e: &dyn std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("{} cannot be read as sweep's history ({e})", path.display())
}
