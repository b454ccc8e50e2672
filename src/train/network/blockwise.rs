//! The model's forward and backward written out a block at a time (llm.c's shape): the forward
//! keeps a planned cache per block, the backward walks the blocks in reverse, frees each cache
//! once used and hands every weight's gradient over as it is made. candle's autograd takes no
//! part (weights are detached): it is the tests' oracle. A cache holds the block's input, q, k,
//! v after RoPE, the attention output, the residual and the `w1`/`w3` products; the rest is
//! recomputed (with `recompute = "blocks"`, all of it). Each op's backward is in [`super::ops`].

use super::grads::Grads;
use super::model::{Attention, Block, Llama, Mlp};
use super::ops::linear::{self, linear, matmul};
use super::ops::{self, accumulate, attention, cross_entropy, embedding, rms_norm, rope, silu_mul};
use crate::config::{AttentionKind, Recompute};
use anyhow::Result;
use candle_core::{DType, Tensor};

/// A micro-batch's token ids, [batch, seq], as the host holds them: the embedding's gradient
/// groups them there (reading them back from a GPU would wait for its queue).
#[derive(Clone, Copy, Debug)]
pub struct Tokens<'a> {
    ids: &'a [u32],
    batch: usize,
    seq: usize,
}

impl<'a> Tokens<'a> {
    pub fn new(ids: &'a [u32], batch: usize, seq: usize) -> Result<Self> {
        anyhow::ensure!(
            batch.checked_mul(seq) == Some(ids.len()),
            "{} token ids for a batch of {batch} × {seq}",
            ids.len()
        );
        Ok(Tokens { ids, batch, seq })
    }
}

/// What attention's backward needs: q, k and v after RoPE, in its forward's layout.
enum AttentionCache {
    /// Heads first: q [B, H, T, Q], k and v [B, KV, T, Q], and the probabilities P as PyTorch's
    /// eager attention keeps them (recomputing them cost the CPU 3–5% of a step).
    Eager {
        q: Tensor,
        k: Tensor,
        v: Tensor,
        p: Tensor,
    },
    /// Heads first, contiguous, in the kernel's dtype: the tiled backward copies a tile as one
    /// 2-D copy (flash's [B, T, H, Q] view took candle's strided copy).
    Flash { q: Tensor, k: Tensor, v: Tensor },
}

/// What a block's backward needs from its forward.
struct Saved {
    attention: AttentionCache,
    /// The attention output before `wo`, [N, H·Q].
    attended: Tensor,
    /// The residual stream after attention, [N, D].
    mid: Tensor,
    /// The `w1` and `w3` products, [N, F].
    gate: Tensor,
    up: Tensor,
}

/// One block's cache: its input, and the rest unless it is recomputed.
struct BlockCache {
    x: Tensor,
    saved: Option<Saved>,
}

fn bytes(t: &Tensor) -> usize {
    t.elem_count() * t.dtype().size_in_bytes()
}

impl BlockCache {
    fn bytes(&self) -> usize {
        let saved = self.saved.as_ref().map_or(0, |s| {
            let attention = match &s.attention {
                AttentionCache::Eager { q, k, v, p } => bytes(q) + bytes(k) + bytes(v) + bytes(p),
                AttentionCache::Flash { q, k, v } => bytes(q) + bytes(k) + bytes(v),
            };
            attention + bytes(&s.attended) + bytes(&s.mid) + bytes(&s.gate) + bytes(&s.up)
        });
        bytes(&self.x) + saved
    }
}

/// The bytes of all caches alive after the forward pass and after each block's backward.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CacheTrace {
    pub after_forward: usize,
    pub after_each_backward: Vec<usize>,
}

/// What a caller may want from inside a pass.
pub struct Probe<'a> {
    /// Called where the pass holds the most (every cache and the head input's gradient).
    pub at_peak: &'a mut dyn FnMut() -> Result<()>,
    /// Wait for the device at the forward's end, to time it apart (benchmarks; it costs a sync).
    pub sync_forward: bool,
    /// Called as the backward finishes parameters' gradients: they may be summed across ranks
    /// while the rest runs.
    pub on_ready: &'a mut dyn FnMut(Finished, &mut Grads) -> Result<()>,
}

