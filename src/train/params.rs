//! The model's parameters: named candle `Var`s, created in name order from one
//! seeded generator (candle's CPU generator cannot be seeded), with
//! torchtitan's LLaMA initialisation.

use anyhow::{anyhow, Result};
use candle_core::{DType, Device, Tensor, Var};
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};
use std::collections::BTreeMap;

pub struct Params {
    /// Sorted by name, which makes everything that iterates them deterministic.
    vars: BTreeMap<String, Var>,
}

/// How a parameter starts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    Ones,
    Normal(f64),
    /// Normal, redrawn beyond two standard deviations.
    Truncated(f64),
}

/// Where a model's blocks get their parameters: each block names every
/// parameter it uses once, with its shape and initialisation (candle's
/// `VarBuilder` pattern). [`Declare`] collects those declarations to create
/// the parameters; [`Params`] hands out the created ones.
pub trait Source {
    fn param(&mut self, name: &str, shape: &[usize], init: Init) -> Result<Tensor>;
}

/// The declarations of a model, without creating anything.
pub struct Declare {
    specs: Vec<(String, Vec<usize>, Init)>,
    placeholder: Tensor,
}

impl Declare {
    pub fn new(device: &Device) -> Result<Declare> {
        Ok(Declare {
            specs: Vec::new(),
            placeholder: Tensor::zeros((), DType::F32, device)?,
        })
    }
}

impl Source for Declare {
    fn param(&mut self, name: &str, shape: &[usize], init: Init) -> Result<Tensor> {
        self.specs.push((name.to_string(), shape.to_vec(), init));
        Ok(self.placeholder.clone())
    }
}

impl Source for &Params {
    fn param(&mut self, name: &str, shape: &[usize], _init: Init) -> Result<Tensor> {
        let t = self.get(name)?;
        if t.dims() != shape {
            anyhow::bail!("`{name}` is {:?}, the model wants {shape:?}", t.dims());
        }
        Ok(t)
    }
}

impl Params {
    /// Creates the parameters `declared` names, in name order from one
    /// generator seeded with `seed`.
    pub fn init(declared: Declare, seed: u64, device: &Device, dtype: DType) -> Result<Params> {
        let mut specs = declared.specs;
        specs.sort_by(|a, b| a.0.cmp(&b.0));
        if let Some(w) = specs.windows(2).find(|w| w[0].0 == w[1].0) {
            anyhow::bail!("parameter `{}` is declared twice", w[0].0);
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut vars = BTreeMap::new();
        for (name, shape, init) in specs {
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
