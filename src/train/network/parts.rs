//! Where a step's time goes, op by op (`sweep bench train --parts`).
//!
//! The ops mark themselves ([`op`]) and the step its phases ([`pass`]);
//! while a recording is on ([`start`] to [`finish`]) every change of (pass,
//! op) stamps the time — on a GPU an event on the device's one stream (the
//! device's time between stamps, idle gaps included; also the CUDA
//! profiler's range, for `ncu --profile-from-start off`), on the CPU the
//! clock — so the parts add up to the step, and what runs outside every op
//! is `other`. Off, a mark is one read of a thread-local: a thread-local,
//! so the passes keep the model's signatures (a step runs on one thread).

use candle_core::{Device, Result};
use std::cell::RefCell;
use std::collections::BTreeMap;

/// The phase of the step, as the trainer splits it (the head's forward
/// falls in the backward phase: it runs slice by slice with its backward).
/// Written by its [`Pass::name`].
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, strum::IntoStaticStr,
)]
#[serde(into = "&'static str")]
#[strum(serialize_all = "lowercase")]
pub enum Pass {
    Forward,
    Backward,
    Optimizer,
}

/// What the time went to. Written by its [`Op::name`].
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, strum::IntoStaticStr,
)]
#[serde(into = "&'static str")]
#[strum(serialize_all = "lowercase")]
pub enum Op {
    /// Matrix products of the linear layers and the head, their gradients.
    Linear,
    /// Attention itself (scores, softmax, values), forward or backward.
    Attention,
    Norm,
    Rope,
    SwiGlu,
    /// The cross-entropy and its gradient.
    Loss,
    Embedding,
    /// The gradients' global norm and clip scale.
    Clip,
    AdamW,
    /// Everything outside the ops above.
    Other,
}

impl Pass {
    pub fn name(self) -> &'static str {
        self.into()
    }
}

impl Op {
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// One part's time in a recorded step.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PartTime {
    pub pass: Pass,
    pub op: Op,
    pub seconds: f64,
}

type Part = (Pass, Op);

enum Stamp {
    Clock(std::time::Instant),
    #[cfg(feature = "cuda")]
    Event(candle_core::cuda::cudarc::driver::CudaEvent),
}

struct Recording {
    device: Device,
    pass: Pass,
    ops: Vec<Op>,
    stamps: Vec<(Part, Stamp)>,
    /// The first stamp that failed: reported by [`finish`] (a guard's drop
    /// cannot return it).
    error: Option<candle_core::Error>,
}

thread_local! {
    static RECORDING: RefCell<Option<Recording>> = const { RefCell::new(None) };
}

impl Recording {
    fn part(&self) -> Part {
        (self.pass, self.ops.last().copied().unwrap_or(Op::Other))
    }

    fn now(&self) -> Result<Stamp> {
        match &self.device {
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => {
                use candle_core::cuda::cudarc::driver::sys::CUevent_flags;
                let event = d
                    .cuda_stream()
                    .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(|e| candle_core::Error::Msg(format!("parts: an event: {e}")))?;
                Ok(Stamp::Event(event))
            }
            _ => Ok(Stamp::Clock(std::time::Instant::now())),
        }
    }

    fn stamp(&mut self) {
        if self.error.is_some() {
            return;
        }
        match self.now() {
            Ok(s) => {
                let part = self.part();
                self.stamps.push((part, s));
            }
            Err(e) => self.error = Some(e),
        }
    }

    /// `change`, and a stamp if the part changed.
    fn change(&mut self, change: impl FnOnce(&mut Recording)) {
        let before = self.part();
        change(self);
        if self.part() != before {
            self.stamp();
        }
    }
}

fn with(f: impl FnOnce(&mut Recording)) -> bool {
    RECORDING.with(|r| r.borrow_mut().as_mut().map(f).is_some())
}

/// Held while an op queues its work; dropping it returns to the op around.
#[must_use = "the op lasts while its guard lives"]
pub struct OpGuard {
    active: bool,
}

impl Drop for OpGuard {
    fn drop(&mut self) {
        if self.active {
            with(|r| {
                r.change(|r| {
                    r.ops.pop();
                })
            });
        }
    }
}

/// Marks the work queued until the guard drops as `op`'s (the innermost op
/// counts where ops nest).
pub fn op(op: Op) -> OpGuard {
    OpGuard {
        active: with(|r| r.change(|r| r.ops.push(op))),
    }
}

/// Marks the work queued from here on as `pass`'s.
pub fn pass(pass: Pass) {
    with(|r| r.change(|r| r.pass = pass));
}

/// Starts recording on this thread, on `device`'s clock: the work queued
/// after this call, until [`finish`].
pub fn start(device: &Device) -> Result<()> {
    if RECORDING.with(|r| r.borrow().is_some()) {
        candle_core::bail!("parts: a recording is already on");
    }
    let mut recording = Recording {
        device: device.clone(),
        pass: Pass::Forward,
        ops: Vec::new(),
        stamps: Vec::new(),
        error: None,
    };
    profiler(device, true)?;
    recording.stamp();
    if let Some(e) = recording.error.take() {
        return Err(e);
    }
    RECORDING.with(|r| *r.borrow_mut() = Some(recording));
    Ok(())
}

