//! Attention for training.
//!
//! - `eager`: Q·Kᵀ, a fused causal softmax, P·V, all differentiable. Grouped
//!   queries are stacked per KV head ([B, KV, rep·T, Q]) and multiplied with
//!   K and V directly, without copying K/V per query head.
//! - `FlashAttention`: the training op of the `flash-attn` feature. Its
//!   forward is candle-flash-attn's kernel on CUDA (a reference computation on
//!   the CPU); candle-flash-attn ships no backward, so `bwd` recomputes
//!   attention in f32 with candle ops, a chunk of (batch, head) pairs at a
//!   time. The CPU forward lets the tests check that backward against autograd.

use super::ops::matmul::matmul;
use super::ops::softmax::softmax;
use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor, D};

/// q [B, H, T, Q]; k, v [B, KV, T, Q] (heads first). Returns [B, H, T, Q].
/// `bf16`: the two products with bf16 operands (the CPU's bf16-mixed precision).
pub fn eager(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool, bf16: bool) -> Result<Tensor> {
    Ok(eager_keeping_probabilities(q, k, v, causal, bf16)?.0)
}

/// [`eager`], and the probabilities P ([B, KV, rep·T, T]) for its backward.
pub fn eager_keeping_probabilities(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    causal: bool,
    bf16: bool,
) -> Result<(Tensor, Tensor)> {
    let (b, h, t, d) = q.dims4()?;
    let kv = k.dim(1)?;
    let q = q.reshape((b, kv, (h / kv) * t, d))?;
    let scores = matmul(&q, &k.t()?, bf16)?;
    let p = softmax(&scores, 1.0 / (d as f64).sqrt(), t, causal)?;
    Ok((matmul(&p, v, bf16)?.reshape((b, h, t, d))?, p))
}

/// The gradients of [`eager`] for q, k and v (heads first) from the gradient
/// of its output, without autograd, from the forward's probabilities `p`
/// (or, without them, recomputed from q and k as flash attention's backward
/// does): P = softmax(Q Kᵀ·scale); dV = Pᵀ dO; dP = dO Vᵀ; dS = P∘(dP − rowsum(P∘dP))·scale;
/// dQ = dS K; dK = dSᵀ Q. With the queries of a KV head's group stacked
/// ([B, KV, rep·T, Q]), the products sum dK and dV over the group by themselves.
pub fn eager_backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    p: Option<&Tensor>,
    d_o: &Tensor,
    causal: bool,
    bf16: bool,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (b, h, t, d) = q.dims4()?;
    let kv = k.dim(1)?;
    let scale = 1.0 / (d as f64).sqrt();
    let qg = q.reshape((b, kv, (h / kv) * t, d))?;
    let dog = d_o.reshape((b, kv, (h / kv) * t, d))?;
    let p = match p {
        Some(p) => p.clone(),
        None => softmax(&matmul(&qg, &k.t()?, bf16)?, scale, t, causal)?,
    };
    let dv = matmul(&p.t()?, &dog, bf16)?;
    let dp = matmul(&dog, &v.t()?, bf16)?;
    let ds = super::ops::softmax::backward(&p, &dp, scale)?;
    drop((p, dp));
    let dq = matmul(&ds, k, bf16)?.reshape((b, h, t, d))?;
    let dk = matmul(&ds.t()?, &qg, bf16)?;
    Ok((dq, dk, dv))
}

/// Flash attention in its own layout: q [B, T, H, Q], k, v [B, T, KV, Q].
pub fn flash(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool, chunk: usize) -> Result<Tensor> {
    let d = q.dim(3)?;
    q.apply_op3(
        k,
        v,
        FlashAttention {
            scale: 1.0 / (d as f32).sqrt(),
            causal,
            chunk: chunk.max(1),
        },
    )
}

#[derive(Debug, Clone, Copy)]
pub struct FlashAttention {
    pub scale: f32,
    pub causal: bool,
    /// (batch, head) pairs recomputed at once in the backward pass; peak extra
    /// memory is about chunk x T x T x 16 bytes.
    pub chunk: usize,
}

