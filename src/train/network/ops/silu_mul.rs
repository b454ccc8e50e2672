//! The SwiGLU gate: silu(a) * b, in one pass each way. CUDA kernels:
//! `src/train/network/kernels/silu_mul.cu`.

use super::store::{Span, Store};
use super::{f32s, own_kernel, work_dtype};
use crate::train::network::kernels::{grid_stride, LaunchPlan, Mem, Ty, Value, SILU_MUL};
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

pub fn silu_mul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let _part = crate::train::network::parts::op(crate::train::network::parts::Op::SwiGlu);
    if own_kernel(super::Kernel::SiluMul, &[a, b]) {
        a.contiguous()?.apply_op2(&b.contiguous()?, SiluMul)
    } else {
        composed(a, b)
    }
}

pub fn composed(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    a.silu()? * b
}

/// The gradients of [`silu_mul`] for a and b, given dy, without autograd:
/// da = dy·b·σ(a)·(1 + a·(1 − σ(a))), db = dy·a·σ(a).
pub fn backward(a: &Tensor, b: &Tensor, dy: &Tensor) -> Result<(Tensor, Tensor)> {
    let _part = crate::train::network::parts::op(crate::train::network::parts::Op::SwiGlu);
    if own_kernel(super::Kernel::SiluMul, &[a, b, dy]) {
        let n = a.elem_count();
        // One pass gives both: [da; db].
        let both =
            a.contiguous()?
                .apply_op3_no_bwd(&b.contiguous()?, &dy.contiguous()?, &SiluMulBwd)?;
        let da = both.narrow(0, 0, n)?.reshape(a.shape())?;
        let db = both.narrow(0, n, n)?.reshape(b.shape())?;
        return Ok((da, db));
    }
    let work = work_dtype(a);
    let (x, y, g) = (a.to_dtype(work)?, b.to_dtype(work)?, dy.to_dtype(work)?);
    let s = candle_nn::ops::sigmoid(&x)?;
    let one_minus = s.affine(-1.0, 1.0)?;
    let ds = ((&x * one_minus)? + 1.0)?;
    let da = (((&g * &y)? * &s)? * ds)?;
    let db = (g * (&x * &s)?)?;
    Ok((da.to_dtype(a.dtype())?, db.to_dtype(b.dtype())?))
}

struct SiluMul;

const CHUNK: usize = 8192;

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + super::exp::exp(-x))
}

impl CustomOp2 for SiluMul {
    fn name(&self) -> &'static str {
        "sweep-silu-mul"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        if super::emulating() {
            return Ok((run_gpu(s1, l1, s2, l2, None)?, l1.shape().clone()));
        }
        let (a, b) = (f32s(s1, l1)?, f32s(s2, l2)?);
        let mut y = vec![0f32; a.len()];
        y.par_chunks_mut(CHUNK)
            .zip(a.par_chunks(CHUNK).zip(b.par_chunks(CHUNK)))
            .for_each(|(y, (a, b))| {
                for ((y, &a), &b) in y.iter_mut().zip(a).zip(b) {
                    *y = a * sigmoid(a) * b;
                }
            });
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        a: &CudaStorage,
        al: &Layout,
        b: &CudaStorage,
        bl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let y = run_gpu(a, al, b, bl, None)?;
        Ok((y, al.shape().clone()))
    }
}

struct SiluMulBwd;

impl CustomOp3 for SiluMulBwd {
    fn name(&self) -> &'static str {
        "sweep-silu-mul-bwd"
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
            let n = l1.shape().elem_count();
            return Ok((run_gpu(s1, l1, s2, l2, Some((s3, l3)))?, Shape::from(2 * n)));
        }
        let (a, b, dy) = (f32s(s1, l1)?, f32s(s2, l2)?, f32s(s3, l3)?);
        let n = a.len();
        let mut out = vec![0f32; 2 * n];
        let (da, db) = out.split_at_mut(n);
        da.par_chunks_mut(CHUNK)
            .zip(db.par_chunks_mut(CHUNK))
            .zip(
                a.par_chunks(CHUNK)
                    .zip(b.par_chunks(CHUNK))
                    .zip(dy.par_chunks(CHUNK)),
            )
            .for_each(|((da, db), ((a, b), dy))| {
                for i in 0..a.len() {
                    let s = sigmoid(a[i]);
                    let silu = a[i] * s;
                    // d silu / da = s (1 + a (1 - s))
                    da[i] = dy[i] * b[i] * s * (1.0 + a[i] * (1.0 - s));
                    db[i] = dy[i] * silu;
                }
            });
        Ok((CpuStorage::F32(out), Shape::from(2 * n)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        a: &CudaStorage,
        al: &Layout,
        b: &CudaStorage,
        bl: &Layout,
        dy: &CudaStorage,
        dyl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let n = al.shape().elem_count();
        let out = run_gpu(a, al, b, bl, Some((dy, dyl)))?;
        Ok((out, Shape::from(2 * n)))
    }
}

/// The forward (`backward` false: silu(a)·b of operands a and b) or the
/// backward ([da; db] from a, b and dy) of n values on a GPU, as output 0:
/// a grid-stride pass over the elements.
pub fn plan(n: usize, own: Ty, backward: bool) -> std::result::Result<LaunchPlan, String> {
    let mut plan = LaunchPlan::default();
    let out = plan.output(own, if backward { 2 * n } else { n });
    let mut args = vec![
        Value::Ptr(Mem::Operand(0), 0),
        Value::Ptr(Mem::Operand(1), 0),
    ];
    if backward {
        args.push(Value::Ptr(Mem::Operand(2), 0));
    }
    args.extend([Value::Ptr(out, 0), Value::U64(n as u64)]);
    let name = if backward {
        "silu_mul_bwd"
    } else {
        "silu_mul_fwd"
    };
    plan.launch(&SILU_MUL, name, own, grid_stride(n), args)?;
    Ok(plan)
}

