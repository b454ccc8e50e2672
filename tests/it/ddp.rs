//! Data parallelism of the built-in trainer with real ranks: MPI between CPU
//! processes, started by `mpirun` (local executor) and by `srun --mpi=pmix`
//! (the local SLURM cluster). Built only with the `mpi` feature, which
//! `scripts/test.sh` turns on.

use super::support::{
    job_id, job_logs, losses, metrics, project, release_requeued, repo, run_ok, status,
    submit_slurm, sweep, wait_for, wait_requeued, wait_steps_gone, write,
};
use std::path::{Path, PathBuf};
use std::process::Command;

/// What the two runs of a study read.
enum Data {
    /// Both read the bundled dataset in the global order (the default): the
    /// same samples at every step whatever the world size.
    Bundled,
    /// Both read the bundled dataset, each rank its own contiguous shard.
    BundledContiguous,
    /// The reference's contiguous shards on two crafted copies of the same
    /// 40 documents that make the samples equal: `split.parquet` holds
    /// a₀…a₁₉ then b₀…b₁₉ (two ranks read a and b, one document per step
    /// each), `interleaved.parquet` holds a₀ b₀ a₁ b₁ … (one rank at batch 2
    /// reads aₖ and bₖ together).
    CraftedContiguous,
}

fn crafted(root: &Path) -> (PathBuf, PathBuf) {
    let (split, interleaved) = (root.join("split.parquet"), root.join("interleaved.parquet"));
    let script = format!(
        r#"
import pyarrow as pa, pyarrow.parquet as pq
docs = pq.read_table({src:?}).column("text").to_pylist()[:40]
a, b = docs[:20], docs[20:]
pq.write_table(pa.table({{"text": a + b}}), {split:?})
pq.write_table(pa.table({{"text": [d for pair in zip(a, b) for d in pair]}}), {inter:?})
"#,
        src = bundled().display().to_string(),
        split = split.display().to_string(),
        inter = interleaved.display().to_string(),
    );
    run_ok(Command::new("python3").args(["-c", &script]));
    (split, interleaved)
}

fn bundled() -> PathBuf {
    repo().join("assets/data/quickstart.parquet")
}

/// One study of two runs: `ranks-1` (one rank, batch 2) and `ranks-2` (two
/// ranks, batch 1 each); `extra` goes into `[defaults]`.
fn study(root: &Path, name: &str, extra: &str, data: Data) -> PathBuf {
    let (order, datasets) = match data {
        Data::Bundled => ("global", [bundled(), bundled()]),
        Data::BundledContiguous => ("contiguous", [bundled(), bundled()]),
        Data::CraftedContiguous => {
            let (split, interleaved) = crafted(root);
            ("contiguous", [interleaved, split])
        }
    };
    let m = root.join(format!("{name}.toml"));
    write(
        &m,
        &format!(
            r#"name = "{name}"
executor = "local"
[defaults]
tokenizer = "{tok}"
model = "tiny"
architecture = {{ dim = 32, n_layers = 2 }}
dataset_type = "padded"
data_order = "{order}"
sequence_length = 64
learning_rate = 3e-3
warmup_steps = 2
logging_frequency = 1
threads = 1
{extra}
[sweep]
name = "ranks-{{{{ slurm.ntasks_per_node }}}}"
[[sweep.zip]]
"slurm.ntasks_per_node" = [1, 2]
batch_size = [2, 1]
dataset = [{one:?}, {two:?}]
[local]
parallel = 1
threads = 2
[slurm]
time = "10"
job_name = "sweep-test-{name}"
cpus_per_task = 1
env = {{ SWEEP_CHECK_REPLICAS = "1" }}
"#,
            tok = repo()
                .join("assets/tokenizers/mistral-7b/tokenizer.json")
                .display(),
            one = datasets[0].display().to_string(),
            two = datasets[1].display().to_string(),
        ),
    );
    m
}

/// The per-step losses of both runs agree within float summation order, and
/// the two-rank run counts both ranks' tokens.
fn assert_same_curve(study: &Path, steps: u64) {
    assert_same_curve_from(study, steps, |_| false);
    let m = metrics(&study.join("ranks-2"));
    let last = m.last().unwrap();
    assert_eq!(last["world_size"], 2);
    let (per_device, global) = (
        last["tokens_per_second"].as_f64().unwrap(),
        last["global_tokens_per_second"].as_f64().unwrap(),
    );
    assert!((global - 2.0 * per_device).abs() < 1e-6 * global, "{last}");
}

