//! What one run executes: the schema of a manifest's `[defaults]`, each run's `config.toml` and
//! `sweep train`. Every field but `dataset` has a default; unknown keys are rejected.

pub mod hints;
pub mod model;
pub mod runtime;
mod validate;

pub(crate) use validate::check_range;
pub use validate::ConfigError;

/// Whether the trainer sums gradient buckets during the backward pass on `device` (MPI does; NCCL after).
pub fn trainer_overlaps_allreduce(device: DeviceKind) -> bool {
    device == DeviceKind::Cpu
}

use anyhow::{Context, Result};
pub use hints::PlanHints;
pub use model::{ModelConfig, ModelOverrides, PRESETS};
pub use runtime::RuntimeOptions;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The trainer's exit code for "checkpoint written on a signal: requeue me".
pub const REQUEUE_EXIT: i32 = 99;

/// The trainer's exit code for "the device ran out of memory", told apart without reading its log.
pub const OUT_OF_MEMORY_EXIT: i32 = 98;

/// `sweep watchdog`'s exit code for "the run stopped making progress": HUNG.
pub const HUNG_EXIT: i32 = 97;

/// The launch doctor's exit code for "the run's nodes cannot meet": FAILED.
pub const LAUNCH_EXIT: i32 = 96;

/// Where the bundled default tokenizer lives, relative to the project root.
pub const DEFAULT_TOKENIZER: &str = "assets/tokenizers/mistral-7b/tokenizer.json";

#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    Default,
    clap::ValueEnum,
    strum::IntoStaticStr,
)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum DatasetType {
    /// One document per sample, truncated or right-padded to seq+1 tokens.
    #[default]
    Padded,
    /// Documents concatenated into one token stream cut into windows.
    PaddingFree,
}

impl DatasetType {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Which samples each rank of a data-parallel run trains on.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    Default,
    clap::ValueEnum,
    strum::IntoStaticStr,
)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum DataOrder {
    /// One sample order over the dataset whatever the world size, each rank its slice (Megatron's):
    /// a scaling study's runs see the same data.
    #[default]
    Global,
    /// Each rank reads its own contiguous documents, as the reference does.
    Contiguous,
}

impl DataOrder {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Left out of a run's configuration at its default, so ids planned before it stay.
    pub fn is_default(&self) -> bool {
        *self == DataOrder::default()
    }
}

#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    strum::IntoStaticStr,
    strum::EnumString,
)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum PretokenizedFormat {
    /// `input_ids` + `attention_mask`, seq+1 per document (padded runs).
    Padded,
    /// `tokens`, one untruncated list per document (padding-free runs).
    TokenList,
}

impl PretokenizedFormat {
    pub fn for_dataset(t: DatasetType) -> Self {
        match t {
            DatasetType::Padded => PretokenizedFormat::Padded,
            DatasetType::PaddingFree => PretokenizedFormat::TokenList,
        }
    }

    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Precision {
    #[default]
    F32,
    /// bf16 parameters, gradients and optimizer state (GPUs; the reference study).
    Bf16,
    /// f32 weights and optimizer, products with bf16 operands and f32 sums (the CPU's autocast).
    Bf16Mixed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LrSchedule {
    /// Linear warmup, then constant (the reference study).
    #[default]
    Constant,
    /// Linear warmup, then cosine decay to `min_lr_ratio · learning_rate`.
    Cosine,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    #[default]
    Cpu,
    Cuda,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum AttentionKind {
    /// Differentiable attention built from matmuls and a fused softmax; runs everywhere.
    #[default]
    Eager,
    /// candle-flash-attn forward with a recompute backward (CUDA builds with `flash-attn`).
    Flash,
}

/// Sequences per device and micro-batch: a number, or `"max"`, the largest that trains,
/// found by `sweep train` when the job starts (`memory_limit_gb` bounds it on a CPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchSize {
    Fixed(usize),
    Max,
}

impl BatchSize {
    /// The size, when it is a number (not yet resolved `max` is not).
    pub fn fixed(self) -> Option<usize> {
        match self {
            BatchSize::Fixed(n) => Some(n),
            BatchSize::Max => None,
        }
    }
}

impl Serialize for BatchSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            BatchSize::Fixed(n) => s.serialize_u64(*n as u64),
            BatchSize::Max => s.serialize_str("max"),
        }
    }
}

