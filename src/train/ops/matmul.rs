//! The model's matrix products: candle's GEMM in the tensors' dtype, or with
//! `bf16` (the `bf16-mixed` precision: f32 tensors, bf16 products) the CPU's
//! bf16 kernel (AVX-512 BF16 or portable, [`bf16_gemm::selected`]), forward
//! and backward, and on a GPU cuBLAS's bf16 GEMM on
//! operands cast to bf16, as autocast does.

use super::bf16_gemm::{self, View};
use super::{f32s_any, fused};
use candle_core::{bail, CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};

pub fn matmul(a: &Tensor, b: &Tensor, bf16: bool) -> Result<Tensor> {
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

    // Autograd runs only in the tests (the oracle, [`crate::train::oracle`]).
    #[cfg(test)]
    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        _c: &Tensor,
        dc: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let da = dc.apply_op2_no_bwd(&b.t()?, &Bf16Matmul)?;
        let db = a.t()?.apply_op2_no_bwd(dc, &Bf16Matmul)?;
        Ok((Some(da), Some(db)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::ops::testing::rand;
    use candle_core::Var;

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
        let g = rand(&[2, 3, 20, 9], 3);
        let (g1, g2) = (
            (ours * &g)?.sum_all()?.backward()?,
            (want * &g)?.sum_all()?.backward()?,
        );
        assert!(rel(g1.get(&q).unwrap(), g2.get(&q).unwrap())? < 2e-2);
        assert!(rel(g1.get(&k).unwrap(), g2.get(&k).unwrap())? < 2e-2);
        let x = rand(&[37, 48], 4);
        let w = rand(&[65, 48], 5);
        assert!(rel(&matmul(&x, &w.t()?, true)?, &x.matmul(&w.t()?)?)? < 1e-2);
        Ok(())
    }
}
