//! The model's parameters: named candle `Var`s, drawn on the CPU from seeded
//! generators (candle's generators cannot be seeded alike on every device),
//! with torchtitan's LLaMA initialisation. Each block of [`INIT_BLOCK`]
//! values of a parameter has its own generator, seeded from the seed, the
//! parameter's name and the block's index, so that blocks are drawn in
//! parallel and the values depend on neither the thread count nor the device:
//! drawing 8 billion values from one generator took minutes.

use anyhow::{anyhow, Result};
use candle_core::{DType, Device, Tensor, Var};
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};
use rayon::prelude::*;
use std::collections::BTreeMap;

/// Values per independently seeded block of a parameter.
pub const INIT_BLOCK: usize = 1 << 20;

pub struct Params {
    /// Sorted by name, which makes everything that iterates them deterministic.
    vars: BTreeMap<String, Var>,
    /// Each variable's value detached (the same storage, no graph): what the
    /// model computes with, one tensor per parameter for good, so that its
    /// id names the parameter ([`super::grads::Grads`]).
    weights: BTreeMap<String, Tensor>,
}

/// How a parameter starts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    Ones,
    Normal(f64),
    /// Normal, redrawn beyond two standard deviations.
    Truncated(f64),
}

impl Init {
    fn fill(self, out: &mut [f32], rng: &mut impl rand::Rng) {
        match self {
            Init::Ones => out.fill(1.0),
            Init::Normal(std) => {
                let dist = Normal::new(0.0, std).expect("a valid std");
                out.iter_mut().for_each(|x| *x = dist.sample(rng) as f32);
            }
            Init::Truncated(std) => {
                let dist = Normal::new(0.0, std).expect("a valid std");
                for x in out {
                    *x = loop {
                        let v: f64 = dist.sample(rng);
                        if v.abs() <= 2.0 * std {
                            break v as f32;
                        }
                    }
                }
            }
        }
    }
}

/// Where a model's blocks get their parameters: each block names every
/// parameter it uses once, with its shape and initialisation (candle's
/// `VarBuilder` pattern). [`Declare`] collects those declarations to create
/// the parameters; [`Params`] hands out the created ones.
pub trait ParamSource {
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

impl ParamSource for Declare {
    fn param(&mut self, name: &str, shape: &[usize], init: Init) -> Result<Tensor> {
        self.specs.push((name.to_string(), shape.to_vec(), init));
        Ok(self.placeholder.clone())
    }
}

/// The parameters' values, sharing their storage (an update of a parameter
/// is seen) but detached: candle records no graph of what is computed from
/// them.
impl ParamSource for &Params {
    fn param(&mut self, name: &str, shape: &[usize], _init: Init) -> Result<Tensor> {
        let t = self.weight(name)?.clone();
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
        let mut vars = BTreeMap::new();
        for (name, shape, init) in specs {
            let n: usize = shape.iter().product();
            let mut data = vec![0f32; n];
            let name_seed = name.bytes().fold(seed ^ 0x9e37_79b9_7f4a_7c15, |h, b| {
                (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
            });
            data.par_chunks_mut(INIT_BLOCK)
                .enumerate()
                .for_each(|(block, out)| {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(
                        name_seed.wrapping_add((block as u64).wrapping_mul(0x2545_f491_4f6c_dd1d)),
                    );
                    init.fill(out, &mut rng);
                });
            let t = Tensor::from_vec(data, shape, device)?.to_dtype(dtype)?;
            vars.insert(name, Var::from_tensor(&t)?);
        }
        let weights = vars
            .iter()
            .map(|(n, v)| (n.clone(), v.as_tensor().detach()))
            .collect();
        Ok(Params { vars, weights })
    }

    /// The value of parameter `name` as the model computes with it: its
    /// storage, detached from autograd.
    pub fn weight(&self, name: &str) -> Result<&Tensor> {
        self.weights
            .get(name)
            .ok_or_else(|| anyhow!("no parameter `{name}`"))
    }

    pub fn var(&self, name: &str) -> Result<&Var> {
        self.vars
            .get(name)
            .ok_or_else(|| anyhow!("no parameter `{name}`"))
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
    /// Sets every parameter from a checkpoint holding `names`, which must be
    /// exactly this model's parameters (a checkpoint of a deeper model has
    /// layers this one lacks: an error, never silently dropped); `read` gives
    /// one tensor at a time, so that a large model is never held twice.
    pub fn load<'a>(
        &self,
        names: impl IntoIterator<Item = &'a str>,
        mut read: impl FnMut(&str) -> Result<Tensor>,
    ) -> Result<()> {
        let mut foreign: Vec<&str> = names
            .into_iter()
            .filter(|k| !self.vars.contains_key(*k))
            .collect();
        if !foreign.is_empty() {
            foreign.sort();
            anyhow::bail!(
                "the checkpoint holds {} tensor(s) this model does not have ({}{}): it belongs to another model",
                foreign.len(),
                foreign.iter().take(3).map(|s| format!("`{s}`")).collect::<Vec<_>>().join(", "),
                if foreign.len() > 3 { ", …" } else { "" }
            );
        }
        for (name, var) in &self.vars {
            let t = read(name)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn draw(seed: u64, threads: usize) -> Vec<f32> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let mut d = Declare::new(&Device::Cpu).unwrap();
            // Three blocks and a bit, so that blocks meet threads unevenly.
            d.param("w", &[3 * INIT_BLOCK + 5], Init::Truncated(0.02))
                .unwrap();
            let p = Params::init(d, seed, &Device::Cpu, DType::F32).unwrap();
            p.get("w").unwrap().to_vec1::<f32>().unwrap()
        })
    }

    #[test]
    fn initial_values_depend_on_the_seed_alone() {
        let one = draw(7, 1);
        assert_eq!(one, draw(7, 3), "the thread count changed the values");
        assert_ne!(one, draw(8, 3));
        // Blocks are not copies of each other, and truncation holds.
        assert_ne!(one[..100], one[INIT_BLOCK..INIT_BLOCK + 100]);
        assert!(one.iter().all(|x| x.abs() <= 0.04));
        let mean = one.iter().map(|&x| x as f64).sum::<f64>() / one.len() as f64;
        let var = one.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / one.len() as f64;
        // A normal truncated at 2σ keeps 77.4% of its variance.
        assert!(
            (var.sqrt() / 0.02 - 0.774f64.sqrt()).abs() < 0.01,
            "{}",
            var.sqrt()
        );
    }
}
