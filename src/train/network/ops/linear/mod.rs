//! The model's matrix products: [`matmul`] / [`linear`] in the tensors' dtype or with bf16
//! products (`bf16-mixed`: [`bf16_gemm`] on the CPU, cuBLAS on a GPU); [`add_product`] and
//! [`add_input_gradient`] as one GEMM with beta = 1 into the buffer, in place: no product
//! tensor and add (a third of the product's time on an H100), no heap fragmentation
//! (docs/trainer.md).

use super::{f32s_any, fused};
use bf16_gemm::View;

pub mod bf16_gemm;
pub(crate) mod cublas;
use candle_core::{bail, CpuStorage, CustomOp2, DType, InplaceOp3, Layout, Result, Shape, Tensor};
pub(crate) use cublas::Gemm;

/// x [N, in] · wᵀ, w [out, in]; bf16 operands when `bf16`.
pub fn linear(x: &Tensor, w: &Tensor, bf16: bool) -> Result<Tensor> {
    matmul(x, &w.t()?, bf16)
}

/// a · b, batched over leading dimensions; bf16 operands when `bf16`.
pub fn matmul(a: &Tensor, b: &Tensor, bf16: bool) -> Result<Tensor> {
    let _part = crate::train::network::parts::op(crate::train::network::parts::Op::Linear);
    if bf16 && fused(a) && fused(b) {
        a.apply_op2(b, Bf16Matmul)
    } else if bf16 && a.dtype() == DType::F32 && super::gpu_path(a.device()) {
        // The casts are differentiable: gradients come back as f32.
        a.to_dtype(DType::BF16)?
            .matmul(&b.to_dtype(DType::BF16)?)?
            .to_dtype(DType::F32)
    } else if a.dtype() == DType::BF16 && super::emulating() {
        // The emulated device's cuBLAS: bf16 operands, f32 sums, bf16 out.
        let f32 = |t: &Tensor| t.to_dtype(DType::F32);
        f32(a)?.matmul(&f32(b)?)?.to_dtype(DType::BF16)
    } else {
        a.matmul(b)
    }
}

struct Bf16Matmul;

/// The data offset of every matrix of a (batched) layout, in row-major order.
fn matrix_offsets(l: &Layout) -> Vec<usize> {
    let dims = l.shape().dims();
    let lead = &dims[..dims.len() - 2];
    (0..lead.iter().product())
        .map(|mut b: usize| {
            let mut off = l.start_offset();
            for (&size, &stride) in lead.iter().zip(l.stride()).rev() {
                off += (b % size) * stride;
                b /= size;
            }
            off
        })
        .collect()
}

impl CustomOp2 for Bf16Matmul {
    fn name(&self) -> &'static str {
        "sweep-bf16-matmul"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (a, b) = (f32s_any(s1)?, f32s_any(s2)?);
        let (da, db) = (l1.shape().dims(), l2.shape().dims());
        let r = da.len();
        if r < 2 || db.len() != r || da[..r - 2] != db[..r - 2] || da[r - 1] != db[r - 2] {
            bail!("bf16 matmul: shapes {da:?} and {db:?} do not multiply");
        }
        let (m, k, n) = (da[r - 2], da[r - 1], db[r - 1]);
        let (sa, sb) = (l1.stride(), l2.stride());
        let (oa, ob) = (matrix_offsets(l1), matrix_offsets(l2));
        let len = oa.len() * m * n;
        let mut c = Vec::with_capacity(len);
        let matrices = c.spare_capacity_mut()[..len].chunks_mut((m * n).max(1));
        for ((&oa, &ob), c) in oa.iter().zip(&ob).zip(matrices) {
            let av = View {
                data: &a[oa..],
                rs: sa[r - 2],
                cs: sa[r - 1],
            };
            let bv = View {
                data: &b[ob..],
                rs: sb[r - 2],
                cs: sb[r - 1],
            };
            bf16_gemm::gemm_uninit(m, n, k, av, bv, c);
        }
        // SAFETY: `gemm_uninit` wrote each matrix of C whole.
        unsafe { c.set_len(len) };
        let mut dims = da.to_vec();
        dims[r - 1] = n;
        Ok((CpuStorage::F32(c), Shape::from(dims)))
    }
}

/// buf [out, in] += dyᵀ · x (a weight gradient); `bf16`: bf16 operands.
pub fn add_product(buf: &mut Tensor, dy: &Tensor, x: &Tensor, bf16: bool) -> Result<()> {
    add_gradient(Gradient::Weight, buf, dy, x, bf16)
}

/// acc [N, in] += dy [N, out] · w [out, in] (an input gradient); `bf16`: bf16 operands.
pub fn add_input_gradient(acc: &mut Tensor, dy: &Tensor, w: &Tensor, bf16: bool) -> Result<()> {
    add_gradient(Gradient::Input, acc, dy, w, bf16)
}

/// Which gradient a GEMM adds into a buffer: the weight's (buf += dyᵀ · x) or the input's
/// (buf += dy · w); `other` is x or w.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Gradient {
    Weight,
    Input,
}