/// Which parameters' gradients a backward pass has just finished, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finished {
    /// The output head and the final norm.
    Head,
    /// Block `i`'s.
    Block(usize),
    /// The token embeddings: the last.
    Embeddings,
}

impl Block {
    /// The block's weights.
    fn weights(&self) -> [&Tensor; 9] {
        let (a, m) = (&self.attention, &self.mlp);
        [
            &self.attention_norm,
            &a.wq,
            &a.wk,
            &a.wv,
            &a.wo,
            &self.ffn_norm,
            &m.w1,
            &m.w2,
            &m.w3,
        ]
    }
}

impl Llama {
    /// Every weight by the backward stage that finishes its gradient (gradient buckets' plan).
    pub fn stages(&self) -> Vec<(Finished, Vec<&Tensor>)> {
        let mut stages = vec![(Finished::Head, vec![&self.output, &self.norm])];
        for (i, block) in self.blocks.iter().enumerate().rev() {
            stages.push((Finished::Block(i), block.weights().to_vec()));
        }
        stages.push((Finished::Embeddings, vec![&self.embeddings]));
        stages
    }
}

/// The positions a pass runs over: `b` sequences of `t` tokens, and their rotary tables.
#[derive(Clone, Copy)]
pub(super) struct Seq<'a> {
    pub b: usize,
    pub t: usize,
    pub rope: &'a rope::RopeTables,
}

/// One forward and backward pass: the loss, the caches' memory and the forward's share of time.
pub struct Pass {
    pub loss: f64,
    pub trace: CacheTrace,
    pub forward_s: f64,
}

/// x [N, in] · wᵀ backwards: dx = dy · w returned, dw = dyᵀ · x added into w's gradient.
fn linear_backward(
    x: &Tensor,
    w: &Tensor,
    dy: &Tensor,
    bf16: bool,
    grads: &mut Grads,
) -> Result<Tensor> {
    grads.add_product(w, dy, x, bf16)?;
    Ok(matmul(dy, w, bf16)?)
}

/// [`linear_backward`] of a layer whose input feeds others too: dx is added into `sum` by
/// one GEMM.
fn linear_backward_into(
    sum: &mut Tensor,
    (x, w, dy): (&Tensor, &Tensor, &Tensor),
    bf16: bool,
    grads: &mut Grads,
) -> Result<()> {
    grads.add_product(w, dy, x, bf16)?;
    Ok(linear::add_input_gradient(sum, dy, w, bf16)?)
}

impl Attention {
    /// h [N, D] -> the attention's output after `wo`, [N, D], and its cache.
    fn forward_cached(&self, h: &Tensor, seq: Seq) -> Result<(Tensor, AttentionCache, Tensor)> {
        let Seq {
            b,
            t,
            rope: rope_tables,
        } = seq;
        let (nh, kv, d) = (self.n_heads, self.n_kv_heads, self.head_dim);
        let q = linear(h, &self.wq, self.bf16)?.reshape((b, t, nh, d))?;
        let k = linear(h, &self.wk, self.bf16)?.reshape((b, t, kv, d))?;
        let v = linear(h, &self.wv, self.bf16)?.reshape((b, t, kv, d))?;
        let qh = rope::heads_first(&q, Some(rope_tables))?;
        let kh = rope::heads_first(&k, Some(rope_tables))?;
        let (out, cache) = match self.kind {
            AttentionKind::Eager => {
                let vh = rope::heads_first(&v, None)?;
                let (o, p) =
                    attention::eager_keeping_probabilities(&qh, &kh, &vh, true, self.bf16)?;
                let o = rope::tokens_first(&o)?;
                let cache = AttentionCache::Eager {
                    q: qh,
                    k: kh,
                    v: vh,
                    p,
                };
                (o, cache)
            }
            AttentionKind::Flash => {
                let dtype = h.dtype();
                let (q, k) = (self.flash_input(&qh, dtype)?, self.flash_input(&kh, dtype)?);
                let v = self.flash_input(&v, dtype)?;
                let (fq, fk) = (rope::tokens_first(&q)?, rope::tokens_first(&k)?);
                let out = attention::flash(&fq, &fk, &v, true)?.to_dtype(dtype)?;
                let v = rope::heads_first(&v, None)?;
                (out, AttentionCache::Flash { q, k, v })
            }
        };
        let attended = out.contiguous()?.reshape((b * t, nh * d))?;
        Ok((linear(&attended, &self.wo, self.bf16)?, cache, attended))
    }

