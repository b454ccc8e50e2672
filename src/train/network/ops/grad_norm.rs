//! The global gradient norm and clip scale: with tensor ops on the host, or on a GPU by sweep's
//! kernels in one pass per gradient and a last kernel writing [norm, scale] for AdamW to read.

use crate::train::network::kernels::{u32_of, LaunchPlan, Mem, Ty, Value, GRAD_NORM, THREADS};
use candle_core::{DType, Result, Tensor};

/// Blocks per gradient at most: four per H100 SM, about the bytes in flight HBM3 needs.
const NORM_BLOCKS: usize = 528;

/// Values per thread below which a gradient takes fewer blocks (a norm's weight takes one).
const PER_THREAD: usize = 8;

/// The norm and scale on a GPU: gradients of `lens` values (operands 0..) into [norm, scale]
/// (the next operand, f32): up to `NORM_BLOCKS` partials each, summed in order by one block.
pub fn plan(lens: &[usize], own: Ty, max_norm: f32) -> std::result::Result<LaunchPlan, String> {
    plan_on(lens, own, max_norm, NORM_BLOCKS)
}

/// [`plan`] on up to `blocks` blocks per gradient (emulated blocks are 256 host threads each).
fn plan_on(
    lens: &[usize],
    own: Ty,
    max_norm: f32,
    blocks: usize,
) -> std::result::Result<LaunchPlan, String> {
    let mut plan = LaunchPlan::default();
    let per: Vec<usize> = lens
        .iter()
        .map(|&n| n.div_ceil(THREADS as usize * PER_THREAD).clamp(1, blocks))
        .collect();
    let count: usize = per.iter().sum();
    let partial = plan.scratch(Ty::F32, count);
    let mut at = 0;
    for (i, (&n, &b)) in lens.iter().zip(&per).enumerate() {
        plan.launch(
            &GRAD_NORM,
            "sum_squares",
            own,
            (u32_of(b, "blocks of the gradient norm")?, 1),
            vec![
                Value::Ptr(Mem::Operand(i), 0),
                Value::U64(n as u64),
                Value::Ptr(partial, at),
            ],
        )?;
        at += b;
    }
    plan.launch(
        &GRAD_NORM,
        "clip_scale",
        Ty::F32,
        (1, 1),
        vec![
            Value::Ptr(partial, 0),
            Value::U32(u32_of(count, "partial sums of the gradient norm")?),
            Value::F32(max_norm),
            Value::Ptr(Mem::Operand(lens.len()), 0),
        ],
    )?;
    Ok(plan)
}

/// The global norm and the gradients' scale: `max_norm / norm` where the norm exceeds
/// `max_norm` > 0, else 1; NaN where the norm is not finite (the update changes nothing).
pub enum Clipping {
    /// Computed on the host (the CPU, or ops without sweep's kernels).
    Host { norm: f64, scale: f64 },
    /// [norm, scale] on the GPU, read by the update there; the host reads it after the update is
    /// queued, not waiting for the backward.
    Device(Tensor),
}

impl Clipping {
    /// The clipping of a norm computed elsewhere (ZeRO's, from every rank's block).
    pub fn from_norm(norm: f64, max_norm: f64) -> Clipping {
        let scale = if !norm.is_finite() {
            f64::NAN
        } else if max_norm > 0.0 && norm > max_norm {
            max_norm / norm
        } else {
            1.0
        };
        Clipping::Host { norm, scale }
    }

    /// [norm, scale] on the host.
    fn read(&self) -> Result<[f64; 2]> {
        Ok(match self {
            Clipping::Host { norm, scale } => [*norm, *scale],
            Clipping::Device(t) => {
                let v = t.to_dtype(DType::F64)?.to_vec1::<f64>()?;
                [v[0], v[1]]
            }
        })
    }

    /// The norm (on a GPU this waits for the step's kernels).
    pub fn norm(&self) -> Result<f64> {
        Ok(self.read()?[0])
    }

    /// The scale on the host (on a GPU this waits for the step's kernels).
    pub fn scale(&self) -> Result<f64> {
        Ok(self.read()?[1])
    }

    /// [norm, scale] as an f32 tensor on `device`.
    pub fn as_tensor(&self, device: &candle_core::Device) -> Result<Tensor> {
        Ok(match self {
            Clipping::Device(t) => t.to_device(device)?,
            Clipping::Host { norm, scale } => Tensor::new(&[*norm as f32, *scale as f32], device)?,
        })
    }
}

