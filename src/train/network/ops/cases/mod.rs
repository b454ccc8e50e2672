//! Every op's cases ([`super::check::Case`]) in one list: what `sweep bench
//! kernels` times and the CUDA self-check runs. A file an op, apart from
//! the op's own (which holds its passes and kernels, nothing else), so that
//! no op imports another's.

mod accumulate;
mod adamw;
mod attention;
mod cross_entropy;
mod embedding;
mod grad_norm;
mod linear;
mod rms_norm;
mod rope;
mod silu_mul;

use super::check::{Case, Shapes};
use anyhow::Result;

/// Every op's cases, in the table's order.
pub fn all(s: &Shapes) -> Result<Vec<Case>> {
    all_with(s, s)
}

/// [`all`], the loss's at `loss`'s shapes (its vocabulary is a width, where
/// the tables' rows of `s` may be fewer).
pub fn all_with(s: &Shapes, loss: &Shapes) -> Result<Vec<Case>> {
    let mut cases = Vec::new();
    cases.extend(rms_norm::cases(s)?);
    cases.extend(silu_mul::cases(s)?);
    cases.extend(rope::cases(s)?);
    cases.extend(cross_entropy::cases(loss)?);
    cases.extend(embedding::cases(s)?);
    cases.extend(attention::softmax_cases(s)?);
    cases.extend(attention::cases(s)?);
    cases.extend(linear::cases(s)?);
    cases.extend(grad_norm::cases(s)?);
    cases.extend(adamw::cases(s)?);
    cases.extend(accumulate::cases(s)?);
    Ok(cases)
}
