//! `sweep bench ...`: the benchmarks of the trainer a user runs. Each prints
//! a table of figures; none is a test (speed goals are checked here, not in
//! `cargo test`). Those that time sweep's own tooling (plan, report, history,
//! data, pretokenize, local) are the `sweep-bench` binary's (`bench/`).

pub mod ddp;
pub mod gemms;
pub mod kernels;
pub mod train;

use crate::config::{ModelConfig, ModelOverrides};

/// The most values one operand of a benchmark may hold (8 GiB of f32):
/// larger sizes no machine holds (and the kernels' 32-bit counts could not
/// index) are refused before anything is allocated.
pub const MAX_ELEMENTS: usize = 1 << 31;

/// A preset's shapes for a benchmark: its vocabulary `vocab` where given,
/// else the preset's, else 32000 (the presets that take theirs from the
/// tokenizer).
pub fn preset_shapes(name: &str, vocab: Option<usize>) -> anyhow::Result<ModelConfig> {
    let mut cfg = ModelConfig::resolve(name, &ModelOverrides::default())?;
    match vocab {
        Some(0) => anyhow::bail!("--vocab must be at least 1"),
        Some(v) => cfg.vocab_size = v,
        None if cfg.vocab_size == 0 => cfg.vocab_size = 32_000,
        None => {}
    }
    Ok(cfg)
}
