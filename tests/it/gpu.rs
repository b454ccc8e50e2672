//! The trainer on a GPU: CUDA follows the CPU in f32, bf16 and bf16-mixed stay
//! close to f32, flash attention trains like eager attention, a killed run
//! resumes on the curve, and one rank through NCCL trains like no engine. They need an NVIDIA GPU and this test binary
//! built with the GPU features (`scripts/build-gpu.sh --tests`;
//! docs/gpu.md), so everywhere else they are ignored with that reason,
//! and `scripts/test.sh` skips them.

use super::support::{losses, project, run_ok, status, sweep, wait_for};
use super::train::manifest;
use std::path::Path;

/// The losses of a finished run of the study `name`.
fn curve(root: &Path, study: &str, run: &str) -> Vec<(u64, f64)> {
    losses(&root.join("results").join(study).join(run))
}

/// The largest relative difference between two loss curves at the same steps.
fn max_rel_diff(a: &[(u64, f64)], b: &[(u64, f64)]) -> f64 {
    assert_eq!(
        a.iter().map(|p| p.0).collect::<Vec<_>>(),
        b.iter().map(|p| p.0).collect::<Vec<_>>(),
        "the same steps are logged"
    );
    a.iter()
        .zip(b)
        .map(|((_, x), (_, y))| (x - y).abs() / x.abs().max(1e-12))
        .fold(0.0, f64::max)
}

fn submit_all_completed(root: &Path, m: &Path) {
    run_ok(sweep(root).arg("submit").arg(m));
    let s = status(root, m);
    assert!(s.values().all(|(st, _)| st == "COMPLETED"), "{s:?}");
}

