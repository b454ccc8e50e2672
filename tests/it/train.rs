//! The trainer through the command line: identical loss curves on the fly
//! and pretokenized, resume after a kill, and requeue on SLURM's SIGUSR1.

use super::support::{
    job_id, job_logs, losses, metrics, project, release_requeued, repo, run_err, run_ok, status,
    stdout, submit_slurm, sweep, wait_for, write,
};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

/// A small training manifest on the bundled data; `extra` goes into [defaults].
pub(super) fn manifest(root: &Path, name: &str, extra: &str, sweep_axes: &str) -> PathBuf {
    let m = root.join(format!("{name}.toml"));
    write(
        &m,
        &format!(
            r#"name = "{name}"
executor = "local"
[defaults]
dataset = "{data}"
tokenizer = "{tok}"
model = "tiny"
architecture = {{ dim = 32, n_layers = 1 }}
learning_rate = 3e-3
warmup_steps = 2
threads = 1
{logging}
{extra}
{sweep_axes}
[local]
parallel = 2
threads = 1
[slurm]
time = "10"
job_name = "sweep-test-{name}"
"#,
            logging = if extra.contains("logging_frequency") {
                ""
            } else {
                "logging_frequency = 1"
            },
            data = repo().join("assets/data/quickstart.parquet").display(),
            tok = repo()
                .join("assets/tokenizers/mistral-7b/tokenizer.json")
                .display(),
        ),
    );
    m
}

/// The first thing anyone does, a tiny study: 8 steps logged every 2 give
/// 5 points, no more than the report's warm-up skip of 5. The plan says so
/// and what to set; the report still fills every cell, with a note per run.
#[test]
fn a_short_study_warns_at_plan_time_and_reports_what_it_has() {
    let root = project();
    let m = manifest(
        root.path(),
        "short",
        "training_steps = 8\nlogging_frequency = 2\nsequence_length = 32",
        "[sweep]\nrepeats = 2",
    );
    let plan = run_ok(sweep(root.path()).arg("plan").arg(&m));
    let err = String::from_utf8_lossy(&plan.stderr);
    assert!(
        err.contains(
            "runs of 8 steps logged every 2 log 5 steps, and the report skips the first 5"
        ) && err.contains("`[report] skip_first` below 5"),
        "{err}"
    );
    let out = run_ok(sweep(root.path()).arg("run").arg(&m));
    let said = stdout(&out);
    assert_eq!(
        said.matches("it logged 5 points, not more than the 5 the report skips")
            .count(),
        2,
        "a note per run: {said}"
    );
    let report = run_ok(
        sweep(root.path())
            .arg("report")
            .arg(root.path().join("results/short"))
            .arg("--json"),
    );
    // Two repeats: one row, and a hint that three give useful intervals.
    assert!(
        said.contains("hint: rows of 2 repeats have wide 95% intervals")
            && said.contains("3 repeats make it ±4.3"),
        "{said}"
    );
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&report.stdout).unwrap();
    assert_eq!(rows.len(), 1);
    for r in &rows {
        assert!(
            r["tokens_per_second_mean"]
                .as_f64()
                .is_some_and(|t| t > 0.0),
            "{r}"
        );
    }
}

