//! `sweep bench`: each benchmark's flags.

use std::path::PathBuf;

use super::*;

#[derive(Subcommand, Debug)]
pub enum BenchCmd {
    /// The train step of the CPU presets in f32 and bf16-mixed: tokens/s, GFLOP/s, share of the matmul peak.
    #[command(
        after_help = "Examples:\n  sweep bench train --threads 1\n  sweep bench train --threads 2 --steps 10\n  sweep bench train --device cuda --layers 8      (a GPU build on a GPU machine)"
    )]
    Train(TrainBenchCli),
    /// The floor of a training step: each matrix product of the linear layers and the head timed alone, times its count.
    #[command(
        after_help = "Examples:\n  sweep bench gemms                                   (small, batch 2 x 256, f32 on the CPU)\n  sweep bench gemms --device cuda --model ref-1b --batch 8 --seq-len 2048   (a GPU build: bf16, cuBLAS)"
    )]
    Gemms(GemmsBenchCli),
    /// Data-parallel scaling of the trainer on this machine: 1 and N ranks (MPI) with the same work per rank.
    #[command(
        after_help = "Example:\n  sweep bench ddp --ranks 1,2 --threads 1      (a build with --features mpi)\n  sweep bench ddp --ranks 1,2 --zero 1,2      (sharded optimizer beside plain)\n  sweep bench ddp --device cuda --ranks 1 --engine-at-one --model ref-1b --batch 8 --seq-len 2048   (NCCL at world size 1)"
    )]
    Ddp(DdpBenchCli),
    /// The largest batch size a run's configuration trains at: real steps at
    /// each size tried, starting from the plan's memory estimate.
    #[command(
        after_help = "Examples:\n  sweep bench max-batch --config results/quickstart/baseline-padded-bs1-r0/config.toml --memory-limit 2G\n  sweep bench max-batch --config results/gpu-quickstart/baseline-padded-bs1/config.toml   (a GPU build: until CUDA runs out of memory)"
    )]
    MaxBatch {
        /// A run's config.toml (`sweep render` writes one per run).
        #[arg(long)]
        config: PathBuf,
        /// Resident memory a trial may use, e.g. 2G or 1500M (CPU runs; default 80% of what is available).
        #[arg(long)]
        memory_limit: Option<String>,
        /// Training steps per trial; the first is not timed.
        #[arg(long, default_value_t = 3, value_parser = count(2, MAX_BENCH_STEPS))]
        steps: usize,
        /// The largest batch size to try.
        #[arg(long, default_value_t = 1024, value_parser = count(1, MAX_BATCH))]
        max: usize,
    },
    /// One rank of `sweep bench ddp` (started by it).
    #[command(hide = true)]
    DdpRank {
        #[arg(long)]
        work: String,
    },
    /// sweep's own kernels (RMSNorm, SwiGLU, RoPE, the loss, the embedding's gradient) against their references: error, time, GB/s, and the composed ops they replace.
    #[command(after_help = "Examples:
  sweep bench kernels
  sweep bench kernels --device cuda --json results/kernels.json   (a GPU build on a GPU machine)")]
    Kernels(KernelsBenchCli),
    /// Matmul throughput on this CPU, f32 (candle) and bf16 (sweep's kernel): what CPU MFU is measured against.
    #[command(after_help = "Example:\n  sweep bench peak")]
    Peak,
}

