//! AdamW with two groups (weight decay on matrices, none on norm weights),
//! gradient accumulation, global-norm clipping, and the learning-rate
//! schedule. On the CPU the update is one fused in-place pass per parameter;
//! elsewhere it is composed from tensor ops. Its state is checkpointed.

use super::ops::accumulate;
use super::params::Params;
use crate::config::{LrSchedule, TrainConfig};
use anyhow::{anyhow, bail, Result};
use candle_core::backprop::GradStore;
use candle_core::{CpuStorage, DType, InplaceOp2, Layout, Tensor, Var};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};

/// The learning rate at a step (1-based): linear warmup, then constant or cosine.
pub fn lr_at(step: usize, cfg: &TrainConfig) -> f64 {
    let lr = cfg.learning_rate;
    if cfg.warmup_steps > 0 && step <= cfg.warmup_steps {
        return lr * step as f64 / cfg.warmup_steps as f64;
    }
    match cfg.lr_schedule {
        LrSchedule::Constant => lr,
        LrSchedule::Cosine => {
            let span = cfg.training_steps.saturating_sub(cfg.warmup_steps).max(1) as f64;
            let progress = ((step - cfg.warmup_steps) as f64 / span).min(1.0);
            let min = lr * cfg.min_lr_ratio;
            min + (lr - min) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
        }
    }
}

/// Gradients summed over the micro-batches of one step, by parameter name.
/// Made by autograd ([`Grads::accumulate`]) or, in buffers kept from step to
/// step ([`Grads::buffers_for`]), written in place by the block-wise pass,
/// which hands each gradient over by its weight ([`Grads::add`], ...).
#[derive(Default)]
pub struct Grads {
    by_name: BTreeMap<String, Tensor>,
    /// The parameter behind each weight tensor, for the block-wise pass.
    names: HashMap<candle_core::TensorId, String>,
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
        Ok(self.by_name.get_mut(name).expect("a buffer per name"))
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
        Ok(accumulate::add_product(self.buffer(weight)?, dy, x, bf16)?)
    }

    /// The buffer of the table `weight` += dy's rows at `ids` (an embedding).
    pub fn add_rows(&mut self, weight: &Tensor, ids: &Tensor, dy: &Tensor) -> Result<()> {
        Ok(accumulate::add_rows(self.buffer(weight)?, ids, dy)?)
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
    /// to `max_norm` (0: none) scales them by ([`clipping`]).
    pub fn clipping(&self, max_norm: f64) -> Result<Clipping> {
        clipping(&self.by_name.values().collect::<Vec<_>>(), max_norm)
    }
}

/// The global gradient norm and the factor the update scales the gradients
/// by: `max_norm / norm` where `max_norm` > 0 and the norm exceeds it, else
/// 1; NaN where the norm is not finite (the update then changes nothing).
pub enum Clipping {
    /// Computed on the host (the CPU, or ops without sweep's kernels).
    Host { norm: f64, scale: f64 },
    /// [norm, scale] in f32 on the GPU, computed and read by the update
    /// there: the host reads it once, after the update is queued
    /// ([`Clipping::norm`]), instead of waiting for the backward to end.
    Device(Tensor),
}

impl Clipping {
    fn from_norm(norm: f64, max_norm: f64) -> Clipping {
        let scale = if !norm.is_finite() {
            f64::NAN
        } else if max_norm > 0.0 && norm > max_norm {
            max_norm / norm
        } else {
            1.0
        };
        Clipping::Host { norm, scale }
    }

    /// [norm, scale] on the host.
    fn read(&self) -> Result<[f64; 2]> {
        Ok(match self {
            Clipping::Host { norm, scale } => [*norm, *scale],
            Clipping::Device(t) => {
                let v = t.to_dtype(DType::F64)?.to_vec1::<f64>()?;
                [v[0], v[1]]
            }
        })
    }

    /// The norm (on a GPU this waits for the step's kernels).
    pub fn norm(&self) -> Result<f64> {
        Ok(self.read()?[0])
    }

    /// The scale on the host (on a GPU this waits for the step's kernels).
    pub fn scale(&self) -> Result<f64> {
        Ok(self.read()?[1])
    }

    /// [norm, scale] as an f32 tensor on `device`.
    pub fn as_tensor(&self, device: &candle_core::Device) -> Result<Tensor> {
        Ok(match self {
            Clipping::Device(t) => t.to_device(device)?,
            Clipping::Host { norm, scale } => Tensor::new(&[*norm as f32, *scale as f32], device)?,
        })
    }
}

