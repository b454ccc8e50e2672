//! What sweep writes where its user points it never replaces what it reads
//! or owns — every output flag of every command tried against the history,
//! the manifest, a run's files, a study's report and a file git tracks — and
//! every long command stops within seconds of SIGTERM or Ctrl-C, its
//! temporaries removed.

use super::support::{
    project, run_err, run_ok, stdout, stop_at_work, sweep, sweep_bench, write, Stopped,
};
use nix::sys::signal::Signal;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Every file of a directory tree with its bytes' hash.
fn snapshot(dir: &Path) -> std::collections::BTreeMap<PathBuf, String> {
    let mut out = std::collections::BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let t = e.file_type().unwrap();
            if t.is_dir() {
                todo.push(e.path());
            } else if t.is_file() {
                let hash = sweep::util::hash::sha256_file(&e.path()).unwrap();
                out.insert(e.path(), hash);
            }
        }
    }
    out
}

/// The project: the study run once (its history, its run directories and
/// report), a second study's directory, and a git checkout whose tracked
/// file is `notes.md`.
fn studied() -> tempfile::TempDir {
    let root = project();
    let d = root.path();
    write(
        &d.join("s.toml"),
        &format!("name = \"s\"\n{}", super::history::FIXED),
    );
    write(&d.join("notes.md"), "# notes\n");
    run_ok(sweep(d).args(["run", "s.toml"]));
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(d)
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    assert!(
        git(&["init", "-q"]) && git(&["add", "notes.md"]) && git(&["commit", "-qm", "notes"]),
        "git makes a checkout"
    );
    root
}

/// Standard output on a full disk (`> file` there; `/dev/full` here): every
/// command that prints fails with an error that says so, never a panic.
#[test]
fn a_full_standard_output_is_an_error_not_a_panic() {
    let root = studied();
    let d = root.path();
    let full = || {
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap()
    };
    for args in [
        &["plan", "s.toml"][..],
        &["plan", "--json", "s.toml"],
        &["status", "s.toml"],
        &["report", "results/s"],
        &["report", "results/s", "--json"],
        &["history", "s.toml"],
        &["check", "results/s"],
        &["run", "s.toml"],
        // clap's own output: help and version.
        &["--help"],
        &["plan", "--help"],
        &["--version"],
    ] {
        let o = sweep(d).args(args).stdout(full()).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            matches!(o.status.code(), Some(1 | 2))
                && err.contains("writing to standard output: No space left on device")
                && !err.contains("panicked"),
            "{args:?}: {:?} {err}",
            o.status
        );
    }
}

