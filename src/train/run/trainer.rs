//! One rank's trainer: model, data and optimizer from a run's configuration, and one optimizer
//! step. The process around it (threads, signals, resuming, the loop) is [`super::run`].

use super::dist::{self, Collective, GradientLayout, GradientSum, Ranks, Sharded};
use crate::config::{BatchSize, DeviceKind, RuntimeOptions, TrainConfig};
use crate::data::Batch;
use crate::data::{DataSpec, SampleStream, SourceSpec, TextTokenizer};
use crate::train::network::blockwise::{Probe, Tokens};
use crate::train::network::grads::Grads;
use crate::train::network::model::{Llama, ModelSpec};
use crate::train::network::optim::AdamW;
use crate::train::network::params::Params;
use crate::train::network::{device, ops};
use crate::util::signals::StopSignals;
use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};
use std::sync::Arc;
use std::time::Instant;

/// Everything a run needs, built from its configuration.
pub struct Trainer {
    pub cfg: TrainConfig,
    pub model_spec: ModelSpec,
    pub device: Device,
    pub params: Params,
    pub model: Llama,
    pub opt: Optimizer,
    pub spec: DataSpec,
    pub threads: usize,
    /// The engine that sums gradients across ranks ([`dist::Single`] alone).
    pub comm: Box<dyn Collective>,
    /// Every parameter's gradient, in buffers kept from step to step.
    pub grads: Grads,
    /// The order and buckets in which gradients are summed across ranks.
    pub layout: GradientLayout,
    /// Wait for the device after each forward pass, so `Phases` splits a step truly (benchmarks).
    pub sync_forward: bool,
    /// The kernels that failed their self-check at device open ([`ops::selfcheck`]).
    pub fallbacks: Vec<ops::selfcheck::Failure>,
    /// The other kernels' times against their twins' at the run's shapes, which chose their paths.
    pub kernel_timings: Vec<ops::selfcheck::Timing>,
    /// A bf16-mixed CPU run whose bf16 kernel is slower than f32's: the two peaks, bf16's first.
    pub f32_products: Option<(f64, f64)>,
}

/// AdamW over the whole model on every rank, or over this rank's share (`zero` ≥ 1).
pub enum Optimizer {
    Replicated(AdamW),
    Sharded(Sharded),
}

impl Optimizer {
    /// The AdamW that updates: its step count, and the moments checkpoints keep.
    pub fn adamw(&self) -> &AdamW {
        match self {
            Optimizer::Replicated(opt) => opt,
            Optimizer::Sharded(z) => &z.opt,
        }
    }

    pub fn adamw_mut(&mut self) -> &mut AdamW {
        match self {
            Optimizer::Replicated(opt) => opt,
            Optimizer::Sharded(z) => &mut z.opt,
        }
    }
}

/// The bytes one rank keeps between steps (the trainer's accounting, not resident memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateBytes {
    /// The whole model's parameters (every rank computes with all of them).
    pub params: usize,
    /// The gradient buffers held now (ZeRO-2 drops them once summed).
    pub grads: usize,
    /// The buffers the sums travel in and land in.
    pub grad_sums: usize,
    /// ZeRO's pieces of the parameters (their master values; none without it).
    pub master: usize,
    /// AdamW's two moments.
    pub moments: usize,
}

/// Where a step's time went, in seconds (without `sync_forward`, a GPU's forward may end late).
#[derive(Debug, Clone, Copy, Default)]
pub struct Phases {
    /// The forward passes of the step's micro-batches.
    pub forward_s: f64,
    /// Their backward passes, and the wait for the gradients' sums.
    pub backward_s: f64,
    /// Clipping and AdamW, until the gradient norm is read.
    pub optimizer_s: f64,
}

