//! ZeRO-1 and -2 with real ranks (MPI between CPU processes, `mpirun` by
//! the local executor): the same curve as plain data parallelism, the
//! optimizer state per rank divided by the world size, and a sharded run's
//! checkpoint resumed on another world size without sharding. Built with
//! the `mpi` feature, which `scripts/test.sh` turns on.

use super::support::{
    losses, metrics, project, run_ok, status, sweep, tiny_defaults, wait_for, write,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A study of the tiny model on the bundled text, batch 1 a rank, one run
/// per `slurm.ntasks_per_node` × `zero` (named `w<ranks>-z<zero>`);
/// `extra` goes into `[defaults]`.
fn study(root: &Path, name: &str, ranks: &[u32], zeros: &[u8], extra: &str) -> PathBuf {
    let m = root.join(format!("{name}.toml"));
    write(
        &m,
        &format!(
            r#"name = "{name}"
executor = "local"
[defaults]
{defaults}
{extra}
[sweep]
name = "w{{{{ slurm.ntasks_per_node }}}}-z{{{{ zero }}}}"
[sweep.grid]
"slurm.ntasks_per_node" = {ranks:?}
zero = {zeros:?}
[local]
parallel = 1
threads = 2
[slurm]
time = "10"
cpus_per_task = 1
"#,
            defaults = tiny_defaults(),
        ),
    );
    m
}

/// Each run's per-step losses agree with its world size's `zero = 0` run
/// within `tolerance` (relative), and the curves fall.
fn assert_on_the_plain_curve(dir: &Path, ranks: &[u32], zeros: &[u8], steps: u64, tolerance: f64) {
    for w in ranks {
        let plain = losses(&dir.join(format!("w{w}-z0")));
        assert_eq!(plain.len() as u64, steps, "w{w}-z0: {plain:?}");
        let mean = |xs: &[(u64, f64)]| xs.iter().map(|x| x.1).sum::<f64>() / xs.len() as f64;
        assert!(
            mean(&plain[plain.len() - 3..]) < mean(&plain[..3]),
            "{plain:?}"
        );
        for z in zeros.iter().filter(|z| **z > 0) {
            let run = format!("w{w}-z{z}");
            let sharded = losses(&dir.join(&run));
            assert_eq!(sharded.len(), plain.len(), "{run}: {sharded:?}");
            for ((step, a), (_, b)) in plain.iter().zip(&sharded) {
                let rel = (a - b).abs() / a.abs();
                assert!(
                    rel <= tolerance,
                    "{run}, step {step}: {a} (zero 0) vs {b} (relative {rel:e})"
                );
            }
            let norms = |run: &str| -> Vec<f64> {
                metrics(&dir.join(run))
                    .iter()
                    .map(|m| m["grad_norm"].as_f64().unwrap())
                    .collect()
            };
            // The replicated norm is summed in f32 (the sharded one in f64).
            for (step, (a, b)) in norms(&format!("w{w}-z0"))
                .iter()
                .zip(norms(&run))
                .enumerate()
            {
                assert!(
                    (a - b).abs() <= 10.0 * tolerance * a,
                    "{run}, step {}: gradient norm {a} (zero 0) vs {b}",
                    step + 1
                );
            }
        }
    }
}

/// What rank 0 of a completed run says it keeps, by kind, in bytes.
fn kept(run: &Path) -> HashMap<String, u64> {
    let log = std::fs::read_to_string(run.join("local.out")).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("rank 0 keeps"))
        .unwrap_or_else(|| panic!("no accounting in {}:\n{log}", run.display()));
    let body = line.split("keeps ").nth(1).unwrap();
    let body = body.split(" (zero").next().unwrap();
    body.split(", ")
        .flat_map(|part| part.split(" and "))
        .map(|part| {
            let (n, kind) = part.split_once(" B of ").unwrap();
            (kind.to_string(), n.parse().unwrap())
        })
        .collect()
}

const STEPS: u64 = 30;

/// 2, 3 and 4 ranks, f32: ZeRO-1 and -2 train on the plain data-parallel
/// curve (3 ranks leave groups that do not divide evenly, parameters split
/// across blocks), and the optimizer's state per rank falls by the world size.
#[test]
fn sharded_runs_follow_the_plain_curve_and_keep_a_world_sizes_share() {
    let root = project();
    let (ranks, zeros) = ([2, 3, 4], [0, 1, 2]);
    // Clipping at every step: the norm, from every rank's blocks, counts.
    let extra = format!("training_steps = {STEPS}\ngrad_clip = 0.05");
    let m = study(root.path(), "zero-f32", &ranks, &zeros, &extra);
    run_ok(sweep(root.path()).arg("submit").arg(&m));
    let s = status(root.path(), &m);
    assert!(s.values().all(|(st, _)| st == "COMPLETED"), "{s:?}");
    let dir = root.path().join("results/zero-f32");
    assert_on_the_plain_curve(&dir, &ranks, &zeros, STEPS, 1e-6);
    for w in ranks {
        let at = |z: u8| kept(&dir.join(format!("w{w}-z{z}")));
        let (plain, one, two) = (at(0), at(1), at(2));
        let moments = plain["moments"] as f64;
        for (z, k) in [(1, &one), (2, &two)] {
            // A 1/w share, and at most the padding of a block per group more.
            let share = k["moments"] as f64 / moments;
            assert!(
                share >= 1.0 / w as f64 && share < 1.0 / w as f64 + 0.01,
                "w{w} z{z}: {k:?} against {plain:?}"
            );
            assert_eq!(k["master values"], k["moments"] / 2, "w{w} z{z}: {k:?}");
            assert_eq!(k["parameters"], plain["parameters"]);
        }
        assert_eq!(plain["master values"], 0);
        // Both keep their blocks of the sums; ZeRO-2 no gradient buffer once
        // the sums are scattered, ZeRO-1 the buffers (which the sums leave).
        let sums = two["gradient sums"] as f64 / plain["parameters"] as f64;
        assert!(
            sums >= 1.0 / w as f64 && sums < 1.0 / w as f64 + 0.01,
            "w{w}: {two:?}"
        );
        assert_eq!(one["gradient sums"], two["gradient sums"]);
        assert_eq!(two["gradient buffers"], 0, "{two:?}");
        assert_eq!(
            one["gradient buffers"], plain["gradient buffers"],
            "{one:?}"
        );
        let last = metrics(&dir.join(format!("w{w}-z2")))
            .last()
            .unwrap()
            .clone();
        assert_eq!(last["world_size"], w, "{last}");
    }
}

