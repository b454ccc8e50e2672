//! A LLaMA-style decoder: token embedding, pre-norm blocks of grouped-query
//! causal attention with rotary embeddings and a SwiGLU feed-forward, RMSNorm,
//! and an untied output head. One small struct per block, each with `new`
//! and `forward`. Activations stay [B·T, D] between blocks, so every
//! projection is one large matrix product.

use super::attention;
use super::ops::{
    cross_entropy::cross_entropy, matmul::matmul, rms_norm::rms_norm, rope, silu_mul::silu_mul,
};
use super::params::Params;
use crate::config::{AttentionKind, ModelConfig};
use anyhow::Result;
use candle_core::{DType, Device, Tensor};

/// x [N, in] · wᵀ, w [out, in]; bf16 operands when `bf16`.
fn linear(x: &Tensor, w: &Tensor, bf16: bool) -> candle_core::Result<Tensor> {
    matmul(x, &w.t()?, bf16)
}

struct Attention {
    wq: Tensor,
    wk: Tensor,
    wv: Tensor,
    wo: Tensor,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    kind: AttentionKind,
    bf16: bool,
}

impl Attention {
    fn new(p: &Params, prefix: &str, cfg: &ModelConfig, kind: AttentionKind) -> Result<Self> {
        let w = |n: &str| p.get(&format!("{prefix}.attention.{n}.weight"));
        Ok(Attention {
            wq: w("wq")?,
            wk: w("wk")?,
            wv: w("wv")?,
            wo: w("wo")?,
            n_heads: cfg.n_heads,
            n_kv_heads: cfg.n_kv_heads,
            head_dim: cfg.head_dim(),
            kind,
            bf16: false,
        })
    }

    fn forward(
        &self,
        x: &Tensor,
        b: usize,
        t: usize,
        rope_tables: &rope::RopeTables,
    ) -> Result<Tensor> {
        let (h, kv, d) = (self.n_heads, self.n_kv_heads, self.head_dim);
        let q = linear(x, &self.wq, self.bf16)?.reshape((b, t, h, d))?;
        let k = linear(x, &self.wk, self.bf16)?.reshape((b, t, kv, d))?;
        let v = linear(x, &self.wv, self.bf16)?.reshape((b, t, kv, d))?;
        let (qh, kh) = (
            rope::heads_first(&q, Some(rope_tables))?,
            rope::heads_first(&k, Some(rope_tables))?,
        );
        let out = match self.kind {
            AttentionKind::Eager => {
                let vh = rope::heads_first(&v, None)?;
                attention::eager(&qh, &kh, &vh, true, self.bf16)?.transpose(1, 2)?
            }
            AttentionKind::Flash => {
                // The flash kernel wants [B, T, H, Q], in bf16 on a GPU: with
                // bf16-mixed (f32 activations) the inputs are cast for it and
                // the output cast back, as autocast does.
                let dtype = x.dtype();
                let cast = self.bf16 && dtype == DType::F32 && !x.device().is_cpu();
                let prep = |t: &Tensor| -> candle_core::Result<Tensor> {
                    let t = t.contiguous()?;
                    if cast {
                        t.to_dtype(DType::BF16)
                    } else {
                        Ok(t)
                    }
                };
                let (q, k, v) = (
                    prep(&qh.transpose(1, 2)?)?,
                    prep(&kh.transpose(1, 2)?)?,
                    prep(&v)?,
                );
                attention::flash(&q, &k, &v, true, 32)?.to_dtype(dtype)?
            }
        };
        let out = out.contiguous()?.reshape((b * t, h * d))?;
        Ok(linear(&out, &self.wo, self.bf16)?)
    }
}

struct Mlp {
    w1: Tensor,
    w2: Tensor,
    w3: Tensor,
    bf16: bool,
}

impl Mlp {
    fn new(p: &Params, prefix: &str) -> Result<Self> {
        let w = |n: &str| p.get(&format!("{prefix}.feed_forward.{n}.weight"));
        Ok(Mlp {
            w1: w("w1")?,
            w2: w("w2")?,
            w3: w("w3")?,
            bf16: false,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let b = self.bf16;
        let gate = silu_mul(&linear(x, &self.w1, b)?, &linear(x, &self.w3, b)?)?;
        Ok(linear(&gate, &self.w2, b)?)
    }
}

struct Block {
    attention_norm: Tensor,
    attention: Attention,
    ffn_norm: Tensor,
    mlp: Mlp,
    eps: f64,
}

impl Block {
    fn new(p: &Params, i: usize, cfg: &ModelConfig, kind: AttentionKind) -> Result<Self> {
        let prefix = format!("layers.{i}");
        Ok(Block {
            attention_norm: p.get(&format!("{prefix}.attention_norm.weight"))?,
            attention: Attention::new(p, &prefix, cfg, kind)?,
            ffn_norm: p.get(&format!("{prefix}.ffn_norm.weight"))?,
            mlp: Mlp::new(p, &prefix)?,
            eps: cfg.norm_eps,
        })
    }

    fn forward(
        &self,
        x: &Tensor,
        b: usize,
        t: usize,
        rope_tables: &rope::RopeTables,
    ) -> Result<Tensor> {
        let h = rms_norm(x, &self.attention_norm, self.eps)?;
        let x = (x + self.attention.forward(&h, b, t, rope_tables)?)?;
        let h = rms_norm(&x, &self.ffn_norm, self.eps)?;
        Ok((&x + self.mlp.forward(&h)?)?)
    }
}

pub struct Llama {
    embeddings: Tensor,
    blocks: Vec<Block>,
    norm: Tensor,
    output: Tensor,
    rope: rope::RopeTables,
    eps: f64,
    bf16: bool,
}

impl Llama {
    /// Matrix products with bf16 operands and f32 accumulation (CPU autocast).
    pub fn with_bf16_matmuls(mut self, on: bool) -> Self {
        self.bf16 = on;
        for b in &mut self.blocks {
            b.attention.bf16 = on;
            b.mlp.bf16 = on;
        }
        self
    }

    pub fn new(
        p: &Params,
        cfg: &ModelConfig,
        kind: AttentionKind,
        max_len: usize,
        device: &Device,
        dtype: DType,
    ) -> Result<Self> {
        Ok(Llama {
            embeddings: p.get("tok_embeddings.weight")?,
            blocks: (0..cfg.n_layers)
                .map(|i| Block::new(p, i, cfg, kind))
                .collect::<Result<_>>()?,
            norm: p.get("norm.weight")?,
            output: p.get("output.weight")?,
            rope: rope::RopeTables::new(cfg.rope_theta, cfg.head_dim(), max_len, device, dtype)?,
            eps: cfg.norm_eps,
            bf16: false,
        })
    }

    /// ids [B, T] -> logits [B·T, vocab].
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let mut x = self.embeddings.index_select(&ids.flatten_all()?, 0)?;
        for block in &self.blocks {
            x = block.forward(&x, b, t, &self.rope)?;
        }
        Ok(linear(
            &rms_norm(&x, &self.norm, self.eps)?,
            &self.output,
            self.bf16,
        )?)
    }

    /// Summed cross-entropy over the labels that are not -100, divided by `divisor`.
    pub fn loss(&self, ids: &Tensor, labels: &[i64], divisor: f64) -> Result<Tensor> {
        Ok(cross_entropy(&self.forward(ids)?, labels, divisor)?)
    }
}
