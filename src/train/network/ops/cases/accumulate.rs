//! `accumulate`'s cases: what `sweep bench kernels` times and the self-check runs.

use crate::train::network::ops::accumulate::*;
use crate::train::network::ops::check::{random, Case, Shapes};
use crate::train::network::ops::Kernel;
use anyhow::Result;

/// Its case for `sweep bench kernels`: a residual sum of the block's width.
pub fn cases(s: &Shapes) -> Result<Vec<Case>> {
    let (n, d) = (s.tokens(), s.cfg.dim);
    Ok(vec![Case::new(
        Kernel::Accumulate,
        "residual sum",
        format!("[{n}, {d}]"),
        3 * n * d,
        vec![random(&[n, d], 41, 1.0)?, random(&[n, d], 42, 1.0)?],
        Box::new(|t| Ok(vec![sum(t[0].clone(), &t[1])?])),
    )])
}
