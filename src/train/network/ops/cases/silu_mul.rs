//! `silu_mul`'s cases: what `sweep bench kernels` times and the self-check runs.

use crate::train::network::ops::check::{random, Case, Shapes};
use crate::train::network::ops::silu_mul::*;
use crate::train::network::ops::Kernel;
use anyhow::Result;

/// Its cases for `sweep bench kernels`: the feed-forward's gate, forward
/// and backward.
pub fn cases(s: &Shapes) -> Result<Vec<Case>> {
    let (n, f) = (s.tokens(), s.cfg.ffn_hidden());
    Ok(vec![
        Case::new(
            Kernel::SiluMul,
            "swiglu forward",
            format!("[{n}, {f}]"),
            3 * n * f,
            vec![random(&[n, f], 6, 4.0)?, random(&[n, f], 7, 1.0)?],
            Box::new(|t| Ok(vec![silu_mul(&t[0], &t[1])?])),
        ),
        Case::new(
            Kernel::SiluMul,
            "swiglu backward",
            format!("[{n}, {f}]"),
            5 * n * f,
            vec![
                random(&[n, f], 8, 4.0)?,
                random(&[n, f], 9, 1.0)?,
                random(&[n, f], 10, 1.0)?,
            ],
            Box::new(|t| {
                let (da, db) = backward(&t[0], &t[1], &t[2])?;
                Ok(vec![da, db])
            }),
        ),
    ])
}