#[test]
fn on_the_fly_and_pretokenized_data_give_identical_loss_curves() {
    let root = project();
    let m = manifest(
        root.path(),
        "same",
        "training_steps = 12\nsequence_length = 64",
        "[sweep.grid]\ndataset_type = [\"padded\", \"padding-free\"]\npretokenized = [false, true]",
    );
    run_ok(sweep(root.path()).arg("submit").arg(&m));
    let s = status(root.path(), &m);
    assert!(s.values().all(|(st, _)| st == "COMPLETED"), "{s:?}");
    for kind in ["padded", "padding-free"] {
        let a = losses(
            &root
                .path()
                .join(format!("results/same/{kind}_pretokenized-false")),
        );
        let b = losses(
            &root
                .path()
                .join(format!("results/same/{kind}_pretokenized-true")),
        );
        assert_eq!(a.len(), 12, "{kind}");
        assert_eq!(
            a, b,
            "{kind}: on-the-fly and pretokenized runs trained differently"
        );
        let tail = a[8..].iter().map(|x| x.1).fold(f64::MAX, f64::min);
        assert!(tail < a[0].1, "{kind}: the loss falls");
    }
    // Every field the report relies on is in every record.
    let rec = &metrics(&root.path().join("results/same/padded_pretokenized-true"))[0];
    for key in [
        "step",
        "loss",
        "lr",
        "grad_norm",
        "tokens_per_second",
        "training_tokens_pct",
        "mfu_pct",
        "tflops",
        "step_time_s",
        "elapsed_s",
        "peak_memory_mb",
    ] {
        assert!(
            rec.get(key).is_some_and(|v| v.is_number()),
            "{key} missing from {rec}"
        );
    }
    let mfu = rec["mfu_pct"].as_f64().unwrap();
    assert!(mfu > 0.0 && mfu <= 100.0, "{mfu}");
}

/// Validation runs on its own schedule (here at 5, 10 and the last step,
/// whatever the logging frequency), and an MFU above 100% (a peak set far too
/// low) is a warning event in metrics.jsonl, not the end of the run: an
/// event at each logged step whose recorded MFU is above 100% and at no
/// other, and one warning in the job's log. (Whether a step comes out above
/// 1 GFLOP/s depends on the machine's load: a step on a busy machine may not;
/// `metrics::tests` holds the rule to recorded step times.)
#[test]
fn validation_keeps_its_schedule_and_mfu_above_peak_is_a_warning() {
    let root = project();
    let m = manifest(
        root.path(),
        "sched",
        "training_steps = 12\nsequence_length = 256\nlogging_frequency = 4\nvalidation_every = 5\nvalidation_documents = 8\nvalidation_batches = 1\npeak_flops = 1e9",
        "",
    );
    run_ok(sweep(root.path()).arg("submit").arg(&m));
    let run = root.path().join("results/sched/run");
    let logged = metrics(&run);
    let steps: Vec<(u64, bool)> = logged
        .iter()
        .map(|v| (v["step"].as_u64().unwrap(), v.get("val_loss").is_some()))
        .collect();
    assert_eq!(
        steps,
        [
            (1, false),
            (4, false),
            (5, true),
            (8, false),
            (10, true),
            (12, true)
        ],
        "logged every 4, validated every 5 and at the end"
    );
    let text = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let events: Vec<(u64, f64)> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["event"] == "mfu_above_peak")
        .map(|v| (v["step"].as_u64().unwrap(), v["value"].as_f64().unwrap()))
        .collect();
    let above: Vec<(u64, f64)> = logged
        .iter()
        .map(|v| (v["step"].as_u64().unwrap(), v["mfu_pct"].as_f64().unwrap()))
        .filter(|&(_, mfu)| mfu > 100.0)
        .collect();
    assert_eq!(
        events, above,
        "an event at each step above the peak: {text}"
    );
    let log = std::fs::read_to_string(run.join("local.out")).unwrap();
    assert_eq!(
        log.matches("MFU came out at").count(),
        usize::from(!above.is_empty()),
        "warned once: {log}"
    );
}

