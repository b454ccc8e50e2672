//! What a run's configuration must satisfy before anything runs: ranges of
//! every number (huge values refused with the key at fault), sizes that fit
//! together, combinations the trainer supports, and what the binary was
//! built with.

use super::*;

/// A configuration the trainer cannot run, and the key at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The `TrainConfig` field, as written in `[defaults]`.
    pub key: &'static str,
    pub message: String,
}

impl ConfigError {
    pub(crate) fn new(key: &'static str, message: String) -> ConfigError {
        ConfigError { key, message }
    }
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

/// `key`, where set, within [least, most] (NaN is not).
pub(crate) fn check_range(
    key: &'static str,
    v: Option<f64>,
    least: f64,
    most: f64,
    unit: &str,
) -> Result<(), ConfigError> {
    match v.filter(|v| !(*v >= least && *v <= most)) {
        Some(v) => Err(ConfigError::new(
            key,
            format!(
                "`{key}` must lie in [{least:e}, {most:e}] {unit}, not {}",
                number(v)
            ),
        )),
        None => Ok(()),
    }
}

/// A number as a person reads it: `1e-300`, not 300 digits.
fn number(v: f64) -> String {
    match v.abs() {
        a if a.is_finite() && a != 0.0 && !(1e-4..1e9).contains(&a) => format!("{v:e}"),
        _ => format!("{v}"),
    }
}

impl TrainConfig {
    /// Checks that hold for any run, whatever the data on disk or the build.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.dataset.as_os_str().is_empty() {
            return Err(ConfigError::new(
                "dataset",
                "`dataset` is not set: give the Parquet file with the training text".into(),
            ));
        }
        self.validate_counts()?;
        self.validate_optimizer()?;
        self.validate_sizes()?;
        self.validate_combinations()?;
        self.validate_model()
    }

    /// Every count within the bounds where it is read.
    fn validate_counts(&self) -> Result<(), ConfigError> {
        let err = |key: &'static str, msg: String| Err(ConfigError::new(key, msg));
        // Every count, bounded where it is read: (key, value, least, most, what 0 means).
        #[rustfmt::skip]
        let counts: [(&'static str, usize, usize, usize, &str); 17] = [
            ("zero", self.zero as usize, 0, 2, " (0: off, 1: optimizer states sharded, 2: gradients too)"),
            ("sequence_length", self.sequence_length, 1, MAX_SEQUENCE_LENGTH, ""),
            ("batch_size", self.batch_size.fixed().unwrap_or(1), 1, MAX_BATCH_SIZE, ""),
            ("gradient_accumulation", self.gradient_accumulation, 1, MAX_GRADIENT_ACCUMULATION, ""),
            ("training_steps", self.training_steps, 1, MAX_STEPS, ""),
            ("logging_frequency", self.logging_frequency, 1, MAX_STEPS, ""),
            ("warmup_steps", self.warmup_steps, 0, MAX_STEPS, ""),
            ("checkpoint_every", self.checkpoint_every, 0, MAX_STEPS, " (0: only on a stop signal and at the end)"),
            ("validation_every", self.validation_every, 0, MAX_STEPS, " (0: off)"),
            ("validation_batches", self.validation_batches, 0, MAX_VALIDATION_BATCHES, ""),
            ("validation_documents", self.validation_documents, 0, MAX_VALIDATION_DOCUMENTS, ""),
            ("prefetch", self.prefetch, 0, MAX_PREFETCH, ""),
            ("threads", self.threads, 0, MAX_THREADS, " (0: all cores, or SLURM_CPUS_PER_TASK)"),
            ("monitor", self.monitor.window, 1, MAX_MONITOR_WINDOW, " (`window`)"),
            ("monitor", self.monitor.plateau_steps, 0, MAX_STEPS, " (`plateau_steps`; 0: off)"),
            ("architecture", self.architecture.n_layers.unwrap_or(1), 1, 1024, " (`n_layers`)"),
            ("architecture", self.architecture.vocab_size.unwrap_or(0), 0, 1 << 24, " (`vocab_size`; 0: the tokenizer's)"),
        ];
        for (name, v, least, most, note) in counts {
            if !(least..=most).contains(&v) {
                return err(
                    name,
                    format!("`{name}` must be a whole number in {least}..={most}{note}, not {v}"),
                );
            }
        }
        Ok(())
    }

    /// The optimizer's and the monitor's numbers (finite, in range).
    fn validate_optimizer(&self) -> Result<(), ConfigError> {
        let err = |key: &'static str, msg: String| Err(ConfigError::new(key, msg));
        if !(self.learning_rate > 0.0 && self.learning_rate.is_finite()) {
            return err(
                "learning_rate",
                "`learning_rate` must be a positive number".into(),
            );
        }
        for (name, v) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&v) {
                return err(name, format!("`{name}` must lie in [0, 1)"));
            }
        }
        // NaN fails every comparison: each range is written so that it does too.
        for (name, v, ok, what) in [
            (
                "grad_clip",
                self.grad_clip,
                self.grad_clip >= 0.0,
                "a number ≥ 0 (0 turns clipping off)",
            ),
            (
                "weight_decay",
                self.weight_decay,
                self.weight_decay >= 0.0,
                "a number ≥ 0",
            ),
            ("eps", self.eps, self.eps > 0.0, "a positive number"),
            (
                "min_lr_ratio",
                self.min_lr_ratio,
                (0.0..=1.0).contains(&self.min_lr_ratio),
                "a number in [0, 1]",
            ),
            (
                "monitor",
                self.monitor.spike_factor,
                self.monitor.spike_factor > 0.0,
                "positive (`spike_factor`)",
            ),
            (
                "monitor",
                self.monitor.explosion_factor,
                self.monitor.explosion_factor > 0.0,
                "positive (`explosion_factor`)",
            ),
            (
                "monitor",
                self.monitor.plateau_tolerance,
                self.monitor.plateau_tolerance >= 0.0,
                "≥ 0 (`plateau_tolerance`)",
            ),
        ] {
            if !(ok && v.is_finite()) {
                return err(name, format!("`{name}` must be {what}, not {v}"));
            }
        }
        Ok(())
    }

    /// Physical quantities and the tokens of one step on one device.
    fn validate_sizes(&self) -> Result<(), ConfigError> {
        // Physical quantities: outside these ranges a value is a typo (a unit
        // off by 10^9), and MFU would print NaN% or 300 digits.
        check_range(
            "peak_flops",
            self.peak_flops,
            1e9,
            1e18,
            "FLOP/s (1 GFLOP/s to 1 EFLOP/s per device)",
        )?;
        check_range("memory_limit_gb", self.memory_limit_gb, 0.01, 1e6, "GB")?;
        // Tokens per step on one device: far beyond what any device holds is
        // a typo, and products of such counts overflow.
        let tokens = self
            .batch_size
            .fixed()
            .unwrap_or(1)
            .checked_mul(self.sequence_length)
            .and_then(|t| t.checked_mul(self.gradient_accumulation))
            .filter(|&t| t <= MAX_TOKENS_PER_STEP);
        if tokens.is_none() {
            let key = if self.sequence_length > MAX_TOKENS_PER_STEP {
                "sequence_length"
            } else {
                "batch_size"
            };
            return Err(ConfigError::new(
                key,
                format!(
                    "batch_size × sequence_length × gradient_accumulation is more than 2^28 \
                     ({MAX_TOKENS_PER_STEP}) tokens per step on one device (a step's token ids are held in memory at once)"
                ),
            ));
        }
        Ok(())
    }

    /// Settings that are each valid but not together.
    fn validate_combinations(&self) -> Result<(), ConfigError> {
        let err = |key: &'static str, msg: String| Err(ConfigError::new(key, msg));
        if self.validation_every > 0 && self.validation_documents == 0 {
            return err(
                "validation_every",
                format!(
                    "`validation_every = {}` but `validation_documents` is 0: no documents are held out to validate on",
                    self.validation_every
                ),
            );
        }
        if self.validation_every > 0 && self.validation_batches == 0 {
            return err(
                "validation_batches",
                "`validation_batches` must be positive when `validation_every` is set".into(),
            );
        }
        if self.attention == AttentionKind::Flash && self.device == DeviceKind::Cpu {
            return err(
                "attention",
                "`attention = \"flash\"` runs on CUDA devices only: set `device = \"cuda\"` (with a build that has the `flash-attn` feature) or use `attention = \"eager\"` on the CPU".into(),
            );
        }
        if let (Some(k), DeviceKind::Cpu) = (self.kernels, self.device) {
            return err(
                "kernels",
                format!("`kernels = \"{}\"` chooses among CUDA kernels: set `device = \"cuda\"`, or leave `kernels` out on the CPU", k.name()),
            );
        }
        if self.precision == Precision::Bf16 && self.device == DeviceKind::Cpu {
            return err(
                "precision",
                "`precision = \"bf16\"` needs a GPU: candle's CPU matmul has no bf16 kernels; use \"bf16-mixed\" (bf16 products, f32 weights) or \"f32\" on the CPU".into(),
            );
        }
        if self.attention == AttentionKind::Flash && self.precision == Precision::F32 {
            return err(
                "attention",
                "`attention = \"flash\"` computes in bf16 (the flash kernels have no f32 variant): \
                 use `precision = \"bf16\"` or `\"bf16-mixed\"`, or `attention = \"eager\"` for f32"
                    .into(),
            );
        }
        Ok(())
    }

    /// The model preset and its architecture overrides.
    fn validate_model(&self) -> Result<(), ConfigError> {
        let err = |key: &'static str, msg: String| Err(ConfigError::new(key, msg));
        if ModelConfig::preset(&self.model).is_none() {
            return err(
                "model",
                format!(
                    "`model`: unknown preset `{}` (known: {})",
                    self.model,
                    PRESETS.join(", ")
                ),
            );
        }
        if let Err(e) = self.model_config() {
            return err("architecture", format!("`architecture`: {e}"));
        }
        Ok(())
    }

    /// Checks that the binary that will train this run was built with what
    /// the configuration needs (a CUDA device, the flash-attention kernels).
    pub fn check_build(&self, build: Features) -> Result<(), ConfigError> {
        let how =
            "build one with scripts/build-gpu.sh or `cargo build --release --features flash-attn` \
                   (docs/gpu.md); to plan for such a build elsewhere, set SWEEP_BIN to its path";
        if self.device == DeviceKind::Cuda && !build.cuda {
            return Err(ConfigError::new(
                "device",
                format!("`device = \"cuda\"` needs a sweep built with the `cuda` feature, and this one has none: {how}"),
            ));
        }
        if self.attention == AttentionKind::Flash && !build.flash_attn {
            return Err(ConfigError::new(
                "attention",
                format!("`attention = \"flash\"` needs a sweep built with the `flash-attn` feature, and this one has none: {how}"),
            ));
        }
        Ok(())
    }
}
