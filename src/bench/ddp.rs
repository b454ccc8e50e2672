//! Data-parallel scaling of the trainer on this machine: the same per-rank work at 1 and N
//! ranks (processes by `mpirun`, or `srun` on SLURM nodes); per-device and job tokens/s, weak
//! scaling efficiency and the share of the step summing gradients. Beside each world size,
//! the plan's forecast for it ([`forecast`]) where the link's bandwidth is given.

use crate::config::{
    AttentionKind, DeviceKind, Features, ModelOverrides, Precision, RuntimeOptions, TrainConfig,
};
use crate::data::SampleStream;
use crate::train::network::{device::PeakMemory, optim};
use crate::train::Trainer;
use crate::util::stdout::outln;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Instant;

/// What one benchmark configuration is: every rank trains this.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DdpWork {
    pub model: String,
    pub batch: usize,
    pub seq: usize,
    pub steps: usize,
    pub threads: usize,
    pub device: DeviceKind,
    /// The project root: the bundled data and tokenizer are under it.
    pub root: PathBuf,
    /// The ZeRO stage the ranks train at.
    #[serde(default)]
    pub zero: u8,
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
    /// Whether the ranks went through the engine (one rank does not, unless `--engine-at-one`).
    pub through_engine: bool,
    /// The ZeRO stage (its all-gather counts in `comm_s`).
    #[serde(default)]
    pub zero: u8,
    /// FLOPs of one rank's step, and the trainer's peak its MFU is measured against.
    pub flops_per_step: f64,
    pub peak_flops: f64,
}

/// Where a benchmark's ranks run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Launch {
    /// `mpirun` on this machine.
    Local,
    /// `srun --mpi=pmix` over this many SLURM nodes (ranks spread evenly).
    Nodes(usize),
}

impl Launch {
    /// Ranks on one node at a world size.
    pub fn ranks_per_node(self, world_size: usize) -> usize {
        match self {
            Launch::Local => world_size,
            Launch::Nodes(n) => world_size.div_ceil(n.min(world_size)),
        }
    }
}

impl DdpRow {
    /// The row's label: its world size, and whether one rank went through the engine.
    pub fn label(&self) -> String {
        match (self.ranks, self.through_engine, self.zero) {
            (1, true, _) => "1 (engine)".into(),
            (n, _, 0) => n.to_string(),
            (n, _, z) => format!("{n} zero {z}"),
        }
    }
}

/// The run every rank trains: f32 on the CPU; on a GPU bf16 with flash attention when built in.
fn config(w: &DdpWork) -> TrainConfig {
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
        zero: w.zero,
        ..Default::default()
    }
}

/// One rank: two warm-up steps, then `steps` timed; rank 0 prints its row as JSON.
pub fn rank(w: &DdpWork, rt: &RuntimeOptions) -> Result<()> {
    let threads = crate::train::init_threads(w.threads, rt);
    let mut t = Trainer::new(config(w), threads, rt)?;
    let mut stream = SampleStream::open(&t.spec)?;
    let mut memory = PeakMemory::default();
    let (mut step_s, mut comm_s) = (0.0, 0.0);
    for step in 1..=w.steps + 2 {
        let batch = crate::data::loader::next_batch(&mut stream, w.batch)?;
        // Timed once every rank has its batch: a slow reader would otherwise count as communication.
        crate::train::run::dist::barrier(&*t.comm, &t.device)?;
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
        let driver = (!t.device.is_cpu())
            .then(|| crate::train::network::device::name(&t.device))
            .transpose()?;
        let (peak_flops, _) =
            crate::train::run::metrics::peak_flops(&t.cfg, driver.as_deref(), t.threads)?;
        let n = w.steps as f64;
        let row = DdpRow {
            ranks: ranks.world_size,
            parameters: t.params.count(),
            tokens_per_s_per_rank: (w.batch * w.seq) as f64 * n / step_s,
            step_s: step_s / n,
            comm_s: comm_s / n,
            engine: t.comm.describe(),
            through_engine: !t.comm.is_single(),
            zero: w.zero,
            flops_per_step: t.model_spec.cfg.flops_per_token(w.seq) * (w.batch * w.seq) as f64,
            peak_flops,
        };
        outln!("{}", serde_json::to_string(&row)?);
    }
    Ok(())
}