fn train(root: &Path, config: &Path) -> Child {
    sweep(root)
        .arg("train")
        .arg("--config")
        .arg(config)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

fn last_step(run: &Path) -> u64 {
    metrics(run)
        .last()
        .and_then(|v| v["step"].as_u64())
        .unwrap_or(0)
}

/// A run of ~91M parameters (the embedding and head, 32000 × 1024 each;
/// two layers): seconds of building before its first step on a CPU, little
/// compute, and state worth hundreds of MB. Rendered; its directory.
fn wide_run(root: &Path, name: &str, extra: &str) -> PathBuf {
    let extra = format!(
        "{extra}\narchitecture = {{ dim = 1024, n_layers = 2, n_heads = 8, n_kv_heads = 8 }}"
    );
    let m = manifest(root, name, &extra, "");
    let text = std::fs::read_to_string(&m).unwrap();
    // The manifest's own small architecture gives way to the wide one.
    write(
        &m,
        &text.replace("architecture = { dim = 32, n_layers = 1 }\n", ""),
    );
    run_ok(sweep(root).arg("render").arg(&m));
    root.join(format!("results/{name}/run"))
}

/// Writing a checkpoint and resuming from one hold the model and its AdamW
/// moments once, not twice: a CPU run that fills its memory while it trains
/// must not be ended by the out-of-memory killer at its checkpoint. The
/// measure is the process's own high-water mark (`peak_memory_mb`, VmHWM):
/// a second copy of the moments, 8 bytes a parameter, is hundreds of MB here.
#[test]
fn a_checkpoint_and_a_resume_hold_the_models_state_once() {
    let root = project();
    let run = wide_run(
        root.path(),
        "once",
        "training_steps = 4\ncheckpoint_every = 2\nsequence_length = 64",
    );
    let config = run.join("config.toml");
    let trained = run_ok(sweep(root.path()).arg("train").arg("--config").arg(&config));
    let said = String::from_utf8_lossy(&trained.stderr).to_string();
    let params: f64 = said
        .split_once(" (")
        .and_then(|(_, rest)| rest.split_once(" parameters"))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("no parameter count in {said}"));
    assert!(params > 80e6, "{said}");
    let moments_mb = 8.0 * params / 1048576.0;
    let peaks = |run: &Path| -> Vec<f64> {
        metrics(run)
            .iter()
            .map(|m| m["peak_memory_mb"].as_f64().unwrap())
            .collect()
    };
    let first = peaks(&run);
    assert_eq!(first.len(), 4, "{first:?}");
    // The step-2 checkpoint is written before step 3.
    let saving = first[3] - first[1];
    assert!(
        saving < 0.25 * moments_mb,
        "writing the checkpoint raised the peak by {saving:.0} MB (the moments are {moments_mb:.0} MB): {first:?}"
    );
    // The resumed run writes no checkpoint, and the first one at step 2 is
    // not needed: each is ~1 GB of the suite's disk.
    std::fs::remove_dir_all(run.join("checkpoints/step-00000002")).unwrap();
    let again = std::fs::read_to_string(&config).unwrap();
    for key in [
        "training_steps = 4",
        "checkpoint_every = 2",
        "checkpoint_at_end = true",
    ] {
        assert!(again.contains(key), "{key} in {again}");
    }
    write(
        &config,
        &again
            .replace("training_steps = 4", "training_steps = 6")
            .replace("checkpoint_every = 2", "checkpoint_every = 0")
            .replace("checkpoint_at_end = true", "checkpoint_at_end = false"),
    );
    let resumed = run_ok(sweep(root.path()).arg("train").arg("--config").arg(&config));
    assert!(
        String::from_utf8_lossy(&resumed.stderr).contains("checkpoints/step-00000004 (step 4,"),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    let after = peaks(&run);
    assert_eq!(after.len(), 6, "{after:?}");
    let restoring = after[4] - first[1];
    assert!(
        restoring < 0.5 * moments_mb,
        "resuming raised the peak by {restoring:.0} MB over the first process's (the moments are {moments_mb:.0} MB): {after:?}"
    );
}

/// A stop that comes while the trainer starts (builds its model, opens its
/// data, reads its checkpoint: seconds here, minutes for a large model) ends
/// it at once, to be requeued; it used to wait for the first step, and a
/// `timeout`, Ctrl-C or SLURM's grace period could run out meanwhile.
#[test]
fn a_stop_while_the_run_starts_ends_it_before_any_step() {
    let root = project();
    let run = wide_run(
        root.path(),
        "starting",
        "training_steps = 4\nsequence_length = 64",
    );
    let child = sweep(root.path())
        .arg("train")
        .arg("--config")
        .arg(run.join("config.toml"))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The moment the trainer catches SIGTERM (bit 15 of its caught signals):
    // it has begun starting, and the first step is seconds away.
    let caught = |pid: u32| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let mask = status.lines().find_map(|l| l.strip_prefix("SigCgt:"))?;
        u64::from_str_radix(mask.trim(), 16).ok()
    };
    wait_for(60, "the trainer's stop handler", || {
        caught(child.id()).filter(|m| m & (1 << (15 - 1)) != 0)
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(99), "to be requeued: {said}");
    assert!(
        said.contains("SIGTERM received while the run was starting (model, data, checkpoint); no step was begun"),
        "{said}"
    );
    assert!(metrics(&run).is_empty(), "no step logged");
}

/// A stop while `batch_size = "max"` is searched ends the search's trial
/// (a `sweep train` of its own, which would hold memory and cores on) and
/// removes the search's folder: the trainer is starting, and says so.
#[test]
fn a_stop_during_the_batch_size_search_ends_its_trial() {
    let root = project();
    let run = wide_run(
        root.path(),
        "searching",
        "training_steps = 4\nsequence_length = 64\nbatch_size = \"max\"\nmemory_limit_gb = 4",
    );
    let tmp = root.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let child = sweep(root.path())
        .arg("train")
        .arg("--config")
        .arg(run.join("config.toml"))
        .env("TMPDIR", &tmp)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let scratch = || {
        std::fs::read_dir(&tmp)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with(".sweep-scratch-")
            })
            .collect::<Vec<_>>()
    };
    // A trial has started: its configuration is written and it runs.
    let trial = wait_for(120, "a trial of the search", || {
        let dir = scratch().into_iter().next()?;
        let bs = std::fs::read_dir(dir).ok()?.flatten().next()?.path();
        bs.join("train.log").exists().then_some(bs)
    });
    let trials = |tree: &Path| {
        let needle = tree.to_string_lossy().into_owned();
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter(|e| {
                std::fs::read(e.path().join("cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&needle))
            })
            .count()
    };
    wait_for(60, "the trial's process", || {
        (trials(&trial) > 0).then_some(())
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(99), "{said}");
    assert!(
        said.contains("SIGTERM received while the run was starting"),
        "{said}"
    );
    assert!(
        scratch().is_empty(),
        "the search's folder is removed: {:?}",
        scratch()
    );
    wait_for(60, "the trial's end", || {
        (trials(&trial) == 0).then_some(())
    });
    assert!(
        !run.join("max-batch.json").exists(),
        "no search result recorded"
    );
}

#[test]
fn a_killed_run_resumes_and_reproduces_the_uninterrupted_curve() {
    let root = project();
    // Two studies with the same configuration: one runs straight through, one is interrupted.
    let extra = "training_steps = 60\ncheckpoint_every = 5\nsequence_length = 128\nbatch_size = 2";
    for name in ["straight", "interrupted"] {
        run_ok(
            sweep(root.path())
                .arg("render")
                .arg(manifest(root.path(), name, extra, "")),
        );
    }
    let reference = root.path().join("results/straight/run");
    let resumed = root.path().join("results/interrupted/run");

    assert!(train(root.path(), &reference.join("config.toml"))
        .wait()
        .unwrap()
        .success());

    // Killed without warning after step 12: resumes from the step-10 checkpoint.
    let mut child = train(root.path(), &resumed.join("config.toml"));
    wait_for(120, "step 12", || (last_step(&resumed) >= 12).then_some(()));
    child.kill().unwrap();
    child.wait().unwrap();
    // A byte that is not UTF-8 in step 3's line: resuming keeps the line as
    // it is (the report lists it), and loses nothing else.
    let log = resumed.join("metrics.jsonl");
    let mut bytes = std::fs::read(&log).unwrap();
    // Step 3's line by what it says, not by its place: an event (a slow
    // step on a busy machine, say) may come before it.
    let mut third = 0;
    for line in bytes.split_inclusive(|&b| b == b'\n') {
        let record: Option<serde_json::Value> = serde_json::from_slice(line).ok();
        if record.is_some_and(|r| r["step"] == 3 && r.get("loss").is_some()) {
            break;
        }
        third += line.len();
    }
    assert!(third < bytes.len(), "no line of step 3 in the log");
    // Its number in the file (from 1), as the report names it.
    let line_no = 1 + bytes[..third].iter().filter(|&&b| b == b'\n').count();
    bytes[third + 1] = 0xff;
    std::fs::write(&log, &bytes).unwrap();
    let corrupt_line: Vec<u8> = bytes[third..]
        .split(|&b| b == b'\n')
        .next()
        .unwrap()
        .to_vec();
    // Stopped by SIGTERM: checkpoints where it is and exits for a requeue.
    let child = train(root.path(), &resumed.join("config.toml"));
    wait_for(120, "step 30", || (last_step(&resumed) >= 30).then_some(()));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(99),
        "SIGTERM ends with the requeue exit code"
    );
    let stopped_at = last_step(&resumed);
    assert!(std::fs::read_dir(resumed.join("checkpoints"))
        .unwrap()
        .any(|e| e.unwrap().file_name().to_string_lossy() == format!("step-{stopped_at:08}")));
    // And finishes.
    assert!(train(root.path(), &resumed.join("config.toml"))
        .wait()
        .unwrap()
        .success());

    let (a, b) = (losses(&reference), losses(&resumed));
    assert_eq!(
        b.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        (1..=60).filter(|&s| s != 3).collect::<Vec<_>>(),
        "every step once, step 3's line unreadable"
    );
    let a_but_3: Vec<(u64, f64)> = a.iter().copied().filter(|(s, _)| *s != 3).collect();
    assert_eq!(
        a_but_3, b,
        "the resumed run trained exactly like the uninterrupted one"
    );
    let after = std::fs::read(&log).unwrap();
    assert_eq!(
        after.split(|&b| b == b'\n').nth(line_no - 1).unwrap(),
        &corrupt_line[..],
        "the unreadable line is kept, byte for byte"
    );
    let report = run_ok(
        sweep(root.path())
            .arg("report")
            .arg(root.path().join("results/interrupted"))
            .arg("--no-plots"),
    );
    let text = String::from_utf8_lossy(&report.stdout);
    let left_out = format!("metrics.jsonl: 1 line(s) left out (line {line_no}: invalid UTF-8");
    assert!(text.contains(&left_out), "{text}");
    // A run that is already complete does nothing when started again.
    assert!(train(root.path(), &reference.join("config.toml"))
        .wait()
        .unwrap()
        .success());
    assert_eq!(losses(&reference), a);
}

#[test]
#[ignore = "needs the local SLURM cluster"]
fn sigusr1_on_slurm_checkpoints_requeues_and_finishes() {
    super::slurm::require_cluster();
    let root = project();
    let m = manifest(
        root.path(),
        "requeue",
        "training_steps = 200\nsequence_length = 128\nbatch_size = 2",
        "",
    );
    submit_slurm(root.path(), &m);
    let run = root.path().join("results/requeue/run");
    wait_for(120, "training to start", || {
        (last_step(&run) >= 5).then_some(())
    });
    let job = status(root.path(), &m)["run"].clone();
    assert_eq!(job.0, "RUNNING");
    let job_id = job_id(&run);
    run_ok(Command::new("scancel").args(["--signal=USR1", &job_id]));
    let held = release_requeued(&job_id);
    assert!(
        held.contains("Reason=BeginTime") || held.contains("Reason=None"),
        "{held}"
    );
    let s = wait_for(600, "the requeued job to finish", || {
        let s = status(root.path(), &m);
        (s["run"].0 == "COMPLETED").then_some(s)
    });
    assert_eq!(s["run"].1, Some(0));
    let log = job_logs(&run);
    assert!(
        log.contains("SIGUSR1 received") && log.contains("requeueing job"),
        "{log}"
    );
    assert!(log.contains("resumed from"), "{log}");
    assert!(
        log.contains("restart 1"),
        "the second attempt is SLURM's restart 1"
    );
    let steps: Vec<u64> = losses(&run).iter().map(|(s, _)| *s).collect();
    assert_eq!(
        steps,
        (1..=200).collect::<Vec<_>>(),
        "every step once across the requeue"
    );
}

#[test]
fn the_plans_memory_estimate_grows_with_the_trainers_peak_within_15_percent() {
    // `small` at 256 tokens: f32 and bf16-mixed, with and without
    // recomputation, batch 8 and 16 (the logits, 32000 wide, dominate).
    // bf16-mixed with the CPU's own kernel, and again through the portable
    // kernel where the CPU's own is AVX-512 BF16, so both paths are checked
    // on a machine that has both.
    let root = project();
    let mut report = Vec::new();
    let mut base: Option<(f64, f64)> = None;
    let mut studies = vec![("mem", r#"["f32", "bf16-mixed"]"#, None)];
    if sweep::train::network::ops::linear::bf16_gemm::avx512_bf16_available() {
        studies.push(("mem-portable", r#"["bf16-mixed"]"#, Some("portable")));
    }
    for (study, precisions, kernels) in studies {
        let m = root.path().join(format!("{study}.toml"));
        write(
            &m,
            &format!(
                r#"name = "{study}"
executor = "local"
[defaults]
dataset = "{data}"
tokenizer = "{tok}"
model = "small"
dataset_type = "padding-free"
sequence_length = 256
training_steps = 2
logging_frequency = 1
# Twelve runs' weights and optimizer states would be ~4 GB of disk.
checkpoint_at_end = false
[sweep]
name = "{{{{ precision }}}}-{{{{ recompute }}}}-bs{{{{ batch_size }}}}"
[sweep.grid]
precision = {precisions}
recompute = ["none", "blocks"]
batch_size = [8, 16]
[local]
parallel = 2
threads = 1
"#,
                data = repo().join("assets/data/quickstart.parquet").display(),
                tok = repo()
                    .join("assets/tokenizers/mistral-7b/tokenizer.json")
                    .display(),
            ),
        );
        let plan = run_ok(sweep(root.path()).arg("plan").arg(&m).arg("--json"));
        let runs: serde_json::Value = serde_json::from_slice(&plan.stdout).unwrap();
        let mut submit = sweep(root.path());
        if let Some(k) = kernels {
            submit.env("SWEEP_CPU_KERNELS", k);
        }
        let out = run_ok(submit.arg("submit").arg(&m));
        for r in runs.as_array().unwrap() {
            let name = r["name"].as_str().unwrap();
            let estimate = r["memory"]["estimate_bytes"].as_f64().unwrap() / 1e6;
            assert_eq!(
                r["memory"]["device_bytes"],
                serde_json::Value::Null,
                "a CPU run"
            );
            let dir = root.path().join("results").join(study).join(name);
            let peak = metrics(&dir)
                .iter()
                .filter_map(|l| l["peak_memory_mb"].as_f64())
                .fold(0.0, f64::max);
            report.push(format!(
                "{study}/{name}: estimate {estimate:.0} MB, measured {peak:.0} MB"
            ));
            // What holds on any machine: how memory grows from the first
            // run (f32, no recomputation, batch 8) to each other one, within
            // 15%; the absolute figures (the allocator's and the binary's
            // share differ between machines) within 30%.
            let (base_estimate, base_peak) = *base.get_or_insert((estimate, peak));
            let growth = (estimate / base_estimate) / (peak / base_peak);
            assert!(
                (growth - 1.0).abs() <= 0.15 && (estimate / peak - 1.0).abs() <= 0.30,
                "{study}/{name}: the estimate grows {growth:.2}× the measured growth, or is off by more than 30%:\n{}",
                report.join("\n")
            );
            if kernels.is_some() {
                let log = job_logs(&dir);
                assert!(
                    log.contains("portable bf16 kernel (SWEEP_CPU_KERNELS=portable)"),
                    "{name} says which kernel it used: {log}\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
    eprintln!("{}", report.join("\n"));
}

#[test]
fn max_batch_finds_the_largest_batch_under_a_memory_budget() {
    let root = project();
    let m = manifest(
        root.path(),
        "mb",
        "training_steps = 3\nsequence_length = 64",
        "",
    );
    run_ok(sweep(root.path()).arg("render").arg(&m));
    let config = root.path().join("results/mb/run/config.toml");
    let out = run_ok(
        sweep(root.path())
            .args(["bench", "max-batch", "--memory-limit", "600M", "--config"])
            .arg(&config),
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let largest: usize = text
        .lines()
        .find_map(|l| l.strip_prefix("largest batch size that trains: "))
        .unwrap_or_else(|| panic!("no answer in:\n{text}"))
        .trim()
        .parse()
        .unwrap();
    // The table: one row per size tried, the answer trained, one more did not.
    let row = |b: usize| {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(&b.to_string()))
            .unwrap_or_else(|| panic!("batch {b} was not tried:\n{text}"))
            .to_string()
    };
    assert!(largest > 1, "{text}");
    assert!(row(largest).ends_with("trains"), "{text}");
    assert!(row(largest + 1).contains("out of memory"), "{text}");
    eprintln!("{text}");
    // Every size that trained reports its throughput and stayed in budget.
    for l in text.lines().filter(|l| l.ends_with("trains")) {
        let cols: Vec<&str> = l.split_whitespace().collect();
        assert!(cols[1].parse::<f64>().unwrap() > 0.0, "{l}");
        // Peak in MiB, like the budget's 600M.
        assert!(cols[2].parse::<f64>().unwrap() <= 600.0, "{l}");
    }
}

#[test]
fn batch_size_max_is_found_when_the_job_starts_and_reported() {
    let root = project();
    let m = manifest(
        root.path(),
        "max",
        "training_steps = 3\nsequence_length = 64\nbatch_size = \"max\"\nmemory_limit_gb = 0.6",
        "",
    );
    let plan = run_ok(sweep(root.path()).arg("plan").arg(&m));
    assert!(String::from_utf8_lossy(&plan.stdout).contains("max"));
    run_ok(sweep(root.path()).arg("submit").arg(&m));
    let run = root.path().join("results/max/run");
    let found: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("max-batch.json")).unwrap())
            .unwrap();
    let b = found["batch_size"].as_u64().unwrap();
    assert!(b > 1, "{found}");
    let trials = found["trials"].as_array().unwrap();
    assert!(
        trials
            .iter()
            .any(|t| t["batch_size"] == b + 1 && t["out_of_memory"].is_string()),
        "{found}"
    );
    // It trained at that size, and the report says so.
    let lines = metrics(&run);
    assert_eq!(lines.len(), 3);
    assert!(lines.iter().all(|l| l["batch_size"] == b), "{lines:?}");
    run_ok(sweep(root.path()).arg("report").arg(&m));
    let table = std::fs::read_to_string(root.path().join("results/max/summary.md")).unwrap();
    let csv = std::fs::read_to_string(root.path().join("results/max/summary.csv")).unwrap();
    assert!(table.contains("| Batch size |"), "{table}\n{csv}");
    assert!(table.contains(&format!(" {b} | COMPLETED |")), "{table}");
}

#[test]
fn bench_train_writes_its_cases_as_json_beside_pytorchs_keys() {
    let root = project();
    let json = root.path().join("train.json");
    run_ok(
        sweep(root.path())
            .args([
                "bench", "train", "--only", "tiny", "--batch", "2", "--steps", "1",
            ])
            .args(["--parts", "--json"])
            .arg(&json),
    );
    let rows: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let rows = rows.as_array().unwrap();
    assert!(!rows.is_empty());
    for r in rows {
        assert_eq!(r["implementation"], "sweep", "{r}");
        assert_eq!(r["device"], "1 CPU thread(s)", "{r}");
        // The keys scripts/torch-gpu-baseline.py writes too.
        for key in [
            "tokens_per_second",
            "mfu_pct",
            "tflops",
            "peak_memory_gb",
            "step_s",
        ] {
            assert!(r[key].as_f64().is_some_and(|v| v > 0.0), "{key} in {r}");
        }
        // And where the step's time went, which add up to it.
        let phases: f64 = ["forward_s", "backward_s", "optimizer_s"]
            .iter()
            .map(|k| r[k].as_f64().unwrap())
            .sum();
        let step = r["step_s"].as_f64().unwrap();
        assert!((phases - step).abs() <= 1e-9 * step, "{r}");
        assert!(r["error"].is_null(), "{r}");
        // One more step by part (`--parts`): every op of the model where it runs.
        let parts = r["parts"].as_array().unwrap();
        for (pass, op) in [
            ("forward", "embedding"),
            ("forward", "norm"),
            ("forward", "linear"),
            ("forward", "rope"),
            ("forward", "attention"),
            ("forward", "swiglu"),
            ("backward", "linear"),
            ("backward", "loss"),
            ("backward", "attention"),
            ("backward", "swiglu"),
            ("backward", "norm"),
            ("backward", "rope"),
            ("backward", "embedding"),
            ("optimizer", "clip"),
            ("optimizer", "adamw"),
        ] {
            assert!(
                parts.iter().any(|p| p["pass"] == pass
                    && p["op"] == op
                    && p["seconds"].as_f64().is_some_and(|s| s > 0.0)),
                "{pass} {op} in {r}"
            );
        }
    }
    // A selection that matches no case is an error, not an empty table.
    let out = sweep(root.path())
        .args(["bench", "train", "--only", "tiny", "--batch", "3"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no case"));
}

#[test]
fn bench_kernels_checks_every_kernel_and_writes_its_figures() {
    let root = project();
    let json = root.path().join("kernels.json");
    let out = run_ok(
        sweep(root.path())
            .args([
                "bench",
                "kernels",
                "--model",
                "tiny",
                "--tokens",
                "256",
                "--repeats",
                "1",
                "--json",
            ])
            .arg(&json),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("attention backward"), "{text}");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 24, "{report}");
    // Each row also as it was measured, so that a run cut off leaves them.
    let progress = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        progress
            .lines()
            .filter(|l| l.starts_with("bench kernels: ") && l.contains("(ok)"))
            .count(),
        24,
        "{progress}"
    );
    // The work rate of the ops made of products.
    for op in [
        "attention backward",
        "weight gradient",
        "flash attention forward",
    ] {
        let row = rows.iter().find(|r| r["op"] == op).unwrap();
        assert!(row["tflop_per_s"].as_f64().unwrap() > 0.0, "{row}");
    }
    for r in rows {
        assert_eq!(r["ok"], true, "{r}");
        for key in ["max_rel_err", "kernel_ms", "composed_ms", "gb_per_s"] {
            assert!(r[key].as_f64().is_some(), "{key} in {r}");
        }
    }
    // A GPU benchmark asked of a CPU build is a clear error.
    if !cfg!(feature = "cuda") {
        let err = run_err(sweep(root.path()).args(["bench", "kernels", "--device", "cuda"]));
        assert!(err.contains("GPU build"), "{err}");
    }
}