/// [`plan`] on a GPU's storages.
fn run_gpu<S: Store>(
    a: &S,
    al: &Layout,
    b: &S,
    bl: &Layout,
    dy: Option<(&S, &Layout)>,
) -> Result<S> {
    let n = al.shape().elem_count();
    let mut operands = vec![a.operand(al)?, b.operand(bl)?];
    if let Some((dy, dyl)) = dy {
        operands.push(dy.operand(dyl)?);
    }
    if operands.iter().any(|o| o.len() != n) {
        candle_core::bail!("SwiGLU: the operands differ in size");
    }
    let plan = plan(n, a.ty()?, dy.is_some()).map_err(candle_core::Error::Msg)?;
    Ok(S::execute(&a.device(), &plan, &operands)?.remove(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::network::ops::testing::{max_diff, rand};
    use candle_core::Var;

    /// The GPU plans under the host emulation of CUDA equal the CPU
    /// kernels: a length with a tail, one value, none; f32 and bf16.
    #[test]
    fn the_gpu_plans_equal_the_cpu_kernels_under_emulation() -> Result<()> {
        use crate::train::network::ops::testing::{
            assert_rounded, buffer, emulate, emulate_off_alignment, max_diff, rand, tensor,
        };
        // 1003: the last values one each, and d b off the 16-byte alignment.
        for n in [1000, 1003, 1, 0] {
            let (a, b, dy) = ((rand(&[n], 1) * 4.0)?, rand(&[n], 2), rand(&[n], 3));
            for (own, tol) in [(Ty::F32, 1e-6), (Ty::Bf16, 2e-2)] {
                let seen = |t: &Tensor| tensor(&buffer(t, own), t.dims());
                let (xa, xb, xdy) = (seen(&a), seen(&b), seen(&dy));
                let Some((out, _)) = emulate(
                    &plan(n, own, false).unwrap(),
                    &[buffer(&a, own), buffer(&b, own)],
                    own == Ty::F32 && n == 1000,
                ) else {
                    return Ok(());
                };
                if n > 0 {
                    assert!(max_diff(&tensor(&out[0], &[n]), &silu_mul(&xa, &xb)?)? < tol);
                }
                assert_rounded(&out[0], &silu_mul(&xa, &xb)?, 1e-5, 0.0);
                let operands = [buffer(&a, own), buffer(&b, own), buffer(&dy, own)];
                let (out, _) = emulate(
                    &plan(n, own, true).unwrap(),
                    &operands,
                    own == Ty::F32 && n == 1000,
                )
                .unwrap();
                // The operands one value further in, off the 16-byte
                // alignment: the single-value path gives the same bits.
                for (backward, want) in [(false, 2), (true, 3)] {
                    let (aligned, _) =
                        emulate(&plan(n, own, backward).unwrap(), &operands[..want], false)
                            .unwrap();
                    let (got, _) =
                        emulate_off_alignment(&plan(n, own, backward).unwrap(), &operands[..want]);
                    assert_eq!(got, aligned, "{own:?} n={n} backward={backward}");
                }
                let (da, db) = backward(&xa, &xb, &xdy)?;
                assert_rounded(&out[0], &Tensor::cat(&[&da, &db], 0)?, 1e-5, 0.0);
                if n > 0 {
                    let both = tensor(&out[0], &[2 * n]);
                    assert!(
                        max_diff(&both.narrow(0, 0, n)?, &da)? < 2.0 * tol,
                        "{own:?}"
                    );
                    assert!(
                        max_diff(&both.narrow(0, n, n)?, &db)? < 2.0 * tol,
                        "{own:?}"
                    );
                }
            }
        }
        Ok(())
    }

    #[test]
    fn fused_matches_composed_forward_and_gradients() -> Result<()> {
        let a = Var::from_tensor(&(rand(&[4, 33], 1) * 3.0)?)?;
        let b = Var::from_tensor(&rand(&[4, 33], 2))?;
        let dy = rand(&[4, 33], 3);
        let x = silu_mul(&a, &b)?;
        let y = composed(&a, &b)?;
        assert!(max_diff(&x, &y)? < 1e-5);
        let (da, db) = backward(&a, &b, &dy)?;
        let g = (y * &dy)?.sum_all()?.backward()?;
        assert!(max_diff(&da, g.get(&a).unwrap())? < 1e-5);
        assert!(max_diff(&db, g.get(&b).unwrap())? < 1e-5);
        Ok(())
    }

    #[test]
    fn the_explicit_backward_equals_autograd_in_f64() -> Result<()> {
        use candle_core::DType;
        let a = Var::from_tensor(&(rand(&[4, 33], 4) * 3.0)?.to_dtype(DType::F64)?)?;
        let b = Var::from_tensor(&rand(&[4, 33], 5).to_dtype(DType::F64)?)?;
        let dy = rand(&[4, 33], 6).to_dtype(DType::F64)?;
        let g = (composed(&a, &b)? * &dy)?.sum_all()?.backward()?;
        let (da, db) = backward(&a, &b, &dy)?;
        let diff = |x: &Tensor, y: &Tensor| -> Result<f64> {
            (x - y)?.abs()?.max_all()?.to_scalar::<f64>()
        };
        assert!(diff(&da, g.get(&a).unwrap())? < 1e-14);
        assert!(diff(&db, g.get(&b).unwrap())? < 1e-14);
        Ok(())
    }
}
