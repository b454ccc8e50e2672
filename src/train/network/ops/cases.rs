//! Every op's cases ([`super::check::Case`]) in one list: what `sweep bench
//! kernels` times and the CUDA self-check runs. Apart from the ops' own
//! files, which declare their cases, so that no op imports another's.

use super::check::{Case, Shapes};
use anyhow::Result;

/// Every op's cases, in the table's order.
pub fn all(s: &Shapes) -> Result<Vec<Case>> {
    let mut cases = Vec::new();
    cases.extend(super::rms_norm::cases(s)?);
    cases.extend(super::silu_mul::cases(s)?);
    cases.extend(super::rope::cases(s)?);
    cases.extend(super::cross_entropy::cases(s)?);
    cases.extend(super::embedding::cases(s)?);
    cases.extend(super::attention::softmax_cases(s)?);
    cases.extend(super::attention::cases(s)?);
    cases.extend(super::linear::cases(s)?);
    cases.extend(super::grad_norm::cases(s)?);
    cases.extend(super::adamw::cases(s)?);
    cases.extend(super::accumulate::cases(s)?);
    Ok(cases)
}