/// bf16-mixed (bf16 products, f32 parameters and sums) at 2 ranks.
#[test]
fn bf16_mixed_sharded_runs_follow_the_plain_curve() {
    let root = project();
    let extra = format!("training_steps = {STEPS}\nprecision = \"bf16-mixed\"");
    let m = study(root.path(), "zero-bf16", &[2], &[0, 2], &extra);
    run_ok(
        sweep(root.path())
            .env("SWEEP_CPU_KERNELS", "portable")
            .arg("submit")
            .arg(&m),
    );
    let dir = root.path().join("results/zero-bf16");
    assert_on_the_plain_curve(&dir, &[2], &[0, 2], STEPS, 1e-5);
}

/// A run of four ZeRO-1 ranks, killed mid-way, resumes from its sharded
/// checkpoint on two ranks without sharding (the global batch kept by
/// accumulation) and continues the uninterrupted curve.
#[test]
fn a_killed_sharded_run_resumes_on_two_plain_ranks_on_its_curve() {
    let root = project();
    let extra = format!("training_steps = {STEPS}\ncheckpoint_every = 5");
    let m = study(root.path(), "zero-resume", &[4], &[0, 1], &extra);
    let mut child = sweep(root.path()).arg("submit").arg(&m).spawn().unwrap();
    let dir = root.path().join("results/zero-resume");
    let run = dir.join("w4-z1");
    wait_for(300, "the sharded run past its second checkpoint", || {
        if let Some(exit) = child.try_wait().unwrap() {
            panic!("the study ended ({exit}) before the run was killed");
        }
        (losses(&run).len() >= 12).then_some(())
    });
    // Every rank at once, as a node failure would.
    run_ok(Command::new("pkill").args([
        "-KILL",
        "-f",
        &run.join("config.toml").display().to_string(),
    ]));
    wait_for(120, "the study to end", || child.try_wait().unwrap());
    let stopped_at = losses(&run).len() as u64;
    assert!(stopped_at < STEPS, "killed before the end: {stopped_at}");
    let shards = std::fs::read_dir(run.join("checkpoints/step-00000010"))
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("optimizer-rank-")
        })
        .count();
    assert_eq!(shards, 4, "one share of the moments per rank");
    // The same run at zero = 0, on two ranks.
    let config = run.join("config.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    write(&config, &text.replace("zero = 1\n", ""));
    let out = Command::new("mpirun")
        .args(["-n", "2"])
        .arg(env!("CARGO_BIN_EXE_sweep"))
        .args(["train", "--config"])
        .arg(&config)
        .env("WORLD_SIZE", "2")
        .envs([
            ("OMPI_MCA_rmaps_base_oversubscribe", "1"),
            ("OMPI_MCA_hwloc_base_binding_policy", "none"),
            ("OMPI_MCA_btl_vader_single_copy_mechanism", "none"),
            ("OMPI_ALLOW_RUN_AS_ROOT", "1"),
            ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"),
        ])
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(
        log.contains("world size 4 → 2") && log.contains("gradient accumulation 1 → 2"),
        "{log}"
    );
    assert!(log.contains("zero = 0"), "{log}");
    // The steps after the checkpoint, again and on: the curve of the
    // uninterrupted plain run.
    let plain: HashMap<u64, f64> = losses(&dir.join("w4-z0")).into_iter().collect();
    let resumed = losses(&run);
    assert_eq!(resumed.last().unwrap().0, STEPS);
    for (step, b) in resumed {
        let a = plain[&step];
        assert!(
            (a - b).abs() <= 1e-5 * a,
            "step {step}: {a} uninterrupted vs {b}"
        );
    }
}

/// `sweep bench ddp --zero` runs the sharded stages beside plain, each row
/// labelled and in the JSON with its stage.
#[test]
fn bench_ddp_runs_the_stages_asked_beside_plain() {
    let root = project();
    let json = root.path().join("ddp.json");
    let args = [
        "bench",
        "ddp",
        "--ranks",
        "1,2",
        "--zero",
        "1,2",
        "--model",
        "tiny",
        "--steps",
        "1",
        "--batch",
        "1",
        "--seq-len",
        "32",
    ];
    let out = run_ok(sweep(root.path()).args(args).arg("--json").arg(&json));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    for label in ["2 zero 1", "2 zero 2"] {
        assert!(
            text.lines().any(|l| l.trim_start().starts_with(label)),
            "{text}"
        );
    }
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let zeros: Vec<(u64, u64)> = doc["rounds"][0]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["ranks"].as_u64().unwrap(), r["zero"].as_u64().unwrap()))
        .collect();
    assert_eq!(zeros, [(1, 0), (2, 0), (2, 1), (2, 2)]);
    let err = super::support::run_err(sweep(root.path()).args(["bench", "ddp", "--zero", "3"]));
    assert!(err.contains("--zero"), "{err}");
}
