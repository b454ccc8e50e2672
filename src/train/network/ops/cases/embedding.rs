//! `embedding`'s cases: what `sweep bench kernels` times and the self-check runs.

use crate::train::network::ops::check::{random, Case, Shapes};
use crate::train::network::ops::embedding::*;
use crate::train::network::ops::Kernel;
use anyhow::Result;

/// Its cases for `sweep bench kernels`: a step's gradient into the table,
/// and the same with every token one of three ids (rows added to many times).
pub fn cases(s: &Shapes) -> Result<Vec<Case>> {
    let (d, v, n) = (s.cfg.dim, s.cfg.vocab_size, s.tokens());
    let spread: Vec<u32> = (0..n).map(|i| ((i * 104_729) % v) as u32).collect();
    let repeated: Vec<u32> = (0..n).map(|i| (i % 3.min(v)) as u32).collect();
    [
        ("embedding backward", spread),
        ("embedding backward, repeated ids", repeated),
    ]
    .into_iter()
    .map(|(op, ids)| {
        let distinct = {
            let mut s = ids.clone();
            s.sort_unstable();
            s.dedup();
            s.len()
        };
        Ok(Case::new(
            Kernel::Embedding,
            op,
            format!("[{n}, {d}] into [{v}, {d}]"),
            n * d + 2 * distinct * d,
            vec![random(&[v, d], 14, 0.1)?, random(&[n, d], 15, 1.0)?],
            Box::new(move |t| {
                let mut buf = t[0].clone();
                let rows = Rows::new(&ids, buf.device())?;
                add_rows(&mut buf, &rows, &t[1])?;
                Ok(vec![buf])
            }),
        ))
    })
    .collect()
}