impl<'de> Deserialize<'de> for BatchSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = BatchSize;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a positive number of sequences or \"max\"")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> std::result::Result<BatchSize, E> {
                Ok(BatchSize::Fixed(n as usize))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> std::result::Result<BatchSize, E> {
                match u64::try_from(n) {
                    Ok(n) => self.visit_u64(n),
                    Err(_) => Err(E::invalid_value(serde::de::Unexpected::Signed(n), &self)),
                }
            }
            fn visit_str<E: serde::de::Error>(self, w: &str) -> std::result::Result<BatchSize, E> {
                match w {
                    "max" => Ok(BatchSize::Max),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Str(w), &self)),
                }
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// Activation recomputation (activation checkpointing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Recompute {
    /// Keep every activation the backward pass needs.
    #[default]
    None,
    /// Keep only each block's input and rerun the block in the backward pass.
    Blocks,
}

/// Thresholds of the stability monitor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MonitorConfig {
    /// A loss above this multiple of the rolling mean is a spike.
    pub spike_factor: f64,
    /// A gradient norm above this multiple of `grad_clip` is an explosion.
    pub explosion_factor: f64,
    /// Steps in the rolling window.
    pub window: usize,
    /// No relative improvement above `plateau_tolerance` over this many steps is a plateau (0 = off).
    pub plateau_steps: usize,
    pub plateau_tolerance: f64,
}

impl Default for MonitorConfig {
    fn default() -> Self {
        MonitorConfig {
            spike_factor: 1.5,
            explosion_factor: 3.0,
            window: 20,
            plateau_steps: 200,
            plateau_tolerance: 0.01,
        }
    }
}

/// The most tokens one device may hold per step (batch × sequence × accumulation): 2^28.
pub const MAX_TOKENS_PER_STEP: usize = 1 << 28;

// Limits on a run's counts: beyond them a value is a typo that would exhaust the machine.
/// Tokens per sequence: a million.
pub const MAX_SEQUENCE_LENGTH: usize = 1 << 20;
/// Sequences per device and micro-batch.
pub const MAX_BATCH_SIZE: usize = 1 << 16;
/// Micro-batches per step (the step's batches are read before it runs).
pub const MAX_GRADIENT_ACCUMULATION: usize = 1 << 16;
/// Training steps, and every count of steps (warm-up, logging, checkpoints).
pub const MAX_STEPS: usize = 1_000_000_000;
/// Batches the background loader prepares ahead of the step.
pub const MAX_PREFETCH: usize = 64;
/// CPU threads of one job (a thread pool this large already exceeds any node).
pub const MAX_THREADS: usize = 4096;
/// Batches of one validation.
pub const MAX_VALIDATION_BATCHES: usize = 1 << 16;
/// Documents held out for validation.
pub const MAX_VALIDATION_DOCUMENTS: usize = 1 << 32;
/// Steps in the monitor's rolling window.
pub const MAX_MONITOR_WINDOW: usize = 100_000;

/// The optional engines a `sweep` binary was compiled with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    pub cuda: bool,
    pub flash_attn: bool,
    /// Data parallelism between CPU ranks.
    pub mpi: bool,
    /// Data parallelism between GPUs.
    pub nccl: bool,
}

impl Features {
    /// This binary's.
    pub const BUILT: Features = Features {
        cuda: cfg!(feature = "cuda"),
        flash_attn: cfg!(feature = "flash-attn"),
        mpi: cfg!(feature = "mpi"),
        nccl: cfg!(feature = "nccl"),
    };

    /// The cargo feature names that are on.
    pub fn names(self) -> Vec<&'static str> {
        [
            ("cuda", self.cuda),
            ("flash-attn", self.flash_attn),
            ("mpi", self.mpi),
            ("nccl", self.nccl),
        ]
        .into_iter()
        .filter_map(|(n, on)| on.then_some(n))
        .collect()
    }

    /// Everything: for planning runs that another binary will train.
    pub const ALL: Features = Features {
        cuda: true,
        flash_attn: true,
        mpi: true,
        nccl: true,
    };
}

fn is_zero(z: &u8) -> bool {
    *z == 0
}

/// Special-token overrides from the manifest (`bos_token`, `eos_token`, `pad_token`) or the
/// command line; by default the tokenizer's own.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpecialTokens {
    pub bos: Option<String>,
    pub eos: Option<String>,
    pub pad: Option<String>,
}

