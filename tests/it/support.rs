//! Helpers shared by the integration tests.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A test whose environment is missing (`environment`: `two-nodes`,
/// `read-only-mount`): says `skipped: <why>` and lets the test return —
/// unless `SWEEP_TEST_REQUIRE` names that environment (or `all`), as CI's
/// run of `scripts/test.sh` does, when it fails: a green run never hides an
/// untested path where the environment was asked for.
pub fn skipped(environment: &str, why: &str) {
    let required = std::env::var("SWEEP_TEST_REQUIRE").unwrap_or_default();
    if required
        .split(',')
        .any(|r| r.trim() == environment || r.trim() == "all")
    {
        panic!(
            "SWEEP_TEST_REQUIRE={required} asks for {environment}, which is missing here: {why}"
        );
    }
    // Past the harness's capture (which hides a passing test's output), so
    // that the run says what it did not test.
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "skipped: {why}");
}

/// The `sweep` binary, run from `root` as the project root.
pub fn sweep(root: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sweep"));
    c.arg("-C").arg(root).current_dir(root);
    c
}

/// The `sweep-bench` binary (benchmarks of sweep's own tooling), run in `root`.
pub fn sweep_bench(root: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sweep-bench"));
    c.current_dir(root);
    c
}

/// `sweep submit <manifest> --executor slurm`, which must succeed; its stdout.
pub fn submit_slurm(root: &Path, manifest: &Path) -> String {
    stdout(&run_ok(
        sweep(root)
            .arg("submit")
            .arg(manifest)
            .args(["--executor", "slurm"]),
    ))
}

/// Runs a command and returns its output, with stdout/stderr shown on failure.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("the command starts");
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs a command that must succeed and prints JSON rows (`--json`): the rows.
pub fn json_rows(cmd: &mut Command) -> Vec<serde_json::Value> {
    serde_json::from_slice(&run_ok(cmd).stdout).expect("JSON rows on stdout")
}

/// Runs a command that must fail; its standard error.
pub fn run_err(cmd: &mut Command) -> String {
    let out = cmd.output().expect("the command starts");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{cmd:?} succeeded:\n{err}");
    err
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A temporary project root with the repository's templates linked in.
pub fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::os::unix::fs::symlink(repo().join("templates"), dir.path().join("templates")).unwrap();
    dir
}

/// A FIFO at `path` (nobody writes it: reading it would block for ever).
pub fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "{path:?}");
}

pub fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// The charts every study's report draws (and scaling ones when the world size varies).
pub const CHARTS: [&str; 8] = [
    "throughput",
    "mfu",
    "tflops",
    "batch-size",
    "loss-step",
    "loss-time",
    "throughput-time",
    "mfu-time",
];

