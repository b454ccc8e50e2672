//! A LLaMA-style decoder: token embedding, pre-norm blocks of grouped-query
//! causal attention with rotary embeddings and a SwiGLU feed-forward, RMSNorm,
//! and an untied output head. One small struct per block, each with `new`
//! and `forward`. Activations stay [B·T, D] between blocks, so every
//! projection is one large matrix product.

use super::attention;
use super::ops::{
    attach::attach, cross_entropy::cross_entropy, embedding::embedding, matmul::matmul,
    rms_norm::rms_norm, rope, silu_mul::silu_mul,
};
use super::params::{Declare, Init, Params, Source};
use crate::config::{AttentionKind, ModelConfig, Recompute};
use anyhow::Result;
use candle_core::backprop::GradStore;
use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Shape, Tensor, Var};
use std::sync::{Arc, Mutex};

/// x [N, in] · wᵀ, w [out, in]; bf16 operands when `bf16`.
pub(super) fn linear(x: &Tensor, w: &Tensor, bf16: bool) -> candle_core::Result<Tensor> {
    matmul(x, &w.t()?, bf16)
}

#[derive(Clone)]
pub(super) struct Attention {
    pub(super) wq: Tensor,
    pub(super) wk: Tensor,
    pub(super) wv: Tensor,
    pub(super) wo: Tensor,
    pub(super) n_heads: usize,
    pub(super) n_kv_heads: usize,
    pub(super) head_dim: usize,
    pub(super) kind: AttentionKind,
    pub(super) bf16: bool,
}

/// The standard deviation of the projections that write into the residual
/// stream of layer `layer`: they shrink with depth (torchtitan's depth init).
fn depth_std(layer: usize) -> f64 {
    0.02 / (2.0 * (layer + 1) as f64).sqrt()
}

impl Attention {
    fn new(src: &mut dyn Source, layer: usize, spec: &ModelSpec) -> Result<Self> {
        let cfg = &spec.cfg;
        let (d, kv) = (cfg.dim, cfg.n_kv_heads * cfg.head_dim());
        let mut w = |n: &str, shape: [usize; 2], init| {
            src.param(
                &format!("layers.{layer}.attention.{n}.weight"),
                &shape,
                init,
            )
        };
        Ok(Attention {
            wq: w("wq", [d, d], Init::Truncated(0.02))?,
            wk: w("wk", [kv, d], Init::Truncated(0.02))?,
            wv: w("wv", [kv, d], Init::Truncated(0.02))?,
            wo: w("wo", [d, d], Init::Truncated(depth_std(layer)))?,
            n_heads: cfg.n_heads,
            n_kv_heads: cfg.n_kv_heads,
            head_dim: cfg.head_dim(),
            kind: spec.attention,
            bf16: spec.bf16_matmuls,
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
                attention::flash(&q, &k, &v, true)?.to_dtype(dtype)?
            }
        };
        let out = out.contiguous()?.reshape((b * t, h * d))?;
        Ok(linear(&out, &self.wo, self.bf16)?)
    }
}

#[derive(Clone)]
pub(super) struct Mlp {
    pub(super) w1: Tensor,
    pub(super) w2: Tensor,
    pub(super) w3: Tensor,
    pub(super) bf16: bool,
}