/// `sweep bench train`.
#[derive(clap::Args, Debug, Clone)]
pub struct TrainBenchCli {
    /// CPU threads (1 gives tokens per CPU-second; 0: every core).
    #[arg(long, default_value_t = 1, value_parser = count(0, MAX_THREADS))]
    pub threads: usize,
    #[arg(long, default_value_t = 5, value_parser = count(1, MAX_BENCH_STEPS))]
    pub steps: usize,
    /// Only the cases whose "label precision" contains this (e.g. `8192`, `bf16-mixed`).
    #[arg(long)]
    pub only: Option<String>,
    /// Only the cases of this batch size.
    #[arg(long, value_parser = count(1, 1 << 20))]
    pub batch: Option<usize>,
    /// After the timed steps, one more step recorded op by op: where its time
    /// goes (linear layers, attention, norms, ... by forward, backward and optimizer).
    #[arg(long)]
    pub parts: bool,
    /// `cpu`: the CPU presets; `cuda`: ref-1b and an 8B-shaped model on GPU 0.
    #[arg(long, value_enum, default_value = "cpu")]
    pub device: crate::config::DeviceKind,
    /// Layers of the 8B-shaped GPU model (ref-8b's shapes; 32 is the full model).
    #[arg(long, default_value_t = 8, value_parser = count(1, 1024))]
    pub layers: usize,
    /// The accelerator's name in the peak-FLOPs table (default: the driver's name).
    #[arg(long)]
    pub gpu: Option<String>,
    /// Activation recomputation for every case (`blocks`: less memory, more compute).
    #[arg(long, value_enum, default_value = "none")]
    pub recompute: crate::config::Recompute,
    /// Also write every case (tokens/s, MFU, peak memory, or its error) to this JSON file
    /// (`-`: standard output, and the table to standard error).
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// `sweep bench gemms`.
#[derive(clap::Args, Debug, Clone)]
pub struct GemmsBenchCli {
    /// `cpu` (f32, candle's and the `gemm` crate's products) or `cuda` (bf16, cuBLAS) on GPU 0.
    #[arg(long, value_enum, default_value = "cpu")]
    pub device: crate::config::DeviceKind,
    /// The model preset whose shapes are used (default: `small` on the CPU, `ref-1b` on a GPU).
    #[arg(long)]
    pub model: Option<String>,
    /// Sequences per step (default: 2 on the CPU, 8 on a GPU).
    #[arg(long, value_parser = count(1, MAX_BATCH))]
    pub batch: Option<usize>,
    /// Tokens per sequence (default: 256 on the CPU, 2048 on a GPU).
    #[arg(long, alias = "sequence-length", value_parser = count(1, MAX_SEQ))]
    pub seq_len: Option<usize>,
    /// Timed calls per shape (the median counts).
    #[arg(long, default_value_t = 5, value_parser = count(1, MAX_REPEATS))]
    pub repeats: usize,
    /// Also write the figures as JSON to this file (`-`: standard output, and the table to standard error).
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// `sweep bench ddp`.
#[derive(clap::Args, Debug, Clone)]
pub struct DdpBenchCli {
    /// World sizes to run, the first being the base of the efficiency.
    #[arg(long, value_delimiter = ',', default_value = "1,2", value_parser = count(1, MAX_BENCH_RANKS))]
    pub ranks: Vec<usize>,
    /// CPU threads per rank.
    #[arg(long, default_value_t = 1, value_parser = count(1, MAX_THREADS))]
    pub threads: usize,
    #[arg(long, default_value_t = 10, value_parser = count(1, MAX_BENCH_STEPS))]
    pub steps: usize,
    /// A model preset (the tokenizer's vocabulary).
    #[arg(long, default_value = "small")]
    pub model: String,
    /// Sequences per rank and step.
    #[arg(long, default_value_t = 4, value_parser = count(1, MAX_BATCH))]
    pub batch: usize,
    #[arg(long, default_value_t = 256, value_parser = count(1, MAX_SEQ))]
    pub seq_len: usize,
    #[arg(long, value_enum, default_value = "cpu")]
    pub device: crate::config::DeviceKind,
    /// Also run one rank through the engine (MPI or NCCL) to see its cost without peers.
    #[arg(long)]
    pub engine_at_one: bool,
    /// Also run the world sizes above one at these ZeRO stages (1, 2), beside `zero = 0`.
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u8).range(1..=2))]
    pub zero: Vec<u8>,
    /// Rounds of every world size in turn; the medians count (a shared
    /// machine's noise moves one run by several percent).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub repeats: u32,
    /// Start the ranks on this many SLURM nodes with `srun --mpi=pmix`
    /// (in an allocation, or one of their own), a world size spread
    /// evenly over them; the one-rank base on one node. Default: `mpirun`
    /// on this machine.
    #[arg(long, value_parser = count(1, MAX_BENCH_RANKS))]
    pub nodes: Option<usize>,
    /// All-reduce bandwidth per device within a node, in GB/s (as `[plan]
    /// intra_node_gbps`): adds the plan's scaling forecast of each world size
    /// that fits on one node, its compute calibrated by the one-rank base.
    #[arg(long, value_parser = gbps)]
    pub intra_node_gbps: Option<f64>,
    /// All-reduce bandwidth per device between nodes, in GB/s (as `[plan]
    /// inter_node_gbps`; 1 Gbit/s is 0.125): adds the forecast of each world
    /// size that spans nodes.
    #[arg(long, value_parser = gbps)]
    pub inter_node_gbps: Option<f64>,
    /// Also write the rows, every round and the forecasts to this JSON file (`-`: standard output).
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// `sweep bench kernels`.
#[derive(clap::Args, Debug, Clone)]
pub struct KernelsBenchCli {
    /// `cpu`: the CPU kernels against the composed ops; `cuda`: the CUDA kernels against the CPU kernels, in bf16 and f32.
    #[arg(long, value_enum, default_value = "cpu")]
    pub device: crate::config::DeviceKind,
    /// The model preset whose shapes are used (default: `small` on the CPU, `ref-1b` on a GPU).
    #[arg(long)]
    pub model: Option<String>,
    /// Tokens per call (batch x sequence; default 2048 on the CPU, 16384 on a GPU).
    #[arg(long, value_parser = count(1, MAX_TOKENS))]
    pub tokens: Option<usize>,
    #[arg(long, alias = "sequence-length", default_value_t = 2048, value_parser = count(1, MAX_SEQ))]
    pub seq_len: usize,
    /// Timed calls per case (the median counts).
    #[arg(long, default_value_t = 5, value_parser = count(1, MAX_REPEATS))]
    pub repeats: usize,
    /// The vocabulary (default: the preset's, else 32000).
    #[arg(long, value_parser = count(1, 1 << 24))]
    pub vocab: Option<usize>,
    /// Also write the figures as JSON to this file (`-`: standard output, and the table to standard error).
    #[arg(long)]
    pub json: Option<PathBuf>,
}
