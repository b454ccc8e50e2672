//! AdamW with two groups (weight decay on matrices, none on norm weights),
//! global-norm clipping, and the learning-rate schedule: the optimizer's
//! state (moments per parameter, the step count, checkpointed) and which
//! update runs where. The update itself, its CPU and CUDA kernels and its
//! composed twin, is [`super::ops::adamw`]; the norm [`super::ops::grad_norm`].

use super::grads::Grads;
use super::ops::grad_norm::Clipping;
use super::ops::{self, adamw};
use super::params::Params;
use crate::config::{LrSchedule, TrainConfig};
use anyhow::{anyhow, Result};
use candle_core::{DType, Tensor, Var};

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
            min + (lr - min) * 0.5 * (1.0 + libm::cos(std::f64::consts::PI * progress))
        }
    }
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
            .map(|(name, var)| (name.clone(), var.clone(), var.rank() >= 2));
        AdamW::over(slots, cfg)
    }

    /// AdamW over named variables, each with weight decay or not (ZeRO's
    /// pieces of parameters, which are 1-D whatever their parameter was).
    pub fn over(
        vars: impl Iterator<Item = (String, Var, bool)>,
        cfg: &TrainConfig,
    ) -> Result<AdamW> {
        let slots = vars
            .map(|(name, var, decay)| {
                let host = !ops::gpu_path(var.device()) && var.dtype() == DType::F32;
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
                    name,
                    var,
                    decay,
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

    /// Each variable the optimizer updates, by name, in its order.
    pub fn vars(&self) -> impl Iterator<Item = (&str, &Var)> {
        self.slots.iter().map(|s| (s.name.as_str(), &s.var))
    }

    /// The bytes the two moments take.
    pub fn moment_bytes(&self) -> usize {
        let bytes = |t: &Tensor| t.elem_count() * t.dtype().size_in_bytes();
        self.slots
            .iter()
            .map(|s| match &s.moments {
                Moments::Host { m, v } => 4 * (m.len() + v.len()),
                Moments::Device { m, v } => bytes(m) + bytes(v),
            })
            .sum()
    }

    /// One update with learning rate `lr`, gradients scaled by the clip
    /// scale; the gradient norm, read once the update is queued (on a GPU
    /// the fused update reads the scale from device memory, and the host
    /// waits for the step's kernels only here). A non-finite norm changes
    /// nothing, the step count included (the caller stops on it).
    pub fn step(&mut self, grads: &Grads, lr: f64, clipping: &Clipping) -> Result<f64> {
        let _part = crate::train::network::parts::op(crate::train::network::parts::Op::AdamW);
        // The scale on the host, read when a path needs it (at most once).
        let mut host_scale = match clipping {
            Clipping::Host { scale, .. } => Some(*scale),
            Clipping::Device(_) => None,
        };
        if host_scale.is_some_and(|s| !s.is_finite()) {
            return Ok(clipping.norm()?);
        }
        self.t += 1;
        let hyper = |wd| adamw::Hyper {
            lr,
            beta1: self.beta1,
            beta2: self.beta2,
            bc1: 1.0 - self.beta1.powi(self.t as i32),
            bc2: 1.0 - self.beta2.powi(self.t as i32),
            eps: self.eps,
            wd,
        };
        let mut device_clip: Option<Tensor> = None;
        for slot in &mut self.slots {
            let g = grads
                .get(&slot.name)
                .ok_or_else(|| anyhow!("no gradient for `{}`", slot.name))?;
            let h = hyper(if slot.decay { self.weight_decay } else { 0.0 });
            let p = slot.var.as_tensor();
            match &mut slot.moments {
                Moments::Device { m, v } if adamw::Update::applies(p, g, m, v) => {
                    // On the device once per step (uploaded when computed on the host).
                    let clip = match &device_clip {
                        Some(c) => c.clone(),
                        None => device_clip.insert(clipping.as_tensor(p.device())?).clone(),
                    };
                    adamw::device(p, g, m, v, &h, clip)?;
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
                        Moments::Host { m, v } => adamw::host(p, g, m, v, &h, scale)?,
                        Moments::Device { m, v } => adamw::composed(&slot.var, g, m, v, &h, scale)?,
                    }
                }
            }
        }
        let norm = clipping.norm()?;
        if !norm.is_finite() {
            // The device's update saw the NaN scale and left everything as it
            // was: so does the count its bias corrections come from.
            self.t -= 1;
        }
        Ok(norm)
    }

    /// Each parameter's name, shape and moments as the optimizer holds them
    /// (for checkpoints, which write them without a copy).
    pub fn moments(&self) -> impl Iterator<Item = (&str, &[usize], MomentsRef<'_>)> {
        self.slots.iter().map(|s| {
            let moments = match &s.moments {
                Moments::Host { m, v } => MomentsRef::Host { m, v },
                Moments::Device { m, v } => MomentsRef::Device { m, v },
            };
            (s.name.as_str(), s.var.dims(), moments)
        })
    }

    /// Sets the optimizer's step count, then each parameter's moments by
    /// `read(name, shape, moments)`, which fills them in place.
    pub fn load_moments(
        &mut self,
        t: u64,
        mut read: impl FnMut(&str, &[usize], MomentsMut<'_>) -> Result<()>,
    ) -> Result<()> {
        self.t = t;
        for s in &mut self.slots {
            let moments = match &mut s.moments {
                Moments::Host { m, v } => MomentsMut::Host { m, v },
                Moments::Device { m, v } => MomentsMut::Device {
                    m,
                    v,
                    dtype: s.var.dtype(),
                },
            };
            read(&s.name, s.var.dims(), moments)?;
        }
        Ok(())
    }
}

/// A parameter's moments, read.
pub enum MomentsRef<'a> {
    /// f32 buffers of the parameter's size.
    Host {
        m: &'a [f32],
        v: &'a [f32],
    },
    Device {
        m: &'a Tensor,
        v: &'a Tensor,
    },
}

/// A parameter's moments, to be set.
pub enum MomentsMut<'a> {
    /// f32 buffers of the parameter's size, filled in place.
    Host { m: &'a mut [f32], v: &'a mut [f32] },
    /// Tensors replaced by ones of `dtype` on their device.
    Device {
        m: &'a mut Tensor,
        v: &'a mut Tensor,
        dtype: DType,
    },
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
    fn a_non_finite_norm_changes_nothing() -> Result<()> {
        let dev = candle_core::Device::Cpu;
        let a = Tensor::new(&[[3.0f32, 0.0], [0.0, 0.0]], &dev)?;
        let inf = Tensor::new(&[f32::INFINITY], &dev)?;
        let c = super::super::ops::grad_norm::clipping(&[&a, &inf], 1.0)?;
        // The update leaves parameters, moments and the step count alone.
        use super::super::params::{Declare, Init, ParamSource};
        let mut declared = Declare::new(&dev)?;
        declared.param("w", &[2, 2], Init::Ones)?;
        let params = Params::init(declared, 1, &dev, DType::F32)?;
        let w = || params.get("w");
        let ones = [[1.0f32, 1.0], [1.0, 1.0]];
        let mut opt = AdamW::new(&params, &TrainConfig::default())?;
        let mut grads = Grads::buffers_for(&params)?;
        grads.add(&w()?, &a)?;
        assert_eq!(opt.step(&grads, 0.1, &c)?, f64::INFINITY);
        assert_eq!(opt.t, 0);
        assert_eq!(w()?.to_vec2::<f32>()?, ones);
        // So does a norm the host learns only after the update is queued (a
        // GPU's [norm, scale]).
        let on_device = Tensor::new(&[f32::INFINITY, f32::NAN], &dev)?;
        let c = super::super::ops::grad_norm::Clipping::Device(on_device);
        assert_eq!(opt.step(&grads, 0.1, &c)?, f64::INFINITY);
        assert_eq!(opt.t, 0);
        assert_eq!(w()?.to_vec2::<f32>()?, ones);
        // A finite norm does update.
        assert_eq!(opt.step(&grads, 0.1, &grads.clipping(1.0)?)?, 3.0);
        assert_eq!(opt.t, 1);
        assert_ne!(w()?.to_vec2::<f32>()?, ones);
        Ok(())
    }
}