/// Every output flag of every command, pointed at each file sweep reads or
/// owns (directly, through `..`, through a link): refused, naming what it
/// is, and nothing changes; `sweep history` and `sweep status` work after.
#[test]
fn no_output_flag_of_any_command_replaces_what_sweep_reads_or_owns() {
    let root = studied();
    let d = root.path();
    let run = "results/s/tps-1000-r0";
    assert!(d.join(run).join("local.out").is_file());
    std::os::unix::fs::symlink(d.join("results/history.sqlite"), d.join("history-link.xml"))
        .unwrap();
    let files = [
        ("results/history.sqlite", "performance history"),
        ("history-link.xml", "performance history"),
        ("results/s/../history.sqlite", "performance history"),
        (
            "results/history.sqlite-wal",
            "beside sweep's performance history",
        ),
        ("s.toml", "TOML file"),
        ("results/s/summary.csv", "inside the study directory"),
        ("results/s/report.html", "inside the study directory"),
        ("results/s/tps-1000-r0/run.json", "inside the run directory"),
        (
            "results/s/tps-1000-r0/local.out",
            "inside the run directory",
        ),
        ("results/s/tps-1000-r0/new.json", "inside the run directory"),
        ("notes.md", "git tracks it"),
    ];
    let dirs = [
        ("results/s", "inside the study directory"),
        ("results/s/tps-1000-r0", "inside the run directory"),
        ("results/imported-elsewhere", "inside the study directory"),
    ];
    // Each command with an output flag, as a function of the path it names.
    type Args = Box<dyn Fn(&str) -> Vec<String>>;
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let tok = super::support::repo()
        .join("assets/tokenizers/mistral-7b/tokenizer.json")
        .display()
        .to_string();
    write(
        &d.join("book.txt"),
        "A short book.\n\nIts second paragraph.\n",
    );
    run_ok(sweep(d).args(["data", "import-text", "book.txt", "--out", "book.parquet"]));
    let file_flags: Vec<(&str, Args)> = vec![
        (
            "check --junit",
            Box::new(move |p| strings(&["check", "s.toml", "--junit", p])),
        ),
        (
            "check --html",
            Box::new(move |p| strings(&["check", "s.toml", "--html", p])),
        ),
        (
            "bench train --json",
            Box::new(move |p| strings(&["bench", "train", "--steps", "1", "--json", p])),
        ),
        (
            "bench kernels --json",
            Box::new(move |p| strings(&["bench", "kernels", "--repeats", "1", "--json", p])),
        ),
        (
            "bench ddp --json",
            Box::new(move |p| strings(&["bench", "ddp", "--steps", "1", "--json", p])),
        ),
        (
            "bench gemms --json",
            Box::new(move |p| strings(&["bench", "gemms", "--repeats", "1", "--json", p])),
        ),
        (
            "data import-text --out",
            Box::new(move |p| strings(&["data", "import-text", "book.txt", "--out", p])),
        ),
    ];
    let log = super::support::repo()
        .join("tests/fixtures/reference-torch-logs/lsai_baseline_padded-396307.out")
        .display()
        .to_string();
    let dir_flags: Vec<(&str, Args)> = vec![
        (
            "report --out",
            Box::new(move |p| {
                strings(&[
                    "report",
                    "--import",
                    &log,
                    "--name",
                    "x",
                    "--no-plots",
                    "--out",
                    p,
                ])
            }),
        ),
        (
            "pretokenize --out",
            Box::new(move |p| {
                strings(&[
                    "pretokenize",
                    "--input",
                    "book.parquet",
                    "--quiet",
                    "--tokenizer",
                    &tok,
                    "--sequence-length",
                    "16",
                    "--out",
                    p,
                ])
            }),
        ),
        (
            "sweep-bench report --dir",
            Box::new(move |p| {
                strings(&[
                    "sweep-bench",
                    "report",
                    "--runs",
                    "2",
                    "--lines",
                    "10",
                    "--dir",
                    p,
                ])
            }),
        ),
        (
            "sweep-bench history --dir",
            Box::new(move |p| strings(&["sweep-bench", "history", "--rows", "10000", "--dir", p])),
        ),
        (
            "sweep-bench plan --dir",
            Box::new(move |p| strings(&["sweep-bench", "plan", "--runs", "2", "--dir", p])),
        ),
    ];
    let before = snapshot(d);
    let mut tried = 0;
    for (flags, targets) in [(&file_flags, &files[..]), (&dir_flags, &dirs[..])] {
        for (name, args) in flags.iter() {
            for (target, says) in targets {
                // The benchmarks of sweep's own tooling are `sweep-bench`'s.
                let o = match args(target).split_first() {
                    Some((bin, rest)) if bin == "sweep-bench" => sweep_bench(d).args(rest).output(),
                    _ => sweep(d).args(args(target)).output(),
                }
                .unwrap();
                let err = String::from_utf8_lossy(&o.stderr);
                // The manifest `sweep check` reads is its input, too.
                let input = *target == "s.toml" && err.contains("is the input");
                assert!(
                    !o.status.success() && (err.contains(says) || input),
                    "{name} {target}: {err}"
                );
                assert!(
                    err.contains("never replaces a file sweep reads or owns"),
                    "{name} {target}: {err}"
                );
                tried += 1;
            }
        }
    }
    assert_eq!(tried, 7 * files.len() + 5 * dirs.len());
    assert_eq!(snapshot(d), before, "something changed");
    run_ok(sweep(d).args(["history", "s.toml"]));
    run_ok(sweep(d).args(["status", "s.toml"]));
    // Its results are not its manifest, but they say which manifest it is.
    for cmd in ["status", "cancel", "submit"] {
        let err = run_err(sweep(d).args([cmd, "results/s"]));
        let says = "results/s holds a study's results; this command reads the study's manifest: ";
        assert!(
            err.contains(says) && err.trim_end().ends_with("/s.toml"),
            "{cmd}: {err}"
        );
    }
    // Two outputs of one command never are one file: through `..` or a link.
    std::fs::create_dir_all(d.join("out/sub")).unwrap();
    write(&d.join("out/a.xml"), "old");
    std::os::unix::fs::symlink(d.join("out/a.xml"), d.join("out/link.html")).unwrap();
    for (junit, html) in [
        ("out/a.xml", "out/sub/../a.xml"),
        ("out/a.xml", "out/link.html"),
    ] {
        let o = sweep(d)
            .args(["check", "s.toml", "--junit", junit, "--html", html])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            o.status.code() == Some(2) && err.contains("--junit and --html both name"),
            "{err}"
        );
    }
    assert_eq!(std::fs::read_to_string(d.join("out/a.xml")).unwrap(), "old");
    // New files beside the history and elsewhere are written (the docs'
    // own `results/nightly-check.xml`).
    let ok = sweep(d)
        .args([
            "check",
            "s.toml",
            "--junit",
            "results/nightly-check.xml",
            "--html",
            "out/check.html",
        ])
        .output()
        .unwrap();
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(d.join("results/nightly-check.xml").is_file() && d.join("out/check.html").is_file());
}

