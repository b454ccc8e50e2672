//! `sweep bench kernels`: each of the trainer's own kernels against its
//! reference on random data of a model's shapes — its error, its time, the
//! bandwidth it reaches, and the time of the composed candle ops it replaces
//! (the measurement that justifies a hand-written kernel).
//!
//! On the CPU the reference is the composed twin in f32. On a GPU it is the
//! CPU kernel run on the same inputs (rounded to the GPU's dtype first), so a
//! wrong CUDA kernel shows as an error here before it shows in a loss curve;
//! a case outside its tolerance makes the command fail.

use crate::config::{DeviceKind, ModelConfig, ModelOverrides};
use crate::data::samples::IGNORE;
use crate::train::ops::{
    accumulate, composed_here, cross_entropy, rms_norm, rope, silu_mul, softmax,
};
use crate::train::{attention, optim};
use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};
use serde::Serialize;
use std::time::Instant;

/// What to measure.
#[derive(Debug, Clone)]
pub struct Work {
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

/// The most values one input may hold (8 GiB of f32).
const MAX_ELEMENTS: usize = 1 << 31;

/// The vocabulary of presets that take theirs from the tokenizer.
const DEFAULT_VOCAB: usize = 32_000;

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

/// Relative error allowed: f32 arithmetic either way; bf16 storage rounds
/// each output once (2^-8 relative) and the reference does not. Ops that
/// chain several bf16 products (`chained`: the attention backward rounds
/// its scores, probabilities and their gradients to bf16 between its five
/// products, as flash attention's backward does) get twice that.
fn tolerance(dtype: DType, chained: bool) -> f64 {
    match (dtype, chained) {
        (DType::BF16, false) => 1.6e-2,
        (DType::BF16, true) => 3.2e-2,
        _ => 1e-4,
    }
}

fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::BF16 => "bf16",
        DType::F64 => "f64",
        _ => "f32",
    }
}

/// Deterministic values in [-scale, scale), f32, on the CPU.
fn random(shape: &[usize], seed: u64, scale: f32) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let v: Vec<f32> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect();
    Ok(Tensor::from_vec(v, shape, &Device::Cpu)?)
}

/// Runs an op on its inputs.
type Run = Box<dyn Fn(&[Tensor]) -> Result<Vec<Tensor>>>;

/// An op under test: inputs prepared once, run by the kernel or the
/// composed twin, its outputs flattened to f32 on the CPU for comparing.
struct Case {
    op: &'static str,
    shape: String,
    /// Elements the op must move at least (times the dtype's size: bytes).
    elements_moved: usize,
    /// Floating-point operations of its matrix products (0: none).
    flops: f64,
    /// Whether its bf16 path chains rounded products ([`tolerance`]).
    chained: bool,
    /// The inputs on the CPU in f32 (already rounded to the dtype).
    inputs: Vec<Tensor>,
    run: Run,
}

