//! `rope`'s cases: what `sweep bench kernels` times and the self-check runs.

use crate::train::network::ops::check::{random, Case, Shapes};
use crate::train::network::ops::rope::*;
use crate::train::network::ops::Kernel;
use anyhow::Result;
use candle_core::{DType, Device, Tensor};

/// Its cases for `sweep bench kernels`: the queries' rotation, forward and
/// backward, with the tables on the device of their input.
pub fn cases(s: &Shapes) -> Result<Vec<Case>> {
    let (batch, seq, h, q) = (s.batch, s.seq, s.cfg.n_heads, s.cfg.head_dim());
    let n = s.tokens();
    let tables = |on: &Device| RopeTables::new(s.cfg.rope_theta, q, seq, on, DType::F32);
    let (cpu, device) = (tables(&Device::Cpu)?, tables(s.device)?);
    let on = move |x: &Tensor| -> RopeTables {
        if x.device().is_cpu() {
            cpu.clone()
        } else {
            device.clone()
        }
    };
    let on_back = on.clone();
    Ok(vec![
        Case::new(
            Kernel::Rope,
            "rope forward",
            format!("[{batch}, {seq}, {h}, {q}]"),
            2 * n * h * q,
            vec![random(&[batch, seq, h, q], 11, 1.0)?],
            Box::new(move |t| Ok(vec![heads_first(&t[0], Some(&on(&t[0])))?])),
        ),
        Case::new(
            Kernel::Rope,
            "rope backward",
            format!("[{batch}, {h}, {seq}, {q}]"),
            2 * n * h * q,
            vec![random(&[batch, h, seq, q], 12, 1.0)?],
            Box::new(move |t| Ok(vec![backward(&t[0], Some(&on_back(&t[0])))?])),
        ),
        // Values take the same kernel without tables: it only moves them
        // to the heads-first layout.
        Case::new(
            Kernel::Rope,
            "heads first, no tables",
            format!("[{batch}, {seq}, {h}, {q}]"),
            2 * n * h * q,
            vec![random(&[batch, seq, h, q], 13, 1.0)?],
            Box::new(move |t| Ok(vec![heads_first(&t[0], None)?])),
        ),
    ])
}
