//! Scaled softmax over attention scores, causal or not. Scores are
//! [..., R, K] where row r is query position first + r % period (queries of
//! several heads stacked for grouped-query attention, a tile of `period`
//! positions from `first`): a causal row sees keys 0..=position, and only
//! those are computed. CUDA kernels: `src/train/kernels/softmax.cu`.

use super::check::{random, Case, Shapes};
#[cfg(feature = "cuda")]
use super::cuda::{self, by_dtype, Element};
use super::{f32s, own_kernel, rows_per_task, work_dtype};
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor, D};
use rayon::prelude::*;

/// Rows are query positions first + r % period (with `first` 0, all of a
/// sequence's positions; else a tile of its queries against keys 0.. of
/// the scores' width).
pub fn softmax(
    scores: &Tensor,
    scale: f64,
    period: usize,
    first: usize,
    causal: bool,
) -> Result<Tensor> {
    if period == 0 {
        candle_core::bail!("softmax: a period of 0 query positions");
    }
    let op = Softmax {
        scale,
        period,
        first,
        causal,
    };
    if own_kernel(&[scores]) {
        scores.contiguous()?.apply_op1(op)
    } else {
        op.composed(scores)
    }
}

/// The gradient of the scores from the probabilities `p` of [`softmax`]
/// and their gradient `dp`, without autograd: dS = scale·P∘(dP − rowsum(P∘dP))
/// (masked entries have P = 0, so their gradient is 0).
pub fn backward(p: &Tensor, dp: &Tensor, scale: f64) -> Result<Tensor> {
    if own_kernel(&[p, dp]) {
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

#[derive(Clone, Copy)]
struct Softmax {
    scale: f64,
    period: usize,
    first: usize,
    causal: bool,
}

impl Softmax {
    /// The composed twin: candle's softmax over the scaled scores with a
    /// mask (any device and dtype).
    fn composed(&self, scores: &Tensor) -> Result<Tensor> {
        let Softmax {
            scale,
            period,
            first,
            causal,
        } = *self;
        let s = (scores * scale)?;
        if !causal {
            return candle_nn::ops::softmax(&s, D::Minus1);
        }
        let dims = s.dims().to_vec();
        let (rows, keys) = (dims[dims.len() - 2], dims[dims.len() - 1]);
        let mask: Vec<f32> = (0..rows)
            .flat_map(|r| {
                (0..keys).map(move |k| {
                    if k <= first + r % period {
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

    fn visible(&self, row: usize, keys: usize) -> usize {
        if self.causal {
            (self.first + row % self.period + 1).min(keys)
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
        let scale = self.scale as f32;
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
                    let max = x[..n].iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) * scale;
                    let mut sum = 0.0;
                    for (y, &x) in y[..n].iter_mut().zip(&x[..n]) {
                        *y = (x * scale - max).exp();
                        sum += *y;
                    }
                    let inv = 1.0 / sum;
                    y[..n].iter_mut().for_each(|v| *v *= inv);
                }
            });
        Ok((CpuStorage::F32(y), l.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
        let p = by_dtype!(cuda::dtype(s), forward_cuda(self, s, l))?;
        Ok((p, l.shape().clone()))
    }

    // Autograd runs only in the tests (the oracle, [`crate::train::oracle`]).
    #[cfg(test)]
    fn bwd(&self, _x: &Tensor, p: &Tensor, dp: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(backward(p, dp, self.scale)?))
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

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        p: &CudaStorage,
        pl: &Layout,
        dp: &CudaStorage,
        dpl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let ds = by_dtype!(cuda::dtype(p), backward_cuda(self.scale, p, pl, dp, dpl))?;
        Ok((ds, pl.shape().clone()))
    }
}

/// (rows, keys) of scores [..., R, K], each count within the kernels' u32.
#[cfg(feature = "cuda")]
fn rows_and_keys(l: &Layout) -> Result<(u32, u32)> {
    let dims = l.shape().dims();
    let keys = *dims.last().unwrap_or(&1);
    let rows = l.shape().elem_count() / keys.max(1);
    Ok((
        cuda::u32_of(rows, "softmax rows")?,
        cuda::u32_of(keys, "softmax keys")?,
    ))
}

#[cfg(feature = "cuda")]
fn forward_cuda<T: Element>(op: &Softmax, s: &CudaStorage, l: &Layout) -> Result<CudaStorage> {
    let (rows, keys) = rows_and_keys(l)?;
    let x = cuda::view::<T>(s, l)?;
    let dev = cuda::device(s);
    let mut p = cuda::alloc::<T>(&dev, x.len())?;
    let period = cuda::u32_of(op.period, "the softmax period")?;
    let first = cuda::u32_of(op.first, "the softmax's first position")?;
    let causal = u32::from(op.causal);
    // The kernel takes an f32 scale.
    let scale = op.scale as f32;
    let f = cuda::function(&dev, &cuda::SOFTMAX, "softmax_fwd", T::DTYPE)?;
    let mut args = f.builder();
    args.arg(&x)
        .arg(&mut p)
        .arg(&keys)
        .arg(&period)
        .arg(&first)
        .arg(&causal)
        .arg(&scale);
    // SAFETY: (scores, probs, keys, period, offset, causal, scale) is the
    // kernel's signature; block r reads and writes row r's `keys` values,
    // and there are `rows` blocks over rows × keys values.
    unsafe { cuda::launch(&mut args, cuda::block_per_row(rows), "softmax_fwd") }?;
    drop(args);
    Ok(CudaStorage::wrap_cuda_slice(p, dev))
}

#[cfg(feature = "cuda")]
fn backward_cuda<T: Element>(
    scale: f32,
    p: &CudaStorage,
    pl: &Layout,
    dp: &CudaStorage,
    dpl: &Layout,
) -> Result<CudaStorage> {
    let (rows, keys) = rows_and_keys(pl)?;
    let (pv, dpv) = (cuda::view::<T>(p, pl)?, cuda::view::<T>(dp, dpl)?);
    if pv.len() != dpv.len() {
        candle_core::bail!("softmax backward: P and dP differ in size");
    }
    let dev = cuda::device(p);
    let mut ds = cuda::alloc::<T>(&dev, pv.len())?;
    let f = cuda::function(&dev, &cuda::SOFTMAX, "softmax_bwd", T::DTYPE)?;
    let mut args = f.builder();
    args.arg(&pv).arg(&dpv).arg(&mut ds).arg(&keys).arg(&scale);
    // SAFETY: (probs, dprobs, dscores, keys, scale) is the kernel's
    // signature; block r touches row r of each, `rows` rows in all.
    unsafe { cuda::launch(&mut args, cuda::block_per_row(rows), "softmax_bwd") }?;
    drop(args);
    Ok(CudaStorage::wrap_cuda_slice(ds, dev))
}

/// Its cases for `sweep bench kernels`: attention's softmax on the last tile
/// of queries of the backward (the one that sees every key).
pub fn cases(s: &Shapes) -> anyhow::Result<Vec<Case>> {
    let (batch, seq, h) = (s.batch, s.seq, s.cfg.n_heads);
    let tile = super::attention::tile_rows(batch, h, seq, candle_core::DType::BF16).min(seq);
    let last_tile = seq - tile;
    let scores = batch * h * tile * seq;
    let scale = 1.0 / (s.cfg.head_dim() as f64).sqrt();
    let shape = format!("[{batch}, {h}, {tile}, {seq}]");
    Ok(vec![
        Case::new(
            "softmax forward",
            shape.clone(),
            2 * scores,
            vec![random(&[batch, h, tile, seq], 16, 8.0)?],
            Box::new(move |t| Ok(vec![softmax(&t[0], scale, tile, last_tile, true)?])),
        ),
        Case::new(
            "softmax backward",
            shape,
            3 * scores,
            // Probabilities (rows of a causal softmax) and their gradient.
            vec![
                softmax(
                    &random(&[batch, h, tile, seq], 17, 8.0)?,
                    scale,
                    tile,
                    last_tile,
                    true,
                )?,
                random(&[batch, h, tile, seq], 18, 1.0)?,
            ],
            Box::new(move |t| Ok(vec![backward(&t[0], &t[1], scale)?])),
        ),
    ])
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
            let a = softmax(&s, 0.35, 5, 0, causal)?;
            let b = super::super::composed_here(|| softmax(&s, 0.35, 5, 0, causal))?;
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
