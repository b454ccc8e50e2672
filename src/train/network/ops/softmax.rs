//! Scaled softmax over attention scores, causal or not. Scores are
//! [..., R, K] where row r is query position first + r % period (queries of
//! several heads stacked for grouped-query attention, a tile of `period`
//! positions from `first`): a causal row sees keys 0..=position, and only
//! those are computed. CUDA kernels: `src/train/network/kernels/softmax.cu`.

use super::store::Store;
use super::{f32s, own_kernel, rows_per_task, work_dtype};
use crate::train::network::kernels::{block_per_row, u32_of, LaunchPlan, Mem, Ty, Value, SOFTMAX};
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
    check_period(scores, period)?;
    let op = Softmax {
        scale,
        period,
        first,
        causal,
    };
    if own_kernel(super::Kernel::Softmax, &[scores]) {
        scores.contiguous()?.apply_op1(op)
    } else {
        op.composed(scores)
    }
}

/// Row r is position first + r % period within its [R, K] matrix (the CPU
/// kernel) and first + (global row) % period (the CUDA ones): the same only
/// when R is a multiple of the period, as every caller's is.
fn check_period(scores: &Tensor, period: usize) -> Result<()> {
    if period == 0 {
        candle_core::bail!("softmax: a period of 0 query positions");
    }
    let rows = scores.dims().iter().rev().nth(1).copied().unwrap_or(1);
    if rows % period != 0 {
        candle_core::bail!(
            "softmax: {rows} rows per matrix are no whole number of periods of {period}"
        );
    }
    Ok(())
}

/// The gradient of the scores from the probabilities `p` of [`softmax`]
/// and their gradient `dp`, without autograd: dS = scale·P∘(dP − rowsum(P∘dP))
/// (masked entries have P = 0, so their gradient is 0).
pub fn backward(p: &Tensor, dp: &Tensor, scale: f64) -> Result<Tensor> {
    if own_kernel(super::Kernel::Softmax, &[p, dp]) {
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

/// [`softmax`] of `scores` and [`backward`] from its probabilities and
/// `dp` in one op: (P, dS). On a GPU one kernel reads the scores and dP
/// once (the two read the scores, then P and dP, and wrote P between); on
/// the CPU its twin runs the two kernels.
pub fn forward_backward(
    scores: &Tensor,
    dp: &Tensor,
    scale: f64,
    period: usize,
    first: usize,
    causal: bool,
) -> Result<(Tensor, Tensor)> {
    if !own_kernel(super::Kernel::Softmax, &[scores, dp]) {
        let p = softmax(scores, scale, period, first, causal)?;
        let ds = backward(&p, dp, scale)?;
        return Ok((p, ds));
    }
    if scores.shape() != dp.shape() {
        candle_core::bail!(
            "softmax forward and backward: scores {:?}, dP {:?}",
            scores.shape(),
            dp.shape()
        );
    }
    check_period(scores, period)?;
    let op = SoftmaxFwdBwd(Softmax {
        scale,
        period,
        first,
        causal,
    });
    // Both at once: [P; dS].
    let both = scores
        .contiguous()?
        .apply_op2_no_bwd(&dp.contiguous()?, &op)?;
    Ok((both.get(0)?, both.get(1)?))
}

#[derive(Clone, Copy)]
struct Softmax {
    scale: f64,
    period: usize,
    first: usize,
    causal: bool,
}

impl Softmax {
    fn gpu<S: Store>(&self, s: &S, l: &Layout) -> Result<(S, Shape)> {
        let (rows, keys) = rows_and_keys(l);
        let shape = (self.period, self.first, self.causal);
        // The kernel takes an f32 scale.
        let plan = forward_plan(rows, keys, s.ty()?, shape, self.scale as f32)
            .map_err(candle_core::Error::Msg)?;
        let p = S::execute(&s.device(), &plan, &[s.operand(l)?])?.remove(0);
        Ok((p, l.shape().clone()))
    }

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

    /// The CPU kernel: probabilities `y` (zeros, filled here) of scores `x`
    /// of shape `dims` [..., R, K].
    fn cpu(&self, x: &[f32], dims: &[usize], y: &mut [f32]) {
        let (rows, keys) = (dims[dims.len() - 2], dims[dims.len() - 1]);
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
                    // The exponentials, then their sum: apart, the first
                    // loop vectorizes (the sum's order is fixed).
                    for (y, &x) in y[..n].iter_mut().zip(&x[..n]) {
                        *y = super::exp::exp(x * scale - max);
                    }
                    let inv = 1.0 / y[..n].iter().sum::<f32>();
                    y[..n].iter_mut().for_each(|v| *v *= inv);
                }
            });
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
        if super::emulating() {
            return self.gpu(s, l);
        }
        let x = f32s(s, l)?;
        let mut y = vec![0f32; x.len()];
        self.cpu(x, l.shape().dims(), &mut y);
        Ok((CpuStorage::F32(y), l.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
        self.gpu(s, l)
    }
}

/// dS = scale * P o (dP - rowsum(P o dP)); masked entries have P = 0.
struct SoftmaxBwd {
    scale: f32,
}

impl SoftmaxBwd {
    fn gpu<S: Store>(&self, p: &S, pl: &Layout, dp: &S, dpl: &Layout) -> Result<(S, Shape)> {
        let (rows, keys) = rows_and_keys(pl);
        if dpl.shape().elem_count() != pl.shape().elem_count() {
            candle_core::bail!("softmax backward: P and dP differ in size");
        }
        let plan =
            backward_plan(rows, keys, p.ty()?, self.scale).map_err(candle_core::Error::Msg)?;
        let operands = [p.operand(pl)?, dp.operand(dpl)?];
        let ds = S::execute(&p.device(), &plan, &operands)?.remove(0);
        Ok((ds, pl.shape().clone()))
    }

    /// The CPU kernel: dS from P and dP of shape `dims` [..., R, K].
    fn cpu(&self, p: &[f32], dp: &[f32], dims: &[usize], ds: &mut [f32]) {
        let keys = dims[dims.len() - 1];
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
    }
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
        if super::emulating() {
            return self.gpu(s1, l1, s2, l2);
        }
        let (p, dp) = (f32s(s1, l1)?, f32s(s2, l2)?);
        let mut ds = vec![0f32; p.len()];
        self.cpu(p, dp, l1.shape().dims(), &mut ds);
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
        self.gpu(p, pl, dp, dpl)
    }
}

