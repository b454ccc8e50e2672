//! The cases `sweep bench kernels` checks and times and the device-open self-check runs
//! ([`super::selfcheck`]), each op's in its own file under [`super::cases`], on random data of a
//! model's shapes; and the one rule comparing a kernel with its reference ([`errors`], [`tolerance`]).

use super::Kernel;
use crate::config::ModelConfig;
use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};

/// The shapes the cases are made for: a model's, at a number of tokens.
pub struct Shapes<'a> {
    pub cfg: &'a ModelConfig,
    /// Sequences per call and their length (`batch · seq` tokens).
    pub batch: usize,
    pub seq: usize,
    /// The device measured (some ops keep tables on it as well as on the CPU).
    pub device: &'a Device,
}

impl Shapes<'_> {
    /// Tokens per call.
    pub fn tokens(&self) -> usize {
        self.batch * self.seq
    }
}

/// Runs an op on its inputs.
pub type OpFn = Box<dyn Fn(&[Tensor]) -> Result<Vec<Tensor>>>;

/// An op under test: inputs made once, run by the kernel or its twin, outputs compared in f32.
pub struct Case {
    /// The kernel it checks (what falls back when it fails).
    pub kernel: Kernel,
    pub op: &'static str,
    pub shape: String,
    /// Elements the op must move at least (times the dtype's size: bytes).
    pub elements_moved: usize,
    /// Floating-point operations of its matrix products (0: none).
    pub flops: f64,
    /// Whether its bf16 path chains rounded products (a wider tolerance).
    pub chained: bool,
    /// Whether it rounds operands to bf16 whatever their dtype (bf16-mixed): bf16's tolerance.
    pub mixed: bool,
    /// Whether it runs in f32 on a GPU too (candle-flash-attn is bf16 only).
    pub gpu_f32: bool,
    /// The inputs on the CPU in f32 (rounded to the measured dtype later).
    pub inputs: Vec<Tensor>,
    pub run: OpFn,
    /// The path the kernel replaces, where not the op fully composed: its check and timing twin.
    pub twin: Option<OpFn>,
}

impl Case {
    /// A case of an op without matrix products and with one rounding.
    pub fn new(
        kernel: Kernel,
        op: &'static str,
        shape: String,
        elements_moved: usize,
        inputs: Vec<Tensor>,
        run: OpFn,
    ) -> Case {
        Case {
            kernel,
            op,
            shape,
            elements_moved,
            flops: 0.0,
            chained: false,
            mixed: false,
            gpu_f32: true,
            inputs,
            run,
            twin: None,
        }
    }

    /// Runs its twin: `twin`, else the op with every kernel composed.
    pub fn run_twin(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        match &self.twin {
            Some(twin) => twin(inputs),
            None => super::composed_here(|| (self.run)(inputs)),
        }
    }
}

/// The dtypes a case runs in: f32 on the CPU; bf16 on a GPU, and f32 where the kernel has it.
pub fn dtypes(case: &Case, device: &Device) -> Vec<DType> {
    match (device.is_cpu(), case.gpu_f32) {
        (true, _) => vec![DType::F32],
        (false, true) => vec![DType::BF16, DType::F32],
        (false, false) => vec![DType::BF16],
    }
}

/// The dtype a case is timed in for a run computing in `run`: that one, or the one it runs in
/// there (flash's backward takes bf16 on a GPU).
pub fn timed_dtype(case: &Case, device: &Device, run: DType) -> DType {
    let dtypes = dtypes(case, device);
    if dtypes.contains(&run) {
        run
    } else {
        dtypes[0]
    }
}

/// A dtype's name in tables and messages.
pub fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::BF16 => "bf16",
        DType::F64 => "f64",
        _ => "f32",
    }
}

/// Relative error allowed: f32 arithmetic either way; bf16 storage or operands round each
/// output once (2^-8), the reference does not. Ops chaining bf16 products (`chained`: the
/// attention backward, as flash's) get twice that.
pub fn tolerance(case: &Case, dtype: DType) -> f64 {
    let dtype = if case.mixed { DType::BF16 } else { dtype };
    match (dtype, case.chained) {
        (DType::BF16, false) => 1.6e-2,
        (DType::BF16, true) => 3.2e-2,
        _ => 1e-4,
    }
}

/// A case's inputs on the device; ops writing their inputs (the loss, embedding) get copies.
pub fn prepare(case: &Case, device: &Device, dtype: DType) -> Result<Vec<Tensor>> {
    case.inputs
        .iter()
        .map(|t| Ok(t.to_dtype(dtype)?.to_device(device)?.copy()?))
        .collect()
}

/// The median of `repeats` timed calls after one untimed warm-up (`call` returns seconds).
pub fn median_after_warmup(repeats: usize, mut call: impl FnMut() -> Result<f64>) -> Result<f64> {
    call()?;
    let mut times = (0..repeats.max(1))
        .map(|_| call())
        .collect::<Result<Vec<f64>>>()?;
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// The median time of `repeats` calls of a case by its kernel or twin, after a warm-up, each
/// on fresh inputs, waiting for the device.
pub fn time(
    case: &Case,
    device: &Device,
    dtype: DType,
    repeats: usize,
    composed: bool,
) -> Result<f64> {
    median_after_warmup(repeats, || {
        let inputs = prepare(case, device, dtype)?;
        device.synchronize()?;
        let start = std::time::Instant::now();
        let out = match composed {
            true => case.run_twin(&inputs)?,
            false => (case.run)(&inputs)?,
        };
        device.synchronize()?;
        let elapsed = start.elapsed().as_secs_f64();
        drop(out);
        Ok(elapsed)
    })
}

/// Every output's values in f32 on the host, one after another.
pub fn flat_f32(outputs: &[Tensor]) -> Result<Vec<f32>> {
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

/// (max abs error, max abs error / max |reference|); a NaN is an infinite error.
pub fn errors(got: &[f32], want: &[f32]) -> Result<(f64, f64)> {
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

/// Deterministic values in [-scale, scale), f32, on the CPU.
pub fn random(shape: &[usize], seed: u64, scale: f32) -> Result<Tensor> {
    use rayon::prelude::*;
    let n: usize = shape.iter().product();
    // Chunks of their own seed, in parallel: the same values whatever the threads.
    const CHUNK: usize = 1 << 16;
    let mut v = vec![0f32; n];
    v.par_chunks_mut(CHUNK).enumerate().for_each(|(i, chunk)| {
        let mut s = (seed ^ (i as u64).wrapping_mul(0xD1B5_4A32_D192_ED03))
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            | 1;
        for x in chunk {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            *x = ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale;
        }
    });
    Ok(Tensor::from_vec(v, shape, &Device::Cpu)?)
}
