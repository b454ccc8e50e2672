//! Attention for training. `eager`: Q·Kᵀ, a fused causal softmax, P·V, differentiable; grouped
//! queries stacked per KV head ([B, KV, rep·T, Q]), K and V never copied per query head.
//! `FlashAttention` (the `flash-attn` feature): candle-flash-attn's forward on CUDA (a reference
//! on the CPU); it ships no backward, so `bwd` recomputes attention a tile of queries at a time
//! ([`tiled_backward`]), or runs sweep's fused kernels ([`fused_backward`]).

use super::linear::matmul;
use super::softmax::{self, softmax};
use super::store::Store;
use crate::train::network::kernels::{u32_of, LaunchPlan, Mem, Ty, Value, ATTENTION};
use candle_core::backend::{BackendDevice, BackendStorage};
use candle_core::{CpuStorage, CustomOp1, CustomOp3, DType, Layout, Result, Shape, Tensor};

/// q [B, H, T, Q]; k, v [B, KV, T, Q]. Returns [B, H, T, Q]; `bf16`: products in bf16.
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
    let _part = crate::train::network::parts::op(crate::train::network::parts::Op::Attention);
    let (b, h, t, d) = q.dims4()?;
    let kv = k.dim(1)?;
    let q = q.reshape((b, kv, (h / kv) * t, d))?;
    let scores = matmul(&q, &k.t()?, bf16)?;
    let p = softmax(&scores, 1.0 / (d as f64).sqrt(), t, 0, causal)?;
    Ok((matmul(&p, v, bf16)?.reshape((b, h, t, d))?, p))
}

/// The gradients of [`eager`] for q, k, v from its output's, from the forward's probabilities
/// `p` (or recomputed): dV = Pᵀ dO; dP = dO Vᵀ; dS = P∘(dP − rowsum(P∘dP))·scale; dQ = dS K;
/// dK = dSᵀ Q. Stacked queries make the products sum dK and dV over a group by themselves.
pub fn eager_backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    p: Option<&Tensor>,
    d_o: &Tensor,
    causal: bool,
    bf16: bool,
) -> Result<(Tensor, Tensor, Tensor)> {
    let _part = crate::train::network::parts::op(crate::train::network::parts::Op::Attention);
    let (b, h, t, d) = q.dims4()?;
    let kv = k.dim(1)?;
    let scale = 1.0 / (d as f64).sqrt();
    let qg = q.reshape((b, kv, (h / kv) * t, d))?;
    let dog = d_o.reshape((b, kv, (h / kv) * t, d))?;
    let p = match p {
        Some(p) => p.clone(),
        None => softmax(&matmul(&qg, &k.t()?, bf16)?, scale, t, 0, causal)?,
    };
    let dv = matmul(&p.t()?, &dog, bf16)?;
    let dp = matmul(&dog, &v.t()?, bf16)?;
    let ds = softmax::backward(&p, &dp, scale)?;
    drop((p, dp));
    let dq = matmul(&ds, k, bf16)?.reshape((b, h, t, d))?;
    let dk = matmul(&ds.t()?, &qg, bf16)?;
    Ok((dq, dk, dv))
}

/// Flash attention in its own layout, q [B, T, H, Q], k, v [B, T, KV, Q]; where its kernel is
/// not to run ([`super::own_kernel`]), [`eager`] attention.
pub fn flash(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool) -> Result<Tensor> {
    let _part = crate::train::network::parts::op(crate::train::network::parts::Op::Attention);
    if !super::own_kernel(super::Kernel::Flash, &[q, k, v]) {
        let heads_first = |x: &Tensor| x.transpose(1, 2)?.contiguous();
        let o = eager(
            &heads_first(q)?,
            &heads_first(k)?,
            &heads_first(v)?,
            causal,
            false,
        )?;
        return o.transpose(1, 2)?.contiguous();
    }
    let d = q.dim(3)?;
    q.apply_op3(
        k,
        v,
        FlashAttention {
            scale: 1.0 / (d as f32).sqrt(),
            causal,
        },
    )
}

