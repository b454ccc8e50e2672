//! The watchdog (docs/running.md, "When a run hangs"): a run that stops
//! making progress is HUNG, with the evidence, while the study's other runs
//! complete; a run whose steps are slow but regular is left alone; bad
//! `[watchdog]` values are refused at plan time. On this machine and on
//! the one-node SLURM cluster; the two-node cases are in `nodes.rs`.

use super::slurm::{require_cluster, wait_until_done};
use super::support::{project, run_ok, status, stdout, stop_record, sweep, write};
use std::path::Path;

/// A study of two command runs: `hang` prints three progress lines, each
/// with its time, and then sleeps (on its first try only: `--retry-failed`
/// completes it); `done` prints them and ends.
fn hanging_study(root: &Path, name: &str, stall: &str) -> std::path::PathBuf {
    let m = root.join(format!("{name}.toml"));
    write(
        &m,
        &format!(
            r#"name = "{name}"
command = "for i in 1 2 3; do echo \"step $i: 100 tokens/s at $(date +%s.%N)\"; sleep 0.3; done; if [ {{{{ mode }}}} = hang ] && [ ! -e {{{{ run.dir }}}}/tried ]; then touch {{{{ run.dir }}}}/tried; sleep 600; fi"
[sweep.grid]
mode = ["hang", "done"]
[local]
parallel = 2
[slurm]
time = "5"
job_name = "sweep-test-{name}-{pid}"
[watchdog]
stall = "{stall}"
[report]
line_pattern = 'step (?P<step>\d+): (?P<tokens_per_second>[0-9.]+) tokens/s'
"#,
            pid = std::process::id()
        ),
    );
    m
}

/// Seconds since the epoch of an RFC 3339 time.
fn epoch(rfc3339: &str) -> f64 {
    chrono::DateTime::parse_from_rfc3339(rfc3339)
        .unwrap_or_else(|e| panic!("{rfc3339}: {e}"))
        .timestamp_millis() as f64
        / 1000.0
}

/// The time the last progress line of a run's log gives.
fn last_progress(log: &str) -> f64 {
    log.lines()
        .filter_map(|l| l.split_once("tokens/s at ").map(|(_, t)| t.trim()))
        .filter_map(|t| t.parse::<f64>().ok())
        .next_back()
        .unwrap_or_else(|| panic!("no progress line in {log}"))
}

/// What every HUNG run must show: the record, its reason naming the node,
/// the evidence; the seconds from its last progress line to HUNG.
fn assert_hung(run: &Path, log: &str, stall_s: f64, slack_s: f64) -> f64 {
    let stopped = stop_record(run);
    assert_eq!(stopped["by"], "watchdog", "{stopped}");
    let nodes = stopped["nodes"].as_array().unwrap();
    assert!(!nodes.is_empty(), "it names the nodes: {stopped}");
    let reason = stopped["reason"].as_str().unwrap();
    assert!(
        reason.contains("no progress for")
            && reason.contains("after 3 progress lines")
            && reason.contains(&format!("on {}", nodes[0].as_str().unwrap())),
        "{reason}"
    );
    let evidence = std::fs::read_to_string(run.join("watchdog.log")).unwrap();
    assert!(
        evidence.contains("## The run's processes") && evidence.contains("sleep 600"),
        "the processes, with the one that sleeps: {evidence}"
    );
    assert!(
        evidence.contains("## The last progress line\nstep 3: 100 tokens/s")
            && evidence.contains("## The last lines of"),
        "the last progress line, the log's last lines: {evidence}"
    );
    let hung_after = epoch(stopped["at"].as_str().unwrap()) - last_progress(log);
    assert!(
        hung_after >= stall_s && hung_after <= stall_s + slack_s,
        "HUNG {hung_after:.1} s after the last progress line (stall {stall_s} s)"
    );
    hung_after
}