/// The global L2 norm and clip scale: on a GPU by sweep's kernels (no host read); elsewhere by
/// tensor ops, each gradient first summed along its last dimension (candle's CUDA `sum_all`
/// uses one block: half an 8B model's step on an H100), in f32, read once.
pub fn clipping(grads: &[&Tensor], max_norm: f64) -> Result<Clipping> {
    if grads.first().is_some_and(|g| super::gpu_path(g.device()))
        && super::own_kernel(super::Kernel::GradNorm, grads)
    {
        let out = gpu_norm::norm_and_scale(grads, max_norm as f32)?;
        return Ok(Clipping::Device(out));
    }
    let sums = grads
        .iter()
        .map(|g| {
            g.to_dtype(DType::F32)?
                .sqr()?
                .sum(candle_core::D::Minus1)?
                .sum_all()
        })
        .collect::<Result<Vec<_>>>()?;
    if sums.is_empty() {
        return Ok(Clipping::from_norm(0.0, max_norm));
    }
    let total = Tensor::stack(&sums, 0)?.sum_all()?.to_scalar::<f32>()?;
    Ok(Clipping::from_norm((total as f64).sqrt(), max_norm))
}

/// [`clipping`] on a GPU's tensors, without a read of the host.
mod gpu_norm {
    use super::super::store::{Span, Store};
    #[cfg(feature = "cuda")]
    use candle_core::CudaStorage;
    use candle_core::{CpuStorage, DType, InplaceOp1, Layout, Result, Tensor};

    /// The global L2 norm of `grads` (all f32 or bf16, one GPU) and clip scale, on the device.
    pub fn norm_and_scale(grads: &[&Tensor], max_norm: f32) -> Result<Tensor> {
        let Some(first) = grads.first() else {
            candle_core::bail!("no gradients to take the norm of");
        };
        let out = Tensor::zeros(2, DType::F32, first.device())?;
        let grads = grads
            .iter()
            .map(|g| g.contiguous())
            .collect::<Result<Vec<_>>>()?;
        out.inplace_op1(&NormAndScale { grads, max_norm })?;
        Ok(out)
    }

    /// Writes [norm, scale] into the tensor it is applied to.
    struct NormAndScale {
        grads: Vec<Tensor>,
        max_norm: f32,
    }

    impl InplaceOp1 for NormAndScale {
        fn name(&self) -> &'static str {
            "sweep-grad-norm"
        }

        fn cpu_fwd(&self, out: &mut CpuStorage, ol: &Layout) -> Result<()> {
            if !crate::train::network::ops::emulating() {
                candle_core::bail!("the device gradient norm runs on CUDA tensors");
            }
            self.gpu(out, ol)
        }

