//! RMSNorm: y = x / sqrt(mean(x^2) + eps) * w, over the last dimension.
//! CUDA kernels: `src/train/network/kernels/rms_norm.cu`.

use super::store::Store;
use super::{f32s, own_kernel, rows_per_task, work_dtype};
use crate::train::network::kernels::{
    column_blocks, u32_of, warp_per_row, LaunchPlan, Mem, Ty, Value, RMS_NORM,
};
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor, D};
use rayon::prelude::*;

pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let _part = crate::train::network::parts::op(crate::train::network::parts::Op::Norm);
    if own_kernel(super::Kernel::RmsNorm, &[x, w]) {
        x.contiguous()?
            .apply_op2(&w.contiguous()?, RmsNorm { eps: eps as f32 })
    } else {
        composed(x, w, eps)
    }
}

/// The same from differentiable candle ops.
pub fn composed(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let r = (x.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?.recip()?;
    x.broadcast_mul(&r)?.broadcast_mul(w)
}

/// The gradients of [`rms_norm`] for x and w, given dy, without autograd:
/// dx = r·(w∘dy) − x·r³·mean(x∘w∘dy), dw = Σ_rows dy∘x·r (r = 1/rms(x)).
pub fn backward(x: &Tensor, w: &Tensor, eps: f64, dy: &Tensor) -> Result<(Tensor, Tensor)> {
    let _part = crate::train::network::parts::op(crate::train::network::parts::Op::Norm);
    if own_kernel(super::Kernel::RmsNorm, &[x, w, dy]) {
        let rows = x.elem_count() / w.elem_count();
        // One pass gives both: rows 0..n are dx, row n is dw.
        let both = x.contiguous()?.apply_op3_no_bwd(
            &w.contiguous()?,
            &dy.contiguous()?,
            &RmsNormBwd { eps: eps as f32 },
        )?;
        let dx = both.narrow(0, 0, rows)?.reshape(x.shape())?;
        let dw = both.narrow(0, rows, 1)?.reshape(w.shape())?;
        return Ok((dx, dw));
    }
    let work = work_dtype(x);
    let (xs, ws, g) = (x.to_dtype(work)?, w.to_dtype(work)?, dy.to_dtype(work)?);
    let d = w.elem_count() as f64;
    let r = (xs.sqr()?.mean_keepdim(D::Minus1)? + eps)?
        .sqrt()?
        .recip()?;
    let wg = g.broadcast_mul(&ws)?;
    let dot = ((&xs * &wg)?.sum_keepdim(D::Minus1)? / d)?;
    let dx = (wg.broadcast_mul(&r)? - xs.broadcast_mul(&(r.powf(3.0)? * dot)?)?)?;
    let rows = x.elem_count() / w.elem_count();
    let dw = (g * xs.broadcast_mul(&r)?)?
        .reshape((rows, w.elem_count()))?
        .sum(0)?
        .reshape(w.shape())?;
    Ok((dx.to_dtype(x.dtype())?, dw.to_dtype(w.dtype())?))
}

struct RmsNorm {
    eps: f32,
}

impl RmsNorm {
    fn gpu<S: Store>(&self, x: &S, xl: &Layout, w: &S, wl: &Layout) -> Result<(S, Shape)> {
        let (rows, d) = rows_and_width(xl, wl)?;
        let plan = forward_plan(rows, d, x.ty()?, self.eps).map_err(candle_core::Error::Msg)?;
        let y = S::execute(&x.device(), &plan, &[x.operand(xl)?, w.operand(wl)?])?.remove(0);
        Ok((y, xl.shape().clone()))
    }
}

fn inv_rms(x: &[f32], eps: f32) -> f32 {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    1.0 / (ss / x.len() as f32 + eps).sqrt()
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "sweep-rms-norm"
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
        let (x, w) = (f32s(s1, l1)?, f32s(s2, l2)?);
        let d = w.len();
        let mut y = vec![0f32; x.len()];
        let per = rows_per_task(x.len() / d, d) * d;
        y.par_chunks_mut(per)
            .zip(x.par_chunks(per))
            .for_each(|(y, x)| {
                for (y, x) in y.chunks_exact_mut(d).zip(x.chunks_exact(d)) {
                    let r = inv_rms(x, self.eps);
                    for ((y, x), w) in y.iter_mut().zip(x).zip(w) {
                        *y = x * r * w;
                    }
                }
            });
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        x: &CudaStorage,
        xl: &Layout,
        w: &CudaStorage,
        wl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        self.gpu(x, xl, w, wl)
    }
}

