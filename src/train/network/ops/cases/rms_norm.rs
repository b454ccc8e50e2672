//! `rms_norm`'s cases: what `sweep bench kernels` times and the self-check runs.

use crate::train::network::ops::check::{random, Case, Shapes};
use crate::train::network::ops::rms_norm::*;
use crate::train::network::ops::Kernel;
use anyhow::Result;

/// Its cases for `sweep bench kernels`: a block's norm, forward and backward.
pub fn cases(s: &Shapes) -> Result<Vec<Case>> {
    let (n, d, eps) = (s.tokens(), s.cfg.dim, s.cfg.norm_eps);
    Ok(vec![
        Case::new(
            Kernel::RmsNorm,
            "rms_norm forward",
            format!("[{n}, {d}]"),
            2 * n * d + d,
            vec![random(&[n, d], 1, 2.0)?, (random(&[d], 2, 0.5)? + 1.0)?],
            Box::new(move |t| Ok(vec![rms_norm(&t[0], &t[1], eps)?])),
        ),
        Case::new(
            Kernel::RmsNorm,
            "rms_norm backward",
            format!("[{n}, {d}]"),
            3 * n * d + 2 * d,
            vec![
                random(&[n, d], 3, 2.0)?,
                (random(&[d], 4, 0.5)? + 1.0)?,
                random(&[n, d], 5, 1.0)?,
            ],
            Box::new(move |t| {
                let (dx, dw) = backward(&t[0], &t[1], eps, &t[2])?;
                Ok(vec![dx, dw])
            }),
        ),
    ])
}
