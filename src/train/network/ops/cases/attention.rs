//! `attention`'s cases: what `sweep bench kernels` times and the self-check runs.

use crate::train::network::ops::attention::*;
use crate::train::network::ops::check::{random, Case, Shapes};
use crate::train::network::ops::softmax::{self, softmax};
use crate::train::network::ops::Kernel;
use anyhow::Result;

/// Its cases for `sweep bench kernels`: the tiled backward of causal
/// attention with grouped queries, and flash attention's forward where it
/// runs (the CPU's reference forward; on a GPU candle-flash-attn's kernel,
/// bf16 only, in builds with the `flash-attn` feature).
pub fn cases(s: &Shapes) -> Result<Vec<Case>> {
    let (batch, seq) = (s.batch, s.seq);
    let (h, kv, q) = (s.cfg.n_heads, s.cfg.n_kv_heads, s.cfg.head_dim());
    let mut cases = Vec::new();
    if s.device.is_cpu() || cfg!(feature = "flash-attn") {
        cases.push(Case {
            flops: 2.0 * 2.0 * (batch * h * q) as f64 * (seq * (seq + 1) / 2) as f64,
            gpu_f32: false,
            ..Case::new(
                Kernel::Flash,
                "flash attention forward",
                format!("[{batch}, {seq}, {h}/{kv}, {q}]"),
                (2 * h + 2 * kv) * s.tokens() * q,
                vec![
                    random(&[batch, seq, h, q], 23, 1.0)?,
                    random(&[batch, seq, kv, q], 24, 1.0)?,
                    random(&[batch, seq, kv, q], 25, 1.0)?,
                ],
                Box::new(|t| Ok(vec![flash(&t[0], &t[1], &t[2], true)?])),
            )
        });
    }
    cases.push(Case {
        // Five products over the causal half of the scores.
        flops: 5.0 * 2.0 * (batch * h * q) as f64 * (seq * (seq + 1) / 2) as f64,
        chained: true,
        ..Case::new(
            Kernel::Softmax,
            "attention backward",
            format!("[{batch}, {h}/{kv}, {seq}, {q}]"),
            (3 * h + 4 * kv) * s.tokens() * q,
            backward_inputs(s)?,
            Box::new(tiled),
        )
    });
    // The fused kernels against the tiled backward they replace (with its
    // own kernels): chosen when the device opens only where faster.
    cases.push(Case {
        flops: cases[cases.len() - 1].flops,
        chained: true,
        // Flash attention's inputs are bf16 on a GPU, in every precision.
        gpu_f32: false,
        twin: Some(Box::new(tiled)),
        ..Case::new(
            Kernel::AttentionBackward,
            "attention backward, fused",
            format!("[{batch}, {h}/{kv}, {seq}, {q}]"),
            (3 * h + 4 * kv) * s.tokens() * q,
            backward_inputs(s)?,
            Box::new(|t| {
                let (dq, dk, dv) = fused_backward(&t[0], &t[1], &t[2], &t[3], true)?;
                Ok(vec![dq, dk, dv])
            }),
        )
    });
    Ok(cases)
}

/// The backward's inputs: q [B, H, T, Q], k, v [B, KV, T, Q], d_o [B, H, T, Q].
fn backward_inputs(s: &Shapes) -> Result<Vec<candle_core::Tensor>> {
    let (batch, seq) = (s.batch, s.seq);
    let (h, kv, q) = (s.cfg.n_heads, s.cfg.n_kv_heads, s.cfg.head_dim());
    Ok(vec![
        random(&[batch, h, seq, q], 19, 1.0)?,
        random(&[batch, kv, seq, q], 20, 1.0)?,
        random(&[batch, kv, seq, q], 21, 1.0)?,
        random(&[batch, h, seq, q], 22, 1.0)?,
    ])
}

/// The tiled backward on a case's inputs.
fn tiled(t: &[candle_core::Tensor]) -> anyhow::Result<Vec<candle_core::Tensor>> {
    let (dq, dk, dv) = tiled_backward(&t[0], &t[1], &t[2], &t[3], true, None)?;
    Ok(vec![dq, dk, dv])
}

/// The softmax's cases for `sweep bench kernels`: attention's softmax on the last tile
/// of queries of the backward (the one that sees every key): forward,
/// backward, and both in one op as the tiled backward runs them.
pub fn softmax_cases(s: &Shapes) -> Result<Vec<Case>> {
    let (batch, seq, h) = (s.batch, s.seq, s.cfg.n_heads);
    let tile = tile_rows(batch, h, seq, candle_core::DType::BF16).min(seq);
    let last_tile = seq - tile;
    let scores = batch * h * tile * seq;
    let scale = 1.0 / (s.cfg.head_dim() as f64).sqrt();
    let shape = format!("[{batch}, {h}, {tile}, {seq}]");
    Ok(vec![
        Case::new(
            Kernel::Softmax,
            "softmax forward",
            shape.clone(),
            2 * scores,
            vec![random(&[batch, h, tile, seq], 16, 8.0)?],
            Box::new(move |t| Ok(vec![softmax(&t[0], scale, tile, last_tile, true)?])),
        ),
        Case::new(
            Kernel::Softmax,
            "softmax backward",
            shape.clone(),
            3 * scores,
            // Probabilities (rows of a causal softmax) and their gradient.
            vec![
                softmax(
                    &random(&[batch, h, tile, seq], 17, 8.0)?,
                    scale,
                    tile,
                    last_tile,
                    true,
                )?,
                random(&[batch, h, tile, seq], 18, 1.0)?,
            ],
            Box::new(move |t| Ok(vec![softmax::backward(&t[0], &t[1], scale)?])),
        ),
        Case::new(
            Kernel::Softmax,
            "softmax forward and backward",
            shape,
            4 * scores,
            // Scores and the probabilities' gradient: P and dS in one op,
            // as the tiled backward runs them.
            vec![
                random(&[batch, h, tile, seq], 19, 8.0)?,
                random(&[batch, h, tile, seq], 20, 1.0)?,
            ],
            Box::new(move |t| {
                let (p, ds) =
                    softmax::forward_backward(&t[0], &t[1], scale, tile, last_tile, true)?;
                Ok(vec![p, ds])
            }),
        ),
    ])
}
