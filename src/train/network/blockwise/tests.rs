//! Tests of the block-wise passes against the autograd oracle: gradients, caches and recomputation.

use super::*;
use crate::config::{AttentionKind, ModelConfig, ModelOverrides, Recompute};
use crate::data::samples::IGNORE;
use crate::train::network::model::ModelSpec;
use crate::train::network::oracle::Autograd;
use crate::train::network::params::Params;
use candle_core::backprop::GradStore;
use candle_core::Device;

/// A model of width `dim` and `blocks` blocks with grouped queries (4 heads
/// over 2 KV heads) and a vocabulary of 50.
fn shape(dim: usize, blocks: usize) -> ModelConfig {
    let o = ModelOverrides {
        dim: Some(dim),
        n_layers: Some(blocks),
        n_heads: Some(4),
        n_kv_heads: Some(2),
        vocab_size: Some(50),
        multiple_of: Some(16),
        ..Default::default()
    };
    ModelConfig::resolve("tiny", &o).unwrap()
}

fn spec(dtype: DType, recompute: Recompute, attention: AttentionKind) -> ModelSpec {
    ModelSpec {
        cfg: shape(16, 3),
        attention,
        max_seq: 8,
        device: Device::Cpu,
        dtype,
        bf16_matmuls: false,
        recompute,
    }
}

/// A micro-batch's ids as the trainer passes them and as the oracle takes them.
struct Micro {
    ids: Vec<u32>,
    b: usize,
    t: usize,
}

impl Micro {
    fn tokens(&self) -> Tokens<'_> {
        Tokens::new(&self.ids, self.b, self.t).unwrap()
    }

    fn tensor(&self) -> Tensor {
        Tensor::from_slice(&self.ids, (self.b, self.t), &Device::Cpu).unwrap()
    }
}

/// Ids [B, T] and labels: padded rows end in ignored labels; a
/// padding-free row's first label after a document start is ignored.
fn batch(b: usize, t: usize, seed: usize) -> (Micro, Vec<i64>) {
    let ids: Vec<u32> = (0..b * t)
        .map(|i| ((i * 7 + seed * 13 + 3) % 50) as u32)
        .collect();
    let labels: Vec<i64> = (0..b * t)
        .map(|i| {
            let (row, pos) = (i / t, i % t);
            let padded = row % 2 == 0 && pos >= t - 2;
            let boundary = row % 2 == 1 && pos == 3;
            if padded || boundary {
                IGNORE
            } else {
                ((i * 11 + seed + 1) % 50) as i64
            }
        })
        .collect();
    (Micro { ids, b, t }, labels)
}

/// Max |a − b| / max |b| over two gradient sets, by parameter name.
fn worst(params: &Params, a: &Grads, b: &GradStore) -> Result<(f64, String)> {
    let mut worst = (0.0, String::new());
    for (name, var) in params.iter() {
        let ga = a.get(name).expect("a gradient for every parameter");
        let gb = b
            .get(var.as_tensor())
            .expect("a gradient for every parameter");
        let (ga, gb) = (ga.to_dtype(DType::F64)?, gb.to_dtype(DType::F64)?);
        let scale = gb.abs()?.max_all()?.to_scalar::<f64>()?;
        let diff = (ga - gb)?.abs()?.max_all()?.to_scalar::<f64>()?;
        assert!(scale > 0.0, "`{name}` has an all-zero gradient");
        if diff / scale > worst.0 {
            worst = (diff / scale, name.clone());
        }
    }
    Ok(worst)
}

#[test]
fn the_explicit_passes_equal_autograd_in_f64() -> Result<()> {
    for recompute in [Recompute::None, Recompute::Blocks] {
        let s = spec(DType::F64, recompute, AttentionKind::Eager);
        let params = s.init_params(11)?;
        let model = Llama::new(&params, &s)?;
        let oracle = Autograd::new(&params, &s)?;
        let (ids, labels) = batch(2, 8, 1);
        let autograd_loss = oracle.loss(&ids.tensor(), &labels, 9.0)?;
        let value = autograd_loss.to_scalar::<f64>()?;
        let reference = oracle.backward(&autograd_loss)?;
        let mut grads = Grads::buffers_for(&params)?;
        let loss = model.forward_backward(ids.tokens(), &labels, 9.0, &mut grads)?;
        assert!(
            (loss - value).abs() <= 1e-12 * value.abs(),
            "{recompute:?}: loss {loss} vs {value}"
        );
        let (err, name) = worst(&params, &grads, &reference)?;
        assert!(
            err <= 1e-10,
            "{recompute:?}: `{name}` off by {err:e} (relative)"
        );
    }
    Ok(())
}

#[test]
fn the_forward_alone_gives_the_same_loss() -> Result<()> {
    for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-6)] {
        let s = spec(dtype, Recompute::None, AttentionKind::Eager);
        let params = s.init_params(13)?;
        let model = Llama::new(&params, &s)?;
        let (ids, labels) = batch(2, 8, 4);
        let forward = model.loss(&ids.tensor(), &labels, 9.0)?;
        let mut grads = Grads::buffers_for(&params)?;
        let both = model.forward_backward(ids.tokens(), &labels, 9.0, &mut grads)?;
        assert!(
            (forward - both).abs() <= tol * both.abs(),
            "{dtype:?}: {forward} vs {both}"
        );
    }
    Ok(())
}

