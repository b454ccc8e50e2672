//! The power a GPU draws, for joules per token: NVML's total-energy counter
//! of the main rank's GPU, read at each log line; the interval's average
//! watts are the energy between two readings over the time between them,
//! and joules per token those watts over the interval's tokens per second.
//! NVML is loaded at run time (`libnvidia-ml.so.1`, with the driver), so
//! a machine without it, a GPU without the counter (before Volta) and a CPU
//! run have no meter: their figures are absent, never zero.

/// A cumulative energy counter in joules, and a clock in seconds.
pub struct Meter {
    joules: Box<dyn FnMut() -> Option<f64>>,
    seconds: Box<dyn FnMut() -> f64>,
    last: Option<(f64, f64)>,
}

impl Meter {
    pub fn new(
        joules: impl FnMut() -> Option<f64> + 'static,
        seconds: impl FnMut() -> f64 + 'static,
    ) -> Meter {
        let mut m = Meter {
            joules: Box::new(joules),
            seconds: Box::new(seconds),
            last: None,
        };
        m.last = m.read();
        m
    }

    fn read(&mut self) -> Option<(f64, f64)> {
        let j = (self.joules)().filter(|j| j.is_finite())?;
        Some(((self.seconds)(), j))
    }

    /// Average watts since the last reading (or since the meter opened);
    /// none where either reading failed, or the counter went back (a
    /// driver reloaded) or the clock did not move.
    pub fn watts(&mut self) -> Option<f64> {
        let now = self.read();
        let before = std::mem::replace(&mut self.last, now);
        let ((t0, j0), (t1, j1)) = (before?, now?);
        (t1 > t0 && j1 >= j0).then(|| (j1 - j0) / (t1 - t0))
    }
}

/// The meter of a device: NVML's counter of a CUDA device (found by its
/// UUID), none elsewhere or where NVML or the counter is missing (said
/// once on stderr).
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
pub fn open(device: &candle_core::Device) -> Option<Meter> {
    #[cfg(feature = "cuda")]
    if let candle_core::Device::Cuda(d) = device {
        return match nvml_counter(d) {
            Ok(counter) => {
                let start = std::time::Instant::now();
                Some(Meter::new(counter, move || start.elapsed().as_secs_f64()))
            }
            Err(why) => {
                eprintln!("sweep train: note: no energy figures: {why}");
                None
            }
        };
    }
    None
}

/// NVML's total energy of `d`, in joules (it counts millijoules).
#[cfg(feature = "cuda")]
fn nvml_counter(d: &candle_core::CudaDevice) -> Result<impl FnMut() -> Option<f64>, String> {
    let uuid = d
        .cuda_stream()
        .context()
        .uuid()
        .map_err(|e| format!("the device's UUID: {e:?}"))?;
    let b: Vec<u8> = uuid.bytes.iter().map(|&x| x as u8).collect();
    let hex =
        |r: std::ops::Range<usize>| -> String { b[r].iter().map(|x| format!("{x:02x}")).collect() };
    let name = format!(
        "GPU-{}-{}-{}-{}-{}",
        hex(0..4),
        hex(4..6),
        hex(6..8),
        hex(8..10),
        hex(10..16)
    );
    let nvml = nvml_wrapper::Nvml::init().map_err(|e| format!("NVML did not load ({e})"))?;
    // The device borrows the library: both live in the closure, the library
    // leaked once (a process opens one device).
    let nvml: &'static nvml_wrapper::Nvml = Box::leak(Box::new(nvml));
    let device = nvml
        .device_by_uuid(name.as_str())
        .map_err(|e| format!("NVML does not know {name} ({e})"))?;
    device
        .total_energy_consumption()
        .map_err(|e| format!("{name} has no energy counter ({e})"))?;
    Ok(move || {
        device
            .total_energy_consumption()
            .ok()
            .map(|mj| mj as f64 / 1e3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    /// Watts between readings, from a planted counter and clock; a failed
    /// reading, a counter that went back and a clock that stood still give
    /// none, and the next interval is measured again.
    #[test]
    fn watts_are_the_energy_between_readings_over_their_time() {
        let j = Rc::new(Cell::new(Some(1000.0)));
        let t = Rc::new(Cell::new(10.0));
        let (jr, tr) = (j.clone(), t.clone());
        let mut m = Meter::new(move || jr.get(), move || tr.get());
        let mut at = |joules: Option<f64>, seconds: f64| {
            j.set(joules);
            t.set(seconds);
            m.watts()
        };
        assert_eq!(at(Some(1700.0), 12.0), Some(350.0));
        assert_eq!(at(None, 13.0), None);
        assert_eq!(at(Some(2000.0), 14.0), None, "after a failed reading");
        assert_eq!(at(Some(2700.0), 16.0), Some(350.0));
        assert_eq!(at(Some(5.0), 17.0), None, "the counter went back");
        assert_eq!(at(Some(5.0), 17.0), None, "no time passed");
        assert_eq!(at(Some(f64::NAN), 18.0), None);
        assert_eq!(at(Some(105.0), 20.0), None, "after a NaN reading");
        assert_eq!(at(Some(205.0), 21.0), Some(100.0));
    }

    /// A reporter with a meter logs each interval's watts and those over
    /// its tokens per second; without one, neither (absent, not zero).
    #[test]
    fn a_log_line_carries_the_intervals_energy() {
        use crate::train::run::metrics::{LoggedStep, Reporter};
        use crate::train::run::record::{parse_log, MetricsLog, Record, METRICS_FILE};
        let steps = |meter: Option<Meter>| {
            let dir = tempfile::tempdir().unwrap();
            let log = MetricsLog::open(dir.path()).unwrap();
            let cfg = crate::config::TrainConfig::default();
            let mut r =
                Reporter::new(Some(log), &cfg, 1, 1.0, 1.0, String::new()).with_meter(meter);
            r.count(1000, 1000, 2.0, 0.0);
            r.log(LoggedStep {
                step: 1,
                loss: 1.0,
                lr: 0.1,
                grad_norm: 1.0,
                elapsed_s: 2.0,
                peak_memory_mb: 0.0,
                val_loss: None,
                rank_compute_s: Vec::new(),
            })
            .unwrap();
            drop(r);
            let bytes = std::fs::read(dir.path().join(METRICS_FILE)).unwrap();
            let text = String::from_utf8(bytes.clone()).unwrap();
            let steps: Vec<_> = parse_log(&bytes)
                .records
                .into_iter()
                .filter_map(|(_, r)| match r {
                    Record::Step(m) => Some(m),
                    _ => None,
                })
                .collect();
            (steps, text)
        };
        let joules = Rc::new(Cell::new(100.0));
        let clock = Rc::new(Cell::new(0.0));
        let (j, c) = (joules.clone(), clock.clone());
        let meter = Meter::new(move || Some(j.get()), move || c.get());
        joules.set(1100.0);
        clock.set(2.0);
        let (measured, _) = steps(Some(meter));
        assert_eq!(measured[0].watts, Some(500.0));
        // 500 W at 500 tokens/s.
        assert_eq!(measured[0].joules_per_token, Some(1.0));
        let (unmeasured, text) = steps(None);
        assert_eq!(
            (unmeasured[0].watts, unmeasured[0].joules_per_token),
            (None, None)
        );
        assert!(
            !text.contains("watts") && !text.contains("joules"),
            "{text}"
        );
    }

    /// The CPU has no meter.
    #[test]
    fn a_cpu_has_no_meter() {
        assert!(open(&candle_core::Device::Cpu).is_none());
    }
}