/// The per-step losses of `ranks-1` and `ranks-2` agree within 1e-5
/// relative; `resumed(step)` says which steps of `ranks-2` ran after a
/// resume (for the message).
fn assert_same_curve_from(study: &Path, steps: u64, resumed: impl Fn(u64) -> bool) {
    assert_curves_agree(study, ["ranks-1", "ranks-2"], steps, resumed);
}

/// The per-step losses of a study's two runs (`runs`: the reference, then
/// the one that differs) agree within 1e-5 relative (float summation order)
/// over `steps` steps, and fall; `resumed(step)` says which steps of the
/// second ran after a resume (for the message).
pub fn assert_curves_agree(
    study: &Path,
    runs: [&str; 2],
    steps: u64,
    resumed: impl Fn(u64) -> bool,
) {
    let one = losses(&study.join(runs[0]));
    let two = losses(&study.join(runs[1]));
    assert_eq!(one.len() as u64, steps, "{one:?}");
    assert_eq!(
        one.iter().map(|x| x.0).collect::<Vec<_>>(),
        two.iter().map(|x| x.0).collect::<Vec<_>>()
    );
    for ((step, a), (_, b)) in one.iter().zip(&two) {
        let rel = (a - b).abs() / a.abs();
        let after = if resumed(*step) {
            " (after the resume)"
        } else {
            ""
        };
        assert!(
            rel <= 1e-5,
            "step {step}{after}: {} {a} vs {} {b} (relative {rel:e})",
            runs[0],
            runs[1]
        );
    }
    let mean = |xs: &[(u64, f64)]| xs.iter().map(|x| x.1).sum::<f64>() / xs.len() as f64;
    assert!(
        mean(&one[one.len() - 3..]) < mean(&one[..3]),
        "the loss falls: {one:?}"
    );
}

fn assert_replicas_checked(log: &str) {
    assert!(
        log.contains("parameters identical on all 2 ranks")
            && log.contains("2 rank(s), gradients summed by"),
        "{log}"
    );
}

/// Submits a study with the local executor (mpirun) and checks that both
/// runs completed on the same curve.
fn same_curve_locally(name: &str, extra: &str, data: Data, steps: u64) {
    let root = project();
    let m = study(root.path(), name, extra, data);
    run_ok(sweep(root.path()).arg("submit").arg(&m));
    let s = status(root.path(), &m);
    assert!(s.values().all(|(st, _)| st == "COMPLETED"), "{s:?}");
    let dir = root.path().join("results").join(name);
    assert_same_curve(&dir, steps);
    let log = std::fs::read_to_string(dir.join("ranks-2/local.out")).unwrap();
    assert_replicas_checked(&log);
}

#[test]
fn two_ranks_at_batch_one_train_like_one_rank_at_batch_two_locally() {
    same_curve_locally("ddp-local", "training_steps = 8", Data::Bundled, 8);
}

#[test]
fn with_gradient_accumulation_too() {
    same_curve_locally(
        "ddp-accumulation",
        "training_steps = 6\ngradient_accumulation = 2",
        Data::Bundled,
        6,
    );
}

#[test]
fn the_contiguous_order_trains_each_rank_on_its_own_shard() {
    same_curve_locally(
        "ddp-contiguous",
        "training_steps = 8",
        Data::CraftedContiguous,
        8,
    );
}

/// Summing gradient buckets during the backward pass (the default on MPI)
/// and after it (SWEEP_BLOCKING_ALLREDUCE) sends the same buckets in the same
/// order: the parameters end bit for bit the same.
#[test]
fn overlapped_and_blocking_sums_give_identical_parameters() {
    let digest = |blocking: bool| {
        let root = project();
        let m = study(
            root.path(),
            "ddp-overlap",
            "training_steps = 6\ngradient_accumulation = 2",
            Data::Bundled,
        );
        let mut cmd = sweep(root.path());
        if blocking {
            cmd.env("SWEEP_BLOCKING_ALLREDUCE", "1");
        }
        run_ok(cmd.arg("submit").arg(&m));
        let log =
            std::fs::read_to_string(root.path().join("results/ddp-overlap/ranks-2/local.out"))
                .unwrap();
        let when = if blocking { "after" } else { "during" };
        assert!(log.contains(&format!("{when} the backward pass")), "{log}");
        let at = log.find("(sha256 ").expect("the final digest") + 8;
        log[at..at + 16].to_string()
    };
    assert_eq!(digest(false), digest(true));
}

