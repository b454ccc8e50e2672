//! The main job end to end on the local SLURM cluster, and the failure
//! drills: a killed training job is requeued and resumes; a run with a bad
//! dataset fails alone; running a finished sweep again submits nothing.

use super::page::check_study_page;
use super::slurm::require_cluster;
use super::support::{
    job_id, job_logs, losses, release_requeued, repo, run_ok, status, stdout, submit_slurm, sweep,
    wait_for, write, CHARTS,
};
use std::path::Path;
use std::process::Command;

/// A project root with the repository's assets, templates and experiments.
fn project_with_assets() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for d in ["assets", "templates", "experiments"] {
        std::os::unix::fs::symlink(repo().join(d), dir.path().join(d)).unwrap();
    }
    dir
}

/// How many jobs of this study SLURM knows (other tests submit at the same time).
/// The jobs (array tasks counted one by one) the scheduler knows, as (id, name).
fn known_jobs() -> Vec<(String, String)> {
    stdout(&run_ok(
        Command::new("squeue").args(["--me", "-h", "-t", "all", "-r", "-o", "%i %j"]),
    ))
    .lines()
    .filter_map(|l| l.split_once(' '))
    .map(|(id, name)| (id.to_string(), name.to_string()))
    .collect()
}

/// The jobs of `study` that were not known `before` (an earlier test run on
/// the same cluster leaves finished jobs of the same name for MinJobAge).
fn jobs_of_study(study: &str, before: &[(String, String)]) -> usize {
    known_jobs()
        .iter()
        .filter(|job| job.1.starts_with(study) && !before.contains(job))
        .count()
}

#[test]
#[ignore = "needs the local SLURM cluster"]
fn the_quickstart_runs_through_slurm_and_a_second_run_submits_nothing() {
    require_cluster();
    let before = known_jobs();
    let root = project_with_assets();
    // The quickstart as shipped, with fewer steps and one run per configuration.
    let text = std::fs::read_to_string(repo().join("experiments/quickstart.toml")).unwrap();
    assert!(text.contains("training_steps = 24") && text.contains("repeats = 3"));
    let m = root.path().join("quickstart-short.toml");
    write(
        &m,
        &text
            .replace("training_steps = 24", "training_steps = 12")
            .replace("repeats = 3", "repeats = 1")
            .replace("name = \"quickstart\"", "name = \"quickstart-short\""),
    );
    let out = run_ok(
        sweep(root.path())
            .arg("run")
            .arg(&m)
            .args(["--executor", "slurm"]),
    );
    let table = stdout(&out);
    let study = root.path().join("results/quickstart-short");
    for name in ["baseline", "pretokenized"] {
        for kind in ["padded", "padding-free"] {
            for bs in [1, 2] {
                let row = format!("| {name}-{kind}-bs{bs} |");
                assert!(
                    table
                        .lines()
                        .any(|l| l.starts_with(&row) && l.ends_with("| COMPLETED |")),
                    "{row} missing from\n{table}"
                );
            }
        }
    }
    for kind in ["padded", "padding-free"] {
        for bs in [1, 2] {
            let a = losses(&study.join(format!("baseline-{kind}-bs{bs}")));
            let b = losses(&study.join(format!("pretokenized-{kind}-bs{bs}")));
            assert_eq!(a.len(), 7, "steps 1, 2, 4, ..., 12");
            assert_eq!(
                a, b,
                "{kind} bs{bs}: pretokenized and on-the-fly loss curves differ"
            );
        }
    }
    for f in ["summary.md", "summary.csv", "summary.parquet"] {
        assert!(study.join(f).is_file(), "{f}");
    }
    // It ends by naming its page, which a browser shows with the table's
    // numbers and the charts (its first screen is the README's picture).
    let page = study.join("report.html");
    assert!(
        table.contains(&format!("the report, one page: {}", page.display())),
        "{table}"
    );
    check_study_page(&page, &study.join("summary.csv"), "quickstart-report.png");
    for chart in CHARTS {
        assert!(
            root.path()
                .join(format!("plots/quickstart-short/{chart}.png"))
                .is_file(),
            "{chart}"
        );
    }

    // Again: nothing is submitted, the report is written again.
    let jobs = jobs_of_study("quickstart-short", &before);
    assert_eq!(jobs, 10, "two pretokenize stages and eight runs");
    let summary = study.join("summary.md");
    std::fs::remove_file(&summary).unwrap();
    let again = run_ok(
        sweep(root.path())
            .arg("run")
            .arg(&m)
            .args(["--executor", "slurm"]),
    );
    let text = String::from_utf8_lossy(&again.stdout);
    assert!(
        text.contains("skip baseline-padded-bs1 (COMPLETED)")
            && text.contains("(output already present)"),
        "{text}"
    );
    assert_eq!(
        jobs_of_study("quickstart-short", &before),
        jobs,
        "a finished sweep submits nothing"
    );
    assert!(summary.is_file(), "the report is rendered again");
}