fn cases(cfg: &ModelConfig, tokens: usize, seq: usize, device: &Device) -> Result<Vec<Case>> {
    let (d, f, v) = (cfg.dim, cfg.ffn_hidden(), cfg.vocab_size);
    let (h, kv, q) = (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim());
    let seq = seq.min(tokens).max(1);
    let batch = tokens.div_ceil(seq);
    let n = batch * seq;
    let eps = cfg.norm_eps;
    // The head works on slices of rows (blockwise.rs): one slice's worth.
    let head_rows = ((1usize << 26) / v).clamp(1, n);
    let labels: Vec<i64> = (0..head_rows)
        .map(|i| {
            if i % 7 == 3 {
                IGNORE
            } else {
                ((i * 7919) % v) as i64
            }
        })
        .collect();
    let ids: Vec<u32> = (0..n).map(|i| ((i * 104_729) % v) as u32).collect();
    let distinct = {
        let mut s = ids.clone();
        s.sort_unstable();
        s.dedup();
        s.len()
    };
    // The tables on the CPU (the reference) and on the device measured.
    let tables = |on: &Device| rope::RopeTables::new(cfg.rope_theta, q, seq, on, DType::F32);
    let (cpu_tables, device_tables) = (tables(&Device::Cpu)?, tables(device)?);
    let rope_tables = move |x: &Tensor| -> rope::RopeTables {
        if x.device().is_cpu() {
            cpu_tables.clone()
        } else {
            device_tables.clone()
        }
    };
    let rope_back = rope_tables.clone();
    // Attention's softmax on the last tile of queries of the backward (the
    // one that sees every key).
    let tile = attention::tile_rows(batch, h, seq, DType::BF16).min(seq);
    let last_tile = seq - tile;
    let scores = batch * h * tile * seq;
    let scale = 1.0 / (q as f64).sqrt();
    let labels_loss = labels.clone();
    let ids_rows = ids.clone();
    Ok(vec![
        Case {
            op: "rms_norm forward",
            shape: format!("[{n}, {d}]"),
            flops: 0.0,
            chained: false,
            elements_moved: 2 * n * d + d,
            inputs: vec![random(&[n, d], 1, 2.0)?, (random(&[d], 2, 0.5)? + 1.0)?],
            run: Box::new(move |t| Ok(vec![rms_norm::rms_norm(&t[0], &t[1], eps)?])),
        },
        Case {
            op: "rms_norm backward",
            shape: format!("[{n}, {d}]"),
            flops: 0.0,
            chained: false,
            elements_moved: 3 * n * d + 2 * d,
            inputs: vec![
                random(&[n, d], 3, 2.0)?,
                (random(&[d], 4, 0.5)? + 1.0)?,
                random(&[n, d], 5, 1.0)?,
            ],
            run: Box::new(move |t| {
                let (dx, dw) = rms_norm::backward(&t[0], &t[1], eps, &t[2])?;
                Ok(vec![dx, dw])
            }),
        },
        Case {
            op: "swiglu forward",
            shape: format!("[{n}, {f}]"),
            flops: 0.0,
            chained: false,
            elements_moved: 3 * n * f,
            inputs: vec![random(&[n, f], 6, 4.0)?, random(&[n, f], 7, 1.0)?],
            run: Box::new(|t| Ok(vec![silu_mul::silu_mul(&t[0], &t[1])?])),
        },
        Case {
            op: "swiglu backward",
            shape: format!("[{n}, {f}]"),
            flops: 0.0,
            chained: false,
            elements_moved: 5 * n * f,
            inputs: vec![
                random(&[n, f], 8, 4.0)?,
                random(&[n, f], 9, 1.0)?,
                random(&[n, f], 10, 1.0)?,
            ],
            run: Box::new(|t| {
                let (da, db) = silu_mul::backward(&t[0], &t[1], &t[2])?;
                Ok(vec![da, db])
            }),
        },
        Case {
            op: "rope forward",
            shape: format!("[{batch}, {seq}, {h}, {q}]"),
            flops: 0.0,
            chained: false,
            elements_moved: 2 * n * h * q,
            inputs: vec![random(&[batch, seq, h, q], 11, 1.0)?],
            run: Box::new(move |t| {
                let r = rope_tables(&t[0]);
                Ok(vec![rope::heads_first(&t[0], Some(&r))?])
            }),
        },
        Case {
            op: "rope backward",
            shape: format!("[{batch}, {h}, {seq}, {q}]"),
            flops: 0.0,
            chained: false,
            elements_moved: 2 * n * h * q,
            inputs: vec![random(&[batch, h, seq, q], 12, 1.0)?],
            run: Box::new(move |t| {
                let r = rope_back(&t[0]);
                Ok(vec![rope::backward(&t[0], Some(&r))?])
            }),
        },
        Case {
            op: "loss and d logits",
            shape: format!("[{head_rows}, {v}]"),
            flops: 0.0,
            chained: false,
            elements_moved: 2 * head_rows * v,
            inputs: vec![random(&[head_rows, v], 13, 8.0)?],
            run: Box::new(move |t| {
                // The op consumes its logits: a copy, made before the clock
                // starts (`prepare`).
                let (loss, d) = cross_entropy::loss_and_grad(t[0].clone(), &labels_loss, 1e3)?;
                Ok(vec![loss.reshape(1)?, d])
            }),
        },
        Case {
            op: "embedding backward",
            shape: format!("[{n}, {d}] into [{v}, {d}]"),
            flops: 0.0,
            chained: false,
            elements_moved: n * d + 2 * distinct * d,
            inputs: vec![random(&[v, d], 14, 0.1)?, random(&[n, d], 15, 1.0)?],
            run: Box::new(move |t| {
                let ids = Tensor::new(ids_rows.as_slice(), t[1].device())?;
                let mut buf = t[0].clone();
                accumulate::add_rows(&mut buf, &ids, &t[1])?;
                Ok(vec![buf])
            }),
        },
        Case {
            op: "softmax forward",
            shape: format!("[{batch}, {h}, {tile}, {seq}]"),
            flops: 0.0,
            chained: false,
            elements_moved: 2 * scores,
            inputs: vec![random(&[batch, h, tile, seq], 16, 8.0)?],
            run: Box::new(move |t| {
                Ok(vec![softmax::softmax(&t[0], scale, tile, last_tile, true)?])
            }),
        },
        Case {
            op: "softmax backward",
            shape: format!("[{batch}, {h}, {tile}, {seq}]"),
            flops: 0.0,
            chained: false,
            elements_moved: 3 * scores,
            // Probabilities (rows of a causal softmax) and their gradient.
            inputs: vec![
                softmax::softmax(
                    &random(&[batch, h, tile, seq], 17, 8.0)?,
                    scale,
                    tile,
                    last_tile,
                    true,
                )?,
                random(&[batch, h, tile, seq], 18, 1.0)?,
            ],
            run: Box::new(move |t| Ok(vec![softmax::backward(&t[0], &t[1], scale)?])),
        },
        Case {
            op: "attention backward",
            shape: format!("[{batch}, {h}/{kv}, {seq}, {q}]"),
            // Five products over the causal half of the scores.
            flops: 5.0 * 2.0 * (batch * h * q) as f64 * (seq * (seq + 1) / 2) as f64,
            chained: true,
            elements_moved: (3 * h + 4 * kv) * n * q,
            inputs: vec![
                random(&[batch, h, seq, q], 19, 1.0)?,
                random(&[batch, kv, seq, q], 20, 1.0)?,
                random(&[batch, kv, seq, q], 21, 1.0)?,
                random(&[batch, h, seq, q], 22, 1.0)?,
            ],
            run: Box::new(move |t| {
                let (dq, dk, dv) =
                    attention::tiled_backward(&t[0], &t[1], &t[2], &t[3], true, None)?;
                Ok(vec![dq, dk, dv])
            }),
        },
        Case {
            op: "weight gradient",
            shape: format!("[{d}, {f}] over {n} rows"),
            // A linear layer's dW += dyᵀ·x with beta = 1 (w2's shapes).
            flops: 2.0 * (n * d * f) as f64,
            chained: false,
            elements_moved: 2 * d * f + n * (d + f),
            inputs: vec![
                random(&[d, f], 26, 0.1)?,
                random(&[n, d], 27, 1.0)?,
                random(&[n, f], 28, 1.0)?,
            ],
            run: Box::new(|t| {
                let mut buf = t[0].clone();
                accumulate::add_product(&mut buf, &t[1], &t[2], false)?;
                Ok(vec![buf])
            }),
        },
        Case {
            op: "grad norm and clip",
            shape: format!("[{v}, {d}] + [{f}, {d}] + [{d}]"),
            flops: 0.0,
            chained: false,
            elements_moved: v * d + f * d + d,
            // Gradients of an embedding, a projection and a norm weight.
            inputs: vec![
                random(&[v, d], 23, 0.01)?,
                random(&[f, d], 24, 0.1)?,
                random(&[d], 25, 1.0)?,
            ],
            run: Box::new(|t| {
                let clipping = optim::clipping(&t.iter().collect::<Vec<_>>(), 1.0)?;
                Ok(vec![clipping.as_tensor(t[0].device())?])
            }),
        },
    ])
}