/// Polls `f` until it returns Some, or panics after `secs` seconds.
pub fn wait_for<T>(secs: u64, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {secs} s waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// A command stopped at work: its exit status, how long it took to end
/// after the signal, and what it wrote to stderr.
pub struct Stopped {
    pub code: Option<i32>,
    pub took: std::time::Duration,
    pub stderr: String,
}

/// Starts the command `start` builds and sends it `sig` as soon as
/// `at_work` sees it at work (polled every 5 ms, up to 120 s). A command
/// that ends before it is seen at work tested nothing (a fast machine, or
/// the test's thread kept off the CPU by a loaded one): `undo` removes what
/// it wrote and it starts again, up to `tries` times; `Err` then holds the
/// last one's output. The caller decides whether that is a failure.
pub fn stop_at_work(
    mut start: impl FnMut() -> Command,
    mut at_work: impl FnMut() -> bool,
    mut undo: impl FnMut(),
    sig: nix::sys::signal::Signal,
    tries: usize,
) -> Result<Stopped, Output> {
    use std::process::Stdio;
    let mut last = None;
    for _ in 0..tries {
        let mut child = start()
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the command starts");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        let caught = loop {
            if at_work() {
                break true;
            }
            if child.try_wait().expect("the command's status").is_some() {
                break false;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("{:?} was not at work after 120 s", child.wait_with_output());
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        if !caught {
            let o = child.wait_with_output().expect("the command's output");
            eprintln!(
                "the command ended ({}) before it was seen at work",
                o.status
            );
            last = Some(o);
            undo();
            continue;
        }
        let sent = std::time::Instant::now();
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig)
            .expect("the signal is sent");
        let o = child.wait_with_output().expect("the command's output");
        return Ok(Stopped {
            code: o.status.code(),
            took: sent.elapsed(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        });
    }
    Err(last.expect("at least one try"))
}

/// `sweep run <manifest>` as a batch job: `sbatch --wait <args> --wrap …`
/// (`sbatch` a command set up for its cluster) from `root`; its exit status
/// and what the job printed.
pub fn sweep_run_in_allocation(
    sbatch: &mut Command,
    root: &Path,
    manifest: &Path,
    args: &[&str],
) -> (Output, String) {
    let log = root.join("allocation.out");
    let out = sbatch
        .arg("--wait")
        .args(args)
        .arg(format!("--output={}", log.display()))
        .arg(format!("--chdir={}", root.display()))
        .arg("--wrap")
        .arg(format!(
            "exec '{}' run '{}'",
            env!("CARGO_BIN_EXE_sweep"),
            manifest.display()
        ))
        .output()
        .unwrap();
    (out, std::fs::read_to_string(&log).unwrap_or_default())
}

/// `sweep status --json` as (name -> (state, exit_code)).
pub fn status(
    root: &Path,
    manifest: &Path,
) -> std::collections::HashMap<String, (String, Option<i64>)> {
    status_by(sweep(root), manifest)
}

/// `sweep status --json` through `sweep` (a command set up for a cluster).
pub fn status_by(
    mut sweep: Command,
    manifest: &Path,
) -> std::collections::HashMap<String, (String, Option<i64>)> {
    let out = run_ok(sweep.arg("status").arg(manifest).arg("--json"));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status --json is JSON");
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap().to_string(),
                (
                    r["state"].as_str().unwrap().to_string(),
                    r["exit_code"].as_i64(),
                ),
            )
        })
        .collect()
}

/// The step records of a run's metrics.jsonl, read by the trainer's own
/// reader (events, lines that do not parse and a partial last line left out).
pub fn metrics(run: &Path) -> Vec<serde_json::Value> {
    let bytes = std::fs::read(run.join("metrics.jsonl")).unwrap_or_default();
    sweep::train::run::record::parse_log(&bytes)
        .steps()
        .map(|m| serde_json::to_value(m).unwrap())
        .collect()
}

/// (step, loss) of every logged step.
pub fn losses(run: &Path) -> Vec<(u64, f64)> {
    metrics(run)
        .iter()
        .map(|v| (v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap()))
        .collect()
}

/// The SLURM job id recorded in a run's run.json.
/// Why the run's last job was stopped, as it recorded in `run.json` (the
/// watchdog's or the launch doctor's record).
pub fn stop_record(run: &Path) -> serde_json::Value {
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("run.json")).unwrap()).unwrap();
    let stop = record["jobs"].as_array().unwrap().last().unwrap()["stopped"].clone();
    assert!(stop.is_object(), "the last job records no stop: {record}");
    stop
}

pub fn job_id(run: &Path) -> String {
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("run.json")).unwrap()).unwrap();
    record["jobs"][0]["job_id"].as_str().unwrap().to_string()
}