/// `sweep bench ddp` runs every world size in each round, with real ranks,
/// and reports the medians with each round's efficiency and all-reduce share.
#[test]
fn bench_ddp_reports_the_median_of_its_rounds() {
    let root = project();
    let out = run_ok(sweep(root.path()).args([
        "bench",
        "ddp",
        "--ranks",
        "1,2",
        "--model",
        "tiny",
        "--steps",
        "1",
        "--batch",
        "1",
        "--seq-len",
        "32",
        "--repeats",
        "2",
    ]));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.contains("median of 2 rounds"), "{text}");
    let row = |ranks: &str| {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(ranks))
            .unwrap_or_else(|| panic!("no row for {ranks} rank(s):\n{text}"))
            .to_string()
    };
    assert!(row("1").trim_end().ends_with("100.0%"), "{text}");
    let two = row("2");
    let rounds = two
        .split("rounds (efficiency/all-reduce %): ")
        .nth(1)
        .unwrap_or_else(|| panic!("no rounds in {two}"));
    assert_eq!(rounds.split(", ").count(), 2, "{two}");
    for round in rounds.split(", ") {
        let (eff, share) = round.trim().split_once('/').unwrap();
        let (eff, share): (f64, f64) = (eff.parse().unwrap(), share.parse().unwrap());
        assert!(eff > 0.0 && (0.0..100.0).contains(&share), "{two}");
    }
}

/// In the contiguous order the bundled data gives 2 ranks other samples than
/// 1 rank at twice the batch: the curves part (what the global order is for).
#[test]
fn the_contiguous_order_on_ordinary_data_leaves_the_curve() {
    let root = project();
    let m = study(
        root.path(),
        "ddp-shards",
        "training_steps = 8",
        Data::BundledContiguous,
    );
    run_ok(sweep(root.path()).arg("submit").arg(&m));
    let dir = root.path().join("results/ddp-shards");
    let (one, two) = (losses(&dir.join("ranks-1")), losses(&dir.join("ranks-2")));
    let (a, b) = (one.last().unwrap().1, two.last().unwrap().1);
    assert!((a - b).abs() / a > 1e-3, "step 8: {a} vs {b}");
}

#[test]
#[ignore = "needs the local SLURM cluster: scripts/local-slurm.sh up (scripts/test.sh does it)"]
fn two_ranks_at_batch_one_train_like_one_rank_at_batch_two_on_slurm() {
    super::slurm::require_cluster();
    let root = project();
    let m = study(
        root.path(),
        "ddp-slurm",
        "training_steps = 8",
        Data::Bundled,
    );
    submit_slurm(root.path(), &m);
    let s = wait_for(300, "both runs to finish", || {
        let s = status(root.path(), &m);
        s.values()
            .all(|(st, _)| st == "COMPLETED" || st == "FAILED")
            .then_some(s)
    });
    let dir = root.path().join("results/ddp-slurm");
    assert!(
        s.values().all(|(st, _)| st == "COMPLETED"),
        "{s:?}\n{}",
        job_logs(&dir.join("ranks-2"))
    );
    assert_same_curve(&dir, 8);
    let script = std::fs::read_to_string(dir.join("ranks-2/job.sbatch")).unwrap();
    assert!(
        script.contains("--kill-on-bad-exit=1") && script.contains("--mpi=pmix"),
        "{script}"
    );
    assert_replicas_checked(&job_logs(&dir.join("ranks-2")));
}

#[test]
#[ignore = "needs the local SLURM cluster: scripts/local-slurm.sh up (scripts/test.sh does it)"]
fn a_two_rank_job_requeues_on_sigusr1_and_resumes_on_the_curve() {
    super::slurm::require_cluster();
    let root = project();
    let (m, dir, job) = stopped_on_slurm(root.path(), "ddp-requeue", 150);
    let run = dir.join("ranks-2");
    release_requeued(&job);
    let s = wait_for(600, "both runs to finish", || {
        let s = status(root.path(), &m);
        s.values()
            .all(|(st, _)| st == "COMPLETED" || st == "FAILED")
            .then_some(s)
    });
    let log = job_logs(&run);
    assert!(s.values().all(|(st, _)| st == "COMPLETED"), "{s:?}\n{log}");
    assert!(
        log.contains("received; checkpoint") && log.contains("resumed from"),
        "{log}"
    );
    let steps: Vec<u64> = losses(&run).iter().map(|(s, _)| *s).collect();
    assert_eq!(
        steps,
        (1..=150).collect::<Vec<_>>(),
        "every step once across the requeue"
    );
    assert_replicas_checked(&log);
    // The interrupted two-rank run stays on the uninterrupted one-rank curve.
    assert_same_curve(&dir, 150);
}