/// Runs `w` at every world size (locally through `mpirun`, on nodes through `srun`); rank 0's
/// rows. `engine_at_one` adds one rank through the engine (its cost without peers).
pub fn run(
    w: &DdpWork,
    world_sizes: &[usize],
    engine_at_one: bool,
    launch: Launch,
) -> Result<Vec<DdpRow>> {
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
        let mut cmd = if let Launch::Nodes(nodes) = launch {
            srun(n, nodes.min(n), w.threads, &argv)?
        } else if n == 1 && !forced {
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
            crate::executor::mpirun::mpirun(n as u32, &argv)?
        };
        if forced {
            cmd.env("SWEEP_ENGINE_AT_ONE", "1");
        }
        let out = crate::util::process::output_stoppable(&mut cmd)
            .context("starting the benchmark's ranks")?;
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

/// `srun` of `ranks` over `nodes` (as many on each), the step failing as a whole with a rank.
fn srun(
    ranks: usize,
    nodes: usize,
    threads: usize,
    argv: &[&str],
) -> Result<std::process::Command> {
    if crate::util::process::find_in_path("srun").is_none() {
        bail!("--nodes starts the ranks with `srun`, and there is none on PATH: run it on a SLURM cluster");
    }
    if !ranks.is_multiple_of(nodes) {
        bail!("{ranks} ranks do not spread evenly over {nodes} nodes: choose world sizes that are multiples of --nodes");
    }
    let mut c = std::process::Command::new("srun");
    c.args([
        "--mpi=pmix",
        "--kill-on-bad-exit=1",
        &format!("--nodes={nodes}"),
        &format!("--ntasks={ranks}"),
        &format!("--ntasks-per-node={}", ranks / nodes),
        &format!("--cpus-per-task={threads}"),
    ])
    .args(argv)
    .env("WORLD_SIZE", ranks.to_string())
    .env_remove("RANK")
    .env_remove("LOCAL_RANK");
    Ok(c)
}

/// The link bandwidths given the forecast (GB/s per device, as `[plan]`'s).
#[derive(Debug, Clone, Copy, Default)]
pub struct Links {
    pub intra_node_gbps: Option<f64>,
    pub inter_node_gbps: Option<f64>,
}

/// The plan's forecast of `row`'s world size with the one-rank `base`'s compute (its MFU as
/// `expected_mfu_pct`) and the link's bandwidth; none for one rank or without the bandwidth.
pub fn forecast(
    w: &DdpWork,
    base: &DdpRow,
    row: &DdpRow,
    launch: Launch,
    links: Links,
) -> Result<Option<crate::estimate::scaling::Forecast>> {
    use crate::estimate::scaling;
    let ranks_per_node = launch.ranks_per_node(row.ranks);
    let mut cfg = config(w);
    cfg.zero = row.zero;
    cfg.peak_flops = Some(base.peak_flops);
    let hints = crate::config::PlanHints {
        expected_mfu_pct: Some(crate::estimate::mfu_pct(
            base.flops_per_step / base.step_s,
            base.peak_flops,
        )),
        ..Default::default()
    };
    let model = crate::data::tokenizer::model_config(&cfg)?;
    let hw = scaling::Hardware {
        peak_flops: base.peak_flops,
        intra_node_gbps: links.intra_node_gbps,
        inter_node_gbps: links.inter_node_gbps,
    };
    let job = scaling::ParallelJob {
        world_size: row.ranks,
        ranks_per_node,
        overlaps: crate::config::trainer_overlaps_allreduce(w.device),
        traffic: scaling::Traffic::Builtin,
    };
    Ok(scaling::FITTED.forecast(&cfg, &hints, &model, hw, job))
}
