//! The CPU's peak: candle's own f32 matmul throughput on this machine and
//! thread count (what MFU is measured against on a CPU). Measured once and
//! cached per CPU model and thread count; `sweep bench peak` refreshes it.

use anyhow::Result;
use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Default, Serialize, Deserialize)]
struct Cache {
    /// "<cpu model>/<threads>" -> FLOP/s
    peaks: BTreeMap<String, f64>,
}

fn cache_path() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("sweep").join("cpu-peak.json")
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown cpu".into())
}

/// Best f32 matmul FLOP/s over a few sizes and repeats, on the current
/// rayon/candle thread count (`RAYON_NUM_THREADS`).
pub fn measure() -> Result<f64> {
    let mut best = 0f64;
    for n in [256usize, 512, 1024] {
        let a = Tensor::randn(0f32, 1.0, (n, n), &Device::Cpu)?;
        let b = Tensor::randn(0f32, 1.0, (n, n), &Device::Cpu)?;
        let _ = a.matmul(&b)?; // warm up
        let reps = (2_000_000_000 / (2 * n * n * n)).max(2);
        for _ in 0..3 {
            let t = Instant::now();
            for _ in 0..reps {
                let _ = a.matmul(&b)?;
            }
            let flops = (2 * n * n * n * reps) as f64 / t.elapsed().as_secs_f64();
            best = best.max(flops);
        }
    }
    Ok(best)
}

/// The cached peak for this CPU and thread count, measured on first use.
pub fn cpu_peak(threads: usize) -> Result<f64> {
    let key = format!("{}/{threads}", cpu_model());
    let path = cache_path();
    let mut cache: Cache = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    if let Some(p) = cache.peaks.get(&key) {
        return Ok(*p);
    }
    let p = measure()?;
    record(&mut cache, key, p, &path);
    Ok(p)
}

/// Measures again and stores the result (for `sweep bench peak`).
pub fn refresh(threads: usize) -> Result<f64> {
    let path = cache_path();
    let mut cache: Cache = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let p = measure()?;
    record(&mut cache, format!("{}/{threads}", cpu_model()), p, &path);
    Ok(p)
}

fn record(cache: &mut Cache, key: String, p: f64, path: &std::path::Path) {
    cache.peaks.insert(key, p);
    // A cache that cannot be written only costs a measurement next time.
    if std::fs::create_dir_all(crate::util::fs::parent_dir(path)).is_ok() {
        let _ = crate::util::fs::write_atomic(
            path,
            &serde_json::to_vec_pretty(cache).unwrap_or_default(),
        );
    }
}