/// Flash attention's forward (candle-flash-attn's on CUDA); its backward is [`tiled_backward`]
/// (no output needed: rowsum(P∘dP) over a tile's full rows equals rowsum(dO∘O)).
#[derive(Debug, Clone, Copy)]
pub struct FlashAttention {
    pub scale: f32,
    pub causal: bool,
}

impl CustomOp3 for FlashAttention {
    fn name(&self) -> &'static str {
        "sweep-flash-attention"
    }

    /// The reference forward in f32 loops, which the GPU's is checked against (bf16 in and out
    /// on the emulated device).
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        use super::f32_values;
        let (q, k, v) = (
            f32_values(s1, l1)?,
            f32_values(s2, l2)?,
            f32_values(s3, l3)?,
        );
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
                    for pj in &mut p[..n] {
                        *pj = super::exp::exp(*pj - max);
                    }
                    let sum: f32 = p[..n].iter().sum();
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
        let o = match s1 {
            CpuStorage::BF16(_) => {
                CpuStorage::BF16(o.into_iter().map(half::bf16::from_f32).collect())
            }
            _ => CpuStorage::F32(o),
        };
        Ok((o, l1.shape().clone()))
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
}

/// Bytes of one score-sized tensor of a tile (four are alive together at most).
const TILE_BYTES: usize = 1 << 28;

/// Query positions per tile for B×H heads over T positions: about T/8 (8 causal tiles do ~56%
/// of the full work), fewer where scores would pass `TILE_BYTES`; a multiple of 64 from 64.
pub fn tile_rows(b: usize, h: usize, t: usize, dtype: DType) -> usize {
    let per_row = [h, t, dtype.size_in_bytes()]
        .iter()
        .fold(b, |n, &x| n.saturating_mul(x))
        .max(1);
    let target = (t / 8).next_multiple_of(64).max(64);
    let rows = (TILE_BYTES / per_row).clamp(1, target.min(t.max(1)));
    if rows >= 64 {
        rows / 64 * 64
    } else {
        rows
    }
}

/// Attention's gradients by recomputation, `tile` queries at a time (`None`: [`tile_rows`]):
/// per tile, S = Q Kᵀ; P = softmax(S·scale); then as [`eager_backward`] — products in the
/// inputs' dtype, the rest and the sums in f32 in a fixed order. Returns dq, dk, dv in q's dtype.
pub fn tiled_backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    d_o: &Tensor,
    causal: bool,
    tile: Option<usize>,
) -> Result<(Tensor, Tensor, Tensor)> {
    let _part = crate::train::network::parts::op(crate::train::network::parts::Op::Attention);
    let (b, h, t, d) = q.dims4()?;
    let kv = k.dim(1)?;
    let tile = tile.unwrap_or_else(|| tile_rows(b, h, t, q.dtype()));
    if kv == 0 || h % kv != 0 || tile == 0 {
        candle_core::bail!(
            "attention backward: {h} query heads over {kv} KV heads, tiles of {tile}"
        );
    }
    let rep = h / kv;
    let scale = 1.0 / (d as f64).sqrt();
    let work = super::work_dtype(q);
    let (k, v) = (k.contiguous()?, v.contiguous()?);
    let (mut dk, mut dv) = (None, None);
    let mut dq_tiles = Vec::new();
    // Last tile first: it sees every key, so it starts the dK and dV sums.
    let firsts: Vec<usize> = (0..t).step_by(tile).collect();
    for &first in firsts.iter().rev() {
        let len = tile.min(t - first);
        let keys = if causal { first + len } else { t };
        let group = |x: &Tensor| -> Result<Tensor> {
            positions(x, first, len)?.reshape((b, kv, rep * len, d))
        };
        let (qt, dot) = (group(q)?, group(d_o)?);
        let (kt, vt) = (k.narrow(2, 0, keys)?, v.narrow(2, 0, keys)?);
        let (s, dp) = (qt.matmul(&kt.t()?)?, dot.matmul(&vt.t()?)?);
        let (p, ds) = softmax::forward_backward(&s, &dp, scale, len, first, causal)?;
        drop((s, dp));
        add_to_keys(&mut dv, &p, &dot, (b, kv, t, d), work)?;
        drop(p);
        add_to_keys(&mut dk, &ds, &qt, (b, kv, t, d), work)?;
        dq_tiles.push(ds.matmul(&kt)?.reshape((b, h, len, d))?);
    }
    dq_tiles.reverse();
    let dtype = q.dtype();
    let total = |x: Option<Tensor>| -> Result<Tensor> {
        match x {
            Some(x) => x.to_dtype(dtype),
            None => Tensor::zeros((b, kv, t, d), dtype, q.device()),
        }
    };
    let dq = if dq_tiles.is_empty() {
        Tensor::zeros((b, h, t, d), dtype, q.device())?
    } else {
        Tensor::cat(&dq_tiles, 2)?
    };
    Ok((dq, total(dk)?, total(dv)?))
}

