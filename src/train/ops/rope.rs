//! Rotary position embeddings (half-split pairs: i with i + head_dim/2),
//! fused with the move from [B, T, H, Q] (projection layout) to [B, H, T, Q]
//! (attention layout), which saves a copy each way.

use super::{f32s, fused};
use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Result, Shape, Tensor};
use rayon::prelude::*;
use std::sync::Arc;

/// cos and sin of position x frequency, [max_len, head_dim / 2].
#[derive(Clone)]
pub struct RopeTables {
    cos: Tensor,
    sin: Tensor,
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
                let freq = 1.0 / theta.powf(2.0 * i as f64 / head_dim as f64);
                let a = t as f64 * freq;
                cos_v.push(a.cos() as f32);
                sin_v.push(a.sin() as f32);
            }
        }
        let cos = Tensor::from_slice(&cos_v, (max_len, half), device)?.to_dtype(dtype)?;
        let sin = Tensor::from_slice(&sin_v, (max_len, half), device)?.to_dtype(dtype)?;
        Ok(RopeTables {
            cos,
            sin,
            cos_v: Arc::new(cos_v),
            sin_v: Arc::new(sin_v),
            half,
        })
    }
}

/// [B, T, H, Q] -> [B, H, T, Q], rotated when `tables` is given (q and k; v
/// only moves).
pub fn heads_first(x: &Tensor, tables: Option<&RopeTables>) -> Result<Tensor> {
    if fused(x) {
        x.contiguous()?.apply_op1(Rope {
            tables: tables.cloned(),
            forward: true,
        })
    } else {
        composed(x, tables)
    }
}

/// The gradient of [`heads_first`], without autograd: dy [B, H, T, Q] back to
/// [B, T, H, Q], rotated by −angle.
pub fn backward(dy: &Tensor, tables: Option<&RopeTables>) -> Result<Tensor> {
    if fused(dy) {
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
    let cos = r.cos.narrow(0, 0, t)?.reshape((1, 1, t, half))?;
    let sin = r.sin.narrow(0, 0, t)?.reshape((1, 1, t, half))?;
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
        let x = f32s(s, l)?;
        let (d0, d1, d2, q) = l.shape().dims4()?;
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

    fn bwd(&self, _x: &Tensor, _y: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(backward(dy, self.tables.as_ref())?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::ops::testing::{max_diff, rand};
    use candle_core::Var;

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
            let ga = (a * &dy)?.sum_all()?.backward()?;
            let gb = (b * &dy)?.sum_all()?.backward()?;
            assert!(max_diff(ga.get(&x).unwrap(), gb.get(&x).unwrap())? < 1e-6);
        }
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