/// The built-in trainer's configuration: `[defaults]` in a manifest, `config.toml` in a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    // --- data
    /// Parquet file with a text column (the source documents).
    pub dataset: PathBuf,
    pub text_column: String,
    /// A Hugging Face `tokenizer.json`.
    pub tokenizer: PathBuf,
    /// Special-token overrides; by default they are read from the tokenizer.
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub pad_token: Option<String>,
    pub dataset_type: DatasetType,
    pub pretokenized: bool,
    /// The pretokenized file (`pretokenized = true`); the planner's pretokenize output by default.
    pub pretokenized_path: Option<PathBuf>,
    pub sequence_length: usize,
    /// Documents held out for validation, taken from the end of the dataset.
    pub validation_documents: usize,
    /// Batches prepared ahead of the train step by the background loader.
    pub prefetch: usize,
    /// With several ranks: one global sample order or the reference's shard per rank.
    #[serde(skip_serializing_if = "DataOrder::is_default")]
    pub data_order: DataOrder,

    // --- model
    /// A preset name (`tiny`, `small`, `ref-1b`, `ref-8b`) ...
    pub model: String,
    /// ... with per-field overrides.
    pub architecture: ModelOverrides,
    pub precision: Precision,
    pub attention: AttentionKind,
    pub recompute: Recompute,
    pub device: DeviceKind,
    /// Which CUDA kernels the run takes (`SWEEP_CUDA_KERNELS`'s values); unset: the process's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernels: Option<runtime::CudaKernels>,

    // --- optimisation
    pub batch_size: BatchSize,
    /// ZeRO stage: 0 whole optimizer state per rank, 1 AdamW's moments sharded, 2 gradients too.
    #[serde(skip_serializing_if = "is_zero")]
    pub zero: u8,
    pub gradient_accumulation: usize,
    pub training_steps: usize,
    pub learning_rate: f64,
    pub warmup_steps: usize,
    pub lr_schedule: LrSchedule,
    pub min_lr_ratio: f64,
    pub weight_decay: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub grad_clip: f64,
    pub seed: u64,

    // --- bookkeeping
    pub logging_frequency: usize,
    /// Save a checkpoint every this many steps (0: only on SIGUSR1/SIGTERM and at the end).
    pub checkpoint_every: usize,
    /// Save one after the last step too (an 8B model's is ~100 GB: throughput studies turn it off).
    pub checkpoint_at_end: bool,
    /// Validation loss every this many steps (0: off).
    pub validation_every: usize,
    pub validation_batches: usize,
    /// Threads for the CPU kernels (0: all cores, or SLURM_CPUS_PER_TASK).
    pub threads: usize,
    /// Accelerator name for the peak-FLOPs table (H100, H200, GH200, A100, ...).
    pub gpu: Option<String>,
    /// Peak FLOP/s per device; overrides the table (and the CPU measurement).
    pub peak_flops: Option<f64>,
    /// On a CPU, the memory `batch_size = "max"` may use, in GB (default: 80% of what is free).
    pub memory_limit_gb: Option<f64>,
    pub monitor: MonitorConfig,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            dataset: PathBuf::new(),
            text_column: "text".into(),
            tokenizer: PathBuf::from(DEFAULT_TOKENIZER),
            bos_token: None,
            eos_token: None,
            pad_token: None,
            dataset_type: DatasetType::Padded,
            pretokenized: false,
            pretokenized_path: None,
            sequence_length: 2048,
            validation_documents: 0,
            prefetch: 4,
            data_order: DataOrder::Global,
            model: "tiny".into(),
            architecture: ModelOverrides::default(),
            precision: Precision::F32,
            attention: AttentionKind::Eager,
            recompute: Recompute::None,
            device: DeviceKind::Cpu,
            kernels: None,
            batch_size: BatchSize::Fixed(1),
            zero: 0,
            gradient_accumulation: 1,
            training_steps: 1000,
            learning_rate: 5e-5,
            warmup_steps: 100,
            lr_schedule: LrSchedule::Constant,
            min_lr_ratio: 0.1,
            weight_decay: 0.1,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            grad_clip: 1.0,
            seed: 42,
            logging_frequency: 10,
            checkpoint_every: 0,
            checkpoint_at_end: true,
            validation_every: 0,
            validation_batches: 4,
            threads: 0,
            gpu: None,
            memory_limit_gb: None,
            peak_flops: None,
            monitor: MonitorConfig::default(),
        }
    }
}

