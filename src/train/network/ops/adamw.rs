//! One AdamW update of one parameter: param −= lr · (m̂ / (√v̂ + eps) + wd ·
//! param), the moments updated in the same pass and the gradient scaled by
//! the clip scale first ([`super::grad_norm`]); the optimizer around it is
//! [`crate::train::network::optim`]. [`host`] is the CPU kernel (one pass);
//! `device` (`kernels/adamw.cu`) reads and writes each element once, the
//! clip scale from device memory, in f32 arithmetic whatever the storage
//! (composed, the update took ~14 passes: 13–23% of an 8B-shaped step on an
//! H100); [`composed`] is the reference on every other device and dtype.

use super::{own_kernel, Kernel};
use crate::train::network::kernels::{grid_stride, LaunchPlan, Mem, Ty, Value, ADAMW};
use candle_core::{CpuStorage, InplaceOp2, Layout, Result, Tensor, Var};
use std::cell::RefCell;

pub use gpu_update::Update;

/// The constants of one update.
#[derive(Debug, Clone, Copy)]
pub struct Hyper {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    /// The bias corrections 1 − β₁ᵗ and 1 − β₂ᵗ.
    pub bc1: f64,
    pub bc2: f64,
    pub eps: f64,
    /// Weight decay (0 for the parameters without it).
    pub wd: f64,
}

/// The CPU kernel: `p` contiguous f32 on the CPU, `m` and `v` its moments,
/// the gradient multiplied by `scale`.
pub fn host(
    p: &Tensor,
    g: &Tensor,
    m: &mut Vec<f32>,
    v: &mut Vec<f32>,
    h: &Hyper,
    scale: f64,
) -> Result<()> {
    let op = HostUpdate {
        m: RefCell::new(m),
        v: RefCell::new(v),
        lr: h.lr as f32,
        scale: scale as f32,
        b1: h.beta1 as f32,
        b2: h.beta2 as f32,
        bc1: h.bc1 as f32,
        bc2: h.bc2 as f32,
        eps: h.eps as f32,
        wd: h.wd as f32,
    };
    p.inplace_op2(&g.contiguous()?, &op)
}

/// The update composed from candle ops (any device and dtype): the moments
/// replaced, the variable set.
pub fn composed(
    var: &Var,
    g: &Tensor,
    m: &mut Tensor,
    v: &mut Tensor,
    h: &Hyper,
    scale: f64,
) -> Result<()> {
    let g = (g * scale)?;
    *m = ((&*m * h.beta1)? + (&g * (1.0 - h.beta1))?)?;
    *v = ((&*v * h.beta2)? + (g.sqr()? * (1.0 - h.beta2))?)?;
    let update = ((&*m / h.bc1)? / ((&*v / h.bc2)?.sqrt()? + h.eps)?)?;
    let p = var.as_tensor();
    let next = ((p * (1.0 - h.lr * h.wd))? - (update * h.lr)?)?;
    var.set(&next)
}

/// The CUDA kernel, where it applies ([`Update::applies`]): `clip` is
/// [norm, scale] in f32 on the device.
pub fn device(
    p: &Tensor,
    g: &Tensor,
    m: &Tensor,
    v: &Tensor,
    h: &Hyper,
    clip: Tensor,
) -> Result<()> {
    let op = Update {
        m: m.clone(),
        v: v.clone(),
        clip,
        hyper: [h.lr, h.beta1, h.beta2, h.bc1, h.bc2, h.eps, h.wd].map(|x| x as f32),
    };
    p.inplace_op2(g, &op)
}

/// The update on a GPU: the parameter, its gradient and its moments m and
/// v (operands 0–3, of storage type `own`; the parameter and the moments
/// written in place) and [norm, scale] (operand 4, f32) for n values, a
/// grid-stride pass; `hyper` is lr, beta1, beta2, the bias corrections 1
/// and 2, eps, weight decay. A NaN scale leaves everything as it is.
pub fn plan(n: usize, own: Ty, hyper: [f32; 7]) -> std::result::Result<LaunchPlan, String> {
    let mut plan = LaunchPlan::default();
    let mut args = vec![
        Value::Ptr(Mem::Operand(0), 0),
        Value::Ptr(Mem::Operand(1), 0),
        Value::Ptr(Mem::Operand(2), 0),
        Value::Ptr(Mem::Operand(3), 0),
        Value::Ptr(Mem::Operand(4), 0),
        Value::U64(n as u64),
    ];
    args.extend(hyper.map(Value::F32));
    plan.launch(&ADAMW, "adamw", own, grid_stride(n), args)?;
    Ok(plan)
}

