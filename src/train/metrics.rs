//! What every logged step reports, in one place: throughput, MFU and TFLOPs
//! from one table of peak FLOPs per device, and the JSON-lines log.

use super::peak::Kernel;
use crate::config::{Precision, TrainConfig};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Peak FLOP/s of one device and where the number comes from: `peak_flops`
/// in the configuration, else its `gpu` name, else the name the CUDA driver
/// gives the device (`driver_name`, `None` on the CPU) looked up in
/// [`crate::config::devices::ACCELERATORS`], else, on the CPU, the measured peak of this machine.
pub fn peak_flops(
    cfg: &TrainConfig,
    driver_name: Option<&str>,
    threads: usize,
) -> Result<(f64, String)> {
    if let Some(p) = cfg.peak_flops {
        return Ok((p, "peak_flops in the configuration".into()));
    }
    if let Some(gpu) = cfg.gpu.as_deref().or(driver_name) {
        return match crate::config::devices::lookup(gpu) {
            Some(a) => Ok((
                a.peak_flops,
                format!("the {} entry of the peak-FLOPs table", a.matches.join(" ")),
            )),
            None => bail!(
                "no peak FLOPs known for gpu `{gpu}` (known: {}); set `peak_flops`",
                crate::config::devices::known()
            ),
        };
    }
    let kernel = match cfg.precision {
        Precision::Bf16Mixed => Kernel::Bf16,
        _ => Kernel::F32,
    };
    let p = super::peak::cpu_peak(kernel, threads)?;
    Ok((
        p,
        format!(
            "the measured peak of {} on {threads} CPU threads",
            kernel.describe()
        ),
    ))
}

/// One logged step.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StepMetrics {
    pub step: usize,
    pub loss: f64,
    pub lr: f64,
    pub grad_norm: f64,
    /// Tokens per second per device, padding included (as the reference).
    pub tokens_per_second: f64,
    /// Ranks training together (data parallelism); 1 for a single process.
    #[serde(default = "one")]
    pub world_size: usize,
    /// Sequences per device and micro-batch (what `batch_size = "max"` became).
    #[serde(default)]
    pub batch_size: usize,
    /// Tokens per second of all ranks together (the global batch per step time).
    #[serde(default)]
    pub global_tokens_per_second: f64,
    /// Share of tokens with a training label (not padding or a document start).
    pub training_tokens_pct: f64,
    pub mfu_pct: f64,
    pub tflops: f64,
    pub step_time_s: f64,
    pub elapsed_s: f64,
    pub peak_memory_mb: f64,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub val_loss: Option<f64>,
}

fn one() -> usize {
    1
}

/// What else `metrics.jsonl` records besides steps: something a run should
/// know about, at a step, with the value that crossed a threshold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub step: usize,
    pub event: EventKind,
    pub value: f64,
    pub threshold: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// The loss jumped above a multiple of its rolling mean.
    LossSpike,
    /// The gradient norm exceeded a multiple of the clipping norm.
    GradientExplosion,
    /// The loss stopped improving.
    Plateau,
    /// The measured MFU exceeds 100%: the peak FLOPs is too low for this
    /// device (a noisy CPU measurement, a wrong `gpu` or `peak_flops`).
    MfuAbovePeak,
}

impl EventKind {
    pub fn describe(self) -> &'static str {
        match self {
            EventKind::LossSpike => "loss spike",
            EventKind::GradientExplosion => "gradient explosion",
            EventKind::Plateau => "plateau",
            EventKind::MfuAbovePeak => "MFU above 100% of the peak",
        }
    }
}

/// Throughput figures over an interval of steps.
pub struct Throughput {
    pub tokens_per_second: f64,
    pub mfu_pct: f64,
    pub tflops: f64,
}

/// Tokens/s, MFU and TFLOPs of an interval. An MFU above 100% is reported as
/// measured (the caller records an [`EventKind::MfuAbovePeak`] event): the
/// throughput is right even when the peak it is divided by is not.
pub fn throughput(tokens: u64, seconds: f64, flops_per_token: f64, peak: f64) -> Throughput {
    let tps = tokens as f64 / seconds.max(1e-12);
    let flops = tps * flops_per_token;
    Throughput {
        tokens_per_second: tps,
        mfu_pct: 100.0 * flops / peak,
        tflops: flops / 1e12,
    }
}

/// The counters between two log lines, owned by the run loop and emptied at
/// every log line.
#[derive(Debug, Clone, Copy, Default)]
pub struct Interval {
    /// Tokens fed to this rank, padding included.
    pub tokens: u64,
    /// Tokens with a training label.
    pub training_tokens: u64,
    pub seconds: f64,
    pub steps: usize,
}

impl Interval {
    pub fn add(&mut self, tokens: u64, training_tokens: u64, seconds: f64) {
        self.tokens += tokens;
        self.training_tokens += training_tokens;
        self.seconds += seconds;
        self.steps += 1;
    }

