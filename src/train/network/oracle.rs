//! The autograd oracle (tests only): the model's forward pass composed from
//! candle's differentiable ops over candle variables — each op's composed
//! twin, never sweep's own kernels — whose gradients candle's autograd
//! computes. The trainer never runs it; the tests hold the explicit
//! block-wise passes ([`super::blockwise`]) against it: in f64, where the
//! two must agree to rounding, and in f32, where the fused kernels meet it.
//! Its gradients are the exact ones whatever the trainer does to save memory,
//! so it knows nothing of recomputation, and attention is one function to it
//! (eager and flash differ in how they run, not in what they compute).

use super::blockwise::Seq;
use super::model::{Attention, Block, Llama, Mlp, ModelSpec};
use super::ops::{
    attention, composed_here, embedding::embedding, linear::linear, rms_norm::rms_norm, rope,
    silu_mul::silu_mul,
};
use super::params::{Init, ParamSource, Params};
use crate::data::samples::IGNORE;
use anyhow::{ensure, Result};
use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor, D};

/// The parameters as candle variables, which autograd follows.
struct Tracked<'a>(&'a Params);

impl ParamSource for Tracked<'_> {
    fn param(&mut self, name: &str, _shape: &[usize], _init: Init) -> Result<Tensor> {
        self.0.get(name)
    }
}

/// The model over variables.
pub struct Autograd {
    model: Llama,
}

impl Autograd {
    pub fn new(params: &Params, spec: &ModelSpec) -> Result<Autograd> {
        // Its ops are differentiable in the tensors' own dtype alone: bf16
        // products and tables run sweep's kernels, which autograd cannot follow.
        ensure!(
            matches!(spec.dtype, DType::F32 | DType::F64) && !spec.bf16_matmuls,
            "the oracle computes in f32 or f64, without bf16 products"
        );
        Ok(Autograd {
            model: Llama::build(&mut Tracked(params), spec)?,
        })
    }

    /// ids [B, T] -> logits [B·T, vocab].
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let m = &self.model;
        let (b, t) = ids.dims2()?;
        let seq = Seq {
            b,
            t,
            rope: &m.rope,
        };
        composed_here(|| {
            let mut x = embedding(&m.embeddings, &ids.flatten_all()?)?;
            for block in &m.blocks {
                x = block.autograd_forward(&x, seq)?;
            }
            Ok(linear(&rms_norm(&x, &m.norm, m.eps)?, &m.output, false)?)
        })
    }

    /// Summed cross-entropy over the labels that are not -100, divided by `divisor`.
    pub fn loss(&self, ids: &Tensor, labels: &[i64], divisor: f64) -> Result<Tensor> {
        Ok(cross_entropy(&self.forward(ids)?, labels, divisor)?)
    }

    /// The gradients of `loss` (from [`Autograd::loss`]) for every parameter.
    pub fn backward(&self, loss: &Tensor) -> Result<GradStore> {
        Ok(loss.backward()?)
    }
}

/// The loss composed from candle ops: `logits` [N, V], `labels` N values
/// (-100: ignored); the sum over the kept rows of −log softmax at the label,
/// divided by `divisor`. The reference the loss's kernels are held to.
pub fn cross_entropy(logits: &Tensor, labels: &[i64], divisor: f64) -> candle_core::Result<Tensor> {
    let (n, _) = logits.dims2()?;
    let keep: Vec<f32> = labels
        .iter()
        .map(|&l| if l == IGNORE { 0.0 } else { 1.0 })
        .collect();
    let idx: Vec<u32> = labels
        .iter()
        .map(|&l| if l == IGNORE { 0 } else { l as u32 })
        .collect();
    let dev = logits.device();
    let logp = candle_nn::ops::log_softmax(logits, D::Minus1)?;
    let picked = logp
        .gather(&Tensor::from_vec(idx, (n, 1), dev)?, 1)?
        .squeeze(1)?;
    let keep = Tensor::from_vec(keep, n, dev)?.to_dtype(logits.dtype())?;
    (picked * keep)?.sum_all()?.neg()? / divisor
}

impl Attention {
    fn autograd_forward(&self, x: &Tensor, seq: Seq) -> Result<Tensor> {
        let Seq {
            b,
            t,
            rope: rope_tables,
        } = seq;
        let (h, kv, d) = (self.n_heads, self.n_kv_heads, self.head_dim);
        let q = linear(x, &self.wq, false)?.reshape((b, t, h, d))?;
        let k = linear(x, &self.wk, false)?.reshape((b, t, kv, d))?;
        let v = linear(x, &self.wv, false)?.reshape((b, t, kv, d))?;
        let out = attention::eager(
            &rope::heads_first(&q, Some(rope_tables))?,
            &rope::heads_first(&k, Some(rope_tables))?,
            &rope::heads_first(&v, None)?,
            true,
            false,
        )?;
        let out = out.transpose(1, 2)?.contiguous()?.reshape((b * t, h * d))?;
        Ok(linear(&out, &self.wo, false)?)
    }
}

impl Mlp {
    fn autograd_forward(&self, x: &Tensor) -> Result<Tensor> {
        let gate = silu_mul(&linear(x, &self.w1, false)?, &linear(x, &self.w3, false)?)?;
        Ok(linear(&gate, &self.w2, false)?)
    }
}

impl Block {
    fn autograd_forward(&self, x: &Tensor, seq: Seq) -> Result<Tensor> {
        let h = rms_norm(x, &self.attention_norm, self.eps)?;
        let x = (x + self.attention.autograd_forward(&h, seq)?)?;
        let h = rms_norm(&x, &self.ffn_norm, self.eps)?;
        Ok((&x + self.mlp.autograd_forward(&h)?)?)
    }
}
