//! The history: each measurement recorded once and never its own
//! reference; foreign, earlier and damaged files refused as they are.

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

/// MFU set after a first report: the measurements already recorded get
/// it (their attempt's mean too), their measured tokens/s kept; a reading
/// of other points is another reading, left as it was.
#[test]
fn figures_derived_anew_reach_the_measurements_already_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = History::open(&dir.path().join(FILE)).unwrap();
    let first = [entry("s", 1, "r0", 100.0), entry("s", 1, "r1", 110.0)];
    h.record(&first).unwrap();
    let with_mfu: Vec<Entry> = first
        .iter()
        .map(|e| Entry {
            mfu_pct_mean: Some(e.tokens_per_second_mean / 10.0),
            tflops_mean: Some(1.5),
            ..e.clone()
        })
        .collect();
    let recorded = h.record(&with_mfu).unwrap();
    assert_eq!(
        recorded,
        Recorded {
            new: 0,
            recomputed: 2
        }
    );
    assert!(recorded
        .to_string()
        .contains("2 recorded before recomputed"));
    let a = &h.attempts(&Filter::default()).unwrap()[0];
    assert_eq!((a.runs, a.tokens_per_second), (2, 105.0));
    assert_eq!((a.mfu_pct, a.tflops), (Some(10.5), Some(1.5)));
    // Once is enough; other points are another reading.
    assert_eq!(h.record(&with_mfu).unwrap(), Recorded::default());
    let other = Entry {
        points: 7,
        mfu_pct_mean: Some(99.0),
        ..with_mfu[0].clone()
    };
    assert_eq!(h.record(&[other]).unwrap(), Recorded::default());
    assert_eq!(
        h.attempts(&Filter::default()).unwrap()[0].mfu_pct,
        Some(10.5)
    );
}

#[test]
fn a_measurement_is_recorded_once_and_never_its_own_reference() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(FILE);
    let mut h = History::open(&path).unwrap();
    let first = [entry("s", 1, "r0", 100.0), entry("s", 1, "r1", 110.0)];
    assert_eq!(h.record(&first).unwrap().new, 2);
    assert_eq!(h.record(&first).unwrap(), Recorded::default());
    // The same measurements under another study's name (a copied or
    // renamed study reported): nothing new.
    let copied: Vec<Entry> = first
        .iter()
        .map(|e| Entry {
            study: "s-copy".into(),
            ..e.clone()
        })
        .collect();
    assert_eq!(h.record(&copied).unwrap(), Recorded::default());
    // The same study name, attempt count and run ids measured afresh
    // (the study moved away and run again): new measurements.
    let afresh = Entry {
        attempt_id: "new-r0".into(),
        study_attempt_id: "s-1-again".into(),
        ran_at: "2026-11-02T12:00:00Z".into(),
        ..entry("s", 1, "r0", 90.0)
    };
    assert_eq!(h.record(std::slice::from_ref(&afresh)).unwrap().new, 1);
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
            assert_eq!(t.join().unwrap().unwrap().new, 1);
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
                c.execute_batch("INSERT INTO meta VALUES ('schema_version', '4')")
                    .unwrap();
            }),
            "is not sweep's history (its schema is not sweep's version 4 (missing: attempts_by_study))",
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
    assert_eq!(verify(&h.conn).unwrap(), Contents::Ours);
    drop(h);
    let h = History::open_existing(&empty).unwrap().unwrap();
    assert_eq!(h.attempts(&Filter::default()).unwrap().len(), 1);
    assert!(immutable_uri(Path::new("/a b/h%.sqlite")).ends_with("/a%20b/h%25.sqlite?immutable=1"));
}
