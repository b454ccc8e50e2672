//! The CPU's peak, what MFU is measured against there: the matrix-product rate of the trainer's
//! own kernels on this machine and thread count (f32: candle's GEMM; bf16-mixed: the best of the
//! bf16 kernels and the f32 GEMM). Cached per CPU model, kernel and threads in
//! `~/.cache/sweep/cpu-peak.json`; `sweep bench peak` refreshes it. No datasheet (a VM's is
//! not). On a busy machine a round is timed by its threads' CPU time, not the clock.

use crate::config::runtime::CpuKernels;
use crate::train::network::ops::linear::bf16_gemm::{self, Bf16Kernel, View};
use anyhow::Result;
use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;
use strum::VariantArray;

/// Which matrix-product kernel a peak is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// candle's f32 GEMM (`precision = "f32"`).
    F32,
    /// bf16 operands, f32 accumulation (`precision = "bf16-mixed"`).
    Bf16(Bf16Kernel),
}

impl Kernel {
    pub fn describe(self) -> String {
        match self {
            Kernel::F32 => "candle's f32 matmul".into(),
            Kernel::Bf16(k) => format!("sweep's bf16 matmul ({})", k.name()),
        }
    }

    /// Its part of the cache's key.
    fn key(self) -> &'static str {
        match self {
            Kernel::F32 => "",
            Kernel::Bf16(Bf16Kernel::Amx) => "/bf16-amx",
            Kernel::Bf16(Bf16Kernel::Avx512Bf16) => "/bf16",
            Kernel::Bf16(Bf16Kernel::Portable) => "/bf16-portable",
        }
    }

    /// The kernels a run of this precision may multiply with, whose best is its peak.
    pub fn for_precision(bf16: bool) -> Vec<Kernel> {
        if !bf16 {
            return vec![Kernel::F32];
        }
        let used = bf16_gemm::selected();
        let faster = Bf16Kernel::VARIANTS.iter().take_while(|k| **k != used);
        faster
            .filter(|k| k.available())
            .chain([&used])
            .map(|k| Kernel::Bf16(*k))
            .chain([Kernel::F32])
            .collect()
    }
}

/// `cpu-peak.json`; a cache in another format is measured again, never misread.
#[derive(Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Cache {
    /// `<cpu model>/<arch>[/bf16[-amx|-portable]]/<threads>` -> its measurement
    peaks: BTreeMap<String, Peak>,
}

#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Peak {
    flops: f64,
    cpu: String,
    kernel: String,
    threads: usize,
    /// The share of wall time its threads spent on a core; below [`QUIET`], per CPU-second.
    cpu_share: f64,
    /// When it was measured (RFC 3339, UTC).
    measured_at: String,
}

/// A measurement whose threads ran this share of the wall time had the machine to itself.
const QUIET: f64 = 0.9;

/// One round's FLOP/s and the share of wall time its `threads` ran; below [`QUIET`] the rate
/// is over the CPU time they got.
fn round_rate(flops: f64, wall_s: f64, cpu_s: f64, threads: usize) -> (f64, f64) {
    let share = cpu_s / (wall_s * threads as f64).max(1e-12);
    let seconds = if share >= QUIET || cpu_s <= 0.0 {
        wall_s
    } else {
        cpu_s / threads as f64
    };
    (flops / seconds.max(1e-12), share)
}

/// CPU seconds the pool's threads have run (each thread's own clock).
fn pool_cpu_seconds(pool: &rayon::ThreadPool) -> f64 {
    pool.broadcast(|_| {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes one timespec through a valid pointer.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
        match rc {
            0 => t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9,
            _ => 0.0,
        }
    })
    .into_iter()
    .sum()
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

/// The cache's key: CPU, build architecture (an emulated build sees the host's CPU), kernel,
/// threads.
fn key(kernel: Kernel, threads: usize) -> String {
    format!(
        "{}/{}{}/{threads}",
        cpu_model(),
        std::env::consts::ARCH,
        kernel.key()
    )
}

/// Best FLOP/s over square products of 256, 512 and 1024, three rounds each, on a pool of
/// `threads`, with the best round's share of wall time on a core.
fn measure(kernel: Kernel, threads: usize) -> Result<(f64, f64)> {
    let threads = threads.max(1);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
    let mut best = (0f64, 0f64);
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
                Kernel::Bf16(k) => {
                    let view = |d| View {
                        data: d,
                        rs: n,
                        cs: 1,
                    };
                    bf16_gemm::gemm_with(k, n, n, n, view(&av), view(&bv), &mut c);
                }
            }
            Ok(())
        };
        pool.install(&mut product)?; // warm up
        let reps = (2_000_000_000 / (2 * n * n * n)).max(2);
        for _ in 0..3 {
            // The clock spans both readings of the threads' clocks.
            let t = Instant::now();
            let cpu = pool_cpu_seconds(&pool);
            pool.install(|| (0..reps).try_for_each(|_| product()))?;
            let cpu = pool_cpu_seconds(&pool) - cpu;
            let wall = t.elapsed().as_secs_f64();
            let round = round_rate((2 * n * n * n * reps) as f64, wall, cpu, threads);
            if round.0 > best.0 {
                best = round;
            }
        }
    }
    Ok(best)
}