impl CustomOp3 for FlashAttention {
    fn name(&self) -> &'static str {
        "sweep-flash-attention"
    }

    /// The reference forward (f32 loops), so CPU tests exercise `bwd`.
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        use super::ops::f32s;
        let (q, k, v) = (f32s(s1, l1)?, f32s(s2, l2)?, f32s(s3, l3)?);
        let (b, t, h, d) = l1.shape().dims4()?;
        let kv = l2.shape().dims4()?.2;
        let rep = h / kv;
        let mut o = vec![0f32; q.len()];
        let mut p = vec![0f32; t];
        for bi in 0..b {
            for hi in 0..h {
                let g = hi / rep;
                for i in 0..t {
                    let qi = &q[((bi * t + i) * h + hi) * d..][..d];
                    let n = if self.causal { i + 1 } else { t };
                    let mut max = f32::NEG_INFINITY;
                    for (j, pj) in p[..n].iter_mut().enumerate() {
                        let kj = &k[((bi * t + j) * kv + g) * d..][..d];
                        *pj = qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>() * self.scale;
                        max = max.max(*pj);
                    }
                    let mut sum = 0.0;
                    for pj in &mut p[..n] {
                        *pj = (*pj - max).exp();
                        sum += *pj;
                    }
                    let oi = &mut o[((bi * t + i) * h + hi) * d..][..d];
                    for (j, pj) in p[..n].iter().enumerate() {
                        let vj = &v[((bi * t + j) * kv + g) * d..][..d];
                        for (o, v) in oi.iter_mut().zip(vj) {
                            *o += pj / sum * v;
                        }
                    }
                }
            }
        }
        Ok((CpuStorage::F32(o), l1.shape().clone()))
    }

    #[cfg(feature = "flash-attn")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let op = candle_flash_attn::FlashAttn {
            softmax_scale: self.scale,
            alibi_slopes: None,
            window_size_left: None,
            window_size_right: if self.causal { Some(0) } else { None },
            softcap: None,
        };
        op.cuda_fwd(s1, l1, s2, l2, s3, l3)
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        o: &Tensor,
        d_o: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (dq, dk, dv) = recompute_backward(q, k, v, o, d_o, *self)?;
        Ok((Some(dq), Some(dk), Some(dv)))
    }
}