#[test]
fn accumulated_micro_batches_equal_autograd_in_f64() -> Result<()> {
    let s = spec(DType::F64, Recompute::None, AttentionKind::Eager);
    let params = s.init_params(5)?;
    let model = Llama::new(&params, &s)?;
    let oracle = Autograd::new(&params, &s)?;
    let (mut ours, mut theirs) = (Grads::buffers_for(&params)?, Grads::default());
    let (mut loss_ours, mut loss_theirs) = (0.0, 0.0);
    // Buffers from an earlier step are emptied first.
    let (ids, labels) = batch(2, 8, 3);
    model.forward_backward(ids.tokens(), &labels, 21.0, &mut ours)?;
    ours.zero()?;
    for seed in [1, 2] {
        let (ids, labels) = batch(2, 8, seed);
        loss_ours += model.forward_backward(ids.tokens(), &labels, 21.0, &mut ours)?;
        let l = oracle.loss(&ids.tensor(), &labels, 21.0)?;
        loss_theirs += l.to_scalar::<f64>()?;
        theirs.accumulate(&params, oracle.backward(&l)?)?;
    }
    assert!((loss_ours - loss_theirs).abs() <= 1e-12 * loss_theirs);
    for (name, _) in params.iter() {
        let (a, b) = (ours.get(name).unwrap(), theirs.get(name).unwrap());
        let scale = b.abs()?.max_all()?.to_scalar::<f64>()?;
        let diff = (a - b)?.abs()?.max_all()?.to_scalar::<f64>()?;
        assert!(diff <= 1e-10 * scale, "`{name}`: {diff:e} of {scale:e}");
    }
    Ok(())
}

#[test]
fn the_fused_f32_kernels_follow_autograd() -> Result<()> {
    // f32 on the CPU: the passes run the fused kernels (flash attention's
    // reference forward and tiled backward too), the oracle candle's ops.
    for attention in [AttentionKind::Eager, AttentionKind::Flash] {
        let s = spec(DType::F32, Recompute::None, attention);
        let params = s.init_params(3)?;
        let model = Llama::new(&params, &s)?;
        let oracle = Autograd::new(&params, &s)?;
        let (ids, labels) = batch(2, 8, 3);
        let l = oracle.loss(&ids.tensor(), &labels, 9.0)?;
        let value = l.to_scalar::<f32>()? as f64;
        let reference = oracle.backward(&l)?;
        let mut grads = Grads::buffers_for(&params)?;
        let loss = model.forward_backward(ids.tokens(), &labels, 9.0, &mut grads)?;
        assert!(
            (loss - value).abs() <= 1e-5 * value,
            "{attention:?}: {loss} vs {value}"
        );
        let (err, name) = worst(&params, &grads, &reference)?;
        assert!(err <= 1e-4, "{attention:?}: `{name}` off by {err:e}");
    }
    Ok(())
}

#[test]
fn each_blocks_cache_is_freed_after_its_backward() -> Result<()> {
    for recompute in [Recompute::None, Recompute::Blocks] {
        let s = spec(DType::F32, recompute, AttentionKind::Eager);
        let params = s.init_params(7)?;
        let model = Llama::new(&params, &s)?;
        let (ids, labels) = batch(2, 8, 2);
        let mut finished = Vec::new();
        let probe = Probe {
            at_peak: &mut || Ok(()),
            sync_forward: false,
            on_ready: &mut |f, _| {
                finished.push(f);
                Ok(())
            },
        };
        let mut grads = Grads::buffers_for(&params)?;
        let trace = model
            .forward_backward_probed(ids.tokens(), &labels, 9.0, &mut grads, probe)?
            .trace;
        // The order in which gradients can be summed across ranks.
        use Finished::*;
        assert_eq!(finished, [Head, Block(2), Block(1), Block(0), Embeddings]);
        let (n, cfg) = (2 * 8, &s.cfg);
        let (d, f) = (cfg.dim, cfg.ffn_hidden());
        let kv = cfg.n_kv_heads * cfg.head_dim();
        // Per block: x, q, k, v, P, the attention output, mid, and the
        // two FFN products (f32); with recomputation, x alone.
        // Eager attention's probabilities: [B, KV, rep·T, T].
        let p = 2 * cfg.n_heads * 8 * 8;
        let per_block = match recompute {
            Recompute::None => 4 * (n * (d + d + kv + kv + d + d + f + f) + p),
            Recompute::Blocks => 4 * n * d,
        };
        assert_eq!(trace.after_forward, 3 * per_block, "{recompute:?}");
        assert_eq!(
            trace.after_each_backward,
            vec![2 * per_block, per_block, 0],
            "{recompute:?}: each block's cache goes with its backward"
        );
    }
    Ok(())
}