/// The inputs of a case on the device in the dtype; ops that write into
/// their inputs (the loss, the embedding's buffer) get fresh copies.
fn prepare(case: &Case, device: &Device, dtype: DType) -> Result<Vec<Tensor>> {
    case.inputs
        .iter()
        .map(|t| Ok(t.to_dtype(dtype)?.to_device(device)?.copy()?))
        .collect()
}

fn flat_f32(outputs: &[Tensor]) -> Result<Vec<f32>> {
    let mut all = Vec::new();
    for t in outputs {
        all.extend(
            t.to_device(&Device::Cpu)?
                .to_dtype(DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()?,
        );
    }
    Ok(all)
}

/// (max abs error, max abs error / max |reference|).
fn errors(got: &[f32], want: &[f32]) -> Result<(f64, f64)> {
    if got.len() != want.len() {
        bail!(
            "{} outputs against {} in the reference",
            got.len(),
            want.len()
        );
    }
    let (mut abs, mut scale) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        let e = (g as f64 - w as f64).abs();
        // A NaN anywhere is an infinite error, not one that max() skips.
        abs = if e.is_nan() {
            f64::INFINITY
        } else {
            abs.max(e)
        };
        scale = scale.max((w as f64).abs());
    }
    Ok((abs, abs / scale.max(f64::MIN_POSITIVE)))
}

