//! Cross-entropy over labels other than -100, divided by `divisor` (such labels in the whole
//! step, so accumulation equals one large batch). The reference's logits are [B·T, 131072]:
//! composed log-softmax keeps three more such tensors and their gradients, so
//! [`loss_and_grad`] computes loss and gradient at once in f32, a slice of rows at a time.

use super::store::{Span, Store};
use super::{f32s, fused, own_kernel, work_dtype};
use crate::data::samples::IGNORE;
use crate::train::network::kernels::{
    block_per_row, u32_of, LaunchPlan, Mem, Ty, Value, CROSS_ENTROPY,
};
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::DType;
use candle_core::{bail, CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};
use rayon::prelude::*;
use std::sync::Arc;

/// One label per row of logits, each ignored or in the vocabulary.
fn check_labels(logits: &Tensor, labels: &[i64]) -> Result<()> {
    let (n, v) = logits.dims2()?;
    if labels.len() != n {
        bail!("{n} rows of logits but {} labels", labels.len());
    }
    if let Some(bad) = labels
        .iter()
        .find(|&&l| l != IGNORE && (l < 0 || l as usize >= v))
    {
        bail!("label {bad} is outside the vocabulary of {v}");
    }
    Ok(())
}

pub use crate::estimate::memory::head_rows;

/// The loss (f32, f64 for f64 logits) and its gradient, `rows` rows at a time.
fn computed_by_slices(
    logits: &Tensor,
    labels: &[i64],
    divisor: f64,
    rows: usize,
) -> Result<(Tensor, Tensor)> {
    let (n, v) = logits.dims2()?;
    let dev = logits.device();
    let x = logits.detach();
    let dtype = work_dtype(&x);
    let idx: Vec<u32> = labels
        .iter()
        .map(|&l| if l == IGNORE { 0 } else { l as u32 })
        .collect();
    // Per row: 1/divisor where the label counts, else 0 (via f64: f64 logits keep every bit).
    let weight: Vec<f64> = labels
        .iter()
        .map(|&l| if l == IGNORE { 0.0 } else { 1.0 / divisor })
        .collect();
    let idx = Tensor::from_vec(idx, (n, 1), dev)?;
    let weight = Tensor::from_vec(weight, (n, 1), dev)?.to_dtype(dtype)?;
    let grad = Tensor::zeros((n, v), x.dtype(), dev)?;
    let mut loss = Tensor::zeros((), dtype, dev)?;
    for start in (0..n).step_by(rows) {
        let len = rows.min(n - start);
        let (idx, w) = (idx.narrow(0, start, len)?, weight.narrow(0, start, len)?);
        let xs = x.narrow(0, start, len)?.to_dtype(dtype)?;
        let shifted = xs.broadcast_sub(&xs.max_keepdim(1)?)?;
        let exp = shifted.exp()?;
        let sum = exp.sum_keepdim(1)?;
        // -log softmax at the label = log Σ exp − shifted[label].
        let rows_loss = (sum.log()? - shifted.gather(&idx, 1)?)?;
        loss = (loss + (rows_loss * &w)?.sum_all()?)?;
        // (softmax − onehot(label)) · weight
        let d = exp.broadcast_mul(&w.broadcast_div(&sum)?)?;
        let d = d.scatter_add(&idx, &w.neg()?, 1)?;
        grad.slice_set(&d.to_dtype(x.dtype())?, 0, start)?;
    }
    Ok((loss, grad))
}

/// A micro-batch's labels: the host's (−100 ignored), and for the GPU kernel as u32
/// (u32::MAX ignored) uploaded once per pass.
#[derive(Debug, Clone)]
pub struct Labels<'a> {
    pub host: &'a [i64],
    device: Option<Tensor>,
}

impl<'a> Labels<'a> {
    /// The labels for logits on `device`: uploaded where its kernel runs.
    pub fn new(host: &'a [i64], device: &candle_core::Device) -> Result<Labels<'a>> {
        let upload = super::gpu_path(device) && super::on_gpu(super::Kernel::CrossEntropy);
        let device = match upload {
            true => Some(Tensor::from_vec(kernel_labels(host), host.len(), device)?),
            false => None,
        };
        Ok(Labels { host, device })
    }

    /// Rows `start..start + len` of them.
    pub fn rows(&self, start: usize, len: usize) -> Result<Labels<'a>> {
        Ok(Labels {
            host: &self.host[start..start + len],
            device: self
                .device
                .as_ref()
                .map(|t| t.narrow(0, start, len))
                .transpose()?,
        })
    }
}