/// The model of [`spec`] with one block and heads of 16 (the fused attention
/// backward's smallest) over 16 positions, bf16 products where `bf16`.
fn wide_spec(attention: AttentionKind, bf16: bool) -> ModelSpec {
    ModelSpec {
        cfg: shape(64, 1),
        max_seq: 16,
        bf16_matmuls: bf16,
        ..spec(DType::F32, Recompute::None, attention)
    }
}

/// What [`two_steps`] gives: each step's loss, the first step's gradients
/// and the parameters after, by name.
struct Steps {
    losses: Vec<f64>,
    grads: Vec<(String, Tensor)>,
    params: Vec<(String, Tensor)>,
}

/// Two optimizer steps of `s`'s model as the trainer takes them (forward,
/// backward, clip, AdamW).
fn two_steps(s: &ModelSpec) -> Result<Steps> {
    use crate::train::network::optim::AdamW;
    let params = s.init_params(3)?;
    let model = Llama::new(&params, s)?;
    let cfg = crate::config::TrainConfig {
        learning_rate: 1e-2,
        grad_clip: 0.5,
        ..Default::default()
    };
    let mut opt = AdamW::new(&params, &cfg)?;
    let mut grads = Grads::buffers_for(&params)?;
    let (mut losses, mut first) = (Vec::new(), Vec::new());
    // Copies: the trainer's buffers are written in place by the next steps.
    let f32s = |t: &Tensor| t.to_dtype(DType::F32)?.copy();
    for seed in 1..=2 {
        let (ids, labels) = batch(2, 16, seed);
        grads.zero()?;
        losses.push(model.forward_backward(ids.tokens(), &labels, 40.0, &mut grads)?);
        if seed == 1 {
            for (name, _) in params.iter() {
                first.push((name.clone(), f32s(grads.get(name).expect("a gradient"))?));
            }
        }
        let clipping = grads.clipping(cfg.grad_clip)?;
        opt.step(&grads, cfg.learning_rate, &clipping)?;
    }
    let params = params
        .iter()
        .map(|(name, v)| Ok((name.clone(), f32s(v.as_tensor())?)))
        .collect::<Result<_>>()?;
    Ok(Steps {
        losses,
        grads: first,
        params,
    })
}

/// The largest |a − b| / max |b| of two named sets of tensors, and where.
fn worst_of(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> Result<(f32, String)> {
    let mut worst = (0.0, String::new());
    for ((name, a), (_, b)) in a.iter().zip(b) {
        let scale = b.abs()?.max_all()?.to_scalar::<f32>()?;
        // (max_diff sees NaNs, which candle's max passes over)
        let err = crate::train::network::ops::testing::max_diff(a, b)? / scale;
        if err.is_nan() || err > worst.0 {
            worst = (err, name.clone());
        }
    }
    Ok(worst)
}

/// A whole training step on the emulated device: every op's GPU path and
/// glue on the same buffers as on a GPU, each plan run by the host
/// emulation of CUDA under AddressSanitizer, cuBLAS and flash attention's
/// forward by host references, the head in three slices; two steps
/// against the CPU trainer's, in f32 (eager attention), bf16-mixed and bf16
/// (flash attention, the fused backward).
#[test]
fn training_steps_under_emulation_follow_the_cpu_trainer() -> Result<()> {
    use crate::train::network::kernels::emulator::Flavor;
    use crate::train::network::ops::emulated;
    // (attention, bf16 products, tolerances of the losses, the first
    // gradients and the parameters after; in bf16 AdamW's first steps move
    // each parameter by ±lr whatever its gradient's size, so the signs of
    // the smallest gradients decide them: not compared).
    for (dtype, attention, bf16, tol) in [
        (DType::F32, AttentionKind::Eager, false, [1e-6, 1e-5, 2e-3]),
        (
            DType::F32,
            AttentionKind::Flash,
            true,
            [1e-3, 3e-2, f64::INFINITY],
        ),
        (
            DType::BF16,
            AttentionKind::Flash,
            false,
            [1e-3, 3e-2, f64::INFINITY],
        ),
    ] {
        let s = wide_spec(attention, bf16);
        let want = two_steps(&s)?;
        let on_device = ModelSpec { dtype, ..s };
        let Some(got) = emulated::on(Flavor::Address, || two_steps(&on_device)) else {
            return Ok(());
        };
        let got = got?;
        for (step, (g, w)) in got.losses.iter().zip(&want.losses).enumerate() {
            assert!(
                (g - w).abs() <= tol[0] * w.abs(),
                "{attention:?}, bf16 {bf16}: step {step}'s loss {g} against the CPU's {w}"
            );
        }
        for (what, got, want, tol) in [
            ("gradient", &got.grads, &want.grads, tol[1]),
            ("parameter after", &got.params, &want.params, tol[2]),
        ] {
            let (err, name) = worst_of(got, want)?;
            assert!(
                err as f64 <= tol,
                "{attention:?}, bf16 {bf16}: `{name}`'s {what} off by {err:e} (relative)"
            );
        }
    }
    Ok(())
}