    /// The interval so far, leaving an empty one in its place.
    pub fn take(&mut self) -> Interval {
        std::mem::take(self)
    }

    pub fn training_tokens_pct(&self) -> f64 {
        100.0 * self.training_tokens as f64 / self.tokens.max(1) as f64
    }

    pub fn step_time_s(&self) -> f64 {
        self.seconds / self.steps.max(1) as f64
    }
}

/// Peak resident memory of this process, in MB.
pub fn peak_memory_mb() -> f64 {
    crate::util::process::proc_kb("/proc/self/status", "VmHWM").map_or(0.0, |kb| kb as f64 / 1024.0)
}

pub const METRICS_FILE: &str = "metrics.jsonl";

/// `metrics.jsonl`: one JSON object per logged step (and per monitor event),
/// flushed as written.
pub struct MetricsLog {
    file: std::fs::File,
    pub path: PathBuf,
}

impl MetricsLog {
    pub fn open(run_dir: &Path) -> Result<MetricsLog> {
        let path = run_dir.join(METRICS_FILE);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        Ok(MetricsLog { file, path })
    }

    pub fn write<T: Serialize>(&mut self, record: &T) -> Result<()> {
        let mut line = serde_json::to_vec(record)?;
        line.push(b'\n');
        self.file.write_all(&line)?;
        self.file.flush()?;
        Ok(())
    }

    /// After a resume: keeps only records up to `step` (and drops a torn
    /// last line), so the log continues without duplicated or missing steps.
    pub fn truncate_after(&mut self, step: usize) -> Result<()> {
        let text = std::fs::read_to_string(&self.path).unwrap_or_default();
        let kept: String = text
            .lines()
            .filter(|l| {
                serde_json::from_str::<serde_json::Value>(l)
                    .ok()
                    .and_then(|v| v.get("step").and_then(|s| s.as_u64()))
                    .is_some_and(|s| s as usize <= step)
            })
            .map(|l| format!("{l}\n"))
            .collect();
        crate::util::fs::write_atomic(&self.path, kept.as_bytes())?;
        *self = MetricsLog::open(crate::util::fs::parent_dir(&self.path))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_and_overrides_give_the_peak() {
        let mut c = TrainConfig {
            gpu: Some("gh200".into()),
            ..Default::default()
        };
        assert_eq!(peak_flops(&c, None, 1).unwrap().0, 989e12);
        c.gpu = Some("NVIDIA A100-SXM4-80GB".into());
        assert_eq!(peak_flops(&c, None, 1).unwrap().0, 312e12);
        c.peak_flops = Some(5e12);
        assert_eq!(peak_flops(&c, None, 1).unwrap().0, 5e12);
        c.peak_flops = None;
        c.gpu = Some("TPU".into());
        assert!(peak_flops(&c, None, 1).is_err());
        // Without a `gpu`, the driver's name for the device.
        c.gpu = None;
        let h100 = peak_flops(&c, Some("NVIDIA H100 80GB HBM3"), 1).unwrap();
        assert_eq!(h100.0, 989e12);
        assert!(peak_flops(&c, Some("NVIDIA GeForce GT 710"), 1).is_err());
    }

    #[test]
    fn an_mfu_above_100_percent_is_reported_as_measured() {
        assert!((throughput(1000, 1.0, 1e9, 1e12).mfu_pct - 100.0).abs() < 1e-9);
        let t = throughput(1000, 1.0, 1e10, 1e12);
        assert!((t.mfu_pct - 1000.0).abs() < 1e-9 && (t.tflops - 10.0).abs() < 1e-9);
    }

    #[test]
    fn events_are_written_with_their_kind() {
        let e = Event {
            step: 7,
            event: EventKind::MfuAbovePeak,
            value: 103.5,
            threshold: 100.0,
        };
        let line = serde_json::to_string(&e).unwrap();
        assert_eq!(
            line,
            r#"{"step":7,"event":"mfu_above_peak","value":103.5,"threshold":100.0}"#
        );
    }

    #[test]
    fn resuming_truncates_the_log_after_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = MetricsLog::open(dir.path()).unwrap();
        for s in [1, 10, 20, 30] {
            log.write(&serde_json::json!({ "step": s })).unwrap();
        }
        std::fs::OpenOptions::new()
            .append(true)
            .open(&log.path)
            .unwrap()
            .write_all(b"{\"step\": 4")
            .unwrap();
        log.truncate_after(20).unwrap();
        log.write(&serde_json::json!({ "step": 30 })).unwrap();
        let text = std::fs::read_to_string(&log.path).unwrap();
        assert_eq!(
            text,
            "{\"step\":1}\n{\"step\":10}\n{\"step\":20}\n{\"step\":30}\n"
        );
    }
}