impl<'a> From<&'a [i64]> for Labels<'a> {
    /// The host's labels alone (the kernel uploads its own copy).
    fn from(host: &'a [i64]) -> Labels<'a> {
        Labels { host, device: None }
    }
}

/// Labels as the CUDA kernel reads them: u32, ignored as u32::MAX.
fn kernel_labels(host: &[i64]) -> Vec<u32> {
    host.iter()
        .map(|&l| if l == IGNORE { u32::MAX } else { l as u32 })
        .collect()
}

/// The cross-entropy (a scalar on the logits' device, read by the caller once per pass) and its
/// gradient, without autograd. The logits are consumed: on CUDA the gradient is written over
/// them by one kernel; on the CPU in f32 one pass each way; elsewhere `computed_by_slices`.
pub fn loss_and_grad(logits: Tensor, labels: &Labels, divisor: f64) -> Result<(Tensor, Tensor)> {
    let _part = crate::train::network::parts::op(crate::train::network::parts::Op::Loss);
    let (labels, uploaded) = (labels.host, labels.device.as_ref());
    check_labels(&logits, labels)?;
    if own_kernel(super::Kernel::CrossEntropy, &[&logits]) && fused(&logits) {
        let (n, v) = logits.dims2()?;
        let both = logits.contiguous()?.apply_op1_no_bwd(&LossAndGradCpu {
            labels: Arc::new(labels.to_vec()),
            divisor: divisor as f32,
        })?;
        let loss = both.narrow(0, n, 1)?.narrow(1, 0, 1)?.reshape(())?;
        return Ok((loss, both.narrow(0, 0, n)?.reshape((n, v))?));
    }
    if own_kernel(super::Kernel::CrossEntropy, &[&logits]) {
        return in_place_on_gpu(logits.contiguous()?, labels, uploaded, divisor);
    }
    // Its f32 temporaries a CPU head's slice at a time (256 MB), on any device.
    let (n, v) = logits.dims2()?;
    computed_by_slices(&logits, labels, divisor, head_rows(n, v, false))
}

/// [`loss_and_grad`] on CUDA: d logits over the logits, each row's loss summed on the device.
fn in_place_on_gpu(
    logits: Tensor,
    labels: &[i64],
    uploaded: Option<&Tensor>,
    divisor: f64,
) -> Result<(Tensor, Tensor)> {
    let (n, _) = logits.dims2()?;
    let dev = logits.device();
    let labels = match uploaded {
        Some(t) if t.device().same_device(dev) => t.clone(),
        _ => Tensor::from_vec(kernel_labels(labels), n, dev)?,
    };
    let row_loss = Tensor::zeros(n, DType::F32, dev)?;
    logits.inplace_op2(
        &labels,
        &LossAndGrad {
            row_loss: row_loss.clone(),
            scale: 1.0 / divisor as f32,
        },
    )?;
    Ok(((row_loss.sum_all()? / divisor)?, logits))
}

/// The CUDA kernel's op: logits (in place) and u32 labels in, each row's loss out.
struct LossAndGrad {
    row_loss: Tensor,
    scale: f32,
}

impl candle_core::InplaceOp2 for LossAndGrad {
    fn name(&self) -> &'static str {
        "sweep-loss-and-grad"
    }

    fn cpu_fwd(
        &self,
        s: &mut CpuStorage,
        l: &Layout,
        labels: &CpuStorage,
        ll: &Layout,
    ) -> Result<()> {
        if !super::emulating() {
            bail!("the in-place loss runs on CUDA tensors");
        }
        loss_and_grad_gpu(s, l, labels, ll, &self.row_loss, self.scale)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        logits: &mut CudaStorage,
        ll: &Layout,
        labels: &CudaStorage,
        labl: &Layout,
    ) -> Result<()> {
        loss_and_grad_gpu(logits, ll, labels, labl, &self.row_loss, self.scale)
    }
}

/// Loss and gradient on a GPU, a block per row: logits [n, v] (operand 0, the gradient written
/// over them times `scale`), u32 labels (1), each row's f32 loss (2).
pub fn plan(n: usize, v: usize, own: Ty, scale: f32) -> std::result::Result<LaunchPlan, String> {
    let mut plan = LaunchPlan::default();
    plan.launch(
        &CROSS_ENTROPY,
        "loss_and_grad",
        own,
        block_per_row(u32_of(n, "rows")?),
        vec![
            Value::Ptr(Mem::Operand(0), 0),
            Value::Ptr(Mem::Operand(1), 0),
            Value::Ptr(Mem::Operand(2), 0),
            Value::U32(u32_of(v, "vocabulary")?),
            Value::F32(scale),
        ],
    )?;
    Ok(plan)
}