/// A training run on the bundled data (unless an axis names the dataset);
/// `extra` goes into [defaults].
fn training_manifest(root: &Path, name: &str, extra: &str, axes: &str) -> std::path::PathBuf {
    let m = root.join(format!("{name}.toml"));
    let dataset = if axes.contains("dataset =") {
        ""
    } else {
        "dataset = \"assets/data/quickstart.parquet\"\n"
    };
    write(
        &m,
        &format!(
            "name = \"{name}\"\n[defaults]\n{dataset}model = \"tiny\"\narchitecture = {{ dim = 32, n_layers = 1 }}\nsequence_length = 128\nbatch_size = 2\nlearning_rate = 3e-3\nwarmup_steps = 2\nlogging_frequency = 1\n{extra}\n{axes}\n[slurm]\ntime = \"10\"\ncpus_per_task = 1\n"
        ),
    );
    m
}

#[test]
#[ignore = "needs the local SLURM cluster"]
fn a_killed_training_job_is_requeued_and_resumes_from_its_checkpoint() {
    require_cluster();
    let root = project_with_assets();
    let m = training_manifest(
        root.path(),
        "killed",
        "training_steps = 150\ncheckpoint_every = 5",
        "",
    );
    submit_slurm(root.path(), &m);
    let run = root.path().join("results/killed/run");
    wait_for(120, "step 20", || (losses(&run).len() >= 20).then_some(()));
    let job = job_id(&run);
    // What a node failure or preemption does: SLURM kills the job and queues it again.
    run_ok(Command::new("scontrol").args(["requeue", &job]));
    release_requeued(&job);
    wait_for(300, "the requeued job to finish", || {
        (status(root.path(), &m)["run"].0 == "COMPLETED").then_some(())
    });
    let steps: Vec<u64> = losses(&run).iter().map(|(s, _)| *s).collect();
    assert_eq!(
        steps,
        (1..=150).collect::<Vec<_>>(),
        "every step exactly once across the kill"
    );
    let log = job_logs(&run);
    assert!(
        log.contains("resumed from") && log.contains("restart 1"),
        "{log}"
    );
}