struct RmsNormBwd {
    eps: f32,
}

impl RmsNormBwd {
    fn gpu<S: Store>(
        &self,
        x: &S,
        xl: &Layout,
        w: &S,
        wl: &Layout,
        dy: &S,
        dyl: &Layout,
    ) -> Result<(S, Shape)> {
        let (rows, d) = rows_and_width(xl, wl)?;
        if dyl.shape().elem_count() != rows * d {
            candle_core::bail!("RMSNorm backward: x, w and dy do not agree in shape");
        }
        let plan = backward_plan(rows, d, x.ty()?, self.eps).map_err(candle_core::Error::Msg)?;
        let operands = [x.operand(xl)?, w.operand(wl)?, dy.operand(dyl)?];
        let out = S::execute(&x.device(), &plan, &operands)?.remove(0);
        Ok((out, Shape::from((rows + 1, d))))
    }
}

impl CustomOp3 for RmsNormBwd {
    fn name(&self) -> &'static str {
        "sweep-rms-norm-bwd"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        if super::emulating() {
            return self.gpu(s1, l1, s2, l2, s3, l3);
        }
        let (x, w, dy) = (f32s(s1, l1)?, f32s(s2, l2)?, f32s(s3, l3)?);
        let d = w.len();
        let rows = x.len() / d;
        let mut out = vec![0f32; x.len() + d];
        let (dx, _) = out.split_at_mut(x.len());
        let per = rows_per_task(rows, d) * d;
        // dx = r (w dy) - x r^3 mean(w dy x); dw = sum over rows of dy x r.
        let partial_dw: Vec<Vec<f32>> = dx
            .par_chunks_mut(per)
            .zip(x.par_chunks(per).zip(dy.par_chunks(per)))
            .map(|(dx, (x, dy))| {
                let mut dw = vec![0f32; d];
                for ((dx, x), dy) in dx
                    .chunks_exact_mut(d)
                    .zip(x.chunks_exact(d))
                    .zip(dy.chunks_exact(d))
                {
                    let r = inv_rms(x, self.eps);
                    let dot: f32 = x.iter().zip(dy).zip(w).map(|((x, g), w)| x * g * w).sum();
                    let c = r * r * r * dot / d as f32;
                    for i in 0..d {
                        dx[i] = r * w[i] * dy[i] - x[i] * c;
                        dw[i] += dy[i] * x[i] * r;
                    }
                }
                dw
            })
            .collect();
        let dw = &mut out[x.len()..];
        for p in partial_dw {
            for (a, b) in dw.iter_mut().zip(p) {
                *a += b;
            }
        }
        Ok((CpuStorage::F32(out), Shape::from((rows + 1, d))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        x: &CudaStorage,
        xl: &Layout,
        w: &CudaStorage,
        wl: &Layout,
        dy: &CudaStorage,
        dyl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        self.gpu(x, xl, w, wl, dy, dyl)
    }
}

/// Rows of x and the width of w (its last dimension).
fn rows_and_width(xl: &Layout, wl: &Layout) -> Result<(usize, usize)> {
    let d = wl.shape().elem_count();
    let n = xl.shape().elem_count();
    if d == 0 || !n.is_multiple_of(d) {
        candle_core::bail!("RMSNorm: x of {n} values is no whole number of rows of {d}");
    }
    Ok((n / d, d))
}

/// The forward on a GPU: y [rows, d] (output 0) from x [rows, d] (operand
/// 0) and w `[d]` (operand 1), a warp per row.
pub fn forward_plan(
    rows: usize,
    d: usize,
    own: Ty,
    eps: f32,
) -> std::result::Result<LaunchPlan, String> {
    let mut plan = LaunchPlan::default();
    let y = plan.output(own, rows * d);
    let (rows32, d32) = (u32_of(rows, "rows")?, u32_of(d, "width")?);
    plan.launch(
        &RMS_NORM,
        "rms_norm_fwd",
        own,
        warp_per_row(rows),
        vec![
            Value::Ptr(Mem::Operand(0), 0),
            Value::Ptr(Mem::Operand(1), 0),
            Value::Ptr(y, 0),
            Value::U32(rows32),
            Value::U32(d32),
            Value::F32(eps),
        ],
    )?;
    Ok(plan)
}

/// Slabs of rows of the backward: a block each, enough to fill a large GPU
/// (132 SMs × 4 blocks) with few rows each, so that the slabs' partial dw
/// rows (slabs × d f32, summed at the end) stay small beside x and dy.
const SLABS: usize = 512;

/// The backward on a GPU: [dx; dw] as [rows + 1, d] (output 0) from x, w
/// and dy (operands 0, 1, 2). One pass over slabs of rows gives dx and each
/// slab's partial dw; a second sums the slabs' partials in order (no
/// atomics: the same bits every run).
pub fn backward_plan(
    rows: usize,
    d: usize,
    own: Ty,
    eps: f32,
) -> std::result::Result<LaunchPlan, String> {
    let mut plan = LaunchPlan::default();
    let out = plan.output(own, (rows + 1) * d);
    let slabs = SLABS.min(rows).max(1);
    let per = rows.div_ceil(slabs).max(1);
    let slabs = rows.div_ceil(per).max(1);
    let partial = plan.scratch(Ty::F32, slabs * d);
    let (rows32, d32) = (u32_of(rows, "rows")?, u32_of(d, "width")?);
    let (per32, slabs32) = (u32_of(per, "rows per slab")?, u32_of(slabs, "slabs")?);
    // Block s reads rows s·per.. of x and dy below `rows` and writes their
    // dx and partial[s].
    plan.launch(
        &RMS_NORM,
        "rms_norm_bwd",
        own,
        (slabs32, 1),
        vec![
            Value::Ptr(Mem::Operand(0), 0),
            Value::Ptr(Mem::Operand(1), 0),
            Value::Ptr(Mem::Operand(2), 0),
            Value::Ptr(out, 0),
            Value::Ptr(partial, 0),
            Value::U32(rows32),
            Value::U32(d32),
            Value::U32(per32),
            Value::F32(eps),
        ],
    )?;
    plan.launch(
        &RMS_NORM,
        "rms_norm_bwd_dw_sum",
        own,
        (column_blocks(d), 1),
        vec![
            Value::Ptr(partial, 0),
            Value::Ptr(out, rows * d),
            Value::U32(slabs32),
            Value::U32(d32),
        ],
    )?;
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::network::ops::testing::{max_diff, rand};
    use candle_core::Var;

    #[test]
    fn fused_matches_composed_forward_and_gradients() -> Result<()> {
        let x = Var::from_tensor(&rand(&[3, 5, 16], 1))?;
        let w = Var::from_tensor(&(rand(&[16], 2) + 1.5)?)?;
        let dy = rand(&[3, 5, 16], 3);
        let a = rms_norm(&x, &w, 1e-5)?;
        let b = composed(&x, &w, 1e-5)?;
        assert!(max_diff(&a, &b)? < 1e-5);
        let (dx, dw) = backward(&x, &w, 1e-5, &dy)?;
        let g = (b * &dy)?.sum_all()?.backward()?;
        assert!(max_diff(&dx, g.get(&x).unwrap())? < 1e-4);
        assert!(max_diff(&dw, g.get(&w).unwrap())? < 1e-4);
        Ok(())
    }

    /// The GPU plans, run by the host emulation of CUDA (under sanitizers),
    /// equal the CPU kernels: rows that fill no whole block of warps, rows
    /// whose last pass is partial and that start off the 16-byte alignment
    /// every other row (bf16), one row, no rows, rows wider than a block
    /// holds in registers (the rest read twice), slabs of several rows; f32
    /// and bf16; and give the same bits with every operand off the 16-byte
    /// alignment.
    #[test]
    fn the_gpu_plans_equal_the_cpu_kernels_under_emulation() -> Result<()> {
        use crate::train::network::ops::testing::{
            assert_rounded, buffer, emulate, emulate_off_alignment, tensor,
        };
        for (rows, d) in [
            (5, 40),
            (7, 42),
            (17, 300),
            (1, 8),
            (0, 16),
            (3, 4200),
            (600, 24),
        ] {
            let x = (rand(&[rows, d], 7) * 2.0)?;
            let w = (rand(&[d], 8) + 1.5)?;
            let dy = rand(&[rows, d], 9);
            for (own, tol) in [(Ty::F32, 1e-5), (Ty::Bf16, 3e-2)] {
                // The twin on the values the GPU sees (bf16 rounded).
                let seen = |t: &Tensor| tensor(&buffer(t, own), t.dims());
                let (xs, ws, dys) = (seen(&x), seen(&w), seen(&dy));
                let operands = [buffer(&x, own), buffer(&w, own)];
                let Some((out, _)) = emulate(
                    &forward_plan(rows, d, own, 1e-5).unwrap(),
                    &operands,
                    own == Ty::F32 && rows == 5,
                ) else {
                    return Ok(());
                };
                let (shifted, _) =
                    emulate_off_alignment(&forward_plan(rows, d, own, 1e-5).unwrap(), &operands);
                assert_eq!(shifted, out, "forward {rows}x{d} {own:?}, shifted");
                let want = rms_norm(&xs, &ws, 1e-5)?;
                let got = tensor(&out[0], &[rows, d]);
                if rows > 0 {
                    assert!(max_diff(&got, &want)? < tol, "forward {rows}x{d} {own:?}");
                }
                assert_rounded(&out[0], &want, 1e-5, 0.0);
                let operands = [buffer(&x, own), buffer(&w, own), buffer(&dy, own)];
                let plan = backward_plan(rows, d, own, 1e-5).unwrap();
                let race = own == Ty::F32 && (rows == 5 || rows == 600);
                let (out, _) = emulate(&plan, &operands, race).unwrap();
                let (shifted, _) = emulate_off_alignment(&plan, &operands);
                assert_eq!(shifted, out, "backward {rows}x{d} {own:?}, shifted");
                let (dx, dw) = backward(&xs, &ws, 1e-5, &dys)?;
                let both = tensor(&out[0], &[rows + 1, d]);
                // Both sides round to the storage's precision; f32 sums in
                // another order, which grows with the rows summed into dw.
                let tol = match own {
                    Ty::F32 => 4e-5 * (1.0 + rows as f32).sqrt(),
                    _ => tol / 3.0,
                };
                let near = |got: &Tensor, want: &Tensor| -> Result<bool> {
                    let scale = want.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
                    Ok(max_diff(got, want)? < tol * (1.0 + scale))
                };
                if rows > 0 {
                    assert!(
                        near(&both.narrow(0, 0, rows)?, &dx)?,
                        "dx {rows}x{d} {own:?}"
                    );
                }
                let got_dw = both.narrow(0, rows, 1)?.reshape(d)?;
                assert!(near(&got_dw, &dw)?, "dw {rows}x{d} {own:?}");
            }
        }
        Ok(())
    }

    #[test]
    fn the_explicit_backward_equals_autograd_in_f64() -> Result<()> {
        use candle_core::DType;
        let x = Var::from_tensor(&rand(&[3, 5, 16], 4).to_dtype(DType::F64)?)?;
        let w = Var::from_tensor(&(rand(&[16], 5) + 1.5)?.to_dtype(DType::F64)?)?;
        let dy = rand(&[3, 5, 16], 6).to_dtype(DType::F64)?;
        let g = (composed(&x, &w, 1e-5)? * &dy)?.sum_all()?.backward()?;
        let (dx, dw) = backward(&x, &w, 1e-5, &dy)?;
        let rel = |a: &Tensor, b: &Tensor| -> Result<f64> {
            let d = (a - b)?.abs()?.max_all()?.to_scalar::<f64>()?;
            Ok(d / b.abs()?.max_all()?.to_scalar::<f64>()?)
        };
        assert!(rel(&dx, g.get(&x).unwrap())? < 1e-12);
        assert!(rel(&dw, g.get(&w).unwrap())? < 1e-12);
        Ok(())
    }
}