/// (P, dS) from the scores and dP: the GPU's one pass ([`forward_backward`]).
struct SoftmaxFwdBwd(Softmax);

impl SoftmaxFwdBwd {
    fn gpu<S: Store>(&self, s: &S, sl: &Layout, dp: &S, dpl: &Layout) -> Result<(S, Shape)> {
        let (rows, keys) = rows_and_keys(sl);
        if dpl.shape() != sl.shape() {
            candle_core::bail!("softmax forward and backward: S and dP differ in shape");
        }
        let Softmax {
            scale,
            period,
            first,
            causal,
        } = self.0;
        let plan =
            forward_backward_plan(rows, keys, s.ty()?, (period, first, causal), scale as f32)
                .map_err(candle_core::Error::Msg)?;
        let operands = [s.operand(sl)?, dp.operand(dpl)?];
        let both = S::execute(&s.device(), &plan, &operands)?.remove(0);
        let mut dims = vec![2];
        dims.extend_from_slice(sl.shape().dims());
        Ok((both, Shape::from(dims)))
    }
}

impl CustomOp2 for SoftmaxFwdBwd {
    fn name(&self) -> &'static str {
        "sweep-softmax-fwd-bwd"
    }

    /// The CPU's two kernels, one after the other (the GPU's twin).
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        if super::emulating() {
            return self.gpu(s1, l1, s2, l2);
        }
        let (x, dp) = (f32s(s1, l1)?, f32s(s2, l2)?);
        if x.len() != dp.len() {
            candle_core::bail!("softmax forward and backward: S and dP differ in size");
        }
        let dims = l1.shape().dims();
        let mut both = vec![0f32; 2 * x.len()];
        let (p, ds) = both.split_at_mut(x.len());
        self.0.cpu(x, dims, p);
        let bwd = SoftmaxBwd {
            scale: self.0.scale as f32,
        };
        bwd.cpu(p, dp, dims, ds);
        let mut shape = vec![2];
        shape.extend_from_slice(dims);
        Ok((CpuStorage::F32(both), Shape::from(shape)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &CudaStorage,
        sl: &Layout,
        dp: &CudaStorage,
        dpl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        self.gpu(s, sl, dp, dpl)
    }
}

/// (rows, keys) of scores [..., R, K].
fn rows_and_keys(l: &Layout) -> (usize, usize) {
    let keys = *l.shape().dims().last().unwrap_or(&1);
    (l.shape().elem_count() / keys.max(1), keys)
}

