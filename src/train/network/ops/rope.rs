//! Rotary position embeddings (half-split pairs: i with i + head_dim/2),
//! fused with the move from [B, T, H, Q] (projection layout) to [B, H, T, Q]
//! (attention layout), which saves a copy each way. CUDA kernel:
//! `src/train/network/kernels/rope.cu`.

use super::store::Store;
use super::{f32s, own_kernel};
use crate::train::network::kernels::{grid_stride, u32_of, LaunchPlan, Mem, Ty, Value, ROPE};
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Result, Shape, Tensor};
use rayon::prelude::*;
use std::sync::Arc;

/// cos and sin of position x frequency, [max_len, head_dim / 2].
#[derive(Clone)]
pub struct RopeTables {
    /// In the model's dtype, for the composed twin.
    cos: Tensor,
    sin: Tensor,
    /// In f32 on the model's device, for the CUDA kernel (the reference
    /// rotates in f32 whatever the model's dtype).
    cos32: Tensor,
    sin32: Tensor,
    cos_v: Arc<Vec<f32>>,
    sin_v: Arc<Vec<f32>>,
    half: usize,
}

impl RopeTables {
    pub fn new(
        theta: f64,
        head_dim: usize,
        max_len: usize,
        device: &Device,
        dtype: DType,
    ) -> Result<RopeTables> {
        let half = head_dim / 2;
        let mut cos_v = Vec::with_capacity(max_len * half);
        let mut sin_v = Vec::with_capacity(max_len * half);
        for t in 0..max_len {
            for i in 0..half {
                // libm's: the same tables on every architecture (exp.rs says why).
                let freq = 1.0 / libm::pow(theta, 2.0 * i as f64 / head_dim as f64);
                let a = t as f64 * freq;
                cos_v.push(libm::cos(a) as f32);
                sin_v.push(libm::sin(a) as f32);
            }
        }
        let cos32 = Tensor::from_slice(&cos_v, (max_len, half), device)?;
        let sin32 = Tensor::from_slice(&sin_v, (max_len, half), device)?;
        Ok(RopeTables {
            cos: cos32.to_dtype(dtype)?,
            sin: sin32.to_dtype(dtype)?,
            cos32,
            sin32,
            cos_v: Arc::new(cos_v),
            sin_v: Arc::new(sin_v),
            half,
        })
    }
}

/// [B, T, H, Q] -> [B, H, T, Q], rotated when `tables` is given (q and k; v
/// only moves).
pub fn heads_first(x: &Tensor, tables: Option<&RopeTables>) -> Result<Tensor> {
    let _part = crate::train::network::parts::op(crate::train::network::parts::Op::Rope);
    if own_kernel(super::Kernel::Rope, &[x]) {
        x.contiguous()?.apply_op1(Rope {
            tables: tables.cloned(),
            forward: true,
        })
    } else {
        composed(x, tables)
    }
}

/// x [B, H, T, Q] -> [B, T, H, Q], only moved: the layout kernel of
/// [`backward`] without tables, where candle's transposing copy is its
/// general strided one (attention's output, flash's inputs).
pub fn tokens_first(x: &Tensor) -> Result<Tensor> {
    backward(x, None)
}

/// The gradient of [`heads_first`], without autograd: dy [B, H, T, Q] back to
/// [B, T, H, Q], rotated by −angle.
pub fn backward(dy: &Tensor, tables: Option<&RopeTables>) -> Result<Tensor> {
    let _part = crate::train::network::parts::op(crate::train::network::parts::Op::Rope);
    if own_kernel(super::Kernel::Rope, &[dy]) {
        return dy.contiguous()?.apply_op1_no_bwd(&Rope {
            tables: tables.cloned(),
            forward: false,
        });
    }
    let Some(r) = tables else {
        return dy.transpose(1, 2)?.contiguous();
    };
    let (_, _, t, q) = dy.dims4()?;
    let half = q / 2;
    let cos = r
        .cos
        .narrow(0, 0, t)?
        .reshape((1, 1, t, half))?
        .to_dtype(dy.dtype())?;
    let sin = r
        .sin
        .narrow(0, 0, t)?
        .reshape((1, 1, t, half))?
        .to_dtype(dy.dtype())?;
    let (g1, g2) = (dy.narrow(3, 0, half)?, dy.narrow(3, half, half)?);
    let a = (g1.broadcast_mul(&cos)? + g2.broadcast_mul(&sin)?)?;
    let b = (g2.broadcast_mul(&cos)? - g1.broadcast_mul(&sin)?)?;
    Tensor::cat(&[a, b], 3)?.transpose(1, 2)?.contiguous()
}

