//! Gradient buffers: the sums of one step's micro-batches, one per
//! parameter, kept from step to step and written in place by the block-wise
//! pass ([`super::ops::accumulate`], [`super::ops::linear::add_product`],
//! [`super::ops::embedding::add_rows`]), found by the weight tensor the
//! pass holds.

use super::ops::{accumulate, embedding, grad_norm, linear};
use super::params::Params;
use anyhow::{anyhow, bail, Result};
use candle_core::backprop::GradStore;
use candle_core::Tensor;
use std::collections::{BTreeMap, HashMap};

/// Gradients summed over the micro-batches of one step, by parameter name.
/// Made by autograd ([`Grads::accumulate`]) or, in buffers kept from step to
/// step ([`Grads::buffers_for`]), written in place by the block-wise pass,
/// which hands each gradient over by its weight ([`Grads::add`], ...).
#[derive(Default)]
pub struct Grads {
    by_name: BTreeMap<String, Tensor>,
    /// The parameter behind each weight tensor, for the block-wise pass.
    names: HashMap<candle_core::TensorId, String>,
    /// Buffers dropped once their sums were scattered (ZeRO-2), made
    /// again, zero, when a pass next adds to them: each one's zeros.
    released: BTreeMap<String, (candle_core::Shape, candle_core::DType, candle_core::Device)>,
}

impl Grads {
    /// A zero buffer for every parameter, in its dtype.
    pub fn buffers_for(params: &Params) -> Result<Grads> {
        let mut g = Grads::default();
        for (name, var) in params.iter() {
            g.by_name
                .insert(name.clone(), var.as_tensor().zeros_like()?);
            // The model's weight (detached) and the variable itself.
            g.names.insert(params.weight(name)?.id(), name.clone());
            g.names.insert(var.as_tensor().id(), name.clone());
        }
        Ok(g)
    }

    /// Gradients given by name (ZeRO's blocks of the sums, by piece).
    pub fn of(named: impl Iterator<Item = (String, Tensor)>) -> Grads {
        Grads {
            by_name: named.collect(),
            ..Default::default()
        }
    }

    /// Every buffer back to zero, in place where it can be: a new step.
    pub fn zero(&mut self) -> Result<()> {
        for t in self.by_name.values_mut() {
            accumulate::zero(t)?;
        }
        Ok(())
    }

    fn buffer(&mut self, weight: &Tensor) -> Result<&mut Tensor> {
        let name = self
            .names
            .get(&weight.id())
            .ok_or_else(|| anyhow!("a gradient for a tensor that is no parameter"))?;
        if let Some((shape, dtype, device)) = self.released.remove(name) {
            let zeros = Tensor::zeros(shape, dtype, &device)?;
            self.by_name.insert(name.clone(), zeros);
        }
        Ok(self.by_name.get_mut(name).expect("a buffer per name"))
    }

    /// Drops the buffer of `name` until a pass next adds to it (ZeRO-2,
    /// once its sum is scattered: only the shard's sums stay).
    pub fn release(&mut self, name: &str) {
        if let Some(t) = self.by_name.remove(name) {
            let like = (t.shape().clone(), t.dtype(), t.device().clone());
            self.released.insert(name.to_string(), like);
        }
    }

    /// The bytes the buffers held now take.
    pub fn bytes(&self) -> usize {
        self.by_name
            .values()
            .map(|t| t.elem_count() * t.dtype().size_in_bytes())
            .sum()
    }

    /// The buffer of `weight` += g.
    pub fn add(&mut self, weight: &Tensor, g: &Tensor) -> Result<()> {
        Ok(accumulate::add(self.buffer(weight)?, g)?)
    }

    /// The buffer of `weight` += dyᵀ·x (a linear layer's weight gradient).
    pub fn add_product(
        &mut self,
        weight: &Tensor,
        dy: &Tensor,
        x: &Tensor,
        bf16: bool,
    ) -> Result<()> {
        Ok(linear::add_product(self.buffer(weight)?, dy, x, bf16)?)
    }

    /// The buffer of the table `weight` += dy's rows at `ids` (an embedding).
    pub fn add_rows(&mut self, weight: &Tensor, ids: &embedding::Rows, dy: &Tensor) -> Result<()> {
        Ok(embedding::add_rows(self.buffer(weight)?, ids, dy)?)
    }

    pub fn accumulate(&mut self, params: &Params, store: GradStore) -> Result<()> {
        for (name, var) in params.iter() {
            let Some(g) = store.get(var.as_tensor()) else {
                bail!("parameter `{name}` received no gradient");
            };
            let g = g.clone();
            match self.by_name.remove(name) {
                Some(acc) => self.by_name.insert(name.clone(), (acc + g)?),
                None => self.by_name.insert(name.clone(), g),
            };
        }
        Ok(())
    }

    /// The parameter whose gradient `weight` (a model's weight) has.
    pub fn name_of(&self, weight: &Tensor) -> Option<&str> {
        self.names.get(&weight.id()).map(String::as_str)
    }

    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.by_name.get(name)
    }

    /// Every gradient, in the parameters' name order (the same on every rank).
    pub fn tensors_mut(&mut self) -> Vec<&mut Tensor> {
        self.by_name.values_mut().collect()
    }

    /// Every gradient by name, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Tensor)> {
        self.by_name.iter()
    }

    /// The gradients of `names`, in that order (each name once).
    pub fn ordered_mut(&mut self, names: &[String]) -> Result<Vec<&mut Tensor>> {
        let mut by_name: HashMap<&str, &mut Tensor> = self
            .by_name
            .iter_mut()
            .map(|(n, t)| (n.as_str(), t))
            .collect();
        names
            .iter()
            .map(|n| {
                by_name
                    .remove(n.as_str())
                    .ok_or_else(|| anyhow!("no gradient `{n}` (or named twice)"))
            })
            .collect()
    }

    /// The global L2 norm over every gradient and the factor that clipping
    /// to `max_norm` (0: none) scales them by (`clipping`).
    pub fn clipping(&self, max_norm: f64) -> Result<grad_norm::Clipping> {
        let _part = crate::train::network::parts::op(crate::train::network::parts::Op::Clip);
        Ok(grad_norm::clipping(
            &self.by_name.values().collect::<Vec<_>>(),
            max_norm,
        )?)
    }
}
