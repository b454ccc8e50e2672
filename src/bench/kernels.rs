//! `sweep bench kernels`: each of the trainer's own kernels against its
//! reference on random data of a model's shapes — its error, its time, the
//! bandwidth it reaches, and the time of the composed candle ops it replaces
//! (the measurement that justifies a hand-written kernel).
//!
//! On the CPU the reference is the composed twin in f32. On a GPU it is the
//! CPU kernel run on the same inputs (rounded to the GPU's dtype first), so a
//! wrong CUDA kernel shows as an error here before it shows in a loss curve;
//! a case outside its tolerance makes the command fail. Each op declares
//! its cases in its own file ([`crate::train::network::ops::check`]); this module
//! runs, times and tabulates them.

use super::MAX_ELEMENTS;
use crate::config::DeviceKind;
use crate::train::network::ops::check::{
    self, dtype_name, errors, flat_f32, prepare, tolerance, Case, Shapes,
};
use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};
use serde::Serialize;

/// What to measure.
#[derive(Debug, Clone)]
pub struct KernelWork {
    pub device: DeviceKind,
    /// A model preset, for the shapes.
    pub model: String,
    /// Tokens per call (batch × sequence).
    pub tokens: usize,
    pub seq_len: usize,
    /// Timed calls per case (the median counts).
    pub repeats: usize,
    /// The vocabulary (default: the preset's, else 32000).
    pub vocab: Option<usize>,
}

/// One kernel on one shape and dtype.
#[derive(Debug, Clone, Serialize)]
pub struct KernelRow {
    pub op: &'static str,
    pub shape: String,
    pub dtype: &'static str,
    /// Max |kernel − reference| over every output, and that over max |reference|.
    pub max_abs_err: f64,
    pub max_rel_err: f64,
    pub tolerance: f64,
    pub ok: bool,
    pub kernel_ms: f64,
    pub composed_ms: f64,
    /// composed / kernel.
    pub speedup: f64,
    /// The bytes the op must move at least (each operand read once, each
    /// output written once) over the kernel's time.
    pub gb_per_s: f64,
    /// For ops made of matrix products (the attention backward), the useful
    /// floating-point work over the kernel's time, in TFLOP/s.
    pub tflop_per_s: Option<f64>,
}

/// The whole run, as `--json` writes it.
#[derive(Debug, Clone, Serialize)]
pub struct KernelReport {
    /// The device's name (`cpu`, or the GPU's as its driver gives it).
    pub device: String,
    /// Which kind it is: what the kernels are checked against.
    #[serde(skip)]
    pub kind: DeviceKind,
    pub model: String,
    pub tokens: usize,
    pub rows: Vec<KernelRow>,
}

/// Runs every case: on the CPU in f32 against the composed twins; on CUDA in
/// f32 and bf16 against the CPU kernels.
pub fn run(work: &KernelWork, rt: &crate::config::RuntimeOptions) -> Result<KernelReport> {
    let cfg = super::preset_shapes(&work.model, work.vocab)?;
    // The largest inputs, [tokens, FFN width] and [vocabulary, width], are
    // held in f32 on the host: refuse sizes no machine holds (and that the
    // kernels' 32-bit counts could not index) before allocating.
    let widest = cfg.dim.max(cfg.ffn_hidden());
    let largest = [
        work.tokens.checked_mul(widest),
        cfg.vocab_size.checked_mul(cfg.dim),
    ];
    if largest.iter().any(|e| e.is_none_or(|e| e > MAX_ELEMENTS)) {
        bail!(
            "--tokens {} with the {} shapes (width {widest}, vocabulary {}) makes tensors of more than {MAX_ELEMENTS} values",
            work.tokens,
            work.model,
            cfg.vocab_size
        );
    }
    if work.tokens == 0 || work.repeats == 0 {
        bail!("--tokens and --repeats must be at least 1");
    }
    let (device, name) = match work.device {
        DeviceKind::Cpu => (Device::Cpu, "cpu".to_string()),
        DeviceKind::Cuda => {
            let d = crate::train::network::device::cuda(0, rt.cuda_pool)?;
            let name = crate::train::network::device::name(&d)?;
            (d, name)
        }
    };
    let seq = work.seq_len.min(work.tokens).max(1);
    let shapes = Shapes {
        cfg: &cfg,
        batch: work.tokens.div_ceil(seq),
        seq,
        device: &device,
    };
    let mut rows = Vec::new();
    for case in crate::train::network::ops::cases::all(&shapes)? {
        for dtype in check::dtypes(&case, &device) {
            let row = check_and_time(&case, dtype, &device, work.repeats)?;
            // As each is measured: at a GPU's shapes the CPU references take
            // minutes, and a run cut off should leave what it found.
            eprintln!(
                "bench kernels: {} {} {}: {:.2e} relative ({}), {:.3} ms, composed {:.3} ms",
                row.op,
                row.shape,
                row.dtype,
                row.max_rel_err,
                if row.ok { "ok" } else { "WRONG" },
                row.kernel_ms,
                row.composed_ms
            );
            rows.push(row);
        }
    }
    Ok(KernelReport {
        device: name,
        kind: work.device,
        model: work.model.clone(),
        tokens: work.tokens,
        rows,
    })
}