/// Submits a study of `steps` steps on the bundled data to SLURM and, once
/// the two-rank run has logged 5 steps, sends its job SIGUSR1 (checkpoint and
/// requeue); returns the manifest, the study's directory and the job.
fn stopped_on_slurm(root: &Path, name: &str, steps: u64) -> (PathBuf, PathBuf, String) {
    let m = study(
        root,
        name,
        &format!("training_steps = {steps}"),
        Data::Bundled,
    );
    submit_slurm(root, &m);
    let dir = root.join("results").join(name);
    let run = dir.join("ranks-2");
    wait_for(180, "training to start", || {
        (losses(&run).len() >= 5).then_some(())
    });
    let job = job_id(&run);
    run_ok(Command::new("scancel").args(["--signal=USR1", &job]));
    (m, dir, job)
}

/// Two ranks train for a while; their job stops on SIGUSR1 and is cancelled
/// while queued again, and the run is continued by one rank (the same job
/// script submitted with `--ntasks-per-node=1`): it keeps the global batch by
/// accumulating two micro-batches, and the curve goes on as the uninterrupted
/// one-rank run's.
#[test]
#[ignore = "needs the local SLURM cluster: scripts/local-slurm.sh up (scripts/test.sh does it)"]
fn a_two_rank_run_resumes_on_one_rank_on_the_same_curve() {
    super::slurm::require_cluster();
    let root = project();
    let steps = 60;
    let (m, dir, job) = stopped_on_slurm(root.path(), "ddp-elastic", steps);
    let run = dir.join("ranks-2");
    wait_requeued(&job);
    run_ok(Command::new("scancel").arg(&job));
    wait_steps_gone(&job);
    let stopped_at = losses(&run).len() as u64;
    assert!(stopped_at < steps, "stopped before the end: {stopped_at}");
    let out = run_ok(
        Command::new("sbatch")
            .args(["--parsable", "--ntasks-per-node=1"])
            .arg(run.join("job.sbatch")),
    );
    let resumed = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let state = wait_for(300, "the one-rank job to finish", || {
        let out = Command::new("scontrol")
            .args(["show", "job", "-o", &resumed])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"]
            .into_iter()
            .find(|s| text.contains(&format!("JobState={s}")))
    });
    let log = job_logs(&run);
    assert_eq!(state, "COMPLETED", "{log}");
    assert!(
        log.contains(
            "world size 2 → 1, global order, global batch 2 kept (gradient accumulation 1 → 2)"
        ),
        "the log says what changed: {log}"
    );
    let steps_seen: Vec<u64> = losses(&run).iter().map(|(s, _)| *s).collect();
    assert_eq!(
        steps_seen,
        (1..=steps).collect::<Vec<_>>(),
        "every step once"
    );
    let last = metrics(&run).last().unwrap().clone();
    assert_eq!(last["world_size"], 1, "{last}");
    wait_for(300, "the uninterrupted run to finish", || {
        (status(root.path(), &m)["ranks-1"].0 == "COMPLETED").then_some(())
    });
    assert_same_curve_from(&dir, steps, |step| step > stopped_at);
}

/// The pid of the `sweep` process that is rank `rank` of the local MPI job
/// training `run`.
fn rank_pid(run: &Path, rank: u32) -> Option<i32> {
    let want_rank = format!("OMPI_COMM_WORLD_RANK={rank}");
    let want_config = run.join("config.toml").display().to_string();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let is_trainer = args[0].ends_with("sweep") && args.iter().any(|a| a == &want_config);
        let env = std::fs::read(e.path().join("environ")).ok()?;
        let env = String::from_utf8_lossy(&env);
        (is_trainer && env.split('\0').any(|v| v == want_rank)).then_some(pid)
    })
}