/// What one optimizer step reports.
#[derive(Debug, Clone, Copy)]
pub struct StepOutcome {
    /// Mean loss over the step's training tokens on all ranks.
    pub loss: f64,
    /// Global L2 norm of the summed gradients, before clipping.
    pub grad_norm: f64,
    /// This rank's tokens with a training label.
    pub training_tokens: usize,
    /// Seconds spent summing gradients and losses across ranks.
    pub comm_s: f64,
    pub phases: Phases,
}

impl Trainer {
    /// A trainer for the rank the launcher's environment names.
    pub fn new(cfg: TrainConfig, threads: usize, rt: &RuntimeOptions) -> Result<Trainer> {
        let tok = Arc::new(TextTokenizer::load(&cfg.tokenizer, &cfg.specials())?);
        let model = cfg.model_config()?.with_vocabulary(tok.vocab_size())?;
        Trainer::with_model(cfg, model, tok, threads, rt)
    }

    /// A trainer of `model_cfg`, whose vocabulary the caller resolved (`sweep bench train`).
    pub fn with_model(
        cfg: TrainConfig,
        model_cfg: crate::config::ModelConfig,
        tok: Arc<TextTokenizer>,
        threads: usize,
        rt: &RuntimeOptions,
    ) -> Result<Trainer> {
        if cfg.batch_size == BatchSize::Max {
            bail!("batch_size = \"max\" must be resolved before training (sweep train does)");
        }
        let ranks = Ranks::from_env()?;
        let (device, opened) = match cfg.device {
            DeviceKind::Cpu => (Device::Cpu, Default::default()),
            DeviceKind::Cuda => cuda_device(ranks.local_rank, rt, &model_cfg, &cfg)?,
        };
        let (dtype, mut bf16_matmuls) =
            crate::train::network::model::dtypes(cfg.precision, &device)?;
        // bf16-mixed is never slower than f32: where this CPU's bf16 kernel is, products are f32's.
        let mut f32_products = None;
        if bf16_matmuls && device.is_cpu() {
            f32_products = super::peak::f32_is_faster(rt.cpu_kernels, threads)?;
            bf16_matmuls = f32_products.is_none();
            if ranks.is_main() {
                announce_bf16_kernel(rt, f32_products);
            }
        }
        let comm = dist::connect(ranks, &device, rt)?;
        // Every rank runs the kernels every rank passed (replicas rounding differently would drift).
        let ops::selfcheck::Opened {
            mut failures,
            timings,
        } = opened;
        let mut kernel_timings = Vec::new();
        if device.is_cuda() {
            failures.extend(super::dist::agree::on_kernels(&*comm, &device, &failures)?);
            kernel_timings = super::dist::agree::on_timings(&*comm, &device, &timings, &failures)?;
            ops::selfcheck::take_faster(&kernel_timings);
        }
        let model_spec = ModelSpec {
            cfg: model_cfg,
            attention: cfg.attention,
            max_seq: cfg.sequence_length,
            device: device.clone(),
            dtype,
            bf16_matmuls,
            recompute: cfg.recompute,
        };
        let params = model_spec.init_params(cfg.seed)?;
        broadcast_params(&*comm, &params)?;
        let model = Llama::new(&params, &model_spec)?;
        let source = match (cfg.pretokenized, &cfg.pretokenized_path) {
            (true, Some(path)) => SourceSpec::Pretokenized { path: path.clone() },
            (true, None) => bail!("`pretokenized = true` needs `pretokenized_path` (the planner sets it from its pretokenize stage)"),
            (false, _) => SourceSpec::Text { path: cfg.dataset.clone(), column: cfg.text_column.clone() },
        };
        let spec = DataSpec {
            dataset_type: cfg.dataset_type,
            seq_len: cfg.sequence_length,
            source,
            tokenizer: tok,
            rank: ranks.rank,
            world_size: ranks.world_size,
            order: cfg.data_order,
            holdout: cfg.validation_documents,
        };
        let grads = Grads::buffers_for(&params)?;
        let mut layout = GradientLayout::new(&grads, &model.stages())?;
        let opt = match cfg.zero {
            0 => Optimizer::Replicated(AdamW::new(&params, &cfg)?),
            stage => {
                layout.shard(stage, ranks.world_size, &grads)?;
                let share = (ranks.rank, ranks.world_size);
                Optimizer::Sharded(Sharded::new(&layout, &params, &cfg, share)?)
            }
        };
        Ok(Trainer {
            cfg,
            model_spec,
            device,
            params,
            model,
            opt,
            spec,
            threads,
            comm,
            grads,
            layout,
            sync_forward: false,
            fallbacks: failures,
            kernel_timings,
            f32_products,
        })
    }

