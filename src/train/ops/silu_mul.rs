//! The SwiGLU gate: silu(a) * b, in one pass each way. CUDA kernels:
//! `src/train/kernels/silu_mul.cu`.

use super::check::{random, Case, Shapes};
#[cfg(feature = "cuda")]
use super::cuda::{self, by_dtype, Element};
use super::{f32s, own_kernel, work_dtype};
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

pub fn silu_mul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if own_kernel(&[a, b]) {
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
    if own_kernel(&[a, b, dy]) {
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
    1.0 / (1.0 + (-x).exp())
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
        let y = by_dtype!(cuda::dtype(a), launch_cuda(a, al, b, bl, None))?;
        Ok((y, al.shape().clone()))
    }

    // Autograd runs only in the tests (the oracle, [`crate::train::oracle`]).
    #[cfg(test)]
    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (da, db) = backward(a, b, dy)?;
        Ok((Some(da), Some(db)))
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
        let out = by_dtype!(cuda::dtype(a), launch_cuda(a, al, b, bl, Some((dy, dyl))))?;
        Ok((out, Shape::from(2 * n)))
    }
}

/// The forward (`dy` None: silu(a)·b) or the backward ([da; db]) on CUDA.
#[cfg(feature = "cuda")]
fn launch_cuda<T: Element>(
    a: &CudaStorage,
    al: &Layout,
    b: &CudaStorage,
    bl: &Layout,
    dy: Option<(&CudaStorage, &Layout)>,
) -> Result<CudaStorage> {
    let (av, bv) = (cuda::view::<T>(a, al)?, cuda::view::<T>(b, bl)?);
    let n = av.len();
    let dyv = dy.map(|(s, l)| cuda::view::<T>(s, l)).transpose()?;
    if bv.len() != n || dyv.as_ref().is_some_and(|d| d.len() != n) {
        candle_core::bail!("SwiGLU: the operands differ in size");
    }
    let dev = cuda::device(a);
    let outputs = if dyv.is_some() { 2 } else { 1 };
    let mut out = cuda::alloc::<T>(&dev, outputs * n)?;
    let n64 = n as u64;
    let name = if dyv.is_some() {
        "silu_mul_bwd"
    } else {
        "silu_mul_fwd"
    };
    let f = cuda::function(&dev, &cuda::SILU_MUL, name, T::DTYPE)?;
    let mut args = f.builder();
    args.arg(&av).arg(&bv);
    if let Some(dyv) = &dyv {
        args.arg(dyv);
    }
    args.arg(&mut out).arg(&n64);
    // SAFETY: (a, b, [dy,] out, n) is the kernel's signature; element i < n
    // of each operand, and i and n + i of out for the backward.
    unsafe { cuda::launch(&mut args, cuda::grid_stride(n), name) }?;
    drop(args);
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}

/// Its cases for `sweep bench kernels`: the feed-forward's gate, forward
/// and backward.
pub fn cases(s: &Shapes) -> anyhow::Result<Vec<Case>> {
    let (n, f) = (s.tokens(), s.cfg.ffn_hidden());
    Ok(vec![
        Case::new(
            "swiglu forward",
            format!("[{n}, {f}]"),
            3 * n * f,
            vec![random(&[n, f], 6, 4.0)?, random(&[n, f], 7, 1.0)?],
            Box::new(|t| Ok(vec![silu_mul(&t[0], &t[1])?])),
        ),
        Case::new(
            "swiglu backward",
            format!("[{n}, {f}]"),
            5 * n * f,
            vec![
                random(&[n, f], 8, 4.0)?,
                random(&[n, f], 9, 1.0)?,
                random(&[n, f], 10, 1.0)?,
            ],
            Box::new(|t| {
                let (da, db) = backward(&t[0], &t[1], &t[2])?;
                Ok(vec![da, db])
            }),
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
        let a = Var::from_tensor(&(rand(&[4, 33], 1) * 3.0)?)?;
        let b = Var::from_tensor(&rand(&[4, 33], 2))?;
        let dy = rand(&[4, 33], 3);
        let x = silu_mul(&a, &b)?;
        let y = composed(&a, &b)?;
        assert!(max_diff(&x, &y)? < 1e-5);
        let gx = (x * &dy)?.sum_all()?.backward()?;
        let gy = (y * &dy)?.sum_all()?.backward()?;
        assert!(max_diff(gx.get(&a).unwrap(), gy.get(&a).unwrap())? < 1e-5);
        assert!(max_diff(gx.get(&b).unwrap(), gy.get(&b).unwrap())? < 1e-5);
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