/// The forward on a GPU: probabilities (output 0) of `rows` rows of `keys`
/// scores (operand 0), a block per row.
pub fn forward_plan(
    rows: usize,
    keys: usize,
    own: Ty,
    (period, first, causal): (usize, usize, bool),
    scale: f32,
) -> std::result::Result<LaunchPlan, String> {
    let mut plan = LaunchPlan::default();
    let p = plan.output(own, rows * keys);
    let rows32 = u32_of(rows, "softmax rows")?;
    plan.launch(
        &SOFTMAX,
        "softmax_fwd",
        own,
        block_per_row(rows32),
        vec![
            Value::Ptr(Mem::Operand(0), 0),
            Value::Ptr(p, 0),
            Value::U32(u32_of(keys, "softmax keys")?),
            Value::U32(u32_of(period, "the softmax period")?),
            Value::U32(u32_of(first, "the softmax's first position")?),
            Value::U32(u32::from(causal)),
            Value::F32(scale),
        ],
    )?;
    Ok(plan)
}

/// The backward on a GPU: dS (output 0) from P and dP (operands 0, 1), a
/// block per row.
pub fn backward_plan(
    rows: usize,
    keys: usize,
    own: Ty,
    scale: f32,
) -> std::result::Result<LaunchPlan, String> {
    let mut plan = LaunchPlan::default();
    let ds = plan.output(own, rows * keys);
    plan.launch(
        &SOFTMAX,
        "softmax_bwd",
        own,
        block_per_row(u32_of(rows, "softmax rows")?),
        vec![
            Value::Ptr(Mem::Operand(0), 0),
            Value::Ptr(Mem::Operand(1), 0),
            Value::Ptr(ds, 0),
            Value::U32(u32_of(keys, "softmax keys")?),
            Value::F32(scale),
        ],
    )?;
    Ok(plan)
}