/// The flash-attention backward by recomputation, in f32, `chunk` (batch,
/// head) pairs at a time:
/// S = Q Kᵀ·scale (masked), P = softmax(S); dV = Pᵀ dO; dP = dO Vᵀ;
/// Δ = rowsum(dO ∘ O); dS = P ∘ (dP − Δ); dQ = dS K·scale; dK = dSᵀ Q·scale;
/// dK and dV summed over the query heads that share a KV head.
pub fn recompute_backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    o: &Tensor,
    d_o: &Tensor,
    op: FlashAttention,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (b, t, h, d) = q.dims4()?;
    let kv = k.dim(2)?;
    let rep = h / kv;
    let dtype = q.dtype();
    let work = super::ops::work_dtype(q);
    let dev = q.device();
    // [B, T, H, Q] -> [B·H, T, Q] in f32 (f64 for f64).
    let rows = |x: &Tensor, heads: usize| -> Result<Tensor> {
        x.to_dtype(work)?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((b * heads, t, d))
    };
    let (q, k, v, o, d_o) = (
        rows(q, h)?,
        rows(k, kv)?,
        rows(v, kv)?,
        rows(o, h)?,
        rows(d_o, h)?,
    );
    let mask = if op.causal {
        let m: Vec<f32> = (0..t)
            .flat_map(|i| (0..t).map(move |j| if j <= i { 0.0 } else { f32::NEG_INFINITY }))
            .collect();
        Some(Tensor::from_vec(m, (1, t, t), dev)?.to_dtype(work)?)
    } else {
        None
    };
    let mut dq_parts = Vec::new();
    let mut dk = Tensor::zeros((b * kv, t, d), work, dev)?;
    let mut dv = Tensor::zeros((b * kv, t, d), work, dev)?;
    let mut start = 0;
    while start < b * h {
        let n = op.chunk.min(b * h - start);
        // The KV row of each (batch, head) pair in the chunk.
        let kv_rows: Vec<u32> = (start..start + n)
            .map(|i| ((i / h) * kv + (i % h) / rep) as u32)
            .collect();
        let kv_idx = Tensor::from_vec(kv_rows, n, dev)?;
        let (qc, oc, doc) = (
            q.narrow(0, start, n)?,
            o.narrow(0, start, n)?,
            d_o.narrow(0, start, n)?,
        );
        let (kc, vc) = (k.index_select(&kv_idx, 0)?, v.index_select(&kv_idx, 0)?);
        let mut s = (qc.matmul(&kc.t()?)? * op.scale as f64)?;
        if let Some(m) = &mask {
            s = s.broadcast_add(m)?;
        }
        let p = candle_nn::ops::softmax(&s, D::Minus1)?;
        let dv_c = p.t()?.matmul(&doc)?;
        let dp = doc.matmul(&vc.t()?)?;
        let delta = (&doc * &oc)?.sum_keepdim(D::Minus1)?;
        let ds = (&p * dp.broadcast_sub(&delta)?)?;
        dq_parts.push((ds.matmul(&kc)? * op.scale as f64)?);
        let dk_c = (ds.t()?.matmul(&qc)? * op.scale as f64)?;
        dk = dk.index_add(&kv_idx, &dk_c, 0)?;
        dv = dv.index_add(&kv_idx, &dv_c, 0)?;
        start += n;
    }
    let back = |x: Tensor, heads: usize| -> Result<Tensor> {
        x.reshape((b, heads, t, d))?
            .transpose(1, 2)?
            .contiguous()?
            .to_dtype(dtype)
    };
    Ok((
        back(Tensor::cat(&dq_parts, 0)?, h)?,
        back(dk, kv)?,
        back(dv, kv)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::ops::testing::{max_diff, rand};
    use crate::train::ops::{rope, softmax};
    use candle_core::DType;
    use candle_core::Var;

    /// Attention from plain differentiable candle ops, in flash layout.
    fn autograd_reference(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool) -> Result<Tensor> {
        let (b, t, h, d) = q.dims4()?;
        let kv = k.dim(2)?;
        let rep = h / kv;
        let qh = rope::composed(q, None)?; // [B, H, T, Q]
        let expand = |x: &Tensor| -> Result<Tensor> {
            let x = rope::composed(x, None)?; // [B, KV, T, Q]
            x.unsqueeze(2)?
                .expand((b, kv, rep, t, d))?
                .reshape((b, h, t, d))
        };
        let (kh, vh) = (expand(k)?, expand(v)?);
        let s = qh.matmul(&kh.t()?)?;
        let p = softmax::composed(&s, 1.0 / (d as f64).sqrt(), t, causal)?;
        p.matmul(&vh)?.transpose(1, 2)
    }

    #[test]
    fn the_recompute_backward_matches_autograd() -> Result<()> {
        // Causal and not; GQA 4:2 and 6:1; chunks that do not divide B·H.
        for (h, kv, chunk, causal) in [
            (4, 2, 3, true),
            (4, 2, 8, false),
            (6, 1, 5, true),
            (2, 2, 1, false),
        ] {
            let (b, t, d) = (2, 7, 8);
            let q = Var::from_tensor(&rand(&[b, t, h, d], 1))?;
            let k = Var::from_tensor(&rand(&[b, t, kv, d], 2))?;
            let v = Var::from_tensor(&rand(&[b, t, kv, d], 3))?;
            let d_o = rand(&[b, t, h, d], 4);
            let ours = flash(&q, &k, &v, causal, chunk)?;
            let reference = autograd_reference(&q, &k, &v, causal)?;
            assert!(max_diff(&ours, &reference)? < 1e-5, "forward h={h} kv={kv}");
            let g1 = (ours * &d_o)?.sum_all()?.backward()?;
            let g2 = (reference * &d_o)?.sum_all()?.backward()?;
            for (name, x) in [("dq", &q), ("dk", &k), ("dv", &v)] {
                let diff = max_diff(g1.get(x).unwrap(), g2.get(x).unwrap())?;
                assert!(
                    diff < 1e-5,
                    "{name}: {diff} (h={h} kv={kv} chunk={chunk} causal={causal})"
                );
            }
        }
        Ok(())
    }

    #[test]
    fn the_explicit_eager_backward_equals_autograd_in_f64() -> Result<()> {
        for causal in [true, false] {
            let (b, t, h, kv, d) = (2, 6, 4, 2, 8);
            let f64s = |x: Tensor| x.to_dtype(DType::F64);
            let q = Var::from_tensor(&f64s(rand(&[b, h, t, d], 9))?)?;
            let k = Var::from_tensor(&f64s(rand(&[b, kv, t, d], 10))?)?;
            let v = Var::from_tensor(&f64s(rand(&[b, kv, t, d], 11))?)?;
            let d_o = f64s(rand(&[b, h, t, d], 12))?;
            let g = (eager(&q, &k, &v, causal, false)? * &d_o)?
                .sum_all()?
                .backward()?;
            // With the forward's probabilities, and recomputing them.
            let (_, p) = eager_keeping_probabilities(&q, &k, &v, causal, false)?;
            for kept in [Some(&p), None] {
                let (dq, dk, dv) = eager_backward(&q, &k, &v, kept, &d_o, causal, false)?;
                for (name, ours, x) in [("dq", dq, &q), ("dk", dk, &k), ("dv", dv, &v)] {
                    let diff = (ours - g.get(x).unwrap())?
                        .abs()?
                        .max_all()?
                        .to_scalar::<f64>()?;
                    assert!(diff < 1e-13, "{name} causal={causal}: {diff}");
                }
            }
        }
        Ok(())
    }

    #[test]
    fn eager_grouped_attention_matches_the_reference() -> Result<()> {
        let (b, t, h, kv, d) = (2, 6, 4, 2, 8);
        let q = Var::from_tensor(&rand(&[b, t, h, d], 5))?;
        let k = Var::from_tensor(&rand(&[b, t, kv, d], 6))?;
        let v = Var::from_tensor(&rand(&[b, t, kv, d], 7))?;
        let (qh, kh, vh) = (
            rope::heads_first(&q, None)?,
            rope::heads_first(&k, None)?,
            rope::heads_first(&v, None)?,
        );
        let ours = eager(&qh, &kh, &vh, true, false)?.transpose(1, 2)?;
        let reference = autograd_reference(&q, &k, &v, true)?;
        assert!(max_diff(&ours, &reference)? < 1e-5);
        let d_o = rand(&[b, t, h, d], 8);
        let g1 = (ours * &d_o)?.sum_all()?.backward()?;
        let g2 = (reference * &d_o)?.sum_all()?.backward()?;
        for x in [&q, &k, &v] {
            assert!(max_diff(g1.get(x).unwrap(), g2.get(x).unwrap())? < 1e-5);
        }
        Ok(())
    }
}