#[test]
fn a_run_that_stops_printing_is_hung_while_the_other_completes_locally() {
    let root = project();
    let m = hanging_study(root.path(), "hang-local", "3s");
    let out = sweep(root.path())
        .arg("submit")
        .arg(&m)
        .args(["--executor", "local"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "a hung run fails the submit");
    let s = status(root.path(), &m);
    assert_eq!(s["done"].0, "COMPLETED", "{s:?}");
    assert_eq!(s["hang"], ("HUNG".into(), Some(97)), "{s:?}");
    let run = root.path().join("results/hang-local/hang");
    let log = std::fs::read_to_string(run.join("local.out")).unwrap();
    let hung_after = assert_hung(&run, &log, 3.0, 5.0);
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("local.json")).unwrap()).unwrap();
    // `ended_at` has whole seconds.
    let released = epoch(state["ended_at"].as_str().unwrap()) - last_progress(&log);
    eprintln!("local: HUNG {hung_after:.1} s after the last progress line, job ended {released:.1} s after it");
    // Said where a user looks: the status table, with the reason.
    let table = stdout(&run_ok(sweep(root.path()).arg("status").arg(&m)));
    assert!(
        table.contains("HUNG") && table.contains("no progress for"),
        "{table}"
    );
    // Said in the report and on its page, and the watchdog's own lines are
    // no progress lines.
    let report = stdout(&run_ok(
        sweep(root.path()).arg("report").arg(&m).arg("--no-plots"),
    ));
    assert!(
        report.contains("| HUNG (no progress for") && !report.contains("repeats or goes back"),
        "{report}"
    );
    let page = std::fs::read_to_string(root.path().join("results/hang-local/report.html")).unwrap();
    assert!(page.contains("HUNG (no progress for"), "the page says it");
    // Kept in the history, with its node: a node that hangs runs shows there.
    let history = stdout(&run_ok(sweep(root.path()).arg("history")));
    let line = history
        .lines()
        .find(|l| l.contains("HUNG"))
        .unwrap_or_else(|| panic!("{history}"));
    assert!(
        history.contains("runs that ended without a measurement")
            && line.contains("hang")
            && line.contains(stop_record(&run)["nodes"][0].as_str().unwrap()),
        "{history}"
    );
    // --retry-failed runs it again (its second try completes).
    run_ok(
        sweep(root.path())
            .args(["submit", "--retry-failed"])
            .arg(&m)
            .args(["--executor", "local"]),
    );
    assert_eq!(status(root.path(), &m)["hang"].0, "COMPLETED");
    // Its figures are the retry's three lines (the first a warm-up), not
    // both attempts' six.
    let rows = super::support::json_rows(sweep(root.path()).args([
        "report",
        m.to_str().unwrap(),
        "--json",
        "--no-plots",
    ]));
    let hang = rows.iter().find(|r| r["run"] == "hang").unwrap();
    assert_eq!(hang["points"].as_u64(), Some(2), "{hang}");
}

#[test]
#[ignore = "needs the local SLURM cluster"]
fn a_run_that_stops_printing_is_hung_on_slurm_naming_its_node() {
    require_cluster();
    let root = project();
    let m = hanging_study(root.path(), "hang-slurm", "4s");
    let submitted = std::time::Instant::now();
    run_ok(
        sweep(root.path())
            .arg("submit")
            .arg(&m)
            .args(["--executor", "slurm"]),
    );
    let s = wait_until_done(root.path(), &m, 120);
    let done = submitted.elapsed().as_secs_f64();
    assert_eq!(s["done"].0, "COMPLETED", "{s:?}");
    assert_eq!(s["hang"].0, "HUNG", "{s:?}");
    let run = root.path().join("results/hang-slurm/hang");
    let log = super::support::job_logs(&run);
    let hung_after = assert_hung(&run, &log, 4.0, 6.0);
    let stopped = stop_record(&run);
    let node = stopped["nodes"][0].as_str().unwrap().to_string();
    assert!(
        log.contains(&format!("on {node} at")),
        "the node named is the one the job ran on ({node}): {log}"
    );
    // The allocation's end, as SLURM says it (whole seconds, local time).
    let job = super::support::job_id(&run);
    let show = stdout(&run_ok(
        std::process::Command::new("scontrol").args(["show", "job", &job]),
    ));
    let end = show
        .split_whitespace()
        .find_map(|f| f.strip_prefix("EndTime="))
        .and_then(|t| chrono::NaiveDateTime::parse_from_str(t, "%Y-%m-%dT%H:%M:%S").ok())
        .and_then(|t| t.and_local_timezone(chrono::Local).single())
        .map(|t| t.timestamp() as f64);
    let released = end.map(|e| e - last_progress(&log));
    eprintln!("slurm: HUNG {hung_after:.1} s after the last progress line on {node}, allocation released {released:.1?} s after it; the study ended {done:.1} s after submission");
}