/// The forward and backward in one pass on a GPU: [P; dS] (output 0, twice
/// the scores' size) from the scores and dP (operands 0, 1), a block per row.
pub fn forward_backward_plan(
    rows: usize,
    keys: usize,
    own: Ty,
    (period, first, causal): (usize, usize, bool),
    scale: f32,
) -> std::result::Result<LaunchPlan, String> {
    let mut plan = LaunchPlan::default();
    let n = rows * keys;
    let out = plan.output(own, 2 * n);
    plan.launch(
        &SOFTMAX,
        "softmax_fwd_bwd",
        own,
        block_per_row(u32_of(rows, "softmax rows")?),
        vec![
            Value::Ptr(Mem::Operand(0), 0),
            Value::Ptr(Mem::Operand(1), 0),
            Value::Ptr(out, 0),
            Value::Ptr(out, n),
            Value::U32(u32_of(keys, "softmax keys")?),
            Value::U32(u32_of(period, "the softmax period")?),
            Value::U32(u32_of(first, "the softmax's first position")?),
            Value::U32(u32::from(causal)),
            Value::F32(scale),
        ],
    )?;
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::network::ops::testing::{max_diff, rand};
    use candle_core::Var;

    /// Rows of scores for the emulation's tests: (rows a matrix, keys,
    /// period, first position, causal).
    const SHAPES: [(usize, usize, usize, usize, bool); 7] = [
        (6, 300, 3, 297, true),
        (4, 40, 4, 0, true),
        (5, 1, 5, 0, false),
        (2, 513, 1, 100, false),
        // More 16-byte groups than a block has threads, and rows that
        // start off the 16-byte alignment every other row (bf16).
        (3, 4112, 3, 4000, true),
        (2, 2053, 2, 2000, true),
        // More groups than a block's threads hold between the passes
        // (HELD, softmax.cu) in both dtypes: the rest is read twice.
        (2, 9000, 2, 8990, true),
    ];

    /// The GPU plans under the host emulation of CUDA equal the CPU
    /// kernels: causal tiles of queries (a period below the rows, a first
    /// position past 0), keys that fill no whole pass of a block, one key;
    /// f32 and bf16.
    #[test]
    fn the_gpu_plans_equal_the_cpu_kernels_under_emulation() -> Result<()> {
        use crate::train::network::ops::testing::{
            assert_rounded, buffer, emulate, emulate_off_alignment, tensor,
        };
        for (r, keys, period, first, causal) in SHAPES {
            let x = (rand(&[2, r, keys], 1) * 4.0)?;
            let dp = rand(&[2, r, keys], 2);
            let rows = 2 * r;
            for (own, tol) in [(Ty::F32, 1e-6), (Ty::Bf16, 1e-2)] {
                let seen = |t: &Tensor| tensor(&buffer(t, own), t.dims());
                let plan = forward_plan(rows, keys, own, (period, first, causal), 0.3).unwrap();
                let Some((out, _)) = emulate(&plan, &[buffer(&x, own)], own == Ty::F32 && r == 6)
                else {
                    return Ok(());
                };
                let want = softmax(&seen(&x), 0.3, period, first, causal)?;
                let p = tensor(&out[0], &[2, r, keys]);
                assert!(max_diff(&p, &want)? < tol, "forward {r}x{keys} {own:?}");
                assert_rounded(&out[0], &want, 1e-5, 0.0);
                let operands = [buffer(&want, own), buffer(&dp, own)];
                let (out, _) = emulate(
                    &backward_plan(rows, keys, own, 0.3).unwrap(),
                    &operands,
                    own == Ty::F32 && r == 6,
                )
                .unwrap();
                // Every operand off the 16-byte alignment: the same bits.
                let (got, _) =
                    emulate_off_alignment(&backward_plan(rows, keys, own, 0.3).unwrap(), &operands);
                assert_eq!(got, out, "backward {r}x{keys} {own:?}, shifted");
                let (got, _) = emulate_off_alignment(&plan, &[buffer(&x, own)]);
                assert_eq!(
                    got[0],
                    buffer(&p, own),
                    "forward {r}x{keys} {own:?}, shifted"
                );
                let ds = backward(&seen(&want), &seen(&dp), 0.3)?;
                let got = tensor(&out[0], &[2, r, keys]);
                assert!(
                    max_diff(&got, &ds)? < 2.0 * tol,
                    "backward {r}x{keys} {own:?}"
                );
                // dS = P (dP − Σ P dP) cancels: its error is absolute.
                assert_rounded(&out[0], &ds, 1e-5, 1e-6);
            }
        }
        Ok(())
    }

    /// The one-pass plan under the emulation equals the two CPU kernels one
    /// after the other, on the forward's shapes (rows longer than the
    /// registers hold among them); masked entries are zeros in both
    /// outputs; the same bits with every operand off the 16-byte alignment.
    #[test]
    fn the_one_pass_plan_equals_the_cpu_kernels_under_emulation() -> Result<()> {
        use crate::train::network::ops::testing::{buffer, emulate, emulate_off_alignment, tensor};
        for (r, keys, period, first, causal) in SHAPES {
            let x = (rand(&[2, r, keys], 3) * 4.0)?;
            let dp = rand(&[2, r, keys], 4);
            for (own, tol) in [(Ty::F32, 1e-5), (Ty::Bf16, 1e-2)] {
                let seen = |t: &Tensor| tensor(&buffer(t, own), t.dims());
                let plan =
                    forward_backward_plan(2 * r, keys, own, (period, first, causal), 0.3).unwrap();
                let operands = [buffer(&x, own), buffer(&dp, own)];
                let Some((out, _)) = emulate(&plan, &operands, own == Ty::F32 && r == 6) else {
                    return Ok(());
                };
                let (shifted, _) = emulate_off_alignment(&plan, &operands);
                assert_eq!(shifted, out, "{r}x{keys} {own:?}, shifted");
                let both = tensor(&out[0], &[2, 2, r, keys]);
                let p = softmax(&seen(&x), 0.3, period, first, causal)?;
                let ds = backward(&p, &seen(&dp), 0.3)?;
                let case = format!("{r}x{keys} {own:?}");
                assert!(max_diff(&both.get(0)?, &p)? < tol, "P {case}");
                assert!(max_diff(&both.get(1)?, &ds)? < 2.0 * tol, "dS {case}");
                if causal {
                    // Row i of a matrix is position first + i % period.
                    let values = both.flatten_all()?.to_vec1::<f32>()?;
                    for (n, v) in values.iter().enumerate() {
                        let (row, key) = (n / keys % r, n % keys);
                        if key > first + row % period {
                            assert_eq!(*v, 0.0, "{case}: masked value {n}");
                        }
                    }
                }
            }
        }
        Ok(())
    }

    #[test]
    fn rows_that_are_no_whole_number_of_periods_are_refused() {
        let x = rand(&[5, 8], 3);
        let e = softmax(&x, 1.0, 2, 0, true).unwrap_err().to_string();
        assert!(e.contains("no whole number of periods"), "{e}");
    }

    #[test]
    fn fused_matches_composed_forward_and_gradients() -> Result<()> {
        // Two heads' queries stacked (rows = 2 x 5 positions) against 5 keys.
        for causal in [true, false] {
            let s = Var::from_tensor(&(rand(&[2, 3, 10, 5], 1) * 4.0)?)?;
            let dy = rand(&[2, 3, 10, 5], 2);
            let a = softmax(&s, 0.35, 5, 0, causal)?;
            let b = super::super::composed_here(|| softmax(&s, 0.35, 5, 0, causal))?;
            assert!(max_diff(&a, &b)? < 1e-6, "causal={causal}");
            let g = (b * &dy)?.sum_all()?.backward()?;
            assert!(
                max_diff(&backward(&a, &dy, 0.35)?, g.get(&s).unwrap())? < 1e-5,
                "causal={causal}"
            );
        }
        Ok(())
    }
}
