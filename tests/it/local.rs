//! The local executor: parallel runs, exit codes, idempotence, dependencies, Ctrl-C.

use super::support::{json_rows, project, run_err, run_ok, status, stdout, sweep, wait_for, write};
use std::process::Command;

#[test]
fn local_runs_record_exit_codes_and_resubmit_only_what_failed() {
    let root = project();
    let m = root.path().join("m.toml");
    write(&m, "name = \"l\"\nexecutor = \"local\"\ncommand = \"echo run {{ code }}; exit {{ code }}\"\n[sweep.grid]\ncode = [0, 3]\n[local]\nparallel = 2\n");
    let out = sweep(root.path()).arg("submit").arg(&m).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "a failed run fails the submit");
    let s = status(root.path(), &m);
    assert_eq!(s["code-0"], ("COMPLETED".into(), Some(0)));
    assert_eq!(s["code-3"], ("FAILED".into(), Some(3)));
    let log = std::fs::read_to_string(root.path().join("results/l/code-3/local.out")).unwrap();
    assert!(log.contains("run 3"), "{log}");

    let again = stdout(&run_ok(sweep(root.path()).arg("submit").arg(&m)));
    assert!(
        again.contains("nothing to submit") && again.contains("--retry-failed"),
        "{again}"
    );
    let retry = sweep(root.path())
        .args(["submit", "--retry-failed"])
        .arg(&m)
        .output()
        .unwrap();
    assert_eq!(retry.status.code(), Some(1));
    let record: serde_json::Value = serde_json::from_slice(
        &std::fs::read(root.path().join("results/l/code-3/run.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        record["jobs"].as_array().unwrap().len(),
        2,
        "the failed run ran twice"
    );
    let record: serde_json::Value = serde_json::from_slice(
        &std::fs::read(root.path().join("results/l/code-0/run.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        record["jobs"].as_array().unwrap().len(),
        1,
        "the completed run ran once"
    );
}

/// A run that fails says, in the report's notes, what its program said
/// last: on SLURM the state's reason is only `NonZeroExitCode`.
#[test]
fn a_failed_runs_note_quotes_the_end_of_its_log() {
    let root = project();
    let m = root.path().join("m.toml");
    write(
        &m,
        "name = \"f\"\nexecutor = \"local\"\ncommand = \"python3 -c 'import no_such_module'\"\n",
    );
    let out = sweep(root.path()).arg("run").arg(&m).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    assert!(
        text.contains("note: run: FAILED (exit 1), ")
            && text.contains(
                "; local.out ends: ModuleNotFoundError: No module named 'no_such_module'\n"
            ),
        "{text}"
    );
    let md = std::fs::read_to_string(root.path().join("results/f/summary.md")).unwrap();
    assert!(md.contains("local.out ends: ModuleNotFoundError"), "{md}");
    let page = std::fs::read_to_string(root.path().join("results/f/report.html")).unwrap();
    assert!(
        page.contains("The last lines of local.out")
            && page.contains("No module named &#39;no_such_module&#39;"),
        "the page shows the log's last lines"
    );
}

/// A program that fails before a pipe fails its run (the history would
/// otherwise record a crash as a measurement), and a command that sets
/// variables before its program runs it (`exec` takes no assignments).
#[test]
fn a_crash_behind_a_pipe_fails_and_assignments_before_a_command_work() {
    let root = project();
    let study = |name: &str, command: &str| {
        let m = root.path().join(format!("{name}.toml"));
        write(
            &m,
            &format!("name = \"{name}\"\nexecutor = \"local\"\ncommand = \"{command}\"\n"),
        );
        let out = sweep(root.path()).arg("submit").arg(&m).output().unwrap();
        let log =
            std::fs::read_to_string(root.path().join("results").join(name).join("run/local.out"))
                .unwrap();
        (
            out.status.code(),
            status(root.path(), &m)["run"].clone(),
            log,
        )
    };
    let (code, state, log) = study("piped", "sh -c 'echo out; exit 3' | cat");
    assert_eq!(code, Some(1), "the crashed run fails the submit");
    assert_eq!(state, ("FAILED".into(), Some(3)), "{log}");
    assert!(log.contains("out"), "{log}");
    let (code, state, log) = study(
        "assigned",
        "OMP_NUM_THREADS=3 SWEEP_NOTE=hi sh -c 'echo $OMP_NUM_THREADS $SWEEP_NOTE'",
    );
    assert_eq!(
        (code, state),
        (Some(0), ("COMPLETED".into(), Some(0))),
        "{log}"
    );
    assert!(log.lines().any(|l| l == "3 hi"), "{log}");
}

/// `[slurm] env` comes last on this machine as in a job script: a thread
/// count it sets reaches the program over the run's share of `[local]
/// threads` (before, the share won in silence).
#[test]
fn the_manifests_env_wins_over_the_runs_share_of_the_cores() {
    let root = project();
    let m = root.path().join("env.toml");
    write(
        &m,
        "name = \"env\"\nexecutor = \"local\"\n\
         command = \"echo threads $OMP_NUM_THREADS $RAYON_NUM_THREADS $SWEEP_THREADS\"\n\
         [local]\nthreads = 1\n[slurm]\nenv = { OMP_NUM_THREADS = \"3\" }\n",
    );
    run_ok(sweep(root.path()).arg("submit").arg(&m));
    let log = std::fs::read_to_string(root.path().join("results/env/run/local.out")).unwrap();
    assert!(log.lines().any(|l| l == "threads 3 1 1"), "{log}");
}

/// A log the `line_pattern` never matches: the report says so, with how
/// many lines the log has and the program's first ones, instead of "no
/// metrics".
#[test]
fn a_pattern_that_matches_no_line_is_said_with_the_logs_first_lines() {
    let root = project();
    let m = root.path().join("pat.toml");
    write(
        &m,
        "name = \"pat\"\nexecutor = \"local\"\ncommand = \"echo starting; echo 'iter 10: loss 4.5, time 5.3ms'\"\n\
         [report]\nline_pattern = 'step (?P<step>\\d+): (?P<tokens_per_second>[0-9.]+) tokens/s'\n",
    );
    run_ok(sweep(root.path()).arg("submit").arg(&m));
    let out = stdout(&run_ok(
        sweep(root.path()).arg("report").arg(&m).arg("--no-plots"),
    ));
    assert!(
        out.contains("no line of local.out matches [report] line_pattern `step (?P<step>")
            && out.contains("it has ")
            && out.contains(
                " lines, the program's first: `starting` · `iter 10: loss 4.5, time 5.3ms`"
            ),
        "{out}"
    );
}

/// A command study without a `line_pattern` has nothing that reads its
/// log: `sweep plan` says so, and the report's rows say why they are empty
/// (not only "the run wrote no metrics.jsonl", which the trainer writes, or a
/// program that writes sweep's own lines).
#[test]
fn a_command_without_a_line_pattern_is_said_at_plan_and_in_the_report() {
    let root = project();
    let m = root.path().join("bare.toml");
    write(
        &m,
        "name = \"bare\"\nexecutor = \"local\"\ncommand = \"echo 'step {{ n }}: 1000 tokens/s'\"\n\
         [sweep.grid]\nn = [1, 2]\n",
    );
    let plan = run_ok(sweep(root.path()).arg("plan").arg(&m));
    let said = String::from_utf8_lossy(&plan.stderr);
    assert!(
        said.contains(
            "warning: `[report] line_pattern` is not set: nothing reads the command's log"
        ),
        "{said}"
    );
    run_ok(sweep(root.path()).arg("run").arg(&m));
    let out = stdout(&run_ok(
        sweep(root.path()).arg("report").arg(&m).arg("--no-plots"),
    ));
    assert!(
        out.contains(
            "note: n-1: COMPLETED, no metrics.jsonl, and no `[report] line_pattern` to read the command's log by"
        ),
        "{out}"
    );
}

/// A program that logs as nanoGPT does (a step's time in ms, its own MFU):
/// tokens/s are `tokens_per_step / step time`, to 0.1% of the hand
/// computation, with speedups against the baseline, TFLOP/s from
/// `flops_per_token` and MFU against a given peak (the log's own MFU wins).
/// A baseline with no way to tokens/s is warned of at plan time.
#[test]
fn tokens_per_second_come_from_a_logged_step_time() {
    let root = project();
    let m = root.path().join("nano.toml");
    let study = |report: &str| {
        format!(
            "name = \"nano\"\nexecutor = \"local\"\n\
             command = 'for i in 1 2 3 4 5 6 7 8 9 10; do echo \"iter $i: loss 4.5504, time {{{{ ms }}}}ms, mfu 0.01%\"; done'\n\
             [defaults]\nblock_size = 64\n\
             [[sweep.zip]]\nbatch_size = [4, 8]\nms = [5.33, 8.0]\n\
             [report]\nbaseline = \"batch_size-4_ms-5.33\"\n\
             line_pattern = 'iter (?P<step>\\d+): loss (?P<loss>[\\d.]+), time (?P<time_ms>[\\d.]+)ms'\n{report}"
        )
    };
    write(&m, &study(""));
    let plan = run_ok(sweep(root.path()).arg("plan").arg(&m));
    let said = String::from_utf8_lossy(&plan.stderr);
    assert!(said.contains("yields no tokens/s"), "{said}");

    write(
        &m,
        &study("step_time = \"time_ms\"\ntokens_per_step = \"batch_size * block_size\"\nflops_per_token = 1e6\npeak_flops = 1e12\n"),
    );
    let plan = run_ok(sweep(root.path()).arg("plan").arg(&m));
    assert!(!String::from_utf8_lossy(&plan.stderr).contains("yields no tokens/s"));
    run_ok(sweep(root.path()).arg("submit").arg(&m));
    let rows = json_rows(sweep(root.path()).args(["report", "nano.toml", "--json", "--no-plots"]));
    assert_eq!(rows.len(), 2, "{rows:?}");
    for (row, tokens, ms) in [(&rows[0], 4.0 * 64.0, 5.33), (&rows[1], 8.0 * 64.0, 8.0)] {
        let want = tokens / (ms / 1e3);
        let got = row["tokens_per_second_mean"].as_f64().unwrap();
        assert!((got / want - 1.0).abs() < 1e-3, "{got} vs {want}: {row}");
        let tflops = row["tflops_mean"].as_f64().unwrap();
        assert!((tflops / (want * 1e6 / 1e12) - 1.0).abs() < 1e-3, "{row}");
        let mfu = row["mfu_pct_mean"].as_f64().unwrap();
        assert!(
            (mfu / (100.0 * want * 1e6 / 1e12) - 1.0).abs() < 1e-3,
            "{row}"
        );
        assert_eq!(row["tokens_per_step"].as_f64(), Some(tokens), "{row}");
    }
    let speedup = rows[1]["speedup"].as_f64().unwrap();
    let want = (8.0 * 64.0 / 8.0) / (4.0 * 64.0 / 5.33);
    assert!((speedup / want - 1.0).abs() < 1e-3, "{speedup} vs {want}");

    // An expression that is no number of tokens is a plan error at the run.
    write(
        &m,
        &study("step_time = \"time_ms\"\ntokens_per_step = \"batch_size - 8\"\n"),
    );
    let err = run_err(sweep(root.path()).arg("plan").arg(&m));
    assert!(
        err.contains("`tokens_per_step` = `batch_size - 8` came out as 0"),
        "{err}"
    );
}

/// A run that failed before its first metric holds nothing worth keeping in
/// place: its command fixed, it runs again without `--replace-changed` (its
/// directory moved aside whole). One that logged a metric before failing
/// still needs the flag.
#[test]
fn a_run_that_failed_before_its_first_metric_runs_again_after_a_fix() {
    let root = project();
    let m = root.path().join("fix.toml");
    let study = |command: &str| {
        format!(
            "name = \"fix\"\nexecutor = \"local\"\ncommand = '{command}'\n\
             [report]\nline_pattern = 'step (?P<step>\\d+): (?P<tokens_per_second>[\\d.]+) tok/s'\n"
        )
    };
    write(&m, &study("echo typo; exit 127"));
    let first = sweep(root.path()).arg("submit").arg(&m).output().unwrap();
    assert_eq!(first.status.code(), Some(1));
    write(
        &m,
        &study("for i in 1 2 3 4 5 6 7; do echo \"step $i: 100 tok/s\"; done"),
    );
    let out = run_ok(sweep(root.path()).arg("submit").arg(&m));
    let said = String::from_utf8_lossy(&out.stderr).into_owned() + &stdout(&out);
    assert!(said.contains("failed before its first metric"), "{said}");
    assert_eq!(status(root.path(), &m)["run"].0, "COMPLETED");
    let replaced = root.path().join("results/fix/replaced");
    let kept: Vec<_> = std::fs::read_dir(&replaced).unwrap().flatten().collect();
    assert_eq!(kept.len(), 1);
    let log = std::fs::read_to_string(kept[0].path().join("run/local.out")).unwrap();
    assert!(
        log.contains("typo"),
        "the failed attempt is kept whole: {log}"
    );

    // Logged a metric, then failed: a measurement of sorts, kept in place.
    write(&m, &study("echo \"step 1: 100 tok/s\"; exit 3"));
    let failed = sweep(root.path())
        .args(["submit", "--replace-changed"])
        .arg(&m)
        .output()
        .unwrap();
    assert_eq!(failed.status.code(), Some(1));
    write(&m, &study("echo fixed"));
    let err = run_err(sweep(root.path()).arg("submit").arg(&m));
    assert!(err.contains("--replace-changed"), "{err}");
}

#[test]
fn a_failed_stage_cancels_the_runs_that_need_it() {
    let root = project();
    let m = root.path().join("m.toml");
    // The dataset does not exist, so the pretokenize stage fails.
    write(&m, "name = \"d\"\nexecutor = \"local\"\n[defaults]\ndataset = \"missing.parquet\"\n[sweep.grid]\npretokenized = [true]\nbatch_size = [1, 2]\n");
    let out = sweep(root.path()).arg("submit").arg(&m).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let s = status(root.path(), &m);
    let stage = s
        .iter()
        .find(|(k, _)| k.starts_with("pretokenize-padded-"))
        .expect("a stage")
        .1;
    assert_eq!(stage.0, "FAILED");
    assert_eq!(s["pretokenized-true_batch_size-1"].0, "CANCELLED");
    assert_eq!(s["pretokenized-true_batch_size-2"].0, "CANCELLED");
}

#[test]
fn ctrl_c_stops_running_jobs_and_their_children() {
    let root = project();
    let m = root.path().join("m.toml");
    write(&m, "name = \"c\"\nexecutor = \"local\"\ncommand = \"sleep 60 & wait\"\n[sweep.grid]\nx = [1, 2, 3]\n[local]\nparallel = 2\n");
    let mut child = sweep(root.path())
        .arg("submit")
        .arg(&m)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for(20, "two running jobs", || {
        let s = status(root.path(), &m);
        (s.values().filter(|v| v.0 == "RUNNING").count() == 2).then_some(())
    });
    let pids: Vec<i32> = ["x-1", "x-2"]
        .iter()
        .map(|r| {
            let v: serde_json::Value = serde_json::from_slice(
                &std::fs::read(root.path().join(format!("results/c/{r}/local.json"))).unwrap(),
            )
            .unwrap();
            v["pid"].as_i64().unwrap() as i32
        })
        .collect();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let code = wait_for(30, "sweep to stop", || child.try_wait().unwrap()).code();
    assert_eq!(code, Some(130));
    // The jobs' whole process groups are gone (the `sleep` children too).
    for pid in pids {
        wait_for(10, "the job's process group to end", || {
            (live_members(pid) == 0).then_some(())
        });
    }
    // Stopped by the user, not failed: the next `sweep submit` runs them.
    let s = status(root.path(), &m);
    assert!(s.values().all(|v| v.0 == "INTERRUPTED"), "{s:?}");
}

/// Processes of a process group that are alive (zombies waiting for a slow
/// PID 1 to reap them do not count).
fn live_members(pgid: i32) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("stat")).ok())
        .filter(|stat| {
            let Some((_, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            let f: Vec<&str> = rest.split_whitespace().collect();
            f.len() > 2 && f[2] == pgid.to_string() && f[0] != "Z" && f[0] != "X"
        })
        .count()
}

/// `-C DIR` works as `git -C DIR`: from another directory, the manifest
/// argument and a command's relative script resolve in the project root.
#[test]
fn minus_c_runs_a_study_from_another_directory() {
    let root = project();
    let elsewhere = tempfile::tempdir().unwrap();
    write(
        &root.path().join("m.toml"),
        "name = \"c\"\nexecutor = \"local\"\ncommand = \"./hello.sh {{ x }}\"\n[sweep.grid]\nx = [1, 2]\n",
    );
    let script = root.path().join("hello.sh");
    write(
        &script,
        "#!/bin/sh\necho \"hello $1\" > \"$SWEEP_RUN_DIR/said\"\n",
    );
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    run_ok(
        Command::new(env!("CARGO_BIN_EXE_sweep"))
            .current_dir(elsewhere.path())
            .arg("-C")
            .arg(root.path())
            .args(["run", "m.toml"]),
    );
    let said = std::fs::read_to_string(root.path().join("results/c/x-2/said")).unwrap();
    assert_eq!(said, "hello 2\n");
    assert!(
        std::fs::read_dir(elsewhere.path())
            .unwrap()
            .next()
            .is_none(),
        "wrote outside the project"
    );
}

/// `launcher` swept over `none` and `mpirun` where there is no mpirun:
/// refused before any run starts (the `none` run started, and was left
/// running when the `mpirun` one could not).
#[test]
fn every_runs_launcher_is_found_before_the_first_starts() {
    let root = project();
    let bin = root.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for tool in ["bash", "touch", "sleep", "mv", "printf", "env"] {
        let real = which(tool);
        std::os::unix::fs::symlink(real, bin.join(tool)).unwrap();
    }
    let m = root.path().join("m.toml");
    write(
        &m,
        "name = \"l\"\nexecutor = \"local\"\ncommand = 'touch \"$SWEEP_RUN_DIR/started\"; sleep 30'\n[sweep.grid]\nlauncher = [\"none\", \"mpirun\"]\n[local]\nparallel = 2\n",
    );
    let err = run_err(sweep(root.path()).env("PATH", &bin).arg("submit").arg(&m));
    assert!(
        err.contains("there is no mpirun on PATH") && err.contains("no run was started"),
        "{err}"
    );
    for run in ["none", "mpirun"] {
        let dir = root.path().join("results/l").join(run);
        assert!(!dir.join("started").exists(), "{run} started");
    }
}

/// Where `tool` is on this machine's PATH.
fn which(tool: &str) -> std::path::PathBuf {
    std::env::var("PATH")
        .unwrap()
        .split(':')
        .map(|d| std::path::Path::new(d).join(tool))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("no {tool} on PATH"))
}

/// A failed run's last line, quoted under it, with a terminal's escapes in
/// it (a title, a cleared screen, a clipboard write): they reach the
/// terminal as nothing, or as text, never as escapes.
#[test]
fn what_a_job_prints_reaches_the_terminal_harmless() {
    let root = project();
    let m = root.path().join("m.toml");
    write(
        &m,
        "name = \"esc\"\nexecutor = \"local\"\ncommand = '''printf '\\033]0;pwned\\007\\033[2J\\033]52;c;ZXZpbA==\\007oops\\001\\n'; exit 3'''\n",
    );
    let out = sweep(root.path()).arg("run").arg(&m).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("FAILED (exit 3)") && said.contains("oops"),
        "{said}"
    );
    assert!(!said.contains(['\u{1b}', '\u{7}', '\u{1}']), "{said:?}");
}