/// Waits until SLURM has queued the job again after a requeue, then releases
/// it: SLURM holds requeued jobs for a while (Reason=BeginTime) against
/// requeue loops, which an administrator can lift. Returns the job's record
/// as it was while held.
pub fn release_requeued(job: &str) -> String {
    let held = wait_requeued(job);
    wait_steps_gone(job);
    // The kill revoked the job's credential on slurmd, at the latest in the
    // second its steps were last seen, and revocation has one-second
    // resolution: a relaunch within that second is refused ("Job N already
    // killed, do not launch batch job") and the job FAILS. SLURM's own hold
    // exists for this; releasing early waits for the clock's next second.
    let second = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    };
    let gone = second();
    wait_for(5, "a later second than the revocation's", || {
        (second() > gone).then_some(())
    });
    run_ok(Command::new("scontrol").args(["update", &format!("JobId={job}"), "StartTime=now"]));
    held
}

/// Waits until SLURM has queued the job again after a requeue; returns its
/// record.
pub fn wait_requeued(job: &str) -> String {
    wait_for(120, "the job to be queued again", || {
        let out = Command::new("scontrol")
            .args(["show", "job", "-o", job])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (text.contains("JobState=PENDING") && text.contains("Restarts=1")).then_some(text)
    })
}

/// Waits until the step daemons of the job's previous attempt have exited.
pub fn wait_steps_gone(job: &str) {
    // A new step with the same id cannot start until they have (with PMIx,
    // its socket `stepd.slurm.pmix.<job>.0` is still bound). SLURM's own
    // hold covers this; releasing early must wait for them.
    let prefix = format!("slurmstepd: [{job}.");
    wait_for(60, "the previous attempt's steps to exit", || {
        let alive = std::fs::read_dir("/proc").ok()?.flatten().any(|e| {
            std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).starts_with(&prefix))
        });
        (!alive).then_some(())
    });
}

/// Every SLURM output file (`*.out`) of a run, concatenated.
pub fn job_logs(run: &Path) -> String {
    std::fs::read_dir(run)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".out"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .collect()
}

/// One step record of `metrics.jsonl`, as the trainer writes it.
pub fn step_line(step: usize, loss: f64, tokens_per_second: f64, elapsed_s: f64) -> String {
    let m = sweep::train::run::record::StepMetrics {
        step,
        loss,
        lr: 1e-3,
        grad_norm: 1.0,
        tokens_per_second,
        world_size: 1,
        batch_size: 1,
        global_tokens_per_second: tokens_per_second,
        training_tokens_pct: 50.0,
        mfu_pct: 10.0,
        tflops: 0.1,
        step_time_s: 1.0,
        elapsed_s,
        peak_memory_mb: 100.0,
        val_loss: None,
        rank_compute_s: Vec::new(),
        watts: None,
        joules_per_token: None,
    };
    serde_json::to_string(&sweep::train::run::record::Record::from(m)).unwrap()
}

/// `sweep report --json` over the reference study's eight DDP logs
/// (`lsai_ddp_baseline_padded_ws_{4,8,12,16}_bs_{1,8}`): one row each.
pub fn reference_ddp_report(root: &Path) -> Vec<serde_json::Value> {
    let glob = format!(
        "{}/lsai_ddp_baseline_padded_ws_*.out",
        repo().join("tests/fixtures/reference-torch-logs").display()
    );
    let out = run_ok(sweep(root).args([
        "report",
        "--log-format",
        "reference",
        "--name",
        "ddp",
        "--json",
        "--import",
        &glob,
    ]));
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows.len(), 8);
    rows
}

/// The tiny model on the bundled text, batch 1 a rank, one thread: the
/// `[defaults]` of the data-parallel studies.
#[cfg(feature = "mpi")]
pub fn tiny_defaults() -> String {
    format!(
        r#"tokenizer = "{tok}"
dataset = "{data}"
model = "tiny"
architecture = {{ dim = 32, n_layers = 2 }}
dataset_type = "padded"
sequence_length = 64
batch_size = 1
learning_rate = 3e-3
warmup_steps = 2
logging_frequency = 1
threads = 1"#,
        tok = repo()
            .join("assets/tokenizers/mistral-7b/tokenizer.json")
            .display(),
        data = repo().join("assets/data/quickstart.parquet").display(),
    )
}