/// One update of the case's parameter `t[0]` by its gradient `t[1]`, from the
/// moments `t[2]` and `|t[3]|`, as the optimizer makes it: the kernel where
/// [`own_kernel`] says so, else the twin; a NaN scale skips the update.
pub(super) fn update_case(t: &[Tensor], scale: f32) -> Result<Vec<Tensor>> {
    let h = Hyper {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.95,
        bc1: 1.0 - 0.9f64.powi(3),
        bc2: 1.0 - 0.95f64.powi(3),
        eps: 1e-8,
        wd: 0.1,
    };
    let (p, g) = (&t[0], &t[1]);
    let (m, v) = (t[2].copy()?, t[3].abs()?);
    let own = own_kernel(Kernel::AdamW, &[p, g, &m, &v]);
    if own && !super::gpu_path(p.device()) {
        if scale.is_nan() {
            return Ok(vec![p.clone(), m, v]);
        }
        let mut mv = m.flatten_all()?.to_vec1::<f32>()?;
        let mut vv = v.flatten_all()?.to_vec1::<f32>()?;
        host(p, g, &mut mv, &mut vv, &h, scale as f64)?;
        let back = |x: Vec<f32>| Tensor::from_vec(x, p.shape(), p.device());
        return Ok(vec![p.clone(), back(mv)?, back(vv)?]);
    }
    if own {
        let clip = Tensor::new(&[1.0f32, scale], p.device())?;
        device(p, g, &m, &v, &h, clip)?;
        return Ok(vec![p.clone(), m, v]);
    }
    if scale.is_nan() {
        return Ok(vec![p.clone(), m, v]);
    }
    let var = Var::from_tensor(p)?;
    let (mut m, mut v) = (m, v);
    composed(&var, g, &mut m, &mut v, &h, scale as f64)?;
    Ok(vec![var.as_tensor().clone(), m, v])
}

/// param -= lr * (m̂ / (sqrt(v̂) + eps) + wd * param), with m and v updated in the same pass.
struct HostUpdate<'a> {
    m: RefCell<&'a mut Vec<f32>>,
    v: RefCell<&'a mut Vec<f32>>,
    lr: f32,
    scale: f32,
    b1: f32,
    b2: f32,
    bc1: f32,
    bc2: f32,
    eps: f32,
    wd: f32,
}

impl InplaceOp2 for HostUpdate<'_> {
    fn name(&self) -> &'static str {
        "sweep-adamw"
    }

    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        dst_l: &Layout,
        src: &CpuStorage,
        src_l: &Layout,
    ) -> candle_core::Result<()> {
        let CpuStorage::F32(p) = dst else {
            candle_core::bail!("adamw: parameters must be f32")
        };
        let Some((a, b)) = dst_l.contiguous_offsets() else {
            candle_core::bail!("adamw: parameters must be contiguous")
        };
        let p = &mut p[a..b];
        let g = super::f32s(src, src_l)?;
        let (mut m, mut v) = (self.m.borrow_mut(), self.v.borrow_mut());
        for i in 0..p.len() {
            let gi = g[i] * self.scale;
            m[i] = self.b1 * m[i] + (1.0 - self.b1) * gi;
            v[i] = self.b2 * v[i] + (1.0 - self.b2) * gi * gi;
            let update = (m[i] / self.bc1) / ((v[i] / self.bc2).sqrt() + self.eps);
            p[i] -= self.lr * (update + self.wd * p[i]);
        }
        Ok(())
    }
}

mod gpu_update {
    use super::super::store::{Span, Store};
    #[cfg(feature = "cuda")]
    use candle_core::CudaStorage;
    use candle_core::{CpuStorage, DType, InplaceOp2, Layout, Result, Tensor};

    /// The update of one parameter (`self` of `inplace_op2`, with its gradient),
    /// its moments updated in place too.
    pub struct Update {
        pub m: Tensor,
        pub v: Tensor,
        /// [norm, scale] in f32 on the device ([`norm_and_scale`]): gradients
        /// are multiplied by the scale; a NaN scale leaves everything as it is.
        pub clip: Tensor,
        /// lr, beta1, beta2, bias corrections 1 and 2, eps, weight decay.
        pub hyper: [f32; 7],
    }

