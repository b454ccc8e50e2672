//! The report: the reference study's own table from its logs, and a sweep
//! whose runs failed, are still writing, or wrote nothing.

use super::support::{
    json_rows, project, repo, run_err, run_ok, stdout, step_line, sweep, write, CHARTS,
};
use serde_json::Value;
use std::path::Path;

/// The reference study's published README table (tokens/s, MFU %, TFLOPs).
const TABLE: &[(&str, f64, f64, f64)] = &[
    ("lsai_baseline_padded-396307", 6544.40, 31.97, 316.23),
    ("lsai_baseline_padded-400129", 7873.05, 38.47, 380.43),
    ("lsai_baseline_padding_free-396382", 6902.55, 35.97, 355.77),
    ("lsai_baseline_padding_free-400137", 7410.96, 36.21, 358.10),
    ("lsai_pretokenized_padded-399928", 6333.60, 30.94, 306.04),
    ("lsai_pretokenized_padded-400185", 7605.06, 37.16, 367.48),
    (
        "lsai_pretokenized_token_list-399941",
        6224.24,
        30.41,
        300.76,
    ),
    (
        "lsai_pretokenized_token_list-400186",
        7475.30,
        36.52,
        361.21,
    ),
];

#[test]
fn the_reference_studys_table_is_reproduced_from_its_logs() {
    let root = project();
    let logs = root.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let fixtures = repo().join("tests/fixtures/reference-torch-logs");
    for (name, ..) in TABLE {
        std::fs::copy(
            fixtures.join(format!("{name}.out")),
            logs.join(format!("{name}.out")),
        )
        .unwrap();
    }
    let glob = format!("{}/*.out", logs.display());
    let rows = json_rows(sweep(root.path()).args([
        "report",
        "--log-format",
        "reference",
        "--name",
        "reference",
        "--json",
        "--import",
        &glob,
    ]));
    assert_eq!(rows.len(), 8);
    for (name, tps, mfu, tflops) in TABLE {
        let r = rows
            .iter()
            .find(|r| r["run"] == *name)
            .unwrap_or_else(|| panic!("{name} missing"));
        for (key, want) in [
            ("tokens_per_second_mean", tps),
            ("mfu_pct_mean", mfu),
            ("tflops_mean", tflops),
        ] {
            let got = r[key].as_f64().unwrap();
            assert!(
                (got - want).abs() <= 0.005 + 1e-9,
                "{name} {key}: {got:.4} vs the published {want}"
            );
        }
        assert_eq!(
            r["points"].as_u64(),
            Some(196),
            "200 log lines minus the first 5 (and step 1)"
        );
        assert_eq!(r["state"], "COMPLETED");
    }
    // The same table lands in summary.md, .csv and .parquet, and the charts exist.
    let md = std::fs::read_to_string(root.path().join("results/reference/summary.md")).unwrap();
    assert!(
        md.contains("| lsai_baseline_padded-400129 | 7873.05 ± ") && md.contains(" | 38.47 ± "),
        "{md}"
    );
    let csv = std::fs::read_to_string(root.path().join("results/reference/summary.csv")).unwrap();
    assert!(csv.lines().count() == 9 && csv.contains("tokens_per_second_p95"));
    assert!(root
        .path()
        .join("results/reference/summary.parquet")
        .is_file());
    for chart in CHARTS {
        for ext in ["png", "svg"] {
            let p = root.path().join(format!("plots/reference/{chart}.{ext}"));
            assert!(
                std::fs::metadata(&p).is_ok_and(|m| m.len() > 1000),
                "{} missing",
                p.display()
            );
        }
    }
}

#[test]
fn failed_runs_torn_lines_and_missing_metrics_are_reported_not_fatal() {
    let root = project();
    let m = root.path().join("m.toml");
    // Each run writes metrics as our trainer does, then behaves differently.
    // Quoted for a shell's printf.
    let line = |s: usize, tps: usize| {
        step_line(s, 10.5 - s as f64, tps as f64, s as f64).replace('"', "\\\"")
    };
    let lines: Vec<String> = (1..=8).map(|s| line(s, 100 * s)).collect();
    let body = lines.join("\\n");
    write(
        &m,
        &format!(
            r#"name = "r"
executor = "local"
command = """
case {{{{ kind }}}} in
  ok) printf '{body}\n' > "$SWEEP_RUN_DIR/metrics.jsonl" ;;
  torn) printf '{body}\n{{"step": 9, "lo' > "$SWEEP_RUN_DIR/metrics.jsonl" ;;
  failed) printf '{body}\n' > "$SWEEP_RUN_DIR/metrics.jsonl"; exit 3 ;;
  silent) true ;;
esac
"""
[sweep.grid]
kind = ["ok", "torn", "failed", "silent"]
[report]
skip_first = 2
baseline = "ok"
"#
        ),
    );
    let _ = sweep(root.path()).arg("submit").arg(&m).output().unwrap();
    let rows = json_rows(sweep(root.path()).arg("report").arg(&m).arg("--json"));
    let row = |n: &str| rows.iter().find(|r| r["run"] == n).unwrap().clone();
    // Skipping 2 of 8 points: mean of 300..800 = 550.
    assert_eq!(row("ok")["tokens_per_second_mean"].as_f64(), Some(550.0));
    assert_eq!(row("ok")["speedup"].as_f64(), Some(1.0));
    assert_eq!(
        row("torn")["tokens_per_second_mean"].as_f64(),
        Some(550.0),
        "the torn last line is left out"
    );
    assert_eq!(row("failed")["state"], "FAILED (exit 3)");
    assert_eq!(row("failed")["points"].as_u64(), Some(6));
    assert!(row("silent")["tokens_per_second_mean"].is_null());
    let text = stdout(&run_ok(
        sweep(root.path()).arg("report").arg(&m).arg("--no-plots"),
    ));
    assert!(text.contains("note: failed: FAILED (exit 3)"), "{text}");
    assert!(
        text.contains(
            "note: silent: COMPLETED, no metrics.jsonl, and no `[report] line_pattern` to read"
        ),
        "{text}"
    );
    let md = std::fs::read_to_string(root.path().join("results/r/summary.md")).unwrap();
    assert!(
        md.contains("Runs without complete results")
            && md.contains("- failed: ")
            && md.contains("- silent: ")
            && md.contains("- torn: COMPLETED, the last line of metrics.jsonl is cut short"),
        "{md}"
    );
    // The results directory alone gives the same table.
    let out = run_ok(
        sweep(root.path())
            .arg("report")
            .arg(root.path().join("results/r"))
            .args(["--json", "--skip-first", "2", "--no-plots"]),
    );
    let again: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(again.len(), 4);
}

/// An imported log that cannot be read or is not UTF-8 is a run listed with
/// its reason, never an empty run that looks like one without metrics.
#[test]
fn unreadable_imported_logs_are_listed_with_their_reason() {
    let root = project();
    let logs = root.path().join("logs");
    let good = (1..=8)
        .map(|s| step_line(s, 2.0, 100.0, s as f64) + "\n")
        .collect::<String>();
    write(&logs.join("good.jsonl"), &good);
    std::fs::write(logs.join("latin1.jsonl"), b"{\"step\":1,\"loss\":\xe9}\n").unwrap();
    // A directory matching the glob cannot be read as a file.
    std::fs::create_dir_all(logs.join("dir.jsonl")).unwrap();
    let glob = format!("{}/*.jsonl", logs.display());
    let text = stdout(&run_ok(
        import_jsonl(root.path(), &glob, "imp").arg("--no-plots"),
    ));
    assert!(
        text.contains("note: latin1: COMPLETED, ")
            && text.contains("latin1.jsonl: 1 line(s) left out (line 1: invalid UTF-8 at byte 17)"),
        "{text}"
    );
    assert!(
        text.contains("note: dir: UNKNOWN")
            && text.contains("dir.jsonl is a directory, not a regular file"),
        "{text}"
    );
    assert!(!text.contains("note: good"), "{text}");
    let md = std::fs::read_to_string(root.path().join("results/imp/summary.md")).unwrap();
    assert!(
        md.contains("- latin1: COMPLETED, ") && md.contains("invalid UTF-8"),
        "{md}"
    );
}

