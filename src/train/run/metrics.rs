//! What every logged step measures: throughput, MFU and TFLOPs against one peak table, the
//! counters between log lines, peak memory. The log itself is [`super::record`].

use super::record::{Event, EventKind, MetricsLog, Placement, StepMetrics};
use crate::config::{Precision, TrainConfig};
use anyhow::{bail, Result};

/// Peak FLOP/s of one device and its source: `peak_flops`, else `gpu`, else the driver's name
/// in [`crate::estimate::devices::ACCELERATORS`], else (CPU) this machine's measured peak.
pub fn peak_flops(
    cfg: &TrainConfig,
    driver_name: Option<&str>,
    threads: usize,
) -> Result<(f64, String)> {
    if let Some(p) = cfg.peak_flops {
        return Ok((p, "peak_flops in the configuration".into()));
    }
    if let Some(gpu) = cfg.gpu.as_deref().or(driver_name) {
        return match crate::estimate::devices::lookup(gpu) {
            Some(a) => Ok((
                a.peak_flops,
                format!("the {} entry of the peak-FLOPs table", a.matches.join(" ")),
            )),
            None => bail!(
                "no peak FLOPs known for gpu `{gpu}` (known: {}); set `peak_flops`",
                crate::estimate::devices::known()
            ),
        };
    }
    let (p, kernel) = super::peak::precision_peak(cfg.precision == Precision::Bf16Mixed, threads)?;
    Ok((
        p,
        format!(
            "the measured peak of {} on {threads} CPU threads (the best this CPU has for {})",
            kernel.describe(),
            match cfg.precision {
                Precision::Bf16Mixed => "bf16-mixed",
                _ => "f32",
            }
        ),
    ))
}

/// Throughput figures over an interval of steps.
pub struct Throughput {
    pub tokens_per_second: f64,
    pub mfu_pct: f64,
    pub tflops: f64,
}

/// Tokens/s, MFU and TFLOPs of an interval; an MFU over 100% is reported as measured (the
/// throughput is right even when the peak is not).
pub fn throughput(tokens: u64, seconds: f64, flops_per_token: f64, peak: f64) -> Throughput {
    let tps = tokens as f64 / seconds.max(1e-12);
    let (tflops, mfu_pct) = crate::estimate::flops(tps, flops_per_token, Some(peak));
    Throughput {
        tokens_per_second: tps,
        mfu_pct: mfu_pct.expect("a peak given"),
        tflops,
    }
}

/// The counters between two log lines, emptied at every line.
#[derive(Debug, Clone, Copy, Default)]
pub struct Interval {
    /// Tokens fed to this rank, padding included.
    pub tokens: u64,
    /// Tokens with a training label.
    pub training_tokens: u64,
    pub seconds: f64,
    /// Of `seconds`, those waiting in collectives: what a straggler makes its peers wait.
    pub comm_seconds: f64,
    pub steps: usize,
}

impl Interval {
    pub fn add(&mut self, tokens: u64, training_tokens: u64, seconds: f64, comm_seconds: f64) {
        self.tokens += tokens;
        self.training_tokens += training_tokens;
        self.seconds += seconds;
        self.comm_seconds += comm_seconds.min(seconds);
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

    /// Seconds per step outside the collectives' waits: this rank's own work.
    pub fn compute_s(&self) -> f64 {
        (self.seconds - self.comm_seconds).max(0.0) / self.steps.max(1) as f64
    }
}

/// What one rank reports as it trains: counters, the peak MFU is measured against, and on the
/// main rank the log lines, events and their echo on stderr.
pub struct Reporter {
    log: Option<MetricsLog>,
    interval: Interval,
    world_size: usize,
    batch_size: usize,
    training_steps: usize,
    flops_per_token: f64,
    peak: f64,
    peak_source: String,
    mfu_warned: bool,
    meter: Option<super::energy::Meter>,
}

/// What a log line says besides the interval's throughput.
pub struct LoggedStep {
    pub step: usize,
    pub loss: f64,
    pub lr: f64,
    pub grad_norm: f64,
    pub elapsed_s: f64,
    pub peak_memory_mb: f64,
    pub val_loss: Option<f64>,
    /// Every rank's [`Interval::compute_s`], by rank (gathered by the caller).
    pub rank_compute_s: Vec<f64>,
}

impl Reporter {
    pub fn new(
        log: Option<MetricsLog>,
        cfg: &TrainConfig,
        world_size: usize,
        flops_per_token: f64,
        peak: f64,
        peak_source: String,
    ) -> Reporter {
        Reporter {
            log,
            interval: Interval::default(),
            world_size,
            batch_size: cfg.batch(),
            training_steps: cfg.training_steps,
            flops_per_token,
            peak,
            peak_source,
            mfu_warned: false,
            meter: None,
        }
    }