/// [`tiled_backward`]'s gradients by sweep's fused kernels on a GPU (`attention.cu`:
/// FlashAttention-2's backward on tensor cores) where [`super::own_kernel`] allows and the
/// shapes fit; the tiled backward everywhere else.
pub fn fused_backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    d_o: &Tensor,
    causal: bool,
) -> Result<(Tensor, Tensor, Tensor)> {
    // bf16 alone on a GPU (the f32 entry points are for the emulation's comparison).
    if super::gpu_path(q.device())
        && q.dtype() == DType::BF16
        && super::own_kernel(super::Kernel::AttentionBackward, &[q, k, v, d_o])
    {
        let _part = crate::train::network::parts::op(crate::train::network::parts::Op::Attention);
        let (b, h, t, d) = q.dims4()?;
        let kv = k.dim(1)?;
        if fused_shapes((b, h, kv, t, d)).is_ok() {
            let (q, k) = (q.contiguous()?, k.contiguous()?);
            let op = FusedBackward {
                v: v.contiguous()?,
                d_o: d_o.contiguous()?,
                causal,
            };
            let all = q.apply_op2_no_bwd(&k, &op)?;
            let (nq, nkv) = (b * h * t * d, b * kv * t * d);
            return Ok((
                all.narrow(0, 0, nq)?.reshape((b, h, t, d))?,
                all.narrow(0, nq, nkv)?.reshape((b, kv, t, d))?,
                all.narrow(0, nq + nkv, nkv)?.reshape((b, kv, t, d))?,
            ));
        }
    }
    tiled_backward(q, k, v, d_o, causal, None)
}

/// Why the fused kernels cannot take these shapes, if not: a head dimension no multiple of 16
/// up to 128, or query heads no multiple of KV heads.
pub fn fused_shapes(
    (b, h, kv, t, d): (usize, usize, usize, usize, usize),
) -> std::result::Result<(), String> {
    if d == 0 || d % 16 != 0 || d > 128 {
        return Err(format!(
            "head dimension {d}: the fused attention backward takes multiples of 16 up to 128"
        ));
    }
    if kv == 0 || h % kv != 0 {
        return Err(format!("{h} query heads over {kv} KV heads"));
    }
    // A grid's second dimension holds at most 65,535 blocks.
    if b * h > 65_535 {
        return Err(format!(
            "{b} sequences × {h} heads: more than a grid's 65,535 rows of blocks"
        ));
    }
    u32_of(t, "positions")?;
    Ok(())
}

/// The fused backward's launches on q, k, v, d_o (heads first, contiguous): one output
/// [dq; dk; dv], and two scratch buffers (log-sum-exp, Σ P∘dP) between its two kernels.
pub fn fused_backward_plan(
    (b, h, kv, t, d): (usize, usize, usize, usize, usize),
    own: Ty,
    causal: bool,
) -> std::result::Result<LaunchPlan, String> {
    fused_shapes((b, h, kv, t, d))?;
    let (nq, nkv) = (b * h * t * d, b * kv * t * d);
    let mut plan = LaunchPlan::default();
    let out = plan.output(own, nq + 2 * nkv);
    let lse = plan.scratch(Ty::F32, b * h * t);
    let delta = plan.scratch(Ty::F32, b * h * t);
    let blocks = u32_of(t.div_ceil(ATTENTION_ROWS), "the sequence's blocks")?;
    let scale = Value::F32(1.0 / (d as f32).sqrt());
    let dq = [Value::Ptr(out, 0), Value::Ptr(lse, 0), Value::Ptr(delta, 0)];
    let (dk, dv) = (Value::Ptr(out, nq), Value::Ptr(out, nq + nkv));
    let dkdv = [Value::Ptr(lse, 0), Value::Ptr(delta, 0), dk, dv];
    for (name, written, heads) in [
        ("attention_bwd_dq", &dq[..], b * h),
        ("attention_bwd_dkdv", &dkdv[..], b * kv),
    ] {
        let mut args: Vec<Value> = (0..4).map(|i| Value::Ptr(Mem::Operand(i), 0)).collect();
        args.extend_from_slice(written);
        args.extend([t, d, h, kv].map(|n| Value::U32(n as u32)));
        args.extend([Value::U32(u32::from(causal)), scale]);
        plan.launch(&ATTENTION, name, own, (blocks, heads as u32), args)?;
    }
    Ok(plan)
}