fn load() -> Cache {
    crate::util::fs::read_regular(&cache_path(), 16 << 20, None)
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

/// The peak a run of this precision is measured against, and which kernel gave it.
pub fn precision_peak(bf16: bool, threads: usize) -> Result<(f64, Kernel)> {
    let mut best = (0.0, Kernel::F32);
    for k in Kernel::for_precision(bf16) {
        best = best_of(best, (cpu_peak(k, threads)?, k));
    }
    Ok(best)
}

fn best_of(a: (f64, Kernel), b: (f64, Kernel)) -> (f64, Kernel) {
    if b.0 > a.0 {
        b
    } else {
        a
    }
}

/// For a bf16-mixed run left to choose (`auto`): bf16's and f32's peaks where f32 is faster.
pub fn f32_is_faster(asked: CpuKernels, threads: usize) -> Result<Option<(f64, f64)>> {
    f32_products(asked, || {
        let bf16 = cpu_peak(Kernel::Bf16(bf16_gemm::selected()), threads)?;
        Ok((bf16, cpu_peak(Kernel::F32, threads)?))
    })
}

/// Whether a bf16-mixed run multiplies in f32: only when left to choose and f32 is faster.
fn f32_products(
    asked: CpuKernels,
    peaks: impl FnOnce() -> Result<(f64, f64)>,
) -> Result<Option<(f64, f64)>> {
    if asked != CpuKernels::Auto {
        return Ok(None);
    }
    let (bf16, f32) = peaks()?;
    Ok((f32 > bf16).then_some((bf16, f32)))
}

/// Measures again and stores the result (for `sweep bench peak`).
pub fn refresh(kernel: Kernel, threads: usize) -> Result<f64> {
    let (p, cpu_share) = measure(kernel, threads)?;
    if cpu_share < QUIET {
        eprintln!(
            "note: the peak of {} on {threads} thread(s) was measured while other work held \
             the cores ({:.0}% of its time on a core): timed by the CPU time it got, not the clock",
            kernel.describe(),
            100.0 * cpu_share
        );
    }
    let mut cache = load();
    let peak = Peak {
        flops: p,
        cpu: cpu_model(),
        kernel: kernel.describe().to_string(),
        threads,
        cpu_share,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The best of a precision's kernels, whichever it is (planted peaks).
    #[test]
    fn the_peak_is_the_best_kernels() {
        let amx = (900e9, Kernel::Bf16(Bf16Kernel::Amx));
        let f32 = (100e9, Kernel::F32);
        let portable = (60e9, Kernel::Bf16(Bf16Kernel::Portable));
        assert_eq!(best_of(best_of(portable, amx), f32), amx);
        assert_eq!(best_of(portable, f32), f32, "f32 beats a slow bf16 kernel");
        assert_eq!(Kernel::for_precision(false), [Kernel::F32]);
        let bf16 = Kernel::for_precision(true);
        assert_eq!(bf16.last(), Some(&Kernel::F32));
        assert!(bf16.contains(&Kernel::Bf16(bf16_gemm::selected())));
        assert_eq!(
            Kernel::Bf16(Bf16Kernel::Amx).describe(),
            "sweep's bf16 matmul (AMX)"
        );
    }

    /// f32 products where the bf16 kernel is slower (an AVX-512 BF16
    /// Xeon's 97 GFLOP/s against candle's 165), never where a kernel was
    /// named.
    #[test]
    fn bf16_mixed_multiplies_in_f32_only_where_that_is_faster_and_unasked() {
        let planted = |bf16, f32| move || Ok((bf16, f32));
        let auto = CpuKernels::Auto;
        assert_eq!(
            f32_products(auto, planted(97e9, 165e9)).unwrap(),
            Some((97e9, 165e9))
        );
        assert_eq!(f32_products(auto, planted(929e9, 165e9)).unwrap(), None);
        let unmeasured = || -> Result<(f64, f64)> { panic!("a named kernel measures nothing") };
        assert_eq!(
            f32_products(CpuKernels::Avx512Bf16, unmeasured).unwrap(),
            None
        );
        assert_eq!(
            f32_products(CpuKernels::Portable, unmeasured).unwrap(),
            None
        );
    }

    #[test]
    fn a_quiet_round_is_timed_by_the_clock() {
        // 10 GFLOP in 1 s on 2 threads that ran 1.9 of their 2 CPU-seconds.
        let (rate, share) = round_rate(1e10, 1.0, 1.9, 2);
        assert_eq!(rate, 1e10);
        assert!((share - 0.95).abs() < 1e-12);
    }

    #[test]
    fn a_round_kept_off_its_cores_is_timed_by_the_cpu_time_it_got() {
        // One thread sharing its core with two others: a third of the wall
        // time on the core, so the kernel's rate is three times the clock's.
        let (rate, share) = round_rate(1e10, 3.0, 1.0, 1);
        assert!((rate - 1e10).abs() < 1e-3, "{rate}");
        assert!((share - 1.0 / 3.0).abs() < 1e-12);
        // Two threads that got one CPU-second between them in one second.
        let (rate, _) = round_rate(1e10, 1.0, 1.0, 2);
        assert!((rate - 2e10).abs() < 1e-3, "{rate}");
    }

    #[test]
    fn a_clock_that_reads_nothing_falls_back_to_the_wall_time() {
        assert_eq!(round_rate(1e10, 2.0, 0.0, 1).0, 5e9);
    }

    #[test]
    fn the_pools_cpu_time_counts_its_threads_work_and_no_more_than_the_clock() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let t = Instant::now();
        let before = pool_cpu_seconds(&pool);
        let sum = pool.install(|| {
            use rayon::prelude::*;
            (0..50_000_000u64)
                .into_par_iter()
                .map(std::hint::black_box)
                .sum::<u64>()
        });
        let cpu = pool_cpu_seconds(&pool) - before;
        let wall = t.elapsed().as_secs_f64();
        assert_eq!(sum, 50_000_000 * 49_999_999 / 2);
        // Two threads cannot run longer than twice the clock.
        assert!(
            cpu > 0.0 && cpu <= 2.0 * wall + 1e-3,
            "{cpu} s on the pool's clocks in {wall} s"
        );
    }
}