#[test]
#[ignore = "needs the local SLURM cluster"]
fn a_run_with_a_bad_dataset_path_fails_alone_with_a_clear_error() {
    require_cluster();
    let root = project_with_assets();
    let m = training_manifest(
        root.path(),
        "baddata",
        "training_steps = 4",
        "[sweep.grid]\ndataset = [\"assets/data/quickstart.parquet\", \"assets/data/no-such-file.parquet\"]\nseed = [1, 2]\n[sweep]\nname = \"{{ 'good' if 'quickstart' in dataset else 'bad' }}-seed{{ seed }}\"",
    );
    let out = sweep(root.path())
        .arg("run")
        .arg(&m)
        .args(["--executor", "slurm"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "a failed run fails the sweep");
    let s = status(root.path(), &m);
    assert_eq!(s["good-seed1"].0, "COMPLETED");
    assert_eq!(s["good-seed2"].0, "COMPLETED");
    assert_eq!(s["bad-seed1"], ("FAILED".into(), Some(1)));
    assert_eq!(s["bad-seed2"], ("FAILED".into(), Some(1)));
    let log: String = std::fs::read_dir(root.path().join("results/baddata/bad-seed1"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".out"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .collect();
    assert!(
        log.contains("error: the dataset ") && log.contains("no-such-file.parquet does not exist"),
        "{log}"
    );
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("note: bad-seed1: FAILED (exit 1)"),
        "{table}"
    );
}

/// A packed block of three training runs, requeued while its second run
/// trains and cancelled (scancel) while its third does, then resubmitted:
/// the completed runs never run again, the interrupted ones resume from
/// their checkpoints, and every run logs every step exactly once.
#[test]
#[ignore = "needs the local SLURM cluster"]
fn a_packed_block_requeued_and_cancelled_loses_and_repeats_nothing() {
    require_cluster();
    let root = project_with_assets();
    let m = root.path().join("packed.toml");
    write(
        &m,
        "name = \"packed\"\n[defaults]\ndataset = \"assets/data/quickstart.parquet\"\nmodel = \"tiny\"\narchitecture = { dim = 32, n_layers = 1 }\nsequence_length = 128\nbatch_size = 2\nlearning_rate = 3e-3\nwarmup_steps = 2\nlogging_frequency = 1\ntraining_steps = 80\ncheckpoint_every = 5\n[sweep]\ndesign = \"blocks\"\norder_seed = 1\nname = \"s{{ seed }}\"\n[sweep.grid]\nseed = [1, 2, 3]\n[slurm]\ntime = \"5\"\ncpus_per_task = 1\npack = true\n",
    );
    let plan: Vec<serde_json::Value> =
        serde_json::from_slice(&run_ok(sweep(root.path()).args(["plan", "--json"]).arg(&m)).stdout)
            .unwrap();
    let order: Vec<String> = plan
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_string())
        .collect();
    let dir = |k: usize| root.path().join("results/packed").join(&order[k]);
    let state = |k: usize| status(root.path(), &m)[&order[k]].0.clone();
    let out = submit_slurm(root.path(), &m);
    assert!(out.contains("block 1 of 3 runs, packed"), "{out}");
    let job = job_id(&dir(0));
    wait_for(240, "the second run at step 10", || {
        (state(0) == "COMPLETED" && losses(&dir(1)).len() >= 10).then_some(())
    });
    assert_eq!(state(2), "PENDING", "the third waits for its turn");
    // What a node failure or preemption does: the block is queued again.
    run_ok(Command::new("scontrol").args(["requeue", &job]));
    release_requeued(&job);
    wait_for(240, "the third run at step 10", || {
        (state(1) == "COMPLETED" && losses(&dir(2)).len() >= 10).then_some(())
    });
    run_ok(Command::new("scancel").arg(&job));
    wait_for(60, "the block to end", || {
        (state(2) == "CANCELLED").then_some(())
    });
    assert_eq!(state(0), "COMPLETED");
    assert_eq!(state(1), "COMPLETED");
    let again = stdout(&run_ok(sweep(root.path()).arg("submit").arg(&m).args([
        "--executor",
        "slurm",
        "--retry-failed",
    ])));
    assert!(
        again.contains("skip ") && again.contains("block 1 of 1 runs, packed"),
        "only the cancelled run goes again: {again}"
    );
    wait_for(240, "the resubmitted run", || {
        (state(2) == "COMPLETED").then_some(())
    });
    for (k, name) in order.iter().enumerate() {
        let steps: Vec<u64> = losses(&dir(k)).iter().map(|(s, _)| *s).collect();
        assert_eq!(
            steps,
            (1..=80).collect::<Vec<_>>(),
            "{name}: every step once"
        );
    }
    let starts = |k: usize| job_logs(&dir(k)).matches("sweep: run ").count();
    assert_eq!(
        starts(0),
        1,
        "the first run completed before the requeue: never run again"
    );
    assert_eq!(starts(1), 2, "the second ran again after the requeue");
    assert!(
        job_logs(&dir(1)).contains("resumed from"),
        "{}",
        job_logs(&dir(1))
    );
    assert_eq!(starts(2), 2, "the third: cancelled, then its own job");
    assert!(
        job_logs(&dir(2)).contains("resumed from"),
        "{}",
        job_logs(&dir(2))
    );
}