/// Query rows (or keys) a block of the fused kernels takes (`ATT_ROWS`).
const ATTENTION_ROWS: usize = 128;

/// [`fused_backward`]'s kernels as an op on (q, k), with v and d_o held.
struct FusedBackward {
    v: Tensor,
    d_o: Tensor,
    causal: bool,
}

impl candle_core::CustomOp2 for FusedBackward {
    fn name(&self) -> &'static str {
        "sweep-attention-fused-backward"
    }

    fn cpu_fwd(
        &self,
        q: &CpuStorage,
        ql: &Layout,
        k: &CpuStorage,
        kl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        if !super::emulating() {
            candle_core::bail!(
                "the fused attention backward runs on GPUs only (the CPU takes the tiled one)"
            );
        }
        self.gpu(q, ql, k, kl)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        q: &candle_core::CudaStorage,
        ql: &Layout,
        k: &candle_core::CudaStorage,
        kl: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        self.gpu(q, ql, k, kl)
    }
}

impl FusedBackward {
    fn gpu<S: Store>(&self, q: &S, ql: &Layout, k: &S, kl: &Layout) -> Result<(S, Shape)> {
        let (b, h, t, d) = ql.shape().dims4()?;
        let kv = kl.shape().dims4()?.1;
        let plan = fused_backward_plan((b, h, kv, t, d), q.ty()?, self.causal)
            .map_err(candle_core::Error::Msg)?;
        let (v, vl) = self.v.storage_and_layout();
        let (d_o, dol) = self.d_o.storage_and_layout();
        let operands = [
            q.operand(ql)?,
            k.operand(kl)?,
            S::held(&v, "attention's v")?.operand(vl)?,
            S::held(&d_o, "attention's output gradient")?.operand(dol)?,
        ];
        let all = S::execute(&q.device(), &plan, &operands)?.remove(0);
        Ok((all, Shape::from(plan.outputs[0].1)))
    }
}

/// x [B, H, T, Q] at positions first..first + len, contiguous, by one 2-D copy (candle's
/// strided copy took 12 ms of ref-1b's step on an H100).
fn positions(x: &Tensor, first: usize, len: usize) -> Result<Tensor> {
    let (_, _, t, _) = x.dims4()?;
    if first + len > t {
        candle_core::bail!("positions {first}..{} of {t}", first + len);
    }
    // candle's CUDA copy2d indexes with 32 bits.
    if !x.is_contiguous() || x.elem_count() > u32::MAX as usize {
        return x.narrow(2, first, len)?.contiguous();
    }
    x.apply_op1_no_bwd(&Positions { first, len })
}

struct Positions {
    first: usize,
    len: usize,
}

impl Positions {
    /// The output's shape and the copy: rows, values a row, the input's row stride, its first value.
    fn plan(&self, l: &Layout) -> Result<(Shape, [usize; 4])> {
        let (b, h, t, q) = l.shape().dims4()?;
        if !l.is_contiguous() || self.first + self.len > t {
            candle_core::bail!("positions {}..+{} of {:?}", self.first, self.len, l.shape());
        }
        let copy = [
            b * h,
            self.len * q,
            t * q,
            l.start_offset() + self.first * q,
        ];
        Ok(((b, h, self.len, q).into(), copy))
    }