#[test]
#[ignore = "needs an NVIDIA GPU and a GPU build (scripts/build-gpu.sh --tests)"]
fn cuda_f32_follows_the_cpu_loss_curve() {
    let root = project();
    let m = manifest(
        root.path(),
        "f32",
        "training_steps = 20\nsequence_length = 64\nprecision = \"f32\"",
        "[sweep.grid]\ndevice = [\"cpu\", \"cuda\"]",
    );
    submit_all_completed(root.path(), &m);
    let (cpu, cuda) = (
        curve(root.path(), "f32", "cpu"),
        curve(root.path(), "f32", "cuda"),
    );
    assert_eq!(cpu.len(), 20);
    let diff = max_rel_diff(&cpu, &cuda);
    assert!(diff <= 1e-4, "CUDA f32 is {diff:e} off the CPU curve");
    // Every kernel passed its self-check when the GPU opened: none fell back.
    let metrics =
        std::fs::read_to_string(root.path().join("results/f32/cuda/metrics.jsonl")).unwrap();
    assert!(
        !metrics.contains("kernel_fallback"),
        "a kernel failed its self-check on this GPU:\n{}",
        metrics
            .lines()
            .filter(|l| l.contains("kernel_fallback"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU and a GPU build (scripts/build-gpu.sh --tests)"]
fn bf16_and_bf16_mixed_stay_within_two_percent_of_f32() {
    let root = project();
    let m = manifest(
        root.path(),
        "prec",
        "training_steps = 200\nsequence_length = 128\nbatch_size = 4\ndevice = \"cuda\"\nlogging_frequency = 10",
        "[sweep.grid]\nprecision = [\"f32\", \"bf16\", \"bf16-mixed\"]",
    );
    submit_all_completed(root.path(), &m);
    let last = |run: &str| curve(root.path(), "prec", run).last().unwrap().1;
    let f32 = last("f32");
    for run in ["bf16", "bf16-mixed"] {
        let rel = (last(run) - f32).abs() / f32;
        assert!(
            rel <= 0.02,
            "{run} ends {rel:.3} off f32 ({} vs {f32})",
            last(run)
        );
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU and a GPU build (scripts/build-gpu.sh --tests)"]
fn flash_attention_trains_like_eager_attention() {
    // `tiny`: 4 query heads on 2 KV heads of 32 dimensions (GQA), causal.
    let root = project();
    let m = manifest(
        root.path(),
        "attn",
        "training_steps = 30\nsequence_length = 256\nbatch_size = 2\ndevice = \"cuda\"\nprecision = \"bf16\"",
        "[sweep.grid]\nattention = [\"eager\", \"flash\"]",
    );
    submit_all_completed(root.path(), &m);
    let diff = max_rel_diff(
        &curve(root.path(), "attn", "eager"),
        &curve(root.path(), "attn", "flash"),
    );
    // bf16 keeps 8 bits of mantissa; 30 steps compound it.
    assert!(diff <= 2e-2, "flash is {diff:e} off eager");
}

#[test]
#[ignore = "needs an NVIDIA GPU and a GPU build (scripts/build-gpu.sh --tests)"]
fn a_killed_cuda_run_resumes_and_reproduces_the_curve() {
    let root = project();
    let extra = "training_steps = 40\ncheckpoint_every = 5\nsequence_length = 128\nbatch_size = 2\ndevice = \"cuda\"";
    for name in ["straight", "interrupted"] {
        run_ok(
            sweep(root.path())
                .arg("render")
                .arg(manifest(root.path(), name, extra, "")),
        );
    }
    let config = |name: &str| {
        root.path()
            .join("results")
            .join(name)
            .join("run/config.toml")
    };
    let train = |name: &str| {
        sweep(root.path())
            .arg("train")
            .arg("--config")
            .arg(config(name))
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    assert!(train("straight").wait().unwrap().success());
    let resumed = root.path().join("results/interrupted/run");
    let mut child = train("interrupted");
    wait_for(300, "step 12", || {
        (losses(&resumed).last().is_some_and(|p| p.0 >= 12)).then_some(())
    });
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(train("interrupted").wait().unwrap().success());
    let (a, b) = (curve(root.path(), "straight", "run"), losses(&resumed));
    assert_eq!(a.len(), 40, "every step once");
    let diff = max_rel_diff(&a, &b);
    assert!(diff <= 1e-6, "the resumed curve is {diff:e} off");
}

#[test]
#[ignore = "needs an NVIDIA GPU and a GPU build (scripts/build-gpu.sh --tests)"]
fn one_rank_through_nccl_trains_exactly_like_no_engine() {
    let root = project();
    let m = manifest(
        root.path(),
        "nccl1",
        "training_steps = 10\nsequence_length = 64\ndevice = \"cuda\"\nprecision = \"bf16\"",
        "",
    );
    run_ok(sweep(root.path()).arg("render").arg(&m));
    let run = root.path().join("results/nccl1/run");
    let mut curves = Vec::new();
    for engine in [false, true] {
        let _ = std::fs::remove_file(run.join("metrics.jsonl"));
        let _ = std::fs::remove_dir_all(run.join("checkpoints"));
        let mut c = sweep(root.path());
        c.args(["train", "--config"]).arg(run.join("config.toml"));
        if engine {
            c.env("SWEEP_ENGINE_AT_ONE", "1")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", "29531");
        }
        let out = run_ok(&mut c);
        let log = String::from_utf8_lossy(&out.stderr);
        assert_eq!(engine, log.contains("gradients summed by NCCL"), "{log}");
        curves.push(losses(&run));
    }
    assert_eq!(curves[0].len(), 10);
    // Summing over one rank changes no bit.
    assert_eq!(
        curves[0], curves[1],
        "NCCL at world size 1 changed the training"
    );
}

/// ZeRO through NCCL at world size 1 (`zero` set in the run's config by
/// hand: the plan refuses it on one rank): the reduce-scatter and the
/// all-gather over one rank and AdamW on one block change no bit (without
/// clipping, whose norm the blocks sum in another order).
#[test]
#[ignore = "needs an NVIDIA GPU and a GPU build (scripts/build-gpu.sh --tests)"]
fn zero_through_nccl_at_one_rank_trains_exactly_like_plain() {
    let root = project();
    let m = manifest(
        root.path(),
        "zero1",
        "training_steps = 10\nsequence_length = 64\ndevice = \"cuda\"\nprecision = \"bf16\"\ngrad_clip = 0.0",
        "",
    );
    run_ok(sweep(root.path()).arg("render").arg(&m));
    let run = root.path().join("results/zero1/run");
    let config = run.join("config.toml");
    let plain = std::fs::read_to_string(&config).unwrap();
    let mut curves = Vec::new();
    for zero in [0, 1, 2] {
        let _ = std::fs::remove_file(run.join("metrics.jsonl"));
        let _ = std::fs::remove_dir_all(run.join("checkpoints"));
        std::fs::write(&config, format!("zero = {zero}\n{plain}")).unwrap();
        let out = run_ok(
            sweep(root.path())
                .args(["train", "--config"])
                .arg(&config)
                .env("SWEEP_ENGINE_AT_ONE", "1")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", "29533"),
        );
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(log.contains(&format!("(zero = {zero})")), "{log}");
        curves.push(losses(&run));
    }
    assert_eq!(curves[0].len(), 10);
    assert_eq!(curves[0], curves[1], "zero = 1 changed the training");
    assert_eq!(curves[0], curves[2], "zero = 2 changed the training");
}

#[test]
#[ignore = "needs an NVIDIA GPU and a GPU build (scripts/build-gpu.sh --tests)"]
fn every_cuda_kernel_matches_its_cpu_twin() {
    // bf16 and f32, against the CPU kernels on the same inputs; the command
    // fails when a kernel is outside its tolerance.
    let root = project();
    run_ok(sweep(root.path()).args([
        "bench",
        "kernels",
        "--device",
        "cuda",
        "--model",
        "small",
        "--tokens",
        "4096",
        "--repeats",
        "1",
    ]));
}