/// An imported report never writes into a rendered study's directory, and
/// a report of a study directory elsewhere writes into that directory, not
/// over the project's study of the same name.
#[test]
fn a_report_writes_only_into_its_own_studys_directory() {
    let root = studied();
    let d = root.path();
    let before = snapshot(&d.join("results/s"));
    let log = super::support::repo()
        .join("tests/fixtures/reference-torch-logs/lsai_baseline_padded-396307.out");
    let o = sweep(d)
        .args(["report", "--import"])
        .arg(&log)
        .args(["--log-format", "reference", "--name", "s", "--no-plots"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("give --name another name"),
        "{err}"
    );
    // A copy of the study elsewhere, reported: into the copy.
    let elsewhere = tempfile::tempdir().unwrap();
    let copy = elsewhere.path().join("s");
    assert!(Command::new("cp")
        .arg("-r")
        .arg(d.join("results/s"))
        .arg(&copy)
        .status()
        .unwrap()
        .success());
    std::fs::remove_file(copy.join("summary.csv")).unwrap();
    run_ok(sweep(d).arg("report").arg(&copy).arg("--no-plots"));
    assert!(copy.join("summary.csv").is_file());
    assert_eq!(snapshot(&d.join("results/s")), before);
}

/// The temporaries (sweep's names for them) anywhere under `dir`.
fn temporaries(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if [
                ".tmp-",
                ".pretokenize-",
                ".import-",
                ".summary-",
                ".chart-",
                ".sweep-scratch-",
            ]
            .iter()
            .any(|p| name.starts_with(p))
            {
                out.push(e.path());
            } else if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(e.path());
            }
        }
    }
    out
}

/// Any file under `dir` whose name starts with `prefix`.
fn any_named(dir: &Path, prefix: &str) -> bool {
    temporaries(dir).iter().any(|p| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
    })
}