    /// The copy on either backend: every value read lies in the input's contiguous range.
    fn run<S>(&self, s: &S, l: &Layout) -> Result<(S, Shape)>
    where
        S: BackendStorage,
        S::Device: BackendDevice<Storage = S>,
    {
        let (shape, [rows, width, stride, offset]) = self.plan(l)?;
        // SAFETY: copy2d writes every value of the output before it is read.
        let mut out = unsafe { s.device().alloc_uninit(&shape, s.dtype())? };
        s.copy2d(&mut out, rows, width, stride, width, offset, 0)?;
        Ok((out, shape))
    }
}

impl CustomOp1 for Positions {
    fn name(&self) -> &'static str {
        "sweep-attention-positions"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        self.run(s, l)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        self.run(s, l)
    }
}

/// sum [B, KV, T, Q] [.., :keys, :] += aᵀ·b in `work`: on a GPU in f32, one batched cuBLAS
/// product into the sum; elsewhere the product in the operands' dtype, cast and added.
fn add_to_keys(
    sum: &mut Option<Tensor>,
    a: &Tensor,
    b: &Tensor,
    shape: (usize, usize, usize, usize),
    work: DType,
) -> Result<()> {
    // The attention backward's check (Softmax) and cuBLAS's in-place products' both guard this.
    if work == DType::F32
        && super::own_kernel(super::Kernel::Softmax, &[a, b])
        && super::gpu_path(a.device())
        && super::on_gpu(super::Kernel::WeightGrad)
    {
        if sum.is_none() {
            *sum = Some(Tensor::zeros(shape, DType::F32, a.device())?);
        }
        if let Some(total) = sum {
            return super::linear::add_batched_product(total, a, b);
        }
    }
    let part = a.t()?.matmul(b)?.to_dtype(work)?;
    match sum {
        None => *sum = Some(part),
        Some(total) => {
            let keys = part.dim(2)?;
            let added = (total.narrow(2, 0, keys)? + part)?;
            total.slice_set(&added, 2, 0)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::network::ops::testing::{max_diff, rand};
    use crate::train::network::ops::{rope, softmax};
    use candle_core::DType;
    use candle_core::Var;

    /// Shapes of the fused kernels' emulation: (batch, heads, KV heads,
    /// positions, head dimension, causal) — positions that fill no tile or
    /// block (a block takes 128, a tile 32), past one block, head
    /// dimensions 16 to 128, grouped queries, and a non-causal case.
    const FUSED_SHAPES: [(usize, usize, usize, usize, usize, bool); 4] = [
        (1, 2, 1, 37, 64, true),
        (1, 2, 2, 130, 16, true),
        (1, 1, 1, 19, 128, true),
        (2, 2, 1, 33, 32, false),
    ];

    /// Shapes the fused kernels cannot take go to the tiled backward.
    #[test]
    fn the_fused_kernels_refuse_what_they_cannot_take() {
        assert!(fused_shapes((8, 16, 4, 2048, 128)).is_ok());
        assert!(fused_shapes((2, 4, 2, 37, 16)).is_ok());
        for bad in [
            (1, 4, 2, 32, 8),
            (1, 4, 2, 32, 144),
            (1, 4, 2, 32, 0),
            (1, 4, 3, 32, 64),
            (1, 4, 0, 32, 64),
            (2_048, 64, 8, 32, 64),
        ] {
            assert!(fused_shapes(bad).is_err(), "{bad:?}");
        }
    }

    /// The fused kernels under the host emulation of CUDA (their tensor-core
    /// products by the fragments' layouts) against the tiled backward on the
    /// CPU, on inputs rounded to bf16: within the tolerance of the chained
    /// bf16 products (P and dS are rounded between them), for f32 and bf16
    /// storage. The two storages hold the same values and compute the same
    /// sums, so each bf16 store is exactly the f32 result rounded.
    #[test]
    fn the_fused_backward_equals_the_tiled_one_under_emulation() -> Result<()> {
        use crate::train::network::ops::testing::{
            assert_rounded, buffer, emulate, emulate_off_alignment, tensor,
        };
        for (n, &(b, h, kv, t, d, causal)) in FUSED_SHAPES.iter().enumerate() {
            let bf16 = |x: Tensor| x.to_dtype(DType::BF16)?.to_dtype(DType::F32);
            let q = bf16(rand(&[b, h, t, d], 1))?;
            let k = bf16(rand(&[b, kv, t, d], 2))?;
            let v = bf16(rand(&[b, kv, t, d], 3))?;
            let d_o = bf16(rand(&[b, h, t, d], 4))?;
            let inputs = [&q, &k, &v, &d_o];
            let run = |own: Ty, race: bool| {
                let plan = fused_backward_plan((b, h, kv, t, d), own, causal).unwrap();
                let operands: Vec<_> = inputs.iter().map(|x| buffer(x, own)).collect();
                let (out, _) = emulate(&plan, &operands, race)?;
                // Operands off the 16- and 4-byte alignment: the narrow loads, the same bits.
                let (shifted, _) = emulate_off_alignment(&plan, &operands);
                assert_eq!(shifted, out, "{:?} {own:?}, shifted", FUSED_SHAPES[n]);
                out.into_iter().next()
            };
            let Some(f32s) = run(Ty::F32, n == 3) else {
                return Ok(());
            };
            let bf16s = run(Ty::Bf16, false).unwrap();
            let (nq, nkv) = (b * h * t * d, b * kv * t * d);
            let all = tensor(&f32s, &[nq + 2 * nkv]);
            assert_rounded(&bf16s, &all, 0.0, 0.0);
            let (dq, dk, dv) = tiled_backward(&q, &k, &v, &d_o, causal, None)?;
            for (name, want, first) in [("dq", dq, 0), ("dk", dk, nq), ("dv", dv, nq + nkv)] {
                let got = all
                    .narrow(0, first, want.elem_count())?
                    .reshape(want.shape())?;
                let scale = want.abs()?.max_all()?.to_scalar::<f32>()?;
                let err = max_diff(&got, &want)? / scale;
                assert!(
                    err < 3.2e-2,
                    "{name} at {:?}: relative error {err:e}",
                    FUSED_SHAPES[n]
                );
            }
        }
        Ok(())
    }

    #[test]
    fn a_tiles_positions_are_copied_as_narrow_makes_them() -> Result<()> {
        let x = rand(&[2, 3, 11, 5], 1);
        for dtype in [DType::F32, DType::BF16] {
            let x = x.to_dtype(dtype)?;
            for (first, len) in [(0, 11), (0, 4), (4, 4), (8, 3), (10, 1), (5, 0)] {
                let want = x.narrow(2, first, len)?.contiguous()?;
                let got = positions(&x, first, len)?;
                assert_eq!(got.dims(), want.dims());
                assert!(got.is_contiguous());
                let (a, b) = (got.to_dtype(DType::F32)?, want.to_dtype(DType::F32)?);
                assert_eq!(
                    a.flatten_all()?.to_vec1::<f32>()?,
                    b.flatten_all()?.to_vec1::<f32>()?,
                    "{dtype:?} {first}+{len}"
                );
            }
        }
        // A view that starts inside its storage, and one that is not contiguous.
        let y = rand(&[3, 3, 11, 5], 2);
        let inner = y.narrow(0, 1, 2)?;
        let want = inner.narrow(2, 3, 6)?.contiguous()?;
        assert_eq!(max_diff(&positions(&inner, 3, 6)?, &want)?, 0.0);
        let transposed = y.transpose(1, 2)?.transpose(1, 2)?.narrow(1, 0, 2)?;
        let want = transposed.narrow(2, 3, 6)?.contiguous()?;
        assert_eq!(max_diff(&positions(&transposed, 3, 6)?, &want)?, 0.0);
        assert!(positions(&x, 8, 4).is_err());
        Ok(())
    }

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
        let p = crate::train::network::ops::composed_here(|| {
            softmax::softmax(&s, 1.0 / (d as f64).sqrt(), t, 0, causal)
        })?;
        p.matmul(&vh)?.transpose(1, 2)
    }

    #[test]
    fn the_tiled_backward_matches_autograd() -> Result<()> {
        // Causal and not; GQA 4:2 and 6:1; tiles that do not divide T, one
        // position per tile, and one tile for all.
        for (h, kv, tile, causal) in [
            (4, 2, 3, true),
            (4, 2, 3, false),
            (6, 1, 1, true),
            (2, 2, 7, true),
            (2, 2, 100, false),
        ] {
            let (b, t, d) = (2, 7, 8);
            let q = Var::from_tensor(&rand(&[b, t, h, d], 1))?;
            let k = Var::from_tensor(&rand(&[b, t, kv, d], 2))?;
            let v = Var::from_tensor(&rand(&[b, t, kv, d], 3))?;
            let d_o = rand(&[b, t, h, d], 4);
            let op = FlashAttention {
                scale: 1.0 / (d as f32).sqrt(),
                causal,
            };
            let ours = q.apply_op3(&k, &v, op)?;
            let reference = autograd_reference(&q, &k, &v, causal)?;
            assert!(max_diff(&ours, &reference)? < 1e-5, "forward h={h} kv={kv}");
            let heads_first = |x: &Tensor| x.transpose(1, 2);
            let (dq, dk, dv) = tiled_backward(
                &heads_first(&q)?,
                &heads_first(&k)?,
                &heads_first(&v)?,
                &heads_first(&d_o)?,
                causal,
                Some(tile),
            )?;
            let g = (reference * &d_o)?.sum_all()?.backward()?;
            for (name, ours, x) in [("dq", dq, &q), ("dk", dk, &k), ("dv", dv, &v)] {
                let diff = max_diff(&heads_first(&ours)?, g.get(x).unwrap())?;
                assert!(
                    diff < 1e-5,
                    "{name}: {diff} (h={h} kv={kv} tile={tile} causal={causal})"
                );
            }
        }
        Ok(())
    }

    #[test]
    fn the_tiled_backward_equals_autograd_in_f64() -> Result<()> {
        for (tile, causal) in [(2, true), (5, true), (4, false), (9, true)] {
            let (b, t, h, kv, d) = (2, 9, 6, 2, 8);
            let f64s = |x: Tensor| x.to_dtype(DType::F64);
            let q = Var::from_tensor(&f64s((rand(&[b, h, t, d], 13) * 3.0)?)?)?;
            let k = Var::from_tensor(&f64s(rand(&[b, kv, t, d], 14))?)?;
            let v = Var::from_tensor(&f64s(rand(&[b, kv, t, d], 15))?)?;
            let d_o = f64s(rand(&[b, h, t, d], 16))?;
            let g = (eager(&q, &k, &v, causal, false)? * &d_o)?
                .sum_all()?
                .backward()?;
            let (dq, dk, dv) = tiled_backward(&q, &k, &v, &d_o, causal, Some(tile))?;
            for (name, ours, x) in [("dq", dq, &q), ("dk", dk, &k), ("dv", dv, &v)] {
                let want = g.get(x).unwrap();
                let diff = (&ours - want)?.abs()?.max_all()?.to_scalar::<f64>()?;
                let size = want.abs()?.max_all()?.to_scalar::<f64>()?;
                assert!(
                    diff <= 1e-12 * size,
                    "{name} tile={tile} causal={causal}: {diff} of {size}"
                );
            }
        }
        Ok(())
    }

    #[test]
    fn tiles_fit_the_budget_and_skip_masked_keys() {
        // ref-1b at batch 8: T/8 positions per tile, a multiple of 64.
        assert_eq!(tile_rows(8, 32, 2048, DType::BF16), 256);
        // A larger batch: fewer positions, within TILE_BYTES per tensor.
        let rows = tile_rows(64, 32, 2048, DType::F32);
        assert!(
            rows * 64 * 32 * 2048 * 4 <= TILE_BYTES && rows > 0,
            "{rows}"
        );
        // Tiny shapes: at least one position, at most T.
        assert_eq!(tile_rows(1, 1, 7, DType::F32), 7);
        assert_eq!(tile_rows(1 << 20, 64, 1 << 16, DType::F32), 1);
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
        let heads_first = |x: &Tensor| x.transpose(1, 2);
        let (dq, dk, dv) = eager_backward(&qh, &kh, &vh, None, &heads_first(&d_o)?, true, false)?;
        let g = (reference * &d_o)?.sum_all()?.backward()?;
        for (ours, x) in [(dq, &q), (dk, &k), (dv, &v)] {
            assert!(max_diff(&heads_first(&ours)?, g.get(x).unwrap())? < 1e-5);
        }
        Ok(())
    }
}
