//! Data-parallel scaling of the built-in trainer on this machine: the same
//! per-rank work (model, batch, real text) at 1 and at N ranks, each rank a
//! process with its own threads; per-device and whole-job tokens/s, weak
//! scaling efficiency, and the share of the step spent summing gradients
//! across ranks. The ranks are the trainer's own (`Trainer::step`, MPI),
//! started by `mpirun` like the local executor starts them.

use crate::config::{
    AttentionKind, DeviceKind, Features, ModelOverrides, Precision, RuntimeOptions, TrainConfig,
};
use crate::data::SampleStream;
use crate::train::{device::PeakMemory, optim, Trainer};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Instant;

/// What one benchmark configuration is: every rank trains this.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Work {
    pub model: String,
    pub batch: usize,
    pub seq: usize,
    pub steps: usize,
    pub threads: usize,
    pub device: DeviceKind,
    /// The project root: the bundled data and tokenizer are under it.
    pub root: PathBuf,
}

/// Rank 0's figures at one world size.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DdpRow {
    pub ranks: usize,
    pub parameters: usize,
    pub tokens_per_s_per_rank: f64,
    pub step_s: f64,
    /// Seconds per step in the all-reduces (and waiting for the slowest rank).
    pub comm_s: f64,
    /// The engine that summed gradients, as it describes itself.
    pub engine: String,
    /// Whether the ranks went through the engine (one rank alone does not,
    /// unless `--engine-at-one`).
    pub through_engine: bool,
}

impl DdpRow {
    /// How the row is labelled: its world size, and whether one rank went
    /// through the engine.
    pub fn label(&self) -> String {
        match (self.ranks, self.through_engine) {
            (1, true) => "1 (engine)".into(),
            (n, _) => n.to_string(),
        }
    }
}

/// The run every rank trains: f32 on the CPU; on a GPU, bf16 with flash
/// attention when built in, as the reference study trains.
fn config(w: &Work) -> TrainConfig {
    let root = &w.root;
    let (precision, attention) = match w.device {
        DeviceKind::Cpu => (Precision::F32, AttentionKind::Eager),
        DeviceKind::Cuda if Features::BUILT.flash_attn => (Precision::Bf16, AttentionKind::Flash),
        DeviceKind::Cuda => (Precision::Bf16, AttentionKind::Eager),
    };
    TrainConfig {
        dataset: root.join("assets/data/quickstart.parquet"),
        tokenizer: root.join(crate::config::DEFAULT_TOKENIZER),
        model: w.model.clone(),
        architecture: ModelOverrides::default(),
        sequence_length: w.seq,
        batch_size: crate::config::BatchSize::Fixed(w.batch),
        precision,
        attention,
        device: w.device,
        learning_rate: 1e-4,
        warmup_steps: 1,
        threads: w.threads,
        ..Default::default()
    }
}

/// One rank of a benchmark (run by `mpirun`, or alone for one rank): two
/// warm-up steps, then `steps` timed ones; rank 0 prints its row as JSON.
pub fn rank(w: &Work, rt: &RuntimeOptions) -> Result<()> {
    let threads = crate::train::init_threads(w.threads, rt);
    let mut t = Trainer::new(config(w), threads, rt)?;
    let mut stream = SampleStream::open(&t.spec)?;
    let mut memory = PeakMemory::default();
    let (mut step_s, mut comm_s) = (0.0, 0.0);
    for step in 1..=w.steps + 2 {
        let batch = crate::data::loader::next_batch(&mut stream, w.batch)?;
        // The step is timed from the moment every rank has its batch: a
        // rank slower to read its samples would otherwise make the others'
        // first sum of the step wait, and count as communication.
        crate::train::dist::barrier(&*t.comm, &t.device)?;
        let started = Instant::now();
        let out = t.step(&[batch], optim::lr_at(step, &t.cfg), &mut memory, None)?;
        t.device.synchronize()?;
        if step > 2 {
            step_s += started.elapsed().as_secs_f64();
            comm_s += out.comm_s;
        }
    }
    t.check_replicas()?;
    let ranks = t.ranks();
    if ranks.is_main() {
        let n = w.steps as f64;
        let row = DdpRow {
            ranks: ranks.world_size,
            parameters: t.params.count(),
            tokens_per_s_per_rank: (w.batch * w.seq) as f64 * n / step_s,
            step_s: step_s / n,
            comm_s: comm_s / n,
            engine: t.comm.describe(),
            through_engine: !t.comm.is_single(),
        };
        println!("{}", serde_json::to_string(&row)?);
    }
    Ok(())
}

/// Runs `w` at every world size of `world_sizes` (1 in this process's
/// child, more through `mpirun`) and returns rank 0's rows; `engine_at_one`
/// adds a run of one rank through the engine (its cost without peers).
pub fn run(w: &Work, world_sizes: &[usize], engine_at_one: bool) -> Result<Vec<DdpRow>> {
    let exe = std::env::current_exe().context("finding the sweep binary")?;
    let exe = exe.to_string_lossy().into_owned();
    let work = serde_json::to_string(w)?;
    let argv = [exe.as_str(), "bench", "ddp-rank", "--work", work.as_str()];
    let mut rows = Vec::new();
    let mut runs: Vec<(usize, bool)> = world_sizes.iter().map(|&n| (n, false)).collect();
    if engine_at_one {
        runs.insert(1.min(runs.len()), (1, true));
    }
    for (n, forced) in runs {
        let mut cmd = if n == 1 && !forced {
            let mut c = std::process::Command::new(&exe);
            c.args(&argv[1..]).env("WORLD_SIZE", "1").env_remove("RANK");
            c
        } else if n == 1 && w.device == DeviceKind::Cuda {
            // NCCL with one rank needs no launcher, only a rendezvous address.
            let mut c = std::process::Command::new(&exe);
            c.args(&argv[1..])
                .env("WORLD_SIZE", "1")
                .env("RANK", "0")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", "29517");
            c
        } else {
            crate::executor::local::mpirun(n as u32, &argv)?
        };
        if forced {
            cmd.env("SWEEP_ENGINE_AT_ONE", "1");
        }
        let out = cmd.output().context("starting the benchmark's ranks")?;
        if !out.status.success() {
            bail!(
                "{n} rank(s) failed ({}):\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let row = text
            .lines()
            .find_map(|l| serde_json::from_str::<DdpRow>(l).ok())
            .with_context(|| format!("{n} rank(s) printed no result:\n{text}"))?;
        rows.push(row);
    }
    Ok(rows)
}
