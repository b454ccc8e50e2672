//! Cross-entropy summed over the labels that are not -100 and divided by
//! `divisor` (the count of such labels in the whole optimizer step, so that
//! gradient accumulation equals one large batch).

use super::{f32s, fused};
use crate::data::samples::IGNORE;
use candle_core::{bail, CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor, D};
use rayon::prelude::*;
use std::sync::Arc;

/// `logits` [N, V], `labels` N values (-100: ignored). Returns a scalar.
pub fn cross_entropy(logits: &Tensor, labels: &[i64], divisor: f64) -> Result<Tensor> {
    let (n, v) = logits.dims2()?;
    if labels.len() != n {
        bail!("{n} rows of logits but {} labels", labels.len());
    }
    if let Some(bad) = labels
        .iter()
        .find(|&&l| l != IGNORE && (l < 0 || l as usize >= v))
    {
        bail!("label {bad} is outside the vocabulary of {v}");
    }
    if fused(logits) {
        logits.contiguous()?.apply_op1(CrossEntropy {
            labels: Arc::new(labels.to_vec()),
            divisor: divisor as f32,
        })
    } else {
        composed(logits, labels, divisor)
    }
}

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
    max + row.iter().map(|&v| (v - max).exp()).sum::<f32>().ln()
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
                    *d = self.scale * (x - lse).exp();
                }
                d[l as usize] -= self.scale;
            });
        Ok((CpuStorage::F32(d), l.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::ops::testing::{max_diff, rand};
    use candle_core::Var;

    #[test]
    fn fused_matches_composed_and_ignores_masked_labels() -> Result<()> {
        let x = Var::from_tensor(&(rand(&[6, 11], 1) * 3.0)?)?;
        let labels = [3, IGNORE, 10, 0, IGNORE, 7];
        let a = cross_entropy(&x, &labels, 4.0)?;
        let b = composed(&x, &labels, 4.0)?;
        assert!(max_diff(&a, &b)? < 1e-5);
        let ga = a.backward()?;
        let gb = b.backward()?;
        let (da, db) = (ga.get(&x).unwrap(), gb.get(&x).unwrap());
        assert!(max_diff(da, db)? < 1e-6);
        // Ignored rows get no gradient.
        assert_eq!(da.get(1)?.abs()?.sum_all()?.to_scalar::<f32>()?, 0.0);
        Ok(())
    }

    #[test]
    fn labels_outside_the_vocabulary_are_an_error() {
        let x = rand(&[2, 5], 1);
        assert!(cross_entropy(&x, &[1, 5], 1.0).is_err());
    }
}