    /// Measures the device's power from now on (the main rank's GPU).
    pub fn with_meter(mut self, meter: Option<super::energy::Meter>) -> Reporter {
        self.meter = meter;
        self
    }

    /// After a resume from a checkpoint of `step`: the log continues from it.
    pub fn resume(&mut self, step: usize) -> Result<()> {
        match &mut self.log {
            Some(log) => log.truncate_after(step),
            None => Ok(()),
        }
    }

    /// One step's tokens (padding included), training tokens, time and time waiting for ranks.
    pub fn count(&mut self, tokens: u64, training_tokens: u64, seconds: f64, comm_seconds: f64) {
        self.interval
            .add(tokens, training_tokens, seconds, comm_seconds);
    }

    /// This rank's compute seconds per step since the last log line.
    pub fn compute_s(&self) -> f64 {
        self.interval.compute_s()
    }

    /// Records what the GPU's opening found from `step`: kernels that fell back and the others'
    /// times against their twins'.
    pub fn device_opened(
        &mut self,
        step: usize,
        failures: &[crate::train::network::ops::selfcheck::Failure],
        timings: &[crate::train::network::ops::selfcheck::Timing],
    ) -> Result<()> {
        let Some(log) = &mut self.log else {
            return Ok(());
        };
        let fell_back = failures.iter().map(|f| Event {
            step,
            event: EventKind::KernelFallback,
            value: f.rel_err.filter(|e| e.is_finite()).unwrap_or(-1.0),
            threshold: f.tolerance,
            detail: Some(f.describe()),
        });
        let timed = timings.iter().map(|t| Event {
            step,
            event: EventKind::KernelTiming,
            value: t.own_s,
            threshold: t.composed_s,
            detail: Some(t.kernel.name().into()),
        });
        for e in fell_back.chain(timed) {
            log.write(e)?;
        }
        Ok(())
    }

    /// Records that this bf16-mixed run multiplies in f32, from `step`.
    pub fn f32_products(&mut self, step: usize, peaks: Option<(f64, f64)>) -> Result<()> {
        let (Some(log), Some((bf16, f32))) = (&mut self.log, peaks) else {
            return Ok(());
        };
        log.write(Event {
            step,
            event: EventKind::F32Products,
            value: bf16,
            threshold: f32,
            detail: None,
        })
    }

    /// The ranks' hosts from `step` on, also said in the job's log.
    pub fn placement(&mut self, step: usize, hosts: Vec<String>) -> Result<()> {
        let Some(log) = &mut self.log else {
            return Ok(());
        };
        let each: Vec<String> = hosts
            .iter()
            .enumerate()
            .map(|(rank, h)| format!("{rank} on {}", crate::util::text::printable(h)))
            .collect();
        eprintln!("sweep train: ranks from step {step}: {}", each.join(", "));
        log.write(Placement { step, hosts })
    }

    /// The monitor's events at a step, logged and echoed.
    pub fn events(&mut self, step: usize, events: Vec<Event>) -> Result<()> {
        let Some(log) = &mut self.log else {
            return Ok(());
        };
        for e in events {
            eprintln!(
                "warning: step {step}: {} ({:.4} > {:.4})",
                e.event.describe(),
                e.value,
                e.threshold
            );
            log.write(e)?;
        }
        Ok(())
    }