impl Gradient {
    /// The buffer's rows, after checking the three shapes agree.
    fn rows(self, buf: &[usize], dy: &[usize], other: &[usize]) -> Result<usize> {
        let (&[n, out], &[a, inp]) = (dy, other) else {
            bail!("a linear gradient from dy {dy:?} and {other:?}: matrices");
        };
        let (rows, agree) = match self {
            Gradient::Weight => (out, n == a),
            Gradient::Input => (n, out == a),
        };
        if !agree || buf != [rows, inp] {
            bail!("a {buf:?} {self:?} gradient from dy {dy:?} and {other:?}");
        }
        Ok(rows)
    }
}

pub(super) fn add_gradient(
    which: Gradient,
    buf: &mut Tensor,
    dy: &Tensor,
    other: &Tensor,
    bf16: bool,
) -> Result<()> {
    let _part = crate::train::network::parts::op(crate::train::network::parts::Op::Linear);
    which.rows(buf.dims(), dy.dims(), other.dims())?;
    if !bf16
        && super::in_place(buf, &[dy, other])
        && super::own_kernel(super::Kernel::WeightGrad, &[dy, other])
    {
        return buf.inplace_op3(dy, other, &AddGradient(which));
    }
    if super::gpu_path(buf.device())
        && buf.is_contiguous()
        && super::own_kernel(super::Kernel::WeightGrad, &[buf, dy, other])
    {
        return cublas::add_gradient(which, buf, dy, other, bf16);
    }
    let product = match which {
        Gradient::Weight => matmul(&dy.t()?, other, bf16)?,
        Gradient::Input => matmul(dy, other, bf16)?,
    };
    super::accumulate::add(buf, &product)
}

/// sum[.., :keys, :] += aᵀ · b per matrix (sum f32, all contiguous): one strided-batched cuBLAS
/// GEMM (attention's dK and dV).
pub fn add_batched_product(sum: &Tensor, a: &Tensor, b: &Tensor) -> Result<()> {
    sum.inplace_op3(a, b, &cublas::AddBatchedProduct)
}

/// c (m × n, contiguous) = lhs · rhs (+ c where `accumulate`) by the `gemm` crate's f32 kernels
/// on the current rayon pool; each operand its first element and strides.
///
/// # Safety
/// Every element reached lies inside its allocation, and c aliases neither operand.
pub(crate) unsafe fn gemm_f32(
    (m, n, k): (usize, usize, usize),
    c: *mut f32,
    accumulate: bool,
    (lhs, lhs_cs, lhs_rs): (*const f32, usize, usize),
    (rhs, rhs_cs, rhs_rs): (*const f32, usize, usize),
) {
    let s = |x: usize| x as isize;
    // SAFETY: as the caller promises.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c,
            1,
            s(n),
            accumulate,
            lhs,
            s(lhs_cs),
            s(lhs_rs),
            rhs,
            s(rhs_cs),
            s(rhs_rs),
            1.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(rayon::current_num_threads()),
        )
    }
}

/// [`add_gradient`] on the CPU in f32: one GEMM into the buffer.
struct AddGradient(Gradient);

/// One past the last element a layout reaches (0 when it is empty).
fn end(l: &Layout) -> usize {
    let dims = l.shape().dims();
    if dims.contains(&0) {
        return 0;
    }
    let last: usize = dims.iter().zip(l.stride()).map(|(d, s)| (d - 1) * s).sum();
    l.start_offset() + last + 1
}