/// A run that never prints a progress line is HUNG at its startup limit.
#[test]
fn a_run_that_never_reports_is_hung_at_its_startup_limit() {
    let root = project();
    let m = root.path().join("silent.toml");
    write(
        &m,
        r#"name = "silent"
executor = "local"
command = "echo loading; sleep 600"
[watchdog]
startup = "3s"
[report]
line_pattern = 'step (?P<step>\d+): (?P<tokens_per_second>[0-9.]+) tokens/s'
"#,
    );
    let started = std::time::Instant::now();
    let out = sweep(root.path()).arg("submit").arg(&m).output().unwrap();
    let took = started.elapsed().as_secs_f64();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(status(root.path(), &m)["run"], ("HUNG".into(), Some(97)));
    let stop = stop_record(&root.path().join("results/silent/run"));
    let reason = stop["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("no progress line after it started (startup limit 3 s)"),
        "{reason}"
    );
    assert!(
        took < 30.0,
        "stopped at its limit, not at the program's end ({took:.0} s)"
    );
}

#[test]
fn slow_but_regular_steps_are_never_hung() {
    let root = project();
    let m = root.path().join("slow.toml");
    // 20-second steps with the default `auto`: ten medians are over three
    // minutes, and the floor five.
    write(
        &m,
        r#"name = "slow"
executor = "local"
command = "for i in 1 2 3 4; do echo \"step $i: 100 tokens/s\"; sleep 20; done"
[report]
line_pattern = 'step (?P<step>\d+): (?P<tokens_per_second>[0-9.]+) tokens/s'
"#,
    );
    let out = run_ok(sweep(root.path()).arg("run").arg(&m));
    assert_eq!(status(root.path(), &m)["run"].0, "COMPLETED");
    // The live view (a block every 15 s in a log) reads a command's
    // progress from its log by its pattern.
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("  run: step ") && said.contains("| loss - | 100 tokens/s"),
        "{said}"
    );
    let run = root.path().join("results/slow/run");
    assert!(!run.join("watchdog.log").exists());
    assert!(!std::fs::read_to_string(run.join("run.json"))
        .unwrap()
        .contains("stopped"));
}

/// A study of one command run under watchdog limits far shorter than it
/// (4 s; it prints a progress line a second for 8 s), submitted from an
/// environment without PYTHONUNBUFFERED (as a login shell's; this suite's
/// may set it): it completes, never stopped, and its report reads every
/// line (tokens/s 100, 200, ... 800: a mean of 450).
fn completes_under_short_limits(name: &str, command: &str) {
    let root = project();
    let m = root.path().join(format!("{name}.toml"));
    write(
        &m,
        &format!(
            r#"name = "{name}"
executor = "local"
command = "{command}"
[watchdog]
startup = "4s"
stall = "4s"
[report]
skip_first = 0
line_pattern = 'step (?P<step>\d+): (?P<tokens_per_second>[0-9.]+) tokens/s'
"#
        ),
    );
    let submit = sweep(root.path())
        .env_remove("PYTHONUNBUFFERED")
        .arg("submit")
        .arg(&m)
        .output()
        .unwrap();
    assert_eq!(
        status(root.path(), &m)["run"].0,
        "COMPLETED",
        "{}",
        String::from_utf8_lossy(&submit.stderr)
    );
    assert!(!root
        .path()
        .join(format!("results/{name}/run/watchdog.log"))
        .exists());
    let report =
        run_ok(sweep(root.path()).args(["report", m.to_str().unwrap(), "--json", "--no-plots"]));
    let rows: serde_json::Value = serde_json::from_str(&stdout(&report)).unwrap();
    assert_eq!(
        rows[0]["tokens_per_second_mean"].as_f64(),
        Some(450.0),
        "{rows}"
    );
}

/// A progress bar (tqdm's in a job's log): each update redrawn with a
/// carriage return, no newline until the end. Each update is progress.
#[test]
fn a_progress_bar_redrawn_in_place_is_progress() {
    completes_under_short_limits(
        "bar",
        r"for i in 1 2 3 4 5 6 7 8; do printf '\\rstep %d: %d tokens/s' $i $((100 * i)); sleep 1; done; echo",
    );
}