/// The global L2 norm over `grads` and the clip scale for `max_norm`: on a
/// GPU with sweep's kernels in one pass over each gradient and a last
/// kernel that writes [norm, scale] (no read of the host); elsewhere with
/// tensor ops, each gradient first summed along its last dimension (candle's
/// CUDA `sum_all` reduces a whole tensor in one thread block, which took
/// half of an 8B-shaped model's step on an H100), in f32, read once.
pub fn clipping(grads: &[&Tensor], max_norm: f64) -> Result<Clipping> {
    #[cfg(feature = "cuda")]
    if grads.first().is_some_and(|g| g.device().is_cuda()) && super::ops::own_kernel(grads) {
        let out = super::optim_cuda::norm_and_scale(grads, max_norm as f32)?;
        return Ok(Clipping::Device(out));
    }
    let sums = grads
        .iter()
        .map(|g| {
            g.to_dtype(DType::F32)?
                .sqr()?
                .sum(candle_core::D::Minus1)?
                .sum_all()
        })
        .collect::<candle_core::Result<Vec<_>>>()?;
    if sums.is_empty() {
        return Ok(Clipping::from_norm(0.0, max_norm));
    }
    let total = Tensor::stack(&sums, 0)?.sum_all()?.to_scalar::<f32>()?;
    Ok(Clipping::from_norm((total as f64).sqrt(), max_norm))
}

enum Moments {
    /// CPU f32: plain buffers, updated in the same pass as the parameter.
    Host {
        m: Vec<f32>,
        v: Vec<f32>,
    },
    Device {
        m: Tensor,
        v: Tensor,
    },
}

struct Slot {
    name: String,
    var: Var,
    decay: bool,
    moments: Moments,
}

pub struct AdamW {
    slots: Vec<Slot>,
    /// Optimizer steps taken (bias correction).
    pub t: u64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
}

impl AdamW {
    pub fn new(params: &Params, cfg: &TrainConfig) -> Result<AdamW> {
        let slots = params
            .iter()
            .map(|(name, var)| {
                let host = var.device().is_cpu() && var.dtype() == DType::F32;
                let moments = if host {
                    Moments::Host {
                        m: vec![0.0; var.elem_count()],
                        v: vec![0.0; var.elem_count()],
                    }
                } else {
                    Moments::Device {
                        m: var.zeros_like()?,
                        v: var.zeros_like()?,
                    }
                };
                Ok(Slot {
                    name: name.clone(),
                    var: var.clone(),
                    decay: var.rank() >= 2,
                    moments,
                })
            })
            .collect::<Result<_>>()?;
        Ok(AdamW {
            slots,
            t: 0,
            beta1: cfg.beta1,
            beta2: cfg.beta2,
            eps: cfg.eps,
            weight_decay: cfg.weight_decay,
        })
    }