fn loss_and_grad_gpu<S: Store>(
    logits: &mut S,
    ll: &Layout,
    labels: &S,
    labl: &Layout,
    row_loss: &Tensor,
    scale: f32,
) -> Result<()> {
    let (n, v) = ll.shape().dims2()?;
    let plan = plan(n, v, logits.ty()?, scale).map_err(candle_core::Error::Msg)?;
    let dev = logits.device();
    S::with_mut(row_loss, |losses, lossl| {
        let operands = [
            logits.operand_mut(ll)?,
            labels.operand(labl)?,
            losses.operand_mut(lossl)?,
        ];
        if operands[1].len() != n || operands[2].len() != n {
            bail!("{n} rows of logits but {} labels", operands[1].len());
        }
        S::execute(&dev, &plan, &operands)?;
        Ok(())
    })
}

/// Loss and d logits in one CPU op: [N + 1, V], d logits then a row whose first value is the loss.
struct LossAndGradCpu {
    labels: Arc<Vec<i64>>,
    divisor: f32,
}

impl CustomOp1 for LossAndGradCpu {
    fn name(&self) -> &'static str {
        "sweep-loss-and-grad"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = f32s(s, l)?;
        let (n, v) = l.shape().dims2()?;
        let scale = 1.0 / self.divisor;
        let mut out = vec![0f32; (n + 1) * v];
        let (d, last) = out.split_at_mut(n * v);
        let rows: Vec<f64> = d
            .par_chunks_mut(v)
            .zip(x.par_chunks(v))
            .zip(self.labels.par_iter())
            .map(|((d, row), &label)| {
                if label == IGNORE {
                    return 0.0;
                }
                let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                // The exponentials, then their sum: apart, the first loop vectorizes.
                for (d, &x) in d.iter_mut().zip(row) {
                    *d = super::exp::exp(x - max);
                }
                let sum: f32 = d.iter().sum();
                let k = scale / sum;
                d.iter_mut().for_each(|d| *d *= k);
                d[label as usize] -= scale;
                (super::exp::ln(sum) + max - row[label as usize]) as f64
            })
            .collect();
        let total: f64 = rows.iter().sum();
        last[0] = (total / self.divisor as f64) as f32;
        Ok((CpuStorage::F32(out), Shape::from((n + 1, v))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::network::ops::testing::{max_diff, rand};
    use crate::train::network::oracle::cross_entropy;
    use candle_core::Var;

    /// The GPU plan under the host emulation of CUDA equals the CPU kernel:
    /// ignored rows (gradient and loss 0), a vocabulary that fills no whole
    /// pass of a block, one row, rows that start off the 16-byte alignment
    /// every other row; f32 and bf16; and gives the same bits with every
    /// operand off the 16-byte alignment.
    #[test]
    fn the_gpu_plan_equals_the_cpu_kernel_under_emulation() -> Result<()> {
        use crate::train::network::kernels::emulator::Buffer;
        use crate::train::network::ops::testing::{
            assert_rounded, buffer, emulate, emulate_off_alignment, tensor,
        };
        for (n, v) in [(6, 1000), (1, 300), (3, 5), (4, 3003)] {
            let logits = (rand(&[n, v], 4) * 6.0)?;
            let labels: Vec<i64> = (0..n)
                .map(|i| {
                    if i % 3 == 1 {
                        IGNORE
                    } else {
                        ((i * 7919) % v) as i64
                    }
                })
                .collect();
            let ids = kernel_labels(&labels);
            let divisor = 4.0;
            for (own, tol) in [(Ty::F32, 1e-5), (Ty::Bf16, 2e-2)] {
                let seen = tensor(&buffer(&logits, own), &[n, v]);
                let (loss, grad) = loss_and_grad(seen, &labels[..].into(), divisor)?;
                let operands = [
                    buffer(&logits, own),
                    Buffer::u32(&ids),
                    Buffer::f32(&vec![0.0; n]),
                ];
                let launches = plan(n, v, own, 1.0 / divisor as f32).unwrap();
                let Some((_, after)) = emulate(&launches, &operands, own == Ty::F32 && n == 6)
                else {
                    return Ok(());
                };
                let (_, shifted) = emulate_off_alignment(&launches, &operands);
                assert_eq!(shifted, after, "{n}x{v} {own:?}, shifted");
                let got = tensor(&after[0], &[n, v]);
                assert!(
                    max_diff(&got, &grad)? < tol / 10.0 + 1e-6,
                    "grad {n}x{v} {own:?}"
                );
                // softmax − one-hot cancels at the label: an absolute error.
                assert_rounded(&after[0], &grad, 1e-5, 1e-7);
                let rows = after[2].to_f32();
                let total: f32 = rows.iter().sum::<f32>() / divisor as f32;
                let want = loss.to_scalar::<f32>()?;
                assert!(
                    (total - want).abs() < tol * want.abs().max(1.0),
                    "loss {total} {want}"
                );
                for (i, l) in labels.iter().enumerate() {
                    if *l == IGNORE {
                        assert_eq!(rows[i], 0.0);
                        assert!(got.get(i)?.abs()?.max(0)?.to_scalar::<f32>()? == 0.0);
                    }
                }
            }
        }
        Ok(())
    }

    /// The loss and its gradient by [`loss_and_grad`], and by candle's
    /// autograd over the composed loss, in f32.
    fn both_ways(x: &Tensor, labels: &[i64], divisor: f64) -> Result<[(Tensor, Tensor); 2]> {
        let (loss, grad) = loss_and_grad(x.clone(), &labels.into(), divisor)?;
        let x32 = Var::from_tensor(&x.to_dtype(DType::F32)?)?;
        let composed = cross_entropy(&x32, labels, divisor)?;
        let g = composed.backward()?.remove(x32.as_tensor()).unwrap();
        let f32s = |t: Tensor| t.to_dtype(DType::F32);
        Ok([
            (f32s(loss)?, f32s(grad)?),
            (composed.to_dtype(DType::F32)?, g),
        ])
    }

    #[test]
    fn fused_matches_composed_and_ignores_masked_labels() -> Result<()> {
        let x = (rand(&[6, 11], 1) * 3.0)?;
        let labels = [3, IGNORE, 10, 0, IGNORE, 7];
        let [(a, da), (b, db)] = both_ways(&x, &labels, 4.0)?;
        assert!(max_diff(&a, &b)? < 1e-5);
        assert!(max_diff(&da, &db)? < 1e-6);
        // Ignored rows get no gradient.
        assert_eq!(da.get(1)?.abs()?.sum_all()?.to_scalar::<f32>()?, 0.0);
        Ok(())
    }

    #[test]
    fn by_rows_matches_composed_in_value_and_gradient() -> Result<()> {
        // f64 and bf16 take the by-rows path on the CPU, as every dtype does
        // on a GPU.
        for dtype in [DType::F64, DType::BF16] {
            let x = (rand(&[7, 13], 2) * 3.0)?.to_dtype(dtype)?;
            let labels = [3, IGNORE, 12, 0, IGNORE, 7, 5];
            let (loss, _) = loss_and_grad(x.clone(), &labels[..].into(), 5.0)?;
            let want = if dtype == DType::F64 {
                dtype
            } else {
                DType::F32
            };
            assert_eq!(loss.dtype(), want);
            let tol = if dtype == DType::F64 { 1e-5 } else { 2e-2 };
            let [(a, da), (b, db)] = both_ways(&x, &labels, 5.0)?;
            assert!(max_diff(&a, &b)? < tol, "{dtype:?}");
            assert!(max_diff(&da, &db)? < tol / 10.0, "{dtype:?}");
            assert_eq!(da.get(1)?.abs()?.sum_all()?.to_scalar::<f32>()?, 0.0);
        }
        Ok(())
    }

    #[test]
    fn slices_of_rows_that_do_not_divide_the_batch_change_nothing() -> Result<()> {
        let x = (rand(&[11, 9], 3) * 4.0)?.to_dtype(DType::F64)?;
        let labels = [1, 8, IGNORE, 0, 5, 5, IGNORE, 2, 3, 7, 6];
        let (whole, d_whole) = computed_by_slices(&x, &labels, 3.0, 11)?;
        for rows in [1, 2, 4, 10] {
            let (a, da) = computed_by_slices(&x, &labels, 3.0, rows)?;
            let diff = (&a - &whole)?.abs()?.to_scalar::<f64>()?;
            assert!(diff < 1e-12, "{rows} rows");
            let diff = (&da - &d_whole)?.abs()?.max_all()?.to_scalar::<f64>()?;
            assert!(diff < 1e-12, "{rows} rows");
        }
        Ok(())
    }

    #[test]
    fn labels_outside_the_vocabulary_are_an_error() {
        let x = rand(&[2, 5], 1);
        assert!(loss_and_grad(x, &[1, 5][..].into(), 1.0).is_err());
    }
}