/// A logger made to colour its lines (rich's handler under `FORCE_COLOR`
/// highlights every number): the pattern, written for the plain text, still
/// matches each line, for the watchdog and the report alike.
#[test]
fn a_coloured_log_is_progress_and_read_as_its_plain_text() {
    completes_under_short_limits(
        "colour",
        r"for i in 1 2 3 4 5 6 7 8; do printf '\\033[2mINFO\\033[0m step \\033[1;36m%d\\033[0m: \\033[1;36m%d\\033[0m tokens/s\\n' $i $((100 * i)); sleep 1; done",
    );
}

/// A Python script that prints its progress without flushing (Python
/// buffers a file 8 KB at a time): its lines reach the log as printed.
#[test]
fn a_python_scripts_unflushed_prints_are_progress() {
    completes_under_short_limits(
        "py",
        r#"python3 -c 'import time\nfor i in range(1, 9):\n    print(f\"step {i}: {100 * i} tokens/s\")\n    time.sleep(1)'"#,
    );
}

#[test]
fn bad_watchdog_values_are_refused_at_plan_time() {
    let root = project();
    let m = root.path().join("bad.toml");
    for (key, value, says) in [
        ("stall", "0s", "is zero"),
        ("stall", "-5m", "is negative"),
        ("stall", "soon", "is not a duration"),
        ("stall", "90days", "more than a month"),
        ("stall", "500ms", "under a second"),
        ("startup", "auto", "is not a duration"),
        ("startup", "0m", "is zero"),
    ] {
        write(
            &m,
            &format!("name = \"bad\"\ncommand = \"true\"\n[watchdog]\n{key} = \"{value}\"\n"),
        );
        let out = sweep(root.path()).arg("plan").arg(&m).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{key} = {value} was accepted");
        assert!(
            err.contains(says) && err.contains(&format!("watchdog.{key}")) && err.contains(":4:"),
            "{key} = {value}: {err}"
        );
    }
    // A good one plans.
    write(
        &m,
        "name = \"bad\"\ncommand = \"true\"\n[watchdog]\nstall = \"2h 30m\"\nstartup = \"off\"\n",
    );
    run_ok(sweep(root.path()).arg("plan").arg(&m));
}

/// A watched command run (a `line_pattern`) that checkpoints on SIGTERM:
/// its handler says it began, takes `seconds`, and exits 99; its next
/// start finds the checkpoint and completes at once.
fn checkpointing_study(root: &Path, name: &str, seconds: u32) -> std::path::PathBuf {
    let m = root.join(format!("{name}.toml"));
    write(
        &m,
        &format!(
            r#"name = "{name}"
executor = "local"
command = '''
if [ -e "$SWEEP_RUN_DIR/ckpt" ]; then echo "step 1: 100 tokens/s"; exit 0; fi
trap 'touch "$SWEEP_RUN_DIR/got-term"; sleep {seconds}; echo saved > "$SWEEP_RUN_DIR/ckpt"; exit 99' TERM
for i in $(seq 1 3000); do echo "step $i: 100 tokens/s"; sleep 0.1; done
'''
[report]
line_pattern = 'step (?P<step>\d+): (?P<tokens_per_second>[0-9.]+) tokens/s'
"#
        ),
    );
    m
}

/// The run's state and reason, from `sweep status --json`.
fn run_state(root: &Path, m: &Path) -> (String, String) {
    let rows = super::support::json_rows(sweep(root).arg("status").arg(m).arg("--json"));
    let r = &rows[0];
    (
        r["state"].as_str().unwrap_or_default().to_string(),
        r["reason"].as_str().unwrap_or_default().to_string(),
    )
}

/// `sweep run` started in the background, once its run has printed progress.
fn running_sweep(root: &Path, m: &Path, run: &Path) -> std::process::Child {
    let child = sweep(root)
        .arg("run")
        .arg(m)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    super::support::wait_for(60, "a progress line", || {
        let log = std::fs::read_to_string(run.join("local.out")).unwrap_or_default();
        log.contains("step 2:").then_some(())
    });
    child
}

/// Whether any process is left in the run's job (its process group), a
/// zombie not yet reaped aside.
fn job_left(run: &Path) -> bool {
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("local.json")).unwrap()).unwrap();
    let group = state["pid"].as_i64().unwrap().to_string();
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        // pid (comm) state ppid pgrp …: after the comm's closing parenthesis.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
        fields.len() > 2 && fields[0] != "Z" && fields[2] == group
    })
}

