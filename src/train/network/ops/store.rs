//! The GPU glue of the ops written once: which storage, which offset,
//! which shape goes into a [`LaunchPlan`] and what comes out. A [`Store`]
//! is CUDA's storage on a GPU (`cuda.rs`) and, in the tests, a CPU storage
//! whose plans run under the host emulation of CUDA (`emulated.rs`), so that
//! a whole training step takes its GPU paths without a GPU.

use super::linear::Gemm;
use crate::train::network::kernels::{LaunchPlan, Ty};
use candle_core::{Layout, Result, Storage, Tensor};
use std::cell::RefCell;

/// What an op's GPU path needs of a storage.
pub trait Store: Sized {
    type Device;
    type Operand<'a>: Span
    where
        Self: 'a;

    fn device(&self) -> Self::Device;

    /// Its element type as the kernels take it (f32 or bf16).
    fn ty(&self) -> Result<Ty>;

    /// Its contiguous elements under `l`: an operand a plan reads.
    fn operand<'a>(&'a self, l: &Layout) -> Result<Self::Operand<'a>>;

    /// The same, which the plan may also write.
    fn operand_mut<'a>(&'a mut self, l: &Layout) -> Result<Self::Operand<'a>>;

    /// The storage of a tensor an op holds beside those candle hands it.
    fn held<'a>(s: &'a Storage, what: &str) -> Result<&'a Self>;

    /// Runs `f` on the storage of such a tensor, to write it: through
    /// candle's in-place op, its one way to a storage mutably.
    fn with_mut<R>(t: &Tensor, f: impl FnOnce(&mut Self, &Layout) -> Result<R>) -> Result<R>;

    /// Runs `plan` on `dev`; its outputs.
    fn execute(
        dev: &Self::Device,
        plan: &LaunchPlan,
        operands: &[Self::Operand<'_>],
    ) -> Result<Vec<Self>>;

    /// C += op(A)·op(B) as cuBLAS's GEMM `g` defines it (f32 arithmetic),
    /// after checking each operand holds every element `g` reaches.
    fn gemm(
        g: &Gemm,
        c: (&mut Self, &Layout),
        a: (&Self, &Layout),
        b: (&Self, &Layout),
        what: &dyn Fn() -> String,
    ) -> Result<()>;
}

/// An operand's size and type.
pub trait Span {
    fn len(&self) -> usize;
    fn ty(&self) -> Ty;
}

/// The in-place op behind [`Store::with_mut`]: calls its function once on
/// the storage of the tensor it is applied to.
pub(crate) struct WithMut<'f, S>(pub RefCell<Call<'f, S>>);

type Call<'f, S> = &'f mut dyn FnMut(&mut S, &Layout) -> Result<()>;

/// [`Store::with_mut`] for a storage whose [`WithMut`] is an in-place op.
pub(crate) fn with_mut<S, R>(t: &Tensor, f: impl FnOnce(&mut S, &Layout) -> Result<R>) -> Result<R>
where
    for<'f> WithMut<'f, S>: candle_core::InplaceOp1,
{
    let (mut f, mut out) = (Some(f), None);
    let mut call = |s: &mut S, l: &Layout| {
        if let Some(f) = f.take() {
            out = Some(f(s, l)?);
        }
        Ok(())
    };
    t.inplace_op1(&WithMut(RefCell::new(&mut call)))?;
    out.ok_or_else(|| candle_core::Error::Msg("an in-place op did not run".into()))
}