/// Ends the recording (waiting for the device): each part's time, in the
/// order of [`Pass`] and [`Op`], the parts that took no time left out.
pub fn finish() -> Result<Vec<PartTime>> {
    let Some(mut r) = RECORDING.with(|r| r.borrow_mut().take()) else {
        candle_core::bail!("parts: no recording is on");
    };
    r.ops.clear();
    r.stamp();
    profiler(&r.device, false)?;
    if let Some(e) = r.error {
        return Err(e);
    }
    let mut total: BTreeMap<Part, f64> = BTreeMap::new();
    for pair in r.stamps.windows(2) {
        let ((part, from), (_, to)) = (&pair[0], &pair[1]);
        let seconds = match (from, to) {
            (Stamp::Clock(a), Stamp::Clock(b)) => b.duration_since(*a).as_secs_f64(),
            #[cfg(feature = "cuda")]
            (Stamp::Event(a), Stamp::Event(b)) => {
                let ms = a
                    .elapsed_ms(b)
                    .map_err(|e| candle_core::Error::Msg(format!("parts: elapsed time: {e}")))?;
                f64::from(ms) / 1e3
            }
            #[cfg(feature = "cuda")]
            _ => candle_core::bail!("parts: stamps of two clocks"),
        };
        *total.entry(*part).or_default() += seconds;
    }
    Ok(total
        .into_iter()
        .filter(|&(_, s)| s > 0.0)
        .map(|((pass, op), seconds)| PartTime { pass, op, seconds })
        .collect())
}

/// Starts or stops the CUDA profiler's range on a GPU (without a profiler
/// attached, nothing happens).
fn profiler(device: &Device, on: bool) -> Result<()> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = device {
        use candle_core::cuda::cudarc::driver::{profiler_start, profiler_stop};
        d.cuda_stream()
            .context()
            .bind_to_thread()
            .and_then(|()| {
                if on {
                    profiler_start()
                } else {
                    profiler_stop()
                }
            })
            .map_err(|e| candle_core::Error::Msg(format!("parts: the profiler's range: {e}")))?;
    }
    let _ = (device, on); // (used in CUDA builds)
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_ops_and_passes_split_the_time_between_them() -> Result<()> {
        let spin = |micros: u64| {
            let until = std::time::Instant::now() + std::time::Duration::from_micros(micros);
            while std::time::Instant::now() < until {}
        };
        let outside = std::time::Instant::now();
        start(&Device::Cpu)?;
        {
            let _l = op(Op::Linear);
            spin(200);
            {
                let _a = op(Op::Attention);
                spin(200);
                // The same op again within itself: no new part.
                let _a2 = op(Op::Attention);
                spin(200);
            }
            spin(200);
        }
        spin(200);
        pass(Pass::Backward);
        {
            let _n = op(Op::Norm);
            spin(200);
        }
        let parts = finish()?;
        let whole = outside.elapsed().as_secs_f64();
        // In the order of passes and ops; the instant between the norm's
        // end and the finish may or may not count as a part of its own.
        let keys: Vec<Part> = parts
            .iter()
            .map(|p| (p.pass, p.op))
            .filter(|&k| k != (Pass::Backward, Op::Other))
            .collect();
        assert_eq!(
            keys,
            [
                (Pass::Forward, Op::Linear),
                (Pass::Forward, Op::Attention),
                (Pass::Forward, Op::Other),
                (Pass::Backward, Op::Norm),
            ]
        );
        // Each spun part is there, with at least its spin; together they
        // are the recording, which lies inside the time around it.
        for (key, at_least) in [
            ((Pass::Forward, Op::Linear), 400e-6),
            ((Pass::Forward, Op::Attention), 400e-6),
            ((Pass::Forward, Op::Other), 200e-6),
            ((Pass::Backward, Op::Norm), 200e-6),
        ] {
            let p = parts.iter().find(|p| (p.pass, p.op) == key);
            assert!(
                p.is_some_and(|p| p.seconds >= at_least),
                "{key:?}: {parts:?}"
            );
        }
        let sum: f64 = parts.iter().map(|p| p.seconds).sum();
        assert!(sum >= 1.2e-3 && sum <= whole, "{sum} of {whole}");
        Ok(())
    }

    #[test]
    fn parts_are_written_by_their_names() {
        let part = PartTime {
            pass: Pass::Optimizer,
            op: Op::AdamW,
            seconds: 0.5,
        };
        assert_eq!(
            serde_json::to_value(&part).unwrap(),
            serde_json::json!({"pass": "optimizer", "op": "adamw", "seconds": 0.5})
        );
        assert_eq!(serde_json::to_value(Op::SwiGlu).unwrap(), "swiglu");
    }

    #[test]
    fn marks_without_a_recording_change_nothing_and_finish_says_so() {
        let _g = op(Op::Linear);
        pass(Pass::Optimizer);
        assert!(finish().is_err());
        assert!(start(&Device::Cpu).is_ok());
        assert!(start(&Device::Cpu).is_err(), "one recording at a time");
        assert!(finish().is_ok());
    }
}