    /// The flash kernel wants bf16 on a GPU: bf16-mixed inputs are cast for it, as autocast does.
    fn flash_input(&self, x: &Tensor, dtype: DType) -> Result<Tensor> {
        let x = x.contiguous()?;
        let cast = self.bf16 && dtype == DType::F32 && ops::gpu_path(x.device());
        Ok(if cast { x.to_dtype(DType::BF16)? } else { x })
    }

    /// The gradient of h from that of the output, and the weights' gradients.
    #[allow(clippy::too_many_arguments)]
    fn backward(
        &self,
        h: &Tensor,
        cache: AttentionCache,
        attended: &Tensor,
        dy: &Tensor,
        seq: Seq,
        grads: &mut Grads,
    ) -> Result<Tensor> {
        let Seq {
            b,
            t,
            rope: rope_tables,
        } = seq;
        let (nh, kv, d) = (self.n_heads, self.n_kv_heads, self.head_dim);
        let d_attended = linear_backward(attended, &self.wo, dy, self.bf16, grads)?;
        // The gradients of q, k (heads first, before un-rotating) and v (as given).
        let (dqh, dkh, dv) = match cache {
            AttentionCache::Eager { q, k, v, p } => {
                let d_o = rope::heads_first(&d_attended.reshape((b, t, nh, d))?, None)?;
                let (dq, dk, dv) =
                    attention::eager_backward(&q, &k, &v, Some(&p), &d_o, true, self.bf16)?;
                (dq, dk, rope::backward(&dv, None)?)
            }
            AttentionCache::Flash { q, k, v } => {
                // Heads first and contiguous, as the cache holds q, k and v.
                let d_o = d_attended.to_dtype(q.dtype())?.reshape((b, t, nh, d))?;
                let d_o = rope::heads_first(&d_o, None)?;
                let (dq, dk, dv) = attention::fused_backward(&q, &k, &v, &d_o, true)?;
                let dtype = h.dtype();
                (
                    dq.to_dtype(dtype)?,
                    dk.to_dtype(dtype)?,
                    rope::backward(&dv.to_dtype(dtype)?, None)?,
                )
            }
        };
        let dq = rope::backward(&dqh, Some(rope_tables))?.reshape((b * t, nh * d))?;
        let dk = rope::backward(&dkh, Some(rope_tables))?.reshape((b * t, kv * d))?;
        let dv = dv.reshape((b * t, kv * d))?;
        let mut dh = linear_backward(h, &self.wq, &dq, self.bf16, grads)?;
        linear_backward_into(&mut dh, (h, &self.wk, &dk), self.bf16, grads)?;
        linear_backward_into(&mut dh, (h, &self.wv, &dv), self.bf16, grads)?;
        Ok(dh)
    }
}

impl Mlp {
    /// The gradient of h2 from that of the output, and the weights' gradients.
    fn backward(
        &self,
        h2: &Tensor,
        gate: &Tensor,
        up: &Tensor,
        dy: &Tensor,
        grads: &mut Grads,
    ) -> Result<Tensor> {
        let g = silu_mul::silu_mul(gate, up)?;
        let dg = linear_backward(&g, &self.w2, dy, self.bf16, grads)?;
        drop(g);
        let (d_gate, d_up) = silu_mul::backward(gate, up, &dg)?;
        let mut dh = linear_backward(h2, &self.w1, &d_gate, self.bf16, grads)?;
        linear_backward_into(&mut dh, (h2, &self.w3, &d_up), self.bf16, grads)?;
        Ok(dh)
    }
}

