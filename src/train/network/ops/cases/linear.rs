//! `linear`'s cases: what `sweep bench kernels` times and the self-check runs.

use crate::train::network::ops::check::{random, Case, Shapes};
use crate::train::network::ops::linear::*;
use crate::train::network::ops::Kernel;
use anyhow::Result;

/// Its cases for `sweep bench kernels`: a weight's gradient with `w2`'s
/// shapes, in the inputs' dtype and with bf16 operands into the buffer (as
/// bf16-mixed makes it: operands rounded on the way in).
pub fn cases(s: &Shapes) -> Result<Vec<Case>> {
    let (d, f, n) = (s.cfg.dim, s.cfg.ffn_hidden(), s.tokens());
    [
        (Gradient::Weight, "weight gradient", false, 26),
        (Gradient::Weight, "weight gradient, bf16 operands", true, 29),
        (Gradient::Input, "input gradient into a sum", false, 32),
        (
            Gradient::Input,
            "input gradient into a sum, bf16 operands",
            true,
            35,
        ),
    ]
    .into_iter()
    .map(|(which, op, bf16, seed)| {
        // w2's shapes: the weight [d, f]; dy [n, d]; x [n, f].
        let (buf, other, shapes) = match which {
            Gradient::Weight => ([d, f], [n, f], format!("[{d}, {f}] over {n} rows")),
            Gradient::Input => ([n, f], [d, f], format!("[{n}, {f}] from {d} outputs")),
        };
        Ok(Case {
            flops: 2.0 * (n * d * f) as f64,
            mixed: bf16,
            ..Case::new(
                Kernel::WeightGrad,
                op,
                shapes,
                2 * (buf[0] * buf[1]) + n * d + other[0] * other[1],
                vec![
                    random(&buf, seed, 0.1)?,
                    random(&[n, d], seed + 1, 1.0)?,
                    random(&other, seed + 2, 1.0)?,
                ],
                Box::new(move |t| {
                    let mut buf = t[0].clone();
                    add_gradient(which, &mut buf, &t[1], &t[2], bf16)?;
                    Ok(vec![buf])
                }),
            )
        })
    })
    .collect()
}