/// Every long command — data import, report, a benchmark; pretokenize in
/// `faults::a_stopped_pretokenize_leaves_nothing_behind` — stopped at work
/// by SIGTERM (as SLURM cancels) or Ctrl-C: it ends within five seconds
/// with 143 or 130, its temporaries removed, no output half written and
/// what was there before intact. Nothing here is timed but the five-second
/// bound, which a command that stops at once meets on any load.
#[test]
fn every_long_command_stops_at_a_signal_and_leaves_nothing_behind() {
    let root = project();
    let d = root.path();
    // Text enough that each command works for seconds.
    let text: String = (0..300_000)
        .map(|i| {
            format!("Paragraph {i} of a long and repetitive book about training throughput.\n\n")
        })
        .collect();
    write(&d.join("book.txt"), &text);
    let limit = std::time::Duration::from_secs(5);

    // data import-text, Ctrl-C: 130.
    let import = || {
        let mut cmd = sweep(d);
        cmd.args(["data", "import-text"])
            .args(["book.txt"; 6])
            .args(["--out", "big.parquet", "--row-group-size", "10"]);
        cmd
    };
    let Stopped { code, took, stderr } = stop_at_work(
        import,
        || any_named(d, ".import-"),
        || drop(std::fs::remove_file(d.join("big.parquet"))),
        Signal::SIGINT,
        5,
    )
    .unwrap_or_else(|o| panic!("import-text ended before it was seen at work, 5 times: {o:?}"));
    assert_eq!(code, Some(130), "{stderr}");
    assert!(
        took < limit && stderr.contains("stopped by SIGINT"),
        "{took:?} {stderr}"
    );
    assert!(
        temporaries(d).is_empty() && !d.join("big.parquet").exists(),
        "{:?}",
        temporaries(d)
    );

    // sweep-bench report: its synthetic study (a temporary folder) goes.
    std::fs::create_dir(d.join("bench")).unwrap();
    let bench = || {
        let mut cmd = sweep_bench(d);
        cmd.args([
            "report", "--runs", "300", "--lines", "2000", "--dir", "bench",
        ]);
        cmd
    };
    let Stopped { code, took, stderr } = stop_at_work(
        bench,
        || any_named(&d.join("bench"), ".sweep-scratch-"),
        || (),
        Signal::SIGTERM,
        5,
    )
    .unwrap_or_else(|o| panic!("bench report ended before it was seen at work, 5 times: {o:?}"));
    assert_eq!(code, Some(143), "{stderr}");
    assert!(took < limit, "{took:?}");
    let left: Vec<_> = std::fs::read_dir(d.join("bench"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        left.is_empty(),
        "the scratch study is removed: {left:?}; {stderr}"
    );

    // sweep report of a large study, stopped as it reads: its earlier
    // report stays whole.
    let study = d.join("results/big");
    for i in 0..200 {
        let run = study.join(format!("run-{i:03}"));
        std::fs::create_dir_all(&run).unwrap();
        write(
            &run.join("run.json"),
            &format!(
                r#"{{"id": "{i:016x}", "name": "run-{i:03}", "study": "big", "kind": "run",
                   "manifest": {{"path": "m.toml", "sha256": "0"}}, "git_commit": null,
                   "sweep_version": "0.1.0", "created_at": "2026-01-01T00:00:00Z",
                   "params": {{"batch_size": {}}}, "jobs": []}}"#,
                1 + i % 4
            ),
        );
        let lines: String = (1..=2000)
            .map(|s| super::support::step_line(s, 5.0, 1000.0 + (s % 7) as f64, s as f64) + "\n")
            .collect();
        write(&run.join("metrics.jsonl"), &lines);
    }
    write(&study.join("summary.csv"), "the earlier report\n");
    let report = || {
        let mut cmd = sweep(d);
        cmd.args(["report", "results/big", "--no-plots"]);
        cmd
    };
    let started = std::time::Instant::now();
    let stopped = stop_at_work(
        report,
        || started.elapsed() > std::time::Duration::from_millis(300),
        || (),
        Signal::SIGTERM,
        1,
    );
    // A fast machine may finish first: then it exits 0 and wrote its report.
    // Stopped, each output is the earlier one or a whole new one (the
    // signal may come after summary.csv was replaced, as the page or the
    // history is written): never a part of one.
    let after_stop = std::fs::read_to_string(study.join("summary.csv")).unwrap();
    match stopped {
        Err(o) => {
            assert!(o.status.success(), "{o:?}");
            eprintln!("the report ended before the signal");
        }
        Ok(Stopped { code, took, stderr }) => {
            assert_eq!(code, Some(143), "{stderr}");
            assert!(took < limit, "{took:?}");
            if after_stop != "the earlier report\n" {
                eprintln!("the report was stopped after it had replaced summary.csv ({took:?})");
            }
        }
    };
    assert!(temporaries(d).is_empty(), "{:?}", temporaries(d));
    assert!(!stdout(&run_ok(sweep(d).args([
        "report",
        "results/big",
        "--no-plots"
    ])))
    .is_empty());
    let whole = std::fs::read_to_string(study.join("summary.csv")).unwrap();
    assert!(
        after_stop == "the earlier report\n" || after_stop == whole,
        "summary.csv after the stop is neither the earlier report nor a whole one:\n{}",
        &after_stop[..after_stop.len().min(300)]
    );
}