impl Block {
    /// x [N, D] -> the block's output and what its backward needs.
    fn forward_cached(&self, x: &Tensor, seq: Seq) -> Result<(Tensor, Saved)> {
        let h = rms_norm::rms_norm(x, &self.attention_norm, self.eps)?;
        let (a, attention, attended) = self.attention.forward_cached(&h, seq)?;
        drop(h);
        let mid = accumulate::sum(a, x)?;
        let h2 = rms_norm::rms_norm(&mid, &self.ffn_norm, self.eps)?;
        let gate = linear(&h2, &self.mlp.w1, self.mlp.bf16)?;
        let up = linear(&h2, &self.mlp.w3, self.mlp.bf16)?;
        drop(h2);
        let down = linear(
            &silu_mul::silu_mul(&gate, &up)?,
            &self.mlp.w2,
            self.mlp.bf16,
        )?;
        let y = accumulate::sum(down, &mid)?;
        let saved = Saved {
            attention,
            attended,
            mid,
            gate,
            up,
        };
        Ok((y, saved))
    }

    /// The gradient of the block's input from its output's; the cache is consumed.
    fn backward(
        &self,
        cache: BlockCache,
        dy: &Tensor,
        seq: Seq,
        grads: &mut Grads,
    ) -> Result<Tensor> {
        let BlockCache { x, saved } = cache;
        let saved = match saved {
            Some(s) => s,
            // Recomputation: the block runs forward again, from its input.
            None => self.forward_cached(&x, seq)?.1,
        };
        let Saved {
            attention,
            attended,
            mid,
            gate,
            up,
        } = saved;
        let h2 = rms_norm::rms_norm(&mid, &self.ffn_norm, self.eps)?;
        let dh2 = self.mlp.backward(&h2, &gate, &up, dy, grads)?;
        drop((h2, gate, up));
        let (d_mid_norm, dg2) = rms_norm::backward(&mid, &self.ffn_norm, self.eps, &dh2)?;
        grads.add(&self.ffn_norm, &dg2)?;
        let d_mid = accumulate::sum(d_mid_norm, dy)?;
        drop(mid);
        let h = rms_norm::rms_norm(&x, &self.attention_norm, self.eps)?;
        let dh = self
            .attention
            .backward(&h, attention, &attended, &d_mid, seq, grads)?;
        let (dx_norm, dg1) = rms_norm::backward(&x, &self.attention_norm, self.eps, &dh)?;
        grads.add(&self.attention_norm, &dg1)?;
        Ok(accumulate::sum(dx_norm, &d_mid)?)
    }
}

impl Llama {
    /// The summed cross-entropy of `tokens` against `labels` (−100 ignored) over `divisor`; every
    /// parameter's gradient is added into `grads`.
    pub fn forward_backward(
        &self,
        tokens: Tokens<'_>,
        labels: &[i64],
        divisor: f64,
        grads: &mut Grads,
    ) -> Result<f64> {
        let probe = Probe {
            at_peak: &mut || Ok(()),
            sync_forward: false,
            on_ready: &mut |_, _| Ok(()),
        };
        Ok(self
            .forward_backward_probed(tokens, labels, divisor, grads, probe)?
            .loss)
    }

    /// [`Llama::forward_backward`], probed from inside.
    pub fn forward_backward_probed(
        &self,
        tokens: Tokens<'_>,
        labels: &[i64],
        divisor: f64,
        grads: &mut Grads,
        probe: Probe<'_>,
    ) -> Result<Pass> {
        let started = std::time::Instant::now();
        crate::train::network::parts::pass(crate::train::network::parts::Pass::Forward);
        let seq = Seq {
            b: tokens.batch,
            t: tokens.seq,
            rope: &self.rope,
        };
        // Everything taken from the host is uploaded before the pass's work is queued.
        let device = self.embeddings.device();
        let ids = Tensor::from_slice(tokens.ids, tokens.ids.len(), device)?;
        let labels = cross_entropy::Labels::new(labels, device)?;
        let rows = embedding::Rows::new(tokens.ids, device)?;
        let recompute = self.recompute == Recompute::Blocks;
        let mut x = embedding::embedding(&self.embeddings, &ids)?;
        drop(ids);
        let mut caches = Vec::with_capacity(self.blocks.len());
        for block in &self.blocks {
            let (y, saved) = block.forward_cached(&x, seq)?;
            caches.push(BlockCache {
                x,
                saved: (!recompute).then_some(saved),
            });
            x = y;
        }
        let mut trace = CacheTrace {
            after_forward: caches.iter().map(BlockCache::bytes).sum(),
            after_each_backward: Vec::with_capacity(caches.len()),
        };
        if probe.sync_forward {
            x.device().synchronize()?;
        }
        let forward_s = started.elapsed().as_secs_f64();
        crate::train::network::parts::pass(crate::train::network::parts::Pass::Backward);
        let (loss, dh) = self.head(&x, &labels, divisor, grads)?;
        (probe.at_peak)()?;
        let (mut dx, dg) = rms_norm::backward(&x, &self.norm, self.eps, &dh)?;
        grads.add(&self.norm, &dg)?;
        drop((x, dh));
        (probe.on_ready)(Finished::Head, grads)?;
        for (i, block) in self.blocks.iter().enumerate().rev() {
            let cache = caches.pop().expect("one cache per block");
            dx = block.backward(cache, &dx, seq, grads)?;
            trace
                .after_each_backward
                .push(caches.iter().map(BlockCache::bytes).sum());
            (probe.on_ready)(Finished::Block(i), grads)?;
        }
        grads.add_rows(&self.embeddings, &rows, &dx)?;
        (probe.on_ready)(Finished::Embeddings, grads)?;
        // Read once the backward is queued: earlier, a GPU would idle while the host waits.
        let loss = loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        Ok(Pass {
            loss,
            trace,
            forward_s,
        })
    }