    /// A log line: throughput since the last and the step's figures (every rank empties, main writes).
    pub fn log(&mut self, s: LoggedStep) -> Result<()> {
        let i = self.interval.take();
        let Some(log) = &mut self.log else {
            return Ok(());
        };
        let tp = throughput(i.tokens, i.seconds, self.flops_per_token, self.peak);
        let watts = self.meter.as_mut().and_then(|m| m.watts());
        if tp.mfu_pct > 100.0 {
            if !self.mfu_warned {
                eprintln!(
                    "warning: step {}: MFU came out at {:.1}% (> 100%): the peak FLOPs ({:.3e}/s, {}) \
                     is too low for this device; set `gpu` or `peak_flops` to its real peak \
                     (a measured CPU peak: `sweep bench peak` measures it again). Training goes on.",
                    s.step, tp.mfu_pct, self.peak, self.peak_source
                );
                self.mfu_warned = true;
            }
            log.write(Event {
                step: s.step,
                event: EventKind::MfuAbovePeak,
                value: tp.mfu_pct,
                threshold: 100.0,
                detail: None,
            })?;
        }
        let m = StepMetrics {
            step: s.step,
            loss: s.loss,
            lr: s.lr,
            grad_norm: s.grad_norm,
            tokens_per_second: tp.tokens_per_second,
            world_size: self.world_size,
            batch_size: self.batch_size,
            // Steps end together (the all-reduce): every rank moves as many tokens.
            global_tokens_per_second: tp.tokens_per_second * self.world_size as f64,
            training_tokens_pct: i.training_tokens_pct(),
            mfu_pct: tp.mfu_pct,
            tflops: tp.tflops,
            step_time_s: i.step_time_s(),
            elapsed_s: s.elapsed_s,
            peak_memory_mb: s.peak_memory_mb,
            val_loss: s.val_loss,
            rank_compute_s: s.rank_compute_s,
            joules_per_token: watts
                .filter(|_| tp.tokens_per_second > 0.0)
                .map(|w| w / tp.tokens_per_second),
            watts,
        };
        let global = match self.world_size {
            1 => String::new(),
            _ => format!(" per device, {:.0} global", m.global_tokens_per_second),
        };
        eprintln!(
            "step {}/{} | loss {:.4} | lr {:.2e} | grad norm {:.3} | {:.0} tokens/s{global} | MFU {:.2}% | {:.3} s/step{}{}",
            m.step,
            self.training_steps,
            m.loss,
            m.lr,
            m.grad_norm,
            m.tokens_per_second,
            m.mfu_pct,
            m.step_time_s,
            m.val_loss.map(|v| format!(" | val loss {v:.4}")).unwrap_or_default(),
            m.watts.map(|w| format!(" | {w:.0} W")).unwrap_or_default()
        );
        log.write(m)
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

    /// Each logged step whose MFU is above 100% gets an event (the run goes
    /// on), the others none, and the warning is said once: on recorded step
    /// times, so that the verdict does not depend on the machine's speed.
    #[test]
    fn an_event_for_each_step_above_the_peak_and_one_warning() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = TrainConfig::default();
        // 1e9 FLOP per token against a peak of 1e12 FLOP/s: 1000 tokens/s is 100%.
        let log = MetricsLog::open(dir.path()).unwrap();
        let mut r = Reporter::new(Some(log), &cfg, 1, 1e9, 1e12, "test".into());
        for (step, seconds) in [(1, 2.0), (2, 0.5), (3, 1.0), (4, 0.25)] {
            r.count(1000, 1000, seconds, 0.0);
            r.log(LoggedStep {
                step,
                loss: 1.0,
                lr: 1e-3,
                grad_norm: 1.0,
                elapsed_s: 0.0,
                peak_memory_mb: 0.0,
                val_loss: None,
                rank_compute_s: Vec::new(),
            })
            .unwrap();
            assert_eq!(r.mfu_warned, step >= 2, "warned from the first step above");
        }
        // Read back by the log's own reader, as the report reads it.
        let bytes = std::fs::read(dir.path().join(crate::layout::METRICS_JSONL)).unwrap();
        let parsed = crate::train::run::record::parse_log(&bytes);
        let events: Vec<(usize, f64)> = parsed
            .records
            .iter()
            .filter_map(|(_, r)| match r {
                crate::train::run::record::Record::Event(e)
                    if e.event == EventKind::MfuAbovePeak =>
                {
                    Some((e.step, e.value))
                }
                _ => None,
            })
            .collect();
        // 50% (2 s), 200%, exactly 100% (not above), 400%.
        assert_eq!(events, [(2, 200.0), (4, 400.0)], "{parsed:?}");
        assert_eq!(parsed.steps().count(), 4, "every step logged");
        assert_eq!(parsed.records.len(), 4 + 2, "and nothing else: {parsed:?}");
    }
}