        #[cfg(feature = "cuda")]
        fn cuda_fwd(&self, out: &mut CudaStorage, ol: &Layout) -> Result<()> {
            self.gpu(out, ol)
        }
    }

    impl NormAndScale {
        fn gpu<S: Store>(&self, out: &mut S, ol: &Layout) -> Result<()> {
            let dev = out.device();
            let stored: Vec<_> = self.grads.iter().map(|g| g.storage_and_layout()).collect();
            let mut operands = Vec::with_capacity(stored.len() + 1);
            for (s, l) in &stored {
                operands.push(S::held(s, "a gradient")?.operand(l)?);
            }
            let own = match operands.first() {
                Some(o) if operands.iter().all(|g| g.ty() == o.ty()) => o.ty(),
                _ => candle_core::bail!("the gradients' norm takes gradients of one dtype"),
            };
            let lens: Vec<usize> = operands.iter().map(|o| o.len()).collect();
            operands.push(out.operand_mut(ol)?);
            if operands.last().map(|o| o.len()) != Some(2) {
                candle_core::bail!("the gradient norm writes [norm, scale]");
            }
            let plan = super::plan(&lens, own, self.max_norm).map_err(candle_core::Error::Msg)?;
            S::execute(&dev, &plan, &operands)?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_norm_clips_and_a_non_finite_norm_scales_by_nan() -> Result<()> {
        let dev = candle_core::Device::Cpu;
        let a = Tensor::new(&[[3.0f32, 0.0], [0.0, 0.0]], &dev)?;
        let b = Tensor::new(&[4.0f32], &dev)?;
        // |(3, 4)| = 5: clipped to 2 by a factor 0.4, untouched under 10 or 0.
        for (max_norm, scale) in [(2.0, 0.4), (10.0, 1.0), (0.0, 1.0)] {
            let c = clipping(&[&a, &b], max_norm)?;
            assert!((c.norm()? - 5.0).abs() < 1e-6);
            assert!((c.scale()? - scale).abs() < 1e-6, "{max_norm}");
            let t = c.as_tensor(&dev)?.to_vec1::<f32>()?;
            assert!((t[0] - 5.0).abs() < 1e-6 && (t[1] as f64 - scale).abs() < 1e-6);
        }
        let inf = Tensor::new(&[f32::INFINITY], &dev)?;
        let c = clipping(&[&a, &inf], 1.0)?;
        assert!(c.norm()?.is_infinite() && c.scale()?.is_nan());
        assert_eq!(clipping(&[], 1.0)?.norm()?, 0.0);
        Ok(())
    }

    /// The GPU plan under the host emulation of CUDA gives the host's norm
    /// and scale: a gradient longer than the grid's threads, one shorter
    /// than a block; clipped; one infinite value (the scale NaN); f32 and
    /// bf16. The trainer's grid (more partials than a block has threads)
    /// once; a grid of 3 blocks otherwise, and under ThreadSanitizer (its
    /// races are within a block: each block writes a partial of its own).
    #[test]
    fn the_gpu_plan_equals_the_host_under_emulation() -> Result<()> {
        use crate::train::network::kernels::emulator::Buffer;
        use crate::train::network::ops::testing::{
            buffer, emulate, emulate_off_alignment, rand, tensor,
        };
        let grads = vec![rand(&[70_000], 1), rand(&[3], 2), rand(&[1_029], 3)];
        let mut with_inf = grads.clone();
        with_inf[1] = Tensor::new(&[1.0f32, f32::INFINITY, 0.0], &candle_core::Device::Cpu)?;
        for (set, grads) in [grads, with_inf].into_iter().enumerate() {
            let max_norm = 1.0;
            {
                for (own, tol) in [(Ty::F32, 1e-5), (Ty::Bf16, 1e-5)] {
                    let seen: Vec<Tensor> = grads
                        .iter()
                        .map(|g| tensor(&buffer(g, own), g.dims()))
                        .collect();
                    let want = clipping(&seen.iter().collect::<Vec<_>>(), max_norm)?;
                    let mut operands: Vec<Buffer> = grads.iter().map(|g| buffer(g, own)).collect();
                    operands.push(Buffer::f32(&[0.0, 0.0]));
                    let lens: Vec<usize> = grads.iter().map(|g| g.elem_count()).collect();
                    // (blocks, under ThreadSanitizer too)
                    let grids: &[(usize, bool)] = match own == Ty::F32 && set == 0 {
                        true => &[(NORM_BLOCKS, false), (3, true)],
                        false => &[(3, false)],
                    };
                    for &(blocks, race) in grids {
                        let Some((_, after)) = emulate(
                            &plan_on(&lens, own, max_norm as f32, blocks).unwrap(),
                            &operands,
                            race,
                        ) else {
                            return Ok(());
                        };
                        let got = after[grads.len()].to_f32();
                        // Off the 16-byte alignment (one value further in):
                        // the same values in the same order, the same bits
                        // (on the small grid: the trainer's is slow to emulate).
                        if blocks != NORM_BLOCKS {
                            let plan = plan_on(&lens, own, max_norm as f32, blocks).unwrap();
                            let (_, after_off) = emulate_off_alignment(&plan, &operands);
                            assert_eq!(
                                after_off[grads.len()],
                                after[grads.len()],
                                "{blocks} blocks, {own:?}: the norm depends on the alignment"
                            );
                        }
                        let (norm, scale) = (want.norm()?, want.scale()?);
                        if norm.is_finite() {
                            assert!(
                                ((got[0] as f64) - norm).abs() < tol * norm,
                                "{blocks} blocks: {got:?} {norm}"
                            );
                            assert!(
                                ((got[1] as f64) - scale).abs() < 1e-5,
                                "{blocks} blocks: {got:?} {scale}"
                            );
                        } else {
                            assert!(got[0].is_infinite() && got[1].is_nan(), "{got:?}");
                        }
                    }
                }
            }
        }
        Ok(())
    }
}