    /// One update with learning rate `lr`, gradients scaled by the clip
    /// scale. A non-finite gradient norm changes nothing (the caller stops
    /// on it); on a GPU the fused update reads the scale from device memory.
    pub fn step(&mut self, grads: &Grads, lr: f64, clipping: &Clipping) -> Result<()> {
        // The scale on the host, read when a path needs it (at most once).
        let mut host_scale = match clipping {
            Clipping::Host { scale, .. } => Some(*scale),
            Clipping::Device(_) => None,
        };
        if host_scale.is_some_and(|s| !s.is_finite()) {
            return Ok(());
        }
        self.t += 1;
        let bc1 = 1.0 - self.beta1.powi(self.t as i32);
        let bc2 = 1.0 - self.beta2.powi(self.t as i32);
        #[cfg(feature = "cuda")]
        let mut device_clip: Option<Tensor> = None;
        for slot in &mut self.slots {
            let g = grads
                .get(&slot.name)
                .ok_or_else(|| anyhow!("no gradient for `{}`", slot.name))?;
            let wd = if slot.decay { self.weight_decay } else { 0.0 };
            match &mut slot.moments {
                #[cfg(feature = "cuda")]
                Moments::Device { m, v }
                    if super::optim_cuda::Update::applies(slot.var.as_tensor(), g, m, v) =>
                {
                    // On the device once per step (uploaded when computed on the host).
                    let clip = match &device_clip {
                        Some(c) => c.clone(),
                        None => device_clip
                            .insert(clipping.as_tensor(slot.var.device())?)
                            .clone(),
                    };
                    let op = super::optim_cuda::Update {
                        m: m.clone(),
                        v: v.clone(),
                        clip,
                        hyper: [lr, self.beta1, self.beta2, bc1, bc2, self.eps, wd]
                            .map(|x| x as f32),
                    };
                    slot.var.as_tensor().inplace_op2(g, &op)?;
                }
                moments => {
                    let scale = match host_scale {
                        Some(s) => s,
                        None => *host_scale.insert(clipping.scale()?),
                    };
                    if !scale.is_finite() {
                        continue;
                    }
                    match moments {
                        Moments::Host { m, v } => {
                            let op = HostUpdate {
                                m: RefCell::new(m),
                                v: RefCell::new(v),
                                lr: lr as f32,
                                scale: scale as f32,
                                b1: self.beta1 as f32,
                                b2: self.beta2 as f32,
                                bc1: bc1 as f32,
                                bc2: bc2 as f32,
                                eps: self.eps as f32,
                                wd: wd as f32,
                            };
                            slot.var.as_tensor().inplace_op2(&g.contiguous()?, &op)?;
                        }
                        Moments::Device { m, v } => {
                            let g = (g * scale)?;
                            *m = ((&*m * self.beta1)? + (&g * (1.0 - self.beta1))?)?;
                            *v = ((&*v * self.beta2)? + (g.sqr()? * (1.0 - self.beta2))?)?;
                            let update = ((&*m / bc1)? / ((&*v / bc2)?.sqrt()? + self.eps)?)?;
                            let p = slot.var.as_tensor();
                            let next = ((p * (1.0 - lr * wd))? - (update * lr)?)?;
                            slot.var.set(&next)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The moments as tensors named `m.<param>` / `v.<param>` (for checkpoints).
    pub fn state(&self) -> Result<HashMap<String, Tensor>> {
        let mut out = HashMap::new();
        for s in &self.slots {
            let (m, v) = match &s.moments {
                Moments::Host { m, v } => (
                    Tensor::from_slice(m, s.var.shape(), s.var.device())?,
                    Tensor::from_slice(v, s.var.shape(), s.var.device())?,
                ),
                Moments::Device { m, v } => (m.clone(), v.clone()),
            };
            out.insert(format!("m.{}", s.name), m);
            out.insert(format!("v.{}", s.name), v);
        }
        Ok(out)
    }

    pub fn load_state(&mut self, t: u64, tensors: &HashMap<String, Tensor>) -> Result<()> {
        self.t = t;
        for s in &mut self.slots {
            let get = |k: &str| {
                tensors
                    .get(&format!("{k}.{}", s.name))
                    .cloned()
                    .ok_or_else(|| {
                        anyhow!("the checkpoint lacks the optimizer state of `{}`", s.name)
                    })
            };
            let (m, v) = (get("m")?, get("v")?);
            match &mut s.moments {
                Moments::Host { m: hm, v: hv } => {
                    *hm = m.flatten_all()?.to_dtype(DType::F32)?.to_vec1()?;
                    *hv = v.flatten_all()?.to_dtype(DType::F32)?.to_vec1()?;
                }
                Moments::Device { m: dm, v: dv } => {
                    *dm = m.to_dtype(s.var.dtype())?;
                    *dv = v.to_dtype(s.var.dtype())?;
                }
            }
        }
        Ok(())
    }
}

/// param -= lr * (m̂ / (sqrt(v̂) + eps) + wd * param), with m and v updated in the same pass.
struct HostUpdate<'a> {
    m: RefCell<&'a mut Vec<f32>>,
    v: RefCell<&'a mut Vec<f32>>,
    lr: f32,
    scale: f32,
    b1: f32,
    b2: f32,
    bc1: f32,
    bc2: f32,
    eps: f32,
    wd: f32,
}

impl InplaceOp2 for HostUpdate<'_> {
    fn name(&self) -> &'static str {
        "sweep-adamw"
    }

    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        dst_l: &Layout,
        src: &CpuStorage,
        src_l: &Layout,
    ) -> candle_core::Result<()> {
        let CpuStorage::F32(p) = dst else {
            candle_core::bail!("adamw: parameters must be f32")
        };
        let Some((a, b)) = dst_l.contiguous_offsets() else {
            candle_core::bail!("adamw: parameters must be contiguous")
        };
        let p = &mut p[a..b];
        let g = super::ops::f32s(src, src_l)?;
        let (mut m, mut v) = (self.m.borrow_mut(), self.v.borrow_mut());
        for i in 0..p.len() {
            let gi = g[i] * self.scale;
            m[i] = self.b1 * m[i] + (1.0 - self.b1) * gi;
            v[i] = self.b2 * v[i] + (1.0 - self.b2) * gi * gi;
            let update = (m[i] / self.bc1) / ((v[i] / self.bc2).sqrt() + self.eps);
            p[i] -= self.lr * (update + self.wd * p[i]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_constant_or_cosine() {
        let mut c = TrainConfig {
            learning_rate: 1.0,
            warmup_steps: 10,
            training_steps: 110,
            ..Default::default()
        };
        assert_eq!(lr_at(1, &c), 0.1);
        assert_eq!(lr_at(10, &c), 1.0);
        assert_eq!(lr_at(50, &c), 1.0);
        c.lr_schedule = LrSchedule::Cosine;
        c.min_lr_ratio = 0.1;
        assert!((lr_at(60, &c) - 0.55).abs() < 1e-9);
        assert!((lr_at(110, &c) - 0.1).abs() < 1e-9);
    }

    #[test]
    fn the_norm_clips_and_a_non_finite_norm_changes_nothing() -> Result<()> {
        let dev = candle_core::Device::Cpu;
        let a = Tensor::new(&[[3.0f32, 0.0], [0.0, 0.0]], &dev)?;
        let b = Tensor::new(&[4.0f32], &dev)?;
        // |(3, 4)| = 5: clipped to 2 by a factor 0.4, untouched under 10 or 0.
        for (max_norm, scale) in [(2.0, 0.4), (10.0, 1.0), (0.0, 1.0)] {
            let c = clipping(&[&a, &b], max_norm)?;
            assert!((c.norm()? - 5.0).abs() < 1e-6);
            assert!((c.scale()? - scale).abs() < 1e-6, "{max_norm}");
            let t = c.as_tensor(&dev)?.to_vec1::<f32>()?;
            assert!((t[0] - 5.0).abs() < 1e-6 && (t[1] as f64 - scale).abs() < 1e-6);
        }
        let inf = Tensor::new(&[f32::INFINITY], &dev)?;
        let c = clipping(&[&a, &inf], 1.0)?;
        assert!(c.norm()?.is_infinite() && c.scale()?.is_nan());
        // The update leaves parameters, moments and the step count alone.
        use super::super::params::{Declare, Init, Source};
        let mut declared = Declare::new(&dev)?;
        declared.param("w", &[2, 2], Init::Ones)?;
        let params = Params::init(declared, 1, &dev, DType::F32)?;
        let w = || params.get("w");
        let ones = [[1.0f32, 1.0], [1.0, 1.0]];
        let mut opt = AdamW::new(&params, &TrainConfig::default())?;
        let mut grads = Grads::buffers_for(&params)?;
        grads.add(&w()?, &a)?;
        opt.step(&grads, 0.1, &c)?;
        assert_eq!(opt.t, 0);
        assert_eq!(w()?.to_vec2::<f32>()?, ones);
        // A finite norm does update.
        opt.step(&grads, 0.1, &grads.clipping(1.0)?)?;
        assert_eq!(opt.t, 1);
        assert_ne!(w()?.to_vec2::<f32>()?, ones);
        Ok(())
    }

    #[test]
    fn host_and_device_updates_agree() -> Result<()> {
        // The fused CPU path against the composed one (forced by f64 params).
        let cfg = TrainConfig {
            weight_decay: 0.1,
            ..Default::default()
        };
        let data: Vec<f32> = (0..12).map(|i| (i as f32 - 6.0) / 7.0).collect();
        let grad: Vec<f32> = (0..12).map(|i| ((i * 7) % 5) as f32 / 3.0 - 0.5).collect();
        let mut finals = Vec::new();
        for dtype in [DType::F32, DType::F64] {
            let var = Var::from_tensor(
                &Tensor::from_slice(&data, (3, 4), &candle_core::Device::Cpu)?.to_dtype(dtype)?,
            )?;
            let slot = Slot {
                name: "w".into(),
                var: var.clone(),
                decay: true,
                moments: if dtype == DType::F32 {
                    Moments::Host {
                        m: vec![0.0; 12],
                        v: vec![0.0; 12],
                    }
                } else {
                    Moments::Device {
                        m: var.zeros_like()?,
                        v: var.zeros_like()?,
                    }
                },
            };
            let mut opt = AdamW {
                slots: vec![slot],
                t: 0,
                beta1: cfg.beta1,
                beta2: cfg.beta2,
                eps: cfg.eps,
                weight_decay: cfg.weight_decay,
            };
            let mut grads = Grads::default();
            grads.by_name.insert(
                "w".into(),
                Tensor::from_slice(&grad, (3, 4), &candle_core::Device::Cpu)?.to_dtype(dtype)?,
            );
            let half = Clipping::Host {
                norm: 2.0,
                scale: 0.5,
            };
            for _ in 0..3 {
                opt.step(&grads, 0.01, &half)?;
            }
            finals.push(
                var.as_tensor()
                    .to_dtype(DType::F32)?
                    .flatten_all()?
                    .to_vec1::<f32>()?,
            );
        }
        for (a, b) in finals[0].iter().zip(&finals[1]) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
        Ok(())
    }
}
