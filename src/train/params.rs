//! The model's parameters: named candle `Var`s, created in name order from one
//! seeded generator (candle's CPU generator cannot be seeded), with
//! torchtitan's LLaMA initialisation.

use crate::config::ModelConfig;
use anyhow::{anyhow, Result};
use candle_core::{DType, Device, Tensor, Var};
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};
use std::collections::BTreeMap;

pub struct Params {
    /// Sorted by name, which makes everything that iterates them deterministic.
    vars: BTreeMap<String, Var>,
}

enum Init {
    Ones,
    Normal(f64),
    /// Normal, redrawn beyond two standard deviations.
    Truncated(f64),
}

impl Params {
    pub fn init(cfg: &ModelConfig, seed: u64, device: &Device, dtype: DType) -> Result<Params> {
        let (d, v, hd) = (cfg.dim, cfg.vocab_size, cfg.head_dim());
        let kv = cfg.n_kv_heads * hd;
        let ffn = cfg.ffn_hidden();
        let mut shapes: Vec<(String, Vec<usize>, Init)> = vec![
            (
                "tok_embeddings.weight".into(),
                vec![v, d],
                Init::Normal(1.0),
            ),
            ("norm.weight".into(), vec![d], Init::Ones),
            (
                "output.weight".into(),
                vec![v, d],
                Init::Truncated((d as f64).powf(-0.5)),
            ),
        ];
        for i in 0..cfg.n_layers {
            // Output projections shrink with depth (torchtitan's depth init).
            let deep = 0.02 / (2.0 * (i + 1) as f64).sqrt();
            let p = |s: &str| format!("layers.{i}.{s}");
            shapes.extend([
                (p("attention.wq.weight"), vec![d, d], Init::Truncated(0.02)),
                (p("attention.wk.weight"), vec![kv, d], Init::Truncated(0.02)),
                (p("attention.wv.weight"), vec![kv, d], Init::Truncated(0.02)),
                (p("attention.wo.weight"), vec![d, d], Init::Truncated(deep)),
                (
                    p("feed_forward.w1.weight"),
                    vec![ffn, d],
                    Init::Truncated(0.02),
                ),
                (
                    p("feed_forward.w2.weight"),
                    vec![d, ffn],
                    Init::Truncated(deep),
                ),
                (
                    p("feed_forward.w3.weight"),
                    vec![ffn, d],
                    Init::Truncated(deep),
                ),
                (p("attention_norm.weight"), vec![d], Init::Ones),
                (p("ffn_norm.weight"), vec![d], Init::Ones),
            ]);
        }
        shapes.sort_by(|a, b| a.0.cmp(&b.0));
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut vars = BTreeMap::new();
        for (name, shape, init) in shapes {
            let n: usize = shape.iter().product();
            let data: Vec<f32> = match init {
                Init::Ones => vec![1.0; n],
                Init::Normal(std) => {
                    let dist = Normal::new(0.0, std).expect("a valid std");
                    (0..n).map(|_| dist.sample(&mut rng) as f32).collect()
                }
                Init::Truncated(std) => {
                    let dist = Normal::new(0.0, std).expect("a valid std");
                    (0..n)
                        .map(|_| loop {
                            let x: f64 = dist.sample(&mut rng);
                            if x.abs() <= 2.0 * std {
                                break x as f32;
                            }
                        })
                        .collect()
                }
            };
            let t = Tensor::from_vec(data, shape, device)?.to_dtype(dtype)?;
            vars.insert(name, Var::from_tensor(&t)?);
        }
        Ok(Params { vars })
    }

    pub fn get(&self, name: &str) -> Result<Tensor> {
        self.vars
            .get(name)
            .map(|v| v.as_tensor().clone())
            .ok_or_else(|| anyhow!("no parameter `{name}`"))
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &Var)> {
        self.vars.iter()
    }

    pub fn count(&self) -> usize {
        self.vars.values().map(|v| v.elem_count()).sum()
    }

    /// Replaces every parameter's value (from a checkpoint); shapes must match.
    pub fn load(&self, tensors: &std::collections::HashMap<String, Tensor>) -> Result<()> {
        for (name, var) in &self.vars {
            let t = tensors
                .get(name)
                .ok_or_else(|| anyhow!("the checkpoint lacks `{name}`"))?;
            if t.dims() != var.dims() {
                anyhow::bail!(
                    "`{name}` is {:?} in the checkpoint but {:?} in the model",
                    t.dims(),
                    var.dims()
                );
            }
            var.set(&t.to_dtype(var.dtype())?)?;
        }
        Ok(())
    }
}
