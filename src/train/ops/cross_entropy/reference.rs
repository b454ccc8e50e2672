//! The test-only forms of the loss: the autograd op the oracle trains with
//! ([`cross_entropy`], the gradient hung on the graph with `attach`), the
//! same by detached slices ([`by_rows`]), and the loss composed from candle
//! ops ([`composed`]) that the kernels are held to.

use super::{check_labels, computed_by_slices, SLICE_ELEMENTS};
use crate::data::samples::IGNORE;
use crate::train::ops::attach::attach;
use crate::train::ops::{f32s, fused, work_dtype};
use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor, D};
use rayon::prelude::*;
use std::sync::Arc;

/// `logits` [N, V], `labels` N values (-100: ignored). Returns a scalar.
pub fn cross_entropy(logits: &Tensor, labels: &[i64], divisor: f64) -> Result<Tensor> {
    check_labels(logits, labels)?;
    if fused(logits) {
        logits.contiguous()?.apply_op1(CrossEntropy {
            labels: Arc::new(labels.to_vec()),
            divisor: divisor as f32,
        })
    } else {
        by_rows(logits, labels, divisor)
    }
}

/// The loss and d loss / d logits, computed with detached candle ops on the
/// logits' device, a slice of rows at a time, in f32 (f64 for f64 logits).
/// The loss is a scalar of that dtype.
pub fn by_rows(logits: &Tensor, labels: &[i64], divisor: f64) -> Result<Tensor> {
    let v = logits.dim(1)?;
    by_slices_of(logits, labels, divisor, (SLICE_ELEMENTS / v).max(1))
}

pub fn by_slices_of(logits: &Tensor, labels: &[i64], divisor: f64, rows: usize) -> Result<Tensor> {
    let (loss, grad) = computed_by_slices(logits, labels, divisor, rows)?;
    loss + attach(logits, grad, work_dtype(logits))?
}

/// The loss composed from candle ops: the reference the tests hold the kernels to.
pub fn composed(logits: &Tensor, labels: &[i64], divisor: f64) -> Result<Tensor> {
    let (n, _) = logits.dims2()?;
    let keep: Vec<f32> = labels
        .iter()
        .map(|&l| if l == IGNORE { 0.0 } else { 1.0 })
        .collect();
    let idx: Vec<u32> = labels
        .iter()
        .map(|&l| if l == IGNORE { 0 } else { l as u32 })
        .collect();
    let dev = logits.device();
    let logp = candle_nn::ops::log_softmax(logits, D::Minus1)?;
    let picked = logp
        .gather(&Tensor::from_vec(idx, (n, 1), dev)?, 1)?
        .squeeze(1)?;
    let keep = Tensor::from_vec(keep, n, dev)?.to_dtype(logits.dtype())?;
    (picked * keep)?.sum_all()?.neg()? / divisor
}

struct CrossEntropy {
    labels: Arc<Vec<i64>>,
    divisor: f32,
}

/// log(sum(exp(row))) computed stably.
fn log_sum_exp(row: &[f32]) -> f32 {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    max + crate::train::ops::exp::ln(
        row.iter()
            .map(|&v| crate::train::ops::exp::exp(v - max))
            .sum::<f32>(),
    )
}

impl CustomOp1 for CrossEntropy {
    fn name(&self) -> &'static str {
        "sweep-cross-entropy"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = f32s(s, l)?;
        let (_, v) = l.shape().dims2()?;
        // Per-row losses in parallel, summed in order: the same bits every run.
        let rows: Vec<f64> = x
            .par_chunks(v)
            .zip(self.labels.par_iter())
            .map(|(row, &l)| {
                if l == IGNORE {
                    0.0
                } else {
                    (log_sum_exp(row) - row[l as usize]) as f64
                }
            })
            .collect();
        let total: f64 = rows.iter().sum();
        Ok((
            CpuStorage::F32(vec![(total / self.divisor as f64) as f32]),
            Shape::from(()),
        ))
    }

    fn bwd(&self, logits: &Tensor, _loss: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let g = grad.to_dtype(DType::F32)?.to_scalar::<f32>()?;
        let op = CrossEntropyBwd {
            labels: self.labels.clone(),
            scale: g / self.divisor,
        };
        Ok(Some(logits.apply_op1_no_bwd(&op)?))
    }
}

/// d logits = scale * (softmax - onehot(label)) on kept rows, 0 elsewhere.
struct CrossEntropyBwd {
    labels: Arc<Vec<i64>>,
    scale: f32,
}

impl CustomOp1 for CrossEntropyBwd {
    fn name(&self) -> &'static str {
        "sweep-cross-entropy-bwd"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = f32s(s, l)?;
        let (_, v) = l.shape().dims2()?;
        let mut d = vec![0f32; x.len()];
        d.par_chunks_mut(v)
            .zip(x.par_chunks(v))
            .zip(self.labels.par_iter())
            .for_each(|((d, row), &l)| {
                if l == IGNORE {
                    return;
                }
                let lse = log_sum_exp(row);
                for (d, &x) in d.iter_mut().zip(row) {
                    *d = self.scale * crate::train::ops::exp::exp(x - lse);
                }
                d[l as usize] -= self.scale;
            });
        Ok((CpuStorage::F32(d), l.shape().clone()))
    }
}
