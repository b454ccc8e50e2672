//! The CPU's peak: the matrix-product throughput the trainer's own kernels
//! reach on this machine and thread count (what MFU is measured against on a
//! CPU): candle's f32 GEMM for `f32`, sweep's bf16 kernel for `bf16-mixed`.
//! Measured once and cached per CPU model, kernel and thread count, with
//! the date (`~/.cache/sweep/cpu-peak.json`); `sweep bench peak` refreshes
//! it for every thread count.

use super::ops::linear::bf16_gemm::{self, Bf16Kernel, View};
use anyhow::Result;
use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

/// Which matrix-product kernel the peak is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// candle's f32 GEMM (`precision = "f32"`).
    F32,
    /// bf16 operands, f32 accumulation (`precision = "bf16-mixed"`).
    Bf16,
}

impl Kernel {
    pub fn describe(self) -> &'static str {
        match (self, bf16_gemm::selected()) {
            (Kernel::F32, _) => "candle's f32 matmul",
            (Kernel::Bf16, Bf16Kernel::Avx512Bf16) => "sweep's bf16 matmul (AVX-512 BF16)",
            (Kernel::Bf16, Bf16Kernel::Portable) => "sweep's bf16 matmul (portable)",
        }
    }
}

/// `cpu-peak.json`: one measured peak per CPU model, kernel and thread
/// count. A cache in another format is measured again, never misread.
#[derive(Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Cache {
    /// "<cpu model>/<threads>" (f32), "<cpu model>/bf16/<threads>" or
    /// "<cpu model>/bf16-portable/<threads>" -> its measurement
    peaks: BTreeMap<String, Peak>,
}

#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Peak {
    flops: f64,
    cpu: String,
    kernel: String,
    threads: usize,
    /// When it was measured (RFC 3339, UTC).
    measured_at: String,
}

fn cache_path() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("sweep").join("cpu-peak.json")
}

fn cpu_model() -> String {
    crate::util::process::cpu_model().unwrap_or_else(|| "unknown cpu".into())
}

/// The cache's key: the CPU, the architecture sweep was built for (a build
/// for another one, run under emulation, sees the host's CPU name), the
/// kernel and the threads.
fn key(kernel: Kernel, threads: usize) -> String {
    let kernel = match (kernel, bf16_gemm::selected()) {
        (Kernel::F32, _) => "",
        (Kernel::Bf16, Bf16Kernel::Avx512Bf16) => "/bf16",
        (Kernel::Bf16, Bf16Kernel::Portable) => "/bf16-portable",
    };
    format!(
        "{}/{}{kernel}/{threads}",
        cpu_model(),
        std::env::consts::ARCH
    )
}

/// Best FLOP/s over square products of 256, 512 and 1024, three rounds each,
/// on a pool of `threads` (candle splits its products by
/// `RAYON_NUM_THREADS`, which the trainer sets to the same count; the pool
/// bounds both kernels to it whatever the process's global pool is).
pub fn measure(kernel: Kernel, threads: usize) -> Result<f64> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .build()?
        .install(|| measure_here(kernel))
}

fn measure_here(kernel: Kernel) -> Result<f64> {
    let mut best = 0f64;
    for n in [256usize, 512, 1024] {
        let a = Tensor::randn(0f32, 1.0, (n, n), &Device::Cpu)?;
        let b = Tensor::randn(0f32, 1.0, (n, n), &Device::Cpu)?;
        let (av, bv) = (
            a.flatten_all()?.to_vec1::<f32>()?,
            b.flatten_all()?.to_vec1::<f32>()?,
        );
        let mut c = vec![0f32; n * n];
        let mut product = || -> Result<()> {
            match kernel {
                Kernel::F32 => drop(a.matmul(&b)?),
                Kernel::Bf16 => {
                    let view = |d| View {
                        data: d,
                        rs: n,
                        cs: 1,
                    };
                    bf16_gemm::gemm(n, n, n, view(&av), view(&bv), &mut c);
                }
            }
            Ok(())
        };
        product()?; // warm up
        let reps = (2_000_000_000 / (2 * n * n * n)).max(2);
        for _ in 0..3 {
            let t = Instant::now();
            for _ in 0..reps {
                product()?;
            }
            let flops = (2 * n * n * n * reps) as f64 / t.elapsed().as_secs_f64();
            best = best.max(flops);
        }
    }
    Ok(best)
}

fn load() -> Cache {
    std::fs::read(cache_path())
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// The cached peak for this CPU, kernel and thread count, measured on first use.
pub fn cpu_peak(kernel: Kernel, threads: usize) -> Result<f64> {
    match load().peaks.get(&key(kernel, threads)) {
        Some(p) => Ok(p.flops),
        None => refresh(kernel, threads),
    }
}

/// Measures again and stores the result (for `sweep bench peak`).
pub fn refresh(kernel: Kernel, threads: usize) -> Result<f64> {
    let p = measure(kernel, threads)?;
    let mut cache = load();
    let peak = Peak {
        flops: p,
        cpu: cpu_model(),
        kernel: kernel.describe().to_string(),
        threads,
        measured_at: crate::util::now_rfc3339(),
    };
    cache.peaks.insert(key(kernel, threads), peak);
    // A cache that cannot be written only costs a measurement next time.
    let path = cache_path();
    if std::fs::create_dir_all(crate::util::fs::parent_dir(&path)).is_ok() {
        let _ = crate::util::fs::write_atomic(
            &path,
            &serde_json::to_vec_pretty(&cache).unwrap_or_default(),
        );
    }
    Ok(p)
}
