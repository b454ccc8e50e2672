//! The linear layer and the model's other matrix products.
//!
//! - [`matmul`] / [`linear`] (forward, and the input's gradient dy · w):
//!   candle's GEMM in the tensors' dtype, or with `bf16` (the `bf16-mixed`
//!   precision: f32 tensors, bf16 products) the CPU's bf16 kernel
//!   ([`bf16_gemm`]: AVX-512 BF16 or portable, [`bf16_gemm::selected`]), and
//!   on a GPU cuBLAS's bf16 GEMM on operands cast to bf16, as autocast does.
//! - [`add_product`] (the weight's gradient `buf += dyᵀ·x`): one GEMM with
//!   beta = 1 written into the gradient buffer, reading the transposed
//!   operand through its strides (no transposed copy, no product tensor): the
//!   `gemm` crate on the CPU in f32, cuBLAS (`cublasGemmEx`, [`cublas`]) on a GPU;
//!   elsewhere the product is added to the buffer.
//!
//! Allocating nothing that outlives a pass matters beyond the copies saved:
//! gradients created block by block during the backward pass, between its
//! transients, fragmented the heap (the CPU trainer's resident memory grew
//! ~75 MB a block under recomputation).

use super::check::{random, Case, Shapes};
use super::{f32s_any, fused};
use bf16_gemm::View;

pub mod bf16_gemm;
mod cublas;
use candle_core::{bail, CpuStorage, CustomOp2, DType, InplaceOp3, Layout, Result, Shape, Tensor};

/// x [N, in] · wᵀ, w [out, in]; bf16 operands when `bf16`.
pub fn linear(x: &Tensor, w: &Tensor, bf16: bool) -> Result<Tensor> {
    matmul(x, &w.t()?, bf16)
}

/// a · b, batched over leading dimensions; bf16 operands when `bf16`.
pub fn matmul(a: &Tensor, b: &Tensor, bf16: bool) -> Result<Tensor> {
    let _part = crate::train::parts::op(crate::train::parts::Op::Linear);
    if bf16 && fused(a) && fused(b) {
        a.apply_op2(b, Bf16Matmul)
    } else if bf16 && a.dtype() == DType::F32 && !a.device().is_cpu() {
        // The casts are differentiable: gradients come back as f32.
        a.to_dtype(DType::BF16)?
            .matmul(&b.to_dtype(DType::BF16)?)?
            .to_dtype(DType::F32)
    } else {
        a.matmul(b)
    }
}

struct Bf16Matmul;

/// The data offset of every matrix of a (possibly batched) layout, in
/// row-major order of the leading (batch) dimensions.
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
        let mut c = vec![0f32; oa.len() * m * n];
        for ((&oa, &ob), c) in oa.iter().zip(&ob).zip(c.chunks_exact_mut(m * n)) {
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
            bf16_gemm::gemm(m, n, k, av, bv, c);
        }
        let mut dims = da.to_vec();
        dims[r - 1] = n;
        Ok((CpuStorage::F32(c), Shape::from(dims)))
    }
}

/// buf [out, in] += dyᵀ · x, with dy [N, out] and x [N, in] (a linear
/// layer's weight gradient); `bf16`: the product with bf16 operands.
pub fn add_product(buf: &mut Tensor, dy: &Tensor, x: &Tensor, bf16: bool) -> Result<()> {
    let _part = crate::train::parts::op(crate::train::parts::Op::Linear);
    let (n, out) = dy.dims2()?;
    let (n2, inp) = x.dims2()?;
    if n != n2 || buf.dims() != [out, inp] {
        bail!(
            "a {:?} gradient from dy {:?} and x {:?}",
            buf.dims(),
            dy.dims(),
            x.dims()
        );
    }
    if !bf16
        && super::in_place(buf, &[dy, x])
        && super::own_kernel(super::Kernel::WeightGrad, &[dy, x])
    {
        return buf.inplace_op3(dy, x, &AddProduct);
    }
    #[cfg(feature = "cuda")]
    if buf.device().is_cuda()
        && buf.is_contiguous()
        && super::own_kernel(super::Kernel::WeightGrad, &[buf, dy, x])
    {
        return cublas::add_product(buf, dy, x, bf16);
    }
    let product = matmul(&dy.t()?, x, bf16)?;
    super::accumulate::add(buf, &product)
}

