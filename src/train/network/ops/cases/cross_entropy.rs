//! `cross_entropy`'s cases: what `sweep bench kernels` times and the self-check runs.

use crate::data::samples::IGNORE;
use crate::train::network::ops::check::{random, Case, Shapes};
use crate::train::network::ops::cross_entropy::*;
use crate::train::network::ops::Kernel;
use anyhow::Result;

/// Its case for `sweep bench kernels`: the loss and its gradient over one
/// slice of rows of the head (as the block-wise pass computes them).
pub fn cases(s: &Shapes) -> Result<Vec<Case>> {
    let v = s.cfg.vocab_size;
    let rows = head_rows(s.tokens(), v, s.device.is_cuda());
    let labels: Vec<i64> = (0..rows)
        .map(|i| {
            if i % 7 == 3 {
                IGNORE
            } else {
                ((i * 7919) % v) as i64
            }
        })
        .collect();
    Ok(vec![Case::new(
        Kernel::CrossEntropy,
        "loss and d logits",
        format!("[{rows}, {v}]"),
        2 * rows * v,
        vec![random(&[rows, v], 13, 8.0)?],
        Box::new(move |t| {
            // The op consumes its logits: a copy, made before the clock starts.
            let labels = Labels::new(&labels, t[0].device())?;
            let (loss, d) = loss_and_grad(t[0].clone(), &labels, 1e3)?;
            Ok(vec![loss.reshape(1)?, d])
        }),
    )])
}