    pub fn ranks(&self) -> Ranks {
        self.comm.ranks()
    }

    /// What this rank keeps from step to step, by kind.
    pub fn state_bytes(&self) -> StateBytes {
        let (master, moments) = match &self.opt {
            Optimizer::Replicated(opt) => (0, opt.moment_bytes()),
            Optimizer::Sharded(z) => z.bytes(),
        };
        StateBytes {
            params: self
                .params
                .iter()
                .map(|(_, v)| v.elem_count() * v.dtype().size_in_bytes())
                .sum(),
            grads: self.grads.bytes(),
            grad_sums: self.layout.sum_bytes(),
            master,
            moments,
        }
    }

    /// One optimizer step over this rank's micro-batches; the loss over all ranks' tokens. With
    /// `stop` (one rank), a stop between micro-batches abandons it: `Interrupted`.
    pub fn step(
        &mut self,
        micro: &[Batch],
        lr: f64,
        memory: &mut device::PeakMemory,
        stop: Option<&StopSignals>,
    ) -> Result<StepOutcome> {
        let local: usize = micro.iter().map(|b| b.training_tokens).sum();
        let t0 = Instant::now();
        let [global] = dist::sum_scalars(&*self.comm, [local as f64], &self.device)?;
        let mut comm_s = t0.elapsed().as_secs_f64();
        // The last backward hands finished buckets to the engine's thread, where it has one; what is
        // waited for afterwards is the exposed communication.
        let passes = Instant::now();
        let alone = self.comm.is_single();
        let (partial, forward_s, finish_s) =
            device::once_more_after_release(&self.device, alone, || {
                let mut sum = self.layout.begin(&*self.comm);
                let (partial, forward_s) = forward_backward(
                    &self.model,
                    &mut self.grads,
                    &self.device,
                    (micro, stop, self.sync_forward),
                    global.max(1.0),
                    memory,
                    (&mut sum, &*self.comm),
                )?;
                let t1 = Instant::now();
                sum.finish(&*self.comm, &mut self.grads)?;
                Ok((partial, forward_s, t1.elapsed().as_secs_f64()))
            })?;
        let t1 = Instant::now();
        let grads = &mut self.grads;
        let [loss] = dist::sum_scalars(&*self.comm, [partial], &self.device)?;
        comm_s += finish_s + t1.elapsed().as_secs_f64();
        let updating = Instant::now();
        crate::train::network::parts::pass(crate::train::network::parts::Pass::Optimizer);
        if !loss.is_finite() {
            bail!("the loss ({loss}) is not finite; try a lower learning_rate");
        }
        let (grad_norm, gather_s) = match &mut self.opt {
            Optimizer::Replicated(opt) => {
                // On a GPU the norm and clip scale stay on the device; the host reads the norm after the
                // update is queued (a non-finite norm changes nothing).
                let clipping = grads.clipping(self.cfg.grad_clip)?;
                (opt.step(grads, lr, &clipping)?, 0.0)
            }
            Optimizer::Sharded(z) => {
                let clip = (lr, self.cfg.grad_clip);
                z.step(&self.layout, &self.params, clip, &*self.comm)?
            }
        };
        if !grad_norm.is_finite() {
            bail!("the gradient norm ({grad_norm}) is not finite (loss {loss}); try a lower learning_rate");
        }
        comm_s += gather_s;
        let phases = Phases {
            forward_s,
            backward_s: (updating - passes).as_secs_f64() - forward_s,
            optimizer_s: updating.elapsed().as_secs_f64(),
        };
        Ok(StepOutcome {
            loss,
            grad_norm,
            training_tokens: local,
            comm_s,
            phases,
        })
    }