impl Mlp {
    fn new(src: &mut dyn Source, layer: usize, spec: &ModelSpec) -> Result<Self> {
        let (d, ffn) = (spec.cfg.dim, spec.cfg.ffn_hidden());
        let mut w = |n: &str, shape: [usize; 2], init| {
            src.param(
                &format!("layers.{layer}.feed_forward.{n}.weight"),
                &shape,
                init,
            )
        };
        Ok(Mlp {
            w1: w("w1", [ffn, d], Init::Truncated(0.02))?,
            w2: w("w2", [d, ffn], Init::Truncated(depth_std(layer)))?,
            w3: w("w3", [ffn, d], Init::Truncated(depth_std(layer)))?,
            bf16: spec.bf16_matmuls,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let b = self.bf16;
        let gate = silu_mul(&linear(x, &self.w1, b)?, &linear(x, &self.w3, b)?)?;
        Ok(linear(&gate, &self.w2, b)?)
    }
}

#[derive(Clone)]
pub(super) struct Block {
    pub(super) attention_norm: Tensor,
    pub(super) attention: Attention,
    pub(super) ffn_norm: Tensor,
    pub(super) mlp: Mlp,
    pub(super) eps: f64,
}

impl Block {
    fn new(src: &mut dyn Source, i: usize, spec: &ModelSpec) -> Result<Self> {
        let d = spec.cfg.dim;
        Ok(Block {
            attention_norm: src.param(
                &format!("layers.{i}.attention_norm.weight"),
                &[d],
                Init::Ones,
            )?,
            attention: Attention::new(src, i, spec)?,
            ffn_norm: src.param(&format!("layers.{i}.ffn_norm.weight"), &[d], Init::Ones)?,
            mlp: Mlp::new(src, i, spec)?,
            eps: spec.cfg.norm_eps,
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

/// Everything a model is built from besides its parameters' values.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    pub cfg: ModelConfig,
    pub attention: AttentionKind,
    /// The longest sequence (the rotary tables' length).
    pub max_seq: usize,
    pub device: Device,
    /// The parameters' dtype.
    pub dtype: DType,
    /// Matrix products with bf16 operands and f32 accumulation (autocast).
    pub bf16_matmuls: bool,
    pub recompute: Recompute,
}

impl ModelSpec {
    /// The model's parameters, initialised from `seed` (the same values for
    /// the same seed and shapes, whatever the device).
    pub fn init_params(&self, seed: u64) -> Result<Params> {
        let mut declared = Declare::new(&self.device)?;
        Llama::build(&mut declared, self)?;
        Params::init(declared, seed, &self.device, self.dtype)
    }
}

pub struct Llama {
    pub(super) embeddings: Tensor,
    pub(super) blocks: Vec<Block>,
    /// With `recompute = "blocks"`: the parameter gradients that the blocks'
    /// second forward passes produce, gathered during `backward`.
    pub(super) recomputed: Option<Arc<Mutex<GradStore>>>,
    pub(super) norm: Tensor,
    pub(super) output: Tensor,
    pub(super) rope: rope::RopeTables,
    pub(super) eps: f64,
    pub(super) bf16: bool,
}

impl Llama {
    /// The model over `params` (made by [`ModelSpec::init_params`] or loaded).
    pub fn new(params: &Params, spec: &ModelSpec) -> Result<Self> {
        Self::build(&mut &*params, spec)
    }

    fn build(src: &mut dyn Source, spec: &ModelSpec) -> Result<Self> {
        let cfg = &spec.cfg;
        let (v, d) = (cfg.vocab_size, cfg.dim);
        Ok(Llama {
            embeddings: src.param("tok_embeddings.weight", &[v, d], Init::Normal(1.0))?,
            blocks: (0..cfg.n_layers)
                .map(|i| Block::new(src, i, spec))
                .collect::<Result<_>>()?,
            norm: src.param("norm.weight", &[d], Init::Ones)?,
            output: src.param(
                "output.weight",
                &[v, d],
                Init::Truncated((d as f64).powf(-0.5)),
            )?,
            rope: rope::RopeTables::new(
                cfg.rope_theta,
                cfg.head_dim(),
                spec.max_seq,
                &spec.device,
                spec.dtype,
            )?,
            eps: cfg.norm_eps,
            bf16: spec.bf16_matmuls,
            recomputed: (spec.recompute == Recompute::Blocks)
                .then(|| Arc::new(Mutex::new(GradStore::default()))),
        })
    }

    /// ids [B, T] -> logits [B·T, vocab].
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let mut x = embedding(&self.embeddings, &ids.flatten_all()?)?;
        for block in &self.blocks {
            x = match &self.recomputed {
                None => block.forward(&x, b, t, &self.rope)?,
                Some(grads) => Recomputed::forward(block, &x, b, t, &self.rope, grads)?,
            };
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

    /// The gradients of `loss` (from [`Llama::loss`]) for every parameter,
    /// those of recomputed blocks included.
    pub fn backward(&self, loss: &Tensor) -> Result<GradStore> {
        let mut grads = loss.backward()?;
        if let Some(recomputed) = &self.recomputed {
            let mut r = recomputed.lock().expect("no panic while holding it");
            grads.extend(std::mem::take(&mut *r))?;
        }
        Ok(grads)
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
        b: usize,
        t: usize,
        rope: &rope::RopeTables,
        grads: &Arc<Mutex<GradStore>>,
    ) -> Result<Tensor> {
        // The block's graph dies with `y`; its output lives on as data.
        let y = block.forward(&x.detach(), b, t, rope)?.detach();
        let op = Recomputed {
            block: block.clone(),
            rope: rope.clone(),
            b,
            t,
            output: Mutex::new(Some(y)),
            grads: grads.clone(),
        };
        Ok(x.apply_op1_arc(Arc::new(Box::new(op)))?)
    }

    /// A contiguous copy of the output's storage (CPU or CUDA alike).
    fn take_output<S>(
        &self,
        pick: impl Fn(&candle_core::Storage) -> Option<&S>,
    ) -> candle_core::Result<(S, Shape)>
    where
        S: candle_core::backend::BackendStorage,
        S::Device: candle_core::backend::BackendDevice<Storage = S>,
    {
        use candle_core::backend::BackendDevice;
        let y = self
            .output
            .lock()
            .expect("no panic while holding it")
            .take()
            .ok_or_else(|| candle_core::Error::Msg("a recomputed block ran twice".into()))?;
        let (storage, layout) = y.storage_and_layout();
        let src = pick(&storage).ok_or_else(|| {
            candle_core::Error::Msg("the block's output is on another device".into())
        })?;
        // SAFETY: every element is written by the copy below.
        let mut dst = unsafe { src.device().alloc_uninit(layout.shape(), src.dtype())? };
        src.copy_strided_src(&mut dst, 0, layout)?;
        Ok((dst, layout.shape().clone()))
    }
}

impl CustomOp1 for Recomputed {
    fn name(&self) -> &'static str {
        "sweep-recomputed-block"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        self.take_output(|s| match s {
            candle_core::Storage::Cpu(s) => Some(s),
            _ => None,
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        _: &candle_core::CudaStorage,
        _: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        self.take_output(|s| match s {
            candle_core::Storage::Cuda(s) => Some(s),
            _ => None,
        })
    }

    fn bwd(&self, x: &Tensor, _: &Tensor, dy: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let x = Var::from_tensor(&x.detach())?;
        let y = self
            .block
            .forward(x.as_tensor(), self.b, self.t, &self.rope)
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
