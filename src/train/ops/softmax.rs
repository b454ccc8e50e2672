//! Scaled softmax over attention scores, causal or not. Scores are
//! [..., R, K] where row r is query position r % period (queries of several
//! heads stacked for grouped-query attention): a causal row sees keys
//! 0..=position, and only those are computed.

use super::{f32s, fused, rows_per_task, work_dtype};
use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor, D};
use rayon::prelude::*;

pub fn softmax(scores: &Tensor, scale: f64, period: usize, causal: bool) -> Result<Tensor> {
    if fused(scores) {
        scores.contiguous()?.apply_op1(Softmax {
            scale: scale as f32,
            period,
            causal,
        })
    } else {
        composed(scores, scale, period, causal)
    }
}

pub fn composed(scores: &Tensor, scale: f64, period: usize, causal: bool) -> Result<Tensor> {
    let s = (scores * scale)?;
    if !causal {
        return candle_nn::ops::softmax(&s, D::Minus1);
    }
    let dims = s.dims().to_vec();
    let (rows, keys) = (dims[dims.len() - 2], dims[dims.len() - 1]);
    let mask: Vec<f32> = (0..rows)
        .flat_map(|r| {
            (0..keys).map(move |k| {
                if k <= r % period {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
        })
        .collect();
    let mask = Tensor::from_vec(mask, (rows, keys), s.device())?.to_dtype(s.dtype())?;
    candle_nn::ops::softmax(&s.broadcast_add(&mask)?, D::Minus1)
}

/// The gradient of the scores from the probabilities `p` of [`softmax`]
/// and their gradient `dp`, without autograd: dS = scale·P∘(dP − rowsum(P∘dP))
/// (masked entries have P = 0, so their gradient is 0).
pub fn backward(p: &Tensor, dp: &Tensor, scale: f64) -> Result<Tensor> {
    if fused(p) && fused(dp) {
        return p.contiguous()?.apply_op2_no_bwd(
            &dp.contiguous()?,
            &SoftmaxBwd {
                scale: scale as f32,
            },
        );
    }
    let work = work_dtype(p);
    let (pw, dpw) = (p.to_dtype(work)?, dp.to_dtype(work)?);
    let dot = (&pw * &dpw)?.sum_keepdim(D::Minus1)?;
    ((pw * dpw.broadcast_sub(&dot)?)? * scale)?.to_dtype(p.dtype())
}

struct Softmax {
    scale: f32,
    period: usize,
    causal: bool,
}

impl Softmax {
    fn visible(&self, row: usize, keys: usize) -> usize {
        if self.causal {
            (row % self.period + 1).min(keys)
        } else {
            keys
        }
    }
}

impl CustomOp1 for Softmax {
    fn name(&self) -> &'static str {
        "sweep-softmax"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = f32s(s, l)?;
        let dims = l.shape().dims();
        let (rows, keys) = (dims[dims.len() - 2], dims[dims.len() - 1]);
        let mut y = vec![0f32; x.len()];
        let per = rows_per_task(x.len() / keys, keys) * keys;
        y.par_chunks_mut(per)
            .zip(x.par_chunks(per))
            .enumerate()
            .for_each(|(task, (y, x))| {
                let first = task * per / keys;
                for (i, (y, x)) in y
                    .chunks_exact_mut(keys)
                    .zip(x.chunks_exact(keys))
                    .enumerate()
                {
                    let n = self.visible((first + i) % rows, keys);
                    let max = x[..n].iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) * self.scale;
                    let mut sum = 0.0;
                    for (y, &x) in y[..n].iter_mut().zip(&x[..n]) {
                        *y = (x * self.scale - max).exp();
                        sum += *y;
                    }
                    let inv = 1.0 / sum;
                    y[..n].iter_mut().for_each(|v| *v *= inv);
                }
            });
        Ok((CpuStorage::F32(y), l.shape().clone()))
    }

    fn bwd(&self, _x: &Tensor, p: &Tensor, dp: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(backward(p, dp, self.scale as f64)?))
    }
}

/// dS = scale * P o (dP - rowsum(P o dP)); masked entries have P = 0.
struct SoftmaxBwd {
    scale: f32,
}

impl CustomOp2 for SoftmaxBwd {
    fn name(&self) -> &'static str {
        "sweep-softmax-bwd"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (p, dp) = (f32s(s1, l1)?, f32s(s2, l2)?);
        let dims = l1.shape().dims();
        let keys = dims[dims.len() - 1];
        let mut ds = vec![0f32; p.len()];
        let per = rows_per_task(p.len() / keys, keys) * keys;
        ds.par_chunks_mut(per)
            .zip(p.par_chunks(per).zip(dp.par_chunks(per)))
            .for_each(|(ds, (p, dp))| {
                for ((ds, p), dp) in ds
                    .chunks_exact_mut(keys)
                    .zip(p.chunks_exact(keys))
                    .zip(dp.chunks_exact(keys))
                {
                    let dot: f32 = p.iter().zip(dp).map(|(a, b)| a * b).sum();
                    for ((d, &p), &g) in ds.iter_mut().zip(p).zip(dp) {
                        *d = self.scale * p * (g - dot);
                    }
                }
            });
        Ok((CpuStorage::F32(ds), l1.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::ops::testing::{max_diff, rand};
    use candle_core::Var;

    #[test]
    fn fused_matches_composed_forward_and_gradients() -> Result<()> {
        // Two heads' queries stacked (rows = 2 x 5 positions) against 5 keys.
        for causal in [true, false] {
            let s = Var::from_tensor(&(rand(&[2, 3, 10, 5], 1) * 4.0)?)?;
            let dy = rand(&[2, 3, 10, 5], 2);
            let a = softmax(&s, 0.35, 5, causal)?;
            let b = composed(&s, 0.35, 5, causal)?;
            assert!(max_diff(&a, &b)? < 1e-6, "causal={causal}");
            let ga = (a * &dy)?.sum_all()?.backward()?;
            let gb = (b * &dy)?.sum_all()?.backward()?;
            assert!(
                max_diff(ga.get(&s).unwrap(), gb.get(&s).unwrap())? < 1e-5,
                "causal={causal}"
            );
        }
        Ok(())
    }
}