    /// Mean loss over `batches` batches of the held-out documents (no gradients).
    pub fn validation_loss(&self, batches: usize) -> Result<f64> {
        let mut stream = SampleStream::open_validation(&self.spec)?;
        let (mut sum, mut count) = (0.0, 0usize);
        for _ in 0..batches {
            let b = crate::data::loader::next_batch(&mut stream, self.cfg.batch())?;
            let ids = Tensor::from_slice(&b.inputs, (b.batch_size, b.seq_len), &self.device)?;
            sum += self.model.loss(&ids, &b.labels, 1.0)?;
            count += b.training_tokens;
        }
        Ok(sum / count.max(1) as f64)
    }

    /// Checks every rank holds the same parameters (rank 0's digest, broadcast); returns it.
    pub fn check_replicas(&self) -> Result<String> {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        for (_, var) in self.params.iter() {
            for x in var.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()? {
                h.update(x.to_le_bytes());
            }
        }
        let digest = format!("{:x}", h.finalize());
        // 48 bits of it, exact in an f64, are what the ranks compare.
        let mine = u64::from_str_radix(&digest[..12], 16).expect("hex") as f64;
        let root = self
            .comm
            .broadcast(&Tensor::new(&[mine], &self.device)?, 0)?;
        let root = root.to_vec1::<f64>()?[0];
        let [differ] = dist::sum_scalars(&*self.comm, [(mine != root) as u8 as f64], &self.device)?;
        if differ > 0.0 {
            bail!(
                "the parameters of {differ} rank(s) differ from rank 0's (this is rank {}, digest {})",
                self.ranks().rank,
                &digest[..12]
            );
        }
        Ok(digest)
    }
}

