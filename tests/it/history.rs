//! The performance history (`results/history.sqlite`), `sweep history`,
//! `sweep check` and `sweep run --again`, on real runs of the local
//! executor.

use crate::support::*;
use std::path::Path;
use std::process::{Command, Stdio};

/// A program that logs a fixed throughput per step (its configuration's
/// `tps`, a little more for each repeat and step): known figures.
pub const FIXED: &str = r#"executor = "local"
command = """for s in 1 2 3 4 5 6; do echo "step $s: $(( {{ tps }} + 3 * {{ repeat }} + s )) tokens/s"; done"""
[sweep]
repeats = 2
[sweep.grid]
tps = [1000, 2000]
[report]
skip_first = 1
line_pattern = 'step (?P<step>\d+): (?P<tokens_per_second>[0-9.]+) tokens/s'
"#;

/// Runs a Python script (indented as the Rust around it: dedented first).
fn python(script: &str, args: &[&str]) -> String {
    let indent = script
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    let script: String = script
        .lines()
        .map(|l| l.get(indent..).unwrap_or("").to_string() + "\n")
        .collect();
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "python failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every report records the study's completed runs once; Python's own
/// `sqlite3` reads the same figures as summary.csv (the schema is a
/// contract); `sweep history` gives the intervals the table has.
#[test]
fn the_history_holds_what_summary_csv_says_and_python_reads_it() {
    let (root, m) = (project(), Path::new("fixed.toml"));
    write(&root.path().join(m), &format!("name = \"fixed\"\n{FIXED}"));
    let out = run_ok(sweep(root.path()).arg("run").arg(m));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("history: 4 run(s) recorded"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let db = root.path().join("results/history.sqlite");
    // Reported again: nothing new.
    let again = run_ok(sweep(root.path()).arg("report").arg(m).arg("--no-plots"));
    assert!(!String::from_utf8_lossy(&again.stderr).contains("recorded"));
    let compared = python(
        r#"
import csv, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
assert db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == "4"
assert db.execute("PRAGMA application_id").fetchone()[0] == 0x73776570
cols = [r[1] for r in db.execute("PRAGMA table_info(measurements)")]
want = ["attempt_id", "study_attempt_id", "study", "run_id", "attempt", "run",
        "configuration_id", "configuration", "system",
        "ran_at", "recorded_at", "git_commit", "sweep_version", "points",
        "tokens_per_second_mean", "tokens_per_second_std", "mfu_pct_mean", "tflops_mean",
        "step_time_s_mean", "peak_memory_mb_mean", "fingerprint_id"]
assert cols == want, cols
# Every run's fingerprint, stored once for the runs that share it.
fps = db.execute("SELECT COUNT(*), COUNT(DISTINCT fingerprint_id) FROM measurements m "
                 "JOIN fingerprints f ON f.id = m.fingerprint_id").fetchone()
assert fps[0] == 4 and fps[1] >= 1, fps
import json
for (j,) in db.execute("SELECT json FROM fingerprints"):
    assert json.loads(j)["system"].startswith("local/"), j
assert db.execute("SELECT COUNT(*) FROM measurements").fetchone()[0] == 4
rows = {r["run"]: r for r in csv.DictReader(open(sys.argv[2]))}
n = 0
for name, mean, runs, points in db.execute(
        "SELECT configuration, AVG(tokens_per_second_mean), COUNT(*), SUM(points) "
        "FROM measurements GROUP BY configuration_id"):
    row = rows[name]
    assert abs(mean - float(row["tokens_per_second_mean"])) < 1e-9 * mean, (mean, row)
    assert runs == int(row["runs"]) and points == int(row["points"]), (runs, points, row)
    n += 1
print(n)
"#,
        &[
            db.to_str().unwrap(),
            root.path()
                .join("results/fixed/summary.csv")
                .to_str()
                .unwrap(),
        ],
    );
    assert_eq!(compared.trim(), "2");
    // `sweep history`: each configuration's attempt with the table's interval.
    let history: Vec<serde_json::Value> = serde_json::from_slice(
        &run_ok(sweep(root.path()).args(["history", "fixed.toml", "--json"])).stdout,
    )
    .unwrap();
    let table =
        json_rows(sweep(root.path()).args(["report", "fixed.toml", "--json", "--no-plots"]));
    assert_eq!(history.len(), 2);
    for h in &history {
        let row = table
            .iter()
            .find(|r| r["run"] == h["configuration"])
            .unwrap();
        let close = |a: &serde_json::Value, b: &serde_json::Value| {
            (a.as_f64().unwrap() - b.as_f64().unwrap()).abs() < 1e-6
        };
        assert!(
            close(&h["tokens_per_second"], &row["tokens_per_second_mean"]),
            "{h} {row}"
        );
        assert!(
            close(&h["ci95"][0], &row["tokens_per_second_ci95_low"]),
            "{h} {row}"
        );
        assert!(
            close(&h["ci95"][1], &row["tokens_per_second_ci95_high"]),
            "{h} {row}"
        );
        assert_eq!(h["attempt"], 1);
        assert!(h["system"].as_str().unwrap().starts_with("local/"), "{h}");
    }
    let filtered = run_ok(sweep(root.path()).args([
        "history",
        "--config",
        "tps-1000",
        "--since",
        "2000-01-01",
    ]));
    let text = stdout(&filtered);
    assert!(
        text.contains("tps-1000") && !text.contains("tps-2000"),
        "{text}"
    );
    // Against a copy of itself: every configuration unchanged, exit 0.
    let copy = root.path().join("results/fixed-copy");
    let cp = Command::new("cp")
        .arg("-r")
        .arg(root.path().join("results/fixed"))
        .arg(&copy)
        .status()
        .unwrap();
    assert!(cp.success());
    let same =
        run_ok(sweep(root.path()).args(["check", "fixed.toml", "--against", "results/fixed-copy"]));
    assert!(stdout(&same).contains("2 unchanged"), "{}", stdout(&same));
    // Usage errors exit 2.
    let bad = sweep(root.path())
        .args(["check", "fixed.toml", "--threshold", "150"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    let both = sweep(root.path())
        .args([
            "check",
            "fixed.toml",
            "--history",
            "--against",
            "results/fixed-copy",
        ])
        .output()
        .unwrap();
    assert_eq!(both.status.code(), Some(2));
}

/// Reports recording at once lose nothing; a report killed while it
/// records leaves all or nothing of it; a history that is not one is named,
/// and the report's own files are written all the same.
#[test]
fn concurrent_killed_and_broken_histories() {
    let root = project();
    for name in ["a", "b"] {
        write(
            &root.path().join(format!("{name}.toml")),
            &format!("name = \"{name}\"\n{FIXED}"),
        );
        run_ok(sweep(root.path()).args(["submit", &format!("{name}.toml")]));
    }
    let db = root.path().join("results/history.sqlite");
    assert!(!db.exists(), "submit records nothing");
    let count = |study: &str| {
        python(
            "import sqlite3, sys; db = sqlite3.connect(sys.argv[1]); \
             assert db.execute('PRAGMA integrity_check').fetchone()[0] == 'ok'; \
             print(db.execute('SELECT COUNT(*) FROM measurements WHERE study = ?', (sys.argv[2],)).fetchone()[0])",
            &[db.to_str().unwrap(), study],
        )
        .trim()
        .parse::<usize>()
        .unwrap()
    };
    // Both at once, a few times.
    for _ in 0..3 {
        let spawn = |m: &str| {
            sweep(root.path())
                .args(["report", m, "--no-plots"])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        };
        let (x, y) = (spawn("a.toml"), spawn("b.toml"));
        for out in [x.wait_with_output().unwrap(), y.wait_with_output().unwrap()] {
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    assert_eq!((count("a"), count("b")), (4, 4));
    // Killed at any moment of a recording: all of it or none.
    for delay_ms in [0u64, 5, 10, 20, 40, 80] {
        python(
            "import sqlite3, sys; db = sqlite3.connect(sys.argv[1]); \
             db.execute('DELETE FROM measurements WHERE study = ?', ('a',)); db.commit()",
            &[db.to_str().unwrap()],
        );
        let mut c = sweep(root.path())
            .args(["history", "--import", "results/a"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        let _ = c.kill();
        let _ = c.wait();
        let n = count("a");
        assert!(n == 0 || n == 4, "{n} rows after a kill at {delay_ms} ms");
        assert_eq!(count("b"), 4);
    }
    // Not a history: named, never written over; the report is written.
    for f in ["history.sqlite-wal", "history.sqlite-shm"] {
        let _ = std::fs::remove_file(root.path().join("results").join(f));
    }
    std::fs::write(&db, b"not a database, but someone's notes\n".repeat(200)).unwrap();
    let summary = root.path().join("results/a/summary.md");
    std::fs::remove_file(&summary).unwrap();
    let err = run_err(sweep(root.path()).args(["report", "a.toml", "--no-plots"]));
    assert!(
        err.contains(&db.display().to_string()) && err.contains("is not a SQLite database"),
        "{err}"
    );
    assert!(summary.is_file());
    assert!(std::fs::read(&db).unwrap().starts_with(b"not a database"));
    let check = sweep(root.path())
        .args(["check", "a.toml"])
        .output()
        .unwrap();
    assert_eq!(check.status.code(), Some(2));
}

/// A program whose throughput is its configuration's `tps` (a little more
/// for each repeat and step) scaled by the percentage in `speed.txt`: a
/// slowdown made by hand, nothing timed.
const SCALED: &str = r#"name = "scaled"
executor = "local"
command = """f=$(cat speed.txt); for s in 1 2 3 4 5 6; do echo "step $s: $(( ({{ tps }} + 3 * {{ repeat }} + s) * f / 100 )) tokens/s"; done"""
[sweep]
repeats = 2
[sweep.grid]
tps = [1000, 2000]
[report]
skip_first = 1
line_pattern = 'step (?P<step>\d+): (?P<tokens_per_second>[0-9.]+) tokens/s'
"#;

/// The measurements in a project's history.
fn measurements(root: &Path) -> usize {
    python(
        "import sqlite3, sys; db = sqlite3.connect(sys.argv[1]); \
         print(db.execute('SELECT COUNT(*) FROM measurements').fetchone()[0])",
        &[root.join("results/history.sqlite").to_str().unwrap()],
    )
    .trim()
    .parse()
    .unwrap()
}

/// The README's recipe — keep a study (`mv results/S results/S-before`),
/// change something, run it again — records the new runs as a new attempt,
/// and `sweep check` finds the slowdown. The study moved, reported again or
/// copied records nothing twice, and a copy is never its own reference; a
/// study removed (`rm -rf`) and run again is measured anew.
#[test]
fn a_study_moved_away_and_run_again_is_a_new_attempt_and_its_slowdown_is_found() {
    let (root, m) = (project(), "scaled.toml");
    write(&root.path().join(m), SCALED);
    write(&root.path().join("speed.txt"), "100\n");
    run_ok(sweep(root.path()).args(["run", m]));
    assert_eq!(measurements(root.path()), 4);
    let results = root.path().join("results");
    std::fs::rename(results.join("scaled"), results.join("scaled-before")).unwrap();
    write(&root.path().join("speed.txt"), "60\n");
    let again = run_ok(sweep(root.path()).args(["run", m]));
    let said = String::from_utf8_lossy(&again.stderr);
    assert!(said.contains("history: 4 run(s) recorded"), "{said}");
    assert_eq!(measurements(root.path()), 8);
    let attempts = |root: &Path| -> Vec<serde_json::Value> {
        json_rows(sweep(root).args(["history", m, "--json"]))
    };
    let h = attempts(root.path());
    assert_eq!(h.len(), 4, "two configurations, two attempts each: {h:?}");
    let ids: std::collections::BTreeSet<&str> = h
        .iter()
        .map(|a| a["study_attempt_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 2, "{h:?}");
    let check = sweep(root.path()).args(["check", m]).output().unwrap();
    let text = stdout(&check);
    assert_eq!(check.status.code(), Some(1), "{text}");
    assert!(
        text.contains("2 regressed") && text.contains("0.600x"),
        "{text}"
    );
    // The moved study reported again, and a copy of it: nothing twice.
    let moved = run_ok(sweep(root.path()).args(["report", "results/scaled-before", "--no-plots"]));
    assert!(
        !String::from_utf8_lossy(&moved.stderr).contains("recorded"),
        "{}",
        String::from_utf8_lossy(&moved.stderr)
    );
    let cp = Command::new("cp")
        .arg("-r")
        .arg(results.join("scaled-before"))
        .arg(results.join("scaled-copy"))
        .status()
        .unwrap();
    assert!(cp.success());
    run_ok(sweep(root.path()).args(["report", "results/scaled-copy", "--no-plots"]));
    assert_eq!(measurements(root.path()), 8);
    // The copy checked against the history: its reference is the other
    // attempt alone (2 runs of 1 attempt), never its own runs again.
    let copy: serde_json::Value = serde_json::from_slice(
        &sweep(root.path())
            .args(["check", "results/scaled-copy", "--json"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    for c in copy["configurations"].as_array().unwrap() {
        assert_eq!(
            (
                &c["reference_runs"],
                &c["reference_attempts"],
                &c["verdict"]
            ),
            (&2.into(), &1.into(), &"improved".into()),
            "{c}"
        );
    }
    // Removed and run again: measured anew.
    std::fs::remove_dir_all(results.join("scaled")).unwrap();
    run_ok(sweep(root.path()).args(["run", m]));
    assert_eq!(measurements(root.path()), 12);
    assert_eq!(attempts(root.path()).len(), 6);
}

/// Another program's SQLite database, or a history of an earlier sweep's
/// schema, where the history goes: named for what it is by every command
/// that meets it, and left byte for byte as it was (no file beside it
/// either); a report's own files are written all the same.
#[test]
fn another_programs_database_and_an_earlier_schema_are_refused_untouched() {
    let (root, m) = (project(), "scaled.toml");
    write(&root.path().join(m), SCALED);
    write(&root.path().join("speed.txt"), "100\n");
    let db = root.path().join("results/history.sqlite");
    std::fs::create_dir_all(db.parent().unwrap()).unwrap();
    for (make, says) in [
        (
            "CREATE TABLE todo (item TEXT); INSERT INTO todo VALUES ('buy milk');",
            "a SQLite database that sweep did not create",
        ),
        (
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL); \
             INSERT INTO meta VALUES ('schema_version', '2'); \
             CREATE TABLE measurements (study TEXT, run_id TEXT, attempt INTEGER); \
             INSERT INTO measurements VALUES ('s', 'r', 1);",
            "is a history of an earlier sweep (schema version 2)",
        ),
    ] {
        let _ = std::fs::remove_file(&db);
        python(
            "import sqlite3, sys; db = sqlite3.connect(sys.argv[1]); \
             db.executescript(sys.argv[2]); db.commit()",
            &[db.to_str().unwrap(), make],
        );
        let before = std::fs::read(&db).unwrap();
        let summary = root.path().join("results/scaled/summary.csv");
        let _ = std::fs::remove_file(&summary);
        let run = sweep(root.path()).args(["run", m]).output().unwrap();
        let err = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(1), "{err}");
        assert!(
            err.contains(says) && err.contains(&db.display().to_string()),
            "{err}"
        );
        assert!(summary.is_file(), "the report is written all the same");
        for args in [vec!["history"], vec!["history", m]] {
            let e = run_err(sweep(root.path()).args(&args));
            assert!(e.contains(says), "{args:?}: {e}");
        }
        let check = sweep(root.path()).args(["check", m]).output().unwrap();
        assert_eq!(check.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&check.stderr).contains(says));
        assert!(std::fs::read(&db).unwrap() == before, "the file changed");
        for side in ["-wal", "-shm", "-journal"] {
            let p = format!("{}{side}", db.display());
            assert!(!Path::new(&p).exists(), "{p} was made");
        }
    }
}

/// `sweep run --again` started while a `sweep run` of the study is still
/// running waits for it — its runs and its report — then measures anew:
/// both succeed, and the history holds both attempts.
#[test]
fn a_run_again_waits_for_a_running_sweep_run_and_its_report() {
    let (root, m) = (project(), "scaled.toml");
    write(
        &root.path().join(m),
        &SCALED.replace("command = \"\"\"f=", "command = \"\"\"sleep 0.5; f="),
    );
    write(&root.path().join("speed.txt"), "100\n");
    let first = sweep(root.path())
        .args(["run", m])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = root.path().join("results/scaled/tps-1000-r0/local.out");
    wait_for(60, "the first run to start", || log.exists().then_some(()));
    let again = run_ok(sweep(root.path()).args(["run", m, "--again"]));
    let first = first.wait_with_output().unwrap();
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("is held by"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert!(root
        .path()
        .join("results/scaled/attempts/1/tps-1000-r0/local.out")
        .is_file());
    assert_eq!(measurements(root.path()), 8);
}

/// Runs `sweep` as a user who may not write the project (root: `nobody`,
/// through setpriv; anyone else: themselves, the project made read-only),
/// from a copy of the binary that user can run.
fn as_reader(root: &Path, bin: &Path) -> Command {
    // SAFETY: geteuid has no preconditions.
    let mut c = match unsafe { libc::geteuid() } {
        0 => {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
                .arg(bin);
            c
        }
        _ => Command::new(bin),
    };
    c.arg("-C").arg(root).current_dir(root);
    c
}

/// A history its reader may not write (its file and folder read-only, or a
/// read-only file system) is read as it is: `sweep history` and `sweep
/// check` work; recording says it is read-only, advises nothing against
/// the record, and changes nothing.
#[test]
fn a_read_only_history_is_read_as_it_is() {
    use std::os::unix::fs::PermissionsExt;
    let (root, m) = (project(), "scaled.toml");
    write(&root.path().join(m), SCALED);
    write(&root.path().join("speed.txt"), "100\n");
    run_ok(sweep(root.path()).args(["run", m]));
    let bin = root.path().join("sweep-bin");
    std::fs::copy(env!("CARGO_BIN_EXE_sweep"), &bin).unwrap();
    let db = root.path().join("results/history.sqlite");
    let before = std::fs::read(&db).unwrap();
    let kept = Command::new("cp")
        .args(["-r", "results/scaled", "results/scaled-before"])
        .current_dir(root.path())
        .status()
        .unwrap();
    assert!(kept.success());
    // Readable by all, writable by none but its owner (root: not `nobody`).
    let walk = Command::new("chmod")
        .args(["-R", "a+rX,go-w"])
        .arg(root.path())
        .status()
        .unwrap();
    assert!(walk.success());
    let read_only = [db.clone(), root.path().join("results")];
    for p in &read_only {
        let mode = std::fs::metadata(p).unwrap().permissions().mode();
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode & !0o222)).unwrap();
    }
    let history = run_ok(as_reader(root.path(), &bin).args(["history", m]));
    assert!(
        stdout(&history).contains("tps-1000"),
        "{}",
        stdout(&history)
    );
    let check = as_reader(root.path(), &bin)
        .args(["check", m])
        .output()
        .unwrap();
    assert_eq!(
        check.status.code(),
        Some(0),
        "{}{}",
        stdout(&check),
        String::from_utf8_lossy(&check.stderr)
    );
    let err = run_err(as_reader(root.path(), &bin).args(["history", "--import", "results/scaled"]));
    assert!(
        err.contains("read-only for this user") && err.contains("The history is intact"),
        "{err}"
    );
    assert!(
        !err.contains("move it") && !err.contains("not a readable"),
        "{err}"
    );
    // Its report: the study that cannot be written is said as such, with
    // the way round it, before anything is written; `--out` writes the whole
    // report elsewhere, charts included (the run fails only on the history).
    let err = run_err(as_reader(root.path(), &bin).args(["report", m]));
    assert!(
        err.contains("cannot be written") && err.contains("`--out DIR`"),
        "{err}"
    );
    let elsewhere = tempfile::tempdir().unwrap();
    std::fs::set_permissions(elsewhere.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let report = as_reader(root.path(), &bin)
        .args(["report", m, "--out"])
        .arg(elsewhere.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&report.stderr);
    assert!(
        report.status.code() == Some(1) && err.contains("not recorded in the history"),
        "{err}"
    );
    for f in ["summary.md", "report.html", "plots/throughput.svg"] {
        assert!(elsewhere.path().join(f).is_file(), "{f}: {err}");
    }
    let err = run_err(as_reader(root.path(), &bin).args([
        "compare",
        "results/scaled-before",
        "results/scaled",
    ]));
    assert!(
        err.contains("cannot be written") && err.contains("`sweep -C DIR compare A B`"),
        "{err}"
    );
    // Rendering or running it: what reads a study one cannot write.
    for verb in ["render", "run"] {
        let err = run_err(as_reader(root.path(), &bin).args([verb, m]));
        assert!(
            err.contains("cannot be written (Permission denied")
                && err.contains(&format!("`sweep {verb}` writes the study's scripts"))
                && err.contains("`sweep report --out DIR`"),
            "{err}"
        );
    }
    assert_eq!(std::fs::read(&db).unwrap(), before);
    for p in &read_only {
        let mode = std::fs::metadata(p).unwrap().permissions().mode();
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode | 0o200)).unwrap();
    }
    // A read-only file system (root only: a read-only bind mount of results/).
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let results = root.path().join("results");
        let script = format!(
            "mount --bind '{r}' '{r}' && mount -o remount,ro,bind '{r}' && exec \"$@\"",
            r = results.display()
        );
        let ro = |args: &[&str]| {
            Command::new("unshare")
                .args(["-m", "sh", "-c", &script, "sh"])
                .arg(&bin)
                .arg("-C")
                .arg(root.path())
                .args(args)
                .current_dir(root.path())
                .output()
                .unwrap()
        };
        let probe = ro(&["history", m]);
        if String::from_utf8_lossy(&probe.stderr).contains("mount") {
            skipped(
                "read-only-mount",
                &format!(
                    "no read-only mount here: {}",
                    String::from_utf8_lossy(&probe.stderr)
                ),
            );
        } else {
            assert!(
                probe.status.success() && stdout(&probe).contains("tps-2000"),
                "{}",
                String::from_utf8_lossy(&probe.stderr)
            );
            let render = ro(&["render", m]);
            let err = String::from_utf8_lossy(&render.stderr);
            assert!(
                !render.status.success()
                    && err.contains("cannot be written (Read-only file system"),
                "{err}"
            );
            let import = ro(&["history", "--import", "results/scaled"]);
            let err = String::from_utf8_lossy(&import.stderr);
            assert!(
                !import.status.success() && err.contains("read-only for this user"),
                "{err}"
            );
        }
        assert_eq!(std::fs::read(&db).unwrap(), before);
    } else {
        skipped(
            "read-only-mount",
            "not root: a read-only bind mount of results/ needs root",
        );
    }
}

/// A program whose throughput is its own, real, single-threaded Python loop.
/// A nightly study: a program whose throughput is what `speed.txt` says
/// (percent of its usual), within ±1% from run to run.
const NIGHTLY: &str = r#"name = "nightly"
executor = "local"
command = """f=$(cat speed.txt); for s in 1 2 3 4 5 6 7 8; do echo "step $s: $(( ({{ work }} + 7 * {{ repeat }} + (s * 37) % 11) * f / 100 )) tokens/s"; done"""
[sweep]
repeats = 3
[sweep.grid]
work = [1000, 2000]
[report]
skip_first = 1
line_pattern = 'step (?P<step>\d+): (?P<tokens_per_second>[0-9.]+) tokens/s'
[environment]
system = "ci-box"
probes = { python = "python3 -c 'import sys; print(sys.version.split()[0])'" }
"#;

/// Measured, measured again unchanged (`--again`: exit 0 against the
/// history), then measured again at 60% of its speed (as competition for
/// the CPU makes it; that is a demonstration, not a test: docs/report.md):
/// the slowdown found in every configuration with its ratio and interval,
/// exit 1, and a JUnit file a real JUnit parser reads.
#[test]
fn a_study_measured_again_is_unchanged_and_a_slowdown_regresses_it() {
    let (root, m) = (project(), Path::new("nightly.toml"));
    write(&root.path().join(m), NIGHTLY);
    write(&root.path().join("speed.txt"), "100\n");
    run_ok(sweep(root.path()).arg("run").arg(m));
    let fp: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            root.path()
                .join("results/nightly/work-1000-r0/environment.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(fp["system"], "ci-box");
    assert!(
        fp["probes"]["python"].as_str().unwrap().starts_with('3'),
        "{fp}"
    );
    assert!(
        !fp["kernel"].as_str().unwrap().is_empty() && fp["nodes"][0] == fp["host"],
        "{fp}"
    );
    let again = run_ok(sweep(root.path()).arg("run").arg(m).arg("--again"));
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("attempt 1 moved to"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    // The first attempt is kept whole.
    assert!(root
        .path()
        .join("results/nightly/attempts/1/work-2000-r2/local.out")
        .is_file());
    let check = |extra: &[&str]| {
        sweep(root.path())
            .args(["check", "nightly.toml", "--history", "--threshold", "10"])
            .args(extra)
            .output()
            .unwrap()
    };
    let unchanged = check(&[]);
    assert_eq!(
        unchanged.status.code(),
        Some(0),
        "{}{}",
        stdout(&unchanged),
        String::from_utf8_lossy(&unchanged.stderr)
    );
    write(&root.path().join("speed.txt"), "60\n");
    run_ok(sweep(root.path()).arg("run").arg(m).arg("--again"));
    let slowed = check(&["--junit", "check.xml"]);
    let text = stdout(&slowed);
    assert_eq!(slowed.status.code(), Some(1), "{text}");
    for config in ["work-1000", "work-2000"] {
        let line = text.lines().find(|l| l.contains(config)).unwrap();
        assert!(line.contains("regressed") && line.contains("x ["), "{line}");
    }
    assert!(text.contains("2 regressed"), "{text}");
    // The reference pooled both earlier attempts (3 runs each).
    assert!(text.contains("(6, 2)"), "{text}");
    let parsed = python(
        r#"
import sys
from junitparser import JUnitXml, Failure
xml = JUnitXml.fromfile(sys.argv[1])
cases = [c for suite in xml for c in suite]
failed = [c for c in cases if any(isinstance(r, Failure) for r in c.result)]
print(len(cases), len(failed), failed[0].result[0].message)
"#,
        &[root.path().join("check.xml").to_str().unwrap()],
    );
    assert!(parsed.starts_with("2 2 regressed:"), "{parsed}");
    // `sweep history`: three attempts of each configuration.
    let h: Vec<serde_json::Value> = serde_json::from_slice(
        &run_ok(sweep(root.path()).args(["history", "results/nightly", "--json"])).stdout,
    )
    .unwrap();
    assert_eq!(h.len(), 6, "{h:?}");
}