/// SIGTERM to `sweep run` (as SLURM stops it): the watchdog outlives it
/// with the run it watches, and passes on how it ended: the checkpoint's
/// exit 99, "checkpoint written", nothing left running. (The watchdog died
/// of the signal: the run was recorded stopped while its checkpoint was
/// still being written.)
#[test]
fn a_stopped_sweep_records_its_watched_runs_checkpoint() {
    let root = project();
    let m = checkpointing_study(root.path(), "ckpt-term", 2);
    let run = root.path().join("results/ckpt-term/run");
    let child = running_sweep(root.path(), &m, &run);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    let (state, reason) = run_state(root.path(), &m);
    assert_eq!(state, "INTERRUPTED", "{reason}");
    assert!(reason.contains("checkpoint written"), "{reason}");
    assert!(run.join("ckpt").exists(), "the handler ran to its end");
    assert!(!job_left(&run), "nothing of the job runs on");
    // The next run continues from the checkpoint and completes.
    run_ok(sweep(root.path()).arg("run").arg(&m));
    assert_eq!(run_state(root.path(), &m).0, "COMPLETED");
}

/// Ctrl-C twice: the second ends `sweep run` at once, and the run whose
/// handler is still checkpointing is RUNNING (not INTERRUPTED while it
/// runs), then ends with its checkpoint recorded, which the next `sweep
/// run` continues.
#[test]
fn ctrl_c_twice_leaves_a_watched_run_running_until_it_checkpointed() {
    let root = project();
    let m = checkpointing_study(root.path(), "ckpt-int", 6);
    let run = root.path().join("results/ckpt-int/run");
    let child = running_sweep(root.path(), &m, &run);
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    super::support::wait_for(30, "the run's handler", || {
        run.join("got-term").exists().then_some(())
    });
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    let (state, reason) = run_state(root.path(), &m);
    assert_eq!(state, "RUNNING", "its handler is still at work: {reason}");
    let ended = super::support::wait_for(60, "the run's end", || {
        let s = run_state(root.path(), &m);
        (s.0 != "RUNNING").then_some(s)
    });
    assert_eq!(ended.0, "INTERRUPTED", "{}", ended.1);
    assert!(ended.1.contains("checkpoint written"), "{}", ended.1);
    assert!(!job_left(&run));
    run_ok(sweep(root.path()).arg("run").arg(&m));
    assert_eq!(run_state(root.path(), &m).0, "COMPLETED");
    let log = std::fs::read_to_string(run.join("local.out")).unwrap();
    assert_eq!(log.matches("sweep: local job for run").count(), 2, "{log}");
}

/// `sweep watchdog --dir` naming a folder that is no run's (a typo): it
/// refuses, and leaves what the folder holds as it was (it removed the
/// folder's `progress/` first).
#[test]
fn the_watchdog_touches_nothing_in_a_folder_that_is_no_runs() {
    let root = project();
    let mine = root.path().join("mine");
    std::fs::create_dir_all(mine.join("progress")).unwrap();
    write(&mine.join("progress/rank-0"), "my notes");
    let out = sweep(root.path())
        .args(["watchdog", "--dir"])
        .arg(&mine)
        .args(["--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("is no run directory"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(mine.join("progress/rank-0")).unwrap(),
        "my notes"
    );
}

/// A run whose log is replaced by a FIFO while it runs: the watchdog and
/// the executor never open it (the watchdog blocked on it for ever, and
/// the job with it), and the run ends as its program did.
#[test]
fn a_log_replaced_by_a_fifo_hangs_nothing() {
    let root = project();
    let m = root.path().join("fifo.toml");
    write(
        &m,
        r#"name = "fifo"
executor = "local"
command = '''echo "step 1: 100 tokens/s"; sleep 1; rm "$SWEEP_RUN_DIR/local.out"; mkfifo "$SWEEP_RUN_DIR/local.out"; echo "step 2: 100 tokens/s"; sleep 2; exit 3'''
[report]
line_pattern = 'step (?P<step>\d+): (?P<tokens_per_second>[0-9.]+) tokens/s'
"#,
    );
    let mut child = sweep(root.path())
        .arg("submit")
        .arg(&m)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let ended = super::support::wait_for(60, "the submit's end", || child.try_wait().unwrap());
    assert_eq!(ended.code(), Some(1));
    assert_eq!(status(root.path(), &m)["run"], ("FAILED".into(), Some(3)));
}