/// The passes of a step's micro-batches into `grads`, telling `sum` what the last backward
/// finished and checking `stop` between them: this rank's loss share and forward seconds.
fn forward_backward(
    model: &Llama,
    grads: &mut Grads,
    device: &Device,
    (micro, stop, sync_forward): (&[Batch], Option<&StopSignals>, bool),
    divisor: f64,
    memory: &mut device::PeakMemory,
    (sum, comm): (&mut GradientSum<'_>, &dyn Collective),
) -> Result<(f64, f64)> {
    grads.zero()?;
    let (mut loss, mut forward_s) = (0.0, 0.0);
    for (i, b) in micro.iter().enumerate() {
        if i > 0 && stop.is_some_and(|s| s.received().is_some()) {
            return Err(Interrupted.into());
        }
        let last = i + 1 == micro.len();
        sum.tokens(&b.inputs);
        let tokens = Tokens::new(&b.inputs, b.batch_size, b.seq_len)?;
        let probe = Probe {
            at_peak: &mut || memory.sample(device),
            sync_forward,
            on_ready: &mut |f, g| {
                if last {
                    sum.finished(f, g, comm)
                } else {
                    Ok(())
                }
            },
        };
        let pass = model.forward_backward_probed(tokens, &b.labels, divisor, grads, probe)?;
        loss += pass.loss;
        forward_s += pass.forward_s;
    }
    Ok((loss, forward_s))
}

/// Every rank starts from rank 0's parameters, whatever the device's kernels do.
fn broadcast_params(comm: &dyn Collective, params: &Params) -> Result<()> {
    if comm.is_single() {
        return Ok(());
    }
    for (_, var) in params.iter() {
        let flat = comm.broadcast(&var.flatten_all()?, 0)?;
        var.set(&flat.reshape(var.shape())?)?;
    }
    Ok(())
}

/// Says once which CPU kernel multiplies bf16-mixed's operands, and why not the fastest.
fn announce_bf16_kernel(rt: &RuntimeOptions, f32_products: Option<(f64, f64)>) {
    use crate::config::runtime::CpuKernels;
    use ops::linear::bf16_gemm::{self, Bf16Kernel};
    let kernel = bf16_gemm::selected();
    if let Some((bf16, f32)) = f32_products {
        eprintln!(
            "sweep train: bf16-mixed multiplies in f32 here: this CPU's bf16 kernel ({}) reaches {:.0} GFLOP/s, its f32 GEMM {:.0} (`SWEEP_CPU_KERNELS={}` keeps bf16 products)",
            kernel.name(),
            bf16 / 1e9,
            f32 / 1e9,
            match kernel {
                Bf16Kernel::Amx => "amx",
                Bf16Kernel::Avx512Bf16 => "avx512-bf16",
                Bf16Kernel::Portable => "portable",
            }
        );
        return;
    }
    if kernel == Bf16Kernel::Portable {
        let why = match rt.cpu_kernels {
            CpuKernels::Portable => "SWEEP_CPU_KERNELS=portable",
            _ if cfg!(target_arch = "x86_64") => "this CPU lacks AVX-512 BF16",
            _ => "AMX and AVX-512 BF16 are x86-64's",
        };
        eprintln!(
            "sweep train: bf16-mixed through the portable bf16 kernel ({why}): the same arithmetic \
             as the AMX and AVX-512 BF16 kernels, and slower than training in f32"
        );
    }
}

/// GPU `local_rank`, its memory pool as asked, once its kernels passed their self-check.
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
fn cuda_device(
    local_rank: usize,
    rt: &RuntimeOptions,
    model: &crate::config::ModelConfig,
    cfg: &TrainConfig,
) -> Result<(Device, ops::selfcheck::Opened)> {
    let policy = match cfg.kernels {
        Some(k) => {
            ops::set_run_kernels(k);
            k
        }
        None => rt.cuda_kernels,
    };
    if policy == ops::CudaKernels::Composed {
        eprintln!("sweep train: kernels = composed: candle's composed ops instead of sweep's CUDA kernels");
    }
    #[cfg(feature = "cuda")]
    {
        let device = device::cuda(local_rank, rt.cuda_pool)?;
        // The kernels see activations in the parameters' dtype.
        let (dtype, _) = crate::train::network::model::dtypes(cfg.precision, &device)?;
        let opened = ops::selfcheck::at_open(&device, policy, model, cfg.sequence_length, dtype)?;
        Ok((device, opened))
    }
    #[cfg(not(feature = "cuda"))]
    bail!(
        "`device = \"cuda\"` (local rank {local_rank}) needs a build with the `cuda` feature (see docs/gpu.md)"
    )
}

/// A stop signal arrived between the micro-batches of a step.
#[derive(Debug)]
pub struct Interrupted;

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stopped by a signal between micro-batches")
    }
}