impl InplaceOp3 for AddGradient {
    fn name(&self) -> &'static str {
        match self.0 {
            Gradient::Weight => "sweep-add-weight-gradient",
            Gradient::Input => "sweep-add-input-gradient",
        }
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<()> {
        let (dy, other) = (f32s_any(s2)?, f32s_any(s3)?);
        let rows = self.0.rows(l1.dims(), l2.dims(), l3.dims())?;
        let ((n, out), inp) = (l2.shape().dims2()?, l3.shape().dims2()?.1);
        let CpuStorage::F32(buf) = s1 else {
            bail!("expected f32 data")
        };
        // Every index below stays inside its slice: the layouts describe them.
        if n == 0
            || !l1.is_contiguous()
            || end(l2) > dy.len()
            || end(l3) > other.len()
            || end(l1) > buf.len()
        {
            bail!("a layout reaches outside its data");
        }
        let (sd, so) = (l2.stride(), l3.stride());
        let (dy, other) = (
            dy[l2.start_offset()..].as_ptr(),
            other[l3.start_offset()..].as_ptr(),
        );
        // Weight: lhs = dyᵀ through dy's strides, over N rows; input: lhs = dy, over `out` columns.
        let (k, lhs) = match self.0 {
            Gradient::Weight => (n, (dy, sd[0], sd[1])),
            Gradient::Input => (out, (dy, sd[1], sd[0])),
        };
        // SAFETY: dst is the contiguous rows × in buffer; both operands lie inside their slices
        // (checked above) and dst aliases neither (a separate, write-locked storage).
        unsafe {
            gemm_f32(
                (rows, inp, k),
                buf.as_mut_ptr().add(l1.start_offset()),
                true,
                lhs,
                (other, so[1], so[0]),
            )
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::network::ops::testing::{max_diff, rand};
    use candle_core::Var;

    #[test]
    fn weight_gradients_accumulate_in_place_like_their_sums() -> Result<()> {
        let (dy, x) = (rand(&[37, 9], 1), rand(&[37, 13], 2));
        let mut buf = rand(&[9, 13], 3);
        let want = (&buf + dy.t()?.matmul(&x)?)?;
        // A clone shares the storage: it sees the sum only if it is made in place.
        let alias = buf.clone();
        add_product(&mut buf, &dy, &x, false)?;
        assert!(max_diff(&buf, &want)? < 1e-5);
        assert!(max_diff(&alias, &want)? < 1e-5, "not in place");
        // A transposed operand is read through its strides.
        let dy_t = rand(&[9, 37], 4);
        let want = (&buf + dy_t.matmul(&x)?)?;
        add_product(&mut buf, &dy_t.t()?, &x, false)?;
        assert!(max_diff(&buf, &want)? < 1e-5);
        // Off the in-place path (f64): the same sums.
        let mut b64 = Tensor::zeros((9, 13), DType::F64, x.device())?;
        let (dy64, x64) = (dy.to_dtype(DType::F64)?, x.to_dtype(DType::F64)?);
        add_product(&mut b64, &dy64, &x64, false)?;
        let d = (&b64 - dy64.t()?.matmul(&x64)?)?
            .abs()?
            .max_all()?
            .to_scalar::<f64>()?;
        assert!(d < 1e-14);
        assert!(add_product(&mut b64, &dy64, &dy64, false).is_err());
        Ok(())
    }

    #[test]
    fn input_gradients_add_in_place_like_their_sums() -> Result<()> {
        let (dy, w) = (rand(&[37, 9], 5), rand(&[9, 13], 6));
        let mut acc = rand(&[37, 13], 7);
        let want = (&acc + dy.matmul(&w)?)?;
        let alias = acc.clone();
        add_input_gradient(&mut acc, &dy, &w, false)?;
        assert!(max_diff(&acc, &want)? < 1e-5);
        assert!(max_diff(&alias, &want)? < 1e-5, "not in place");
        // Operands read through their strides (a transposed weight).
        let w_t = rand(&[13, 9], 8);
        let want = (&acc + dy.matmul(&w_t.t()?)?)?;
        add_input_gradient(&mut acc, &dy, &w_t.t()?, false)?;
        assert!(max_diff(&acc, &want)? < 1e-5);
        // bf16 operands: the product of the rounded operands, added.
        let want = (&acc + matmul(&dy, &w, true)?)?;
        add_input_gradient(&mut acc, &dy, &w, true)?;
        assert!(max_diff(&acc, &want)? < 1e-5);
        // Shapes that do not multiply, or a sum of another shape: errors.
        assert!(add_input_gradient(&mut acc, &dy, &w.t()?, false).is_err());
        assert!(add_input_gradient(&mut acc.t()?, &dy, &w, false).is_err());
        Ok(())
    }

    #[test]
    fn batched_transposed_products_and_gradients_match_f32_within_bf16_rounding() -> Result<()> {
        // The attention shapes: [B, KV, R, Q] x [B, KV, T, Q]ᵀ, and a linear layer x · wᵀ.
        let q = Var::from_tensor(&rand(&[2, 3, 20, 16], 1))?;
        let k = Var::from_tensor(&rand(&[2, 3, 9, 16], 2))?;
        let ours = matmul(&q, &k.t()?, true)?;
        let want = q.matmul(&k.t()?)?;
        let rel = |a: &Tensor, b: &Tensor| -> Result<f32> {
            let d = (a - b)?.abs()?.max_all()?.to_scalar::<f32>()?;
            Ok(d / b.abs()?.max_all()?.to_scalar::<f32>()?)
        };
        assert!(
            rel(&ours, &want)? < 1e-2,
            "bf16 operands keep ~3 significant digits"
        );
        // The gradients as the backward pass takes them: dq = g·k, dk = gᵀ·q.
        let g = rand(&[2, 3, 20, 9], 3);
        let (dq, dk) = (matmul(&g, &k, true)?, matmul(&g.t()?, &q, true)?);
        let autograd = (want * &g)?.sum_all()?.backward()?;
        assert!(rel(&dq, autograd.get(&q).unwrap())? < 2e-2);
        assert!(rel(&dk, autograd.get(&k).unwrap())? < 2e-2);
        let x = rand(&[37, 48], 4);
        let w = rand(&[65, 48], 5);
        assert!(rel(&matmul(&x, &w.t()?, true)?, &x.matmul(&w.t()?)?)? < 1e-2);
        Ok(())
    }
}
