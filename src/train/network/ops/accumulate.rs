//! Gradient buffers that live as long as the trainer, written in place:
//! `buf = 0` and `buf += g` here; a weight's gradient `buf += dyᵀ·x` is the
//! linear layer's ([`super::linear::add_product`]) and an embedding's rows
//! the embedding's ([`super::embedding::add_rows`]). On the CPU in f32 the
//! sums are written into the buffer, on a GPU by cuBLAS's `axpy` (f32
//! arithmetic; candle's add of two bf16 [16384, 2048] tensors moved 1.3 TB/s
//! on an H100, and made a new tensor); elsewhere (other dtypes) the sum is a
//! new tensor that replaces the buffer. The block's residual sums take the
//! same path, into a tensor the pass has just made.
//!
//! Allocating nothing that outlives a pass matters beyond the copies saved:
//! gradients created block by block during the backward pass, between its
//! transients, fragmented the heap (the CPU trainer's resident memory grew
//! ~75 MB a block under recomputation).

use candle_core::{bail, CpuStorage, InplaceOp1, InplaceOp2, Layout, Result, Tensor};
use rayon::prelude::*;

/// buf = 0.
pub fn zero(buf: &mut Tensor) -> Result<()> {
    if super::in_place(buf, &[]) {
        return buf.inplace_op1(&Zero);
    }
    *buf = buf.zeros_like()?;
    Ok(())
}

/// buf += g (same shape).
pub fn add(buf: &mut Tensor, g: &Tensor) -> Result<()> {
    if buf.shape() != g.shape() {
        bail!(
            "adding a {:?} gradient into a {:?} buffer",
            g.shape(),
            buf.shape()
        );
    }
    let own = super::own_kernel(super::Kernel::Accumulate, &[buf, g]);
    if own && super::in_place(buf, &[g]) {
        return buf.inplace_op2(&g.contiguous()?, &Add);
    }
    if own
        && super::gpu_path(buf.device())
        && buf.is_contiguous()
        && i32::try_from(g.elem_count()).is_ok()
    {
        return buf.inplace_op2(&g.contiguous()?, &Axpy);
    }
    *buf = (&*buf + g.to_dtype(buf.dtype())?)?;
    Ok(())
}

/// a + b, written into a's storage where [`add`] sums in place: for an `a`
/// the caller has just made and holds alone (a residual branch's output),
/// which is consumed.
pub fn sum(a: Tensor, b: &Tensor) -> Result<Tensor> {
    let mut a = a;
    add(&mut a, b)?;
    Ok(a)
}

struct Zero;

impl InplaceOp1 for Zero {
    fn name(&self) -> &'static str {
        "sweep-zero"
    }

    fn cpu_fwd(&self, s: &mut CpuStorage, l: &Layout) -> Result<()> {
        let CpuStorage::F32(v) = s else {
            bail!("expected f32 data")
        };
        // A buffer may be a view into a larger storage (an all-reduced bucket).
        let (start, end) = l
            .contiguous_offsets()
            .ok_or_else(|| candle_core::Error::Msg("expected contiguous data".into()))?;
        v[start..end]
            .par_chunks_mut(1 << 16)
            .for_each(|c| c.fill(0.0));
        Ok(())
    }
}

struct Add;

impl InplaceOp2 for Add {
    fn name(&self) -> &'static str {
        "sweep-add-into"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<()> {
        let g = super::f32s(s2, l2)?;
        let CpuStorage::F32(buf) = s1 else {
            bail!("expected f32 data")
        };
        let buf = &mut buf[l1.start_offset()..l1.start_offset() + g.len()];
        buf.par_chunks_mut(1 << 16)
            .zip(g.par_chunks(1 << 16))
            .for_each(|(b, g)| b.iter_mut().zip(g).for_each(|(b, g)| *b += g));
        Ok(())
    }
}

/// buf += g on a GPU: cuBLAS's `axpy` ([`on_gpu`]); on the emulated device
/// a host reference of the same call (f32 arithmetic, one rounding).
struct Axpy;

impl InplaceOp2 for Axpy {
    fn name(&self) -> &'static str {
        "sweep-add-into-cublas"
    }

    fn cpu_fwd(
        &self,
        buf: &mut CpuStorage,
        bl: &Layout,
        g: &CpuStorage,
        gl: &Layout,
    ) -> Result<()> {
        let n = gl.shape().elem_count();
        let (Some((b0, b1)), Some((g0, g1))) = (bl.contiguous_offsets(), gl.contiguous_offsets())
        else {
            bail!("cuBLAS axpy takes contiguous tensors")
        };
        if !super::emulating() || b1 - b0 != n || g1 - g0 != n {
            bail!("cuBLAS axpy: {n} values into {:?} on a GPU", bl.shape());
        }
        match (buf, g) {
            (CpuStorage::F32(b), CpuStorage::F32(g)) => b[b0..b1]
                .iter_mut()
                .zip(&g[g0..g1])
                .for_each(|(b, g)| *b += g),
            (CpuStorage::BF16(b), CpuStorage::BF16(g)) => {
                for (b, g) in b[b0..b1].iter_mut().zip(&g[g0..g1]) {
                    *b = half::bf16::from_f32(b.to_f32() + g.to_f32());
                }
            }
            _ => bail!("cuBLAS axpy adds f32 into f32 or bf16 into bf16"),
        }
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        buf: &mut candle_core::CudaStorage,
        bl: &Layout,
        g: &candle_core::CudaStorage,
        gl: &Layout,
    ) -> Result<()> {
        on_gpu::run(buf, bl, g, gl)
    }
}

