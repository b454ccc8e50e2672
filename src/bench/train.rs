//! The train step alone (synthetic batches, no data loading): tokens per
//! second, achieved GFLOP/s, and their share of the matmul peak of the same
//! kernel on the same threads (candle's f32 GEMM, or sweep's bf16 kernel for
//! `bf16-mixed`), with the time split into forward, backward and optimizer.

use crate::config::{AttentionKind, ModelConfig, ModelOverrides, TrainConfig};
use crate::data::samples::IGNORE;
use crate::train::model::Llama;
use crate::train::optim::{AdamW, Grads};
use crate::train::params::Params;
use crate::train::peak::Kernel;
use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use std::time::Instant;

pub struct Case {
    pub label: String,
    pub preset: String,
    pub vocab: usize,
    pub seq: usize,
    pub batch: usize,
    /// `bf16-mixed`: bf16 matrix products (else f32 throughout).
    pub bf16: bool,
}

impl Case {
    pub fn precision(&self) -> &'static str {
        if self.bf16 {
            "bf16-mixed"
        } else {
            "f32"
        }
    }
}

pub struct TrainRow {
    pub case: Case,
    pub params: usize,
    pub flops_per_token: f64,
    pub tokens_per_s: f64,
    pub gflops: f64,
    pub peak_gflops: f64,
    pub forward_s: f64,
    pub backward_s: f64,
    pub optimizer_s: f64,
}

/// The presets as the quickstart trains them, and the CPU speed-goal model
/// (`small`, vocab 8192, seq 256, batch 8: 82.6 MFLOP per token),
/// in f32 and, where the CPU has AVX-512 BF16, in bf16-mixed.
pub fn default_cases() -> Vec<Case> {
    let c = |label: &str, preset: &str, vocab, seq, batch, bf16| Case {
        label: label.into(),
        preset: preset.into(),
        vocab,
        seq,
        batch,
        bf16,
    };
    let mut cases = vec![
        c("tiny (quickstart shape)", "tiny", 32000, 512, 2, false),
        c("small (vocab 32000)", "small", 32000, 512, 2, false),
        c("small (vocab 8192)", "small", 8192, 256, 8, false),
    ];
    if crate::train::ops::bf16_gemm::supported() {
        cases.push(c("small (vocab 8192)", "small", 8192, 256, 8, true));
    }
    cases
}

pub fn run(cases: Vec<Case>, steps: usize, threads: usize) -> Result<Vec<TrainRow>> {
    let mut rows = Vec::new();
    for case in cases {
        let kernel = if case.bf16 { Kernel::Bf16 } else { Kernel::F32 };
        let peak = crate::train::peak::refresh(kernel, threads)?;
        let o = ModelOverrides {
            vocab_size: Some(case.vocab),
            ..Default::default()
        };
        let cfg = ModelConfig::resolve(&case.preset, &o)?;
        let params = Params::init(&cfg, 1, &Device::Cpu, DType::F32)?;
        let model = Llama::new(
            &params,
            &cfg,
            AttentionKind::Eager,
            case.seq,
            &Device::Cpu,
            DType::F32,
        )?
        .with_bf16_matmuls(case.bf16);
        let mut opt = AdamW::new(&params, &TrainConfig::default())?;
        let n = case.batch * case.seq;
        let ids: Vec<u32> = (0..n).map(|i| ((i * 7919) % case.vocab) as u32).collect();
        let labels: Vec<i64> = (0..n)
            .map(|i| {
                if i % case.seq == 0 {
                    IGNORE
                } else {
                    ((i * 104729) % case.vocab) as i64
                }
            })
            .collect();
        let ids = Tensor::from_vec(ids, (case.batch, case.seq), &Device::Cpu)?;
        let (mut fwd, mut bwd, mut upd) = (0.0, 0.0, 0.0);
        for step in 0..steps + 2 {
            let t0 = Instant::now();
            let loss = model.loss(&ids, &labels, n as f64)?;
            let _ = loss.to_scalar::<f32>()?;
            let t1 = Instant::now();
            let mut grads = Grads::default();
            grads.accumulate(&params, loss.backward()?)?;
            let norm = grads.norm()?;
            let t2 = Instant::now();
            opt.step(&grads, 1e-4, (1.0 / norm).min(1.0))?;
            let t3 = Instant::now();
            if step >= 2 {
                // The first two steps warm up allocations and caches.
                fwd += (t1 - t0).as_secs_f64();
                bwd += (t2 - t1).as_secs_f64();
                upd += (t3 - t2).as_secs_f64();
            }
        }
        let total = fwd + bwd + upd;
        let tokens_per_s = (n * steps) as f64 / total;
        let flops_per_token = cfg.flops_per_token(case.seq);
        rows.push(TrainRow {
            params: params.count(),
            flops_per_token,
            tokens_per_s,
            gflops: tokens_per_s * flops_per_token / 1e9,
            peak_gflops: peak / 1e9,
            forward_s: fwd / steps as f64,
            backward_s: bwd / steps as f64,
            optimizer_s: upd / steps as f64,
            case,
        });
    }
    Ok(rows)
}