/// The study's two-rank run alone, training (all but) for ever; `sections`
/// are added to the manifest.
fn two_ranks_for_ever(root: &Path, name: &str, sections: &str) -> PathBuf {
    let m = study(root, name, "training_steps = 100000", Data::Bundled);
    let text = std::fs::read_to_string(&m).unwrap();
    let only_two = format!("[[sweep.exclude]]\n\"slurm.ntasks_per_node\" = 1\n{sections}[local]");
    write(&m, &text.replace("[local]", &only_two));
    m
}

#[test]
fn a_rank_killed_mid_run_fails_the_job_within_a_minute() {
    let root = project();
    let m = two_ranks_for_ever(root.path(), "ddp-kill", "");
    let mut child = sweep(root.path()).arg("submit").arg(&m).spawn().unwrap();
    let run = root.path().join("results/ddp-kill/ranks-2");
    wait_for(120, "training to start", || {
        (losses(&run).len() >= 3).then_some(())
    });
    let pid = wait_for(10, "rank 1's process", || rank_pid(&run, 1));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // The bound: the whole job ends within a minute of its rank's death
    // (the survivor does not wait in the gradient sum for ever).
    let exit = wait_for(60, "the job to fail after its rank died", || {
        child.try_wait().unwrap()
    });
    assert!(!exit.success(), "sweep reports the failed run");
    let steps = losses(&run).len();
    assert!(
        steps < 100_000,
        "it ended at the kill, not at its last step ({steps} logged)"
    );
    let s = status(root.path(), &m);
    assert_eq!(s["ranks-2"].0, "FAILED", "{s:?}");
    let log = std::fs::read_to_string(run.join("local.out")).unwrap();
    assert!(
        log.contains("rank 1") && log.contains("signal 9"),
        "mpirun names the dead rank: {log}"
    );
}

/// A two-rank run logs every rank's compute time per interval and the
/// ranks' hosts. Both runs' speeds are then set by the test, so the verdict
/// rests on the edit alone and not on the machine's load: measured
/// (`sweep submit`, which leaves the report to `sweep report`) and reported
/// at set speeds, measured again with `--again`, and its two-rank log given
/// a straggler — rank 1's compute four times its peer's, the run's
/// throughput halved, as a rank on a busy core makes it — before the report
/// reads it: the report names rank 1 and its node with the figures, and
/// `sweep check --history` names it beside the regression it causes (a rank
/// on a core three busy processes share is a demonstration, not a test:
/// docs/data-parallelism.md).
#[test]
fn a_slow_rank_is_named_a_straggler_in_the_report_and_the_check() {
    let root = project();
    let m = study(
        root.path(),
        "ddp-straggler",
        "training_steps = 16",
        Data::Bundled,
    );
    let dir = root.path().join("results/ddp-straggler");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let host = host.trim().to_string();
    run_ok(sweep(root.path()).arg("submit").arg(&m));
    set_speeds(&dir.join("ranks-1/metrics.jsonl"), &host, 1, false);
    set_speeds(&dir.join("ranks-2/metrics.jsonl"), &host, 2, false);
    run_ok(sweep(root.path()).arg("report").arg(&m));

    run_ok(sweep(root.path()).args(["submit", "--again"]).arg(&m));
    set_speeds(&dir.join("ranks-1/metrics.jsonl"), &host, 1, false);
    set_speeds(&dir.join("ranks-2/metrics.jsonl"), &host, 2, true);

    let out = run_ok(sweep(root.path()).arg("report").arg(&m));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let named = format!("straggler: ranks-2: rank 1 of 2 on node {host} computes");
    assert!(text.contains(&named), "{text}");
    assert!(!text.contains("rank 0 of 2"), "{text}");
    let md = std::fs::read_to_string(dir.join("summary.md")).unwrap();
    assert!(
        md.contains("Stragglers") && md.contains("rank 1 of 2"),
        "{md}"
    );
    let page = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(page.contains("id=\"stragglers\""));

    let check = sweep(root.path())
        .args(["check", "--history"])
        .arg(&m)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&check.stdout).into_owned();
    assert_eq!(check.status.code(), Some(1), "{text}");
    assert!(
        text.contains("ranks-2 regressed; straggler ranks-2: rank 1 of 2 on node"),
        "{text}"
    );
}