pub fn composed(x: &Tensor, tables: Option<&RopeTables>) -> Result<Tensor> {
    let x = x.transpose(1, 2)?.contiguous()?;
    let Some(r) = tables else { return Ok(x) };
    let (_, _, t, q) = x.dims4()?;
    let half = q / 2;
    // The tables in x's dtype: `sweep bench kernels` builds them in f32
    // beside bf16 inputs (training builds them in the model's dtype).
    let cos = r
        .cos
        .narrow(0, 0, t)?
        .to_dtype(x.dtype())?
        .reshape((1, 1, t, half))?;
    let sin = r
        .sin
        .narrow(0, 0, t)?
        .to_dtype(x.dtype())?
        .reshape((1, 1, t, half))?;
    let x1 = x.narrow(3, 0, half)?;
    let x2 = x.narrow(3, half, half)?;
    let a = (x1.broadcast_mul(&cos)? - x2.broadcast_mul(&sin)?)?;
    let b = (x2.broadcast_mul(&cos)? + x1.broadcast_mul(&sin)?)?;
    Tensor::cat(&[a, b], 3)
}

/// `forward`: [B, T, H, Q] -> [B, H, T, Q] rotating by +angle; else the
/// gradient's way back: [B, H, T, Q] -> [B, T, H, Q] rotating by -angle.
#[derive(Clone)]
struct Rope {
    tables: Option<RopeTables>,
    forward: bool,
}