/// buf += g on CUDA: cuBLAS's `cublasAxpyEx` (alpha 1 in f32, f32
/// arithmetic, bf16 or f32 storage), on candle's stream.
#[cfg(feature = "cuda")]
mod on_gpu {
    use crate::train::network::ops::cuda;
    use candle_core::cuda::cudarc::cublas::sys;
    use candle_core::cuda::cudarc::driver::{DevicePtr, DevicePtrMut};
    use candle_core::cuda::CudaDType;
    use candle_core::{bail, CudaStorage, DType, Layout, Result};

    fn axpy<T: CudaDType>(
        buf: &mut CudaStorage,
        bl: &Layout,
        g: &CudaStorage,
        gl: &Layout,
        ty: sys::cudaDataType,
    ) -> Result<()> {
        let n = gl.shape().elem_count();
        let dev = cuda::device(buf);
        let stream = dev.cuda_stream();
        let blas = dev.cublas_handle();
        let gv = cuda::view::<T>(g, gl)?;
        let mut bv = cuda::view_mut::<T>(buf, bl)?;
        if bl.shape().elem_count() != n || gv.len() < n || bv.len() < n {
            bail!("cuBLAS axpy: {n} values into {:?}", bl.shape());
        }
        let count = i32::try_from(n)
            .map_err(|_| candle_core::Error::Msg(format!("{n} values for one cuBLAS axpy")))?;
        let (g_ptr, _g) = gv.device_ptr(&stream);
        let (b_ptr, _b) = bv.device_ptr_mut(&stream);
        let one = 1.0f32;
        // SAFETY: both views hold the n values the call reads and writes
        // (checked above) and outlive it on their stream; alpha is an f32
        // host value, as the f32 execution type takes it.
        unsafe {
            sys::cublasAxpyEx(
                *blas.handle(),
                count,
                (&one as *const f32).cast(),
                sys::cudaDataType::CUDA_R_32F,
                g_ptr as *const _,
                ty,
                1,
                b_ptr as *mut _,
                ty,
                1,
                sys::cudaDataType::CUDA_R_32F,
            )
        }
        .result()
        .map_err(|e| cuda::typed(e, format!("cuBLAS axpy of {n} values")))
    }

    pub fn run(buf: &mut CudaStorage, bl: &Layout, g: &CudaStorage, gl: &Layout) -> Result<()> {
        match (cuda::dtype(buf), cuda::dtype(g)) {
            (DType::F32, DType::F32) => axpy::<f32>(buf, bl, g, gl, sys::cudaDataType::CUDA_R_32F),
            (DType::BF16, DType::BF16) => {
                axpy::<half::bf16>(buf, bl, g, gl, sys::cudaDataType::CUDA_R_16BF)
            }
            (b, g) => bail!("cuBLAS axpy of {g:?} into {b:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::network::ops::testing::{max_diff, rand};

    #[test]
    fn buffers_add_and_zero_in_place() -> Result<()> {
        let mut buf = rand(&[9, 13], 3);
        let alias = buf.clone();
        let g = rand(&[9, 13], 5);
        let want = (&buf + &g)?;
        add(&mut buf, &g)?;
        assert!(max_diff(&buf, &want)? < 1e-7);
        assert!(max_diff(&alias, &want)? < 1e-7, "not in place");
        assert!(add(&mut buf, &rand(&[13, 9], 6)).is_err());
        zero(&mut buf)?;
        assert_eq!(alias.abs()?.max_all()?.to_scalar::<f32>()?, 0.0);
        // A residual sum lands in its first term's storage, bit for bit candle's.
        let (a, b) = (rand(&[7, 5], 7), rand(&[7, 5], 8));
        let (want, alias) = ((&a + &b)?, a.clone());
        let got = sum(a, &b)?;
        assert_eq!(max_diff(&got, &want)?, 0.0);
        assert_eq!(max_diff(&alias, &want)?, 0.0, "not in place");
        // Composed (a self-check's twin): a new tensor, the same values.
        let got = crate::train::network::ops::composed_here(|| sum(b.clone(), &want))?;
        assert_eq!(max_diff(&got, &(&b + &want)?)?, 0.0);
        assert_ne!(max_diff(&b, &got)?, 0.0, "the twin adds into a new tensor");
        Ok(())
    }
}