/// Checks what the trainer logged in `path` (16 steps; for two ranks, their
/// hosts and each one's compute time, finite, at every step) and sets every
/// step's speed: 1000 tokens/s per rank with a 1% spread that repeats, the
/// same at every measurement; halved, with rank 1's compute four times rank
/// 0's, where `straggle`.
fn set_speeds(path: &Path, host: &str, ranks: usize, straggle: bool) {
    let log = std::fs::read_to_string(path).unwrap();
    let mut records: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    if ranks > 1 {
        assert_eq!(
            records[0]["hosts"],
            serde_json::json!(vec![host; ranks]),
            "{log}"
        );
    }
    let mut steps = 0;
    for r in records.iter_mut().filter(|r| r.get("loss").is_some()) {
        if ranks > 1 {
            let times: Vec<f64> = serde_json::from_value(r["rank_compute_s"].clone()).unwrap();
            assert!(
                times.len() == ranks && times.iter().all(|t| t.is_finite() && *t > 0.0),
                "{r}"
            );
            let compute = match straggle {
                false => vec![0.1; ranks],
                true => vec![0.1, 0.4],
            };
            r["rank_compute_s"] = serde_json::json!(compute);
        }
        let spread = 1.0 + 0.01 * ((steps % 3) as f64 - 1.0);
        let speed = if straggle { 500.0 } else { 1000.0 } * spread;
        r["tokens_per_second"] = speed.into();
        r["global_tokens_per_second"] = (speed * ranks as f64).into();
        steps += 1;
    }
    assert_eq!(steps, 16);
    let text: String = records.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(path, text).unwrap();
}

/// A rank stopped mid-run (SIGSTOP: as a rank wedged in a driver or a
/// file system looks): the other waits in the gradient sum for ever, and
/// the run's watchdog stops the run as HUNG within its `stall`, naming the
/// stopped rank and its host, with the running rank's threads' stacks.
#[test]
fn a_stopped_rank_is_hung_naming_it_and_its_host() {
    let root = project();
    let m = two_ranks_for_ever(root.path(), "ddp-stop", "[watchdog]\nstall = \"6s\"\n");
    let mut child = sweep(root.path()).arg("submit").arg(&m).spawn().unwrap();
    let run = root.path().join("results/ddp-stop/ranks-2");
    let beat = |rank: usize| {
        let text = std::fs::read_to_string(run.join(format!("progress/rank-{rank}"))).ok()?;
        let f: Vec<String> = text.split_whitespace().map(str::to_string).collect();
        Some((
            f.first()?.parse::<u64>().ok()?,
            f.get(1)?.parse::<u64>().ok()?,
            f.get(2)?.clone(),
            f.get(3)?.parse::<i32>().ok()?,
        ))
    };
    let (_, _, host, pid) = wait_for(120, "rank 1 to finish three steps", || {
        beat(1).filter(|b| b.0 >= 3)
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .unwrap();
    let stopped_at = std::time::Instant::now();
    let exit = wait_for(60, "the watchdog to stop the run", || {
        child.try_wait().unwrap()
    });
    let released = stopped_at.elapsed().as_secs_f64();
    assert!(!exit.success(), "sweep reports the hung run");
    let s = status(root.path(), &m);
    assert_eq!(s["ranks-2"], ("HUNG".into(), Some(97)), "{s:?}");
    let stopped = super::support::stop_record(&run);
    assert_eq!(stopped["ranks"], serde_json::json!([1]), "{stopped}");
    assert_eq!(stopped["nodes"], serde_json::json!([host]), "{stopped}");
    let reason = stopped["reason"].as_str().unwrap();
    assert!(
        reason.contains(&format!("rank 1 on {host} is stopped (SIGSTOP)")),
        "{reason}"
    );
    let evidence = std::fs::read_to_string(run.join("watchdog.log")).unwrap();
    assert!(
        evidence.contains("## Each rank's last report (2 of 2 ranks reported)")
            && evidence.contains("## Stacks of rank 0")
            && evidence.contains("(sweep-stacks)")
            && evidence.contains("#0 "),
        "each rank's report and rank 0's stacks: {evidence}"
    );
    let quiet = stopped["quiet_s"].as_f64().unwrap();
    assert!((6.0..20.0).contains(&quiet), "{stopped}");
    eprintln!(
        "ddp-stop: HUNG after {quiet:.1} s without progress (stall 6 s); the job ended {released:.1} s after the SIGSTOP"
    );
}
