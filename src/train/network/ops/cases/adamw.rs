//! `adamw`'s cases: what `sweep bench kernels` times and the self-check runs.

use crate::train::network::ops::adamw::*;
use crate::train::network::ops::check::{random, Case, Shapes};
use crate::train::network::ops::Kernel;
use anyhow::Result;

/// Its cases for `sweep bench kernels`: one update of an FFN-shaped
/// parameter with its gradient scaled by 0.5, and one with a NaN clip scale
/// (the step whose gradients overflowed), which leaves everything as it is.
/// The outputs: the parameter and both moments.
pub fn cases(s: &Shapes) -> Result<Vec<Case>> {
    let (d, f) = (s.cfg.dim, s.cfg.ffn_hidden());
    [("adamw", 0.5f32), ("adamw, NaN clip scale", f32::NAN)]
        .into_iter()
        .enumerate()
        .map(|(i, (op, scale))| {
            let seed = 40 + 4 * i as u64;
            let inputs = (0..4)
                .map(|k| random(&[d, f], seed + k, if k == 0 { 0.1 } else { 1.0 }))
                .collect::<anyhow::Result<Vec<_>>>()?;
            Ok(Case {
                // The twin's moments round in bf16 at each of its passes.
                chained: true,
                ..Case::new(
                    Kernel::AdamW,
                    op,
                    format!("[{d}, {f}]"),
                    7 * d * f,
                    inputs,
                    Box::new(move |t| Ok(update_case(t, scale)?)),
                )
            })
        })
        .collect()
}