impl std::error::Error for Interrupted {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ModelConfig, ModelOverrides, Precision};
    use crate::data::samples::IGNORE;
    use crate::train::network::optim;
    use crate::train::network::oracle::Autograd;

    fn tiny(vocab: usize) -> ModelConfig {
        let o = ModelOverrides {
            dim: Some(16),
            n_layers: Some(2),
            n_heads: Some(4),
            n_kv_heads: Some(2),
            vocab_size: Some(vocab),
            multiple_of: Some(16),
            ..Default::default()
        };
        ModelConfig::resolve("tiny", &o).unwrap()
    }

    /// The tiny model in f64 beside its oracle, a batch and its labels.
    fn setup() -> (Params, Autograd, Tensor, Vec<i64>) {
        let cfg = tiny(40);
        let spec = ModelSpec {
            cfg,
            attention: crate::config::AttentionKind::Eager,
            max_seq: 8,
            device: Device::Cpu,
            dtype: DType::F64,
            bf16_matmuls: false,
            recompute: crate::config::Recompute::None,
        };
        let params = spec.init_params(7).unwrap();
        let model = Autograd::new(&params, &spec).unwrap();
        let ids: Vec<u32> = (0..12).map(|i| (i * 7 + 3) % 40).collect();
        let ids = Tensor::from_vec(ids, (2, 6), &Device::Cpu).unwrap();
        let labels: Vec<i64> = (0..12)
            .map(|i| {
                if i % 5 == 4 {
                    IGNORE
                } else {
                    (i * 11 + 1) % 40
                }
            })
            .collect();
        (params, model, ids, labels)
    }

    fn grads_of(params: &Params, model: &Autograd, ids: &Tensor, labels: &[i64]) -> (f64, Grads) {
        let loss = model.loss(ids, labels, 10.0).unwrap();
        let value = loss.to_scalar::<f64>().unwrap();
        let mut g = Grads::default();
        g.accumulate(params, model.backward(&loss).unwrap())
            .unwrap();
        (value, g)
    }

    #[test]
    fn gradients_match_finite_differences() -> Result<()> {
        // f64 runs the composed ops, so differences are precise.
        let (params, model, ids, labels) = setup();
        let (_, grads) = grads_of(&params, &model, &ids, &labels);
        // Central differences: truncation error O(h^2), round-off ~1e-16 * loss / h.
        let h = 1e-4;
        for (name, index) in [
            ("tok_embeddings.weight", 3 * 16 + 2),
            ("layers.0.attention.wq.weight", 17),
            ("layers.1.attention.wk.weight", 5),
            ("layers.0.attention.wv.weight", 40),
            ("layers.1.attention.wo.weight", 101),
            ("layers.0.feed_forward.w1.weight", 9),
            ("layers.1.feed_forward.w2.weight", 77),
            ("layers.0.feed_forward.w3.weight", 33),
            ("layers.1.attention_norm.weight", 4),
            ("norm.weight", 11),
            ("output.weight", 30 * 16 + 7),
        ] {
            let var = params.iter().find(|(n, _)| *n == name).unwrap().1.clone();
            let base: Vec<f64> = var.flatten_all()?.to_vec1()?;
            let at = |delta: f64| -> Result<f64> {
                let mut v = base.clone();
                v[index] += delta;
                var.set(&Tensor::from_vec(v, var.shape(), &Device::Cpu)?)?;
                Ok(model.loss(&ids, &labels, 10.0)?.to_scalar::<f64>()?)
            };
            let numeric = (at(h)? - at(-h)?) / (2.0 * h);
            at(0.0)?;
            let analytic = grads.get(name).unwrap().flatten_all()?.to_vec1::<f64>()?[index];
            let err = (numeric - analytic).abs();
            assert!(
                err < 1e-6 * analytic.abs() + 1e-10,
                "{name}[{index}]: numeric {numeric:e} vs autograd {analytic:e}"
            );
        }
        Ok(())
    }

    /// Per-step losses of a small model on the bundled text.
    fn losses_on_real_text(precision: Precision, steps: usize) -> Result<Vec<f64>> {
        losses_sharded(precision, steps, 0, 1.0)
    }

    /// ZeRO on one rank: one block holds everything, and the curve is the
    /// replicated one's — bit for bit without clipping; with it, the norm
    /// is summed in another order.
    #[test]
    fn zero_on_one_rank_follows_the_replicated_curve() -> Result<()> {
        let plain = losses_on_real_text(Precision::F32, 8)?;
        let unclipped = losses_sharded(Precision::F32, 8, 0, 0.0)?;
        for zero in [1, 2] {
            let sharded = losses_sharded(Precision::F32, 8, zero, 1.0)?;
            for (step, (a, b)) in plain.iter().zip(sharded).enumerate() {
                let step = step + 1;
                assert!(
                    (a - b).abs() <= 1e-6 * a,
                    "zero {zero}, step {step}: {a} vs {b}"
                );
            }
            let exact = losses_sharded(Precision::F32, 8, zero, 0.0)?;
            assert_eq!(unclipped, exact, "zero {zero}");
        }
        Ok(())
    }

    fn losses_sharded(
        precision: Precision,
        steps: usize,
        zero: u8,
        grad_clip: f64,
    ) -> Result<Vec<f64>> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let cfg = TrainConfig {
            dataset: root.join("assets/data/quickstart.parquet"),
            tokenizer: root.join(crate::config::DEFAULT_TOKENIZER),
            sequence_length: 64,
            batch_size: crate::config::BatchSize::Fixed(4),
            learning_rate: 3e-3,
            warmup_steps: 3,
            precision,
            zero,
            grad_clip,
            architecture: ModelOverrides {
                dim: Some(32),
                n_layers: Some(1),
                ..Default::default()
            },
            ..Default::default()
        };
        let mut t = Trainer::new(cfg.clone(), 2, &RuntimeOptions::default())?;
        let mut stream = SampleStream::open(&t.spec)?;
        let mut losses = vec![];
        for step in 1..=steps {
            let b = crate::data::loader::next_batch(&mut stream, cfg.batch())?;
            let out = t.step(
                &[b],
                optim::lr_at(step, &cfg),
                &mut device::PeakMemory::default(),
                None,
            )?;
            losses.push(out.loss);
        }
        Ok(losses)
    }

    #[test]
    fn loss_falls_on_real_text() -> Result<()> {
        let losses = losses_on_real_text(Precision::F32, 40)?;
        let first: f64 = losses[..3].iter().sum::<f64>() / 3.0;
        let last: f64 = losses[37..].iter().sum::<f64>() / 3.0;
        assert!(first > 10.0, "starts near ln(32000) = 10.4: {first}");
        // A random model stays near ln(32000); falling a nat in 40 steps is learning.
        assert!(last < first - 1.0, "loss {first:.2} -> {last:.2}");
        Ok(())
    }

    #[test]
    fn bf16_mixed_follows_the_f32_curve() -> Result<()> {
        // With the process's kernel: AVX-512 BF16 where the CPU has it, else
        // the portable one (the integration tests force the portable one too).
        let f32 = losses_on_real_text(Precision::F32, 30)?;
        let mixed = losses_on_real_text(Precision::Bf16Mixed, 30)?;
        // Same data, same init: only the rounding of matmul operands differs.
        for (step, (a, b)) in f32.iter().zip(&mixed).enumerate() {
            assert!(
                (a - b).abs() < 0.02 * a,
                "step {}: f32 {a:.4} vs bf16-mixed {b:.4}",
                step + 1
            );
        }
        assert!(mixed[27..].iter().sum::<f64>() / 3.0 < mixed[..3].iter().sum::<f64>() / 3.0 - 0.8);
        Ok(())
    }

    #[test]
    fn flops_per_token_match_the_reference_formula() {
        // 6·N + 12·L·H·Q·T at T = 2048, N excluding the token embedding.
        let p = |name: &str| ModelConfig::preset(name).unwrap();
        assert_eq!(p("ref-8b").non_embedding_params(), 7_516_459_008);
        assert_eq!(p("ref-8b").flops_per_token(2048), 48_319_979_520.0);
        assert_eq!(p("ref-1b").non_embedding_params(), 989_923_328);
        assert_eq!(p("ref-1b").flops_per_token(2048), 6_744_846_336.0);
        // The reference's own figures: 7873.05 tokens/s -> 380.43 TFLOPs, 38.47% of 989e12.
        let tflops = 7873.05 * p("ref-8b").flops_per_token(2048) / 1e12;
        assert!((tflops - 380.43).abs() < 0.01 && (100.0 * tflops / 989.0 - 38.47).abs() < 0.01);
        // The CPU speed-goal model (`small`, vocab 8192, seq 256): 82.6 MFLOP/token.
        let small = ModelConfig {
            vocab_size: 8192,
            ..p("small")
        };
        assert_eq!(small.flops_per_token(256), 82_605_312.0);
    }
}