impl TrainConfig {
    /// The special-token overrides (flat keys: serde's `flatten` defeats `deny_unknown_fields`).
    pub fn specials(&self) -> SpecialTokens {
        SpecialTokens {
            bos: self.bos_token.clone(),
            eos: self.eos_token.clone(),
            pad: self.pad_token.clone(),
        }
    }

    /// The resolved architecture (vocab_size may still be 0: from the tokenizer).
    pub fn model_config(&self) -> Result<ModelConfig> {
        ModelConfig::resolve(&self.model, &self.architecture)
    }

    /// Makes every path absolute against `root`, so the job runs from anywhere.
    pub fn absolutize(&mut self, root: &Path) {
        self.dataset = crate::util::fs::absolute(root, &self.dataset);
        self.tokenizer = crate::util::fs::absolute(root, &self.tokenizer);
        if let Some(p) = &self.pretokenized_path {
            self.pretokenized_path = Some(crate::util::fs::absolute(root, p));
        }
    }

    pub fn load(path: &Path) -> Result<TrainConfig> {
        let bytes = crate::util::fs::read_input("the run configuration", path, 16 << 20)?;
        let text = String::from_utf8(bytes)
            .with_context(|| format!("the run configuration {} is not UTF-8", path.display()))?;
        let cfg: TrainConfig =
            toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        cfg.validate()
            .and_then(|()| cfg.check_build(Features::BUILT))
            .with_context(|| format!("invalid run configuration {}", path.display()))?;
        Ok(cfg)
    }

    /// How many steps write a metrics line: the first, every `logging_frequency`-th, every
    /// validation step and the last.
    pub fn logged_steps(&self) -> usize {
        let n = self.training_steps;
        let multiples = |k: usize| n.checked_div(k).unwrap_or(0);
        let (log, val) = (self.logging_frequency.max(1), self.validation_every);
        // Multiples of either, once each.
        let mut count = multiples(log) + multiples(val);
        if val > 0 {
            let gcd = |mut a: usize, mut b: usize| {
                while b != 0 {
                    (a, b) = (b, a % b);
                }
                a
            };
            count -= (log / gcd(log, val)).checked_mul(val).map_or(0, multiples);
        }
        let multiple = |s: usize| s.is_multiple_of(log) || (val > 0 && s.is_multiple_of(val));
        // Step 1 and the last, where they are no multiple.
        count += (n >= 1 && !multiple(1)) as usize;
        count += (n > 1 && !multiple(n)) as usize;
        count
    }

    /// Sequences per micro-batch; an unresolved `max` counts as 1 (planning's lower bound).
    pub fn batch(&self) -> usize {
        self.batch_size.fixed().unwrap_or(1)
    }

    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a TrainConfig always serialises")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_toml() {
        let mut c = TrainConfig {
            dataset: "data.parquet".into(),
            ..Default::default()
        };
        c.architecture.n_layers = Some(2);
        let back: TrainConfig = toml::from_str(&c.to_toml()).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn flash_attention_needs_cuda_and_a_flash_attn_build() {
        let c = TrainConfig {
            dataset: "d.parquet".into(),
            attention: AttentionKind::Flash,
            ..Default::default()
        };
        assert_eq!(c.validate().unwrap_err().key, "attention", "not on the CPU");
        let c = TrainConfig {
            device: DeviceKind::Cuda,
            ..c
        };
        assert_eq!(c.validate().unwrap_err().key, "attention", "not in f32");
        let c = TrainConfig {
            precision: Precision::Bf16,
            ..c
        };
        assert!(c.validate().is_ok());
        let no_flash = Features {
            flash_attn: false,
            ..Features::ALL
        };
        let e = c.check_build(no_flash).unwrap_err();
        assert!(e.message.contains("`flash-attn` feature"), "{e}");
        let e = c
            .check_build(Features {
                cuda: false,
                ..no_flash
            })
            .unwrap_err();
        assert_eq!(e.key, "device");
        assert!(c.check_build(Features::ALL).is_ok());
    }

    #[test]
    fn validation_needs_held_out_documents() {
        let c = TrainConfig {
            dataset: "d.parquet".into(),
            validation_every: 25,
            ..Default::default()
        };
        assert_eq!(c.validate().unwrap_err().key, "validation_every");
        let c = TrainConfig {
            validation_documents: 8,
            ..c
        };
        assert!(c.validate().is_ok());
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let err = toml::from_str::<TrainConfig>("dataset = 'x'\nbatch_sise = 2\n").unwrap_err();
        assert!(err.to_string().contains("batch_sise"), "{err}");
    }
}
