//! A LLaMA-style decoder's structure: token embedding, pre-norm blocks of
//! grouped-query causal attention with rotary embeddings and a SwiGLU
//! feed-forward, RMSNorm, and an untied output head. One small struct per
//! block, each declaring its parameters once, where it uses them. The
//! passes over it are [`super::blockwise`]'s (the trainer's) and, in the
//! tests alone, `oracle`'s autograd.

use super::ops::rope;
use super::params::{Declare, Init, ParamSource, Params};
use crate::config::{AttentionKind, ModelConfig, Precision, Recompute};
use anyhow::Result;
use candle_core::{DType, Device, Tensor};

/// Layer `layer`'s weight `name` of its `part` (`attention`,
/// `feed_forward`), named as the reference's checkpoints name it.
fn matrix(
    src: &mut dyn ParamSource,
    layer: usize,
    part: &str,
    name: &str,
    shape: [usize; 2],
    init: Init,
) -> Result<Tensor> {
    src.param(
        &format!("layers.{layer}.{part}.{name}.weight"),
        &shape,
        init,
    )
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
    fn new(src: &mut dyn ParamSource, layer: usize, spec: &ModelSpec) -> Result<Self> {
        let cfg = &spec.cfg;
        let (d, kv) = (cfg.dim, cfg.n_kv_heads * cfg.head_dim());
        let mut w = |n: &str, shape, init| matrix(src, layer, "attention", n, shape, init);
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
}

#[derive(Clone)]
pub(super) struct Mlp {
    pub(super) w1: Tensor,
    pub(super) w2: Tensor,
    pub(super) w3: Tensor,
    pub(super) bf16: bool,
}

impl Mlp {
    fn new(src: &mut dyn ParamSource, layer: usize, spec: &ModelSpec) -> Result<Self> {
        let (d, ffn) = (spec.cfg.dim, spec.cfg.ffn_hidden());
        let mut w = |n: &str, shape, init| matrix(src, layer, "feed_forward", n, shape, init);
        Ok(Mlp {
            w1: w("w1", [ffn, d], Init::Truncated(0.02))?,
            w2: w("w2", [d, ffn], Init::Truncated(depth_std(layer)))?,
            w3: w("w3", [ffn, d], Init::Truncated(depth_std(layer)))?,
            bf16: spec.bf16_matmuls,
        })
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
    fn new(src: &mut dyn ParamSource, i: usize, spec: &ModelSpec) -> Result<Self> {
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
}

/// What a precision means on `device`: the dtype of parameters and
/// activations, and whether matrix products round their operands to bf16
/// (bf16-mixed: f32 weights and optimizer state, bf16 products, as autocast).
pub fn dtypes(precision: Precision, device: &Device) -> Result<(DType, bool)> {
    Ok(match (precision, !super::ops::gpu_path(device)) {
        (Precision::F32, _) => (DType::F32, false),
        (Precision::Bf16, false) => (DType::BF16, false),
        (Precision::Bf16, true) => anyhow::bail!("`precision = \"bf16\"` needs a GPU: candle's CPU matmul has no bf16 kernels; use \"bf16-mixed\" (or \"f32\") on the CPU"),
        (Precision::Bf16Mixed, _) => (DType::F32, true),
    })
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
    /// Whether a block's backward runs its forward again (keeping only its
    /// input in the forward pass).
    pub(super) recompute: Recompute,
    pub(super) norm: Tensor,
    pub(super) output: Tensor,
    pub(super) rope: rope::RopeTables,
    pub(super) eps: f64,
    pub(super) bf16: bool,
}

impl Llama {
    /// The model over `params` (made by [`ModelSpec::init_params`] or
    /// loaded). Its weights share the parameters' storage (the optimizer's
    /// updates are theirs) without being candle variables: no pass over it
    /// records a graph.
    pub fn new(params: &Params, spec: &ModelSpec) -> Result<Self> {
        Self::build(&mut &*params, spec)
    }

    pub(super) fn build(src: &mut dyn ParamSource, spec: &ModelSpec) -> Result<Self> {
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
            recompute: spec.recompute,
        })
    }
}