    /// The summed cross-entropy of `ids` [B, T] over `divisor`, forward only (validation).
    pub fn loss(&self, ids: &Tensor, labels: &[i64], divisor: f64) -> Result<f64> {
        let (b, t) = ids.dims2()?;
        let seq = Seq {
            b,
            t,
            rope: &self.rope,
        };
        let mut x = embedding::embedding(&self.embeddings, &ids.flatten_all()?)?;
        for block in &self.blocks {
            x = block.forward_cached(&x, seq)?.0;
        }
        let (n, _) = x.dims2()?;
        let h = rms_norm::rms_norm(&x, &self.norm, self.eps)?;
        drop(x);
        let rows = head_rows(n, self.output.dim(0)?, h.device());
        let labels = cross_entropy::Labels::new(labels, h.device())?;
        let mut loss = 0.0;
        for start in (0..n).step_by(rows) {
            let len = rows.min(n - start);
            let logits = linear(&h.narrow(0, start, len)?, &self.output, self.bf16)?;
            let (l, _) = cross_entropy::loss_and_grad(logits, &labels.rows(start, len)?, divisor)?;
            loss += l.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        }
        Ok(loss)
    }

    /// The head and the loss a slice of rows at a time: the loss and the head input's gradient.
    fn head(
        &self,
        x: &Tensor,
        labels: &cross_entropy::Labels,
        divisor: f64,
        grads: &mut Grads,
    ) -> Result<(Tensor, Tensor)> {
        let (n, _) = x.dims2()?;
        let vocab = self.output.dim(0)?;
        let h = rms_norm::rms_norm(x, &self.norm, self.eps)?;
        let rows = head_rows(n, vocab, h.device());
        let (mut loss, mut dh_parts) = (None, Vec::new());
        for start in (0..n).step_by(rows) {
            let len = rows.min(n - start);
            let hs = h.narrow(0, start, len)?;
            let logits = linear(&hs, &self.output, self.bf16)?;
            let (l, d_logits) =
                cross_entropy::loss_and_grad(logits, &labels.rows(start, len)?, divisor)?;
            loss = Some(match loss {
                None => l,
                Some(sum) => (sum + l)?,
            });
            dh_parts.push(linear_backward(
                &hs,
                &self.output,
                &d_logits,
                self.bf16,
                grads,
            )?);
        }
        let loss = match loss {
            Some(l) => l,
            None => Tensor::zeros((), DType::F32, x.device())?,
        };
        Ok((loss, Tensor::cat(&dh_parts, 0)?))
    }
}

/// Rows of logits the head computes at once (a GPU's slices hold 2^28 values; emulated: a third).
fn head_rows(n: usize, vocab: usize, device: &candle_core::Device) -> usize {
    let rows = cross_entropy::head_rows(n, vocab, ops::gpu_path(device));
    match ops::emulating() {
        true => n.div_ceil(3).max(1),
        false => rows,
    }
}

#[cfg(test)]
mod tests;