/// The median time of `repeats` calls, after one warm-up, each on fresh
/// inputs, waiting for the device after each.
fn time(case: &Case, device: &Device, dtype: DType, repeats: usize, composed: bool) -> Result<f64> {
    let mut times = Vec::with_capacity(repeats);
    for i in 0..=repeats {
        let inputs = prepare(case, device, dtype)?;
        device.synchronize()?;
        let start = Instant::now();
        let out = if composed {
            composed_here(|| (case.run)(&inputs))?
        } else {
            (case.run)(&inputs)?
        };
        device.synchronize()?;
        let elapsed = start.elapsed().as_secs_f64();
        drop(out);
        if i > 0 {
            times.push(elapsed);
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Runs every case: on the CPU in f32 against the composed twins; on CUDA in
/// f32 and bf16 against the CPU kernels.
pub fn run(work: &Work) -> Result<KernelReport> {
    let mut cfg = ModelConfig::resolve(&work.model, &ModelOverrides::default())?;
    if let Some(v) = work.vocab {
        cfg.vocab_size = v;
    } else if cfg.vocab_size == 0 {
        cfg.vocab_size = DEFAULT_VOCAB;
    }
    if cfg.vocab_size == 0 {
        bail!("--vocab must be at least 1");
    }
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
    let (device, name, dtypes) = match work.device {
        DeviceKind::Cpu => (Device::Cpu, "cpu".to_string(), vec![DType::F32]),
        DeviceKind::Cuda => {
            let d =
                crate::train::device::cuda(0, crate::config::RuntimeOptions::current().cuda_pool)?;
            let name = crate::train::device::name(&d)?;
            (d, name, vec![DType::BF16, DType::F32])
        }
    };
    let mut rows = Vec::new();
    for case in cases(&cfg, work.tokens, work.seq_len, &device)? {
        for &dtype in &dtypes {
            // The reference: on the CPU the composed twin, elsewhere the CPU
            // kernel, on the same (rounded) inputs in f32.
            let reference_inputs: Vec<Tensor> = case
                .inputs
                .iter()
                // Copies: some ops write into their inputs.
                .map(|t| Ok(t.to_dtype(dtype)?.to_dtype(DType::F32)?.copy()?))
                .collect::<Result<_>>()?;
            let want = if device.is_cpu() {
                flat_f32(&composed_here(|| (case.run)(&reference_inputs))?)?
            } else {
                flat_f32(&(case.run)(&reference_inputs)?)?
            };
            let got = flat_f32(&(case.run)(&prepare(&case, &device, dtype)?)?)?;
            let (max_abs_err, max_rel_err) = errors(&got, &want)?;
            let kernel_s = time(&case, &device, dtype, work.repeats, false)?;
            let composed_s = time(&case, &device, dtype, work.repeats, true)?;
            let tol = tolerance(dtype, case.chained);
            rows.push(KernelRow {
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
            });
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
        let work = Work {
            device: DeviceKind::Cpu,
            model: "small".into(),
            tokens: usize::MAX / 2,
            seq_len: 2048,
            repeats: 1,
            vocab: None,
        };
        let err = run(&work).unwrap_err().to_string();
        assert!(err.contains("more than"), "{err}");
        let huge_vocab = Work {
            tokens: 8,
            vocab: Some(usize::MAX / 4),
            ..work
        };
        assert!(run(&huge_vocab).is_err());
    }

    #[test]
    fn every_cpu_kernel_matches_its_composed_twin() -> Result<()> {
        let work = Work {
            device: DeviceKind::Cpu,
            model: "tiny".into(),
            tokens: 64,
            seq_len: 32,
            repeats: 1,
            vocab: Some(300),
        };
        let report = run(&work)?;
        assert_eq!(report.rows.len(), 13);
        for r in &report.rows {
            assert!(r.ok, "{} {}: {:e}", r.op, r.shape, r.max_rel_err);
            assert!(r.kernel_ms > 0.0 && r.composed_ms > 0.0, "{}", r.op);
        }
        Ok(())
    }
}