/// sum[.., :keys, :] += aᵀ · b for every matrix of the leading dimensions,
/// with a [.., M, keys], b [.., M, d] (both contiguous, f32 or bf16) and the
/// sum [.., T, d] (contiguous f32, T ≥ keys): on a GPU one strided-batched
/// cuBLAS GEMM with beta = 1 written into the sum (f32 arithmetic), instead of
/// a product tensor, its cast to f32 and an add over a strided slice.
/// Attention's backward sums dK and dV over its tiles of queries this way.
#[cfg(feature = "cuda")]
pub fn add_batched_product(sum: &Tensor, a: &Tensor, b: &Tensor) -> Result<()> {
    sum.inplace_op3(a, b, &cublas::AddBatchedProduct)
}

/// c (m × n, contiguous row-major) = lhs · rhs (m × k times k × n), plus
/// c's values where `accumulate`, by the `gemm` crate's f32 kernels (the
/// ones candle uses) on the current rayon pool. Each operand is its first
/// element with its column and row strides.
///
/// # Safety
/// Every element the shapes and strides reach lies inside its allocation,
/// and c aliases neither operand.
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

struct AddProduct;

impl InplaceOp3 for AddProduct {
    fn name(&self) -> &'static str {
        "sweep-add-product-into"
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
        let (dy, x) = (f32s_any(s2)?, f32s_any(s3)?);
        let (n, out) = l2.shape().dims2()?;
        let inp = l3.shape().dims2()?.1;
        let CpuStorage::F32(buf) = s1 else {
            bail!("expected f32 data")
        };
        let (sd, sx) = (l2.stride(), l3.stride());
        // Every index below stays inside its slice: the layouts describe them.
        let (dy_end, x_end) = (
            l2.start_offset() + (n - 1) * sd[0] + (out - 1) * sd[1] + 1,
            l3.start_offset() + (n - 1) * sx[0] + (inp - 1) * sx[1] + 1,
        );
        let buf_end = l1.start_offset() + out * inp;
        if n == 0 || dy_end > dy.len() || x_end > x.len() || buf_end > buf.len() {
            bail!("a layout reaches outside its data");
        }
        // SAFETY: dst is the contiguous out × in buffer (row stride `inp`),
        // lhs = dyᵀ read through dy's strides (lhs(i, p) = dy[p, i]), rhs = x
        // through its own; all three lie inside their slices (checked above)
        // and dst does not alias the operands (a separate storage).
        unsafe {
            gemm_f32(
                (out, inp, n),
                buf.as_mut_ptr().add(l1.start_offset()),
                true,
                (dy.as_ptr().add(l2.start_offset()), sd[0], sd[1]),
                (x.as_ptr().add(l3.start_offset()), sx[1], sx[0]),
            )
        };
        Ok(())
    }
}

/// Its cases for `sweep bench kernels`: a weight's gradient with `w2`'s
/// shapes, in the inputs' dtype and with bf16 operands into the buffer (as
/// bf16-mixed makes it: operands rounded on the way in).
pub fn cases(s: &Shapes) -> anyhow::Result<Vec<Case>> {
    let (d, f, n) = (s.cfg.dim, s.cfg.ffn_hidden(), s.tokens());
    [
        ("weight gradient", false, 26),
        ("weight gradient, bf16 operands", true, 29),
    ]
    .into_iter()
    .map(|(op, bf16, seed)| {
        Ok(Case {
            flops: 2.0 * (n * d * f) as f64,
            mixed: bf16,
            ..Case::new(
                crate::train::ops::Kernel::WeightGrad,
                op,
                format!("[{d}, {f}] over {n} rows"),
                2 * d * f + n * (d + f),
                vec![
                    random(&[d, f], seed, 0.1)?,
                    random(&[n, d], seed + 1, 1.0)?,
                    random(&[n, f], seed + 2, 1.0)?,
                ],
                Box::new(move |t| {
                    let mut buf = t[0].clone();
                    add_product(&mut buf, &t[1], &t[2], bf16)?;
                    Ok(vec![buf])
                }),
            )
        })
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::ops::testing::{max_diff, rand};
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
