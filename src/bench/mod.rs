//! `sweep bench ...`: the benchmarks of the hot paths. Each prints a table of
//! figures; none is a test (speed goals are checked here, not in `cargo test`).

pub mod data;
pub mod ddp;
pub mod gemms;
pub mod history;
pub mod kernels;
pub mod local;
pub mod plan;
pub mod pretokenize;
pub mod report;
pub mod train;

use crate::config::{ModelConfig, ModelOverrides};
use std::time::{Duration, Instant};

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

/// Runs `f` once and returns its result with the wall time it took.
pub fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let v = f();
    (v, t.elapsed())
}

/// CPU time of this process so far: (user, kernel) seconds.
pub fn cpu_times() -> (f64, f64) {
    use nix::sys::resource::{getrusage, UsageWho};
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(u) => {
            let s = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 * 1e-6;
            (s(u.user_time()), s(u.system_time()))
        }
        Err(_) => (0.0, 0.0),
    }
}