/// One case in one dtype: its error against the reference on the same
/// (rounded) inputs — on the CPU the composed twin, elsewhere the CPU kernel,
/// in f32 — and its time beside the composed ops'.
fn check_and_time(case: &Case, dtype: DType, device: &Device, repeats: usize) -> Result<KernelRow> {
    let reference_inputs: Vec<Tensor> = case
        .inputs
        .iter()
        // Copies: some ops write into their inputs.
        .map(|t| Ok(t.to_dtype(dtype)?.to_dtype(DType::F32)?.copy()?))
        .collect::<Result<_>>()?;
    let want = if device.is_cpu() {
        flat_f32(&case.run_twin(&reference_inputs)?)?
    } else {
        flat_f32(&(case.run)(&reference_inputs)?)?
    };
    let got = flat_f32(&(case.run)(&prepare(case, device, dtype)?)?)?;
    let (max_abs_err, max_rel_err) = errors(&got, &want)?;
    let kernel_s = check::time(case, device, dtype, repeats, false)?;
    let composed_s = check::time(case, device, dtype, repeats, true)?;
    let tol = tolerance(case, dtype);
    Ok(KernelRow {
        op: case.op,
        shape: case.shape.clone(),
        dtype: dtype_name(dtype),
        max_abs_err,
        max_rel_err,
        tolerance: tol,
        ok: max_rel_err <= tol,
        kernel_ms: kernel_s * 1e3,
        composed_ms: composed_s * 1e3,
        speedup: composed_s / kernel_s,
        gb_per_s: (case.elements_moved * dtype.size_in_bytes()) as f64 / kernel_s / 1e9,
        tflop_per_s: (case.flops > 0.0).then(|| case.flops / kernel_s / 1e12),
    })
}

/// The table `sweep bench kernels` prints.
pub fn table(report: &KernelReport) -> String {
    let mut out = format!(
        "sweep's kernels on {} ({} shapes, {} tokens); reference: {}\n",
        report.device,
        report.model,
        report.tokens,
        match report.kind {
            DeviceKind::Cpu => "the composed candle ops",
            DeviceKind::Cuda => "the CPU kernels on the same inputs",
        }
    );
    out += &format!(
        "{:<20} {:<26} {:<5} {:>10} {:>10} {:>4} {:>10} {:>12} {:>8} {:>8} {:>8}\n",
        "op",
        "shape",
        "dtype",
        "max abs",
        "max rel",
        "ok",
        "kernel ms",
        "composed ms",
        "speedup",
        "GB/s",
        "TFLOP/s"
    );
    for r in &report.rows {
        out += &format!(
            "{:<20} {:<26} {:<5} {:>10.2e} {:>10.2e} {:>4} {:>10.3} {:>12.3} {:>7.1}x {:>8.1} {:>8}\n",
            r.op,
            r.shape,
            r.dtype,
            r.max_abs_err,
            r.max_rel_err,
            if r.ok { "yes" } else { "NO" },
            r.kernel_ms,
            r.composed_ms,
            r.speedup,
            r.gb_per_s,
            r.tflop_per_s
                .map_or_else(|| "-".to_string(), |t| format!("{t:.1}"))
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_count_nans_and_scale_by_the_reference() -> Result<()> {
        assert_eq!(errors(&[1.0, 2.5], &[1.0, 2.0])?, (0.5, 0.25));
        assert_eq!(errors(&[f32::NAN], &[1.0])?.0, f64::INFINITY);
        assert!(errors(&[1.0], &[1.0, 2.0]).is_err());
        Ok(())
    }

    #[test]
    fn sizes_no_machine_holds_are_refused_before_allocating() {
        let work = KernelWork {
            device: DeviceKind::Cpu,
            model: "small".into(),
            tokens: usize::MAX / 2,
            seq_len: 2048,
            repeats: 1,
            vocab: None,
        };
        let err = run(&work, &Default::default()).unwrap_err().to_string();
        assert!(err.contains("more than"), "{err}");
        let huge_vocab = KernelWork {
            tokens: 8,
            vocab: Some(usize::MAX / 4),
            ..work
        };
        assert!(run(&huge_vocab, &Default::default()).is_err());
    }

    #[test]
    fn every_cpu_kernel_matches_its_composed_twin() -> Result<()> {
        let work = KernelWork {
            device: DeviceKind::Cpu,
            model: "tiny".into(),
            tokens: 64,
            seq_len: 32,
            repeats: 1,
            vocab: Some(300),
        };
        let report = run(&work, &Default::default())?;
        assert_eq!(report.rows.len(), 24);
        for r in &report.rows {
            assert!(r.ok, "{} {}: {:e}", r.op, r.shape, r.max_rel_err);
            assert!(r.kernel_ms > 0.0 && r.composed_ms > 0.0, "{}", r.op);
        }
        Ok(())
    }
}