    impl Update {
        /// Whether the fused pass applies: CUDA, f32 or bf16, everything contiguous.
        pub fn applies(p: &Tensor, g: &Tensor, m: &Tensor, v: &Tensor) -> bool {
            crate::train::network::ops::gpu_path(p.device())
                && crate::train::network::ops::own_kernel(
                    crate::train::network::ops::Kernel::AdamW,
                    &[p, g, m, v],
                )
                && matches!(p.dtype(), DType::F32 | DType::BF16)
                && [g, m, v]
                    .iter()
                    .all(|t| t.dtype() == p.dtype() && t.is_contiguous())
                && p.is_contiguous()
        }
    }

    impl InplaceOp2 for Update {
        fn name(&self) -> &'static str {
            "sweep-adamw"
        }

        fn cpu_fwd(
            &self,
            p: &mut CpuStorage,
            pl: &Layout,
            g: &CpuStorage,
            gl: &Layout,
        ) -> Result<()> {
            if !crate::train::network::ops::emulating() {
                candle_core::bail!("the fused AdamW runs on CUDA tensors");
            }
            self.gpu(p, pl, g, gl)
        }

        #[cfg(feature = "cuda")]
        fn cuda_fwd(
            &self,
            p: &mut CudaStorage,
            pl: &Layout,
            g: &CudaStorage,
            gl: &Layout,
        ) -> Result<()> {
            self.gpu(p, pl, g, gl)
        }
    }

    impl Update {
        fn gpu<S: Store>(&self, p: &mut S, pl: &Layout, g: &S, gl: &Layout) -> Result<()> {
            let dev = p.device();
            let (c, cl) = self.clip.storage_and_layout();
            let c = S::held(&c, "the clip scale")?;
            if cl.shape().elem_count() != 2 || self.clip.dtype() != DType::F32 {
                candle_core::bail!("the fused AdamW takes [norm, scale] in f32");
            }
            // The moments: the optimizer's own tensors, written in place.
            S::with_mut(&self.m, |m, ml| {
                S::with_mut(&self.v, |v, vl| {
                    let operands = [
                        p.operand_mut(pl)?,
                        g.operand(gl)?,
                        m.operand_mut(ml)?,
                        v.operand_mut(vl)?,
                        c.operand(cl)?,
                    ];
                    let n = operands[0].len();
                    if operands[1..4]
                        .iter()
                        .any(|o| o.len() != n || o.ty() != operands[0].ty())
                    {
                        candle_core::bail!(
                            "the fused AdamW got tensors of different sizes or dtypes"
                        );
                    }
                    let plan = super::plan(n, operands[0].ty(), self.hyper)
                        .map_err(candle_core::Error::Msg)?;
                    S::execute(&dev, &plan, &operands)?;
                    Ok(())
                })
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    /// The GPU plan under the host emulation of CUDA equals the CPU kernel,
    /// scaled by the clip scale; a NaN scale leaves the parameter and both
    /// moments as they were; f32 and bf16.
    #[test]
    fn the_gpu_plan_equals_the_cpu_kernel_under_emulation() -> Result<()> {
        use crate::train::network::kernels::emulator::Buffer;
        use crate::train::network::ops::testing::{
            assert_rounded, buffer, emulate, emulate_off_alignment, max_diff, rand, tensor,
        };
        // Not a multiple of the 16-byte groups: the last values one each.
        let n = 1003;
        let (p, g) = (rand(&[n], 1), (rand(&[n], 2) * 3.0)?);
        let (m0, v0) = (rand(&[n], 3), rand(&[n], 4).abs()?);
        let h = Hyper {
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.95,
            bc1: 0.19,
            bc2: 0.0975,
            eps: 1e-8,
            wd: 0.1,
        };
        let hyper = [h.lr, h.beta1, h.beta2, h.bc1, h.bc2, h.eps, h.wd].map(|x| x as f32);
        for scale in [0.5f32, f32::NAN] {
            for (own, tol) in [(Ty::F32, 1e-6), (Ty::Bf16, 2e-2)] {
                let seen = |t: &Tensor| tensor(&buffer(t, own), t.dims());
                let want = seen(&p).copy()?;
                let (mut m, mut v) = (seen(&m0).to_vec1::<f32>()?, seen(&v0).to_vec1::<f32>()?);
                if !scale.is_nan() {
                    host(&want, &seen(&g), &mut m, &mut v, &h, scale as f64)?;
                }
                let operands = [
                    buffer(&p, own),
                    buffer(&g, own),
                    buffer(&m0, own),
                    buffer(&v0, own),
                    Buffer::f32(&[2.0, scale]),
                ];
                let Some((_, after)) = emulate(
                    &plan(n, own, hyper).unwrap(),
                    &operands,
                    own == Ty::F32 && scale == 0.5,
                ) else {
                    return Ok(());
                };
                let got = tensor(&after[0], &[n]);
                assert!(max_diff(&got, &want)? < tol, "{scale} {own:?}");
                assert_rounded(&after[0], &want, 1e-5, 0.0);
                // Every state it keeps: the parameter (above), m and v.
                let m = Tensor::new(m.as_slice(), &Device::Cpu)?;
                assert!(
                    max_diff(&tensor(&after[2], &[n]), &m)? < tol,
                    "m {scale} {own:?}"
                );
                let v = Tensor::new(v.as_slice(), &Device::Cpu)?;
                assert!(
                    max_diff(&tensor(&after[3], &[n]), &v)? < tol,
                    "v {scale} {own:?}"
                );
                assert_rounded(&after[2], &m, 1e-5, 0.0);
                assert_rounded(&after[3], &v, 1e-5, 0.0);
                // Off the 16-byte alignment: the single-value path gives
                // the same bits.
                let (_, after_off) =
                    emulate_off_alignment(&plan(n, own, hyper).unwrap(), &operands);
                assert_eq!(after_off, after, "{scale} {own:?}, off the alignment");
                if scale.is_nan() {
                    assert_eq!(after[0], operands[0], "a NaN scale changes nothing");
                    assert_eq!(after[2], operands[2]);
                    assert_eq!(after[3], operands[3]);
                }
            }
        }
        Ok(())
    }

    #[test]
    fn the_cpu_kernel_and_the_composed_update_agree() -> Result<()> {
        let data: Vec<f32> = (0..12).map(|i| (i as f32 - 6.0) / 7.0).collect();
        let grad: Vec<f32> = (0..12).map(|i| ((i * 7) % 5) as f32 / 3.0 - 0.5).collect();
        let (beta1, beta2) = (0.9, 0.95);
        let hyper = |t: i32| Hyper {
            lr: 0.01,
            beta1,
            beta2,
            bc1: 1.0 - f64::powi(beta1, t),
            bc2: 1.0 - f64::powi(beta2, t),
            eps: 1e-8,
            wd: 0.1,
        };
        // The kernel in f32, the composed ops in f64: three steps, scale 0.5.
        let p = Tensor::from_slice(&data, (3, 4), &Device::Cpu)?;
        let g = Tensor::from_slice(&grad, (3, 4), &Device::Cpu)?;
        let (mut m, mut v) = (vec![0f32; 12], vec![0f32; 12]);
        let var = Var::from_tensor(&p.to_dtype(DType::F64)?)?;
        let g64 = g.to_dtype(DType::F64)?;
        let (mut m64, mut v64) = (g64.zeros_like()?, g64.zeros_like()?);
        for t in 1..=3 {
            host(&p, &g, &mut m, &mut v, &hyper(t), 0.5)?;
            composed(&var, &g64, &mut m64, &mut v64, &hyper(t), 0.5)?;
        }
        let want = var
            .as_tensor()
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let got = p.flatten_all()?.to_vec1::<f32>()?;
        assert_ne!(got, data, "the kernel changed nothing");
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
        let m_want = m64.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        for (a, b) in m.iter().zip(&m_want) {
            assert!((a - b).abs() < 1e-6, "m: {a} vs {b}");
        }
        let v_want = v64.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        assert!(v.iter().any(|x| *x > 0.0), "the kernel left v at zero");
        for (a, b) in v.iter().zip(&v_want) {
            assert!((a - b).abs() < 1e-6 * b.abs().max(1e-3), "v: {a} vs {b}");
        }
        Ok(())
    }
}
