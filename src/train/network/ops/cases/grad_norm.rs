//! `grad_norm`'s cases: what `sweep bench kernels` times and the self-check runs.

use crate::train::network::ops::check::{random, Case, Shapes};
use crate::train::network::ops::grad_norm::*;
use crate::train::network::ops::Kernel;
use anyhow::Result;

/// Its case for `sweep bench kernels`: gradients of an embedding, a
/// projection and a norm weight.
pub fn cases(s: &Shapes) -> Result<Vec<Case>> {
    let (d, f, v) = (s.cfg.dim, s.cfg.ffn_hidden(), s.cfg.vocab_size);
    Ok(vec![Case::new(
        Kernel::GradNorm,
        "grad norm and clip",
        format!("[{v}, {d}] + [{f}, {d}] + [{d}]"),
        v * d + f * d + d,
        vec![
            random(&[v, d], 23, 0.01)?,
            random(&[f, d], 24, 0.1)?,
            random(&[d], 25, 1.0)?,
        ],
        Box::new(|t| {
            let clipping = clipping(&t.iter().collect::<Vec<_>>(), 1.0)?;
            Ok(vec![clipping.as_tensor(t[0].device())?])
        }),
    )])
}