#[test]
fn the_reference_ddp_logs_give_whole_job_throughput_and_scaling_efficiency() {
    let root = project();
    let rows = super::support::reference_ddp_report(root.path());
    for r in &rows {
        let name = r["run"].as_str().unwrap();
        let ws: f64 = name
            .split("_ws_")
            .nth(1)
            .unwrap()
            .split('_')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(r["world_size"].as_f64(), Some(ws), "{name}");
        let eff = r["scaling_efficiency_pct"].as_f64().unwrap();
        if ws == 4.0 {
            assert!(
                (eff - 100.0).abs() < 1e-9,
                "{name}: the smallest world size is the base"
            );
        } else {
            assert!(eff > 50.0 && eff < 100.0, "{name}: {eff}");
        }
        assert!(
            r["global_tokens_per_second"].as_f64().unwrap()
                > r["tokens_per_second_mean"].as_f64().unwrap() * ws * 0.8
        );
    }
    // Batch 8 scales better than batch 1 (communication per token shrinks).
    let eff = |name: &str| {
        rows.iter()
            .find(|r| r["run"].as_str().unwrap().starts_with(name))
            .unwrap()["scaling_efficiency_pct"]
            .as_f64()
            .unwrap()
    };
    assert!(
        eff("lsai_ddp_baseline_padded_ws_16_bs_8")
            > eff("lsai_ddp_baseline_padded_ws_16_bs_1") + 10.0
    );
    let md = std::fs::read_to_string(root.path().join("results/ddp/summary.md")).unwrap();
    assert!(
        md.contains("| Ranks | Global tokens/sec | Scaling efficiency % |"),
        "{md}"
    );
    for chart in ["scaling-throughput", "scaling-efficiency"] {
        assert!(
            root.path().join(format!("plots/ddp/{chart}.png")).is_file(),
            "{chart}"
        );
    }
}

#[test]
fn repeats_become_one_row_per_configuration_with_intervals_and_verdicts() {
    let root = project();
    let m = super::train::manifest(
        root.path(),
        "reps",
        "training_steps = 12\nsequence_length = 32",
        "[sweep]\nrepeats = 3\n[sweep.grid]\nbatch_size = [1, 4]\n[report]\nbaseline = \"batch_size-1\"\nskip_first = 2",
    );
    let plan = stdout(&run_ok(sweep(root.path()).arg("plan").arg(&m)));
    assert!(
        plan.contains("6 runs (2 configurations × 3 repeats)"),
        "{plan}"
    );
    run_ok(sweep(root.path()).arg("submit").arg(&m));
    let rows = json_rows(sweep(root.path()).args(["report", "--json"]).arg(&m));
    let names: Vec<&str> = rows.iter().map(|r| r["run"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["batch_size-1", "batch_size-4"],
        "one row per configuration"
    );
    for r in &rows {
        assert_eq!(r["repeats"], 3, "{r}");
        for metric in ["tokens_per_second", "mfu_pct"] {
            let (lo, mean, hi) = (
                r[format!("{metric}_ci95_low")].as_f64().unwrap(),
                r[format!("{metric}_mean")].as_f64().unwrap(),
                r[format!("{metric}_ci95_high")].as_f64().unwrap(),
            );
            assert!(lo < mean && mean < hi, "{metric}: {lo} {mean} {hi}");
        }
        assert_eq!(r["state"], "COMPLETED");
    }
    assert!(
        rows[0]["significant"].is_null() && rows[0]["speedup"] == 1.0,
        "the baseline"
    );
    let b4 = &rows[1];
    let (lo, s, hi) = (
        b4["speedup_ci95_low"].as_f64().unwrap(),
        b4["speedup"].as_f64().unwrap(),
        b4["speedup_ci95_high"].as_f64().unwrap(),
    );
    assert!(lo < s && s < hi, "{b4}");
    // One comparison in the family: Holm's p is the plain one, and the
    // verdict agrees with the interval.
    let (p, p_holm) = (
        b4["speedup_p_value"].as_f64().unwrap(),
        b4["speedup_p_value_holm"].as_f64().unwrap(),
    );
    assert!((p - p_holm).abs() < 1e-12, "{b4}");
    assert_eq!(b4["significant"].as_bool(), Some(p_holm < 0.05));
    assert_eq!(b4["significant"].as_bool(), Some(lo > 1.0 || hi < 1.0));
    let csv = std::fs::read_to_string(root.path().join("results/reps/summary.csv")).unwrap();
    let header = csv.lines().next().unwrap();
    for col in [
        "tokens_per_second_ci95_low",
        "tokens_per_second_ci95_high",
        "mfu_pct_ci95_low",
        "mfu_pct_ci95_high",
        "speedup_ci95_low",
        "speedup_ci95_high",
        "speedup_p_value",
        "speedup_p_value_holm",
        "repeats",
        "significant",
    ] {
        assert!(
            header.split(',').any(|h| h == col),
            "{col} missing from {header}"
        );
    }
    let md = std::fs::read_to_string(root.path().join("results/reps/summary.md")).unwrap();
    assert!(
        md.contains("| batch_size-4 | 3 | ") && md.contains(" ± "),
        "{md}"
    );

    // sweep compare: the same measurements on both sides are no difference
    // (the copy of a study directory: its runs and what it records of its
    // manifest, whose report settings both sides use).
    let results = root.path().join("results");
    std::fs::create_dir_all(results.join("reps-copy")).unwrap();
    std::fs::copy(
        results.join("reps/study.json"),
        results.join("reps-copy/study.json"),
    )
    .unwrap();
    for e in std::fs::read_dir(results.join("reps")).unwrap() {
        let run = e.unwrap().path();
        if run.join("run.json").is_file() {
            let to = results.join("reps-copy").join(run.file_name().unwrap());
            std::fs::create_dir_all(&to).unwrap();
            // Its records too: a run whose state is unknown is no measurement.
            for f in std::fs::read_dir(&run).unwrap() {
                let f = f.unwrap().path();
                if f.is_file() {
                    std::fs::copy(&f, to.join(f.file_name().unwrap())).unwrap();
                }
            }
        }
    }
    let out = stdout(&run_ok(
        sweep(root.path())
            .arg("compare")
            .arg(results.join("reps-copy"))
            .arg(results.join("reps")),
    ));
    assert!(out.contains("have the same configuration"), "{out}");
    for config in ["batch_size-1", "batch_size-4"] {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("| {config} |")))
            .unwrap();
        assert!(
            // The same runs on both sides: never a change; `unchanged` only
            // where their spread puts the whole interval within 3%.
            line.contains("≈1.00x")
                && (line.ends_with("| unchanged |") || line.ends_with("| inconclusive |")),
            "{out}"
        );
    }
    let csv =
        std::fs::read_to_string(results.join("compare/reps-copy-vs-reps/comparison.csv")).unwrap();
    assert!(
        csv.starts_with("configuration,a_tokens_per_second_mean,"),
        "{csv}"
    );
    assert!(root
        .path()
        .join("plots/compare/reps-copy-vs-reps/comparison.png")
        .is_file());
}

