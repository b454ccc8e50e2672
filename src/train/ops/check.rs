//! The cases `sweep bench kernels` checks and times: each op declares its
//! own beside its kernels (a `cases` function in its file), on random data
//! of a model's shapes; [`all`] lists them in the order the table shows.

use crate::config::ModelConfig;
use anyhow::Result;
use candle_core::{Device, Tensor};

/// The shapes the cases are made for: a model's, at a number of tokens.
pub struct Shapes<'a> {
    pub cfg: &'a ModelConfig,
    /// Sequences per call and their length (`batch · seq` tokens).
    pub batch: usize,
    pub seq: usize,
    /// The device measured (some ops keep tables on it as well as on the CPU).
    pub device: &'a Device,
}

impl Shapes<'_> {
    /// Tokens per call.
    pub fn tokens(&self) -> usize {
        self.batch * self.seq
    }
}

/// Runs an op on its inputs.
pub type Run = Box<dyn Fn(&[Tensor]) -> Result<Vec<Tensor>>>;

/// An op under test: inputs made once, run by the kernel or the composed
/// twin ([`super::composed_here`]), its outputs compared in f32.
pub struct Case {
    pub op: &'static str,
    pub shape: String,
    /// Elements the op must move at least (times the dtype's size: bytes).
    pub elements_moved: usize,
    /// Floating-point operations of its matrix products (0: none).
    pub flops: f64,
    /// Whether its bf16 path chains rounded products (a wider tolerance).
    pub chained: bool,
    /// The inputs on the CPU in f32 (rounded to the measured dtype later).
    pub inputs: Vec<Tensor>,
    pub run: Run,
}

impl Case {
    /// A case of an op without matrix products and with one rounding.
    pub fn new(
        op: &'static str,
        shape: String,
        elements_moved: usize,
        inputs: Vec<Tensor>,
        run: Run,
    ) -> Case {
        Case {
            op,
            shape,
            elements_moved,
            flops: 0.0,
            chained: false,
            inputs,
            run,
        }
    }
}

/// Every op's cases, in the table's order.
pub fn all(s: &Shapes) -> Result<Vec<Case>> {
    let mut cases = Vec::new();
    cases.extend(super::rms_norm::cases(s)?);
    cases.extend(super::silu_mul::cases(s)?);
    cases.extend(super::rope::cases(s)?);
    cases.extend(super::cross_entropy::cases(s)?);
    cases.extend(super::embedding::cases(s)?);
    cases.extend(super::softmax::cases(s)?);
    cases.extend(super::attention::cases(s)?);
    cases.extend(super::linear::cases(s)?);
    cases.extend(super::grad_norm::cases(s)?);
    Ok(cases)
}

/// Deterministic values in [-scale, scale), f32, on the CPU.
pub fn random(shape: &[usize], seed: u64, scale: f32) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let v: Vec<f32> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect();
    Ok(Tensor::from_vec(v, shape, &Device::Cpu)?)
}
