//! The autograd oracle (tests only): the model's forward pass written with
//! candle's differentiable ops over candle variables, whose gradients
//! candle's autograd computes. The trainer never runs it; the tests hold
//! the explicit block-wise passes ([`super::blockwise`]) against it, in f64
//! where the two must agree to rounding. With `recompute = "blocks"` each
//! block is a custom op whose backward runs the block again.

use super::blockwise::Seq;
use super::model::{Attention, Block, Llama, Mlp, ModelSpec};
use super::ops::{
    attach::attach, attention, cross_entropy::cross_entropy, embedding::embedding, linear::linear,
    rms_norm::rms_norm, rope, silu_mul::silu_mul,
};
use super::params::{Init, Params, ParamSource};
use crate::config::{AttentionKind, Recompute};
use anyhow::Result;
use candle_core::backprop::GradStore;
use candle_core::{CpuStorage, CustomOp1, DType, Layout, Shape, Tensor, Var};
use std::sync::{Arc, Mutex};

/// The parameters as candle variables, which autograd follows.
struct Tracked<'a>(&'a Params);

impl ParamSource for Tracked<'_> {
    fn param(&mut self, name: &str, _shape: &[usize], _init: Init) -> Result<Tensor> {
        self.0.get(name)
    }
}

/// The model over variables, and the gradients its recomputed blocks make.
pub struct Autograd {
    model: Llama,
    recomputed: Option<Arc<Mutex<GradStore>>>,
}

impl Autograd {
    pub fn new(params: &Params, spec: &ModelSpec) -> Result<Autograd> {
        Ok(Autograd {
            model: Llama::build(&mut Tracked(params), spec)?,
            recomputed: (spec.recompute == Recompute::Blocks)
                .then(|| Arc::new(Mutex::new(GradStore::default()))),
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
        let mut x = embedding(&m.embeddings, &ids.flatten_all()?)?;
        for block in &m.blocks {
            x = match &self.recomputed {
                None => block.autograd_forward(&x, seq)?,
                Some(grads) => Recomputed::forward(block, &x, seq, grads)?,
            };
        }
        Ok(linear(&rms_norm(&x, &m.norm, m.eps)?, &m.output, m.bf16)?)
    }

    /// Summed cross-entropy over the labels that are not -100, divided by `divisor`.
    pub fn loss(&self, ids: &Tensor, labels: &[i64], divisor: f64) -> Result<Tensor> {
        Ok(cross_entropy(&self.forward(ids)?, labels, divisor)?)
    }

    /// The gradients of `loss` (from [`Autograd::loss`]) for every
    /// parameter, those of recomputed blocks included.
    pub fn backward(&self, loss: &Tensor) -> Result<GradStore> {
        let mut grads = loss.backward()?;
        if let Some(recomputed) = &self.recomputed {
            let mut r = recomputed.lock().expect("no panic while holding it");
            grads.extend(std::mem::take(&mut *r))?;
        }
        Ok(grads)
    }
}

impl Attention {
    fn autograd_forward(&self, x: &Tensor, seq: Seq) -> Result<Tensor> {
        let Seq {
            b,
            t,
            rope: rope_tables,
        } = seq;
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
                // [B, T, H, Q], as the flash kernel takes it.
                let (q, k) = (
                    qh.transpose(1, 2)?.contiguous()?,
                    kh.transpose(1, 2)?.contiguous()?,
                );
                attention::flash(&q, &k, &v.contiguous()?, true)?
            }
        };
        let out = out.contiguous()?.reshape((b * t, h * d))?;
        Ok(linear(&out, &self.wo, self.bf16)?)
    }
}

impl Mlp {
    fn autograd_forward(&self, x: &Tensor) -> Result<Tensor> {
        let b = self.bf16;
        let gate = silu_mul(&linear(x, &self.w1, b)?, &linear(x, &self.w3, b)?)?;
        Ok(linear(&gate, &self.w2, b)?)
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

/// One block under activation recomputation, as a custom op on the block's
/// input: its forward pass runs the block without keeping the graph (only
/// the input stays alive, as the op's argument) and its backward pass runs
/// the block again with the graph, from the gradient of its output.
struct Recomputed {
    block: Block,
    rope: rope::RopeTables,
    b: usize,
    t: usize,
    /// The output, computed before the op is applied; the op hands over a
    /// copy of it and lets it go.
    output: Mutex<Option<Tensor>>,
    grads: Arc<Mutex<GradStore>>,
}

impl Recomputed {
    fn forward(
        block: &Block,
        x: &Tensor,
        seq: Seq,
        grads: &Arc<Mutex<GradStore>>,
    ) -> Result<Tensor> {
        // The block's graph dies with `y`; its output lives on as data.
        let y = block.autograd_forward(&x.detach(), seq)?.detach();
        let op = Recomputed {
            block: block.clone(),
            rope: seq.rope.clone(),
            b: seq.b,
            t: seq.t,
            output: Mutex::new(Some(y)),
            grads: grads.clone(),
        };
        Ok(x.apply_op1_arc(Arc::new(Box::new(op)))?)
    }
}

impl CustomOp1 for Recomputed {
    fn name(&self) -> &'static str {
        "sweep-recomputed-block"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let y = self
            .output
            .lock()
            .expect("no panic while holding it")
            .take()
            .ok_or_else(|| candle_core::Error::Msg("a recomputed block ran twice".into()))?;
        let (storage, layout) = y.storage_and_layout();
        let candle_core::Storage::Cpu(src) = &*storage else {
            return Err(candle_core::Error::Msg("the oracle runs on the CPU".into()));
        };
        use candle_core::backend::{BackendDevice, BackendStorage};
        // SAFETY: every element is written by the copy below.
        let mut dst = unsafe { src.device().alloc_uninit(layout.shape(), src.dtype())? };
        src.copy_strided_src(&mut dst, 0, layout)?;
        Ok((dst, layout.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, _: &Tensor, dy: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let x = Var::from_tensor(&x.detach())?;
        let y = self
            .block
            .autograd_forward(
                x.as_tensor(),
                Seq {
                    b: self.b,
                    t: self.t,
                    rope: &self.rope,
                },
            )
            .map_err(|e| candle_core::Error::Msg(format!("recomputing a block: {e:#}")))?;
        let mut inner = attach(&y, dy.detach(), DType::F32)?.backward()?;
        let dx = inner.remove(x.as_tensor());
        // What is left are the block's parameters' gradients.
        self.grads
            .lock()
            .expect("no panic while holding it")
            .extend(inner)?;
        Ok(dx)
    }
}