/// Logs that are broken, special or hostile: each is listed among the
/// problems of `sweep report` and `sweep compare`, the good lines of a log
/// are used, nothing blocks or reads without bound, and no table shows a
/// value that is not a number.
#[test]
fn broken_special_and_hostile_logs_are_listed_and_nothing_blocks() {
    let root = project();
    let m = root.path().join("h.toml");
    let body = (1..=8)
        .map(|s| step_line(s, 10.0 - s as f64 * 0.1, 100.0 + s as f64, s as f64))
        .collect::<Vec<_>>()
        .join("\\\\n")
        .replace('"', "\\\"");
    write(
        &m,
        &format!(
            r#"name = "h"
executor = "local"
command = "printf '{body}\\n' > \"$SWEEP_RUN_DIR/metrics.jsonl\""
[sweep.grid]
kind = ["good", "badbyte", "garbage", "absurd", "fifo", "huge", "outside", "devzero"]
[local]
parallel = 2
"#
        ),
    );
    run_ok(sweep(root.path()).arg("submit").arg(&m));
    let dir = |k: &str| root.path().join("results/h").join(k);
    let log = |k: &str| dir(k).join("metrics.jsonl");
    let lines = |k: &str| -> Vec<Vec<u8>> {
        std::fs::read(log(k))
            .unwrap()
            .split(|&b| b == b'\n')
            .map(<[u8]>::to_vec)
            .collect()
    };
    let join = |ls: Vec<Vec<u8>>| ls.join(&b'\n');
    // One byte that is not UTF-8 in line 3.
    let mut l = lines("badbyte");
    l[2][1] = 0xff;
    std::fs::write(log("badbyte"), join(l)).unwrap();
    // Garbage in the middle.
    let mut l = lines("garbage");
    l.insert(4, b"not json at all".to_vec());
    std::fs::write(log("garbage"), join(l)).unwrap();
    // Numbers no run logs: 1e308 tokens/s, and 1e999 (not even an f64).
    let mut l = lines("absurd");
    l[5] = String::from_utf8(l[5].clone())
        .unwrap()
        .replace("\"tokens_per_second\":106.0", "\"tokens_per_second\":1e308")
        .into_bytes();
    l[6] = String::from_utf8(l[6].clone())
        .unwrap()
        .replace("\"loss\":9.3", "\"loss\":1e999")
        .into_bytes();
    std::fs::write(log("absurd"), join(l)).unwrap();
    // A FIFO with no writer (reading it would block forever).
    std::fs::remove_file(log("fifo")).unwrap();
    super::support::mkfifo(&log("fifo"));
    // 2 GiB (sparse: nothing is written, nothing may be read).
    std::fs::OpenOptions::new()
        .write(true)
        .open(log("huge"))
        .unwrap()
        .set_len(2 << 30)
        .unwrap();
    // Links out of the study: a file elsewhere, and /dev/zero.
    let elsewhere = root.path().join("elsewhere.jsonl");
    std::fs::copy(log("good"), &elsewhere).unwrap();
    for (k, target) in [
        ("outside", elsewhere.as_path()),
        ("devzero", Path::new("/dev/zero")),
    ] {
        std::fs::remove_file(log(k)).unwrap();
        std::os::unix::fs::symlink(target, log(k)).unwrap();
    }

    let report = |args: &[&std::ffi::OsStr]| {
        let mut child = sweep(root.path())
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let started = std::time::Instant::now();
        while child.try_wait().unwrap().is_none() {
            if started.elapsed().as_secs() > 120 {
                child.kill().unwrap();
                panic!("`sweep {args:?}` blocks");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let text = report(&["report".as_ref(), m.as_os_str(), "--no-plots".as_ref()]);
    for want in [
        "note: badbyte: COMPLETED, ",
        "metrics.jsonl: 1 line(s) left out (line 3: invalid UTF-8 at byte 1)",
        "note: garbage: COMPLETED, ",
        "1 line(s) left out (line 5: not JSON",
        "`tokens_per_second` left out on 1 line(s), not a value a run can log (line 6: 1e308)",
        "(line 7: not JSON (number out of range",
        "note: fifo: COMPLETED, ",
        "is a FIFO, not a regular file",
        "note: huge: COMPLETED, ",
        "is 2147.5 MB, more than the 1074 MB a file read here may have",
        "note: outside: COMPLETED, ",
        "elsewhere.jsonl, outside",
        "note: devzero: COMPLETED, ",
        "is a link to /dev/zero, outside",
    ] {
        assert!(text.contains(want), "`{want}` missing from:\n{text}");
    }
    assert!(!text.contains("note: good"), "{text}");
    let md = std::fs::read_to_string(root.path().join("results/h/summary.md")).unwrap();
    for table_line in md.lines().filter(|l| l.starts_with('|')) {
        let lower = table_line.to_lowercase();
        assert!(
            !lower.contains("inf") && !lower.contains("nan") && !lower.contains("e+"),
            "{table_line}"
        );
    }
    // Rows keep their good lines: 7 of badbyte's 8 steps, all 8 of garbage's.
    let json = report(&[
        "report".as_ref(),
        m.as_os_str(),
        "--json".as_ref(),
        "--skip-first".as_ref(),
        "0".as_ref(),
        "--no-plots".as_ref(),
    ]);
    let rows: Vec<Value> = serde_json::from_str(&json).unwrap();
    let points = |n: &str| rows.iter().find(|r| r["run"] == n).unwrap()["points"].as_u64();
    assert_eq!(
        (points("good"), points("badbyte"), points("garbage")),
        (Some(8), Some(7), Some(8))
    );

    // A copy whose run.json is cut short, compared with the original: both
    // sides' problems are printed, the cut record among them.
    let copy = root.path().join("results/h-copy");
    std::fs::create_dir_all(&copy).unwrap();
    for k in ["good", "badbyte"] {
        std::fs::create_dir_all(copy.join(k)).unwrap();
        for f in ["run.json", "metrics.jsonl"] {
            std::fs::copy(dir(k).join(f), copy.join(k).join(f)).unwrap();
        }
    }
    let record = std::fs::read(copy.join("good/run.json")).unwrap();
    std::fs::write(copy.join("good/run.json"), &record[..record.len() / 2]).unwrap();
    let text = report(&[
        "compare".as_ref(),
        root.path().join("results/h").as_os_str(),
        copy.as_os_str(),
        "--no-plots".as_ref(),
    ]);
    assert!(
        text.contains("## Problems in h\n") && text.contains("## Problems in h-copy\n"),
        "{text}"
    );
    assert!(
        text.contains("- good: UNKNOWN, ") && text.contains("run.json is not a valid run record"),
        "{text}"
    );
    assert!(text.contains("is a FIFO, not a regular file"), "{text}");
    assert!(!text.to_lowercase().contains("infx"), "{text}");
}

/// `sweep report --import GLOB --log-format jsonl --name NAME`, run in `root`.
fn import_jsonl(root: &Path, glob: &str, name: &str) -> std::process::Command {
    let mut cmd = sweep(root);
    cmd.args([
        "report",
        "--import",
        glob,
        "--log-format",
        "jsonl",
        "--name",
        name,
    ]);
    cmd
}

/// One log file in `<root>/logs`, and the glob that imports it.
fn one_log(root: &Path, name: &str, text: &str) -> String {
    let logs = root.join("logs");
    write(&logs.join(name), text);
    format!("{}/*.jsonl", logs.display())
}

/// The flags that say how imported logs are read are refused without
/// `--import`: a study's runs are read as its manifest says, and a
/// `--pattern` given beside it would otherwise be dropped in silence.
#[test]
fn flags_for_imported_logs_need_import() {
    let root = project();
    for flags in [
        &["--pattern", "step (?P<step>\\d+)"][..],
        &["--name", "other"],
        &["--log-format", "jsonl"],
        &["--gpu", "H100"],
    ] {
        let err = run_err(sweep(root.path()).args(["report", "results/s"]).args(flags));
        assert!(err.contains("--import"), "{flags:?}: {err}");
    }
}

/// `--name` becomes a directory under results/ and plots/: a path there is
/// refused before anything is written.
#[test]
fn report_names_cannot_leave_the_results_directory() {
    let root = project();
    let glob = one_log(
        root.path(),
        "a.jsonl",
        &(step_line(1, 2.0, 100.0, 1.0) + "\n"),
    );
    let outside = root.path().join("outside");
    for name in ["../../outside", outside.to_str().unwrap(), "..", ""] {
        let err = run_err(&mut import_jsonl(&root.path().join("logs"), &glob, name));
        assert!(err.contains("--name"), "{err}");
    }
    assert!(!outside.exists() && !root.path().join("results").exists());
    assert!(std::fs::read_dir(root.path().parent().unwrap())
        .unwrap()
        .all(|e| e.unwrap().file_name() != "outside"));
}

/// Control characters and markdown in names read from files reach neither
/// the terminal nor summary.md raw.
#[test]
fn names_from_files_are_printed_as_text() {
    let root = project();
    let glob = one_log(
        root.path(),
        "evil|name\u{1b}[31m.jsonl",
        &(step_line(1, 2.0, 100.0, 1.0) + "\ngarbage\n"),
    );
    let out = run_ok(import_jsonl(root.path(), &glob, "evil").arg("--no-plots"));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.contains('\u{1b}'), "{text:?}");
    assert!(text.contains("evil\\|name\\u{1b}[31m"), "{text}");
    let md = std::fs::read_to_string(root.path().join("results/evil/summary.md")).unwrap();
    assert!(!md.contains('\u{1b}'), "{md:?}");
    // As many cells as the header: no `|` of the name splits one.
    let pipes = |l: &str| l.replace("\\|", "").matches('|').count();
    let header = md
        .lines()
        .find(|l| l.starts_with("| Configuration"))
        .unwrap();
    let row = md.lines().find(|l| l.starts_with("| evil")).unwrap();
    assert_eq!(pipes(row), pipes(header), "{row}");
}

/// A study compared with itself is an error that says what to compare instead.
#[test]
fn compare_refuses_a_study_compared_with_itself() {
    let root = super::support::project();
    std::fs::create_dir_all(root.path().join("results/same")).unwrap();
    let o = super::support::sweep(root.path())
        .args(["compare", "results/same", "./results/../results/same"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("are the same study"),
        "{err}"
    );
}

/// Another program's logs with `--pattern` alone: the pattern says how to
/// read them (it used to be dropped for the reference format, every run "no
/// step lines"); with a format of another kind it is an error.
#[test]
fn a_pattern_reads_imported_logs_without_naming_its_format() {
    let root = project();
    let logs = root.path().join("logs");
    let text: String = (1..=8)
        .map(|s| {
            format!(
                "it {s} loss {:.2} speed {}\n",
                9.0 - s as f64 * 0.5,
                100 * s
            )
        })
        .collect();
    write(&logs.join("a.log"), &text);
    // A progress bar's log (tqdm's in a SLURM job): every update redrawn
    // with a carriage return, the epoch's updates one line of the file.
    let bar: String = (1..=8)
        .map(|s| {
            format!(
                "\rit {s} loss {:.2} speed {}",
                9.0 - s as f64 * 0.5,
                200 * s
            )
        })
        .chain(["\n".to_string()])
        .collect();
    write(&logs.join("b.log"), &bar);
    let glob = format!("{}/*.log", logs.display());
    let pattern = r"it (?P<step>\d+) loss (?P<loss>[\d.]+) speed (?P<tokens_per_second>\d+)";
    let rows = json_rows(
        sweep(root.path())
            .args(["report", "--import", &glob, "--pattern", pattern])
            .args([
                "--name",
                "other",
                "--skip-first",
                "2",
                "--json",
                "--no-plots",
            ]),
    );
    // Points 3..8: mean of 300..800, and of 600..1600.
    assert_eq!(
        (
            rows[0]["tokens_per_second_mean"].as_f64(),
            rows[1]["tokens_per_second_mean"].as_f64()
        ),
        (Some(550.0), Some(1100.0)),
        "{rows:?}"
    );
    let refused = sweep(root.path())
        .args(["report", "--import", &glob, "--pattern", pattern])
        .args(["--log-format", "jsonl", "--name", "other", "--no-plots"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("--log-format jsonl") && err.contains("--pattern"),
        "{err}"
    );
}

/// torchtitan's metrics line, as a SLURM job logs it: each field in its own
/// colour, tokens/s grouped in thousands (`tps: 16,000`), the rank's prefix.
/// A pattern written for the plain text reads every step.
#[test]
fn a_torchtitan_log_is_read_through_its_colours_and_thousands() {
    let root = project();
    let log = root.path().join("logs/titan.log");
    let text: String = (1..=8)
        .map(|s| {
            format!(
                "[rank0]:[titan] 2026-11-29 12:00:{s:02},123 - root - INFO - \x1b[31mstep: {s:2}  \x1b[32mloss: {:7.4}  \x1b[33mmemory: 31.52GiB(39.88%)  \x1b[34mtps: {}  \x1b[36mtflops: 1,316.23  \x1b[35mmfu: 31.97%\x1b[39m\n",
                9.0 - s as f64 * 0.5,
                match s {
                    1 => "980".to_string(),
                    s => format!("1{},000", s + 10),
                }
            )
        })
        .collect();
    write(&log, &text);
    let pattern = r"step:\s+(?P<step>\d+)\s+loss:\s+(?P<loss>[\d.]+)\s+memory:\s+\S+\s+tps: (?P<tokens_per_second>[\d,]+)\s+tflops: (?P<tflops>[\d,.]+)\s+mfu: (?P<mfu_pct>[\d.]+)%";
    let rows = json_rows(
        sweep(root.path())
            .args([
                "report",
                "--import",
                log.to_str().unwrap(),
                "--pattern",
                pattern,
            ])
            .args([
                "--name",
                "titan",
                "--skip-first",
                "2",
                "--json",
                "--no-plots",
            ]),
    );
    // Steps 3..8: 113,000 .. 118,000 tokens/s.
    assert_eq!(
        rows[0]["tokens_per_second_mean"].as_f64(),
        Some(115_500.0),
        "{rows:?}"
    );
    assert_eq!(rows[0]["tflops_mean"].as_f64(), Some(1316.23), "{rows:?}");
    assert_eq!(rows[0]["mfu_pct_mean"].as_f64(), Some(31.97), "{rows:?}");
}

/// A log imported from a program that says only its step's time (nanoGPT's
/// `iter 10: loss 4.55, time 80.00ms`) gets tokens/s from the flags that are
/// a command study's `[report]` keys, and TFLOP/s and MFU from its FLOPs per
/// token and peak; a flag that cannot be is refused by its name.
#[test]
fn an_imported_log_of_step_times_gets_tokens_per_second_and_mfu_from_flags() {
    let root = project();
    let log = root.path().join("logs/nano.log");
    let text: String = (0..=20)
        .map(|s| {
            format!(
                "iter {s}: loss {:.4}, time {}ms, mfu -100.00%\n",
                9.0 - s as f64 * 0.1,
                if s % 2 == 0 { "80.00" } else { "80.0" }
            )
        })
        .collect();
    write(&log, &text);
    let pattern = r"iter (?P<step>\d+): loss (?P<loss>[\d.]+), time (?P<time_ms>[\d.]+)ms";
    let import = |extra: &[&str]| {
        let mut c = sweep(root.path());
        c.args([
            "report",
            "--import",
            log.to_str().unwrap(),
            "--pattern",
            pattern,
        ])
        .args(["--name", "nano", "--json", "--no-plots"])
        .args(extra);
        c
    };
    let rows = json_rows(&mut import(&[
        "--step-time",
        "time_ms",
        "--tokens-per-step",
        "8192",
        "--flops-per-token",
        "6e9",
        "--peak-flops",
        "1e15",
    ]));
    let near = |key: &str, want: f64| {
        let got = rows[0][key].as_f64().unwrap_or(f64::NAN);
        assert!(
            (got - want).abs() <= 1e-9 * want,
            "{key}: {got} against {want}: {rows:?}"
        );
    };
    // 8192 tokens in 80 ms; × 6e9 FLOPs per token; ÷ 1e15 FLOP/s.
    near("tokens_per_second_mean", 102_400.0);
    near("tflops_mean", 614.4);
    near("mfu_pct_mean", 61.44);
    near("final_loss", 7.0);
    // Without the flags the same log has a loss and no speed.
    let bare = json_rows(&mut import(&[]));
    assert!(bare[0]["tokens_per_second_mean"].is_null(), "{bare:?}");
    for (flags, said) in [
        (&["--tokens-per-step", "8192"][..], "--tokens-per-step: "),
        (&["--step-time", "loss"][..], "--step-time: "),
        (
            &["--gpu", "H1000"][..],
            "--gpu: the device table does not know `H1000`",
        ),
        (
            &["--peak-flops", "1e15", "--gpu", "H100"][..],
            "--peak-flops: ",
        ),
        (&["--model", "ref-1b"][..], "--model: "),
        (&["--charts", "step"][..], "--charts: "),
    ] {
        let err = run_err(&mut import(flags));
        assert!(err.contains(said), "{flags:?}: {err}");
    }
}

/// Megatron-LM's log line, read by the pattern docs/report.md gives for it:
/// tokens/s from its step time, MFU from its own TFLOP/s and the device
/// alone, its loss in Megatron's `9.876543E+00`.
#[test]
fn a_megatron_log_gets_mfu_from_its_own_tflops_and_the_device() {
    let root = project();
    let docs =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/report.md"))
            .unwrap();
    let pattern = docs
        .lines()
        .find_map(|l| l.strip_prefix("line_pattern = 'iteration"))
        .map(|rest| format!("iteration{}", rest.trim_end_matches('\'')))
        .expect("docs/report.md gives Megatron's pattern");
    let log = root.path().join("logs/megatron.out");
    let text: String = (1..=12)
        .map(|i| {
            format!(
                " [2026-11-29 12:00:{i:02}] iteration {i:8}/    1000 | consumed samples: {:12} | elapsed time per iteration (ms): 500.0 | throughput per GPU (TFLOP/s/GPU): 400.0 | learning rate: 1.500000E-04 | global batch size:    64 | lm loss: {:.6E} | loss scale: 1.0 | grad norm: 3.210 | number of skipped iterations:   0 | number of nan iterations:   0 |\n",
                i * 64,
                10.0 - i as f64 * 0.25
            )
        })
        .collect();
    write(&log, &text);
    let rows = json_rows(
        sweep(root.path())
            .args([
                "report",
                "--import",
                log.to_str().unwrap(),
                "--pattern",
                &pattern,
            ])
            .args([
                "--step-time",
                "iter_ms",
                "--tokens-per-step",
                "16384",
                "--gpu",
                "H100",
            ])
            .args(["--name", "megatron", "--json", "--no-plots"]),
    );
    let r = &rows[0];
    assert_eq!(
        r["tokens_per_second_mean"].as_f64(),
        Some(16384.0 / 0.5),
        "{r}"
    );
    assert_eq!(r["tflops_mean"].as_f64(), Some(400.0), "{r}");
    let mfu = r["mfu_pct_mean"].as_f64().expect("an MFU");
    assert!((mfu - 100.0 * 400e12 / 989e12).abs() < 1e-9, "{r}");
    assert_eq!(r["final_loss"].as_f64(), Some(7.0), "{r}");
}

/// A report of a manifest reads each planned run as `render` recorded it:
/// a run added to the manifest since is unsubmitted, not yet rendered, and
/// a directory that holds a run of an earlier version of the manifest is a
/// problem, not that run's figures.
#[test]
fn a_manifest_report_reads_what_render_recorded() {
    let (root, m) = (project(), Path::new("m.toml"));
    let line = step_line(1, 3.0, 100.0, 1.0).replace('"', "\\\"");
    let manifest = |extra: &str, sizes: &str| {
        format!(
            r#"name = "v"
executor = "local"
command = """printf '{line}\n' > "$SWEEP_RUN_DIR/metrics.jsonl"; echo {extra}"""
[sweep.grid]
size = [{sizes}]
[report]
skip_first = 0
"#
        )
    };
    write(&root.path().join(m), &manifest("one", "1, 2"));
    run_ok(sweep(root.path()).arg("run").arg(m));
    // The same names, another command (other ids), and a third run.
    write(&root.path().join(m), &manifest("two", "1, 2, 3"));
    let rows = json_rows(
        sweep(root.path())
            .arg("report")
            .arg(m)
            .args(["--json", "--no-plots"]),
    );
    assert_eq!(rows.len(), 3, "{rows:?}");
    let text = stdout(&run_ok(
        sweep(root.path()).arg("report").arg(m).arg("--no-plots"),
    ));
    assert!(
        text.contains("of another version of the manifest: `sweep render` it again"),
        "{text}"
    );
    assert!(text.contains("not rendered yet"), "{text}");
    for row in &rows {
        assert!(
            row["tokens_per_second_mean"].is_null(),
            "figures of another run were reported as this manifest's: {row}"
        );
    }
}

/// Peak memory, watts and joules per token are columns (mean and
/// interval), in the markdown table and a chart, for the built-in trainer's
/// logs and any program whose log lines name them; a command run whose log
/// has no clock gets its wall time from its executor.
#[test]
fn peak_memory_energy_and_wall_time_reach_the_tables_and_charts() {
    let (root, m) = (project(), Path::new("m.toml"));
    write(
        &root.path().join(m),
        r#"name = "mem"
executor = "local"
command = """for s in 1 2 3 4; do echo "step $s tps {{ tps }} mem {{ mem }} w 350 j {{ 350 / tps }}"; done; sleep 1"""
[sweep.grid]
tps = [100, 200]
mem = [512, 2048]
[report]
skip_first = 0
line_pattern = 'step (?P<step>\d+) tps (?P<tokens_per_second>[0-9.]+) mem (?P<peak_memory_mb>[0-9.]+) w (?P<watts>[0-9.]+) j (?P<joules_per_token>[0-9.]+)'
"#,
    );
    run_ok(sweep(root.path()).arg("run").arg(m));
    let rows = json_rows(sweep(root.path()).arg("report").arg(m).arg("--json"));
    assert_eq!(rows.len(), 4);
    for r in &rows {
        let mem = r["mem"].as_f64().unwrap();
        assert_eq!(r["peak_memory_mb_mean"].as_f64(), Some(mem), "{r}");
        assert!(r.get("peak_memory_mb_ci95_low").is_some(), "{r}");
        let tps = r["tps"].as_f64().unwrap();
        assert_eq!(r["watts_mean"].as_f64(), Some(350.0), "{r}");
        assert_eq!(
            r["joules_per_token_mean"].as_f64(),
            Some(350.0 / tps),
            "{r}"
        );
        let wall = r["wall_time_s"].as_f64().unwrap_or(0.0);
        assert!(
            (1.0..60.0).contains(&wall),
            "wall time from local.json: {r}"
        );
    }
    let md = std::fs::read_to_string(root.path().join("results/mem/summary.md")).unwrap();
    assert!(
        md.contains("Peak memory (MB)") && md.contains("2048"),
        "{md}"
    );
    assert!(md.contains("Joules/token") && md.contains("1.7500"), "{md}");
    assert!(root.path().join("plots/mem/peak-memory.png").exists());
    assert!(root.path().join("plots/mem/energy.png").exists());
    let page = std::fs::read_to_string(root.path().join("results/mem/report.html")).unwrap();
    assert!(page.contains("Peak memory (MB)"));
    assert!(page.contains("Joules/token") && page.contains("Watts"));
}

/// `sweep report results/<study>` reads the manifest's settings from the
/// study directory (its baseline gives speedups), lists a directory an
/// earlier version of the manifest left as stale instead of averaging it
/// in, and a `--group-by` report writes beside the main one.
#[test]
fn a_study_directory_reports_as_its_manifest_and_groupings_write_beside_it() {
    let (root, m) = (project(), Path::new("m.toml"));
    let line = |tps: &str| {
        step_line(1, 3.0, 100.0, 1.0)
            .replace("100.0", tps)
            .replace("\"batch_size\":1,", "\"batch_size\":{{ size }},")
            .replace('"', "\\\"")
    };
    let manifest = |sizes: &str| {
        format!(
            r#"name = "dir"
executor = "local"
command = """printf '{}\n' > "$SWEEP_RUN_DIR/metrics.jsonl" """
[sweep]
name = "s{{{{ size }}}}-{{{{ kind }}}}"
[sweep.grid]
size = [{sizes}]
kind = ["a", "b"]
[report]
skip_first = 0
baseline = "s1-a"
"#,
            line("{{ size * 100 }}")
        )
    };
    write(&root.path().join(m), &manifest("1, 2"));
    run_ok(sweep(root.path()).arg("run").arg(m));
    // The next version drops size 2: its two directories stay behind.
    write(&root.path().join(m), &manifest("1, 3"));
    run_ok(sweep(root.path()).arg("run").arg(m));
    let dir = root.path().join("results/dir");
    let rows = json_rows(
        sweep(root.path())
            .arg("report")
            .arg(&dir)
            .args(["--json", "--no-plots"]),
    );
    let names: Vec<&str> = rows.iter().map(|r| r["run"].as_str().unwrap()).collect();
    assert_eq!(names.len(), 4, "{names:?}");
    assert!(!names.iter().any(|n| n.starts_with("s2-")), "{names:?}");
    let speedup = |n: &str| rows.iter().find(|r| r["run"] == n).unwrap()["speedup"].as_f64();
    assert_eq!(speedup("s1-a"), Some(1.0));
    assert_eq!(speedup("s3-b"), Some(3.0));
    let text = stdout(&run_ok(
        sweep(root.path()).arg("report").arg(&dir).arg("--no-plots"),
    ));
    assert!(
        text.contains("s2-a: STALE") && text.contains("earlier version"),
        "{text}"
    );
    // A grouping on the command line leaves the main report as it was.
    let main = std::fs::read_to_string(dir.join("summary.md")).unwrap();
    run_ok(
        sweep(root.path())
            .arg("report")
            .arg(&dir)
            .args(["--group-by", "kind", "--no-plots"]),
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("summary.md")).unwrap(),
        main
    );
    let grouped = std::fs::read_to_string(dir.join("grouped/kind/summary.md")).unwrap();
    assert!(grouped.contains("kind"), "{grouped}");
    assert!(dir.join("grouped/kind/report.html").is_file());
    // A group over batch sizes 1 and 3 says so, not "3"; the manifest's
    // baseline run names its group.
    let row = grouped
        .lines()
        .find(|l| l.starts_with("| kind=b |"))
        .unwrap_or_else(|| panic!("{grouped}"));
    assert!(row.contains("| 1–3 |"), "{grouped}");
    assert!(
        row.contains("| 1.00x") || row.contains("1.00x ["),
        "{grouped}"
    );
    // A baseline that names nothing lists what does.
    let err = run_err(sweep(root.path()).arg("report").arg(&dir).args([
        "--group-by",
        "kind",
        "--no-plots",
        "--baseline",
        "kind=c",
    ]));
    assert!(
        err.contains("no row, configuration or run named `kind=c`")
            && err.contains("`kind=a`, `kind=b`"),
        "{err}"
    );
}

/// A program's own log fields: every named group of the line pattern is a
/// column (`grad_norm_mean`, its interval, charted on request), the groups
/// `[report]` names as memory and throughput fill those columns (GiB made
/// MB), and FLOPs per token with a device give TFLOPs and MFU. A study
/// whose log has none of that shows no MFU column at all.
#[test]
fn a_programs_own_fields_become_columns_and_its_flops_are_computed() {
    let (root, m) = (project(), Path::new("m.toml"));
    write(
        &root.path().join(m),
        r#"name = "foreign"
executor = "local"
command = """for s in 1 2 3 4; do echo "it $s: {{ tps }} tok/s mem {{ mem }} GiB gn 0.$s"; done"""
[sweep.grid]
tps = [100, 200]
mem = [1, 2]
[report]
skip_first = 0
line_pattern = 'it (?P<step>\d+): (?P<tok_s>[0-9.]+) tok/s mem (?P<mem_gib>[0-9.]+) GiB gn (?P<grad_norm>[0-9.]+)'
memory = "mem_gib"
throughput = "tok_s"
charts = ["grad_norm"]
flops_per_token = 6e9
gpu = "H100"
"#,
    );
    run_ok(sweep(root.path()).arg("run").arg(m));
    let check = |rows: &[serde_json::Value]| {
        assert_eq!(rows.len(), 4);
        for r in rows {
            let (tps, mem) = (r["tps"].as_f64().unwrap(), r["mem"].as_f64().unwrap());
            let close = |k: &str, want: f64| {
                let got = r[k].as_f64().unwrap_or(f64::NAN);
                assert!(
                    (got - want).abs() < 1e-6 * want.abs().max(1.0),
                    "{k}: {got} vs {want}: {r}"
                );
            };
            close("tokens_per_second_mean", tps);
            close("peak_memory_mb_mean", mem * 1024.0);
            close("grad_norm_mean", 0.25);
            close("tflops_mean", tps * 6e9 / 1e12);
            close("mfu_pct_mean", 100.0 * tps * 6e9 / 989e12);
            close("mfu_peak_tflops", 989.0);
            assert!(r["grad_norm_ci95_low"].as_f64().is_some(), "{r}");
        }
    };
    check(&json_rows(
        sweep(root.path()).arg("report").arg(m).arg("--json"),
    ));
    // The study directory reads its logs as the manifest said.
    check(&json_rows(
        sweep(root.path())
            .arg("report")
            .arg("results/foreign")
            .args(["--json", "--no-plots"]),
    ));
    let md = std::fs::read_to_string(root.path().join("results/foreign/summary.md")).unwrap();
    assert!(
        md.contains("| grad_norm |") && md.contains("| MFU % |"),
        "{md}"
    );
    assert!(
        md.contains("MFU is measured against a peak of 989.0 TFLOP/s"),
        "{md}"
    );
    assert!(root
        .path()
        .join("plots/foreign/field-grad_norm.png")
        .is_file());

    // Tokens/s alone: no MFU, TFLOPs or memory columns of dashes.
    let plain = Path::new("plain.toml");
    write(
        &root.path().join(plain),
        r#"name = "plain"
executor = "local"
command = """for s in 1 2 3; do echo "it $s: {{ tps }} tok/s"; done"""
[sweep.grid]
tps = [100, 200]
[report]
skip_first = 0
line_pattern = 'it (?P<step>\d+): (?P<tokens_per_second>[0-9.]+) tok/s'
"#,
    );
    run_ok(sweep(root.path()).arg("run").arg(plain));
    let md = std::fs::read_to_string(root.path().join("results/plain/summary.md")).unwrap();
    let header = md
        .lines()
        .find(|l| l.starts_with("| Configuration |"))
        .unwrap();
    for hidden in [
        "MFU %",
        "TFLOPs",
        "Training tokens %",
        "Peak memory",
        "Joules/token",
        "Watts",
    ] {
        assert!(!header.contains(hidden), "{header}");
    }
    assert!(header.contains("Tokens/sec"), "{header}");
    // A role that names no group is refused at plan time.
    write(
        &root.path().join(plain),
        &std::fs::read_to_string(root.path().join(plain))
            .unwrap()
            .replace("skip_first = 0", "skip_first = 0\nmemory = \"mem\""),
    );
    let err = run_err(sweep(root.path()).arg("plan").arg(plain));
    assert!(err.contains("`memory = \"mem\"` names no group"), "{err}");
}

/// `sweep compare` names both studies and says what differs between their
/// runs: here the command a configuration ran.
#[test]
fn compare_names_both_studies_and_what_differs() {
    let (root, m) = (project(), Path::new("m.toml"));
    let manifest = |tps: u32| {
        format!(
            r#"name = "cmpd"
executor = "local"
command = """for s in 1 2 3 4; do echo "it $s: {tps} tok/s"; done"""
[sweep.grid]
kind = ["x", "y"]
[report]
skip_first = 0
line_pattern = 'it (?P<step>\d+): (?P<tokens_per_second>[0-9.]+) tok/s'
"#
        )
    };
    write(&root.path().join(m), &manifest(100));
    run_ok(sweep(root.path()).arg("run").arg(m));
    let results = root.path().join("results");
    run_ok(
        std::process::Command::new("mv")
            .arg(results.join("cmpd"))
            .arg(results.join("cmpd-before")),
    );
    write(&root.path().join(m), &manifest(200));
    run_ok(sweep(root.path()).arg("run").arg(m));
    let out = stdout(&run_ok(
        sweep(root.path())
            .arg("compare")
            .arg(results.join("cmpd-before"))
            .arg(results.join("cmpd")),
    ));
    assert!(
        out.contains("A: cmpd-before") && out.contains("B: cmpd"),
        "{out}"
    );
    assert!(out.contains("## What differs"), "{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with("| command |"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        line.contains("100 tok/s") && line.contains("200 tok/s") && line.ends_with("| all |"),
        "{out}"
    );
    let page = std::fs::read_to_string(results.join("compare/cmpd-before-vs-cmpd/comparison.html"))
        .unwrap();
    assert!(
        page.contains("What differs") && page.contains("A: cmpd-before"),
        "{page}"
    );
}

/// Imported files with the same stem in different directories are runs of
/// their own, named by their paths below the files' common directory.
#[test]
fn imported_files_with_one_stem_are_named_by_their_paths() {
    let root = project();
    let logs = root.path().join("logs");
    for (node, tps) in [("node1", 100.0), ("node2", 300.0)] {
        let lines: Vec<String> = (1..=3).map(|s| step_line(s, 3.0, tps, s as f64)).collect();
        write(
            &logs.join(node).join("local.jsonl"),
            &(lines.join("\n") + "\n"),
        );
    }
    let glob = format!("{}/*/local.jsonl", logs.display());
    let rows = json_rows(import_jsonl(root.path(), &glob, "nodes").args([
        "--json",
        "--skip-first",
        "0",
        "--no-plots",
    ]));
    let names: Vec<&str> = rows.iter().map(|r| r["run"].as_str().unwrap()).collect();
    assert_eq!(names, ["node1/local", "node2/local"]);
    assert_eq!(rows[1]["tokens_per_second_mean"].as_f64(), Some(300.0));
}

/// A blocked study whose blocks ran at very different speeds (1000, 1300
/// and 1600 tokens/s: three nodes), configuration `b` 5% faster than `a`
/// in each: paired by block, the speedup's interval is tight around 1.05
/// and significant; the table says the analysis is blocked.
#[test]
fn a_blocked_study_pairs_its_speedups_by_block() {
    let root = project();
    let m = root.path().join("b.toml");
    write(
        &m,
        r#"name = "paired"
executor = "local"
command = """
speed=$(( 1000 + 300 * {{ repeat }} ))
for s in 1 2 3 4 5 6 7 8; do
  awk -v v="$speed" -v f="{{ factor }}" -v s="$s" 'BEGIN { printf "step %d: %.2f tokens/s\\n", s, v * f * (1 + ((s * 7) % 5 - 2) / 1000) }'
done
"""
[sweep]
repeats = 3
design = "blocks"
order_seed = 5
[sweep.grid]
factor = [1.0, 1.05]
[report]
baseline = "factor-1.0"
skip_first = 1
line_pattern = 'step (?P<step>\d+): (?P<tokens_per_second>[0-9.]+) tokens/s'
"#,
    );
    run_ok(sweep(root.path()).arg("run").arg(&m));
    let rows = json_rows(sweep(root.path()).args(["report", "--json"]).arg(&m));
    let b = rows.iter().find(|r| r["run"] == "factor-1.05").unwrap();
    let (low, high) = (
        b["speedup_ci95_low"].as_f64().unwrap(),
        b["speedup_ci95_high"].as_f64().unwrap(),
    );
    assert!(
        1.04 < low && low < 1.05 && 1.05 < high && high < 1.06,
        "paired: [{low}, {high}] {b}"
    );
    assert_eq!(b["significant"], true, "{b}");
    let md = std::fs::read_to_string(root.path().join("results/paired/summary.md")).unwrap();
    assert!(
        md.contains("Randomized blocks (3): each speedup is paired by block"),
        "{md}"
    );
    // Where each block ran, from its runs' environment records.
    let host = sweep::util::process::host_name();
    assert!(
        md.contains(&format!(
            "Where each block ran: block 1: {host} (2 runs); block 2: {host}"
        )),
        "{md}"
    );
    let said = stdout(&run_ok(sweep(root.path()).arg("report").arg(&m)));
    assert!(
        said.contains("Randomized blocks (3): each speedup is paired by block"),
        "{said}"
    );
    // One block cannot be paired, and says so.
    let text = std::fs::read_to_string(&m)
        .unwrap()
        .replace("repeats = 3", "repeats = 1");
    write(
        &m,
        &text.replace("name = \"paired\"", "name = \"one-block\""),
    );
    run_ok(sweep(root.path()).arg("run").arg(&m));
    let said = stdout(&run_ok(sweep(root.path()).arg("report").arg(&m)));
    assert!(
        said.contains("Randomized blocks (1): one block cannot be paired")
            && !said.contains("paired by block"),
        "{said}"
    );
}

/// A configuration that runs slower the later it comes in its block (here:
/// it counts the runs of the block before it, as a cache another run
/// filled or a GPU heating up would) is named with its figures; the others
/// are not.
#[test]
fn a_configuration_whose_speed_depends_on_its_place_in_the_block_is_flagged() {
    let root = project();
    let m = root.path().join("b.toml");
    write(
        &m,
        r#"name = "places"
executor = "local"
command = """
before=$(( $(cat "$SWEEP_RUN_DIR/../ran.txt" 2>/dev/null | wc -l) % 4 ))
echo x >> "$SWEEP_RUN_DIR/../ran.txt"
speed=$(( 1000 + 150 * {{ repeat }} ))
slow=$([ "{{ cfg }}" = d ] && echo "0.03 * $before" || echo 0)
for s in 1 2 3 4 5 6; do
  awk -v v="$speed" -v b="$slow" -v s="$s" 'BEGIN { split(b, p, " "); d = (b == "0") ? 0 : p[1] * p[3]; printf "step %d: %.3f tokens/s\\n", s, v * (1 - d) * (1 + ((s * 7) % 5 - 2) / 2000) }'
done
"""
[sweep]
repeats = 5
design = "blocks"
order_seed = 3
[sweep.grid]
cfg = ["a", "b", "c", "d"]
[report]
skip_first = 1
line_pattern = 'step (?P<step>\d+): (?P<tokens_per_second>[0-9.]+) tokens/s'
"#,
    );
    run_ok(sweep(root.path()).arg("run").arg(&m));
    let said = stdout(&run_ok(sweep(root.path()).arg("report").arg(&m)));
    let line = said
        .lines()
        .find(|l| l.starts_with("place in block:"))
        .unwrap_or_else(|| panic!("{said}"));
    assert!(
        line.contains("speed depends on the place in the block — d: -")
            && line.matches("per place later").count() == 1,
        "{line}"
    );
    let md = std::fs::read_to_string(root.path().join("results/places/summary.md")).unwrap();
    assert!(
        md.contains("Place in the block: speed depends on the place in the block — d"),
        "{md}"
    );
    // `sweep compare` of two blocked studies shows each one's blocks and
    // check, and says that its speedups between them are unpaired.
    let results = root.path().join("results");
    run_ok(
        std::process::Command::new("cp")
            .arg("-r")
            .arg(results.join("places"))
            .arg(results.join("before")),
    );
    let said = stdout(&run_ok(sweep(root.path()).args([
        "compare",
        "results/before",
        "results/places",
    ])));
    let host = sweep::util::process::host_name();
    assert!(
        said.contains("## Blocked designs")
            && said.contains(&format!("- before: randomized blocks (5), its own speedups paired by block; block 1: {host} (4 runs)"))
            && said.contains("Place in the block: speed depends on the place in the block — d")
            && said.contains("compare runs of different allocations (unpaired)"),
        "{said}"
    );
}

/// A folder that is not a study's results (no study.json, no run.json) is
/// refused by every command that reads results, even where one of its
/// folders holds logs (`/` and its `/tmp`): nothing is written into it and
/// no history is made beside it.
#[test]
fn a_folder_of_logs_that_is_no_study_is_refused() {
    let root = project();
    let d = root.path();
    write(&d.join("home/jobs/slurm-1.out"), "step 1\n");
    write(&d.join("home/summary.md"), "my own summary\n");
    for args in [
        vec!["report", "home", "--no-plots"],
        vec!["check", "home"],
        vec!["history", "--import", "home"],
    ] {
        let err = super::support::run_err(sweep(d).args(&args));
        assert!(
            err.contains("holds no run directories (run.json) and no study.json: it is not a study's results directory"),
            "{args:?}: {err}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(d.join("home/summary.md")).unwrap(),
        "my own summary\n"
    );
    let mut left: Vec<String> = std::fs::read_dir(d.join("home"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["jobs", "summary.md"]);
    assert!(!d.join("history.sqlite").exists() && !d.join("results").exists());
}

/// A run whose record (`run.json`) is gone does not drop out of a report
/// of its study's directory, nor of a comparison, without a word: it is
/// named and counted missing, and a baseline among such runs is said to be
/// missing, not blamed on its name.
#[test]
fn a_run_without_its_record_is_named_and_counted_missing() {
    let root = project();
    let d = root.path();
    write(
        &d.join("f.toml"),
        &format!(
            "name = \"f\"\n{}",
            super::history::FIXED
                .replace("skip_first = 1", "skip_first = 1\nbaseline = \"tps-1000\"")
        ),
    );
    run_ok(sweep(d).args(["run", "f.toml"]));
    assert!(std::process::Command::new("cp")
        .args(["-r", "results/f", "results/f-before"])
        .current_dir(d)
        .status()
        .unwrap()
        .success());
    std::fs::remove_file(d.join("results/f/tps-2000-r1/run.json")).unwrap();
    let said = stdout(&run_ok(sweep(d).args([
        "report",
        "results/f",
        "--no-plots",
    ])));
    assert!(
        said.contains("tps-2000-r1") && said.contains("holds logs but no run.json"),
        "{said}"
    );
    assert!(
        said.contains("1 of the 4 runs the manifest last rendered"),
        "{said}"
    );
    // A comparison names it too.
    let cmp = stdout(&run_ok(sweep(d).args([
        "compare",
        "results/f-before",
        "results/f",
        "--no-plots",
    ])));
    assert!(cmp.contains("tps-2000-r1"), "{cmp}");
    // The baseline's runs without their records: said so.
    for r in ["tps-1000-r0", "tps-1000-r1"] {
        std::fs::remove_file(d.join("results/f").join(r).join("run.json")).unwrap();
    }
    let err = run_err(sweep(d).args(["report", "results/f", "--no-plots"]));
    assert!(
        err.contains("no readable record") && err.contains("tps-1000-r0"),
        "{err}"
    );
}

/// Three repeats at 1386, 2850 and 1417 tokens/s, each steady to ±0.2%:
/// the configuration's mean is the mean of its runs', and its spread (std,
/// median, p5, p95) that of all their steady points together, never the
/// mean of each run's own narrow one.
#[test]
fn a_configurations_spread_is_over_all_its_runs_points() {
    let root = project();
    let m = root.path().join("s.toml");
    write(
        &m,
        r#"name = "spread"
executor = "local"
command = """
for s in 1 2 3 4 5 6; do
  awk -v v="{{ [1386, 2850, 1417][repeat] }}" -v s="$s" 'BEGIN { printf "step %d: %.3f tokens/s\\n", s, v * (1 + (s % 2 - 0.5) / 250) }'
done
"""
[sweep]
repeats = 3
[report]
skip_first = 0
line_pattern = 'step (?P<step>\d+): (?P<tokens_per_second>[0-9.]+) tokens/s'
"#,
    );
    run_ok(sweep(root.path()).arg("run").arg(&m));
    let rows = json_rows(sweep(root.path()).args(["report", "--json"]).arg(&m));
    assert_eq!(rows.len(), 1, "{rows:?}");
    let r = &rows[0];
    let mut points: Vec<f64> = [1386.0, 2850.0, 1417.0]
        .iter()
        .flat_map(|v| (1..=6).map(move |s| v * (1.0 + ((s % 2) as f64 - 0.5) / 250.0)))
        .map(|v| (v * 1000.0_f64).round() / 1000.0)
        .collect();
    points.sort_by(f64::total_cmp);
    let n = points.len() as f64;
    let mean = points.iter().sum::<f64>() / n;
    let std = (points.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
    let close = |key: &str, want: f64| {
        let got = r[key].as_f64().unwrap();
        assert!(
            (got - want).abs() < 1e-6 * want,
            "{key}: {got} vs {want}: {r}"
        );
    };
    close("tokens_per_second_mean", (1386.0 + 2850.0 + 1417.0) / 3.0);
    close("tokens_per_second_std", std);
    close("tokens_per_second_median", (points[8] + points[9]) / 2.0);
    assert!(std > 600.0, "{std}");
    let md = std::fs::read_to_string(root.path().join("results/spread/summary.md")).unwrap();
    assert!(
        md.contains("over every steady-state point of a row's runs together"),
        "{md}"
    );
    // Repeats 2× apart are said, with the cause the environments recorded.
    assert!(
        md.contains("Note: the repeats of run differ by 2.06× (") && md.contains(" at 1386, "),
        "{md}"
    );
    let env: serde_json::Value = serde_json::from_slice(
        &std::fs::read(root.path().join("results/spread/run-r0/environment.json")).unwrap(),
    )
    .unwrap();
    for at in ["load_at_start", "load_at_end"] {
        let cores = env[at]["cores"].as_u64().unwrap();
        let busy = env[at]["busy_cores"].as_f64().unwrap();
        assert!(
            cores >= 1 && (0.0..=cores as f64 + 0.01).contains(&busy),
            "{env}"
        );
        assert_eq!(env[at]["load_average"].as_array().unwrap().len(), 3);
    }
}

/// MFU per configuration across a sequence-length axis: `[report]
/// flops_per_token` as an expression over the run's values (attention's
/// FLOPs grow with the sequence), evaluated per run, the runs' ids the
/// same as without it, and a study rendered before the key runs nothing
/// again once it is added.
#[test]
fn flops_per_token_as_an_expression_gives_each_configuration_its_mfu() {
    let root = project();
    let m = root.path().join("mfu.toml");
    let study = |report: &str| {
        format!(
            r#"name = "mfu"
executor = "local"
command = 'for i in 1 2 3 4; do echo "step $i: {{{{ seq * 10 }}}} tokens/s"; done'
[sweep.grid]
seq = [128, 1024]
[report]
skip_first = 0
line_pattern = 'step (?P<step>\d+): (?P<tokens_per_second>[0-9.]+) tokens/s'
{report}"#
        )
    };
    let ids = |m: &Path| -> Vec<(String, String)> {
        json_rows(sweep(root.path()).arg("plan").arg(m).arg("--json"))
            .iter()
            .map(|r| {
                (
                    r["name"].as_str().unwrap().into(),
                    r["id"].as_str().unwrap().into(),
                )
            })
            .collect()
    };
    write(&m, &study(""));
    let before = ids(&m);
    run_ok(sweep(root.path()).arg("run").arg(&m));
    write(
        &m,
        &study("flops_per_token = \"6 * 2130240 + 12 * 2 * 128 * seq\"\npeak_flops = 1e12\n"),
    );
    assert_eq!(ids(&m), before, "a report setting changes no run");
    let again = stdout(&run_ok(sweep(root.path()).arg("submit").arg(&m)));
    assert!(again.contains("nothing to submit"), "{again}");
    let rows =
        json_rows(sweep(root.path()).args(["report", m.to_str().unwrap(), "--json", "--no-plots"]));
    for (name, seq) in [("seq-128", 128.0), ("seq-1024", 1024.0)] {
        let row = rows.iter().find(|r| r["run"] == name).unwrap();
        let flops = 6.0 * 2_130_240.0 + 12.0 * 2.0 * 128.0 * seq;
        let mfu = 100.0 * (seq * 10.0) * flops / 1e12;
        let got = row["mfu_pct_mean"].as_f64().unwrap();
        assert!((got - mfu).abs() < 1e-9 * mfu, "{name}: {got} vs {mfu}");
        // And the history, whose attempts were recorded without it.
        let history = json_rows(sweep(root.path()).args(["history", "--json"]));
        let past = history.iter().find(|a| a["configuration"] == name).unwrap();
        let got = past["mfu_pct"].as_f64().unwrap_or_default();
        assert!(
            (got - mfu).abs() < 1e-9 * mfu,
            "{name} in the history: {past}"
        );
        assert_eq!(past["runs"].as_u64(), Some(1), "no attempt added: {past}");
    }
    // A figure an expression cannot give is refused at plan time, at the key.
    write(&m, &study("flops_per_token = \"seq - 1024\"\n"));
    let err = run_err(sweep(root.path()).arg("plan").arg(&m));
    assert!(
        err.contains("`flops_per_token` = `seq - 1024` came out as 0")
            && err.contains("report.flops_per_token"),
        "{err}"
    );
}
