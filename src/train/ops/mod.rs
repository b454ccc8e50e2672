//! Fused CPU kernels with hand-written backward passes, for the ops where
//! candle's own either drop gradients (`ops::rms_norm`, `rope`,
//! `softmax_last_dim`) or spend most of their time allocating intermediates.
//!
//! Each op has a composed twin built from differentiable candle ops; the twin
//! runs on other devices and dtypes, and the tests check the fused op's
//! forward and gradients against it.

pub mod accumulate;
pub mod attach;
pub mod bf16_gemm;
pub mod cross_entropy;
pub mod embedding;
pub mod matmul;
pub mod rms_norm;
pub mod rope;
pub mod silu_mul;
pub mod softmax;

use candle_core::{bail, CpuStorage, DType, Layout, Result, Tensor};

/// The dtype an op's backward computes in off the fused path: f64 for f64
/// tensors (the tests' oracle precision), else f32 (reductions of bf16
/// values lose too much).
pub(crate) fn work_dtype(t: &Tensor) -> DType {
    if t.dtype() == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// Whether the fused CPU kernels apply (contiguous f32 on the CPU).
pub fn fused(t: &Tensor) -> bool {
    t.device().is_cpu() && t.dtype() == DType::F32
}

/// The contiguous f32 data of a CPU storage.
pub(crate) fn f32s<'a>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [f32]> {
    let CpuStorage::F32(v) = s else {
        bail!("expected f32 data")
    };
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&v[a..b]),
        None => bail!("expected contiguous data"),
    }
}

/// All the f32 data of a CPU storage (for ops that read through strides).
pub(crate) fn f32s_any(s: &CpuStorage) -> Result<&[f32]> {
    match s {
        CpuStorage::F32(v) => Ok(v),
        _ => bail!("expected f32 data"),
    }
}

/// Rows per parallel task: enough work per task to amortise scheduling.
pub(crate) fn rows_per_task(rows: usize, row_len: usize) -> usize {
    (16_384 / row_len.max(1)).clamp(1, rows.max(1))
}

#[cfg(test)]
pub(crate) mod testing {
    use candle_core::{Device, Result, Tensor};

    /// Deterministic pseudo-random data in [-1, 1).
    pub fn rand(shape: &[usize], seed: u64) -> Tensor {
        let n: usize = shape.iter().product();
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let v: Vec<f32> = (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    }

    pub fn max_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
        (a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()
    }
}