impl CustomOp1 for Rope {
    fn name(&self) -> &'static str {
        "sweep-rope"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (d0, d1, d2, q) = l.shape().dims4()?;
        if super::emulating() {
            return Ok((rope_gpu(self, s, l)?, Shape::from((d0, d2, d1, q))));
        }
        let x = f32s(s, l)?;
        // forward: (b, t, h) in; backward: (b, h, t) in. Output swaps dims 1 and 2.
        let (b, t_dim, h_dim) = if self.forward {
            (d0, d1, d2)
        } else {
            (d0, d2, d1)
        };
        let mut y = vec![0f32; x.len()];
        let sign = if self.forward { 1.0 } else { -1.0 };
        let half = q / 2;
        // Each task writes one output row block [d2 of output rows]: out dims (b, d2, d1, q).
        y.par_chunks_mut(d1 * q)
            .enumerate()
            .for_each(|(block, out)| {
                let (bi, j) = (block / d2, block % d2);
                for i in 0..d1 {
                    let src = &x[((bi * d1 + i) * d2 + j) * q..][..q];
                    let dst = &mut out[i * q..(i + 1) * q];
                    let t = if self.forward { i } else { j };
                    match &self.tables {
                        None => dst.copy_from_slice(src),
                        Some(r) => {
                            let (c, s) = (
                                &r.cos_v[t * r.half..][..half],
                                &r.sin_v[t * r.half..][..half],
                            );
                            for k in 0..half {
                                let (x1, x2) = (src[k], src[k + half]);
                                dst[k] = x1 * c[k] - sign * x2 * s[k];
                                dst[k + half] = x2 * c[k] + sign * x1 * s[k];
                            }
                        }
                    }
                }
            });
        let _ = (b, t_dim, h_dim);
        Ok((CpuStorage::F32(y), Shape::from((d0, d2, d1, q))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, x: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
        let (d0, d1, d2, q) = l.shape().dims4()?;
        let y = rope_gpu(self, x, l)?;
        Ok((y, Shape::from((d0, d2, d1, q))))
    }
}

/// `Rope` on a GPU: x [d0, d1, d2, q] (operand 0) to [d0, d2, d1, q]
/// (output 0), rotated with the f32 tables cos and sin [positions, q/2]
/// (operands 1 and 2) when `rotate` (without, the kernel reads none: a
/// one-value stand-in): a thread per 16 bytes' worth of output pairs where
/// they line up (`rope.cu`), per pair elsewhere.
pub fn plan(
    (d0, d1, d2, q): (usize, usize, usize, usize),
    own: Ty,
    forward: bool,
    rotate: bool,
) -> std::result::Result<LaunchPlan, String> {
    let mut plan = LaunchPlan::default();
    let n = d0 * d1 * d2 * q;
    let y = plan.output(own, n);
    let (cos, sin) = match rotate {
        true => (Mem::Operand(1), Mem::Operand(2)),
        false => {
            let none = plan.scratch(Ty::F32, 1);
            (none, none)
        }
    };
    let sign: f32 = if forward { 1.0 } else { -1.0 };
    plan.launch(
        &ROPE,
        "rope",
        own,
        grid_stride(n / 2),
        vec![
            Value::Ptr(Mem::Operand(0), 0),
            Value::Ptr(y, 0),
            Value::Ptr(cos, 0),
            Value::Ptr(sin, 0),
            Value::U32(u32_of(d0, "batch")?),
            Value::U32(u32_of(d1, "dim 1")?),
            Value::U32(u32_of(d2, "dim 2")?),
            Value::U32(u32_of(q, "head size")?),
            Value::F32(sign),
            Value::U32(u32::from(rotate)),
            Value::U32(u32::from(forward)),
        ],
    )?;
    Ok(plan)
}

/// [`plan`] on a GPU's storages, its tables checked to cover the positions.
fn rope_gpu<S: Store>(op: &Rope, x: &S, l: &Layout) -> Result<S> {
    let (d0, d1, d2, q) = l.shape().dims4()?;
    // The positions run along dim 1 going forward, dim 2 coming back.
    let positions = if op.forward { d1 } else { d2 };
    if let Some(r) = &op.tables {
        if r.half * 2 != q || r.cos_v.len() < positions * r.half {
            candle_core::bail!(
                "RoPE: tables for {} positions of head size {} do not fit {positions} positions of size {q}",
                r.cos_v.len() / r.half.max(1),
                2 * r.half
            );
        }
    }
    let plan = plan((d0, d1, d2, q), x.ty()?, op.forward, op.tables.is_some())
        .map_err(candle_core::Error::Msg)?;
    let tables = op
        .tables
        .as_ref()
        .map(|r| (r.cos32.storage_and_layout(), r.sin32.storage_and_layout()));
    let mut operands = vec![x.operand(l)?];
    if let Some(((c, cl), (s, sl))) = &tables {
        operands.push(S::held(c, "the RoPE tables")?.operand(cl)?);
        operands.push(S::held(s, "the RoPE tables")?.operand(sl)?);
    }
    Ok(S::execute(&x.device(), &plan, &operands)?.remove(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::network::ops::testing::{max_diff, rand};
    use candle_core::Var;

    /// The GPU plan under the host emulation of CUDA equals the CPU kernel:
    /// forward and back, with tables and without (v only moves); f32 and
    /// bf16; heads whose halves are 16-byte groups in both dtypes (16), in
    /// f32 alone (8) and in neither (12); and gives the same bits with every
    /// operand off the 16-byte alignment.
    #[test]
    fn the_gpu_plan_equals_the_cpu_kernel_under_emulation() -> Result<()> {
        for q in [8, 16, 12] {
            emulated_against_the_cpu(q)?;
        }
        Ok(())
    }

    fn emulated_against_the_cpu(q: usize) -> Result<()> {
        use crate::train::network::kernels::emulator::Buffer;
        use crate::train::network::ops::testing::{
            assert_rounded, buffer, emulate, emulate_off_alignment, tensor,
        };
        let (b, t, h) = (2, 7, 3);
        let r = RopeTables::new(10_000.0, q, 16, &Device::Cpu, DType::F32)?;
        let (cos, sin) = (Buffer::f32(&r.cos_v), Buffer::f32(&r.sin_v));
        for forward in [true, false] {
            let dims = if forward { (b, t, h, q) } else { (b, h, t, q) };
            let x = rand(&[dims.0, dims.1, dims.2, dims.3], 9);
            for rotate in [true, false] {
                for (own, tol) in [(Ty::F32, 1e-6), (Ty::Bf16, 1e-2)] {
                    let seen = tensor(&buffer(&x, own), x.dims());
                    let tables = rotate.then_some(&r);
                    let want = match forward {
                        true => heads_first(&seen, tables)?,
                        false => super::backward(&seen, tables)?,
                    };
                    let mut operands = vec![buffer(&x, own)];
                    if rotate {
                        operands.extend([cos.clone(), sin.clone()]);
                    }
                    let launches = plan(dims, own, forward, rotate).unwrap();
                    let race = own == Ty::F32 && forward && rotate && q == 8;
                    let Some((out, _)) = emulate(&launches, &operands, race) else {
                        return Ok(());
                    };
                    let got = tensor(&out[0], want.dims());
                    let case = format!("q {q} forward {forward} rotate {rotate} {own:?}");
                    assert!(max_diff(&got, &want)? < tol, "{case}");
                    assert_rounded(&out[0], &want, 1e-5, 0.0);
                    let (shifted, _) = emulate_off_alignment(&launches, &operands);
                    assert_eq!(shifted, out, "{case}, shifted");
                }
            }
        }
        Ok(())
    }

    #[test]
    fn fused_matches_composed_forward_and_gradients() -> Result<()> {
        let r = RopeTables::new(10_000.0, 8, 16, &Device::Cpu, DType::F32)?;
        let x = Var::from_tensor(&rand(&[2, 5, 3, 8], 1))?;
        let dy = rand(&[2, 3, 5, 8], 2);
        for tables in [Some(&r), None] {
            let a = heads_first(&x, tables)?;
            let b = composed(&x, tables)?;
            assert_eq!(a.dims(), &[2, 3, 5, 8]);
            assert!(max_diff(&a, &b)? < 1e-6);
            let g = (b * &dy)?.sum_all()?.backward()?;
            assert!(max_diff(&backward(&dy, tables)?, g.get(&x).unwrap())? < 1e-6);
        }
        Ok(())
    }

    /// Tables in f32 beside a bf16 input, as `sweep bench kernels` builds
    /// them (the composed path stopped its GPU run at the first RoPE case).
    #[test]
    fn f32_tables_rotate_a_bf16_input() -> Result<()> {
        let r = RopeTables::new(10_000.0, 8, 16, &Device::Cpu, DType::F32)?;
        let x = rand(&[2, 5, 3, 8], 7);
        let want = composed(&x, Some(&r))?;
        let got = composed(&x.to_dtype(DType::BF16)?, Some(&r))?;
        assert_eq!(got.dtype(), DType::BF16);
        assert!(max_diff(&got.to_dtype(DType::F32)?, &want)? < 2e-2);
        Ok(())
    }

    #[test]
    fn the_explicit_backward_equals_autograd_in_f64() -> Result<()> {
        let r = RopeTables::new(10_000.0, 8, 16, &Device::Cpu, DType::F64)?;
        let x = Var::from_tensor(&rand(&[2, 5, 3, 8], 4).to_dtype(DType::F64)?)?;
        let dy = rand(&[2, 3, 5, 8], 5).to_dtype(DType::F64)?;
        for tables in [Some(&r), None] {
            let g = (composed(&x, tables)? * &dy)?.sum_all()?.backward()?;
            let dx = backward(&dy, tables)?;
            let diff = (dx - g.get(&x).unwrap())?
                .abs()?
                .max_all()?
                .to_scalar::<f64>()?;
            assert!(diff < 1e-14, "{diff}");
        }
        Ok(())
    }

    #[test]
    fn position_zero_is_not_rotated() -> Result<()> {
        let r = RopeTables::new(10_000.0, 4, 4, &Device::Cpu, DType::F32)?;
        let x = rand(&[1, 2, 1, 4], 3);
        let y = heads_first(&x, Some(&r))?;
        assert!(
            max_diff(
                &y.narrow(2, 0, 1)?.flatten_all()?,
                &x.narrow(1, 0, 1)?.flatten_all()?
            )? < 1e-7
        );
        Ok(())
    }
}
